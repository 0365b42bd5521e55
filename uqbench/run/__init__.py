"""Running: `runner` (suite -> models -> passes -> scorers: the order of work), `folder` (writing
the run folder), `score_records` (``uqbench score``: a run folder from records made elsewhere),
`reproduce` (rerun and diff)."""
