"""Result tables: ``results.{jsonl,csv,md,tex}`` and the printed summary.

AURC and E-AURC are fractions (not x1000). ECE uses 12 equal-width bins on the MSP of the
method's predictive distribution (the paper's convention); ECE-TS (and, in the csv/jsonl,
``ece_hb``, ``ece_iso``) is the same ECE after temperature scaling (histogram binning,
isotonic regression) fitted on the domain's labelled calibration split
(`uqbench.stats.recalibration`). ECE-ad is the ECE with 12 equal-mass bins, MCE the largest gap of
the 12 equal-width bins, Brier (multiclass) and NLL (nats) score the predictive distribution,
AUGRC is the area under the generalized risk-coverage curve (Traub et al. 2024). OOD-AUROC
is ID vs the shifted split of the same domain, OOD = positive, score = uncertainty. The rows
`chance` (a uniform guess; its interval is where a random guesser lands) and `options-only` (a
classifier that sees the options, not the question) are references with accuracy columns only:
a model must beat them to show it reads the question (`uqbench.results.references`). The columns of
the conformal and risk-control tables are defined in `uqbench.results.conformal_risk`.
"""
from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from uqbench.files import rundir
from uqbench.files.cache import atomic_write_text

KEY_COLUMNS = ("method", "model", "gate", "scorer", "domain")
#: Reference rows (`uqbench.results.references`): accuracy columns only, gate and scorer "-".
CHANCE, OPTIONS_ONLY = "chance", "options-only"
REFERENCE_METHODS = (CHANCE, OPTIONS_ONLY)


def is_reference(row: Mapping[str, Any]) -> bool:
    """A ``chance`` or ``options-only`` row, not a model's."""
    return row.get("method") in REFERENCE_METHODS


SHOWN = (  # (column, header, digits)
    ("accuracy", "Acc", 3), ("ece", "ECE", 3), ("ece_ts", "ECE-TS", 3),
    ("ece_adaptive", "ECE-ad", 3), ("mce", "MCE", 3), ("brier", "Brier", 3), ("nll", "NLL", 3),
    ("ood_auroc", "OOD-AUROC", 3),
    ("aurc", "AURC", 3), ("augrc", "AUGRC", 3), ("sel_acc_80", "SelAcc@80", 3),
    ("shift_accuracy", "ShiftAcc", 3),
    ("avg_experts", "Experts", 2), ("forward_passes", "Passes", 0),
)
#: The second table: conformal sets at alpha = 0.1 fitted on calib (`uqbench.results.conformal_risk`).
CONFORMAL_SHOWN = (
    ("cp_lac_10_cov", "LAC cov", 3), ("cp_lac_10_size", "LAC size", 2),
    ("cp_aps_rand_10_cov", "APS cov", 3), ("cp_aps_rand_10_size", "APS size", 2),
    ("cp_aps_rand_10_ssc", "APS SSC", 3), ("shift_cp_aps_rand_10_cov", "Shift APS cov", 3),
    ("shift_cp_aps_rand_10_size", "Shift APS size", 2),
    ("cp_raps_rand_10_cov", "RAPS cov", 3), ("cp_raps_rand_10_size", "RAPS size", 2),
)
#: The third table: selective risk control at the default target (r* = 0.5, delta = 0.1).
RISK_SHOWN = (
    ("rc_50_coverage", "Cov@r*", 3), ("rc_50_risk", "Risk", 3),
    ("shift_rc_50_coverage", "Shift cov", 3), ("shift_rc_50_risk", "Shift risk", 3),
    ("risk_at_50", "Risk@50", 3), ("risk_at_80", "Risk@80", 3), ("risk_at_90", "Risk@90", 3),
)
TABLES = (("Calibration, OOD detection, selective prediction", SHOWN),
          ("Conformal sets, alpha = 0.1 (q̂ from the calib split; shift: calibrated on ID)",
           CONFORMAL_SHOWN),
          ("Selective risk control: target risk 0.5 at delta = 0.1 (Learn-then-Test on calib)",
           RISK_SHOWN))


def _fmt(row: Mapping[str, Any], col: str, digits: int, *, ci: bool) -> str:
    v = row.get(col)
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    s = f"{v:.{digits}f}"
    lo, hi = row.get(f"{col}_lo"), row.get(f"{col}_hi")
    if ci and lo is not None and hi is not None and not math.isnan(lo):
        s += f" [{lo:.{digits}f}, {hi:.{digits}f}]"
    elif row.get("seeds", 1) > 1 and row.get(f"{col}_std") is not None:
        s += f" ± {row[f'{col}_std']:.{digits}f}"
    return s


def _shown_rows(rows: Sequence[Mapping[str, Any]], shown: Sequence[tuple[str, str, int]]
                ) -> Sequence[Mapping[str, Any]]:
    """The main table keeps the reference rows; the others hold model rows only."""
    return rows if shown is SHOWN else [r for r in rows if not is_reference(r)]


def markdown_table(rows: Sequence[Mapping[str, Any]], *, ci: bool = True,
                   shown: Sequence[tuple[str, str, int]] = SHOWN) -> str:
    head = ["Method", "Domain", *(h for _, h, _ in shown)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in _shown_rows(rows, shown):
        cells = [r["method"], r["domain"], *(_fmt(r, c, d, ci=ci) for c, _, d in shown)]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines)


def latex_table(rows: Sequence[Mapping[str, Any]],
                shown: Sequence[tuple[str, str, int]] = SHOWN) -> str:
    head = ["Method", "Domain", *(h for _, h, _ in shown)]
    out = ["\\begin{tabular}{ll" + "c" * len(shown) + "}", "\\toprule",
           " & ".join(head) + " \\\\", "\\midrule"]
    for r in _shown_rows(rows, shown):
        cells = [r["method"], r["domain"], *(_fmt(r, c, d, ci=False) for c, _, d in shown)]
        out.append(" & ".join(str(c).replace("_", "\\_").replace("–", "--") for c in cells)
                   + " \\\\")
    out += ["\\bottomrule", "\\end{tabular}"]
    return "\n".join(out)


def summary(rows: Sequence[Mapping[str, Any]], *, domain: str = "pooled") -> str:
    """The paper's Table "uq" layout (Method | ECE | OOD-AUROC), plus Acc and AURC, one domain."""
    sel = [r for r in rows if r["domain"] == domain]
    width = max((len(r["method"]) for r in sel), default=6)
    lines = [f"{'Method':<{width}}  {'Acc':>6}  {'ECE':>6}  {'OOD-AUROC':>9}  {'AURC':>6}  "
             f"{'Experts':>7}  {'Passes':>6}"]
    for r in sel:
        def cell(col: str, digits: int) -> str:
            return _fmt(r, col, digits, ci=False).split(" ")[0]  # the value, without ± std

        lines.append(
            f"{r['method']:<{width}}  {cell('accuracy', 3):>6}  {cell('ece', 3):>6}  "
            f"{cell('ood_auroc', 3):>9}  {cell('aurc', 3):>6}  "
            f"{cell('avg_experts', 2):>7}  {cell('forward_passes', 0):>6}")
    return "\n".join(lines)


def _provenance(meta: Mapping[str, Any]) -> str:
    """What the results come from: the run's suite, profile and backbone, or (records of a
    model uqbench did not run, e.g. lm-eval samples) where they were scored from."""
    if meta.get("suite") is not None:
        return (f"suite `{meta['suite']}`, profile `{meta.get('profile')}`, "
                f"backbone `{meta.get('backbone')}`")
    model = (meta.get("lmeval") or {}).get("model")
    return (f"scored from {meta.get('scored_from', 'records made elsewhere')}"
            + (f", model `{model}`" if model else ""))


def write_results(out_dir: Path, rows: Sequence[Mapping[str, Any]],
                  meta: Mapping[str, Any]) -> dict[str, Path]:
    """Write every table format atomically; returns the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    cols = list(dict.fromkeys(k for r in rows for k in r))
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, extrasaction="ignore")
    w.writeheader()
    w.writerows(rows)
    paths = {**{k: out_dir / name for k, name in rundir.TABLES.items()},
             "meta": out_dir / rundir.META}
    atomic_write_text(paths["jsonl"], "".join(json.dumps(r) + "\n" for r in rows))
    atomic_write_text(paths["csv"], buf.getvalue())
    md = (f"# uqbench results: {_provenance(meta)}\n\n{__doc__.strip()}\n"
          "Cells: value [95% bootstrap CI] (mean over seeds when several).\n\n"
          + "\n\n".join(f"## {title}\n\n" + markdown_table(rows, shown=shown)
                         for title, shown in TABLES) + "\n" + _notes(rows))
    atomic_write_text(paths["md"], md)
    atomic_write_text(paths["tex"], "\n\n".join(f"% {title}\n" + latex_table(rows, shown)
                                                 for title, shown in TABLES) + "\n")
    atomic_write_text(paths["meta"], json.dumps(dict(meta), indent=1, default=str))
    return paths


def _notes(rows: Sequence[Mapping[str, Any]]) -> str:
    """Why conformal or risk-control cells are empty ("–"), once per distinct reason."""
    why = dict.fromkeys(m for r in rows for k in ("cp_note", "rc_note")
                        for m in str(r.get(k) or "").split(" | ") if m)
    return "\nEmpty conformal / risk-control cells:\n\n" + "".join(
        f"- {m}\n" for m in why) if why else ""


def rows_for(rows: Iterable[Mapping[str, Any]], **match: Any) -> list[Mapping[str, Any]]:
    return [r for r in rows if all(r.get(k) == v for k, v in match.items())]
