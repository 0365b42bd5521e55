"""A finished run folder as figures read it: `load_run` -> `RunData` (per-example `Scores`).

A run folder (its layout: `uqbench.files.rundir`, which reads it) holds ``results.jsonl`` (one row
per method x domain), ``scores.npz`` (per-example arrays of methods and of model/gate pairs,
keyed by `uqbench.files.rundir.score_key`) and ``run.json`` (meta; its ``training`` logs feed the
training figure).
The reference rows of ``results.jsonl`` (``chance``, ``options-only``) are no method: `load_run`
keeps them in ``RunData.references``, out of every method figure. Figures only *read* these
records: every curve comes from a `uqbench.stats.metrics` curve function, every table number from
``results.jsonl``.

The panel modules (`figures.calibration`, `figures.selective`, ...) import this module;
`figures.run` imports the panels to draw a run, so no module imports its importer.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from figures.style import MethodStyles
from uqbench.files.rundir import SCORE_FIELDS, read_run, score_key
from uqbench.results.tables import is_reference

log = logging.getLogger(__name__)

ROLES = ("id", "shift")
ROLE_LABELS = {"id": "ID", "shift": "shifted"}
POOLED = "pooled"


@dataclass(frozen=True)
class Scores:
    """One method's per-example arrays on one domain and split (seed 0 of the run)."""

    uncertainty: NDArray[np.float64]
    confidence: NDArray[np.float64]
    correct: NDArray[np.float64]  # 0/1

    @property
    def n(self) -> int:
        return int(self.correct.size)

    def problem(self, *, need_both_classes: bool = True) -> str | None:
        """Why this split cannot be drawn (empty, or a single class), else None."""
        if self.n == 0:
            return "empty split"
        if need_both_classes:
            n_right = int(np.sum(self.correct == 1))
            if n_right == self.n:
                return f"all {self.n} predictions correct (single class)"
            if n_right == 0:
                return f"all {self.n} predictions wrong (single class)"
        return None


@dataclass
class RunData:
    """The records of one finished run, indexed for the figure functions."""

    path: Path
    rows: list[dict[str, Any]]  # the models' rows (`load_run` sets the references aside)
    arrays: Mapping[str, NDArray[Any]]
    meta: dict[str, Any] = field(default_factory=dict)
    references: list[dict[str, Any]] = field(default_factory=list)  # chance, options-only

    # -- index ----------------------------------------------------------------------------------
    @cached_property
    def methods(self) -> list[str]:
        return list(dict.fromkeys(r["method"] for r in self.rows))

    @cached_property
    def domains(self) -> list[str]:
        """Domains in run order, ``pooled`` first when present."""
        doms = list(dict.fromkeys(r["domain"] for r in self.rows))
        return ([POOLED] if POOLED in doms else []) + [d for d in doms if d != POOLED]

    @cached_property
    def gates(self) -> list[str]:
        return list(dict.fromkeys(r["gate"] for r in self.rows))

    @cached_property
    def styles(self) -> MethodStyles:
        return MethodStyles(self.methods)

    @cached_property
    def _rows(self) -> dict[tuple[str, str], dict[str, Any]]:
        return {(r["method"], r["domain"]): r for r in self.rows}

    @cached_property
    def n_seeds(self) -> int:
        return max((int(r.get("seeds", 1) or 1) for r in self.rows), default=1)

    def row(self, method: str, domain: str) -> dict[str, Any] | None:
        return self._rows.get((method, domain))

    def scores(self, method: str, domain: str, role: str) -> Scores | None:
        """None when the run holds no per-example arrays for this method/domain/role."""
        got = [self.array(method, domain, role, f) for f in SCORE_FIELDS]
        if any(a is None for a in got):
            return None
        u, c, k = (np.asarray(a, dtype=np.float64).ravel() for a in got)  # type: ignore[arg-type]
        return Scores(u, c, k)

    def array(self, owner: str, domain: str, role: str, name: str) -> NDArray[Any] | None:
        """The per-example array ``name`` of a method or model/gate pair, as stored (N, seeds)."""
        return self.arrays.get(score_key(owner, domain, role, name))

    def pair_field(self, pair: str, domain: str, role: str, name: str) -> NDArray[Any] | None:
        a = self.array(pair, domain, role, name)
        return None if a is None else np.asarray(a).ravel()

    def pair_roles(self, pair: str, domain: str, name: str) -> dict[str, NDArray[Any]]:
        """{role: array} of a pair field over the roles the run holds."""
        got = {r: self.pair_field(pair, domain, r, name) for r in ROLES}
        return {r: a for r, a in got.items() if a is not None}

    # -- gates ----------------------------------------------------------------------------------
    def gate_rows(self, gate: str, domain: str = POOLED, *,
                  prefer: tuple[str, ...] = ("msp",)) -> dict[str, Any] | None:
        """The row that represents a gate's accuracy and experts: the preferred scorer if the
        run has it, else the single-pass method with the fewest forward passes."""
        cands = [r for r in self.rows if r["gate"] == gate and r["domain"] == domain]
        if not cands:
            return None
        for s in prefer:
            for r in cands:
                if r["scorer"] == s:
                    return r
        return min(cands, key=lambda r: (r.get("forward_passes") or 1))

    def moe_pair(self, gate: str) -> str | None:
        """``model/gate`` of the first MoE model evaluated under ``gate`` (router arrays)."""
        for r in self.rows:
            pair = f"{r['model']}/{r['gate']}"
            if r["gate"] == gate and any(self.array(pair, d, role, "experts") is not None
                                         for d in self.domains for role in ROLES):
                return pair
        return None

    def care_gate(self) -> str | None:
        """The run's CARE gate at its main budget: ``care``, else the budget-B gate, else the
        first CARE gate (experiment runs name them care-b2, care-tau0.4, ...)."""
        care = [g for g in self.gates if g.startswith("care")]
        if "care" in care:
            return "care"
        budget = self.meta.get("config", {}).get("budget", 4.0)
        for g in care:
            if g == f"care-b{float(budget):g}":
                return g
        return care[0] if care else None

    def method_of(self, pair: str, scorer: str = "msp") -> str | None:
        """The method of ``pair`` with ``scorer``, else its first method."""
        ms = [m for m in self.methods if m.rsplit("/", 1)[0] == pair]
        return f"{pair}/{scorer}" if f"{pair}/{scorer}" in ms else (ms[0] if ms else None)

    def seed_note(self) -> str:
        return f"per-example curves: {self.n_seeds} seeds pooled" if self.n_seeds > 1 else ""


def load_run(run_dir: str | Path) -> RunData:
    """Read ``results.jsonl``, ``scores.npz`` and (optional) ``run.json`` of a finished run
    (`uqbench.files.rundir.read_run`).

    Raises
    ------
    UserError
        ``results.jsonl`` or ``scores.npz`` is missing or unreadable; the message names the
        file and the run step to redo.
    """
    run = read_run(run_dir)
    for why in run.problems.values():  # run.json: the training figure and budget need it
        log.warning("%s; figures use results.jsonl and scores.npz alone", why)
    # the reference rows (chance, options-only) are no method: no scores, no gate, no style
    return RunData(run.path, [r for r in run.rows if not is_reference(r)], run.arrays, run.meta,
                   [r for r in run.rows if is_reference(r)])


__all__ = ["POOLED", "ROLES", "ROLE_LABELS", "RunData", "Scores", "load_run"]
