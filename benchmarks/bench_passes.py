"""Forward passes of one split: MC-dropout passes stacked vs one after another, and what a
stacked pass would save the thermostat.

``mc_passes_stacked_vs_sequential`` (one row per model): the ``T`` = `cpu` profile's
``mc_passes`` MC-dropout passes over ``N_RECORDS`` records (the `cpu` profile's ID cap; real
ARC-Easy train questions when ``UQBENCH_DATA`` holds them, else synthetic ones) at the profile's
``eval_batch_size``, as the engine ran them before (``T`` calls of `baselines.forward.collect`)
and as it runs them now (`baselines.forward.collect_mc`: ``T`` copies stacked in each forward,
per-copy dropout masks). Models: the MoE-LoRA of the `smoke`/`cpu` recipe (experts on the FFN
linears of the last 2 blocks, default head) on ``tiny-bert``, ``tiny-llama`` and ``minilm``
(the default backbone; its 4-block frozen prefix read from the prefix cache, warmed first).
Both paths timed in one run, interleaved, median of ``REPS``, one torch thread (the machine is
shared). ``max_abs_diff`` / ``bitwise`` compare every field of every pass between the paths.

``thermostat_stacked_thresholds``: one bisection step of the thermostat (`mean_k` over the same
records under calibrated-looking CARE) against one pass with each batch stacked 3 times, the
cost of evaluating 3 thresholds at once (the next two levels of the bisection: midpoint and
both quarter points). ``per_level_ratio`` = stacked / (2 x single): below 1, a stacked search
would calibrate faster than the sequential bisection.
"""
from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

from benchmarks.bench_threads import arc_records

N_RECORDS = 120
REPS = 3
BACKBONES = ("tiny-bert", "tiny-llama", "minilm")




def _timed(fns: dict[str, Callable[[], Any]]) -> tuple[dict[str, float], dict[str, Any]]:
    """Median seconds of each function, interleaved, after a warm-up; and each's last result."""
    out = {k: fn() for k, fn in fns.items()}   # warm-up
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(REPS):
        for k, fn in fns.items():
            t = time.perf_counter()
            out[k] = fn()
            times[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}, out


def run() -> Iterator[dict[str, object]]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    records, what = arc_records(N_RECORDS)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for name in BACKBONES:
            yield from _measure(name, records, what)
    finally:
        torch.set_num_threads(before)


def _measure(name: str, records: list[Any], what: str) -> Iterator[dict[str, object]]:
    import numpy as np
    import torch

    from baselines.backbones import load_backbone
    from baselines.forward import collect, collect_mc
    from baselines.gates import Care
    from baselines.heads import make_moe
    from baselines.moe import MoELoRAConfig, set_gate
    from baselines.thermostat import mean_k
    from uqbench.core.profiles import RECIPE, get_profile

    prof = get_profile("cpu")
    T, bs, n_len = prof.mc_passes, prof.eval_batch_size, prof.max_length
    model = make_moe(load_backbone(name), MoELoRAConfig(
        seed=0, target_modules=RECIPE["target_modules"], top_layers=RECIPE["top_layers"]), seed=0)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():   # trained-looking experts: lora_B = 0 gives D = 0
        for layer in model.moe_layers():
            layer.lora_B.copy_(torch.randn(layer.lora_B.shape, generator=g) * 0.02)
    kw: dict[str, Any] = {"batch_size": bs, "max_length": n_len, "progress": False}
    collect(model, records, **kw)   # fills the prefix cache (minilm) for both paths
    secs, out = _timed({
        "sequential": lambda: [collect(model, records, mode="mc_dropout", seed=t, **kw)
                               for t in range(T)],
        "stacked": lambda: collect_mc(model, records, list(range(T)), **kw)})
    diff = max(float(np.abs(a[k].astype(np.float64) - b[k].astype(np.float64)).max())
               for a, b in zip(out["sequential"], out["stacked"], strict=False) for k in a)
    yield {"name": "mc_passes_stacked_vs_sequential", "backbone": name, "head": model.mode,
           "records": what, "n": len(records), "passes": T, "batch_size": bs,
           "sequential_s": round(secs["sequential"], 3), "stacked_s": round(secs["stacked"], 3),
           "ratio": round(secs["stacked"] / secs["sequential"], 3), "max_abs_diff": diff,
           "bitwise": diff == 0.0, "threads": 1, "reps": REPS,
           "target": "ratio < 1 and the same values",
           "met": secs["stacked"] < secs["sequential"] and diff <= 1e-6}

    set_gate(model, Care(0.5))
    batches = [model.encode(records[i:i + bs], n_len) for i in range(0, len(records), bs)]
    stacked = [model.encode(records[i:i + bs] * 3, n_len) for i in range(0, len(records), bs)]

    def fwd(m: Any, b: Any) -> Any:
        return m(b)

    secs, _ = _timed({"single": lambda: mean_k(model, batches, fwd),
                      "stacked3": lambda: mean_k(model, stacked, fwd)})
    per_level = secs["stacked3"] / (2 * secs["single"])
    yield {"name": "thermostat_stacked_thresholds", "backbone": name, "records": what,
           "n": len(records), "single_pass_s": round(secs["single"], 3),
           "stacked3_pass_s": round(secs["stacked3"], 3), "per_level_ratio": round(per_level, 3),
           "threads": 1, "reps": REPS, "target": "per_level_ratio < 1 to stack thresholds",
           "met": per_level < 1}
