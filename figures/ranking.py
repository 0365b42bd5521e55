"""Figures of a run over several models (``uqbench score SRC1 SRC2 ...``, whose ``run.json``
``model_table`` names the models and the scorer that stands for each).

`ranking_figure`: one panel per metric of the model table (`uqbench.results.tables.
MODEL_COLUMNS`), the models sorted best first on the first domain (``pooled``), each domain's
value and 95% bootstrap CI; every number is a cell of ``results.jsonl``, nothing is computed
here. `models_reliability_figure`: every model's reliability diagram side by side
(`figures.calibration.reliability_figure` on each model's method).
"""
from __future__ import annotations

import math

from matplotlib.figure import Figure

from figures.calibration import reliability_figure
from figures.data import RunData
from figures.forest import best_first, domain_handles, draw_intervals, finite
from figures.style import TEXT_WIDTH, new_figure
from uqbench.results.tables import MODEL_COLUMNS, header

ROW_HEIGHT = 0.22  # inches per model and panel row
NCOLS = 2
CHAR_WIDTH = 0.062  # inches per character of an 8 pt title


def model_methods(run: RunData) -> dict[str, str]:
    """model -> the method that stands for it (``run.json`` ``model_table``); empty for a run
    of one model."""
    t = run.meta.get("model_table") or {}
    return {m: f"{m}/{t['scorer']}" for m in t.get("models", ())
            if f"{m}/{t['scorer']}" in run.methods}


def ranking_figure(run: RunData) -> Figure | None:
    """Per metric, every model's value [CI] per domain, best first; None for one model."""
    methods = model_methods(run)
    cols = [c for c in MODEL_COLUMNS if any(
        finite((run.row(m, d) or {}).get(c)) is not None for m in methods.values()
        for d in run.domains)]
    if len(methods) < 2 or not cols:
        return None
    doms, first = run.domains, run.domains[0]
    gates = {m.rsplit("/", 1)[-1] for m in methods}
    # one gate for all (lm-eval: the normalisation): named once in the title, not per label
    label = {m: m.rsplit("/", 1)[0] if len(gates) == 1 else m for m in methods}
    nrows = math.ceil(len(cols) / NCOLS)
    fig = new_figure(TEXT_WIDTH, nrows * (0.9 + ROW_HEIGHT * len(methods)) + 0.4)
    for k, c in enumerate(cols):
        ax = fig.add_subplot(nrows, min(NCOLS, len(cols)), k + 1)
        order = best_first(run, list(methods), c, methods.__getitem__)  # best at the top
        draw_intervals(ax, run, c, [(m, methods[m]) for m in order], tag=f"{c}|")
        ax.set_yticklabels([label[m] for m in order])
        ax.set_title(header(c))
    shared = f", all /{next(iter(gates))}" if len(gates) == 1 else ""
    fig.suptitle(f"Models ranked on {first} (best at the top; 95% bootstrap CI{shared})",
                 x=0.02, ha="left")
    fig.legend(handles=domain_handles(doms), loc="outside lower center", ncols=len(doms))
    return fig


def models_reliability_figure(run: RunData, domain: str) -> Figure | None:
    """Every model's reliability diagram on ``domain``'s ID split, side by side (panels wide
    enough for the models' names); None for one model."""
    methods = model_methods(run)
    if len(methods) < 2:
        return None
    width = max(TEXT_WIDTH / 3, CHAR_WIDTH * max(map(len, methods)))
    return reliability_figure(run, domain, list(methods.values()),
                              ncols=min(max(1, round(2 * TEXT_WIDTH / width)), len(methods)),
                              panel_width=width)


__all__ = ["model_methods", "models_reliability_figure", "ranking_figure"]
