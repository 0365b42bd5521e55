"""Models: MoE-LoRA layers and gates (fixed top-k, CARE, ablations), dense peft baselines,
multiple-choice heads, training and checkpoint I/O."""
