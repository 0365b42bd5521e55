"""Turn a `GateSpec` into a gate for one trained model, calibrating it when it has a budget.

Calibration (the CARE thermostat) runs on the union of the suite's unlabeled ``calib`` splits and
is cached by (adapter checkpoint hash, calibration split hashes, gate spec), so a warm run does no
bisection. The returned description (gate fields, calibrated knob, achieved budget, whether the
budget was met) keys the forward-record cache and is written to ``run.json``.
"""
from __future__ import annotations

import json
from typing import Any

import numpy as np

from uqbench.cache import PROTOCOL_VERSION
from uqbench.errors import ConfigError
from uqbench.plan import BUDGET_KINDS, GATE_KINDS, GateSpec


def make_gate(spec: GateSpec, model: Any, adapter_sha: str, engine: Any) -> tuple[Any, dict[str, Any]]:
    from baselines import gates as G

    if spec.kind not in GATE_KINDS:  # GateSpec checks this too; never fall back to CARE
        raise ConfigError(f"gate {spec.name!r}: unknown gate kind {spec.kind!r}; valid: "
                          f"{', '.join(GATE_KINDS)}")
    if spec.kind == "dense":
        return None, {"spec": spec.describe()}
    if not model.has_moe:
        raise ConfigError(f"gate {spec.name!r} needs a router distribution, but model "
                          f"{model.adapter['type']!r} has none (e.g. FlyLoRA's implicit routing); "
                          "evaluate it under its own routing only")
    if spec.kind == "native":  # the gate the model was trained with
        from baselines.moe import MoELoRAConfig, train_gate
        gate = train_gate(MoELoRAConfig.from_dict(model.adapter["config"]))
        return gate, {"spec": spec.describe(), "gate": G.gate_to_dict(gate)}
    if spec.kind == "topk":
        gate = G.TopK(**spec.kwargs)
        return gate, {"spec": spec.describe(), "gate": G.gate_to_dict(gate)}
    if spec.budget is None:  # a fixed threshold, e.g. the thermostat sweep's tau
        fixed = {"care": G.Care, "nucleus": G.NucleusOnly}
        if spec.kind not in fixed:
            raise ConfigError(f"gate {spec.name!r}: kind {spec.kind!r} needs a budget; only "
                              f"{', '.join(fixed)} take a fixed tau")
        gate = fixed[spec.kind](**spec.kwargs)
        return gate, {"spec": spec.describe(), "gate": G.gate_to_dict(gate)}
    calib = engine.suite.role("calib")
    material = {"protocol": PROTOCOL_VERSION, "adapter": adapter_sha, "spec": spec.key(),
                "calib": sorted(s.hash for s in calib), "max_length": engine.prof.max_length}
    cached = engine.arrays.get("thermostat", material)
    if cached is not None:
        desc = {**json.loads(str(cached["desc"])), "spec": spec.describe()}  # under this name
    else:
        desc = _calibrate(spec, model, [r for s in calib for r in s.records], engine.prof)
        engine.arrays.put("thermostat", material, {"desc": np.array(json.dumps(desc))})
    return G.gate_from_dict(desc["gate"]), desc


def _calibrate(spec: GateSpec, model: Any, records: list[Any], prof: Any) -> dict[str, Any]:
    from baselines import gates as G
    from baselines import thermostat as TH

    bs = prof.eval_batch_size
    batches = [model.encode(records[i:i + bs], max_length=prof.max_length)
               for i in range(0, len(records), bs)]
    fwd = lambda m, b: m(b)
    p = spec.kwargs
    budget = float(spec.budget)  # type: ignore[arg-type]
    gate: Any
    if spec.kind == "entropyk":
        res = TH.calibrate_entropy_k(model, batches, budget, forward=fwd, **p)
        gate = G.EntropyK(res.tau, **p)  # type: ignore[arg-type]
    elif spec.kind in ("care", "nucleus", "randomk"):
        nucleus = spec.kind == "nucleus"
        factory = (lambda t: G.NucleusOnly(t, **p)) if nucleus else (lambda t: G.Care(t, **p))
        res = TH.calibrate(model, batches, budget, gate_factory=factory, forward=fwd)
        gate = factory(res.tau)
        if spec.kind == "randomk":  # CARE's k histogram at this budget, re-assigned at random
            gate = TH.random_k_from_care(model, batches, res.tau, seed=0, care=factory, forward=fwd)
    else:
        raise ConfigError(f"gate {spec.name!r}: the thermostat cannot calibrate kind "
                          f"{spec.kind!r}; valid: {', '.join(BUDGET_KINDS)}")
    return {"spec": spec.describe(), "gate": G.gate_to_dict(gate),
            "calibration": {"knob": res.tau, "achieved": res.achieved, "target": res.target,
                            "met": res.met, "iterations": res.iterations,
                            "calib_tokens_from": len(records)}}
