"""The run folder's layout: its file names, the key format of ``scores.npz``, and reading a
finished run back. Every other module names a run folder's files and formats its scores keys
through this one.

A run folder (``uqbench run``, ``uqbench score``) holds:

- ``results.jsonl`` (also ``.csv``, ``.md``, ``.tex``): one row per method x domain, then the
  reference rows (``chance``, ``options-only``);
- ``scores.npz``: per-example arrays of shape (N, seeds), keyed by `score_key`:
  ``"{method}|{domain}|{role}|{field}"`` for a method's ``uncertainty``, ``confidence``,
  ``correct`` (ID also ``confidence_ts/_hb/_iso``, both roles ``conformity_<score>``) and
  ``"{model}/{gate}|{domain}|{role}|{field}"`` for router statistics and labels;
- ``run.json``: configuration, splits, timings, training logs, ``at_chance``, ...;
- ``figures/``, ``records/``, ``report.html``, and ``paper_report.md`` after an experiment.
"""
from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from uqbench.core.errors import UserError
from uqbench.files.cache import atomic_write_bytes

RESULTS = "results.jsonl"
SCORES = "scores.npz"
META = "run.json"
FIGURES = "figures"
RECORDS = "records"
REPORT_HTML = "report.html"
PAPER_REPORT = "paper_report.md"
#: the tables beside ``results.jsonl``: suffix -> file name
TABLES = {"jsonl": RESULTS, "csv": "results.csv", "md": "results.md", "tex": "results.tex"}
#: the fields of a method's per-example arrays that every (method, domain, role) has
SCORE_FIELDS = ("uncertainty", "confidence", "correct")

#: How to get a run folder's files back (a warm cache makes it cheap).
REDO = ("redo the run step that writes it: `uqbench run ... --out {dir}` (a warm cache makes "
        "this cheap: no model work)")


def score_key(owner: str, domain: str, role: str, name: str) -> str:
    """The ``scores.npz`` key of one per-example array; ``owner`` is a method
    (``model/gate/scorer``) or a model/gate pair (``model/gate``)."""
    return f"{owner}|{domain}|{role}|{name}"


def write_scores(run_dir: Path, arrays: Mapping[str, NDArray[Any]]) -> Path:
    """Write ``scores.npz`` atomically; returns its path. The members of `np.savez_compressed`
    (its ``.npy`` files, dated 1980 as it dates them), at zlib's fastest level: per-example
    floats barely compress, and numpy's default level took most of the writing time."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, allowZip64=True, compresslevel=1) as z:
        for key, a in arrays.items():
            with z.open(f"{key}.npy", "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.asanyarray(a), allow_pickle=False)
    path = Path(run_dir) / SCORES
    atomic_write_bytes(path, buf.getvalue())
    return path


def read_results(run_dir: str | Path) -> list[dict[str, Any]]:
    """The rows of a finished run's ``results.jsonl``; a missing, unreadable, empty or foreign
    file is a `UserError` naming it and the run step to redo."""
    d = Path(run_dir)
    path = d / RESULTS
    if not path.exists():
        raise UserError(f"{path} not found: {d} is not a finished uqbench run; "
                        + REDO.format(dir=d))
    try:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (ValueError, UnicodeDecodeError) as exc:
        raise UserError(f"{path} is not valid JSON lines ({exc}); " + REDO.format(dir=d)) from None
    if not rows:
        raise UserError(f"{path} holds no results; " + REDO.format(dir=d))
    missing = [k for k in ("method", "model", "gate", "scorer", "domain") if k not in rows[0]]
    if missing:
        raise UserError(f"{path} rows lack the column(s) {', '.join(missing)}: written by another "
                        "tool or an old version; " + REDO.format(dir=d))
    return rows


def read_scores(run_dir: str | Path) -> dict[str, NDArray[Any]]:
    """Every array of ``scores.npz``; missing or unreadable: a `UserError` naming it."""
    d = Path(run_dir)
    path = d / SCORES
    if not path.exists():
        raise UserError(f"{path} is missing: the per-example scores that `uqbench run` writes "
                        f"next to {RESULTS}; " + REDO.format(dir=d))
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise UserError(f"{path} is unreadable ({exc}); " + REDO.format(dir=d)) from None


def read_meta(run_dir: str | Path) -> dict[str, Any]:
    """``run.json``; missing, unreadable or not a JSON object: a `UserError` naming it."""
    d = Path(run_dir)
    path = d / META
    try:
        meta = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{path} is missing; " + REDO.format(dir=d)) from None
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise UserError(f"{path} is unreadable ({exc}); " + REDO.format(dir=d)) from None
    if not isinstance(meta, dict):
        raise UserError(f"{path} holds a JSON {type(meta).__name__}, not an object; "
                        + REDO.format(dir=d))
    return meta


@dataclass
class RunFolder:
    """A finished run as read back: ``problems`` names each part that could not be read."""

    path: Path
    rows: list[dict[str, Any]] = field(default_factory=list)
    arrays: dict[str, NDArray[Any]] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)  # file name -> why it is missing

    def scores(self, owner: str, domain: str, role: str, name: str) -> NDArray[Any] | None:
        return self.arrays.get(score_key(owner, domain, role, name))


def read_run(run_dir: str | Path, *, need: tuple[str, ...] = (RESULTS, SCORES)) -> RunFolder:
    """Read a finished run folder: ``results.jsonl``, ``scores.npz`` and ``run.json``. A part
    named in ``need`` that cannot be read raises its `UserError`; any other is recorded in
    ``problems`` (file name -> the error) and left empty, for readers that render what there
    is (``report.html`` of an interrupted run)."""
    d = Path(run_dir)
    if not d.is_dir():
        raise UserError(f"run folder {d} does not exist; run `uqbench run ... --out {d}` first")
    run = RunFolder(d)
    for name, read, attr in ((RESULTS, read_results, "rows"), (SCORES, read_scores, "arrays"),
                             (META, read_meta, "meta")):
        try:
            setattr(run, attr, read(d))
        except UserError as exc:
            if name in need:
                raise
            run.problems[name] = str(exc)
    return run


__all__ = ["FIGURES", "META", "PAPER_REPORT", "RECORDS", "REDO", "REPORT_HTML", "RESULTS",
           "SCORES", "SCORE_FIELDS", "TABLES", "RunFolder", "read_meta", "read_results",
           "read_run", "read_scores", "score_key", "write_scores"]
