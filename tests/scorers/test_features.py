"""Feature-space scorers (mahalanobis, rmd, knn): values by hand and against scikit-learn, the
`Outputs.features` contract, the training reference (`with_train`), records with and without
features, and the pooled final hidden state each head records."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from sklearn.covariance import EmpiricalCovariance, LedoitWolf, ledoit_wolf
from sklearn.neighbors import NearestNeighbors
from sklearn.preprocessing import normalize

from scorers.features import ledoit_wolf as lw_numpy
from scorers.features import mahalanobis
from tests.support.data import make_outputs
from uqbench import Outputs, get_scorer
from uqbench.core.errors import ConfigError, PluginError
from uqbench.core.outputs import with_train
from uqbench.core.probs import softmax
from uqbench.core.scorer import run_scorer


def feature_outputs(x: np.ndarray, train: np.ndarray, train_domain=None) -> Outputs:
    """Outputs carrying test features ``x`` and the training reference ``train``."""
    n = len(x)
    rng = np.random.default_rng(0)
    td = np.repeat(["a", "b"], [len(train) // 2, len(train) - len(train) // 2]) \
        if train_domain is None else np.asarray(train_domain)
    return Outputs(ids=np.arange(n).astype(str), labels=np.zeros(n, int),
                   logits=rng.normal(size=(n, 3)), domain=np.full(n, "a"), features=x,
                   train_features=train, train_domain=td)


def random_features(n: int = 40, m: int = 120, p: int = 12, seed: int = 0):
    """Correlated Gaussian training features and test features, float32 as recorded."""
    rng = np.random.default_rng(seed)
    mix = rng.normal(size=(p, p))
    train = (rng.normal(size=(m, p)) @ mix + 3.0).astype(np.float32)
    test = (rng.normal(size=(n, p)) @ mix * 1.5 + 2.0).astype(np.float32)
    return test, train


# -- values: by hand ----------------------------------------------------------------------------
def test_mahalanobis_and_knn_by_hand():
    # 1-D: train {-1, 1}: mean 0, variance 1, no shrinkage in one dimension -> MD^2 = x^2
    o = feature_outputs(np.array([[2.0], [0.0], [-3.0]]), np.array([[-1.0], [1.0]]))
    np.testing.assert_allclose(get_scorer("mahalanobis")(o), [4.0, 0.0, 9.0], rtol=1e-6)
    # unit vectors at 0, 90, 180 degrees; the test point at 0 (scaled: knn normalises)
    train = np.array([[1.0, 0.0], [0.0, 2.0], [-3.0, 0.0]])
    x = np.array([[5.0, 0.0]])
    for k, want in ((1, 0.0), (2, np.sqrt(2.0)), (3, 2.0)):
        np.testing.assert_allclose(get_scorer("knn", k=k)(feature_outputs(x, train)), [want],
                                   atol=1e-6)


def test_rmd_by_hand():
    # 1-D, domains a = {-2, 0} (mean -1), b = {2, 4} (mean 3); within-domain variance 1;
    # background: mean 1, variance (9 + 1 + 1 + 9) / 4 = 5. x = 3: min(16, 0) - 4/5 = -0.8
    o = feature_outputs(np.array([[3.0], [-1.0], [1.0]]), np.array([[-2.0], [0.0], [2.0], [4.0]]),
                        ["a", "a", "b", "b"])
    want = [0.0 - 4 / 5, 0.0 - 4 / 5, 4.0 - 0.0]
    np.testing.assert_allclose(get_scorer("rmd")(o), want, rtol=1e-6)


# -- values: against scikit-learn -------------------------------------------------------------
@pytest.mark.parametrize("n,p", [(200, 10), (15, 40)])  # more and fewer samples than dimensions
def test_ledoit_wolf_equals_sklearn(n, p):
    x = np.random.default_rng(n).normal(size=(n, p)) @ np.random.default_rng(p).normal(size=(p, p))
    xc = x - x.mean(0)
    np.testing.assert_allclose(lw_numpy(xc), ledoit_wolf(xc, assume_centered=True)[0],
                               rtol=1e-10, atol=1e-12)


def test_mahalanobis_equals_sklearn():
    x, train = random_features()
    got = get_scorer("mahalanobis")(feature_outputs(x, train))
    want = LedoitWolf().fit(train.astype(np.float64)).mahalanobis(x.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=1e-6)
    emp = EmpiricalCovariance().fit(train.astype(np.float64))  # the distance under any cov
    np.testing.assert_allclose(mahalanobis(x.astype(np.float64), emp.location_,
                                           emp.covariance_), emp.mahalanobis(x), rtol=1e-6)
    means = np.stack([emp.location_, emp.location_ + 1.0])   # several means: a column each
    np.testing.assert_allclose(mahalanobis(x.astype(np.float64), means, emp.covariance_),
                               np.stack([emp.mahalanobis(x - m + emp.location_) for m in means],
                                        axis=1), rtol=1e-6)


def test_rmd_equals_sklearn():
    x, train = random_features(m=90, seed=3)
    dom = np.repeat(["a", "b", "c"], 30)
    train[dom == "b"] += 4.0
    t, x64 = train.astype(np.float64), x.astype(np.float64)
    means = {d: t[dom == d].mean(0) for d in "abc"}
    shared = LedoitWolf(assume_centered=True).fit(t - np.stack([means[d] for d in dom]))
    background = LedoitWolf().fit(t).mahalanobis(x64)
    want = np.min([shared.mahalanobis(x64 - means[d]) for d in "abc"], axis=0) - background
    got = get_scorer("rmd")(feature_outputs(x, train, dom))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("k", [1, 10])
def test_knn_equals_sklearn(k, monkeypatch):
    x, train = random_features(n=50, m=80)
    sc = get_scorer("knn", k=k)
    monkeypatch.setattr(sc, "chunk", 7)  # several blocks of the distance matrix
    dist, _ = NearestNeighbors(n_neighbors=k).fit(normalize(train)).kneighbors(normalize(x))
    np.testing.assert_allclose(sc(feature_outputs(x, train)), dist[:, k - 1], atol=1e-5)
    assert sc.name == f"knn{k}"


def test_far_examples_score_higher_and_confidence_is_the_msp():
    _, train = random_features(n=20)
    near = train[:10].copy()
    far = train[:10] * 4.0 - 30.0
    o = feature_outputs(np.concatenate([near, far]), train)
    for name in ("mahalanobis", "rmd", "knn"):
        u, conf = run_scorer(get_scorer(name), o)
        assert u[10:].min() > u[:10].max(), name
        np.testing.assert_array_equal(conf, softmax(o.logits).max(1))  # like routing_entropy


def test_bad_knn_k_and_single_domain_rmd_are_clear_errors():
    x, train = random_features(m=8)
    with pytest.raises(PluginError, match=r"knn10 needs k=10 training questions, has 8"):
        run_scorer(get_scorer("knn"), feature_outputs(x, train))
    with pytest.raises(ValueError, match="positive integer"):
        get_scorer("knn", k=0)
    with pytest.raises(PluginError, match=r"rmd needs training questions of at least 2 domains"):
        run_scorer(get_scorer("rmd"), feature_outputs(x, train, np.full(8, "a")))


# -- Outputs ----------------------------------------------------------------------------------
def test_outputs_validate_features():
    o = make_outputs(6)
    assert o.features.dtype == np.float32 and o.train_features.dtype == np.float32
    assert {"features", "train_features"} <= o.available()
    with pytest.raises(ValueError, match=r"features must have shape \(6, H>0\), got \(5, 6\)"):
        dataclasses.replace(o, features=np.zeros((5, 6)))
    with pytest.raises(ValueError, match=r"train_features must have shape \(M>=2, 6\)"):
        dataclasses.replace(o, train_features=np.zeros((32, 4)))
    with pytest.raises(ValueError, match="train_features needs features of this split"):
        dataclasses.replace(o, features=None)
    with pytest.raises(ValueError, match="come together"):
        dataclasses.replace(o, train_domain=None)
    bad = o.features.copy()
    bad[2, 1] = np.nan
    with pytest.raises(ValueError, match="features has 1 NaN"):
        dataclasses.replace(o, features=bad)


def test_select_and_concat_keep_the_training_reference():
    o = make_outputs(10)
    part = o.select(np.arange(10) < 4)
    assert part.train_features is o.train_features and part.features.shape == (4, 6)
    both = Outputs.concat([part, o.select(np.arange(10) >= 4)])
    np.testing.assert_array_equal(both.features, o.features)
    assert both.train_features is o.train_features
    other = make_outputs(4, seed=9)  # another reference: the pooled record has none
    assert Outputs.concat([part, other]).train_features is None
    assert Outputs.concat([part, other]).features.shape == (8, 6)


def test_with_train_attaches_every_domains_train_records_of_the_same_pair_and_seed():
    def rec(seed, dom, n=5):
        return dataclasses.replace(make_outputs(n, seed=seed), domain=np.full(n, dom),
                                   train_features=None, train_domain=None)

    outs = {("p", "x/train", 0): rec(1, "x"), ("p", "y/train", 0): rec(2, "y"),
            ("p", "x/id", 0): rec(3, "x"), ("p", "x/id", 1): rec(4, "x"),
            ("q", "x/id", 0): rec(5, "x")}
    got = with_train(outs)
    want = np.concatenate([outs["p", "x/train", 0].features, outs["p", "y/train", 0].features])
    np.testing.assert_array_equal(got["p", "x/id", 0].train_features, want)
    assert list(got["p", "x/id", 0].train_domain) == ["x"] * 5 + ["y"] * 5
    assert "train_features" not in got["p", "x/id", 1].available()  # no train record: seed 1
    assert "train_features" not in got["q", "x/id", 0].available()


def test_a_models_splits_share_one_fit_and_other_training_arrays_get_their_own(monkeypatch):
    import scorers.features as F

    def rec(seed, dom, n=30):
        x, _ = random_features(n=n, seed=seed)
        return dataclasses.replace(feature_outputs(x, x), domain=np.full(n, dom),
                                   train_features=None, train_domain=None)

    outs = with_train({(p, f"{d}/{role}", 0): rec(i, d) for i, (p, d, role) in enumerate(
        (p, d, role) for p in "pq" for d in "xy" for role in ("train", "id", "shift"))})
    fits = []
    monkeypatch.setattr(F, "ledoit_wolf", lambda xc: fits.append(1) or lw_numpy(xc))
    monkeypatch.setattr(F, "FITS", {})
    scored = {k: [get_scorer(s)(o) for s in ("mahalanobis", "rmd")]
              for k, o in outs.items() if not k[1].endswith("/train")}
    assert len(fits) == 2 * 2   # per model: the one Gaussian and the per-domain one
    for (p, split, _), got in scored.items():   # each equal to a fit of its own model alone
        t = outs[p, split, 0].train_features.astype(np.float64)
        x = outs[p, split, 0].features.astype(np.float64)
        np.testing.assert_allclose(got[0], mahalanobis(x, t.mean(0), lw_numpy(t - t.mean(0))),
                                   rtol=1e-10)
        monkeypatch.setattr(F, "FITS", {})
        np.testing.assert_array_equal(got[1], get_scorer("rmd")(outs[p, split, 0]))


# -- the head's pooled state, as recorded by a forward pass -----------------------------------
@pytest.mark.parametrize("kind,mode", [("encoder", "bi_encoder"), ("encoder", "cross_encoder"),
                                       ("encoder", "cross_encoder_cls"), ("decoder", "cloze"),
                                       ("decoder", "letters")])
def test_forward_records_one_deterministic_feature_per_question(kind, mode):
    import torch

    from baselines.backbones import tiny_backbone
    from baselines.forward import collect
    from baselines.heads import make_plain
    from tests.support.data import toy_records

    model = make_plain(tiny_backbone(kind), mode=mode)
    recs = toy_records(7, seed=2, n_choices=(2, 3, 4))
    a = collect(model, recs, batch_size=6, progress=False)["features"]
    b = collect(model, recs, batch_size=1, progress=False)["features"]  # alone in its batch
    assert a.shape == (7, 32) and a.dtype == np.float32 and np.isfinite(a).all()
    np.testing.assert_allclose(a, b, atol=1e-5)  # padding and batch-mates do not matter
    assert np.abs(a - a.mean(0)).max() > 1e-3  # questions differ
    if mode == "letters":  # the final hidden state at the answer position, computed directly
        enc = model.encode(recs[:1], 128)
        with torch.inference_mode():
            h = model.backbone.base_model(input_ids=enc["input_ids"]).last_hidden_state
        np.testing.assert_allclose(a[0], h[0, -1].numpy(), atol=1e-5)


def test_scorers_say_up_front_when_they_cannot_score_a_training_set() -> None:
    from uqbench.core.plan import MOE, TOP4, Method, Pair, drop_unusable

    rmd, knn, msp = get_scorer("rmd"), get_scorer("knn", k=5), get_scorer("msp")
    assert "at least 2 domains" in rmd.unusable(["science"] * 9, 9)
    assert rmd.unusable(["science", "math"], 2) is None
    assert knn.unusable(["a", "b"], 4) == "needs k=5 training questions, has 4"
    assert knn.unusable(["a"], 5) is None and msp.unusable([], 0) is None
    pair = Pair(MOE, TOP4, frozenset())
    ms = [Method(pair, s) for s in (msp, rmd, knn)]
    with pytest.warns(UserWarning, match="scorer 'rmd' skipped"):
        keep, skipped = drop_unusable(ms, ["science"] * 20, 20)
    assert [m.scorer.name for m in keep] == ["msp", "knn5"]
    assert skipped == [{"scorer": "rmd", "pair": "moe-lora/top4",
                        "reason": rmd.unusable(["science"], 20)}]
    with pytest.raises(ConfigError, match="no chosen scorer can score this run: rmd needs"):
        drop_unusable(ms[1:2], ["science"], 20)
