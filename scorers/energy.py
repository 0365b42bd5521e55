"""Energy score (Liu et al., 2020): ``u = -T log sum_c exp(z_c / T)`` with ``T = 1``.

Low logsumexp (no choice scored highly) means high energy, i.e. more uncertain / more OOD.
"""
from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from uqbench import Outputs, Scorer, register_scorer
from uqbench.core.probs import log_sum_exp


@register_scorer("energy")
class Energy(Scorer):
    requires = frozenset({"logits"})
    temperature: float = 1.0

    def __call__(self, outputs: Outputs) -> NDArray[np.float64]:
        t = self.temperature
        return -t * log_sum_exp(self.logits_of(outputs) / t)
