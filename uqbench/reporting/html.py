"""``report.html``: one self-contained page per run folder, and ``compare.html``.

Rendered from ``run.json``, ``results.jsonl``, ``scores.npz``'s presence, ``figures/*.png`` and
``paper_report.md`` through the Jinja2 templates of ``uqbench/reporting/templates`` (autoescaped). The
page needs no network: the figures are inlined as base64 PNG data, the style and the table
sorting are inline. A part of the run folder that is missing or unreadable (an interrupted run,
a corrupt figure) is named on the page in its section, and the rest still renders.
"""
from __future__ import annotations

import base64
import json
import logging
import math
import re
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import jinja2

from uqbench.files import rundir
from uqbench.files.cache import atomic_write_text
from uqbench.results.tables import SHOWN, is_reference

log = logging.getLogger(__name__)

#: question -> figure stems (a stem matches itself or ``stem_<domain>``), in page order
QUESTIONS = (
    ("Calibration: are the confidences right?", ("reliability", "reliability_recalibrated")),
    ("OOD detection: does uncertainty rise under shift?", ("ood_roc", "ood_hist")),
    ("Selective prediction: does abstaining on the uncertain help?",
     ("risk_coverage", "conformal_coverage")),
    ("Compute: accuracy and calibration per expert budget",
     ("frontier", "thermostat", "allocation", "ablation", "mechanism")),
)
TRAINING_FIGURE = "training"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@cache
def _env() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("uqbench.reporting", "templates"),
                             autoescape=jinja2.select_autoescape(["html", "j2"]),
                             undefined=jinja2.StrictUndefined, trim_blocks=True,
                             lstrip_blocks=True)
    env.filters["num"] = _num
    return env


def _num(v: Any, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    return f"{v:.{digits}f}" if isinstance(v, (int, float)) else str(v)


def _figure(path: Path) -> dict[str, Any]:
    """A figure as a data URI, or the reason it cannot be shown."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        return {"name": path.stem, "error": f"{path.name} is unreadable ({exc})"}
    if not data.startswith(PNG_MAGIC):
        return {"name": path.stem, "error": f"{path.name} is not a PNG image (corrupt or "
                "truncated); redraw it with `uqbench plot RUN_DIR`"}
    return {"name": path.stem, "src": "data:image/png;base64," + base64.b64encode(data).decode()}


def _stem_of(name: str, stems: Sequence[str]) -> str | None:
    """The longest of ``stems`` that ``name`` is, or starts with followed by ``_``."""
    hits = [s for s in stems if name == s or name.startswith(s + "_")]
    return max(hits, key=len, default=None)


def figure_groups(fig_dir: Path) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """(one group per question with its figures, the training figure or None)."""
    pngs = sorted(fig_dir.glob("*.png")) if fig_dir.is_dir() else []
    all_stems = [s for _, stems in QUESTIONS for s in stems]
    groups = []
    for title, stems in QUESTIONS:
        figs = []
        for stem in stems:  # page order: the question's stems, then the file names
            figs += [_figure(p) for p in pngs if _stem_of(p.stem, all_stems) == stem]
        groups.append({"title": title, "figures": figs})
    other = [_figure(p) for p in pngs
             if _stem_of(p.stem, all_stems) is None and p.stem != TRAINING_FIGURE]
    if other:
        groups.append({"title": "Other figures", "figures": other})
    training = next((_figure(p) for p in pngs if p.stem == TRAINING_FIGURE), None)
    return groups, training


def _domain_tables(rows: Sequence[Mapping[str, Any]], at_chance: Sequence[Mapping[str, Any]]
                   ) -> list[dict[str, Any]]:
    reasons = {(f["method"], f["domain"]):
               f"ID accuracy CI [{_num(f.get('accuracy_lo'), 2)}, {_num(f.get('accuracy_hi'), 2)}]"
               f" includes chance {_num(f.get('chance'), 2)}: its UQ numbers measure a model at "
               "chance" for f in at_chance}
    domains = list(dict.fromkeys(r["domain"] for r in rows))
    domains = (["pooled"] if "pooled" in domains else []) + [d for d in domains if d != "pooled"]
    tables = []
    for dom in domains:
        out = []
        for r in rows:
            if r["domain"] != dom:
                continue
            cells = []
            for col, _, digits in SHOWN:
                v, lo, hi = r.get(col), r.get(f"{col}_lo"), r.get(f"{col}_hi")
                text = _num(v, digits)
                if lo is not None and not (isinstance(lo, float) and math.isnan(lo)):
                    text += f" [{_num(lo, digits)}, {_num(hi, digits)}]"
                sort = v if isinstance(v, (int, float)) and not math.isnan(v) else ""
                cells.append({"text": text, "sort": sort})
            out.append({"method": r["method"], "cells": cells, "reference": is_reference(r),
                        "chance": reasons.get((r["method"], dom), "")})
        tables.append({"domain": dom, "rows": out})
    return tables


def _paper_claims(path: Path) -> dict[str, Any] | None:
    """The verdict table of ``paper_report.md`` (None without one): header and rows."""
    if not path.exists():
        return None
    try:
        lines = [ln for ln in path.read_text().splitlines() if ln.startswith("|")]
    except (OSError, UnicodeDecodeError) as exc:
        return {"error": f"{path.name} is unreadable ({exc})", "header": [], "rows": []}
    cells = [[re.sub(r"\*+", "", c).strip() for c in ln.strip().strip("|").split("|")]
             for ln in lines if not set(ln) <= set("|-: ")]
    return {"error": "", "header": cells[0] if cells else [], "rows": cells[1:]}


def render_report(run_dir: str | Path) -> str:
    """The HTML page of a run folder; every missing or unreadable part is named on it."""
    run = rundir.read_run(run_dir, need=())
    meta = run.meta
    problems = dict(run.problems)
    fig_dir = run.path / rundir.FIGURES
    groups, training = figure_groups(fig_dir)
    if not fig_dir.is_dir():
        problems[rundir.FIGURES] = (f"{fig_dir} is missing: no figures (a run with "
                                    "--no-figures, or interrupted); `uqbench plot RUN_DIR` draws "
                                    "them")
    splits = [{"name": k, "n": v.get("n", "–"), "hash": v.get("hash", "–"),
               "recipe": json.dumps(v.get("recipe"), default=str) if v.get("recipe") else ""}
              for k, v in (meta.get("splits") or {}).items()]
    return _env().get_template("report.html.j2").render(
        title=f"uqbench run: {meta.get('suite', '?')} {meta.get('profile', '')}", meta=meta, problems=problems,
        config=json.dumps(meta.get("config", {}), indent=1, default=str),
        splits=splits, seconds=meta.get("seconds", {}), training=training,
        headers=[h for _, h, _ in SHOWN],
        tables=_domain_tables(run.rows, meta.get("at_chance") or []), groups=groups,
        paper=_paper_claims(run.path / rundir.PAPER_REPORT),
        skipped=meta.get("skipped_scorers") or [], fallbacks=meta.get("fallbacks") or [],
        references_skipped=meta.get("references_skipped") or {},
        scores_present=rundir.SCORES not in problems)


def write_report(run_dir: str | Path) -> Path:
    """Write ``RUN_DIR/report.html``; returns its path."""
    path = Path(run_dir) / rundir.REPORT_HTML
    atomic_write_text(path, render_report(run_dir))
    return path


def render_compare(labels: Sequence[str], columns: Sequence[str],
                   tables: Sequence[Mapping[str, Any]]) -> str:
    """``compare.html``: ``tables`` are ``{"domain", "rows": [{"method", "run", "cells":
    [{"text", "sort"}]}]}`` (`uqbench.reporting.compare.html_tables`)."""
    return _env().get_template("compare.html.j2").render(
        title="uqbench compare", labels=labels, columns=columns, tables=tables)


__all__ = ["QUESTIONS", "figure_groups", "render_compare", "render_report", "write_report"]
