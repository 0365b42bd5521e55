"""Post-hoc recalibration of every method, fitted on each domain's labelled calibration split.

The CARE paper reports raw ECE and tells practitioners to recalibrate; this module says what
recalibration buys. For every method and domain (``pooled``: the union of the domains' splits)
the calibrators of `uqbench.stats.recalibration` (``ts``, ``hb``, ``iso``) are fitted on the
method's outputs on the ``calib`` split (labelled, disjoint from the ID test split: a seeded
slice of the train pool, or another half of the source) and applied to the ID test split, where
ECE is measured with the same 12 bins as the raw ``ece``. Temperature scaling rescales the
method's full predictive distribution; a scorer with its own ``confidence`` (not the MSP of its
predictive), or records holding a confidence and a correctness only (`uqbench.io.confidence`),
get netcal's binary form on that confidence instead. A temperature fit that fails warns and is
listed in run.json ``fallbacks`` with its reason and seed. Recalibration changes confidences
only: accuracy and the ranking metrics (AUROC, AURC, ...) stay on the raw scores.

The runner imports this module only where recalibration runs; `recalibrate_cached` answers a
warm rerun from the cache without importing netcal at all. Metrics, scorers and figures never
import this module.
"""
from __future__ import annotations

import hashlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache, partial
from importlib import metadata
from typing import Any

import numpy as np
from numpy.typing import NDArray

from uqbench.core.errors import record_fallback
from uqbench.core.outputs import Outputs
from uqbench.core.scorer import Scorer
from uqbench.files.cache import ArrayCache, source_hash
from uqbench.stats import metrics as M
from uqbench.stats import recalibration as fit
from uqbench.stats.recalibration import CALIBRATORS, temperature_scaling, top_label


@dataclass(frozen=True)
class Recalibrated:
    """Recalibrated confidences of one method on its ID test split, stacked over seeds.

    ``confidence[kind]`` has shape (N, S) like `uqbench.results.evaluate.Scored`;
    ``temperature`` (S,) is the fitted T of temperature scaling per seed; ``failed`` (S,): why
    that seed's fit failed and was held at `uqbench.stats.recalibration.T_MAX` ("" when it did
    not; `uqbench.stats.recalibration.temperature_scaling`).
    """

    confidence: dict[str, NDArray[np.float64]]
    temperature: NDArray[np.float64]
    failed: tuple[str, ...] = ()


def _uses_msp(scorer: Scorer) -> bool:
    """Whether the scorer's confidence is the default: the MSP of its predictive."""
    return type(scorer).confidence is Scorer.confidence


def _check_same_prediction(raw: NDArray[Any], scaled: NDArray[Any], what: str) -> None:
    if not np.array_equal(raw.argmax(axis=1), scaled.argmax(axis=1)):
        raise RuntimeError(f"temperature scaling changed a prediction of {what}: T must be > 0")


def recalibrate(scorer: Scorer, calib: Sequence[Outputs], test: Sequence[Outputs],
                calib_confidence: NDArray[Any], test_confidence: NDArray[Any]) -> Recalibrated:
    """Fit every calibrator per seed on ``calib`` and apply it to ``test``.

    ``calib``/``test``: one `Outputs` per seed; ``*_confidence`` (N, S): the scorer's
    confidences (as `uqbench.results.evaluate.Scored.confidence`). Correctness is the argmax of the
    scorer's predictive against the labels, as in `uqbench.results.evaluate.Scored`.
    """
    out: dict[str, list[NDArray[np.float64]]] = {k: [] for k in CALIBRATORS}
    temps, failed = [], []
    for s, (cal, tst) in enumerate(zip(calib, test, strict=False)):
        c_cal, c_tst = calib_confidence[:, s], test_confidence[:, s]
        if cal.logits is None:  # confidence-only records: the binary form, as a scorer's own
            right_cal = np.asarray(cal.correct, np.float64)
        else:
            p_cal, p_tst = scorer.predictive(cal), scorer.predictive(tst)
            right_cal = (p_cal.argmax(axis=1) == cal.labels).astype(np.float64)
        if cal.logits is not None and _uses_msp(scorer):
            assert cal.labels is not None  # Outputs: labels come with logits
            t, q, why = temperature_scaling(p_cal, cal.labels, p_tst)
            _check_same_prediction(p_tst, q, f"scorer {scorer.name!r}")
            out["ts"].append(q.max(axis=1))
        else:
            t, q, why = temperature_scaling(c_cal, right_cal, c_tst)
            out["ts"].append(q)
        temps.append(t)
        failed.append(why)
        for kind in ("hb", "iso"):
            out[kind].append(top_label(kind, c_cal, right_cal, c_tst))
    return Recalibrated({k: np.stack(v, axis=1) for k, v in out.items()}, np.array(temps),
                        tuple(failed))


def columns(rec: Recalibrated, correct: NDArray[Any], *, n_bins: int = M.ECE_BINS,
            n_boot: int = 1000, seed: int = 0) -> dict[str, float]:
    """``ece_<kind>`` (mean over seeds), ``_std``, bootstrap ``_lo``/``_hi`` over the ID test
    examples (the calibrators held fixed), for each of `CALIBRATORS`; ``ts_temperature``."""
    # a Resampled metric: the bootstrap evaluates a chunk of resamples in one call
    ece = M.Resampled(partial(M.expected_calibration_error, n_bins=n_bins),
                      partial(M.calibration_resampler, n_bins=n_bins))
    row: dict[str, float] = {}
    arrays = {kind: (rec.confidence[kind], correct.astype(bool)) for kind in CALIBRATORS}
    # one draw of the resamples for every calibrator: bit for bit a bootstrap_ci each
    cis = M.bootstrap_cis([(M.seed_mean(ece), a) for a in arrays.values()],
                          n_resamples=n_boot, seed=seed)
    for (kind, a), (_, lo, hi) in zip(arrays.items(), cis, strict=True):
        name = f"ece_{kind}"
        row[name], row[f"{name}_std"] = M.per_seed(ece, *a)
        row[f"{name}_lo"], row[f"{name}_hi"] = lo, hi
    row["ts_temperature"], row["ts_temperature_std"] = M.mean_std(list(rec.temperature))
    return row


@cache
def fits_code_hash() -> str:
    """Hash of the code the cached recalibration columns depend on, netcal's version included."""
    try:
        version = metadata.version("netcal")
    except metadata.PackageNotFoundError:
        version = "?"
    return source_hash(M, fit, sys.modules[__name__], extra=version)


def recalibrate_cached(cache: ArrayCache | None, scorer: Scorer, calib: Sequence[Outputs],
                       test: Sequence[Outputs], calib_confidence: NDArray[Any],
                       test_confidence: NDArray[Any], test_correct: NDArray[Any],
                       where: str | None = None, **options: Any
                       ) -> tuple[dict[str, float], Recalibrated]:
    """(`columns`, `Recalibrated`), memoised in ``cache`` (kind ``recalibrate``) by content:
    the predictive distributions, labels and confidences of both splits, the options, the
    source of this module, the calibrators and the metrics, and netcal's version. No cache ->
    compute.

    A failed temperature fit (`uqbench.stats.recalibration.temperature_scaling`) warns and goes
    to run.json ``fallbacks`` (`uqbench.core.errors.record_fallback`) on every run, a cached one
    too, as ``where``'s (default: the scorer and the test split's domains) seed ``s``."""

    def compute() -> dict[str, NDArray[Any]]:
        rec = recalibrate(scorer, calib, test, calib_confidence, test_confidence)
        arrays: dict[str, NDArray[Any]] = {
            k: np.asarray(v, dtype=np.float64)
            for k, v in columns(rec, test_correct, **options).items()}
        arrays.update({f"confidence_{k}": v for k, v in rec.confidence.items()})
        arrays["temperature"] = rec.temperature
        arrays["ts_failed"] = np.array(rec.failed, dtype=str)
        return arrays

    if cache is None:
        got = compute()
    else:
        h = hashlib.sha256()
        for outs in (calib, test):
            for o in outs:
                for a in ((o.confidence, o.correct) if o.logits is None
                          else (scorer.predictive(o), o.labels)):
                    # Outputs: confidence-only records hold both, the others their labels
                    assert a is not None
                    h.update(np.ascontiguousarray(a).tobytes() + str(a.shape).encode())
        for a in (calib_confidence, test_confidence, test_correct):
            h.update(np.ascontiguousarray(a).tobytes() + str(a.shape).encode())
        material = {"scores": h.hexdigest(), "msp": _uses_msp(scorer), "options": options,
                    "code": fits_code_hash()}
        got, _ = cache.get_or_compute("recalibrate", material, compute)
    row = {k: float(v) for k, v in got.items() if np.ndim(v) == 0}
    rec = Recalibrated({k: np.asarray(got[f"confidence_{k}"]) for k in CALIBRATORS},
                       np.asarray(got["temperature"]), tuple(map(str, got["ts_failed"])))
    domains = "+".join(sorted(set(map(str, test[0].domain))))
    where = where or f"scorer {scorer.name!r} on {domains}"
    for s, why in enumerate(rec.failed):
        if why:
            record_fallback("temperature scaling fit", f"{where}, seed {s}", why)
    return row, rec


__all__ = ["Recalibrated", "columns", "recalibrate", "recalibrate_cached"]
