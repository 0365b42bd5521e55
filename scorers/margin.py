"""Top-2 margin: ``u = 1 - (p_(1) - p_(2))`` of the softmax distribution."""
from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from uqbench import Outputs, Scorer, register_scorer


@register_scorer("margin")
class Margin(Scorer):
    requires = frozenset({"logits"})

    def __call__(self, outputs: Outputs) -> NDArray[np.float64]:
        top2 = np.sort(self.predictive(outputs), axis=1)[:, -2:]
        return 1.0 - (top2[:, 1] - top2[:, 0])
