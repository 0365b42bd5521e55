"""Suites: domains x roles of built, hashed, cached splits.

A suite maps each domain to four roles: ``train`` (fine-tuning data), ``calib`` (an unlabeled,
seeded held-out slice of the train source, used by the CARE thermostat), ``id`` (in-distribution
evaluation) and ``shift`` (harder, shifted evaluation). The built-in `pooled` suite (DESIGN.md,
"Suites and profiles"):

========= ============================== ============================ =========================
domain    train (and calib)              id                           shift
========= ============================== ============================ =========================
science   ARC-Easy train                 ARC-Easy test                ARC-Challenge test
knowledge MMLU high_school_* subjects,   the other half               MMLU college_* and
          seeded per-subject half of test                             professional_* subjects
math      GSM8K train as numeric MC      GSM8K test (MC)              MATH-500 integer answers
code      MBPP ids 1-10, 511-974 (MC)    MBPP ids 11-510              HumanEval
========= ============================== ============================ =========================

Only questions with exactly 4 options are kept in ``pooled`` (the recipe counts the rest).

**Selection.** Each role draws from a *pool*: the items of one (source, split) after its
filters (MMLU subjects, seeded half). A pool is put in a seeded random order once; roles
drawing from the same pool take consecutive slices of that order in the order calib, train,
id, shift, so they never overlap, and the calib slice (the head) does not move when the train
cap changes. A role takes items until it holds its cap (``Profile.<role>_cap``, overridden by the
suite's ``caps``; None = the whole rest of the pool). For built sources (math, code) an item the
builder rejects is consumed and skipped, so a split still reaches its cap when the pool allows.
Records are then put back in source order. Everything is a function of (files, spec, caps,
seed): two builds give the same hashes.

**Cache.** Each built split is a JSON file under ``cache_dir/<suite>/`` whose name is the sha256
of its key material: suite spec of the domain, caps, seed, the sha256 of every source file of
the domain, the loader/builder versions and the sha256 of the code that made it. A changed
source file therefore never hits an old entry. Entries are written atomically (temporary file
+ ``os.replace``); on read the stored key and the records' content hash are checked and a
corrupt or stale entry is removed (with a `StaleCacheWarning`) and rebuilt.

**Custom suites** come from a YAML file with the same shape (see ``examples/suites/``)::

    name: my-suite
    choices: 4                      # optional: keep only questions with this many options
    domains:
      commonsense:
        train: {source: openbookqa, split: train}
        id:    {source: openbookqa, split: test}
        shift: {source: arc-challenge, split: test}
        # calib: optional, default = the train spec (a disjoint seeded slice of it)
    caps: {train: 200, id: 100, shift: 100}   # optional, overrides the profile's
    head: cloze                     # optional: auto | cloze | letters | cross_encoder

A role may also give ``subjects`` (MMLU subject names or the groups ``high_school``,
``college``, ``professional``), ``half`` (0 or 1: a seeded half of the source, per MMLU subject)
and ``choices``.
"""
from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import difflib
import hashlib
import json
import multiprocessing
import re
import sys
import time
import warnings
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from uqbench.cache import StaleCacheWarning, atomic_write_text, key_hash
from uqbench.data import loaders as L
from uqbench.data.records import MCRecord, Split, content_hash
from uqbench.errors import ConfigError, DataError
from uqbench.profiles import HEADS, Profile, get_profile
from uqbench.registry import Registry

#: Bump when selection or the split/recipe format changes.
SUITE_VERSION = "1"
#: Cache file format.
CACHE_FORMAT = 1

ROLES: tuple[str, ...] = ("train", "calib", "id", "shift")
#: Build order within a domain: calib is the head of the train pool.
BUILD_ORDER: tuple[str, ...] = ("calib", "train", "id", "shift")
REQUIRED_ROLES: tuple[str, ...] = ("train", "id", "shift")
#: Builders that execute code: built with a process pool.
PARALLEL_KINDS = frozenset({"mbpp", "humaneval"})
N_WORKERS = 2


# --------------------------------------------------------------------------------------------
# Specs
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RoleSpec:
    """Where one role's records come from.

    ``subjects`` (MMLU only) keeps those subjects; ``half`` (0/1) keeps a seeded half of the
    source, stratified by MMLU subject; ``choices`` keeps only questions with that many options.
    """

    source: str
    split: str
    subjects: tuple[str, ...] | None = None
    half: int | None = None
    choices: int | None = None

    def pool_key(self) -> str:
        """Roles with the same pool key draw disjoint slices of one seeded order."""
        subj = _subjects_label(self.subjects) if self.subjects is not None else "*"
        half = "" if self.half is None else f"#half{self.half}"
        choices = "" if self.choices is None else f"#choices{self.choices}"
        return f"{self.source}:{self.split}[{subj}]{half}{choices}"

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"source": self.source, "split": self.split}
        if self.subjects is not None:
            d["subjects"] = list(self.subjects)
        if self.half is not None:
            d["half"] = self.half
        if self.choices is not None:
            d["choices"] = self.choices
        return d


def _subjects_label(subjects: tuple[str, ...]) -> str:
    """Short, exact label of a subject list: whole MMLU groups by name, the rest listed."""
    rest, parts = list(subjects), []
    for g, members in L.MMLU_GROUPS.items():
        if members and all(m in rest for m in members):
            parts.append(g)
            rest = [s for s in rest if s not in members]
    return ",".join(parts + rest)


@dataclass(frozen=True)
class DomainSpec:
    name: str
    roles: Mapping[str, RoleSpec]

    def to_json(self) -> dict[str, Any]:
        return {r: self.roles[r].to_json() for r in ROLES}


@dataclass(frozen=True)
class SuiteSpec:
    """A suite definition: its domains' role specs and optional cap overrides."""

    name: str
    domains: tuple[DomainSpec, ...]
    caps: Mapping[str, int | None] = field(default_factory=dict)
    description: str = ""
    origin: str = "built-in"
    models: tuple[str, ...] = ()  # `models:` (uqbench list models); empty: lora + moe-lora
    head: str = "auto"  # `head:` how options are scored (`baselines.heads`); --head overrides

    def domain(self, name: str) -> DomainSpec:
        for d in self.domains:
            if d.name == name:
                return d
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "domains": {d.name: d.to_json() for d in self.domains},
                "caps": dict(self.caps)}


def _pooled() -> SuiteSpec:
    four = 4

    def r(source: str, split: str, **kw: Any) -> RoleSpec:
        return RoleSpec(source, split, choices=four, **kw)

    hs = L.MMLU_GROUPS["high_school"]
    cp = L.MMLU_GROUPS["college"] + L.MMLU_GROUPS["professional"]
    doms = (
        DomainSpec("science", {"train": r("arc-easy", "train"), "calib": r("arc-easy", "train"),
                               "id": r("arc-easy", "test"), "shift": r("arc-challenge", "test")}),
        DomainSpec("knowledge", {
            "train": r("mmlu", "test", subjects=hs, half=0),
            "calib": r("mmlu", "test", subjects=hs, half=0),
            "id": r("mmlu", "test", subjects=hs, half=1),
            "shift": r("mmlu", "test", subjects=cp)}),
        DomainSpec("math", {"train": r("gsm8k", "train"), "calib": r("gsm8k", "train"),
                            "id": r("gsm8k", "test"), "shift": r("math500", "test")}),
        DomainSpec("code", {"train": r("mbpp", "train"), "calib": r("mbpp", "train"),
                            "id": r("mbpp", "test"), "shift": r("humaneval", "test")}),
    )
    return SuiteSpec("pooled", doms, description="four domains x (train, calib, id, shift); "
                     "DESIGN.md 'Suites and profiles'")


SUITES: Registry[SuiteSpec] = Registry("suite")
SUITES.add("pooled", _pooled())


def register_suite(spec: SuiteSpec) -> SuiteSpec:
    """Register a suite definition under ``spec.name`` (duplicate name -> ValueError)."""
    return SUITES.add(spec.name, spec)


def list_suites() -> list[str]:
    """Names of the registered suites (``uqbench run --suite`` also takes a YAML path)."""
    return SUITES.names()


# -- YAML -------------------------------------------------------------------------------------

_SUITE_KEYS = {"name", "description", "domains", "caps", "choices", "models", "head"}
_ROLE_KEYS = {"source", "split", "subjects", "half", "choices"}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def _choices(v: Any, where: str) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 2:
        raise ConfigError(f"{where}: 'choices' must be an integer >= 2 (the number of options "
                          f"to keep), got {v!r}")
    return v


def parse_caps(caps: Any, where: str = "suite") -> dict[str, int | None]:
    """Validate a ``caps`` mapping: role -> positive int or null (= all)."""
    if caps is None:
        return {}
    if not isinstance(caps, Mapping):
        raise ConfigError(f"{where}: 'caps' must be a mapping like {{train: 200, id: 100}}, "
                          f"got {caps!r}")
    out: dict[str, int | None] = {}
    for k, v in caps.items():
        if k not in ROLES:
            raise ConfigError(f"{where}: unknown role {k!r} in 'caps'; valid: {', '.join(ROLES)}")
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ConfigError(f"{where}: cap for {k!r} must be a positive integer or null "
                              f"(= all), got {v!r}")
        out[k] = v
    return out


def parse_suite(data: Any, *, origin: str = "<suite>", default_name: str | None = None
                ) -> SuiteSpec:
    """Validate a suite mapping (parsed YAML) into a `SuiteSpec`; ConfigError on any problem.

    Checks unknown keys, missing roles, unknown sources/splits (listing the valid ones), MMLU
    subjects, halves, choices and caps. No data is read.
    """
    if not isinstance(data, Mapping):
        raise ConfigError(f"{origin}: a suite file must be a mapping with 'name' and 'domains', "
                          f"got {type(data).__name__}")
    extra = set(data) - _SUITE_KEYS
    if extra:
        raise ConfigError(f"{origin}: unknown key(s) {', '.join(map(repr, sorted(extra)))}; "
                          f"valid: {', '.join(sorted(_SUITE_KEYS))}")
    name = data.get("name", default_name)
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigError(f"{origin}: 'name' must be a simple name (letters, digits, '-', '_', "
                          f"'.'), got {name!r}")
    doms = data.get("domains")
    if not isinstance(doms, Mapping) or not doms:
        raise ConfigError(f"{origin}: 'domains' must be a non-empty mapping of domain name -> "
                          "{train: ..., id: ..., shift: ...}")
    top_choices = _choices(data.get("choices"), origin)
    domains = []
    for dname, roles in doms.items():
        where = f"{origin}: domain {dname!r}"
        if not isinstance(dname, str) or not _NAME.match(dname) or dname == "pooled":
            raise ConfigError(f"{where}: domain names must be simple names (not 'pooled', "
                              "which names the union of domains)")
        if not isinstance(roles, Mapping):
            raise ConfigError(f"{where}: expected a mapping of roles {', '.join(ROLES)}")
        unknown = set(roles) - set(ROLES)
        if unknown:
            raise ConfigError(f"{where}: unknown role(s) {', '.join(map(repr, sorted(unknown)))}"
                              f"; valid roles: {', '.join(ROLES)}")
        missing = [r for r in REQUIRED_ROLES if r not in roles]
        if missing:
            raise ConfigError(f"{where}: missing role(s) {', '.join(missing)}; every domain "
                              "needs train, id and shift (calib defaults to a held-out slice of "
                              "train)")
        specs = {r: _parse_role(roles[r], f"{where}, role {r!r}", top_choices)
                 for r in ROLES if r in roles}
        specs.setdefault("calib", specs["train"])
        domains.append(DomainSpec(dname, specs))
    return SuiteSpec(name, tuple(domains), parse_caps(data.get("caps"), origin),
                     str(data.get("description", "")), origin,
                     _models(data.get("models"), origin),
                     check_head(data.get("head", "auto"), f"{origin}: 'head'"))


def check_head(v: Any, where: str = "--head") -> str:
    """``head:`` -- how a model scores the options (decoders: ``cloze`` = length-normalised
    option log-likelihood, ``letters`` = answer-letter logits)."""
    if v not in HEADS:
        raise ConfigError(f"{where}: head {v!r} unknown; valid: {', '.join(HEADS)} (cloze and "
                          "letters are for decoder backbones, bi_encoder and cross_encoder for encoders)")
    return str(v)


def _models(v: Any, where: str) -> tuple[str, ...]:
    """``models:`` -- a list (or comma-separated string) of model names to train and score."""
    from uqbench.plan import MODELS

    if v is None:
        return ()
    names = [x.strip() for x in v.split(",")] if isinstance(v, str) else v
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise ConfigError(f"{where}: 'models' must be a non-empty list of model names, got {v!r}")
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        raise ConfigError(f"{where}: unknown model(s) {', '.join(map(repr, unknown))} in "
                          f"'models'; valid: {', '.join(MODELS)}")
    return tuple(names)


def _parse_role(v: Any, where: str, default_choices: int | None) -> RoleSpec:
    if not isinstance(v, Mapping):
        raise ConfigError(f"{where}: expected {{source: NAME, split: NAME}}, got {v!r}")
    extra = set(v) - _ROLE_KEYS
    if extra:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(map(repr, sorted(extra)))}; "
                          f"valid: {', '.join(sorted(_ROLE_KEYS))}")
    if "source" not in v or "split" not in v:
        raise ConfigError(f"{where}: needs 'source' and 'split'; sources: "
                          f"{', '.join(L.list_sources())}")
    try:
        L.get_source(str(v["source"]), str(v["split"]))
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    subjects = None
    if v.get("subjects") is not None:
        if not str(v["source"]).startswith("mmlu"):
            raise ConfigError(f"{where}: 'subjects' only applies to MMLU sources")
        s = v["subjects"]
        if isinstance(s, str):
            s = [s]
        try:
            subjects = L.mmlu_subjects([str(x) for x in s])
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    half = v.get("half")
    if half is not None and (isinstance(half, bool) or half not in (0, 1)):
        raise ConfigError(f"{where}: 'half' must be 0 or 1, got {half!r}")
    ch = _choices(v.get("choices"), where)
    return RoleSpec(str(v["source"]), str(v["split"]), subjects, half,
                    ch if ch is not None else default_choices)


def load_suite_file(path: str | Path) -> SuiteSpec:
    """Read and validate a suite YAML file (ConfigError naming the file on any problem)."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"suite file {str(p)!r} does not exist; give a built-in suite name "
                          f"({', '.join(list_suites())}) or a path to a suite YAML file")
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: invalid YAML: {exc}") from None
    return parse_suite(data, origin=str(p), default_name=p.stem)


def get_suite_spec(name_or_path: str | Path | SuiteSpec) -> SuiteSpec:
    """A registered suite by name, or a YAML file by path; ConfigError listing valid names."""
    if isinstance(name_or_path, SuiteSpec):
        return name_or_path
    s = str(name_or_path)
    if s.endswith((".yaml", ".yml")) or "/" in s or Path(s).is_file():
        return load_suite_file(s)
    if s in SUITES:
        return SUITES.get(s)
    close = difflib.get_close_matches(s, list_suites(), n=3, cutoff=0.5)
    hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
    raise ConfigError(f"unknown suite {s!r}{hint}; valid: {', '.join(list_suites())}, or the "
                      "path to a suite YAML file (see examples/suites/)")


# --------------------------------------------------------------------------------------------
# Suite
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Suite:
    """A built suite: ``splits[(domain, role)]`` for every domain and role in `ROLES`."""

    name: str
    profile: str
    domains: tuple[str, ...]
    splits: Mapping[tuple[str, str], Split]
    seed: int = 0
    spec: SuiteSpec | None = None

    def split(self, domain: str, role: str) -> Split:
        try:
            return self.splits[domain, role]
        except KeyError:
            raise KeyError(f"suite {self.name!r} has no split {domain}/{role}; domains: "
                           f"{', '.join(self.domains)}; roles: {', '.join(ROLES)}") from None

    def role(self, role: str) -> list[Split]:
        """That role's split of every domain, in domain order."""
        if role not in ROLES:
            raise KeyError(f"unknown role {role!r}; valid: {', '.join(ROLES)}")
        return [self.splits[d, role] for d in self.domains]

    def train_records(self) -> tuple[MCRecord, ...]:
        """The union of the domains' train splits (the pooled training set), domain by domain."""
        return tuple(r for s in self.role("train") for r in s.records)


# --------------------------------------------------------------------------------------------
# Cache
# --------------------------------------------------------------------------------------------

def _canon(x: Any) -> Any:
    return json.loads(json.dumps(x, sort_keys=True, default=str))


class SplitCache:
    """``root/<suite>/<domain>-<role>-<keyhash>.json`` entries (see module doc)."""

    def __init__(self, root: str | Path | None) -> None:
        self.root = Path(root) if root is not None else None

    def path(self, suite: str, domain: str, role: str, material: Mapping[str, Any]) -> Path:
        assert self.root is not None
        return self.root / suite / f"{domain}-{role}-{key_hash(material)[:24]}.json"

    def get(self, suite: str, domain: str, role: str, material: Mapping[str, Any]
            ) -> Split | None:
        if self.root is None:
            return None
        path = self.path(suite, domain, role, material)
        if not path.exists():
            return None
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
            if d.get("format") != CACHE_FORMAT or d["key"] != _canon(material):
                raise ValueError("key mismatch (stale entry)")
            records = tuple(MCRecord.from_json(r) for r in d["records"])
            h = content_hash(records)
            if h != d["hash"]:
                raise ValueError(f"content hash {h} != stored {d['hash']}")
            split = Split(d["domain"], d["role"], records, d["recipe"], h)
            if (split.domain, split.role) != (domain, role):
                raise ValueError("domain/role mismatch")
            int(split.recipe["selection"]["stop"])
            return split
        except (OSError, ValueError, KeyError, TypeError) as exc:
            warnings.warn(f"cached split {path} is corrupt or stale ({type(exc).__name__}: "
                          f"{exc}); rebuilding it", StaleCacheWarning, stacklevel=3)
            path.unlink(missing_ok=True)
            return None

    def put(self, suite: str, material: Mapping[str, Any], split: Split) -> None:
        if self.root is None:
            return
        path = self.path(suite, split.domain, split.role, material)
        blob = {"format": CACHE_FORMAT, "key": _canon(material), "domain": split.domain,
                "role": split.role, "hash": split.hash, "recipe": _canon(split.recipe),
                "records": [r.to_json() for r in split.records]}
        atomic_write_text(path, json.dumps(blob, ensure_ascii=False, sort_keys=True))


_CODE_SHA: dict[str, str] = {}


def _code_sha() -> str:
    """sha256 of the modules that turn files into splits: an edit invalidates cached splits."""
    if not _CODE_SHA:
        h = hashlib.sha256()
        for f in (L.__file__, __file__):
            h.update(Path(f).read_bytes())
        _CODE_SHA["v"] = h.hexdigest()[:16]
    return _CODE_SHA["v"]


# --------------------------------------------------------------------------------------------
# Building
# --------------------------------------------------------------------------------------------

def _rng(seed: int, *parts: str) -> np.random.Generator:
    digest = hashlib.sha256("/".join([str(seed), *parts]).encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


@dataclass
class _Pool:
    key: str
    kind: str
    items: list[L.Item]  # in seeded order
    info: dict[str, Any]


class _Builder:
    """Builds one suite's splits (one instance per `build_suite` call)."""

    def __init__(self, spec: SuiteSpec, caps: Mapping[str, int | None], seed: int,
                 data_dir: Path | None, verify: bool, cache: SplitCache, progress: bool,
                 hub_loader: L.HubLoader | None) -> None:
        self.spec, self.caps, self.seed = spec, caps, seed
        self.data_dir, self.verify, self.cache = data_dir, verify, cache
        self.progress, self.hub_loader = progress, hub_loader
        self._loaded: dict[tuple[str, str, tuple[str, ...] | None], L.Loaded] = {}
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
    def loaded(self, rs: RoleSpec) -> L.Loaded:
        k = (rs.source, rs.split, rs.subjects)
        if k not in self._loaded:
            self._loaded[k] = L.load_source(rs.source, rs.split, data_dir=self.data_dir,
                                            verify=self.verify, subjects=rs.subjects,
                                            hub_loader=self.hub_loader)
        return self._loaded[k]

    def files(self, rs: RoleSpec) -> dict[str, str]:
        """Checked sha256 of a role's files (no parsing on the local path)."""
        if self.data_dir is None:
            return dict(self.loaded(rs).files)
        return L.source_files(rs.source, rs.split, data_dir=self.data_dir, verify=self.verify,
                              subjects=rs.subjects)

    def pool(self, rs: RoleSpec) -> _Pool:
        key = rs.pool_key()
        if key in self._pools:
            return self._pools[key]
        loaded = self.loaded(rs)
        items = list(loaded.items)
        info: dict[str, Any] = {"key": key, "size_raw": len(items)}
        if rs.half is not None:
            strata: dict[str, list[L.Item]] = {}
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
        kinds = sorted({L.get_source(rs.source).kind for rs in dom.roles.values()})
        return {
            "what": "uqbench split", "suite": self.spec.name, "domain": dom.name,
            "spec": dom.to_json(), "caps": dict(self.caps), "seed": self.seed,
            "files": dict(sorted(files.items())), "verify": self.verify,
            "builders": {k: L.builder_info(k) for k in kinds},
            "suite_version": SUITE_VERSION, "loader_version": L.LOADER_VERSION,
            "code_sha256": _code_sha(),
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
                if int(hit.recipe["selection"]["start"]) != cursors.get(key, 0):
                    hit = None  # cannot happen with an intact key; rebuild to be safe
                else:
                    out[role] = hit
                    cursors[key] = int(hit.recipe["selection"]["stop"])
                    continue
            t0 = time.perf_counter()
            split = self.build_split(dom.name, role, rs, cursors.get(key, 0))
            cursors[key] = int(split.recipe["selection"]["stop"])
            self.cache.put(self.spec.name, material, split)
            out[role] = split
            self.log(f"{self.spec.name}: built {dom.name}/{role}: {len(split.records)} records "
                     f"from {rs.source}:{rs.split} in {time.perf_counter() - t0:.1f}s")
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
            ok, why = L.builder_available(kind)
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
            "builder": L.builder_info(kind),
            "suite_version": SUITE_VERSION,
        }
        if stats:
            recipe["builder_stats"] = stats
        return Split(domain, role, records, _canon(recipe))

    def _build_many(self, domain: str, role: str, rs: RoleSpec, pool: _Pool, start: int,
                    cap: int | None) -> tuple[list[tuple[L.Item, MCRecord]], int, dict[str, Any]]:
        """Build MC records from the pool order until ``cap`` succeed (or the pool ends)."""
        kind, items = pool.kind, pool.items
        want = len(items) - start if cap is None else cap
        chosen: list[tuple[L.Item, MCRecord]] = []
        agg = _StatsAgg(kind)
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
                    L.build_item, [kind] * n, batch, [self.seed] * n, [domain] * n)
            else:
                results = (L.build_item(kind, it, self.seed, domain) for it in batch)
            for it, (rec, st) in zip(batch, results):
                pos += 1
                if rec is not None and rs.choices is not None and len(rec.choices) != rs.choices:
                    st = {**st, "reason": f"choices!={rs.choices}"}
                    rec = None
                agg.add(rec, st)
                if rec is not None:
                    # JSON-canonical meta: a cached record equals a freshly built one
                    chosen.append((it, dataclasses.replace(rec, meta=_canon(dict(rec.meta)))))
                    if len(chosen) >= want:
                        break
            if parallel:
                self.log(f"{self.spec.name}: {domain}/{role}: {len(chosen)}/{want} built, "
                         f"{pos - start} tried ({time.perf_counter() - t0:.0f}s)")
        return chosen, pos, agg.result()


def _mp_context() -> multiprocessing.context.BaseContext:
    """"fork" on Linux: works from any caller (a script without a ``__main__`` guard, code piped
    on stdin), and the workers only run Python and sandbox subprocesses. "spawn" elsewhere."""
    if sys.platform.startswith("linux"):
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


class _StatsAgg:
    """Sums builder statistics (code: mutants; math: distractor methods) over a split."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.tried = self.built = 0
        self.rejected: Counter[str] = Counter()
        self.sums: dict[str, float] = {}
        self.flags: Counter[str] = Counter()
        self.methods: Counter[str] = Counter()
        self.designs: Counter[str] = Counter()

    def add(self, rec: MCRecord | None, st: Mapping[str, Any]) -> None:
        self.tried += 1
        if rec is None:
            why = str(st.get("reason") or _REJECT_REASON.get(self.kind, "rejected by builder"))
            # group by kind of reason: drop the per-problem details
            self.rejected[re.split(r" among |: ", why, maxsplit=1)[0]] += 1
        else:
            self.built += 1
        for k, v in st.items():
            if isinstance(v, bool):
                self.flags[k] += int(v)
            elif isinstance(v, (int, float)):
                self.sums[k] = self.sums.get(k, 0) + v
        if rec is not None:
            for m in _distractor_methods(rec.meta):
                self.methods[m.split(":")[0]] += 1  # family: "perturbation:plus_one" -> ...
            if isinstance(rec.meta.get("design"), str):
                self.designs[rec.meta["design"]] += 1

    def result(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": self.kind, "tried": self.tried, "built": self.built,
                             "rejected": dict(sorted(self.rejected.items()))}
        if self.sums:
            d["totals"] = {k: (int(v) if float(v).is_integer() else v)
                           for k, v in sorted(self.sums.items())}
        if self.kind in PARALLEL_KINDS:
            d["verified"] = self.flags.get("verified", 0)
        d.update({f"n_{k}": v for k, v in sorted(self.flags.items()) if k != "verified"})
        if self.methods:
            d["distractor_methods"] = dict(self.methods.most_common())
        if self.designs:
            d["designs"] = dict(self.designs.most_common())
        return d


_REJECT_REASON = {"math500": "answer not an integer", "gsm8k": "no final number",
                  "numeric": "no numeric answer"}


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
                hub_loader: L.HubLoader | None = None) -> Suite:
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
    root = L.resolve_data_dir(data_dir)
    builder = _Builder(spec, caps, seed, root, verify, SplitCache(cache_dir), progress,
                       hub_loader)
    # everything that can fail cheaply fails here, before any split is built
    dom_files: dict[str, dict[str, str]] = {}
    for dom in spec.domains:
        files: dict[str, str] = {}
        for role in ROLES:
            rs = dom.roles[role]
            kind = L.get_source(rs.source).kind
            ok, why = L.builder_available(kind)
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
    "BUILD_ORDER", "ROLES", "SUITES", "DomainSpec", "RoleSpec", "SplitCache", "Suite",
    "SuiteSpec", "build_suite", "get_suite_spec", "list_suites", "load_suite_file",
    "parse_caps", "parse_suite", "register_suite",
]
