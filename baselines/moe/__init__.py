"""Mixture-of-LoRA-experts layers: injection into a frozen backbone, swappable gates, per-token
routing statistics and the load-balancing loss.

One adapted linear (paper Eq. "moelora")::

    y = W0 h + scaling * sum_{i in S} p~_i B_i A_i dropout(h),   p = softmax(W_r h),
    p~ = p renormalised over the admitted set S,                  scaling = alpha / rank

computed as one rank-``N*r`` matmul pair: ``z = A_stack dropout(h)`` (T, N*r), ``u = p~ * z``
(zero outside S), ``y = W0 h + scaling * B_stack u``. No (T, N, d) tensor is ever formed. The gate
(:mod:`baselines.gates`) picks S per token and can be swapped at inference (:func:`set_gate`).

CARE's disagreement of a set S (paper Eq. "disagree") is computed from Gram blocks of the
stacked B, ``G = B_stack^T B_stack`` ((N*r, N*r), once per forward)::

    ||e_i||^2 = z_i^T G_ii z_i,   ||e_bar||^2 = u^T G u,   e_i = B_i A_i h (unscaled).

Variants (:data:`VARIANTS`; presets with their papers' settings in :mod:`baselines.variants`)
switch small pieces of this one layer: HydraLoRA shares one ``A`` across the experts (B heads),
HMoRA mixes a token router with a sequence (task) router by a depth-dependent weight, LoRAMoE,
DynMoLE and HMoRA have their own auxiliary losses, DynMoLE its own gate
(:class:`baselines.gates.DynMoLE`). FlyLoRA has no router; it is the separate
:class:`FlyLoRALinear`, injected by the same :func:`inject`.

Usage::

    model = inject(AutoModel.from_pretrained(...), MoELoRAConfig())    # trains with TopK(4)
    set_gate(model, Care(tau=calibrate(model, batches).tau))          # CARE at inference
    record_stats(model, True); set_token_mask(model, attention_mask.bool())
    model(**batch); stats = layer_stats(model)                        # per layer, (B, L) each
"""
from __future__ import annotations

from baselines.moe.config import (
    AUTO_TARGETS,
    BERT_TARGETS,
    FFN_PATTERN,
    HMORA_EPSILON,
    LLAMA_TARGETS,
    VARIANTS,
    MoELoRAConfig,
    Variant,
)
from baselines.moe.inject import (
    forget_aux,
    forward_state_kept,
    get_gates,
    inject,
    layer_stats,
    load_balance_loss,
    moe_layers,
    record_stats,
    resolve_targets,
    set_gate,
    set_token_mask,
    train_gate,
    trainable_parameters,
)
from baselines.moe.layer import (
    FlyLoRALinear,
    MoELoRALinear,
    dropout_scale,
    fast_dropout,
    gram_disagreement,
    trainable_dtype,
)
from baselines.moe.losses import (
    HMORA_GAMMA,
    LORAMOE_GROUPS,
    AuxLoss,
    SwitchLoss,
    hmora_routing,
    hmora_routing_loss,
    lb_parts,
    localized_balance,
    switch,
    switch_tsallis,
    token_mean,
    valid_tokens,
)

__all__ = [
    "AUTO_TARGETS",
    "BERT_TARGETS",
    "FFN_PATTERN",
    "HMORA_EPSILON",
    "HMORA_GAMMA",
    "LLAMA_TARGETS",
    "LORAMOE_GROUPS",
    "VARIANTS",
    "AuxLoss",
    "FlyLoRALinear",
    "MoELoRAConfig",
    "MoELoRALinear",
    "SwitchLoss",
    "Variant",
    "dropout_scale",
    "fast_dropout",
    "forget_aux",
    "forward_state_kept",
    "get_gates",
    "gram_disagreement",
    "hmora_routing",
    "hmora_routing_loss",
    "inject",
    "layer_stats",
    "lb_parts",
    "load_balance_loss",
    "localized_balance",
    "moe_layers",
    "record_stats",
    "resolve_targets",
    "set_gate",
    "set_token_mask",
    "switch",
    "switch_tsallis",
    "token_mean",
    "train_gate",
    "trainable_dtype",
    "trainable_parameters",
    "valid_tokens",
]
