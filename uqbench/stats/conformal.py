"""Split conformal prediction sets over a method's predictive distribution (pure numpy).

A conformity score ``s(x, c, u)`` says how unusual option ``c`` is for question ``x`` (``u`` is
the question's uniform draw, for the randomised scores). Fitted on a labelled calibration split
of n questions, split conformal takes

    q̂ = the k-th smallest calibration score s(x_i, y_i, u_i), k = ⌈(n + 1)(1 − α)⌉,

i.e. the ⌈(n+1)(1−α)⌉/n empirical quantile, and predicts the set ``{c : s(x, c, u) ≤ q̂}``.
On exchangeable data the set holds the gold option with probability ≥ 1 − α (Vovk et al. 2005;
Angelopoulos & Bates 2021). It needs k ≤ n, i.e. n ≥ 1/α − 1: a smaller calibration split
cannot resolve α (`uqbench.core.errors.NotReachable`).

The scores (MAPIE's classes, one interface: `ConformityScore.scores`):

``lac``         1 − p_c (Sadinle et al. 2019).
``aps``         the standard non-randomised APS (Romano et al. 2020; Angelopoulos & Bates 2021,
                §2.1): calibrated on the mass of the options ranked at or above y, the gold
                option's own mass included; the set takes options in decreasing probability
                until their mass reaches q̂, the option that reaches it included: ``{c : mass
                ranked strictly above c < q̂}`` (MAPIE's APS with u = 0 at calibration and
                ``include_last_label=True``; `APS.in_set`).
``aps_strict``  the mass of the options ranked strictly above c (u = 0 below), one score at
                calibration and prediction: smaller sets than ``aps``, the same guarantee.
``aps_rand``    the mass ranked strictly above c, plus u·p_c (randomised APS, Romano et al.).
``raps``        the standard non-randomised RAPS (Angelopoulos et al. 2021): ``aps`` plus the
                penalty λ·(rank − k_reg)⁺, λ = `RAPS_LAMBDA`, k_reg = `RAPS_K_REG` (fixed, not
                tuned: four options leave nothing to tune on); calibrated on the penalised mass
                at y, the set keeps the option whose penalised mass reaches q̂ (the paper's
                "+1" rule; MAPIE's RAPS with u = 0 at calibration and
                ``include_last_label=True``).
``raps_strict`` ``aps_strict`` + λ·(rank_c − k_reg)⁺, one score at calibration and prediction.
``raps_rand``   ``aps_rand`` + λ·(rank_c − k_reg)⁺.

Randomised (``*_rand``, as in the papers): u ~ U(0, 1), drawn from a seeded generator per
question. Non-randomised (``aps_strict``, ``raps_strict``): u = 0, so the most probable option
is always in the set. A choice of probability 0 (a padded choice of a pooled row whose domains
have fewer options) is never in a set. Whether the gold option is covered is always read off the
set (`covered`): for every score but ``aps`` and ``raps`` that is ``s(x, y, u) ≤ q̂``.

Coverage, mean set size and the worst size-stratified coverage (Angelopoulos & Bates 2021,
MAPIE's ``classification_ssc_score`` with one bin per set size) are plain functions of the
per-question indicators; they take optional bootstrap resample counts (B, N) (`resample_counts`:
how often each question is drawn), so that a CI (questions resampled, q̂ held fixed) costs one
matrix product.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, TypedDict

import numpy as np
from numpy.typing import ArrayLike, NDArray

from uqbench.core.errors import NotReachable

#: The α of the table's columns.
ALPHAS = (0.05, 0.1, 0.2)
#: RAPS regulariser and the rank it starts after (Angelopoulos et al. 2021).
RAPS_LAMBDA = 0.1
RAPS_K_REG = 1
#: Float tolerance of ⌈(n + 1)(1 − α)⌉: (9 + 1) * 0.9 is 9.000000000000002, and means 9.
_CEIL_TOL = 1e-9


@dataclass(frozen=True)
class ConformityScore:
    """``s(x, c, u)`` for every option; subclasses implement `_scores`."""

    name: str
    randomized: bool = False

    def scores(self, probs: ArrayLike, u: ArrayLike | None = None) -> NDArray[np.float64]:
        """(N, C) scores of every option; ``u`` (N,) the uniform draws of the randomised
        scores (ignored, and may be None, otherwise: u = 0). Padded choices (p = 0): +inf."""
        p = np.asarray(probs, dtype=np.float64)
        if p.ndim != 2:
            raise ValueError(f"probs must be (N, C); got shape {p.shape}")
        if self.randomized:
            if u is None:
                raise ValueError(f"the randomised score {self.name!r} needs u (N,) in [0, 1)")
            uu = np.asarray(u, dtype=np.float64).reshape(-1)
            if uu.shape != (len(p),):
                raise ValueError(f"u must have shape ({len(p)},); got {uu.shape}")
        else:
            uu = np.zeros(len(p))
        return np.where(p == 0, np.inf, self._scores(p, uu))

    def _scores(self, p: NDArray[np.float64], u: NDArray[np.float64]) -> NDArray[np.float64]:
        raise NotImplementedError

    def in_set(self, probs: ArrayLike, qhat: ArrayLike, u: ArrayLike | None = None
               ) -> NDArray[np.bool_]:
        """(N, C) whether each option is in the set at threshold ``qhat`` (one value, or (N,)
        one per question): ``s(x, c, u) ≤ q̂``."""
        return self.scores(probs, u) <= np.asarray(qhat)[..., None]


@dataclass(frozen=True)
class LAC(ConformityScore):
    """``1 − p_c``; ``u`` plays no part."""

    def _scores(self, p: NDArray[np.float64], u: NDArray[np.float64]) -> NDArray[np.float64]:
        return 1.0 - p


@dataclass(frozen=True)
class APS(ConformityScore):
    """``Σ_{c' ranked above c} p_c' + u·p_c``, plus `penalty` ``lam·(rank_c − k_reg)⁺`` (zero
    for APS; RAPS: `RAPS_LAMBDA`, `RAPS_K_REG`)."""

    lam: float = 0.0
    k_reg: int = 0

    def penalty(self, rank: NDArray[np.intp]) -> NDArray[np.float64]:
        return self.lam * np.maximum(rank - self.k_reg, 0).astype(np.float64)

    def _scores(self, p: NDArray[np.float64], u: NDArray[np.float64]) -> NDArray[np.float64]:
        above, rank = _mass_above(p)
        return above + u[:, None] * p + self.penalty(rank)


def _mass_above(p: NDArray[np.float64]) -> tuple[NDArray[np.float64], NDArray[np.intp]]:
    """(N, C) the mass of the options ranked strictly above each option, and its rank (1 =
    most probable; ties keep index order)."""
    order = np.argsort(-p, axis=1, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(1, p.shape[1] + 1)[None, :], axis=1)
    sorted_p = np.take_along_axis(p, order, axis=1)
    return np.take_along_axis(np.cumsum(sorted_p, axis=1) - sorted_p, rank - 1, axis=1), rank


@dataclass(frozen=True)
class CumulativeAPS(APS):
    """Non-randomised (R)APS: calibrated on ``Σ_{c' ranked at or above y} p_c'`` + the penalty
    at y's rank; the set holds the options whose mass ranked strictly above them, plus the
    penalty at the rank above theirs, is ``< q̂``: the options in decreasing probability up to
    and including the one whose penalised cumulative mass reaches q̂.

    The gold option is in the set whenever its calibration score is ≤ q̂ (its set score is that
    score minus p_y > 0, minus the penalty's last step), hence coverage ≥ 1 − α. These are
    MAPIE's ``APSConformityScore`` and ``RAPSConformityScore`` sets with
    ``include_last_label=True`` when its calibration draw is u = 0; MAPIE ends the set at the
    first cumulative mass ≥ q̂ − 1e-8 and adds the options tied in probability with the last
    one, so the sets can differ where a cumulative mass lies within 1e-8 below q̂ or
    probabilities tie across the cut."""

    def _scores(self, p: NDArray[np.float64], u: NDArray[np.float64]) -> NDArray[np.float64]:
        above, rank = _mass_above(p)
        return above + p + self.penalty(rank)

    def in_set(self, probs: ArrayLike, qhat: ArrayLike, u: ArrayLike | None = None
               ) -> NDArray[np.bool_]:
        p = np.asarray(probs, dtype=np.float64)
        self.scores(p)  # the same checks of the input
        above, rank = _mass_above(p)
        return (above + self.penalty(rank - 1) < np.asarray(qhat)[..., None]) & (p > 0)


class _Penalty(TypedDict):
    lam: float
    k_reg: int


#: RAPS's penalty (`APS.lam`, `APS.k_reg`) at the table's λ and k_reg
_RAPS: _Penalty = {"lam": RAPS_LAMBDA, "k_reg": RAPS_K_REG}
#: The table's scores: column prefix -> score.
SCORES: dict[str, ConformityScore] = {
    "lac": LAC("lac"), "aps": CumulativeAPS("aps"), "aps_strict": APS("aps_strict"),
    "aps_rand": APS("aps_rand", randomized=True),
    "raps": CumulativeAPS("raps", **_RAPS), "raps_strict": APS("raps_strict", **_RAPS),
    "raps_rand": APS("raps_rand", randomized=True, **_RAPS),
}


def check_alpha(alpha: float) -> float:
    a = float(alpha)
    if not 0.0 < a < 1.0:
        raise ValueError(f"alpha={alpha!r} is outside (0, 1): give the miscoverage level, e.g. "
                         "0.1 for sets that hold the gold option 90% of the time")
    return a


def quantile_rank(n: int, alpha: float) -> int:
    """k = ⌈(n + 1)(1 − α)⌉; raises `uqbench.core.errors.NotReachable` when k > n
    (n < 1/α − 1)."""
    a = check_alpha(alpha)
    k = math.ceil((n + 1) * (1.0 - a) - _CEIL_TOL)
    if k > n:
        raise NotReachable(
            f"alpha={a:g} not reachable: {n} calibration questions, split conformal needs "
            f"n >= 1/alpha - 1 = {math.ceil(1.0 / a - 1.0 - _CEIL_TOL)}; use a larger calib "
            "split (profile calib_cap) or a larger alpha")
    return max(k, 1)


def conformal_quantile(calib_scores: ArrayLike, alpha: float) -> float:
    """q̂: the ⌈(n+1)(1−α)⌉-th smallest of the n calibration scores (the ⌈(n+1)(1−α)⌉/n
    empirical quantile, numpy ``method="lower"``).

    >>> conformal_quantile([0.1, 0.4, 0.2, 0.9, 0.3, 0.5, 0.6, 0.8, 0.7, 0.05], 0.2)
    0.8
    """
    s = np.asarray(calib_scores, dtype=np.float64).reshape(-1)
    if s.size == 0:
        raise NotReachable("no calibration scores: the calib split is empty")
    k = quantile_rank(s.size, alpha)
    return float(np.partition(s, k - 1)[k - 1])


def true_label_scores(score: ConformityScore, probs: ArrayLike, labels: ArrayLike,
                      u: ArrayLike | None = None) -> NDArray[np.float64]:
    """(N,) ``s(x_i, y_i, u_i)``: the calibration scores (on a test split, ``≤ q̂`` is whether
    the gold option is in the set for every score but ``aps``: use `covered`)."""
    y = np.asarray(labels, dtype=np.intp).reshape(-1)
    return np.take_along_axis(score.scores(probs, u), y[:, None], axis=1)[:, 0]


def prediction_sets(score: ConformityScore, probs: ArrayLike, qhat: ArrayLike,
                    u: ArrayLike | None = None) -> NDArray[np.bool_]:
    """(N, C) membership (`ConformityScore.in_set`); ``qhat`` one value, or (N,) one per
    question."""
    return score.in_set(probs, qhat, u)


def covered(sets: NDArray[np.bool_], labels: ArrayLike) -> NDArray[np.bool_]:
    """(N,) whether each question's set (`prediction_sets`) holds its gold option."""
    y = np.asarray(labels, dtype=np.intp).reshape(-1)
    return sets[np.arange(len(y)), y]


# --- metrics of the sets: per-question indicators, optional bootstrap resample counts (B, N) ---

def resample_counts(resamples: ArrayLike, n: int) -> NDArray[np.float64]:
    """(B, n) how many times each of the ``n`` questions is drawn in each of the B bootstrap
    resamples ``resamples`` (B, m) of question indices: a resample's mean of per-question
    values ``x`` is then ``counts @ x / m``, one matrix product instead of B gathers.

    >>> resample_counts([[0, 0, 2], [1, 2, 2]], 3)
    array([[2., 0., 1.],
           [0., 1., 2.]])
    """
    idx = np.asarray(resamples)
    if idx.ndim != 2 or (idx.size and (idx.min() < 0 or idx.max() >= n)):
        raise ValueError(f"resamples must be (B, m) indices into the {n} questions; got shape "
                         f"{idx.shape}")
    flat = (idx + n * np.arange(len(idx))[:, None]).ravel()
    return np.bincount(flat, minlength=n * len(idx)).reshape(len(idx), n).astype(np.float64)


def resample_sums(x: NDArray[Any], counts: ArrayLike) -> NDArray[np.float64]:
    """(B, ...) the sums of ``x`` (N, ...) over each resample of ``counts`` (B, N)
    (`resample_counts`): exact, whatever the summation order, for integer-valued ``x``
    (indicators, sizes) as long as the sums stay below 2**53."""
    w = np.asarray(counts, dtype=np.float64)
    if w.ndim != 2 or w.shape[1] != len(x):
        raise ValueError(f"counts must be (B, {len(x)}) resample counts of the {len(x)} "
                         f"questions (resample_counts); got shape {w.shape}")
    return w @ x


def set_statistics(covered: ArrayLike, size: ArrayLike, counts: ArrayLike | None = None
                   ) -> tuple[Any, Any, Any]:
    """(coverage, mean set size, worst size-stratified coverage) of sets with the per-question
    indicators ``covered`` (the gold option is in the set) and sizes ``size``:
    ``mean_i covered_i``, ``mean_i size_i``, and the minimum over the non-empty groups of
    questions of equal set size of the group's coverage (Angelopoulos & Bates 2021; lower = a
    set size that under-covers). ``counts`` (B, N) bootstrap resample counts
    (`resample_counts`): one value of each per resample, (B,), all from one matrix product.

    >>> set_statistics([1, 0, 1, 1, 1], [1, 1, 2, 2, 3])
    (0.8, 1.8, 0.5)
    """
    c = np.asarray(covered, dtype=np.float64).reshape(-1)
    s = np.asarray(size).reshape(-1)
    if s.shape != c.shape:
        raise ValueError(f"covered and size must have the same shape; got {c.shape}, {s.shape}")
    sizes, code = np.unique(s, return_inverse=True)
    group = (code.reshape(-1)[:, None] == np.arange(len(sizes))).astype(np.float64)  # (N, k)
    values = np.column_stack([c, s, np.ones_like(c), group, group * c[:, None]])
    sums = resample_sums(values, np.ones((1, c.size)) if counts is None else counts)
    n_bin, hits = sums[:, 3:3 + len(sizes)], sums[:, 3 + len(sizes):]
    with np.errstate(invalid="ignore", divide="ignore"):
        worst = np.where(n_bin > 0, hits / n_bin, np.inf).min(axis=1)
    cov, mean_size = sums[:, 0] / sums[:, 2], sums[:, 1] / sums[:, 2]
    if counts is None:
        return float(cov[0]), float(mean_size[0]), float(worst[0])
    return cov, mean_size, worst


def coverage(covered: ArrayLike, counts: ArrayLike | None = None) -> Any:
    """Fraction of questions whose set holds the gold option (`set_statistics`).

    >>> coverage([1, 1, 0, 1])
    0.75
    """
    return set_statistics(covered, np.zeros(np.size(covered)), counts)[0]


def mean_set_size(size: ArrayLike, counts: ArrayLike | None = None) -> Any:
    """Mean number of options in the set, ``mean_i |C(x_i)|`` (`set_statistics`)."""
    return set_statistics(np.zeros(np.size(size)), size, counts)[1]


def worst_size_stratified_coverage(covered: ArrayLike, size: ArrayLike,
                                   counts: ArrayLike | None = None) -> Any:
    """The worst coverage over the groups of questions of equal set size (`set_statistics`).

    >>> worst_size_stratified_coverage([1, 0, 1, 1, 1], [1, 1, 2, 2, 3])
    0.5
    """
    return set_statistics(covered, size, counts)[2]


def coverage_curve(calib_scores: ArrayLike, test_scores: ArrayLike, alphas: ArrayLike
                   ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Empirical coverage on a test split against the nominal 1 − α, for each α the calib
    split resolves (the others are left out). ``*_scores``: true-label scores
    (`true_label_scores`). Returns (1 − α, coverage), α descending."""
    cal = np.asarray(calib_scores, np.float64).reshape(-1)
    test = np.asarray(test_scores, np.float64).reshape(-1)
    nominal, cov = [], []
    for a in sorted(map(float, np.asarray(alphas).reshape(-1)), reverse=True):
        try:
            q = conformal_quantile(cal, a)
        except NotReachable:
            continue
        nominal.append(1.0 - a)
        cov.append(coverage(test <= q))
    return np.array(nominal), np.array(cov)


__all__ = ["ALPHAS", "APS", "LAC", "SCORES", "ConformityScore", "CumulativeAPS",
           "check_alpha", "conformal_quantile", "coverage", "coverage_curve",
           "covered", "mean_set_size",
           "prediction_sets", "quantile_rank", "resample_counts", "resample_sums",
           "set_statistics", "true_label_scores", "worst_size_stratified_coverage"]
