"""Torch threads on a busy machine: the runner's default thread count against ``--threads 1``.

``train_step_threads_under_load``: wall time of one training step of the real MiniLM MoE-LoRA
model (``baselines.heads.make_moe`` with the `smoke`/`cpu` recipe: experts on the FFN linears,
bi-encoder head; ``baselines.train.train`` on 16 records = one optimiser step) with torch's
intra-op threads set to the cores this process may use (``len(os.sched_getaffinity(0))``, the
runner's default) and to one thread, while a competing busy process (a Python loop spinning in
a subprocess) runs beside it the whole time. Both settings are timed in one run, interleaved
(default, one, default, one, ...) after a warm-up of each, median of ``REPS``; ``ratio`` is
default / one (> 1: the default threads are slower than one thread on the busy machine).
Records: the first 16 of the real ARC-Easy train split when ``UQBENCH_DATA`` holds it, else 16
synthetic 4-option questions (``records`` says which).
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from typing import Any

REPS = 5
N_RECORDS = 16


def arc_records(n: int = N_RECORDS) -> tuple[list[Any], str]:
    """``n`` four-option ARC-Easy train questions (their source named), or ``n`` synthetic ones
    where no data copy nor the hub can be read (the line then says "synthetic")."""
    from uqbench.data.records import MCRecord

    try:
        from uqbench.data.sources import load_source

        real = load_source("arc-easy", "train", data_dir=os.environ.get("UQBENCH_DATA") or None)
        recs = [it.record for it in real.items
                if it.record is not None and len(it.record.choices) == 4][:n]
        if len(recs) == n:
            return recs, "arc-easy train (real)"
    except Exception as exc:  # noqa: BLE001 -- no local copy and no hub: synthetic questions
        warnings.warn(f"benchmarks: ARC-Easy not readable ({type(exc).__name__}: {exc}); "
                      f"{n} synthetic questions instead (the line says so)", stacklevel=2)
    words = ["carbon", "oxygen", "helium", "neon", "water", "iron", "light", "sound"]
    recs = [MCRecord(id=f"syn{i}", domain="science",
                     question=f"Question {i}: which of these is {words[i % 8]}?"
                              + " It is asked about the natural world." * (i % 3),
                     choices=tuple(words[(i + j) % 8] for j in range(4)), answer=i % 4,
                     source="synthetic") for i in range(n)]
    return recs, "synthetic"


def _busy() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "while True: pass"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def run() -> Iterator[dict[str, object]]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    from baselines.backbones import load_backbone
    from baselines.heads import make_moe
    from baselines.moe import MoELoRAConfig
    from baselines.train import TrainConfig, train
    from uqbench.core.profiles import RECIPE

    records, source = arc_records()
    model = make_moe(load_backbone("minilm"),
                     MoELoRAConfig(seed=0, target_modules=RECIPE["target_modules"],
                                   top_layers=RECIPE["top_layers"]),
                     mode=RECIPE["encoder_head"], seed=0)
    cfg = TrainConfig(epochs=1, batch_size=N_RECORDS, lr=RECIPE["lr"],
                      head_lr=RECIPE["head_lr"], seed=0)
    default = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else (os.cpu_count() or 1)
    settings = {"default": default, "one": 1}
    before = torch.get_num_threads()

    def step(n: int) -> float:
        torch.set_num_threads(n)
        t0 = time.perf_counter()
        res = train(model, records, cfg, progress=False)
        assert res.steps == 1
        return time.perf_counter() - t0

    busy = _busy()
    times: dict[str, list[float]] = {k: [] for k in settings}
    try:
        time.sleep(0.5)  # let the competitor start spinning
        for n in settings.values():
            step(n)      # warm-up
        for _ in range(REPS):
            for k, n in settings.items():
                times[k].append(step(n))
    finally:
        busy.kill()
        busy.wait()
        torch.set_num_threads(before)
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = med["default"] / med["one"]
    yield {"name": "train_step_threads_under_load", "default_threads": default,
           "default_s": round(med["default"], 4), "one_thread_s": round(med["one"], 4),
           "default_all_s": [round(t, 4) for t in times["default"]],
           "one_thread_all_s": [round(t, 4) for t in times["one"]],
           "ratio": round(ratio, 3), "records": source, "batch": len(records), "reps": REPS,
           "competitor": "1 busy Python loop",
           "target": "informational: > 1 means --threads 1 is faster on a busy machine",
           "met": None}
