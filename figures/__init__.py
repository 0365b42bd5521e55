"""Plots drawn from arrays that `uqbench.stats.metrics` curve functions return.

`draw_run` reads a finished run folder and writes every figure its data supports, PNG and PDF,
into ``RUN_DIR/figures/`` (``uqbench plot RUN_DIR``). Each figure module separates computing
from drawing (sklearn's Display pattern): a ``*Display`` holds the metric's arrays, ``plot``
only draws them. The package registers itself as the ``"figures"`` figure set of
`uqbench.core.engine` (the runner and the CLI draw through it, without importing this package).
"""
from __future__ import annotations

from pathlib import Path

from figures.data import load_run
from figures.run import draw_run
from uqbench.core.engine import register_drawer


@register_drawer("figures")
def draw(run_dir: Path) -> list[Path]:
    """Every figure of a run folder with the default selection of methods (`draw_run`)."""
    return draw_run(run_dir)


__all__ = ["draw", "draw_run", "load_run"]
