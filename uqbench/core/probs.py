"""Numerically stable probability helpers shared by scorers (pure numpy)."""
from __future__ import annotations

import numpy as np
from numpy.typing import NDArray
from scipy.special import entr, logsumexp
from scipy.special import softmax as _softmax


def softmax(logits: NDArray[np.float64], axis: int = -1) -> NDArray[np.float64]:
    """Row-wise softmax."""
    return np.asarray(_softmax(logits, axis=axis), dtype=np.float64)


def entropy(probs: NDArray[np.float64], axis: int = -1) -> NDArray[np.float64]:
    """Shannon entropy in nats, ``-sum p log p`` with ``0 log 0 = 0``."""
    return np.asarray(entr(probs).sum(axis=axis), dtype=np.float64)


def log_sum_exp(logits: NDArray[np.float64], axis: int = -1) -> NDArray[np.float64]:
    return np.asarray(logsumexp(logits, axis=axis), dtype=np.float64)
