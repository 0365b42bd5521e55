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

Usage::

    model = inject(AutoModel.from_pretrained(...), MoELoRAConfig())    # trains with TopK(4)
    set_gate(model, Care(tau=calibrate(model, batches).tau))          # CARE at inference
    record_stats(model, True); set_token_mask(model, attention_mask.bool())
    model(**batch); stats = layer_stats(model)                        # per layer, (B, L) each
"""
from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from baselines.gates import EPS, Gate, TopK, normalized_entropy

BERT_TARGETS = ("query", "key", "value", "attention.output.dense", "intermediate.dense",
                "output.dense")
LLAMA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
#: ``target_modules="auto"`` by ``model.config.model_type``.
AUTO_TARGETS: dict[str, tuple[str, ...]] = {
    **{t: BERT_TARGETS for t in ("bert", "roberta", "xlm-roberta", "camembert", "electra")},
    **{t: LLAMA_TARGETS for t in ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2")},
}


def _help(text: str, default: Any) -> Any:
    return field(default=default, metadata={"help": text})


@dataclass(frozen=True)
class MoELoRAConfig:
    """Hyper-parameters of the MoE-LoRA adapter (paper Appendix "Detailed Experimental Setup")."""
    n_experts: int = _help("number of LoRA experts N per adapted linear", 16)
    rank: int = _help("LoRA rank r of each expert", 8)
    alpha: float = _help("LoRA alpha; the expert mixture is scaled by alpha / rank", 16.0)
    dropout: float = _help("dropout on the experts' input (also the MC-dropout source)", 0.05)
    target_modules: tuple[str, ...] | str = _help(
        "'auto' (resolved per architecture: BERT query,key,value,attention.output.dense,"
        "intermediate.dense,output.dense; Llama q/k/v/o_proj,gate/up/down_proj) or module-name "
        "suffixes matched on dotted boundaries", "auto")
    top_k: int = _help("experts per token during training (fixed top-k gate)", 4)
    lb_coef: float = _help("weight of the load-balancing auxiliary loss in training", 0.01)
    seed: int = _help("seed of the router and lora_A initialisation", 0)

    def __post_init__(self) -> None:
        def bad(name: str, fix: str) -> ValueError:
            return ValueError(f"MoELoRAConfig: {name}={getattr(self, name)!r} is invalid; {fix}")

        if isinstance(self.target_modules, (list, tuple)):
            object.__setattr__(self, "target_modules", tuple(self.target_modules))
            if not self.target_modules or not all(isinstance(t, str) and t
                                                  for t in self.target_modules):
                raise bad("target_modules", "give 'auto' or non-empty module-name suffixes")
        elif not isinstance(self.target_modules, str) or self.target_modules != "auto":
            raise bad("target_modules", "give 'auto' or a tuple of module-name suffixes")
        if self.n_experts < 1:
            raise bad("n_experts", "use n_experts >= 1")
        if self.rank < 1:
            raise bad("rank", "use rank >= 1")
        if not self.alpha > 0:
            raise bad("alpha", "use alpha > 0")
        if not 0.0 <= self.dropout < 1.0:
            raise bad("dropout", "use dropout in [0, 1)")
        if not 1 <= self.top_k <= self.n_experts:
            raise bad("top_k", f"use 1 <= top_k <= n_experts={self.n_experts}")
        if not self.lb_coef >= 0:
            raise bad("lb_coef", "use lb_coef >= 0")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if isinstance(d["target_modules"], tuple):
            d["target_modules"] = list(d["target_modules"])
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MoELoRAConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"MoELoRAConfig.from_dict: unknown keys {sorted(unknown)}; "
                             f"valid: {sorted(known)}")
        return cls(**d)


def gram_disagreement(weights: Tensor, z: Tensor, gram: Tensor, *, eps: float = EPS) -> Tensor:
    """Disagreement ``D`` from Gram blocks, equal to :func:`baselines.gates.disagreement`.

    With ``e_i = B_i z_i`` and ``G = B_stack^T B_stack``: ``||e_i||^2 = z_i^T G_ii z_i`` and
    ``||sum_i p~_i e_i||^2 = u^T G u``, ``u = (p~_i z_i)_i``. Cost O(T (N r)^2), no (T, N, d).

    Parameters
    ----------
    weights : (T, N) zero outside the admitted set (renormalised here).
    z : (T, N, r) expert codes ``A_i h``.
    gram : (N*r, N*r) ``B_stack^T B_stack``.
    """
    T, N, r = z.shape
    p = weights / weights.sum(-1, keepdim=True)                           # (T, N)
    blocks = torch.diagonal(gram.view(N, r, N, r), dim1=0, dim2=2).permute(2, 0, 1)  # (N, r, r)
    zt = z.transpose(0, 1)                                                # (N, T, r)
    e2 = (torch.bmm(zt, blocks) * zt).sum(-1).T                          # (T, N) ||e_i||^2
    m2 = (p * e2).sum(-1)                                                 # (T,)
    u = (p[:, :, None] * z).reshape(T, N * r)                             # (T, N*r)
    mean2 = ((u @ gram) * u).sum(-1)                                      # (T,) ||e_bar||^2
    return ((m2 - mean2) / (m2 + eps)).clamp(0.0, 1.0)


class _Probe:
    """``mask -> D`` for one forward; the Gram matrix is fetched only if a D is asked for."""

    def __init__(self, layer: MoELoRALinear, probs: Tensor, z: Tensor) -> None:
        self.layer, self.probs, self.z = layer, probs, z

    def __call__(self, mask: Tensor) -> Tensor:
        gram = self.layer.gram(self.z.dtype)                              # (N*r, N*r)
        return gram_disagreement(self.probs * mask, self.z, gram)


class MoELoRALinear(nn.Module):
    """``base_layer`` (frozen) plus N gated LoRA experts; see the module docstring.

    Parameters: ``router`` (nn.Linear d -> N, no bias), ``lora_A`` (N, r, d) with peft's
    kaiming-uniform init, ``lora_B`` (N, d_out, r) zero-initialised, so a fresh layer equals its
    base layer exactly. ``dropout`` is a real ``nn.Dropout`` on the experts' input.
    """

    def __init__(self, base_layer: nn.Linear, *, n_experts: int = 16, rank: int = 8,
                 alpha: float = 16.0, dropout: float = 0.05, gate: Gate | None = None,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.base_layer = base_layer
        self.in_features, self.out_features = base_layer.in_features, base_layer.out_features
        self.n_experts, self.rank, self.scaling = n_experts, rank, alpha / rank
        w = base_layer.weight
        kw = {"device": w.device, "dtype": w.dtype}
        self.router = nn.Linear(self.in_features, n_experts, bias=False, **kw)
        self.lora_A = nn.Parameter(torch.empty(n_experts, rank, self.in_features, **kw))
        self.lora_B = nn.Parameter(torch.zeros(n_experts, self.out_features, rank, **kw))
        self.dropout = nn.Dropout(dropout)
        bound = 1.0 / math.sqrt(self.in_features)  # nn.Linear / peft kaiming_uniform(a=sqrt(5))
        with torch.no_grad():
            for p in (self.router.weight, self.lora_A):
                p.copy_(torch.empty(p.shape).uniform_(-bound, bound, generator=generator))
        self.gate: Gate = gate if gate is not None else TopK(min(4, n_experts))
        self.gate.validate(n_experts)
        self.record = False
        self.token_mask: Tensor | None = None      # (B, L) bool, True = real token
        self.last_stats: dict[str, Tensor] | None = None
        self._lb: tuple[Tensor, Tensor] | None = None   # (f, P) of the last forward
        self._gram: tuple[tuple[Any, ...], Tensor] | None = None

    def extra_repr(self) -> str:
        return (f"in={self.in_features}, out={self.out_features}, n_experts={self.n_experts}, "
                f"rank={self.rank}, scaling={self.scaling:g}, gate={self.gate}")

    def b_stack(self) -> Tensor:
        """(d_out, N*r): column ``i*r + j`` is ``lora_B[i, :, j]``."""
        N, O, r = self.lora_B.shape
        return self.lora_B.permute(1, 0, 2).reshape(O, N * r)

    @torch.no_grad()
    def gram(self, dtype: torch.dtype) -> Tensor:
        """``B_stack^T B_stack`` (N*r, N*r), cached until ``lora_B`` changes (in-place updates
        by an optimiser or ``load_state_dict`` bump its version counter)."""
        key = (self.lora_B._version, self.lora_B.data_ptr(), self.lora_B.device, dtype)
        if self._gram is None or self._gram[0] != key:
            b = self.b_stack().to(dtype)                                  # (O, N*r)
            self._gram = (key, b.T @ b)
        return self._gram[1]

    def forward(self, x: Tensor) -> Tensor:
        lead = x.shape[:-1]
        N, r = self.n_experts, self.rank
        y = self.base_layer(x)                                            # (*, O)
        h = x.reshape(-1, self.in_features)                               # (T, E)
        T = h.shape[0]
        cdt = torch.promote_types(x.dtype, torch.float32)   # routing maths in >= float32
        probs = F.softmax(self.router(h).to(cdt), dim=-1)                 # (T, N)
        z = F.linear(self.dropout(h), self.lora_A.reshape(N * r, -1))     # (T, N*r)
        b_stack = self.b_stack()                                          # (O, N*r)

        with torch.no_grad():
            probe = _Probe(self, probs.detach().to(cdt), z.detach().view(T, N, r).to(cdt))
            sel = self.gate.select(probe.probs, probe)                    # mask (T, N)
            valid = None
            if self.token_mask is not None:
                if self.token_mask.shape != lead:
                    raise ValueError(f"token mask of shape {tuple(self.token_mask.shape)} does not "
                                     f"match this input's {tuple(lead)}: call set_token_mask(model, "
                                     "mask) with the current batch's mask, or None")
                valid = self.token_mask.to(x.device).reshape(-1)          # (T,)

        w = probs * sel.mask                                              # (T, N)
        w = w * (self.scaling / w.sum(-1, keepdim=True))                  # scaling * p~
        u = (w.to(z.dtype).unsqueeze(-1) * z.view(T, N, r)).reshape(T, N * r)  # (T, N*r)
        y = torch.addmm(y.reshape(T, self.out_features), u, b_stack.T)   # (T, O)
        y = y.view(*lead, self.out_features)

        self._lb = _lb_parts(probs, sel.mask, valid)
        if self.record:
            with torch.no_grad():
                d = sel.disagreement if sel.disagreement is not None else probe(sel.d_mask)
                stats = {"entropy": normalized_entropy(probe.probs),
                         "top1": probe.probs.max(-1).values,
                         "disagreement": d,
                         "k": sel.k.to(cdt)}
                keep = valid.to(cdt) if valid is not None else None
                self.last_stats = {key: (v * keep if keep is not None else v).float().view(lead)
                                   for key, v in stats.items()}
        else:
            self.last_stats = None
        return y


def _lb_parts(probs: Tensor, mask: Tensor, valid: Tensor | None) -> tuple[Tensor, Tensor] | None:
    """``f_i`` = share of admitted (token, expert) slots on expert i, ``P_i`` = mean ``p_i``."""
    if valid is not None:
        probs, mask = probs[valid], mask[valid]
    if probs.shape[0] == 0:
        return None
    f = mask.float().sum(0)                                               # (N,)
    return f / f.sum(), probs.mean(0)


# --------------------------------------------------------------------------------------------
# model-level functions
# --------------------------------------------------------------------------------------------


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


def resolve_targets(model: nn.Module, target_modules: tuple[str, ...] | str) -> tuple[str, ...]:
    """Module-name suffixes to adapt; ``"auto"`` resolves by ``model.config.model_type``."""
    if target_modules != "auto":
        return tuple(target_modules)
    mtype = getattr(getattr(model, "config", None), "model_type", None)
    if mtype in AUTO_TARGETS:
        return AUTO_TARGETS[mtype]
    names = _linear_names(model)
    for cand in (LLAMA_TARGETS, BERT_TARGETS):
        if any(_matches(n, cand[:1]) for n in names):
            return cand
    raise ValueError(f"target_modules='auto' cannot be resolved for model_type={mtype!r}; pass "
                     f"MoELoRAConfig(target_modules=(...)) with suffixes of these Linear modules: "
                     f"{_describe_linears(model)}")


def inject(model: nn.Module, config: MoELoRAConfig) -> nn.Module:
    """Wrap the target linears of ``model`` in :class:`MoELoRALinear`, in place.

    Freezes every backbone parameter; only the experts (``lora_A``, ``lora_B``) and routers are
    trainable. Layers start with the ``TopK(config.top_k)`` gate. The config is kept as
    ``model.moe_lora_config``. Raises ``ValueError`` if the targets match no ``nn.Linear`` (the
    message lists the model's Linear modules) or if the model is already injected.
    """
    if moe_layers(model):
        raise ValueError("inject: model already has MoE-LoRA layers; inject into a fresh backbone")
    targets = resolve_targets(model, config.target_modules)
    names = [n for n in _linear_names(model) if _matches(n, targets)]
    if not names:
        raise ValueError(f"inject: target_modules={targets} match no nn.Linear of "
                         f"{type(model).__name__}; its Linear modules are: "
                         f"{_describe_linears(model)}")
    for p in model.parameters():
        p.requires_grad_(False)
    gen = torch.Generator().manual_seed(config.seed)
    for name in names:
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        layer = MoELoRALinear(getattr(parent, attr), n_experts=config.n_experts, rank=config.rank,
                              alpha=config.alpha, dropout=config.dropout,
                              gate=TopK(config.top_k), generator=gen)
        setattr(parent, attr, layer)
    model.moe_lora_config = config  # type: ignore[assignment]
    return model


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
    for g, layer in zip(gates, layers):
        g.validate(layer.n_experts)
    for g, layer in zip(gates, layers):
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


def load_balance_loss(model: nn.Module) -> Tensor:
    """Switch-style auxiliary loss of the last forward, averaged over MoE layers.

    Per layer ``N * sum_i f_i P_i`` with ``f_i`` the share of admitted (token, expert) slots
    routed to expert i (so ``sum f = 1`` for any k) and ``P_i`` the mean router probability of
    expert i, both over non-masked tokens. Equals 1 under perfectly uniform routing; gradients
    flow through ``P`` only.
    """
    layers = _layers_or_raise(model, "load_balance_loss")
    terms = [layer.n_experts * (layer._lb[0] * layer._lb[1]).sum()
             for layer in layers if layer._lb is not None]
    if not terms:
        raise ValueError("load_balance_loss: no forward has run since injection (or every token "
                         "was masked); run a forward first")
    return torch.stack(terms).mean()


def trainable_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
