"""Suite specs: what a suite is made of (`RoleSpec`, `DomainSpec`, `SuiteSpec`), the suite
registry, and suite YAML files, validated into specs without reading any data.

A suite maps each domain to four roles: ``train`` (fine-tuning data), ``calib`` (an unlabeled,
seeded held-out slice of the train source, used by the CARE thermostat), ``id`` (in-distribution
evaluation) and ``shift`` (harder, shifted evaluation). Built-in suites register themselves with
`register_suite` (`uqbench.data.suites.pooled`); how specs become splits is
`uqbench.data.suites.build`.

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
    models: [moe-lora, mixlora]     # optional: uqbench list models (default lora, moe-lora)
    gates: [care, "topk:k=2"]       # optional: router models' gates besides their own

A role may also give ``subjects`` (MMLU subject names or the groups ``high_school``,
``college``, ``professional``), ``half`` (0 or 1: a seeded half of the source, per MMLU subject)
and ``choices``.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, overload

from uqbench.core.errors import ConfigError
from uqbench.core.registry import Registry
from uqbench.data.records import MCRecord, Split
from uqbench.data.sources import get_source, list_sources

ROLES: tuple[str, ...] = ("train", "calib", "id", "shift")
REQUIRED_ROLES: tuple[str, ...] = ("train", "id", "shift")


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

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"source": self.source, "split": self.split}
        if self.subjects is not None:
            d["subjects"] = list(self.subjects)
        if self.half is not None:
            d["half"] = self.half
        if self.choices is not None:
            d["choices"] = self.choices
        return d


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
    #: `gates:` the gates router models run under besides their own (`--gates`); empty: CARE
    gates: tuple[str, ...] = ()
    head: str = "auto"  # `head:` how options are scored (`baselines.heads`); --head overrides

    def domain(self, name: str) -> DomainSpec:
        for d in self.domains:
            if d.name == name:
                return d
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "domains": {d.name: d.to_json() for d in self.domains},
                "caps": dict(self.caps)}


SUITES: Registry[SuiteSpec] = Registry(
    "suite", builtins=("uqbench.data.suites.pooled", "uqbench.data.suites.pooled_plus"),
    entry_point_group="uqbench.suites",
    also="or the path to a suite YAML file (see examples/suites/)")


@overload
def register_suite(name: str) -> Callable[[Callable[[], SuiteSpec]], Callable[[], SuiteSpec]]:
    ...


@overload
def register_suite(name: SuiteSpec) -> SuiteSpec:
    ...


def register_suite(name: str | SuiteSpec
                   ) -> Callable[[Callable[[], SuiteSpec]], Callable[[], SuiteSpec]] | SuiteSpec:
    """Decorator: ``@register_suite("name")`` on a function returning the `SuiteSpec` (called
    once, at registration). ``register_suite(spec)`` registers a spec directly. A duplicate
    name is a ValueError."""
    if isinstance(name, SuiteSpec):
        return SUITES.add(name.name, name)

    def deco(make: Callable[[], SuiteSpec]) -> Callable[[], SuiteSpec]:
        spec = make()
        if spec.name != name:
            raise ValueError(f"@register_suite({name!r}) returned a suite named {spec.name!r}")
        SUITES.add(name, spec)
        return make

    return deco


def list_suites() -> list[str]:
    """Names of the registered suites (``uqbench run --suite`` also takes a YAML path)."""
    return SUITES.names()


# -- YAML -------------------------------------------------------------------------------------

_SUITE_KEYS = {"name", "description", "domains", "caps", "choices", "models", "gates", "head"}
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
                     _names(data.get("models"), origin, "models"),
                     _names(data.get("gates"), origin, "gates"),
                     check_head(data.get("head", "auto"), f"{origin}: 'head'"))


def check_head(v: Any, where: str = "--head") -> str:
    """``head:`` -- how a model scores the options (`uqbench.core.heads`: decoders ``cloze`` =
    length-normalised option log-likelihood, ``letters`` = answer-letter logits; encoders
    ``bi_encoder``, ``cross_encoder``...; ``auto``)."""
    from uqbench.core.heads import check_head as check

    return check(v, where)


def _names(v: Any, where: str, key: str) -> tuple[str, ...]:
    """``models:`` or ``gates:`` -- a list (or comma-separated string) of names. Models and
    gate kinds may come from a ``--plugin``, so they are looked up when the run starts."""
    if v is None:
        return ()
    names = [x.strip() for x in v.split(",")] if isinstance(v, str) else v
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n
                                                           for n in names):
        raise ConfigError(f"{where}: {key!r} must be a non-empty list of names, got {v!r}")
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
                          f"{', '.join(list_sources())}")
    try:
        source = get_source(str(v["source"]), str(v["split"]))
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    subjects = None
    if v.get("subjects") is not None:
        s = v["subjects"]
        try:
            subjects = source.select_subjects([str(x) for x in ([s] if isinstance(s, str) else s)])
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
    """A registered suite by name, or a YAML file by path; `UnknownNameError` listing the valid
    names."""
    if isinstance(name_or_path, SuiteSpec):
        return name_or_path
    s = str(name_or_path)
    if s.endswith((".yaml", ".yml")) or "/" in s or Path(s).is_file():
        return load_suite_file(s)
    return SUITES.get(s)


# -- built suites -----------------------------------------------------------------------------

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


__all__ = [
    "REQUIRED_ROLES", "ROLES", "SUITES", "DomainSpec", "RoleSpec", "Suite", "SuiteSpec",
    "check_head", "get_suite_spec", "list_suites", "load_suite_file", "parse_caps",
    "parse_suite", "register_suite",
]
