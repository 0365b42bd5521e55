"""Forest plots: one figure per ranking metric (the scorer-level columns with a bootstrap CI),
every method's value and 95% CI per domain, methods sorted by their value on the first domain
(``pooled`` when present), the random-ranking value marked (`uqbench.results.tables.
random_ranking`). Every number drawn is a cell of ``results.jsonl``: nothing is computed here.
A model at chance on a domain draws hollow markers."""
from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from figures.data import RunData
from figures.style import PALETTE, REFERENCE_COLOR, new_figure
from uqbench.results.columns import COLUMNS
from uqbench.results.tables import FOREST_COLUMNS, chance_reasons, random_ranking, short_name

ROW_HEIGHT = 0.17  # inches per method


def finite(v: Any) -> float | None:
    """``v`` as a float, or None where it is missing or NaN (a results cell)."""
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def best_first(run: RunData, names: Sequence[str], column: str,
               method: Callable[[str], str] = str) -> list[str]:
    """``names`` sorted best first by ``column``'s value on the run's first domain (the row of
    ``method(name)``), those without a value last."""
    higher = COLUMNS[column].higher_is_better

    def key(n: str) -> tuple[bool, float]:
        v = finite((run.row(method(n), run.domains[0]) or {}).get(column))
        return (v is None, -v if v is not None and higher else (v or 0.0))

    return sorted(names, key=key)


def draw_intervals(ax: Axes, run: RunData, column: str, order: Sequence[tuple[str, str]], *,
                   hollow: Collection[tuple[str, str]] = (), tag: str = "",
                   random_marks: bool = False) -> None:
    """Row j of ``order`` ((label, method), top first): per domain, ``column``'s value (gid
    ``{tag}{label}|{domain}``) and its 95% CI (``ci|...``) read off the results row, hollow for
    the (method, domain) in ``hollow``; with ``random_marks``, the random-ranking value."""
    step = 0.8 / max(len(run.domains), 1)
    for i, dom in enumerate(run.domains):
        color = PALETTE[i % len(PALETTE)]
        for j, (label, m) in enumerate(order):
            row = run.row(m, dom) or {}
            v = finite(row.get(column))
            if v is None:
                continue
            y = j - 0.4 + step * (i + 0.5)
            lo, hi = finite(row.get(f"{column}_lo")), finite(row.get(f"{column}_hi"))
            if lo is not None and hi is not None:
                ax.plot([lo, hi], [y, y], color=color, lw=0.9, gid=f"ci|{tag}{label}|{dom}")
            ax.plot([v], [y], "o", ms=3.2, color=color,
                    mfc="white" if (m, dom) in hollow else color, mew=0.9,
                    gid=f"{tag}{label}|{dom}")
            ref = random_ranking(column, row) if random_marks else None
            if ref is not None and column != "ood_auroc":
                ax.plot([ref], [y], "|", ms=5, color=REFERENCE_COLOR, gid=f"random|{m}|{dom}")
    if column == "ood_auroc":
        ax.axvline(0.5, color=REFERENCE_COLOR, ls="--", lw=0.8, gid="random")
    ax.set_yticks(range(len(order)), [label for label, _ in order])
    ax.set_ylim(len(order) - 0.5, -0.5)
    ax.grid(axis="y", visible=False)


def domain_handles(doms: Sequence[str]) -> list[Line2D]:
    """A legend entry (colour, marker) per domain, as `draw_intervals` draws them."""
    return [Line2D([], [], color=PALETTE[i % len(PALETTE)], marker="o", ms=3.2, lw=0.9,
                   label=d) for i, d in enumerate(doms)]


def forest_figure(run: RunData, column: str) -> Figure | None:
    """``column``'s value [CI] of every method on every domain; None without any value."""
    doms = run.domains
    methods = [m for m in run.methods
               if any(finite((run.row(m, d) or {}).get(column)) is not None for d in doms)]
    if not methods:
        return None
    higher, first = COLUMNS[column].higher_is_better, doms[0]
    methods = best_first(run, methods, column)  # best first: drawn at the top
    fig = new_figure(4.6, 1.3 + ROW_HEIGHT * len(methods))
    ax = fig.add_subplot()
    draw_intervals(ax, run, column, [(m, m) for m in methods],
                   hollow=chance_reasons(run.rows + run.references), random_marks=True)
    header = short_name(column)
    better = "higher" if higher else "lower"
    ax.set_xlabel(f"{header} ({better} is better; 95% bootstrap CI)")
    fig.suptitle(f"{header} per method and domain (sorted on {first})", x=0.02, ha="left")
    handles = domain_handles(doms) + [
        Line2D(
            [],
            [],
            color=REFERENCE_COLOR,
            ls="--" if column == "ood_auroc" else "",
            marker="" if column == "ood_auroc" else "|",
            label="random ranking",
        ),
        Line2D(
            [], [], color="black", marker="o", mfc="white", ms=3.2, ls="", label="model at chance"
        ),
    ]
    ax.legend(handles=handles, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncols=4,
              borderaxespad=0.2, columnspacing=0.8, handletextpad=0.3)
    return fig


__all__ = ["FOREST_COLUMNS", "forest_figure"]
