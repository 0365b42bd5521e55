"""Tests for uqbench.stats.metrics: hand-worked values, reference tools, properties, bad input."""
from __future__ import annotations

import doctest
import functools
import math
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.testing import assert_allclose, assert_array_equal
from sklearn.calibration import calibration_curve
from sklearn.metrics import average_precision_score, roc_auc_score, roc_curve

from uqbench.stats import metrics
from uqbench.stats.metrics import (
    NLL_EPS,
    UndefinedMetricWarning,
    augrc,
    aupr_in,
    aupr_out,
    aurc,
    bootstrap_ci,
    bootstrap_ci_two_sample,
    brier_score,
    e_aurc,
    expected_calibration_error,
    fpr_at_95_tpr,
    helm_selective_accuracy,
    max_calibration_error,
    mean_std,
    negative_log_likelihood,
    ood_auroc,
    ood_roc_curve,
    prediction_rejection_ratio,
    reliability_curve,
    risk_coverage_curve,
    selective_accuracy,
    selective_summary,
)

PROPS = settings(max_examples=30, deadline=None)

# Shared 5-element examples, worked by hand below.
CONF = np.array([0.1, 0.3, 0.55, 0.8, 0.95])
CORRECT = np.array([0, 0, 1, 1, 0])
PROBS = np.array([
    [0.7, 0.2, 0.1],
    [0.1, 0.8, 0.1],
    [0.3, 0.3, 0.4],
    [0.5, 0.5, 0.0],
    [1.0, 0.0, 0.0],
])
LABELS = np.array([0, 1, 2, 1, 0])
U_ID = np.array([0.1, 0.4, 0.35, 0.8, 0.2])
U_OOD = np.array([0.9, 0.4, 0.7, 0.3, 0.6])  # 0.4 ties with an ID example
U_SEL = np.array([0.2, 0.5, 0.5, 0.1, 0.9])  # two examples tied at 0.5, one right, one wrong
C_SEL = np.array([1, 0, 1, 1, 0])


# --------------------------------------------------------------------------------------------
# calibration, by hand
# --------------------------------------------------------------------------------------------


def test_reliability_curve_by_hand():
    curve = reliability_curve(CONF, CORRECT, n_bins=2)
    # (0, .5]: {.1, .3}, none correct; (.5, 1]: {.55, .8, .95}, two correct.
    assert_array_equal(curve.edges, [0.0, 0.5, 1.0])
    assert_array_equal(curve.count, [2, 3])
    assert_allclose(curve.confidence, [0.2, (0.55 + 0.8 + 0.95) / 3])  # [.2, .7667]
    assert_allclose(curve.accuracy, [0.0, 2 / 3])


def test_ece_and_mce_by_hand():
    # 2/5 * |0 - 0.2| + 3/5 * |2/3 - 2.3/3| = 0.08 + 3/5 * 0.1 = 0.08 + 0.06
    assert expected_calibration_error(CONF, CORRECT, n_bins=2) == pytest.approx(0.14)
    # max(|0 - 0.2|, |2/3 - 0.7667|) = max(0.2, 0.1)
    assert max_calibration_error(CONF, CORRECT, n_bins=2) == pytest.approx(0.2)
    # 15 bins: every example alone in its bin, so ECE = mean |correct - conf|
    # = (.1 + .3 + .45 + .2 + .95) / 5 = 2.0 / 5
    assert expected_calibration_error(CONF, CORRECT) == pytest.approx(0.4)
    assert max_calibration_error(CONF, CORRECT) == pytest.approx(0.95)


def test_uniform_bins_are_right_closed_with_zero_in_first_bin():
    curve = reliability_curve([0.0, 0.5, 0.5000001, 1.0], [1, 1, 0, 0], n_bins=2)
    # 0 -> first bin; 0.5 = edge -> lower bin (0, .5]; 1 -> last bin
    assert_array_equal(curve.count, [2, 2])
    assert_allclose(curve.accuracy, [1.0, 0.0])


def test_empty_bins_are_kept_with_nan():
    curve = reliability_curve([0.05, 0.95], [1, 0], n_bins=4)
    assert_array_equal(curve.count, [1, 0, 0, 1])
    assert np.isnan(curve.confidence[1:3]).all() and np.isnan(curve.accuracy[1:3]).all()
    assert curve.edges.shape == (5,)
    # |1 - .05| and |0 - .95|, each weight 1/2
    assert expected_calibration_error([0.05, 0.95], [1, 0], n_bins=4) == pytest.approx(0.95)


def test_quantile_bins_by_hand():
    curve = reliability_curve(CONF, CORRECT, n_bins=5, strategy="quantile")
    # linear quantiles of the sorted values at positions 0, .8, 1.6, 2.4, 3.2, 4:
    # .1, .1+.8*.2 = .26, .3+.6*.25 = .45, .55+.4*.25 = .65, .8+.2*.15 = .83, .95;
    # the outer edges are then set to 0 and 1
    assert_allclose(curve.edges, [0.0, 0.26, 0.45, 0.65, 0.83, 1.0])
    assert_array_equal(curve.count, [1, 1, 1, 1, 1])
    # one example per bin: mean |correct - conf| = 2.0 / 5
    assert expected_calibration_error(CONF, CORRECT, n_bins=5, strategy="quantile") == (
        pytest.approx(0.4)
    )


def test_quantile_bins_never_split_ties():
    conf = [0.9, 0.9, 0.9, 0.9, 0.2]
    correct = [1, 1, 1, 0, 0]
    curve = reliability_curve(conf, correct, n_bins=5, strategy="quantile")
    # sorted [.2, .9, .9, .9, .9]: quantiles .2, .2+.8*.7 = .76, .9, .9, .9, .9 -> duplicate
    # edges are kept; the tie group at .9 sits in (.76, .9], the zero-width bins stay empty
    assert_allclose(curve.edges, [0.0, 0.76, 0.9, 0.9, 0.9, 1.0])
    assert_array_equal(curve.count, [1, 4, 0, 0, 0])
    # 1/5 * |0 - .2| + 4/5 * |3/4 - .9| = .04 + .12
    assert expected_calibration_error(conf, correct, n_bins=5, strategy="quantile") == (
        pytest.approx(0.16)
    )


def test_brier_by_hand():
    # rows: (.3^2 + .2^2 + .1^2) = .14; (.1^2 + .2^2 + .1^2) = .06; (.3^2 + .3^2 + .6^2) = .54;
    # (.5^2 + .5^2 + 0) = .5; (0 + 0 + 0) = 0.  Sum 1.24 / 5
    assert brier_score(PROBS, LABELS) == pytest.approx(0.248)


def test_nll_by_hand():
    # (-ln .7 - ln .8 - ln .4 - ln .5 - ln 1) / 5
    # = (.3566749 + .2231436 + .9162907 + .6931472 + 0) / 5 = 2.1892564 / 5
    assert negative_log_likelihood(PROBS, LABELS) == pytest.approx(0.4378513, abs=1e-7)


def test_nll_clips_zero_probability():
    # label 2 of row [.5, .5, 0] has p = 0 -> clipped to 1e-12: (-ln 1e-12 - ln 1) / 2
    value = negative_log_likelihood([[0.5, 0.5, 0.0], [0.0, 0.0, 1.0]], [2, 2])
    assert value == pytest.approx(-math.log(NLL_EPS) / 2)  # 13.8155
    assert math.isfinite(value)


# --------------------------------------------------------------------------------------------
# OOD detection, by hand
# --------------------------------------------------------------------------------------------


def test_ood_auroc_by_hand():
    # for each OOD value, ID values below it (+ 1/2 per tie):
    # .9: 5; .4: 3 (.1, .35, .2) + .5 (tie .4); .7: 4; .3: 2; .6: 4 -> 18.5 / 25
    assert ood_auroc(U_ID, U_OOD) == pytest.approx(0.74)


def test_ood_roc_curve_by_hand():
    fpr, tpr, thr = ood_roc_curve(U_ID, U_OOD)
    # descending thresholds; at each, (ID >= t) / 5 and (OOD >= t) / 5
    assert_array_equal(thr, [np.inf, 0.9, 0.8, 0.7, 0.6, 0.4, 0.35, 0.3, 0.2, 0.1])
    assert_allclose(fpr, [0, 0, 0.2, 0.2, 0.2, 0.4, 0.6, 0.6, 0.8, 1.0])
    assert_allclose(tpr, [0, 0.2, 0.2, 0.4, 0.6, 0.8, 0.8, 1.0, 1.0, 1.0])


def test_aupr_by_hand():
    # OOD positive, descending u: .9 O | .8 I | .7 O | .6 O | .4 O+I | .35 I | .3 O | .2 I | .1 I
    # precision where an OOD example enters: 1, 2/3, 3/4, 4/6, 5/8, each recall step 1/5
    # (1 + 2/3 + 3/4 + 2/3 + 5/8) / 5 = (89/24) / 5 = 89/120
    assert aupr_out(U_ID, U_OOD) == pytest.approx(89 / 120)
    # ID positive, ascending u: .1 I | .2 I | .3 O | .35 I | .4 I+O | .6 O | .7 O | .8 I | .9 O
    # precision where an ID example enters: 1, 1, 3/4, 4/6, 5/9
    # (1 + 1 + 3/4 + 2/3 + 5/9) / 5 = (143/36) / 5 = 143/180
    assert aupr_in(U_ID, U_OOD) == pytest.approx(143 / 180)


def test_fpr_at_95_tpr_by_hand():
    # TPR >= .95 needs all 5 OOD: first at threshold .3, where ID .8, .4, .35 are flagged: 3/5
    assert fpr_at_95_tpr(U_ID, U_OOD) == pytest.approx(0.6)
    # 20 OOD, 19 of them >= 1: at threshold 1.0 TPR = 19/20 = .95 exactly, which counts, and
    # the ID example 1.5 is flagged: 1/4 (were .95 not enough, threshold 0 would give 4/4)
    u_ood = np.r_[np.linspace(1.0, 2.0, 19), 0.0]
    assert fpr_at_95_tpr([1.5, 0.1, 0.2, 0.3], u_ood) == pytest.approx(0.25)


def test_ood_metrics_on_perfect_separation():
    u_id, u_ood = [0.1, 0.2, 0.3], [0.5, 0.6]
    assert ood_auroc(u_id, u_ood) == 1.0
    assert aupr_out(u_id, u_ood) == 1.0
    assert aupr_in(u_id, u_ood) == 1.0
    assert fpr_at_95_tpr(u_id, u_ood) == 0.0


# --------------------------------------------------------------------------------------------
# selective prediction, by hand (with a tie)
# --------------------------------------------------------------------------------------------


def test_risk_coverage_curve_by_hand_with_tie():
    cov, risk, thr = risk_coverage_curve(U_SEL, C_SEL)
    # ascending: .1 (right) | .2 (right) | .5, .5 (one wrong, together) | .9 (wrong)
    assert_array_equal(thr, [0.1, 0.2, 0.5, 0.9])
    assert_allclose(cov, [0.2, 0.4, 0.8, 1.0])
    assert_allclose(risk, [0.0, 0.0, 1 / 4, 2 / 5])


def test_aurc_family_by_hand_with_tie():
    # positions .1 (right), .2 (right), the two tied at .5 (one wrong) in random order, .9:
    # expected risks 0, 0, (1/2)/3, 1/4, 2/5; AURC = (sum + (r_1 - r_N)/2) / N
    assert aurc(U_SEL, C_SEL) == pytest.approx((1 / 6 + 1 / 4 + 2 / 5 - 1 / 5) / 5)
    assert aurc(U_SEL, C_SEL) == pytest.approx(37 / 300)
    # = the mean of the two tie-breaks: right one first (0, 0, 0, 1/4, 2/5) or wrong one first
    assert aurc(U_SEL, C_SEL) == pytest.approx(
        (aurc([.2, .5, .6, .1, .9], C_SEL) + aurc([.2, .6, .5, .1, .9], C_SEL)) / 2)
    assert aurc([.2, .6, .5, .1, .9], C_SEL) == pytest.approx((1 / 4 + 2 / 5 - 1 / 5) / 5)
    # error rate .4: optimal = .4 + .6 ln .6 = .4 - .3064954 = .0935046
    assert e_aurc(U_SEL, C_SEL) == pytest.approx(37 / 300 - (0.4 + 0.6 * math.log(0.6)))
    assert e_aurc(U_SEL, C_SEL) == pytest.approx(0.0298287, abs=1e-7)
    # generalized risk = errors / 5: (0,0) (.2,0) (.4,0) (.8,.2) (1,.4)
    # .4*(0+.2)/2 + .2*(.2+.4)/2 = .04 + .06
    assert augrc(U_SEL, C_SEL) == pytest.approx(0.1)


def test_selective_accuracy_by_hand_with_tie():
    # k = ceil(.8*5) = 4: .1, .2 and the whole tie at .5 -> 3 right of 4
    assert selective_accuracy(U_SEL, C_SEL) == pytest.approx(0.75)
    # k = 3: .1, .2, then 1 of the 2 tied at .5, counted at the tie's accuracy 1/2:
    # (2 + 1 * 1/2) / 3
    assert selective_accuracy(U_SEL, C_SEL, coverage=0.6) == pytest.approx(2.5 / 3)
    # k = 1: the least uncertain (.1) is right
    assert selective_accuracy(U_SEL, C_SEL, coverage=0.2) == pytest.approx(1.0)
    # k = 5: overall accuracy 3/5
    assert selective_accuracy(U_SEL, C_SEL, coverage=1.0) == pytest.approx(0.6)


def test_selective_accuracy_coverage_rounding():
    # 0.7 * 10 is 7.000000000000001 in floating point; k must be 7, not 8.
    u = np.arange(10.0)
    correct = np.r_[np.ones(7), np.zeros(3)]
    assert selective_accuracy(u, correct, coverage=0.7) == 1.0  # first 7 are all right
    # k = ceil(.71*10) = 8: 7 right of 8
    assert selective_accuracy(u, correct, coverage=0.71) == pytest.approx(7 / 8)


def test_e_aurc_at_error_rate_zero_and_one():
    u = [0.3, 0.1, 0.2, 0.5, 0.4]
    # err = 0: AURC 0, optimal 0
    assert aurc(u, [1] * 5) == 0.0 and e_aurc(u, [1] * 5) == 0.0
    # err = 1: AURC 1, optimal 1 + 0 * ln 0 = 1
    assert aurc(u, [0] * 5) == 1.0 and e_aurc(u, [0] * 5) == 0.0


def test_constant_uncertainty_by_hand():
    # one point (1, 2/5): AURC = rectangle 2/5; AUGRC = triangle 2/5 / 2
    assert aurc([0.3] * 5, C_SEL) == pytest.approx(0.4)
    assert augrc([0.3] * 5, C_SEL) == pytest.approx(0.2)
    # the whole set is one tie group: pro rata = overall accuracy 3/5
    assert selective_accuracy([0.3] * 5, C_SEL, coverage=0.4) == pytest.approx(0.6)


def test_mean_std_by_hand():
    # mean .2, std sqrt((.01 + .01) / 1) = .141421
    mean, std = mean_std([0.1, 0.3])
    assert mean == pytest.approx(0.2) and std == pytest.approx(math.sqrt(0.02))
    assert mean_std([0.7]) == (0.7, 0.0)
    with pytest.warns(UndefinedMetricWarning, match="NaN"):
        mean, std = mean_std([0.1, float("nan")])
    assert math.isnan(mean) and math.isnan(std)


def test_scalar_metrics_return_python_floats():
    values = [
        expected_calibration_error(CONF, CORRECT), max_calibration_error(CONF, CORRECT),
        brier_score(PROBS, LABELS), negative_log_likelihood(PROBS, LABELS),
        ood_auroc(U_ID, U_OOD), aupr_out(U_ID, U_OOD), aupr_in(U_ID, U_OOD),
        fpr_at_95_tpr(U_ID, U_OOD), aurc(U_SEL, C_SEL), e_aurc(U_SEL, C_SEL),
        augrc(U_SEL, C_SEL), selective_accuracy(U_SEL, C_SEL),
    ]
    assert all(type(v) is float for v in values)


def test_docstring_examples():
    import importlib
    import pkgutil

    attempted = 0
    for info in pkgutil.iter_modules(metrics.__path__):
        module = importlib.import_module(f"{metrics.__name__}.{info.name}")
        result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
        assert result.failed == 0, info.name
        attempted += result.attempted
    assert attempted >= 15


# --------------------------------------------------------------------------------------------
# cross-checks against the reference tools
# --------------------------------------------------------------------------------------------


def _calibration_sample(n, seed):
    rng = np.random.default_rng(seed)
    conf = rng.random(n)
    return conf, rng.random(n) < conf**1.5


@pytest.mark.parametrize("n_bins", [5, 10, 15])
def test_ece_and_mce_match_netcal(n_bins):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # netcal's dependencies warn on import
        from netcal.metrics import ECE, MCE
    # Continuous random confidences never sit on a bin edge, where the conventions differ.
    conf, correct = _calibration_sample(3000, seed=n_bins)
    y = correct.astype(int)
    assert expected_calibration_error(conf, correct, n_bins=n_bins) == pytest.approx(
        ECE(bins=n_bins).measure(conf, y), abs=1e-12)
    assert max_calibration_error(conf, correct, n_bins=n_bins) == pytest.approx(
        MCE(bins=n_bins).measure(conf, y), abs=1e-12)


def test_ece_netcal_edge_convention_is_mirrored():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from netcal.metrics import ECE
    # netcal bins [l, u) (np.histogramdd), we bin (l, u]. Mirroring c -> 1 - c and
    # correct -> 1 - correct maps one convention onto the other; with 4 bins the edges are
    # exact binary fractions, so confidences on the edges are a real test.
    conf = np.tile(np.arange(9) / 8, 3)
    correct = np.random.default_rng(1).integers(0, 2, conf.size)
    ours_mirrored = expected_calibration_error(1 - conf, 1 - correct, n_bins=4)
    assert ours_mirrored == pytest.approx(ECE(bins=4).measure(conf, correct), abs=1e-12)
    # ...and the conventions really do differ on edge values:
    # ours: (0, .5] = {.25(0), .5(1), .5(1)}, (.5, 1] = {.75(0)}: .25*.75 + .75*.25 = .375
    # netcal: [0, .5) = {.25(0)}, [.5, 1] = {.5, .5, .75}: .25*.25 + (2/3-7/12)*.75 = .125
    edge_conf, edge_correct = np.array([0.25, 0.5, 0.5, 0.75]), np.array([0, 1, 1, 0])
    assert expected_calibration_error(edge_conf, edge_correct, n_bins=2) == pytest.approx(0.375)
    assert ECE(bins=2).measure(edge_conf, edge_correct) == pytest.approx(0.125)


@pytest.mark.parametrize("n_bins", [1, 2, 10, 15, 63, 64, 100])
def test_uniform_reliability_curve_matches_sklearn_including_edges(n_bins):
    rng = np.random.default_rng(n_bins)
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    conf = np.concatenate([rng.random(500), edges, np.round(rng.random(200), 2)])
    correct = rng.random(conf.size) < conf
    curve = reliability_curve(conf, correct, n_bins=n_bins)
    acc, mean_conf = calibration_curve(correct, conf, n_bins=n_bins, strategy="uniform")
    filled = curve.count > 0
    assert_allclose(curve.accuracy[filled], acc, rtol=1e-12)
    assert_allclose(curve.confidence[filled], mean_conf, rtol=1e-12)
    assert curve.count.sum() == conf.size


@pytest.mark.parametrize("n_bins", [3, 10])
def test_quantile_reliability_curve_matches_sklearn(n_bins):
    # n - 1 = 1009 is prime, so no quantile position is an integer and the edges lie strictly
    # between data points (np.quantile and sklearn's np.percentile then bin identically).
    conf, correct = _calibration_sample(1010, seed=7)
    curve = reliability_curve(conf, correct, n_bins=n_bins, strategy="quantile")
    acc, mean_conf = calibration_curve(correct, conf, n_bins=n_bins, strategy="quantile")
    assert_array_equal(curve.count > 0, np.ones(n_bins, bool))
    assert_allclose(curve.accuracy, acc, rtol=1e-12)
    assert_allclose(curve.confidence, mean_conf, rtol=1e-12)


def _ood_sample(n_id, n_ood, seed, decimals):
    rng = np.random.default_rng(seed)
    # Rounding produces ties within and across the two splits.
    return (np.round(rng.normal(0.0, 1.0, n_id), decimals),
            np.round(rng.normal(0.8, 1.0, n_ood), decimals))


@pytest.mark.parametrize("decimals", [0, 1, 3, 12])
@pytest.mark.parametrize("seed", [0, 1])
def test_ood_metrics_match_sklearn(seed, decimals):
    u_id, u_ood = _ood_sample(300, 170, seed, decimals)
    y = np.r_[np.zeros(u_id.size), np.ones(u_ood.size)]
    u = np.r_[u_id, u_ood]
    assert ood_auroc(u_id, u_ood) == pytest.approx(roc_auc_score(y, u), abs=1e-12)
    assert aupr_out(u_id, u_ood) == pytest.approx(average_precision_score(y, u), abs=1e-12)
    assert aupr_in(u_id, u_ood) == pytest.approx(average_precision_score(1 - y, -u), abs=1e-12)
    fpr, tpr, thr = ood_roc_curve(u_id, u_ood)
    sk_fpr, sk_tpr, sk_thr = roc_curve(y, u, drop_intermediate=False)
    assert_array_equal(fpr, sk_fpr)
    assert_array_equal(tpr, sk_tpr)
    assert_array_equal(thr, sk_thr)
    first = np.argmax(sk_tpr >= 0.95)
    assert fpr_at_95_tpr(u_id, u_ood) == sk_fpr[first]


def _brute_force_risk_coverage(u, correct):
    thresholds = np.unique(u)
    accepted = [u <= t for t in thresholds]
    coverage = np.array([a.mean() for a in accepted])
    risk = np.array([1 - correct[a].mean() for a in accepted])
    return coverage, risk, thresholds


# --------------------------------------------------------------------------------------------
# properties
# --------------------------------------------------------------------------------------------

_unit = st.floats(0.0, 1.0, allow_nan=False)
_coarse = st.integers(0, 4).map(lambda k: k / 4)  # ties and exact bin edges
_unit_or_coarse = st.one_of(_unit, _coarse)


@st.composite
def _scored(draw, max_size=40):
    n = draw(st.integers(1, max_size))
    values = np.array(draw(st.lists(_unit_or_coarse, min_size=n, max_size=n)))
    correct = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    return values, correct


_ood_pair = st.tuples(
    st.lists(_unit_or_coarse, min_size=1, max_size=30).map(np.array),
    st.lists(_unit_or_coarse, min_size=1, max_size=30).map(np.array),
)


@PROPS
@given(_scored(), st.integers(1, 20), st.sampled_from(["uniform", "quantile", "midpoint"]))
def test_calibration_bounds(data, n_bins, strategy):
    conf, correct = data
    ece = expected_calibration_error(conf, correct, n_bins=n_bins, strategy=strategy)
    mce = max_calibration_error(conf, correct, n_bins=n_bins, strategy=strategy)
    assert 0.0 <= ece <= mce + 1e-12 <= 1.0 + 1e-12
    curve = reliability_curve(conf, correct, n_bins=n_bins, strategy=strategy)
    assert curve.count.sum() == conf.size and np.all(np.diff(curve.edges) >= 0)


@PROPS
@given(_scored())
def test_selective_bounds_and_curve(data):
    u, correct = data
    assert 0.0 <= aurc(u, correct) <= 1.0
    assert 0.0 <= augrc(u, correct) <= 1.0
    assert 0.0 <= selective_accuracy(u, correct) <= 1.0
    cov, risk, thr = risk_coverage_curve(u, correct)
    ref = _brute_force_risk_coverage(u, correct)
    assert_allclose(cov, ref[0])
    assert_allclose(risk, ref[1])
    assert_array_equal(thr, ref[2])
    # at a point's coverage, selective accuracy is 1 - that point's risk (no partial tie group)
    assert selective_accuracy(u, correct, coverage=cov[0]) == pytest.approx(1 - risk[0])


@PROPS
@given(_ood_pair)
def test_ood_bounds_and_antisymmetry(pair):
    u_id, u_ood = pair
    auroc = ood_auroc(u_id, u_ood)
    assert 0.0 <= auroc <= 1.0
    assert auroc == pytest.approx(1.0 - ood_auroc(u_ood, u_id), abs=1e-12)
    assert 0.0 < aupr_out(u_id, u_ood) <= 1.0 and 0.0 < aupr_in(u_id, u_ood) <= 1.0
    assert 0.0 <= fpr_at_95_tpr(u_id, u_ood) <= 1.0


@PROPS
@given(_ood_pair)
def test_ood_metrics_match_sklearn_property(pair):
    u_id, u_ood = pair
    y = np.r_[np.zeros(u_id.size), np.ones(u_ood.size)]
    u = np.r_[u_id, u_ood]
    assert ood_auroc(u_id, u_ood) == pytest.approx(roc_auc_score(y, u), abs=1e-12)
    assert aupr_out(u_id, u_ood) == pytest.approx(average_precision_score(y, u), abs=1e-12)
    assert aupr_in(u_id, u_ood) == pytest.approx(average_precision_score(1 - y, -u), abs=1e-12)


@PROPS
@given(_ood_pair, st.floats(0.0, 2.0))
def test_ood_metrics_improve_when_ood_moves_up(pair, shift):
    u_id, u_ood = pair
    shifted = u_ood + shift  # OOD more uncertain: separation can only improve
    assert ood_auroc(u_id, shifted) >= ood_auroc(u_id, u_ood) - 1e-12
    assert aupr_out(u_id, shifted) >= aupr_out(u_id, u_ood) - 1e-12
    assert aupr_in(u_id, shifted) >= aupr_in(u_id, u_ood) - 1e-12
    assert fpr_at_95_tpr(u_id, shifted) <= fpr_at_95_tpr(u_id, u_ood) + 1e-12


@PROPS
@given(_scored(), _ood_pair, st.integers(0, 2**32 - 1))
def test_permutation_invariance(data, pair, seed):
    rng = np.random.default_rng(seed)
    u, correct = data
    p = rng.permutation(u.size)
    for metric in (aurc, e_aurc, augrc, selective_accuracy, expected_calibration_error,
                   max_calibration_error,
                   functools.partial(expected_calibration_error, strategy="quantile")):
        assert metric(u[p], correct[p]) == pytest.approx(metric(u, correct), abs=1e-12)
    u_id, u_ood = pair
    p_id, p_ood = rng.permutation(u_id.size), rng.permutation(u_ood.size)
    for ood_metric in (ood_auroc, aupr_out, aupr_in, fpr_at_95_tpr):
        assert ood_metric(u_id[p_id], u_ood[p_ood]) == pytest.approx(
            ood_metric(u_id, u_ood), abs=1e-12)


@PROPS
@given(_scored(), st.floats(0.0, 10.0))
def test_constant_uncertainty_gives_error_rate(data, value):
    _, correct = data
    u = np.full(correct.size, value)
    err = 1.0 - correct.mean()
    assert aurc(u, correct) == pytest.approx(err, abs=1e-12)
    assert augrc(u, correct) == pytest.approx(err / 2, abs=1e-12)
    assert selective_accuracy(u, correct, coverage=0.5) == pytest.approx(1 - err, abs=1e-12)


@PROPS
@given(st.integers(1, 40).flatmap(
    lambda n: st.tuples(st.permutations(range(n)),
                        st.lists(st.booleans(), min_size=n, max_size=n))))
def test_aurc_at_least_oracle_for_distinct_uncertainty(data):
    order, correct = data
    u, correct = np.array(order, float), np.array(correct)
    n = u.size
    oracle = np.where(correct, 0, n) + np.arange(n)  # all right ones first, distinct values
    assert aurc(u, correct) >= aurc(oracle, correct) - 1e-12
    # The closed-form optimum of e_aurc is the many-example limit of the oracle's AURC; on N
    # examples the oracle's trapezoid AURC lies below it by < 0.08 / N (worst case 1 right).
    assert e_aurc(u, correct) >= -0.08 / n
    assert e_aurc(oracle, correct) <= 1e-12


@PROPS
@given(_scored())
def test_augrc_at_least_oracle_even_with_ties(data):
    u, correct = data
    # Generalized risk is linear inside a tie group, so no plateau can beat e^2 / 2.
    err = 1.0 - correct.mean()
    assert augrc(u, correct) >= err**2 / 2 - 1e-12


def test_aurc_tie_plateau_cannot_beat_oracle():
    # Two wrong predictions tied at 1: every tie-break is the same ranking, so the tie costs
    # nothing, and AURC is the oracle's 5/18. (A straight line between the curve's points
    # (1/3, 0) and (1, 2/3) would give 2/9, below the oracle: the old trapezoid's bias.)
    assert aurc([0, 1, 1], [1, 0, 0]) == pytest.approx(5 / 18)
    assert aurc([0, 1, 2], [1, 0, 0]) == pytest.approx(5 / 18)
    assert e_aurc([0, 1, 1], [1, 0, 0]) == pytest.approx(e_aurc([0, 1, 2], [1, 0, 0]))


@PROPS
@given(_scored())
def test_aurc_at_least_oracle_even_with_ties(data):
    u, correct = data
    n = u.size
    oracle = np.where(correct, 0, n) + np.arange(n)
    assert aurc(u, correct) >= aurc(oracle, correct) - 1e-12
    assert e_aurc(u, correct) >= -0.08 / n


# --------------------------------------------------------------------------------------------
# ties: each ranking metric is its expectation over random tie-breaks (Monte Carlo check)
# --------------------------------------------------------------------------------------------


def _break_ties(u, rng):
    """Distinct scores ordering ``u`` with ties broken uniformly at random."""
    order = np.lexsort((rng.random(u.size), u))
    broken = np.empty(u.size)
    broken[order] = np.arange(u.size)
    return broken


def _tied_selective(seed, n=400, decimals=1):
    rng = np.random.default_rng(seed)
    u = rng.random(n)
    correct = rng.random(n) > 0.7 * u  # informative, so tie-breaks matter
    return np.round(u, decimals), correct


def _monte_carlo(metric, draw, k=2000, seed=0):
    rng = np.random.default_rng(seed)
    values = np.array([metric(*draw(rng)) for _ in range(k)])
    return values.mean(), values.std(ddof=1) / math.sqrt(k)


@pytest.mark.parametrize("seed, decimals", [(0, 1), (1, 1), (2, 0), (3, 2)])
@pytest.mark.parametrize("metric", [
    aurc, e_aurc, augrc, selective_accuracy,
    functools.partial(selective_accuracy, coverage=0.55), prediction_rejection_ratio,
    functools.partial(prediction_rejection_ratio, max_rejection=0.5), helm_selective_accuracy,
], ids=["aurc", "e_aurc", "augrc", "selacc80", "selacc55", "prr", "prr50", "helm_selacc10"])
def test_selective_metrics_are_the_expectation_over_random_tie_breaks(metric, seed, decimals):
    u, correct = _tied_selective(seed, decimals=decimals)
    mean, se = _monte_carlo(metric, lambda rng: (_break_ties(u, rng), correct), seed=seed)
    # 5 standard errors (a Monte Carlo miss 1 time in ~3.5 million), plus float slack
    assert metric(u, correct) == pytest.approx(mean, abs=5 * se + 1e-12)


def test_aurc_on_ties_is_no_longer_below_every_tie_break():
    # The case: scores rounded to one decimal; the old linear interpolation gave a value
    # below all 200 random tie-breaks.
    u, correct = _tied_selective(0)
    rng = np.random.default_rng(5)
    broken = [aurc(_break_ties(u, rng), correct) for _ in range(200)]
    assert min(broken) < aurc(u, correct) < max(broken)


@pytest.mark.parametrize("seed, decimals", [(0, 1), (1, 2)])
def test_ood_auroc_is_the_expectation_over_random_tie_breaks(seed, decimals):
    u_id, u_ood = _ood_sample(150, 90, seed=seed, decimals=decimals)

    def draw(rng):
        both = _break_ties(np.r_[u_id, u_ood], rng)  # ID and OOD ties broken together
        return both[:u_id.size], both[u_id.size:]

    mean, se = _monte_carlo(ood_auroc, draw, seed=seed)
    assert ood_auroc(u_id, u_ood) == pytest.approx(mean, abs=5 * se + 1e-12)


def test_ranking_metrics_on_untied_data_are_unchanged_by_tie_breaking():
    rng = np.random.default_rng(7)
    u, correct = rng.random(200), rng.random(200) > 0.3
    for metric in (aurc, e_aurc, augrc, selective_accuracy, prediction_rejection_ratio,
                   helm_selective_accuracy):
        assert metric(_break_ties(u, rng), correct) == pytest.approx(metric(u, correct),
                                                                     abs=1e-12)


# --------------------------------------------------------------------------------------------
# bad input
# --------------------------------------------------------------------------------------------

_NAN5 = [0.1, np.nan, 0.3, 0.4, 0.5]
_INF5 = [0.1, np.inf, 0.3, 0.4, 0.5]
_OK5 = [0.1, 0.2, 0.3, 0.4, 0.5]
_B5 = [1, 0, 1, 0, 1]
_ece, _rc = expected_calibration_error, reliability_curve

BAD_INPUT = [
    # (id, callable, args, kwargs, words the message must contain)
    ("conf-nan", _ece, (_NAN5, _B5), {}, "confidence must be finite"),
    ("conf-inf", _ece, (_INF5, _B5), {}, "confidence must be finite"),
    ("conf-2d", _ece, ([[0.1, 0.2]], [1]), {}, "confidence must be 1-D"),
    ("conf-scalar", _ece, (0.5, [1]), {}, "confidence must be 1-D"),
    ("conf-empty", _ece, ([], []), {}, "confidence must not be empty"),
    ("conf-above-1", _ece, ([0.1, 1.3], [1, 0]), {}, "confidence must lie in [0, 1]; got max 1.3"),
    ("conf-below-0", _ece, ([-0.1, 0.3], [1, 0]), {}, "confidence must lie in [0, 1]; got min"),
    ("conf-strings", _ece, (["a", "b"], [1, 0]), {}, "confidence must be a real numeric"),
    ("conf-length", _ece, (_OK5, [1, 0]), {}, "confidence and correct must have the same length"),
    ("correct-2", _ece, (_OK5, [1, 0, 2, 0, 1]), {}, "correct must be boolean or 0/1"),
    ("correct-nan", _ece, (_OK5, [1, 0, np.nan, 0, 1]), {}, "correct must be finite"),
    ("correct-2d", _ece, (_OK5, [_B5]), {}, "correct must be 1-D"),
    ("n-bins-0", _rc, (_OK5, _B5), {"n_bins": 0}, "n_bins must be a positive integer"),
    ("n-bins-float", _rc, (_OK5, _B5), {"n_bins": 2.5}, "n_bins must be a positive integer"),
    ("strategy", _rc, (_OK5, _B5), {"strategy": "adaptive"},
     "strategy must be 'uniform', 'quantile' or 'midpoint'"),
    ("mce-nan", max_calibration_error, (_NAN5, _B5), {}, "confidence must be finite"),
    ("probs-1d", brier_score, (_OK5, [0] * 5), {}, "probs must be 2-D"),
    ("probs-nan", brier_score, ([[0.5, np.nan]], [0]), {}, "probs must be finite"),
    ("probs-above-1", brier_score, ([[1.5, -0.5]], [0]), {}, "probs must lie in [0, 1]"),
    ("probs-rowsum", brier_score, ([[0.5, 0.9]], [0]), {}, "probs rows must sum to 1"),
    ("probs-empty", brier_score, (np.zeros((0, 3)), []), {}, "probs must not be empty"),
    ("labels-range", brier_score, ([[0.5, 0.5]], [2]), {}, "labels must be class indices"),
    ("labels-neg", negative_log_likelihood, ([[0.5, 0.5]], [-1]), {}, "labels must be class"),
    ("labels-frac", negative_log_likelihood, ([[0.5, 0.5]], [0.5]), {}, "labels must be integer"),
    ("labels-length", negative_log_likelihood, ([[0.5, 0.5]], [0, 1]), {},
     "probs and labels must have the same length"),
    ("ood-id-empty", ood_auroc, ([], [0.1]), {}, "uncertainty_id must not be empty"),
    ("ood-ood-empty", aupr_out, ([0.1], []), {}, "uncertainty_ood must not be empty"),
    ("ood-ood-nan", aupr_in, ([0.1], [np.nan]), {}, "uncertainty_ood must be finite"),
    ("ood-id-2d", fpr_at_95_tpr, ([[0.1]], [0.2]), {}, "uncertainty_id must be 1-D"),
    ("roc-inf", ood_roc_curve, ([0.1, np.inf], [0.2]), {}, "uncertainty_id must be finite"),
    ("rc-inf", risk_coverage_curve, (_INF5, _B5), {}, "uncertainty must be finite"),
    ("aurc-length", aurc, (_OK5, [1, 0]), {}, "uncertainty and correct must have the same"),
    ("eaurc-correct", e_aurc, (_OK5, [1, 0, 3, 0, 1]), {}, "correct must be boolean or 0/1"),
    ("augrc-empty", augrc, ([], []), {}, "uncertainty must not be empty"),
    ("selacc-cov-0", selective_accuracy, (_OK5, _B5), {"coverage": 0.0}, "coverage must be"),
    ("selacc-cov-big", selective_accuracy, (_OK5, _B5), {"coverage": 1.5}, "coverage must be"),
    ("selacc-cov-nan", selective_accuracy, (_OK5, _B5), {"coverage": np.nan}, "coverage must"),
    ("mean-std-empty", mean_std, ([],), {}, "values must not be empty"),
    ("mean-std-2d", mean_std, ([[0.1]],), {}, "values must be 1-D"),
    ("mean-std-inf", mean_std, ([0.1, np.inf],), {}, "values must be finite"),
    ("boot-length", bootstrap_ci, (aurc, _OK5, [1, 0]), {}, "bootstrap_ci_two_sample"),
    ("boot-none", bootstrap_ci, (aurc,), {}, "at least one array"),
    ("boot-empty", bootstrap_ci, (aurc, [], []), {}, "arrays[0] must not be empty"),
    ("boot-level", bootstrap_ci, (aurc, _OK5, _B5), {"level": 1.0}, "level must be a"),
    ("boot-n", bootstrap_ci, (aurc, _OK5, _B5), {"n_resamples": 0}, "n_resamples must be"),
    ("boot2-empty", bootstrap_ci_two_sample, (ood_auroc, [0.1], []), {}, "b must not be empty"),
]


@pytest.mark.parametrize(("fn", "args", "kwargs", "message"),
                         [case[1:] for case in BAD_INPUT], ids=[case[0] for case in BAD_INPUT])
def test_bad_input_raises_value_error_naming_the_argument(fn, args, kwargs, message):
    with pytest.raises(ValueError) as info:
        fn(*args, **kwargs)
    assert message in str(info.value)


def test_single_class_correct_is_fine_for_selective_metrics():
    # Not degenerate: all right gives zero risk, all wrong full risk, no warning.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert aurc(_OK5, [1] * 5) == 0.0
        assert augrc(_OK5, [0] * 5) == 0.5
        assert expected_calibration_error(_OK5, [1] * 5) == pytest.approx(0.7)  # 1 - mean .3


# --------------------------------------------------------------------------------------------
# bootstrap
# --------------------------------------------------------------------------------------------


def _probs_sample(n, seed):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(n, 3)) * 2
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    labels = np.array([rng.choice(3, p=p) for p in probs])
    return probs, labels


def test_bootstrap_is_deterministic_given_seed():
    probs, labels = _probs_sample(200, seed=0)
    first = bootstrap_ci(brier_score, probs, labels, n_resamples=100, seed=3)
    assert first == bootstrap_ci(brier_score, probs, labels, n_resamples=100, seed=3)
    assert first != bootstrap_ci(brier_score, probs, labels, n_resamples=100, seed=4)
    assert first[0] == brier_score(probs, labels)


def test_bootstrap_of_several_statistics_is_each_statistics_own_bootstrap():
    # selective_summary's five values, and one interval per value from the same resamples:
    # equal to five separate bootstraps of the five metrics with the same seed.
    rng = np.random.default_rng(5)
    u = np.round(rng.random(300), 2)  # ties
    ok = rng.random(300) < 0.6
    each = (aurc, augrc, functools.partial(selective_accuracy, coverage=0.7),
            prediction_rejection_ratio, helm_selective_accuracy)
    assert_array_equal(selective_summary(u, ok, coverage=0.7), [fn(u, ok) for fn in each])
    point, low, high = bootstrap_ci(functools.partial(selective_summary, coverage=0.7), u, ok,
                                    n_resamples=200, seed=2)
    for k, fn in enumerate(each):
        assert (point[k], low[k], high[k]) == bootstrap_ci(fn, u, ok, n_resamples=200, seed=2)
    assert np.all(low < high)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 60), st.integers(1, 40),
       st.sampled_from([0, 1, 3]))
def test_resampled_ranking_metrics_equal_resorting_every_resample(seed, n_id, n_ood, decimals):
    # A Resampled metric counts the full data's tie groups in each resample instead of sorting
    # it: the intervals must be bitwise those of the plain metric on the same draws, ties
    # (rounded keys), one-example splits and a single class included.
    u_id, u_ood = _ood_sample(n_id, n_ood, seed=seed % 1000, decimals=decimals)
    ok = np.random.default_rng(seed).random(n_id) < 0.5
    fast_auroc = metrics.Resampled(ood_auroc, metrics.auroc_resampler)
    assert (bootstrap_ci_two_sample(fast_auroc, u_id, u_ood, n_resamples=30, seed=seed)
            == bootstrap_ci_two_sample(ood_auroc, u_id, u_ood, n_resamples=30, seed=seed))
    fast = metrics.resampled_selective_summary(0.7)
    plain = functools.partial(selective_summary, coverage=0.7)
    for a, b in zip(bootstrap_ci(fast, u_id, ok, n_resamples=30, seed=seed),
                    bootstrap_ci(plain, u_id, ok, n_resamples=30, seed=seed), strict=False):
        assert_array_equal(a, b)


def test_resampled_metric_is_the_metric_on_the_full_data():
    u_id, u_ood = _ood_sample(40, 30, seed=1, decimals=1)
    fast_auroc = metrics.Resampled(ood_auroc, metrics.auroc_resampler)
    assert fast_auroc(u_id, u_ood) == ood_auroc(u_id, u_ood) == roc_auc_score(
        np.r_[np.zeros(40), np.ones(30)], np.r_[u_id, u_ood])
    # the resampler on the identity resample is the metric itself
    stat = metrics.auroc_resampler(u_id, u_ood)
    assert stat(np.arange(40), np.arange(30)) == ood_auroc(u_id, u_ood)
    # and on a hand-made resample: id [0.1, 0.1], ood [0.9]: every pair a win
    stat = metrics.auroc_resampler([0.1, 0.5], [0.9, 0.5])
    assert stat(np.array([0, 0]), np.array([0])) == 1.0
    assert stat(np.array([1, 1]), np.array([1, 1])) == 0.5  # all tied: half credit


def test_bootstrap_interval_contains_point_and_shrinks_with_n():
    widths = []
    for n in (100, 2000):
        probs, labels = _probs_sample(n, seed=1)
        point, low, high = bootstrap_ci(brier_score, probs, labels, n_resamples=200)
        assert low <= point <= high
        widths.append(high - low)
    # width ~ 1/sqrt(n): a 20x larger sample gives a ~4.5x narrower interval
    assert widths[1] < 0.5 * widths[0]


def test_bootstrap_resamples_examples_jointly():
    x = np.arange(50.0)
    # pairs stay pairs in every resample, so this metric is 1 on each of them
    assert bootstrap_ci(lambda a, b: float(np.all(a == b)), x, x.copy(),
                        n_resamples=50) == (1.0, 1.0, 1.0)


def test_bootstrap_two_sample_keeps_lengths_and_covers_point():
    u_id, u_ood = _ood_sample(120, 45, seed=2, decimals=2)
    assert bootstrap_ci_two_sample(lambda a, b: float(len(a) * 1000 + len(b)), u_id, u_ood,
                                   n_resamples=20) == (120045.0, 120045.0, 120045.0)
    result = bootstrap_ci_two_sample(ood_auroc, u_id, u_ood, n_resamples=200, seed=5)
    assert result == bootstrap_ci_two_sample(ood_auroc, u_id, u_ood, n_resamples=200, seed=5)
    point, low, high = result
    assert point == ood_auroc(u_id, u_ood) and low <= point <= high < 1.0


def _needs_both_classes(correct):
    # a stand-in for an AUROC-type metric: undefined (NaN, with a warning) on one class
    if correct.all() or not correct.any():
        warnings.warn("single class", UndefinedMetricWarning, stacklevel=2)
        return math.nan
    return float(correct.mean())


def test_bootstrap_drops_nan_resamples_and_warns():
    correct = np.array([1, 1, 1, 1, 0], bool)  # all-right resamples: (4/5)^5 = 33%
    with pytest.warns(UndefinedMetricWarning, match="resamples gave NaN") as record:
        point, low, high = bootstrap_ci(_needs_both_classes, correct, n_resamples=200)
    assert len(record) == 1  # one summary, not one per resample
    assert point == 0.8 and 0.0 < low <= high < 1.0


def test_bootstrap_nan_point_returns_nan_interval():
    with pytest.warns(UndefinedMetricWarning):
        point, low, high = bootstrap_ci(_needs_both_classes, np.ones(5, bool), n_resamples=10)
    assert math.isnan(point) and math.isnan(low) and math.isnan(high)


def test_bootstrap_propagates_metric_errors():
    def fails_on_resamples(x):
        if not np.array_equal(x, np.arange(5)):
            raise RuntimeError("boom")
        return 0.0

    with pytest.raises(RuntimeError, match="boom"):
        bootstrap_ci(fails_on_resamples, np.arange(5), n_resamples=10)


# --------------------------------------------------------------------------------------------
# paired differences (uqbench compare, by hand on 5 examples)
# --------------------------------------------------------------------------------------------
def test_paired_difference_resamples_the_same_examples_on_both_sides():
    from uqbench.stats.metrics import paired_difference

    a = np.array([0.1, 0.5, 0.2, 0.9, 0.3])
    d, lo, hi = paired_difference(np.mean, [a], [a + 0.1], n_resamples=300)
    # paired: every resample moves both sides alike, so the difference is 0.1 in each of them
    assert d == pytest.approx(0.1) and lo == pytest.approx(0.1) and hi == pytest.approx(0.1)
    # accuracy 0.6 -> 0.8, b right wherever a is: no resample can favour a
    d, lo, hi = paired_difference(np.mean, [[1, 0, 1, 0, 1]], [[1, 1, 1, 0, 1]], n_resamples=300)
    assert d == pytest.approx(0.2) and 0.0 <= lo < d < hi <= 1.0
    assert paired_difference(np.mean, [a], [a], n_resamples=50) == (0.0, 0.0, 0.0)


@pytest.mark.parametrize("sizes", [(5,), (7, 3), (301, 257), (1, 4, 2)])
def test_resample_indices_are_the_draws_of_one_call_per_resample_and_set(sizes):
    # the bootstraps draw a chunk of resamples in one call: the indices must be those of
    # drawing each resample's sets in turn, and leave the generator where those calls leave it
    from uqbench.stats.metrics.bootstrap import draw_indices

    got_rng, want_rng = np.random.default_rng(5), np.random.default_rng(5)
    for k in (1, 6, 2):
        got = draw_indices(got_rng, sizes, k)
        want = [[want_rng.integers(0, n, size=n) for n in sizes] for _ in range(k)]
        assert [g.shape for g in got] == [(k, n) for n in sizes]
        for j in range(len(sizes)):
            np.testing.assert_array_equal(got[j], np.stack([row[j] for row in want]))
    assert got_rng.integers(0, 2**62) == want_rng.integers(0, 2**62)


@pytest.mark.parametrize("memo", [0, 1 << 20])   # drawn chunk by chunk; drawn once and kept
def test_index_chunks_are_the_draws_of_one_generator_kept_or_not(memo, monkeypatch):
    from uqbench.stats.metrics import bootstrap
    from uqbench.stats.metrics.bootstrap import draw_indices, index_chunks

    monkeypatch.setattr(bootstrap, "MEMO_ELEMENTS", memo)
    monkeypatch.setattr(bootstrap, "DRAWN", type(bootstrap.DRAWN)())
    sizes, n, chunk = (37, 11), 23, 5
    want = draw_indices(np.random.default_rng(9), sizes, n)
    for _ in range(2):   # the second time from the memo, where it is kept
        got = list(index_chunks(9, sizes, n, chunk))
        assert [len(c[0]) for c in got] == [5, 5, 5, 5, 3]
        for j in range(len(sizes)):
            np.testing.assert_array_equal(np.concatenate([c[j] for c in got]), want[j])
    assert len(bootstrap.DRAWN) == (1 if memo else 0)
    if memo:
        with pytest.raises(ValueError, match="read-only"):
            got[0][0][0, 0] = 1   # kept indices cannot be changed by a caller
        # other draws push the oldest out: what is kept stays within the budget
        monkeypatch.setattr(bootstrap, "MEMO_ELEMENTS", 2 * 10 * 40)
        for seed in range(3):
            list(index_chunks(seed, (40,), 10, 4))
        assert list(bootstrap.DRAWN) == [(1, (40,), 10), (2, (40,), 10)]


def test_paired_difference_two_sample_and_bad_input():
    from uqbench.stats.metrics import paired_difference

    u_id = np.array([0.1, 0.4, 0.35, 0.8, 0.2])
    u_sh = np.array([0.3, 0.9, 0.5, 0.7, 0.6])
    # by hand: shifted above ID in 2 + 5 + 4 + 4 + 4 = 19 of 25 pairs; b separates perfectly
    d, lo, hi = paired_difference(ood_auroc, [u_id, u_sh], [u_id, u_sh + 10], two_sample=True,
                                  n_resamples=300)
    assert d == pytest.approx(1 - 19 / 25) and 0.0 <= lo <= d <= hi
    with pytest.raises(ValueError, match="same examples"):
        paired_difference(np.mean, [u_id], [u_id[:4]])
    with pytest.raises(ValueError, match="two_sample needs two arrays"):
        paired_difference(np.mean, [u_id], [u_id], two_sample=True)


def test_brier_does_not_depend_on_the_blas_thread_count() -> None:
    """A BLAS dot splits its reduction over threads (other last bits at another thread count:
    results.csv would depend on the machine's cores); the pairwise sum does not."""
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(0)
    p, y = rng.dirichlet(np.ones(4), 400_000), rng.integers(0, 4, 400_000)
    values = []
    for threads in (1, 2):
        with threadpool_limits(threads):
            values.append(metrics.brier_score(p, y))
    assert values[0] == values[1]


# --------------------------------------------------------------------------------------------
# Columns others report: LM-Polygraph's PRR, HELM's ece_10_bin and selective_acc@10, checked
# against their own code, vendored here because the packages are not installed.
#
# LM-Polygraph, github.com/IINemo/lm-polygraph at efea882d (MIT License, Copyright (c) 2023
# MBZUAI): src/lm_polygraph/ue_metrics/pred_rej_area.py (PredictionRejectionArea.__call__) and
# ue_metric.py (normalize, get_random_scores, normalize_metric); utils/manager.py reports
# prr_normalized = normalize_metric(prr(ue, metric), prr(-metric, metric),
# get_random_scores(prr, metric)).

def _lmpg_normalize(target):
    min_t, max_t = np.min(target), np.max(target)
    if np.isclose(min_t, max_t):
        min_t -= 1
        max_t += 1
    target = (np.array(target) - min_t) / (max_t - min_t)
    return target


def _lmpg_prr(estimator, target, max_rejection=1.0):
    target = _lmpg_normalize(target)
    ue = np.array(estimator)
    num_obs = len(ue)
    num_rej = int(max_rejection * num_obs)
    ue_argsort = np.argsort(ue)
    sorted_metrics = np.array(target)[ue_argsort]
    cumsum = np.cumsum(sorted_metrics)[-num_rej:]
    scores = (cumsum / np.arange((num_obs - num_rej) + 1, num_obs + 1))[::-1]
    prr_score = np.sum(scores) / num_rej
    return prr_score


def _lmpg_get_random_scores(function, metrics, num_iter=1000, seed=42):
    np.random.seed(seed)
    rand_scores = np.arange(len(metrics))
    value = []
    for _i in range(num_iter):
        np.random.shuffle(rand_scores)
        rand_val = function(rand_scores, metrics)
        value.append(rand_val)
    return np.mean(value)


def _lmpg_normalize_metric(target_score, oracle_score, random_score):
    if not (oracle_score == random_score):  # noqa: SIM201 (verbatim)
        target_score = (target_score - random_score) / (oracle_score - random_score)
    return target_score


# uncertainty-calibration 0.1.4, github.com/p-lambda/verified_calibration at ee81c346 (MIT
# License, Copyright (c) 2019 Ananya Kumar), calibration/utils.py: what HELM calls
# (src/helm/benchmark/metrics/basic_metrics.py, compute_calibration_metrics: ece_10_bin =
# cal.get_ece_em(max_probs, correct, num_bins=10); selective_acc@10 =
# cal.get_selective_stats(max_probs, correct)[1]). get_ece_em with 1-D probs is
# _get_ce -> ce_1d -> plugin_ce(bin(data, get_equal_bins(probs, num_bins)), power=1).

def _cal_split(sequence, parts):
    assert parts <= len(sequence)
    array_splits = np.array_split(sequence, parts)
    splits = [list(part) for part in array_splits]
    assert len(splits) == parts
    return splits


def _cal_get_equal_bins(probs, num_bins=10):
    sorted_probs = sorted(probs)
    num_bins = min(num_bins, len(sorted_probs))
    binned_data = _cal_split(sorted_probs, num_bins)
    bins = []
    for i in range(len(binned_data) - 1):
        last_prob = binned_data[i][-1]
        next_first_prob = binned_data[i + 1][0]
        bins.append((last_prob + next_first_prob) / 2.0)
    bins.append(1.0)
    bins = sorted(list(set(bins)))  # noqa: C414 (verbatim)
    return bins


def _cal_fast_bin(data, bins):
    prob_label = np.array(data)
    bin_indices = np.searchsorted(bins, prob_label[:, 0])
    bin_sort_indices = np.argsort(bin_indices)
    sorted_bins = bin_indices[bin_sort_indices]
    splits = np.searchsorted(sorted_bins, list(range(1, len(bins))))
    binned_data = np.split(prob_label[bin_sort_indices], splits)
    return binned_data


def _cal_plugin_ce(binned_data, power=2):
    def bin_error(data):
        if len(data) == 0:
            return 0.0
        data = np.array(data)
        return abs(np.mean(data[:, 0]) - np.mean(data[:, 1])) ** power  # difference_mean
    bin_sizes = list(map(len, binned_data))
    bin_probs = [b * 1.0 / sum(bin_sizes) for b in bin_sizes]  # get_bin_probs
    bin_errors = list(map(bin_error, binned_data))
    return np.dot(bin_probs, bin_errors) ** (1.0 / power)


def _cal_get_ece_em(probs, labels, num_bins=15):
    probs, labels = np.array(probs), np.array(labels)
    data = list(zip(probs, labels, strict=False))
    return _cal_plugin_ce(_cal_fast_bin(data, _cal_get_equal_bins(probs, num_bins=num_bins)),
                          power=1)


def _cal_get_selective_stats(probs, correct):
    probs = np.array(probs)
    correct = np.array(correct)
    sort_indices = np.argsort(-probs)
    sorted_correct = correct[sort_indices]
    accs = np.cumsum(sorted_correct) / np.arange(1, len(sorted_correct) + 1)
    coverage_acc_area = np.mean(accs)
    acc_percentile_90 = accs[int(0.1 * len(sorted_correct))]
    return coverage_acc_area, acc_percentile_90


def _untied(n, seed):
    """Distinct confidences in (0, 1) and correctness that follows them."""
    rng = np.random.default_rng(seed)
    conf = rng.permutation(np.linspace(0.2, 0.99, n))
    return conf, (rng.random(n) < conf).astype(int)


def test_prr_by_hand():
    # U_SEL / C_SEL: E[r_k] = (0, 0, 1/6, 1/4, 2/5) (the tie at 0.5 in expectation), mean
    # 49/300; e = 0.4; the oracle accepts the 3 correct first: (0, 0, 0, 1/4, 2/5), mean 0.13
    assert prediction_rejection_ratio(U_SEL, C_SEL) == pytest.approx(
        (0.4 - 49 / 300) / (0.4 - 0.13), abs=1e-12)
    # max_rejection 0.6: the last int(3.0) = 3 points, k = 3, 4, 5
    assert prediction_rejection_ratio(U_SEL, C_SEL, max_rejection=0.6) == pytest.approx(
        (0.4 - (1 / 6 + 1 / 4 + 2 / 5) / 3) / (0.4 - (1 / 4 + 2 / 5) / 3), abs=1e-12)
    assert prediction_rejection_ratio(np.full(5, 0.3), C_SEL) == pytest.approx(0.0, abs=1e-12)
    for degenerate in ([1] * 5, [0] * 5):
        with pytest.warns(UndefinedMetricWarning, match="every prediction is right"):
            assert math.isnan(prediction_rejection_ratio(U_SEL, degenerate))
    with pytest.warns(UndefinedMetricWarning, match="only 1 point"):
        assert math.isnan(prediction_rejection_ratio(U_SEL, C_SEL, max_rejection=0.2))
    with pytest.raises(ValueError, match=r"max_rejection must be a number in \(0, 1\]"):
        prediction_rejection_ratio(U_SEL, C_SEL, max_rejection=0.0)


@pytest.mark.parametrize("n, max_rejection", [(7, 1.0), (60, 1.0), (333, 1.0), (333, 0.5),
                                              (101, 0.37)])
def test_prr_is_lm_polygraphs(n, max_rejection):
    conf, correct = _untied(n, seed=n)
    u = 1.0 - conf + np.random.default_rng(n).normal(0, 0.2, n)  # an imperfect ranking
    prr = functools.partial(_lmpg_prr, max_rejection=max_rejection)
    ours = prediction_rejection_ratio(u, correct, max_rejection=max_rejection)
    oracle = prr(-correct, correct)
    # with the exact random baseline (1 - error rate): equal up to float rounding
    assert ours == pytest.approx(_lmpg_normalize_metric(prr(u, correct), oracle, correct.mean()),
                                 abs=1e-12)
    # with LM-Polygraph's own Monte Carlo baseline (1000 seeded permutations): its error only
    reported = _lmpg_normalize_metric(prr(u, correct), oracle,
                                      _lmpg_get_random_scores(prr, correct))
    assert ours == pytest.approx(reported, abs=0.01)


def test_ece_10_mass_by_hand():
    # 2 runs of the sorted CONF: (.1, .3, .55), (.8, .95) -> edge (.55 + .8) / 2 = .675;
    # 3/5 |1/3 - .31667| + 2/5 |1/2 - .875| = .01 + .15
    curve = reliability_curve(CONF, CORRECT, n_bins=2, strategy="midpoint")
    assert_allclose(curve.edges, [0, 0.675, 1])
    assert expected_calibration_error(CONF, CORRECT, n_bins=2, strategy="midpoint") == \
        pytest.approx(0.16, abs=1e-12)
    # fewer confidences than bins: one bin per confidence, the bins above them empty
    curve = reliability_curve([0.9, 0.2, 0.6], [1, 0, 0], n_bins=10, strategy="midpoint")
    assert_allclose(curve.edges, [0, 0.4, 0.75] + [1] * 8)
    assert curve.count.tolist() == [1, 1, 1] + [0] * 7


@pytest.mark.parametrize("n, decimals", [(3, None), (10, None), (57, None), (300, None),
                                         (300, 2), (1000, 1)])
def test_ece_10_mass_is_helms_ece_10_bin(n, decimals):
    conf, correct = _untied(n, seed=n)
    if decimals is not None:  # ties, across the cuts between runs too
        conf = np.round(conf, decimals)
    ours = expected_calibration_error(conf, correct, n_bins=10, strategy="midpoint")
    assert ours == pytest.approx(_cal_get_ece_em(conf, correct, num_bins=10), abs=1e-12)


def test_helm_selective_accuracy_by_hand():
    # N = 100: int(0.1 * 100) + 1 = 11 most confident, HELM's accs[10]; 8 of them right
    u = np.arange(100) / 100
    correct = np.r_[[1, 1, 0, 1, 1, 1, 0, 1, 1, 1, 0], np.ones(89)]
    assert helm_selective_accuracy(u, correct) == pytest.approx(8 / 11)
    assert selective_accuracy(u, correct, coverage=0.1) == pytest.approx(8 / 10)  # ceil: 10
    assert helm_selective_accuracy(U_SEL, C_SEL) == 1.0  # N = 5: the single least uncertain
    with pytest.raises(ValueError, match=r"fraction must be a number in \(0, 1\)"):
        helm_selective_accuracy(U_SEL, C_SEL, fraction=1.0)


@pytest.mark.parametrize("n", [1, 5, 9, 10, 30, 70, 101, 1000])
def test_sel_acc_10_is_helms_selective_acc_at_10(n):
    conf, correct = _untied(n, seed=n)
    assert helm_selective_accuracy(1.0 - conf, correct) == pytest.approx(
        _cal_get_selective_stats(conf, correct)[1], abs=1e-12)


def test_a_side_resampled_once_pairs_bit_for_bit_as_paired_difference():
    # model tables compare every model with the best: the best side is resampled once
    # (resample_side) and paired with each other side, bit for bit paired_difference's result
    from uqbench.stats import metrics as M

    rng = np.random.default_rng(2)
    ok = rng.random((40, 2)) < 0.6
    u, *others = (rng.random((40, 2)).round(1) for _ in range(3))
    sh = rng.random((25, 2))
    auroc = M.Resampled(M.ood_auroc, M.auroc_resampler)
    for metric, side, two in ((M.resampled_selective_accuracy(0.8), [u, ok], False),
                              (np.mean, [u], False), (auroc, [u, sh], True)):
        f = M.seed_mean(metric)
        base = M.resample_side(f, side, two_sample=two, n_resamples=80, seed=1)
        for o in others:
            mine = [o, *side[1:]]
            got = M.paired_interval(base, M.resample_side(f, mine, two_sample=two,
                                                          n_resamples=80, seed=1))
            assert got == M.paired_difference(f, side, mine, two_sample=two, n_resamples=80,
                                              seed=1)
    with pytest.raises(ValueError, match="resamples of the same examples"):
        M.paired_interval(base, M.resample_side(np.mean, [u[:30]], n_resamples=80, seed=1))
