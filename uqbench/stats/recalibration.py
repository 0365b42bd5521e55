"""Post-hoc recalibration through netcal, fitted on each domain's labelled calibration split.

The CARE paper reports raw ECE and tells practitioners to recalibrate; this module says what
recalibration buys. For every method and domain (``pooled``: the union of the domains' splits)
three calibrators are fitted on the method's outputs on the ``calib`` split (labelled, disjoint
from the ID test split: a seeded slice of the train pool, or another half of the source) and
applied to the ID test split, where ECE is measured with the same 12 bins as the raw ``ece``:

``ts`` -- temperature scaling (``netcal.scaling.TemperatureScaling``, Guo et al. 2017) of the
    method's **full predictive distribution**: ``q = softmax(log p / T)``, one scalar T fitted
    by maximum likelihood; the recalibrated confidence is ``max q``. T > 0 keeps the order of
    every row, so no prediction and no accuracy changes. T is kept in ``(0, T_MAX]``: the
    unconstrained fit gives 1/T < 0 when confidence anti-correlates with correctness (a model at
    chance), which would reverse every ranking; the likelihood is convex in 1/T, so the
    constrained optimum is then the bound (an almost uniform distribution). A fit that fails
    (1/T not a finite number) is held at the bound too, and warns and is listed in run.json
    ``fallbacks`` with its reason and seed. A scorer with its
    own ``confidence`` (not the MSP of its predictive), or records holding a confidence and a
    correctness only (`uqbench.io.confidence`), get netcal's binary form on that confidence
    instead, ``sigmoid(logit(c) / T)`` (Platt scaling without a bias).
``hb`` -- histogram binning (``netcal.binning.HistogramBinning``, `HB_BINS` equal-width bins;
    an empty bin keeps its midpoint) of the **top-label confidence**: the confidence of the
    predicted class against whether the prediction was right.
``iso`` -- isotonic regression (``netcal.binning.IsotonicRegression``) of the top-label
    confidence, as ``hb``.

Why top-label for the binning methods: the choices of a multiple-choice question are positions,
not classes with a meaning, so netcal's multiclass mode (one calibrator per class index, then
renormalised) would calibrate "option B" across unrelated questions and could change the
argmax; calibrating the confidence ECE measures (Kumar et al. 2019, Gupta & Ramdas 2022) keeps
every prediction. Recalibration changes confidences only: accuracy and the ranking metrics
(AUROC, AURC, ...) stay on the raw scores.

netcal imports torch and pyro (~4 s): it is imported inside the fitting functions, and the
runner imports this module only where recalibration runs; `recalibrate_cached` answers a warm
rerun from the cache without importing netcal at all. Metrics, scorers and figures never import
this module.
"""
from __future__ import annotations

import hashlib
import math
import sys
import warnings
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

#: The calibrators, in column order: ``ece_ts``, ``ece_hb``, ``ece_iso``.
CALIBRATORS = ("ts", "hb", "iso")
#: Equal-width bins of histogram binning (netcal's default).
HB_BINS = 10
#: Largest temperature: a fit that wants more (or 1/T <= 0) is held at this bound.
T_MAX = 1000.0


@dataclass(frozen=True)
class Recalibrated:
    """Recalibrated confidences of one method on its ID test split, stacked over seeds.

    ``confidence[kind]`` has shape (N, S) like `uqbench.results.evaluate.Scored`; ``temperature`` (S,)
    is the fitted T of temperature scaling per seed; ``failed`` (S,): why that seed's fit
    failed and was held at `T_MAX` ("" when it did not; `temperature_scaling`).
    """

    confidence: dict[str, NDArray[np.float64]]
    temperature: NDArray[np.float64]
    failed: tuple[str, ...] = ()


def _netcal() -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # netcal's dependencies warn on import
        import netcal.binning
        import netcal.scaling

    return netcal


def _uses_msp(scorer: Scorer) -> bool:
    """Whether the scorer's confidence is the default: the MSP of its predictive."""
    return type(scorer).confidence is Scorer.confidence


def temperature_scaling(probs_calib: NDArray[Any], labels_calib: NDArray[Any],
                        probs: NDArray[Any]) -> tuple[float, NDArray[np.float64], str]:
    """Fit T on ``(probs_calib, labels_calib)`` and rescale ``probs``.

    Parameters
    ----------
    probs_calib : (N_cal, C) predictive distributions; labels_calib : (N_cal,) int labels.
        C = 1 (or a 1-D array): binary confidences, labels 0/1 (netcal's binary form).
    probs : (N, C) (or (N,) binary) distributions to rescale.

    Returns
    -------
    T, ``softmax(log probs / T)`` (binary: ``sigmoid(logit(probs) / T)``), the same shape, and
    why the fit failed ("" when it did not). netcal fits the inverse temperature 1/T (its
    public ``TemperatureScaling.temperature`` is that factor on the log-probabilities); a fit
    with 1/T < 1/`T_MAX` is held at the bound (the constrained optimum, see the module doc),
    and a fit that is not a finite number -- a failed fit -- is also held there, with the reason
    returned: `recalibrate_cached` warns and records it in run.json ``fallbacks``. A held fit
    is applied by `_rescale` (netcal has no public setter for its fitted factor). A choice of
    probability 0 (a padded choice of a pooled row whose domains have fewer options) stays at
    0; the fit sees it at netcal's epsilon (~1e-16), negligible unless T is in the hundreds.

    Examples
    --------
    Logits of a calibrated set scaled by 2 are fitted with T close to 2 (tests).
    """
    nc = _netcal()
    ts = nc.scaling.TemperatureScaling()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # pyro's, inside netcal
        ts.fit(np.asarray(probs_calib, np.float64), np.asarray(labels_calib))
        inverse = float(np.ravel(ts.temperature)[0])
        failed = "" if math.isfinite(inverse) else (
            f"netcal's maximum-likelihood fit gave 1/T = {inverse} (not a finite number); T is "
            f"held at T_MAX = {T_MAX:g}, an almost uniform distribution")
        if inverse >= 1.0 / T_MAX and not failed:
            scaled = np.asarray(ts.transform(np.asarray(probs, np.float64)), np.float64)
        else:
            inverse = 1.0 / T_MAX
            scaled = _rescale(np.asarray(probs, np.float64), inverse)
    scaled = scaled.reshape(np.shape(probs))
    absent = np.asarray(probs) == 0  # padded choices (`PAD_LOGIT`) stay at probability 0
    if scaled.ndim == 2 and absent.any():  # netcal sees them at its epsilon, which T inflates
        scaled = np.where(absent, 0.0, scaled)
        scaled /= scaled.sum(axis=1, keepdims=True)
    return 1.0 / inverse, scaled, failed


def _rescale(probs: NDArray[np.float64], inverse: float) -> NDArray[np.float64]:
    """netcal's temperature-scaling transform with the factor ``inverse`` = 1/T, in its float64
    arithmetic (probabilities clipped to [eps, 1 - eps]; the softmax shifted by its maximum and
    multiplied by the reciprocal of its sum): equal to ``TemperatureScaling.transform`` to the
    last bit but in about 0.1% of entries, which differ by one ulp (its ``exp``)."""
    eps = np.finfo(np.float64).eps
    c = np.clip(probs, eps, 1.0 - eps)
    if probs.ndim == 1 or probs.shape[1] == 1:  # binary: sigmoid(logit(c) / T)
        return 1.0 / (1.0 + np.exp(-(np.log(c) - np.log1p(-c)) * inverse))
    z = np.log(c) * inverse
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e * (1.0 / e.sum(axis=1, keepdims=True))


def top_label(kind: str, confidence_calib: NDArray[Any], correct_calib: NDArray[Any],
              confidence: NDArray[Any]) -> NDArray[np.float64]:
    """Histogram binning (``hb``) or isotonic regression (``iso``) of a top-label confidence,
    fitted on ``(confidence_calib, correct_calib)`` (N_cal,), applied to ``confidence`` (N,)."""
    nc = _netcal()
    if kind == "hb":
        cal = nc.binning.HistogramBinning(bins=HB_BINS)
    elif kind == "iso":
        cal = nc.binning.IsotonicRegression()
    else:
        raise ValueError(f"unknown top-label calibrator {kind!r}; valid: hb, iso")
    cal.fit(np.asarray(confidence_calib, np.float64), np.asarray(correct_calib, np.float64))
    return np.asarray(cal.transform(np.asarray(confidence, np.float64)), np.float64).reshape(-1)


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
    for s, (cal, tst) in enumerate(zip(calib, test)):
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
                      partial(M.RESAMPLED_ECE.resampler, n_bins=n_bins))
    row: dict[str, float] = {}
    for kind in CALIBRATORS:
        name, arrays = f"ece_{kind}", (rec.confidence[kind], correct.astype(bool))
        row[name], row[f"{name}_std"] = M.per_seed(ece, *arrays)
        _, row[f"{name}_lo"], row[f"{name}_hi"] = M.bootstrap_ci(
            M.seed_mean(ece), *arrays, n_resamples=n_boot, seed=seed)
    row["ts_temperature"], row["ts_temperature_std"] = M.mean_std(list(rec.temperature))
    return row


@cache
def _code_hash() -> str:
    try:
        version = metadata.version("netcal")
    except metadata.PackageNotFoundError:
        version = "?"
    return source_hash(M, sys.modules[__name__], extra=version)


def recalibrate_cached(cache: ArrayCache | None, scorer: Scorer, calib: Sequence[Outputs],
                       test: Sequence[Outputs], calib_confidence: NDArray[Any],
                       test_confidence: NDArray[Any], test_correct: NDArray[Any],
                       where: str | None = None, **options: Any
                       ) -> tuple[dict[str, float], Recalibrated]:
    """(`columns`, `Recalibrated`), memoised in ``cache`` (kind ``recalibrate``) by content:
    the predictive distributions, labels and confidences of both splits, the options, this
    module's and the metrics' source and netcal's version. No cache -> compute.

    A failed temperature fit (`temperature_scaling`) warns and goes to run.json ``fallbacks``
    (`uqbench.core.errors.record_fallback`) on every run, a cached one too, as ``where``'s (default:
    the scorer and the test split's domains) seed ``s``."""

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
                    "code": _code_hash()}
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


__all__ = ["CALIBRATORS", "HB_BINS", "T_MAX", "Recalibrated", "columns", "recalibrate",
           "recalibrate_cached", "temperature_scaling", "top_label"]
