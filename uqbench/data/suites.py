"""Suites: domains x roles of built, hashed, cached splits (`build_suite`).

What a suite is made of and suite YAML files: `uqbench.data.suite_spec`; the built-in `pooled`
suite: `uqbench.data.pooled`; the cache of built splits: `uqbench.data.split_cache`. Their
public names are importable from here too.

**Selection.** Each role draws from a *pool*: the items of one (source, split) after its
filters (MMLU subjects, seeded half). A pool is put in a seeded random order once; roles
drawing from the same pool take consecutive slices of that order in the order calib, train,
id, shift, so they never overlap, and the calib slice (the head) does not move when the train
cap changes. A role takes items until it holds its cap (``Profile.<role>_cap``, overridden by the
suite's ``caps``; None = the whole rest of the pool). For built sources (math, code) an item the
builder rejects is consumed and skipped, so a split still reaches its cap when the pool allows;
code items are built by a pool of `N_WORKERS` processes. Records are then put back in source
order. Everything is a function of (files, spec, caps, seed): two builds give the same hashes.
"""
from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import multiprocessing
import sys
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from uqbench.data import builders as B
from uqbench.data import sources
from uqbench.data.build_stats import CODE_KINDS, StatsAgg
from uqbench.data.records import MCRecord, Split
from uqbench.data.seeds import derive_seed
from uqbench.data.sources import HubLoader, Item, Loaded
from uqbench.data.split_cache import CACHE_FORMAT, SplitCache, canon
from uqbench.data.suite_spec import (
    REQUIRED_ROLES,
    ROLES,
    SUITES,
    DomainSpec,
    RoleSpec,
    Suite,
    SuiteSpec,
    check_head,
    get_suite_spec,
    list_suites,
    load_suite_file,
    parse_caps,
    parse_suite,
    register_suite,
)
from uqbench.errors import ConfigError, DataError, record_fallback
from uqbench.profiles import HEADS, Profile, get_profile

#: Bump when selection or the split/recipe format changes.
SUITE_VERSION = "1"

#: Build order within a domain: calib is the head of the train pool.
BUILD_ORDER: tuple[str, ...] = ("calib", "train", "id", "shift")
#: Builders that execute code: built with a process pool.
PARALLEL_KINDS = CODE_KINDS
N_WORKERS = 2


def _rng(seed: int, *parts: str) -> np.random.Generator:
    return np.random.default_rng(derive_seed(seed, *parts))


@dataclass
class _Pool:
    key: str
    kind: str
    items: list[Item]  # in seeded order
    info: dict[str, Any]


class _Builder:
    """Builds one suite's splits (one instance per `build_suite` call)."""

    def __init__(self, spec: SuiteSpec, caps: Mapping[str, int | None], seed: int,
                 data_dir: Path | None, verify: bool, cache: SplitCache, progress: bool,
                 hub_loader: HubLoader | None) -> None:
        self.spec, self.caps, self.seed = spec, caps, seed
        self.data_dir, self.verify, self.cache = data_dir, verify, cache
        self.progress, self.hub_loader = progress, hub_loader
        self._loaded: dict[tuple[str, str, tuple[str, ...] | None], Loaded] = {}
        self._pools: dict[str, _Pool] = {}
        self._executor: cf.ProcessPoolExecutor | None = None

    def executor(self) -> cf.ProcessPoolExecutor:
        """One pool of `N_WORKERS` processes for the whole build (started on first use)."""
        if self._executor is None:
            self._executor = cf.ProcessPoolExecutor(N_WORKERS, mp_context=_mp_context())
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
            self._loaded[k] = sources.load_source(
                rs.source, rs.split, data_dir=self.data_dir, verify=self.verify,
                subjects=rs.subjects, hub_loader=self.hub_loader)
        return self._loaded[k]

    def files(self, rs: RoleSpec) -> dict[str, str]:
        """Checked sha256 of a role's files (no parsing on the local path)."""
        if self.data_dir is None:
            return dict(self.loaded(rs).files)
        return sources.source_files(rs.source, rs.split, data_dir=self.data_dir,
                                    verify=self.verify, subjects=rs.subjects)

    def pool(self, rs: RoleSpec) -> _Pool:
        key = rs.pool_key()
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
        if rs.choices is not None and loaded.kind == "mc":
            kept = [it for it in items if it.record is not None
                    and len(it.record.choices) == rs.choices]
            info["dropped_choices"] = {"kept_only": rs.choices, "dropped": len(items) - len(kept),
                                       "by_n_choices": dict(sorted(Counter(
                                           len(it.record.choices) for it in items
                                           if it.record is not None
                                           and len(it.record.choices) != rs.choices).items()))}
            items = kept
        order = _rng(self.seed, "pool", key).permutation(len(items))
        pool = _Pool(key, loaded.kind, [items[i] for i in order], info)
        info["size"] = len(items)
        self._pools[key] = pool
        return pool

    # -- one domain ---------------------------------------------------------------------------
    def domain_material(self, dom: DomainSpec, files: Mapping[str, str]) -> dict[str, Any]:
        """A domain's split cache key (plus ``role``); see `uqbench.data.split_cache`."""
        srcs = {rs.source: sources.get_source(rs.source) for rs in dom.roles.values()}
        kinds = sorted({s.kind for s in srcs.values()})
        return {
            "what": "uqbench split", "suite": self.spec.name, "domain": dom.name,
            "spec": dom.to_json(), "caps": dict(self.caps), "seed": self.seed,
            "files": dict(sorted(files.items())), "verify": self.verify,
            "builders": {k: B.builder_info(k) for k in kinds},
            "sources": {n: s.version for n, s in sorted(srcs.items())},
            "suite_version": SUITE_VERSION, "loader_version": sources.LOADER_VERSION,
        }

    def build_domain(self, dom: DomainSpec, files: Mapping[str, str]) -> dict[str, Split]:
        base = self.domain_material(dom, files)
        cursors: dict[str, int] = {}
        out: dict[str, Split] = {}
        for role in BUILD_ORDER:
            rs = dom.roles[role]
            material = {**base, "role": role}
            key = rs.pool_key()
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
                split = self.build_split(dom.name, role, rs, cursors.get(key, 0))
                self.cache.put(self.spec.name, material, split)
                self.log(f"{self.spec.name}: built {dom.name}/{role}: {len(split.records)} "
                         f"records from {rs.source}:{rs.split} in "
                         f"{time.perf_counter() - t0:.1f}s")
            cursors[key] = int(split.recipe["selection"]["stop"])
            out[role] = split
            _record_unlimited(split, f"{self.spec.name}: {dom.name}/{role}")
        return {r: out[r] for r in ROLES}

    def build_split(self, domain: str, role: str, rs: RoleSpec, start: int) -> Split:
        pool = self.pool(rs)
        cap = self.caps.get(role)
        kind = pool.kind
        if kind == "mc":
            stop = len(pool.items) if cap is None else min(len(pool.items), start + cap)
            chosen = [(it, dataclasses.replace(it.record, domain=domain))
                      for it in pool.items[start:stop] if it.record is not None]
            stats: dict[str, Any] = {}
        else:
            ok, why = B.builder_available(kind)
            if not ok:
                raise DataError(f"{domain}/{role} needs the {kind} MC builder: {why}")
            chosen, stop, stats = self._build_many(domain, role, rs, pool, start, cap)
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
                       "files": self.files(rs),
                       "verified": self.verify},
            "filters": {"choices": rs.choices, "subjects": list(rs.subjects)
                        if rs.subjects is not None else None, "half": rs.half},
            "pool": pool.info,
            "selection": {"method": "seeded permutation of the pool; roles of one pool take "
                                    "consecutive slices in the order calib, train, id, shift; "
                                    "records kept in source order",
                          "seed": self.seed, "cap": cap, "start": start, "stop": stop},
            "builder": B.builder_info(kind),
            "suite_version": SUITE_VERSION,
        }
        if stats:
            recipe["builder_stats"] = stats
        return Split(domain, role, records, canon(recipe))

    def _build_many(self, domain: str, role: str, rs: RoleSpec, pool: _Pool, start: int,
                    cap: int | None) -> tuple[list[tuple[Item, MCRecord]], int, dict[str, Any]]:
        """Build MC records from the pool order until ``cap`` succeed (or the pool ends)."""
        kind, items = pool.kind, pool.items
        want = len(items) - start if cap is None else cap
        chosen: list[tuple[Item, MCRecord]] = []
        agg = StatsAgg(kind)
        pos = start
        parallel = kind in PARALLEL_KINDS
        t0 = time.perf_counter()
        while len(chosen) < want and pos < len(items):
            need = want - len(chosen)
            # a little over-asking covers builder rejections; extra results are discarded
            n = min(len(items) - pos, need + (max(2, need // 4) if parallel else 0))
            batch = items[pos:pos + n]
            if parallel and len(batch) > 1:
                results: Iterable[tuple[MCRecord | None, dict[str, Any]]] = self.executor().map(
                    B.build_item, [kind] * n, batch, [self.seed] * n, [domain] * n)
            else:
                results = (B.build_item(kind, it, self.seed, domain) for it in batch)
            for it, (rec, st) in zip(batch, results):
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
            if parallel:
                self.log(f"{self.spec.name}: {domain}/{role}: {len(chosen)}/{want} built, "
                         f"{pos - start} tried ({time.perf_counter() - t0:.0f}s)")
        return chosen, pos, agg.result()


def _record_unlimited(split: Split, where: str) -> None:
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


def _mp_context() -> multiprocessing.context.BaseContext:
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
                data_dir: str | Path | None = None, cache_dir: str | Path | None = None,
                seed: int = 0, progress: bool = True, verify: bool = True,
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
    cache_dir : path, optional
        Where built splits are cached as JSON (None: no cache).
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
        Missing/changed/malformed data, or a math/code builder that is not available; all
        raised before any split is built.

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
    root = sources.resolve_data_dir(data_dir)
    builder = _Builder(spec, caps, seed, root, verify, SplitCache(cache_dir), progress,
                       hub_loader)
    # everything that can fail cheaply fails here, before any split is built
    dom_files: dict[str, dict[str, str]] = {}
    for dom in spec.domains:
        files: dict[str, str] = {}
        for role in ROLES:
            rs = dom.roles[role]
            kind = sources.get_source(rs.source).kind
            ok, why = B.builder_available(kind)
            if not ok:
                raise DataError(f"suite {spec.name!r}: {dom.name}/{role} uses {rs.source!r}, "
                                f"whose multiple-choice form needs the {kind} builder: {why}")
            files.update(builder.files(rs))
        dom_files[dom.name] = files
    splits: dict[tuple[str, str], Split] = {}
    t0 = time.perf_counter()
    try:
        for dom in spec.domains:
            built = builder.build_domain(dom, dom_files[dom.name])
            _check_disjoint(spec.name, dom.name, built)
            for role, s in built.items():
                splits[dom.name, role] = s
    finally:
        builder.close()
    builder.log(f"{spec.name} ({prof.name}): {len(splits)} splits ready in "
                f"{time.perf_counter() - t0:.1f}s")
    return Suite(spec.name, prof.name, tuple(d.name for d in spec.domains), splits, seed, spec)


__all__ = [
    "BUILD_ORDER", "CACHE_FORMAT", "HEADS", "N_WORKERS", "PARALLEL_KINDS", "REQUIRED_ROLES",
    "ROLES", "SUITES", "SUITE_VERSION", "DomainSpec", "RoleSpec", "SplitCache", "Suite",
    "SuiteSpec", "build_suite", "check_head", "get_suite_spec", "list_suites",
    "load_suite_file", "parse_caps", "parse_suite", "register_suite",
]
