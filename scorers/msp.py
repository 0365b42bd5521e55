"""Maximum softmax probability (Hendrycks & Gimpel, 2017): ``u = 1 - max_c p_c``."""
from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from uqbench import Outputs, Scorer, register_scorer


@register_scorer("msp")
class MSP(Scorer):
    requires = frozenset({"logits"})

    def __call__(self, outputs: Outputs) -> NDArray[np.float64]:
        return 1.0 - self.predictive(outputs).max(axis=1)
