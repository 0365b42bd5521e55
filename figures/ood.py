"""OOD detection figures: ROC curves (`ood_roc_curve`) and ID-vs-shift score histograms.

OOD (the shifted split of the same domain) is the positive class and the score is the
uncertainty, as in the table's OOD-AUROC (`ood_auroc`).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from numpy.typing import ArrayLike, NDArray

from figures.data import RunData, Scores
from figures.style import (
    COLUMN_WIDTH,
    ID_COLOR,
    REFERENCE_COLOR,
    SHIFT_COLOR,
    TEXT_WIDTH,
    LineStyle,
    new_figure,
    note,
    split_method,
)
from uqbench.stats import metrics as M


@dataclass(frozen=True)
class RocDisplay:
    """An OOD ROC curve and its AUROC."""

    fpr: NDArray[np.float64]
    tpr: NDArray[np.float64]
    thresholds: NDArray[np.float64]
    auroc: float
    label: str = ""

    @classmethod
    def from_scores(cls, uncertainty_id: ArrayLike, uncertainty_ood: ArrayLike, *,
                    label: str = "") -> RocDisplay:
        fpr, tpr, thr = M.ood_roc_curve(uncertainty_id, uncertainty_ood)
        return cls(fpr, tpr, thr, M.ood_auroc(uncertainty_id, uncertainty_ood), label)

    def plot(self, ax: Axes, *, style: LineStyle, legend: str | None = None) -> Line2D:
        (line,) = ax.plot(self.fpr, self.tpr, **style.kw(), gid=self.label,
                          label=legend if legend is not None else self.label)
        return line


def _pair(
    run: RunData, method: str, domain: str
) -> tuple[Scores | None, Scores | None, str | None]:
    """(ID scores, shifted scores, why they cannot be drawn)."""
    sid, ssh = run.scores(method, domain, "id"), run.scores(method, domain, "shift")
    if sid is None or ssh is None:
        return sid, ssh, "no per-example scores for both splits"
    for name, s in (("ID", sid), ("shifted", ssh)):
        if s.problem(need_both_classes=False):
            return sid, ssh, f"{name} split is empty"
    return sid, ssh, None


def roc_figure(run: RunData, domain: str, methods: Sequence[str]) -> Figure:
    """OOD ROC of every method on one domain: ID split vs its shifted split."""
    fig = new_figure(COLUMN_WIDTH, 2.5 + 0.13 * (len(methods) + 1))
    ax = fig.add_subplot()
    ax.plot([0, 1], [0, 1], ls=":", lw=0.9, color=REFERENCE_COLOR, label="chance (AUROC 0.5)")
    skipped, drawn = [], 0
    for method in methods:
        sid, ssh, problem = _pair(run, method, domain)
        if problem is not None:
            skipped.append(f"{method}: {problem}")
            continue
        assert sid is not None and ssh is not None
        d = RocDisplay.from_scores(sid.uncertainty, ssh.uncertainty, label=method)
        d.plot(ax, style=run.styles[method], legend=f"{method} (AUROC {d.auroc:.3f})")
        drawn += 1
    if skipped:
        text = "not drawn:\n" + "\n".join(skipped)
        if drawn:
            ax.text(0.98, 0.02, text, transform=ax.transAxes, ha="right", va="bottom",
                    fontsize=6, color="#444444")
        else:
            note(ax, text)
    ax.set(xlim=(0, 1), ylim=(0, 1.01), xlabel="FPR (ID flagged)", ylabel="TPR (shifted flagged)")
    ax.set_aspect("equal", adjustable="box")
    seed = run.seed_note()
    ax.set_title(f"OOD ROC, {domain} (ID vs shifted)" + (f"\n({seed})" if seed else ""))
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncols=1)
    return fig


def _draw_hist(ax: Axes, sid: Scores, ssh: Scores) -> None:
    both = np.concatenate([sid.uncertainty, ssh.uncertainty])
    edges = np.histogram_bin_edges(both, bins=min(30, max(5, int(np.sqrt(both.size)))))
    for s, color, label in ((sid, ID_COLOR, "ID"), (ssh, SHIFT_COLOR, "shifted")):
        sns.histplot(x=s.uncertainty, bins=edges, stat="density", element="step", fill=True,
                     color=color, alpha=0.35, linewidth=0.8, ax=ax, label=label)


def histogram_figure(run: RunData, domain: str, methods: Sequence[str], *,
                     ncols: int = 4) -> Figure:
    """Small multiples: the distribution of each method's uncertainty on the ID and shifted
    splits (density; the title gives the OOD-AUROC of that score)."""
    methods = list(methods)
    ncols = max(1, min(ncols, len(methods)))
    nrows = max(1, math.ceil(len(methods) / ncols))
    fig = new_figure(TEXT_WIDTH * ncols / 4, 1.45 * nrows + 0.45)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    for ax in axes.flat[len(methods):]:
        ax.set_axis_off()
    for ax, method in zip(axes.flat, methods, strict=False):
        model, gate, scorer = split_method(method)
        sid, ssh, problem = _pair(run, method, domain)
        if problem is not None:
            ax.set_title(f"{model}/{gate}\n{scorer}", fontsize=7)
            note(ax, problem, fontsize=6)
            ax.set(xticks=[], yticks=[])
            continue
        assert sid is not None and ssh is not None
        _draw_hist(ax, sid, ssh)
        auroc = M.ood_auroc(sid.uncertainty, ssh.uncertainty)
        ax.set_title(f"{model}/{gate}\n{scorer}  AUROC {auroc:.3f}", fontsize=7)
        ax.set(xlabel="", ylabel="")
        ax.tick_params(labelsize=6)
        ax.set_yticks([])
    for ax in axes[:, 0]:
        ax.set_ylabel("density")
    for ax in axes[-1, :]:
        ax.set_xlabel("uncertainty")
    fig.legend(handles=[Line2D([], [], color=ID_COLOR, lw=4, alpha=0.6, label="ID"),
                        Line2D([], [], color=SHIFT_COLOR, lw=4, alpha=0.6, label="shifted")],
               loc="outside lower center", ncols=2)
    seed = run.seed_note()
    fig.suptitle(f"Uncertainty scores, {domain}: ID vs shifted split"
                 + (f" ({seed})" if seed else ""))
    return fig


__all__ = ["RocDisplay", "histogram_figure", "roc_figure"]
