"""Seconds per training step of the ``full`` profile's MoE-LoRA against a dense LoRA on the same
linears, through the real training loop (`baselines.train.train`), in one run on one device.

On an H200, ``make gpu-check``'s ``full`` step trained the ``full`` adapter (16 experts of rank 8
on all 210 attention and MLP linears of SmolLM2) at 1.4 steps/s, about 0.7 s a step, where the
arithmetic needs ~10 ms: the step is bound by kernel launches. This benchmark is the short
script to measure that on a lent GPU in one call, before and after a change: no data and no
cache needed (synthetic questions of ``max_length`` tokens), the backbone SmolLM2 where it is
installed and a GPU is found, else the 2-layer random ``tiny-llama`` (a CPU smoke of the same
path). ``UQBENCH_BENCH_BACKBONE`` names another backbone, or a folder holding a decoder's
``config.json`` and tokenizer files but no weights: that architecture with random weights (a
step's time does not depend on the weights' values; a lease then carries a few MB, not the
weights). Goal (``ratio``, MoE-LoRA step over
the dense LoRA step): <= 1.5 on 2 CPU cores, <= 1.3 on a GPU; the line also has tokens/s, and
the MoE-LoRA step with gradient checkpointing (``--grad-checkpoint``) against the plain one.

On a CPU without ``UQBENCH_BENCH_BACKBONE`` it times three cases, one line each:

- ``tiny-llama`` (hidden 32): the adapter's arithmetic dominates there, since the 16 experts' 128
  code columns are 4x the model's width, so this line is the MoE layer's worst case;
- ``tiny-llama`` with 4 experts of which the gate admits all 4: the arithmetic a path computing
  only the top-4 experts would do, at no gather cost; the floor of any sparse path;
- SmolLM2 (where installed: the ``full`` profile's backbone), at the smaller CPU batch
  ``CPU_SHAPE``: the ratio at the width the profile trains.

On a GPU the line also times the graph path (`TrainConfig.cuda_graph`): ``*_graph_s_per_step``
is the marginal step, ``(t(GRAPH_STEPS) - t(STEPS)) / (GRAPH_STEPS - STEPS)`` over two
trainings, so the eager warm-up and the capture each one pays once cancel out (the first
``STEPS`` of one training cost ``*_graph_first_s``). Goal: ``GOAL_STEPS_PER_S`` MoE-LoRA steps
a second on an H200. ``*_graph_tf32_s_per_step``: the same with float32 matmuls in TensorFloat-32
(``torch.set_float32_matmul_precision("high")``; a run keeps PyTorch's "highest"): the float32
adapter products are most of what is left of the replayed step's device time.

The MoE-LoRA and dense LoRA trainings alternate for `ROUNDS` rounds and each step time is the
median over them, so a change of the machine's load during the run weighs on both alike;
``ratio_rounds`` gives each round's ratio. ``floor_ratio`` is what the ratio would be if the
MoE-LoRA step cost nothing beyond the dense LoRA step but the extra arithmetic of its adapter
products: the dense LoRA step plus, for every adapted linear, the six products of the
rank-``N*r`` adapter (forward codes and output, the backward's four) minus those of a rank-``r``
LoRA, each product timed alone at the step's token count, over the dense LoRA step. The
MoE-LoRA layer computes every expert's codes (the arithmetic of a rank-``N*r`` adapter), so
no change outside those products can bring the ratio below this floor.
"""
from __future__ import annotations

import os
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from statistics import median
from typing import Any

import torch
from torch import Tensor

#: MoE-LoRA step / dense LoRA step: on 2 CPU cores, and on a GPU (where launches dominate)
GOAL_RATIO = {"cpu": 1.5, "cuda": 1.3}
#: the ``full`` profile's batch and sequence length
BATCH, MAX_LENGTH = 16, 256
STEPS = 8
#: alternating MoE-LoRA / dense LoRA trainings a line times
ROUNDS = 3
#: the longer training of the graph path's marginal step
GRAPH_STEPS = 32
#: SmolLM2's ``full`` MoE-LoRA steps a second on an H200 (issue 35)
GOAL_STEPS_PER_S = 10
#: SmolLM2's (batch, max_length, steps) on a CPU: an eighth of the GPU's 16 x 256 tokens a step
CPU_SHAPE = (4, 128, 3)


def synthetic_records(n: int, words: int) -> list[Any]:
    from uqbench.data.records import MCRecord

    text = " ".join(["the quick brown fox jumps over the lazy dog"] * (words // 9 + 1))
    return [MCRecord(id=f"b{i}", domain="bench", question=f"{i} {text}",
                     choices=tuple(f"option {j} of {i}" for j in range(4)), answer=i % 4,
                     source="bench") for i in range(n)]


def step_backbone() -> tuple[str, Any]:
    """``UQBENCH_BENCH_BACKBONE``, else SmolLM2 on a GPU where it is installed, else tiny-llama
    (the line names which), under the cuBLAS setting a run makes
    (`baselines.train.deterministic_cublas`)."""
    from baselines.backbones import check_backbone, load_backbone
    from baselines.train import deterministic_cublas
    from uqbench.core.errors import ConfigError

    deterministic_cublas()
    gpu = torch.cuda.is_available()
    name = os.environ.get("UQBENCH_BENCH_BACKBONE")
    if name is not None and architecture_only(Path(name)):
        return f"{Path(name).name} (random weights)", random_backbone(Path(name), gpu)
    if name is None:
        try:
            check_backbone("smollm2")
            name = "smollm2" if gpu else "tiny-llama"
        except ConfigError:
            name = "tiny-llama"
    return name, load_backbone(name, device="cuda" if gpu else None)


def architecture_only(folder: Path) -> bool:
    """A folder with ``config.json`` and no weight files."""
    return (folder / "config.json").is_file() and not any(
        f.suffix in (".safetensors", ".bin", ".gguf") for f in folder.iterdir())


def random_backbone(folder: Path, gpu: bool) -> Any:
    """The decoder ``folder``'s config describes, randomly initialised (seed 0), with its
    tokenizer; bfloat16 on a GPU as `baselines.backbones.load_backbone` places real weights."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from baselines.backbones import from_model

    config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16 if gpu else torch.float32)
    return from_model(model.to("cuda" if gpu else "cpu"), tokenizer, name=folder.name,
                      kind="decoder")


def _train_seconds(model: Any, records: list[Any], batch: int, max_length: int,
                   cuda_graph: bool = False, grad_checkpoint: bool = False
                   ) -> tuple[float, int]:
    """(seconds, steps) of one training on ``records``, after a warm-up training."""
    from baselines.train import TrainConfig, train

    cfg = TrainConfig(epochs=1, batch_size=batch, max_length=max_length, bucket=False,
                      cuda_graph=cuda_graph, grad_checkpoint=grad_checkpoint)
    train(model, records[:2 * batch], cfg, progress=False)               # warm-up
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t = time.perf_counter()
    res = train(model, records, cfg, progress=False)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - t, res.steps


def seconds_per_step(model: Any, records: list[Any], batch: int, max_length: int,
                     grad_checkpoint: bool = False) -> float:
    """Wall seconds of one training step of ``model`` on ``records``."""
    seconds, steps = _train_seconds(model, records, batch, max_length,
                                    grad_checkpoint=grad_checkpoint)
    return seconds / steps


def product_seconds(shapes: list[tuple[int, int]], tokens: int, rank: int,
                    device: torch.device, dtype: torch.dtype, repeats: int = 5) -> float:
    """Seconds of the six products of a rank-``rank`` adapter on every (in, out) linear of
    ``shapes`` at ``tokens`` tokens, each timed alone (median of ``repeats``): the forward's
    codes and output, and the backward's input gradient of the output product, the two weight
    gradients and the input gradient of the codes."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def operand(rows: int, cols: int) -> Tensor:
        return torch.randn(rows, cols, device=device, dtype=dtype)

    total = 0.0
    for e, o in shapes:
        h, gy = operand(tokens, e), operand(tokens, o)
        a, b = operand(rank, e), operand(rank, o)
        z = operand(tokens, rank)
        for left, right in [(a, h.t()), (z, b), (b, gy.t()), (gy.t(), z), (h.t(), z), (z, a)]:
            times = []
            for _ in range(repeats + 1):
                sync()
                t = time.perf_counter()
                torch.mm(left, right)
                sync()
                times.append(time.perf_counter() - t)
            total += median(times[1:])
    return total


def graph_fields(kind: str, model: Any, batch: int, max_length: int) -> dict[str, float]:
    """The graph path's marginal step (see the module doc) and its first `STEPS` steps, then
    the marginal step with TensorFloat-32 matmuls."""
    records = synthetic_records(batch * GRAPH_STEPS, max_length)
    out = {}
    for name, precision in (("graph", "highest"), ("graph_tf32", "high")):
        before = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision(precision)
        try:
            short, _ = _train_seconds(model, records[:batch * STEPS], batch, max_length, True)
            long, _ = _train_seconds(model, records, batch, max_length, True)
        finally:
            torch.set_float32_matmul_precision(before)
        out[f"{kind}_{name}_s_per_step"] = round((long - short) / (GRAPH_STEPS - STEPS), 4)
        out.setdefault(f"{kind}_graph_first_s", round(short, 2))
    return out


def run() -> Iterator[dict[str, Any]]:
    from baselines.backbones import check_backbone, load_backbone
    from uqbench.core.errors import ConfigError

    if torch.cuda.is_available() or "UQBENCH_BENCH_BACKBONE" in os.environ:
        name, bb = step_backbone()
        yield ratio_line(name, bb)
        return
    tiny = load_backbone("tiny-llama")
    yield ratio_line("tiny-llama", tiny)
    yield ratio_line("tiny-llama", tiny, n_experts=4)
    try:
        check_backbone("smollm2")
    except ConfigError as e:
        warnings.warn(f"train_step: no SmolLM2 line: {e}", stacklevel=1)
        yield {"benchmark": "train_step_moe_vs_lora", "backbone": "smollm2", "skipped": str(e)}
        return
    yield ratio_line("smollm2", load_backbone("smollm2"), *CPU_SHAPE)


def ratio_line(name: str, bb: Any, batch: int = BATCH, max_length: int = MAX_LENGTH,
               steps: int = STEPS, n_experts: int = 16) -> dict[str, Any]:
    """The line of backbone ``bb``: MoE-LoRA and LoRA seconds per step and their ratio."""
    from baselines.dense import make_dense
    from baselines.heads import make_moe
    from baselines.moe import MoELoRAConfig, moe_layers

    records = synthetic_records(batch * steps, max_length)
    cfg = MoELoRAConfig(n_experts=n_experts, top_k=min(4, n_experts))   # 16: the default
    moe = make_moe(bb, cfg)
    lora = make_dense(bb, "lora")
    rounds: dict[str, list[float]] = {"moe": [], "lora": []}
    for _ in range(ROUNDS):
        for key, model in (("moe", moe), ("lora", lora)):
            rounds[key].append(seconds_per_step(model, records, batch, max_length))
    s = {key: median(times) for key, times in rounds.items()}
    s["moe_ckpt"] = seconds_per_step(moe, records, batch, max_length, grad_checkpoint=True)
    dev = next(moe.parameters()).device
    layers = moe_layers(moe.backbone)
    shapes = [(layer.in_features, layer.out_features) for layer in layers]
    adapter_dtype = layers[0].lora_A.dtype
    extra = (product_seconds(shapes, batch * max_length, cfg.n_experts * cfg.rank, dev,
                             adapter_dtype)
             - product_seconds(shapes, batch * max_length, cfg.rank, dev, adapter_dtype))
    graph: dict[str, Any] = {}
    if dev.type == "cuda":
        graph = {**graph_fields("moe", moe, batch, max_length),
                 **graph_fields("lora", lora, batch, max_length)}
        graph.update(graph_ratio=round(graph["moe_graph_s_per_step"]
                                       / graph["lora_graph_s_per_step"], 3),
                     moe_graph_steps_per_s=round(1 / graph["moe_graph_s_per_step"], 1),
                     goal_steps_per_s=GOAL_STEPS_PER_S)
    return {
        "benchmark": "train_step_moe_vs_lora",
        "backbone": name,
        "device": str(dev),
        "dtype": str(next(moe.parameters()).dtype).replace("torch.", ""),
        "adapter_dtype": str(adapter_dtype).replace("torch.", ""),
        # the layers whose last training forward took the hand-written step
        "fast_step_layers": sum(layer.took_fast_step for layer in layers),
        "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        "batch": batch,
        "max_length": max_length,
        "steps": steps,
        "adapted_linears": len(layers),
        "n_experts": cfg.n_experts,
        "top_k": cfg.top_k,
        "moe_s_per_step": round(s["moe"], 4),
        "lora_s_per_step": round(s["lora"], 4),
        "moe_tokens_per_s": round(batch * max_length / s["moe"]),
        "ratio": round(s["moe"] / s["lora"], 3),
        "goal_ratio": GOAL_RATIO[dev.type],
        "rounds": ROUNDS,
        "ratio_rounds": [
            round(m / d, 3) for m, d in zip(rounds["moe"], rounds["lora"], strict=False)
        ],
        "extra_product_s_per_step": round(extra, 4),
        "floor_ratio": round((s["lora"] + extra) / s["lora"], 3),
        "met": s["moe"] / s["lora"] <= GOAL_RATIO[dev.type],
        # what --grad-checkpoint costs: the MoE-LoRA step recomputing its blocks
        "moe_ckpt_s_per_step": round(s["moe_ckpt"], 4),
        "ckpt_ratio": round(s["moe_ckpt"] / s["moe"], 3),
        **graph,
        "load": round(os.getloadavg()[0], 2),
    }
