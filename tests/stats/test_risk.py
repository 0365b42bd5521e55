"""Selective risk control (`uqbench.stats.risk`): hand-worked values, bad input, and the same
p-values and Learn-then-Test decisions as MAPIE's risk control where the definitions match
(a binary loss, the precision risk of the accepted questions, fixed sequence testing)."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binom

from uqbench.core.errors import NotReachable
from uqbench.stats import risk as R
from uqbench.stats.conformal import resample_counts


def test_bounds_and_fixed_sequence_by_hand() -> None:
    assert float(R.binomial_p_value(0, 10, 0.2)) == pytest.approx(0.8 ** 10)
    # 1 error of 4: P(Bin(4, .5) <= 1) = (1 + 4) / 16
    assert float(R.binomial_p_value(1, 4, 0.5)) == pytest.approx(5 / 16)
    assert R.clopper_pearson_upper(0, 10, 0.1) == pytest.approx(1 - 0.1 ** 0.1)
    ub = R.clopper_pearson_upper(3, 20, 0.1)  # the bound is where the p-value equals delta
    assert binom.cdf(3, 20, ub) == pytest.approx(0.1)
    assert R.clopper_pearson_upper(5, 5) == 1.0
    assert R.fixed_sequence([0.01, 0.05, 0.2, 0.01], 0.1) == 2
    assert R.fixed_sequence([0.5], 0.1) == 0 and R.fixed_sequence([0.0, 0.1], 0.1) == 2


def test_ltt_threshold_by_hand() -> None:
    # 20 calib questions, uncertainty i/20; the first 10 right, then alternating wrong/right.
    u = np.arange(20) / 20
    correct = np.r_[np.ones(10), np.tile([0, 1], 5)]
    # grid 10%, 20%, ..., 100% (our default has 5% steps; a coarser one is easier by hand):
    # accepted 2, 4, ..., 20; errors 0 (first 10), then 1, 1, 2, 2, ... at 12, 14, 16...
    grid = tuple(np.arange(1, 11) / 10)
    # target 0.5, delta 0.1: p = 0.5^n for errors 0: n = 2 -> 0.25 > 0.1: not reachable
    with pytest.raises(NotReachable, match="most confident 2 of 20 calib questions have 0 "
                                             "errors, an upper bound of 0.684"):
        R.ltt_threshold(u, correct, 0.5, delta=0.1, grid=grid)
    # delta 0.3: n=2 p=.25 ok, n=4 .0625, ... n=12 e=1: 13/4096 ok ... n=20 e=5: P(Bin(20,.5)<=5)
    # = 0.0207 ok -> full coverage certified
    t = R.ltt_threshold(u, correct, 0.5, delta=0.3, grid=grid)
    assert (t.n_accepted, t.errors, t.calib_coverage) == (20, 5, 1.0)
    # target 0.2, delta 0.3: n=2: 0.8^2=.64 > .3 -> not reachable; n_acc 6, 8 pass when first
    g2 = (0.4, 0.5, 0.6, 0.8)  # 8 (p=.168), 10 (.107), 12 e=1 (.275), 16 e=3 (.598 stop)
    t = R.ltt_threshold(u, correct, 0.2, delta=0.3, grid=g2)
    assert (t.n_accepted, t.errors, t.threshold) == (12, 1, pytest.approx(0.55))
    # selective risk on a test split, plus bootstrap resamples
    assert R.selective_risk([1, 1, 1, 0], [1, 0, 1, 0]) == pytest.approx(1 / 3)
    assert math.isnan(R.selective_risk([0, 0], [1, 0]))
    counts = resample_counts(np.array([[0, 0, 0], [1, 1, 2]]), 3)
    np.testing.assert_allclose(R.selective_risk([1, 1, 0], [1, 0, 1], counts), [0.0, 1.0])


def test_bad_targets_are_clear_errors() -> None:
    for bad in (0.0, 1.0, 1.2):
        with pytest.raises(ValueError, match="outside \\(0, 1\\)"):
            R.ltt_threshold([0.1, 0.2], [1, 0], bad)
    with pytest.raises(ValueError, match="delta"):
        R.ltt_threshold([0.1, 0.2], [1, 0], 0.5, delta=1.0)


def test_p_values_and_ltt_decisions_equal_mapies() -> None:
    pytest.importorskip("mapie", reason="MAPIE is a test dependency: pip install -e '.[test]'")
    from mapie.risk_control._base_controller import ltt_procedure
    from mapie.risk_control.methods import compute_hoeffding_bentkus_p_value

    rng = np.random.default_rng(1)
    n = 400
    u = rng.random(n)
    correct = rng.random(n) > 0.15 + 0.7 * u  # error rate grows with the uncertainty
    target, delta = 0.3, R.DELTA
    srt = np.sort(u)
    thr = [srt[round(c * n) - 1] for c in R.COVERAGE_GRID]
    n_acc = np.array([(u <= t).sum() for t in thr])
    err = np.array([((u <= t) & ~correct).sum() for t in thr])
    # MAPIE counts the errors as ceil(n * r_hat), where 100 * (14 / 100) rounds up to 15: a
    # hair below r_hat gives it the exact counts
    r_hat = (err - 1e-9) / n_acc
    assert np.array_equal(np.ceil(n_acc * r_hat), err)
    ours = R.binomial_p_value(err, n_acc, target)
    theirs = compute_hoeffding_bentkus_p_value(r_hat, n_acc, target, binary=True)[:, 0]
    np.testing.assert_allclose(ours, theirs, rtol=1e-6)  # binary: Bentkus = exact binomial
    # risk rising along the grid on average: MAPIE tests in the grid's order, as we do (it
    # warns that the risk is not monotone at the first few thresholds)
    assert np.mean(np.diff(r_hat)) > 0
    with pytest.warns(UserWarning, match="monotonic"):
        valid, _ = ltt_procedure(r_hat[None], np.array([[target]]), delta, n_acc[None],
                                 binary=True, fwer_method="fixed_sequence")
    k = R.fixed_sequence(ours, delta)
    assert 0 < k < len(R.COVERAGE_GRID)  # a real decision: some certified, some not
    assert sorted(valid[0]) == list(range(k))
    t = R.ltt_threshold(u, correct, target)
    assert t.threshold == thr[k - 1] and t.n_accepted == n_acc[k - 1]
