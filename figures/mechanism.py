"""Mechanism panels (paper Figure "mechanism"), per example, from ``scores.npz``.

(a) top-1 routing mass of the fixed top-4 model for correct vs wrong predictions;
(b) CARE's active experts per example against difficulty (quintiles of the top-4 model's MSP
    uncertainty; wrong/right when MSP is absent), with the fixed k = 4 line;
(c) marginal gain of a fifth expert, ``correct(top5) - correct(top4)`` per example, averaged in
    quintiles of the top-4 disagreement (frontier runs only).
Per-domain allocation under one global tau is `figures.compute.allocation_figure`.
Examples of the ID and shifted splits are pooled; (a) and (b) show them side by side.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from numpy.typing import NDArray
from scipy.stats import rankdata

from figures.data import POOLED, ROLE_LABELS, ROLES, RunData
from figures.style import BLACK, BLUE, GREY, ID_COLOR, SHIFT_COLOR, new_figure, note

log = logging.getLogger(__name__)

N_QUANTILES = 5
PALETTE = {ROLE_LABELS["id"]: ID_COLOR, ROLE_LABELS["shift"]: SHIFT_COLOR}
REFERENCE_K = 4


def quantile_bins(x: NDArray[np.float64], n_bins: int = N_QUANTILES) -> NDArray[np.int64]:
    """Bin index 0..n_bins-1 of each value by its rank (equal-mass bins; ties share a bin)."""
    x = np.asarray(x, dtype=float)
    if x.size == 0:
        return np.zeros(0, dtype=np.int64)
    q = (rankdata(x, method="average") - 0.5) / x.size
    return np.minimum((q * n_bins).astype(np.int64), n_bins - 1)


def _bin_labels(n: int, easy: str, hard: str) -> list[str]:
    return [f"{i + 1}\n{easy}" if i == 0 else f"{i + 1}\n{hard}" if i == n - 1 else str(i + 1)
            for i in range(n)]


@dataclass
class _Panel:
    """A panel's data, collected per role; `problem` says why it cannot be drawn."""

    title: str
    ref: str = ""  # the method whose scores give the x axis
    use_msp: bool = True
    parts: dict[str, dict[str, NDArray[np.float64]]] = field(default_factory=dict)
    problem: str | None = None

    def add(self, role: str, **arrays: NDArray[np.float64]) -> None:
        lengths = {a.size for a in arrays.values()}
        if len(lengths) != 1:
            self.problem = f"array lengths differ on the {role} split: {sorted(lengths)}"
        elif lengths == {0}:
            return
        else:
            self.parts[ROLE_LABELS[role]] = arrays

    def cat(self, name: str) -> NDArray[np.float64]:
        return np.concatenate([p[name] for p in self.parts.values()])

    def hue(self) -> NDArray[np.str_]:
        return np.concatenate([np.full(next(iter(p.values())).size, r)
                               for r, p in self.parts.items()])


def _top1_panel(run: RunData, dom: str) -> _Panel | None:
    pair = run.moe_pair(f"top{REFERENCE_K}")
    method = run.method_of(pair, "msp") if pair else None
    if pair is None or method is None:
        return None
    p = _Panel(f"(a) routing confidence\n{method}")
    for role in ROLES:
        mass, s = run.pair_field(pair, dom, role, "top1_mass"), run.scores(method, dom, role)
        if mass is not None and s is not None:
            p.add(role, mass=mass.astype(float), correct=s.correct)
    if not p.parts and p.problem is None:
        p.problem = "empty splits"
    elif p.problem is None:
        corr = p.cat("correct")
        if corr.min() == corr.max():
            p.problem = f"all predictions {'correct' if corr[0] else 'wrong'} (single class)"
    return p


def _draw_top1(ax: Axes, p: _Panel) -> None:
    outcome = np.where(p.cat("correct") == 1, "correct", "wrong")
    hue = p.hue()
    sns.violinplot(x=outcome, y=p.cat("mass"), hue=hue, order=["correct", "wrong"],
                   hue_order=[h for h in PALETTE if h in p.parts], palette=PALETTE,
                   split=len(p.parts) == 2, inner="quart", cut=0, density_norm="width",
                   linewidth=0.6, legend=False, ax=ax)  # one legend for the figure
    ax.set(xlabel="top-4 prediction", ylabel="top-1 routing mass")


def _experts_panel(run: RunData, dom: str) -> _Panel | None:
    gate = run.care_gate()
    care = run.moe_pair(gate) if gate else None
    top = run.moe_pair(f"top{REFERENCE_K}")
    ref = (run.method_of(top, "msp") if top else None) or (run.method_of(care) if care else None)
    if care is None or ref is None:
        return None
    p = _Panel(f"(b) CARE experts vs difficulty\n{care}", ref, ref.endswith("/msp"))
    for role in ROLES:
        k, s = run.pair_field(care, dom, role, "experts"), run.scores(ref, dom, role)
        if k is not None and s is not None:
            p.add(role, experts=k.astype(float),
                  difficulty=s.uncertainty if p.use_msp else 1.0 - s.correct)
    if not p.parts and p.problem is None:
        p.problem = "empty splits"
    return p


def _draw_experts(ax: Axes, p: _Panel) -> None:
    diff = p.cat("difficulty")
    if p.use_msp:
        labels = _bin_labels(N_QUANTILES, "easy", "hard")
        x = np.asarray(labels)[quantile_bins(diff)]
        xlabel = f"difficulty: quintile of {p.ref.rsplit('/', 2)[1]} MSP uncertainty"
    else:
        labels = ["right", "wrong"]
        x = np.where(diff > 0.5, "wrong", "right")
        xlabel = f"{p.ref.rsplit('/', 2)[1]} prediction"
    sns.pointplot(x=x, y=p.cat("experts"), hue=p.hue(), order=labels,
                  hue_order=[h for h in PALETTE if h in p.parts], palette=PALETTE,
                  errorbar="se", dodge=0.3, markersize=3, linewidth=1.0, legend=False, ax=ax)
    ax.axhline(REFERENCE_K, color=BLACK, ls="--", lw=0.8, label=f"fixed k={REFERENCE_K}")
    ax.set(xlabel=xlabel, ylabel="CARE experts / example")
    ax.legend([ax.get_lines()[-1]], [f"fixed k={REFERENCE_K}"], loc="upper left", fontsize=6)


def _gain_panel(run: RunData, dom: str) -> _Panel | None:
    p4, p5 = run.moe_pair(f"top{REFERENCE_K}"), run.moe_pair(f"top{REFERENCE_K + 1}")
    if p4 is None or p5 is None or p4.split("/")[0] != p5.split("/")[0]:
        return None
    m4, m5 = run.method_of(p4, "msp"), run.method_of(p5, "msp")
    if m4 is None or m5 is None or m4.rsplit("/", 1)[1] != m5.rsplit("/", 1)[1]:
        return None
    p = _Panel(f"(c) gain of a {REFERENCE_K + 1}th expert\n{m5} − top{REFERENCE_K}")
    for role in ROLES:
        d = run.pair_field(p4, dom, role, "disagreement")
        s4, s5 = run.scores(m4, dom, role), run.scores(m5, dom, role)
        if d is not None and s4 is not None and s5 is not None:
            p.add(role, disagreement=d.astype(float), gain=s5.correct - s4.correct)
    if not p.parts and p.problem is None:
        p.problem = "empty splits"
    return p


def _draw_gain(ax: Axes, p: _Panel) -> None:
    labels = _bin_labels(N_QUANTILES, "low", "high")
    x = np.asarray(labels)[quantile_bins(p.cat("disagreement"))]
    sns.barplot(x=x, y=p.cat("gain"), order=labels, errorbar="se", color=BLUE, alpha=0.8,
                err_kws={"linewidth": 0.9, "color": GREY}, capsize=0.2, ax=ax)
    ax.axhline(0, color=BLACK, lw=0.7)
    ax.set(xlabel=f"quintile of top-{REFERENCE_K} disagreement",
           ylabel=f"Δ accuracy, top-{REFERENCE_K + 1} − top-{REFERENCE_K}")


PANELS: tuple[
    tuple[Callable[[RunData, str], _Panel | None], Callable[[Axes, _Panel], None]], ...
] = ((_top1_panel, _draw_top1), (_experts_panel, _draw_experts), (_gain_panel, _draw_gain))


def mechanism_figure(run: RunData) -> Figure | None:
    """The panels the run supports, side by side; None (with a log note) if none."""
    dom = POOLED if POOLED in run.domains else run.domains[0]
    panels = [(p, draw) for build, draw in PANELS if (p := build(run, dom)) is not None]
    if not panels:
        log.info("mechanism figure skipped: needs a MoE top-%d pair or a CARE pair with router "
                 "arrays in scores.npz", REFERENCE_K)
        return None
    fig = new_figure(2.35 * len(panels), 2.5)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (p, draw) in zip(axes, panels, strict=False):
        ax.set_title(p.title, fontsize=7)
        if p.problem is not None:
            note(ax, p.problem)
            ax.set(xticks=[], yticks=[])
        else:
            draw(ax, p)
    roles = [h for h in PALETTE if any(h in p.parts for p, _ in panels)]
    fig.legend(handles=[Patch(color=PALETTE[h], label=f"{h} examples") for h in roles],
               loc="outside lower center", ncols=len(roles))
    fig.suptitle(f"Why CARE works ({dom}; points and bars: mean ± s.e.)")
    return fig


__all__ = ["mechanism_figure", "quantile_bins"]
