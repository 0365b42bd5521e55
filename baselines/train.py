"""Training loop for `MultipleChoiceModel` (paper Appendix "Detailed Experimental Setup").

AdamW on the trainable parameters only (adapters, routers, scoring head; the backbone is frozen),
cosine decay with linear warm-up, cross-entropy over the choices, plus for MoE-LoRA the
load-balancing auxiliary loss ``lb_coef * load_balance_loss`` with the fixed top-k gate
(CARE replaces only the gate at inference; the MoE-LoRA variants of `baselines.variants` train
with their own gate and auxiliary loss), and for AdaLoRA its orthogonality regulariser and
rank allocation. Seeded and deterministic on CPU: same config and records -> identical losses
and weights.

Under a distributed launch (`baselines.distributed`) each step's batch is split across the
processes and the model wrapped in DDP. Each process's cross-entropy is summed and scaled by
``world / batch`` so that the all-reduced (averaged) gradient is exactly the gradient of the
mean over the whole batch, as in one process. Two things differ from one process, as in any
data-parallel MoE training: dropout masks (drawn per process), and the load-balancing loss,
computed on each process's share of the batch and averaged (Switch Transformer's practice).
"""
from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from baselines import distributed
from baselines.heads import MultipleChoiceModel
from uqbench.core.config import help_field
from uqbench.data.records import MCRecord
from uqbench.core.errors import ConfigError


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation hyper-parameters; the defaults are the paper's where it gives them."""

    lr: float = help_field("AdamW learning rate of adapters and routers (paper: 2e-4)", 2e-4)
    head_lr: float = help_field(
        "learning rate of the scoring head (a linear probe on the pooled features). Higher than "
        "lr: the head starts random (std 0.02), adapters start as an exact no-op, and Adam moves "
        "each weight by about lr per step. Mean-pooled pairs of one question differ little (the "
        "question dominates), so the head must grow to separate options. MiniLM+MoE, 400 "
        "ARC-Easy records, 25 steps: head_lr 2e-4 and 1e-3 leave the loss at ln 4 (1.386), "
        "1e-2 moves it (1.390 -> 1.372)", 1e-2)
    weight_decay: float = help_field("AdamW decoupled weight decay (0: LoRA's usual setting)",
                                     0.0)
    epochs: int = help_field("passes over the training records (paper: 3)", 3)
    batch_size: int = help_field("examples per optimiser step (paper: 16)", 16)
    max_length: int = help_field("max tokens per sequence (question truncated first)", 128)
    warmup_ratio: float = help_field("fraction of steps of linear warm-up before cosine decay", 0.06)
    seed: int = help_field("seed of shuffling and dropout", 0)
    grad_clip: float | None = help_field("max global grad norm (None: no clipping)", 1.0)
    bucket: bool = help_field("group similar lengths inside a seeded shuffle (less padding)", True)

    def __post_init__(self) -> None:
        checks = [
            ("lr", self.lr > 0), ("head_lr", self.head_lr > 0),
            ("weight_decay", self.weight_decay >= 0), ("epochs", self.epochs >= 1),
            ("batch_size", self.batch_size >= 1), ("max_length", self.max_length >= 8),
            ("warmup_ratio", 0 <= self.warmup_ratio < 1),
            ("grad_clip", self.grad_clip is None or self.grad_clip > 0),
        ]
        for name, ok in checks:
            if not ok:
                raise ConfigError(f"TrainConfig.{name}={getattr(self, name)!r} is invalid "
                                  f"({type(self).__dataclass_fields__[name].metadata['help']})")


@dataclass(frozen=True)
class TrainResult:
    """``losses``: cross-entropy per step; ``aux_losses``: the weighted auxiliary loss per step
    (load balancing / AdaLoRA regulariser; 0 for other adapters); ``train_accuracy``: fraction
    of each step's batch whose argmax was the answer (from the logits of that step's forward,
    before its update; train mode, so with dropout). ``chance_loss`` / ``chance_accuracy``: the
    cross-entropy and accuracy of a uniform guess on the training records (mean ln k_i, mean
    1/k_i for k_i options): a loss that stays near ``chance_loss`` has learnt nothing."""

    losses: tuple[float, ...]
    aux_losses: tuple[float, ...]
    seconds: float
    steps: int
    train_accuracy: tuple[float, ...] = ()
    chance_loss: float = float("nan")
    chance_accuracy: float = float("nan")

    def summary(self, window: int = 10) -> dict[str, float]:
        """Mean loss and train accuracy of the first and of the last ``window`` steps."""
        def mean(xs: Sequence[float]) -> float:
            return float(sum(xs) / len(xs)) if xs else float("nan")

        w = window
        return {"first_loss": mean(self.losses[:w]), "last_loss": mean(self.losses[-w:]),
                "first_train_accuracy": mean(self.train_accuracy[:w]),
                "last_train_accuracy": mean(self.train_accuracy[-w:]), "window": w,
                "chance_loss": self.chance_loss, "chance_accuracy": self.chance_accuracy}

    def to_json(self) -> dict[str, object]:
        """The training log stored with a checkpoint and shown in ``run.json``."""
        return {"steps": self.steps, "seconds": self.seconds, "losses": list(self.losses),
                "aux_losses": list(self.aux_losses),
                "train_accuracy": list(self.train_accuracy), "summary": self.summary()}


def length_key(record: MCRecord) -> int:
    """Cheap proxy of a record's padded token length (characters)."""
    return len(record.question) + max(len(c) for c in record.choices)


def batch_order(records: Sequence[MCRecord], batch_size: int, generator: torch.Generator, *,
                bucket: bool = True) -> list[list[int]]:
    """One epoch's batches of record indices, from a seeded shuffle.

    With ``bucket``, the shuffle is cut into chunks of 8 batches, each chunk sorted by length and
    split into batches, and the batch order shuffled again: batches hold similar lengths (less
    padding) while every epoch still differs.
    """
    perm = torch.randperm(len(records), generator=generator).tolist()
    if not bucket:
        return [perm[i:i + batch_size] for i in range(0, len(perm), batch_size)]
    chunk = batch_size * 8
    batches = []
    for i in range(0, len(perm), chunk):
        part = sorted(perm[i:i + chunk], key=lambda j: length_key(records[j]))
        batches += [part[k:k + batch_size] for k in range(0, len(part), batch_size)]
    order = torch.randperm(len(batches), generator=generator).tolist()
    return [batches[i] for i in order]


def train(model: MultipleChoiceModel, records: Sequence[MCRecord], config: TrainConfig, *,
          progress: bool = True) -> TrainResult:
    """Train the model's adapters and head in place.

    Parameters
    ----------
    model : MultipleChoiceModel
        From `baselines.heads.make_moe`, `baselines.dense.make_dense` or `make_plain`.
    records : sequence of MCRecord
        Training examples; the label is ``record.answer``.
    config : TrainConfig
    progress : bool
        Show a tqdm bar.

    Returns
    -------
    TrainResult
        Per-step losses and train accuracy, wall time and number of steps. The model is left
        in eval mode, with its MoE gates as they were before training.

    Notes
    -----
    Loss per step ``CE(logits, answer) + aux`` with ``aux = lb_coef * load_balance_loss`` for
    MoE-LoRA (gate ``TopK(top_k)`` during training) and AdaLoRA's orthogonality term. The global
    RNG state is saved and restored; deterministic algorithms are requested for the run.
    """
    from baselines import dense

    if not records:
        raise ConfigError("train: no training records; check the split and the profile caps")
    params = model.trainable_parameters()
    if not params:
        raise ConfigError("train: the model has no trainable parameters")
    head_ids = {id(p) for p in model.head_parameters()}
    groups = [{"params": [p for p in params if id(p) not in head_ids], "lr": config.lr},
              {"params": [p for p in params if id(p) in head_ids], "lr": config.head_lr}]
    groups = [g for g in groups if g["params"]]

    steps_per_epoch = math.ceil(len(records) / config.batch_size)
    total = steps_per_epoch * config.epochs
    if dense.is_adalora(model):
        dense.adalora_schedule(model, total)

    moe_gates, lb_coef = None, 0.0
    if model.has_moe:
        from baselines.moe import MoELoRAConfig, get_gates, set_gate, train_gate
        cfg = model.adapter["config"]
        moe_gates, lb_coef = get_gates(model.backbone), float(cfg["lb_coef"])
        set_gate(model.backbone, train_gate(MoELoRAConfig.from_dict(cfg)))

    losses: list[float] = []
    aux_losses: list[float] = []
    accuracy: list[float] = []
    t0 = time.perf_counter()
    bar = tqdm(total=total, desc="train", disable=not progress or not distributed.is_main(),
               leave=False)
    world = distributed.world()
    net = model if world == 1 else _ddp(model)
    try:
        with torch.random.fork_rng(devices=_devices(model)), deterministic_training():
            torch.manual_seed(config.seed)
            gen = torch.Generator().manual_seed(config.seed)
            from transformers import get_cosine_schedule_with_warmup
            opt = torch.optim.AdamW(groups, weight_decay=config.weight_decay)
            sched = get_cosine_schedule_with_warmup(
                opt, num_warmup_steps=math.ceil(config.warmup_ratio * total),
                num_training_steps=total)
            model.train()
            step = 0
            for _ in range(config.epochs):
                for batch_records in _records(records, config, gen):
                    # this process's share of the batch; a process left without one runs an
                    # example at weight 0, so that it still joins the gradient all-reduce
                    mine = batch_records[distributed.rank()::world] or batch_records[:1]
                    weight = 1.0 if distributed.rank() < len(batch_records) else 0.0
                    enc = model.encode(mine, config.max_length)
                    labels = torch.tensor([r.answer for r in mine], device=model.device)
                    logits = net(enc)                                     # (B, C)
                    aux = torch.zeros((), device=model.device)
                    if model.has_moe and lb_coef > 0:
                        from baselines.moe import load_balance_loss
                        aux = aux + lb_coef * load_balance_loss(model.backbone)
                    if dense.is_adalora(model):
                        aux = aux + dense.adalora_orth_loss(model)
                    right = weight * (logits.detach().argmax(1) == labels).sum().float()
                    if world == 1:
                        ce = F.cross_entropy(logits, labels)
                        loss = ce + aux
                    else:
                        ce_sum = weight * F.cross_entropy(logits, labels, reduction="sum")
                        loss = ce_sum * (world / len(batch_records)) + weight * aux
                        ce = distributed.all_sum(ce_sum) / len(batch_records)
                        aux = distributed.all_sum(weight * aux) / world
                        right = distributed.all_sum(right)
                    if not torch.isfinite(loss):
                        raise FloatingPointError(
                            f"train: loss is {loss.item()} at step {step}; lower lr/head_lr or "
                            "check the inputs")
                    loss.backward()
                    if config.grad_clip is not None:
                        torch.nn.utils.clip_grad_norm_(params, config.grad_clip)
                    opt.step()
                    sched.step()
                    if dense.is_adalora(model):
                        dense.adalora_update(model, step)
                    opt.zero_grad(set_to_none=True)
                    losses.append(float(ce.detach()))
                    aux_losses.append(float(aux.detach()))
                    accuracy.append(float(right) / len(batch_records))
                    step += 1
                    bar.update(1)
                    bar.set_postfix(loss=f"{losses[-1]:.4f}", acc=f"{accuracy[-1]:.2f}")
    finally:
        bar.close()
        model.eval()
        if moe_gates is not None:
            from baselines.moe import set_gate
            set_gate(model.backbone, moe_gates)
    ks = [len(r.choices) for r in records]
    return TrainResult(losses=tuple(losses), aux_losses=tuple(aux_losses),
                       seconds=time.perf_counter() - t0, steps=len(losses),
                       train_accuracy=tuple(accuracy),
                       chance_loss=sum(math.log(k) for k in ks) / len(ks),
                       chance_accuracy=sum(1.0 / k for k in ks) / len(ks))


@contextmanager
def deterministic_training() -> Iterator[None]:
    """Deterministic algorithms for a training loop, the previous settings restored after.

    ``warn_only``: some CUDA kernels have no deterministic version; CPU ones all do. Without
    deterministic mode's NaN fill of every new allocation
    (``torch.utils.deterministic.fill_uninitialized_memory``): it is one extra kernel per
    ``torch.empty`` (14k of a SmolLM2 MoE-LoRA step's 55k ops) and changes no value here, as
    every op writes its output before anything reads it (same losses, bit for bit).
    """
    before = (torch.are_deterministic_algorithms_enabled(),
              torch.is_deterministic_algorithms_warn_only_enabled(),
              torch.utils.deterministic.fill_uninitialized_memory)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = False
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch.utils.deterministic.fill_uninitialized_memory = before[2]


def _records(records: Sequence[MCRecord], config: TrainConfig, gen: torch.Generator
             ) -> Iterator[list[MCRecord]]:
    for idx in batch_order(records, config.batch_size, gen, bucket=config.bucket):
        yield [records[i] for i in idx]


def _ddp(model: MultipleChoiceModel) -> torch.nn.Module:
    """The model in DDP: gradients of the trainable parameters averaged across processes."""
    from torch.nn.parallel import DistributedDataParallel

    dev = model.device
    # init_sync=False: every process built the same seeded model, no need to broadcast a large
    # frozen backbone; buffers are frozen too
    return DistributedDataParallel(model, device_ids=[dev.index] if dev.type == "cuda" else None,
                                   forward_sync_buffers=False, init_sync=False)


def _devices(model: MultipleChoiceModel) -> list[int]:
    dev = model.device
    return [dev.index or 0] if dev.type == "cuda" else []
