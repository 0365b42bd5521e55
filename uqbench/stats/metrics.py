"""Metrics for calibration, OOD detection and selective prediction: pure functions on arrays.

Conventions shared by every function here:

- Inputs are per-example 1-D arrays of length N (``probs`` is (N, C)). Inputs are validated
  (finite, 1-D, non-empty, equal lengths, [0, 1] where a probability is expected) and a bad one
  raises ``ValueError`` naming the argument and what was expected.
- ``uncertainty``: higher = more uncertain. ``confidence``: in [0, 1], higher = more confident.
  ``correct``: boolean or 0/1, True where the prediction was right.
- ``*_error``, ``*_loss``-like metrics (ECE, MCE, Brier, NLL, AURC, E-AURC, AUGRC, FPR@95TPR):
  lower is better. AUROC, AUPR, selective accuracy: higher is better.
- OOD detection: the OOD (shifted) split is the **positive** class and the score is the
  uncertainty. The ranking metrics use one private sort-and-group-ties helper
  (:func:`_tie_groups`), so tied scores always move together; the ROC / precision-recall counts
  are the same as scikit-learn's (``roc_curve(..., drop_intermediate=False)``,
  ``roc_auc_score``, ``average_precision_score``), which the tests check, but computed without
  scikit-learn's stable argsort so that 10^6 examples take milliseconds. On tied scores AUROC,
  AURC/E-AURC, AUGRC and selective accuracy equal their expectation over uniformly random
  orderings inside the tie groups (AUROC's half credit; AUGRC's errors growing linearly inside
  a group; selective accuracy's pro rata share of a straddling group; AURC's closed form in
  :func:`aurc`); AUPR and FPR@95TPR keep scikit-learn's convention (ties move together).
- Curves come before summaries (:func:`reliability_curve` -> ECE/MCE,
  :func:`risk_coverage_curve` -> AURC/E-AURC, :func:`ood_roc_curve` -> FPR@95TPR) so that
  figures draw exactly the binning and points the numbers were computed from.
- Degenerate but valid input is not an error: a single class in ``correct`` gives risk 0 or 1,
  and the OOD metrics cannot see a single class because an empty split is a ``ValueError``. The
  convention for a metric that is undefined on its input is a :class:`UndefinedMetricWarning` and
  NaN (:func:`mean_std` follows it for NaN values); :func:`bootstrap_ci` drops NaN resamples.
"""
from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal, NamedTuple

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = [
    "per_seed",
    "seed_mean",
    "ECE_BINS",
    "NLL_EPS",
    "SELECTIVE_COVERAGE",
    "PairedInterval",
    "RESAMPLED_OOD_AUROC",
    "ReliabilityCurve",
    "Resampled",
    "UndefinedMetricWarning",
    "augrc",
    "aupr_in",
    "aupr_out",
    "aurc",
    "bootstrap_ci",
    "bootstrap_ci_two_sample",
    "brier_score",
    "e_aurc",
    "expected_calibration_error",
    "fpr_at_95_tpr",
    "max_calibration_error",
    "mean_std",
    "negative_log_likelihood",
    "ood_auroc",
    "ood_roc_curve",
    "paired_bootstrap",
    "paired_difference",
    "reliability_curve",
    "resampled_selective_summary",
    "risk_coverage_curve",
    "selective_accuracy",
    "selective_summary",
]

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]
BoolArray = NDArray[np.bool_]
BinStrategy = Literal["uniform", "quantile"]

#: Probabilities are clipped to at least this value before the log in
#: :func:`negative_log_likelihood`, so a zero probability on the true label costs
#: ``-log(1e-12) ~= 27.6`` instead of infinity.
NLL_EPS = 1e-12

#: The benchmark's calibration bins: the results table's ECE, ECE-ad and MCE, the reliability
#: figures and the paper's ECE claim all use this many.
ECE_BINS = 12

#: The benchmark's selective-prediction coverage: the ``sel_acc_80`` columns, the
#: risk-coverage figure's marked point and the paper's selective claims.
SELECTIVE_COVERAGE = 0.8

# Probability rows may deviate from summing to 1 by float32 softmax rounding, not more.
_ROW_SUM_ATOL = 1e-3

# selective_accuracy: coverage * N within this relative distance of an integer is that integer.
_CEIL_RTOL = 1e-9

# bootstrap_ci warns when more than this fraction of resamples was undefined (NaN) and dropped.
_MAX_DROPPED_FRACTION = 0.05


class UndefinedMetricWarning(UserWarning):
    """A metric is undefined on its input (e.g. a single class); NaN was returned."""


# --------------------------------------------------------------------------------------------
# validation (shared by every public function)
# --------------------------------------------------------------------------------------------


def _numeric(x: ArrayLike, name: str) -> NDArray[Any]:
    arr = np.asarray(x)
    if arr.dtype.kind not in "biuf":
        raise ValueError(f"{name} must be a real numeric array; got dtype {arr.dtype}")
    return arr


def _check_shape(arr: NDArray[Any], name: str, ndim: int, shape_doc: str) -> None:
    if arr.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D of shape {shape_doc}; got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name} must not be empty; got shape {arr.shape}")


def _check_finite(arr: NDArray[Any], name: str) -> None:
    if arr.dtype.kind == "f" and not np.isfinite(arr).all():
        bad = ~np.isfinite(arr)
        first = np.unravel_index(int(np.argmax(bad)), arr.shape)
        where = first[0] if len(first) == 1 else first
        raise ValueError(
            f"{name} must be finite; got {int(bad.sum())} NaN/inf value(s), "
            f"the first {arr[first]} at index {where}"
        )


def _check_unit_interval(arr: FloatArray, name: str) -> None:
    lo, hi = float(arr.min()), float(arr.max())
    if lo < 0.0:
        raise ValueError(f"{name} must lie in [0, 1]; got min {lo:g}")
    if hi > 1.0:
        raise ValueError(f"{name} must lie in [0, 1]; got max {hi:g}")


def _check_probabilities(arr: FloatArray, name: str) -> None:
    """Finite and in [0, 1]; one min/max pass when the input is fine."""
    if not (arr.min() >= 0.0 and arr.max() <= 1.0):  # also false for NaN
        _check_finite(arr, name)
        _check_unit_interval(arr, name)


def _float_vector(x: ArrayLike, name: str, *, unit_interval: bool = False) -> FloatArray:
    arr = _numeric(x, name)
    _check_shape(arr, name, 1, "(N,)")
    arr = arr.astype(np.float64, copy=False)
    if unit_interval:
        _check_probabilities(arr, name)
    else:
        _check_finite(arr, name)
    return arr


def _bool_vector(x: ArrayLike, name: str) -> BoolArray:
    arr = _numeric(x, name)
    _check_shape(arr, name, 1, "(N,)")
    if arr.dtype.kind == "b":
        return arr
    if arr.dtype.kind == "f":
        _check_finite(arr, name)
    # Integers with min >= 0 and max <= 1 are 0/1: a fast path for valid input.
    if arr.dtype.kind == "f" or not (arr.min() >= 0 and arr.max() <= 1):
        is01 = (arr == 0) | (arr == 1)
        if not is01.all():
            i = int(np.argmin(is01))
            raise ValueError(f"{name} must be boolean or 0/1; got {arr[i]} at index {i}")
    return arr.astype(bool)


def _probs_matrix(x: ArrayLike, name: str = "probs") -> FloatArray:
    arr = _numeric(x, name)
    _check_shape(arr, name, 2, "(N, C)")
    arr = arr.astype(np.float64, copy=False)
    _check_probabilities(arr, name)
    sums = arr @ np.ones(arr.shape[1])  # several times faster than arr.sum(axis=1) for small C
    off = np.abs(sums - 1.0) > _ROW_SUM_ATOL
    if off.any():
        i = int(np.argmax(off))
        raise ValueError(
            f"{name} rows must sum to 1 (within {_ROW_SUM_ATOL:g}); got row {i} summing to "
            f"{sums[i]:g}: pass probabilities (softmax of the logits), not logits or scores"
        )
    return arr


def _label_vector(x: ArrayLike, n_classes: int, name: str = "labels") -> NDArray[np.intp]:
    arr = _numeric(x, name)
    _check_shape(arr, name, 1, "(N,)")
    if arr.dtype.kind == "b":
        raise ValueError(f"{name} must be integer class indices; got a boolean array")
    if arr.dtype.kind == "f":
        _check_finite(arr, name)
        frac = arr != np.round(arr)
        if frac.any():
            i = int(np.argmax(frac))
            raise ValueError(
                f"{name} must be integer class indices; got {arr[i]} at index {i}"
            )
    lo, hi = arr.min(), arr.max()
    if lo < 0 or hi >= n_classes:
        bad = lo if lo < 0 else hi
        raise ValueError(
            f"{name} must be class indices in [0, {n_classes}) for probs with {n_classes} "
            f"columns; got {bad}"
        )
    return arr.astype(np.intp, copy=False)


def _check_same_length(first: tuple[str, NDArray[Any]], *others: tuple[str, NDArray[Any]]) -> None:
    name0, arr0 = first
    for name, arr in others:
        if len(arr) != len(arr0):
            raise ValueError(
                f"{name0} and {name} must have the same length; got {len(arr0)} and {len(arr)}"
            )


def _check_n_bins(n_bins: int) -> None:
    if isinstance(n_bins, bool) or not isinstance(n_bins, (int, np.integer)) or n_bins < 1:
        raise ValueError(f"n_bins must be a positive integer; got {n_bins!r}")


def _check_fraction(value: float, name: str, *, open_right: bool) -> float:
    """``value`` in (0, 1) or, when not ``open_right``, in (0, 1]."""
    is_number = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
        value, bool
    )
    v = float(value) if is_number else math.nan
    if not (0.0 < v < 1.0 or (v == 1.0 and not open_right)):
        interval = "(0, 1)" if open_right else "(0, 1]"
        raise ValueError(f"{name} must be a number in {interval}; got {value!r}")
    return v


def _calibration_inputs(confidence: ArrayLike, correct: ArrayLike) -> tuple[FloatArray, BoolArray]:
    conf = _float_vector(confidence, "confidence", unit_interval=True)
    corr = _bool_vector(correct, "correct")
    _check_same_length(("confidence", conf), ("correct", corr))
    return conf, corr


def _prob_inputs(probs: ArrayLike, labels: ArrayLike) -> tuple[FloatArray, NDArray[np.intp]]:
    p = _probs_matrix(probs)
    y = _label_vector(labels, p.shape[1])
    _check_same_length(("probs", p), ("labels", y))
    return p, y


def _ood_inputs(
    uncertainty_id: ArrayLike, uncertainty_ood: ArrayLike
) -> tuple[FloatArray, FloatArray]:
    # Lengths may differ: the two splits are independent samples.
    return (_float_vector(uncertainty_id, "uncertainty_id"),
            _float_vector(uncertainty_ood, "uncertainty_ood"))


# --------------------------------------------------------------------------------------------
# calibration
# --------------------------------------------------------------------------------------------


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
    raise ValueError(f"strategy must be 'uniform' or 'quantile'; got {strategy!r}")


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
    strategy : {"uniform", "quantile"}, default "uniform"
        ``"uniform"``: equal-width edges ``np.linspace(0, 1, n_bins + 1)``.
        ``"quantile"``: equal-mass edges at the quantiles of ``confidence``
        (``np.quantile``, linear interpolation: scikit-learn's
        ``calibration_curve(strategy="quantile")`` edges up to float rounding), with the outer
        edges then set to 0 and 1.

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

    Ties under ``"quantile"``: examples are binned by value, so a group of equal confidences is
    never split. When many confidences are tied, several quantiles coincide; the duplicate edges
    are kept (so there are always ``n_bins`` bins), the whole tie group falls in the lowest bin
    whose upper edge equals its value, and the zero-width bins above it stay empty (count 0). Bin
    masses are then unequal; ECE is unaffected by empty bins.

    Examples
    --------
    >>> c = reliability_curve([0.1, 0.3, 0.55, 0.8, 0.95], [0, 0, 1, 1, 0], n_bins=2)
    >>> c.count, c.accuracy.round(3), c.confidence.round(3), c.edges
    (array([2, 3]), array([0.   , 0.667]), array([0.2  , 0.767]), array([0. , 0.5, 1. ]))
    """
    conf, corr = _calibration_inputs(confidence, correct)
    _check_n_bins(n_bins)
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
    strategy : {"uniform", "quantile"}, default "uniform"
        Equal-width bins ``(l, u]`` (0 in the first bin) or equal-mass bins (the "adaptive"
        ECE); see :func:`reliability_curve` for edges and ties.

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
    strategy : {"uniform", "quantile"}, default "uniform"
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
    p, y = _prob_inputs(probs, labels)
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
    p, y = _prob_inputs(probs, labels)
    return float(-np.mean(np.log(np.maximum(_true_label_probs(p, y), NLL_EPS))))


# --------------------------------------------------------------------------------------------
# ranking core: one sort, ties grouped
# --------------------------------------------------------------------------------------------


class _TieGroups(NamedTuple):
    values: FloatArray  # (G,) distinct keys, ascending
    n_upto: IntArray  # (G,) number of examples with key <= values[g]
    hits_upto: IntArray  # (G,) number of hit examples with key <= values[g]


def _tie_groups(hit_keys: FloatArray, other_keys: FloatArray) -> _TieGroups:
    """Sort all keys ascending, group equal keys, count examples and hits up to each group.

    ``hit_keys`` are the keys of the flagged examples (errors, or positives), ``other_keys`` the
    rest. Every threshold metric (risk-coverage, ROC, precision-recall) is a function of these
    cumulative counts at the end of each tie group, so tied examples are always
    accepted/rejected together.
    """
    # Sorting the two parts separately (fast SIMD sorts) leaves two sorted runs; a stable sort
    # merges them in linear time (timsort) and its order tells which part each key came from.
    # This is several times faster than one argsort of all keys with the flags carried along.
    merged = np.concatenate([np.sort(hit_keys), np.sort(other_keys)])
    order = np.argsort(merged, kind="stable")
    sorted_keys = merged[order]
    hits_so_far = np.cumsum(order < hit_keys.size, dtype=np.int64)
    ends = np.flatnonzero(sorted_keys[1:] != sorted_keys[:-1])
    ends = np.append(ends, sorted_keys.size - 1)
    n_upto = (ends + 1).astype(np.int64, copy=False)
    return _TieGroups(sorted_keys[ends], n_upto, hits_so_far[ends])


def _binary_counts(
    score_pos: FloatArray, score_neg: FloatArray
) -> tuple[IntArray, IntArray, FloatArray]:
    """(fps, tps, thresholds) at each distinct score, descending, as sklearn's _binary_clf_curve.

    ``tps[g]`` / ``fps[g]`` count positives / negatives with score >= ``thresholds[g]``.
    """
    # Ascending order of -score is descending order of score.
    groups = _tie_groups(-score_pos, -score_neg)
    tps = groups.hits_upto
    return groups.n_upto - tps, tps, -groups.values


def _average_precision(score_pos: FloatArray, score_neg: FloatArray) -> float:
    fps, tps, _ = _binary_counts(score_pos, score_neg)
    precision = tps / (tps + fps)
    recall_steps = np.diff(tps, prepend=0)
    return float(np.sum(recall_steps * precision) / tps[-1])


# --------------------------------------------------------------------------------------------
# OOD detection (OOD = positive class, score = uncertainty)
# --------------------------------------------------------------------------------------------


def ood_roc_curve(
    uncertainty_id: ArrayLike, uncertainty_ood: ArrayLike
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """ROC curve of detecting OOD examples by thresholding the uncertainty.

    An example is flagged OOD when its uncertainty is >= the threshold. OOD is the positive
    class: TPR = fraction of OOD flagged, FPR = fraction of ID flagged.

    Parameters
    ----------
    uncertainty_id : array-like of shape (N_id,)
        Uncertainty of the in-distribution examples (higher = more uncertain).
    uncertainty_ood : array-like of shape (N_ood,)
        Uncertainty of the OOD (shifted) examples; the length may differ from ``N_id``.

    Returns
    -------
    fpr, tpr : ndarray of shape (G + 1,)
        Non-decreasing, from (0, 0) to (1, 1).
    thresholds : ndarray of shape (G + 1,)
        Decreasing: ``inf`` and then each of the G distinct uncertainty values.

    Notes
    -----
    Identical to scikit-learn's ``roc_curve(y, u, drop_intermediate=False)`` with ``y = 1`` for
    OOD (tested), with one point per distinct value so that ties move together. Collinear points
    are kept: they matter for :func:`fpr_at_95_tpr`.

    Examples
    --------
    >>> fpr, tpr, thr = ood_roc_curve([0.1, 0.4], [0.4, 0.9])
    >>> fpr, tpr, thr
    (array([0. , 0. , 0.5, 1. ]), array([0. , 0.5, 1. , 1. ]), array([inf, 0.9, 0.4, 0.1]))
    """
    u_id, u_ood = _ood_inputs(uncertainty_id, uncertainty_ood)
    fps, tps, thresholds = _binary_counts(u_ood, u_id)
    fps = np.r_[0, fps]
    tps = np.r_[0, tps]
    return fps / fps[-1], tps / tps[-1], np.r_[np.inf, thresholds]


def ood_auroc(uncertainty_id: ArrayLike, uncertainty_ood: ArrayLike) -> float:
    r"""Area under :func:`ood_roc_curve`: OOD detection AUROC; higher is better, in [0, 1].

    .. math:: \mathrm{AUROC} = P(u_{ood} > u_{id}) + \tfrac12 P(u_{ood} = u_{id})

    for an independent ID/OOD pair, i.e. the trapezoid area under the ROC curve (ties count
    one half); 0.5 is chance. Equals scikit-learn's ``roc_auc_score`` with OOD as class 1.
    ``ood_auroc(a, b) == 1 - ood_auroc(b, a)``.

    Parameters
    ----------
    uncertainty_id : array-like of shape (N_id,)
        Uncertainty of the in-distribution examples.
    uncertainty_ood : array-like of shape (N_ood,)
        Uncertainty of the OOD examples.

    Returns
    -------
    float

    Examples
    --------
    Pairs (id, ood): (.1,.4) win, (.1,.9) win, (.4,.4) tie, (.4,.9) win: 3.5/4.

    >>> ood_auroc([0.1, 0.4], [0.4, 0.9])
    0.875
    """
    u_id, u_ood = _ood_inputs(uncertainty_id, uncertainty_ood)
    return _auroc(_tie_groups(-u_ood, -u_id))


def _auroc(groups: _TieGroups) -> float:
    """AUROC from the tie groups of ``-uncertainty`` with OOD as the hits."""
    tps = np.r_[0, groups.hits_upto]
    fps = np.r_[0, groups.n_upto] - tps
    # Twice the trapezoid area in integer counts: exact, then one division.
    twice_area = np.sum(np.diff(fps) * (tps[1:] + tps[:-1]))
    return float(twice_area / (2.0 * fps[-1] * tps[-1]))


def aupr_out(uncertainty_id: ArrayLike, uncertainty_ood: ArrayLike) -> float:
    r"""Area under the precision-recall curve with OOD positive (AUPR-Out); higher is better.

    Average precision with OOD as the positive class and score = uncertainty:

    .. math:: \mathrm{AP} = \sum_t (R_t - R_{t-1})\,P_t

    over the distinct thresholds t (descending), with precision :math:`P_t` and recall
    :math:`R_t` of flagging ``uncertainty >= t``. Equals scikit-learn's
    ``average_precision_score`` (tested). In (0, 1]; a random score gives about the OOD fraction.

    Parameters
    ----------
    uncertainty_id : array-like of shape (N_id,)
        Uncertainty of the in-distribution examples.
    uncertainty_ood : array-like of shape (N_ood,)
        Uncertainty of the OOD examples.

    Returns
    -------
    float

    Examples
    --------
    Thresholds .9: P=1, R=1/2; .4: P=2/3, R=1: AP = 1/2 * 1 + 1/2 * 2/3.

    >>> round(aupr_out([0.1, 0.4], [0.4, 0.9]), 6)
    0.833333
    """
    u_id, u_ood = _ood_inputs(uncertainty_id, uncertainty_ood)
    return _average_precision(u_ood, u_id)


def aupr_in(uncertainty_id: ArrayLike, uncertainty_ood: ArrayLike) -> float:
    """Area under the precision-recall curve with ID positive (AUPR-In); higher is better.

    Average precision (as in :func:`aupr_out`) with the in-distribution examples as the positive
    class and score = -uncertainty (the least uncertain are the most surely ID).

    Parameters
    ----------
    uncertainty_id : array-like of shape (N_id,)
        Uncertainty of the in-distribution examples.
    uncertainty_ood : array-like of shape (N_ood,)
        Uncertainty of the OOD examples.

    Returns
    -------
    float

    Examples
    --------
    Scores -.1 (ID): P=1, R=1/2; -.4 (ID and OOD tied): P=2/3, R=1.

    >>> round(aupr_in([0.1, 0.4], [0.4, 0.9]), 6)
    0.833333
    """
    u_id, u_ood = _ood_inputs(uncertainty_id, uncertainty_ood)
    return _average_precision(-u_id, -u_ood)


def fpr_at_95_tpr(uncertainty_id: ArrayLike, uncertainty_ood: ArrayLike) -> float:
    """Fraction of ID examples flagged at the first threshold that catches >= 95% of OOD.

    Lower is better, in [0, 1]. Read off :func:`ood_roc_curve` (scikit-learn's ``roc_curve``
    points): the FPR at the first (highest) threshold whose TPR >= 0.95. Ties move together, so
    the TPR there may exceed 0.95; no interpolation between points.

    Parameters
    ----------
    uncertainty_id : array-like of shape (N_id,)
        Uncertainty of the in-distribution examples.
    uncertainty_ood : array-like of shape (N_ood,)
        Uncertainty of the OOD examples.

    Returns
    -------
    float

    Examples
    --------
    Catching both OOD examples needs threshold 0.4, which also flags the ID example at 0.4.

    >>> fpr_at_95_tpr([0.1, 0.4], [0.4, 0.9])
    0.5
    """
    fpr, tpr, _ = ood_roc_curve(uncertainty_id, uncertainty_ood)
    return float(fpr[int(np.searchsorted(tpr, 0.95, side="left"))])


# --------------------------------------------------------------------------------------------
# selective prediction on (uncertainty, correct)
# --------------------------------------------------------------------------------------------


def _selective_inputs(uncertainty: ArrayLike, correct: ArrayLike) -> tuple[FloatArray, BoolArray]:
    u = _float_vector(uncertainty, "uncertainty")
    corr = _bool_vector(correct, "correct")
    _check_same_length(("uncertainty", u), ("correct", corr))
    return u, corr


def _selective_groups(uncertainty: ArrayLike, correct: ArrayLike) -> _TieGroups:
    u, corr = _selective_inputs(uncertainty, correct)
    return _tie_groups(u[~corr], u[corr])


def _aurc(groups: _TieGroups) -> float:
    """Expected trapezoid AURC over random orderings inside tie groups (see :func:`aurc`)."""
    n_upto, errors_upto = groups.n_upto, groups.hits_upto
    n = int(n_upto[-1])
    size = np.diff(n_upto, prepend=0)  # (G,) examples per tie group
    group_errors = np.diff(errors_upto, prepend=0)
    group = np.repeat(np.arange(size.size), size)  # (N,) tie group of each accepted position
    accepted = np.arange(1, n + 1)  # (N,) i = 1..N
    into_group = accepted - (n_upto - size)[group]  # (N,) j = 1..n_g
    # Expected errors among the first j of a group of n_g holding e_g errors: j * e_g / n_g.
    errors_before = (errors_upto - group_errors)[group]
    expected_errors = errors_before + into_group * (group_errors / size)[group]
    risk = expected_errors / accepted  # (N,) E[r_i]
    # Trapezoids between consecutive positions plus the rectangle from coverage 0 to 1/N:
    # (1/N) (r_1 + sum_i (r_i + r_{i+1}) / 2) = (1/N) (sum_i r_i + (r_1 - r_N) / 2).
    return float((np.sum(risk) + (risk[0] - risk[-1]) / 2) / n)


def risk_coverage_curve(
    uncertainty: ArrayLike, correct: ArrayLike
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Selective risk against coverage when accepting examples with uncertainty <= threshold.

    Parameters
    ----------
    uncertainty : array-like of shape (N,)
        Uncertainty of each prediction (higher = more uncertain, rejected first).
    correct : array-like of shape (N,)
        Boolean or 0/1: whether each prediction was right.

    Returns
    -------
    coverage : ndarray of shape (G,)
        Fraction accepted, ascending, ending at 1.
    risk : ndarray of shape (G,)
        Selective risk: error rate among the accepted examples.
    thresholds : ndarray of shape (G,)
        The G distinct uncertainty values, ascending; point g accepts ``uncertainty <=
        thresholds[g]``.

    Notes
    -----
    One point per distinct uncertainty value: tied examples are accepted or rejected together
    (there is no point inside a tie group).

    Examples
    --------
    The two examples tied at 0.5 enter together.

    >>> cov, risk, thr = risk_coverage_curve([0.2, 0.5, 0.5, 0.1, 0.9], [1, 0, 1, 1, 0])
    >>> cov, risk, thr
    (array([0.2, 0.4, 0.8, 1. ]), array([0.  , 0.  , 0.25, 0.4 ]), array([0.1, 0.2, 0.5, 0.9]))
    """
    groups = _selective_groups(uncertainty, correct)
    return groups.n_upto / groups.n_upto[-1], groups.hits_upto / groups.n_upto, groups.values


def aurc(uncertainty: ArrayLike, correct: ArrayLike) -> float:
    r"""Area under the risk-coverage curve (AURC), as a fraction; lower is better, in [0, 1].

    Reported as a fraction in [0, 1], **not** multiplied by 1000 as in some papers.

    With distinct uncertainties, accepting the i least uncertain examples gives coverage
    :math:`i/N` and selective risk :math:`r_i = E_i / i` (:math:`E_i` errors among them), and

    .. math:: \mathrm{AURC} = \frac1N \Bigl(r_1 + \sum_{i=1}^{N-1} \frac{r_i + r_{i+1}}{2}\Bigr)
              = \frac1N \Bigl(\sum_{i=1}^{N} r_i + \frac{r_1 - r_N}{2}\Bigr),

    the trapezoid rule over every point plus the rectangle from coverage 0 to the first point at
    its risk (fd-shifts' "linear" AURC). A constant uncertainty gives the error rate.

    **Ties**: the value is the expectation of the above over uniformly random orderings inside
    each tie group, in closed form. AURC is linear in the :math:`r_i`, so it suffices to replace
    each :math:`r_i` by its expectation. For position :math:`i = n_< + j` inside a group of
    :math:`n_g` examples holding :math:`e_g` errors, with :math:`n_<` examples and :math:`E_<`
    errors in the groups before it, the first :math:`j` of a random ordering of the group hold
    :math:`j\,e_g/n_g` errors on average (hypergeometric mean), so

    .. math:: \mathbb{E}[r_i] = \frac{E_< + j\,e_g / n_g}{n_< + j},

    i.e. the group's errors are spread uniformly over its positions: cumulative errors grow
    linearly inside the group, the risk does not. (Joining the group's end points of
    :func:`risk_coverage_curve` by a straight line instead, as a plain trapezoid over the curve
    does, underestimates this and can even beat a perfect ranking.) The curve itself keeps one
    point per distinct value, so on tied data AURC is not the trapezoid area under those points.

    Parameters
    ----------
    uncertainty : array-like of shape (N,)
        Uncertainty of each prediction (higher = more uncertain).
    correct : array-like of shape (N,)
        Boolean or 0/1: whether each prediction was right.

    Returns
    -------
    float

    Examples
    --------
    Order .1, .2, then the two tied at .5 (one wrong) in random order, then .9 (wrong):
    :math:`\mathbb{E}[r] = (0, 0, \tfrac12/3, 1/4, 2/5)`, so
    AURC = (0 + 0 + 1/6 + 1/4 + 2/5 + (0 - 2/5)/2) / 5 = 37/300: the mean of the two orderings'
    AURCs 0.09 and 0.15667.

    >>> round(aurc([0.2, 0.5, 0.5, 0.1, 0.9], [1, 0, 1, 1, 0]), 6)
    0.123333
    """
    return _aurc(_selective_groups(uncertainty, correct))


def e_aurc(uncertainty: ArrayLike, correct: ArrayLike) -> float:
    r"""Excess AURC: :func:`aurc` minus the AURC of a perfect ranking; lower is better.

    .. math:: \mathrm{E\text{-}AURC} = \mathrm{AURC} - \bigl(e + (1-e)\ln(1-e)\bigr)

    with :math:`e` the overall error rate (Geifman et al. 2019). The subtracted term is the area
    under the risk-coverage curve of an oracle that accepts all correct predictions first, in
    the limit of many examples; it is 0 for :math:`e = 0` and 1 for :math:`e = 1`
    (:math:`(1-e)\ln(1-e) \to 0`). A fraction, not x1000.

    Parameters
    ----------
    uncertainty : array-like of shape (N,)
        Uncertainty of each prediction (higher = more uncertain).
    correct : array-like of shape (N,)
        Boolean or 0/1: whether each prediction was right.

    Returns
    -------
    float

    Notes
    -----
    The value can be slightly negative: on N examples the oracle's own trapezoid AURC lies
    below the closed form by less than 0.08 / N (the oracle curve is concave above its kink).
    Ties cannot push it lower: AURC is the expectation over tie-breaks (see :func:`aurc`), and
    every tie-break is a strict ranking, at least the oracle's.

    Examples
    --------
    AURC 37/300 and e = 0.4: 0.123333 - (0.4 + 0.6 ln 0.6) = 0.123333 - 0.0935046.

    >>> round(e_aurc([0.2, 0.5, 0.5, 0.1, 0.9], [1, 0, 1, 1, 0]), 6)
    0.029829
    """
    groups = _selective_groups(uncertainty, correct)
    err = float(groups.hits_upto[-1] / groups.n_upto[-1])
    optimal = 1.0 if err == 1.0 else err + (1.0 - err) * math.log1p(-err)
    return _aurc(groups) - optimal


def augrc(uncertainty: ArrayLike, correct: ArrayLike) -> float:
    r"""Area under the generalized risk-coverage curve (AUGRC); lower is better, in [0, 1].

    The generalized risk at a threshold is the number of accepted errors divided by N (not by
    the number accepted). At the thresholds of :func:`risk_coverage_curve`, with coverage
    :math:`c_g` and generalized risk :math:`\rho_g`, and closed at :math:`(c_0, \rho_0) = (0, 0)`:

    .. math:: \mathrm{AUGRC} = \sum_{g=1}^{G} (c_g - c_{g-1})\,\frac{\rho_{g-1} + \rho_g}{2}

    (Traub et al. 2024). A constant uncertainty gives :math:`e/2`, a perfect ranking
    :math:`e^2/2`, for error rate e. A fraction, not x1000.

    Parameters
    ----------
    uncertainty : array-like of shape (N,)
        Uncertainty of each prediction (higher = more uncertain).
    correct : array-like of shape (N,)
        Boolean or 0/1: whether each prediction was right.

    Returns
    -------
    float

    Examples
    --------
    Points (0, 0), (.2, 0), (.4, 0), (.8, .2), (1, .4): .4*(0+.2)/2 + .2*(.2+.4)/2.

    >>> round(augrc([0.2, 0.5, 0.5, 0.1, 0.9], [1, 0, 1, 1, 0]), 6)
    0.1
    """
    return _augrc(_selective_groups(uncertainty, correct))


def _augrc(groups: _TieGroups) -> float:
    n_acc = np.r_[0, groups.n_upto]
    errors = np.r_[0, groups.hits_upto]
    n = int(n_acc[-1])
    # In integer counts: sum (dn) * (e_prev + e_next) / (2 N^2), exact before the division.
    twice_area = np.sum(np.diff(n_acc) * (errors[1:] + errors[:-1]))
    return float(twice_area / (2.0 * n * n))


def _n_accepted(coverage: float, n: int) -> int:
    """ceil(coverage * n), forgiving float rounding: 0.7 * 10 = 7.000000000000001 gives 7."""
    exact = coverage * n
    nearest = round(exact)
    if abs(exact - nearest) <= _CEIL_RTOL * max(1.0, exact):
        return max(1, nearest)
    return math.ceil(exact)


def selective_accuracy(
    uncertainty: ArrayLike, correct: ArrayLike, *, coverage: float = SELECTIVE_COVERAGE
) -> float:
    r"""Accuracy on the ``ceil(coverage * N)`` least uncertain examples; higher is better.

    Parameters
    ----------
    uncertainty : array-like of shape (N,)
        Uncertainty of each prediction (higher = more uncertain).
    correct : array-like of shape (N,)
        Boolean or 0/1: whether each prediction was right.
    coverage : float, default `SELECTIVE_COVERAGE` (0.8)
        Fraction to accept, in (0, 1].

    Returns
    -------
    float

    Notes
    -----
    With k = ceil(coverage * N), where a product within a relative 1e-9 of an integer counts as
    that integer (so that 0.7 * 10, which is 7.000000000000001 in floating point, gives 7, and
    so does a coverage read off :func:`risk_coverage_curve`). If a tie group straddles the
    cut, only part of it fits: it is counted pro rata at its mean accuracy (the expected value
    under random tie-breaking),

    .. math:: \mathrm{acc} = \frac{C_{<} + (k - n_{<})\,C_t / n_t}{k}

    with :math:`n_<, C_<` the examples and correct ones strictly before the group and
    :math:`n_t, C_t` those of the group.

    Examples
    --------
    k = 3: 0.1 and 0.2 (both correct), then one of the two tied at 0.5 (half correct):
    (2 + 1 * 1/2) / 3.

    >>> round(selective_accuracy([0.2, 0.5, 0.5, 0.1, 0.9], [1, 0, 1, 1, 0], coverage=0.6), 6)
    0.833333
    """
    cov = _check_fraction(coverage, "coverage", open_right=False)
    return _selective_accuracy(_selective_groups(uncertainty, correct), cov)


def _selective_accuracy(groups: _TieGroups, cov: float) -> float:
    n = int(groups.n_upto[-1])
    k = _n_accepted(cov, n)
    g = int(np.searchsorted(groups.n_upto, k, side="left"))  # the group holding the k-th example
    n_before = int(groups.n_upto[g - 1]) if g else 0
    err_before = int(groups.hits_upto[g - 1]) if g else 0
    group_n = int(groups.n_upto[g]) - n_before
    group_err = int(groups.hits_upto[g]) - err_before
    errors = err_before + (k - n_before) * group_err / group_n
    return float((k - errors) / k)


def selective_summary(
    uncertainty: ArrayLike, correct: ArrayLike, *, coverage: float = 0.8
) -> FloatArray:
    """(:func:`aurc`, :func:`augrc`, :func:`selective_accuracy` at ``coverage``) from one sort
    of the examples: the three of the table, e.g. as one :func:`bootstrap_ci` metric.

    >>> selective_summary([0.2, 0.5, 0.5, 0.1, 0.9], [1, 0, 1, 1, 0], coverage=0.6).round(6)
    array([0.123333, 0.1     , 0.833333])
    """
    cov = _check_fraction(coverage, "coverage", open_right=False)
    groups = _selective_groups(uncertainty, correct)
    return np.array([_aurc(groups), _augrc(groups), _selective_accuracy(groups, cov)])


# --------------------------------------------------------------------------------------------
# uncertainty of the estimates: bootstrap and seeds
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Resampled:
    """A metric with a faster, equal way to evaluate it on bootstrap resamples.

    ``resampler(*arrays)`` does the per-dataset work once (for the ranking metrics: one sort of
    the keys into tie groups) and returns ``f(*indices)``, equal to
    ``fn(*(a[i] for a, i in zip(arrays, indices)))``: :func:`bootstrap_ci` and
    :func:`bootstrap_ci_two_sample` call it with the indices they draw. A resample's tie groups
    are the full data's groups that it holds, counted by ``np.bincount``: the same integer
    counts as sorting the resample, hence bitwise the same statistic, without a sort per
    resample (a sort of 50,000 keys and its grouping cost milliseconds, the counting a tenth).
    """

    fn: Callable[..., Any]
    resampler: Callable[..., Callable[..., Any]]

    def __call__(self, *arrays: Any) -> Any:
        return self.fn(*arrays)


def _counted_groups(values: FloatArray, group: IntArray, hit: BoolArray
                    ) -> Callable[[IntArray], _TieGroups]:
    """``idx -> _tie_groups`` of the resample ``idx`` of examples whose keys are
    ``values[group]``: the groups the resample holds, with their counts."""
    code = 2 * group + hit  # one bincount counts examples and hits of every group
    n_groups = values.size

    def groups(idx: IntArray) -> _TieGroups:
        counts = np.bincount(code[idx], minlength=2 * n_groups).reshape(n_groups, 2)
        hits = counts[:, 1]
        n_g = counts[:, 0] + hits  # not counts.sum(1): a reduction over 2 is slow
        held = np.flatnonzero(n_g)  # (integer takes beat boolean masks here)
        return _TieGroups(values[held], np.cumsum(n_g[held]), np.cumsum(hits[held]))

    return groups


def _selective_resampler(uncertainty: ArrayLike, correct: ArrayLike, *, coverage: float
                         ) -> Callable[[IntArray], FloatArray]:
    cov = _check_fraction(coverage, "coverage", open_right=False)
    u, corr = _selective_inputs(uncertainty, correct)
    values, group = np.unique(u, return_inverse=True)
    groups = _counted_groups(values, group, ~corr)  # hits: the errors

    def stat(idx: IntArray) -> FloatArray:
        g = groups(idx)
        return np.array([_aurc(g), _augrc(g), _selective_accuracy(g, cov)])

    return stat


def _auroc_resampler(uncertainty_id: ArrayLike, uncertainty_ood: ArrayLike
                     ) -> Callable[[IntArray, IntArray], float]:
    u_id, u_ood = _ood_inputs(uncertainty_id, uncertainty_ood)
    values, group = np.unique(np.concatenate([-u_ood, -u_id]), return_inverse=True)
    ood = np.arange(group.size) < u_ood.size
    groups = _counted_groups(values, group, ood)
    n_ood = u_ood.size

    def stat(idx_id: IntArray, idx_ood: IntArray) -> float:
        return _auroc(groups(np.concatenate([idx_ood, n_ood + idx_id])))

    return stat


def resampled_selective_summary(coverage: float = SELECTIVE_COVERAGE) -> Resampled:
    """:func:`selective_summary` at ``coverage`` as a `Resampled` metric."""
    return Resampled(partial(selective_summary, coverage=coverage),
                     partial(_selective_resampler, coverage=coverage))


#: :func:`ood_auroc` as a `Resampled` metric
RESAMPLED_OOD_AUROC = Resampled(ood_auroc, _auroc_resampler)


def _check_bootstrap_options(n_resamples: int, level: float) -> None:
    if (
        isinstance(n_resamples, bool)
        or not isinstance(n_resamples, (int, np.integer))
        or n_resamples < 1
    ):
        raise ValueError(f"n_resamples must be a positive integer; got {n_resamples!r}")
    _check_fraction(level, "level", open_right=True)


def _resampleable(arrays: tuple[ArrayLike, ...], names: list[str]) -> list[NDArray[Any]]:
    out = []
    for name, a in zip(names, arrays):
        arr = np.asarray(a)
        if arr.ndim == 0:
            raise ValueError(
                f"{name} must be an array with examples along axis 0; got a scalar {arr!r}"
            )
        if len(arr) == 0:
            raise ValueError(f"{name} must not be empty; got shape {arr.shape}")
        out.append(arr)
    return out


def _statistic(value: Any) -> Any:
    """A metric's value: a float, or a (K,) float array for a metric of K statistics."""
    return float(value) if np.ndim(value) == 0 else np.asarray(value, dtype=np.float64)


def _percentile_interval(
    point: Any, draw: Callable[[], Any], n_resamples: int, level: float
) -> tuple[Any, Any, Any]:
    """(point, low, high) from ``n_resamples`` calls of ``draw``; for a metric of K statistics
    (``point`` a (K,) array) each bound is a (K,) array, every statistic treated as alone."""
    points = np.atleast_1d(point)
    stats = np.full((n_resamples, points.size), np.nan)
    if not np.isnan(points).all():  # else undefined: nothing to draw
        with warnings.catch_warnings():
            # Undefined resamples are counted below and reported once, not once per resample.
            warnings.simplefilter("ignore", UndefinedMetricWarning)
            for i in range(n_resamples):
                stats[i] = draw()
    bounds = np.empty((points.size, 2))
    for k, p in enumerate(points):  # a loop, not a comprehension: warnings' stacklevel
        bounds[k] = _column_interval(p, stats[:, k], level)
    if np.ndim(point) == 0:
        return point, float(bounds[0, 0]), float(bounds[0, 1])
    return point, bounds[:, 0], bounds[:, 1]


def _column_interval(point: float, stats: FloatArray, level: float) -> tuple[float, float]:
    if math.isnan(point):
        warnings.warn(
            "the metric is NaN (undefined) on the full data; returning NaN for the interval",
            UndefinedMetricWarning,
            stacklevel=4,
        )
        return math.nan, math.nan
    n_resamples = stats.size
    defined = stats[~np.isnan(stats)]
    n_dropped = n_resamples - defined.size
    if defined.size == 0:
        warnings.warn(
            f"the metric was NaN (undefined) on all {n_resamples} bootstrap resamples; "
            "returning NaN bounds",
            UndefinedMetricWarning,
            stacklevel=4,
        )
        return math.nan, math.nan
    if n_dropped > _MAX_DROPPED_FRACTION * n_resamples:
        warnings.warn(
            f"{n_dropped} of {n_resamples} bootstrap resamples gave NaN (metric undefined, e.g. "
            "a single class) and were dropped; the interval describes the other resamples only",
            UndefinedMetricWarning,
            stacklevel=4,
        )
    alpha = (1.0 - level) / 2.0
    low, high = np.quantile(defined, [alpha, 1.0 - alpha])
    return float(low), float(high)


def bootstrap_ci(
    metric: Callable[..., float],
    *arrays: ArrayLike,
    n_resamples: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> tuple[float, float, float]:
    """Percentile bootstrap confidence interval, resampling examples jointly across arrays.

    Each resample draws N example indices with replacement (``np.random.default_rng(seed)``) and
    applies them to every array, so per-example pairs such as ``(confidence, correct)`` stay
    together. For two independent samples of different lengths (ID vs OOD uncertainties) use
    :func:`bootstrap_ci_two_sample`.

    Parameters
    ----------
    metric : callable
        ``metric(*arrays) -> float``, e.g. :func:`expected_calibration_error`. Extra options
        go in a ``functools.partial`` or a lambda. A metric may return a (K,) array of K
        statistics of the same examples (e.g. :func:`selective_summary`): each gets its own
        interval from the same resamples, and ``point``, ``low``, ``high`` are (K,) arrays.
    *arrays : array-like, each with N examples along axis 0
        The metric's arguments (1-D, or e.g. ``probs`` of shape (N, C)).
    n_resamples : int, default 1000
        Number of bootstrap resamples.
    level : float, default 0.95
        Confidence level, in (0, 1); the bounds are the ``(1 - level) / 2`` and
        ``(1 + level) / 2`` quantiles of the resampled values.
    seed : int, default 0
        Seed of the resampling generator; equal seeds give equal intervals.

    Returns
    -------
    point, low, high : float
        ``metric(*arrays)`` and the percentile interval.

    Notes
    -----
    Resamples on which the metric is NaN (undefined, e.g. a single class) are dropped, with an
    :class:`UndefinedMetricWarning` when more than 5% of them were; errors raised by the metric
    propagate. The percentile interval need not contain the point estimate for a biased metric
    such as ECE, whose resamples are biased upwards.

    Examples
    --------
    >>> from uqbench.stats.metrics import brier_score
    >>> probs = [[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.3, 0.7], [0.5, 0.5]]
    >>> point, low, high = bootstrap_ci(brier_score, probs, [0, 1, 1, 1, 0], n_resamples=200)
    >>> low <= point <= high
    True
    """
    if not arrays:
        raise ValueError("bootstrap_ci needs at least one array to resample after the metric")
    arrs = _resampleable(arrays, [f"arrays[{i}]" for i in range(len(arrays))])
    lengths = [len(a) for a in arrs]
    if len(set(lengths)) > 1:
        raise ValueError(
            f"arrays must all have the same length (axis 0) to be resampled jointly; got "
            f"lengths {lengths}; for two independent samples (e.g. ID and OOD uncertainties) "
            "use bootstrap_ci_two_sample"
        )
    _check_bootstrap_options(n_resamples, level)
    n = lengths[0]
    rng = np.random.default_rng(seed)

    resample = (metric.resampler(*arrs) if isinstance(metric, Resampled)
                else lambda idx: metric(*(a[idx] for a in arrs)))

    def draw() -> float:
        return _statistic(resample(rng.integers(0, n, size=n)))

    return _percentile_interval(_statistic(metric(*arrs)), draw, n_resamples, level)


def bootstrap_ci_two_sample(
    metric: Callable[[Any, Any], float],
    a: ArrayLike,
    b: ArrayLike,
    *,
    n_resamples: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> tuple[float, float, float]:
    """Percentile bootstrap confidence interval for a metric of two independent samples.

    For the OOD metrics (``metric(uncertainty_id, uncertainty_ood)``), whose two arguments are
    separate splits of possibly different lengths: each resample draws ``len(a)`` indices into
    ``a`` and, independently, ``len(b)`` indices into ``b`` (one generator,
    ``np.random.default_rng(seed)``). Resampling each split keeps both classes present in every
    resample.

    Parameters
    ----------
    metric : callable
        ``metric(a, b) -> float``, e.g. :func:`ood_auroc`, or a (K,) array as in
        :func:`bootstrap_ci`.
    a, b : array-like, examples along axis 0
        The two samples, e.g. ID and OOD uncertainties.
    n_resamples : int, default 1000
        Number of bootstrap resamples.
    level : float, default 0.95
        Confidence level, in (0, 1).
    seed : int, default 0
        Seed of the resampling generator.

    Returns
    -------
    point, low, high : float
        ``metric(a, b)`` and the percentile interval; NaN resamples are handled as in
        :func:`bootstrap_ci`.

    Examples
    --------
    >>> from uqbench.stats.metrics import ood_auroc
    >>> point, low, high = bootstrap_ci_two_sample(
    ...     ood_auroc, [0.1, 0.2, 0.6, 0.3], [0.5, 0.9, 0.7], n_resamples=200)
    >>> point, low <= point <= high
    (0.9166666666666666, True)
    """
    arr_a, arr_b = _resampleable((a, b), ["a", "b"])
    _check_bootstrap_options(n_resamples, level)
    rng = np.random.default_rng(seed)

    resample = (metric.resampler(arr_a, arr_b) if isinstance(metric, Resampled)
                else lambda ia, ib: metric(arr_a[ia], arr_b[ib]))

    def draw() -> float:
        idx_a = rng.integers(0, len(arr_a), size=len(arr_a))
        idx_b = rng.integers(0, len(arr_b), size=len(arr_b))
        return _statistic(resample(idx_a, idx_b))

    return _percentile_interval(_statistic(metric(arr_a, arr_b)), draw, n_resamples, level)


def paired_difference(
    metric: Callable[..., float],
    a: Sequence[ArrayLike],
    b: Sequence[ArrayLike],
    *,
    two_sample: bool = False,
    n_resamples: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> tuple[float, float, float]:
    """``metric(*b) - metric(*a)`` with a percentile bootstrap interval of the difference itself,
    the examples resampled *paired*: each resample draws one set of example indices and applies
    it to both sides (the same questions scored by two methods, or by two runs over the same
    splits), so what the two sides share cancels out of the interval.

    Parameters
    ----------
    metric : callable
        ``metric(*arrays) -> float``, applied to ``a`` and to ``b``.
    a, b : sequences of array-likes, examples along axis 0
        The metric's arguments for each side, with equal lengths side to side (``a[i]`` and
        ``b[i]`` hold the same examples; trailing axes, e.g. seeds, may differ).
    two_sample : bool, default False
        ``metric`` takes two independent samples (e.g. ID and shifted uncertainties, for
        :func:`ood_auroc`): each is resampled on its own, as in :func:`bootstrap_ci_two_sample`,
        and each draw is shared by both sides. Else every argument holds the same examples and
        is resampled jointly, as in :func:`bootstrap_ci`.
    n_resamples, level, seed
        As in :func:`bootstrap_ci`.

    Returns
    -------
    point, low, high : float

    Examples
    --------
    >>> d, low, high = paired_difference(np.mean, [[1, 0, 1, 0, 1]], [[1, 1, 1, 0, 1]])
    >>> round(d, 3), low >= 0  # b is never worse on any example: no resample favours a
    (0.2, True)
    """
    sides = [_resampleable(tuple(s), [f"{n}[{i}]" for i in range(len(s))])
             for n, s in (("a", a), ("b", b))]
    if len(sides[0]) != len(sides[1]) or not sides[0]:
        raise ValueError(f"a and b must give the metric the same number (>= 1) of arrays; got "
                         f"{len(sides[0])} and {len(sides[1])}")
    lengths = [len(x) for x in sides[0]]
    if lengths != [len(x) for x in sides[1]]:
        raise ValueError(f"paired sides must hold the same examples: a's lengths {lengths}, b's "
                         f"{[len(x) for x in sides[1]]}")
    if two_sample and len(lengths) != 2:
        raise ValueError(f"two_sample needs two arrays per side (e.g. ID and shifted); got "
                         f"{len(lengths)}")

    def diff(*idx: NDArray[np.intp]) -> float:
        pick = idx if two_sample else idx * len(lengths)
        va, vb = (metric(*(x[i] for x, i in zip(side, pick))) for side in sides)
        return float(vb - va)

    if not two_sample and len(set(lengths)) > 1:
        raise ValueError(f"the arrays of one side must hold the same examples to be resampled "
                         f"jointly; got lengths {lengths} (two_sample=True for ID vs shifted)")
    point, low, high, _ = paired_bootstrap(diff, lengths if two_sample else lengths[:1],
                                           n_resamples=n_resamples, level=level, seed=seed)
    return point, low, high


class PairedInterval(NamedTuple):
    """A bootstrap statistic: its value on all examples, the percentile interval, and how many
    resamples were undefined (NaN) and dropped from the interval."""

    point: float
    low: float
    high: float
    dropped: int = 0


def paired_bootstrap(
    stat: Callable[..., float],
    sizes: Sequence[int],
    *,
    n_resamples: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> PairedInterval:
    """``stat(*indices)`` on every example and its percentile bootstrap interval, for statistics
    that read their arrays themselves: each resample draws, for every set of examples (e.g. ID
    and, independently, shifted), ``size`` indices with replacement, and ``stat`` applies the
    same draw to everything it compares (two methods, every seed). :func:`paired_difference`
    is this with the arrays given; `uqbench.reporting.paper` judges its claims with it.

    Parameters
    ----------
    stat : callable
        ``stat(*indices) -> float``, one index array per entry of ``sizes``.
    sizes : sequence of int
        The number of examples of each independent set (drawn in this order, one generator).
    n_resamples, level, seed
        As in :func:`bootstrap_ci`.

    Returns
    -------
    PairedInterval
        ``stat`` on all examples (``np.arange`` of each size), the interval, and ``dropped``:
        the resamples on which ``stat`` was NaN, left out of the interval as in
        :func:`bootstrap_ci` (which warns when more than 5% were).

    Examples
    --------
    >>> a, b = np.array([1, 0, 1, 0, 1]), np.array([1, 1, 1, 0, 1])
    >>> d = paired_bootstrap(lambda i: b[i].mean() - a[i].mean(), [5], n_resamples=200)
    >>> round(d.point, 3), d.low >= 0, d.dropped
    (0.2, True, 0)
    """
    if len(sizes) == 0 or any(isinstance(n, bool) or not isinstance(n, (int, np.integer))
                              or n < 1 for n in sizes):
        raise ValueError(f"sizes must be one or more positive integers; got {list(sizes)!r}")
    _check_bootstrap_options(n_resamples, level)
    rng = np.random.default_rng(seed)
    dropped = 0

    def draw() -> float:
        nonlocal dropped
        value = float(stat(*(rng.integers(0, n, size=n) for n in sizes)))
        dropped += math.isnan(value)
        return value

    point = float(stat(*(np.arange(n) for n in sizes)))
    return PairedInterval(*_percentile_interval(point, draw, n_resamples, level), dropped)


def mean_std(values: ArrayLike) -> tuple[float, float]:
    r"""Mean and sample standard deviation of a metric over seeds.

    .. math:: \bar v = \frac1S \sum_s v_s, \qquad
              s = \sqrt{\frac{1}{S-1}\sum_s (v_s - \bar v)^2}

    (``ddof=1``); the standard deviation of a single value is reported as 0.

    Parameters
    ----------
    values : array-like of shape (S,)
        One value per seed.

    Returns
    -------
    mean, std : float
        NaN for both, with an :class:`UndefinedMetricWarning`, if any value is NaN (a metric
        undefined on some seed).

    Examples
    --------
    >>> mean_std([1.0, 2.0, 3.0])
    (2.0, 1.0)
    """
    v = _numeric(values, "values")
    _check_shape(v, "values", 1, "(S,)")
    v = v.astype(np.float64, copy=False)
    if np.isnan(v).any():
        warnings.warn(
            f"{int(np.isnan(v).sum())} of {v.size} values are NaN (undefined metric); "
            "returning NaN mean and std",
            UndefinedMetricWarning,
            stacklevel=2,
        )
        return math.nan, math.nan
    _check_finite(v, "values")
    std = float(np.std(v, ddof=1)) if v.size > 1 else 0.0
    return float(np.mean(v)), std


def seed_mean(metric: Callable[..., float]) -> Callable[..., float]:
    """Lift a 1-D metric to (n, S) arrays: the mean over the S seed columns (a
    `uqbench.stats.metrics.Resampled` metric stays one: its resampler is lifted too)."""

    def lifted(*arrays: NDArray[Any]) -> Any:  # a float, or (K,) for a metric of K statistics
        return np.mean([metric(*(a[:, s] for a in arrays)) for s in range(arrays[0].shape[1])],
                       axis=0)

    if not isinstance(metric, Resampled):
        return lifted

    def resampler(*arrays: NDArray[Any]) -> Callable[..., Any]:
        per_seed = [metric.resampler(*(a[:, s] for a in arrays))
                    for s in range(arrays[0].shape[1])]
        return lambda *idx: np.mean([f(*idx) for f in per_seed], axis=0)

    return Resampled(lifted, resampler)


def per_seed(metric: Callable[..., float], *arrays: NDArray[Any]) -> tuple[float, float]:
    """`mean_std` of ``metric`` computed on each of the S seed columns of (n, S) arrays."""
    return mean_std([metric(*(a[:, s] for a in arrays)) for s in range(arrays[0].shape[1])])
