"""Compute figures drawn from ``results.jsonl`` rows: accuracy-compute frontier, thermostat
sweep, per-domain allocation, component ablation.

Every number drawn is a table cell (accuracy with its bootstrap CI, ``avg_experts``): no metric
is recomputed here. The one derived quantity, the CARE budget at which CARE's accuracy reaches
fixed top-4's, is a linear interpolation between CARE's table points
(`uqbench.reporting.paper.matched_budget`, the one the paper report's claim uses).
"""
from __future__ import annotations

import logging
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from figures.data import POOLED, RunData
from figures.style import (
    BLACK,
    COLUMN_WIDTH,
    GREY,
    ID_COLOR,
    SHIFT_COLOR,
    VERMILLION,
    gate_color,
    new_figure,
)
from uqbench.reporting.paper import matched_budget

log = logging.getLogger(__name__)

TOPK = re.compile(r"top(\d+)")
CARE_B = re.compile(r"care-b(\d+(?:\.\d+)?)")
CARE_TAU = re.compile(r"care-tau(\d*\.?\d+)")
ABLATION = ("fixed-k", "random-k", "entropy-k", "nucleus-only", "care")
REFERENCE_K = 4  # the fixed-k the paper matches (the training gate)


def _f(row: dict[str, Any], key: str) -> float:
    v = row.get(key)
    return float("nan") if v is None else float(v)


@dataclass(frozen=True)
class GatePoint:
    """One gate's table cells: achieved mean experts, accuracy and its 95% CI."""

    gate: str
    knob: float  # k, budget or tau (from the gate name)
    experts: float
    accuracy: float
    lo: float
    hi: float
    scorer: str

    @classmethod
    def of(cls, row: dict[str, Any], knob: float) -> GatePoint:
        experts = _f(row, "avg_experts")
        return cls(row["gate"], knob, experts, _f(row, "accuracy"), _f(row, "accuracy_lo"),
                   _f(row, "accuracy_hi"), row["scorer"])

    def yerr(self) -> tuple[float, float]:
        if math.isnan(self.lo) or math.isnan(self.hi):
            return 0.0, 0.0
        return max(self.accuracy - self.lo, 0.0), max(self.hi - self.accuracy, 0.0)


def _points(run: RunData, pattern: re.Pattern[str], domain: str) -> list[GatePoint]:
    pts = []
    for g in run.gates:
        m = pattern.fullmatch(g)
        row = run.gate_rows(g, domain) if m else None
        if m and row is not None:
            pts.append(GatePoint.of(row, float(m.group(1))))
    return sorted(pts, key=lambda p: p.knob)


def _errorbar(ax: Axes, pts: Sequence[GatePoint], x: Sequence[float], **kw: Any) -> None:
    yerr = np.array([p.yerr() for p in pts]).T
    ax.errorbar(x, [p.accuracy for p in pts], yerr=yerr, capsize=2, elinewidth=0.8,
                marker="o", ms=3.5, **kw)


def frontier_figure(run: RunData, domain: str = POOLED) -> Figure | None:
    """Accuracy against achieved mean experts: fixed top-k for each k vs CARE at each budget,
    with the experts CARE saves at fixed top-4's accuracy."""
    fixed, care = _points(run, TOPK, domain), _points(run, CARE_B, domain)
    if len(fixed) < 2 or not care:
        log.info("frontier figure skipped: the run has %d fixed top-k gate(s) and %d CARE budget "
                 "gate(s); run `uqbench run --experiment frontier` for it", len(fixed), len(care))
        return None
    fig = new_figure(COLUMN_WIDTH, 2.7)
    ax = fig.add_subplot()

    def xs(pts: Sequence[GatePoint]) -> list[float]:  # achieved budget; nominal if unknown
        return [p.knob if math.isnan(p.experts) else p.experts for p in pts]

    _errorbar(ax, fixed, xs(fixed), color=gate_color("top1"), label="fixed top-$k$", gid="fixed")
    _errorbar(ax, care, xs(care), color=VERMILLION, label="CARE (budget $B$)", gid="care")
    for p, x in zip(fixed, xs(fixed), strict=False):
        ax.annotate(f"k={p.knob:g}", (x, p.accuracy), textcoords="offset points", xytext=(0, -9),
                    ha="center", fontsize=5.5, color=gate_color("top1"))
    for p, x in zip(care, xs(care), strict=False):
        ax.annotate(f"B={p.knob:g}", (x, p.accuracy), textcoords="offset points", xytext=(0, 5),
                    ha="center", fontsize=5.5, color=VERMILLION)
    ref = next((p for p in fixed if p.knob == REFERENCE_K), None)
    if ref is None:
        msg = f"no fixed top-{REFERENCE_K} gate in this run: no matched-accuracy comparison"
    else:
        x_ref = xs([ref])[0]
        ax.axhline(ref.accuracy, color=GREY, ls=":", lw=0.8)
        match = matched_budget(xs(care), [p.accuracy for p in care], ref.accuracy)
        if match is None:
            msg = (f"CARE never reaches fixed top-{REFERENCE_K} accuracy ({ref.accuracy:.3f}) "
                   f"at budgets {care[0].knob:g}–{care[-1].knob:g}")
        else:
            x_match, exact = match
            saved = x_ref - x_match
            ax.annotate("", xy=(x_match, ref.accuracy), xytext=(x_ref, ref.accuracy),
                        arrowprops={"arrowstyle": "->", "color": BLACK, "lw": 0.9})
            sign = "" if exact else "≥ "
            word = "fewer" if saved >= 0 else "more"
            msg = (f"at top-{REFERENCE_K} accuracy ({ref.accuracy:.3f}) CARE uses "
                   f"{'≤ ' if not exact else ''}{x_match:.2f} experts: "
                   f"{sign}{abs(saved):.2f} {word} ({sign}{abs(saved) / x_ref:.0%})")
    ax.text(0.02, 0.98, msg, transform=ax.transAxes, ha="left", va="top", fontsize=6,
            wrap=True, gid="matched")
    ax.set(xlabel="mean active experts (achieved)", ylabel="accuracy")
    ax.margins(y=0.18)
    ax.legend(loc="lower right")
    ax.set_title(f"Accuracy–compute trade-off ({domain})")
    return fig


def thermostat_figure(run: RunData, domain: str = POOLED) -> Figure | None:
    """τ (CARE's nucleus threshold) -> achieved mean experts (left) and accuracy (right)."""
    pts = _points(run, CARE_TAU, domain)
    if len(pts) < 2:
        log.info("thermostat figure skipped: %d care-tau* gate(s); run `uqbench run "
                 "--experiment thermostat` for it", len(pts))
        return None
    fig = new_figure(COLUMN_WIDTH, 2.3)
    ax = fig.add_subplot()
    tau = [p.knob for p in pts]
    ax.plot(tau, [p.experts for p in pts], marker="s", ms=3.5, color=VERMILLION,
            label="mean experts", gid="experts")
    ax.set(xlabel="nucleus threshold $\\tau$", ylabel="mean active experts")
    ax.yaxis.label.set_color(VERMILLION)
    ax2 = ax.twinx()
    _errorbar(ax2, pts, tau, color=BLACK, label="accuracy", gid="accuracy")
    ax2.set_ylabel("accuracy")
    ax2.grid(False)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    fig.legend(h1 + h2, l1 + l2, loc="outside lower center", ncols=2)  # clear of both curves
    ax.set_title(f"Thermostat sweep ({domain})")
    return fig


def _tau_of(desc: Any) -> float | None:
    """The calibrated tau in a gate description of run.json, wherever it is nested."""
    if isinstance(desc, dict):
        for k, v in desc.items():
            if k == "tau" and isinstance(v, (int, float)):
                return float(v)
            got = _tau_of(v)
            if got is not None:
                return got
    return None


def allocation_figure(run: RunData) -> Figure | None:
    """Mean experts CARE spends per domain under one global τ (ID and shifted splits)."""
    gate = run.care_gate()
    domains = [d for d in run.domains if d != POOLED]
    rows: dict[str, dict[str, Any]] = {}
    for d in domains:
        r = run.gate_rows(gate, d) if gate else None
        if r is not None and not math.isnan(_f(r, "avg_experts")):
            rows[d] = r
    if not rows:
        log.info("allocation figure skipped: no CARE gate with per-domain expert counts")
        return None
    fig = new_figure(COLUMN_WIDTH, 2.3)
    ax = fig.add_subplot()
    x = np.arange(len(rows))
    has_shift = all(not math.isnan(_f(r, "shift_avg_experts")) for r in rows.values())
    w = 0.38 if has_shift else 0.6
    ax.bar(x - (w / 2 if has_shift else 0), [_f(r, "avg_experts") for r in rows.values()], w,
           color=ID_COLOR, label="ID", gid="id")
    if has_shift:
        ax.bar(x + w / 2, [_f(r, "shift_avg_experts") for r in rows.values()], w,
               color=SHIFT_COLOR, label="shifted", gid="shift")
    pooled = run.gate_rows(gate, POOLED) if gate else None
    if pooled is not None and not math.isnan(_f(pooled, "avg_experts")):
        ax.axhline(_f(pooled, "avg_experts"), color=BLACK, ls="--", lw=0.8,
                   label=f"pooled ID mean ({_f(pooled, 'avg_experts'):.2f})")
    ax.set_xticks(x, list(rows), rotation=20 if len(rows) > 4 else 0)
    ax.set_ylabel("mean active experts")
    tau = _tau_of(next((v for k, v in run.meta.get("gates", {}).items()
                        if k.split("@")[0].endswith(f"/{gate}")), None))
    ax.set_title(
        "CARE experts per domain\n"
        + f"(gate {gate}, one global $\\tau$"
        + (f" = {tau:.3g})" if tau is not None else ")")
    )
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncols=3)
    return fig


def ablation_figure(run: RunData, domain: str = POOLED) -> Figure | None:
    """Component ablation at matched budget: accuracy (a) and OOD-AUROC (b) per gate."""
    gates = [g for g in ABLATION if g in run.gates]
    if "care" not in gates or len(gates) < 3 or not any(g in run.gates for g in ABLATION[1:4]):
        log.info("ablation figure skipped: needs the gates of `--experiment ablation`")
        return None
    have = {(r["gate"], r["scorer"]) for r in run.rows if r["domain"] == domain}
    scorer = "care" if all((g, "care") in have for g in gates) else "msp"
    fig = new_figure(COLUMN_WIDTH * 1.6, 2.2)
    axes = fig.subplots(1, 2)
    for ax, (col, title, prefer) in zip(axes, (
            ("accuracy", "(a) accuracy", ("msp",)),
            ("ood_auroc", f"(b) OOD-AUROC ({scorer} score)", (scorer,))), strict=False):
        rows = [run.gate_rows(g, domain, prefer=prefer) for g in gates]
        y = [_f(r, col) if r else float("nan") for r in rows]
        lo = [_f(r, f"{col}_lo") if r else float("nan") for r in rows]
        hi = [_f(r, f"{col}_hi") if r else float("nan") for r in rows]
        for i, g in enumerate(gates):
            err = [[0.0], [0.0]] if math.isnan(lo[i]) else [[y[i] - lo[i]], [hi[i] - y[i]]]
            ax.errorbar([i], [y[i]], yerr=err, marker="o", ms=4, capsize=2, color=gate_color(g),
                        gid=f"{col}|{g}")
        ax.set_xticks(range(len(gates)), gates, rotation=30, ha="right")
        ax.set_title(title)
        ax.margins(x=0.15, y=0.25)
    fig.suptitle(f"Component ablation at matched budget ({domain}; 95% CI)")
    return fig


__all__ = [
    "GatePoint",
    "ablation_figure",
    "allocation_figure",
    "frontier_figure",
    "thermostat_figure",
]
