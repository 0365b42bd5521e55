"""Multiple-choice models on a frozen backbone: one score per option -> logits (B, C).

Five heads, one interface (`Head`: ``encode`` records into a batch, ``scores`` a batch into
logits and per-question features), in the table `HEADS` by name (the ``mode`` of
`MultipleChoiceModel`, stored in checkpoints):

``bi_encoder`` (`BiEncoder`; encoders, the default), ``cross_encoder`` (`CrossEncoder`),
``cross_encoder_cls`` (`CrossEncoderCLS`), ``cloze`` (`Cloze`; decoders) and ``letters``
(`Letters`; decoders, the default). `MultipleChoiceModel.encode` then ``forward`` delegate to
the model's head (``model.scoring``).

Choice counts may differ within a batch: absent options get `uqbench.core.outputs.PAD_LOGIT`
(finite, probability exactly 0 in float64, zero gradient), so logits are always (B, C_max) and
finite.

When the backbone has MoE-LoRA layers, ``forward`` hands them the token mask (padding excluded
from routing statistics and the load-balancing loss). Encoders whose adapters sit in the last
blocks only read the frozen bottom blocks' states from `PREFIX_CACHE` (`baselines.heads.prefix`).
"""
from baselines.heads.base import Head
from baselines.heads.decoder import LETTERS, Cloze, Letters
from baselines.heads.encoder import BI_ENCODER_SCALE, BiEncoder, CrossEncoder, CrossEncoderCLS
from baselines.heads.model import (
    MultipleChoiceModel,
    adapter_layers,
    make_moe,
    make_plain,
    prepare_backbone,
)
from baselines.heads.prefix import PREFIX_CACHE, PrefixCache, run_blocks
from baselines.heads.registry import DEFAULT_HEADS, HEADS, head_class, heads_for

__all__ = [
    "BI_ENCODER_SCALE",
    "DEFAULT_HEADS",
    "HEADS",
    "LETTERS",
    "PREFIX_CACHE",
    "BiEncoder",
    "Cloze",
    "CrossEncoder",
    "CrossEncoderCLS",
    "Head",
    "Letters",
    "MultipleChoiceModel",
    "PrefixCache",
    "adapter_layers",
    "head_class",
    "heads_for",
    "make_moe",
    "make_plain",
    "prepare_backbone",
    "run_blocks",
]
