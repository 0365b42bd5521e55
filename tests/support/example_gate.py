"""The README's "Adding a gate" example, verbatim (tests: test_gates, test_thermostat)."""
# my_gates.py
import math
from dataclasses import dataclass

import torch

from baselines.gates import Selection, top_mask
from uqbench.core.gating import register_gate


@register_gate("fractionk", knob="frac")  # the thermostat tunes `frac` to meet a budget
@dataclass(frozen=True)
class FractionK:
    """Admit the top ceil(frac * N) experts of every token."""
    frac: float = 0.25

    def validate(self, n_experts: int) -> None: ...

    def select(self, probs: torch.Tensor, disagreement) -> Selection:
        k = torch.full(probs.shape[:1], max(1, math.ceil(self.frac * probs.shape[-1])))
        return Selection(mask := top_mask(probs, k), k, mask)
