"""``uqbench compare RUN_A RUN_B [...]``: the methods of several runs over the same splits, side
by side, with paired-bootstrap differences against the first run.

Runs are comparable when every domain has the same ID and shifted splits (the results rows'
``split_hashes``): then example i is the same question in every run, and each bootstrap
resample draws the same questions for both runs (`uqbench.stats.metrics.paired_difference`; ID and
shifted questions independently for OOD-AUROC), so the interval is that of the difference
itself. Useful for the same suite under two backbones, two seed counts, or a run before and
after a plugin scorer (a method present in one run only is listed without a difference).

Differences are ``run − first run``, seeds pooled as in the run's own tables (each run's
metric is its mean over its seed columns). Conformal coverage uses each run's own q̂ from its
calib split (held fixed, as in the run's CIs). Writes ``compare.{md,csv,html}``.
"""
from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from uqbench.core.errors import UserError
from uqbench.files.cache import atomic_write_text
from uqbench.files.rundir import RunFolder, read_run
from uqbench.reporting.html import render_compare
from uqbench.results.columns import (
    COLUMNS,
    CONFORMAL_COVERAGE,
    RISK_AT,
    SCHEMA_CHANGES,
    Column,
    inputs_of,
    results_schema,
)
from uqbench.results.tables import is_reference
from uqbench.stats import metrics as M

FILES = ("compare.md", "compare.csv", "compare.html")


#: the columns compare pairs: a few of the results table's and the conformal / risk ones
METRICS: dict[str, Column] = {
    **{n: COLUMNS[n] for n in ("accuracy", "ece", "ood_auroc", "aurc", "augrc")},
    **RISK_AT, **CONFORMAL_COVERAGE}


@dataclass(frozen=True)
class Cell:
    """One run's value of one metric (from its results row, with the run's CI) and its paired
    difference to the first run (None for the first run or when it cannot be formed)."""

    value: float | None
    lo: float | None
    hi: float | None
    diff: tuple[float, float, float] | None = None
    note: str = ""


def _label(paths: Sequence[Path]) -> list[str]:
    names = [p.name or str(p) for p in paths]
    return names if len(set(names)) == len(names) else [str(p) for p in paths]


def _split_hashes(run: RunFolder) -> dict[str, str]:
    return {r["domain"]: str(r.get("split_hashes", "")) for r in run.rows if not is_reference(r)}


def check_comparable(runs: Sequence[RunFolder], labels: Sequence[str]) -> None:
    """Every run's results under one schema (a column that changed its definition would be
    compared with itself under another name) and each domain over the same ID and shifted
    splits in every run; else a `UserError` naming what differs."""
    schemas = {label: results_schema(run.meta) for run, label in zip(runs, labels, strict=False)}
    if len(set(schemas.values())) > 1:
        lo, hi = min(schemas.values()), max(schemas.values())
        changes = "; ".join(SCHEMA_CHANGES[v] for v in range(lo + 1, hi + 1))
        raise UserError(
            "the runs' results were written under different schemas ("
            + ", ".join(f"{k}: {v}" for k, v in schemas.items()) + f"): {changes}. Score the "
            "older run again with this version (`uqbench run` with the same options reuses its "
            "cached models and forward records) and compare the new folders")
    base = _split_hashes(runs[0])
    bad = []
    for run, label in zip(runs[1:], labels[1:], strict=False):
        other = _split_hashes(run)
        for dom in sorted(base.keys() | other.keys()):
            if base.get(dom) != other.get(dom):
                bad.append(f"domain {dom}: {labels[0]} has {base.get(dom) or 'no such domain'}, "
                           f"{label} has {other.get(dom) or 'no such domain'}")
    if bad:
        raise UserError("the runs are not over the same splits (ID,shifted split hashes per "
                        "domain), so their examples cannot be paired:\n  " + "\n  ".join(bad)
                        + "\ncompare runs of the same suite and profile (same data)")


def _num(v: Any) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


@dataclass
class Comparison:
    labels: list[str]
    columns: list[str]
    #: domain -> method -> one Cell per run and column (None: the method is not in that run)
    table: dict[str, dict[str, list[dict[str, Cell] | None]]]


def compare(run_dirs: Sequence[str | Path], *, n_boot: int | None = None, seed: int = 0
            ) -> Comparison:
    """Read and check the runs (before any bootstrap), then every paired difference.
    ``n_boot`` None: the smallest number of resamples the runs used for their own CIs."""
    paths = [Path(d) for d in run_dirs]
    labels = _label(paths)
    if len(paths) < 2:
        raise UserError("uqbench compare needs at least two run folders (RUN_A RUN_B ...); got "
                        f"{len(paths)}")
    runs = [read_run(p) for p in paths]
    check_comparable(runs, labels)
    if n_boot is None:
        n_boot = min(int(r.meta.get("bootstrap") or r.meta.get("profile_settings", {})
                         .get("bootstrap") or 1000) for r in runs)
    rows = [{(r["method"], r["domain"]): r for r in run.rows if not is_reference(r)}
            for run in runs]
    domains = list(dict.fromkeys(d for run_rows in rows for _, d in run_rows))
    methods = list(dict.fromkeys(m for run_rows in rows for m, _ in run_rows))
    columns = [c for c in METRICS if any(c in r for run_rows in rows for r in run_rows.values())]
    table: dict[str, dict[str, list[dict[str, Cell] | None]]] = {}
    for dom in domains:
        table[dom] = {}
        for m in methods:
            per_run: list[dict[str, Cell] | None] = []
            base = {c: inputs_of(runs[0], m, dom, METRICS[c]) for c in columns}
            for i, (run, run_rows) in enumerate(zip(runs, rows, strict=False)):
                row = run_rows.get((m, dom))
                if row is None:
                    per_run.append(None)
                    continue
                cells = {}
                for c in columns:
                    cell = Cell(_num(row.get(c)), _num(row.get(f"{c}_lo")),
                                _num(row.get(f"{c}_hi")))
                    if i and (m, dom) in rows[0]:
                        col = METRICS[c]
                        ref, mine = base[c], inputs_of(run, m, dom, METRICS[c])
                        if ref is None or mine is None:
                            cell = Cell(cell.value, cell.lo, cell.hi,
                                        note="no per-example arrays in scores.npz")
                        else:
                            cell = Cell(cell.value, cell.lo, cell.hi, M.paired_difference(
                                M.seed_mean(col.bound()), ref, mine,
                                two_sample=col.two_sample,
                                n_resamples=n_boot, seed=seed))
                    cells[c] = cell
                per_run.append(cells)
            table[dom][m] = per_run
    return Comparison(labels, columns, table)


def _f(v: float | None, signed: bool = False) -> str:
    return "–" if v is None or math.isnan(v) else (f"{v:+.3f}" if signed else f"{v:.3f}")


def cell_text(cell: Cell | None) -> str:
    """``value [lo, hi]`` of a run; for the later runs also ``Δ d [lo, hi]`` to the first."""
    if cell is None:
        return "not in this run"
    s = _f(cell.value) + (f" [{_f(cell.lo)}, {_f(cell.hi)}]" if cell.lo is not None else "")
    if cell.diff is not None:
        d, lo, hi = cell.diff
        s += f"; Δ {_f(d, True)} [{_f(lo, True)}, {_f(hi, True)}]"
    elif cell.note:
        s += f"; Δ – ({cell.note})"
    return s


def markdown(c: Comparison) -> str:
    lines = ["# uqbench compare", "", "Runs: " + ", ".join(f"`{x}`" for x in c.labels)
             + f". Δ: run − `{c.labels[0]}`, paired bootstrap over the same examples, 95% CI.",
             ""]
    for dom, methods in c.table.items():
        lines += [f"## {dom}", "", "| Method | Run | " + " | ".join(c.columns) + " |",
                  "|" + "---|" * (len(c.columns) + 2)]
        for m, per_run in methods.items():
            for label, cells in zip(c.labels, per_run, strict=False):
                vals = [cell_text(cells[col] if cells else None) for col in c.columns]
                lines.append(f"| {m} | {label} | " + " | ".join(vals) + " |")
        lines.append("")
    return "\n".join(lines)


def csv_text(c: Comparison) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["domain", "method", "run", "metric", "value", "value_lo", "value_hi", "diff",
                "diff_lo", "diff_hi", "note"])
    for dom, methods in c.table.items():
        for m, per_run in methods.items():
            for label, cells in zip(c.labels, per_run, strict=False):
                for col, cell in (cells or {}).items():
                    w.writerow([dom, m, label, col, cell.value, cell.lo, cell.hi,
                                *(cell.diff or ("", "", "")), cell.note])
    return buf.getvalue()


def html_tables(c: Comparison) -> list[dict[str, Any]]:
    """The tables of ``compare.html`` (`uqbench.reporting.html.render_compare`); a cell sorts by its
    difference where it has one, else by its value."""
    def sort(cell: Cell | None) -> float | str:
        if cell is None:
            return ""
        return cell.diff[0] if cell.diff else ("" if cell.value is None else cell.value)

    return [{"domain": dom, "rows": [
        {"method": m, "run": label,
         "cells": [{"text": cell_text(cells[col] if cells else None),
                    "sort": sort(cells[col] if cells else None)} for col in c.columns]}
        for m, per_run in methods.items() for label, cells in zip(c.labels, per_run, strict=False)]}
        for dom, methods in c.table.items()]


def write_compare(run_dirs: Sequence[str | Path], out: str | Path | None = None, *,
                  n_boot: int | None = None) -> tuple[Comparison, list[Path]]:
    """`compare`, written to ``out`` (default: the current folder) as ``compare.{md,csv,html}``."""
    c = compare(run_dirs, n_boot=n_boot)
    out = Path(out or ".")
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f for f in FILES]
    html = render_compare(c.labels, c.columns, html_tables(c))
    for p, text in zip(paths, (markdown(c), csv_text(c), html), strict=False):
        atomic_write_text(p, text)
    return c, paths


__all__ = [
    "METRICS",
    "Cell",
    "Comparison",
    "cell_text",
    "check_comparable",
    "compare",
    "html_tables",
    "write_compare",
]
