"""Pages and verdicts over finished runs: `html` (report.html), `compare` (runs side by
side with paired differences), `paper` (the CARE paper's claims judged on a run)."""
