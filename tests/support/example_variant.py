"""The README's "A model variant" example, verbatim (tests: test_extending)."""
# my_moe.py
from baselines.moe import MoELoRAConfig
from baselines.variants import register_variant


@register_variant("wide-moe", doc="MoE-LoRA: 8 experts of rank 4 on the FFN, trained top-2")
def wide_moe(seed: int = 0) -> MoELoRAConfig:
    return MoELoRAConfig(n_experts=8, rank=4, alpha=8.0, target_modules="ffn", top_k=2,
                         seed=seed, variant="moe-lora")  # the plain layer's pieces
