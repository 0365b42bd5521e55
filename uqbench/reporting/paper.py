"""The CARE paper's claims, checked against a finished ``--experiment`` run (``paper``: all of
them; a single experiment, e.g. ``ablation``: the claims of its own section).

Each claim compares two methods (or a trend) on the ``pooled`` domain. Differences are
*paired*: one bootstrap resample of the examples (ID examples, and independently shifted ones for
OOD metrics) is applied to both methods, so the 95% CI is that of the difference itself.
Verdict rules, written down once and applied to every claim:

- "A > B": **holds** if the CI of A − B lies above 0, **does not hold** if it lies below 0,
  otherwise **inconclusive at this scale**;
- "A > each of B1, B2, ...": holds if every CI of A − Bi lies above 0, does not hold if any lies
  below 0, otherwise inconclusive (a missing Bi is listed, and can only leave it inconclusive);
- "A ≈ B within m": holds if the CI of A − B lies inside [−m, m], does not hold if it lies
  entirely outside, otherwise inconclusive;
- trends (monotone, rank order) are judged on point estimates and say so, except "accuracy rises
  with τ" (paired: highest τ − lowest τ > 0) and "CARE matches fixed-4 with fewer experts", which
  holds only if fixed-k at the rounded-down matching budget is less accurate than fixed-4 (paired)
  and does not hold only if CARE at B = 4 is less accurate than fixed-4 (paired): on a flat
  frontier every budget "matches", above or below 4 experts, and neither would be CARE's doing;
- a claim that rests on a method whose ID accuracy CI includes its domain's chance level (the
  ``chance`` row; `uqbench.results.references.at_chance`) keeps its verdict but is marked **not
  evidence: model at chance**: its numbers describe a model that cannot be told from guessing;
- likewise a claim that rests on a method whose learned column's CI does not lie above 0
  (`uqbench.results.references.not_learned`: trained minus zero-shot accuracy, paired) is marked
  **not evidence: no better than its zero-shot backbone**: its numbers describe the backbone.

`write_paper_report(run_dir)` writes ``paper_report.md`` from the numbers; it is never edited by
hand. The claims are data (`CLAIMS`: section, text, the paper's numbers, methods, metric,
margin), judged by one function (`claims`).
"""
from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from scipy.stats import spearmanr

from uqbench.core.errors import UserError, record_fallback
from uqbench.core.experiments import CONCENTRATION, EXPERIMENTS
from uqbench.core.plan import MODELS
from uqbench.files.cache import atomic_write_text
from uqbench.files.rundir import PAPER_REPORT, read_meta, read_run, score_key
from uqbench.results.columns import COLUMNS
from uqbench.results.references import at_chance, not_learned
from uqbench.stats import metrics as M

HOLDS, FAILS, INCONCLUSIVE = "holds", "does not hold", "inconclusive at this scale"
#: Table "uq"'s single-pass MoE baselines, as the paper scores them
UQ_SINGLE_PASS = ("hydralora/native/msp", "mixlora/native/msp", "dynmole/native/entropy",
                  "flylora/native/msp", "flylora/native/entropy")
MSP4 = "moe-lora/top4/msp"
CARE_B4 = "moe-lora/care-b4/msp"
CARE = "moe-lora/care/care"
#: the gate families the trend claims read (`fnmatch` patterns of ``model/gate/scorer``)
TAU_GATES, BUDGET_GATES, W_SCORERS = "*/care-tau*/care", "*/care-b*/msp", "*/*/care_w*"
TOP5 = "moe-lora/top5/msp"
N_BOOT = 1000
AT_CHANCE = "not evidence: model at chance"
NOT_LEARNED = "not evidence: no better than its zero-shot backbone"
#: The seed's MoE-LoRA baselines are uqbench's re-implementations (`baselines/variants.py`: one
#: MoE-LoRA layer configured per method, trained with the run's recipe), not their authors'
#: code; what each leaves out is registered with it (`uqbench.core.plan.ModelEntry.simplified`).
#: The report says so next to every claim that rests on one.
SIMPLIFIED_MARK = " ‡ (against uqbench's simplified re-implementations of these baselines)"


def simplified_notes() -> dict[str, str]:
    """Model name -> what uqbench's re-implementation of it leaves out, for every registered
    model that has such a note."""
    return {n: e.simplified for n, e in MODELS.items() if e.simplified}


@dataclass(frozen=True)
class Claim:
    section: str
    text: str
    paper: str
    ours: str
    verdict: str
    #: the (method, domain) rows the claim rests on
    rests_on: tuple[tuple[str, str], ...] = ()
    #: `AT_CHANCE` when one of them is a model at chance, `NOT_LEARNED` when one is no better
    #: than its zero-shot backbone, both joined by "; ", else ""
    note: str = ""

    def shown_verdict(self) -> str:
        return f"**{self.verdict}**" + (f" — *{self.note}*" if self.note else "")


def _pooled(*methods: str) -> tuple[tuple[str, str], ...]:
    return tuple((m, "pooled") for m in methods)


class PaperRun:
    """One run's rows and score arrays, as the claims read them."""

    def __init__(self, run_dir: Path) -> None:
        run = read_run(run_dir)  # results.jsonl and scores.npz, or a UserError naming them
        self.rows, self.arrays = run.rows, run.arrays

    def has(self, method: str) -> bool:
        return score_key(method, "pooled", "id", "correct") in self.arrays

    def a(self, method: str, role: str, field: str) -> NDArray[np.float64]:
        """(N, seeds): one column per seed (a run written before seeds were kept: (N, 1))."""
        a = self.arrays[score_key(method, "pooled", role, field)]
        return a.reshape(len(a), -1)

    def row(self, method: str, domain: str = "pooled") -> dict[str, Any]:
        for r in self.rows:
            if r["method"] == method and r["domain"] == domain:
                return r
        raise KeyError(method)


def _bootstrap(stat: Callable[..., float], sizes: Sequence[int], what: str,
               seed: int = 0) -> M.PairedInterval:
    """``stat(*indices)`` and its 95% CI over `N_BOOT` resamples
    (`uqbench.stats.metrics.paired_bootstrap`: one index array per set of examples, ID or ID and
    shifted, each drawn independently).
    Resamples on which ``stat`` is NaN (undefined) are left out of the CI and counted: any are
    warned about and recorded (`uqbench.core.errors.record_fallback`), and the claim says how
    many."""
    d = M.paired_bootstrap(stat, sizes, n_resamples=N_BOOT, seed=seed)
    if d.dropped:
        record_fallback("paper claim bootstrap", what,
                        f"{d.dropped} of {N_BOOT} resamples gave NaN (statistic undefined on "
                        "them) and were left out of the 95% CI")
    return d


#: metrics of the paired claims (`uqbench.results.columns`); each seed's column is pooled
PAIRED_METRICS = ("accuracy", "ece", "sel_acc_80", "shift_accuracy", "shift_sel_acc_80",
                  "ood_auroc")


def _paired_value(run: PaperRun, method: str, metric: str, i: NDArray[np.intp],
                  j: NDArray[np.intp]) -> float:
    """``metric`` of ``method`` on the resampled ID examples ``i`` and shifted examples ``j``,
    every seed's column pooled."""
    col = COLUMNS[metric]
    return col(*(run.a(method, split, field)[i if split == "id" else j].ravel()
                 for split, field in col.reads))


def paired_interval(run: PaperRun, a: str, b: str, metric: str, seed: int = 0) -> M.PairedInterval:
    """Point and 95% CI of metric(a) − metric(b) under a shared bootstrap of examples. Every
    seed counts: a resample draws examples (the same for every seed and both methods), and the
    metric is computed on those examples pooled over the seeds; ID and shifted examples are
    resampled independently (`_bootstrap`)."""
    n, k = len(run.a(a, "id", "correct")), len(run.a(a, "shift", "correct"))
    return _bootstrap(lambda i, j: _paired_value(run, a, metric, i, j)
                      - _paired_value(run, b, metric, i, j), (n, k),
                      f"{metric}: {a} − {b}", seed)


def verdict_greater(d: Sequence[float]) -> str:
    """`HOLDS` if the CI ``d`` is above 0, `FAILS` if below, else `INCONCLUSIVE`."""
    return HOLDS if d[1] > 0 else FAILS if d[2] < 0 else INCONCLUSIVE


def verdict_within(d: Sequence[float], m: float) -> str:
    """`HOLDS` if the CI ``d`` lies within ±``m``, `FAILS` if beyond it, else `INCONCLUSIVE`."""
    return HOLDS if -m <= d[1] and d[2] <= m else FAILS if d[1] > m or d[2] < -m else INCONCLUSIVE


def _fmt_diff(d: M.PairedInterval, pct: bool = False) -> str:
    s = 100.0 if pct else 1.0
    unit = " pts" if pct else ""
    dropped = (f" ({d.dropped} of {N_BOOT} resamples undefined, left out of the CI)"
               if d.dropped else "")
    return f"Δ = {d[0] * s:+.3f}{unit} [{d[1] * s:+.3f}, {d[2] * s:+.3f}]{dropped}"


def _v(run: PaperRun, method: str, col: str, pct: bool = False) -> str:
    r = run.row(method)
    s = 100.0 if pct else 1.0
    lo, hi = r.get(f"{col}_lo"), r.get(f"{col}_hi")
    ci = f" [{lo * s:.3g}, {hi * s:.3g}]" if lo is not None and hi is not None else ""
    return f"{r[col] * s:.3g}{ci}"


# --- the claims, declared: `CLAIMS` is the paper's list, `claims` judges it ---------------------


@dataclass(frozen=True)
class Compare:
    """"A > B" on ``metric`` (``margin`` None) or "A ≈ B within ``margin``", paired."""

    section: str
    text: str
    paper: str
    a: str
    b: str
    metric: str
    margin: float | None = None
    #: shown in percentage points
    pct: bool = False

    @property
    def methods(self) -> tuple[str, ...]:
        return (self.a, self.b)

    def judge(self, run: PaperRun) -> list[Claim]:
        a, b = self.a, self.b
        if not (run.has(a) and run.has(b)):
            return [Claim(self.section, self.text, self.paper,
                          f"not measured ({a} or {b} missing)", INCONCLUSIVE)]
        d = paired_interval(run, a, b, self.metric)
        verdict = verdict_greater(d) if self.margin is None else verdict_within(d, self.margin)
        return [Claim(self.section, self.text, self.paper,
                      f"{_v(run, a, self.metric, self.pct)} vs {_v(run, b, self.metric, self.pct)}"
                      f"; {_fmt_diff(d, self.pct)}", verdict, _pooled(a, b))]


@dataclass(frozen=True)
class BeatsEach:
    """"A > each of ``others``" on ``metric`` (paired, one comparison per baseline): holds only
    if A beats every one with its CI above 0; does not hold if any one is significantly better
    than A; otherwise (or with a baseline missing) inconclusive."""

    section: str
    text: str
    paper: str
    a: str
    others: tuple[str, ...]
    metric: str

    @property
    def methods(self) -> tuple[str, ...]:
        return (self.a, *self.others)

    def judge(self, run: PaperRun) -> list[Claim]:
        a, metric = self.a, self.metric
        missing = [b for b in self.others if not run.has(b)]
        have = [b for b in self.others if run.has(b)]
        if not run.has(a) or not have:
            absent = ([] if run.has(a) else [a]) + missing
            return [Claim(self.section, self.text, self.paper,
                          f"not measured ({', '.join(absent)} missing)", INCONCLUSIVE)]
        parts, verdicts = [], []
        for b in have:
            d = paired_interval(run, a, b, metric)
            verdicts.append(verdict_greater(d))
            parts.append(f"vs {b}: {_v(run, b, metric)}, {_fmt_diff(d)}")
        ours = f"{_v(run, a, metric)}; " + "; ".join(parts)
        if missing:
            ours += f"; not measured: {', '.join(missing)}"
        verdict = (FAILS if FAILS in verdicts else
                   HOLDS if not missing and all(v == HOLDS for v in verdicts) else
                   INCONCLUSIVE)
        return [Claim(self.section, self.text, self.paper, ours, verdict, _pooled(a, *have))]


@dataclass(frozen=True)
class Trend:
    """Claims judged by their own function (trends, the frontier's budget, ...); ``methods``
    are the methods it reads, as `fnmatch` patterns (``*`` for a family of gates or scorers)."""

    section: str
    rule: Callable[[PaperRun], list[Claim]]
    methods: tuple[str, ...]

    def judge(self, run: PaperRun) -> list[Claim]:
        return self.rule(run)


_ABL = "moe-lora/{}/care"
_PP = 0.01  # one percentage point


def claims(run: PaperRun) -> list[Claim]:
    """Every claim of `CLAIMS`, judged on ``run``, marked where it rests on a model at chance
    or on one no better than its zero-shot backbone."""
    return _mark_not_evidence(run, [c for spec in CLAIMS for c in spec.judge(run)])


def _mark_not_evidence(run: PaperRun, cs: list[Claim]) -> list[Claim]:
    """Mark every claim resting on a (method, domain) whose ID accuracy CI includes chance
    (`AT_CHANCE`) or whose learned column's CI does not lie above 0 (`NOT_LEARNED`)."""
    marks = [(AT_CHANCE, {(f["method"], f["domain"]) for f in at_chance(run.rows)}),
             (NOT_LEARNED, {(f["method"], f["domain"]) for f in not_learned(run.rows)})]
    return [replace(c, note="; ".join(m for m, flagged in marks
                                      if flagged.intersection(c.rests_on))) for c in cs]


def _pooled_rows(run: PaperRun, pattern: str) -> list[dict[str, Any]]:
    """The pooled rows of the methods that match ``pattern`` (`fnmatch`, e.g. `TAU_GATES`)."""
    return [r for r in run.rows if r["domain"] == "pooled" and fnmatchcase(r["method"], pattern)]


def _thermostat(run: PaperRun) -> list[Claim]:
    rows = sorted(_pooled_rows(run, TAU_GATES), key=lambda r: float(r["gate"][len("care-tau"):]))
    if len(rows) < 2:
        return [Claim("thermostat", "mean experts rises with τ", "1.54 → 3.96", "not measured",
                      INCONCLUSIVE)]
    taus = [r["gate"][len("care-tau"):] for r in rows]
    k = [r["avg_experts"] for r in rows]
    acc = [r["accuracy"] for r in rows]
    table = ", ".join(f"τ={t}: {kk:.2f} experts / {aa * 100:.1f}%"
                      for t, kk, aa in zip(taus, k, acc, strict=False))
    text = "accuracy rises with τ (highest vs lowest τ, paired)"
    hi, lo = rows[-1]["method"], rows[0]["method"]
    if run.has(hi) and run.has(lo):
        d = paired_interval(run, hi, lo, "accuracy")
        points = ", ".join(f"{a * 100:.1f}" for a in acc)
        rises = Claim("thermostat", text, "46.6 → 53.7", f"{points}; "
                      f"τ={taus[-1]} − τ={taus[0]}: {_fmt_diff(d, pct=True)}", verdict_greater(d),
                      _pooled(hi, lo))
    else:
        rises = Claim("thermostat", text, "46.6 → 53.7", f"not measured ({hi} or {lo} missing)",
                      INCONCLUSIVE)
    return [
        Claim("thermostat", "mean experts rises monotonically with τ (point estimates)",
              "1.54, 1.92, 2.42, 3.08, 3.96", table,
              HOLDS if all(b > a for a, b in itertools.pairwise(k)) else FAILS,
              _pooled(*(r["method"] for r in rows))),
        rises,
    ]


def matched_budget(experts: Sequence[float], accuracy: Sequence[float],
                   target: float) -> tuple[float, bool] | None:
    """Smallest mean-expert count at which the piecewise-linear accuracy(experts) through the
    points reaches ``target`` (the frontier claim and figure both use it).

    Returns ``(experts, exact)``; ``exact`` is False when the lowest point already reaches the
    target (the crossing lies at or below it, which the points cannot locate). None when the
    curve never reaches it.

    >>> matched_budget([2, 3, 4], [0.50, 0.54, 0.56], 0.53)
    (2.75, True)
    """
    order = np.argsort(experts)
    x = np.asarray(experts, dtype=float)[order]
    y = np.asarray(accuracy, dtype=float)[order]
    if x.size == 0:
        return None
    if y[0] >= target:
        return float(x[0]), False
    for i in range(x.size - 1):
        if y[i] < target <= y[i + 1]:
            return float(x[i] + (target - y[i]) / (y[i + 1] - y[i]) * (x[i + 1] - x[i])), True
    return None


def _matching_budget(run: PaperRun) -> Claim:
    text, paper = "CARE reaches fixed-4 accuracy with fewer experts", "3.5 experts (12% fewer)"
    care = sorted((r["avg_experts"], r["accuracy"]) for r in _pooled_rows(run, BUDGET_GATES))
    fixed4 = _pooled_rows(run, "*/top4/msp")
    if len(care) < 2 or not fixed4:
        return Claim("frontier", text, paper, "not measured", INCONCLUSIVE)
    target = fixed4[0]["accuracy"]
    rests = _pooled(*(r["method"] for r in _pooled_rows(run, BUDGET_GATES)), MSP4)
    xs, ys = zip(*care, strict=False)
    match, exact = matched_budget(xs, ys, target) or (None, True)
    if match is None or match > 4.05:
        # It fails only if CARE at B = 4 is less accurate than fixed-4 (paired): on a flat
        # frontier a match above 4 experts is as much noise as one below.
        ours = (f"CARE never reaches fixed-4's {target * 100:.1f}% on budgets "
                f"{', '.join(f'{x:.2f}' for x in xs)}" if match is None else
                f"{match:.2f} experts ({(match - 4) / 4 * 100:.0f}% more; point estimates, "
                "interpolated)")
        if not run.has(CARE_B4) or not run.has(MSP4):
            return Claim("frontier", text, paper, ours, INCONCLUSIVE, rests)
        d = paired_interval(run, MSP4, CARE_B4, "accuracy")
        return Claim("frontier", text, paper,
                     f"{ours}; fixed top-4 − CARE at B=4: {_fmt_diff(d, pct=True)}",
                     FAILS if verdict_greater(d) == HOLDS else INCONCLUSIVE, rests)
    most, least = ("", "") if exact else ("≤ ", "≥ ")  # not exact: the lowest budget matches
    ours = (f"{most}{match:.2f} experts ({least}{(4 - match) / 4 * 100:.0f}% fewer; point "
            "estimates, interpolated)")
    # A saving is CARE's only if fixed-k at that many experts is less accurate than fixed-4;
    # on a flat frontier (every k equally accurate) any budget "matches" fixed-4.
    low = f"moe-lora/top{max(1, int(match))}/msp"
    if match >= 3.95 or not run.has(low) or not run.has(MSP4):
        return Claim("frontier", text, paper, ours, INCONCLUSIVE, rests)
    d = paired_interval(run, MSP4, low, "accuracy")
    return Claim("frontier", text, paper,
                 f"{ours}; fixed top-4 − {low.split('/')[1]}: {_fmt_diff(d, pct=True)}",
                 HOLDS if verdict_greater(d) == HOLDS else INCONCLUSIVE, rests + _pooled(low))


def gain_with_disagreement(run: PaperRun, seed: int = 0) -> Claim:
    """Figure "mechanism" (c) as a paired claim: per example (ID and shifted pooled, as the
    figure), the gain of a 5th expert is ``correct(top-5) - correct(top-4)``; the statistic is its
    mean on the examples whose top-4 disagreement is above the median minus its mean on the rest
    (per seed), with a bootstrap over examples."""
    text = ("the accuracy gain of a 5th expert grows with top-4 disagreement (mean gain above "
            "vs below the median disagreement)")
    paper = "Fig. mechanism (c): grows"
    top5, top4 = TOP5, MSP4.rsplit("/", 1)[0]
    def dis_key(role: str) -> str:
        return score_key(top4, "pooled", role, "disagreement")

    roles = [r for r in ("id", "shift") if dis_key(r) in run.arrays]
    if not (run.has(MSP4) and run.has(top5) and roles):
        return Claim("frontier", text, paper, f"not measured ({MSP4}, {top5} or the top-4 "
                     "disagreement missing)", INCONCLUSIVE)

    def cat(get: Callable[[str], NDArray[np.float64]]) -> NDArray[np.float64]:
        return np.concatenate([get(r).reshape(len(get(r)), -1) for r in roles]).astype(float)

    gain = cat(lambda r: run.a(top5, r, "correct")) - cat(lambda r: run.a(MSP4, r, "correct"))
    dis = cat(lambda r: run.arrays[dis_key(r)])
    dis = np.broadcast_to(dis, gain.shape)

    def halves(i: NDArray[np.intp]) -> tuple[float, float]:
        """Mean gain of the examples ``i`` above and at-or-below the median disagreement."""
        g, d = gain[i], dis[i]
        high = d > np.median(d, axis=0)
        if high.all() or not high.any():
            return float("nan"), float("nan")
        return float(g[high].mean()), float(g[~high].mean())

    n = len(gain)
    above, below = halves(np.arange(n))
    d = _bootstrap(lambda i: float(np.subtract(*halves(i))), (n,), text, seed)
    ours = (f"gain {above * 100:+.2f} pts above vs {below * 100:+.2f} pts below the median "
            f"({n} examples); {_fmt_diff(d, pct=True)}")
    return Claim("frontier", text, paper, ours, verdict_greater(d), _pooled(MSP4, top5))


def _wblend(run: PaperRun) -> Claim:
    wrows = _pooled_rows(run, W_SCORERS)
    rows = sorted((float(r["scorer"][len("care_w"):]), r["ood_auroc"]) for r in wrows)
    if len(rows) < 3:
        return Claim("wblend", "interior peak of OOD-AUROC in w", "peak 0.671 at w=0.75",
                     "not measured", INCONCLUSIVE)
    best = max(rows, key=lambda t: t[1])
    ours = ", ".join(f"w={w:g}: {a:.3f}" for w, a in rows)
    return Claim("wblend", "interior peak of OOD-AUROC in w (point estimates)",
                 "0.640, 0.657, 0.668, 0.671, 0.668", ours,
                 HOLDS if 0 < best[0] < 1 else FAILS, _pooled(*(r["method"] for r in wrows)))


def _allocation(run: PaperRun) -> Claim:
    text = "one global τ spends more experts on harder domains (Spearman ρ of experts vs error)"
    rows = [r for r in run.rows if r["method"] == CARE and r["domain"] != "pooled"]
    if len(rows) < 3:
        return Claim("allocation", text, "MMLU 3.6, GSM8K 4.6, HumanEval 4.4, ScienceQA 3.4",
                     "not measured", INCONCLUSIVE)
    rho = float(spearmanr([r["avg_experts"] for r in rows], [1 - r["accuracy"] for r in rows])[0])
    ours = ", ".join(f"{r['domain']} {r['avg_experts']:.2f} (err {1 - r['accuracy']:.2f})"
                     for r in rows) + f"; ρ = {rho:.2f}"
    return Claim("allocation", text, "MMLU 3.6, GSM8K 4.6, HumanEval 4.4, ScienceQA 3.4", ours,
                 HOLDS if rho >= 0.8 else FAILS if rho <= 0 else INCONCLUSIVE,
                 tuple((r["method"], r["domain"]) for r in rows))


#: The paper's claims, in report order: data, judged by `claims`; every method named here is one
#: of its section's experiment (`uqbench.core.experiments.experiment_methods`; a test checks it)
CLAIMS: tuple[Compare | BeatsEach | Trend, ...] = (
    Compare("uq", "CARE's OOD-AUROC beats MoE top-4 + MSP", "0.668 vs 0.640", CARE, MSP4,
            "ood_auroc"),
    Compare("uq", "CARE's OOD-AUROC beats MC-dropout", "0.668 vs 0.636", CARE,
            "moe-lora/top4/mc_dropout_msp", "ood_auroc"),
    Compare("uq", "CARE's OOD-AUROC beats the deep ensemble", "0.668 vs 0.638", CARE,
            "moe-lora/top4/ensemble_msp", "ood_auroc"),
    BeatsEach("uq", "CARE's OOD-AUROC beats every single-pass MoE baseline (HydraLoRA + MSP, "
              "MixLoRA + MSP, DynMoLE + entropy, FlyLoRA + MSP, FlyLoRA + entropy)",
              "0.668 vs 0.640, 0.640, 0.651, 0.640, 0.651", CARE, UQ_SINGLE_PASS, "ood_auroc"),
    Compare("uq", "raw ECE comparable between CARE and MSP (|Δ| ≤ 0.03)", "0.186 vs 0.175",
            CARE, MSP4, "ece", margin=0.03),
    Compare("ablation", "random-k loses accuracy vs fixed-k", "52.1 vs 52.8",
            _ABL.format("fixed-k"), _ABL.format("random-k"), "accuracy", pct=True),
    Compare("ablation", "nucleus-only gains accuracy over fixed-k", "53.7 vs 52.8",
            _ABL.format("nucleus-only"), _ABL.format("fixed-k"), "accuracy", pct=True),
    Compare("ablation", "entropy-k gains accuracy over fixed-k", "53.7 vs 52.8",
            _ABL.format("entropy-k"), _ABL.format("fixed-k"), "accuracy", pct=True),
    Compare("ablation", "disagreement term raises OOD-AUROC (CARE with its read-out, w = 0.5, "
            "vs the concentration-only model: nucleus-only gate scored by the "
            "concentration-only read-out, w = 0)", "0.668 vs 0.640", _ABL.format("care"),
            f"moe-lora/nucleus-only/{CONCENTRATION}", "ood_auroc"),
    Compare("ablation", "disagreement term costs no accuracy (|Δ| ≤ 1 pt)", "53.7 vs 53.7",
            _ABL.format("care"), _ABL.format("nucleus-only"), "accuracy", margin=_PP, pct=True),
    Trend("thermostat", _thermostat, (TAU_GATES,)),
    Compare("frontier", "CARE at B=4 beats fixed top-4 accuracy", "53.7 vs 52.8", CARE_B4, MSP4,
            "accuracy", pct=True),
    Trend("frontier", lambda run: [_matching_budget(run)],
          (BUDGET_GATES, CARE_B4, MSP4, "moe-lora/top[123]/msp")),
    Trend("frontier", lambda run: [gain_with_disagreement(run)], (MSP4, TOP5)),
    Compare("kmax", "accuracy saturates by k_max = 6 (|acc(12) − acc(6)| ≤ 1 pt)",
            "53.7 vs 53.6", "moe-lora/care-kmax12/care", "moe-lora/care-kmax6/care", "accuracy",
            margin=_PP, pct=True),
    Trend("wblend", lambda run: [_wblend(run)], (W_SCORERS,)),
    Compare("selective", "ID: CARE within 1 pt of MSP at 80% coverage", "54.2 vs 55.1", CARE,
            MSP4, "sel_acc_80", margin=_PP, pct=True),
    Compare("selective", "shifted: CARE beats MSP at 80% coverage", "53.5 vs 52.0", CARE, MSP4,
            "shift_sel_acc_80", pct=True),
    Compare("robustness", "CARE keeps more accuracy on shifted splits than fixed top-4",
            "53.1 vs 50.3", "moe-lora/care/msp", MSP4, "shift_accuracy", pct=True),
    Trend("allocation", lambda run: [_allocation(run)], (CARE,)),
)


def run_experiment(run_dir: Path) -> str:
    """The experiment a finished run ran (``run.json`` config), ``paper`` when it names none."""
    try:
        exp = read_meta(run_dir).get("config", {}).get("experiment")
    except (UserError, AttributeError):  # no run.json, unreadable, or a foreign one
        exp = None
    return exp or "paper"


def write_paper_report(run_dir: str | Path, experiment: str | None = None) -> Path:
    """Write ``paper_report.md``: the claims of ``experiment`` (its section; ``paper``: every
    claim), judged on the run's numbers. ``experiment`` None: the one ``run.json`` records."""
    run_dir = Path(run_dir)
    experiment = experiment or run_experiment(run_dir)
    if experiment not in EXPERIMENTS:
        raise UserError(f"unknown experiment {experiment!r}; valid: "
                        f"{', '.join(EXPERIMENTS.names())}")
    run = PaperRun(run_dir)
    cs = claims(run)
    if experiment != "paper":
        cs = [c for c in cs if c.section == experiment]
    scope = ("every experiment's claims" if experiment == "paper" else
             f"the claims of experiment `{experiment}` only (`--experiment paper` checks all)")
    lines = ["# CARE paper claims, measured by uqbench", "", f"Scope: {scope}.", "",
             __doc__.split("\n\n", 1)[1].split("`write_paper_report")[0].strip(), "",
             "| section | claim | paper | ours (95% CI) | verdict |", "|---|---|---|---|---|"]
    notes = simplified_notes()
    models = [sorted({m.split("/")[0] for m, _ in c.rests_on} & notes.keys()) for c in cs]
    lines += [f"| {c.section} | {c.text}{SIMPLIFIED_MARK if ms else ''} | {c.paper} | {c.ours} "
              f"| {c.shown_verdict()} |" for c, ms in zip(cs, models, strict=False)]
    if used := sorted({m for ms in models for m in ms}):
        lines += ["", "‡ The MoE-LoRA baselines are uqbench's re-implementations (one MoE-LoRA "
                  "layer configured per method, `baselines/variants.py`, trained with this "
                  "run's recipe), not their authors' code; a ranking against them is a ranking "
                  "against these versions. Simplifications: "
                  + "; ".join(notes[m] for m in used) + "."]
    counts = {v: sum(c.verdict == v for c in cs) for v in (HOLDS, FAILS, INCONCLUSIVE)}
    n_chance = sum(AT_CHANCE in c.note for c in cs)
    n_flat = sum(NOT_LEARNED in c.note for c in cs)
    lines += ["", f"Totals: {counts[HOLDS]} hold, {counts[FAILS]} do not hold, "
              f"{counts[INCONCLUSIVE]} inconclusive at this scale."
              + (f" {n_chance} of these rest on a model at chance (ID accuracy CI includes "
                 "chance): not evidence." if n_chance else "")
              + (f" {n_flat} rest on a model no better than its zero-shot backbone (learned "
                 "column's CI not above 0): not evidence." if n_flat else "")]
    path = run_dir / PAPER_REPORT
    atomic_write_text(path, "\n".join(lines) + "\n")
    return path
