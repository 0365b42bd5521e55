"""The resamples behind a results row's intervals, kept for the report's paired bootstraps
(`uqbench.results.evaluate.column_side`): read back instead of resampled, bit for bit what
resampling again gives."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

from uqbench.results import evaluate as E
from uqbench.results.columns import COLUMNS
from uqbench.results.evaluate import Scored, column_side, evaluate
from uqbench.stats import metrics as M


def scored(rng: np.random.Generator, n: int) -> Scored:
    p = rng.dirichlet(np.ones(4), size=(n, 2)) + 1e-3
    p /= p.sum(-1, keepdims=True)
    lab = rng.integers(0, 4, (n, 2))
    conf = p.max(-1)
    return Scored((1 - conf).round(2), conf, (p.argmax(-1) == lab).astype(float), None, None,
                  p, lab)


def test_a_column_side_reads_the_rows_resamples_and_equals_resampling_again(monkeypatch):
    monkeypatch.setattr(E, "INTERVALS", {})
    monkeypatch.setattr(E, "RESAMPLES", {})
    rng = np.random.default_rng(3)
    splits = {"id": scored(rng, 70), "shift": scored(rng, 50)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", M.UndefinedMetricWarning)
        evaluate(splits["id"], splits["shift"], n_boot=60, seed=0)
    ci_columns = [c for c in COLUMNS.values() if c.ci and c.metric is not None
                  and all(hasattr(splits[s], f) for s, f in c.reads)]
    assert {"accuracy", "ece", "ood_auroc", "aurc", "augrc", "sel_acc_80"} <= {
        c.name for c in ci_columns}
    kept = {}
    calls = []
    resample = M.resample_side
    monkeypatch.setattr(M, "resample_side", lambda *a, **k: calls.append(a) or resample(*a, **k))
    for col in ci_columns:
        arrays = [getattr(splits[s], f) for s, f in col.reads]
        kept[col.name] = column_side(col, arrays, n_boot=60)
    assert calls == []   # every side read back from the row's bootstrap
    for col in ci_columns:
        arrays = [getattr(splits[s], f) for s, f in col.reads]
        again = resample(M.seed_mean(col.bound()), arrays, two_sample=col.two_sample,
                         n_resamples=60, seed=0)
        got = kept[col.name]
        assert (got.point, got.sizes, got.seed) == (again.point, again.sizes, again.seed), \
            col.name
        np.testing.assert_array_equal(got.stats, again.stats, err_msg=col.name)
    # arrays no row bootstrapped, or another number of resamples: resampled now
    col = COLUMNS["aurc"]
    other = [getattr(scored(rng, 70), f) for _, f in col.reads]
    column_side(col, other, n_boot=60)
    column_side(col, [getattr(splits["id"], f) for _, f in col.reads], n_boot=61)
    assert len(calls) == 2


def test_the_kept_resamples_are_bounded(monkeypatch):
    monkeypatch.setattr(E, "RESAMPLES", {"old": np.zeros(3)})
    monkeypatch.setattr(E, "RESAMPLE_ENTRIES", 2)
    E.remember_resamples({"a": np.ones(3)})
    assert set(E.RESAMPLES) == {"old", "a"}
    E.remember_resamples({"b": np.ones(3)})
    assert set(E.RESAMPLES) == {"b"}


@pytest.mark.parametrize("n_boot", [1, 7])
def test_column_side_without_a_row_is_resample_side(n_boot, monkeypatch):
    monkeypatch.setattr(E, "RESAMPLES", {})
    rng = np.random.default_rng(1)
    col = COLUMNS["accuracy"]
    arrays = [rng.integers(0, 2, (9, 1)).astype(float)]
    got = column_side(col, arrays, n_boot=n_boot, seed=4)
    want = M.resample_side(M.seed_mean(col.bound()), arrays, n_resamples=n_boot, seed=4)
    assert got.point == want.point and got.sizes == want.sizes
    np.testing.assert_array_equal(got.stats, want.stats)
