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
    `uqbench.core.gating.check_spec` validates it (an unknown kind is a ConfigError listing the valid
    ones) before any model work.

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
    adalora (dense peft baselines) or a MoE-LoRA variant of `baselines.variants` (loramoe,
    hydralora, mixlora, dynmole, hmora, flylora)."""

    name: str
    kind: str


@dataclass(frozen=True)
class ModelEntry:
    """A selectable model (``--models``): its spec, whether it has a router distribution (router
    Outputs fields, CARE), and a one-line description for ``uqbench list models``."""

    spec: ModelSpec
    router: bool
    doc: str


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


def _variant(name: str, doc: str, router: bool = True) -> ModelEntry:
    return ModelEntry(ModelSpec(name, name), router, doc)


#: every selectable model, by name; the default run uses ``lora`` and ``moe-lora``
MODELS: dict[str, ModelEntry] = {e.spec.name: e for e in (
    ModelEntry(LORA, False, "dense LoRA (peft), rank 8, all linears"),
    ModelEntry(MOE, True, "MoE-LoRA: 16 experts r8, top-4 + Switch load balance (CARE paper)"),
    _variant("loramoe", "LoRAMoE (Dou et al. 2023): FFN experts, soft router, localized "
             "balancing"),
    _variant("hydralora", "HydraLoRA (Tian et al. 2024): shared A, 8 B heads, soft router"),
    _variant("mixlora", "MixLoRA (Li et al. 2024): FFN experts, top-2, Switch load balance"),
    _variant("dynmole", "DynMoLE (2025): Tsallis-entropy hybrid routing (top-p / all) + "
             "Tsallis loss"),
    _variant("hmora", "HMoRA (Liao et al. 2025): token + task router mixed by depth, top-2"),
    _variant("flylora", "FlyLoRA (Zou et al. 2025): rank-1 experts, frozen sparse A, implicit "
             "top-8 (no router: no CARE)", router=False),
)}
DEFAULT_MODELS = ("lora", "moe-lora")


def default_pairs(budget: float = 4.0) -> list[Pair]:
    """The pooled run: dense LoRA; MoE-LoRA under its training gate (fixed top-4, with MC-dropout
    and the deep ensemble of independently seeded MoE-LoRA models); MoE-LoRA under CARE
    calibrated to the same average budget."""
    return [
        Pair(LORA, DENSE, ENGINE),
        Pair(MOE, TOP4, ROUTER | {"mc_logits", "member_logits"}),
        Pair(MOE, GateSpec("care", "care", budget=budget), ROUTER),
    ]


def model_pairs(names: Sequence[str], budget: float = 4.0) -> list[Pair]:
    """The pairs of the chosen models (``--models``): ``lora`` and ``moe-lora`` as in
    `default_pairs`; a router variant under its own gate (with MC-dropout and ensemble members
    on demand) and under CARE at ``budget``; FlyLoRA under its implicit routing only.

    Unknown names raise ConfigError listing the valid ones.
    """
    unknown = [n for n in names if n not in MODELS]
    if unknown or not names:
        what = f"unknown model(s) {', '.join(map(repr, unknown))}" if unknown else "no models"
        raise ConfigError(f"{what}; valid: {', '.join(MODELS)} (see uqbench list models)")
    out: list[Pair] = []
    for name in dict.fromkeys(names):
        spec = MODELS[name].spec
        if name in DEFAULT_MODELS:
            out += [p for p in default_pairs(budget) if p.model == spec]
        elif MODELS[name].router:
            out += [Pair(spec, NATIVE, ROUTER | {"mc_logits", "member_logits"}),
                    Pair(spec, GateSpec("care", "care", budget=budget), ROUTER)]
        else:
            out.append(Pair(spec, GateSpec("native", "dense"),
                            ENGINE | {"mc_logits", "member_logits"}))
    return out


def methods(pairs: Sequence[Pair], scorers: Sequence[Scorer]) -> list[Method]:
    """Every (pair, scorer) whose requirements the pair covers. A scorer that no pair can serve
    is a configuration error, raised before any model work."""
    out = [Method(p, s) for p in pairs for s in scorers if s.requires <= p.fields]
    for s in scorers:
        if not any(m.scorer is s for m in out):
            need = sorted(s.requires - set().union(*(p.fields for p in pairs)))
            routerless = [n for n in dict.fromkeys(p.model.name for p in pairs)
                          if n in MODELS and not MODELS[n].router]
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
