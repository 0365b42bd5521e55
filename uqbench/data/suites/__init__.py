"""The suite layer: what a suite is made of and the suite registry (`spec`), how its splits are
built (`build`), the cache of built splits (`cache`), the split table (`table`) and the built-in
suites (`pooled`, `pooled_plus`)."""
