"""MC-dropout (Gal & Ghahramani, 2016): T stochastic passes with dropout kept on at inference."""
from __future__ import annotations

from scorers._sampled import SampledEntropy, SampledMSP, SampledMutualInfo
from uqbench import register_scorer

MC = frozenset({"mc_logits"})


@register_scorer("mc_dropout_msp")
class MCDropoutMSP(SampledMSP):
    field, requires = "mc_logits", MC


@register_scorer("mc_dropout_entropy")
class MCDropoutEntropy(SampledEntropy):
    field, requires = "mc_logits", MC


@register_scorer("mc_dropout_mutual_info")
class MCDropoutMutualInfo(SampledMutualInfo):
    field, requires = "mc_logits", MC
