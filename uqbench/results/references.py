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

``zero-shot``
    the accuracy of the frozen backbone (no adapter) through the run's head on the same
    questions: one deterministic pass (`uqbench.core.engine.Engine.zero_shot`), for heads that
    answer untrained (a decoder's ``letters`` and ``cloze``); CI as ``options-only``'s. Runs
    whose head has no zero-shot (an encoder's new head) leave it out and say why (run.json
    ``references_skipped``).

``shift_accuracy`` is the same reference on the shifted split. Beside it every model row gets
``learned`` (`learned_columns`): its ID accuracy minus the zero-shot accuracy, with the 95%
percentile interval of a *paired* bootstrap over the same questions (the resamples of the
accuracy column: the same seed). `at_chance` lists every model
row whose ID accuracy CI includes its domain's chance level: its UQ numbers describe a model
that cannot be told from guessing.
"""
from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from uqbench.data.artifacts import (
    chance_interval,
    chance_level,
    fit_options_only,
    options_only_correct,
)
from uqbench.files.cache import PROTOCOL_VERSION
from uqbench.results.columns import COLUMNS
from uqbench.results.evaluate import CI_METRICS, ROW_COLUMNS
from uqbench.stats import metrics as M

CHANCE, OPTIONS_ONLY, ZERO_SHOT = "chance", "options-only", "zero-shot"
REFERENCE_METHODS = (CHANCE, OPTIONS_ONLY, ZERO_SHOT)
#: the columns `learned_columns` adds to every model row
LEARNED_COLUMNS = ("learned", "learned_lo", "learned_hi")


def trained(meta: Mapping[str, Any]) -> bool:
    """Whether a run's models were trained by uqbench (a `uqbench run`, or `uqbench score` of
    its records: run.json names the suite, itself or per merged model), so that "what training
    added" (the learned column) is a question the run can ask; predictions made elsewhere
    (lm-eval, HELM, confidence-only records) carry no training."""
    return meta.get("suite") is not None or any(
        isinstance(m, Mapping) and m.get("suite") is not None
        for m in (meta.get("models") or {}).values())


def is_reference(row: Mapping[str, Any]) -> bool:
    """A ``chance``, ``options-only`` or ``zero-shot`` row, not a model's."""
    return row.get("method") in REFERENCE_METHODS

log = logging.getLogger(__name__)


def _template(method: str, domain: str) -> dict[str, Any]:
    row: dict[str, Any] = {"method": method, "model": method, "gate": "-", "scorer": "-",
                           "domain": domain}
    for c in ROW_COLUMNS:
        row[c] = row[f"{c}_std"] = float("nan")
        if c in CI_METRICS:
            row[f"{c}_lo"] = row[f"{c}_hi"] = float("nan")
    return row


def _mean_ci(correct: np.ndarray, n_boot: int, seed: int) -> tuple[float, float, float]:
    if correct.size == 0 or not np.isfinite(correct).all():
        return float("nan"), float("nan"), float("nan")
    _, lo, hi = M.bootstrap_ci(np.mean, correct, n_resamples=n_boot, seed=seed)
    return float(np.mean(correct)), float(lo), float(hi)


@dataclass(frozen=True)
class ReferenceInputs:
    """What the reference rows need, keyed by split name ``"domain/role"`` (role ``id`` or
    ``shift``): each question's option count k_i, and the options-only classifier's 0/1
    correctness per question — ``None`` when there is no train split to fit it on (predictions
    made elsewhere: `uqbench.io.recordset`), in which case the ``options-only`` rows are left out;
    ``hashes`` has every split's content hash, ``calib`` included; ``zero_shot``: the frozen
    backbone's 0/1 correctness per question through the run's head (None where the head has
    no zero-shot, or the records hold none: no ``zero-shot`` rows, ``learned`` NaN)."""

    domains: tuple[str, ...]
    n_choices: Mapping[str, NDArray[np.int64]]
    options_only: Mapping[str, NDArray[np.float64]] | None
    hashes: Mapping[str, str]
    zero_shot: Mapping[str, NDArray[np.float64]] | None = None


def reference_inputs(suite: Any, *, seed: int = 0,
                     zero_shot: Mapping[str, NDArray[np.float64]] | None = None
                     ) -> ReferenceInputs:
    """`ReferenceInputs` of a built suite (``domains`` and ``split(domain, role)`` with
    ``records``/``hash``, a `uqbench.data.suites.spec.Suite`): the classifier is fitted on each
    domain's train split with ``seed``; ``zero_shot`` as `ReferenceInputs` has it."""
    domains = tuple(suite.domains)
    n_choices, correct, hashes = {}, {}, {}
    for d in domains:
        clf = fit_options_only(list(suite.split(d, "train").records), seed)
        for r in ("id", "shift"):
            split = suite.split(d, r)
            n_choices[f"{d}/{r}"] = np.array([len(x.choices) for x in split.records])
            correct[f"{d}/{r}"] = options_only_correct(clf, list(split.records), seed)
            hashes[f"{d}/{r}"] = split.hash
        hashes[f"{d}/calib"] = suite.split(d, "calib").hash
    return ReferenceInputs(domains, n_choices, correct, hashes, zero_shot)


def shift_column(name: str) -> bool:
    """Whether row key ``name`` is computed from a shifted split (ID against shift, or on the
    shift alone): absent from a row whose domain has none."""
    base = re.sub(r"_(std|lo|hi)$", "", name)
    col = COLUMNS.get(base)
    return (col is not None and any(s == "shift" for s, _ in col.reads)) \
        or base.startswith("shift_") or base == "n_shift"


#: the columns a row without a shift split lacks (run.json ``skipped_columns``)
NO_SHIFT_COLUMNS = (*(c.name for c in COLUMNS.values()
                      if any(s == "shift" for s, _ in c.reads)), "shift_avg_experts",
                    "shift_cp_* and shift_rc_* (conformal coverage and risk control under shift)")


def drop_shift(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` without its `shift_column` keys."""
    return {k: v for k, v in row.items() if not shift_column(k)}


def reference_rows(refs: ReferenceInputs, *, n_boot: int, seed: int = 0,
                   protocol: str = PROTOCOL_VERSION) -> list[dict[str, Any]]:
    """The ``chance``, ``options-only`` and ``zero-shot`` rows of every domain of ``refs`` and
    ``pooled``."""
    domains = list(refs.domains)
    rows: list[dict[str, Any]] = []
    methods = [m for m, table in ((CHANCE, refs.n_choices), (OPTIONS_ONLY, refs.options_only),
                                  (ZERO_SHOT, refs.zero_shot))
               if table]  # confidence-only records may not know the option counts
    for method in methods:
        for dom in [*domains, "pooled"]:
            parts = domains if dom == "pooled" else [dom]

            def cat(table: Mapping[str, NDArray[Any]], role: str,
                    parts: list[str] = parts) -> NDArray[Any]:
                return np.concatenate([table[f"{d}/{role}"] for d in parts])

            row = _template(method, dom)
            has_shift = all(f"{d}/shift" in refs.n_choices for d in parts)
            ks_id, ks_sh = (cat(refs.n_choices, r).tolist() for r in ("id", "shift"
                                                                      if has_shift else "id"))
            if method == CHANCE:
                row["accuracy"] = chance_level(ks_id)
                row["accuracy_lo"], row["accuracy_hi"] = chance_interval(ks_id)
                row["shift_accuracy"] = chance_level(ks_sh)
            else:
                table = refs.options_only if method == OPTIONS_ONLY else refs.zero_shot
                assert table is not None
                c_id, c_sh = cat(table, "id"), cat(table, "shift" if has_shift else "id")
                row["accuracy"], row["accuracy_lo"], row["accuracy_hi"] = _mean_ci(c_id, n_boot,
                                                                                   seed)
                row["shift_accuracy"] = float(np.mean(c_sh)) if c_sh.size else float("nan")
            row["accuracy_std"] = row["shift_accuracy_std"] = 0.0
            row.update({
                "forward_passes": float("nan"), "n_id": len(ks_id), "n_shift": len(ks_sh),
                "seeds": 1, "protocol": protocol,
                "split_hashes": ",".join(refs.hashes[f"{d}/{r}"] for d in parts
                                         for r in ("id", "shift") if f"{d}/{r}" in refs.hashes),
            })
            # without a shift split (`uqbench.io.lmeval.NO_SHIFT`) the ID split stood in
            rows.append(row if has_shift else drop_shift(row))
    return rows


def learned_columns(refs: ReferenceInputs, parts: Sequence[str], correct: NDArray[Any], *,
                    n_boot: int, seed: int = 0) -> dict[str, float]:
    """``learned``, ``learned_lo``, ``learned_hi`` of a model row over the domains ``parts``:
    its ID accuracy (the seed mean, as the ``accuracy`` column) minus the ``zero-shot``
    accuracy on the same questions, and the 95% percentile interval of the paired bootstrap
    (`uqbench.stats.metrics.paired_difference`: each resample draws one set of questions for
    both, from ``seed``, the accuracy column's draws).

    ``correct`` is the (N, S) 0/1 correctness of the model's seeds on the ID questions of
    ``parts`` in order. NaN when ``refs`` has no zero-shot.

    Examples
    --------
    >>> refs = ReferenceInputs(("d",), {}, None, {}, {"d/id": np.array([0., 1., 0., 0.])})
    >>> learned_columns(refs, ["d"], np.array([[1.], [1.], [0.], [1.]]), n_boot=100)["learned"]
    0.5
    """
    if refs.zero_shot is None:
        return dict.fromkeys(LEARNED_COLUMNS, float("nan"))
    zs = np.concatenate([refs.zero_shot[f"{d}/id"] for d in parts])
    model = np.asarray(correct, dtype=np.float64).reshape(len(zs), -1)
    d, lo, hi = M.paired_difference(M.seed_mean(COLUMNS["accuracy"].bound()), [zs[:, None]],
                                    [model], n_resamples=n_boot, seed=seed)
    return dict(zip(LEARNED_COLUMNS, (float(d), float(lo), float(hi)), strict=False))


def zero_shot_skipped(zs_log: Mapping[str, Any] | None) -> str:
    """Why a run has no ``zero-shot`` row (run.json ``references_skipped``), from its
    ``zero_shot`` log (the engine's: head, applies, reason)."""
    if not zs_log or zs_log.get("applies"):
        return ("needs the frozen backbone's own pass through the same head; these records "
                "hold none (or several models' differ)")
    return (f"head {zs_log.get('head')!r} gives no answer untrained: "
            f"{zs_log.get('reason') or 'the engine gave no zero-shot pass'}; the learned "
            "column is empty, so the report cannot say what training added over the backbone")


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


def not_learned(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Model rows whose learned column's CI ``[learned_lo, learned_hi]`` does not lie above 0:
    training is not shown to answer better than the frozen backbone zero-shot on the same
    questions (rows without a learned value, e.g. no ``zero-shot`` row, are not checked).

    Examples
    --------
    >>> not_learned([{"method": "m", "domain": "d", "learned": 0.02, "learned_lo": -0.01,
    ...               "learned_hi": 0.05}, {"method": "n", "domain": "d", "learned": 0.1,
    ...               "learned_lo": 0.04, "learned_hi": 0.16}])
    [{'method': 'm', 'domain': 'd', 'learned': 0.02, 'learned_lo': -0.01, 'learned_hi': 0.05}]
    """
    out = []
    for r in rows:
        d, lo, hi = (_num(r.get(c)) for c in LEARNED_COLUMNS)
        if is_reference(r) or d is None or lo is None or hi is None:
            continue
        if lo <= 0:
            out.append({"method": r["method"], "domain": r["domain"],
                        **dict(zip(LEARNED_COLUMNS, (d, lo, hi), strict=False))})
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


__all__ = ["LEARNED_COLUMNS", "ReferenceInputs", "at_chance", "at_chance_message",
           "learned_columns", "reference_inputs", "reference_rows", "trained", "warn_at_chance",
           "zero_shot_skipped"]
