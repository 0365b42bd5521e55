"""Benchmarks: `python -m benchmarks [NAME ...]` prints one JSON line per benchmark.

Each ``bench_*.py`` module defines ``run() -> Iterable[dict]``; every dict carries at least
``name``, the measured numbers, a ``ratio`` where the benchmark compares two things in one run,
its ``target`` and whether it was ``met``. Targets are goals, never asserted in tests.
"""
