"""Post-hoc recalibrators through netcal, as pure functions of arrays: each is fitted on a
labelled calibration split's predictive distributions (or confidences) and applied to another
split's (`uqbench.results.recalibration` fits them per method, domain and seed).

``ts`` -- temperature scaling (``netcal.scaling.TemperatureScaling``, Guo et al. 2017) of the
    method's **full predictive distribution**: ``q = softmax(log p / T)``, one scalar T fitted
    by maximum likelihood; the recalibrated confidence is ``max q``. T > 0 keeps the order of
    every row, so no prediction and no accuracy changes. T is kept in ``(0, T_MAX]``: the
    unconstrained fit gives 1/T < 0 when confidence anti-correlates with correctness (a model at
    chance), which would reverse every ranking; the likelihood is convex in 1/T, so the
    constrained optimum is then the bound (an almost uniform distribution). A fit that fails
    (1/T not a finite number) is held at the bound too, and warns and is listed in run.json
    ``fallbacks`` with its reason and seed (`uqbench.results.recalibration`). A scorer with its
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

netcal imports torch and pyro (~4 s): it is imported inside the fitting functions, so importing
this module loads neither.
"""
from __future__ import annotations

import contextlib
import io
import math
import sys
import warnings
from typing import Any

import numpy as np
from numpy.typing import NDArray

#: The calibrators, in column order: ``ece_ts``, ``ece_hb``, ``ece_iso``.
CALIBRATORS = ("ts", "hb", "iso")
#: Equal-width bins of histogram binning (netcal's default).
HB_BINS = 10
#: Largest temperature: a fit that wants more (or 1/T <= 0) is held at this bound.
T_MAX = 1000.0


def _netcal() -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # netcal's dependencies warn on import
        import netcal.binning
        import netcal.scaling

    return netcal


_ABSENT_CLASS = "WARNING: Not all class labels are present"


def temperature_scaling(probs_calib: NDArray[Any], labels_calib: NDArray[Any],
                        probs: NDArray[Any]) -> tuple[float, NDArray[np.float64], str]:
    """Fit T on ``(probs_calib, labels_calib)`` and rescale ``probs``.

    Parameters
    ----------
    probs_calib : (N_cal, C) predictive distributions; labels_calib : (N_cal,) int labels.
        C = 1 (or a 1-D array): binary confidences, labels 0/1 (netcal's binary form).
        C = 2 is fitted as netcal does, on the probability of choice 1: the same T.
    probs : (N, C) (or (N,) binary) distributions to rescale.

    Returns
    -------
    T, ``softmax(log probs / T)`` (binary: ``sigmoid(logit(probs) / T)``), the same shape, and
    why the fit failed ("" when it did not). netcal fits the inverse temperature 1/T (its
    public ``TemperatureScaling.temperature`` is that factor on the log-probabilities); a fit
    with 1/T < 1/`T_MAX` is held at the bound (the constrained optimum, see the module doc),
    and a fit that is not a finite number -- a failed fit -- is also held there, with the reason
    returned: `uqbench.results.recalibration.recalibrate_cached` warns and records it in run.json
    ``fallbacks``. A held fit is applied by `rescaled` (netcal has no public setter for its
    fitted factor). A choice of probability 0 (a padded choice of a pooled row whose domains
    have fewer options) stays at 0; the fit sees it at netcal's epsilon (~1e-16), negligible
    unless T is in the hundreds.

    Examples
    --------
    Logits of a calibrated set scaled by 2 are fitted with T close to 2 (tests).
    """
    nc = _netcal()
    ts = nc.scaling.TemperatureScaling()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # pyro's, inside netcal
        with contextlib.redirect_stdout(io.StringIO()) as said:
            ts.fit(np.asarray(probs_calib, np.float64), np.asarray(labels_calib))
        # netcal prints that a class is absent from the labels: one shared temperature needs
        # no sample of every class (a small calib split rarely has them all); other lines pass
        sys.stdout.write("".join(line for line in said.getvalue().splitlines(keepends=True)
                                 if not line.startswith(_ABSENT_CLASS)))
        inverse = float(np.ravel(ts.temperature)[0])
        failed = "" if math.isfinite(inverse) else (
            f"netcal's maximum-likelihood fit gave 1/T = {inverse} (not a finite number); T is "
            f"held at T_MAX = {T_MAX:g}, an almost uniform distribution")
        if inverse >= 1.0 / T_MAX and not failed:
            scaled = np.asarray(ts.transform(np.asarray(probs, np.float64)), np.float64)
        else:
            inverse = 1.0 / T_MAX
            scaled = rescaled(np.asarray(probs, np.float64), inverse)
    if np.ndim(probs) == 2 and np.shape(probs)[1] == 2 and scaled.ndim == 1:
        scaled = np.stack([1.0 - scaled, scaled], axis=1)  # netcal's binary form: P(choice 1)
    scaled = scaled.reshape(np.shape(probs))
    absent = np.asarray(probs) == 0  # padded choices (`PAD_LOGIT`) stay at probability 0
    if scaled.ndim == 2 and absent.any():  # netcal sees them at its epsilon, which T inflates
        scaled = np.where(absent, 0.0, scaled)
        scaled /= scaled.sum(axis=1, keepdims=True)
    return 1.0 / inverse, scaled, failed


def rescaled(probs: NDArray[np.float64], inverse: float) -> NDArray[np.float64]:
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


__all__ = ["CALIBRATORS", "HB_BINS", "T_MAX", "temperature_scaling", "top_label"]
