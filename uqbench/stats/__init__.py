"""Statistics on arrays, no model and no files: `metrics` (calibration, OOD detection,
selective prediction, bootstrap), `conformal` (split conformal sets), `risk` (selective risk
control), `recalibration` (post-hoc recalibrators through netcal). From the rest of `uqbench`
only `uqbench.core.errors` (tests/test_layers.py)."""
