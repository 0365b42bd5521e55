"""Draw every figure a finished run folder supports (`draw_run`, ``uqbench plot RUN_DIR``).

The run is read by `figures.data` (`load_run`); each figure comes from a panel module
(`figures.calibration`, `figures.selective`, `figures.ood`, `figures.recalibrated`,
`figures.conformal`, `figures.forest`, `figures.compute`, `figures.mechanism`, `figures.training`,
`figures.ranking`), which
imports `figures.data` and never this module. Figures only *read* the run's records: every
curve comes from a `uqbench.stats.metrics` (or `uqbench.stats.conformal`) curve function, every
table number from ``results.jsonl``.
"""
from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from multiprocessing import get_context
from pathlib import Path

from matplotlib.figure import Figure

from figures import (
    calibration,
    compute,
    conformal,
    forest,
    mechanism,
    ood,
    ranking,
    recalibrated,
    selective,
    training,
)
from figures.data import POOLED, ROLES, RunData, Scores, load_run
from figures.style import select_methods, theme
from uqbench.core.errors import UserError

log = logging.getLogger(__name__)

FORMATS = ("png", "pdf")
#: the metadata that keeps each format's file free of the time it was written, so that a
#: figure drawn again from the same run is the same bytes (a PNG holds no date)
UNDATED: dict[str, dict[str, None]] = {"pdf": {"CreationDate": None}, "svg": {"Date": None}}


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "x"


def figure_plan(run: RunData, *, max_methods: int | None = 8,
                methods: list[str] | None = None) -> list[tuple[str, Callable[[], Figure | None]]]:
    """(file stem, builder) of every figure; a builder returns None when the run's data does
    not support its figure (and logs why)."""
    if methods is not None:
        unknown = [m for m in methods if m not in run.methods]
        if unknown:
            raise UserError(f"unknown method(s) {', '.join(unknown)}; this run has: "
                            f"{', '.join(run.methods)}")
        shown = list(methods)
    else:
        shown = select_methods(run.methods, max_methods)
        if len(shown) < len(run.methods):
            log.info("figures show %d of %d methods (%s); pass methods=... to choose",
                     len(shown), len(run.methods), ", ".join(shown))
    plan: list[tuple[str, Callable[[], Figure | None]]] = []
    for dom in run.domains:
        s = _slug(dom)
        plan += [
            (f"reliability_{s}", partial(calibration.reliability_figure, run, dom, shown)),
            (f"risk_coverage_{s}", partial(selective.risk_coverage_figure, run, dom, shown)),
            (f"ood_roc_{s}", partial(ood.roc_figure, run, dom, shown)),
        ]
    hist_dom = POOLED if POOLED in run.domains else run.domains[0]
    plan += [
        (f"ood_hist_{_slug(hist_dom)}", partial(ood.histogram_figure, run, hist_dom, shown)),
        (f"reliability_recalibrated_{_slug(hist_dom)}",
         partial(recalibrated.recalibrated_reliability_figure, run, hist_dom, shown)),
        (f"conformal_coverage_{_slug(hist_dom)}",
         partial(conformal.coverage_figure, run, hist_dom, shown)),
        *((f"forest_{c}", partial(forest.forest_figure, run, c)) for c in forest.FOREST_COLUMNS),
        ("frontier", partial(compute.frontier_figure, run)),
        ("thermostat", partial(compute.thermostat_figure, run)),
        ("allocation", partial(compute.allocation_figure, run)),
        ("ablation", partial(compute.ablation_figure, run)),
        ("mechanism", partial(mechanism.mechanism_figure, run)),
        ("training", partial(training.training_figure, run)),
    ]
    if ranking.model_methods(run):  # a run over several models (uqbench score SRC1 SRC2 ...)
        plan += [("models_ranking", partial(ranking.ranking_figure, run)),
                 *((f"models_reliability_{_slug(d)}",
                    partial(ranking.models_reliability_figure, run, d)) for d in run.domains)]
    return plan


def draw_run(run_dir: str | Path, *, max_methods: int | None = 8,
             methods: list[str] | None = None, workers: int | str = "auto") -> list[Path]:
    """Draw every figure the run's records support into ``run_dir/figures/`` (PNG and PDF).

    Parameters
    ----------
    run_dir : path
        A finished ``uqbench run`` folder.
    max_methods : int or None, default 8
        Per-method figures (reliability, risk-coverage, ROC, histograms) show at most this
        many methods, preferring CARE and the paper's Table "uq" methods; None: all.
    methods : list of str, optional
        Exactly these methods instead.
    workers : int or "auto", default "auto"
        Processes drawing the figures, each a share of them (1: in this process). ``"auto"``:
        the cores this process may use, at most one per `MIN_FIGURES_PER_WORKER` figures (a
        worker pays for its start and for reading the run).

    Returns
    -------
    list of Path
        The written files, PNG and PDF of each figure, in the plan's order (the same files
        whatever ``workers``). Figures the data does not support (e.g. the frontier outside a
        ``--experiment frontier`` run) are skipped with a log note.

    Raises
    ------
    UserError
        The run folder lacks ``results.jsonl`` or ``scores.npz``.
    """
    run = load_run(run_dir)
    stems = [stem for stem, _ in figure_plan(run, max_methods=max_methods, methods=methods)]
    n = _figure_workers(workers, len(stems))
    if n == 1:
        drawn = _draw(run, stems, max_methods, methods, FORMATS)
    else:
        drawn = {}
        with ProcessPoolExecutor(n, mp_context=get_context("spawn")) as ex:
            for share, records in ex.map(_draw_share, [run.path] * n,
                                         [stems[i::n] for i in range(n)], [max_methods] * n,
                                         [methods] * n, [FORMATS] * n):
                drawn.update(share)
                for name, level, msg in records:
                    logging.getLogger(name).log(level, "%s", msg)
    return [p for stem in stems for p in drawn.get(stem, [])]


#: figures a worker process must have to draw before `draw_run` starts one (``"auto"``)
MIN_FIGURES_PER_WORKER = 3


def _figure_workers(requested: int | str, n_figures: int) -> int:
    if requested == "auto":
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
            else os.cpu_count() or 1
        return max(1, min(cores, n_figures // MIN_FIGURES_PER_WORKER))
    if isinstance(requested, bool) or not isinstance(requested, int) or requested < 1:
        raise UserError(f"figure workers must be 'auto' or a whole number >= 1; got "
                        f"{requested!r}")
    return max(1, min(requested, n_figures))


class _Kept(logging.Handler):
    """Keeps the records of a worker's figures (what was skipped, and why) for the parent."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[tuple[str, int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.name != __name__:   # not figure_plan's note, which the parent logged
            self.records.append((record.name, record.levelno, record.getMessage()))


def _draw_share(run_dir: Path, stems: list[str], max_methods: int | None,
                methods: list[str] | None, formats: tuple[str, ...]
                ) -> tuple[dict[str, list[Path]], list[tuple[str, int, str]]]:
    """A worker's share of `draw_run`: the run read again, the figures ``stems`` drawn, and
    the log records of drawing them (logged again by the parent)."""
    run = load_run(run_dir)
    root, kept = logging.getLogger("figures"), _Kept()
    root.addHandler(kept)
    root.setLevel(logging.INFO)
    try:
        return _draw(run, stems, max_methods, methods, formats), kept.records
    finally:
        root.removeHandler(kept)


def _draw(run: RunData, stems: list[str], max_methods: int | None,
          methods: list[str] | None, formats: tuple[str, ...]) -> dict[str, list[Path]]:
    """Draw the figures ``stems`` of ``run``'s plan in ``formats`` (`FORMATS`, as the caller
    sees it) into its ``figures/``: the files of each figure drawn (none for a figure the data
    does not support)."""
    out = run.path / "figures"
    out.mkdir(parents=True, exist_ok=True)
    wanted = set(stems)
    paths: dict[str, list[Path]] = {}
    with theme():
        for stem, build in figure_plan(run, max_methods=max_methods, methods=methods):
            if stem not in wanted:
                continue
            fig = build()
            if fig is None:
                continue
            for fmt in formats:
                p = out / f"{stem}.{fmt}"
                fig.savefig(p, format=fmt, metadata=UNDATED.get(fmt))
                paths.setdefault(stem, []).append(p)
                # the other formats keep the layout the first one computed: the same picture,
                # and constrained layout run again on a laid-out forest plot collapses its axes
                fig.set_layout_engine("none")
            fig.clear()  # figures live outside pyplot: dropping the reference frees them
    return paths


__all__ = ["POOLED", "ROLES", "RunData", "Scores", "draw_run", "figure_plan", "load_run"]
