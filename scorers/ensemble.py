"""Deep ensembles (Lakshminarayanan et al., 2017): M independently seeded MoE-LoRA adapters."""
from __future__ import annotations

from scorers._sampled import SampledEntropy, SampledMSP, SampledMutualInfo
from uqbench import register_scorer

MEMBERS = frozenset({"member_logits"})


@register_scorer("ensemble_msp")
class EnsembleMSP(SampledMSP):
    field, requires = "member_logits", MEMBERS


@register_scorer("ensemble_entropy")
class EnsembleEntropy(SampledEntropy):
    field, requires = "member_logits", MEMBERS


@register_scorer("ensemble_mutual_info")
class EnsembleMutualInfo(SampledMutualInfo):
    field, requires = "member_logits", MEMBERS
