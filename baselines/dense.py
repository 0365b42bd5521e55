"""Dense single-adapter baselines (LoRA, DoRA, AdaLoRA) through peft, in the same
`MultipleChoiceModel` as MoE-LoRA so training, forward records and checkpoints are shared.

The adapters go on the same linears as MoE-LoRA's ``target_modules="auto"`` at matching rank
(paper: "a single adapter of matching rank"). The scoring head stays outside the peft model
(a plain trainable ``nn.Linear`` of `MultipleChoiceModel`), so peft only sees the backbone.

AdaLoRA prunes ranks on a schedule that needs the number of training steps: `make_dense` takes
``total_step`` if known, and `baselines.train.train` always re-schedules it to the real number of
steps (`adalora_schedule`) before the first step.
"""
from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from baselines.backbones import Backbone
from baselines.heads import MultipleChoiceModel, prepare_backbone
from uqbench.core.errors import ConfigError

DENSE_KINDS = ("lora", "dora", "adalora")
ADAPTER_NAME = "default"
# placeholder schedule length when the number of steps is not yet known; train() replaces it
_PENDING_STEPS = 1000


def make_dense(backbone: Backbone, kind: str = "lora", rank: int = 8, alpha: float = 16.0,
               dropout: float = 0.05, target_modules: str | Sequence[str] = "auto", *,
               top_layers: int | None = None, mode: str = "auto", head_dropout: float = 0.1,
               seed: int = 0, total_step: int | None = None,
               copy: bool = True) -> MultipleChoiceModel:
    """A dense peft adapter on the backbone, wrapped as a `MultipleChoiceModel`.

    Parameters
    ----------
    backbone : Backbone
    kind : {"lora", "dora", "adalora"}
        DoRA is ``LoraConfig(use_dora=True)``; AdaLoRA starts at rank ``ceil(1.5 * rank)`` and
        prunes to an average of ``rank`` (peft's default 12 -> 8 ratio).
    rank, alpha, dropout : LoRA hyper-parameters (paper: r = 8, dropout 0.05).
    target_modules : "auto" or module-name suffixes; "auto" = MoE-LoRA's targets for this
        architecture (`baselines.moe.resolve_targets`).
    top_layers : int, optional
        Adapt only the targets of the last ``top_layers`` transformer blocks (as MoE-LoRA's
        ``MoELoRAConfig.top_layers``); the stored config lists the resolved module names.
    mode, head_dropout, seed : see `MultipleChoiceModel`; ``seed`` also seeds the adapter init.
    total_step : int, optional
        AdaLoRA schedule length; `baselines.train.train` sets it from the data anyway.
    copy : bool
        Adapt a clone of the backbone (default), leaving ``backbone`` reusable.

    Returns
    -------
    MultipleChoiceModel
        Trainable: the adapter tensors (``lora_A``, ``lora_B``; DoRA ``lora_magnitude_vector``;
        AdaLoRA ``lora_E``) and the scoring head. ``model.peft_model`` is the peft wrapper (for
        AdaLoRA's rank allocator); forward calls the adapted backbone directly.
    """
    from peft import AdaLoraConfig, LoraConfig, get_peft_model

    from baselines.moe import resolve_targets

    if kind not in DENSE_KINDS:
        raise ConfigError(f"dense adapter kind {kind!r} unknown; valid: {', '.join(DENSE_KINDS)}")
    if rank < 1 or not alpha > 0 or not 0.0 <= dropout < 1.0:
        raise ConfigError(f"dense adapter: need rank >= 1, alpha > 0, dropout in [0, 1); got "
                          f"rank={rank}, alpha={alpha}, dropout={dropout}")
    bb = prepare_backbone(backbone, copy)
    targets = list(resolve_targets(bb.model, target_modules if isinstance(target_modules, str)
                                   else tuple(target_modules), top_layers))
    if kind == "adalora":
        steps = int(total_step) if total_step else _PENDING_STEPS
        tinit, tfinal = _adalora_phases(steps)
        # peft types lora_alpha as int; it scales by any number (the ignores below)
        peft_config: Any = AdaLoraConfig(
            init_r=math.ceil(1.5 * rank), target_r=rank,
            lora_alpha=alpha,  # type: ignore[arg-type]
            lora_dropout=dropout,
            target_modules=targets, total_step=steps, tinit=tinit, tfinal=tfinal, deltaT=1)
    else:
        peft_config = LoraConfig(r=rank, lora_alpha=alpha,  # type: ignore[arg-type]
                                 lora_dropout=dropout,
                                 target_modules=targets, use_dora=kind == "dora", bias="none")
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        torch.manual_seed(seed)   # peft initialises lora_A from the global RNG
        # peft 0.21 calls a transformers-5-deprecated alias; not ours to fix
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing",
                                category=FutureWarning)
        peft_model = get_peft_model(bb.model, peft_config, adapter_name=ADAPTER_NAME)
    config = {"rank": rank, "alpha": float(alpha), "dropout": float(dropout),
              "target_modules": targets, "seed": seed}
    if kind == "adalora":
        config["total_step"] = peft_config.total_step
    model = MultipleChoiceModel(bb, mode=mode, head_dropout=head_dropout, seed=seed,
                                adapter={"type": kind, "config": config})
    # a plain attribute, not a submodule: it wraps the very modules of model.backbone
    model.__dict__["peft_model"] = peft_model
    return model


def _adalora_phases(total_step: int) -> tuple[int, int]:
    """(tinit, tfinal): 10% warm-up at full rank, 20% final phase at the pruned ranks."""
    tinit, tfinal = total_step // 10, total_step // 5
    if tinit >= total_step - tfinal:   # tiny runs: prune right away, no final phase
        tinit, tfinal = 0, 0
    return tinit, tfinal


def is_adalora(model: MultipleChoiceModel) -> bool:
    return model.adapter.get("type") == "adalora"


def adalora_schedule(model: MultipleChoiceModel, total_steps: int) -> None:
    """Set AdaLoRA's budget schedule (``total_step``, ``tinit``, ``tfinal``) to the real run."""
    peft: Any = model.peft_model   # set by make_dense, untyped on the module
    cfg = peft.peft_config[ADAPTER_NAME]
    cfg.total_step = int(total_steps)
    cfg.tinit, cfg.tfinal = _adalora_phases(int(total_steps))
    model.adapter["config"]["total_step"] = int(total_steps)


def adalora_orth_loss(model: MultipleChoiceModel) -> Tensor:
    """AdaLoRA's orthogonality regulariser ``w * mean ||P P^T - I||_F``, as peft's forward adds
    it when labels are given (we call the backbone without labels, so add it ourselves)."""
    peft: Any = model.peft_model
    cfg = peft.peft_config[ADAPTER_NAME]
    terms = []
    for name, p in model.backbone.named_parameters():
        if ("lora_A" in name or "lora_B" in name) and ADAPTER_NAME in name and p.requires_grad:
            cov = p @ p.T if "lora_A" in name else p.T @ p                 # (r, r)
            eye = torch.eye(*cov.shape, device=cov.device, dtype=cov.dtype)
            terms.append(torch.linalg.matrix_norm(cov - eye))
    if not terms:
        return torch.zeros((), device=model.device)
    return cfg.orth_reg_weight * torch.stack(terms).mean()


def adalora_update(model: MultipleChoiceModel, global_step: int) -> None:
    """AdaLoRA's importance update and rank masking; after ``optimizer.step()``, before
    ``zero_grad()``."""
    peft: Any = model.peft_model
    peft.base_model.update_and_allocate(global_step)
