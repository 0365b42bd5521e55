"""The compiled training path (``TrainConfig.compile``) against eager, through
the real training loop in one run on one device: compile time (the wall time of the steps that
compiled) apart from the step time, the compiled steps' seconds against eager ones, compiles
per epoch (the second epoch must compile nothing), recompiles (dynamo's compiles of a frame it
had compiled before, with their distinct guard failures), graph breaks, and how far the
compiled losses are from eager ones (same seed, same records; the compiled dropout masks come
from inductor's own random numbers, so this includes dropout noise: tests/baselines/test_compile.py
compares equal draws).

The model is the ``full`` profile's MoE-LoRA (`bench_train_step`'s backbone: SmolLM2 on a GPU
where installed, else the 2-layer random ``tiny-llama``) on synthetic questions of up to
``MAX_LENGTH`` tokens. On CPU, inductor's C++ kernels and 2 shared cores say little about a
GPU, where the compiled path exists to cut kernel launches. A ``train_step_eager`` line comes
first, before anything compiles: on an H200 compiling SmolLM2's 30 blocks outlasted a 205 s call,
and a call that runs out of time keeps that line.
"""
from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch._dynamo.utils

from benchmarks.bench_train_step import BATCH, MAX_LENGTH, step_backbone, synthetic_records

#: per epoch; the last batch is partial (padded on the compiled path)
STEPS = 4
EPOCHS = 2


def run() -> Iterator[dict[str, Any]]:
    from baselines.heads import make_moe
    from baselines.moe import MoELoRAConfig
    from baselines.train import TrainConfig, train

    name, bb = step_backbone()
    records = synthetic_records(BATCH * STEPS - BATCH // 2, MAX_LENGTH)
    cfg = TrainConfig(epochs=EPOCHS, batch_size=BATCH, max_length=MAX_LENGTH)
    on = TrainConfig(**{**cfg.__dict__, "compile": "on"})
    train(make_moe(bb, MoELoRAConfig()), records[:2 * BATCH],
          TrainConfig(**{**cfg.__dict__, "epochs": 1}), progress=False)   # warm-up, eager
    load_before = os.getloadavg()[0]
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    res = {}
    dynamo = torch._dynamo.utils
    dynamo.set_compilation_metrics_limit(100_000)   # one entry per compile (default: last 64)
    device = str(next(bb.model.parameters()).device)
    for key, c in (("eager", cfg), ("compiled", on)):
        sync()
        dynamo.clear_compilation_metrics()
        t = time.perf_counter()
        res[key] = train(make_moe(bb, MoELoRAConfig()), records, c, progress=False)
        sync()
        res[key + "_s"] = time.perf_counter() - t
        if key == "eager":   # printed before compiling: a call that runs out of time keeps it
            yield {"benchmark": "train_step_eager", "backbone": name, "device": device,
                   "batch": BATCH, "max_length": MAX_LENGTH, "steps": res[key].steps,
                   "epochs": EPOCHS, "eager_s_per_step": round(res[key + "_s"] / res[key].steps, 4),
                   "compiling_from": time.strftime("%Y-%m-%dT%H:%M:%S")}
    # each recompile's first failed guard, without the source line dynamo appends after '#'
    reasons = [m.recompile_reason.splitlines()[0].split("#")[0].strip()
               for m in dynamo.get_compilation_metrics() if m.recompile_reason is not None]
    eager, comp = res["eager"], res["compiled"]
    log = comp.compile
    eager_step = res["eager_s"] / eager.steps
    comp_step = log["seconds_per_other_step"]
    diff = max(abs(a - b) for a, b in zip(eager.losses, comp.losses, strict=False))
    yield {"benchmark": "train_step_compiled_vs_eager", "backbone": name,
           "device": device, "batch": BATCH,
           "max_length": MAX_LENGTH, "steps": eager.steps, "epochs": EPOCHS,
           "eager_s_per_step": round(eager_step, 4),
           "compiled_s_per_step": round(comp_step, 4) if comp_step else None,
           "ratio_compiled_to_eager": round(comp_step / eager_step, 3) if comp_step else None,
           "compile_s": round(log["compile_steps_seconds"], 2),
           "compile_steps": log["compile_steps"],
           "compiles_per_epoch": log["compiles_per_epoch"], "recompiles": len(reasons),
           "recompile_reasons": sorted(set(reasons)),
           "graph_breaks": log["graph_breaks"], "blocks": log["blocks"],
           "max_abs_loss_diff": diff, "total_s": {k: round(res[k + "_s"], 2)
                                                  for k in ("eager", "compiled")},
           "load_before": round(load_before, 2), "load_after": round(os.getloadavg()[0], 2)}
