"""Input validation shared by every metric, the benchmark's constants and the array types."""
from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]
BoolArray = NDArray[np.bool_]
BinStrategy = Literal["uniform", "quantile", "midpoint"]

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

#: HELM's calibration columns: ``ece_10_bin`` has 10 equal-mass bins, ``selective_acc@10`` is
#: the accuracy of the most confident tenth (the ``ece_10_mass`` and ``sel_acc_10`` columns).
HELM_ECE_BINS = 10
HELM_SELECTIVE_FRACTION = 0.1

# Probability rows may deviate from summing to 1 by float32 softmax rounding, not more.
ROW_SUM_ATOL = 1e-3

# selective_accuracy: coverage * N within this relative distance of an integer is that integer.
CEIL_RTOL = 1e-9

# bootstrap_ci warns when more than this fraction of resamples was undefined (NaN) and dropped.
MAX_DROPPED_FRACTION = 0.05


class UndefinedMetricWarning(UserWarning):
    """A metric is undefined on its input (e.g. a single class); NaN was returned."""




def numeric(x: ArrayLike, name: str) -> NDArray[Any]:
    arr = np.asarray(x)
    if arr.dtype.kind not in "biuf":
        raise ValueError(f"{name} must be a real numeric array; got dtype {arr.dtype}")
    return arr


def check_shape(arr: NDArray[Any], name: str, ndim: int, shape_doc: str) -> None:
    if arr.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D of shape {shape_doc}; got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name} must not be empty; got shape {arr.shape}")


def check_finite(arr: NDArray[Any], name: str) -> None:
    if arr.dtype.kind == "f" and not np.isfinite(arr).all():
        bad = ~np.isfinite(arr)
        first = np.unravel_index(int(np.argmax(bad)), arr.shape)
        where = first[0] if len(first) == 1 else first
        raise ValueError(
            f"{name} must be finite; got {int(bad.sum())} NaN/inf value(s), "
            f"the first {arr[first]} at index {where}"
        )


def check_unit_interval(arr: FloatArray, name: str) -> None:
    lo, hi = float(arr.min()), float(arr.max())
    if lo < 0.0:
        raise ValueError(f"{name} must lie in [0, 1]; got min {lo:g}")
    if hi > 1.0:
        raise ValueError(f"{name} must lie in [0, 1]; got max {hi:g}")


def check_probabilities(arr: FloatArray, name: str) -> None:
    """Finite and in [0, 1]; one min/max pass when the input is fine."""
    if not (arr.min() >= 0.0 and arr.max() <= 1.0):  # also false for NaN
        check_finite(arr, name)
        check_unit_interval(arr, name)


def float_vector(x: ArrayLike, name: str, *, unit_interval: bool = False) -> FloatArray:
    arr = numeric(x, name)
    check_shape(arr, name, 1, "(N,)")
    arr = arr.astype(np.float64, copy=False)
    if unit_interval:
        check_probabilities(arr, name)
    else:
        check_finite(arr, name)
    return arr


def bool_vector(x: ArrayLike, name: str) -> BoolArray:
    arr = numeric(x, name)
    check_shape(arr, name, 1, "(N,)")
    if arr.dtype.kind == "b":
        return arr
    if arr.dtype.kind == "f":
        check_finite(arr, name)
    # Integers with min >= 0 and max <= 1 are 0/1: a fast path for valid input.
    if arr.dtype.kind == "f" or not (arr.min() >= 0 and arr.max() <= 1):
        is01 = (arr == 0) | (arr == 1)
        if not is01.all():
            i = int(np.argmin(is01))
            raise ValueError(f"{name} must be boolean or 0/1; got {arr[i]} at index {i}")
    return arr.astype(bool)


def probs_matrix(x: ArrayLike, name: str = "probs") -> FloatArray:
    arr = numeric(x, name)
    check_shape(arr, name, 2, "(N, C)")
    arr = arr.astype(np.float64, copy=False)
    check_probabilities(arr, name)
    sums = arr @ np.ones(arr.shape[1])  # several times faster than arr.sum(axis=1) for small C
    off = np.abs(sums - 1.0) > ROW_SUM_ATOL
    if off.any():
        i = int(np.argmax(off))
        raise ValueError(
            f"{name} rows must sum to 1 (within {ROW_SUM_ATOL:g}); got row {i} summing to "
            f"{sums[i]:g}: pass probabilities (softmax of the logits), not logits or scores"
        )
    return arr


def label_vector(x: ArrayLike, n_classes: int, name: str = "labels") -> NDArray[np.intp]:
    arr = numeric(x, name)
    check_shape(arr, name, 1, "(N,)")
    if arr.dtype.kind == "b":
        raise ValueError(f"{name} must be integer class indices; got a boolean array")
    if arr.dtype.kind == "f":
        check_finite(arr, name)
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


def check_same_length(first: tuple[str, NDArray[Any]], *others: tuple[str, NDArray[Any]]) -> None:
    name0, arr0 = first
    for name, arr in others:
        if len(arr) != len(arr0):
            raise ValueError(
                f"{name0} and {name} must have the same length; got {len(arr0)} and {len(arr)}"
            )


def check_n_bins(n_bins: int) -> None:
    if isinstance(n_bins, bool) or not isinstance(n_bins, (int, np.integer)) or n_bins < 1:
        raise ValueError(f"n_bins must be a positive integer; got {n_bins!r}")


def check_fraction(value: float, name: str, *, open_right: bool) -> float:
    """``value`` in (0, 1) or, when not ``open_right``, in (0, 1]."""
    is_number = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
        value, bool
    )
    v = float(value) if is_number else math.nan
    if not (0.0 < v < 1.0 or (v == 1.0 and not open_right)):
        interval = "(0, 1)" if open_right else "(0, 1]"
        raise ValueError(f"{name} must be a number in {interval}; got {value!r}")
    return v


def calibration_inputs(confidence: ArrayLike, correct: ArrayLike) -> tuple[FloatArray, BoolArray]:
    conf = float_vector(confidence, "confidence", unit_interval=True)
    corr = bool_vector(correct, "correct")
    check_same_length(("confidence", conf), ("correct", corr))
    return conf, corr


def prob_inputs(probs: ArrayLike, labels: ArrayLike) -> tuple[FloatArray, NDArray[np.intp]]:
    p = probs_matrix(probs)
    y = label_vector(labels, p.shape[1])
    check_same_length(("probs", p), ("labels", y))
    return p, y


def ood_inputs(
    uncertainty_id: ArrayLike, uncertainty_ood: ArrayLike
) -> tuple[FloatArray, FloatArray]:
    # Lengths may differ: the two splits are independent samples.
    return (float_vector(uncertainty_id, "uncertainty_id"),
            float_vector(uncertainty_ood, "uncertainty_ood"))


