"""Reliability diagrams: accuracy against confidence per bin, from `reliability_curve`.

Drawn with matplotlib rather than netcal: netcal bins on its own (left-closed bins, a bar for
every bin, empty ones included), whereas a figure must show exactly the bins the table's ECE
was computed from; the bars here are `uqbench.stats.metrics.reliability_curve`'s, the ECE in the
title is `expected_calibration_error` with the same 12 bins, and empty bins draw nothing.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from numpy.typing import ArrayLike

from figures.data import ROLE_LABELS, RunData
from figures.style import GREY, TEXT_WIDTH, new_figure, note, split_method
from uqbench.stats import metrics as M
from uqbench.stats.metrics import ECE_BINS

# The gap is neutral (no method colour): dark hatch over a translucent white.
GAP_FILL, GAP_EDGE = (1.0, 1.0, 1.0, 0.35), "#333333"


@dataclass(frozen=True)
class ReliabilityDisplay:
    """A reliability diagram's data: the metric's bins and its ECE. Only `plot` draws."""

    curve: M.ReliabilityCurve
    ece: float
    n: int
    label: str = ""

    @classmethod
    def from_predictions(cls, confidence: ArrayLike, correct: ArrayLike, *,
                         n_bins: int = ECE_BINS, label: str = "") -> ReliabilityDisplay:
        curve = M.reliability_curve(confidence, correct, n_bins=n_bins)
        ece = M.expected_calibration_error(confidence, correct, n_bins=n_bins)
        return cls(curve, ece, int(np.asarray(correct).size), label)

    def plot(self, ax: Axes, ax_count: Axes | None = None, *, color: str = "#0072B2") -> None:
        """Bars at the per-bin accuracy over each non-empty bin; the gap to the bin's mean
        confidence hatched (this is what ECE averages); counts per bin in ``ax_count``.

        A bin's bars fade with its share of the examples (opacity ∝ sqrt(count / largest
        count), at least 0.15): a bin of one example is 0 or 1 accurate by construction, and a
        full-strength bar would draw the eye to a gap that ECE weights by its count."""
        c = self.curve
        filled = c.count > 0
        left, width = c.edges[:-1][filled], np.diff(c.edges)[filled]
        acc, conf = c.accuracy[filled], c.confidence[filled]
        weight = np.maximum(0.15, np.sqrt(c.count[filled] / c.count.max()))
        ax.plot([0, 1], [0, 1], ls="--", lw=0.8, color=GREY, zorder=1, label="perfect")
        ax.bar(left, acc, width, align="edge", color=[to_rgba(color, 0.85 * w) for w in weight],
               edgecolor="white", linewidth=0.5, zorder=2, label="accuracy", gid="accuracy")
        ax.bar(left, conf - acc, width, bottom=acc, align="edge",
               facecolor=[(*GAP_FILL[:3], GAP_FILL[3] * w) for w in weight],
               edgecolor=[to_rgba(GAP_EDGE, w) for w in weight], hatch="////", linewidth=0.4,
               zorder=3, label="gap to mean confidence", gid="gap")
        ax.set(xlim=(0, 1), ylim=(0, 1))
        if ax_count is not None:
            ax_count.bar(left, c.count[filled], width, align="edge", color=GREY,
                         edgecolor="white", linewidth=0.4, gid="count")
            ax_count.set(xlim=(0, 1))
            ax_count.ticklabel_format(axis="y", style="sci", scilimits=(-3, 4))


def _panel_title(method: str) -> str:
    model, gate, scorer = split_method(method)
    return f"{model}/{gate}\n{scorer}"


def reliability_figure(run: RunData, domain: str, methods: Sequence[str], *,
                       role: str = "id", ncols: int = 3,
                       panel_width: float = TEXT_WIDTH / 3) -> Figure:
    """Grid of reliability diagrams (one per method) on one domain's ``role`` split, each with
    a bin-count histogram under it; ``panel_width`` in inches."""
    methods = list(methods)
    ncols = max(1, min(ncols, len(methods)))
    nrows = max(1, math.ceil(len(methods) / ncols))
    panel_w = panel_width
    fig = new_figure(panel_w * ncols, 2.55 * nrows)
    outer = fig.add_gridspec(nrows, ncols)
    handles: list[Artist] = []
    for i, method in enumerate(methods):
        inner = outer[i // ncols, i % ncols].subgridspec(2, 1, height_ratios=(3.2, 1), hspace=0.05)
        ax = fig.add_subplot(inner[0])
        axc = fig.add_subplot(inner[1], sharex=ax)
        s = run.scores(method, domain, role)
        problem = "no per-example scores in scores.npz" if s is None else s.problem()
        if problem is not None:
            ax.set_title(_panel_title(method))
            note(ax, f"{problem}:\nno reliability diagram")
            ax.set(xlim=(0, 1), ylim=(0, 1))
            axc.set_axis_off()
        else:
            assert s is not None
            disp = ReliabilityDisplay.from_predictions(s.confidence, s.correct, label=method)
            disp.plot(ax, axc, color=run.styles.color(method))
            ax.set_title(f"{_panel_title(method)}  ECE {disp.ece:.3f}")
            if not handles:  # full-strength keys: the bars themselves fade with their counts
                color = run.styles.color(method)
                handles = [ax.get_lines()[0],
                           Patch(facecolor=to_rgba(color, 0.85), label="accuracy"),
                           Patch(facecolor=GAP_FILL, edgecolor=GAP_EDGE, hatch="////",
                                 linewidth=0.4, label="gap to mean confidence")]
        ax.tick_params(labelbottom=False)
        if i % ncols == 0:
            ax.set_ylabel("accuracy")
            axc.set_ylabel("count")
        axc.set_xlabel("confidence")
    seed = run.seed_note()
    fig.suptitle(f"Reliability ({ECE_BINS} bins), {domain}, {ROLE_LABELS.get(role, role)} split"
                 + (f" ({seed})" if seed else ""))
    if handles:
        fig.legend(handles, [str(h.get_label()) for h in handles], loc="outside lower center",
                   ncols=3)
    return fig


__all__ = ["ReliabilityDisplay", "reliability_figure"]
