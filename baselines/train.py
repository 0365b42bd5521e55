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
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm.auto import tqdm

from baselines import distributed
from baselines.heads import MultipleChoiceModel
from uqbench.core.config import help_field
from uqbench.core.errors import ConfigError, record_fallback
from uqbench.data.records import MCRecord

#: `TrainConfig.compile` values
COMPILE_MODES = ("off", "on", "auto")
#: compiled path: sequence lengths are padded up to a multiple of this (one graph per bucket)
LENGTH_BUCKET = 64
#: the logged loss is read from the device (one host sync) once every this many steps
LOG_EVERY = 16
#: graph path: eager steps of a batch shape before its forward and backward are captured
GRAPH_WARMUP = 2


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
    warmup_ratio: float = help_field(
        "fraction of steps of linear warm-up before cosine decay", 0.06)
    seed: int = help_field("seed of shuffling and dropout", 0)
    grad_clip: float | None = help_field("max global grad norm (None: no clipping)", 1.0)
    bucket: bool = help_field("group similar lengths inside a seeded shuffle (less padding)", True)
    compile: str = help_field(
        "torch.compile each transformer block (regional compilation) with static shapes: "
        "sequence lengths padded up to a multiple of 64 (at most max_length), the last batch "
        "padded to batch_size with masked rows. off | on | auto (on where the model is on "
        "CUDA); off trains exactly as without the option", "off")
    cuda_graph: bool = help_field(
        "replay each step's forward and backward as a CUDA graph, one per batch shape (the "
        "static shapes of compile; the optimizer runs eagerly): the eager step is bound by "
        "launching kernels. CUDA only; one process; not with compile on (auto then means off)",
        False)
    grad_checkpoint: bool = help_field(
        "recompute each transformer block's activations in the backward instead of keeping "
        "them (transformers' gradient checkpointing, non-reentrant, dropout masks redrawn "
        "alike): a step then keeps each block's input and one block's activations, and runs "
        "every block's forward twice. Not with cuda_graph nor compile on (auto then means off)",
        False)

    def __post_init__(self) -> None:
        checks = [
            ("lr", self.lr > 0), ("head_lr", self.head_lr > 0),
            ("weight_decay", self.weight_decay >= 0), ("epochs", self.epochs >= 1),
            ("batch_size", self.batch_size >= 1), ("max_length", self.max_length >= 8),
            ("warmup_ratio", 0 <= self.warmup_ratio < 1),
            ("grad_clip", self.grad_clip is None or self.grad_clip > 0),
            ("compile", self.compile in COMPILE_MODES),
            ("cuda_graph", not (self.cuda_graph and self.compile == "on")),
            ("grad_checkpoint", not (self.grad_checkpoint
                                     and (self.cuda_graph or self.compile == "on"))),
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
    #: the compiled path's log (`TrainConfig.compile`): compiles per epoch, graph breaks,
    #: seconds of the steps that compiled; None when training ran eagerly
    compile: dict[str, object] | None = None
    #: the loss before any update (step 0): `step_zero`'s per-domain and pooled cross-entropy
    #: and accuracy of the untrained model
    initial: dict[str, Any] | None = None
    #: per-domain training curves, one point per read of the log (every `LOG_EVERY` steps and
    #: the last): ``{"steps": [...], "domains": {d: {"loss": [...], "accuracy": [...],
    #: "n": [...]}}}``, each point the mean over the domain's questions in the steps since the
    #: previous point (train mode, the steps' own forwards, before their updates)
    curves: dict[str, Any] | None = None

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
        out = {"steps": self.steps, "seconds": self.seconds, "losses": list(self.losses),
               "aux_losses": list(self.aux_losses),
               "train_accuracy": list(self.train_accuracy), "summary": self.summary()}
        if self.compile is not None:
            out["compile"] = self.compile
        if self.initial is not None:
            out["initial"] = self.initial
        if self.curves is not None:
            out["curves"] = self.curves
        return out


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

    No step waits for the device: the logged values are read every `LOG_EVERY` steps (a
    non-finite loss raises there, naming its step). On CUDA, AdamW is fused and batches are
    copied from pinned memory without blocking. With ``config.compile`` on (`compile_enabled`)
    each transformer block runs ``torch.compile``d: lengths padded to multiples of
    `LENGTH_BUCKET` and the last batch to ``batch_size`` (`static_shapes`), so an epoch after
    the first compiles nothing; its log is `TrainResult.compile`. Losses and gradients equal
    the eager ones within float tolerance (tests/baselines/test_compile.py); off, nothing
    changes. With ``config.cuda_graph`` the step's forward and backward on the same static
    shapes are replayed as CUDA graphs (`GraphSteps`), the optimizer eager.
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

    world = distributed.world()
    graphs = GraphSteps(model.device, world) if config.cuda_graph else None   # or refused
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

    with torch.random.fork_rng(devices=_devices(model)):   # eval mode: it draws nothing
        initial = step_zero(model, records, max_length=config.max_length,
                            batch_size=config.batch_size)
    domains = list(initial["domains"])
    domain_of = {d: i for i, d in enumerate(domains)}
    names = {id(q): n for n, q in model.named_parameters()}
    log = _StepLog(domains, [names.get(id(p), "?") for p in params], setting(model, config, world))
    t0 = time.perf_counter()
    bar = tqdm(total=total, desc="train", disable=not progress or not distributed.is_main(),
               leave=False)
    net = model if world == 1 else _ddp(model)
    compiled = compile_enabled(config, model.device)
    # compiled path: every process's share padded to one row count (static shapes)
    rows = math.ceil(config.batch_size / world)
    compile_log = None
    try:
        with torch.random.fork_rng(devices=_devices(model)), \
                deterministic_training(model.device), \
                compile_context(model, compiled) as compile_log, \
                checkpointed(model, config.grad_checkpoint):
            torch.manual_seed(config.seed)
            gen = torch.Generator().manual_seed(config.seed)
            from transformers import get_cosine_schedule_with_warmup
            # fused: one kernel per step for all parameters, and its step counters on the GPU
            fused: dict[str, Any] = {"fused": True} if all(p.is_cuda for p in params) else {}
            opt = torch.optim.AdamW(groups, weight_decay=config.weight_decay, **fused)
            sched = get_cosine_schedule_with_warmup(
                opt, num_warmup_steps=math.ceil(config.warmup_ratio * total),
                num_training_steps=total)
            model.train()

            def forward_backward(enc: dict[str, Tensor], labels: Tensor, n: int, weight: float,
                                 n_batch: int
                                 ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
                """The step's loss, run backward: (CE, aux loss, right answers, loss, (2, n)
                per-question CE and correctness)."""
                logits = net(enc)                                         # (B, C)
                if len(logits) > n:   # padding rows: no loss, no gradient
                    logits, labels = logits[:n], labels[:n]
                aux = torch.zeros((), device=model.device)
                if model.has_moe and lb_coef > 0:
                    from baselines.moe import load_balance_loss
                    aux = aux + lb_coef * load_balance_loss(model.backbone)
                if dense.is_adalora(model):
                    aux = aux + dense.adalora_orth_loss(model)
                right = weight * (logits.detach().argmax(1) == labels).sum().float()
                # per question, for the per-domain curves (detached: the loss is the above)
                each = torch.stack([per_example_ce(logits.detach(), labels),
                                    (logits.detach().argmax(1) == labels).float()])  # (2, n)
                if world == 1:
                    ce = F.cross_entropy(logits, labels)
                    loss = ce + aux
                else:
                    ce_sum = weight * F.cross_entropy(logits, labels, reduction="sum")
                    loss = ce_sum * (world / n_batch) + weight * aux
                    ce = distributed.all_sum(ce_sum) / n_batch
                    aux = distributed.all_sum(weight * aux) / world
                    right = distributed.all_sum(right)
                loss.backward()
                if model.has_moe:   # no graph outlives its step
                    from baselines.moe import forget_aux
                    forget_aux(model.backbone)
                return ce.detach(), aux.detach(), right, loss.detach(), each

            if graphs is not None:
                graphs.fn = lambda e, y, n: forward_backward(e, y, n, 1.0, n)
            static = compiled or graphs is not None   # static shapes
            step = 0
            for epoch in range(config.epochs):
                for batch_records in _records(records, config, gen):
                    t_step = time.perf_counter()
                    # this process's share of the batch; a process left without one runs an
                    # example at weight 0, so that it still joins the gradient all-reduce
                    mine = batch_records[distributed.rank()::world] or batch_records[:1]
                    weight = 1.0 if distributed.rank() < len(batch_records) else 0.0
                    n = len(mine)
                    if static:   # rows past n repeat real ones, masked out below
                        mine = mine + [mine[i % n] for i in range(rows - n)]
                    enc = model.encode(mine, config.max_length)
                    labels = torch.tensor([r.answer for r in mine])
                    if static:
                        enc = static_shapes(enc, n, _length_cap(model, config.max_length),
                                            _pad_id(model))
                    enc, labels = _to_device(enc, labels, model.device)
                    if graphs is None:
                        ce, aux, right, loss, each = forward_backward(
                            enc, labels, n, weight, len(batch_records))
                    else:
                        ce, aux, right, loss, each = graphs(enc, labels, n)
                    _, dom = _to_device({}, torch.tensor([domain_of[r.domain] for r in mine[:n]]),
                                        model.device)
                    by_domain = torch.zeros(2, len(domains), device=model.device).index_add_(
                        1, dom, each) * weight                                  # (2, D)
                    if world > 1:
                        by_domain = distributed.all_sum(by_domain)
                    norms = grad_norms(params)   # the step's own, before clipping
                    if config.grad_clip is not None:
                        torch.nn.utils.clip_grad_norm_(params, config.grad_clip)
                    opt.step()
                    sched.step()
                    if dense.is_adalora(model):
                        dense.adalora_update(model, step)
                    opt.zero_grad(set_to_none=graphs is None)   # graphs: gradients stay put
                    log.add(ce, aux, right, loss, len(batch_records), by_domain, norms,
                            [sum(r.domain == d for r in batch_records) for d in domains])
                    step += 1
                    if step % LOG_EVERY == 0 or step == total:
                        log.read()
                        bar.set_postfix(loss=f"{log.losses[-1]:.4f}",
                                        acc=f"{log.accuracy[-1]:.2f}", **log.postfix())
                    if compile_log is not None:
                        compile_log.step(epoch, time.perf_counter() - t_step)
                    bar.update(1)
            log.read()
    finally:
        bar.close()
        model.eval()
        if moe_gates is not None:
            from baselines.moe import set_gate
            set_gate(model.backbone, moe_gates)
    ks = [len(r.choices) for r in records]
    return TrainResult(losses=tuple(log.losses), aux_losses=tuple(log.aux_losses),
                       seconds=time.perf_counter() - t0, steps=len(log.losses),
                       train_accuracy=tuple(log.accuracy),
                       compile=compile_log.to_json() if compile_log is not None else None,
                       chance_loss=sum(math.log(k) for k in ks) / len(ks),
                       chance_accuracy=sum(1.0 / k for k in ks) / len(ks),
                       initial=initial, curves=log.curves())


#: `step_zero` scores at most this many training questions of each domain (the first ones)
STEP_ZERO_QUESTIONS = 64


def per_example_ce(logits: Tensor, labels: Tensor) -> Tensor:
    """(B,) cross-entropy of each row, ``-log softmax(logits)[label]`` (float32)."""
    return -F.log_softmax(logits.float(), dim=1).gather(1, labels[:, None]).squeeze(1)


def step_zero(model: MultipleChoiceModel, records: Sequence[MCRecord], *, max_length: int,
              batch_size: int) -> dict[str, Any]:
    """The loss before any update: the model's cross-entropy and accuracy on the first
    `STEP_ZERO_QUESTIONS` training questions of each domain, in eval mode (no dropout),
    under the gate it is set to: ``{"domains": {d: {"loss", "accuracy", "n"}}, "loss",
    "accuracy", "n"}`` (the last three over every question scored). One deterministic pass,
    without gradients; the model's modes are put back after."""
    by: dict[str, list[MCRecord]] = {}
    for r in records:
        if len(by.setdefault(r.domain, [])) < STEP_ZERO_QUESTIONS:
            by[r.domain].append(r)
    flags = {m: m.training for m in model.modules()}
    model.eval()
    out: dict[str, Any] = {"domains": {}}
    tot = torch.zeros(2, dtype=torch.float64)
    try:
        with torch.no_grad():
            for d, recs in by.items():
                sums = torch.zeros(2, dtype=torch.float64)
                for i in range(0, len(recs), batch_size):
                    chunk = recs[i:i + batch_size]
                    logits = model(model.encode(chunk, max_length))[:len(chunk)]
                    labels = torch.tensor([r.answer for r in chunk], device=logits.device)
                    sums += torch.stack([per_example_ce(logits, labels).sum(),
                                         (logits.argmax(1) == labels).sum().float()]).cpu()
                loss, right = sums.tolist()
                out["domains"][d] = {"loss": loss / len(recs), "accuracy": right / len(recs),
                                     "n": len(recs)}
                tot += sums
    finally:
        for m, was in flags.items():
            m.training = was
        if model.has_moe:   # nothing this pass derived reaches training
            from baselines.moe import forget_aux, moe_layers
            forget_aux(model.backbone)
            for layer in moe_layers(model.backbone):
                layer._cache.clear()   # views of the weights made without autograd
    n = sum(v["n"] for v in out["domains"].values())
    out.update(loss=float(tot[0]) / max(n, 1), accuracy=float(tot[1]) / max(n, 1), n=n)
    return out


def grad_norms(params: Sequence[Tensor]) -> Tensor:
    """(P,) float32 L2 norm of each parameter's gradient (0 for one without), on the device:
    a non-finite one is a non-finite gradient (or one too large for float32)."""
    have = [p.grad for p in params if p.grad is not None]
    norms = iter(torch._foreach_norm(have)) if have else iter(())
    zero = torch.zeros((), device=params[0].device)
    return torch.stack([next(norms).float() if p.grad is not None else zero for p in params])


def setting(model: MultipleChoiceModel, config: TrainConfig, world: int) -> str:
    """What a training error names: backbone, adapter, head, dtypes, device and the recipe."""
    trainable = next((p for p in model.parameters() if p.requires_grad), None)
    adapter = model.adapter.get("type", "?")
    variant = (model.adapter.get("config") or {}).get("variant")
    parts = [f"backbone {model.identity.get('name', '?')}",
             f"adapter {adapter}" + (f" ({variant})" if variant and variant != adapter else ""),
             f"head {model.mode}", f"backbone dtype {str(model.backbone.dtype).split('.')[-1]}",
             "adapter dtype " + (str(trainable.dtype).split(".")[-1] if trainable is not None
                                 else "-"),
             f"device {model.device}", f"lr {config.lr:g}", f"head_lr {config.head_lr:g}",
             f"batch_size {config.batch_size}", f"epochs {config.epochs}",
             f"warmup_ratio {config.warmup_ratio:g}", f"grad_clip {config.grad_clip}",
             f"seed {config.seed}", f"max_length {config.max_length}"]
    parts += [k for k, on in (("compile", compile_enabled(config, model.device)),
                              ("cuda_graph", config.cuda_graph),
                              ("grad_checkpoint", config.grad_checkpoint)) if on]
    return ", ".join(parts + ([f"{world} processes"] if world > 1 else []))


class NonFiniteLoss(FloatingPointError):
    """Training stopped: a step's loss or gradients were not finite. ``step`` (0-based) is the
    first such step, ``layers`` the modules whose gradients were non-finite at it, ``setting``
    the training's (`setting`)."""

    def __init__(self, message: str, *, step: int, layers: Sequence[str], setting: str) -> None:
        super().__init__(message)
        self.step, self.layers, self.setting = step, list(layers), setting


def _layer(name: str) -> str:
    """The module holding a parameter (``a.b.lora_A`` -> ``a.b``)."""
    return name.rsplit(".", 1)[0] if "." in name else name


def _listed(names: Sequence[str], at_most: int = 6) -> str:
    return ", ".join(names[:at_most]) + (f" and {len(names) - at_most} more"
                                         if len(names) > at_most else "")


class _StepLog:
    """Per-step cross-entropy, auxiliary loss and train accuracy (and per domain: the summed
    cross-entropy and right answers of its questions; and each parameter's gradient norm),
    kept on the device and read in one go every `LOG_EVERY` steps: reading a device scalar is
    a host sync, which stalls the GPU's queue of kernels once per step. A non-finite loss or
    gradient raises `NonFiniteLoss` at the read after it, naming the step, the layers and the
    setting; each read adds one point to the per-domain curves."""

    def __init__(self, domains: Sequence[str] = (), params: Sequence[str] = (),
                 setting: str = "") -> None:
        self.domains, self.params, self.setting = list(domains), list(params), setting
        self.losses: list[float] = []
        self.aux_losses: list[float] = []
        self.accuracy: list[float] = []
        self.steps: list[int] = []
        self.by_domain: dict[str, dict[str, list[float | None]]] = {
            d: {"loss": [], "accuracy": [], "n": []} for d in self.domains}
        self._pending: list[Tensor] = []
        self._sizes: list[int] = []
        self._counts: list[list[int]] = []
        self._last_norms: list[float] | None = None

    def add(self, ce: Tensor, aux: Tensor, right: Tensor, loss: Tensor, size: int,
            by_domain: Tensor | None = None, norms: Tensor | None = None,
            counts: Sequence[int] = ()) -> None:
        """One step: its CE, aux loss, number of right answers, total loss and batch size; the
        (2, D) per-domain sums of CE and right answers, the (P,) gradient norms and the
        questions of each domain in the batch."""
        # float64 holds each float32 value exactly: the floats read equal float(value)
        parts = [torch.stack([t.detach().double() for t in (ce, aux, right, loss)])]
        if by_domain is not None:
            parts.append(by_domain.detach().double().flatten())
        if norms is not None:
            parts.append(norms.detach().double())
        self._pending.append(torch.cat(parts))
        self._sizes.append(size)
        self._counts.append(list(counts))

    def read(self) -> None:
        if not self._pending:
            return
        rows = torch.stack(self._pending).tolist()                        # one sync
        first, n_dom = len(self.losses), 2 * len(self.domains)
        for i, row in enumerate(rows):
            norms = row[4 + n_dom:]
            bad = [j for j, v in enumerate(norms) if not math.isfinite(v)]
            if not math.isfinite(row[3]) or bad:
                raise self._error(first + i, row[3], bad)
            self._last_norms = norms
        self.losses += [r[0] for r in rows]
        self.aux_losses += [r[1] for r in rows]
        self.accuracy += [r[2] / b for r, b in zip(rows, self._sizes, strict=False)]
        if self.domains:
            sums = [sum(r[4 + k] for r in rows) for k in range(n_dom)]
            self.steps.append(len(self.losses))
            for k, d in enumerate(self.domains):
                n = sum(c[k] for c in self._counts if c)
                curve = self.by_domain[d]
                curve["loss"].append(sums[k] / n if n else None)
                curve["accuracy"].append(sums[len(self.domains) + k] / n if n else None)
                curve["n"].append(n)
        self._pending, self._sizes, self._counts = [], [], []

    def _error(self, step: int, loss: float, bad: Sequence[int]) -> NonFiniteLoss:
        layers = list(dict.fromkeys(_layer(self.params[j]) for j in bad)) if self.params else []
        every = bool(self.params) and len(bad) == len(self.params)
        if not bad:
            where = "its gradients were finite"
        elif every:
            where = f"every trained layer's gradient ({len(layers)} layers) is non-finite with it"
        else:
            where = f"non-finite gradients in {_listed(layers)}"
        msg = (f"train: loss is {loss} at step {step}" if not math.isfinite(loss) else
               f"train: the gradients went non-finite at step {step} (loss {loss:.4g})")
        msg += f"; {where}"
        last = self._last_norms
        if last is not None and self.params and (every or not bad):
            top = sorted(range(len(self.params)), key=lambda j: -last[j])[:3]
            msg += ("; largest gradients at the step before: " + ", ".join(
                f"{_layer(self.params[j])} ({last[j]:.3g})" for j in top))
        msg += (f". Setting: {self.setting}. Training stopped before any model was saved; "
                "lower lr/head_lr or check the inputs")
        return NonFiniteLoss(msg, step=step, layers=layers, setting=self.setting)

    def curves(self) -> dict[str, Any]:
        """`TrainResult.curves`."""
        return {"steps": list(self.steps), "domains": self.by_domain}

    def postfix(self) -> dict[str, str]:
        """The progress bar's per-domain ``loss/accuracy`` of the last read."""
        out = {}
        for d, c in self.by_domain.items():
            loss, acc = c["loss"][-1] if c["loss"] else None, c["accuracy"][-1] if c[
                "accuracy"] else None
            if loss is not None and acc is not None:
                out[d] = f"{loss:.3f}/{acc:.2f}"
        return out


class GraphSteps:
    """The training step's forward and backward replayed as CUDA graphs, one per batch shape
    (`TrainConfig.cuda_graph`; the shapes are `static_shapes`'). A shape's first `GRAPH_WARMUP`
    steps run eagerly on a side stream (capture needs warmed-up kernels and autograd state), the
    next one is captured with its batch copied into static buffers, then replayed; every later
    step of that shape copies its batch into the buffers and replays. The backward accumulates
    into each parameter's own ``.grad``, so gradients are zeroed in place, never set to None;
    clipping, AdamW and the schedule run eagerly after it (a few fused kernels), so the learning
    rate stays a float. The graphs share one memory pool: they never run at once nor read each
    other's outputs (what a replay returns is copied before the next), so their activations
    take the largest shape's step's memory, not the sum."""

    #: the step: (batch, labels, real rows) -> (CE, aux loss, right answers, loss), backward run
    fn: Callable[[dict[str, Tensor], Tensor, int], tuple[Tensor, ...]]

    def __init__(self, device: torch.device, world: int) -> None:
        if world > 1 or device.type != "cuda":
            raise ConfigError(f"train: cuda_graph needs one process with the model on a CUDA "
                              f"device (here {world} process(es), {device}); turn it off")
        self.graphs: dict[tuple[Any, ...], tuple[Any, Any, dict[str, Tensor], Tensor]] = {}
        self.eager: Counter[tuple[Any, ...]] = Counter()
        self.stream = torch.cuda.Stream()
        self.pool = torch.cuda.graph_pool_handle()

    def __call__(self, enc: dict[str, Tensor], labels: Tensor, n: int) -> tuple[Tensor, ...]:
        key = (n, *((k, tuple(v.shape), v.dtype) for k, v in enc.items()))
        if key not in self.graphs and self.eager[key] < GRAPH_WARMUP:
            self.eager[key] += 1
            with self._side_stream():
                return self.fn(enc, labels, n)
        if key not in self.graphs:
            buf, buf_labels = {k: v.clone() for k, v in enc.items()}, labels.clone()
            self.graphs[key] = (*self._capture(lambda: self.fn(buf, buf_labels, n)), buf,
                                buf_labels)
        graph, outs, buf, buf_labels = self.graphs[key]
        for k, v in enc.items():
            buf[k].copy_(v)
        buf_labels.copy_(labels)
        return self._replay(graph, outs)

    @contextmanager
    def _side_stream(self) -> Iterator[None]:
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            yield
        torch.cuda.current_stream().wait_stream(self.stream)

    def _capture(self, fn: Callable[[], tuple[Tensor, ...]]) -> tuple[Any, tuple[Tensor, ...]]:
        """(the graph, its output tensors); capturing runs no kernel."""
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            outs = fn()
        return graph, outs

    def _replay(self, graph: Any, outs: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        graph.replay()
        return outs


def compile_enabled(config: TrainConfig, device: torch.device) -> bool:
    """Whether `train` takes the compiled path: ``compile`` on, or auto on a CUDA device, and
    neither the graph path nor gradient checkpointing (which refuse compile on)."""
    return not config.cuda_graph and not config.grad_checkpoint and (
        config.compile == "on" or (config.compile == "auto" and device.type == "cuda"))


def transformer_blocks(backbone: nn.Module) -> list[nn.Module]:
    """The repeated blocks of a Hugging Face model (the classes its ``_no_split_modules``
    names, held in an ``nn.ModuleList``), in order; [] if it names none."""
    names: set[str] = set()
    for m in backbone.modules():
        names |= set(getattr(m, "_no_split_modules", None) or ())
    return [b for m in backbone.modules() if isinstance(m, nn.ModuleList)
            for b in m if type(b).__name__ in names]


class _CompileLog:
    """What the compiled path did: dynamo's frames compiled (first compiles and recompiles,
    all blocks) per epoch, graph breaks, and the wall time of the steps that compiled (their
    compute included) apart from the others."""

    def __init__(self, blocks: int) -> None:
        from torch._dynamo.utils import counters

        self.counters, self.blocks = counters, blocks
        self.compiles: list[int] = []
        self.compile_s = self.step_s = 0.0
        self.compile_steps = self.steps = 0
        self._seen = self._frames()
        self._breaks = self._graph_breaks()

    def _frames(self) -> int:
        return int(self.counters["frames"]["ok"])

    def _graph_breaks(self) -> int:
        return int(sum(self.counters["graph_break"].values()))

    def step(self, epoch: int, seconds: float) -> None:
        new, self._seen = self._frames() - self._seen, self._frames()
        self.compiles += [0] * (epoch + 1 - len(self.compiles))
        self.compiles[epoch] += new
        if new:
            self.compile_steps, self.compile_s = self.compile_steps + 1, self.compile_s + seconds
        else:
            self.steps, self.step_s = self.steps + 1, self.step_s + seconds

    def to_json(self) -> dict[str, object]:
        return {"blocks": self.blocks, "compiles": sum(self.compiles),
                "compiles_per_epoch": self.compiles,
                "graph_breaks": self._graph_breaks() - self._breaks,
                "compile_steps": self.compile_steps,
                "compile_steps_seconds": self.compile_s,
                "seconds_per_other_step": self.step_s / self.steps if self.steps else None,
                "length_bucket": LENGTH_BUCKET}


@contextmanager
def compile_context(model: MultipleChoiceModel, on: bool) -> Iterator[_CompileLog | None]:
    """Within the block, each transformer block's ``forward`` is ``torch.compile``d (static
    shapes); the eager forwards are restored after (inference passes run eagerly). The MoE-LoRA
    layers take their autograd path while compiled: the hand-written step is an eager
    optimisation (fewer launches) that dynamo would break the graph at, and inductor fuses the
    autograd path's ops itself."""
    if not on:
        yield None
        return
    from baselines.moe import moe_layers

    layers = moe_layers(model.backbone)
    fast = [layer.__dict__.get("fast_path") for layer in layers]  # own settings, if any
    blocks = transformer_blocks(model.backbone)
    if not blocks:
        raise ConfigError(f"train: compile is on but backbone {type(model.backbone).__name__} "
                          "names no transformer block class (_no_split_modules); use "
                          "--compile off")
    import torch._dynamo

    # a forward set on the instance (e.g. accelerate's device-map hooks) is put back after
    before = [b.__dict__.get("forward") for b in blocks]
    for b in blocks:
        b.forward = torch.compile(b.forward, dynamic=False)
    for layer in layers:
        layer.fast_path = False
    try:
        # graphs per length bucket: row counts, the first block's input needing no gradient,
        # batches with and without padding (no attention mask): more than dynamo's default 8
        with torch._dynamo.config.patch(recompile_limit=64):
            yield _CompileLog(len(blocks))
    finally:
        for b, f in zip(blocks, before, strict=False):
            if f is None:
                del b.forward
            else:
                b.forward = f
        for layer, f in zip(layers, fast, strict=False):
            if f is None:
                del layer.fast_path
            else:
                layer.fast_path = f


@contextmanager
def checkpointed(model: MultipleChoiceModel, on: bool) -> Iterator[None]:
    """Within the block, the backbone's transformer blocks recompute their activations in the
    backward (`TrainConfig.grad_checkpoint`); off after it (passes run without gradients)."""
    if not on:
        yield
        return
    bb = model.backbone
    if not getattr(bb, "supports_gradient_checkpointing", False):
        raise ConfigError(f"train: grad_checkpoint is on but {type(bb).__name__} does not support "
                          "gradient checkpointing in transformers; turn it off")
    from baselines.moe import forward_state_kept

    # the recomputed forward keeps the MoE layers' state of the step's own forward
    kw = {"use_reentrant": False,
          "context_fn": lambda: (nullcontext(), forward_state_kept(bb))}
    if hasattr(bb, "activation_checkpointing_enable"):   # its name since transformers 5.x
        bb.activation_checkpointing_enable(activation_checkpointing_kwargs=kw)
    else:
        bb.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kw)
    try:
        yield
    finally:
        getattr(bb, "activation_checkpointing_disable", bb.gradient_checkpointing_disable)()


def static_shapes(batch: dict[str, Tensor], n_real: int, cap: int, pad_id: int
                  ) -> dict[str, Tensor]:
    """The batch of `MultipleChoiceModel.encode` with static shapes for the compiled path.

    Every (rows, L) tensor is right-padded to the next multiple of `LENGTH_BUCKET` (at most
    ``cap``): ``*input_ids`` with ``pad_id``, masks with 0. The rows of the examples from
    ``n_real`` on (copies padding the batch) get all-zero attention masks, so no MoE-LoRA
    statistic or load-balancing loss counts their tokens; the caller drops their logits.
    """
    n_choices = batch["n_choices"]
    ex = torch.arange(n_choices.numel())
    per_option = torch.repeat_interleave(ex, n_choices)
    example_of = {len(ex): ex, len(per_option): per_option,
                  len(ex) + len(per_option): torch.cat([ex, per_option])}
    out = dict(batch)
    for key, t in batch.items():
        if t.dim() != 2:
            continue
        width = max(t.shape[1], min(math.ceil(t.shape[1] / LENGTH_BUCKET) * LENGTH_BUCKET, cap))
        t = F.pad(t, (0, width - t.shape[1]), value=pad_id if key.endswith("input_ids") else 0)
        if key.endswith("attention_mask") and n_real < len(ex):
            t = t.masked_fill((example_of[t.shape[0]] >= n_real)[:, None], 0)
        out[key] = t
    return out


def _length_cap(model: MultipleChoiceModel, max_length: int) -> int:
    """The longest sequence `MultipleChoiceModel.encode` makes for ``max_length``."""
    limit = getattr(model.backbone.config, "max_position_embeddings", None)
    return min(max_length, int(limit)) if limit is not None else max_length


def _pad_id(model: MultipleChoiceModel) -> int:
    pad = getattr(model.tokenizer, "pad_token_id", None)
    return int(pad) if pad is not None else 0


def _to_device(batch: dict[str, Tensor], labels: Tensor, device: torch.device
               ) -> tuple[dict[str, Tensor], Tensor]:
    """On CUDA: the batch and labels copied from pinned memory without blocking the host (the
    model's own ``.to(device)`` calls are then no-ops); elsewhere the batch as it is and the
    labels moved to ``device``."""
    if device.type != "cuda":
        return batch, labels.to(device)
    def move(t):
        return t.pin_memory().to(device, non_blocking=True)
    return {k: move(v) for k, v in batch.items()}, move(labels)


#: the cuBLAS workspace settings under which CUDA matmuls are deterministic
CUBLAS_DETERMINISTIC = (":4096:8", ":16:8")


def deterministic_cublas() -> None:
    """Make this process's CUDA matmuls deterministic while that is still possible: set
    ``CUBLAS_WORKSPACE_CONFIG`` to ``:4096:8`` where a GPU is present, the variable is unset
    and CUDA has not started (cuBLAS and PyTorch read it once, at the first matmul). A value
    already set is kept, and `deterministic_training` records one that is not deterministic.

    ``:4096:8`` rather than ``:16:8``: NVIDIA's cuBLAS guide (Results reproducibility) gives it
    a cost of about 24 MiB of GPU memory, where ``:16:8`` may limit performance; it is also
    PyTorch's default workspace (32 MiB) on Hopper and Blackwell GPUs, and larger than its
    default on older ones, so no matmul loses workspace."""
    if ("CUBLAS_WORKSPACE_CONFIG" not in os.environ and torch.cuda.is_available()
            and not torch.cuda.is_initialized()):
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_DETERMINISTIC[0]


@contextmanager
def deterministic_training(device: torch.device | None = None) -> Iterator[None]:
    """Deterministic algorithms for a training loop, the previous settings restored after.

    ``warn_only``: some CUDA kernels have no deterministic version; CPU ones all do. On CUDA
    (``device``), matmuls are deterministic only when ``CUBLAS_WORKSPACE_CONFIG`` is one of
    `CUBLAS_DETERMINISTIC` before the process first uses cuBLAS (a run sets it:
    `deterministic_cublas`); otherwise PyTorch warns on every cuBLAS call, and run.json
    ``fallbacks`` records that the training was not. Without
    deterministic mode's NaN fill of every new allocation
    (``torch.utils.deterministic.fill_uninitialized_memory``): it is one extra kernel per
    ``torch.empty`` (14k of a SmolLM2 MoE-LoRA step's 55k ops) and changes no value here, as
    every op writes its output before anything reads it (same losses, bit for bit).
    """
    det: Any = torch.utils.deterministic   # its attribute is a module property, untyped
    before = (torch.are_deterministic_algorithms_enabled(),
              torch.is_deterministic_algorithms_warn_only_enabled(),
              det.fill_uninitialized_memory)
    config = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    if device is not None and device.type == "cuda" and config not in CUBLAS_DETERMINISTIC:
        record_fallback("deterministic training", "cuBLAS",
                        f"CUBLAS_WORKSPACE_CONFIG is {config!r}, not one of "
                        f"{' or '.join(CUBLAS_DETERMINISTIC)}: the GPU's matmuls are not "
                        "deterministic; set it before the run for a deterministic training")
    torch.use_deterministic_algorithms(True, warn_only=True)
    det.fill_uninitialized_memory = False
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        det.fill_uninitialized_memory = before[2]


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
