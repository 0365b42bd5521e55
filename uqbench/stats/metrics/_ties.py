"""The ranking core: one sort, tied scores grouped (shared by OOD and selective metrics)."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from uqbench.stats.metrics._validation import FloatArray, IntArray


class TieGroups(NamedTuple):
    """Sorted tie groups; the counts may have a leading axis of B bootstrap resamples, (B, G):
    the full data's groups counted in each resample, a group it does not hold counting 0 (the
    ``*_of_groups`` metrics then give one value per resample, equal to sorting it)."""

    values: FloatArray  # (G,) distinct keys, ascending
    n_upto: IntArray  # (G,) or (B, G) number of examples with key <= values[g]
    hits_upto: IntArray  # (G,) or (B, G) number of hit examples with key <= values[g]


def as_rows(groups: TieGroups) -> tuple[IntArray, IntArray, bool]:
    """``(n_upto, hits_upto)`` as (B, G) rows (one row for unbatched groups), and whether the
    groups were batched: the ``*_of_groups`` metrics compute on rows, then return a float or
    a (B,) array (`of_rows`)."""
    batched = groups.n_upto.ndim == 2
    return np.atleast_2d(groups.n_upto), np.atleast_2d(groups.hits_upto), batched


def of_rows(values: FloatArray, batched: bool) -> FloatArray | float:
    """(B,) per-resample values, or the float of the one row."""
    return values if batched else float(values[0])


def tie_groups(hit_keys: FloatArray, other_keys: FloatArray) -> TieGroups:
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
    return TieGroups(sorted_keys[ends], n_upto, hits_so_far[ends])


def binary_counts(
    score_pos: FloatArray, score_neg: FloatArray
) -> tuple[IntArray, IntArray, FloatArray]:
    """(fps, tps, thresholds) at each distinct score, descending, as sklearn's _binary_clf_curve.

    ``tps[g]`` / ``fps[g]`` count positives / negatives with score >= ``thresholds[g]``.
    """
    # Ascending order of -score is descending order of score.
    groups = tie_groups(-score_pos, -score_neg)
    tps = groups.hits_upto
    return groups.n_upto - tps, tps, -groups.values


def average_precision(score_pos: FloatArray, score_neg: FloatArray) -> float:
    fps, tps, _ = binary_counts(score_pos, score_neg)
    precision = tps / (tps + fps)
    recall_steps = np.diff(tps, prepend=0)
    return float(np.sum(recall_steps * precision) / tps[-1])


