"""Predictive entropy ``u = -sum_c p_c log p_c`` (nats) of the softmax distribution."""
from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from uqbench import Outputs, Scorer, register_scorer
from uqbench.core.probs import entropy


@register_scorer("entropy")
class Entropy(Scorer):
    requires = frozenset({"logits"})

    def __call__(self, outputs: Outputs) -> NDArray[np.float64]:
        return entropy(self.predictive(outputs))
