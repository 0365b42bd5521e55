"""Uncertainty of the estimates: bootstrap intervals, paired differences, seed means."""
from __future__ import annotations

import math
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import ArrayLike, NDArray

from uqbench.stats.metrics._ties import TieGroups
from uqbench.stats.metrics._validation import (
    MAX_DROPPED_FRACTION,
    SELECTIVE_COVERAGE,
    BoolArray,
    FloatArray,
    IntArray,
    UndefinedMetricWarning,
    check_finite,
    check_fraction,
    check_shape,
    numeric,
    ood_inputs,
)
from uqbench.stats.metrics.ranking import auroc_of_groups
from uqbench.stats.metrics.selective import (
    selective_accuracy,
    selective_accuracy_of_groups,
    selective_inputs,
    selective_summary,
    summary_of_groups,
)


@dataclass(frozen=True)
class Resampled:
    """A metric with a faster, equal way to evaluate it on bootstrap resamples.

    ``resampler(*arrays)`` does the per-dataset work once (for the ranking metrics: one sort of
    the keys into tie groups) and returns ``f(*indices)``, each index array of shape (B, n): B
    resamples at once, ``f`` giving row ``b`` equal to
    ``fn(*(a[i[b]] for a, i in zip(arrays, indices)))`` ((B,) or (B, K)):
    :func:`bootstrap_ci` and :func:`bootstrap_ci_two_sample` call it with the indices they draw,
    a chunk of resamples at a time. A resample's tie groups are the full data's groups counted
    in it by ``np.bincount`` (0 for a group it does not hold): the same integer counts as
    sorting the resample, hence bitwise the same statistic, without a sort per resample, and
    the metric's arithmetic runs on all B rows at once instead of B small calls.
    """

    fn: Callable[..., Any]
    resampler: Callable[..., Callable[..., Any]]

    def __call__(self, *arrays: Any, **options: Any) -> Any:
        return self.fn(*arrays, **options)


def _counted_groups(values: FloatArray, group: IntArray, hit: BoolArray
                    ) -> Callable[[IntArray], TieGroups]:
    """``idx -> tie_groups`` of the (B, n) resamples ``idx`` of examples whose keys are
    ``values[group]``: every group's counts in each resample, (B, G) (`TieGroups`); (G,) for
    one (n,) resample."""
    code = 2 * group + hit  # one bincount counts examples and hits of every group
    n_groups = values.size

    def groups(idx: IntArray) -> TieGroups:
        if idx.ndim == 1 or len(idx) == 1:   # one resample: only the groups it holds
            counts = np.bincount(code[idx.ravel()], minlength=2 * n_groups)
            hits1, n_1 = counts[1::2], counts[0::2] + counts[1::2]
            held = np.flatnonzero(n_1)   # (integer takes beat boolean masks here)
            one = TieGroups(values[held], np.cumsum(n_1[held]), np.cumsum(hits1[held]))
            return one if idx.ndim == 1 else TieGroups(one.values, one.n_upto[None],
                                                       one.hits_upto[None])
        rows = np.atleast_2d(idx)
        flat = (code[rows] + 2 * n_groups * np.arange(len(rows))[:, None]).ravel()
        counts = np.bincount(flat, minlength=2 * n_groups * len(rows))
        counts = counts.reshape(*idx.shape[:-1], n_groups, 2)
        hits = counts[..., 1]
        n_g = counts[..., 0] + hits  # not counts.sum(-1): a reduction over 2 is slow
        return TieGroups(values, np.cumsum(n_g, axis=-1), np.cumsum(hits, axis=-1))

    return groups


def selective_resampler(uncertainty: ArrayLike, correct: ArrayLike, *,
                        of_groups: Callable[[TieGroups], Any]) -> Callable[[IntArray], Any]:
    """The resampler (`Resampled`) of a selective metric computed by ``of_groups`` from the tie
    groups of the uncertainties (e.g. `uqbench.stats.metrics.selective.aurc_of_groups`)."""
    u, corr = selective_inputs(uncertainty, correct)
    values, group = np.unique(u, return_inverse=True)
    groups = _counted_groups(values, group, ~corr)  # hits: the errors
    return lambda idx: of_groups(groups(idx))


def _selective(fn: Callable[..., Any], of_groups: Callable[[TieGroups], Any]) -> Resampled:
    return Resampled(fn, partial(selective_resampler, of_groups=of_groups))


def auroc_resampler(uncertainty_id: ArrayLike, uncertainty_ood: ArrayLike
                    ) -> Callable[[IntArray, IntArray], float | FloatArray]:
    """The resampler (`Resampled`) of :func:`ood_auroc`: one sort of both splits' scores."""
    u_id, u_ood = ood_inputs(uncertainty_id, uncertainty_ood)
    values, group = np.unique(np.concatenate([-u_ood, -u_id]), return_inverse=True)
    ood = np.arange(group.size) < u_ood.size
    groups = _counted_groups(values, group, ood)
    n_ood = u_ood.size

    def stat(idx_id: IntArray, idx_ood: IntArray) -> float | FloatArray:
        return auroc_of_groups(groups(np.concatenate([idx_ood, n_ood + idx_id], axis=-1)))

    return stat


def resampled_selective_summary(coverage: float = SELECTIVE_COVERAGE) -> Resampled:
    """:func:`selective_summary` at ``coverage`` as a `Resampled` metric."""
    cov = check_fraction(coverage, "coverage", open_right=False)
    return _selective(partial(selective_summary, coverage=cov),
                      partial(summary_of_groups, cov=cov))


def resampled_selective_accuracy(coverage: float = SELECTIVE_COVERAGE) -> Resampled:
    """:func:`selective_accuracy` at ``coverage`` as a `Resampled` metric."""
    cov = check_fraction(coverage, "coverage", open_right=False)
    return _selective(partial(selective_accuracy, coverage=cov),
                      partial(selective_accuracy_of_groups, cov=cov))


def mean_score(values: NDArray[Any]) -> float:
    """The mean of ``values`` (accuracy: of the 0/1 correctness)."""
    return float(np.mean(values))


def mean_resampler(values: NDArray[Any]) -> Callable[[IntArray], FloatArray]:
    """The resampler (`Resampled`) of :func:`mean_score`."""
    return lambda idx: np.mean(np.asarray(values)[idx], axis=1)


def _check_bootstrap_options(n_resamples: int, level: float) -> None:
    if (
        isinstance(n_resamples, bool)
        or not isinstance(n_resamples, (int, np.integer))
        or n_resamples < 1
    ):
        raise ValueError(f"n_resamples must be a positive integer; got {n_resamples!r}")
    check_fraction(level, "level", open_right=True)


def _resampleable(arrays: tuple[ArrayLike, ...], names: list[str]) -> list[NDArray[Any]]:
    out = []
    for name, a in zip(names, arrays, strict=False):
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


#: the most index elements (resamples x examples) a `Resampled` metric is given at once: the
#: resamples of a bootstrap are evaluated in chunks of about this size
CHUNK_ELEMENTS = 1 << 20


#: fewer resamples than this in a chunk: one resample a call instead. Rows of a chunk carry
#: every tie group of the data (about 1.6 times the groups one resample holds), which costs
#: more than the calls it saves once a resample has tens of thousands of examples
MIN_CHUNK_ROWS = 64


def chunk_rows(n_examples: int) -> int:
    """Resamples per chunk for a resample of ``n_examples`` indices."""
    rows = CHUNK_ELEMENTS // max(n_examples, 1)
    return rows if rows >= MIN_CHUNK_ROWS else 1


def draw_indices(rng: np.random.Generator, sizes: Sequence[int], k: int
                 ) -> tuple[IntArray, ...]:
    """``k`` resamples' indices, a (k, n) array for each set of ``sizes`` examples: the draws
    of one resample after another, each drawing every set in turn. One bounded draw per
    resample and set gives the same stream as one call for them all (numpy's bounded draws
    take whole words of the generator, one index after another, whatever the call), and
    scalar bounds are many times faster than an array of bounds."""
    if len(sizes) == 1:
        return (rng.integers(0, sizes[0], size=(k, sizes[0])),)
    out = tuple(np.empty((k, n), dtype=np.int64) for n in sizes)
    for row in range(k):
        for idx, n in zip(out, sizes, strict=True):
            idx[row] = rng.integers(0, n, size=n)
    return out


#: the most index elements (resamples x examples, all sets) this process keeps drawn
#: (`index_chunks`): a table of many models over the same questions draws them once
MEMO_ELEMENTS = 1 << 25
#: (seed, sizes, resamples) -> every resample's indices, oldest first (`index_chunks`)
DRAWN: OrderedDict[tuple[int, tuple[int, ...], int], tuple[IntArray, ...]] = OrderedDict()


def index_chunks(seed: int, sizes: Sequence[int], n_resamples: int, chunk: int
                 ) -> Iterator[tuple[IntArray, ...]]:
    """The indices of ``n_resamples`` resamples of ``np.random.default_rng(seed)``
    (`draw_indices`), ``chunk`` resamples at a time ((k, n) arrays, read-only). Where they fit
    in `MEMO_ELEMENTS` they are drawn once in this process and kept (the same numbers: drawing
    them all at once or a chunk at a time is one stream); else drawn a chunk at a time."""
    sizes = tuple(int(n) for n in sizes)
    if n_resamples * sum(sizes) > MEMO_ELEMENTS:
        rng = np.random.default_rng(seed)
        for at in range(0, n_resamples, chunk):
            yield draw_indices(rng, sizes, min(chunk, n_resamples - at))
        return
    key = (int(seed), sizes, int(n_resamples))
    drawn = DRAWN.get(key)
    if drawn is None:
        drawn = draw_indices(np.random.default_rng(seed), sizes, n_resamples)
        for idx in drawn:
            idx.setflags(write=False)
        DRAWN[key] = drawn
        while sum(k[2] * sum(k[1]) for k in DRAWN) > MEMO_ELEMENTS:
            DRAWN.popitem(last=False)
    DRAWN.move_to_end(key)
    for at in range(0, n_resamples, chunk):
        yield tuple(idx[at:at + chunk] for idx in drawn)


def _draws(seed: int, sizes: Sequence[int], n_resamples: int, rows: Callable[..., Any] | None,
           one: Callable[..., Any]) -> Callable[[int], Any]:
    """``k ->`` the statistics of the next resamples (at most ``k``), for `_percentile_interval`:
    ``rows`` of a chunk of them, given their (k', n) indices (a `Resampled` metric's way), or,
    without ``rows``, ``one`` of the next resample's (n,) indices. Either way the indices are
    those of drawing one resample after another (`index_chunks`)."""
    if rows is not None:
        chunks = index_chunks(seed, sizes, n_resamples, chunk_rows(sum(sizes)))
        return lambda k: rows(*next(chunks))
    ones = index_chunks(seed, sizes, n_resamples, 1)
    return lambda k: one(*(idx[0] for idx in next(ones)))


def _percentile_interval(
    point: Any, draws: Callable[[int], Any], n_resamples: int, level: float
) -> tuple[Any, Any, Any]:
    """(point, low, high) from the statistics of ``n_resamples`` resamples, ``draws(k)`` giving
    those of the next ``k`` or fewer ((k',) or (k', K)); for a metric of K statistics
    (``point`` a (K,) array) each bound is a (K,) array, every statistic treated as alone."""
    points = np.atleast_1d(point)
    stats = np.full((n_resamples, points.size), np.nan)
    if not np.isnan(points).all():  # else undefined: nothing to draw
        with warnings.catch_warnings():
            # Undefined resamples are counted below and reported once, not once per resample.
            warnings.simplefilter("ignore", UndefinedMetricWarning)
            done = 0
            while done < n_resamples:
                got = np.asarray(draws(n_resamples - done), dtype=np.float64)
                got = got.reshape(-1, points.size)
                stats[done:done + len(got)] = got
                done += len(got)
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
    if n_dropped > MAX_DROPPED_FRACTION * n_resamples:
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
    draws = _draws(seed, lengths[:1], n_resamples,
                   metric.resampler(*arrs) if isinstance(metric, Resampled) else None,
                   lambda idx: _statistic(metric(*(a[idx] for a in arrs))))
    return _percentile_interval(_statistic(metric(*arrs)), draws, n_resamples, level)


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
    draws = _draws(seed, (len(arr_a), len(arr_b)), n_resamples,
                   metric.resampler(arr_a, arr_b) if isinstance(metric, Resampled) else None,
                   lambda idx_a, idx_b: _statistic(metric(arr_a[idx_a], arr_b[idx_b])))
    return _percentile_interval(_statistic(metric(arr_a, arr_b)), draws, n_resamples, level)


def bootstrap_cis(
    metrics: Sequence[tuple[Callable[..., Any], Sequence[ArrayLike]]],
    *,
    two_sample: bool = False,
    n_resamples: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> list[tuple[Any, Any, Any]]:
    """Percentile bootstrap intervals of several metrics of the same examples, from one draw.

    Each ``(metric, arrays)`` is what :func:`bootstrap_ci` (or, with ``two_sample``,
    :func:`bootstrap_ci_two_sample`: ``arrays`` is ``(a, b)``) takes; every metric's arrays
    hold the same examples (the same lengths). The resamples' indices are drawn once, a chunk
    at a time, and applied to every metric, so the draw costs what one metric's does; the
    intervals are bit for bit those of calling :func:`bootstrap_ci` (or its two-sample form)
    once per metric with the same ``seed`` (each call draws the same indices).

    Returns
    -------
    list of (point, low, high)
        One per metric, in order, as :func:`bootstrap_ci` returns them.

    Examples
    --------
    >>> import numpy as np
    >>> correct = np.array([1, 0, 1, 1, 0])
    >>> conf = np.array([0.9, 0.4, 0.8, 0.7, 0.6])
    >>> both = bootstrap_cis([(np.mean, [correct]), (np.mean, [conf])], n_resamples=50)
    >>> both[0] == bootstrap_ci(np.mean, correct, n_resamples=50)
    True
    """
    if not metrics:
        return []
    _check_bootstrap_options(n_resamples, level)
    out = []
    for point, stats in bootstrap_stats(metrics, two_sample=two_sample, n_resamples=n_resamples,
                                        seed=seed):
        out.append(percentile_bounds(point, stats, level))  # a loop: warnings' stacklevel
    return out


def bootstrap_stats(metrics: Sequence[tuple[Callable[..., Any], Sequence[ArrayLike]]], *,
                    two_sample: bool = False, n_resamples: int = 1000, seed: int = 0
                    ) -> list[tuple[Any, FloatArray]]:
    """What :func:`bootstrap_cis` computes its intervals from: each metric's value on all
    examples and its (n_resamples, K) statistics on the resamples (all NaN for a metric
    undefined on the full data: nothing drawn)."""
    if not metrics:
        return []
    _check_bootstrap_options(n_resamples, 0.95)
    names = ["a", "b"] if two_sample else None
    prepared = []
    for k, (metric, arrays) in enumerate(metrics):
        if two_sample and len(arrays) != 2:
            raise ValueError(f"metrics[{k}]: a two-sample metric takes two arrays (a, b); got "
                             f"{len(arrays)}")
        if not arrays:
            raise ValueError(f"metrics[{k}]: no array to resample after the metric")
        arrs = _resampleable(tuple(arrays), names or [f"metrics[{k}] arrays[{i}]"
                                                      for i in range(len(arrays))])
        prepared.append((metric, arrs))
    first = prepared[0][1]
    sizes = [len(a) for a in first] if two_sample else [len(first[0])]
    for k, (_, arrs) in enumerate(prepared):
        lengths = [len(a) for a in arrs] if two_sample else sorted({len(a) for a in arrs})
        if lengths != sizes:
            raise ValueError(f"metrics[{k}]: arrays of lengths {lengths}, metrics[0]'s {sizes}: "
                             "the metrics of one bootstrap resample the same examples")
    points = [_statistic(metric(*arrs)) for metric, arrs in prepared]
    stats = [np.full((n_resamples, np.size(p)), np.nan) for p in points]
    live = []  # (k, f(*indices) -> (k', K)) of each metric defined on the full data
    for k, ((metric, arrs), point) in enumerate(zip(prepared, points, strict=False)):
        if np.isnan(np.atleast_1d(point)).all():
            continue  # undefined: nothing to draw (as bootstrap_ci)
        if isinstance(metric, Resampled):
            live.append((k, metric.resampler(*arrs)))
        else:
            def one_by_one(*idx: IntArray, metric: Any = metric, arrs: Any = arrs) -> Any:
                if two_sample:
                    return [_statistic(metric(arrs[0][i], arrs[1][j]))
                            for i, j in zip(*idx, strict=False)]
                return [_statistic(metric(*(a[i] for a in arrs))) for i in idx[0]]
            live.append((k, one_by_one))
    if live:
        with warnings.catch_warnings():
            # Undefined resamples are counted below and reported once, not once per resample.
            warnings.simplefilter("ignore", UndefinedMetricWarning)
            done = 0
            for idx in index_chunks(seed, sizes, n_resamples, chunk_rows(sum(sizes))):
                for k, f in live:
                    stats[k][done:done + len(idx[0])] = np.asarray(
                        f(*idx), dtype=np.float64).reshape(len(idx[0]), -1)
                done += len(idx[0])
    return list(zip(points, stats, strict=True))


def percentile_bounds(point: Any, stats: FloatArray, level: float = 0.95
                      ) -> tuple[Any, Any, Any]:
    """(point, low, high) of the percentile interval of a metric's (B, K) resample statistics
    (`bootstrap_stats`), as :func:`bootstrap_cis` returns them."""
    bounds = np.empty((stats.shape[1], 2))
    for j, p in enumerate(np.atleast_1d(point)):  # a loop: warnings' stacklevel
        bounds[j] = _column_interval(p, stats[:, j], level)
    return ((point, float(bounds[0, 0]), float(bounds[0, 1])) if np.ndim(point) == 0
            else (point, bounds[:, 0], bounds[:, 1]))


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
        ``metric(*arrays) -> float``, applied to ``a`` and to ``b``. A `Resampled` metric is
        evaluated on a chunk of resamples at a time, with the same interval.
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

    if not two_sample and len(set(lengths)) > 1:
        raise ValueError(f"the arrays of one side must hold the same examples to be resampled "
                         f"jointly; got lengths {lengths} (two_sample=True for ID vs shifted)")
    _check_bootstrap_options(n_resamples, level)
    side_a, side_b = (resample_side(metric, side, two_sample=two_sample,
                                    n_resamples=n_resamples, seed=seed) for side in sides)
    return paired_interval(side_a, side_b, level=level)


class ResampledSide(NamedTuple):
    """One side of a paired bootstrap (`resample_side`): the metric on all examples and on
    each resample, and what was resampled (the sizes of the sets of examples, the seed)."""

    point: float
    stats: FloatArray  # (B,)
    sizes: tuple[int, ...]
    seed: int


def resample_side(metric: Callable[..., float], arrays: Sequence[ArrayLike], *,
                  two_sample: bool = False, n_resamples: int = 1000, seed: int = 0
                  ) -> ResampledSide:
    """``metric(*arrays)`` and its value on each resample of :func:`paired_difference` (the
    indices of ``seed``, drawn as :func:`bootstrap_ci` or, ``two_sample``,
    :func:`bootstrap_ci_two_sample` draws them): a side compared with several others
    (`paired_interval`) is resampled once. NaN resamples are kept (the interval drops them)."""
    arrs = _resampleable(tuple(arrays), [f"arrays[{i}]" for i in range(len(arrays))])
    lengths = [len(x) for x in arrs]
    if two_sample and len(arrs) != 2:
        raise ValueError(f"two_sample needs two arrays (e.g. ID and shifted); got {len(arrs)}")
    if not two_sample and len(set(lengths)) > 1:
        raise ValueError(f"the arrays must hold the same examples to be resampled jointly; got "
                         f"lengths {lengths} (two_sample=True for ID vs shifted)")
    _check_bootstrap_options(n_resamples, 0.95)
    sizes = lengths if two_sample else lengths[:1]

    def one(*idx: IntArray) -> float:
        pick = idx if two_sample else idx * len(arrs)
        return float(metric(*(x[i] for x, i in zip(arrs, pick, strict=True))))

    draws = _draws(seed, sizes, n_resamples,
                   metric.resampler(*arrs) if isinstance(metric, Resampled) else None, one)
    stats = np.empty(n_resamples)
    with warnings.catch_warnings():
        # Undefined resamples are counted by the interval and reported once there.
        warnings.simplefilter("ignore", UndefinedMetricWarning)
        done = 0
        while done < n_resamples:
            got = np.asarray(draws(n_resamples - done), dtype=np.float64).reshape(-1)
            stats[done:done + len(got)] = got
            done += len(got)
    return ResampledSide(one(*(np.arange(n) for n in sizes)), stats, tuple(sizes), seed)


def paired_interval(a: ResampledSide, b: ResampledSide, *, level: float = 0.95
                    ) -> tuple[float, float, float]:
    """``b.point - a.point`` and the percentile interval of the resamples' differences: what
    :func:`paired_difference` returns for the two sides' arrays, bit for bit, from each side's
    `resample_side` (the same sizes, seed and number of resamples)."""
    if (a.sizes, a.seed, len(a.stats)) != (b.sizes, b.seed, len(b.stats)):
        raise ValueError(f"paired sides must be resamples of the same examples: sizes, seed and "
                         f"resamples {(a.sizes, a.seed, len(a.stats))} and "
                         f"{(b.sizes, b.seed, len(b.stats))}")
    diffs = b.stats - a.stats
    return _percentile_interval(  # type: ignore[no-any-return]
        float(b.point - a.point), lambda k: diffs[len(diffs) - k:], len(diffs), level)


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
    dropped = 0

    def counted(*idx: IntArray) -> float:
        nonlocal dropped
        value = float(stat(*idx))
        dropped += math.isnan(value)
        return value

    draws = _draws(seed, sizes, n_resamples, None, counted)
    point = float(stat(*(np.arange(n) for n in sizes)))
    return PairedInterval(*_percentile_interval(point, draws, n_resamples, level), dropped)


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
    v = numeric(values, "values")
    check_shape(v, "values", 1, "(S,)")
    v = v.astype(np.float64, copy=False)
    if np.isnan(v).any():
        warnings.warn(
            f"{int(np.isnan(v).sum())} of {v.size} values are NaN (undefined metric); "
            "returning NaN mean and std",
            UndefinedMetricWarning,
            stacklevel=2,
        )
        return math.nan, math.nan
    check_finite(v, "values")
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
