"""Calibration: reliability curve, ECE, MCE, Brier score, NLL."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from uqbench.stats.metrics._validation import (
    NLL_EPS,
    BinStrategy,
    BoolArray,
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
    """(B, n_bins + 1) edges of each row of the (B, N) confidences."""
    if strategy == "uniform":
        return np.broadcast_to(np.linspace(0.0, 1.0, n_bins + 1), (len(conf), n_bins + 1))
    if strategy == "quantile":
        edges = np.quantile(conf, np.linspace(0.0, 1.0, n_bins + 1), axis=1).T
        # Interpolated quantiles are monotone in exact arithmetic; make sure in floating point.
        edges = np.maximum.accumulate(edges, axis=1)
        edges[:, 0], edges[:, -1] = 0.0, 1.0
        return edges
    if strategy == "midpoint":
        # uncertainty-calibration's get_equal_bins: np.array_split of the sorted confidences
        # into min(n_bins, N) runs, an edge halfway between the last of a run and the first of
        # the next; with fewer confidences than bins, the bins above 1 stay empty
        s = np.sort(conf, axis=1)
        parts = min(n_bins, s.shape[1])
        size, longer = divmod(s.shape[1], parts)  # array_split: the first `longer` runs longer
        ends = np.cumsum(size + (np.arange(parts) < longer))[:-1]  # (parts - 1,) run starts
        inner = (s[:, ends - 1] + s[:, ends]) / 2.0
        rows = len(conf)
        return np.concatenate([np.zeros((rows, 1)), inner, np.ones((rows, n_bins - parts + 1))],
                              axis=1)
    raise ValueError(f"strategy must be 'uniform', 'quantile' or 'midpoint'; got {strategy!r}")


def _bin_ids(conf: FloatArray, edges: FloatArray) -> NDArray[np.integer[Any]]:
    """(B, N) bin index of each confidence of the rows: the number of interior edges of its
    row strictly below it.

    This is ``np.searchsorted(edges[b, 1:-1], conf[b], side="left")``: a value equal to an
    interior edge goes to the lower bin, (l, u], and 0 goes to bin 0.
    """
    inner = edges[:, 1:-1]
    if inner.shape[1] >= 63:
        return np.stack(
            [np.searchsorted(e, c, side="left") for e, c in zip(inner, conf, strict=False)]
        )
    # For few bins, counting edge by edge is ~8x faster than a binary search per value. uint8
    # holds the ids of up to 63 bins, and 2 * id + 1 (see reliability_curve).
    ids = np.zeros(conf.shape, dtype=np.uint8)
    above = np.empty(conf.shape, dtype=bool)
    for edge in inner.T:
        np.greater(conf, edge[:, None], out=above)
        ids += above.view(np.uint8)
    return ids


def _curve_rows(conf: FloatArray, corr: BoolArray, n_bins: int, strategy: str
                ) -> tuple[FloatArray, FloatArray, IntArray, FloatArray]:
    """Mean confidence, accuracy (NaN in an empty bin), count and edges of each bin of each
    row of the (B, N) confidences and correctness: (B, n_bins) each, edges (B, n_bins + 1).
    The one binning of :func:`reliability_curve` (a single row) and of the calibration errors'
    bootstrap (a row per resample)."""
    rows = len(conf)
    edges = _bin_edges(conf, n_bins, strategy)
    bin_ids = _bin_ids(conf, edges) + n_bins * np.arange(rows)[:, None]   # (B, N) into B * K
    conf_sum = np.bincount(bin_ids.ravel(), weights=conf.ravel(), minlength=rows * n_bins)
    # One integer bincount of 2 * bin + correct gives (wrong, right) counts per bin.
    by_outcome = np.bincount((2 * bin_ids + corr).ravel(), minlength=2 * rows * n_bins)
    by_outcome = by_outcome.reshape(rows, n_bins, 2)
    count = by_outcome.sum(axis=2).astype(np.int64)
    correct_sum = by_outcome[..., 1]
    filled = count > 0
    mean_conf = np.divide(conf_sum.reshape(rows, n_bins), count, where=filled,
                          out=np.full((rows, n_bins), np.nan))
    accuracy = np.divide(correct_sum, count, out=np.full((rows, n_bins), np.nan), where=filled)
    return mean_conf, accuracy, count, edges


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
    equal confidences is never split. When many confidences are tied, several quantiles coincide;
    the duplicate edges are kept (so there are always ``n_bins`` bins), the whole tie group falls in
    the lowest bin whose upper edge equals its value, and the zero-width bins above it stay empty
    (count 0). Bin masses are then unequal; ECE is unaffected by empty bins.

    Examples
    --------
    >>> c = reliability_curve([0.1, 0.3, 0.55, 0.8, 0.95], [0, 0, 1, 1, 0], n_bins=2)
    >>> c.count, c.accuracy.round(3), c.confidence.round(3), c.edges
    (array([2, 3]), array([0.   , 0.667]), array([0.2  , 0.767]), array([0. , 0.5, 1. ]))
    """
    conf, corr = calibration_inputs(confidence, correct)
    check_n_bins(n_bins)
    mean_conf, accuracy, count, edges = _curve_rows(conf[None], corr[None], int(n_bins),
                                                    strategy)
    return ReliabilityCurve(confidence=mean_conf[0], accuracy=accuracy[0], count=count[0],
                            edges=edges[0])


def calibration_errors(conf: FloatArray, corr: BoolArray, *, n_bins: int, strategy: str
                       ) -> tuple[FloatArray, FloatArray]:
    """(ECE, MCE) of each row of the (B, N) confidences and correctness, (B,) each: the one
    definition of :func:`expected_calibration_error` and :func:`max_calibration_error` (a
    single row) and of their bootstrap (a row per resample, `calibration_resampler`)."""
    mean_conf, accuracy, count, _ = _curve_rows(conf, corr, n_bins, strategy)
    filled = count > 0
    gaps = np.abs(accuracy - mean_conf)        # NaN in an empty bin
    weighted = count / count.sum(axis=1, keepdims=True) * gaps
    # each row summed over its non-empty bins alone (np.sum's grouping, hence its last bits,
    # depends on how many terms it adds)
    ece = np.array([np.sum(w[f]) for w, f in zip(weighted, filled, strict=False)])
    return ece, np.max(np.where(filled, gaps, -np.inf), axis=1)


def calibration_resampler(confidence: ArrayLike, correct: ArrayLike, *, n_bins: int = 15,
                          strategy: BinStrategy = "uniform", largest: bool = False
                          ) -> Callable[[IntArray], FloatArray]:
    """``idx -> (B,)``: the ECE (``largest``: the MCE) of each (B, N) resample ``idx``, equal
    to the metric on each resample (`uqbench.stats.metrics.Resampled`)."""
    conf, corr = calibration_inputs(confidence, correct)
    check_n_bins(n_bins)
    pick = int(largest)

    def stat(idx: IntArray) -> FloatArray:
        return calibration_errors(conf[idx], corr[idx], n_bins=int(n_bins),
                                  strategy=strategy)[pick]

    return stat


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
    return _on_all(calibration_resampler(confidence, correct, n_bins=n_bins,
                                         strategy=strategy), correct)


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
    return _on_all(calibration_resampler(confidence, correct, n_bins=n_bins,
                                         strategy=strategy, largest=True), correct)


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
    return _on_all(brier_resampler(probs, labels), labels)


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
    return _on_all(nll_resampler(probs, labels), labels)


def _on_all(stat: Callable[[IntArray], FloatArray], examples: ArrayLike) -> float:
    """A resampler's statistic on the identity resample: the metric on every example."""
    return float(stat(np.arange(len(examples))[None])[0])   # type: ignore[arg-type]


def brier_resampler(probs: ArrayLike, labels: ArrayLike) -> Callable[[IntArray], FloatArray]:
    """``idx -> (B,)``: :func:`brier_score` of each (B, N) resample ``idx`` (the one
    definition: the score is this on the identity resample)."""
    p, y = prob_inputs(probs, labels)
    # mean_i sum_c (p_ic - y_ic)^2 = (sum_ic p_ic^2) / N - 2 mean_i p_i,label + 1,
    # without building the one-hot matrix; numpy's pairwise sum, not BLAS's dot, whose
    # threaded reduction gives other last bits at another thread count
    square, true, n = np.square(p), _true_label_probs(p, y), len(y)
    return lambda idx: (square[idx].reshape(len(idx), -1).sum(axis=1) / n
                        - 2.0 * np.mean(true[idx], axis=1) + 1.0)


def nll_resampler(probs: ArrayLike, labels: ArrayLike) -> Callable[[IntArray], FloatArray]:
    """``idx -> (B,)``: :func:`negative_log_likelihood` of each (B, N) resample ``idx`` (the
    one definition, as `brier_resampler`)."""
    p, y = prob_inputs(probs, labels)
    log_p = np.log(np.maximum(_true_label_probs(p, y), NLL_EPS))
    return lambda idx: -np.mean(log_p[idx], axis=1)
