"""Reliability diagrams after post-hoc recalibration: raw, temperature scaling, histogram
binning and isotonic regression side by side, one row per method, on the ID split.

The recalibrated confidences are the run's own (``scores.npz`` keys
``"{method}|{domain}|id|confidence_{ts,hb,iso}"``, written by the runner from
`uqbench.results.recalibration`, fitted on the domain's calibration split); this module only reads
and draws them, with the same bins as the raw diagram (`figures.calibration.ReliabilityDisplay`).
"""
from __future__ import annotations

import logging
from collections.abc import Sequence

from matplotlib.figure import Figure

from figures.calibration import ReliabilityDisplay
from figures.data import RunData, Scores
from figures.style import TEXT_WIDTH, new_figure, note, split_method
from uqbench.stats.metrics import ECE_BINS

log = logging.getLogger(__name__)

#: (key suffix, column title): "" is the raw confidence.
KINDS = (("", "raw"), ("ts", "temperature scaling"), ("hb", "histogram binning"),
         ("iso", "isotonic regression"))
#: Rows at most: four diagrams per method make a tall figure.
MAX_METHODS = 4


def _confidence(run: RunData, method: str, domain: str, kind: str) -> Scores | None:
    s = run.scores(method, domain, "id")
    if s is None or not kind:
        return s
    c = run.array(method, domain, "id", f"confidence_{kind}")
    return None if c is None else Scores(s.uncertainty, c.astype(float).ravel(), s.correct)


def recalibrated_reliability_figure(run: RunData, domain: str, methods: Sequence[str], *,
                                    max_methods: int = MAX_METHODS) -> Figure | None:
    """Rows: the first ``max_methods`` of ``methods`` that have recalibrated confidences;
    columns: `KINDS`. None (with a log note) when the run holds none (a run written before
    recalibration, or without calibration splits)."""
    shown = [m for m in methods if _confidence(run, m, domain, "ts") is not None][:max_methods]
    if not shown:
        log.info("no recalibrated confidences for %s in scores.npz: the recalibrated "
                 "reliability figure is skipped (rerun `uqbench run` to get them)", domain)
        return None
    ncols = len(KINDS)
    fig = new_figure(TEXT_WIDTH, 2.3 * len(shown))
    outer = fig.add_gridspec(len(shown), ncols)
    for i, method in enumerate(shown):
        color = run.styles.color(method)
        for j, (kind, title) in enumerate(KINDS):
            inner = outer[i, j].subgridspec(2, 1, height_ratios=(3.2, 1), hspace=0.05)
            ax = fig.add_subplot(inner[0])
            axc = fig.add_subplot(inner[1], sharex=ax)
            s = _confidence(run, method, domain, kind)
            problem = "no recalibrated confidences" if s is None else s.problem()
            head = f"{title}\n" if i == 0 else ""
            if problem is not None:
                ax.set_title(head)
                note(ax, f"{problem}:\nno reliability diagram")
                ax.set(xlim=(0, 1), ylim=(0, 1))
                axc.set_axis_off()
            else:
                assert s is not None
                disp = ReliabilityDisplay.from_predictions(s.confidence, s.correct,
                                                           n_bins=ECE_BINS, label=method)
                disp.plot(ax, axc, color=color)
                ax.set_title(f"{head}ECE {disp.ece:.3f}")
            ax.tick_params(labelbottom=False)
            if j == 0:
                model, gate, scorer = split_method(method)
                ax.set_ylabel(f"{model}/{gate}\n{scorer}\naccuracy")
                axc.set_ylabel("count")
            else:
                ax.tick_params(labelleft=False)
            axc.set_xlabel("confidence")
    seed = run.seed_note()
    fig.suptitle(f"Reliability after recalibration on the calibration split ({ECE_BINS} bins), "
                 f"{domain}, ID split" + (f" ({seed})" if seed else ""))
    return fig


__all__ = ["KINDS", "recalibrated_reliability_figure"]
