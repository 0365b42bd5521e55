"""The rows of the results table: every method on every domain and ``pooled``, then the
reference rows, from the forward records of a run (or of records made elsewhere), with the
per-example arrays the figures and verdicts read (``scores.npz``).

Methods are scored in worker processes (`score_workers`), one task per model/gate pair and
domain (``pooled`` included, unless there is one domain: then it is that domain's rows), so
that the pair's scorers share the bootstrap intervals memoised in their process
(`uqbench.results.evaluate`); a pair's methods are split over several tasks where there are
fewer pairs than workers (`task_groups`). Every interval is seeded on its own, so the rows and
arrays are those of the serial path, bit for bit; the workers' warnings are re-emitted here, and
their `record_fallback` entries recorded here, in the serial order."""
from __future__ import annotations

import os
import pickle
import sys
import warnings
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from multiprocessing import get_context
from typing import Any

import numpy as np

from uqbench.core.errors import (
    ConfigError,
    FallbackWarning,
    add_fallback,
    record_fallback,
    reset_fallbacks,
)
from uqbench.core.outputs import Outputs
from uqbench.core.plan import Method
from uqbench.core.registry import import_plugin
from uqbench.files.cache import PROTOCOL_VERSION, ArrayCache
from uqbench.files.rundir import SCORE_FIELDS, score_key
from uqbench.results.conformal_risk import ConformalNote, conformal_risk_columns, seen_note
from uqbench.results.evaluate import (
    RESAMPLES,
    Scored,
    evaluate_cached,
    remember_resamples,
)
from uqbench.results.recalibration import recalibrate_cached
from uqbench.results.references import (
    ReferenceInputs,
    drop_shift,
    learned_columns,
    reference_rows,
)
from uqbench.stats.metrics import ECE_BINS
from uqbench.stats.recalibration import CALIBRATORS

Rows = list[dict[str, Any]]
Arrays = dict[str, np.ndarray]
#: a warning raised in a worker: (category, message, filename, lineno)
Caught = tuple[type[Warning], str, str, int]
#: ``auto`` scores in the calling process below this much work: methods x one pair's examples
#: (ID, shift and calib of every domain and seed) x bootstrap resamples (the smoke profile:
#: ~2e6, the cpu profile: ~7e7). Starting a worker (imports, netcal) costs seconds on 2 cores,
#: more than a small run's whole scoring.
AUTO_MIN_WORK = 1e7


def check_workers(requested: int | str) -> None:
    """A `ConfigError` unless ``requested`` is ``"auto"`` or a whole number >= 1."""
    if requested != "auto" and (isinstance(requested, bool) or not isinstance(requested, int)
                                or requested < 1):
        raise ConfigError(f"--score-workers {requested!r}: give a number of processes >= 1 "
                          "(1 scores in this process), or auto")


def score_workers(requested: int | str, ms: Sequence[Method],
                  outs: Mapping[tuple[str, str, int], Outputs], n_boot: int) -> int:
    """The number of worker processes `score_all` should use: ``requested`` (``"auto"``:
    the cores this process may use (``os.sched_getaffinity``), at most one per method and
    domain, and 1 below `AUTO_MIN_WORK`; 1 = in this process), or 1 with a warning and a
    run.json ``fallbacks`` entry when a scorer cannot be sent to another process."""
    check_workers(requested)
    pairs = len(dict.fromkeys(m.pair.name for m in ms))
    domains = {split.split("/")[0] for _, split, _ in outs}   # split names: "domain/role"
    groups = len(ms) * (len(domains) + (len(domains) > 1))   # + pooled, unless one domain
    if requested == "auto":
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
            else os.cpu_count() or 1
        examples = sum(o.n for (pair, split, _), o in outs.items()  # every pair's
                       if not split.endswith("/train")) / max(pairs, 1)
        work = len(ms) * examples * n_boot
        n = 1 if work < AUTO_MIN_WORK else min(cores, groups)
    else:
        n = min(int(requested), groups)
    if n <= 1:
        return 1
    for m in ms:
        try:
            if type(m.scorer).__module__ == "__main__":  # another process cannot import it
                raise pickle.PicklingError("its class is defined in __main__")
            pickle.dumps(m)
        except (pickle.PicklingError, AttributeError, TypeError) as exc:  # what pickle raises
            record_fallback("scoring in worker processes", f"scorer {m.scorer.name!r}",
                            f"the scorer cannot be sent to another process ({exc}); scored in "
                            "this process instead, one method after another. Define its class "
                            "in an importable module and load it with --plugin MODULE")
            return 1
    return n


def score_all(ms: Sequence[Method], refs: ReferenceInputs,
              outs: Mapping[tuple[str, str, int], Outputs], n_seeds: int, n_boot: int,
              cache: ArrayCache | None = None, scorer_timeout: float | None = None,
              protocol: str = PROTOCOL_VERSION, *, workers: int = 1,
              plugins: Sequence[str] = ()
              ) -> tuple[list[dict[str, Any]], dict[str, np.ndarray]]:
    """One row per method per domain of ``refs`` and ``pooled``, then the reference rows
    (``chance``, ``options-only``, ``zero-shot``: `uqbench.results.references`; each method row
    with its ``learned`` columns); also the per-example arrays for
    figures. ``outs`` is keyed ``(pair name, "domain/role", seed)``; ``n_boot`` bootstrap
    resamples. With ``cache``, rows already evaluated on identical scores are read back.
    ``protocol``: the forward-record protocol the rows name (records made elsewhere keep the
    one they were made under). ``workers`` > 1: that many worker processes (`score_workers`),
    each of which imports ``plugins`` first (the modules defining the methods' scorers); the
    result is the same.

    ``outs`` holds the ``calib`` split of every domain too: each row's ``ece_ts``/``ece_hb``/
    ``ece_iso`` are the ECE on the ID split after recalibrating on it
    (`uqbench.results.recalibration`)."""
    job = (refs, n_seeds, n_boot, cache, scorer_timeout, protocol)
    rows: Rows = []
    arrays: Arrays = {}
    domains = [*refs.domains, "pooled"]
    # pooled over one domain is that domain: its rows are computed once (`as_domain`)
    scored = list(refs.domains) if len(refs.domains) == 1 else domains
    if workers <= 1:
        for m in ms:
            done = {dom: _score_method(m, dom, outs, *job) for dom in scored}
            for dom in domains:
                r, a = done.get(dom) or as_domain(*done[refs.domains[0]], dom)
                rows.append(r)
                arrays.update(a)
        return rows + reference_rows(refs, n_boot=n_boot, seed=0, protocol=protocol), arrays
    groups = task_groups(ms, workers, len(scored))
    torch = sys.modules.get("torch")  # recalibration's netcal runs on torch: the same threads
    threads = torch.get_num_threads() if torch is not None else None
    with ProcessPoolExecutor(min(workers, len(groups) * len(scored)),
                             mp_context=get_context("spawn"), initializer=_init_worker,
                             initargs=(tuple(plugins), threads)) as ex:
        futures: dict[tuple[int, str], Future[Any]] = {   # the pooled (largest) tasks first
            (g, dom): ex.submit(_score_group, group, dom, {  # the records the task reads
                k: o for k, o in outs.items() if k[0] == group[0].pair.name
                and not k[1].endswith("/train") and dom in ("pooled", k[1].split("/")[0])}, job)
            for dom in scored[::-1] for g, group in enumerate(groups)}
        with warnings.catch_warnings(record=True) as ref_caught:  # re-emitted after the methods'
            warnings.simplefilter("always")
            refs_rows = reference_rows(refs, n_boot=n_boot, seed=0, protocol=protocol)
        at = {id(m): (g, i) for g, group in enumerate(groups) for i, m in enumerate(group)}
        try:
            for m in ms:  # the serial order: rows, arrays, warnings and fallbacks
                for dom in domains:
                    if dom not in scored:
                        r, a = as_domain(r, a, dom)   # the one domain's, just above
                    else:  # a worker's error is raised here, its remote traceback as the cause
                        g, i = at[id(m)]
                        done, resamples = futures[g, dom].result()
                        remember_resamples(resamples)   # for the report's paired bootstraps
                        r, a, caught, fallbacks = done[i]
                        _reemit(caught, fallbacks)
                    rows.append(r)
                    arrays.update(a)
        finally:  # after an error no task that has not started yet starts (none is left else)
            ex.shutdown(cancel_futures=True)
    _reemit([(w.category, str(w.message), w.filename, w.lineno) for w in ref_caught], [])
    return rows + refs_rows, arrays


def task_groups(ms: Sequence[Method], workers: int, domains: int) -> list[list[Method]]:
    """The methods of each worker task (with each domain): those of one model/gate pair, which
    then share the model's intervals (`uqbench.results.evaluate.INTERVALS`), split in turns
    into as many parts as it takes for every worker to have a task."""
    pairs: dict[str, list[Method]] = {}
    for m in ms:
        pairs.setdefault(m.pair.name, []).append(m)
    parts = -(-workers // max(len(pairs) * domains, 1))
    return [group[k::parts] for group in pairs.values() for k in range(min(parts, len(group)))]


def as_domain(row: dict[str, Any], arrays: Arrays, domain: str
              ) -> tuple[dict[str, Any], Arrays]:
    """A method's row and arrays of one domain as those of ``domain``: ``pooled`` over a single
    domain is that domain's questions, scored once."""
    def key(k: str) -> str:
        owner, _, role, name = k.rsplit("|", 3)
        return score_key(owner, domain, role, name)

    return {**row, "domain": domain}, {key(k): v for k, v in arrays.items()}


def _score_method(m: Method, dom: str, outs: Mapping[tuple[str, str, int], Outputs],
                  refs: ReferenceInputs, n_seeds: int, n_boot: int, cache: ArrayCache | None,
                  scorer_timeout: float | None, protocol: str) -> tuple[dict[str, Any], Arrays]:
    """The row of ``m`` on ``dom`` (a domain of ``refs`` or ``pooled``) and the arrays it adds."""
    arrays: Arrays = {}
    domains = list(refs.domains)
    parts = domains if dom == "pooled" else [dom]

    # a domain without a shift split (`uqbench.io.lmeval.NO_SHIFT`): its ID split stands in
    # for the shift so that every ID column is computed as with one; the shift columns are
    # then dropped (`drop_shift`), not reported
    has_shift = all(f"{d}/shift" in refs.hashes for d in parts)
    id_outs, sh_outs, cal_outs = (
        [Outputs.concat([outs[m.pair.name, f"{d}/{role}", r] for d in parts])
         for r in range(n_seeds)]
        for role in ("id", "shift" if has_shift else "id", "calib"))
    id_s, sh_s, cal_s = (Scored.of(m.scorer, o, timeout=scorer_timeout)
                         for o in (id_outs, sh_outs, cal_outs))
    metrics = evaluate_cached(cache, id_s, sh_s, n_bins=ECE_BINS, n_boot=n_boot, seed=0)
    recal, recal_conf = recalibrate_cached(
        cache, m.scorer, cal_outs, id_outs, cal_s.confidence, id_s.confidence,
        id_s.correct, where=f"{m.name} on {dom}", n_bins=ECE_BINS, n_boot=n_boot, seed=0)
    at = list(metrics).index("ece_hi") + 1  # the recalibrated ECEs beside the raw one
    row: dict[str, Any] = {
        "method": m.name, "model": m.pair.model.name, "gate": m.pair.gate.name,
        "scorer": m.scorer.name, "domain": dom,
        **dict(list(metrics.items())[:at]), **recal, **dict(list(metrics.items())[at:]),
        "forward_passes": m.scorer.passes(id_outs[0]),
        "n_id": id_outs[0].n, "n_shift": sh_outs[0].n, "n_calib": cal_outs[0].n,
        "seeds": n_seeds, "protocol": protocol,
        "split_hashes": ",".join(refs.hashes[f"{d}/{r}"] for d in parts
                                 for r in ("id", "shift") if f"{d}/{r}" in refs.hashes),
        "calib_hashes": ",".join(refs.hashes[f"{d}/calib"] for d in parts),
    }
    # conformal sets and selective risk control, fitted on calib
    groups = {r: o[0].domain for r, o in (("calib", cal_outs), ("id", id_outs),
                                           ("shift", sh_outs))} if len(parts) > 1 else None
    row.update(conformal_risk_columns(cache, cal_s, id_s, sh_s, n_boot=n_boot,
                                      arrays=arrays, owner=(m.name, dom), groups=groups))
    # what training added over the frozen backbone, paired over the same ID questions
    row.update(learned_columns(refs, parts, id_s.correct, n_boot=n_boot, seed=0))
    # per-example arrays are (N, seeds): verdicts and figures pool every seed
    for kind in CALIBRATORS:
        arrays[score_key(m.name, dom, "id", f"confidence_{kind}")] = \
            recal_conf.confidence[kind]
    roles = (("id", id_outs, id_s), ("shift", sh_outs, sh_s))[:2 if has_shift else 1]
    if not has_shift:
        row = drop_shift(row)
        arrays = {k: v for k, v in arrays.items() if k.split("|")[2:3] != ["shift"]}
    for role, os_, _ in roles:
        for f in ("route_entropy", "top1_mass", "disagreement", "experts", "labels"):
            if getattr(os_[0], f) is not None:
                arrays[score_key(m.pair.name, dom, role, f)] = np.stack(
                    [getattr(o, f) for o in os_], 1)
    for role, _, sc in roles:
        for f in SCORE_FIELDS:
            arrays[score_key(m.name, dom, role, f)] = getattr(sc, f)
    return row, arrays


def _init_worker(plugins: Sequence[str], threads: int | None) -> None:
    """A scoring worker's start: the parent's torch threads (netcal's fits give the same bits),
    then the plugins, so that their scorers unpickle."""
    if threads is not None:
        os.environ["OMP_NUM_THREADS"] = str(threads)  # read when netcal first imports torch
    for p in plugins:
        import_plugin(p)


def _score_group(group: Sequence[Method], dom: str,
                 outs: Mapping[tuple[str, str, int], Outputs], job: tuple[Any, ...]
                 ) -> tuple[list[Any], dict[str, np.ndarray]]:
    """In a worker: the row on ``dom`` of each method of one task (`task_groups`), with the warnings
    it raised and the fallbacks it recorded (an error reaches the parent through its future);
    and the resamples' statistics its intervals came from (`RESAMPLES`)."""
    before = set(RESAMPLES)
    results: list[Any] = []
    for m in group:
        fallbacks = reset_fallbacks()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")  # every one goes back; the parent filters
            r, a = _score_method(m, dom, outs, *job)
        results.append((r, a, [(w.category, str(w.message), w.filename, w.lineno)
                               for w in caught], list(fallbacks)))
    return results, {k: v for k, v in RESAMPLES.items() if k not in before}


def _reemit(caught: Iterable[Caught], fallbacks: Sequence[dict[str, str]]) -> None:
    """Warn ``caught`` here as if raised at their place (this process's filters and
    once-per-place registries); a `record_fallback` warning is recorded here too; neither it
    nor a conformal note (once per process) repeats what this process did already, as in one
    process."""
    entries = {f"{e['what']} ({e['where']}): {e['reason']}": e for e in fallbacks}
    modules: dict[str | None, Any] = {}  # by __file__ (None: a module without one)
    for category, message, filename, lineno in caught:
        if issubclass(category, FallbackWarning) and message in entries \
                and not add_fallback(entries.pop(message)):
            continue  # recorded (and warned) already, as in one process
        if issubclass(category, ConformalNote) and seen_note(message):
            continue  # once per process, as in one process: another worker warned it too
        if not modules:
            modules = {getattr(mod, "__file__", None): mod for mod in list(sys.modules.values())}
        module = modules.get(filename)
        registry = vars(module).setdefault("__warningregistry__", {}) if module else None
        warnings.warn_explicit(message, category, filename, lineno, registry=registry)


__all__ = ["AUTO_MIN_WORK", "check_workers", "score_all", "score_workers"]
