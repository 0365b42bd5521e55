"""The conformal-set and selective-risk-control columns of one results row.

`conformal_risk_columns` fits on the method's ``calib`` split and measures on its ID and shifted
splits (calibrated on ID: the shift columns say whether the guarantee survives the shift):

``cp_<score>_<a>_{cov,size,ssc}``  conformal sets (`uqbench.stats.conformal`) at α = a/100:
    empirical coverage, mean set size, worst size-stratified coverage; ``shift_cp_...`` on the
    shift.
``rc_<r>_{coverage,risk}``  the Learn-then-Test threshold for target risk r/100
    (`uqbench.stats.risk`): coverage and realised selective risk on ID; ``shift_rc_...`` on the
    shift.
``risk_at_<c>``  selective risk (error rate) of the c% least uncertain ID questions
    (``1 − selective_accuracy``; mean ± std over seeds, no CI).
``cp_note``/``rc_note``  why a cell is empty (an α the calib split cannot resolve, a target no
    threshold certifies, a split on which nothing was accepted); "" when none is.

Every number is the mean over seeds with ``_std``; the 95% percentile-bootstrap CIs (``_lo``,
``_hi``) resample the test questions with q̂ and the threshold held fixed, all columns of one
split from the same resamples. Both halves are memoised in the cache by the content they read
(kinds ``conformal`` and ``risk``).
"""
from __future__ import annotations

import hashlib
import itertools
import math
import sys
import warnings
from collections.abc import Callable, MutableMapping
from functools import cache, partial
from typing import Any

import numpy as np
from numpy.typing import NDArray

from uqbench.core.errors import NotReachable
from uqbench.files.cache import ArrayCache, source_hash
from uqbench.files.rundir import score_key
from uqbench.results import columns
from uqbench.results.evaluate import Scored
from uqbench.stats import conformal as C
from uqbench.stats import metrics as M
from uqbench.stats import risk as R
from uqbench.stats.metrics import bootstrap

#: Scores whose true-label scores go to ``scores.npz`` for the coverage figure.
FIGURE_SCORES = ("lac", "aps_rand", "raps_rand")
SPLITS = (("", "id"), ("shift_", "shift"))
#: Reasons for empty cells already warned about in this process.
WARNED: set[str] = set()


class ConformalNote(UserWarning):
    """Why a conformal or risk-control cell is empty: warned once per reason and process."""


def seen_note(msg: str) -> bool:
    """Whether this process warned the note ``msg`` already; marks it warned."""
    seen = msg in WARNED
    WARNED.add(msg)
    return seen


def _pct(x: float) -> str:
    return f"{round(x * 100):02d}"


def _resampled(n: int, n_boot: int, seed: int, entries: list[tuple[NDArray[np.integer],
               Callable[[NDArray[np.integer], NDArray[np.float64]], tuple[Any, ...]]]]
               ) -> list[tuple[NDArray[np.float64], ...]]:
    """Each entry's statistics on ``n_boot`` bootstrap resamples of the ``n`` test questions,
    (B,) arrays: an entry is ``(code, stat)``, ``code`` (n,) a small integer that tells the
    questions apart wherever ``stat`` could, and ``stat(codes, counts)`` the statistics given
    the codes of some questions and (B', U) resample counts of each of them
    (`uqbench.stats.conformal.resample_counts`).

    The resamples are those of ``np.random.default_rng(seed)``: `M.index_chunks`, a chunk at
    a time. The questions are counted by their row of codes (all entries'), distinct rows once:
    every statistic here is a ratio of integer-valued sums over the resample, which are exact,
    hence bitwise the same, whichever questions of a row carry the count. No (B, n) matrix is
    held: at most `bootstrap.CHUNK_ELEMENTS` counts (and a chunk of indices) at once."""
    _, first, row = np.unique(np.column_stack([code for code, _ in entries]), axis=0,
                              return_index=True, return_inverse=True)
    row = row.reshape(-1)
    codes = [code[first] for code, _ in entries]
    block = max(1, bootstrap.CHUNK_ELEMENTS // len(first))
    parts: list[list[tuple[Any, ...]]] = [[] for _ in entries]
    pending: list[NDArray[np.float64]] = []

    def flush() -> None:
        counts = np.concatenate(pending)
        pending.clear()
        for got, code, (_, stat) in zip(parts, codes, entries, strict=True):
            got.append(stat(code, counts))

    for idx in M.index_chunks(seed, [n], n_boot, M.chunk_rows(n)):
        if pending and sum(map(len, pending)) + len(idx[0]) > block:
            flush()
        pending.append(C.resample_counts(row[idx[0]], len(first)))
    if pending:
        flush()
    return [tuple(np.concatenate(column) for column in zip(*got, strict=True))
            for got in parts]


def _set_stats(code: NDArray[np.integer], counts: NDArray[np.float64]) -> tuple[Any, ...]:
    """`C.set_statistics` of the questions whose code is ``2 * size + covered``."""
    return C.set_statistics(code & 1, code >> 1, counts)


def _risk_stats(right: NDArray[np.float64], code: NDArray[np.integer],
                counts: NDArray[np.float64]) -> tuple[Any, ...]:
    """(coverage, `R.selective_risk`) of the questions whose code is ``2 * k + accepted``,
    ``right[k]`` their correctness."""
    return C.coverage(code & 1, counts), R.selective_risk(code & 1, right[code >> 1], counts)


def _summarise(row: dict[str, Any], name: str, points: list[float],
               boots: list[NDArray[np.float64]]) -> None:
    row[name], row[f"{name}_std"] = M.mean_std(points)
    b = np.mean(boots, axis=0)
    b = b[np.isfinite(b)]
    lo, hi = np.quantile(b, [0.025, 0.975]) if b.size and math.isfinite(row[name]) else (
        math.nan, math.nan)
    row[f"{name}_lo"], row[f"{name}_hi"] = float(lo), float(hi)


def _empty(row: dict[str, Any], name: str) -> None:
    row[name] = row[f"{name}_std"] = row[f"{name}_lo"] = row[f"{name}_hi"] = math.nan


#: per split: the columns still to summarise (their names, None for one left empty, and each
#: seed's point statistics) and the `_resampled` entries of their seeds, in the same order
Pending = dict[str, tuple[list[tuple[tuple[str | None, ...], list[tuple[Any, ...]]]],
                          list[tuple[NDArray[np.integer], Any]]]]


def _summarise_pending(row: dict[str, Any], pending: Pending, tests: dict[str, Scored], *,
                       n_boot: int, seed: int) -> None:
    """`_summarise` every pending column of each split, from one pass over its resamples; the
    columns hold their place in ``row`` (`_empty` until then)."""
    for role, (todo, entries) in pending.items():
        if not todo:
            continue
        boots = iter(_resampled(len(tests[role].correct), n_boot, seed, entries))
        for names, points in todo:
            per_seed = [next(boots) for _ in points]
            for k, name in enumerate(names):
                if name is not None:
                    _summarise(row, name, [p[k] for p in points], [b[k] for b in per_seed])


def _check_probs(*splits: tuple[str, Scored]) -> None:
    for what, s in splits:
        if s.probs is None or s.labels is None:
            raise ValueError(f"conformal sets need the {what} split's predictive distribution: "
                             "build its Scored with Scored.of")


def _quantiles(true: dict[str, NDArray[np.float64]], alpha: float,
               groups: dict[str, NDArray[Any]] | None) -> dict[str, Any]:
    """q̂ for the ID and shift questions: one from all calib scores, or (``groups``: each
    question's domain, per split) each domain's own from its calib questions (Mondrian)."""
    if groups is None:
        q = C.conformal_quantile(true["calib"], alpha)
        return {"id": q, "shift": q}
    doms = np.unique(groups["calib"])
    per_dom = np.array([C.conformal_quantile(true["calib"][groups["calib"] == d], alpha)
                        for d in doms])
    out = {}
    for r in ("id", "shift"):
        if missing := sorted(set(np.unique(groups[r]).tolist()) - set(doms.tolist())):
            raise ValueError(f"per-domain conformal: no calib questions of {missing}")
        out[r] = per_dom[np.searchsorted(doms, groups[r])]
    return out


def conformal_columns(cal: Scored, id_: Scored, shift: Scored, *, n_boot: int, seed: int = 0,
                      groups: dict[str, NDArray[Any]] | None = None
                      ) -> tuple[dict[str, Any], dict[str, NDArray[np.float64]]]:
    """The ``cp_*`` columns and ``cp_note``; figure arrays ``{role}|conformity_{score}`` (N, S).
    Reads only the predictive distributions and labels. ``groups`` (each question's domain per
    split: ``calib``, ``id``, ``shift``; the pooled row) adds ``cpd_*``, the same columns for
    `FIGURE_SCORES` with each domain's q̂ fitted on its own calib questions."""
    _check_probs(("calib", cal), ("ID", id_), ("shift", shift))
    tests = {"id": id_, "shift": shift}
    n_seeds = cal.probs.shape[1]  # type: ignore[union-attr]
    pending: Pending = {role: ([], []) for role in tests}
    row: dict[str, Any] = {}
    notes: list[str] = []
    arrays: dict[str, list[NDArray[np.float64]]] = {}
    draws = []  # per seed: the uniform draw of every question of every split
    for s in range(n_seeds):
        rng = np.random.default_rng([seed, s])
        draws.append({"calib": rng.random(len(cal.correct)),
                      **{role: rng.random(len(t.correct)) for role, t in tests.items()}})
    probs = {"calib": cal.probs, "id": id_.probs, "shift": shift.probs}
    labels = {"calib": cal.labels, "id": id_.labels, "shift": shift.labels}
    for name, score in C.SCORES.items():
        true = [{r: C.true_label_scores(score, probs[r][:, s],  # type: ignore[index]
                                        labels[r][:, s], draws[s][r])  # type: ignore[index]
                 for r in probs} for s in range(n_seeds)]
        if name in FIGURE_SCORES:
            for role in ("calib", "id", "shift"):
                arrays[f"{role}|conformity_{name}"] = [t[role] for t in true]
        fits = [("cp", None)] + ([("cpd", groups)] if groups and name in FIGURE_SCORES else [])
        for alpha, (kind, grp) in itertools.product(C.ALPHAS, fits):
            col = f"{kind}_{name}_{_pct(alpha)}"
            try:
                qhat = [_quantiles(t, alpha, grp) for t in true]
            except NotReachable as exc:
                if str(exc) not in notes:
                    notes.append(str(exc))
                for prefix, _ in SPLITS:
                    for stat in ("cov", "size", "ssc"):
                        _empty(row, f"{prefix}{col}_{stat}")
                continue
            for prefix, role in SPLITS:
                names = tuple(f"{prefix}{col}_{k}" for k in ("cov", "size", "ssc"))
                points = []
                for s in range(n_seeds):
                    sets = C.prediction_sets(score, probs[role][:, s],  # type: ignore[index]
                                             qhat[s][role], draws[s][role])
                    covered = C.covered(sets, labels[role][:, s])  # type: ignore[index]
                    size = sets.sum(axis=1)
                    points.append(C.set_statistics(covered, size))
                    pending[role][1].append(((2 * size + covered).astype(np.int32),
                                             _set_stats))
                pending[role][0].append((names, points))
                for cell in names:
                    _empty(row, cell)
    _summarise_pending(row, pending, tests, n_boot=n_boot, seed=seed)
    row["cp_note"] = " | ".join(notes)
    return row, {k: np.stack(v, axis=1) for k, v in arrays.items()}


def risk_columns(cal: Scored, id_: Scored, shift: Scored, *, n_boot: int, seed: int = 0
                 ) -> dict[str, Any]:
    """The ``rc_*`` and ``risk_at_*`` columns and ``rc_note``. Reads only the uncertainties
    and correctness."""
    tests = {"id": id_, "shift": shift}
    pending: Pending = {role: ([], []) for role in tests}
    row: dict[str, Any] = {}
    notes: list[str] = []
    n_seeds = cal.uncertainty.shape[1]
    # each seed's correctness values and which of them each question has, per split
    right = {role: [np.unique(t.correct[:, s], return_inverse=True) for s in range(n_seeds)]
             for role, t in tests.items()}
    for target in R.TARGETS:
        try:
            thr = [R.ltt_threshold(cal.uncertainty[:, s], cal.correct[:, s], target)
                   for s in range(n_seeds)]
        except NotReachable as exc:
            notes.append(str(exc))
            for prefix, _ in SPLITS:
                for stat in ("coverage", "risk"):
                    _empty(row, f"{prefix}rc_{_pct(target)}_{stat}")
            continue
        for prefix, role in SPLITS:
            sc = tests[role]
            points = []
            for s in range(n_seeds):
                acc = (sc.uncertainty[:, s] <= thr[s].threshold).astype(np.float64)
                points.append((C.coverage(acc),
                               R.selective_risk(acc, sc.correct[:, s])))  # type: ignore[arg-type]
                values, which = right[role][s]
                pending[role][1].append(((acc + 2 * which).astype(np.int32),
                                         partial(_risk_stats, values)))
            name = f"{prefix}rc_{_pct(target)}"
            _empty(row, f"{name}_coverage")
            _empty(row, f"{name}_risk")
            undefined = any(math.isnan(p[1]) for p in points)
            if undefined:
                notes.append(f"{name}_risk: no {role} question accepted at the calib threshold "
                             "(coverage 0), the realised risk is undefined")
            pending[role][0].append(((f"{name}_coverage", None if undefined else f"{name}_risk"),
                                     points))
    _summarise_pending(row, pending, tests, n_boot=n_boot, seed=seed)
    for name, col in columns.RISK_AT.items():
        row[name], row[f"{name}_std"] = M.per_seed(col.bound(), tests["id"].uncertainty,
                                                  tests["id"].correct)
    row["rc_note"] = " | ".join(notes)
    return row


def compute(cal: Scored, id_: Scored, shift: Scored, *, n_boot: int, seed: int = 0,
            groups: dict[str, NDArray[Any]] | None = None
            ) -> tuple[dict[str, Any], dict[str, NDArray[np.float64]]]:
    """(`conformal_columns` + `risk_columns`, the figure arrays)."""
    row, arrays = conformal_columns(cal, id_, shift, n_boot=n_boot, seed=seed, groups=groups)
    return {**row, **risk_columns(cal, id_, shift, n_boot=n_boot, seed=seed)}, arrays


@cache
def _code_hash() -> str:
    return source_hash(C, R, M, columns, sys.modules[__name__])


def _hash(*arrays: NDArray[Any] | None) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(b"-" if a is None else np.ascontiguousarray(a).tobytes() + str(a.shape).encode())
    return h.hexdigest()


def conformal_risk_columns(cache: ArrayCache | None, cal: Scored, id_: Scored, shift: Scored, *,
                    n_boot: int, seed: int = 0,
                    arrays: MutableMapping[str, NDArray[Any]] | None = None,
                    owner: tuple[str, str] = ("", ""),
                    groups: dict[str, NDArray[Any]] | None = None) -> dict[str, Any]:
    """`conformal_columns` and `risk_columns`, each memoised in ``cache`` by the content it
    reads (kinds ``conformal``, ``risk``: the scorers of one model share its predictive
    distribution, so they share one conformal entry). The figure arrays go into ``arrays``
    under ``score_key(method, domain, role, f"conformity_{score}")`` with ``owner`` =
    (method, domain) (the runner's ``scores.npz``); ``groups``: the pooled row's domains
    (`conformal_columns`). Every reason for an empty cell warns, from the cache too."""
    splits = (cal, id_, shift)
    opts = {"n_boot": n_boot, "seed": seed, "code": _code_hash()}

    def conformal() -> dict[str, NDArray[Any]]:
        cols, figs = conformal_columns(*splits, n_boot=n_boot, seed=seed, groups=groups)
        return {**{f"col|{k}": np.asarray(v) for k, v in cols.items()},
                **{f"fig|{k}": v for k, v in figs.items()}}

    def risk() -> dict[str, NDArray[Any]]:
        return {f"col|{k}": np.asarray(v)
                for k, v in risk_columns(*splits, n_boot=n_boot, seed=seed).items()}

    got: dict[str, NDArray[Any]] = {}
    for kind, fn, reads in (("conformal", conformal, ("probs", "labels")),
                            ("risk", risk, ("uncertainty", "correct"))):
        if any(getattr(s, f) is None for s in splits for f in reads):
            # confidence-only records: no sets to form (run.json skipped_columns says why)
            got["col|cp_note"] = np.asarray("")
            continue
        if cache is None:
            got.update(fn())
        else:
            material = {"scores": _hash(*(getattr(s, f) for s in splits for f in reads)), **opts}
            if kind == "conformal" and groups is not None:
                material["groups"] = _hash(*(np.asarray(groups[r]).astype("U") for r in groups))
            got.update(cache.get_or_compute(kind, material, fn)[0])
    row: dict[str, Any] = {}
    for k, v in got.items():
        if k.startswith("col|"):
            row[k[4:]] = str(v) if v.dtype.kind == "U" else float(v)
        elif arrays is not None:
            role, name = k[4:].split("|")  # fig|{role}|conformity_{score}
            arrays[score_key(*owner, role, name)] = v
    for kind in ("cp", "rc"):
        for msg in filter(None, row[f"{kind}_note"].split(" | ")):
            if not seen_note(msg):  # once per distinct reason and process, not once per row
                warnings.warn(msg, ConformalNote, stacklevel=2)
    return row


__all__ = [
    "FIGURE_SCORES",
    "ConformalNote",
    "compute",
    "conformal_columns",
    "conformal_risk_columns",
    "risk_columns",
    "seen_note",
]
