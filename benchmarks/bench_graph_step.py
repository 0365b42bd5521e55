"""The MoE-LoRA and dense LoRA training steps replayed as one CUDA graph each, against eager.

On an H200 the ``full`` adapter's eager step on SmolLM2's architecture took 0.41 s and dense LoRA's
0.20 s for ~5-10 ms of arithmetic (benchmarks/results/benchmarks.md): both are bound by launching
kernels one by one from Python. A CUDA graph replays a captured step's kernels in one launch; this
benchmark measures, before the training loop gets such a path, what it would give: the same step
(forward, cross-entropy plus the Switch load-balancing loss, backward, fused AdamW with its state on
the GPU, gradients zeroed in place) on one fixed batch of ``BATCH`` x ``MAX_LENGTH`` tokens, timed
eagerly and as graph replays, with the capture's seconds apart. A step that cannot be captured (an
op that waits for the host, a CPU tensor) is reported with the error, which names the op: that is
the list the training loop's graph path must clear.

Without CUDA it runs the eager step only (a CPU check of the same step function, no timing
claim). The backbone is `bench_train_step.step_backbone` (``UQBENCH_BENCH_BACKBONE``: a folder
with a config and tokenizer gives that architecture with random weights).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.bench_train_step import BATCH, MAX_LENGTH, step_backbone, synthetic_records

#: timed steps (eager) and replays (graph), after the warm-up
STEPS = 10
WARMUP = 3


def _step(model: Any, enc: dict[str, torch.Tensor], labels: torch.Tensor,
          opt: torch.optim.Optimizer, lb_coef: float) -> Callable[[], torch.Tensor]:
    """One training step on a fixed batch, as `baselines.train.train` takes it."""
    def step() -> torch.Tensor:
        logits = model(enc)
        loss = F.cross_entropy(logits, labels)
        if lb_coef > 0:
            from baselines.moe import load_balance_loss
            loss = loss + lb_coef * load_balance_loss(model.backbone)
        loss.backward()
        if model.has_moe:   # as the training loop: no graph outlives its step
            from baselines.moe import forget_aux
            forget_aux(model.backbone)
        opt.step()
        opt.zero_grad(set_to_none=False)   # gradients stay where the graph wrote them
        return loss.detach()
    return step


def _timed(fn: Callable[[], Any], n: int, sync: Callable[[], None]) -> float:
    sync()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    sync()
    return (time.perf_counter() - t) / n


def fixed_step(model: Any, records: list[Any], **adamw: Any
               ) -> tuple[Callable[[], torch.Tensor], Callable[[], None], int]:
    """(the training step of ``model`` on one fixed batch of ``records`` (the training gate set,
    ``adamw`` given to AdamW), a device sync, the batch's token count)."""
    from baselines.moe import MoELoRAConfig, set_gate, train_gate

    cuda = model.device.type == "cuda"
    lb_coef = 0.0
    if model.has_moe:
        cfg = model.adapter["config"]
        lb_coef = float(cfg["lb_coef"])
        set_gate(model.backbone, train_gate(MoELoRAConfig.from_dict(cfg)))
    enc = {k: v.to(model.device) for k, v in model.encode(records, MAX_LENGTH).items()}
    labels = torch.tensor([r.answer for r in records], device=model.device)
    opt = torch.optim.AdamW(model.trainable_parameters(), lr=1e-4, **adamw)
    model.train()
    return (_step(model, enc, labels, opt, lb_coef),
            torch.cuda.synchronize if cuda else (lambda: None), int(enc["input_ids"].numel()))


def measure(model: Any, records: list[Any]) -> dict[str, Any]:
    from baselines.train import deterministic_training

    cuda = model.device.type == "cuda"
    step, sync, tokens = fixed_step(model, records,
                                    **({"fused": True, "capturable": True} if cuda else {}))
    row: dict[str, Any] = {"tokens": tokens}
    with deterministic_training():
        for _ in range(WARMUP):
            step()
        row["eager_s_per_step"] = round(_timed(step, STEPS if cuda else 1, sync), 4)
        if not cuda:
            return row
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):   # warm-up on a side stream, as capture requires
            for _ in range(WARMUP):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        t = time.perf_counter()
        try:
            with torch.cuda.graph(graph):
                loss = step()
        except RuntimeError as exc:   # the op that cannot be captured is the finding
            row["graph_error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
            return row
        sync()
        row["capture_s"] = round(time.perf_counter() - t, 2)
        row["graph_s_per_step"] = round(_timed(graph.replay, STEPS, sync), 4)
        row["graph_loss_finite"] = bool(torch.isfinite(loss).item())
        row["speedup"] = round(row["eager_s_per_step"] / row["graph_s_per_step"], 2)
    return row


def step_models() -> Iterator[tuple[dict[str, Any], Any, list[Any]]]:
    """(the fields naming the case, the model, the batch's records): the ``full`` profile's
    MoE-LoRA, then dense LoRA on the same linears, on `step_backbone`; one model alive at a
    time."""
    from baselines.dense import make_dense
    from baselines.heads import make_moe
    from baselines.moe import MoELoRAConfig

    name, bb = step_backbone()
    records = synthetic_records(BATCH, MAX_LENGTH)
    for kind, make in (("moe-lora", lambda: make_moe(bb, MoELoRAConfig())),
                       ("lora", lambda: make_dense(bb, "lora"))):
        model = make()
        yield ({"model": kind, "backbone": name, "device": str(model.device), "batch": BATCH,
                "max_length": MAX_LENGTH}, model, records)
        del model


def run() -> Iterator[dict[str, Any]]:
    for case, model, records in step_models():
        yield {"benchmark": "train_step_cuda_graph", **case, **measure(model, records)}
