"""Shared base for scorers over K stochastic predictions (MC-dropout passes, ensemble members).

The predictive distribution is the mean of the K softmax distributions,
``p̄ = (1/K) sum_k softmax(z_k)``; accuracy and calibration use it too.
"""
from __future__ import annotations

from typing import ClassVar

import numpy as np
from numpy.typing import NDArray

from uqbench import Outputs, Scorer
from uqbench.core.probs import entropy, softmax


class SampledScorer(Scorer):
    field: ClassVar[str]  # "mc_logits" or "member_logits"

    def samples(self, outputs: Outputs) -> NDArray[np.float64]:
        """(K, N, C) per-sample probabilities."""
        return softmax(getattr(outputs, self.field))

    def predictive(self, outputs: Outputs) -> NDArray[np.float64]:
        return self.samples(outputs).mean(axis=0)


class SampledMSP(SampledScorer):
    """``u = 1 - max_c p̄_c``."""

    def __call__(self, outputs: Outputs) -> NDArray[np.float64]:
        return 1.0 - self.predictive(outputs).max(axis=1)


class SampledEntropy(SampledScorer):
    """Total predictive entropy ``u = H(p̄)``."""

    def __call__(self, outputs: Outputs) -> NDArray[np.float64]:
        return entropy(self.predictive(outputs))


class SampledMutualInfo(SampledScorer):
    """Mutual information (BALD), the epistemic part: ``u = H(p̄) - (1/K) sum_k H(p_k)``.

    Clipped at 0 against round-off (it is non-negative by Jensen's inequality).
    """

    def __call__(self, outputs: Outputs) -> NDArray[np.float64]:
        p = self.samples(outputs)
        mi = entropy(p.mean(axis=0)) - entropy(p).mean(axis=0)
        return np.maximum(mi, 0.0)
