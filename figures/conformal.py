"""Conformal coverage against the nominal 1 − α: ID and shifted split, per method and score.

The true-label conformity scores are the run's own (``scores.npz`` keys
``"{method}|{domain}|{calib,id,shift}|conformity_{score}"``, written by the runner through
`uqbench.results.conformal_risk`); each curve is `uqbench.stats.conformal.coverage_curve` (q̂ from
the calib split, coverage on the ID or the shifted split, seed 0). A calibrated method lies on the
diagonal on ID; below it under shift, its sets lose their guarantee.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
from matplotlib.figure import Figure

from figures.data import RunData
from figures.style import TEXT_WIDTH, new_figure
from uqbench.stats import conformal as C

log = logging.getLogger(__name__)

#: (score key, panel title)
PANELS = (("lac", "LAC"), ("aps_rand", "APS (randomised)"), ("raps_rand", "RAPS (randomised)"))
#: The α grid of the curves: 1 − α from 0.5 to 0.98.
ALPHA_GRID = np.round(np.arange(0.02, 0.51, 0.02), 2)


def _scores(run: RunData, method: str, domain: str, role: str, score: str) -> np.ndarray | None:
    a = run.array(method, domain, role, f"conformity_{score}")
    return None if a is None else np.asarray(a, dtype=np.float64).reshape(len(a), -1)[:, 0]


def coverage_figure(run: RunData, domain: str, methods: Sequence[str]) -> Figure | None:
    """Panels: `PANELS`; a line per predictive distribution (the scorers of one model share
    theirs, and so their sets: one line, labelled with them), solid on ID, dashed on the
    shifted split. None (with a log note) when the run holds no conformity scores (a run
    written before them)."""
    shown = [m for m in methods if _scores(run, m, domain, "calib", "lac") is not None]
    if not shown:
        log.info("no conformity scores for %s in scores.npz: the conformal coverage figure is "
                 "skipped (rerun `uqbench run` to get them)", domain)
        return None
    groups: dict[bytes, list[str]] = {}  # equal conformity scores -> one line
    for m in shown:
        key = b"".join(_scores(run, m, domain, r, s).tobytes()  # type: ignore[union-attr]
                       for s, _ in PANELS for r in ("calib", "id", "shift")
                       if _scores(run, m, domain, r, s) is not None)
        groups.setdefault(key, []).append(m)
    fig = new_figure(TEXT_WIDTH, 2.9)
    axes = fig.subplots(1, len(PANELS), sharey=True)
    for ax, (score, title) in zip(axes, PANELS, strict=False):
        ax.plot([0.5, 1], [0.5, 1], color="#999999", lw=0.8, ls=":", label="nominal")
        for same in groups.values():
            method = same[0]
            cal = _scores(run, method, domain, "calib", score)
            for role, ls in (("id", "-"), ("shift", "--")):
                test = _scores(run, method, domain, role, score)
                if cal is None or test is None:
                    continue
                nominal, cov = C.coverage_curve(cal, test, ALPHA_GRID)
                scorers = ", ".join(m.rsplit("/", 1)[1] for m in same)
                label = method if len(same) == 1 else f"{method.rsplit('/', 1)[0]}/{{{scorers}}}"
                ax.plot(nominal, cov, ls=ls, lw=1.1, color=run.styles.color(method),
                        label=label if role == "id" else "_shift", gid=method)
        ax.set(xlim=(0.5, 1), ylim=(0.3, 1.0), xlabel="nominal coverage 1 − α", title=title)
    axes[0].set_ylabel("empirical coverage")
    axes[0].plot([], [], color="#333333", ls="-", label="ID split (solid)")
    axes[0].plot([], [], color="#333333", ls="--", label="shifted split (dashed)")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=2, fontsize=6)
    seed = run.seed_note()
    fig.suptitle(f"Conformal coverage, {domain} (q̂ from the calib split; shift calibrated on ID)"
                 + (f" ({seed})" if seed else ""))
    return fig


__all__ = ["ALPHA_GRID", "PANELS", "coverage_figure"]
