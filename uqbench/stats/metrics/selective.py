"""Selective prediction on (uncertainty, correct): risk-coverage, AURC, E-AURC, AUGRC, PRR,
selective accuracy (and HELM's form of it)."""
from __future__ import annotations

import math
import warnings

import numpy as np
from numpy.typing import ArrayLike

from uqbench.stats.metrics._ties import TieGroups, as_rows, of_rows, tie_groups
from uqbench.stats.metrics._validation import (
    CEIL_RTOL,
    HELM_SELECTIVE_FRACTION,
    SELECTIVE_COVERAGE,
    BoolArray,
    FloatArray,
    UndefinedMetricWarning,
    bool_vector,
    check_fraction,
    check_same_length,
    float_vector,
)


def selective_inputs(uncertainty: ArrayLike, correct: ArrayLike) -> tuple[FloatArray, BoolArray]:
    u = float_vector(uncertainty, "uncertainty")
    corr = bool_vector(correct, "correct")
    check_same_length(("uncertainty", u), ("correct", corr))
    return u, corr


def _selective_groups(uncertainty: ArrayLike, correct: ArrayLike) -> TieGroups:
    u, corr = selective_inputs(uncertainty, correct)
    return tie_groups(u[~corr], u[corr])


def expected_risks(groups: TieGroups) -> FloatArray:
    """(N,) E[r_i]: the selective risk of the i least uncertain examples, i = 1..N, in
    expectation over random orderings inside tie groups (see :func:`aurc`); (B, N) for groups
    of B resamples (`TieGroups`)."""
    n_upto, errors_upto, batched = as_rows(groups)
    n = int(n_upto[0, -1])
    size = np.diff(n_upto, prepend=0, axis=1)  # (B, G) examples per tie group
    group_errors = np.diff(errors_upto, prepend=0, axis=1)
    # (B, N) tie group of each accepted position, as an index into the flattened (B, G)
    group = np.repeat(np.arange(size.size), size.ravel()).reshape(-1, n)
    accepted = np.arange(1, n + 1)  # (N,) i = 1..N
    into_group = accepted - (n_upto - size).ravel()[group]  # (B, N) j = 1..n_g
    # Expected errors among the first j of a group of n_g holding e_g errors: j * e_g / n_g.
    errors_before = (errors_upto - group_errors).ravel()[group]
    rate = np.divide(group_errors, size, out=np.zeros(size.shape), where=size > 0)
    expected_errors = errors_before + into_group * rate.ravel()[group]
    risk = expected_errors / accepted
    return risk if batched else risk[0]


def aurc_of_groups(groups: TieGroups) -> float | FloatArray:
    """Expected trapezoid AURC over random orderings inside tie groups (see :func:`aurc`)."""
    return _aurc_of_risks(expected_risks(groups))


def _aurc_of_risks(risk: FloatArray) -> float | FloatArray:
    # Trapezoids between consecutive positions plus the rectangle from coverage 0 to 1/N:
    # (1/N) (r_1 + sum_i (r_i + r_{i+1}) / 2) = (1/N) (sum_i r_i + (r_1 - r_N) / 2).
    rows = np.atleast_2d(risk)
    area = (np.sum(rows, axis=1) + (rows[:, 0] - rows[:, -1]) / 2) / rows.shape[1]
    return of_rows(area, risk.ndim == 2)


def risk_coverage_curve(
    uncertainty: ArrayLike, correct: ArrayLike
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Selective risk against coverage when accepting examples with uncertainty <= threshold.

    Parameters
    ----------
    uncertainty : array-like of shape (N,)
        Uncertainty of each prediction (higher = more uncertain, rejected first).
    correct : array-like of shape (N,)
        Boolean or 0/1: whether each prediction was right.

    Returns
    -------
    coverage : ndarray of shape (G,)
        Fraction accepted, ascending, ending at 1.
    risk : ndarray of shape (G,)
        Selective risk: error rate among the accepted examples.
    thresholds : ndarray of shape (G,)
        The G distinct uncertainty values, ascending; point g accepts ``uncertainty <=
        thresholds[g]``.

    Notes
    -----
    One point per distinct uncertainty value: tied examples are accepted or rejected together
    (there is no point inside a tie group).

    Examples
    --------
    The two examples tied at 0.5 enter together.

    >>> cov, risk, thr = risk_coverage_curve([0.2, 0.5, 0.5, 0.1, 0.9], [1, 0, 1, 1, 0])
    >>> cov, risk, thr
    (array([0.2, 0.4, 0.8, 1. ]), array([0.  , 0.  , 0.25, 0.4 ]), array([0.1, 0.2, 0.5, 0.9]))
    """
    groups = _selective_groups(uncertainty, correct)
    return groups.n_upto / groups.n_upto[-1], groups.hits_upto / groups.n_upto, groups.values


def aurc(uncertainty: ArrayLike, correct: ArrayLike) -> float:
    r"""Area under the risk-coverage curve (AURC), as a fraction; lower is better, in [0, 1].

    Reported as a fraction in [0, 1], **not** multiplied by 1000 as in some papers.

    With distinct uncertainties, accepting the i least uncertain examples gives coverage
    :math:`i/N` and selective risk :math:`r_i = E_i / i` (:math:`E_i` errors among them), and

    .. math:: \mathrm{AURC} = \frac1N \Bigl(r_1 + \sum_{i=1}^{N-1} \frac{r_i + r_{i+1}}{2}\Bigr)
              = \frac1N \Bigl(\sum_{i=1}^{N} r_i + \frac{r_1 - r_N}{2}\Bigr),

    the trapezoid rule over every point plus the rectangle from coverage 0 to the first point at
    its risk (fd-shifts' "linear" AURC). A constant uncertainty gives the error rate.

    **Ties**: the value is the expectation of the above over uniformly random orderings inside
    each tie group, in closed form. AURC is linear in the :math:`r_i`, so it suffices to replace
    each :math:`r_i` by its expectation. For position :math:`i = n_< + j` inside a group of
    :math:`n_g` examples holding :math:`e_g` errors, with :math:`n_<` examples and :math:`E_<`
    errors in the groups before it, the first :math:`j` of a random ordering of the group hold
    :math:`j\,e_g/n_g` errors on average (hypergeometric mean), so

    .. math:: \mathbb{E}[r_i] = \frac{E_< + j\,e_g / n_g}{n_< + j},

    i.e. the group's errors are spread uniformly over its positions: cumulative errors grow
    linearly inside the group, the risk does not. (Joining the group's end points of
    :func:`risk_coverage_curve` by a straight line instead, as a plain trapezoid over the curve
    does, underestimates this and can even beat a perfect ranking.) The curve itself keeps one
    point per distinct value, so on tied data AURC is not the trapezoid area under those points.

    Parameters
    ----------
    uncertainty : array-like of shape (N,)
        Uncertainty of each prediction (higher = more uncertain).
    correct : array-like of shape (N,)
        Boolean or 0/1: whether each prediction was right.

    Returns
    -------
    float

    Examples
    --------
    Order .1, .2, then the two tied at .5 (one wrong) in random order, then .9 (wrong):
    :math:`\mathbb{E}[r] = (0, 0, \tfrac12/3, 1/4, 2/5)`, so
    AURC = (0 + 0 + 1/6 + 1/4 + 2/5 + (0 - 2/5)/2) / 5 = 37/300: the mean of the two orderings'
    AURCs 0.09 and 0.15667.

    >>> round(aurc([0.2, 0.5, 0.5, 0.1, 0.9], [1, 0, 1, 1, 0]), 6)
    0.123333
    """
    return float(aurc_of_groups(_selective_groups(uncertainty, correct)))


def e_aurc(uncertainty: ArrayLike, correct: ArrayLike) -> float:
    r"""Excess AURC: :func:`aurc` minus the AURC of a perfect ranking; lower is better.

    .. math:: \mathrm{E\text{-}AURC} = \mathrm{AURC} - \bigl(e + (1-e)\ln(1-e)\bigr)

    with :math:`e` the overall error rate (Geifman et al. 2019). The subtracted term is the area
    under the risk-coverage curve of an oracle that accepts all correct predictions first, in
    the limit of many examples; it is 0 for :math:`e = 0` and 1 for :math:`e = 1`
    (:math:`(1-e)\ln(1-e) \to 0`). A fraction, not x1000.

    Parameters
    ----------
    uncertainty : array-like of shape (N,)
        Uncertainty of each prediction (higher = more uncertain).
    correct : array-like of shape (N,)
        Boolean or 0/1: whether each prediction was right.

    Returns
    -------
    float

    Notes
    -----
    The value can be slightly negative: on N examples the oracle's own trapezoid AURC lies
    below the closed form by less than 0.08 / N (the oracle curve is concave above its kink).
    Ties cannot push it lower: AURC is the expectation over tie-breaks (see :func:`aurc`), and
    every tie-break is a strict ranking, at least the oracle's.

    Examples
    --------
    AURC 37/300 and e = 0.4: 0.123333 - (0.4 + 0.6 ln 0.6) = 0.123333 - 0.0935046.

    >>> round(e_aurc([0.2, 0.5, 0.5, 0.1, 0.9], [1, 0, 1, 1, 0]), 6)
    0.029829
    """
    groups = _selective_groups(uncertainty, correct)
    err = float(groups.hits_upto[-1] / groups.n_upto[-1])
    optimal = 1.0 if err == 1.0 else err + (1.0 - err) * math.log1p(-err)
    return float(aurc_of_groups(groups)) - optimal


def augrc(uncertainty: ArrayLike, correct: ArrayLike) -> float:
    r"""Area under the generalized risk-coverage curve (AUGRC); lower is better, in [0, 1].

    The generalized risk at a threshold is the number of accepted errors divided by N (not by
    the number accepted). At the thresholds of :func:`risk_coverage_curve`, with coverage
    :math:`c_g` and generalized risk :math:`\rho_g`, and closed at :math:`(c_0, \rho_0) = (0, 0)`:

    .. math:: \mathrm{AUGRC} = \sum_{g=1}^{G} (c_g - c_{g-1})\,\frac{\rho_{g-1} + \rho_g}{2}

    (Traub et al. 2024). A constant uncertainty gives :math:`e/2`, a perfect ranking
    :math:`e^2/2`, for error rate e. A fraction, not x1000.

    Parameters
    ----------
    uncertainty : array-like of shape (N,)
        Uncertainty of each prediction (higher = more uncertain).
    correct : array-like of shape (N,)
        Boolean or 0/1: whether each prediction was right.

    Returns
    -------
    float

    Examples
    --------
    Points (0, 0), (.2, 0), (.4, 0), (.8, .2), (1, .4): .4*(0+.2)/2 + .2*(.2+.4)/2.

    >>> round(augrc([0.2, 0.5, 0.5, 0.1, 0.9], [1, 0, 1, 1, 0]), 6)
    0.1
    """
    return float(augrc_of_groups(_selective_groups(uncertainty, correct)))


def augrc_of_groups(groups: TieGroups) -> float | FloatArray:
    n_upto, errors_upto, batched = as_rows(groups)
    n_acc, errors = (np.pad(a, ((0, 0), (1, 0))) for a in (n_upto, errors_upto))
    n = int(n_acc[0, -1])
    # In integer counts: sum (dn) * (e_prev + e_next) / (2 N^2), exact before the division.
    twice_area = np.sum(np.diff(n_acc, axis=1) * (errors[:, 1:] + errors[:, :-1]), axis=1)
    return of_rows(twice_area / (2.0 * n * n), batched)


def _n_accepted(coverage: float, n: int) -> int:
    """ceil(coverage * n), forgiving float rounding: 0.7 * 10 = 7.000000000000001 gives 7."""
    exact = coverage * n
    nearest = round(exact)
    if abs(exact - nearest) <= CEIL_RTOL * max(1.0, exact):
        return max(1, nearest)
    return math.ceil(exact)


def selective_accuracy(
    uncertainty: ArrayLike, correct: ArrayLike, *, coverage: float = SELECTIVE_COVERAGE
) -> float:
    r"""Accuracy on the ``ceil(coverage * N)`` least uncertain examples; higher is better.

    Parameters
    ----------
    uncertainty : array-like of shape (N,)
        Uncertainty of each prediction (higher = more uncertain).
    correct : array-like of shape (N,)
        Boolean or 0/1: whether each prediction was right.
    coverage : float, default `SELECTIVE_COVERAGE` (0.8)
        Fraction to accept, in (0, 1].

    Returns
    -------
    float

    Notes
    -----
    With k = ceil(coverage * N), where a product within a relative 1e-9 of an integer counts as
    that integer (so that 0.7 * 10, which is 7.000000000000001 in floating point, gives 7, and
    so does a coverage read off :func:`risk_coverage_curve`). If a tie group straddles the
    cut, only part of it fits: it is counted pro rata at its mean accuracy (the expected value
    under random tie-breaking),

    .. math:: \mathrm{acc} = \frac{C_{<} + (k - n_{<})\,C_t / n_t}{k}

    with :math:`n_<, C_<` the examples and correct ones strictly before the group and
    :math:`n_t, C_t` those of the group.

    Examples
    --------
    k = 3: 0.1 and 0.2 (both correct), then one of the two tied at 0.5 (half correct):
    (2 + 1 * 1/2) / 3.

    >>> round(selective_accuracy([0.2, 0.5, 0.5, 0.1, 0.9], [1, 0, 1, 1, 0], coverage=0.6), 6)
    0.833333
    """
    cov = check_fraction(coverage, "coverage", open_right=False)
    return float(selective_accuracy_of_groups(_selective_groups(uncertainty, correct), cov))


def selective_accuracy_of_groups(groups: TieGroups, cov: float) -> float | FloatArray:
    return _first_k_accuracy(groups, _n_accepted(cov, int(groups.n_upto[..., -1].flat[0])))


def _first_k_accuracy(groups: TieGroups, k: int) -> float | FloatArray:
    """Accuracy of the k least uncertain examples, a straddling tie group pro rata."""
    n_upto, errors_upto, batched = as_rows(groups)
    # the group holding the k-th example: the first with n_upto >= k (never an empty group)
    g = (n_upto < k).sum(axis=1, keepdims=True)
    before = np.maximum(g - 1, 0)
    n_before = np.where(g > 0, np.take_along_axis(n_upto, before, axis=1), 0)[:, 0]
    err_before = np.where(g > 0, np.take_along_axis(errors_upto, before, axis=1), 0)[:, 0]
    group_n = np.take_along_axis(n_upto, g, axis=1)[:, 0] - n_before
    group_err = np.take_along_axis(errors_upto, g, axis=1)[:, 0] - err_before
    errors = err_before + (k - n_before) * group_err / group_n
    return of_rows((k - errors) / k, batched)


def helm_selective_accuracy(
    uncertainty: ArrayLike, correct: ArrayLike, *, fraction: float = HELM_SELECTIVE_FRACTION
) -> float:
    r"""Accuracy on the ``int(fraction * N) + 1`` least uncertain examples (HELM's
    ``selective_acc@10`` at the default 0.1); higher is better.

    HELM computes ``selective_acc@10`` with ``uncertainty-calibration``'s
    ``get_selective_stats(max_probs, correct)``: the cumulative accuracies of the examples
    sorted by descending confidence, read at index ``int(0.1 * N)``, i.e. the accuracy of the
    ``int(0.1 * N) + 1`` most confident (11 of 100, 1 of 5). This function is that number with
    the uncertainty as the ranking (least uncertain first); :func:`selective_accuracy` at
    ``coverage`` accepts ``ceil(coverage * N)`` instead (10 of 100).

    Parameters
    ----------
    uncertainty : array-like of shape (N,)
        Uncertainty of each prediction (higher = more uncertain); for HELM's own number, any
        decreasing function of its ``max_prob``, e.g. ``1 - max_prob``.
    correct : array-like of shape (N,)
        Boolean or 0/1: whether each prediction was right (HELM's ``exact_match``).
    fraction : float, default 0.1
        In (0, 1).

    Returns
    -------
    float

    Notes
    -----
    Ties: HELM orders tied confidences as ``np.argsort`` happens to (quicksort, not stable);
    here a tie group straddling the cut counts pro rata at its accuracy, the expectation over
    random orderings inside the group (as :func:`selective_accuracy`). Without ties the two are
    equal.

    Examples
    --------
    N = 5: int(0.5) + 1 = 1 example, the least uncertain (0.1, correct).

    >>> helm_selective_accuracy([0.2, 0.5, 0.5, 0.1, 0.9], [1, 0, 1, 1, 0])
    1.0

    At fraction 0.4: int(2.0) + 1 = 3 examples; the third is one of the two tied at 0.5.

    >>> round(helm_selective_accuracy([0.2, 0.5, 0.5, 0.1, 0.9], [1, 0, 1, 1, 0],
    ...                               fraction=0.4), 6)
    0.833333
    """
    frac = check_fraction(fraction, "fraction", open_right=True)
    groups = _selective_groups(uncertainty, correct)
    return float(helm_selective_accuracy_of_groups(groups, frac))


def helm_selective_accuracy_of_groups(groups: TieGroups, frac: float) -> float | FloatArray:
    return _first_k_accuracy(groups, int(frac * int(groups.n_upto[..., -1].flat[0])) + 1)


def prediction_rejection_ratio(
    uncertainty: ArrayLike, correct: ArrayLike, *, max_rejection: float = 1.0
) -> float:
    r"""Prediction-rejection ratio (PRR), as LM-Polygraph's normalised ``prr``; higher is
    better, 1 for a perfect ranking, 0 in expectation for a random one (can be negative).

    Rejecting the most uncertain examples first, let :math:`a_k` be the accuracy of the
    :math:`k` least uncertain. The prediction-rejection area over the last :math:`m =
    \lfloor \mathrm{max\_rejection}\cdot N 
floor` points is
    :math:`\mathrm{PRA} = rac1m \sum_{k=N-m+1}^{N} a_k`, and

    .. math:: \mathrm{PRR} = rac{\mathrm{PRA} - \mathrm{PRA}_\mathrm{random}}
                                  {\mathrm{PRA}_\mathrm{oracle} - \mathrm{PRA}_\mathrm{random}}
              = rac{e - R}{e - R_\mathrm{oracle}},

    with the loss ``1 - correct``: :math:`R = 1 - \mathrm{PRA}` the mean selective risk over
    those points, :math:`e` the error rate (a random ranking's expected risk at every
    coverage) and :math:`R_\mathrm{oracle}` the oracle's, which accepts every correct
    prediction first: :math:`r_k = \max(0, k - C)/k` with :math:`C` correct examples.

    This is LM-Polygraph's ``PredictionRejectionArea(max_rejection)`` with target ``correct``
    (``ue_metrics/pred_rej_area.py``), normalised as its ``UEManager`` reports
    ``prr_normalized`` (``ue_metrics/ue_metric.py`` ``normalize_metric``), with two
    differences: the random PRA is the exact expectation :math:`1 - e`, where LM-Polygraph
    estimates it from 1000 seeded random permutations (``get_random_scores``), so its value
    differs from this one by that Monte Carlo error; and tied uncertainties are counted in
    expectation over orderings inside tie groups (as :func:`aurc`), where LM-Polygraph takes
    ``np.argsort``'s order. Without ties and with the exact random baseline the two are equal.

    Parameters
    ----------
    uncertainty : array-like of shape (N,)
        Uncertainty of each prediction (higher = more uncertain, rejected first).
    correct : array-like of shape (N,)
        Boolean or 0/1: whether each prediction was right.
    max_rejection : float, default 1.0
        Largest fraction of examples rejected, in (0, 1] (LM-Polygraph's default 1.0: the
        whole curve, ``prr``; 0.5 gives its ``prr_0.5``).

    Returns
    -------
    float
        NaN, with an `UndefinedMetricWarning`, when every prediction is right or every one is
        wrong (the oracle is then no better than random; LM-Polygraph returns the
        unnormalised area there) or when fewer than two points lie on the curve.

    Examples
    --------
    Distinct uncertainties, least uncertain first: correct 1, 1, 1, 0, 0 (a perfect ranking)
    gives 1, and the reverse order gives R = (1 + 1 + 2/3 + 1/2 + 2/5) / 5, e = 0.4,
    R_oracle = (0 + 0 + 0 + 1/4 + 2/5) / 5: PRR = (0.4 - 0.71333) / (0.4 - 0.13) = -1.16049.

    >>> prediction_rejection_ratio([0.1, 0.2, 0.3, 0.4, 0.5], [1, 1, 1, 0, 0])
    1.0
    >>> round(prediction_rejection_ratio([0.5, 0.4, 0.3, 0.2, 0.1], [1, 1, 1, 0, 0]), 5)
    -1.16049
    """
    frac = check_fraction(max_rejection, "max_rejection", open_right=False)
    return float(prr_of_groups(_selective_groups(uncertainty, correct), frac))


def prr_of_groups(groups: TieGroups, max_rejection: float = 1.0,
                  risk: FloatArray | None = None) -> float | FloatArray:
    """:func:`prediction_rejection_ratio` of sorted tie groups (``risk``: their
    `expected_risks`, if already computed)."""
    n_upto, errors_upto, batched = as_rows(groups)
    n = int(n_upto[0, -1])
    n_errors = errors_upto[:, -1]  # (B,)
    m = int(max_rejection * n)  # LM-Polygraph's num_rej
    undefined = (m < 2) | (n_errors == 0) | (n_errors == n)
    if undefined.any():
        why = (f"only {m} point(s) on the rejection curve (max_rejection * N < 2)" if m < 2
               else "every prediction is right or every one is wrong")
        warnings.warn(f"prediction_rejection_ratio: undefined, {why}; returning NaN",
                      UndefinedMetricWarning, stacklevel=3)
        if undefined.all():
            return of_rows(np.full(undefined.size, math.nan), batched)
    # (B, m) E[r_k], k > N-m
    rows = np.atleast_2d(expected_risks(groups) if risk is None else risk)[:, n - m:]
    k = np.arange(n - m + 1, n + 1)
    oracle = np.maximum(k - (n - n_errors[:, None]), 0) / k
    e = n_errors / n
    with np.errstate(divide="ignore", invalid="ignore"):  # the undefined rows
        prr = (e - np.mean(rows, axis=1)) / (e - np.mean(oracle, axis=1))
    return of_rows(np.where(undefined, math.nan, prr), batched)


def selective_summary(
    uncertainty: ArrayLike, correct: ArrayLike, *, coverage: float = 0.8
) -> FloatArray:
    """(:func:`aurc`, :func:`augrc`, :func:`selective_accuracy` at ``coverage``,
    :func:`prediction_rejection_ratio`, :func:`helm_selective_accuracy`) from one sort of the
    examples: the ranking columns of the table, e.g. as one :func:`bootstrap_ci` metric.

    >>> selective_summary([0.2, 0.5, 0.5, 0.1, 0.9], [1, 0, 1, 1, 0], coverage=0.6).round(6)
    array([0.123333, 0.1     , 0.833333, 0.876543, 1.      ])
    """
    cov = check_fraction(coverage, "coverage", open_right=False)
    return summary_of_groups(_selective_groups(uncertainty, correct), cov)


def summary_of_groups(groups: TieGroups, cov: float) -> FloatArray:
    """:func:`selective_summary` of sorted tie groups."""
    risk = expected_risks(groups)  # shared by AURC and PRR
    # (5,), or (B, 5) for the groups of B resamples
    return np.stack([_aurc_of_risks(risk), augrc_of_groups(groups),
                     selective_accuracy_of_groups(groups, cov), prr_of_groups(groups, 1.0, risk),
                     helm_selective_accuracy_of_groups(groups, HELM_SELECTIVE_FRACTION)], axis=-1)
