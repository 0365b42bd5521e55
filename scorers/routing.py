"""Router-based scores, read from the same forward pass that routed the tokens.

Per example, averaged over non-padding tokens and MoE layers:
- ``routing_entropy``: normalised router entropy ``H(p) / log N`` (higher = less sure which
  experts to use);
- ``top1_mass``: ``u = 1 - p_(1)`` (a peaked router is confident);
- ``disagreement``: CARE's disagreement ``D`` of the admitted experts' outputs.
"""
from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from uqbench import Outputs, Scorer, register_scorer


@register_scorer("routing_entropy")
class RoutingEntropy(Scorer):
    requires = frozenset({"logits", "route_entropy"})

    def __call__(self, outputs: Outputs) -> NDArray[np.float64]:
        assert outputs.route_entropy is not None
        return outputs.route_entropy


@register_scorer("top1_mass")
class Top1Mass(Scorer):
    requires = frozenset({"logits", "top1_mass"})

    def __call__(self, outputs: Outputs) -> NDArray[np.float64]:
        assert outputs.top1_mass is not None
        return 1.0 - outputs.top1_mass


@register_scorer("disagreement")
class Disagreement(Scorer):
    requires = frozenset({"logits", "disagreement"})

    def __call__(self, outputs: Outputs) -> NDArray[np.float64]:
        assert outputs.disagreement is not None
        return outputs.disagreement
