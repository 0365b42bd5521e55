"""The conformal and risk-control columns of a results row (`uqbench.results.conformal_risk`)."""
from __future__ import annotations

import dataclasses
import json
import math
import warnings

import numpy as np
import pytest

from tests.support.data import make_outputs
from uqbench.core.scorer import get_scorer
from uqbench.files.cache import ArrayCache
from uqbench.results.conformal_risk import compute, conformal_risk_columns
from uqbench.results.evaluate import Scored
from uqbench.stats import conformal as C


def _scored(n: int, seed: int, seeds: int = 1) -> Scored:
    return Scored.of(get_scorer("msp"), [make_outputs(n, 4, seed=seed + 10 * s)
                                         for s in range(seeds)])


def test_columns_are_the_conformal_functions_with_cis_and_figure_arrays() -> None:
    cal, id_, sh = _scored(60, 1, seeds=2), _scored(50, 2, seeds=2), _scored(40, 3, seeds=2)
    row, figs = compute(cal, id_, sh, n_boot=100)
    assert figs["id|conformity_lac"].shape == (50, 2)
    assert figs["calib|conformity_lac"].shape == (60, 2)
    # LAC at alpha 0.1 (no randomness) by the functions of uqbench.stats.conformal, mean over seeds
    cov, size = [], []
    for s in range(2):
        q = C.conformal_quantile(C.true_label_scores(C.SCORES["lac"], cal.probs[:, s],
                                                     cal.labels[:, s]), 0.1)
        sets = C.prediction_sets(C.SCORES["lac"], id_.probs[:, s], q)
        cov.append(C.coverage(sets[np.arange(50), id_.labels[:, s]]))
        size.append(C.mean_set_size(sets.sum(axis=1)))
    assert row["cp_lac_10_cov"] == pytest.approx(np.mean(cov))
    assert row["cp_lac_10_size"] == pytest.approx(np.mean(size))
    for name in ("cp_aps_rand_20_cov", "shift_cp_raps_05_size", "cp_lac_10_ssc"):
        assert row[f"{name}_lo"] <= row[name] <= row[f"{name}_hi"], name
    assert row["risk_at_50"] <= row["risk_at_90"] + 0.2 and "rc_50_coverage" in row


def test_too_small_calib_gives_reason_cells_and_warns_from_the_cache_too(tmp_path,
                                                                         monkeypatch) -> None:
    import uqbench.results.conformal_risk as T

    monkeypatch.setattr(T, "WARNED", set())
    cal, id_, sh = _scored(16, 1), _scored(30, 2), _scored(30, 3)  # the smoke profile's calib
    arrays: dict = {}
    with pytest.warns(UserWarning, match="alpha=0.05 not reachable: 16 calibration questions"):
        row = conformal_risk_columns(ArrayCache(tmp_path), cal, id_, sh, n_boot=50, arrays=arrays,
                              owner=("m", "d"))
    assert "n >= 1/alpha - 1 = 19" in row["cp_note"]
    assert math.isnan(row["cp_aps_05_cov"]) and math.isnan(row["shift_cp_lac_05_ssc_hi"])
    assert math.isfinite(row["cp_aps_10_cov"])  # 16 >= 1/0.1 - 1 = 9
    assert "target risk 0.3 not reachable" in row["rc_note"] and math.isnan(row["rc_30_coverage"])
    assert arrays["m|d|shift|conformity_aps_rand"].shape == (30, 1)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        conformal_risk_columns(None, cal, id_, sh, n_boot=50)
    assert not seen  # once per reason and process, not once per row
    monkeypatch.setattr(T, "WARNED", set())  # another process: a cached row warns too
    with pytest.warns(UserWarning, match="alpha=0.05 not reachable"):
        again = conformal_risk_columns(ArrayCache(tmp_path), cal, id_, sh, n_boot=50)
    assert json.dumps(again) == json.dumps(row)


def test_coverage_figure_draws_the_coverage_curves_and_skips_old_runs(tmp_path) -> None:
    from figures.conformal import ALPHA_GRID, PANELS, coverage_figure
    from figures.data import load_run
    from tests.figures.test_figures import make_run

    d = make_run(tmp_path / "run", frontier=False, extra=False)
    run = load_run(d)
    assert coverage_figure(run, "pooled", run.methods) is None  # a run without the arrays
    rng = np.random.default_rng(0)
    method = run.methods[0]
    with np.load(d / "scores.npz") as z:
        arrays = {k: z[k] for k in z.files}
    for score, _ in PANELS:
        for role, n in (("calib", 40), ("id", 30), ("shift", 30)):
            arrays[f"{method}|pooled|{role}|conformity_{score}"] = rng.random((n, 1)) + (
                0.3 if role == "shift" else 0.0)
    np.savez_compressed(d / "scores.npz", **arrays)
    run = load_run(d)
    fig = coverage_figure(run, "pooled", run.methods)
    assert fig is not None
    for ax, (score, _) in zip(fig.axes, PANELS, strict=False):
        lines = [ln for ln in ax.get_lines() if ln.get_gid() == method]
        assert len(lines) == 2  # ID and shift
        for ln, role in zip(lines, ("id", "shift"), strict=False):
            nominal, cov = C.coverage_curve(arrays[f"{method}|pooled|calib|conformity_{score}"],
                                            arrays[f"{method}|pooled|{role}|conformity_{score}"],
                                            ALPHA_GRID)
            np.testing.assert_allclose(ln.get_xdata(), nominal)
            np.testing.assert_allclose(ln.get_ydata(), cov)
        assert 0.98 not in np.round(lines[0].get_xdata(), 2)  # 40 < 1/0.02 - 1 = 49: left out


def test_pooled_row_adds_per_domain_quantiles() -> None:
    """``groups`` (the pooled row's domains): ``cpd_*`` fits each domain's q̂ on its own calib
    questions; with one domain it is the pooled fit; without groups there are no cpd columns."""
    cal, id_, sh = _scored(80, 1), _scored(60, 2), _scored(40, 3)
    # two domains, a and b, of 40 calib, 30 ID and 20 shift questions each
    dom = {"calib": np.repeat(["a", "b"], 40), "id": np.repeat(["a", "b"], 30),
           "shift": np.repeat(["a", "b"], 20)}
    row, _ = compute(cal, id_, sh, n_boot=50, groups=dom)
    lac = C.SCORES["lac"]
    true = {r: C.true_label_scores(lac, s.probs[:, 0], s.labels[:, 0])
            for r, s in (("calib", cal), ("id", id_), ("shift", sh))}
    q = {d: C.conformal_quantile(true["calib"][dom["calib"] == d], 0.2) for d in "ab"}
    per_q = np.array([q[d] for d in dom["id"]])
    assert q["a"] != q["b"]
    assert row["cpd_lac_20_cov"] == pytest.approx(np.mean(true["id"] <= per_q))
    sets = C.prediction_sets(lac, id_.probs[:, 0], per_q)
    assert row["cpd_lac_20_size"] == pytest.approx(sets.sum(axis=1).mean())
    assert "cpd_aps_20_cov" not in row  # per-domain fits for the figure's scores only
    same, _ = compute(cal, id_, sh, n_boot=50, groups={r: np.full(len(v), "a")
                                                       for r, v in dom.items()})
    assert same["cpd_lac_10_cov"] == same["cp_lac_10_cov"]
    assert not any(k.startswith("cpd_") for k in compute(cal, id_, sh, n_boot=50)[0])
    with pytest.raises(ValueError, match=r"no calib questions of \['c'\]"):
        compute(cal, id_, sh, n_boot=50, groups={**dom, "shift": np.repeat(["a", "c"], 20)})


def _interval(boots: list) -> tuple[float, float]:
    """The 95% interval of the seed mean of per-seed (B,) resampled statistics."""
    b = np.mean(boots, axis=0)
    lo, hi = np.quantile(b[np.isfinite(b)], [0.025, 0.975])
    return float(lo), float(hi)


@pytest.mark.parametrize("chunk", [1, 37, 1 << 20])
def test_intervals_are_those_of_the_dense_count_matrix_bit_for_bit(monkeypatch, chunk) -> None:
    # the columns resample the test questions a chunk at a time and count equal questions
    # once, holding no (B, N) matrix: their intervals must be bit for bit those of the (B, N)
    # resample counts of one draw of all B resamples (what the columns computed before)
    from uqbench.stats import risk as R
    from uqbench.stats.metrics import bootstrap

    def informative(n: int, seed: int) -> Scored:  # uncertainties that rank errors last
        s = _scored(n, seed, seeds=2)
        noise = np.random.default_rng(seed).random(s.correct.shape)
        return dataclasses.replace(s, uncertainty=np.round(noise + (1 - s.correct), 1))

    monkeypatch.setattr(bootstrap, "CHUNK_ELEMENTS", chunk)
    cal, id_, sh = informative(200, 1), informative(50, 2), informative(40, 3)
    row, _ = compute(cal, id_, sh, n_boot=100, seed=4)
    assert math.isfinite(row["rc_50_risk"]) and math.isfinite(row["shift_rc_50_risk_lo"])
    tests = {"id": id_, "shift": sh}
    dense = {r: C.resample_counts(np.random.default_rng(4).integers(
        0, len(t.correct), size=(100, len(t.correct))), len(t.correct)) for r, t in tests.items()}
    lac = C.SCORES["lac"]  # not randomised: no uniform draws to repeat here
    for prefix, role in (("", "id"), ("shift_", "shift")):
        t, w = tests[role], dense[role]
        boots, cov, risk = [], [], []
        for s in range(2):
            q = C.conformal_quantile(C.true_label_scores(lac, cal.probs[:, s], cal.labels[:, s]),
                                     0.1)
            sets = C.prediction_sets(lac, t.probs[:, s], q)
            boots.append(C.set_statistics(C.covered(sets, t.labels[:, s]), sets.sum(axis=1), w))
            thr = R.ltt_threshold(cal.uncertainty[:, s], cal.correct[:, s], 0.5).threshold
            acc = (t.uncertainty[:, s] <= thr).astype(np.float64)
            cov.append(C.coverage(acc, w))
            risk.append(R.selective_risk(acc, t.correct[:, s], w))
        for k, stat in enumerate(("cov", "size", "ssc")):
            got = (row[f"{prefix}cp_lac_10_{stat}_lo"], row[f"{prefix}cp_lac_10_{stat}_hi"])
            assert got == _interval([b[k] for b in boots]), (prefix, stat)
        for stat, want in (("coverage", cov), ("risk", risk)):
            got = (row[f"{prefix}rc_50_{stat}_lo"], row[f"{prefix}rc_50_{stat}_hi"])
            assert got == _interval(want), (prefix, stat)
