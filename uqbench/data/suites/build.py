"""Suites: domains x roles of built, hashed, cached splits (`build_suite`).

What a suite is made of, suite YAML files and the suite registry: `uqbench.data.suites.spec`;
the built-in `pooled` suite: `uqbench.data.suites.pooled`; the cache of built splits:
`uqbench.data.suites.cache`. A split is made here, in three steps: the role's *pool*, what it
*takes* from it (a parsed source's records, or its raw items through the source's own ``build``,
`make_record`), then the `Split` with its recipe and builder statistics.

**Selection.** Each role draws from a *pool*: the items of one (source, split) after its
filters (MMLU subjects, seeded half). A pool is put in a seeded random order once; roles
drawing from the same pool take consecutive slices of that order in the order calib, train,
id, shift, so they never overlap, and the calib slice (the head) does not move when the train
cap changes. A role takes items until it holds its cap (``Profile.<role>_cap``, overridden by the
suite's ``caps``; None = the whole rest of the pool). For built sources (math, code) an item the
builder rejects is consumed and skipped, so a split still reaches its cap when the pool allows;
sandboxed (code) items are built by a pool of `N_WORKERS` processes. Records are then put back in
source order. Everything is a function of (files, spec, caps, seed): two builds give the same
hashes.
"""
from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import multiprocessing
import re
import sys
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from uqbench.core.errors import ConfigError, DataError, record_fallback
from uqbench.core.profiles import Profile, get_profile
from uqbench.data.records import MCRecord, Split
from uqbench.data.seeds import derive_seed
from uqbench.data.sources.api import (
    LOADER_VERSION,
    HubLoader,
    Item,
    Loaded,
    Source,
    get_source,
    load_source,
    source_files,
)
from uqbench.data.sources.files import resolve_data_dir
from uqbench.data.sources.mmlu import MMLU_GROUPS
from uqbench.data.suites.cache import SplitCache, canon
from uqbench.data.suites.spec import ROLES, DomainSpec, RoleSpec, Suite, SuiteSpec, get_suite_spec

#: Bump when selection or the split/recipe format changes.
SUITE_VERSION = "1"
#: Bump when `make_record` (the per-item seed) or a source's reading of its raw items into a
#: typed problem (GSM8K hints, the SVAMP question, MBPP tests...) changes a record.
BUILD_ITEM_VERSION = "1"

#: Build order within a domain: calib is the head of the train pool.
BUILD_ORDER: tuple[str, ...] = ("calib", "train", "id", "shift")
#: Processes that run a sandboxed builder (`Source.sandboxed`: code MC).
N_WORKERS = 2


def _rng(seed: int, *parts: str) -> np.random.Generator:
    return np.random.default_rng(derive_seed(seed, *parts))


def pool_key(rs: RoleSpec) -> str:
    """Roles with the same pool key draw disjoint slices of one seeded order."""
    subj = _subjects_label(rs.subjects) if rs.subjects is not None else "*"
    half = "" if rs.half is None else f"#half{rs.half}"
    choices = "" if rs.choices is None else f"#choices{rs.choices}"
    return f"{rs.source}:{rs.split}[{subj}]{half}{choices}"


def _subjects_label(subjects: tuple[str, ...]) -> str:
    """Short, exact label of a subject list: whole MMLU groups by name, the rest listed."""
    rest, parts = list(subjects), []
    for g, members in MMLU_GROUPS.items():
        if members and all(m in rest for m in members):
            parts.append(g)
            rest = [s for s in rest if s not in members]
    return ",".join(parts + rest)


def builder_info(source: Source) -> dict[str, Any]:
    """What made a source's choices (in the split cache key and the recipe): the source options,
    or its ``build`` with its version constants and `BUILD_ITEM_VERSION`."""
    if source.build is None:
        return {"method": "source options", "loader_version": LOADER_VERSION}
    return {"method": f"{source.build.__module__}.{source.build.__qualname__}",
            "loader_version": LOADER_VERSION, "build_item_version": BUILD_ITEM_VERSION,
            **source.versions}


def make_record(source: str, split: str, item: Item, seed: int, domain: str | None = None
                ) -> tuple[MCRecord | None, dict[str, Any]]:
    """One item of ``source`` as an `MCRecord` (None if its builder rejects it) plus the
    builder's statistics.

    A parsed item is its record; a raw one goes through the source's ``build`` with a per-item
    seed derived from ``(seed, item.id)``, so the result does not depend on which other items are
    built or in which process. The record's id is the item's and its domain ``domain`` (default:
    the builder's). Takes the source's name, not the `Source`: it runs in worker processes.
    """
    return _make_record(get_source(source), split, item, seed, domain)


def _make_record(src: Source, split: str, item: Item, seed: int, domain: str | None
                 ) -> tuple[MCRecord | None, dict[str, Any]]:
    """`make_record` of a `Source` at hand (in this process)."""
    stats: dict[str, Any] = {}
    if src.build is None:
        assert item.record is not None
        rec: MCRecord | None = item.record
    else:
        rec, stats = src.build(src, split, item,
                               derive_seed(seed, item.id, nbytes=4, byteorder="big"))
        stats = dict(stats)
    if rec is not None:
        rec = dataclasses.replace(rec, id=item.id, domain=domain or rec.domain)
    return rec, stats


@dataclass
class _Pool:
    key: str
    source: Source
    items: list[Item]  # in seeded order
    info: dict[str, Any]


class SplitMaker:
    """Makes one suite's splits (one instance per `build_suite` call): a role's `pool`, then
    `take` from it, then the `Split` (`make_split`)."""

    def __init__(self, spec: SuiteSpec, caps: Mapping[str, int | None], seed: int,
                 data_dir: Path | None, verify: bool, cache: SplitCache, progress: bool,
                 hub_loader: HubLoader | None) -> None:
        self.spec = spec
        self.caps = caps
        self.seed = seed
        self.data_dir = data_dir
        self.verify = verify
        self.cache = cache
        self.progress = progress
        self.hub_loader = hub_loader
        self._loaded: dict[tuple[str, str, tuple[str, ...] | None], Loaded] = {}
        self._pools: dict[str, _Pool] = {}
        self._files: dict[RoleSpec, dict[str, str]] = {}
        self._executor: cf.ProcessPoolExecutor | None = None

    def executor(self) -> cf.ProcessPoolExecutor:
        """One pool of `N_WORKERS` processes for the whole build (started on first use)."""
        if self._executor is None:
            self._executor = cf.ProcessPoolExecutor(N_WORKERS, mp_context=worker_context())
        return self._executor

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None

    def log(self, msg: str) -> None:
        if self.progress:
            print(f"[uqbench data] {msg}", file=sys.stderr, flush=True)

    # -- inputs -------------------------------------------------------------------------------
    def loaded(self, rs: RoleSpec) -> Loaded:
        k = (rs.source, rs.split, rs.subjects)
        if k not in self._loaded:
            self._loaded[k] = load_source(
                rs.source, rs.split, data_dir=self.data_dir, verify=self.verify,
                subjects=rs.subjects, hub_loader=self.hub_loader)
        return self._loaded[k]

    def files(self, rs: RoleSpec) -> dict[str, str]:
        """Checked sha256 of a role's files (no parsing on the local path), kept for the
        role's recipe (`build_suite` checks every role's files before any split is built)."""
        if rs in self._files:
            return self._files[rs]
        if self.data_dir is None:
            self._files[rs] = dict(self.loaded(rs).files)
        else:
            self._files[rs] = source_files(rs.source, rs.split, data_dir=self.data_dir,
                                           verify=self.verify, subjects=rs.subjects)
        return self._files[rs]

    def pool(self, rs: RoleSpec) -> _Pool:
        key = pool_key(rs)
        if key in self._pools:
            return self._pools[key]
        loaded = self.loaded(rs)
        items = list(loaded.items)
        info: dict[str, Any] = {"key": key, "size_raw": len(items)}
        if rs.half is not None:
            strata: dict[str, list[Item]] = {}
            for it in items:
                strata.setdefault(it.stratum, []).append(it)
            keep: set[str] = set()
            for st, its in sorted(strata.items()):
                order = _rng(self.seed, "half", rs.source, rs.split, st).permutation(len(its))
                n0 = (len(its) + 1) // 2  # half 0 gets the odd one
                chosen = order[:n0] if rs.half == 0 else order[n0:]
                keep.update(its[i].id for i in chosen)
            items = [it for it in items if it.id in keep]
            info["half"] = {"half": rs.half, "of": info["size_raw"], "kept": len(items),
                            "stratified_by": "subject" if any(strata) else None}
        source = get_source(rs.source)
        if rs.choices is not None and source.build is None:
            kept = [it for it in items if it.record is not None
                    and len(it.record.choices) == rs.choices]
            info["dropped_choices"] = {"kept_only": rs.choices, "dropped": len(items) - len(kept),
                                       "by_n_choices": dict(sorted(Counter(
                                           len(it.record.choices) for it in items
                                           if it.record is not None
                                           and len(it.record.choices) != rs.choices).items()))}
            items = kept
        order = _rng(self.seed, "pool", key).permutation(len(items))
        pool = _Pool(key, source, [items[i] for i in order], info)
        info["size"] = len(items)
        self._pools[key] = pool
        return pool

    # -- one domain ---------------------------------------------------------------------------
    def domain_material(self, dom: DomainSpec, files: Mapping[str, str]) -> dict[str, Any]:
        """A domain's split cache key (plus ``role``); see `uqbench.data.suites.cache`."""
        srcs = {rs.source: get_source(rs.source) for rs in dom.roles.values()}
        return {
            "what": "uqbench split", "suite": self.spec.name, "domain": dom.name,
            "spec": dom.to_json(), "caps": dict(self.caps), "seed": self.seed,
            "files": dict(sorted(files.items())), "verify": self.verify,
            "builders": {n: builder_info(s) for n, s in sorted(srcs.items())},
            "sources": {n: s.version for n, s in sorted(srcs.items())},
            "suite_version": SUITE_VERSION, "loader_version": LOADER_VERSION,
        }

    def domain_splits(self, dom: DomainSpec, files: Mapping[str, str]) -> dict[str, Split]:
        base = self.domain_material(dom, files)
        cursors: dict[str, int] = {}
        out: dict[str, Split] = {}
        for role in BUILD_ORDER:
            rs = dom.roles[role]
            material = {**base, "role": role}
            key = pool_key(rs)
            hit = self.cache.get(self.spec.name, dom.name, role, material)
            if hit is not None:
                start = int(hit.recipe["selection"]["start"])
                if start != cursors.get(key, 0):  # the key fixes every earlier role's slice
                    raise DataError(
                        f"cached split {self.cache.path(self.spec.name, dom.name, role, material)}"
                        f" starts at item {start} of pool {key}, but the roles before it end at "
                        f"{cursors.get(key, 0)}: the split cache is inconsistent (edited by "
                        f"hand, or a bug). Delete the cache's {self.spec.name}/ folder and "
                        "rebuild.")
                split = hit
            else:
                t0 = time.perf_counter()
                split = self.make_split(dom.name, role, rs, cursors.get(key, 0))
                self.cache.put(self.spec.name, material, split)
                self.log(f"{self.spec.name}: built {dom.name}/{role}: {len(split.records)} "
                         f"records from {rs.source}:{rs.split} in "
                         f"{time.perf_counter() - t0:.1f}s")
            cursors[key] = int(split.recipe["selection"]["stop"])
            out[role] = split
            record_unlimited(split, f"{self.spec.name}: {dom.name}/{role}")
        return {r: out[r] for r in ROLES}

    def make_split(self, domain: str, role: str, rs: RoleSpec, start: int) -> Split:
        pool = self.pool(rs)
        cap = self.caps.get(role)
        chosen, stop, stats = self.take(domain, role, rs, pool, start, cap)
        if not chosen:
            raise ConfigError(
                f"suite {self.spec.name!r}: split {domain}/{role} would be empty: pool "
                f"{pool.key} has {len(pool.items)} items and {start} are taken by earlier roles "
                f"of the same pool (calib, train, id, shift draw from it in that order). Give "
                "the roles different splits, a 'half', or smaller caps.")
        chosen.sort(key=lambda p: p[0].position)
        records = tuple(r for _, r in chosen)
        recipe = {
            "suite": self.spec.name, "domain": domain, "role": role,
            "source": {"name": rs.source, "split": rs.split,
                       "origin": "hub" if self.data_dir is None else "local",
                       "files": dict(self._files[rs]),
                       "verified": self.verify},
            "filters": {"choices": rs.choices, "subjects": list(rs.subjects)
                        if rs.subjects is not None else None, "half": rs.half},
            "pool": pool.info,
            "selection": {"method": "seeded permutation of the pool; roles of one pool take "
                                    "consecutive slices in the order calib, train, id, shift; "
                                    "records kept in source order",
                          "seed": self.seed, "cap": cap, "start": start, "stop": stop},
            "builder": builder_info(pool.source),
            "suite_version": SUITE_VERSION,
        }
        if stats:
            recipe["builder_stats"] = stats
        return Split(domain, role, records, canon(recipe))

    def take(self, domain: str, role: str, rs: RoleSpec, pool: _Pool, start: int,
             cap: int | None) -> tuple[list[tuple[Item, MCRecord]], int, dict[str, Any]]:
        """Records from the pool order at ``start`` until ``cap`` are made (or the pool ends):
        ``(chosen, stop, builder stats)``. Parsed sources take a slice; built ones consume and
        skip the items their builder rejects."""
        src, items = pool.source, pool.items
        if src.build is None:
            stop = len(items) if cap is None else min(len(items), start + cap)
            return [(it, dataclasses.replace(it.record, domain=domain))
                    for it in items[start:stop] if it.record is not None], stop, {}
        want = len(items) - start if cap is None else cap
        chosen: list[tuple[Item, MCRecord]] = []
        agg = BuildStats(src)
        pos = start
        t0 = time.perf_counter()
        while len(chosen) < want and pos < len(items):
            need = want - len(chosen)
            # a little over-asking covers builder rejections; extra results are discarded
            n = min(len(items) - pos, need + (max(2, need // 4) if src.sandboxed else 0))
            batch = items[pos:pos + n]
            if src.sandboxed and len(batch) > 1:
                results: Iterable[tuple[MCRecord | None, dict[str, Any]]] = self.executor().map(
                    make_record, [src.name] * n, [rs.split] * n, batch, [self.seed] * n,
                    [domain] * n)
            else:
                results = (_make_record(src, rs.split, it, self.seed, domain)
                           for it in batch)
            for it, (rec, st) in zip(batch, results, strict=False):
                pos += 1
                if rec is not None and rs.choices is not None and len(rec.choices) != rs.choices:
                    st = {**st, "reason": f"choices!={rs.choices}"}
                    rec = None
                agg.add(rec, st)
                if rec is not None:
                    # JSON-canonical meta: a cached record equals a freshly built one
                    chosen.append((it, dataclasses.replace(rec, meta=canon(dict(rec.meta)))))
                    if len(chosen) >= want:
                        break
            if src.sandboxed:
                self.log(f"{self.spec.name}: {domain}/{role}: {len(chosen)}/{want} built, "
                         f"{pos - start} tried ({time.perf_counter() - t0:.0f}s)")
        return chosen, pos, agg.result()


class BuildStats:
    """Sums builder statistics (code: mutants; math: distractor methods) over a split."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self.tried = self.built = 0
        self.rejected: Counter[str] = Counter()
        self.sums: dict[str, float] = {}
        self.flags: Counter[str] = Counter()
        self.methods: Counter[str] = Counter()
        self.designs: Counter[str] = Counter()
        self.outcomes: Counter[str] = Counter()
        self.limits_failed: Counter[str] = Counter()

    def add(self, rec: MCRecord | None, st: Mapping[str, Any]) -> None:
        self.tried += 1
        if rec is None:
            why = str(st.get("reason") or self.source.rejects)
            # group by kind of reason: drop the per-problem details
            self.rejected[re.split(r" among |: ", why, maxsplit=1)[0]] += 1
        else:
            self.built += 1
        for k, v in st.items():
            if isinstance(v, bool):
                self.flags[k] += int(v)
            elif isinstance(v, (int, float)):
                self.sums[k] = self.sums.get(k, 0) + v
        self.outcomes.update(
            o for o in st.get("choice_outcomes", ()) if o
        )  # code: how mutants fail
        self.limits_failed.update(st.get("limits_failed", {}))  # code: runs without an OS limit
        if rec is not None:
            for m in _distractor_methods(rec.meta):
                self.methods[m.split(":")[0]] += 1  # family: "perturbation:plus_one" -> ...
            if isinstance(rec.meta.get("design"), str):
                self.designs[rec.meta["design"]] += 1

    def result(self) -> dict[str, Any]:
        d: dict[str, Any] = {"source": self.source.name, "tried": self.tried, "built": self.built,
                             "rejected": dict(sorted(self.rejected.items()))}
        if self.sums:
            d["totals"] = {k: (int(v) if float(v).is_integer() else v)
                           for k, v in sorted(self.sums.items())}
        if self.source.sandboxed:
            d["verified"] = self.flags.get("verified", 0)
            # sandboxed runs that went without an OS limit, by limit ({}: all were enforced)
            d["sandbox_limits_failed"] = dict(sorted(self.limits_failed.items()))
        d.update({f"n_{k}": v for k, v in sorted(self.flags.items()) if k != "verified"})
        if self.methods:
            d["distractor_methods"] = dict(self.methods.most_common())
        if self.designs:
            d["designs"] = dict(self.designs.most_common())
        if self.outcomes:
            d["mutant_outcomes"] = dict(self.outcomes.most_common())
        return d


def _distractor_methods(meta: Mapping[str, Any]) -> list[str]:
    """Distractor provenance labels a builder left in ``meta`` (best effort, any of the keys)."""
    for key in ("choice_methods", "distractor_methods", "distractor_sources", "distractors",
                "methods", "mutants"):
        v = meta.get(key)
        if isinstance(v, Mapping):
            v = list(v.values())
        if isinstance(v, list) and all(isinstance(x, str) for x in v):
            return [x for x in v if x != "gold"]
        if isinstance(v, list) and all(isinstance(x, Mapping) for x in v):
            return [str(x.get("method", x.get("kind", "?"))) for x in v]
    return []


def record_unlimited(split: Split, where: str) -> None:
    """Sandboxed builder runs (code MC) that went without an OS limit (`uqbench.data.sandbox`),
    from the split's recipe: warned and listed in run.json ``fallbacks`` on every run that uses
    the split, a cached one too (the recipe's ``builder_stats`` keep the counts)."""
    missing = split.recipe.get("builder_stats", {}).get("sandbox_limits_failed") or {}
    if missing:
        runs = ", ".join(f"{n} without {limit}" for limit, n in missing.items())
        record_fallback("sandbox limits", where,
                        f"sandboxed runs of candidate programs went on without OS limits the "
                        f"machine refused ({runs}); their pass/fail verdicts may differ from a "
                        "fully limited machine's")


def worker_context() -> multiprocessing.context.BaseContext:
    """"fork" on Linux: works from any caller (a script without a ``__main__`` guard, code piped
    on stdin), and the workers only run Python and sandbox subprocesses. "spawn" elsewhere."""
    if sys.platform.startswith("linux"):
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


def _check_disjoint(suite: str, dom: str, splits: Mapping[str, Split]) -> None:
    seen: dict[str, str] = {}
    for role in ROLES:
        for r in splits[role].records:
            if r.id in seen and seen[r.id] != role:
                raise ConfigError(
                    f"suite {suite!r}, domain {dom!r}: record {r.id!r} is in both "
                    f"{seen[r.id]} and {role}. Roles drawing from overlapping sources must use "
                    "the same source/split/subjects (they then take disjoint slices) or "
                    "different halves ('half: 0' / 'half: 1').")
            seen[r.id] = role


def build_suite(name_or_path: str | Path | SuiteSpec, profile: Profile | str, *,
                data_dir: str | Path | None = None,
                cache_dir: str | Path | SplitCache | None = None, seed: int = 0,
                progress: bool = True, verify: bool = True,
                hub_loader: HubLoader | None = None) -> Suite:
    """Build (or load from the cache) every split of a suite.

    Parameters
    ----------
    name_or_path : str or path
        A registered suite (`list_suites`) or a suite YAML file.
    profile : Profile or str
        Supplies the per-role caps (``train_cap``, ``calib_cap``, ``id_cap``, ``shift_cap``);
        a suite's own ``caps`` override them.
    data_dir : path, optional
        Local data folder (default ``$UQBENCH_DATA``; neither: the Hugging Face hub).
    cache_dir : path or SplitCache, optional
        Where built splits are cached as JSON (None: no cache); a `SplitCache` also tells
        which entries the suite was built from (``used``).
    seed : int
        Seeds the pool orders, halves and distractor builders.
    progress : bool
        Log what is built to stderr.
    verify : bool
        Check the data files' sha256 against the folder's manifest.
    hub_loader : callable, optional
        ``load_dataset``-compatible loader for the hub path (tests).

    Raises
    ------
    ConfigError
        Unknown suite or profile, invalid suite file, a split that would be empty.
    DataError
        Missing/changed/malformed data; raised before any split is built.

    Examples
    --------
    >>> s = build_suite("pooled", "smoke", data_dir="shared/data")  # doctest: +SKIP
    >>> s.split("science", "id").hash, len(s.train_records())  # doctest: +SKIP
    """
    spec = get_suite_spec(name_or_path)
    prof = get_profile(profile) if isinstance(profile, str) else profile
    caps: dict[str, int | None] = {"train": prof.train_cap, "calib": prof.calib_cap,
                                   "id": prof.id_cap, "shift": prof.shift_cap}
    caps.update(spec.caps)
    root = resolve_data_dir(data_dir)
    cache = cache_dir if isinstance(cache_dir, SplitCache) else SplitCache(cache_dir)
    maker = SplitMaker(spec, caps, seed, root, verify, cache, progress, hub_loader)
    # everything that can fail cheaply fails here, before any split is built
    dom_files = {dom.name: {f: h for role in ROLES for f, h in maker.files(dom.roles[role]).items()}
                 for dom in spec.domains}
    splits: dict[tuple[str, str], Split] = {}
    t0 = time.perf_counter()
    try:
        for dom in spec.domains:
            built = maker.domain_splits(dom, dom_files[dom.name])
            _check_disjoint(spec.name, dom.name, built)
            for role, s in built.items():
                splits[dom.name, role] = s
    finally:
        maker.close()
    maker.log(f"{spec.name} ({prof.name}): {len(splits)} splits ready in "
                f"{time.perf_counter() - t0:.1f}s")
    return Suite(spec.name, prof.name, tuple(d.name for d in spec.domains), splits, seed, spec)


__all__ = ["BUILD_ITEM_VERSION", "BUILD_ORDER", "N_WORKERS", "SUITE_VERSION", "build_suite",
           "builder_info", "make_record"]
