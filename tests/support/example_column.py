"""The README's "A results column" example, verbatim (tests: test_columns, test_readme)."""
# my_columns.py -- then: uqbench run --plugin my_columns (every results table gains the column)
import numpy as np

from uqbench.results.columns import register_column


@register_column("conf_gap", reads=(("id", "confidence"), ("id", "correct")), level="model",
                 higher_is_better=False, header="Gap")
def confidence_gap(confidence: np.ndarray, correct: np.ndarray) -> float:
    """|mean confidence - accuracy| on the ID split: calibration in the large."""
    return float(abs(np.mean(confidence) - np.mean(correct)))
