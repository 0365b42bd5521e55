"""Recalibration (uqbench.stats.recalibration, through netcal, and its per-method fits in
uqbench.results.recalibration): temperatures with a known answer,
predictions and accuracy unchanged, the binning calibrators, the cached columns, and the
calibration split disjoint from the ID test split."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from tests.support.data import make_outputs
from uqbench.core.outputs import Outputs
from uqbench.core.scorer import Scorer, get_scorer
from uqbench.files.cache import ArrayCache
from uqbench.results.evaluate import Scored
from uqbench.results.recalibration import columns, recalibrate, recalibrate_cached
from uqbench.stats import metrics as M
from uqbench.stats.recalibration import CALIBRATORS, T_MAX, temperature_scaling, top_label


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _calibrated(n: int, c: int = 4, *, seed: int = 0, scale: float = 1.5):
    """Logits and labels drawn from softmax(logits): calibrated by construction."""
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, c)) * scale
    p = _softmax(z)
    labels = (rng.random(n)[:, None] > p.cumsum(axis=1)).sum(axis=1)
    return z, labels


@pytest.mark.parametrize("factor", [2.0, 0.5])
def test_temperature_undoes_a_known_scaling_of_calibrated_logits(factor):
    # softmax(z) is calibrated for these labels; softmax(factor * z) is over- (factor 2) or
    # under-confident (0.5), and the maximum-likelihood temperature is `factor`.
    z, y = _calibrated(6000)
    t, q, _ = temperature_scaling(_softmax(factor * z), y, _softmax(factor * z))
    assert t == pytest.approx(factor, rel=0.06)
    np.testing.assert_allclose(q, _softmax(factor * z / t), atol=1e-6)  # softmax(log p / T)


def test_temperature_is_one_on_a_calibrated_set():
    z, y = _calibrated(6000, seed=1)
    t, _, _ = temperature_scaling(_softmax(z), y, _softmax(z))
    assert t == pytest.approx(1.0, rel=0.06)


@pytest.mark.parametrize("case", ["over", "under", "anti", "chance"])
def test_temperature_scaling_keeps_every_prediction_and_the_accuracy(case):
    z, y = _calibrated(800, seed=2)
    p = _softmax({"over": 3 * z, "under": 0.3 * z, "anti": z, "chance": z}[case])
    if case == "anti":  # the most probable choice is always wrong: 1/T < 0 unconstrained
        y = p.argmin(axis=1)
    if case == "chance":
        y = np.random.default_rng(0).integers(0, 4, y.size)
    test = _softmax(np.random.default_rng(3).normal(size=(500, 4)) * 2)
    t, q, failed = temperature_scaling(p, y, test)
    assert 0 < t <= T_MAX and failed == ""  # the bound is the constrained optimum: no failure
    np.testing.assert_array_equal(q.argmax(axis=1), test.argmax(axis=1))
    labels = np.random.default_rng(4).integers(0, 4, 500)
    assert np.mean(q.argmax(axis=1) == labels) == np.mean(test.argmax(axis=1) == labels)
    if case == "anti":
        assert t == T_MAX  # held at the bound, not flipped
        np.testing.assert_allclose(q, _softmax(np.log(test) / T_MAX), rtol=1e-12)
    if case == "over":
        assert t > 1


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # pyro's, inside netcal
def test_the_bound_is_applied_as_netcal_applies_a_temperature():
    """A fit held at `T_MAX` is applied by `rescaled` (netcal has no public setter): it must be
    netcal's own transform for a factor netcal fitted, and softmax(log p / T_MAX) by hand."""
    import netcal.scaling

    from uqbench.stats.recalibration import rescaled

    z, y = _calibrated(500, seed=8)
    p = _softmax(2 * z)
    for x, labels in ((p, y), (p.max(axis=1), (p.argmax(axis=1) == y).astype(float))):
        ts = netcal.scaling.TemperatureScaling()
        ts.fit(x, labels)
        inverse = float(np.ravel(ts.temperature)[0])
        np.testing.assert_allclose(rescaled(x, inverse), ts.transform(x).reshape(x.shape),
                                   rtol=1e-14, atol=0)
    np.testing.assert_allclose(rescaled(p, 1 / T_MAX), _softmax(np.log(p) / T_MAX), rtol=1e-12)


def test_a_failed_temperature_fit_warns_and_is_recorded_every_run(tmp_path, monkeypatch):
    """netcal's fit giving NaN (patched here: it needs a broken optimiser) is held at `T_MAX`
    with a `FallbackWarning` and a run.json ``fallbacks`` record naming the scorer, the
    domain and the seed -- on the first run and on a warm one that reads the cache."""
    import netcal.scaling

    import uqbench.results.recalibration as R
    from uqbench.core.errors import FallbackWarning, reset_fallbacks

    monkeypatch.setattr(netcal.scaling.TemperatureScaling, "temperature",
                        property(lambda self: np.array([np.nan])))
    z, y = _calibrated(200, seed=9)
    t, q, failed = temperature_scaling(_softmax(z), y, _softmax(z))
    assert t == T_MAX and "1/T = nan" in failed
    np.testing.assert_allclose(q, _softmax(z / T_MAX), rtol=1e-12)

    scorer = get_scorer("msp")
    cal, test = _seeds(60, 2, 0), _seeds(50, 2, 10)
    cs, ts = _scored(scorer, cal), _scored(scorer, test)
    cache = ArrayCache(tmp_path)
    for run in ("cold", "warm"):
        record = reset_fallbacks()
        with pytest.warns(FallbackWarning, match="temperature scaling fit"):
            row, rec = recalibrate_cached(cache, scorer, cal, test, cs.confidence,
                                          ts.confidence, ts.correct, n_bins=12, n_boot=20)
        assert [(r["what"], r["where"]) for r in record] == [
            ("temperature scaling fit", f"scorer 'msp' on {d}, seed {s}")
            for d in ["+".join(sorted(set(test[0].domain)))] for s in (0, 1)], run
        assert all("not a finite number" in r["reason"] for r in record)
        assert row["ts_temperature"] == T_MAX and all(rec.failed)
        monkeypatch.setattr(R, "recalibrate", None)  # the warm run must read the cache
    reset_fallbacks()


def test_padded_choices_stay_at_zero_after_temperature_scaling():
    z, y = _calibrated(400, c=3, seed=7)
    p = np.c_[_softmax(0.2 * z), np.zeros(400)]  # a 4th, padded choice; underconfident: T < 1
    t, q, _ = temperature_scaling(p, y, p)
    assert np.all(q[:, 3] == 0) and np.allclose(q.sum(axis=1), 1)
    np.testing.assert_allclose(q[:, :3], _softmax(0.2 * z / t), atol=1e-9)


def test_binary_temperature_scaling_of_a_confidence():
    # netcal's binary form, sigmoid(logit(c) / T): calibrated confidences made sharper by 2
    rng = np.random.default_rng(5)
    logit = rng.normal(size=8000) * 1.5
    right = rng.random(8000) < 1 / (1 + np.exp(-logit))
    sharp = 1 / (1 + np.exp(-2 * logit))
    t, q, _ = temperature_scaling(sharp, right.astype(float), sharp)
    assert t == pytest.approx(2.0, rel=0.06)
    np.testing.assert_allclose(q, 1 / (1 + np.exp(-2 * logit / t)), atol=1e-6)


def test_two_choices_keep_their_two_columns_and_the_softmax_temperature():
    # netcal reads an (N, 2) input as binary and returns P(choice 1) alone: a two-choice task
    # (BoolQ, WinoGrande, a yes/no classification) must come back as (N, 2) distributions,
    # softmax(log p / T), which for two choices equals sigmoid(logit(p_1) / T)
    z, y = _calibrated(3000, c=2, seed=11)
    p = _softmax(2.0 * z)  # calibrated logits made sharper by 2
    t, q, failed = temperature_scaling(p, y, p)
    assert failed == "" and q.shape == (3000, 2) and t == pytest.approx(2.0, rel=0.1)
    np.testing.assert_allclose(q, _softmax(2.0 * z / t), atol=1e-9)
    t1, q1, _ = temperature_scaling(p[:, 1], y, p[:, 1])  # the binary form: the same fit
    assert t1 == t and np.array_equal(q1, q[:, 1])


def test_a_calib_split_missing_a_class_fits_without_netcals_print(capsys):
    # netcal prints "Not all class labels are present" when a class is absent from the calib
    # labels; one temperature is fitted from every question alike, so the fit stands, silently
    z, y = _calibrated(300, c=3, seed=3)
    keep = y != 2
    t, q, failed = temperature_scaling(_softmax(z[keep]), y[keep], _softmax(z))
    assert failed == "" and math.isfinite(t) and q.shape == (300, 3)
    assert capsys.readouterr().out == ""


def test_histogram_binning_and_isotonic_by_hand():
    # calib: confidence .05 (bin 0 of 10) right 1 of 2; .95 (bin 9) right 2 of 2
    conf, right = np.array([0.05, 0.05, 0.95, 0.95]), np.array([1.0, 0.0, 1.0, 1.0])
    # bins 0 and 9 map to their accuracies; an empty bin keeps its midpoint (bin 5: .55)
    assert top_label("hb", conf, right, np.array([0.02, 0.99, 0.51])).tolist() == \
        pytest.approx([0.5, 1.0, 0.55])
    # isotonic: the fitted steps, clipped outside the calibration range
    assert top_label("iso", conf, right, np.array([0.0, 0.05, 0.95, 1.0])).tolist() == \
        pytest.approx([0.5, 0.5, 1.0, 1.0])
    with pytest.raises(ValueError, match="unknown top-label calibrator 'bbq'"):
        top_label("bbq", conf, right, conf)


def test_isotonic_is_monotone_and_recalibration_lowers_in_sample_ece():
    z, y = _calibrated(3000, seed=6)
    p = _softmax(3 * z)  # overconfident
    conf, right = p.max(axis=1), (p.argmax(axis=1) == y).astype(float)
    raw = M.expected_calibration_error(conf, right, n_bins=12)
    iso = top_label("iso", conf, right, conf)
    assert np.all(np.diff(iso[np.argsort(conf)]) >= 0)
    for kind in ("hb", "iso"):
        assert M.expected_calibration_error(top_label(kind, conf, right, conf), right,
                                            n_bins=12) < raw / 3
    _, q, _ = temperature_scaling(p, y, p)
    assert M.expected_calibration_error(q.max(axis=1), right, n_bins=12) < raw / 3


def _seeds(n: int, seeds: int, offset: int) -> list[Outputs]:
    return [make_outputs(n=n, seed=offset + s) for s in range(seeds)]


def _scored(scorer: Scorer, outs: list[Outputs]) -> Scored:
    return Scored.of(scorer, outs)


@pytest.mark.parametrize("name", ["msp", "mc_dropout_msp"])
def test_recalibrate_per_seed_keeps_predictions(name):
    scorer = get_scorer(name)
    cal, test = _seeds(60, 2, 0), _seeds(50, 2, 10)
    cs, ts = _scored(scorer, cal), _scored(scorer, test)
    rec = recalibrate(scorer, cal, test, cs.confidence, ts.confidence)
    assert set(rec.confidence) == set(CALIBRATORS) and rec.temperature.shape == (2,)
    for kind in CALIBRATORS:
        assert rec.confidence[kind].shape == (50, 2)
        assert np.all((rec.confidence[kind] >= 0) & (rec.confidence[kind] <= 1))
    for s in range(2):  # ts = the MSP of the rescaled predictive, seed by seed
        _, q, _ = temperature_scaling(scorer.predictive(cal[s]), cal[s].labels,
                                   scorer.predictive(test[s]))
        np.testing.assert_allclose(rec.confidence["ts"][:, s], q.max(axis=1))


class _OwnConfidence(Scorer):
    name = "own_conf"

    def __call__(self, outputs: Outputs) -> np.ndarray:
        return 1 - self.confidence(outputs)

    def confidence(self, outputs: Outputs) -> np.ndarray:
        return 0.25 + 0.75 * self.predictive(outputs).max(axis=1) ** 2


def test_a_scorer_with_its_own_confidence_gets_binary_temperature_scaling():
    scorer = _OwnConfidence()
    cal, test = _seeds(80, 1, 0), _seeds(40, 1, 10)
    cs, ts = _scored(scorer, cal), _scored(scorer, test)
    rec = recalibrate(scorer, cal, test, cs.confidence, ts.confidence)
    right = (scorer.predictive(cal[0]).argmax(axis=1) == cal[0].labels).astype(float)
    t, q, _ = temperature_scaling(cs.confidence[:, 0], right, ts.confidence[:, 0])
    np.testing.assert_allclose(rec.confidence["ts"][:, 0], q)
    assert rec.temperature[0] == pytest.approx(t)


def test_columns_and_cache(tmp_path, monkeypatch):
    import uqbench.results.recalibration as R

    scorer = get_scorer("msp")
    cal, test = _seeds(60, 2, 0), _seeds(50, 2, 10)
    cs, ts = _scored(scorer, cal), _scored(scorer, test)
    opts = {"n_bins": 12, "n_boot": 50, "seed": 0}
    cache = ArrayCache(tmp_path)
    row, rec = recalibrate_cached(cache, scorer, cal, test, cs.confidence, ts.confidence,
                                  ts.correct, **opts)
    assert row == columns(recalibrate(scorer, cal, test, cs.confidence, ts.confidence),
                          ts.correct, **opts)
    for kind in CALIBRATORS:
        per_seed = [M.expected_calibration_error(rec.confidence[kind][:, s],
                                                 ts.correct[:, s].astype(bool), n_bins=12)
                    for s in range(2)]
        assert row[f"ece_{kind}"] == pytest.approx(np.mean(per_seed))
        assert row[f"ece_{kind}_lo"] <= row[f"ece_{kind}"] <= row[f"ece_{kind}_hi"]
    assert row["ts_temperature"] == pytest.approx(rec.temperature.mean())

    def no_fit(*a, **k):
        raise AssertionError("a cached recalibration must not be refitted")

    monkeypatch.setattr(R, "recalibrate", no_fit)
    again, rec2 = recalibrate_cached(cache, scorer, cal, test, cs.confidence, ts.confidence,
                                     ts.correct, **opts)
    assert json.dumps(again) == json.dumps(row)
    np.testing.assert_array_equal(rec2.confidence["hb"], rec.confidence["hb"])
    with pytest.raises(AssertionError, match="refitted"):  # another calib split: refitted
        recalibrate_cached(cache, scorer, _seeds(60, 2, 99), test, cs.confidence,
                           ts.confidence, ts.correct, **opts)


def test_importing_recalibration_does_not_load_netcal_or_torch():
    probe = ("import sys, json, uqbench.stats.recalibration, uqbench.results.recalibration, "
             "uqbench.run.runner; "
             "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))")
    loaded = json.loads(subprocess.run([sys.executable, "-c", probe], capture_output=True,
                                       text=True, check=True).stdout)
    assert "netcal" not in loaded and "torch" not in loaded


def test_calib_split_is_disjoint_from_the_id_test_split(real_data_dir, tmp_path):
    """Recalibrators are fitted on ``calib`` and scored on ``id``: no example (by id or by
    question text) may be in both. Checked on the pooled suite's science and knowledge (whose
    calib and id come from one MMLU test set, split in seeded halves)."""
    from uqbench.data.suites import build as S
    from uqbench.data.suites import spec as SP

    pooled = SP.SUITES.get("pooled")
    for dom in pooled.domains:  # the spec: calib never draws from the ID split's pool
        cal, id_ = dom.roles["calib"], dom.roles["id"]
        assert (cal.source, cal.split, cal.half) != (id_.source, id_.split, id_.half), dom.name
    fast = SP.SuiteSpec("pooled", pooled.domains[:2])
    suite = S.build_suite(fast, "smoke", data_dir=real_data_dir, cache_dir=tmp_path,
                          progress=False)
    for dom in suite.domains:
        cal, id_ = suite.split(dom, "calib").records, suite.split(dom, "id").records
        assert cal and id_
        assert not {r.id for r in cal} & {r.id for r in id_}, dom
        assert not {r.question for r in cal} & {r.question for r in id_}, dom
