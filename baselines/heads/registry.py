"""The built-in scoring heads, registered in the core's head registry (`uqbench.core.heads`) under
the name that is the ``mode`` of `MultipleChoiceModel` (and of checkpoints)."""
from __future__ import annotations

from baselines.heads.base import Head
from baselines.heads.decoder import Cloze, Letters
from baselines.heads.encoder import BiEncoder, CrossEncoder, CrossEncoderCLS
from uqbench.core.heads import HEADS, heads_for, register_head

for _cls in (BiEncoder, CrossEncoder, CrossEncoderCLS, Cloze, Letters):
    register_head(_cls)

#: the head ``mode="auto"`` picks, by backbone kind
DEFAULT_HEADS = {"encoder": BiEncoder.name, "decoder": Letters.name}


def head_class(mode: str) -> type[Head]:
    """The class of the head registered as ``mode`` (`UnknownNameError` with close matches)."""
    return HEADS.get(mode).cls  # type: ignore[no-any-return]


__all__ = ["DEFAULT_HEADS", "HEADS", "head_class", "heads_for"]
