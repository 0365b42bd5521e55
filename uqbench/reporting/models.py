"""The model-by-metric table of a run over several models (``uqbench score SRC1 SRC2 ...``):
per domain and ``pooled``, each model's value and 95% bootstrap CI of every metric (the cells of
``results.jsonl``), and its paired-bootstrap difference to the best model of that column.

A model is a model/gate pair; its row is the results row of its ``scorer`` method (default
``msp``: the model's own confidence; a pair without that scorer is left out, and said so). The
models' records hold the same questions in the same order (`uqbench.run.score_records.
merge_models`), so example i is one question for every model: each resample draws one set of
question indices for both sides (`uqbench.stats.metrics.paired_difference`, as ``uqbench
compare`` pairs runs; ID and shifted questions independently for OOD-AUROC), each model's side
resampled once per column (`uqbench.stats.metrics.resample_side`). A difference is
``model − best``: its CI excluding 0 says the model is worse than the best on these questions.

Writes ``models.md``, ``models.csv`` and ``models.json`` into the run folder; ``report.html``
shows the table (`uqbench.reporting.html`), `figures.ranking` draws its cells.
"""
from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from uqbench.core.errors import UserError
from uqbench.files.cache import atomic_write_text
from uqbench.files.rundir import RunFolder
from uqbench.results.columns import COLUMNS, Column, inputs_of
from uqbench.results.evaluate import column_side
from uqbench.results.tables import (
    MODEL_COLUMNS,
    digits_of,
    domains_of,
    header,
    is_reference,
    pair_of,
)
from uqbench.stats import metrics as M

FILES = {"md": "models.md", "csv": "models.csv", "json": "models.json"}


@dataclass(frozen=True)
class ModelCell:
    """One model's value of one column on one domain, its CI, and ``model − best`` with the CI
    of that paired difference (None for the best model itself, or without per-example arrays)."""

    value: float | None
    lo: float | None
    hi: float | None
    best: bool = False
    diff: tuple[float, float, float] | None = None

    @property
    def worse(self) -> bool:
        """The difference's CI excludes 0: worse than the best on these questions."""
        if self.diff is None:
            return False
        _, lo, hi = self.diff
        return lo > 0 or hi < 0


@dataclass(frozen=True)
class ModelTable:
    """``cells[domain][model][column]``; ``methods[model]``: the results row's method."""

    scorer: str
    columns: list[str]
    models: list[str]
    methods: dict[str, str]
    cells: dict[str, dict[str, dict[str, ModelCell]]]
    n_boot: int
    left_out: dict[str, str]  # pair -> why it has no row in the table


def _num(v: Any) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def _best(values: Mapping[str, float | None], col: Column) -> str | None:
    have = {m: v for m, v in values.items() if v is not None}
    if not have:
        return None
    return (max if col.higher_is_better else min)(have, key=have.__getitem__)


def model_table(run: RunFolder, *, scorer: str = "msp", n_boot: int = 1000, seed: int = 0,
                columns: Sequence[str] = MODEL_COLUMNS) -> ModelTable:
    """The model-by-metric table of ``run`` (rows and per-example arrays), see the module
    docstring. Raises `UserError` when fewer than two models have a ``scorer`` row."""
    rows = [r for r in run.rows if not is_reference(r)]
    pairs = list(dict.fromkeys(pair_of(r) for r in rows))
    methods = {p: f"{p}/{scorer}" for p in pairs
               if any(r["method"] == f"{p}/{scorer}" for r in rows)}
    left_out = {p: f"no {scorer!r} method (its scorers: "
                   f"{', '.join(sorted({str(r['scorer']) for r in rows if pair_of(r) == p}))})"
                for p in pairs if p not in methods}
    if len(methods) < 2:
        raise UserError(f"the model table needs two or more models scored with {scorer!r}; "
                        f"this run has {len(methods)} ({', '.join(methods) or 'none'}); choose "
                        "--rank-scorer among the scorers every model has")
    by = {(r["method"], r["domain"]): r for r in rows}
    cols = [c for c in columns if any(c in r for r in rows)]
    cells: dict[str, dict[str, dict[str, ModelCell]]] = {}

    def side(method: str, dom: str, col: Column) -> M.ResampledSide | None:
        """The column's paired-bootstrap side of ``method`` (`column_side`)."""
        inputs = inputs_of(run, method, dom, col)
        return None if inputs is None else column_side(col, inputs, n_boot=n_boot, seed=seed)

    for dom in domains_of(rows):
        table: dict[str, dict[str, ModelCell]] = {m: {} for m in methods}
        for c in cols:
            col = COLUMNS[c]
            vals = {m: _num((by.get((meth, dom)) or {}).get(c)) for m, meth in methods.items()}
            best = _best(vals, col)
            base = side(methods[best], dom, col) if best is not None else None
            for m, meth in methods.items():
                row = by.get((meth, dom)) or {}
                diff = None
                if best is not None and m != best and vals[m] is not None and base is not None:
                    mine = side(meth, dom, col)
                    if mine is not None:  # the paired bootstrap, the best side resampled once
                        diff = M.paired_interval(base, mine)
                table[m][c] = ModelCell(vals[m], _num(row.get(f"{c}_lo")),
                                        _num(row.get(f"{c}_hi")), m == best, diff)
        cells[dom] = table
    return ModelTable(scorer, cols, list(methods), methods, cells, n_boot, left_out)


def _f(v: float | None, digits: int, signed: bool = False) -> str:
    return "–" if v is None or math.isnan(v) else f"{v:+.{digits}f}" if signed \
        else f"{v:.{digits}f}"


def cell_text(c: ModelCell, column: str) -> str:
    """``value [lo, hi]``, then ``best`` or ``Δ d [lo, hi]`` to the best (``*``: its CI
    excludes 0)."""
    digits = digits_of(column)
    s = _f(c.value, digits) + (f" [{_f(c.lo, digits)}, {_f(c.hi, digits)}]"
                               if c.lo is not None and c.hi is not None else "")
    if c.best:
        return s + " (best)"
    if c.diff is not None:
        d, lo, hi = c.diff
        s += (f"; Δ {_f(d, digits, True)} [{_f(lo, digits, True)}, {_f(hi, digits, True)}]"
              + ("*" if c.worse else ""))
    return s


def markdown(t: ModelTable) -> str:
    """One table per domain, models in rows, metrics in columns."""
    lines = [(f"Models ranked: each model's `{t.scorer}` row; cell = value [95% bootstrap CI]; "
              "Δ = model − best model of the column, paired bootstrap over the same questions "
              f"({t.n_boot} resamples), 95% CI; * = CI excludes 0 (worse than the best)."), ""]
    for m, why in t.left_out.items():
        lines += [f"Left out: {m}: {why}.", ""]
    for dom, table in t.cells.items():
        lines += [f"#### {dom}", "", "| Model | " + " | ".join(map(header, t.columns)) + " |",
                  "|" + "---|" * (len(t.columns) + 1)]
        lines += [f"| {m} | " + " | ".join(cell_text(table[m][c], c) for c in t.columns) + " |"
                  for m in t.models]
        lines.append("")
    return "\n".join(lines)


def csv_text(t: ModelTable) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["domain", "model", "method", "metric", "value", "value_lo", "value_hi", "best",
                "diff_to_best", "diff_lo", "diff_hi"])
    for dom, table in t.cells.items():
        for m in t.models:
            for c in t.columns:
                cell = table[m][c]
                w.writerow([dom, m, t.methods[m], c, cell.value, cell.lo, cell.hi, cell.best,
                            *(cell.diff or ("", "", ""))])
    return buf.getvalue()


def write_models(out: Path, t: ModelTable) -> dict[str, Path]:
    """``models.{md,csv,json}`` in the run folder ``out``; returns their paths."""
    paths = {k: out / name for k, name in FILES.items()}
    atomic_write_text(paths["md"], "# uqbench: models side by side\n\n" + markdown(t))
    atomic_write_text(paths["csv"], csv_text(t))
    atomic_write_text(paths["json"], json.dumps(asdict(t), indent=1))
    return paths


def read_models(run_dir: Path) -> ModelTable | None:
    """The table ``write_models`` wrote (None where the run has none)."""
    path = Path(run_dir) / FILES["json"]
    if not path.is_file():
        return None
    d = json.loads(path.read_text())
    cells = {dom: {m: {c: ModelCell(**{**v, "diff": tuple(v["diff"]) if v["diff"] else None})
                       for c, v in cols.items()} for m, cols in table.items()}
             for dom, table in d.pop("cells").items()}
    return ModelTable(cells=cells, **d)


def html_tables(t: ModelTable) -> list[dict[str, Any]]:
    """Per domain, one row per model: cells ``{"text", "sort", "best", "worse"}``."""
    return [{"domain": dom, "rows": [
        {"model": m, "cells": [{"col": c, "text": cell_text(table[m][c], c),
                                "sort": "" if table[m][c].value is None else repr(
                                    table[m][c].value),
                                "best": table[m][c].best, "worse": table[m][c].worse}
                               for c in t.columns]} for m in t.models]}
        for dom, table in t.cells.items()]


__all__ = ["FILES", "ModelCell", "ModelTable", "cell_text", "csv_text",
           "html_tables", "markdown", "model_table", "read_models", "write_models"]
