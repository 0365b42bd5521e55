"""`benchmarks.divergence`: the per-step, per-layer probe of a MoE-LoRA training (tiny-llama
in bfloat16, as the GPU trains): its rows, and the layer it names when one goes non-finite;
`benchmarks.divergence_candidates`: each candidate changes its one thing."""
from __future__ import annotations

import math
from typing import Any

import torch

from baselines import heads, moe, train
from baselines.backbones import load_backbone
from benchmarks.divergence import probed
from uqbench.data.records import MCRecord


def _records(n: int = 8) -> list[MCRecord]:
    return [MCRecord(f"q{i}", "science", f"which number is {i}?", ("one", "two", "three", "four"),
                     i % 4, "test") for i in range(n)]


def _model() -> heads.MultipleChoiceModel:
    bb = load_backbone("tiny-llama")
    bb.model.to(torch.bfloat16)
    torch.manual_seed(0)
    return heads.make_moe(bb, moe.MoELoRAConfig(seed=0), mode="letters", seed=0, copy=False)


CFG = train.TrainConfig(lr=1e-3, epochs=2, batch_size=4, max_length=32, seed=0)


def test_the_probe_writes_one_row_a_step_and_stops_after_the_steps_asked(tmp_path, heavy_compute):
    model = _model()
    n_layers = len(moe.moe_layers(model.backbone))
    out = tmp_path / "d.jsonl"
    with probed(model, stop_after=3, out=str(out)) as probe:
        train.train(model, _records(), CFG, progress=False)
    rows = probe.rows
    assert [r["step"] for r in rows] == [0, 1, 2]          # 4 steps asked of train, 3 kept
    assert len(out.read_text().splitlines()) == 3
    for r in rows:
        assert r["first_nonfinite_forward"] is None and r["first_nonfinite_backward"] is None
        assert r["grad_nonfinite"] == []
        assert math.isfinite(r["grad_total"]) and r["grad_total"] > 0
        assert len(r["top_h"]) == min(6, n_layers)
        # the global norm is at least the largest parameter's
        assert r["grad_total"] >= r["grad_top"][0][1] - 1e-6
    # lora_B starts at 0: no adapter output before the first update, some after it
    assert max(v for _, v in rows[0]["top_delta"]) == 0.0
    assert max(v for _, v in rows[2]["top_delta"]) > 0.0


def test_the_probe_names_the_first_layer_that_goes_non_finite(heavy_compute):
    model = _model()
    names = [n for n, m in model.named_modules() if isinstance(m, moe.MoELoRALinear)]
    bad = names[len(names) // 2]                            # a layer in the middle
    layer = dict(model.named_modules())[bad]
    with torch.no_grad():
        layer.router.weight[0, 0] = float("inf")           # its router logits overflow
    with probed(model, stop_after=5) as probe:   # ends training before the loop's log read
        train.train(model, _records(64), CFG, progress=False)
    last = probe.rows[-1]
    assert len(probe.rows) == 1                            # stopped after the first bad step
    assert last["first_nonfinite_forward"] == bad.split("layers.", 1)[-1]
    assert last["grad_nonfinite"]


def test_a_candidate_names_its_target_linears_joined_by_plus():
    from benchmarks.recipe_search import target_modules

    assert target_modules("auto") == "auto" and target_modules("ffn") == "ffn"
    assert target_modules("q_proj+up_proj") == ("q_proj", "up_proj")


def test_the_candidates_each_change_their_one_thing(real_data):
    """`benchmarks.divergence_candidates` on tiny-llama: one line per candidate, one row a
    step; ``first-token`` leaves the first token without adapter output, the others not."""
    from benchmarks.divergence_candidates import run

    bb = load_backbone("tiny-llama")
    kw: dict[str, Any] = {"top": 1, "lr": 1e-2, "records": 8, "batch": 4, "epochs": 2,
                          "steps": 4, "max_length": 64, "data_dir": str(real_data),
                          "cache_dir": "", "out": None, "bb": bb}
    lines = {c: run("tiny-llama", c, **kw) for c in
             ("none", "first-token", "z-loss=1e-3", "slow-router-a=0.1", "slow-b=0.1",
              "no-down-proj", "fan-in", "input-l1")}
    for c, line in lines.items():
        assert line["steps"] == 4 and len(line["loss"]) == 4 and len(line["grad_norm"]) == 4, c
        assert all(math.isfinite(x) for x in line["loss"]), c
        assert line["delta_other"][0] == 0.0, c  # B starts at 0
        # (a tenth of lr on B leaves its output below the line's rounding for these steps)
        assert c == "slow-b=0.1" or line["delta_other"][2] > 0.0, c
    assert lines["none"]["delta_first"][3] > 0.0
    assert lines["first-token"]["delta_first"] == [0.0] * 4
    # the same first forward (same seed, no update yet), then each its own updates
    for c in ("first-token", "z-loss=1e-3", "slow-router-a=0.1", "slow-b=0.1"):
        assert lines[c]["loss"][0] == lines["none"]["loss"][0], c
        assert lines[c]["loss"][1:] != lines["none"]["loss"][1:], c
    assert lines["no-down-proj"]["targets"] == "no down_proj"
    # tiny-llama's down_proj reads an input twice the hidden width: half the lr; the others lr
    assert sorted(set(lines["fan-in"]["lr_factors"])) == [0.5, 1.0]
    l1 = lines["input-l1"]["lr_factors"]
    assert max(l1) == 1.0 and min(l1) < 1.0 and len(l1) == len(lines["fan-in"]["lr_factors"])
    assert lines["none"]["lr_factors"] is None
