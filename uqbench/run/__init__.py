"""Running: `runner` (suite -> models -> passes -> scorers -> run folder), `score_records`
(`uqbench score`: a run folder from records made elsewhere), `reproduce` (rerun and diff)."""
