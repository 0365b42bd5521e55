"""CARE's uncertainty read-out (paper Eq. "uq"): ``u = (1 - w) * mean H(p) + w * mean D``.

``mean H(p)`` is the normalised routing entropy and ``mean D`` the admitted-expert disagreement,
both averaged over the example's tokens and MoE layers (``w = 0.5`` in the paper). Calibration uses
the MSP of the model's softmax, as the paper's Table "uq" does.
"""
from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from uqbench import Outputs, Scorer, register_scorer


@register_scorer("care")
class Care(Scorer):
    requires = frozenset({"logits", "route_entropy", "disagreement"})

    def __init__(self, w: float = 0.5) -> None:
        if not 0.0 <= w <= 1.0:
            raise ValueError(f"care scorer: w must lie in [0, 1], got {w}")
        self.w = w

    def __call__(self, outputs: Outputs) -> NDArray[np.float64]:
        assert outputs.route_entropy is not None and outputs.disagreement is not None
        return (1.0 - self.w) * outputs.route_entropy + self.w * outputs.disagreement
