"""Plots drawn from arrays that `uqbench.metrics` curve functions return.

`draw_run` reads a finished run folder and writes every figure its data supports, PNG and PDF,
into ``RUN_DIR/figures/`` (``uqbench plot RUN_DIR``). Each figure module separates computing
from drawing (sklearn's Display pattern): a ``*Display`` holds the metric's arrays, ``plot``
only draws them.
"""
from __future__ import annotations

from figures.data import load_run
from figures.run import draw_run

__all__ = ["draw_run", "load_run"]
