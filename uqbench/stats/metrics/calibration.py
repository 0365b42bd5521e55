"""Calibration: reliability curve, ECE, MCE, Brier score, NLL."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from uqbench.stats.metrics._validation import (
    NLL_EPS,
    BinStrategy,
    FloatArray,
    IntArray,
    calibration_inputs,
    check_n_bins,
    prob_inputs,
)


@dataclass(frozen=True)
class ReliabilityCurve:
    """Per-bin statistics of a reliability diagram; see :func:`reliability_curve`.

    Attributes
    ----------
    confidence : ndarray of shape (n_bins,)
        Mean confidence of the examples in each bin; NaN for an empty bin.
    accuracy : ndarray of shape (n_bins,)
        Fraction correct in each bin; NaN for an empty bin.
    count : ndarray of shape (n_bins,)
        Number of examples in each bin (0 for an empty bin).
    edges : ndarray of shape (n_bins + 1,)
        Bin edges, non-decreasing, ``edges[0] == 0`` and ``edges[-1] == 1``. Bin ``b`` holds the
        confidences in ``(edges[b], edges[b + 1]]``; a confidence of exactly 0 is in bin 0.
    """

    confidence: FloatArray
    accuracy: FloatArray
    count: IntArray
    edges: FloatArray


def _bin_edges(conf: FloatArray, n_bins: int, strategy: str) -> FloatArray:
    if strategy == "uniform":
        return np.linspace(0.0, 1.0, n_bins + 1)
    if strategy == "quantile":
        edges = np.quantile(conf, np.linspace(0.0, 1.0, n_bins + 1))
        # Interpolated quantiles are monotone in exact arithmetic; make sure in floating point.
        edges = np.maximum.accumulate(edges)
        edges[0], edges[-1] = 0.0, 1.0
        return edges
    if strategy == "midpoint":
        # uncertainty-calibration's get_equal_bins: np.array_split of the sorted confidences
        # into min(n_bins, N) runs, an edge halfway between the last of a run and the first of
        # the next; with fewer confidences than bins, the bins above 1 stay empty
        s = np.sort(conf)
        parts = min(n_bins, s.size)
        size, longer = divmod(s.size, parts)  # array_split: the first `longer` runs one longer
        ends = np.cumsum(size + (np.arange(parts) < longer))[:-1]  # (parts - 1,) run starts
        inner = (s[ends - 1] + s[ends]) / 2.0
        return np.concatenate([[0.0], inner, np.ones(n_bins - parts + 1)])
    raise ValueError(f"strategy must be 'uniform', 'quantile' or 'midpoint'; got {strategy!r}")


def _bin_ids(conf: FloatArray, edges: FloatArray) -> NDArray[np.integer[Any]]:
    """Bin index of each confidence: the number of interior edges strictly below it.

    This is ``np.searchsorted(edges[1:-1], conf, side="left")``: a value equal to an interior
    edge goes to the lower bin, (l, u], and 0 goes to bin 0.
    """
    inner = edges[1:-1]
    if inner.size >= 63:
        return np.searchsorted(inner, conf, side="left")
    # For few bins, counting edge by edge is ~8x faster than a binary search per value. uint8
    # holds the ids of up to 63 bins, and 2 * id + 1 (see reliability_curve).
    ids = np.zeros(conf.size, dtype=np.uint8)
    above = np.empty(conf.size, dtype=bool)
    for edge in inner:
        np.greater(conf, edge, out=above)
        ids += above.view(np.uint8)
    return ids


def reliability_curve(
    confidence: ArrayLike,
    correct: ArrayLike,
    *,
    n_bins: int = 15,
    strategy: BinStrategy = "uniform",
) -> ReliabilityCurve:
    """Bin confidences and report mean confidence, accuracy and count per bin.

    This is the one binning behind :func:`expected_calibration_error`,
    :func:`max_calibration_error` and the reliability diagrams.

    Parameters
    ----------
    confidence : array-like of shape (N,)
        Confidence of each prediction, in [0, 1] (e.g. the maximum softmax probability).
    correct : array-like of shape (N,)
        Boolean or 0/1: whether each prediction was right.
    n_bins : int, default 15
        Number of bins.
    strategy : {"uniform", "quantile", "midpoint"}, default "uniform"
        ``"uniform"``: equal-width edges ``np.linspace(0, 1, n_bins + 1)``.
        ``"quantile"``: equal-mass edges at the quantiles of ``confidence``
        (``np.quantile``, linear interpolation: scikit-learn's
        ``calibration_curve(strategy="quantile")`` edges up to float rounding), with the outer
        edges then set to 0 and 1.
        ``"midpoint"``: equal-mass edges as ``uncertainty-calibration``'s ``get_equal_bins``
        (HELM's ``ece_10_bin``): the sorted confidences are cut into ``n_bins`` runs of equal
        size (``np.array_split``: the first ``N % n_bins`` runs one longer), each inner edge
        halfway between the last confidence of a run and the first of the next; with
        ``N < n_bins``, one run per confidence and the bins above them empty.

    Returns
    -------
    ReliabilityCurve
        ``confidence``, ``accuracy``, ``count`` of shape (n_bins,) and ``edges`` of shape
        (n_bins + 1,). Empty bins are kept, with count 0 and NaN confidence and accuracy.

    Notes
    -----
    Bins are right-closed, ``(edges[b], edges[b + 1]]``, and a confidence of exactly 0 falls in
    the first bin (Guo et al. 2017; scikit-learn's ``calibration_curve`` bins identically).
    netcal bins left-closed, ``[l, u)``; the two agree except for confidences lying exactly on an
    interior edge.

    Ties under ``"quantile"`` and ``"midpoint"``: examples are binned by value, so a group of
    equal confidences is never split. When many confidences are tied, several quantiles coincide; the duplicate edges
    are kept (so there are always ``n_bins`` bins), the whole tie group falls in the lowest bin
    whose upper edge equals its value, and the zero-width bins above it stay empty (count 0). Bin
    masses are then unequal; ECE is unaffected by empty bins.

    Examples
    --------
    >>> c = reliability_curve([0.1, 0.3, 0.55, 0.8, 0.95], [0, 0, 1, 1, 0], n_bins=2)
    >>> c.count, c.accuracy.round(3), c.confidence.round(3), c.edges
    (array([2, 3]), array([0.   , 0.667]), array([0.2  , 0.767]), array([0. , 0.5, 1. ]))
    """
    conf, corr = calibration_inputs(confidence, correct)
    check_n_bins(n_bins)
    edges = _bin_edges(conf, int(n_bins), strategy)
    bin_ids = _bin_ids(conf, edges)
    conf_sum = np.bincount(bin_ids, weights=conf, minlength=n_bins)
    # One integer bincount of 2 * bin + correct gives (wrong, right) counts per bin.
    by_outcome = np.bincount(2 * bin_ids + corr, minlength=2 * n_bins).reshape(n_bins, 2)
    count = by_outcome.sum(axis=1).astype(np.int64)
    correct_sum = by_outcome[:, 1]
    filled = count > 0
    mean_conf = np.divide(conf_sum, count, out=np.full(n_bins, np.nan), where=filled)
    accuracy = np.divide(correct_sum, count, out=np.full(n_bins, np.nan), where=filled)
    return ReliabilityCurve(confidence=mean_conf, accuracy=accuracy, count=count, edges=edges)


def _bin_gaps(curve: ReliabilityCurve) -> tuple[FloatArray, FloatArray]:
    """|accuracy - confidence| and weight n_b / N of the non-empty bins."""
    filled = curve.count > 0
    gaps = np.abs(curve.accuracy[filled] - curve.confidence[filled])
    weights = curve.count[filled] / curve.count.sum()
    return gaps, weights


def expected_calibration_error(
    confidence: ArrayLike,
    correct: ArrayLike,
    *,
    n_bins: int = 15,
    strategy: BinStrategy = "uniform",
) -> float:
    r"""Expected calibration error (ECE); lower is better, in [0, 1].

    .. math:: \mathrm{ECE} = \sum_b \frac{n_b}{N}\,\lvert \mathrm{acc}_b - \mathrm{conf}_b \rvert

    over the bins of :func:`reliability_curve` (empty bins contribute 0).

    Parameters
    ----------
    confidence : array-like of shape (N,)
        Confidence of each prediction, in [0, 1].
    correct : array-like of shape (N,)
        Boolean or 0/1: whether each prediction was right.
    n_bins : int, default 15
        Number of bins.
    strategy : {"uniform", "quantile", "midpoint"}, default "uniform"
        Equal-width bins ``(l, u]`` (0 in the first bin) or equal-mass bins (the "adaptive"
        ECE; ``"midpoint"``: HELM's ``ece_10_bin`` at ``n_bins=10``); see
        :func:`reliability_curve` for edges and ties.

    Returns
    -------
    float

    Examples
    --------
    Bins (0, .5] and (.5, 1]: 2/5 * |0 - 0.2| + 3/5 * |2/3 - 0.7667| = 0.08 + 0.06.

    >>> round(expected_calibration_error([0.1, 0.3, 0.55, 0.8, 0.95], [0, 0, 1, 1, 0],
    ...                                  n_bins=2), 6)
    0.14
    """
    gaps, weights = _bin_gaps(
        reliability_curve(confidence, correct, n_bins=n_bins, strategy=strategy)
    )
    return float(np.sum(weights * gaps))


def max_calibration_error(
    confidence: ArrayLike,
    correct: ArrayLike,
    *,
    n_bins: int = 15,
    strategy: BinStrategy = "uniform",
) -> float:
    r"""Maximum calibration error (MCE); lower is better, in [0, 1].

    .. math:: \mathrm{MCE} = \max_{b:\,n_b > 0} \lvert \mathrm{acc}_b - \mathrm{conf}_b \rvert

    over the non-empty bins of :func:`reliability_curve` (same binning as
    :func:`expected_calibration_error`).

    Parameters
    ----------
    confidence : array-like of shape (N,)
        Confidence of each prediction, in [0, 1].
    correct : array-like of shape (N,)
        Boolean or 0/1: whether each prediction was right.
    n_bins : int, default 15
        Number of bins.
    strategy : {"uniform", "quantile", "midpoint"}, default "uniform"
        See :func:`reliability_curve`.

    Returns
    -------
    float

    Examples
    --------
    >>> round(max_calibration_error([0.1, 0.3, 0.55, 0.8, 0.95], [0, 0, 1, 1, 0], n_bins=2), 6)
    0.2
    """
    gaps, _ = _bin_gaps(reliability_curve(confidence, correct, n_bins=n_bins, strategy=strategy))
    return float(np.max(gaps))


def _true_label_probs(p: FloatArray, y: NDArray[np.intp]) -> FloatArray:
    """p[i, y[i]] for each row, by one gather from the flattened (C-contiguous) matrix."""
    p = np.ascontiguousarray(p)
    return p.ravel()[np.arange(len(y)) * p.shape[1] + y]


def brier_score(probs: ArrayLike, labels: ArrayLike) -> float:
    r"""Multiclass Brier score; lower is better, in [0, 2].

    .. math:: \mathrm{BS} = \frac{1}{N}\sum_i \sum_c (p_{ic} - y_{ic})^2

    with :math:`y_i` the one-hot label. This is the multiclass (Brier 1950) form: for two classes
    it is twice scikit-learn's ``brier_score_loss``, which scores the positive class only.

    Parameters
    ----------
    probs : array-like of shape (N, C)
        Predictive distribution of each example; entries in [0, 1], rows summing to 1.
    labels : array-like of shape (N,)
        True class index of each example, in [0, C).

    Returns
    -------
    float

    Examples
    --------
    (0.7-1)^2 + 0.3^2 = 0.18 and 0^2 + (1-1)^2 = 0, mean 0.09.

    >>> round(brier_score([[0.7, 0.3], [0.0, 1.0]], [0, 1]), 6)
    0.09
    """
    p, y = prob_inputs(probs, labels)
    # mean_i sum_c (p_ic - y_ic)^2 = (sum_ic p_ic^2) / N - 2 mean_i p_i,label + 1,
    # without building the one-hot matrix; numpy's pairwise sum, not BLAS's dot, whose
    # threaded reduction gives other last bits at another thread count
    n = len(y)
    return float(np.square(p).sum() / n - 2.0 * np.mean(_true_label_probs(p, y)) + 1.0)


def negative_log_likelihood(probs: ArrayLike, labels: ArrayLike) -> float:
    r"""Mean negative log-likelihood of the true label; lower is better, >= 0.

    .. math:: \mathrm{NLL} = -\frac{1}{N}\sum_i \log \max(p_{i,y_i}, \varepsilon)

    with :math:`\varepsilon` = :data:`NLL_EPS` = 1e-12, so that a zero probability on the true
    label costs about 27.6 nats instead of infinity. Natural log (nats).

    Parameters
    ----------
    probs : array-like of shape (N, C)
        Predictive distribution of each example; entries in [0, 1], rows summing to 1.
    labels : array-like of shape (N,)
        True class index of each example, in [0, C).

    Returns
    -------
    float

    Examples
    --------
    (-log 0.5 - log 1) / 2 = 0.3466.

    >>> round(negative_log_likelihood([[0.5, 0.5], [0.0, 1.0]], [0, 1]), 4)
    0.3466
    """
    p, y = prob_inputs(probs, labels)
    return float(-np.mean(np.log(np.maximum(_true_label_probs(p, y), NLL_EPS))))


