"""Real data as multiple-choice splits, by seam, each room importing only those before it: the
record (`records`), seeds and the options-only artifact check (`artifacts`); the sandbox that
runs candidate programs (`sandbox`); the multiple-choice builders (`mc`); the sources (`sources`:
the source API in `sources.api`); the suite layer (`suites`: spec, build, split cache)."""
from uqbench.data.records import MCRecord, Split

__all__ = ["MCRecord", "Split"]
