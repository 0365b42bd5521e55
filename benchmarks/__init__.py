"""Benchmarks: `python -m benchmarks [NAME ...]` prints one JSON line per benchmark.

Each ``bench_*.py`` module defines ``run() -> Iterable[dict]``; every dict carries at least
``name``, the measured numbers, a ``ratio`` where the benchmark compares two things in one run,
its ``target`` and whether it was ``met``. Targets are goals, never asserted in tests.
"""
from __future__ import annotations

import json
from typing import Any


def emit(row: dict[str, Any], out: str | None = None) -> None:
    """Print ``row`` as one JSON line and, with ``out``, append it to that file."""
    line = json.dumps(row, default=str)
    print(line, flush=True)
    if out:
        with open(out, "a") as f:
            f.write(line + "\n")
