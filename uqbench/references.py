"""Reference rows (what a model must beat to show it reads the question) and the at-chance check.

Per domain and ``pooled`` the results gain two rows, with the accuracy columns only (every other
metric column NaN; model = method name, gate and scorer ``-``):

``chance``
    the expected accuracy of a uniform guess on the ID test split, mean of 1/k_i over its
    questions (k_i options). Its ``accuracy_lo``/``accuracy_hi`` are not a bootstrap (the level
    is a known constant of the split) but the central 95% interval of a uniform *guesser's*
    accuracy on this split: the 2.5% and 97.5% quantiles of the Poisson-binomial number correct
    (`uqbench.data.artifacts.chance_interval`), i.e. where a model answering at random lands.
``options-only``
    the accuracy of the options-only artifact classifier (`uqbench.data.artifacts`: logistic
    regression on option text and option-set features, the question hidden), trained on the
    domain's train split and evaluated on the ID test split; pooled concatenates the domains'
    predictions. CI: percentile bootstrap over examples with the profile's resamples and seed 0,
    as every model row.

``shift_accuracy`` is the same reference on the shifted split. `at_chance` lists every model
row whose ID accuracy CI includes its domain's chance level: its UQ numbers describe a model
that cannot be told from guessing.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from uqbench import metrics as M
from uqbench.cache import PROTOCOL_VERSION
from uqbench.evaluate import CI_METRICS, COLUMNS
from uqbench.report import CHANCE, OPTIONS_ONLY, is_reference

log = logging.getLogger(__name__)


def _template(method: str, domain: str) -> dict[str, Any]:
    row: dict[str, Any] = {"method": method, "model": method, "gate": "-", "scorer": "-",
                           "domain": domain}
    for c in COLUMNS:
        row[c] = row[f"{c}_std"] = float("nan")
        if c in CI_METRICS:
            row[f"{c}_lo"] = row[f"{c}_hi"] = float("nan")
    return row


def _mean_ci(correct: np.ndarray, n_boot: int, seed: int) -> tuple[float, float, float]:
    if correct.size == 0 or not np.isfinite(correct).all():
        return float("nan"), float("nan"), float("nan")
    _, lo, hi = M.bootstrap_ci(np.mean, correct, n_resamples=n_boot, seed=seed)
    return float(np.mean(correct)), float(lo), float(hi)


def reference_rows(suite: Any, *, n_boot: int, seed: int = 0) -> list[dict[str, Any]]:
    """The ``chance`` and ``options-only`` rows of every domain of a built suite and ``pooled``.

    ``suite`` needs ``domains`` and ``split(domain, role).records``/``.hash`` (a built
    `uqbench.data.suites.Suite`).
    """
    from uqbench.data.artifacts import _clf_correct, _fit, chance_interval, chance_level

    domains = list(suite.domains)
    recs = {(d, r): list(suite.split(d, r).records) for d in domains for r in ("id", "shift")}
    correct: dict[tuple[str, str], np.ndarray] = {}
    for d in domains:
        clf = _fit(list(suite.split(d, "train").records), seed)
        for r in ("id", "shift"):
            correct[d, r] = _clf_correct(clf, recs[d, r], seed)
    rows: list[dict[str, Any]] = []
    for method in (CHANCE, OPTIONS_ONLY):
        for dom in [*domains, "pooled"]:
            parts = domains if dom == "pooled" else [dom]
            id_recs = [x for d in parts for x in recs[d, "id"]]
            sh_recs = [x for d in parts for x in recs[d, "shift"]]
            row = _template(method, dom)
            if method == CHANCE:
                row["accuracy"] = chance_level(id_recs)
                row["accuracy_lo"], row["accuracy_hi"] = chance_interval(id_recs)
                row["shift_accuracy"] = chance_level(sh_recs)
                row["accuracy_std"] = row["shift_accuracy_std"] = 0.0
            else:
                c_id = np.concatenate([correct[d, "id"] for d in parts])
                c_sh = np.concatenate([correct[d, "shift"] for d in parts])
                row["accuracy"], row["accuracy_lo"], row["accuracy_hi"] = _mean_ci(c_id, n_boot,
                                                                                   seed)
                row["shift_accuracy"] = float(np.mean(c_sh)) if c_sh.size else float("nan")
                row["accuracy_std"] = row["shift_accuracy_std"] = 0.0
            row.update({
                "forward_passes": float("nan"), "n_id": len(id_recs), "n_shift": len(sh_recs),
                "seeds": 1, "protocol": PROTOCOL_VERSION,
                "split_hashes": ",".join(suite.split(d, r).hash for d in parts
                                         for r in ("id", "shift")),
            })
            rows.append(row)
    return rows


def _num(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(v) else v


def at_chance(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Model rows whose ID accuracy CI ``[accuracy_lo, accuracy_hi]`` includes their domain's
    chance level (from the ``chance`` rows; domains without one are not checked)."""
    chance = {r["domain"]: _num(r.get("accuracy")) for r in rows if r.get("method") == CHANCE}
    out = []
    for r in rows:
        if is_reference(r):
            continue
        c = chance.get(r["domain"])
        lo, hi = _num(r.get("accuracy_lo")), _num(r.get("accuracy_hi"))
        if c is None or lo is None or hi is None:
            continue
        if lo <= c <= hi:
            out.append({"method": r["method"], "domain": r["domain"],
                        "accuracy": _num(r.get("accuracy")), "accuracy_lo": lo,
                        "accuracy_hi": hi, "chance": c})
    return out


def at_chance_message(flags: Sequence[Mapping[str, Any]]) -> str:
    """One warning listing every flagged method and domain ('' when none)."""
    if not flags:
        return ""
    lines = [f"WARNING: {len(flags)} method/domain result(s) cannot be told from guessing:"]
    for f in flags:
        acc = f["accuracy"]
        lines.append(f"  {f['method']} on {f['domain']}: ID accuracy "
                     f"{'nan' if acc is None else format(acc, '.2f')} "
                     f"[{f['accuracy_lo']:.2f}, {f['accuracy_hi']:.2f}] includes chance "
                     f"{f['chance']:.2f} — its UQ numbers measure a model at chance")
    return "\n".join(lines)


def warn_at_chance(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """`at_chance` of the rows, logged as one WARNING (stderr) when any; returns the list."""
    flags = at_chance(rows)
    if flags:
        log.warning(at_chance_message(flags))
    return flags


__all__ = ["at_chance", "at_chance_message", "reference_rows", "warn_at_chance"]
