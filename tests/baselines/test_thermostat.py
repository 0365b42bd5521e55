"""Budget thermostat on a tiny BERT with random routers: hits the budget, reports honestly."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import BertConfig, BertModel

from baselines.gates import Care, EntropyK, NucleusOnly, RandomK, TopK
from baselines.moe import MoELoRAConfig, get_gates, inject, moe_layers, set_gate
from baselines.thermostat import (
    bisect_budget,
    calibrate,
    calibrate_entropy_k,
    care_k_histogram,
    mean_k,
    measure_k,
    random_k_from_care,
)


@pytest.fixture(scope="module")
def model() -> BertModel:
    torch.manual_seed(0)
    m = BertModel(BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                             intermediate_size=64, vocab_size=100)).eval()
    inject(m, MoELoRAConfig())
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for layer in moe_layers(m):  # non-trivial routers and experts
            layer.router.weight.copy_(torch.randn(layer.router.weight.shape, generator=g) * 0.5)
            layer.lora_B.copy_(torch.randn(layer.lora_B.shape, generator=g) * 0.1)
    return m


@pytest.fixture(scope="module")
def batches() -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(2)
    out = []
    for _ in range(3):
        am = torch.ones(4, 16, dtype=torch.long)
        am[0, 10:] = 0
        am[2, 5:] = 0
        out.append({"input_ids": torch.randint(0, 100, (4, 16), generator=g),
                    "attention_mask": am})
    return out


def test_calibrate_hits_budget_and_leaves_model_gated(model, batches) -> None:
    res = calibrate(model, batches, budget=4.0)
    assert res.met and abs(res.achieved - 4.0) <= 0.05 and not res.per_layer
    assert isinstance(res.tau, float) and 0 < res.tau < 1
    assert get_gates(model) == [Care(res.tau)] * len(moe_layers(model))
    assert mean_k(model, batches)[0] == pytest.approx(res.achieved)   # measured, not claimed
    assert res.target == 4.0 and 2 <= res.iterations <= 30
    assert sum(res.layer_achieved) / len(res.layer_achieved) == pytest.approx(res.achieved)


def test_calibrate_reports_unreachable_budgets_honestly(model, batches) -> None:
    high = calibrate(model, batches, budget=20.0)          # k_max = 8 caps every token
    assert not high.met and high.achieved == pytest.approx(8.0) and high.tau == 1.0
    low = calibrate(model, batches, budget=0.5)            # k_min = 1 floors every token
    assert not low.met and low.achieved == pytest.approx(1.0)


def test_calibrate_per_layer(model, batches) -> None:
    res = calibrate(model, batches[:2], budget=3.0, per_layer=True, gate_factory=NucleusOnly)
    assert res.per_layer and isinstance(res.tau, list) and len(res.tau) == 12
    assert get_gates(model) == [NucleusOnly(t) for t in res.tau]
    assert res.layer_achieved == pytest.approx(mean_k(model, batches[:2])[1])
    close = [abs(v - 3.0) <= 0.05 for v in res.layer_achieved]
    assert res.met == all(close)
    assert sum(close) >= 9   # the step function may not allow every layer within 0.05
    assert all(abs(v - 3.0) <= 0.5 for v in res.layer_achieved)


def test_calibrate_entropy_k_scale(model, batches) -> None:
    res = calibrate_entropy_k(model, batches, budget=4.0)
    assert res.met and abs(res.achieved - 4.0) <= 0.05
    assert get_gates(model)[0] == EntropyK(res.tau)


def test_random_k_matches_care_histogram(model, batches) -> None:
    res = calibrate(model, batches, budget=4.0)
    set_gate(model, TopK(4))
    rk = random_k_from_care(model, batches, res.tau, seed=5)
    assert isinstance(rk, RandomK) and rk.mean_k == pytest.approx(res.achieved)
    assert get_gates(model)[0] == TopK(4)                 # restored
    set_gate(model, Care(res.tau))
    assert care_k_histogram(model, batches) == rk.histogram
    set_gate(model, rk)
    assert abs(mean_k(model, batches)[0] - res.achieved) < 0.5   # same budget, random tokens
    per = random_k_from_care(model, batches, [res.tau] * 12, per_layer=True)
    assert isinstance(per, list) and len(per) == 12


def test_padding_is_not_counted(model, batches) -> None:
    set_gate(model, Care(0.6))
    b = batches[1]
    padded = {"input_ids": torch.cat([b["input_ids"], torch.zeros(4, 7, dtype=torch.long)], 1),
              "attention_mask": torch.cat([b["attention_mask"],
                                           torch.zeros(4, 7, dtype=torch.long)], 1)}
    ks, ks_pad = measure_k(model, [b]), measure_k(model, [padded])
    assert all(torch.equal(a, c) for a, c in zip(ks, ks_pad, strict=False))
    assert ks[0].numel() == int(b["attention_mask"].sum())


def test_measure_k_reads_back_once_per_batch(model, batches) -> None:
    """Every layer's tokens are selected and read back at once: one boolean indexing (a wait
    for the device on a GPU) per batch, not one per MoE layer; the same values as per layer."""
    from torch.profiler import ProfilerActivity, profile

    set_gate(model, Care(0.6))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        ks = measure_k(model, batches)
    assert [e.name for e in prof.events()].count("aten::nonzero") == len(batches)
    assert len(ks) == len(moe_layers(model)) > 1
    for i in (0, len(ks) - 1):
        assert torch.equal(measure_k(model, batches, only_layer=i)[i], ks[i])


def test_custom_forward_and_mode_restored(model, batches) -> None:
    calls = []

    def forward(m: nn.Module, batch: dict) -> None:
        calls.append(1)
        m(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])

    model.train()
    res = calibrate(model, batches, budget=2.5, forward=forward, max_iter=12)
    assert calls and res.iterations <= 12
    assert all(m.training for m in model.modules())
    model.eval()


def test_bisect_guards_non_monotone_blips() -> None:
    # step function with a blip at 0.5 -> 0.7: the closest *evaluated* point is returned with
    # its true value
    def f(x: float) -> float:
        return 9.0 if 0.45 < x < 0.55 else float(int(x * 8) + 1)

    x, v, n, met = bisect_budget(f, 4.0, 1e-6, 1.0, 0.05, 30, False)
    assert v == f(x) and n <= 30
    assert met and v == 4.0
    x, v, n, met = bisect_budget(lambda t: 2.0 if t < 0.5 else 6.0, 4.0, 1e-6, 1.0, 0.05, 30, False)
    assert not met and v in (2.0, 6.0) and n < 30   # a jump: no tau gives 4


@pytest.mark.parametrize("kw, match", [({"budget": 0.0}, "budget"), ({"budget": -1.0}, "budget"),
                                       ({"tol": 0.0}, "tol")])
def test_bad_arguments(model, batches, kw, match) -> None:
    with pytest.raises(ValueError, match=match):
        calibrate(model, batches, **kw)
    with pytest.raises(ValueError, match="empty"):
        calibrate(model, [])
    with pytest.raises(ValueError, match="inject"):
        calibrate(nn.Linear(2, 2), batches)


# --- the thermostat asks the gate registry for the knob ---------------------------------------

def test_calibrate_kind_equals_the_per_gate_calibrations(model, batches) -> None:
    """calibrate_kind (knob, bounds, proxy from the registry) gives the very gates the
    per-kind functions give: the runner's cached thermostat results stay valid."""
    from baselines.thermostat import calibrate_kind
    from uqbench.core.gating import GATES

    saved = get_gates(model)
    try:
        gate, res = calibrate_kind(GATES.get("care"), model, batches, 3.0, {"gamma": 1.0})
        ref = calibrate(model, batches, 3.0, gate_factory=lambda t: Care(t, gamma=1.0))
        assert gate == Care(ref.tau, gamma=1.0) and res == ref
        gate, res = calibrate_kind(GATES.get("entropy"), model, batches, 3.0, {"k_max": 6})
        ref = calibrate_entropy_k(model, batches, 3.0, k_max=6)
        assert gate == EntropyK(ref.tau, k_max=6) and res == ref
        gate, res = calibrate_kind(GATES.get("random"), model, batches, 3.0, {})
        ref = calibrate(model, batches, 3.0)
        assert res == ref and gate == random_k_from_care(model, batches, ref.tau, seed=0)
        with pytest.raises(ValueError, match="no knob"):
            calibrate_kind(GATES.get("topk"), model, batches, 3.0, {})
    finally:
        set_gate(model, saved)


def test_a_registered_plugin_gate_is_calibrated_by_its_knob(model, batches) -> None:
    """The README's gate example: the thermostat finds `frac` for a budget, no code of its own."""
    import importlib
    import sys

    from baselines.thermostat import calibrate_kind
    from uqbench.core.gating import GATES

    saved = get_gates(model)
    try:
        with GATES.scoped():
            FractionK = importlib.import_module("tests.support.example_gate").FractionK  # registers
            gate, res = calibrate_kind(GATES.get("fractionk"), model, batches, 6.0, {})
            assert isinstance(gate, FractionK) and res.met and abs(res.achieved - 6.0) <= 0.05
            assert get_gates(model)[0] == gate
    finally:
        set_gate(model, saved)
        sys.modules.pop("tests.support.example_gate", None)


# --- fewer passes, the same calibrated gate ---------------------------------------------------

def test_calibrate_runs_one_pass_per_evaluation_and_reports_what_a_remeasure_gives(
        model, batches) -> None:
    """The achieved budget comes from the search's own pass at the returned tau (no pass to
    repeat it): equal, bit for bit, to measuring again under the calibrated gate."""
    calls = []

    def fwd(m, b):
        calls.append(1)
        return m(**b)

    saved = get_gates(model)
    try:
        res = calibrate(model, batches, 3.0, forward=fwd)
        assert len(calls) == res.iterations * len(batches)
        assert get_gates(model)[0] == Care(res.tau)
        assert mean_k(model, batches) == (res.achieved, res.layer_achieved)
    finally:
        set_gate(model, saved)


def test_engine_random_k_shares_cares_bisection(tmp_path) -> None:
    """make_gate for a proxy kind (random-k) reuses the calibration of its proxy (care) at the
    same budget and parameters, cached: one pass over the calibration set instead of a
    bisection, and the very gate calibrate_kind gives."""
    from types import SimpleNamespace

    from baselines.backbones import tiny_backbone
    from baselines.engine import make_gate
    from baselines.heads import make_moe
    from baselines.thermostat import calibrate_kind
    from tests.support.data import toy_records
    from uqbench.core.gating import GATES
    from uqbench.core.plan import GateSpec
    from uqbench.files.cache import ArrayCache

    m = make_moe(tiny_backbone("encoder"), MoELoRAConfig(n_experts=8, rank=2, top_k=2))
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for layer in moe_layers(m):
            layer.router.weight.copy_(torch.randn(layer.router.weight.shape, generator=g))
            layer.lora_B.copy_(torch.randn(layer.lora_B.shape, generator=g) * 0.1)
    recs = toy_records(12, seed=5)
    split = SimpleNamespace(hash="h", records=recs)
    engine = SimpleNamespace(arrays=ArrayCache(tmp_path),
                             suite=SimpleNamespace(role=lambda r: [split]),
                             prof=SimpleNamespace(eval_batch_size=8, max_length=48))
    batches = [m.encode(recs[i:i + 8], max_length=48) for i in range(0, 12, 8)]
    ref_gate, ref = calibrate_kind(GATES.get("random"), m, batches, 2.5, {},
                                   forward=lambda mm, b: mm(b))
    calls = []
    hook = m.register_forward_hook(lambda *a: calls.append(1))
    try:
        gate, desc = make_gate(GateSpec("random-k", "random", budget=2.5), m, "sha", engine)
        first = len(calls)
        assert gate == ref_gate and desc["calibration"]["knob"] == ref.tau
        assert desc["calibration"]["iterations"] == ref.iterations
        assert first == (ref.iterations + 1) * len(batches)   # care's bisection + one pass
        care, _ = make_gate(GateSpec("care", "care", budget=2.5), m, "sha", engine)
        assert care == Care(ref.tau) and len(calls) == first   # cached by the proxy call
        engine.arrays = ArrayCache(tmp_path / "other")
        make_gate(GateSpec("care", "care", budget=2.5), m, "sha", engine)
        calls.clear()
        again, _ = make_gate(GateSpec("random-k", "random", budget=2.5), m, "sha", engine)
        assert again == ref_gate and len(calls) == len(batches)   # no bisection of its own
    finally:
        hook.remove()
