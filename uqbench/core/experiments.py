"""The CARE paper's experiments as sets of (model, gate) pairs and scorers on the same runner.

``uqbench run --suite pooled --experiment NAME`` evaluates the experiment's pairs; the results
table has the usual columns, and `uqbench.reporting.paper` writes ``paper_report.md`` with a verdict
per claim of that experiment (``paper``: of all of them). All gates at a budget are calibrated by
the thermostat on the unlabeled calibration split; the achieved budget is in ``run.json`` and in the
``avg_experts`` column.

Experiments are a registry (`EXPERIMENTS`, `register_experiment`, the entry-point group
``uqbench.experiments``): a plugin adds its own set of pairs and scorers under a new name.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from uqbench.core.errors import ConfigError
from uqbench.core.plan import (
    DET,
    MODELS,
    MOE,
    NATIVE,
    ROUTER,
    TOP4,
    GateSpec,
    Method,
    Pair,
    default_pairs,
    methods,
)
from uqbench.core.registry import Registry
from uqbench.core.scorer import Scorer, get_scorer

TAUS = (0.4, 0.5, 0.6, 0.7, 0.8)
FIXED_K = (1, 2, 3, 4, 5, 6, 8)
CARE_BUDGETS = (2.0, 3.0, 4.0, 5.0)
KMAX = (4, 6, 8, 12)
W_BLEND = (0.0, 0.25, 0.5, 0.75, 1.0)


@dataclass(frozen=True)
class Experiment:
    name: str
    doc: str
    pairs: Callable[[float], list[Pair]]
    #: scorer name -> (registered scorer, constructor kwargs); None = the run's scorers
    scorers: dict[str, tuple[str, dict[str, float]]] | None = None


def _moe(gate: GateSpec) -> Pair:
    return Pair(MOE, gate, ROUTER)


def _ablation(b: float) -> list[Pair]:
    return [_moe(GateSpec("fixed-k", "topk", params={"k": round(b)})),
            _moe(GateSpec("random-k", "random", budget=b)),
            _moe(GateSpec("entropy-k", "entropy", budget=b)),
            _moe(GateSpec("nucleus-only", "nucleus", budget=b)),
            _moe(GateSpec("care", "care", budget=b))]


#: Table "uq"'s single-pass MoE baselines, each under its own training gate; logits only (the
#: table scores them with MSP or predictive entropy), so no router statistics, no MC-dropout
#: and no ensemble members are run for them
UQ_BASELINES = ("hydralora", "mixlora", "dynmole", "flylora")


def _uq(b: float) -> list[Pair]:
    """Table "uq": dense LoRA, MoE-LoRA top-4 (MSP, MC-dropout, deep ensemble), CARE, and the
    MoE-LoRA baselines HydraLoRA, MixLoRA, DynMoLE, FlyLoRA under their own routing
    (FlyLoRA's is implicit: no router distribution, gate ``dense``)."""
    out = default_pairs(b)
    for name in UQ_BASELINES:
        entry = MODELS.get(name)
        out.append(Pair(entry.spec, NATIVE if entry.router else GateSpec("native", "dense"), DET))
    return out


#: CARE's read-out restricted to the concentration term (paper Eq. "uq" with w = 0): the
#: ablation scores its concentration-only model (nucleus-only) with it
CONCENTRATION = "care_concentration"
_MSP_CARE: dict[str, tuple[str, dict[str, float]]] = {"msp": ("msp", {}), "care": ("care", {})}
EXPERIMENTS: Registry[Experiment] = Registry("experiment",
                                             entry_point_group="uqbench.experiments",
                                             expects=Experiment)


def register_experiment(exp: Experiment) -> Experiment:
    """Register ``exp`` under its name (a duplicate is a ValueError)."""
    return EXPERIMENTS.add(exp.name, exp)


for _exp in (
    Experiment("uq", "Table 'uq': dense LoRA + MSP; HydraLoRA, MixLoRA, DynMoLE, FlyLoRA (own "
               "routing) + MSP/entropy; MoE top-4 + MSP; MC-dropout; deep ensemble; CARE", _uq),
    Experiment("ablation", "Table 'ablation': fixed-k, random-k, entropy-k, nucleus-only, CARE at "
               "matched budget; nucleus-only is also scored by the concentration-only read-out "
               f"({CONCENTRATION}: CARE's with w = 0)", _ablation,
               scorers={**_MSP_CARE, CONCENTRATION: ("care", {"w": 0.0})}),
    Experiment("thermostat", "Table 'tau': tau -> mean experts, accuracy", lambda b: [
        _moe(GateSpec(f"care-tau{t:g}", "care", params={"tau": t})) for t in TAUS],
               scorers=_MSP_CARE),
    Experiment("frontier", "Table 'frontier': fixed k vs CARE at budgets", lambda b: [
        *[_moe(GateSpec(f"top{k}", "topk", params={"k": k})) for k in FIXED_K],
        *[_moe(GateSpec(f"care-b{c:g}", "care", budget=c)) for c in CARE_BUDGETS]],
               scorers=_MSP_CARE),
    Experiment("kmax", "Table 'kmax': CARE k_max at budget B", lambda b: [
        _moe(GateSpec(f"care-kmax{k}", "care", budget=b, params={"k_max": k})) for k in KMAX],
               scorers=_MSP_CARE),
    Experiment("wblend", "Table 'wblend': CARE read-out blend weight w -> OOD-AUROC",
               lambda b: [_moe(GateSpec("care", "care", budget=b))],
               scorers={f"care_w{w:g}": ("care", {"w": w}) for w in W_BLEND}),
    Experiment("selective", "Selective accuracy at 80% coverage, ID and shifted: MSP vs CARE",
               lambda b: [Pair(MOE, TOP4, ROUTER), _moe(GateSpec("care", "care", budget=b))],
               scorers={"msp": ("msp", {}), "care": ("care", {})}),
    Experiment("robustness", "Accuracy on shifted splits at budget B: fixed top-4 vs CARE",
               lambda b: [Pair(MOE, TOP4, ROUTER), _moe(GateSpec("care", "care", budget=b))],
               scorers={"msp": ("msp", {})}),
    Experiment("allocation", "Mean experts per domain under one global tau (CARE at budget B)",
               lambda b: [_moe(GateSpec("care", "care", budget=b))],
               scorers={"care": ("care", {})}),
    Experiment("paper", "every experiment above in one run; paper_report.md has a verdict per "
               "claim of all of them (a single experiment's run: its own claims)", default_pairs),
):
    register_experiment(_exp)
#: what ``paper`` runs: the paper's experiments (a plugin's own ones run by their names)
PAPER_EXPERIMENTS = tuple(n for n, _ in EXPERIMENTS.items() if n != "paper")


def get_experiment(name: str) -> Experiment:
    """The experiment called ``name`` (unknown -> `UnknownNameError` listing the valid ones)."""
    return EXPERIMENTS.get(name)


def experiment_scorers(exp: Experiment) -> list[Scorer] | None:
    """The experiment's own scorers (renamed instances, e.g. ``care_w0.25``), or None."""
    if exp.scorers is None:
        return None
    out = []
    for name, (base, kw) in exp.scorers.items():
        sc = get_scorer(base, **kw)
        sc.name = name
        out.append(sc)
    return out


def experiment_methods(name: str, budget: float,
                       scorers_for: Callable[[Experiment], list[Scorer]]) -> list[Method]:
    """Methods of one experiment, or of all of them for ``paper`` (pairs of the same name are
    merged, their producible fields united, so each (model, gate) runs once)."""
    exps = [get_experiment(n) for n in (PAPER_EXPERIMENTS if name == "paper" else (name,))]
    ms = [m for e in exps for m in methods(e.pairs(budget), scorers_for(e))]
    merged: dict[str, Pair] = {}
    for m in ms:
        old = merged.get(m.pair.name)
        if old is not None and (old.gate, old.model) != (m.pair.gate, m.pair.model):
            raise ConfigError(f"experiments define two different gates named {m.pair.name!r}")
        merged[m.pair.name] = replace(m.pair, fields=(old.fields if old else frozenset())
                                      | m.pair.fields)
    out: dict[str, Method] = {}
    for m in ms:
        out.setdefault(m.name, Method(merged[m.pair.name], m.scorer))
    return list(out.values())
