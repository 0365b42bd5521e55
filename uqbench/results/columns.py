"""The columns of the results table, each declared once with everything that travels with it.

A `Column` names its metric (a function of 1-D arrays from `uqbench.stats.metrics`) and its
resampler (the metric's fast bootstrap form), the arrays it reads (``(split, field)``: split
``id`` or ``shift``; field ``correct``, ``confidence``, ``uncertainty``, ``probs`` or
``labels``), its header and digits in the tables, its direction, whether the table gives it a
bootstrap CI, a one-line doc (docs/results.md's columns table, `columns_doc`) and its level:
``model`` columns depend only on the model's predictive distribution (accuracy, calibration:
equal on every scorer row of one model unless the scorer brings its own confidence),
``scorer`` columns on the ranking a scorer's uncertainty induces (OOD detection,
selective prediction). The results table (`uqbench.results.evaluate`), ``uqbench compare`` and
the paper's paired verdicts all compute a column through `COLUMNS`.

The conformal and risk-control columns are computed apart (`uqbench.results.conformal_risk`:
they fit on the calib split first), the recalibrated ECEs too (`uqbench.results.recalibration`);
the expert budget columns (``avg_experts``) are token averages, not metrics of examples
(`uqbench.results.evaluate.per_token_experts`): `COMPUTED_ELSEWHERE` declares how they are
shown. A plugin adds a column with `register_column`.
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
    """One column of the results table, declared once with everything that travels with it.

    ``metric(*arrays)`` takes the arrays named by ``reads``, in that order (``correct`` as 0/1
    or bool); ``binned`` metrics also take ``n_bins``. ``resampler``: the metric's faster, equal
    form on bootstrap resamples (`uqbench.stats.metrics.Resampled`), same arguments; None: the
    bootstrap calls ``metric`` on each resample. ``ci``: the table gives it a bootstrap CI
    (else mean ± std over seeds). ``header`` and ``digits``: how the tables show it (no header:
    results.csv/jsonl only); ``doc``: one line for docs/results.md. ``metric`` is None for a
    column another stage computes (``doc`` names it). ``two_sample``: it reads the ID and the
    shifted split (their examples are resampled independently)."""

    name: str
    metric: Callable[..., float] | None
    reads: Reads
    higher_is_better: bool
    level: Literal["model", "scorer"]
    header: str = ""
    digits: int = 3
    doc: str = ""
    resampler: Callable[..., Callable[..., Any]] | None = None
    ci: bool = True
    binned: bool = False

    @property
    def two_sample(self) -> bool:
        return {s for s, _ in self.reads} == {"id", "shift"}

    def __call__(self, *arrays: NDArray[Any], n_bins: int = M.ECE_BINS) -> float:
        if self.metric is None:
            raise TypeError(f"column {self.name!r} is computed elsewhere ({self.doc})")
        return self.metric(*self._inputs(arrays), **self._options(n_bins))

    def _inputs(self, arrays: tuple[NDArray[Any], ...]) -> tuple[NDArray[Any], ...]:
        return tuple(a.astype(bool) if f == "correct" else a
                     for a, (_, f) in zip(arrays, self.reads, strict=False))

    def _options(self, n_bins: int) -> dict[str, int]:
        return {"n_bins": n_bins} if self.binned else {}

    def bound(self, n_bins: int = M.ECE_BINS) -> Callable[..., float]:
        """The metric as a function of its arrays alone; with a ``resampler``, a
        `uqbench.stats.metrics.Resampled` metric, so that its bootstrap keeps the fast path
        (all resamples of a chunk in one call)."""
        def fn(*arrays: NDArray[Any]) -> float:
            return self(*arrays, n_bins=n_bins)

        resampler, options = self.resampler, self._options(n_bins)
        if resampler is None:
            return fn
        return M.Resampled(fn, lambda *arrays: resampler(*self._inputs(arrays), **options))


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


def _ranked(of_groups: Callable[..., Any]) -> Callable[..., Callable[..., Any]]:
    """The resampler of a selective metric that ``of_groups`` computes from tie groups."""
    return partial(M.selective_resampler, of_groups=of_groups)


_ID_CAL: Reads = (("id", "confidence"), ("id", "correct"))
_ID_RANK: Reads = (("id", "uncertainty"), ("id", "correct"))
_OOD: Reads = (("id", "uncertainty"), ("shift", "uncertainty"))
_ID_PROBS: Reads = (("id", "probs"), ("id", "labels"))
#: selective accuracy at the table's coverage
_SEL = M.resampled_selective_accuracy(M.SELECTIVE_COVERAGE)

#: the results table's metric columns, in the order of a results row; each is computed,
#: bootstrapped and shown from its declaration here (`register_column` adds one)
COLUMNS: dict[str, Column] = {c.name: c for c in (
    # with a resampler: a chunk of bootstrap resamples in one call (bitwise equal to one at a
    # time; the ranking metrics from one sort)
    Column("accuracy", M.mean_score, (("id", "correct"),), True, "model", "Acc",
           doc="fraction of the ID questions answered right", resampler=M.mean_resampler),
    Column("ece", M.expected_calibration_error, _ID_CAL, False, "model", "ECE", binned=True,
           doc="expected calibration error, 12 equal-width bins on the confidence",
           resampler=M.calibration_resampler),
    Column("brier", M.brier_score, _ID_PROBS, False, "model", "Brier",
           doc="multiclass Brier score of the predictive distribution, in [0, 2]",
           resampler=M.brier_resampler),
    Column("nll", M.negative_log_likelihood, _ID_PROBS, False, "model", "NLL",
           doc="mean −log p of the gold option (nats)", resampler=M.nll_resampler),
    Column("brier_conf", _brier_conf, _ID_CAL, False, "model", ci=False,
           doc="Brier score of the confidence as a forecast of correctness, in [0, 1]"),
    Column("mce", M.max_calibration_error, _ID_CAL, False, "model", "MCE", binned=True,
           doc="the largest |accuracy − confidence| gap over the 12 equal-width bins",
           resampler=partial(M.calibration_resampler, largest=True)),
    Column("ece_adaptive", partial(M.expected_calibration_error, strategy="quantile"), _ID_CAL,
           False, "model", "ECE-ad", binned=True, doc="the ECE with 12 equal-mass bins",
           resampler=partial(M.calibration_resampler, strategy="quantile")),
    Column("ece_10_mass", partial(M.expected_calibration_error, n_bins=M.HELM_ECE_BINS,
                                  strategy="midpoint"), _ID_CAL, False, "model", "ECE-10m",
           doc="HELM's `ece_10_bin`: 10 equal-mass bins",
           resampler=partial(M.calibration_resampler, n_bins=M.HELM_ECE_BINS,
                             strategy="midpoint")),
    Column("ood_auroc", M.ood_auroc, _OOD, True, "scorer", "OOD-AUROC",
           doc="AUROC of the uncertainty, ID vs the shifted split (OOD = positive)",
           resampler=M.auroc_resampler),
    Column("aupr_out", M.aupr_out, _OOD, True, "scorer", "AUPR-out", ci=False,
           doc="average precision of the uncertainty, the shifted split positive"),
    Column("fpr95", M.fpr_at_95_tpr, _OOD, False, "scorer", "FPR95", ci=False,
           doc="fraction of ID flagged at the first threshold catching 95% of the shift"),
    Column("aurc", M.aurc, _ID_RANK, False, "scorer", "AURC",
           doc="area under the risk–coverage curve (a fraction, not ×1000)",
           resampler=_ranked(M.aurc_of_groups)),
    Column("e_aurc", M.e_aurc, _ID_RANK, False, "scorer", "E-AURC", ci=False,
           doc="AURC minus the AURC of the best ranking of the same predictions"),
    Column("augrc", M.augrc, _ID_RANK, False, "scorer", "AUGRC",
           doc="area under the generalized risk–coverage curve (Traub et al. 2024)",
           resampler=_ranked(M.augrc_of_groups)),
    Column("sel_acc_80", _SEL.fn, _ID_RANK, True, "scorer", "SelAcc@80",
           doc="accuracy on the 80% least uncertain ID questions", resampler=_SEL.resampler),
    Column("prr", M.prediction_rejection_ratio, _ID_RANK, True, "scorer", "PRR",
           doc="LM-Polygraph's normalised prediction-rejection ratio",
           resampler=_ranked(M.prr_of_groups)),
    Column("sel_acc_10", M.helm_selective_accuracy, _ID_RANK, True, "scorer", "SelAcc@10",
           doc="HELM's `selective_acc@10`: accuracy of the int(0.1 N) + 1 least uncertain",
           resampler=_ranked(partial(M.helm_selective_accuracy_of_groups,
                                     frac=M.HELM_SELECTIVE_FRACTION))),
    Column("shift_accuracy", M.mean_score, (("shift", "correct"),), True, "model", "ShiftAcc",
           ci=False, doc="accuracy on the shifted split", resampler=M.mean_resampler),
    Column("shift_sel_acc_80", _SEL.fn, (("shift", "uncertainty"), ("shift", "correct")),
           True, "scorer", "ShiftSelAcc@80", ci=False,
           doc="accuracy on the 80% least uncertain shifted questions", resampler=_SEL.resampler),
)}

#: ``risk_at_<c>``: the selective risk (error rate) of the c% least uncertain ID questions
#: (mean +- std over seeds; computed with the risk-control columns)
RISK_AT: dict[str, Column] = {c.name: c for c in (
    Column(f"risk_at_{round(100 * k):02d}", _risk_at(k), _ID_RANK, False, "scorer",
           f"Risk@{round(100 * k):02d}", ci=False,
           doc=f"error rate of the {round(100 * k)}% least uncertain ID questions")
    for k in R.RISK_AT)}

#: the miscoverage level of the coverage columns below
CP_ALPHA = 0.1
#: ``cp_<score>_10_cov``: empirical coverage of the conformal sets at alpha = 0.1 on ID; only
#: scores whose sets are ``{c : s(x, c, u) <= q̂}`` (not ``aps``, ``raps``:
#: `uqbench.stats.conformal`), as `inputs_of` reads the gold option's coverage off its stored
#: conformity score
CONFORMAL_COVERAGE: dict[str, Column] = {c.name: c for c in (
    Column(f"cp_{s}_10_cov", M.mean_score, (("id", f"covered_{s}"),), True, "model", header,
           doc=f"coverage of the {sets} conformal sets at α = 0.1 on ID",
           resampler=M.mean_resampler)
    for s, header, sets in (("lac", "LAC cov", "LAC"), ("aps_rand", "APS cov", "randomised APS"),
                            ("raps_rand", "", "randomised RAPS")))}


def _elsewhere(name: str, higher_is_better: bool, level: Literal["model", "scorer"],
               header: str, doc: str, digits: int = 3, *, ci: bool = True) -> Column:
    return Column(name, None, (), higher_is_better, level, header, digits, doc, ci=ci)


_CP = "`uqbench.results.conformal_risk`"
_RC = "on calib, risk control at r* = 0.5, δ = 0.1"
#: the shown columns other stages compute, in the order of a results row
COMPUTED_ELSEWHERE: dict[str, Column] = {c.name: c for c in (
    _elsewhere("ece_ts", False, "model", "ECE-TS", "the ECE after temperature scaling fitted "
               "on the calib split (`uqbench.results.recalibration`)"),
    _elsewhere("ece_hb", False, "model", "", "the ECE after histogram binning fitted on the "
               "calib split (`uqbench.results.recalibration`)"),
    _elsewhere("ece_iso", False, "model", "", "the ECE after isotonic regression fitted on the "
               "calib split (`uqbench.results.recalibration`)"),
    _elsewhere("learned", True, "model", "Learned", "ID accuracy minus the zero-shot "
               "accuracy of the frozen backbone, paired bootstrap CI "
               "(`uqbench.results.references`)"),
    _elsewhere("avg_experts", False, "model", "Experts", "active experts per token over every "
               "token of the ID split: the budget the thermostat calibrates", 2, ci=False),
    _elsewhere("forward_passes", False, "model", "Passes", "forward passes the scorer needs",
               0, ci=False),
    _elsewhere("cp_lac_10_size", False, "model", "LAC size", f"mean size of the LAC sets at "
               f"α = 0.1 on ID ({_CP})", 2),
    _elsewhere("cp_aps_rand_10_size", False, "model", "APS size", "mean size of the "
               f"randomised APS sets at α = 0.1 on ID ({_CP})", 2),
    _elsewhere("shift_cp_aps_rand_10_cov", True, "model", "Shift APS cov", "coverage of the "
               f"randomised APS sets on the shifted split, calibrated on ID ({_CP})"),
    _elsewhere("shift_cp_aps_rand_10_size", False, "model", "Shift APS size", "mean size of "
               f"the randomised APS sets on the shifted split ({_CP})", 2),
    _elsewhere("rc_50_coverage", True, "scorer", "Cov@r*", f"ID coverage of the threshold "
               f"certified {_RC} ({_CP})"),
    _elsewhere("rc_50_risk", False, "scorer", "Risk@r*", f"ID selective risk at that "
               f"threshold ({_CP})"),
    _elsewhere("shift_rc_50_coverage", True, "scorer", "Shift cov@r*", "coverage of that "
               f"threshold on the shifted split ({_CP})"),
    _elsewhere("shift_rc_50_risk", False, "scorer", "Shift risk@r*", "selective risk of that "
               f"threshold on the shifted split ({_CP})"),
)}

#: every declared column, by name
DECLARED: dict[str, Column] = {**COLUMNS, **COMPUTED_ELSEWHERE, **CONFORMAL_COVERAGE,
                               **RISK_AT}


def register_column(name: str, *, reads: Reads, higher_is_better: bool,
                    level: Literal["model", "scorer"], header: str = "", digits: int = 3,
                    ci: bool = True, binned: bool = False,
                    resampler: Callable[..., Callable[..., Any]] | None = None
                    ) -> Callable[[Callable[..., float]], Callable[..., float]]:
    """Declare the decorated metric a column of every results table (`COLUMNS`), computed per
    seed on the arrays ``reads`` names (each method's, ``pooled`` included), with a bootstrap
    CI unless ``ci`` is False, shown as ``header`` at the end of its ``level``'s table (no
    header: results.csv/jsonl only); its doc is the metric's first docstring line. A plugin
    module registers its columns when it is imported (``--plugin``). A name already declared
    -> ``ValueError``."""
    def deco(metric: Callable[..., float]) -> Callable[..., float]:
        if name in DECLARED:
            raise ValueError(f"column {name!r} is already declared; choose another name")
        doc = (metric.__doc__ or "").strip().split("\n")[0]
        col = Column(name, metric, reads, higher_is_better, level, header, digits, doc,
                     resampler, ci, binned)
        COLUMNS[name] = DECLARED[name] = col
        return metric

    return deco


def unregister_column(name: str) -> Column:
    """Remove a column `register_column` added (the built-in columns stay)."""
    if name not in COLUMNS or name in _BUILT_IN:
        raise ValueError(f"column {name!r} was not added by register_column")
    del DECLARED[name]
    return COLUMNS.pop(name)


_BUILT_IN = frozenset(DECLARED)


def registered_modules() -> tuple[str, ...]:
    """The modules defining the metrics of the columns `register_column` added: part of the
    cache key of a results row (`uqbench.results.evaluate`)."""
    return tuple(sorted({getattr(c.metric, "__module__", "") for n, c in COLUMNS.items()
                         if n not in _BUILT_IN}))


def columns_doc() -> str:
    """The columns table of docs/results.md: every declared column with its header, level,
    direction, interval and one-line doc (tests/results/test_columns.py checks the page holds
    it)."""
    lines = ["| column | shown as | level | better | CI | what |", "|---|---|---|---|---|---|"]
    for c in DECLARED.values():
        lines.append(f"| `{c.name}` | {c.header or '–'} | {c.level} | "
                     f"{'higher' if c.higher_is_better else 'lower'} | "
                     f"{'yes' if c.ci else '±std'} | {c.doc.replace('|', chr(92) + '|')} |")
    return "\n".join(lines) + "\n"


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


if __name__ == "__main__":  # the columns table of docs/results.md
    print(columns_doc(), end="")


__all__ = ["COLUMNS", "COMPUTED_ELSEWHERE", "CONFORMAL_COVERAGE", "CP_ALPHA", "DECLARED",
           "NEEDS_DISTRIBUTION", "RESULTS_SCHEMA", "RISK_AT", "SCHEMA_CHANGES", "Column",
           "columns_doc", "inputs_of", "register_column", "registered_modules", "results_schema",
           "skipped_columns", "unregister_column"]
