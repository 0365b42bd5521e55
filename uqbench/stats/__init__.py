"""Statistics on arrays, no model and no files: `metrics` (calibration, OOD detection,
selective prediction, bootstrap), `conformal` (split conformal sets), `risk` (selective risk
control), `recalibration` (post-hoc recalibration through netcal)."""
