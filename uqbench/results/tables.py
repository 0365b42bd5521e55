"""Result tables: ``results.{jsonl,csv,md,tex}`` and the printed summary.

AURC and E-AURC are fractions (not x1000). ECE uses 12 equal-width bins on the MSP of the
method's predictive distribution (the paper's convention); ECE-TS (and, in the csv/jsonl,
``ece_hb``, ``ece_iso``) is the same ECE after temperature scaling (histogram binning,
isotonic regression) fitted on the domain's labelled calibration split
(`uqbench.stats.recalibration`). ECE-ad is the ECE with 12 equal-mass bins, MCE the largest gap of
the 12 equal-width bins, Brier (multiclass) and NLL (nats) score the predictive distribution,
AUGRC is the area under the generalized risk-coverage curve (Traub et al. 2024). ECE-10m,
PRR and SelAcc@10 are HELM's ``ece_10_bin``, LM-Polygraph's normalised PRR and HELM's
``selective_acc@10`` (docs/results.md). OOD-AUROC
is ID vs the shifted split of the same domain, OOD = positive, score = uncertainty. The rows
`chance` (a uniform guess; its interval is where a random guesser lands), `options-only` (a
classifier that sees the options, not the question) and `zero-shot` (the frozen backbone through
the same head, where the head answers untrained) are references with accuracy columns only: a
model must beat the first two to show it reads the question, the third to show its training
added anything, which each model row's Learned column gives (accuracy − zero-shot, paired
bootstrap CI; `uqbench.results.references`). The conformal
and risk-control columns are defined in `uqbench.results.conformal_risk`.

Two levels (each column's header and level declared in `uqbench.results.columns`): the model
level holds what depends only on a model/gate's predictive distribution (accuracy,
calibration, conformal sets, expert budget), once per model/gate and domain, plus one row per
other predictive distribution a scorer brings (MC-dropout or ensemble means); the scorer level
holds the ranking each scorer's uncertainty induces (OOD detection, selective prediction, risk
control), the model named once per block. ``results.csv``/``.jsonl`` keep every column of every row.
"""
from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from uqbench.files import rundir
from uqbench.files.cache import atomic_write_text
from uqbench.results.columns import COLUMNS, DECLARED, RISK_AT
from uqbench.results.references import (
    at_chance,
    is_reference,
    trained,
)

KEY_COLUMNS = ("method", "model", "gate", "scorer", "domain")
#: the order of the tables' columns; a declared column with a header (`DECLARED`) that this
#: does not name comes after these, in declaration order
ORDER = (
    "accuracy", "shift_accuracy", "learned", "ece", "ece_ts", "ece_adaptive", "ece_10_mass", "mce",
    "brier", "nll", "cp_lac_10_cov", "cp_lac_10_size", "cp_aps_rand_10_cov",
    "cp_aps_rand_10_size", "shift_cp_aps_rand_10_cov", "shift_cp_aps_rand_10_size",
    "avg_experts", "forward_passes", "ood_auroc", "aupr_out", "fpr95", "aurc", "e_aurc",
    "augrc", "sel_acc_80", "shift_sel_acc_80", "prr", "sel_acc_10", "rc_50_coverage",
    "rc_50_risk", "shift_rc_50_coverage", "shift_rc_50_risk", *RISK_AT,
)


def short_name(column: str) -> str:
    """The header the tables show ``column`` under (its name where it has none)."""
    col = DECLARED.get(column)
    return col.header if col is not None and col.header else column


def digits_of(column: str) -> int:
    """The digits the tables show ``column`` with (3 where it is not declared)."""
    col = DECLARED.get(column)
    return col.digits if col is not None else 3


def level_of(column: str) -> str:
    """``model`` or ``scorer``: the column's declared level (`uqbench.results.columns`)."""
    return DECLARED[column].level


def shown(level: str, *, learned: bool = True) -> tuple[tuple[str, str, int], ...]:
    """(column, header, digits) of one level's table: every declared column with a header
    (``learned`` False: without the learned column, for a run that trained nothing,
    `uqbench.results.references.trained`)."""
    names = [*ORDER, *(n for n in DECLARED if n not in ORDER)]
    return tuple((c.name, c.header, c.digits) for c in map(DECLARED.__getitem__, names)
                 if c.header and c.level == level and (learned or c.name != "learned"))


#: the ranking columns with a bootstrap CI: one forest plot each (`figures.forest`)
FOREST_COLUMNS = tuple(c.name for c in COLUMNS.values() if c.level == "scorer" and c.ci)
#: the many-model table's columns (`uqbench.reporting.models`): those with a CI in the results
#: rows and per-example arrays in ``scores.npz`` (so the paired difference can be formed), model
#: level then scorer level
MODEL_COLUMNS = ("accuracy", "ece", "ood_auroc", "aurc", "augrc", "sel_acc_80")


def header(column: str) -> str:
    """A column's short name with its direction (``ECE ↓``)."""
    return f"{short_name(column)} {'↑' if DECLARED[column].higher_is_better else '↓'}"


def random_ranking(column: str, row: Mapping[str, Any]) -> float | None:
    """What a score that ranks at random (a constant: one tie group) gets in a ranking column,
    from the row's ID accuracy ``a``: OOD-AUROC 0.5; AURC ``1 − a`` (every coverage carries
    the full error rate); AUGRC ``(1 − a) / 2`` (the generalized risk grows linearly with
    coverage); selective accuracy ``a``; PRR 0. None for the columns without one."""
    a = _num(row.get("accuracy"))
    if column in ("ood_auroc", "prr"):
        return 0.5 if column == "ood_auroc" else 0.0
    if a is None:
        return None
    return {"aurc": 1.0 - a, "augrc": (1.0 - a) / 2, "sel_acc_80": a, "sel_acc_10": a}.get(column)


def _num(v: Any) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else v


def _fmt(row: Mapping[str, Any], col: str, digits: int, *, ci: bool) -> str:
    v = _num(row.get(col))
    if v is None:
        return "–"
    s = f"{v:.{digits}f}"
    lo, hi = _num(row.get(f"{col}_lo")), _num(row.get(f"{col}_hi"))
    if ci and lo is not None and hi is not None:
        s += f" [{lo:.{digits}f}, {hi:.{digits}f}]"
    elif row.get("seeds", 1) > 1 and _num(row.get(f"{col}_std")) is not None:
        s += f" ± {row[f'{col}_std']:.{digits}f}"
    return s


def pair_of(row: Mapping[str, Any]) -> str:
    """``model/gate`` of a model's row; a reference row's (or a bare row's) method."""
    if is_reference(row) or "model" not in row or "gate" not in row:
        return str(row["method"])
    return f"{row['model']}/{row['gate']}"


def _short(scorers: Sequence[str]) -> str:
    """``mc_dropout_*`` for scorers sharing a prefix up to an underscore, else their list."""
    prefix = os.path.commonprefix(list(scorers))
    prefix = prefix[:prefix.rfind("_") + 1]
    return f"{prefix}*" if len(scorers) > 1 and prefix else ", ".join(scorers)


@dataclass(frozen=True)
class ModelRow:
    """One row of the model-level table: a model/gate's predictive distribution on one domain.

    Scorers of one model/gate share its predictive distribution (accuracy, calibration,
    conformal sets) unless they bring their own (`Scorer.predictive`: MC-dropout and ensemble
    means; or `Scorer.confidence`): each distinct set of model-level values is its own row,
    labelled with the scorers it belongs to. ``row`` is the results row shown (the MSP one
    where MSP shares it)."""

    label: str
    pair: str
    domain: str
    row: Mapping[str, Any]
    methods: tuple[str, ...]
    at_chance: str  # why its accuracy cannot be told from chance; "" when it can

    @property
    def reference(self) -> bool:
        return is_reference(self.row)


@dataclass(frozen=True)
class ScorerBlock:
    """The scorer-level rows of one model/gate on one domain (the model named once)."""

    pair: str
    domain: str
    rows: tuple[Mapping[str, Any], ...]
    at_chance: str


def chance_reasons(rows: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], str]:
    """(method, domain) -> why its ID accuracy cannot be told from chance
    (`uqbench.results.references.at_chance`)."""
    return {(f["method"], f["domain"]):
            f"ID accuracy CI [{f['accuracy_lo']:.2f}, {f['accuracy_hi']:.2f}] includes chance "
            f"{f['chance']:.2f}" for f in at_chance(rows)}


def domains_of(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Domains in row order, ``pooled`` first."""
    doms = list(dict.fromkeys(r["domain"] for r in rows))
    return (["pooled"] if "pooled" in doms else []) + [d for d in doms if d != "pooled"]


def model_rows(rows: Sequence[Mapping[str, Any]]) -> list[ModelRow]:
    """The model-level table: per domain, one row per model/gate and predictive distribution
    (see `ModelRow`), then the reference rows."""
    why = chance_reasons(rows)
    keys = [c for c, _, _ in shown("model")]
    out = []
    for dom in domains_of(rows):
        groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
        for r in rows:
            if r["domain"] == dom and not is_reference(r):
                groups.setdefault((pair_of(r), repr([r.get(k) for k in keys])), []).append(r)
        first: dict[str, tuple[str, str]] = {}
        for key, members in groups.items():  # the group holding MSP (else the first) is plain
            if key[0] not in first or any(m.get("scorer") == "msp" for m in members):
                first[key[0]] = key
        for (pair, vals), members in groups.items():
            shown_row = next((m for m in members if m.get("scorer") == "msp"), members[0])
            plain = first[pair] == (pair, vals) or pair == shown_row["method"]
            label = pair if plain else f"{pair} · {_short([str(m['scorer']) for m in members])}"
            methods = tuple(str(m["method"]) for m in members)
            chance = next((why[(m, dom)] for m in methods if (m, dom) in why), "")
            out.append(ModelRow(label, pair, dom, shown_row, methods, chance))
        out += [ModelRow(r["method"], r["method"], dom, r, (r["method"],), "")
                for r in rows if r["domain"] == dom and is_reference(r)]
    return out


def scorer_blocks(rows: Sequence[Mapping[str, Any]]) -> list[ScorerBlock]:
    """The scorer-level table: per domain and model/gate, its scorers' rows."""
    why = chance_reasons(rows)
    out = []
    for dom in domains_of(rows):
        blocks: dict[str, list[Mapping[str, Any]]] = {}
        for r in rows:
            if r["domain"] == dom and not is_reference(r):
                blocks.setdefault(pair_of(r), []).append(r)
        for pair, members in blocks.items():
            chance = next((why[(m["method"], dom)] for m in members
                           if (m["method"], dom) in why), "")
            out.append(ScorerBlock(pair, dom, tuple(members), chance))
    return out


def _scorer_name(row: Mapping[str, Any]) -> str:
    return str(row.get("scorer", row["method"]))


def _table(head: Sequence[str], body: Iterable[Sequence[str]], *, tex: bool) -> str:
    if tex:
        esc = [[str(c).replace("_", "\\_").replace("–", "--") for c in line] for line in body]
        return "\n".join(["\\begin{tabular}{" + "l" * 3 + "c" * (len(head) - 3) + "}",
                          "\\toprule", " & ".join(head) + " \\\\", "\\midrule",
                          *(" & ".join(line) + " \\\\" for line in esc),
                          "\\bottomrule", "\\end{tabular}"])
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head),
                      *("| " + " | ".join(map(str, line)) + " |" for line in body)])


def model_table(rows: Sequence[Mapping[str, Any]], *, ci: bool = True, tex: bool = False,
                learned: bool = True) -> str:
    """Model level: Model | Domain | Scorers | accuracy, calibration, conformal, budget
    (``learned``: with the learned column)."""
    cols = shown("model", learned=learned)
    head = ["Model", "Domain", "Scorers", *(h for _, h, _ in cols)]
    body = [[m.label + (" (at chance)" if m.at_chance else ""), m.domain,
             "–" if m.reference else str(len(m.methods)),
             *(_fmt(m.row, c, d, ci=ci) for c, _, d in cols)] for m in model_rows(rows)]
    return _table(head, body, tex=tex)


def scorer_table(rows: Sequence[Mapping[str, Any]], *, ci: bool = True, tex: bool = False) -> str:
    """Scorer level: Model (named once per block) | Scorer | Domain | the ranking metrics."""
    cols = shown("scorer")
    head = ["Model", "Scorer", "Domain", *(h for _, h, _ in cols)]
    body = [[(b.pair + (" (at chance)" if b.at_chance else "")) if i == 0 else "",
             _scorer_name(r), b.domain, *(_fmt(r, c, d, ci=ci) for c, _, d in cols)]
            for b in scorer_blocks(rows) for i, r in enumerate(b.rows)]
    return _table(head, body, tex=tex)


MODEL_TITLE = ("Model level: the predictive distribution of each model/gate (accuracy, "
               "calibration, conformal sets at alpha = 0.1, expert budget); a scorer with its own "
               "predictive distribution (MC-dropout, ensemble) has its own row")
SCORER_TITLE = ("Scorer level: the ranking each scorer's uncertainty induces (OOD detection, "
                "selective prediction, risk control at r* = 0.5, delta = 0.1)")


def markdown_table(rows: Sequence[Mapping[str, Any]], *, ci: bool = True,
                   learned: bool = True) -> str:
    """Both levels, model then scorer, as markdown."""
    return (f"### {MODEL_TITLE}\n\n{model_table(rows, ci=ci, learned=learned)}\n\n"
            f"### {SCORER_TITLE}\n\n{scorer_table(rows, ci=ci)}")


def latex_table(rows: Sequence[Mapping[str, Any]], *, learned: bool = True) -> str:
    """Both levels as LaTeX tabulars (values without CIs)."""
    return (f"% {MODEL_TITLE}\n{model_table(rows, ci=False, tex=True, learned=learned)}\n\n"
            f"% {SCORER_TITLE}\n{scorer_table(rows, ci=False, tex=True)}\n")


def _w(col: str) -> int:
    return max(len(DECLARED[col].header), 6)


def summary(rows: Sequence[Mapping[str, Any]], *, domain: str = "pooled",
            learned: bool = True) -> str:
    """The printed summary of one domain: the model level (Acc, Learned where ``learned``,
    ECE, ECE-TS, Experts, Passes) then the scorer level (OOD-AUROC, AURC, AUGRC, SelAcc@80),
    the model named once above its scorers; a model none of whose scorers has a value in
    these columns is left out of the scorer level (and the level, when no model has one)."""
    sel = [r for r in rows if r["domain"] == domain]
    models = model_rows(sel)
    scols = ("ood_auroc", "aurc", "augrc", "sel_acc_80")
    blocks = [b for b in scorer_blocks(sel)
              if any(_num(r.get(c)) is not None for r in b.rows for c in scols)]

    def line(name: str, width: int, row: Mapping[str, Any], cols: Sequence[str]) -> str:
        cells = [_fmt(row, c, DECLARED[c].digits, ci=False).split(" ")[0].rjust(_w(c))
                 for c in cols]  # the value, without ± std
        return f"{name:<{width}}  " + "  ".join(cells)

    def head(name: str, width: int, cols: Sequence[str]) -> str:
        return f"{name:<{width}}  " + "  ".join(DECLARED[c].header.rjust(_w(c)) for c in cols)

    mcols = ("accuracy", *(["learned"] if learned else []), "ece", "ece_ts", "avg_experts",
             "forward_passes")
    mw = max([len(m.label) + 12 * bool(m.at_chance) for m in models] + [5])
    lines = [head("Model", mw, mcols)]
    lines += [line(m.label + (" (at chance)" if m.at_chance else ""), mw, m.row, mcols)
              for m in models]
    if not blocks:
        return "\n".join(lines)
    sw = max([len(_scorer_name(r)) + 2 for b in blocks for r in b.rows] + [8])
    lines += ["", head("Scorer", sw, scols)]
    for b in blocks:
        lines.append(b.pair + (" (at chance)" if b.at_chance else ""))
        lines += [line("  " + _scorer_name(r), sw, r, scols) for r in b.rows]
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
    learned = trained(meta)
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
          "Cells: value [95% bootstrap CI] (mean over seeds when several). results.csv and "
          "results.jsonl hold every column of every row.\n\n" + "".join(
              f"Not computed for {', '.join(c['domains'])}: {', '.join(c['columns'])} "
              f"({c['reason']}).\n\n" for c in meta.get("skipped_columns", [])
              if "domains" in c) +  # a domain without a shift split
          f"## {MODEL_TITLE}\n\n{model_table(rows, learned=learned)}\n\n"
          f"## {SCORER_TITLE}\n\n{scorer_table(rows)}\n" + _notes(rows))
    atomic_write_text(paths["md"], md)
    atomic_write_text(paths["tex"], latex_table(rows, learned=learned))
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
