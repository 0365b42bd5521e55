"""The head registry: how a model scores the options of a question.

Heads are torch code (`baselines.heads`); this module holds what the core needs about them: the
name (``--head``, a suite's ``head:``, the ``mode`` of a model and its checkpoints), the backbone
kind it fits and the class, filled by ``@register_head`` on each head class. The built-in heads
are imported on the first lookup (as the built-in gates are); a third-party head is one module
with a decorated class, loaded with ``--plugin`` or through the entry-point group
``uqbench.heads``. ``auto`` is no head: it picks the profile's encoder head for encoders and
``letters`` for decoders.
"""
from __future__ import annotations

from dataclasses import dataclass

from uqbench.core.errors import ConfigError, UnknownNameError
from uqbench.core.registry import Registry

#: the head name that lets the backbone kind choose
AUTO = "auto"
KINDS = ("encoder", "decoder")


@dataclass(frozen=True)
class HeadKind:
    """A registered head: its ``name``, the backbone ``kind`` it fits ("encoder" or
    "decoder") and its class (built as ``cls()``)."""

    name: str
    kind: str
    cls: type


HEADS: Registry[HeadKind] = Registry("head", builtins=("baselines.heads",),
                                     entry_point_group="uqbench.heads", expects=HeadKind)


def register_head(cls: type) -> type:
    """Class decorator registering a head class under its ``name`` for its ``kind``."""
    name, kind = getattr(cls, "name", None), getattr(cls, "kind", None)
    if not isinstance(name, str) or not name or name == AUTO:
        raise ValueError(f"@register_head: {cls!r} needs a class attribute `name` (not {AUTO!r})")
    if kind not in KINDS:
        raise ValueError(f"@register_head: head {name!r} has kind {kind!r}; use one of {KINDS}")
    HEADS.add(name, HeadKind(name, kind, cls))
    return cls


def heads_for(kind: str) -> tuple[str, ...]:
    """The registered heads that fit a backbone of ``kind``, in registration order."""
    return tuple(name for name, h in HEADS.items() if h.kind == kind)


def check_head(name: object, where: str = "--head") -> str:
    """``name`` if it is ``auto`` or a registered head, else a `ConfigError` naming ``where``,
    the close matches and the valid names."""
    if name == AUTO:
        return AUTO
    try:
        HEADS.get(str(name))
    except UnknownNameError as exc:
        raise ConfigError(f"{where}: {exc} (or {AUTO}; heads fit encoder or decoder backbones: "
                          f"`uqbench list heads`)") from None
    return str(name)


__all__ = ["AUTO", "HEADS", "HeadKind", "check_head", "heads_for", "register_head"]
