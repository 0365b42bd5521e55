"""The seed's MoE-LoRA baselines as configurations of the one MoE-LoRA layer (`baselines.moe`).

Each preset is a `MoELoRAConfig` whose ``variant`` switches the few pieces that define the
method (shared A, task router, auxiliary loss, gate); everything else (injection, dropout,
routing statistics, CARE, checkpoints, `baselines.train.train`) is shared. All router variants
use N = 8 experts, so CARE (``k_max = 8``) can replace their gate at inference.

=============  ================  ========  =====================  =================================
variant        targets           experts   training gate          auxiliary loss (x ``lb_coef``)
=============  ================  ========  =====================  =================================
``loramoe``    FFN only          8 x r8    soft (all 8)           localized balancing (2 groups)
``hydralora``  all linears       8 B, 1 A  soft (all 8)           none
``mixlora``    FFN only          8 x r8    top-2                  Switch load balance
``dynmole``    FFN only          8 x r8    top-p / all if S_q>th  Switch + Tsallis entropy
``hmora``      all linears       8 x r8    top-2 of token+task    HMoRA routing (GJS) loss
``flylora``    all linears       32 x r1   implicit top-8 |A h|   none (no router)
=============  ================  ========  =====================  =================================

Example
-------
>>> model = make_moe(load_backbone("minilm"), variant_config("mixlora"))   # doctest: +SKIP
"""
from __future__ import annotations

from collections.abc import Callable

from baselines.moe import MoELoRAConfig
from uqbench.core.errors import ConfigError


def loramoe(seed: int = 0) -> MoELoRAConfig:
    """LoRAMoE (Dou et al., 2023, "LoRAMoE: Alleviate World Knowledge Forgetting in Large
    Language Models via MoE-Style Plugin"): LoRA experts on the FFN layers only, a softmax router
    over all of them (dense mixture), and the localized balancing constraint: experts split into
    groups, the importance variation penalised within each group.

    Simplification: the paper weights importance by whether a sample's type matches the group
    (``1 +- delta``); uqbench's records carry no such type, so the loss is ``Var/Mean^2`` of the
    mean router probability within each of the 2 groups (scale-free), averaged over groups.
    """
    return MoELoRAConfig(n_experts=8, rank=8, alpha=16.0, target_modules="ffn", top_k=8,
                         lb_coef=0.01, seed=seed, variant="loramoe")


def hydralora(seed: int = 0) -> MoELoRAConfig:
    """HydraLoRA (Tian et al., NeurIPS 2024, "HydraLoRA: An Asymmetric LoRA Architecture for
    Efficient Fine-Tuning"): one shared ``A`` per adapted linear and N ``B`` heads mixed by a
    softmax router (all heads weighted; no balancing loss).

    Simplification: N = 8 heads fixed (the paper picks N by k-means on the training data).
    """
    return MoELoRAConfig(n_experts=8, rank=8, alpha=16.0, target_modules="auto", top_k=8,
                         lb_coef=0.0, seed=seed, variant="hydralora")


def mixlora(seed: int = 0) -> MoELoRAConfig:
    """MixLoRA (Li et al., 2024, "MixLoRA: Enhancing Large Language Models Fine-Tuning with
    LoRA-based Mixture of Experts"): 8 LoRA experts on the frozen FFN, top-2 routing, Switch
    auxiliary load-balance loss with coefficient 0.01.

    Simplifications: one router per adapted linear (MixLoRA shares one per FFN block); the
    plain LoRA that MixLoRA adds to attention layers is not added. Loading MixLoRA's own
    checkpoints (``peft_type: MIXLORA``) is not supported.
    """
    return MoELoRAConfig(n_experts=8, rank=8, alpha=16.0, target_modules="ffn", top_k=2,
                         lb_coef=0.01, seed=seed, variant="mixlora")


def dynmole(seed: int = 0) -> MoELoRAConfig:
    """DynMoLE (2025, "DynMoLE: Boosting Mixture of LoRA Experts Fine-Tuning with a Hybrid
    Routing Mechanism"): hybrid routing by the router's Tsallis entropy
    (`baselines.gates.DynMoLE`: top-p with at least ``top_k = 2`` experts, every expert when
    ``S_q(p) > 0.9``, q = 1.1) and an auxiliary loss of Switch load balance plus the mean
    Tsallis entropy, on MixLoRA-style FFN experts.

    Simplifications: the admitted weights are renormalised over the admitted set (as every gate
    of this layer does); both loss terms share ``lb_coef``.
    """
    return MoELoRAConfig(n_experts=8, rank=8, alpha=16.0, target_modules="ffn", top_k=2,
                         lb_coef=0.01, seed=seed, variant="dynmole")


def hmora(seed: int = 0) -> MoELoRAConfig:
    """HMoRA (Liao et al., ICLR 2025, "HMoRA: Making LLMs More Effective with Hierarchical
    Mixture of LoRA Experts"): hierarchical hybrid routing ``p = (1 - a_l) p_token + a_l p_task``
    with ``a_l = sigmoid(-2 + 4 l / (L - 1))`` (learnable; token-level in shallow layers,
    task-level in deep ones), top-2 admission, and HMoRA's routing loss (balance of the mean
    routing, certainty per token) on both routers.

    Simplification: the task router reads the masked mean of the layer's input over the
    sequence (HMoRA feeds a separate task representation).
    """
    return MoELoRAConfig(n_experts=8, rank=8, alpha=16.0, target_modules="auto", top_k=2,
                         lb_coef=0.01, seed=seed, variant="hmora")


def flylora(seed: int = 0) -> MoELoRAConfig:
    """FlyLoRA (Zou et al., NeurIPS 2025, "FlyLoRA: Boosting Task Decoupling and Parameter
    Efficiency via Implicit Rank-Wise Mixture-of-Experts"): rank-wise experts (32 rank-1
    experts), a frozen sparse random ``A`` that is also the implicit router (top-8 of
    ``|A h|``), only ``B`` trained, ``alpha = 2 r`` (scaling 2). See `baselines.moe.FlyLoRALinear`.

    It has no router distribution: no routing statistics, and CARE does not apply.
    """
    return MoELoRAConfig(n_experts=32, rank=1, alpha=2.0, target_modules="auto", top_k=8,
                         lb_coef=0.0, seed=seed, variant="flylora")


PRESETS: dict[str, Callable[[int], MoELoRAConfig]] = {
    f.__name__: f for f in (loramoe, hydralora, mixlora, dynmole, hmora, flylora)}


def variant_config(name: str, *, seed: int = 0) -> MoELoRAConfig:
    """The preset `MoELoRAConfig` of a variant by name (ConfigError listing the valid ones)."""
    if name not in PRESETS:
        raise ConfigError(f"unknown MoE-LoRA variant {name!r}; valid: {', '.join(PRESETS)}")
    return PRESETS[name](seed)


__all__ = ["PRESETS", "variant_config", *PRESETS]
