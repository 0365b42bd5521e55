"""The answers ``report.html`` opens with: per question and domain, the best method with its CI
(from ``results.jsonl``), its paired-bootstrap difference to MSP (`uqbench.stats.metrics.
paired_difference` over the per-example arrays of ``scores.npz``, as ``uqbench compare`` pairs
runs) and a one-line verdict.

=====================================================  ==================  =====================
question                                               column (best)       "yes" when the CI ...
=====================================================  ==================  =====================
Are the confidences calibrated?                        ``ece`` (lowest)    lies below 0.05
Does uncertainty rise under shift?                     ``ood_auroc`` (hi)  lies above 0.5
Does abstaining help?                                  ``aurc`` (lowest)   lies below 1 − acc
Does conformal coverage survive the shift?             shift APS coverage  reaches 0.9
=====================================================  ==================  =====================

Then what training added (`learned_lines`): per model/gate, the domains whose ``learned`` CI
(accuracy − the frozen backbone's ``zero-shot`` accuracy, paired bootstrap) lies above 0 (it
improved), includes 0 (not shown) or lies below 0 (worse); or why the run has no zero-shot.

``1 − acc`` is the AURC of a score that ranks at random (every coverage has the full error
rate); 0.9 the coverage the conformal sets promise at α = 0.1 (fitted on ID calib). MSP is the
``msp`` scorer of the best method's model/gate (else the domain's first ``msp`` row). A best
method whose model is at chance on the domain is "not evidence".
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from uqbench.files.rundir import RunFolder
from uqbench.results.columns import COLUMNS, CONFORMAL_COVERAGE, CP_ALPHA, Column, inputs_of
from uqbench.results.evaluate import column_side
from uqbench.results.references import trained
from uqbench.results.tables import (
    chance_reasons,
    domains_of,
    is_reference,
    model_rows,
    pair_of,
    random_ranking,
)
from uqbench.stats import metrics as M

#: shift coverage of the APS sets at alpha = 0.1 (q̂ of the ID calib split), per example
SHIFT_COVERAGE = replace(CONFORMAL_COVERAGE["cp_aps_rand_10_cov"],
                         name="shift_cp_aps_rand_10_cov", reads=(("shift", "covered_aps_rand"),))
CALIBRATED_ECE, COVERAGE_TARGET = 0.05, 0.9


@dataclass(frozen=True)
class Question:
    key: str
    text: str
    column: Column
    higher_is_better: bool
    note: str = ""  # the row field that says why a value is missing (``cp_note``)

    def reference(self, row: Mapping[str, Any]) -> float:
        """The value a "yes" must beat, for ``row``."""
        if self.key in ("calibration", "coverage"):
            return CALIBRATED_ECE if self.key == "calibration" else COVERAGE_TARGET
        ref = random_ranking(self.column.name, row)
        return math.nan if ref is None else ref


QUESTIONS = (
    Question("calibration", "Are the confidences calibrated?", COLUMNS["ece"], False),
    Question("shift", "Does uncertainty rise under shift?", COLUMNS["ood_auroc"], True),
    Question("abstain", "Does abstaining on the uncertain help?", COLUMNS["aurc"], False),
    Question("coverage", "Does conformal coverage survive the shift?", SHIFT_COVERAGE, True,
             "cp_note"),
)


@dataclass(frozen=True)
class Answer:
    question: Question
    domain: str
    name: str  # the best method; for a model-level question its model-level row's label
    best: Mapping[str, Any] | None  # the results row of the best method
    msp: Mapping[str, Any] | None
    diff: tuple[float, float, float] | None  # best − MSP, paired bootstrap
    vs_msp: str  # the comparison in words
    verdict: str  # yes / no / unclear / not evidence
    line: str  # the one-line verdict

    @property
    def column(self) -> str:
        return self.question.column.name


def _num(v: Any) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def _vs_msp(q: Question, run: RunFolder, best: Mapping[str, Any], msp: Mapping[str, Any] | None,
            n_boot: int) -> tuple[tuple[float, float, float] | None, str]:
    if msp is None:
        return None, "no msp scorer in this run to compare with"
    if msp["method"] == best["method"]:
        return (
            None,
            "this is MSP" if q.column.level == "scorer" else "MSP's own predictive distribution",
        )
    a, b = (inputs_of(run, m["method"], best["domain"], q.column) for m in (msp, best))
    if a is None or b is None:
        return None, "no per-example arrays in scores.npz to pair"
    d = M.paired_interval(*(column_side(q.column, x, n_boot=n_boot) for x in (a, b)))
    if d == (0.0, 0.0, 0.0):
        return d, "same predictive distribution as MSP"
    better = d[1] > 0 if q.higher_is_better else d[2] < 0
    worse = d[2] < 0 if q.higher_is_better else d[1] > 0
    word = ("significantly better than" if better else "significantly worse than" if worse
            else "not significantly different from")
    return d, f"{word} {msp['method']}"


def _verdict(q: Question, best: Mapping[str, Any], chance: str) -> tuple[str, str]:
    v, lo, hi = (_num(best.get(q.column.name + s)) for s in ("", "_lo", "_hi"))
    assert v is not None  # `answers` asks it of rows that have the column only
    ref = q.reference(best)
    lo, hi = (v, v) if lo is None or hi is None else (lo, hi)
    if q.key == "coverage":  # survives unless significantly below the promise
        yes, no = hi >= ref, hi < ref
    elif q.higher_is_better:
        yes, no = lo > ref, hi <= ref
    else:
        yes, no = hi < ref, lo >= ref
    what = {"calibration": f"ECE {CALIBRATED_ECE}", "shift": "chance (AUROC 0.5)",
            "abstain": f"random abstention (AURC = error rate {ref:.3f})",
            "coverage": f"the promised {COVERAGE_TARGET:.0%}"}[q.key]
    if chance:
        plain = _verdict(q, best, "")[0]
        return "not evidence", (f"Not evidence: the model is at chance here ({chance}); the "
                                f"numbers alone say {plain}.")
    if yes:
        return "yes", {"calibration": f"Yes: ECE's CI lies below {what}.",
                       "shift": f"Yes: OOD-AUROC's CI lies above {what}.",
                       "abstain": f"Yes: AURC's CI lies below {what}.",
                       "coverage": f"Yes: shift coverage's CI reaches {what}."}[q.key]
    if no:
        return "no", {"calibration": f"No: even the best ECE is not below {what}.",
                      "shift": f"No: the best OOD-AUROC is not above {what}.",
                      "abstain": f"No: the best AURC is not below {what}.",
                      "coverage": f"No: coverage falls below {what} under shift."}[q.key]
    return "unclear", f"Unclear: the CI includes {what}."


def answers(run: RunFolder, *, n_boot: int | None = None) -> list[Answer]:
    """Every question on every domain (``pooled`` first)."""
    rows = [r for r in run.rows if not is_reference(r)]
    why = chance_reasons(run.rows)
    if n_boot is None:
        n_boot = int(run.meta.get("bootstrap")
                     or (run.meta.get("profile_settings") or {}).get("bootstrap") or 1000)
    out = []
    for dom in domains_of(rows):
        here = [r for r in rows if r["domain"] == dom]
        # a model-level question compares predictive distributions: one row each, named so
        labels = {m.row["method"]: m.label for m in model_rows(here)}
        for q in QUESTIONS:
            cands = [r for r in here if _num(r.get(q.column.name)) is not None
                     and (q.column.level == "scorer" or r["method"] in labels)]
            if not cands:
                notes = [p for r in here if q.note and r.get(q.note)  # one per alpha
                         for p in str(r[q.note]).split(" | ")]
                note = next((p for p in notes if p.startswith(f"alpha={CP_ALPHA:g} ")),
                            notes[0] if notes else "")
                out.append(Answer(q, dom, "", None, None, None, "", "unclear",
                                  f"No method of this run has {q.column.name} on {dom}"
                                  + (f": {note}" if note else ".")))
                continue
            sign = -1 if q.higher_is_better else 1
            best = min(cands, key=lambda r: sign * r[q.column.name])
            msps = [r for r in here if r.get("scorer") == "msp"]
            msp = next((r for r in msps if pair_of(r) == pair_of(best)), msps[0] if msps else None)
            diff, vs = _vs_msp(q, run, best, msp, n_boot)
            verdict, line = _verdict(q, best, why.get((best["method"], dom), ""))
            name = labels[best["method"]] if q.column.level == "model" else best["method"]
            out.append(Answer(q, dom, name, best, msp, diff, vs, verdict, line))
    return out


@dataclass(frozen=True)
class Learned:
    """What training added over the frozen backbone, for one model/gate on one domain: its
    ``learned`` value and CI (`uqbench.results.references.learned_columns`) and the verdict
    ``improved`` (CI above 0), ``not shown`` (CI includes 0) or ``worse`` (CI below 0)."""

    model: str
    domain: str
    value: float
    lo: float
    hi: float
    verdict: str


def learned(run: RunFolder) -> list[Learned]:
    """Every model/gate's ``learned`` per domain (its own predictive distribution's row, the
    MSP one; ``pooled`` first), where the run has a zero-shot reference."""
    out = []
    for m in model_rows(run.rows):
        v, lo, hi = (_num(m.row.get(f"learned{s}")) for s in ("", "_lo", "_hi"))
        if m.reference or m.label != m.pair or v is None or lo is None or hi is None:
            continue
        verdict = "improved" if lo > 0 else "worse" if hi < 0 else "not shown"
        out.append(Learned(m.label, m.domain, v, lo, hi, verdict))
    return out


def learned_lines(run: RunFolder) -> list[str]:
    """What training added, in words: one line per model/gate naming the domains it improved
    (``learned`` CI above 0), those it did not, and those it made worse; without a zero-shot
    reference, the one line saying why (run.json ``references_skipped``); none for a run that
    trained nothing (`uqbench.results.references.trained`: predictions made elsewhere)."""
    got = learned(run)
    if not got and not trained(run.meta):
        return []
    if not got:
        why = (run.meta.get("references_skipped") or {}).get("zero-shot")
        line = ("What training added over the backbone is unknown: no zero-shot reference ("
                f"{why or 'no learned column in these results'}).")
        return [line] if run.rows else []

    def cells(items: list[Learned]) -> str:
        return ", ".join(f"{x.domain} ({x.value:+.3f} [{x.lo:+.3f}, {x.hi:+.3f}])"
                         for x in items)

    lines = []
    for model in dict.fromkeys(x.model for x in got):
        mine = [x for x in got if x.model == model]
        parts = [f"{words} {cells(items)}" for words, items in (
            ("improved on", [x for x in mine if x.verdict == "improved"]),
            ("did not improve on", [x for x in mine if x.verdict == "not shown"]),
            ("made worse", [x for x in mine if x.verdict == "worse"])) if items]
        lines.append(f"{model}: training " + "; ".join(parts) + ".")
    return lines


__all__ = ["QUESTIONS", "Answer", "Learned", "Question", "answers", "learned", "learned_lines"]
