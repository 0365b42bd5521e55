"""What a run computes: models, the gates each is evaluated under, and the methods (scorers).

Pure data, no torch. A *pair* is (model, gate); a *method* is (pair, scorer). Each pair declares
the Outputs fields it can produce; a scorer is paired with every pair that covers its
``requires``. Multi-pass fields (MC-dropout, ensemble members) are produced only for the pairs
that list them, and only when a chosen scorer needs them.
"""
from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from uqbench.core.errors import ConfigError
from uqbench.core.outputs import REQUIRED_FIELDS, ROUTER_FIELDS
from uqbench.core.registry import Registry
from uqbench.core.scorer import Scorer

DET = frozenset((*REQUIRED_FIELDS,))
#: the pooled hidden state of the deterministic pass and that of the training questions (one
#: extra deterministic pass over the train splits, run only when a scorer reads them)
FEATURES = frozenset({"features", "train_features"})
#: what the torch engine gives any model; ROUTER: a model with a router distribution
ENGINE = DET | FEATURES
ROUTER = ENGINE | frozenset(ROUTER_FIELDS)


@dataclass(frozen=True)
class GateSpec:
    """A gate by name. ``kind``: ``native`` (the model's training gate), ``dense`` (none) or a
    registered gate kind (`uqbench.core.gating`: topk, care, nucleus, random, entropy, dynmole...);
    `uqbench.core.gating.check_spec` validates it (an unknown kind is a ConfigError listing the
    valid ones) before any model work.

    ``budget`` set -> the thermostat calibrates the gate's knob (tau or scale) on the unlabeled
    calibration split so that the mean number of active experts equals it; ``params`` are
    passed to the gate (k, tau, gamma, delta, k_min, k_max).
    """

    name: str
    kind: str
    budget: float | None = None
    params: tuple[tuple[str, Any], ...] | Mapping[str, Any] = ()

    def __post_init__(self) -> None:
        # a sorted tuple keeps the spec hashable
        items = self.params.items() if isinstance(self.params, Mapping) else self.params
        object.__setattr__(self, "params", tuple(sorted(items)))

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.params)  # type: ignore[arg-type]

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "budget": self.budget,
                "params": self.kwargs}

    def key(self) -> dict[str, Any]:
        """What the gate computes, without its display name: cache keys use this, so one gate
        under two names (the ablation's ``fixed-k`` and ``top4``) is calibrated and run once."""
        return {k: v for k, v in self.describe().items() if k != "name"}


@dataclass(frozen=True)
class ModelSpec:
    """A trained model family: ``kind`` moe (MoE-LoRA, trained with fixed top-k), lora/dora/
    adalora (dense peft baselines) or the name of a registered MoE-LoRA variant
    (`baselines.variants`: loramoe, hydralora, mixlora, dynmole, hmora, flylora, or a
    plugin's)."""

    name: str
    kind: str


@dataclass(frozen=True)
class ModelEntry:
    """A selectable model (``--models``, a suite's ``models:``): its spec, whether it has a
    router distribution (router Outputs fields, CARE), a one-line description for ``uqbench
    list models`` and, for a re-implementation of a published method, what it leaves out
    (``paper_report.md`` marks every claim that rests on it)."""

    spec: ModelSpec
    router: bool
    doc: str
    simplified: str = ""


@dataclass(frozen=True)
class Pair:
    model: ModelSpec
    gate: GateSpec
    fields: frozenset[str]  # what this pair can produce

    @property
    def name(self) -> str:
        return f"{self.model.name}/{self.gate.name}"


@dataclass(frozen=True)
class Method:
    pair: Pair
    scorer: Scorer

    @property
    def name(self) -> str:
        return f"{self.pair.name}/{self.scorer.name}"


MOE = ModelSpec("moe-lora", "moe")
LORA = ModelSpec("lora", "lora")
TOP4 = GateSpec("top4", "topk", params={"k": 4})
CARE = GateSpec("care", "care", budget=4.0)
DENSE = GateSpec("dense", "dense")


NATIVE = GateSpec("native", "native")  # the model's own training gate (baselines.moe.train_gate)


#: every selectable model, by name: ``lora`` and ``moe-lora`` here (the default run), the
#: MoE-LoRA variants by `register_model` -- `baselines.variants.register_variant` registers a
#: variant's preset on the torch side and its entry here, under one name; third-party ones
#: through ``--plugin`` or the entry-point group ``uqbench.models``
MODELS: Registry[ModelEntry] = Registry("model", builtins=("baselines.variants",),
                                        entry_point_group="uqbench.models", expects=ModelEntry)


def register_model(entry: ModelEntry) -> ModelEntry:
    """Register a selectable model under ``entry.spec.name`` (a duplicate is a ValueError)."""
    return MODELS.add(entry.spec.name, entry)


register_model(ModelEntry(LORA, False, "dense LoRA (peft), rank 8, all linears"))
register_model(ModelEntry(MOE, True, "MoE-LoRA: 16 experts r8, top-4 + Switch load balance "
                          "(CARE paper)"))
DEFAULT_MODELS = ("lora", "moe-lora")


def default_pairs(budget: float = 4.0) -> list[Pair]:
    """The pooled run: dense LoRA; MoE-LoRA under its training gate (fixed top-4, with MC-dropout
    and the deep ensemble of independently seeded MoE-LoRA models); MoE-LoRA under CARE
    calibrated to the same average budget."""
    return model_pairs(DEFAULT_MODELS, budget)


def model_pairs(names: Sequence[str], budget: float = 4.0,
                gates: Sequence[GateSpec] = ()) -> list[Pair]:
    """The pairs of the chosen models (``--models``): ``lora`` under no gate; a router model
    under its own training gate (MoE-LoRA: top-4; with MC-dropout and ensemble members on
    demand) and under each of ``gates`` (``--gates``; default: CARE at ``budget``); a model
    without a router (FlyLoRA) under its implicit routing only.

    Unknown names raise `UnknownNameError` listing the valid ones.
    """
    if not names:
        raise ConfigError(f"no models; valid: {', '.join(MODELS.names())} (see uqbench list "
                          "models)")
    if gates and not any(MODELS.get(n).router for n in names):
        raise ConfigError(f"--gates {', '.join(g.name for g in gates)}: no chosen model has a "
                          f"router ({', '.join(names)}); add a MoE-LoRA model to --models")
    extra = tuple(gates) or (GateSpec("care", "care", budget=budget),)
    multi = frozenset({"mc_logits", "member_logits"})
    out: list[Pair] = []
    for name in dict.fromkeys(names):
        entry = MODELS.get(name)
        if entry.spec == LORA:
            out.append(Pair(LORA, DENSE, ENGINE))
        elif entry.router:
            out += [Pair(entry.spec, TOP4 if entry.spec == MOE else NATIVE, ROUTER | multi),
                    *(Pair(entry.spec, g, ROUTER) for g in extra)]
        else:
            out.append(Pair(entry.spec, GateSpec("native", "dense"), ENGINE | multi))
    return out


def methods(pairs: Sequence[Pair], scorers: Sequence[Scorer]) -> list[Method]:
    """Every (pair, scorer) whose requirements the pair covers. A scorer that no pair can serve
    is a configuration error, raised before any model work."""
    out = [Method(p, s) for p in pairs for s in scorers if s.requires <= p.fields]
    for s in scorers:
        if not any(m.scorer is s for m in out):
            need = sorted(s.requires - set().union(*(p.fields for p in pairs)))
            routerless = [n for n in dict.fromkeys(p.model.name for p in pairs)
                          if n in MODELS and not MODELS.get(n).router]
            why = (f" Model(s) {', '.join(map(repr, routerless))} have no router distribution "
                   "(no routing statistics; CARE does not apply to them)."
                   if routerless and set(need) & set(ROUTER_FIELDS) else "")
            raise ConfigError(
                f"scorer {s.name!r} needs field(s) {', '.join(map(repr, need))}, which no model "
                f"in this run produces (pairs: {', '.join(p.name for p in pairs)}).{why} Drop it "
                "from --scorers or add a model that provides them.")
    return out


def drop_unusable(ms: Sequence[Method], train_domains: Sequence[str], n_train: int
                  ) -> tuple[list[Method], list[dict[str, Any]]]:
    """``ms`` without the methods whose scorer cannot score this training set
    (`Scorer.unusable`: rmd on one domain, knn with fewer than k questions), and the skipped
    ``{scorer, pair, reason}`` entries for ``run.json`` ``skipped_scorers``; each scorer
    skipped is warned about once. Nothing left is a `ConfigError`."""
    scorers = {id(m.scorer): m.scorer for m in ms}
    why = {k: s.unusable(train_domains, n_train) for k, s in scorers.items()}
    for k, reason in why.items():
        if reason is not None:
            warnings.warn(f"scorer {scorers[k].name!r} skipped: it {reason}", stacklevel=2)
    keep = [m for m in ms if why[id(m.scorer)] is None]
    skipped = [{"scorer": m.scorer.name, "pair": m.pair.name, "reason": why[id(m.scorer)]}
               for m in ms if why[id(m.scorer)] is not None]
    if not keep:
        raise ConfigError("no chosen scorer can score this run: " + "; ".join(
            f"{scorers[k].name} {r}" for k, r in why.items() if r))
    return keep, skipped


def needed_fields(pair: Pair, ms: Sequence[Method]) -> frozenset[str]:
    """The fields of ``pair`` some method actually reads (so MC passes run only if needed)."""
    return frozenset().union(*(m.scorer.requires for m in ms if m.pair == pair)) | DET
