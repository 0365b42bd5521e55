"""The auxiliary losses of the MoE-LoRA variants (Switch load balance, LoRAMoE's localized
balance, DynMoLE's Tsallis term, HMoRA's routing loss) and their masked token means: sums over
the valid tokens, no host sync."""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from baselines.gates import DynMoLE, tsallis_entropy

LORAMOE_GROUPS = 2            # LoRAMoE: experts split into 2 groups for the balancing constraint
HMORA_GAMMA = (0.5, 0.98)     # HMoRA: (certainty, balance) bounds of its routing loss


class Routed(Protocol):
    """What an auxiliary loss reads of its layer (`baselines.moe.layer.MoELoRALinear`)."""

    n_experts: int


#: an auxiliary loss: (layer, router probs (T, N), load-balance parts (f, P), token mask (T,) or
#: None, HMoRA's task-router probs (S, N) or None) -> scalar
AuxLoss = Callable[["Routed", Tensor, tuple[Tensor, Tensor], "Tensor | None",
                    "Tensor | None"], Tensor]


def switch(layer: Routed, probs: Tensor, lb: tuple[Tensor, Tensor],
           valid: Tensor | None, p_task: Tensor | None) -> Tensor:
    """Switch load balance ``N sum_i f_i P_i`` (:func:`load_balance_loss`)."""
    return layer.n_experts * (lb[0] * lb[1]).sum()


def localized_balance(layer: Routed, probs: Tensor, lb: tuple[Tensor, Tensor],
                      valid: Tensor | None, p_task: Tensor | None) -> Tensor:
    """LoRAMoE: the mean over expert groups of ``Var(P_g) / Mean(P_g)^2``."""
    groups = lb[1].chunk(LORAMOE_GROUPS)                                  # P_g per group
    return torch.stack([g.var(unbiased=False) / g.mean().pow(2) for g in groups]).mean()


def switch_tsallis(layer: Routed, probs: Tensor, lb: tuple[Tensor, Tensor],
                   valid: Tensor | None, p_task: Tensor | None) -> Tensor:
    """DynMoLE: Switch plus the mean Tsallis entropy ``S_q(p)`` of the router."""
    tsallis = token_mean(tsallis_entropy(probs, DynMoLE().q), valid)
    return switch(layer, probs, lb, valid, p_task) + tsallis


def hmora_routing(layer: Routed, probs: Tensor, lb: tuple[Tensor, Tensor],
                  valid: Tensor | None, p_task: Tensor | None) -> Tensor:
    """HMoRA's routing loss (:func:`hmora_routing_loss`) on the token and task routers."""
    assert p_task is not None
    return 0.5 * (hmora_routing_loss(probs, valid) + hmora_routing_loss(p_task))


class SwitchLoss(torch.autograd.Function):
    """The mean Switch loss ``N sum_i f_i P_i`` of L layers of one batch (:func:`lb_parts`,
    :func:`switch`: the same sums, bitwise), reduced at once on the layers' (T, N) blocks
    side by side, with its gradient sent straight to each layer's router logits::

        dL/dl_t = c v_t p_t ⊙ (f - <p_t, f>),   c = N / (L * sum_t v_t)
    """

    @staticmethod
    def forward(ctx: Any, probs: Tensor, w: Tensor, valid: Tensor | None, n_layers: int,
                *logits: Tensor) -> Tensor:
        L, N = n_layers, probs.shape[1] // n_layers
        admitted = w.sign()                                                # (T, L*N) 0/1
        if valid is not None:
            admitted = admitted * valid[:, None]
        f = admitted.float().sum(0).view(L, N)          # admitted counts, in float32 as lb_parts
        f = f / f.sum(-1, keepdim=True)                                   # (L, N)
        P = token_mean(probs, valid).view(L, N)                          # (L, N)
        ctx.save_for_backward(probs, f, valid)
        return (N * (f * P).sum(-1)).mean()

    @staticmethod
    def backward(ctx: Any, go: Tensor) -> tuple[Tensor | None, ...]:
        probs, f, valid = ctx.saved_tensors
        (L, N), T = f.shape, probs.shape[0]
        n = T if valid is None else valid.sum()
        cf = f.to(probs.dtype) * (go * N / L / n)                         # (L, N)
        p3 = probs.view(T, L, N)
        g = p3 * (cf - (p3 * cf).sum(-1, keepdim=True))                    # (T, L, N)
        if valid is not None:
            g = g * valid.view(T, 1, 1)
        return (None, None, None, None, *g.view(T, L * N).split(N, dim=1))


def hmora_routing_loss(p: Tensor, valid: Tensor | None = None) -> Tensor:
    """HMoRA's routing auxiliary loss (generalised Jensen-Shannon form), (T, N) -> scalar.

    ``relu((g_b - g_c) log N - (min(H(mean p), g_b log N) - mean max(H(p), g_c log N))) / log N``
    with ``(g_c, g_b) = HMORA_GAMMA``: high entropy of the mean routing (balance) and low
    entropy per token (certainty), each only up to its bound. Means over the tokens where
    ``valid`` (T,) bool is True (all if None).
    """
    n = p.shape[-1]
    hmax = math.log(n) if n > 1 else 1.0
    g_c, g_b = HMORA_GAMMA
    mean = token_mean(p, valid)
    h_mean = (-torch.special.xlogy(mean, mean).sum()).clamp(max=g_b * hmax)
    h_tok = token_mean((-torch.special.xlogy(p, p).sum(-1)).clamp(min=g_c * hmax), valid)
    return F.relu((g_b - g_c) * hmax - (h_mean - h_tok)) / hmax


def valid_tokens(mask: Tensor | None, device: torch.device) -> Tensor | None:
    """A (B, L) token mask as the (T,) bool vector of a layer's flattened tokens."""
    return None if mask is None else mask.to(device).reshape(-1)


def token_mean(x: Tensor, valid: Tensor | None) -> Tensor:
    """Mean of ``x`` (T, ...) over the tokens where ``valid`` (T,) bool is True (all if None).

    A masked sum, not ``x[valid].mean(0)``: boolean indexing sizes its result from the mask's
    count, a device-to-host sync on an accelerator. Equal up to float rounding (the sum adds the
    masked tokens' zeros, which regroups its partial sums: aux losses moved by <= 4e-9); NaN if no
    token is valid.
    """
    if valid is None:
        return x.mean(0)
    v = valid.to(x.dtype)
    return (x * v.view(-1, *(1,) * (x.ndim - 1))).sum(0) / v.sum()


def lb_parts(probs: Tensor, mask: Tensor, valid: Tensor | None) -> tuple[Tensor, Tensor] | None:
    """``f_i`` = share of admitted (token, expert) slots on expert i, ``P_i`` = mean ``p_i``,
    over the valid tokens (None for an input without tokens; NaN if all are masked: the training
    loop rejects the non-finite loss). Masked sums, no host sync (:func:`token_mean`)."""
    if probs.shape[0] == 0:
        return None
    if valid is not None:
        mask = mask & valid[:, None]
    f = mask.float().sum(0)                                               # (N,)
    return f / f.sum(), token_mean(probs, valid)
