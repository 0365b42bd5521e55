"""Where the time of one MoE-LoRA and one dense LoRA training step goes, from the profiler.

On an H200 the ``full`` adapter's eager step on SmolLM2's architecture took 0.41 s and dense
LoRA's 0.20 s (benchmarks/results/benchmarks.md): 1 ms more per adapted linear, where the MoE
layer's ~15 kernels and ~39 leaf ops (`python -m benchmarks moe`) would cost a fraction of that
to launch.
This benchmark tells in one lease call what the difference is made of: for the step that
`bench_graph_step` times (fixed batch, loss, backward, AdamW), the ops that take the most device
time (CPU time without CUDA), per step, and the calls that wait for the device
(``cudaStreamSynchronize``, device-to-host copies, ``_local_scalar_dense``, ``nonzero``: in
the forward and backward, and in the optimizer's step apart), the kernel launches per step, and
the step's seconds with and without deterministic algorithms
(`baselines.train.deterministic_training`, which every training runs in: some CUDA ops take
slower deterministic kernels there, and unless ``CUBLAS_WORKSPACE_CONFIG`` is ``:4096:8`` or
``:16:8`` every cuBLAS call issues a warning, and its matmuls stay nondeterministic). It runs
under the setting a run makes (`baselines.train.deterministic_cublas`: ``:4096:8`` where
unset); run it again with ``CUBLAS_WORKSPACE_CONFIG=`` (empty: PyTorch's default workspace,
nondeterministic matmuls) to see the other.
"""
from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from typing import Any

from benchmarks.bench_graph_step import WARMUP, _timed, fixed_step, step_models

#: profiled steps, and the ops listed per model
STEPS, TOP = 2, 15
#: events that wait for the device, by name (runtime calls and aten ops)
SYNC_EVENTS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
               "aten::_local_scalar_dense", "aten::nonzero")


def profile_step(model: Any, records: list[Any]) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    from baselines.train import deterministic_training

    cuda = model.device.type == "cuda"
    step, sync, tokens = fixed_step(model, records, **({"fused": True} if cuda else {}))

    def seconds() -> float:
        for _ in range(WARMUP):
            step()
        return round(_timed(step, STEPS + 3, sync), 4)

    # deterministic mode alerts on every cuBLAS call unless this names a deterministic workspace
    row: dict[str, Any] = {"tokens": tokens,
                           "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
                           "s_per_step": seconds()}
    with deterministic_training():
        row["s_per_step_deterministic"] = seconds()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with deterministic_training(), profile(activities=activities) as prof:
        for _ in range(STEPS):
            step()
        sync()
    events = prof.events()
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    ops = sorted(prof.key_averages(), key=lambda e: getattr(e, key), reverse=True)[:TOP]
    row["time"] = "device" if cuda else "cpu"
    row["top_ops"] = [{"name": e.key[:80], "calls_per_step": e.count / STEPS,
                       "ms_per_step": round(getattr(e, key) / 1e3 / STEPS, 3)} for e in ops]
    names = Counter(e.name for e in events)
    syncs = Counter(("optimizer" if _in_optimizer(e) else "step", e.name) for e in events
                    if e.name in SYNC_EVENTS)
    for part in ("step", "optimizer"):   # the CPU optimizer's reads are of its CPU step counters
        row[f"{part}_syncs_per_step"] = {n: c / STEPS for (p, n), c in syncs.items() if p == part}
    row["device_to_host_copies_per_step"] = sum(
        c for n, c in names.items() if "DtoH" in n or "Device -> Pageable" in n) / STEPS
    row["kernel_launches_per_step"] = sum(
        c for n, c in names.items() if n in ("cudaLaunchKernel", "cuLaunchKernel",
                                             "cudaLaunchKernelExC")) / STEPS
    row["aten_ops_per_step"] = sum(c for n, c in names.items() if n.startswith("aten::")) / STEPS
    return row


def _in_optimizer(event: Any) -> bool:
    while event is not None:
        if event.name.startswith("Optimizer.step"):
            return True
        event = event.cpu_parent
    return False


def run() -> Iterator[dict[str, Any]]:
    for case, model, records in step_models():
        yield {"benchmark": "train_step_profile", **case, **profile_step(model, records)}
