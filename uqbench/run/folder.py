"""Writing a run folder: tables, ``run.json``, ``scores.npz``, figures (redrawn only when their
inputs changed) and ``report.html``, and the summary printed at the end of a run."""
from __future__ import annotations

import hashlib
import inspect
import json
import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from uqbench.core.engine import get_drawer
from uqbench.files import rundir
from uqbench.files.cache import atomic_write_text
from uqbench.files.rundir import RunFolder
from uqbench.reporting.answers import learned_lines
from uqbench.reporting.html import write_report
from uqbench.results.columns import RESULTS_SCHEMA
from uqbench.results.references import trained, warn_at_chance
from uqbench.results.tables import summary, write_results

log = logging.getLogger(__name__)


def write_run(out: Path, rows: list[dict[str, Any]], arrays: Mapping[str, np.ndarray],
              meta: dict[str, Any], *, t0: float, figures: bool, final: Path | None = None,
              figure_set: str = "figures") -> None:
    """Write a run folder's tables, ``run.json`` (with ``at_chance`` and ``seconds``), scores,
    figures (drawn by the figure set ``figure_set``) and ``report.html``; ``t0``: when the run
    started (``perf_counter``), for ``seconds.total``; ``final``: where ``out`` will be renamed
    to (messages name it)."""
    meta["results_schema"] = RESULTS_SCHEMA
    meta["at_chance"] = warn_at_chance(rows)  # one WARNING listing every method at chance
    meta["seconds"]["total"] = time.perf_counter() - t0
    write_results(out, rows, meta)
    rundir.write_scores(out, arrays)
    if figures:
        t_fig = time.perf_counter()
        _draw_figures(out, arrays, meta.get("training", {}), figure_set)
        meta["seconds"]["figures"] = time.perf_counter() - t_fig
        meta["seconds"]["total"] = time.perf_counter() - t0
        atomic_write_text(out / rundir.META, json.dumps(meta, indent=1, default=str))
    _write_html_report(out, meta, final or out)
    print("seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in meta["seconds"].items()),
          flush=True)


def _write_html_report(out: Path, meta: dict[str, Any], final: Path) -> None:
    """``report.html`` (`uqbench.reporting.html`), which must never fail a run: if rendering fails,
    the error is warned about and recorded in ``run.json`` ``report_html_error``; results stay."""
    try:
        write_report(out)
    except Exception as exc:  # noqa: BLE001 -- any rendering error: the run's results stand
        meta["report_html_error"] = f"{type(exc).__name__}: {exc}"
        log.warning("report.html was not written (%s); the results are complete, rerun "
                    "`uqbench report %s --html` after fixing it", meta["report_html_error"], final)
        atomic_write_text(out / rundir.META, json.dumps(meta, indent=1, default=str))


def print_summary(out: Path, rows: Sequence[Mapping[str, Any]], meta: Mapping[str, Any]) -> None:
    """The pooled table, the at-chance warning and where the files are."""
    print(summary(rows, learned=trained(meta)), flush=True)
    if meta["at_chance"]:  # the list went to the log (stderr) once; the summary points at it
        print(f"\nWARNING: {len(meta['at_chance'])} method/domain result(s) have an ID accuracy "
              "CI that includes chance (listed in the log, on stderr, and in run.json "
              "`at_chance`): their UQ numbers measure a model at chance", flush=True)
    for line in learned_lines(RunFolder(out, [dict(r) for r in rows], {}, dict(meta))):
        print(line, flush=True)
    print(f"\nwrote {out}/results.{{md,csv,jsonl,tex}}", flush=True)


def _draw_figures(out: Path, arrays: Mapping[str, np.ndarray], training: Any,
                  figure_set: str = "figures") -> None:
    """Draw the run's figures with the figure set ``figure_set`` unless ``figures/STAMP`` shows
    they were drawn from these very results by this very figures code and are all still there
    (a warm rerun then costs nothing)."""
    draw = get_drawer(figure_set)
    h = hashlib.sha256((out / rundir.RESULTS).read_bytes())
    h.update(json.dumps(training, sort_keys=True).encode())  # the training figure's input
    for k in sorted(arrays):
        h.update(k.encode() + np.ascontiguousarray(arrays[k]).tobytes())
    for src in sorted(Path(inspect.getfile(draw)).parent.glob("*.py")):  # the figures code
        h.update(src.read_bytes())
    stamp = out / rundir.FIGURES / "STAMP"
    try:
        old = json.loads(stamp.read_text())
        if old["hash"] == h.hexdigest() and all((out / rundir.FIGURES / f).exists()
                                                for f in old["files"]):
            log.info("figures are up to date with these results; not redrawn")
            return
    except (OSError, ValueError, KeyError, TypeError):
        pass
    paths = draw(out)
    atomic_write_text(stamp, json.dumps({"hash": h.hexdigest(), "files": [p.name for p in paths]}))


__all__ = ["print_summary", "write_run"]
