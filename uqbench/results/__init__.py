"""The results table: `columns` (each column declared once), `evaluate` (one method's
metrics with CIs and seed spread), `recalibration` (its ECE after recalibrators fitted on the
calib split), `conformal_risk` (its conformal and risk-control columns),
`references` (chance and options-only rows, the at-chance check), `rows` (every method's rows
of a run), `tables` (results.{jsonl,csv,md,tex} and the printed summary)."""
