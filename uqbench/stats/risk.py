"""Selective risk control: a threshold on a scorer's uncertainty, chosen on the labelled calib
split, whose selective risk (error rate among the accepted questions) is ≤ r* with probability
≥ 1 − δ — Learn-then-Test (Angelopoulos et al. 2021) with exact binomial p-values and fixed
sequence testing (pure numpy/scipy).

Candidate thresholds t_j accept the questions with uncertainty ≤ t_j; t_j is the ⌈c_j·n⌉-th
smallest calib uncertainty for the coverages c_j of `COVERAGE_GRID` (5%, 10%, ..., 100%; a tie
at t_j accepts the whole tie group). For each, with n_j accepted and e_j errors among them, the
null "risk(t_j) > r*" has the binomial p-value

    p_j = P(Binomial(n_j, r*) ≤ e_j),

and p_j ≤ δ exactly when the one-sided Clopper–Pearson upper bound of the risk at level 1 − δ
is ≤ r* (`clopper_pearson_upper`). Fixed sequence testing walks the grid from the most confident
threshold and stops at the first p_j > δ; the chosen threshold is the last one rejected (the
largest certified coverage). The family-wise error of the walk is ≤ δ without a multiplicity
correction; the thresholds are read off the calib split itself (as in SGR, Geifman & El-Yaniv
2017), so the guarantee is for the grid of calib coverages. If even the first threshold is not
certified, the target is not reachable (`uqbench.core.errors.NotReachable`, with the bound that
was reached).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.stats import beta, binom

from uqbench.core.errors import NotReachable
from uqbench.stats.conformal import resample_sums

#: Level of the guarantee: P(risk > r*) ≤ δ over the calib draw.
DELTA = 0.1
#: Target selective risks (error rates): the cpu models err on 54-78% of the questions at full
#: coverage, so useful targets lie below that and above what the most confident 5% reach.
TARGETS = (0.3, 0.4, 0.5, 0.6)
#: The target of the headline columns ``rc_coverage``/``rc_risk``.
DEFAULT_TARGET = 0.5
#: Calib coverages of the candidate thresholds, in testing order.
COVERAGE_GRID = tuple(np.round(np.arange(1, 21) / 20, 2))
#: Coverages of the ``risk_at_*`` columns.
RISK_AT = (0.5, 0.8, 0.9)


def binomial_p_value(errors: ArrayLike, n: ArrayLike, target: float) -> NDArray[np.float64]:
    """``P(Binomial(n, r*) ≤ errors)``: small when ``errors`` out of ``n`` is unlikely if the
    risk were ``r*`` or more.

    >>> round(float(binomial_p_value(0, 10, 0.2)), 6)  # 0.8 ** 10
    0.107374
    """
    return np.asarray(binom.cdf(errors, n, _check_target(target)), dtype=np.float64)


def clopper_pearson_upper(errors: int, n: int, delta: float = DELTA) -> float:
    """One-sided (1 − δ) Clopper–Pearson upper bound of a binomial rate, ``errors`` of ``n``:
    the r with ``P(Binomial(n, r) ≤ errors) = δ`` (1 when errors = n).

    >>> round(clopper_pearson_upper(0, 10, 0.1), 6)  # 1 - 0.1 ** (1 / 10)
    0.205672
    """
    if not 0 <= errors <= n or n < 1:
        raise ValueError(f"need 0 <= errors <= n and n >= 1; got errors={errors}, n={n}")
    return 1.0 if errors == n else float(beta.ppf(1.0 - delta, errors + 1, n - errors))


def fixed_sequence(p_values: ArrayLike, delta: float = DELTA) -> int:
    """Number of leading hypotheses rejected (``p ≤ δ``) before the first that is not.

    >>> fixed_sequence([0.01, 0.05, 0.2, 0.01], 0.1)
    2
    """
    p = np.asarray(p_values, dtype=np.float64).reshape(-1)
    failed = np.flatnonzero(~(p <= delta))
    return int(failed[0]) if failed.size else int(p.size)


def _check_target(target: float) -> float:
    t = float(target)
    if not 0.0 < t < 1.0:
        raise ValueError(f"target risk {target!r} is outside (0, 1): give an error rate, e.g. 0.3")
    return t


@dataclass(frozen=True)
class Threshold:
    """The chosen threshold: accept uncertainty ≤ ``threshold``; on calib it accepted
    ``n_accepted`` questions (``calib_coverage``) with ``errors`` errors."""

    threshold: float
    calib_coverage: float
    n_accepted: int
    errors: int


def ltt_threshold(uncertainty: ArrayLike, correct: ArrayLike, target: float, *,
                  delta: float = DELTA, grid: tuple[float, ...] = COVERAGE_GRID) -> Threshold:
    """The Learn-then-Test threshold of the module docstring, fitted on calib arrays (N,)."""
    r = _check_target(target)
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta={delta!r} is outside (0, 1)")
    u = np.asarray(uncertainty, dtype=np.float64).reshape(-1)
    wrong = ~np.asarray(correct).astype(bool).reshape(-1)
    if u.size == 0 or u.shape != wrong.shape:
        raise ValueError(f"uncertainty and correct must be non-empty and of one length; got "
                         f"{u.shape}, {wrong.shape}")
    srt = np.sort(u)
    thresholds = [srt[max(math.ceil(c * u.size - 1e-9), 1) - 1] for c in grid]
    n_acc = np.array([(u <= t).sum() for t in thresholds])
    errors = np.array([(wrong & (u <= t)).sum() for t in thresholds])
    k = fixed_sequence(binomial_p_value(errors, n_acc, r), delta)
    if k == 0:
        raise NotReachable(
            f"target risk {r:g} not reachable at delta={delta:g}: the most confident "
            f"{n_acc[0]} of {u.size} calib questions have {errors[0]} errors, an upper bound of "
            f"{clopper_pearson_upper(int(errors[0]), int(n_acc[0]), delta):.3f}; give a higher "
            "target or a larger calib split")
    j = k - 1
    return Threshold(float(thresholds[j]), float(n_acc[j] / u.size), int(n_acc[j]),
                     int(errors[j]))


def selective_risk(accepted: ArrayLike, correct: ArrayLike, counts: ArrayLike | None = None
                   ) -> float | NDArray[np.float64]:
    """Error rate among the accepted questions, ``Σ accepted·wrong / Σ accepted`` (NaN when
    none is accepted). ``counts`` (B, N) bootstrap resample counts
    (`uqbench.stats.conformal.resample_counts`): one value per resample.

    >>> selective_risk([1, 1, 1, 0], [1, 0, 1, 0])
    0.3333333333333333
    """
    a = np.asarray(accepted, dtype=np.float64).reshape(-1)
    bad = a * (1.0 - np.asarray(correct, dtype=np.float64).reshape(-1))
    if counts is None:
        n, e = np.atleast_2d(a).sum(axis=1), np.atleast_2d(bad).sum(axis=1)
    else:
        n, e = resample_sums(np.column_stack([a, bad]), counts).T
    with np.errstate(invalid="ignore", divide="ignore"):
        v = np.where(n > 0, e / n, np.nan)
    return float(v[0]) if counts is None else v


__all__ = ["COVERAGE_GRID", "DEFAULT_TARGET", "DELTA", "RISK_AT", "TARGETS",
           "Threshold", "binomial_p_value", "clopper_pearson_upper", "fixed_sequence",
           "ltt_threshold", "selective_risk"]
