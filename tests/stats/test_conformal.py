"""Split conformal sets (`uqbench.stats.conformal`): hand-worked values, bad input, and the same q̂,
sets, coverage, set size and size-stratified coverage as MAPIE on the same probabilities."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from uqbench.core.errors import NotReachable
from uqbench.stats import conformal as C

P = np.array([[0.5, 0.3, 0.2], [0.1, 0.6, 0.3], [0.25, 0.25, 0.5]])


def test_scores_by_hand() -> None:
    np.testing.assert_allclose(C.SCORES["lac"].scores(P), 1 - P)
    # strict APS, u = 0: the mass ranked above each option (ties keep index order)
    np.testing.assert_allclose(C.SCORES["aps_strict"].scores(P),
                               [[0, 0.5, 0.8], [0.9, 0, 0.6], [0.5, 0.75, 0]])
    # APS: calibrated on the mass ranked at or above the option, its own included
    np.testing.assert_allclose(C.SCORES["aps"].scores(P),
                               [[0.5, 0.8, 1.0], [1.0, 0.6, 0.9], [0.75, 1.0, 0.5]])
    u = np.array([0.5, 0.0, 1.0])
    np.testing.assert_allclose(C.SCORES["aps_rand"].scores(P, u),
                               [[0.25, 0.65, 0.9], [0.9, 0, 0.6], [0.75, 1.0, 0.5]])
    # RAPS: + 0.1 * (rank - 1)+ (ranks [1, 2, 3], [3, 1, 2], [2, 3, 1]), to aps and aps_strict
    np.testing.assert_allclose(C.SCORES["raps"].scores(P),
                               [[0.5, 0.9, 1.2], [1.2, 0.6, 1.0], [0.85, 1.2, 0.5]])
    np.testing.assert_allclose(C.SCORES["raps_strict"].scores(P),
                               [[0, 0.6, 1.0], [1.1, 0, 0.7], [0.6, 0.95, 0]])
    assert np.array_equal(C.APS("r").scores(P), C.SCORES["aps_strict"].scores(P))
    assert np.array_equal(C.CumulativeAPS("r").scores(P), C.SCORES["aps"].scores(P))
    with pytest.raises(ValueError, match="needs u"):
        C.SCORES["raps_rand"].scores(P)


def test_aps_sets_take_options_until_their_mass_reaches_qhat() -> None:
    # masses above each option: [0, .5, .8], [.9, 0, .6], [.5, .75, 0]
    aps, strict = C.SCORES["aps"], C.SCORES["aps_strict"]
    assert C.prediction_sets(aps, P, 0.5).tolist() == [
        [True, False, False], [False, True, False], [False, False, True]]
    # at q̂ = .7: row 0 takes .5 and then .3 (reaching .8 >= .7, included), not .2
    assert C.prediction_sets(aps, P, 0.7).tolist() == [
        [True, True, False], [False, True, True], [True, False, True]]
    # the strict APS admits an option whose mass above equals q̂; APS stops there
    assert C.prediction_sets(strict, P, 0.5)[0].tolist() == [True, True, False]
    # per question q̂, and a padded option (p = 0) never, even at q̂ above every mass
    assert C.prediction_sets(aps, P, np.array([0.5, 0.7, 0.2]))[:, 2].tolist() == [
        False, True, True]
    assert C.prediction_sets(aps, [[0.7, 0.3, 0.0]], 5.0).tolist() == [[True, True, False]]
    # coverage is read off the set: the gold option of row 0 (label 1, calibration score .8)
    # is in the q̂ = .7 set although .8 > .7
    sets = C.prediction_sets(aps, P, 0.7)
    assert C.covered(sets, [1, 2, 1]).tolist() == [True, True, False]
    assert (C.true_label_scores(aps, P, [1, 2, 1]) <= 0.7).tolist() == [False, False, False]
    # RAPS: the mass above plus the penalty at the rank above, 0.1 * (rank - 2)+: [0, .5, .9],
    # [1.0, 0, .6], [.5, .85, 0]; at q̂ = .85 APS takes row 0's third option (.8 < .85), RAPS not
    raps = C.SCORES["raps"]
    assert C.prediction_sets(aps, P, 0.85).tolist() == [
        [True, True, True], [False, True, True], [True, True, True]]
    assert C.prediction_sets(raps, P, 0.85).tolist() == [
        [True, True, False], [False, True, True], [True, False, True]]
    # the gold option of row 2 (label 1, calibration score 1.2) is out: 0.85 is not < 0.85
    assert C.covered(C.prediction_sets(raps, P, 0.85), [1, 2, 1]).tolist() == [True, True, False]
    for name in ("lac", "aps_strict", "raps_strict"):  # covered <=> s(x, y) <= q̂
        sets = C.prediction_sets(C.SCORES[name], P, 0.7)
        assert np.array_equal(C.covered(sets, [1, 2, 1]),
                              C.true_label_scores(C.SCORES[name], P, [1, 2, 1]) <= 0.7)


def test_quantile_sets_and_metrics_by_hand() -> None:
    cal = [0.1, 0.4, 0.2, 0.9, 0.3, 0.5, 0.6, 0.8, 0.7, 0.05]
    # n = 10, alpha = 0.2: k = ceil(11 * 0.8) = 9 -> the 9th smallest, 0.8
    assert C.conformal_quantile(cal, 0.2) == 0.8
    assert C.conformal_quantile(cal, 0.1) == 0.9  # k = ceil(9.9) = 10
    assert C.quantile_rank(9, 0.1) == 9  # (9 + 1) * 0.9 = 9.000000000000002 in floats
    sets = C.prediction_sets(C.SCORES["lac"], P, 0.6)  # p >= 0.4
    assert sets.tolist() == [[True, False, False], [False, True, False], [False, False, True]]
    covered, size = [1, 0, 1, 1, 1], [1, 1, 2, 2, 3]
    assert C.coverage(covered) == 0.8 and C.mean_set_size(size) == 1.8
    assert C.worst_size_stratified_coverage(covered, size) == 0.5
    idx = np.array([[0, 0, 0, 0, 0], [1, 1, 2, 3, 4]])  # two bootstrap resamples
    counts = C.resample_counts(idx, 5)
    assert counts.tolist() == [[5, 0, 0, 0, 0], [0, 2, 1, 1, 1]]
    np.testing.assert_allclose(C.coverage(covered, counts), [1.0, 0.6])
    np.testing.assert_allclose(C.mean_set_size(size, counts), [1.0, 1.8])
    np.testing.assert_allclose(C.worst_size_stratified_coverage(covered, size, counts),
                               [1.0, 0.0])
    with pytest.raises(ValueError, match="indices into the 5 questions"):
        C.resample_counts([[0, 5]], 5)
    with pytest.raises(ValueError, match=r"counts must be \(B, 5\)"):
        C.coverage(covered, counts[:, :4])
    # a padded choice (probability 0: a pooled row of a domain with fewer options) is never in
    assert not C.prediction_sets(C.SCORES["aps"], [[0.7, 0.3, 0.0]], 5.0)[0, 2]


def test_bad_alpha_and_too_small_calib_are_clear_errors() -> None:
    for a in (0.0, 1.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="outside \\(0, 1\\)"):
            C.conformal_quantile([0.1, 0.2], a)
    with pytest.raises(NotReachable, match="16 calibration questions.*n >= 1/alpha - 1 = 19"):
        C.conformal_quantile(np.linspace(0, 1, 16), 0.05)
    assert C.conformal_quantile(np.linspace(0, 1, 19), 0.05) == 1.0  # n = 19: k = 19 = n
    nominal, _ = C.coverage_curve(np.linspace(0, 1, 16), np.linspace(0, 1, 5), [0.05, 0.5])
    assert nominal.tolist() == [0.5]  # 0.05 left out: 16 questions cannot resolve it


class _Given:
    """A prefit classifier whose predict_proba returns given rows (MAPIE needs an estimator)."""

    def __init__(self, probs: np.ndarray) -> None:
        self.probs, self.classes_ = probs, np.arange(probs.shape[1])
        self.__sklearn_is_fitted__ = lambda: True

    def fit(self, X, y):
        return self

    def predict_proba(self, X):
        return self.probs[np.asarray(X)[:, 0].astype(int)]

    def predict(self, X):
        return self.predict_proba(X).argmax(axis=1)


def _mapie_problem(n_cal: int, n_test: int, k: int = 4) -> tuple:
    """(a prefit-classifier class for MAPIE, probabilities, labels drawn from them, calib and
    test inputs: row indices into the probabilities)."""
    from sklearn.base import BaseEstimator, ClassifierMixin

    class Given(_Given, ClassifierMixin, BaseEstimator):
        pass

    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.full(k, 0.7), n_cal + n_test)
    y = np.array([rng.choice(k, p=p) for p in probs])
    return (Given, probs, y, np.arange(n_cal)[:, None],
            np.arange(n_cal, n_cal + n_test)[:, None])


class _Draws(np.random.RandomState):
    """A RandomState whose successive ``uniform`` calls return the given arrays, so that MAPIE
    draws the same u as we do."""

    def __init__(self, draws: list[np.ndarray]) -> None:
        super().__init__(0)
        self.draws = list(draws)

    def uniform(self, low=0.0, high=1.0, size=None):
        return np.asarray(self.draws.pop(0)).reshape(size)


@pytest.mark.filterwarnings("ignore:Mean of empty slice", "ignore:invalid value")
@pytest.mark.parametrize("alpha", C.ALPHAS)
@pytest.mark.parametrize("name", ["lac", "aps", "aps_strict", "aps_rand"])
def test_sets_equal_mapies(name: str, alpha: float) -> None:
    pytest.importorskip("mapie", reason="MAPIE is a test dependency: pip install -e '.[test]'")
    from mapie.classification import SplitConformalClassifier
    from mapie.conformity_scores import APSConformityScore
    from mapie.metrics.classification import (
        classification_coverage_score,
        classification_mean_width_score,
        classification_ssc_score,
    )
    n_cal, n_test = 200, 300
    Given, probs, y, x_cal, x_test = _mapie_problem(n_cal, n_test)
    rng = np.random.default_rng(1)
    y_cal, y_test = y[:n_cal], y[n_cal:]
    score = C.SCORES[name]
    u_cal, u_test = rng.random(n_cal), rng.random(n_test)
    if name == "lac":
        mapie_score, draws, last = "lac", [], True
    elif name == "aps":  # MAPIE's calib score is cumsum - U p_y: U = 0, the mass up to y
        mapie_score, draws, last = APSConformityScore(), [np.zeros(n_cal)], True
    elif name == "aps_strict":  # U = 1: the mass above y, our u = 0
        mapie_score, draws, last = APSConformityScore(), [np.ones(n_cal)], True
    else:  # MAPIE's u is our 1 - u, at calibration and in the sets alike
        mapie_score, draws, last = APSConformityScore(), [1 - u_cal, 1 - u_test], "randomized"
    mapie = SplitConformalClassifier(Given(probs), confidence_level=1 - alpha,
                                     conformity_score=mapie_score, prefit=True,
                                     random_state=_Draws(draws)).conformalize(x_cal, y_cal)
    with np.errstate(all="ignore"):
        _, mapie_sets = mapie.predict_set(x_test, conformity_score_params={
            "include_last_label": last})
    mapie_sets = mapie_sets[:, :, 0]
    qhat = C.conformal_quantile(C.true_label_scores(score, probs[:n_cal], y_cal, u_cal), alpha)
    q_mapie = mapie._mapie_classifier.conformity_score_function_.quantiles_
    assert qhat == pytest.approx(float(np.ravel(q_mapie)[0]), abs=1e-12)
    sets = C.prediction_sets(score, probs[n_cal:], qhat, u_test)
    assert np.array_equal(sets, mapie_sets)
    covered = C.covered(sets, y_test)
    if name != "aps":  # a threshold set: the gold option is in it iff its score is <= q̂
        assert np.array_equal(covered, C.true_label_scores(score, probs[n_cal:], y_test,
                                                           u_test) <= qhat)
    with np.errstate(all="ignore"):
        assert C.coverage(covered) == pytest.approx(
            classification_coverage_score(y_test, mapie_sets)[0])
        assert C.mean_set_size(sets.sum(axis=1)) == pytest.approx(
            classification_mean_width_score(mapie_sets))
        assert C.worst_size_stratified_coverage(covered, sets.sum(axis=1)) == pytest.approx(
            classification_ssc_score(y_test, mapie_sets)[0])


class _Recorded(np.random.RandomState):
    """A RandomState whose ``uniform`` draws are MAPIE's U for our score ``name``, our u recorded:
    ``raps_rand``, u from a seeded generator and U = 1 - u (MAPIE's U is our 1 - u);
    ``raps_strict``, u = 0 (U = 1); ``raps``, U = 0 (MAPIE's calibration score is then the mass
    up to y). Its shuffles are RandomState(0)'s, so MAPIE's RAPS split can be redrawn."""

    def __init__(self, name: str) -> None:
        super().__init__(0)
        self.name, self.us, self._gen = name, [], np.random.default_rng(1)

    def uniform(self, low=0.0, high=1.0, size=None):
        u = self._gen.random(size) if self.name == "raps_rand" else np.zeros(size)
        self.us.append(u)
        return u if self.name == "raps" else 1 - u


@pytest.mark.filterwarnings("ignore:Mean of empty slice", "ignore:invalid value")
@pytest.mark.parametrize("alpha", C.ALPHAS)
@pytest.mark.parametrize("name", ["raps", "raps_strict", "raps_rand"])
def test_raps_equals_mapies(alpha: float, name: str) -> None:
    """MAPIE tunes RAPS's k_reg and λ on a held-out part of the calib split; with the k and λ it
    chose, our quantile on the rest equals its quantile, and our ``raps`` and ``raps_rand``
    sets equal its sets (``include_last_label=True``, the paper's "+1" rule, and
    ``"randomized"``). ``raps_strict``, calibrated on the mass strictly above y, applies one
    score at calibration and prediction: MAPIE's "+1" sets on that calibration are ours with
    k_reg + 1 at prediction, a superset of ours."""
    pytest.importorskip("mapie", reason="MAPIE is a test dependency: pip install -e '.[test]'")
    from mapie.classification import SplitConformalClassifier
    from mapie.conformity_scores import RAPSConformityScore
    from sklearn.model_selection import StratifiedShuffleSplit

    n_cal, n_test = 400, 300
    Given, probs, y, x_cal, x_test = _mapie_problem(n_cal, n_test)
    draws = _Recorded(name)
    mapie = SplitConformalClassifier(
        Given(probs), confidence_level=1 - alpha, conformity_score=RAPSConformityScore(0.25),
        prefit=True, random_state=draws).conformalize(x_cal, y[:n_cal])
    fitted = mapie._mapie_classifier.conformity_score_function_
    rest, _ = next(StratifiedShuffleSplit(1, test_size=fitted.size_raps, random_state=0)
                   .split(x_cal, y[:n_cal]))
    with np.errstate(all="ignore"):
        _, mapie_sets = mapie.predict_set(x_test, conformity_score_params={
            "include_last_label": "randomized" if name == "raps_rand" else True})
    mapie_sets = mapie_sets[:, :, 0]
    k_reg, lam = int(np.ravel(fitted.k_star)[0]), float(np.ravel(fitted.lambda_star)[0])
    score = replace(C.SCORES[name], lam=lam, k_reg=k_reg)
    u_test = draws.us[-1] if name == "raps_rand" else None
    qhat = C.conformal_quantile(
        C.true_label_scores(score, probs[rest], y[rest], draws.us[0]), alpha)
    assert qhat == pytest.approx(float(np.ravel(fitted.quantiles_)[0]), abs=1e-12)
    sets = C.prediction_sets(score, probs[n_cal:], qhat, u_test)
    if name == "raps_strict":
        plus_one = C.prediction_sets(replace(score, k_reg=k_reg + 1), probs[n_cal:], qhat)
        assert np.array_equal(plus_one, mapie_sets) and np.all(sets <= mapie_sets)
        assert not np.array_equal(sets, mapie_sets)
    else:
        assert np.array_equal(sets, mapie_sets)
