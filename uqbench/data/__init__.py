"""Real data: loaders into one multiple-choice record, built splits, suites."""
from uqbench.data.records import MCRecord, Split

__all__ = ["MCRecord", "Split"]
