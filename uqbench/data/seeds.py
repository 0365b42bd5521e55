"""The one seeding helper of the data path: a seed derived from ``(seed, *parts)`` by sha256,
stable across runs, processes and Python versions (never Python's ``hash``)."""
from __future__ import annotations

import hashlib
from typing import Literal


def derive_seed(*parts: object, sep: str = "/", nbytes: int = 8,
                byteorder: Literal["little", "big"] = "little") -> int:
    """``int.from_bytes(sha256(sep.join(map(str, parts)))[:nbytes], byteorder)``.

    Three uses, each with the arithmetic its cached splits were built with: pool orders and
    halves (``sep="/"``, 8 bytes, little-endian, into ``numpy.random.default_rng``), the per-item
    seed a builder gets (``"/"``, 4 bytes, big-endian) and a record's own RNG (``"\\x00"``, 16
    bytes, big-endian, into ``random.Random``).

    Examples
    --------
    >>> derive_seed(0, "mbpp/11", nbytes=4, byteorder="big")
    3526228899
    """
    digest = hashlib.sha256(sep.join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:nbytes], byteorder)


__all__ = ["derive_seed"]
