"""``report.html``: one self-contained page per run folder, and ``compare.html``.

Rendered from ``run.json``, ``results.jsonl``, ``scores.npz``'s presence, ``figures/*.png`` and
``paper_report.md`` through the Jinja2 templates of ``uqbench/reporting/templates`` (autoescaped).
The page needs no network: the figures are inlined as base64 PNG data, the style and the table
sorting and the row filter are inline. A part of the run folder that is missing or unreadable
(an interrupted run, a corrupt figure) is named on the page in its section, and the rest still
renders.

A run over several models (``uqbench score SRC1 SRC2 ...``) opens with them side by side:
the model-by-metric table (`uqbench.reporting.models`), the ranking figure and every model's
reliability diagram (`figures.ranking`). The page then gives the answers
(`uqbench.reporting.answers`: per question the best method, its CI, its paired difference to MSP, a
verdict) under banners for at-chance models and fallbacks; then the model-level and scorer-level
tables (`uqbench.results.tables`) with the forest plots beside the latter, the figures by question,
the paper's verdicts, and at the end, collapsed, the fallbacks, skipped scorers, configuration,
splits, phase timings and training curves. Every table cell carries its ``results.csv`` value in
``data-sort`` and its column in ``data-col``.
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
from uqbench.reporting.answers import Answer, answers, learned_lines
from uqbench.reporting.models import html_tables as models_html
from uqbench.reporting.models import read_models
from uqbench.results import tables as T
from uqbench.results.references import trained
from uqbench.results.tables import header

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
FOREST_FIGURE = "forest"  # forest_<column>: beside the scorer-level table
MODELS_FIGURE = "models"  # models_ranking, models_reliability_<domain>: several models
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


def figure_groups(fig_dir: Path) -> tuple[list[dict[str, Any]], dict[str, Any] | None,
                                         list[dict[str, Any]]]:
    """(one group per question with its figures, the training figure or None, the forest
    plots in `uqbench.results.tables.FOREST_COLUMNS` order)."""
    pngs = sorted(fig_dir.glob("*.png")) if fig_dir.is_dir() else []
    all_stems = [s for _, stems in QUESTIONS for s in stems] + [FOREST_FIGURE, MODELS_FIGURE]
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
    order = {f"{FOREST_FIGURE}_{c}": i for i, c in enumerate(T.FOREST_COLUMNS)}
    forests = [_figure(p) for p in sorted(pngs, key=lambda p: order.get(p.stem, len(order)))
               if _stem_of(p.stem, all_stems) == FOREST_FIGURE]
    return groups, training, forests


def model_figures(fig_dir: Path) -> list[dict[str, Any]]:
    """The figures of a run over several models (`figures.ranking`): the ranking, then every
    model's reliability diagrams per domain."""
    pngs = sorted(fig_dir.glob(f"{MODELS_FIGURE}_*.png")) if fig_dir.is_dir() else []
    return [_figure(p) for p in sorted(pngs, key=lambda p: "reliability" in p.stem)]


def _cell(row: Mapping[str, Any], col: str, digits: int) -> dict[str, Any]:
    """A table cell: the value as in ``results.csv`` (``sort``), its text and its CI's."""
    v, lo, hi = row.get(col), row.get(f"{col}_lo"), row.get(f"{col}_hi")
    finite = isinstance(v, (int, float)) and not (isinstance(v, float) and math.isnan(v))
    ci = ""
    if finite and isinstance(lo, (int, float)) and not math.isnan(lo):
        ci = f"[{_num(lo, digits)}, {_num(hi, digits)}]"
    return {"col": col, "text": _num(v, digits), "ci": ci, "sort": repr(v) if finite else ""}


def _by_domain(items: Sequence[Any]) -> list[tuple[str, list[Any]]]:
    doms = list(dict.fromkeys(i.domain for i in items))
    return [(d, [i for i in items if i.domain == d]) for d in doms]


def model_tables(rows: Sequence[Mapping[str, Any]], *, learned: bool = True
                 ) -> list[dict[str, Any]]:
    """Per domain, the model-level rows (`uqbench.results.tables.model_rows`; ``learned``:
    with the learned column)."""
    cols = T.shown("model", learned=learned)
    return [{"domain": dom, "rows": [
        {"label": m.label, "method": m.row["method"], "methods": m.methods,
         "reference": m.reference, "chance": m.at_chance,
         "cells": [_cell(m.row, c, d) for c, _, d in cols]} for m in items]}
        for dom, items in _by_domain(T.model_rows(rows))]


def scorer_tables(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per domain, per model/gate, its scorers' rows (`uqbench.results.tables.scorer_blocks`)."""
    return [{"domain": dom, "blocks": [
        {"pair": b.pair, "chance": b.at_chance, "rows": [
            {"scorer": r.get("scorer", r["method"]), "method": r["method"],
             "cells": [_cell(r, c, d) for c, _, d in T.shown("scorer")]} for r in b.rows]}
        for b in items]} for dom, items in _by_domain(T.scorer_blocks(rows))]


def _answer(a: Answer) -> dict[str, Any]:
    digits = T.digits_of(a.column)
    out: dict[str, Any] = {"question": a.question.text, "domain": a.domain, "name": a.name,
                           "verdict": a.verdict, "line": a.line, "vs": a.vs_msp, "diff": "",
                           "header": T.short_name(a.column),
                           "cell": _cell(a.best, a.column, digits) if a.best else None,
                           "method": a.best["method"] if a.best else ""}
    if a.diff is not None and a.diff != (0.0, 0.0, 0.0):
        d, lo, hi = a.diff
        out["diff"] = f"Δ {d:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}]"
    return out


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


def lmeval_sources(meta: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each lm-eval source of a scored run (run.json ``lmeval``, or each model's under
    ``models``): its pair (None for one source), model, name (its pair's, as the tables name
    it: a renamed source's new name), lm-eval's version, the tasks and the metric of each
    domain, and the accuracy check (lm-eval's logged value beside uqbench's)."""
    items = [(None, meta)] if "lmeval" in meta else [
        (pair, m) for pair, m in (meta.get("models") or {}).items() if "lmeval" in m]
    return [{"pair": pair, "model": m["lmeval"].get("model"),
             "name": (pair or "").rsplit("/", 1)[0] or m["lmeval"].get("named") or None,
             "version": m["lmeval"].get("lm_eval_version"),
             "domains": m["lmeval"].get("domains") or {},
             "metric": m["lmeval"].get("metric") or {},
             "warnings": m["lmeval"].get("warnings") or [],
             "accuracy": [dict(c, **{k: _num(c.get(k), 4) for k in
                                     ("lm_eval", "uqbench_all", "uqbench")})
                          for c in m["lmeval"].get("accuracy") or []]}
            for pair, m in items]


def render_report(run_dir: str | Path) -> str:
    """The HTML page of a run folder; every missing or unreadable part is named on it."""
    run = rundir.read_run(run_dir, need=())
    meta = run.meta
    problems = dict(run.problems)
    fig_dir = run.path / rundir.FIGURES
    groups, training, forests = figure_groups(fig_dir)
    if not fig_dir.is_dir():
        # named within the run folder: the report is written before the folder gets its name
        problems[rundir.FIGURES] = (f"{rundir.FIGURES}/ is missing: no figures (a run with "
                                    "--no-figures, or interrupted); `uqbench plot RUN_DIR` draws "
                                    "them")
    splits = [{"name": k, "n": v.get("n", "–"), "hash": v.get("hash", "–"),
               "recipe": json.dumps(v.get("recipe"), default=str) if v.get("recipe") else ""}
              for k, v in (meta.get("splits") or {}).items()]
    found = [_answer(a) for a in answers(run)] if run.rows else []
    try:
        many = read_models(run.path)  # models.json: a run over several models
    except (OSError, ValueError, TypeError, KeyError) as exc:
        many = None
        problems["models.json"] = (f"unreadable ({type(exc).__name__}: {exc}): no table of the "
                                   "models; rerun `uqbench score` over them")
    doms = T.domains_of(run.rows)
    models = [m for m in T.model_rows(run.rows) if not m.reference]
    lm = lmeval_sources(meta)
    title = f"uqbench run: {meta.get('suite', '?')} {meta.get('profile', '')}"
    if lm:
        title = "uqbench: " + ", ".join(dict.fromkeys(s["name"] or "?" for s in lm)) + \
            " scored from lm-eval " + (", ".join(dict.fromkeys(
                s["version"] for s in lm if s["version"])) or "(version not recorded)")
    return _env().get_template("report.html.j2").render(
        title=title, meta=meta,
        problems=problems, lmeval=lm,
        config=json.dumps(meta.get("config", {}), indent=1, default=str),
        splits=splits, seconds=meta.get("seconds", {}), training=training,
        headline=[a for a in found if a["domain"] == (doms[0] if doms else None)],
        answers=found, learned=learned_lines(run) if run.rows else [],
        chance_models=[m for m in models if m.at_chance], n_models=len(models),
        chance_by_domain=[(d, len([m for m in ms if m.at_chance]), len(ms),
                           [m.label for m in ms if m.at_chance])
                          for d, ms in _by_domain(models) if any(m.at_chance for m in ms)],
        trained=trained(meta),
        model_headers=[h for _, h, _ in T.shown("model", learned=trained(meta))],
        scorer_headers=[h for _, h, _ in T.shown("scorer")],
        model_tables=model_tables(run.rows, learned=trained(meta)),
        scorer_tables=scorer_tables(run.rows),
        forests=forests, groups=groups,
        paper=_paper_claims(run.path / rundir.PAPER_REPORT),
        skipped=meta.get("skipped_scorers") or [], fallbacks=meta.get("fallbacks") or [],
        references_skipped=meta.get("references_skipped") or {},
        scores_present=rundir.SCORES not in problems,
        many=None if many is None else {
            "scorer": many.scorer, "n_boot": many.n_boot, "left_out": many.left_out,
            "headers": [header(c) for c in many.columns], "tables": models_html(many),
            "figures": model_figures(fig_dir)})


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


__all__ = [
    "QUESTIONS",
    "figure_groups",
    "model_figures",
    "model_tables",
    "render_compare",
    "render_report",
    "scorer_tables",
    "write_report",
]
