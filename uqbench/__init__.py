"""uqbench: uncertainty-quantification benchmark for Mixture-of-Experts LoRA models."""
from __future__ import annotations

from uqbench.core.outputs import Outputs
from uqbench.core.scorer import Scorer, get_scorer, list_scorers, register_scorer

__all__ = ["Outputs", "Scorer", "get_scorer", "list_scorers", "register_scorer"]
__version__ = "0.1.0"
