"""What an MoE-LoRA adapter is: `MoELoRAConfig`, the variants' layer pieces (`VARIANTS`) and
the target linears per architecture (`AUTO_TARGETS`)."""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from typing import Any

from baselines.gates import DynMoLE, Gate, TopK
from baselines.moe.losses import AuxLoss, hmora_routing, localized_balance, switch, switch_tsallis
from uqbench.core.config import help_field

BERT_TARGETS = ("query", "key", "value", "attention.output.dense", "intermediate.dense",
                "output.dense")


LLAMA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
#: ``target_modules="auto"`` by ``model.config.model_type``.
AUTO_TARGETS: dict[str, tuple[str, ...]] = {
    **{t: BERT_TARGETS for t in ("bert", "roberta", "xlm-roberta", "camembert", "electra")},
    **{t: LLAMA_TARGETS for t in ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2")},
    "mpnet": ("attn.q", "attn.k", "attn.v", "attn.o", "intermediate.dense", "output.dense"),
}


#: ``target_modules="ffn"``: the feed-forward block's linears only (BERT ``intermediate.dense``
#: and the block's ``output.dense``, not ``attention.output.dense``; Llama gate/up/down_proj).
FFN_PATTERN = re.compile(r"(?:^|\.)(?:intermediate\.dense|\d+\.output\.dense|gate_proj|up_proj|"
                         r"down_proj)$")


HMORA_EPSILON = 2.0           # HMoRA: alpha_l = sigmoid(-eps + 2 eps l / (L - 1)) (their default)


@dataclass(frozen=True)
class Variant:
    """The pieces of the one MoE-LoRA layer a variant switches (presets with their papers'
    settings: :mod:`baselines.variants`)."""

    aux_loss: AuxLoss = switch
    #: HydraLoRA: one ``A`` shared by the N ``B`` heads
    shared_a: bool = False
    #: HMoRA: a sequence (task) router mixed with the token router by a depth-dependent weight
    task_router: bool = False
    #: the gate it trains with (and starts with), from ``top_k``
    train_gate: Callable[[int], Gate] = TopK
    #: FlyLoRA: no router; rank-1 experts in :class:`FlyLoRALinear`
    routerless: bool = False


#: ``MoELoRAConfig.variant`` -> what it changes.
VARIANTS: dict[str, Variant] = {
    "moe-lora": Variant(),
    "loramoe": Variant(aux_loss=localized_balance),
    "hydralora": Variant(shared_a=True),
    "mixlora": Variant(),
    "dynmole": Variant(aux_loss=switch_tsallis,
                       train_gate=lambda k: DynMoLE(keep_top_k=k)),
    "hmora": Variant(aux_loss=hmora_routing, task_router=True),
    "flylora": Variant(routerless=True),
}


@dataclass(frozen=True)
class MoELoRAConfig:
    """Hyper-parameters of the MoE-LoRA adapter (paper Appendix "Detailed Experimental Setup")."""
    n_experts: int = help_field("number of LoRA experts N per adapted linear", 16)
    rank: int = help_field("LoRA rank r of each expert", 8)
    alpha: float = help_field("LoRA alpha; the expert mixture is scaled by alpha / rank", 16.0)
    dropout: float = help_field("dropout on the experts' input (also the MC-dropout source)", 0.05)
    target_modules: tuple[str, ...] | str = help_field(
        "'auto' (resolved per architecture: BERT query,key,value,attention.output.dense,"
        "intermediate.dense,output.dense; Llama q/k/v/o_proj,gate/up/down_proj), 'ffn' (the "
        "feed-forward linears only) or module-name suffixes matched on dotted boundaries", "auto")
    top_layers: int | None = help_field(
        "adapt only the target linears of the last top_layers transformer blocks (None: every "
        "block). The blocks below stay frozen and adapter-free, so an encoder head computes them "
        "once per text and reuses them (baselines.heads.PrefixCache)", None)
    top_k: int = help_field("experts per token during training (fixed top-k gate)", 4)
    lb_coef: float = help_field("weight of the load-balancing auxiliary loss in training", 0.01)
    seed: int = help_field("seed of the router and lora_A initialisation", 0)
    variant: str = help_field(f"layer variant, one of {', '.join(VARIANTS)} (baselines.variants)",
                         "moe-lora")

    def __post_init__(self) -> None:
        def bad(name: str, fix: str) -> ValueError:
            return ValueError(f"MoELoRAConfig: {name}={getattr(self, name)!r} is invalid; {fix}")

        if isinstance(self.target_modules, (list, tuple)):
            object.__setattr__(self, "target_modules", tuple(self.target_modules))
            if not self.target_modules or not all(isinstance(t, str) and t
                                                  for t in self.target_modules):
                raise bad("target_modules", "give 'auto' or non-empty module-name suffixes")
        elif not isinstance(self.target_modules, str) or self.target_modules not in ("auto", "ffn"):
            raise bad("target_modules", "give 'auto', 'ffn' or a tuple of module-name suffixes")
        if self.top_layers is not None and (isinstance(self.top_layers, bool)
                                            or not isinstance(self.top_layers, int)
                                            or self.top_layers < 1):
            raise bad("top_layers", "use None (every block) or an integer >= 1")
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
        if self.variant not in VARIANTS:
            raise bad("variant", f"use one of {', '.join(VARIANTS)}")
        if VARIANTS[self.variant].routerless and self.rank != 1:
            raise bad("rank", "FlyLoRA's experts are single ranks: use rank=1 and n_experts = the "
                      "total LoRA rank")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if d["top_layers"] is None:  # an every-block adapter's dict (and cache key) has no entry
            del d["top_layers"]
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
