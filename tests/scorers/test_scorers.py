"""Registry-driven checks of every registered scorer, plus values worked by hand."""
from __future__ import annotations

import numpy as np
import pytest

from tests.support.data import make_outputs
from uqbench import Outputs, get_scorer, list_scorers
from uqbench.core.scorer import run_scorer


@pytest.mark.parametrize("name", list_scorers())
def test_every_scorer_contract(name, outputs: Outputs):
    sc = get_scorer(name)
    assert sc.requires <= outputs.available()
    u, conf = run_scorer(sc, outputs)  # validates shape (N,), finiteness, conf in [0,1]
    np.testing.assert_array_equal(u, get_scorer(name)(outputs))  # deterministic
    perm = np.random.default_rng(0).permutation(outputs.n)
    np.testing.assert_allclose(sc(outputs.select(perm)), u[perm], rtol=1e-12)
    np.testing.assert_allclose(sc.confidence(outputs.select(perm)), conf[perm], rtol=1e-12)
    assert sc.predictive(outputs).shape == outputs.logits.shape


# Hand-worked: logits chosen so softmax is exact: log of probabilities.
P = np.array(
    [[0.7, 0.1, 0.1, 0.1], [0.25, 0.25, 0.25, 0.25], [0.5, 0.5, 0.0 + 1e-300, 0.0 + 1e-300]]
)


def hand_outputs(**kw) -> Outputs:
    return Outputs(ids=np.array(["a", "b", "c"]), labels=np.array([0, 1, 0]),
                   logits=np.log(P), domain=np.array(["d"] * 3), **kw)


def test_msp_entropy_margin_by_hand():
    o = hand_outputs()
    np.testing.assert_allclose(get_scorer("msp")(o), [0.3, 0.75, 0.5])
    # H = -(0.7 ln 0.7 + 3 * 0.1 ln 0.1) = 0.24967 + 0.69078 = 0.94045; ln 4; ln 2
    np.testing.assert_allclose(
        get_scorer("entropy")(o), [0.940448, np.log(4), np.log(2)], rtol=1e-5
    )
    # margins 0.6, 0, 0 -> u = 0.4, 1, 1
    np.testing.assert_allclose(get_scorer("margin")(o), [0.4, 1.0, 1.0])
    # energy = -logsumexp(log p) = -log(sum p) = 0 for normalised log-probs
    np.testing.assert_allclose(get_scorer("energy")(o), [0, 0, 0], atol=1e-12)


def test_sampled_scorers_by_hand():
    # two samples per example: [1,0] & [0,1] (disagree) vs [.5,.5] twice (agree)
    eps = 1e-300
    mc = np.log(np.array([[[1, eps], [0.5, 0.5]], [[eps, 1], [0.5, 0.5]]]))
    o = Outputs(ids=np.array(["a", "b"]), labels=np.array([0, 0]), logits=np.zeros((2, 2)),
                domain=np.array(["d", "d"]), mc_logits=mc, member_logits=mc)
    for fam in ("mc_dropout", "ensemble"):
        # mean probs [.5,.5] for both -> MSP u = .5, H = ln 2 for both
        np.testing.assert_allclose(get_scorer(f"{fam}_msp")(o), [0.5, 0.5])
        np.testing.assert_allclose(get_scorer(f"{fam}_entropy")(o), [np.log(2)] * 2)
        # MI = ln2 - 0 for the disagreeing pair, ln2 - ln2 = 0 for the agreeing one
        np.testing.assert_allclose(get_scorer(f"{fam}_mutual_info")(o), [np.log(2), 0], atol=1e-12)
        assert get_scorer(f"{fam}_msp").passes(o) == 2


def test_router_scorers_and_care_blend_by_hand():
    o = hand_outputs(route_entropy=np.array([0.2, 0.4, 0.6]), top1_mass=np.array([0.9, 0.5, 0.3]),
                     disagreement=np.array([0.0, 0.5, 1.0]))
    np.testing.assert_allclose(get_scorer("routing_entropy")(o), [0.2, 0.4, 0.6])
    np.testing.assert_allclose(get_scorer("top1_mass")(o), [0.1, 0.5, 0.7])
    np.testing.assert_allclose(get_scorer("disagreement")(o), [0.0, 0.5, 1.0])
    # u = .5 H + .5 D
    np.testing.assert_allclose(get_scorer("care")(o), [0.1, 0.45, 0.8])
    np.testing.assert_allclose(get_scorer("care", w=0.0)(o), [0.2, 0.4, 0.6])
    with pytest.raises(ValueError, match="w must lie in"):
        get_scorer("care", w=1.5)
    # CARE calibrates with the model's MSP
    np.testing.assert_allclose(get_scorer("care").confidence(o), [0.7, 0.25, 0.5])


def test_mutual_info_is_zero_when_samples_agree():
    o = make_outputs(n=8, t=4)
    same = np.repeat(o.logits[None], 4, axis=0)
    o2 = Outputs(ids=o.ids, labels=o.labels, logits=o.logits, domain=o.domain, mc_logits=same)
    np.testing.assert_allclose(get_scorer("mc_dropout_mutual_info")(o2), 0, atol=1e-12)
