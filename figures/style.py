"""One look for every figure: seaborn theme, colour-blind-safe palette, fixed method styles.

Sizes are chosen to be readable at paper column width (`COLUMN_WIDTH` = 3.3 in) without
rescaling: 8 pt text, 7 pt ticks, 6.5 pt legends. The palette is Okabe & Ito's (2008), which
stays distinguishable under the common colour-vision deficiencies; a method keeps the same
(colour, line style) in every figure of a run (`MethodStyles`).
"""
from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import matplotlib as mpl
import seaborn as sns
from cycler import cycler
from matplotlib.figure import Figure

COLUMN_WIDTH = 3.3  # inches, one paper column
TEXT_WIDTH = 6.9  # inches, two columns

# Okabe-Ito, yellow last (poor contrast on white), then Paul Tol's muted extras.
BLACK, ORANGE, SKY, GREEN, YELLOW, BLUE, VERMILLION, PURPLE = (
    "#000000", "#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7")
GREY = "#8C8C8C"
PALETTE = (VERMILLION, BLUE, BLACK, GREEN, ORANGE, PURPLE, SKY, "#332288", "#882255", "#999933",
           YELLOW)
LINESTYLES = ("-", "--", ":", "-.")
ID_COLOR, SHIFT_COLOR = SKY, ORANGE  # in-distribution vs shifted split
REFERENCE_COLOR = GREY  # oracle / random / chance references

#: Gate families of the compute figures (frontier, thermostat, ablation).
GATE_COLORS = {"topk": BLUE, "care": VERMILLION, "fixed-k": BLUE, "random-k": GREY,
               "entropy-k": GREEN, "nucleus-only": ORANGE}

#: Headline methods keep their colour in every run (matched on "model/gate/scorer").
_RESERVED = ((re.compile(r"^[^/]+/care[^/]*/care$"), VERMILLION),
             (re.compile(r"^[^/]+/top4/msp$"), BLUE),
             (re.compile(r"^[^/]+/dense/msp$"), BLACK))

#: Scorers in the order a figure prefers them when it cannot show every method: the paper's
#: Table "uq" (CARE, MSP, routing entropy, MC-dropout, deep ensemble, entropy), then the rest.
SCORER_PRIORITY = ("care", "msp", "routing_entropy", "mc_dropout_mutual_info",
                   "ensemble_mutual_info", "entropy", "mc_dropout_msp", "ensemble_msp",
                   "mc_dropout_entropy", "ensemble_entropy", "energy", "margin", "top1_mass",
                   "disagreement")


def rc_params() -> dict[str, Any]:
    return {
        "font.size": 8, "axes.titlesize": 8, "axes.labelsize": 8, "xtick.labelsize": 7,
        "ytick.labelsize": 7, "legend.fontsize": 6.5, "legend.title_fontsize": 7,
        "figure.titlesize": 9, "lines.linewidth": 1.3, "lines.markersize": 4,
        "axes.linewidth": 0.7, "grid.linewidth": 0.5, "patch.linewidth": 0.5,
        "legend.frameon": False, "savefig.dpi": 200, "savefig.bbox": "tight",
        "pdf.fonttype": 42, "ps.fonttype": 42,
        "axes.prop_cycle": cycler(color=list(PALETTE)),
    }


@contextlib.contextmanager
def theme() -> Iterator[None]:
    """The uqbench theme, applied only inside the ``with`` block (global state is restored)."""
    with mpl.rc_context(), sns.axes_style("ticks", {"axes.grid": True, "grid.color": "#E6E6E6"}):
        mpl.rcParams.update(rc_params())  # type: ignore[arg-type]
        yield


def new_figure(width: float = COLUMN_WIDTH, height: float = 2.4, **kw: object) -> Figure:
    """A figure outside pyplot's registry: nothing to close, nothing leaks between figures."""
    return Figure(figsize=(width, height), layout="constrained", **kw)  # type: ignore[arg-type]


def split_method(method: str) -> tuple[str, str, str]:
    """"model/gate/scorer" -> (model, gate, scorer); scorer names never contain "/"."""
    head, scorer = method.rsplit("/", 1)
    model, gate = head.rsplit("/", 1)
    return model, gate, scorer


def priority_key(method: str, index: int) -> tuple[int, int, int]:
    """Sort key: CARE's read-out on a CARE gate and plain scorers on the other gates first
    ("native" methods), then by `SCORER_PRIORITY`, then run order."""
    _, gate, scorer = split_method(method)
    native = (scorer == "care") == gate.startswith("care")
    rank = SCORER_PRIORITY.index(scorer) if scorer in SCORER_PRIORITY else len(SCORER_PRIORITY)
    return (0 if native else 1, rank, index)


def select_methods(methods: Sequence[str], limit: int | None) -> list[str]:
    """At most ``limit`` methods (run order kept), preferring `priority_key`; None: all."""
    if limit is None or len(methods) <= limit:
        return list(methods)
    keep = set(sorted(methods, key=lambda m: priority_key(m, methods.index(m)))[:limit])
    return [m for m in methods if m in keep]


@dataclass(frozen=True)
class LineStyle:
    color: str
    linestyle: str | tuple[float, tuple[float, ...]] = "-"

    def kw(self) -> dict[str, Any]:
        return {"color": self.color, "linestyle": self.linestyle}


class MethodStyles:
    """Fixed method -> (colour, line style) map of one run.

    Built once from *all* methods of the run, in `priority_key` order, so the methods a figure
    shows first get distinct solid colours; reserved headline methods (CARE read-out on a CARE
    gate, top-4 MSP, dense MSP) keep the same colour across runs.
    """

    def __init__(self, methods: Sequence[str]) -> None:
        self._map: dict[str, LineStyle] = {}
        ordered = sorted(dict.fromkeys(methods), key=lambda m: priority_key(m, methods.index(m)))
        free = list(PALETTE)
        for m in ordered:
            for pattern, color in _RESERVED:
                if pattern.match(m) and color in free:
                    self._map[m] = LineStyle(color)
                    free.remove(color)
                    break
        rest = [m for m in ordered if m not in self._map]
        cycle = free + [c for c in PALETTE if c not in free]
        for i, m in enumerate(rest):
            self._map[m] = LineStyle(cycle[i % len(cycle)],
                                     LINESTYLES[(i // len(cycle)) % len(LINESTYLES)])

    def __getitem__(self, method: str) -> LineStyle:
        if method not in self._map:  # a method outside the run: deterministic fallback
            self._map[method] = LineStyle(PALETTE[len(self._map) % len(PALETTE)], "-.")
        return self._map[method]

    def color(self, method: str) -> str:
        return self[method].color


def gate_color(gate: str) -> str:
    """Colour of a gate family: fixed top-k, CARE (any budget or tau) or an ablation gate."""
    if gate in GATE_COLORS:
        return GATE_COLORS[gate]
    if gate.startswith("care"):
        return GATE_COLORS["care"]
    if re.fullmatch(r"top\d+", gate):
        return GATE_COLORS["topk"]
    return GREY


def note(ax: object, text: str, *, fontsize: float = 7) -> None:
    """Write an explanation in the middle of an axes whose data cannot be drawn."""
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center",  # type: ignore[attr-defined]
            fontsize=fontsize, color="#444444", wrap=True,
            bbox={"boxstyle": "round,pad=0.4", "fc": "#F5F5F5", "ec": "#CCCCCC", "lw": 0.5})


__all__ = [
    "COLUMN_WIDTH",
    "PALETTE",
    "TEXT_WIDTH",
    "LineStyle",
    "MethodStyles",
    "gate_color",
    "new_figure",
    "note",
    "select_methods",
    "split_method",
    "theme",
]
