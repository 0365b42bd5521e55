"""The gate registry: gate kind -> its class, the knob the thermostat calibrates, its parameters.

Gates are torch code (`baselines.gates`); this module holds what the core needs about them as
plain data, filled by the ``@register_gate`` decorator on each gate class. The built-in gates
are imported on the first lookup (like the built-in scorers); a third-party gate is one module
with a decorated class, imported with ``--plugin`` or through the entry-point group
``uqbench.gates``.

Two kinds are no gate class and are handled by the model side itself (`MODEL_KINDS`):
``native`` (the gate the model was trained with) and ``dense`` (no gate: a dense model).

A `GateSpec` (`uqbench.core.plan`) names a kind; `check_spec` validates it against the registry
(unknown kind, budget rules, parameter names) and is called for every pair before any model
work, and again by the engine before it builds a gate. `parse_gate` reads one from the text of
``uqbench run --gates`` or a suite's ``gates:`` (the gates router models run under besides their
own), so a plugin's gate runs without an experiment of its own.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, dataclass, fields, is_dataclass
from typing import Any

from uqbench.core.errors import ConfigError, UnknownNameError
from uqbench.core.plan import GateSpec
from uqbench.core.registry import Registry, unknown_name

#: kinds without a gate class: the model's own training gate, and none (dense models)
MODEL_KINDS = ("native", "dense")


@dataclass(frozen=True)
class GateKind:
    """A registered gate kind.

    cls : the gate class (a frozen dataclass), built as ``cls(**params)``.
    knob : the field the thermostat calibrates so that the mean number of active experts meets
        a budget (``tau``, ``scale``); None: a fixed gate, which takes no budget.
    fixed : whether a spec without a budget may give the knob itself (a fixed threshold).
    bounds : the knob's search interval; ``expand_hi``: widen the upper end while the budget is
        out of reach (unbounded knobs).
    proxy : another kind whose knob is calibrated instead; this gate is then built from the
        proxy's measured per-token expert counts with ``cls.from_counts(ks, seed=0)``
        (``random``: CARE's histogram of ``k`` at the budget, assigned at random).
    """

    kind: str
    cls: type
    knob: str | None = None
    fixed: bool = True
    bounds: tuple[float, float] = (0.0, 1.0)
    expand_hi: bool = False
    proxy: str | None = None

    @property
    def params(self) -> tuple[str, ...]:
        """The constructor parameters a spec may set (the knob only for a fixed gate)."""
        base = GATES.get(self.proxy) if self.proxy else self
        return tuple(f.name for f in fields(base.cls)
                     if f.init and not f.name.startswith("_") and f.name != base.knob)

    @property
    def budgeted(self) -> bool:
        return self.knob is not None or self.proxy is not None


GATES: Registry[GateKind] = Registry("gate kind", builtins=("baselines.gates",),
                                     entry_point_group="uqbench.gates", expects=GateKind)


def register_gate(kind: str, *, knob: str | None = None, fixed: bool = True,
                  bounds: tuple[float, float] = (0.0, 1.0), expand_hi: bool = False,
                  proxy: str | None = None) -> Callable[[type], type]:
    """Class decorator registering a gate class under ``kind`` (see `GateKind` for the rest).

    ``kind`` is the gate's one name: the decorator sets the class's ``name`` (how run.json and
    the cache keys name its gates) to it; a class that names itself otherwise is a ValueError.
    """

    def deco(cls: type) -> type:
        own = cls.__dict__.get("name", kind)
        if own != kind:
            raise ValueError(f"@register_gate({kind!r}): {cls.__name__} names itself {own!r}; "
                             "a gate has one name, its kind: drop its `name` (the decorator "
                             "sets it) or register it under that name")
        if not is_dataclass(cls):
            raise TypeError(f"@register_gate({kind!r}) must decorate a dataclass, got {cls!r}")
        if knob is not None and knob not in {f.name for f in fields(cls)}:
            raise TypeError(f"@register_gate({kind!r}): {cls.__name__} has no field {knob!r}")
        if kind in MODEL_KINDS:
            raise ValueError(f"gate kind {kind!r} is reserved for the model's own gating")
        GATES.add(kind, GateKind(kind, cls, knob, fixed, bounds, expand_hi, proxy))
        cls.name = kind  # type: ignore[attr-defined]
        return cls

    return deco


def gate_kinds() -> list[str]:
    """Every valid `GateSpec.kind`: `MODEL_KINDS`, then the registered kinds."""
    return [*MODEL_KINDS, *GATES.names()]


def get_gate_kind(spec: GateSpec) -> GateKind | None:
    """The registered kind of a valid spec (None for `MODEL_KINDS`); see `check_spec`."""
    check_spec(spec)
    return None if spec.kind in MODEL_KINDS else GATES.get(spec.kind)


def check_spec(spec: GateSpec) -> None:
    """Raise `ConfigError` unless ``spec`` names a valid kind with a budget and parameters that
    kind takes. An unknown kind is an error listing the valid ones, never a fallback."""
    if spec.kind in MODEL_KINDS:
        if spec.budget is not None:
            raise ConfigError(f"gate {spec.name!r}: kind {spec.kind!r} takes no budget")
        return
    if spec.kind not in GATES:
        raise UnknownNameError(f"gate {spec.name!r}: "
                               f"{unknown_name('gate kind', spec.kind, gate_kinds())}")
    entry = GATES.get(spec.kind)
    budgeted = [k for k in GATES.names() if GATES.get(k).budgeted]
    if spec.budget is not None and not entry.budgeted:
        raise ConfigError(f"gate {spec.name!r}: kind {spec.kind!r} takes no budget (the "
                          f"thermostat calibrates only {', '.join(budgeted)})")
    if spec.budget is None and entry.budgeted and not entry.fixed:
        raise ConfigError(f"gate {spec.name!r}: kind {spec.kind!r} needs a budget (its knob "
                          "is calibrated by the thermostat)")
    allowed = entry.params + ((entry.knob,) if entry.knob and spec.budget is None else ())
    unknown = sorted(set(spec.kwargs) - set(allowed))
    if unknown:
        raise ConfigError(f"gate {spec.name!r}: kind {spec.kind!r} takes no parameter(s) "
                          f"{', '.join(map(repr, unknown))}; valid: {', '.join(allowed)}")
    if spec.budget is not None or entry.proxy:
        return  # the thermostat sets the knob
    missing = [f.name for f in fields(entry.cls) if f.init and f.name not in spec.kwargs
               and f.default is MISSING and f.default_factory is MISSING]
    if missing:
        raise ConfigError(f"gate {spec.name!r}: kind {spec.kind!r} needs {', '.join(missing)} "
                          "(or a budget, for the thermostat to calibrate it)")


def parse_gate(text: str, budget: float) -> GateSpec:
    """A gate of ``--gates`` or a suite's ``gates:``: ``KIND`` or ``KIND:PARAM=VALUE[:...]``
    (``care``, ``topk:k=2``, ``care:k_max=6``), named by the text with ``-`` for ``:`` and
    without ``=`` (``topk-k2``). A kind whose knob the thermostat calibrates runs at ``budget``
    unless the text fixes the knob itself; `check_spec` validates the result.

    >>> parse_gate("topk:k=2", 4.0)            # doctest: +SKIP
    GateSpec(name='topk-k2', kind='topk', budget=None, params=(('k', 2),))
    """
    kind, *parts = str(text).strip().split(":")
    params: dict[str, Any] = {}
    for part in parts:
        key, eq, value = part.partition("=")
        if not (key and eq and value):
            raise ConfigError(f"gate {text!r}: {part!r} is not PARAM=VALUE; write KIND or "
                              "KIND:PARAM=VALUE[:PARAM=VALUE], e.g. topk:k=2")
        params[key.strip()] = _number(value.strip())
    if kind in MODEL_KINDS:
        raise ConfigError(f"gate {text!r}: kind {kind!r} is the model's own gating, evaluated "
                          "for every model already; name a registered gate kind "
                          f"({', '.join(GATES.names())})")
    if kind not in GATES:
        raise UnknownNameError(f"gate {text!r}: {GATES.unknown(kind)}")
    entry = GATES.get(kind)
    calibrated = entry.budgeted and not (entry.fixed and entry.knob in params)
    name = "-".join([kind, *(f"{k}{v}" for k, v in params.items())])
    spec = GateSpec(name, kind, budget=budget if calibrated else None, params=params)
    check_spec(spec)
    return spec


def _number(v: str) -> int | float | str:
    for cast in (int, float):
        try:
            return cast(v)
        except ValueError:
            pass
    return v
