"""The calibration and ranking columns of the results table: each one is declared once
(`uqbench.results.columns`), is the `uqbench.stats.metrics` function on the method's arrays,
mean over seeds, with a bootstrap CI, and is what compare and the paper's verdicts compute."""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from tests.support.data import make_outputs
from uqbench.core.scorer import get_scorer
from uqbench.results.evaluate import CI_METRICS, ROW_COLUMNS, Scored, evaluate
from uqbench.results.tables import markdown_table
from uqbench.stats import metrics as M

NEW = ("brier", "nll", "mce", "ece_adaptive", "augrc")
#: columns as other tools report them: LM-Polygraph's PRR, HELM's ece_10_bin, selective_acc@10
OTHERS = {"prr": ("scorer", True), "ece_10_mass": ("model", False),
          "sel_acc_10": ("scorer", True)}


def _scored() -> Scored:
    """Five examples, two seeds; seed 0 is the metrics docstrings' hand-worked example."""
    u = np.array([[0.2, 0.1], [0.5, 0.2], [0.5, 0.3], [0.1, 0.4], [0.9, 0.5]])
    conf = np.array([[0.1, 0.6], [0.3, 0.6], [0.55, 0.6], [0.8, 0.6], [0.95, 0.6]])
    correct = np.array([[1, 1], [0, 1], [1, 0], [1, 1], [0, 0]], dtype=float)
    p0 = np.array([[0.7, 0.3], [0.0, 1.0], [0.5, 0.5], [0.5, 0.5], [0.5, 0.5]])
    probs = np.stack([p0, np.full((5, 2), 0.5)], axis=1)  # (N, S, C)
    labels = np.array([[0, 0], [1, 1], [0, 0], [1, 1], [0, 0]])
    return Scored(u, conf, correct, None, None, probs, labels)


def test_new_columns_are_the_metrics_functions_mean_over_seeds_with_cis() -> None:
    s = _scored()
    row = evaluate(s, s, n_boot=50)
    assert set(NEW) <= set(ROW_COLUMNS) and set(NEW) <= set(CI_METRICS)
    # seed 0: AUGRC 0.1 by hand (metrics docstring); seed 1: ranks 0.1..0.5, errors at 0.3, 0.5:
    # points (.2,0) (.4,0) (.6,.2) (.8,.2) (1,.4): .2*.2/2 + .2*.4/2 + .2*.6/2 = 0.12
    assert row["augrc"] == pytest.approx((0.1 + 0.12) / 2)
    # seed 0 Brier: (.09*2 + 0 + .5*3) / 5 -> per-row (0.18, 0, .5, .5, .5) mean 0.336; seed 1: .5
    assert row["brier"] == pytest.approx((0.336 + 0.5) / 2)
    nll0 = -(np.log(0.7) + np.log(1.0) + 3 * np.log(0.5)) / 5
    assert row["nll"] == pytest.approx((nll0 + np.log(2)) / 2)
    for name, fn in (("mce", M.max_calibration_error), ("ece_adaptive", None)):
        per_seed = [fn(s.confidence[:, k], s.correct[:, k], n_bins=12) if fn else
                    M.expected_calibration_error(s.confidence[:, k], s.correct[:, k], n_bins=12,
                                                 strategy="quantile") for k in range(2)]
        assert row[name] == pytest.approx(np.mean(per_seed))
        assert row[f"{name}_std"] == pytest.approx(np.std(per_seed, ddof=1))
    for name in NEW:
        assert row[f"{name}_lo"] <= row[f"{name}_hi"] and math.isfinite(row[f"{name}_lo"])
    table = markdown_table([{"method": "m", "domain": "d", **row}])
    assert "| ECE-ad | ECE-10m | MCE | Brier | NLL |" in table


def test_scored_of_keeps_the_predictive_and_labels_and_without_them_warns() -> None:
    outs = [make_outputs(6, 3, seed=k) for k in range(2)]
    msp = get_scorer("msp")
    s = Scored.of(msp, outs)
    assert s.probs is not None and s.probs.shape == (6, 2, 3) and s.labels.shape == (6, 2)
    np.testing.assert_allclose(s.probs[:, 1], msp.predictive(outs[1]))
    row = evaluate(s, s, n_boot=20)
    assert row["brier"] == pytest.approx(np.mean([M.brier_score(msp.predictive(o), o.labels)
                                                  for o in outs]))
    bare = Scored(s.uncertainty, s.confidence, s.correct, None)
    with pytest.warns(UserWarning, match="brier and nll are NaN"):
        nan_row = evaluate(bare, bare, n_boot=20)
    assert math.isnan(nan_row["brier"]) and math.isnan(nan_row["nll_hi"])
    assert nan_row["augrc"] == row["augrc"]


def test_each_column_is_declared_once_and_used_by_compare_and_the_paper() -> None:
    from uqbench.reporting import compare, paper
    from uqbench.results.columns import COLUMNS, CONFORMAL_COVERAGE, RISK_AT

    table = {**COLUMNS, **RISK_AT, **CONFORMAL_COVERAGE}
    for name, col in table.items():
        assert col.name == name and {s for s, _ in col.reads} <= {"id", "shift"}
        # a column that reads a scorer's uncertainty is about the scorer, else about the model
        assert (col.level == "scorer") == any(f == "uncertainty" for _, f in col.reads), name
    assert all(compare.METRICS[n] is table[n] for n in compare.METRICS)
    assert set(paper.PAIRED_METRICS) <= set(COLUMNS)
    assert [n for n, c in COLUMNS.items() if c.two_sample] == ["ood_auroc", "aupr_out", "fpr95"]


def test_a_column_is_its_metric_on_its_arrays() -> None:
    from uqbench.results.columns import COLUMNS, RISK_AT

    s = _scored()
    arrays = {"uncertainty": s.uncertainty[:, 0], "confidence": s.confidence[:, 0],
              "correct": s.correct[:, 0], "probs": s.probs[:, 0], "labels": s.labels[:, 0]}

    def args(name, cols=COLUMNS):
        return [arrays[f] for _, f in cols[name].reads]

    ok = s.correct[:, 0].astype(bool)
    assert COLUMNS["ece"](*args("ece")) == M.expected_calibration_error(
        s.confidence[:, 0], ok, n_bins=M.ECE_BINS)
    assert COLUMNS["ece"](*args("ece"), n_bins=3) == M.expected_calibration_error(
        s.confidence[:, 0], ok, n_bins=3)
    assert COLUMNS["aurc"](*args("aurc")) == M.aurc(s.uncertainty[:, 0], ok)
    assert COLUMNS["accuracy"](*args("accuracy")) == 0.6
    assert COLUMNS["nll"](*args("nll")) == M.negative_log_likelihood(s.probs[:, 0], s.labels[:, 0])
    assert RISK_AT["risk_at_80"](*args("risk_at_80", RISK_AT)) == pytest.approx(
        1 - M.selective_accuracy(s.uncertainty[:, 0], ok, coverage=0.8))
    # the bootstrapped columns keep their resampler for the bootstrap's fast path (the table
    # bootstraps the selective ones together, as `M.resampled_selective_summary`)
    assert all(isinstance(c.bound(), M.Resampled) for c in COLUMNS.values() if c.ci)


@pytest.mark.parametrize("min_rows", [1, 10**9])   # chunks of many rows; of one row each
@pytest.mark.parametrize("seed", range(3))
def test_resampled_columns_bootstrap_bitwise_as_one_resample_at_a_time(seed, min_rows,
                                                                       monkeypatch):
    # A bootstrapped column evaluates a chunk of resamples in one call: its interval must be
    # bitwise that of calling the column on each resample, over several chunks (a small chunk
    # size), tied confidences, empty bins and a single-class resample included
    from uqbench.results.columns import COLUMNS, CONFORMAL_COVERAGE
    from uqbench.stats.metrics import bootstrap

    monkeypatch.setattr(bootstrap, "CHUNK_ELEMENTS", 97)
    monkeypatch.setattr(bootstrap, "MIN_CHUNK_ROWS", min_rows)
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 40))
    probs = rng.dirichlet(np.ones(4) * 0.7, n).round(int(rng.integers(1, 4)))
    probs /= probs.sum(1, keepdims=True)
    labels = rng.integers(0, 4, n)
    conf, ok = probs.max(1), (probs.argmax(1) == labels).astype(float)
    u_id, u_sh = (rng.random(k).round(1) for k in (n, int(rng.integers(1, 30))))
    data = {("id", "confidence"): conf, ("id", "correct"): ok, ("id", "probs"): probs,
            ("id", "labels"): labels, ("id", "uncertainty"): u_id,
            ("shift", "uncertainty"): u_sh, **{("id", f): rng.random(n) < 0.8 for f in (
                "covered_lac", "covered_aps_rand", "covered_raps_rand")}}
    for name, col in {**COLUMNS, **CONFORMAL_COVERAGE}.items():
        if not col.ci:
            continue
        arrays = [data[r] for r in col.reads]
        boot = M.bootstrap_ci_two_sample if col.two_sample else M.bootstrap_ci
        for n_bins in (3, M.ECE_BINS):
            def plain(*a, n_bins=n_bins, col=col):
                return col(*a, n_bins=n_bins)
            fast = col.bound(n_bins)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", M.UndefinedMetricWarning)
                got = boot(fast, *arrays, n_resamples=25, seed=seed)
                want = boot(plain, *arrays, n_resamples=25, seed=seed)
            np.testing.assert_array_equal(got, want, err_msg=f"{name} at {n_bins} bins")
            # paired with other values of the same examples, each side seed-averaged
            sides = [
                np.stack([a, b], axis=1) for a, b in zip(arrays, other(arrays, rng), strict=False)
            ]
            sides = [[sides[i][:, ::-1] for i in range(len(sides))], sides]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", M.UndefinedMetricWarning)
                got, want = (M.paired_difference(M.seed_mean(f), *sides, n_resamples=25,
                                                 two_sample=col.two_sample, seed=seed)
                             for f in (fast, plain))
            np.testing.assert_array_equal(got, want, err_msg=f"paired {name} at {n_bins} bins")


@pytest.mark.parametrize("chunk", [97, 1 << 20])   # many chunks of a few rows; one chunk
def test_a_row_draws_its_resamples_once_and_equals_one_bootstrap_per_column(chunk, monkeypatch):
    # evaluate() draws the indices of the one-sample columns once and those of ID against
    # shift once, applying them to every column: each interval must be bit for bit that of
    # bootstrapping the column on its own with the same seed (what every column did before)
    from uqbench.results import evaluate as E
    from uqbench.results.columns import COLUMNS
    from uqbench.stats.metrics import bootstrap

    monkeypatch.setattr(bootstrap, "CHUNK_ELEMENTS", chunk)
    monkeypatch.setattr(E, "INTERVALS", {})
    monkeypatch.setattr(bootstrap, "MEMO_ELEMENTS", 0)   # every chunk drawn when it is used
    rng = np.random.default_rng(7)

    def scored(n: int) -> Scored:
        p = rng.dirichlet(np.ones(4), size=(n, 2)).round(2) + 1e-3
        p /= p.sum(-1, keepdims=True)
        lab = rng.integers(0, 4, (n, 2))
        conf = p.max(-1)
        return Scored((1 - conf).round(1), conf, (p.argmax(-1) == lab).astype(float), None,
                      None, p, lab)

    id_, shift = scored(60), scored(45)
    calls = []
    draw = bootstrap.draw_indices
    monkeypatch.setattr(bootstrap, "draw_indices",
                        lambda rng, sizes, k: calls.append(tuple(sizes)) or draw(rng, sizes, k))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", M.UndefinedMetricWarning)
        row = evaluate(id_, shift, n_boot=40, seed=3)
    # once per row and kind of column (not once per column), a chunk of resamples at a time
    assert sorted(set(calls)) == [(60,), (60, 45)]
    assert calls.count((60,)) == -(-40 // bootstrap.chunk_rows(60))
    assert calls.count((60, 45)) == -(-40 // bootstrap.chunk_rows(105))
    monkeypatch.setattr(bootstrap, "draw_indices", draw)
    splits = {"id": id_, "shift": shift}
    checked = 0
    for name, col in COLUMNS.items():
        if not col.ci:
            continue
        arrays = [getattr(splits[s], f) for s, f in col.reads]
        boot = M.bootstrap_ci_two_sample if col.two_sample else M.bootstrap_ci
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", M.UndefinedMetricWarning)
            if name in E.SELECTIVE:
                _, lo, hi = boot(M.seed_mean(M.resampled_selective_summary(
                    M.SELECTIVE_COVERAGE)), *arrays, n_resamples=40, seed=3)
                lo, hi = lo[E.SELECTIVE[name]], hi[E.SELECTIVE[name]]
            else:
                _, lo, hi = boot(M.seed_mean(col.bound(M.ECE_BINS)), *arrays, n_resamples=40,
                                 seed=3)
        assert (row[f"{name}_lo"], row[f"{name}_hi"]) == (lo, hi), name
        checked += 1
    assert checked == len(E.CI_METRICS) >= 10


def other(arrays: list[np.ndarray], rng: np.random.Generator) -> list[np.ndarray]:
    """Other values of the same examples as ``arrays`` (confidences and uncertainties
    rounded to ties, correctness and labels flipped at random)."""
    out = []
    for a in arrays:
        if a.ndim == 2:   # probabilities
            b = rng.dirichlet(np.ones(a.shape[1]), len(a)).round(1) + 1e-3
            out.append(b / b.sum(1, keepdims=True))
        elif a.dtype.kind == "i":   # labels
            out.append(rng.integers(0, 4, len(a)))
        elif set(np.unique(a)) <= {0.0, 1.0}:   # correctness
            out.append(np.where(rng.random(len(a)) < 0.3, 1.0 - a, a))
        else:
            out.append(rng.random(len(a)).round(1))
    return out


def test_columns_others_report_are_the_metrics_at_their_level_with_cis() -> None:
    from uqbench.results.columns import COLUMNS
    from uqbench.results.tables import shown as shown_at

    s = _scored()
    row = evaluate(s, s, n_boot=50)
    shown = {level: [c for c, _, _ in shown_at(level)] for level in ("model", "scorer")}
    for name, (level, higher) in OTHERS.items():
        col = COLUMNS[name]
        assert (col.level, col.higher_is_better, col.ci) == (level, higher, True)
        assert name in ROW_COLUMNS and name in shown[level]
        assert row[f"{name}_lo"] <= row[f"{name}_hi"]
    per_seed = {
        "prr": [M.prediction_rejection_ratio(s.uncertainty[:, k], s.correct[:, k])
                for k in range(2)],
        # HELM's binning at its 10 bins, whatever the table's n_bins
        "ece_10_mass": [M.expected_calibration_error(s.confidence[:, k], s.correct[:, k],
                                                     n_bins=10, strategy="midpoint")
                        for k in range(2)],
        "sel_acc_10": [M.helm_selective_accuracy(s.uncertainty[:, k], s.correct[:, k])
                       for k in range(2)],
    }
    for name, values in per_seed.items():
        assert row[name] == pytest.approx(np.mean(values)) and row[f"{name}_std"] == \
            pytest.approx(np.std(values, ddof=1))
    # seed 0 is test_metrics' hand-worked PRR example; seed 1 ranks 0.1..0.5 with errors at
    # 0.3 and 0.5: E[r] = (0, 0, 1/3, 1/4, 2/5), oracle (0, 0, 0, 1/4, 2/5), e = 0.4
    assert per_seed["prr"] == pytest.approx([(0.4 - 49 / 300) / 0.27,
                                             (0.4 - (1 / 3 + 1 / 4 + 2 / 5) / 5) / 0.27])
    assert per_seed["sel_acc_10"] == [1.0, 1.0]  # N = 5: the single least uncertain


def test_every_shown_column_is_declared_once_with_its_header_and_level() -> None:
    """The tables show exactly the declared columns that have a header, each at its level,
    in `ORDER` (which names only declared ones); the model/scorer sets are disjoint."""
    from uqbench.results import tables as T
    from uqbench.results.columns import DECLARED

    assert set(T.ORDER) <= set(DECLARED) and len(set(T.ORDER)) == len(T.ORDER)
    model, scorer = ([c for c, _, _ in T.shown(level)] for level in ("model", "scorer"))
    assert set(model) | set(scorer) == {n for n, c in DECLARED.items() if c.header}
    assert not set(model) & set(scorer)
    assert model[:4] == ["accuracy", "shift_accuracy", "learned", "ece"]
    assert scorer[0] == "ood_auroc"
    assert T.short_name("ece_ts") == "ECE-TS" and T.digits_of("avg_experts") == 2
    assert T.short_name("brier_conf") == "brier_conf" and T.digits_of("not_a_column") == 3
    assert all(c.doc and "\n" not in c.doc for c in DECLARED.values())


def test_the_columns_table_of_docs_results_is_the_declarations() -> None:
    """docs/results.md holds `columns_doc()` between its markers (regenerate it with
    ``python -m uqbench.results.columns``)."""
    import re

    from tests.conftest import REPO
    from uqbench.results.columns import DECLARED, columns_doc

    page = (REPO / "docs" / "results.md").read_text()
    found = re.search(r"<!-- columns: .*?-->\n(.*?)<!-- /columns -->", page, re.DOTALL)
    assert found, "docs/results.md lost its <!-- columns --> markers"
    assert found.group(1) == columns_doc(), "regenerate: python -m uqbench.results.columns"
    assert len(columns_doc().splitlines()) == 2 + len(DECLARED)
    assert "| `mce` | MCE | model | lower | yes | the largest \\|accuracy" in columns_doc()


@pytest.fixture
def gap_column():
    """The README's column plugin (tests/support/example_column.py), registered for one test."""
    import importlib
    import sys

    from uqbench.results.columns import unregister_column

    sys.modules.pop("tests.support.example_column", None)
    yield importlib.import_module("tests.support.example_column")
    unregister_column("conf_gap")
    sys.modules.pop("tests.support.example_column", None)


def test_a_registered_column_is_computed_with_a_ci_and_shown(gap_column, tmp_path) -> None:
    """One declaration (the README's): every results row gains the column, per seed with a
    bootstrap CI, the cache key names its module, and the model table shows its header."""
    from uqbench.files.cache import ArrayCache
    from uqbench.results import columns as C
    from uqbench.results import tables as T
    from uqbench.results.evaluate import evaluate_cached

    s = _scored()
    row = evaluate(s, s, n_boot=50)
    # seed 0: mean conf (0.1 + 0.3 + 0.55 + 0.8 + 0.95) / 5 = 0.54, accuracy 0.6 -> 0.06;
    # seed 1: conf 0.6, accuracy 0.6 -> 0
    assert row["conf_gap"] == pytest.approx(0.03)
    assert row["conf_gap_std"] == pytest.approx(np.std([0.06, 0.0], ddof=1))
    assert row["conf_gap_lo"] <= row["conf_gap"] <= row["conf_gap_hi"]
    assert C.registered_modules() == ("tests.support.example_column",)
    assert "conf_gap" in [c for c, _, _ in T.shown("model")]
    table = markdown_table([{"method": "m", "domain": "d", **row}])
    assert "| Gap |" in table and "0.030 [" in table
    cache = ArrayCache(tmp_path)
    assert evaluate_cached(cache, s, s, n_boot=50)["conf_gap"] == pytest.approx(0.03)
    with pytest.raises(ValueError, match="'conf_gap' is already declared"):
        C.register_column("conf_gap", reads=(("id", "correct"),), higher_is_better=True,
                          level="model")(np.mean)
    with pytest.raises(ValueError, match="not added by register_column"):
        C.unregister_column("ece")


def test_recalibrated_eces_share_one_draw_bit_for_bit_as_one_bootstrap_each() -> None:
    # the calibrators' ECE intervals come from one draw of the resamples: each must be bit for
    # bit the interval of bootstrapping that calibrator's ECE alone with the same seed
    from uqbench.results import recalibration as RC

    rng = np.random.default_rng(3)
    conf = {k: rng.random((70, 2)).round(2) for k in RC.CALIBRATORS}
    correct = rng.random((70, 2)) < 0.6
    row = RC.columns(RC.Recalibrated(conf, np.array([1.0, 1.5])), correct, n_boot=60, seed=5)
    ece = M.seed_mean(lambda c, ok: M.expected_calibration_error(c, ok, n_bins=M.ECE_BINS))
    for kind in RC.CALIBRATORS:
        _, lo, hi = M.bootstrap_ci(ece, conf[kind], correct, n_resamples=60, seed=5)
        assert (row[f"ece_{kind}_lo"], row[f"ece_{kind}_hi"]) == (lo, hi), kind
