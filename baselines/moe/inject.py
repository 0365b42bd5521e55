"""Model-level functions: inject the layers into a backbone, swap gates, token masks, routing
statistics and the load-balancing loss of the last forward."""
from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from baselines.gates import Gate
from baselines.moe.config import (
    AUTO_TARGETS,
    BERT_TARGETS,
    FFN_PATTERN,
    LLAMA_TARGETS,
    VARIANTS,
    MoELoRAConfig,
)
from baselines.moe.layer import FlyLoRALinear, MoELoRALinear
from baselines.moe.losses import SwitchLoss, valid_tokens


def _matches(name: str, targets: Sequence[str]) -> bool:
    return any(name == t or name.endswith("." + t) for t in targets)


def _linear_names(model: nn.Module) -> list[str]:
    return [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]


def _describe_linears(model: nn.Module) -> str:
    """Linear module names with layer indices collapsed (``encoder.layer.*.attention...``)."""
    seen: dict[str, None] = {}
    for n in _linear_names(model):
        seen[re.sub(r"\.\d+\.", ".*.", n)] = None
    return ", ".join(seen) or "(none)"


def resolve_targets(model: nn.Module, target_modules: tuple[str, ...] | str,
                    top_layers: int | None = None) -> tuple[str, ...]:
    """Module-name suffixes to adapt; ``"auto"`` resolves by ``model.config.model_type``,
    ``"ffn"`` to the full names of the feed-forward linears (:data:`FFN_PATTERN`). With
    ``top_layers``: the full names of the matching linears in the last ``top_layers`` transformer
    blocks (``config.num_hidden_layers``, else the largest block index + 1)."""
    if top_layers is not None:
        targets = resolve_targets(model, target_modules)
        names = [n for n in _linear_names(model) if _matches(n, targets)]
        n_blocks = int(getattr(getattr(model, "config", None), "num_hidden_layers", 0)
                       or max((_block_index(n) for n in names), default=0) + 1)
        if not 1 <= top_layers <= n_blocks:
            from uqbench.core.errors import ConfigError
            raise ConfigError(f"top_layers={top_layers} is out of range: this model has "
                              f"{n_blocks} transformer blocks; valid: 1..{n_blocks} (or None)")
        return tuple(n for n in names if _block_index(n) >= n_blocks - top_layers)
    if target_modules == "ffn":
        return tuple(n for n in _linear_names(model) if FFN_PATTERN.search(n))
    if target_modules != "auto":
        return tuple(target_modules)
    mtype = getattr(getattr(model, "config", None), "model_type", None)
    if mtype in AUTO_TARGETS:
        return AUTO_TARGETS[mtype]
    names = _linear_names(model)
    for cand in (LLAMA_TARGETS, BERT_TARGETS):
        if any(_matches(n, cand[:1]) for n in names):
            return cand
    from uqbench.core.errors import ConfigError  # a ValueError the CLI reports without traceback

    raise ConfigError(f"no known MoE-LoRA target modules for architecture model_type={mtype!r}; "
                      f"its Linear modules are: {_describe_linears(model)}. Pass "
                      "MoELoRAConfig(target_modules=(...)) with suffixes of some of them, or "
                      f"register them in a --plugin module: baselines.moe.AUTO_TARGETS[{mtype!r}]"
                      " = ('q_proj', ...)")


def inject(model: nn.Module, config: MoELoRAConfig) -> nn.Module:
    """Wrap the target linears of ``model`` in :class:`MoELoRALinear` (FlyLoRA:
    :class:`FlyLoRALinear`), in place.

    Freezes every backbone parameter; only the experts (``lora_A``, ``lora_B``) and routers are
    trainable (FlyLoRA: ``lora_B`` only). Layers start with the variant's :func:`train_gate` and in
    the train/eval mode of the linear they wrap. The config is kept as
    ``model.moe_lora_config``. Raises ``ValueError`` if the targets match no ``nn.Linear`` (the
    message lists the model's Linear modules) or if the model is already injected.
    """
    if moe_layers(model) or any(isinstance(m, FlyLoRALinear) for m in model.modules()):
        raise ValueError("inject: model already has MoE-LoRA layers; inject into a fresh backbone")
    targets = resolve_targets(model, config.target_modules, config.top_layers)
    names = [n for n in _linear_names(model) if _matches(n, targets)]
    if not names:
        raise ValueError(f"inject: target_modules={targets or config.target_modules!r} match no "
                         f"nn.Linear of "
                         f"{type(model).__name__}; its Linear modules are: "
                         f"{_describe_linears(model)}")
    for p in model.parameters():
        p.requires_grad_(False)
    gen = torch.Generator().manual_seed(config.seed)
    blocks = [_block_index(n) for n in names]
    for name, block in zip(names, blocks, strict=False):
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        layer: nn.Module
        if VARIANTS[config.variant].routerless:
            layer = FlyLoRALinear(getattr(parent, attr), n_experts=config.n_experts,
                                  top_k=config.top_k, alpha=config.alpha, dropout=config.dropout,
                                  generator=gen)
        else:
            layer = MoELoRALinear(getattr(parent, attr), n_experts=config.n_experts,
                                  rank=config.rank, alpha=config.alpha, dropout=config.dropout,
                                  gate=train_gate(config), generator=gen, variant=config.variant,
                                  depth=block / max(1, max(blocks)))
        layer.train(getattr(parent, attr).training)   # keep the wrapped layer's mode
        setattr(parent, attr, layer)
    model.moe_lora_config = config  # type: ignore[assignment]
    return model


def train_gate(config: MoELoRAConfig) -> Gate:
    """The gate a variant trains with (and starts with): ``TopK(top_k)``, or for DynMoLE its
    hybrid gate keeping at least ``top_k`` experts."""
    return VARIANTS[config.variant].train_gate(config.top_k)


def _block_index(name: str) -> int:
    """Transformer block of a module name (first ``.<int>.`` component; 0 if none)."""
    m = re.search(r"\.(\d+)\.", f".{name}.")
    return int(m.group(1)) if m else 0


def moe_layers(model: nn.Module) -> list[MoELoRALinear]:
    """The model's MoE-LoRA layers in module order (front to back for HF backbones)."""
    return [m for m in model.modules() if isinstance(m, MoELoRALinear)]


def _layers_or_raise(model: nn.Module, who: str) -> list[MoELoRALinear]:
    layers = moe_layers(model)
    if not layers:
        raise ValueError(f"{who}: {type(model).__name__} has no MoE-LoRA layers; call "
                         "inject(model, MoELoRAConfig(...)) first")
    return layers


def set_gate(model: nn.Module, gate: Gate | Sequence[Gate]) -> None:
    """Swap the gate of every MoE layer (no retraining): one gate for all, or one per layer.

    Each gate is validated against its layer's ``N`` (``k > N`` raises ``ValueError``).
    """
    layers = _layers_or_raise(model, "set_gate")
    gates = list(gate) if isinstance(gate, Sequence) else [gate] * len(layers)
    if len(gates) != len(layers):
        raise ValueError(f"set_gate: got {len(gates)} gates for {len(layers)} MoE layers; give "
                         "one gate, or exactly one per layer (in moe_layers(model) order)")
    for g, layer in zip(gates, layers, strict=False):
        g.validate(layer.n_experts)
    for g, layer in zip(gates, layers, strict=False):
        layer.gate = g


def get_gates(model: nn.Module) -> list[Gate]:
    return [layer.gate for layer in _layers_or_raise(model, "get_gates")]


def set_token_mask(model: nn.Module, mask: Tensor | None) -> None:
    """(B, L) bool, True = real token; excluded tokens count in no stats, LB loss or budget."""
    if mask is not None:
        mask = mask.bool()
    for layer in _layers_or_raise(model, "set_token_mask"):
        layer.token_mask = mask


def record_stats(model: nn.Module, on: bool) -> None:
    """When on, each layer keeps the per-token stats of its most recent forward."""
    for layer in _layers_or_raise(model, "record_stats"):
        layer.record = on
        layer.last_stats = None


def layer_stats(model: nn.Module) -> list[dict[str, Tensor]]:
    """Per MoE layer, from the last forward: ``entropy`` (``H(p)/log N``), ``top1`` (``p_(1)``),
    ``disagreement`` (``D`` of the admitted set; CARE: of its nucleus set, as in Algorithm 1),
    ``k`` (experts used); each float32 of the input's leading shape (B, L), 0 at masked tokens.
    """
    out = []
    for i, layer in enumerate(_layers_or_raise(model, "layer_stats")):
        if layer.last_stats is None:
            raise ValueError(f"layer_stats: MoE layer {i} has no stats from its last forward; call "
                             "record_stats(model, True) before the forward")
        out.append(layer.last_stats)
    return out


def forget_aux(model: nn.Module) -> None:
    """Drop each layer's auxiliary-loss inputs of the last forward, once its loss has run
    backward: kept, they hold that step's autograd graph, whose gradient accumulators run on the
    CUDA stream that made them (a CUDA graph capture of the next step fails on that)."""
    for layer in _layers_or_raise(model, "forget_aux"):
        layer.last_aux = None


@contextmanager
def forward_state_kept(model: nn.Module) -> Iterator[None]:
    """Within the block, a forward leaves each MoE layer's state of the last forward (its
    auxiliary-loss inputs, its router statistics) as it was: the recompute context of gradient
    checkpointing, whose forward runs again in the backward. Kept, the recomputed state would
    hold each recomputed block's autograd graph until the step ends, and with it the
    activations the checkpoint frees."""
    layers = moe_layers(model)
    saved = [m.forward_state for m in layers]
    try:
        yield
    finally:
        for m, state in zip(layers, saved, strict=False):
            m.forward_state = state


def load_balance_loss(model: nn.Module) -> Tensor:
    """Auxiliary (load-balancing) loss of the last forward, averaged over MoE layers.

    MoE-LoRA (and MixLoRA, HydraLoRA): per layer the Switch loss ``N * sum_i f_i P_i`` with
    ``f_i`` the share of admitted (token, expert) slots routed to expert i (so ``sum f = 1`` for
    any k) and ``P_i`` the mean router probability of expert i, both over non-masked tokens.
    Equals 1 under perfectly uniform routing; gradients flow through ``P`` only. LoRAMoE, DynMoLE
    and HMoRA use their own (``MoELoRALinear.aux_loss``).
    """
    layers = _layers_or_raise(model, "load_balance_loss")
    fused = _switch_fused(layers)
    if fused is not None:
        return fused
    terms = [layer.last_aux for layer in layers if layer.last_aux is not None]
    if not terms:
        raise ValueError("load_balance_loss: no forward has run since injection (or its input "
                         "had no tokens); run a forward first")
    return torch.stack(terms).mean()


def _switch_fused(layers: list[MoELoRALinear]) -> Tensor | None:
    """The mean Switch loss of layers whose last forward took :class:`TopKStep` on one batch
    (:class:`SwitchLoss`; None if they did not)."""
    pending = [layer._fast_aux for layer in layers]
    first = pending[0]
    if first is None or any(a is None or a[1].shape != first[1].shape or a[3] is not first[3]
                            for a in pending):
        return None
    ready = [a for a in pending if a is not None]   # all of them, as checked above
    probs = torch.cat([a[1].detach() for a in ready], 1)                 # (T, L*N)
    w = torch.cat([a[2] for a in ready], 1)                              # (T, L*N)
    return SwitchLoss.apply(probs, w, valid_tokens(first[3], probs.device), len(layers),
                             *(a[0] for a in ready))


def trainable_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
