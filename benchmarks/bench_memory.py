"""Bytes a token holds in a MoE-LoRA model's passes and training step, for a backbone's
architecture: what a profile's ``eval_tokens``, ``batch_size`` and ``max_length`` cost in memory.

A GPU run's peak is set by its largest forward: the stacked MC-dropout pass holds ``mc_passes``
copies of an eval batch, and a training step keeps every adapted block's activations for its
backward. Both grow with the padded tokens of one forward (`benchmarks.lengths` gives those of
a profile's largest batches), so the bytes per token measured here, times those tokens, are the
activations' memory, beside the weights. Measured on the CPU, in bfloat16 as a GPU holds the
backbone, with random weights (the bytes do not depend on the values), on the architecture cut
to one and to two blocks:

- ``eval_bytes_per_token``: peak bytes allocated during one MC-dropout forward under
  ``inference_mode`` (each block's intermediates live only while it runs, so the peak does not
  grow with depth: the larger of the one- and two-block peaks);
- ``train_bytes_per_token_block``: what one more adapted block adds to the peak of a training
  step (forward, cross-entropy and load-balancing loss, backward): the two-block peak minus the
  one-block peak; a model keeps this for each adapted block (a profile's ``top_layers``, else
  every block);
- ``train_ckpt_bytes_per_token_block``: the same with gradient checkpointing
  (``--grad-checkpoint``: a block keeps its input, and the backward recomputes the rest);
- ``weights_bytes``: the whole backbone's parameters in bfloat16 (built on the meta device).

On the CPU the attention runs PyTorch's CPU kernels, whose scratch memory may differ from a
GPU's fused kernels; the linears' outputs, which dominate at these widths, are the same.

``UQBENCH_BENCH_BACKBONE`` names a folder with a decoder's ``config.json`` and tokenizer files
(several, separated by ``:``); without it, the 2-block random ``tiny-llama`` at SmolLM2's width.
``UQBENCH_BENCH_TARGETS``: the adapted linears, ``auto`` (attention and MLP, the ``full``
profile's) or ``ffn`` (the ``gpu`` profile's); default both.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

#: (rows, tokens a row) of the measured batch: enough tokens that the per-model constants
#: (a router's weights cast, the loss) are small against the per-token bytes
SHAPE = (4, 256)


def peak_bytes(fn: Callable[[], Any], *, grad: bool) -> int:
    """Peak live bytes torch allocates on the CPU while ``fn()`` runs (under inference mode
    unless ``grad``): the running sum of every op's own allocations and frees
    (torch.profiler ``profile_memory=True``), in time order."""
    from torch.profiler import ProfilerActivity, profile

    ctx = torch.enable_grad() if grad else torch.inference_mode()
    with ctx, profile(activities=[ProfilerActivity.CPU], profile_memory=True) as p:
        fn()
    cur = peak = 0
    for e in sorted(p.events(), key=lambda e: e.time_range.start):
        cur += e.self_cpu_memory_usage
        peak = max(peak, cur)
    return peak


def _architectures() -> list[tuple[str, Any, Any]]:
    """(name, config, tokenizer) of each measured architecture."""
    from transformers import AutoConfig, AutoTokenizer

    from baselines.backbones import tiny_backbone

    names = os.environ.get("UQBENCH_BENCH_BACKBONE")
    if not names:
        bb = tiny_backbone("decoder", hidden=576)
        return [("tiny-llama-576", bb.model.config, bb.tokenizer)]
    return [(Path(d).name, AutoConfig.from_pretrained(d, local_files_only=True),
             AutoTokenizer.from_pretrained(d, local_files_only=True)) for d in names.split(":")]


def _weights_bytes(config: Any) -> int:
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    return sum(p.numel() * p.element_size() for p in model.parameters())


def _peaks(config: Any, tokenizer: Any, blocks: int, targets: str
           ) -> tuple[int, int, int, int]:
    """(eval peak, train-step peak, the same with gradient checkpointing, padded tokens) of the
    architecture cut to ``blocks``."""
    import copy

    from transformers import AutoModelForCausalLM

    from baselines.backbones import from_model
    from baselines.heads import make_moe
    from baselines.moe import MoELoRAConfig, forget_aux, load_balance_loss
    from baselines.train import checkpointed
    from benchmarks.bench_train_step import synthetic_records

    config = copy.deepcopy(config)
    config.num_hidden_layers = blocks
    torch.manual_seed(0)
    net = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    moe_cfg = MoELoRAConfig(target_modules=targets)
    model = make_moe(from_model(net, tokenizer, name="arch", kind="decoder"), moe_cfg,
                     copy=False)
    records = synthetic_records(*SHAPE)
    batch = model.encode(records, SHAPE[1])
    labels = torch.tensor([r.answer for r in records])
    model.eval()
    model.mc_dropout_on()
    eval_peak = peak_bytes(lambda: model(batch), grad=False)
    model.train()

    def step() -> None:
        loss = torch.nn.functional.cross_entropy(model(batch).float(), labels)
        (loss + moe_cfg.lb_coef * load_balance_loss(model.backbone)).backward()
        forget_aux(model.backbone)

    train_peak = peak_bytes(step, grad=True)
    with checkpointed(model, True):
        ckpt_peak = peak_bytes(step, grad=True)
    return eval_peak, train_peak, ckpt_peak, batch["attention_mask"].numel()


def run() -> Iterator[dict[str, Any]]:
    targets = os.environ.get("UQBENCH_BENCH_TARGETS", "auto,ffn").split(",")
    for name, config, tokenizer in _architectures():
        for target in targets:
            (e1, t1, c1, n), (e2, t2, c2, _) = (_peaks(config, tokenizer, b, target)
                                                for b in (1, 2))
            row = {"name": "activation_bytes", "architecture": name, "targets": target,
                   "dtype": "bfloat16", "hidden": config.hidden_size,
                   "intermediate": getattr(config, "intermediate_size", None),
                   "blocks": config.num_hidden_layers, "tokens": n,
                   "eval_bytes_per_token": round(max(e1, e2) / n),
                   "train_bytes_per_token_block": round((t2 - t1) / n),
                   "train_bytes_per_token_one_block": round(t1 / n),
                   "train_ckpt_bytes_per_token_block": round((c2 - c1) / n),
                   "train_ckpt_bytes_per_token_one_block": round(c1 / n),
                   "weights_bytes": _weights_bytes(config)}
            yield {**row, "profiles": profile_gb(row)}


def profile_gb(row: dict[str, Any]) -> dict[str, dict[str, float]]:
    """For each built-in profile adapting ``row``'s targets, the gigabytes of its largest
    forwards by ``row``'s bytes per token, at their upper bound: every row of a batch at the
    profile's ``max_length`` (``mc_pass``: ``mc_passes`` stacked copies of an eval batch;
    ``train_step`` and ``train_step_ckpt``: a batch over the adapted blocks, without and with
    ``--grad-checkpoint``) and the weights. ``eval_tokens_for_80gb``: the ``--eval-tokens``
    whose pass fits beside the weights in 80 GB, 10% kept free (None: the pass fits as it is)."""
    from uqbench.core.profiles import PROFILES

    out = {}
    for name in PROFILES.names():
        prof = PROFILES.get(name)
        if prof.target_modules != row["targets"]:
            continue
        blocks = min(prof.top_layers or row["blocks"], row["blocks"])
        step = prof.batch_size * prof.max_length
        eval_tokens = prof.mc_passes * prof.eval_batch_size * prof.max_length
        free = 0.9 * 80e9 - row["weights_bytes"]
        fits = int(free // row["eval_bytes_per_token"])
        out[name] = {
            "mc_pass": round(eval_tokens * row["eval_bytes_per_token"] / 1e9, 1),
            "train_step": round(step * (row["train_bytes_per_token_one_block"] + (blocks - 1)
                                        * row["train_bytes_per_token_block"]) / 1e9, 1),
            "train_step_ckpt": round(step * (row["train_ckpt_bytes_per_token_one_block"]
                                             + (blocks - 1)
                                             * row["train_ckpt_bytes_per_token_block"]) / 1e9, 1),
            "weights": round(row["weights_bytes"] / 1e9, 2),
            "eval_tokens_for_80gb": None if fits >= eval_tokens else fits}
    return out
