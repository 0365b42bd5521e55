"""Forest plots: one figure per ranking metric (the scorer-level columns with a bootstrap CI),
every method's value and 95% CI per domain, methods sorted by their value on the first domain
(``pooled`` when present), the random-ranking value marked (`uqbench.results.tables.
random_ranking`). Every number drawn is a cell of ``results.jsonl``: nothing is computed here.
A model at chance on a domain draws hollow markers."""
from __future__ import annotations

import math
from typing import Any

from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from figures.data import RunData
from figures.style import PALETTE, REFERENCE_COLOR, new_figure
from uqbench.results.columns import COLUMNS
from uqbench.results.tables import FOREST_COLUMNS, HEADERS, chance_reasons, random_ranking

ROW_HEIGHT = 0.17  # inches per method


def _finite(v: Any) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def forest_figure(run: RunData, column: str) -> Figure | None:
    """``column``'s value [CI] of every method on every domain; None without any value."""
    doms = run.domains
    methods = [m for m in run.methods
               if any(_finite((run.row(m, d) or {}).get(column)) is not None for d in doms)]
    if not methods:
        return None
    higher = COLUMNS[column].higher_is_better
    first = doms[0]

    def key(m: str) -> tuple[int, float]:
        v = _finite((run.row(m, first) or {}).get(column))
        return (v is None, -v if v is not None and higher else (v or 0.0))

    methods.sort(key=key)  # best first: drawn at the top
    at_chance = chance_reasons(run.rows + run.references)
    fig = new_figure(4.6, 1.3 + ROW_HEIGHT * len(methods))
    ax = fig.add_subplot()
    step = 0.8 / max(len(doms), 1)
    for i, dom in enumerate(doms):
        color = PALETTE[i % len(PALETTE)]
        for j, m in enumerate(methods):
            row = run.row(m, dom) or {}
            v = _finite(row.get(column))
            if v is None:
                continue
            y = j - 0.4 + step * (i + 0.5)
            lo, hi = _finite(row.get(f"{column}_lo")), _finite(row.get(f"{column}_hi"))
            if lo is not None and hi is not None:
                ax.plot([lo, hi], [y, y], color=color, lw=0.9, gid=f"ci|{m}|{dom}")
            hollow = (m, dom) in at_chance
            ax.plot([v], [y], "o", ms=3.2, color=color, mfc="white" if hollow else color,
                    mew=0.9, gid=f"{m}|{dom}")
            ref = random_ranking(column, row)
            if ref is not None and column != "ood_auroc":
                ax.plot([ref], [y], "|", ms=5, color=REFERENCE_COLOR, gid=f"random|{m}|{dom}")
    if column == "ood_auroc":
        ax.axvline(0.5, color=REFERENCE_COLOR, ls="--", lw=0.8, gid="random")
    ax.set_yticks(range(len(methods)), methods)
    ax.set_ylim(len(methods) - 0.5, -0.5)
    ax.grid(axis="y", visible=False)
    header = HEADERS.get(column, (column, 3))[0]
    better = "higher" if higher else "lower"
    ax.set_xlabel(f"{header} ({better} is better; 95% bootstrap CI)")
    fig.suptitle(f"{header} per method and domain (sorted on {first})", x=0.02, ha="left")
    handles = [Line2D([], [], color=PALETTE[i % len(PALETTE)], marker="o", ms=3.2, lw=0.9,
                      label=d) for i, d in enumerate(doms)]
    handles += [Line2D([], [], color=REFERENCE_COLOR, ls="--" if column == "ood_auroc" else "",
                       marker="" if column == "ood_auroc" else "|", label="random ranking"),
                Line2D([], [], color="black", marker="o", mfc="white", ms=3.2, ls="",
                       label="model at chance")]
    ax.legend(handles=handles, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncols=4,
              borderaxespad=0.2, columnspacing=0.8, handletextpad=0.3)
    return fig


__all__ = ["FOREST_COLUMNS", "forest_figure"]
