"""The results table: `evaluate` (one method's metrics with CIs and seed spread),
`columns` (its conformal and risk-control columns), `references` (chance and options-only
rows, the at-chance check), `tables` (results.{jsonl,csv,md,tex} and the printed summary)."""
