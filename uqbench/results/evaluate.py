"""Score one method on an ID split and its shifted split: metrics, bootstrap CIs, seed spread.

A *method* is (model, gate, scorer). Every metric is computed per seed and reported as the mean
over seeds with its standard deviation; 95% CIs are percentile-bootstrap intervals of that
seed-mean, resampling examples (the same examples for every seed, since all seeds see the same
split). ID metrics resample the ID split; OOD metrics resample ID and shifted splits independently.

`evaluate_cached` memoises rows on disk by *content*: the key is a hash of the scored arrays, the
options and the source of this module, `uqbench.stats.metrics` and the column declarations (a
plugin's too), so a changed score, option or metric definition can never be answered by an old
row.
"""
from __future__ import annotations

import hashlib
import math
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from functools import cache
from typing import Any

import numpy as np
from numpy.typing import NDArray

from uqbench.core.outputs import Outputs
from uqbench.core.scorer import Scorer, run_scorer
from uqbench.files.cache import ArrayCache, source_hash
from uqbench.results import columns
from uqbench.results.columns import COLUMNS as METRIC_COLUMNS
from uqbench.stats import metrics as M

#: Metrics that get a bootstrap CI (the others are reported as mean +- std over seeds).
CI_METRICS = tuple(name for name, col in METRIC_COLUMNS.items() if col.ci)
#: CI metrics bootstrapped together, from one sort per resample: their index in
#: `uqbench.stats.metrics.selective_summary`.
SELECTIVE = {"aurc": 0, "augrc": 1, "sel_acc_80": 2, "prr": 3, "sel_acc_10": 4}
#: the metric columns of a results row, and the expert budget
ROW_COLUMNS = (*METRIC_COLUMNS, "avg_experts", "shift_avg_experts")


@dataclass(frozen=True)
class Scored:
    """One method's per-example arrays on one split, stacked over seeds: shape (N, S)."""

    uncertainty: NDArray[np.float64]
    confidence: NDArray[np.float64]
    correct: NDArray[np.float64]
    experts: NDArray[np.float64] | None
    #: tokens each example's ``experts`` is a mean over (`Outputs.n_tokens`)
    n_tokens: NDArray[np.float64] | None = None
    #: (N, S, C) the scorer's predictive distribution (`Scorer.predictive`) and (N, S) the
    #: labels: Brier, NLL and conformal sets need them (None: those columns are NaN, warned)
    probs: NDArray[np.float64] | None = None
    labels: NDArray[np.int64] | None = None

    @staticmethod
    def of(scorer: Scorer, per_seed: Sequence[Outputs], *, timeout: float | None = None) -> Scored:
        u, conf, corr, probs, labs = [], [], [], [], []
        for out in per_seed:
            ui, ci = run_scorer(scorer, out, timeout=timeout)
            u.append(ui)
            conf.append(ci)
            if out.logits is None:  # confidence-only records: correctness recorded, no probs
                assert out.correct is not None  # Outputs: such records hold it
                corr.append(out.correct)
            else:
                assert out.labels is not None  # Outputs: labels come with logits
                probs.append(scorer.predictive(out))
                labs.append(out.labels)
                corr.append((probs[-1].argmax(axis=1) == out.labels).astype(float))
        exp = [o.experts for o in per_seed if o.experts is not None]
        tok = [o.n_tokens for o in per_seed if o.n_tokens is not None]
        experts = np.stack(exp, axis=1) if len(exp) == len(per_seed) else None
        n_tokens = np.stack(tok, axis=1) if len(tok) == len(per_seed) else None
        if len(probs) < len(per_seed):
            return Scored(np.stack(u, 1), np.stack(conf, 1), np.stack(corr, 1), experts,
                          n_tokens)
        labels = np.stack(labs, 1).astype(np.int64)
        return Scored(np.stack(u, 1), np.stack(conf, 1), np.stack(corr, 1), experts, n_tokens,
                      np.stack(probs, 1), labels)


#: bootstrap intervals of this process by content: methods of one model that share a
#: predictive distribution (msp, entropy, energy, margin) share their accuracy and ECE intervals
INTERVALS: dict[str, tuple[Any, Any]] = {}
#: the resamples' statistics behind this process's intervals, (B,) per column by content (the
#: keys of `INTERVALS`): the paired bootstraps of the report read them (`column_side`)
RESAMPLES: dict[str, NDArray[np.float64]] = {}
#: the most entries `RESAMPLES` holds (then it starts again)
RESAMPLE_ENTRIES = 16384


def remember_resamples(new: dict[str, NDArray[np.float64]]) -> None:
    """Add ``new`` to `RESAMPLES` (emptied first when they would not fit)."""
    if len(RESAMPLES) + len(new) > RESAMPLE_ENTRIES:
        RESAMPLES.clear()
    RESAMPLES.update(new)


def _interval_key(name: str, arrays: Sequence[NDArray[Any]], two_sample: bool,
                  options: dict[str, Any]) -> str:
    """The memo key of one column's interval: its name, options and the arrays' bytes."""
    h = hashlib.sha256(repr((name, two_sample, sorted(options.items()))).encode())
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes() + str(a.shape).encode())
    return h.hexdigest()


def _cis(wanted: Sequence[tuple[str, Callable[..., Any], Sequence[NDArray[Any]]]], *,
         two_sample: bool, n_boot: int, seed: int, **options: Any) -> dict[str, tuple[Any, Any]]:
    """(low, high) of the percentile bootstrap of each ``(name, fn, arrays)``'s seed mean, all
    from one draw of the resamples' indices (`uqbench.stats.metrics.bootstrap_cis`: bit for bit
    the intervals of one bootstrap per column, the same seed), memoised in this process by
    content (`_interval_key`)."""
    opts = {**options, "n_boot": n_boot, "seed": seed}
    keys = {name: _interval_key(name, arrays, two_sample, opts) for name, _, arrays in wanted}
    todo = [(name, fn, arrays) for name, fn, arrays in wanted if keys[name] not in INTERVALS]
    if len(INTERVALS) + len(todo) > 4096:
        INTERVALS.clear()
        todo = list(wanted)
    got = M.bootstrap_stats([(M.seed_mean(fn), arrays) for _, fn, arrays in todo],
                            two_sample=two_sample, n_resamples=n_boot, seed=seed)
    for (name, _, arrays), (point, stats) in zip(todo, got, strict=True):
        _, lo, hi = M.percentile_bounds(point, stats)
        INTERVALS[keys[name]] = (lo, hi)
        remember_resamples({_interval_key(column, arrays, two_sample, opts): stats[:, k]
                            for k, column in enumerate(SELECTIVE if name == "selective"
                                                       else [name])})
    return {name: INTERVALS[keys[name]] for name, _, _ in wanted}


def column_side(col: columns.Column, arrays: Sequence[NDArray[Any]], *, n_boot: int,
                seed: int = 0, n_bins: int = M.ECE_BINS) -> M.ResampledSide:
    """``col``'s paired-bootstrap side on ``arrays`` (`M.resample_side`), its resamples read
    from `RESAMPLES` where this process bootstrapped the same arrays for a results row (the
    same draws, the same statistics), else resampled now."""
    fn = M.seed_mean(col.bound(n_bins))
    key = _interval_key(col.name, arrays, col.two_sample,
                        {"n_bins": n_bins, "n_boot": n_boot, "seed": seed})
    stats = RESAMPLES.get(key)
    if stats is None:
        return M.resample_side(fn, arrays, two_sample=col.two_sample, n_resamples=n_boot,
                               seed=seed)
    sizes = tuple(len(a) for a in arrays) if col.two_sample else (len(arrays[0]),)
    return M.ResampledSide(float(fn(*arrays)), stats, sizes, seed)


def evaluate(id_: Scored, shift: Scored, *, n_bins: int = M.ECE_BINS, n_boot: int = 1000,
             seed: int = 0) -> dict[str, float]:
    """All table metrics of one method. Keys: metric, ``metric_std`` and, for `CI_METRICS`,
    ``metric_lo``/``metric_hi``.

    Calibration on the ID split: ``ece`` (``n_bins`` equal-width bins), ``ece_adaptive`` (as
    many equal-mass bins), ``ece_10_mass`` (HELM's ``ece_10_bin``), ``mce`` (the largest gap
    of the equal-width bins), ``brier`` (multiclass) and ``nll`` of the predictive
    distribution; ranking: ``aurc``, ``e_aurc``, ``augrc``, ``prr`` (LM-Polygraph's
    normalised PRR), ``sel_acc_80``, ``sel_acc_10`` (HELM's ``selective_acc@10``)
    (`uqbench.stats.metrics`, one definition each). The intervals of the one-sample columns
    come from one draw of resamples, those of ID against shift from another (`_cis`)."""

    splits = {"id": id_, "shift": shift}
    if id_.probs is None or id_.labels is None:
        warnings.warn("evaluate: the ID Scored has no predictive distribution (probs/labels); "
                      "brier and nll are NaN (records without a distribution over choices, or "
                      "a Scored not built with Scored.of)", stacklevel=2)
    row: dict[str, float] = {}
    wanted: dict[bool, list[tuple[str, Callable[..., Any], Sequence[NDArray[Any]]]]] = {
        False: [], True: []}
    # one-sample columns first, then those of ID against shift (the row's column order)
    for col in sorted(METRIC_COLUMNS.values(), key=lambda c: c.two_sample):
        name, arrays = col.name, tuple(getattr(splits[s], f) for s, f in col.reads)
        if any(a is None for a in arrays):  # brier/nll without a predictive distribution
            row[name] = row[f"{name}_std"] = row[f"{name}_lo"] = row[f"{name}_hi"] = math.nan
            continue
        fn = col.bound(n_bins)
        row[name], row[f"{name}_std"] = M.per_seed(fn, *arrays)
        if name in SELECTIVE or col.ci:  # its interval's place in the row's order
            row[f"{name}_lo"] = row[f"{name}_hi"] = math.nan
        if name in SELECTIVE:  # the five from one statistic
            if not any(w[0] == "selective" for w in wanted[False]):
                wanted[False].append(("selective", M.resampled_selective_summary(
                    M.SELECTIVE_COVERAGE), arrays))
        elif col.ci:
            wanted[col.two_sample].append((name, fn, arrays))
    for two_sample, cols in wanted.items():
        for name, (lo, hi) in _cis(cols, two_sample=two_sample, n_boot=n_boot, seed=seed,
                                   n_bins=n_bins).items():
            if name == "selective":
                for sel, k in SELECTIVE.items():
                    if sel in row:
                        row[f"{sel}_lo"], row[f"{sel}_hi"] = float(lo[k]), float(hi[k])
            else:
                row[f"{name}_lo"], row[f"{name}_hi"] = lo, hi
    for name, scored in (("avg_experts", id_), ("shift_avg_experts", shift)):
        if scored.experts is None:
            row[name] = row[f"{name}_std"] = float("nan")
        else:
            row[name], row[f"{name}_std"] = M.mean_std(per_token_experts(scored))
    return row


def per_token_experts(scored: Scored) -> list[float]:
    """Average experts per token, per seed: the paper's budget and the thermostat's target,
    ``sum_i experts_i * n_tokens_i / sum_i n_tokens_i`` (not the mean over examples of their
    per-token means). ``[nan]`` without router statistics; experts without token counts are an
    error, not silently weighted by example."""
    if scored.experts is None:
        return [float("nan")]
    if scored.n_tokens is None:
        raise ValueError("avg_experts: per-example expert means without their token counts "
                         "(Outputs.n_tokens); the per-token average cannot be formed")
    w = scored.n_tokens
    return list((scored.experts * w).sum(axis=0) / np.maximum(w.sum(axis=0), 1.0))


@cache
def _code_hash(registered: tuple[str, ...] = ()) -> str:
    """The source of the metrics, the column declarations, this module and the modules of the
    columns a plugin registered (`uqbench.results.columns.registered_modules`)."""
    return source_hash(M, columns, sys.modules[__name__],
                       *(sys.modules[m] for m in registered))


def _content_hash(*scored: Scored) -> str:
    h = hashlib.sha256()
    for s in scored:
        for f in fields(s):
            a = getattr(s, f.name)
            h.update(f.name.encode() + (b"-" if a is None else np.ascontiguousarray(a).tobytes()))
            h.update(b"" if a is None else str(a.shape).encode())
    return h.hexdigest()


def evaluate_cached(cache: ArrayCache | None, id_: Scored, shift: Scored, **options: Any
                    ) -> dict[str, float]:
    """`evaluate`, memoised in ``cache`` (kind ``evaluate``) by content; no cache -> compute."""
    if cache is None:
        return evaluate(id_, shift, **options)
    material = {"scores": _content_hash(id_, shift), "options": options,
                "code": _code_hash(columns.registered_modules())}
    arrays, _ = cache.get_or_compute(
        "evaluate", material,
        lambda: {k: np.asarray(v, dtype=np.float64)
                 for k, v in evaluate(id_, shift, **options).items()})
    return {k: float(v) for k, v in arrays.items()}
