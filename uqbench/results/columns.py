"""The per-column metrics of the results table, each declared once.

A `Column` names its metric (a function of 1-D arrays from `uqbench.stats.metrics`), the arrays
it reads (``(split, field)``: split ``id`` or ``shift``; field ``correct``, ``confidence``,
``uncertainty``, ``probs`` or ``labels``), its direction, whether the table gives it a bootstrap
CI and its level: ``model`` columns depend only on the model's predictive distribution
(accuracy, calibration: equal on every scorer row of one model unless the scorer brings its own
confidence), ``scorer`` columns on the ranking a scorer's uncertainty induces (OOD detection,
selective prediction). The results table (`uqbench.results.evaluate`), ``uqbench compare`` and
the paper's paired verdicts all compute a column through `COLUMNS`.

The conformal and risk-control columns are computed apart (`uqbench.results.conformal_risk`:
they fit on the calib split first); the expert budget columns (``avg_experts``) are token
averages, not metrics of examples (`uqbench.results.evaluate.per_token_experts`).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from uqbench.core.errors import NotReachable
from uqbench.files.rundir import RunFolder
from uqbench.stats import metrics as M
from uqbench.stats import risk as R
from uqbench.stats.conformal import conformal_quantile

Split = Literal["id", "shift"]
#: a `uqbench.results.evaluate.Scored` field, or ``covered_<score>``: whether the gold option is
#: in the conformal set (its conformity score <= the calib split's q̂), formed by the caller
Field = str
#: the arrays a `Column` reads, in order
Reads = tuple[tuple[Split, Field], ...]


@dataclass(frozen=True)
class Column:
    """One per-column metric of the results table.

    ``metric(*arrays)`` takes the arrays named by ``reads``, in that order (``correct`` as 0/1
    or bool); ``binned`` metrics also take ``n_bins``. ``two_sample``: it reads the ID and the
    shifted split (their examples are resampled independently)."""

    name: str
    metric: Callable[..., float]
    reads: Reads
    higher_is_better: bool
    level: Literal["model", "scorer"]
    ci: bool = True
    binned: bool = False

    @property
    def two_sample(self) -> bool:
        return {s for s, _ in self.reads} == {"id", "shift"}

    def __call__(self, *arrays: NDArray[Any], n_bins: int = M.ECE_BINS) -> float:
        return self.metric(*self._inputs(arrays), **self._options(n_bins))

    def _inputs(self, arrays: tuple[NDArray[Any], ...]) -> tuple[NDArray[Any], ...]:
        return tuple(a.astype(bool) if f == "correct" else a
                     for a, (_, f) in zip(arrays, self.reads))

    def _options(self, n_bins: int) -> dict[str, int]:
        return {"n_bins": n_bins} if self.binned else {}

    def bound(self, n_bins: int = M.ECE_BINS) -> Callable[..., float]:
        """The metric as a function of its arrays alone; a `uqbench.stats.metrics.Resampled`
        metric stays one, so that its bootstrap keeps the fast path (all resamples of a
        chunk in one call)."""
        def fn(*arrays: NDArray[Any]) -> float:
            return self(*arrays, n_bins=n_bins)

        metric, options = self.metric, self._options(n_bins)
        if not isinstance(metric, M.Resampled):
            return fn
        return M.Resampled(fn, lambda *arrays: metric.resampler(*self._inputs(arrays),
                                                                **options))


#: ECE with ``n_bins`` equal-mass bins (the "adaptive" ECE)
_ECE_ADAPTIVE = M.Resampled(partial(M.expected_calibration_error, strategy="quantile"),
                            partial(M.RESAMPLED_ECE.resampler, strategy="quantile"))
#: selective accuracy at the table's coverage
_SELECTIVE_ACCURACY = M.resampled_selective_accuracy(M.SELECTIVE_COVERAGE)
#: HELM's ``ece_10_bin``: 10 equal-mass bins cut as uncertainty-calibration cuts them
_ECE_10_MASS = M.Resampled(
    partial(M.expected_calibration_error, n_bins=M.HELM_ECE_BINS, strategy="midpoint"),
    partial(M.RESAMPLED_ECE.resampler, n_bins=M.HELM_ECE_BINS, strategy="midpoint"))


def _risk_at(coverage: float) -> Callable[..., float]:
    def risk_at(uncertainty: NDArray[Any], correct: NDArray[Any]) -> float:
        return 1.0 - M.selective_accuracy(uncertainty, correct, coverage=coverage)

    return risk_at


def _brier_conf(confidence: NDArray[Any], correct: NDArray[Any]) -> float:
    """Brier score of the top-label confidence as a binary forecast of correctness,
    ``mean_i (c_i - correct_i)^2`` in [0, 1] (sklearn's ``brier_score_loss(correct, c)``);
    unlike ``brier`` it needs no distribution over the choices."""
    c, ok = M.calibration_inputs(confidence, correct)
    return float(np.mean((c - ok) ** 2))


_ID_CAL: Reads = (("id", "confidence"), ("id", "correct"))
_ID_RANK: Reads = (("id", "uncertainty"), ("id", "correct"))
_OOD: Reads = (("id", "uncertainty"), ("shift", "uncertainty"))
_ID_PROBS: Reads = (("id", "probs"), ("id", "labels"))

#: the results table's metric columns, in its order
COLUMNS: dict[str, Column] = {c.name: c for c in (
    # Resampled: a chunk of bootstrap resamples in one call (bitwise equal to one at a time)
    Column("accuracy", M.RESAMPLED_MEAN, (("id", "correct"),), True, "model"),
    Column("ece", M.RESAMPLED_ECE, _ID_CAL, False, "model", binned=True),
    Column("brier", M.RESAMPLED_BRIER, _ID_PROBS, False, "model"),
    Column("nll", M.RESAMPLED_NLL, _ID_PROBS, False, "model"),
    Column("brier_conf", _brier_conf, _ID_CAL, False, "model", ci=False),
    Column("mce", M.RESAMPLED_MCE, _ID_CAL, False, "model", binned=True),
    Column("ece_adaptive", _ECE_ADAPTIVE, _ID_CAL, False, "model", binned=True),
    Column("ece_10_mass", _ECE_10_MASS, _ID_CAL, False, "model"),
    # bootstrapped from one sort (bitwise equal to sorting each resample)
    Column("ood_auroc", M.RESAMPLED_OOD_AUROC, _OOD, True, "scorer"),
    Column("aupr_out", M.aupr_out, _OOD, True, "scorer", ci=False),
    Column("fpr95", M.fpr_at_95_tpr, _OOD, False, "scorer", ci=False),
    Column("aurc", M.RESAMPLED_AURC, _ID_RANK, False, "scorer"),
    Column("e_aurc", M.e_aurc, _ID_RANK, False, "scorer", ci=False),
    Column("augrc", M.RESAMPLED_AUGRC, _ID_RANK, False, "scorer"),
    Column("sel_acc_80", _SELECTIVE_ACCURACY, _ID_RANK, True, "scorer"),
    Column("prr", M.RESAMPLED_PRR, _ID_RANK, True, "scorer"),
    Column("sel_acc_10", M.RESAMPLED_HELM_SELECTIVE_ACCURACY, _ID_RANK, True, "scorer"),
    Column("shift_accuracy", M.RESAMPLED_MEAN, (("shift", "correct"),), True, "model", ci=False),
    Column("shift_sel_acc_80", _SELECTIVE_ACCURACY,
           (("shift", "uncertainty"), ("shift", "correct")), True, "scorer", ci=False),
)}

#: ``risk_at_<c>``: the selective risk (error rate) of the c% least uncertain ID questions
#: (mean +- std over seeds; computed with the risk-control columns)
RISK_AT: dict[str, Column] = {c.name: c for c in (
    Column(f"risk_at_{round(100 * k):02d}", _risk_at(k), _ID_RANK, False, "scorer", ci=False)
    for k in R.RISK_AT)}

#: the miscoverage level of the coverage columns below
CP_ALPHA = 0.1
#: ``cp_<score>_10_cov``: empirical coverage of the conformal sets at alpha = 0.1 on ID; only
#: scores whose sets are ``{c : s(x, c, u) <= q̂}`` (not ``aps``, ``raps``:
#: `uqbench.stats.conformal`), as `inputs_of` reads the gold option's coverage off its stored
#: conformity score
CONFORMAL_COVERAGE: dict[str, Column] = {c.name: c for c in (
    Column(f"cp_{s}_10_cov", M.RESAMPLED_MEAN, (("id", f"covered_{s}"),), True, "model")
    for s in ("lac", "aps_rand", "raps_rand"))}


#: the `uqbench.results.evaluate.Scored` fields made from a record's distribution over choices
#: (``logits`` and ``labels``): records without one (confidence-only) cannot give the columns
#: reading them, nor the conformal sets (``cp_*``: `uqbench.results.conformal_risk`)
NEEDS_DISTRIBUTION = ("probs", "labels")


def skipped_columns(fields: frozenset[str]) -> list[dict[str, Any]]:
    """The columns records holding ``fields`` (`uqbench.core.outputs.Outputs.available`) cannot
    give, each ``{"columns", "missing", "reason"}`` for run.json ``skipped_columns``: none when
    the records have logits and labels."""
    missing = sorted({"logits", "labels"} - fields)
    if not missing:
        return []
    cols = [c.name for c in (*COLUMNS.values(), *CONFORMAL_COVERAGE.values())
            if any(f in NEEDS_DISTRIBUTION or f.startswith("covered_") for _, f in c.reads)]
    return [{"columns": [*cols, "cp_* (every conformal-set column)"], "missing": missing,
             "reason": "needs each question's distribution over its choices and its gold "
                       "choice; these records hold a confidence and a correctness only"}]


def inputs_of(run: RunFolder, method: str, domain: str, col: Column
              ) -> list[NDArray[Any]] | None:
    """The (N, seeds) arrays ``col`` reads for ``method`` on ``domain`` from a finished run's
    ``scores.npz`` (``covered_<score>``: conformity <= the calib split's q̂ at `CP_ALPHA`), or
    None where the run does not hold them."""
    out = []
    for role, name in col.reads:
        a: NDArray[Any] | None
        if name.startswith("covered_"):  # conformal: the ID conformity score <= q̂ of calib
            cal = run.scores(method, domain, "calib", f"conformity_{name[8:]}")
            test = run.scores(method, domain, role, f"conformity_{name[8:]}")
            if cal is None or test is None:
                return None
            try:
                q = [conformal_quantile(cal[:, s], CP_ALPHA) for s in range(cal.shape[1])]
            except NotReachable:
                return None
            a = (test <= np.array(q)[None, :]).astype(float)
        else:
            a = run.scores(method, domain, role, name)
        if a is None:
            return None
        out.append(np.asarray(a, dtype=np.float64).reshape(len(a), -1))
    return out


#: the results table's schema, recorded in run.json (``results_schema``): raised whenever a
#: column keeps its name but changes its definition, with what changed in `SCHEMA_CHANGES`, so
#: that no reader puts two definitions side by side (`uqbench.reporting.compare`). A run folder
#: without the field was written under schema 1.
RESULTS_SCHEMA = 3
SCHEMA_CHANGES = {
    2: "cp_aps_* became the standard, inclusive APS sets (schema 1's cp_aps_* are schema 2's "
       "cp_aps_strict_*)",
    3: "cp_raps_* became the standard, inclusive RAPS sets (schema 2's cp_raps_* are schema 3's "
       "cp_raps_strict_*)",
}


def results_schema(meta: dict[str, Any]) -> int:
    """The schema a run folder's run.json says its results were written under."""
    return int(meta.get("results_schema", 1))


__all__ = ["COLUMNS", "CONFORMAL_COVERAGE", "CP_ALPHA", "NEEDS_DISTRIBUTION", "RESULTS_SCHEMA",
           "RISK_AT", "SCHEMA_CHANGES", "Column", "inputs_of", "results_schema", "skipped_columns"]
