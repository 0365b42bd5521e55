"""The table of scoring heads, by the name ``mode`` of `MultipleChoiceModel` (and checkpoints)."""
from __future__ import annotations

from baselines.heads.base import Head
from baselines.heads.decoder import Cloze, Letters
from baselines.heads.encoder import BiEncoder, CrossEncoder, CrossEncoderCLS

#: every head, by name; the order of the lists below and of error messages
HEADS: dict[str, type[Head]] = {h.name: h for h in (BiEncoder, CrossEncoder, CrossEncoderCLS,
                                                    Cloze, Letters)}
#: the head ``mode="auto"`` picks, by backbone kind
DEFAULT_HEADS = {"encoder": BiEncoder.name, "decoder": Letters.name}


def modes_for(kind: str) -> tuple[str, ...]:
    """The heads that fit a backbone of ``kind`` ("encoder" or "decoder")."""
    return tuple(name for name, h in HEADS.items() if h.kind == kind)


HEAD_MODES = tuple(HEADS)
ENCODER_MODES = modes_for("encoder")
