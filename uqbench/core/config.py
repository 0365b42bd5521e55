"""Helpers for the configuration dataclasses (``MoELoRAConfig``, ``TrainConfig``...)."""
from __future__ import annotations

from dataclasses import field
from typing import Any


def help_field(text: str, default: Any) -> Any:
    """A dataclass field with a default and a one-line ``help`` text in its metadata (read by
    documentation and ``--help`` generators: ``dataclasses.fields(cls)[i].metadata["help"]``)."""
    return field(default=default, metadata={"help": text})
