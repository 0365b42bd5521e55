"""Gates and CARE's reference functions: hand-worked cases, equivalences, properties, errors."""
from __future__ import annotations

import importlib
import itertools
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from baselines.gates import (
    EPS,
    Care,
    EntropyK,
    NucleusOnly,
    RandomK,
    TopK,
    care_k,
    disagreement,
    gate_from_dict,
    gate_to_dict,
    normalized_entropy,
)

P4 = torch.tensor([[0.5, 0.3, 0.1, 0.1]])


def ref_fn(probs: torch.Tensor, outputs: torch.Tensor):
    """The ``mask -> D`` callable gates receive, built on the reference :func:`disagreement`."""
    return lambda mask: disagreement(probs * mask, outputs)


def random_case(seed: int, T: int = 64, N: int = 16, d: int = 12, sharp: float = 3.0):
    g = torch.Generator().manual_seed(seed)
    probs = (torch.randn(T, N, generator=g, dtype=torch.float64) * sharp).softmax(-1)
    outputs = torch.randn(T, N, d, generator=g, dtype=torch.float64)
    # make some experts agree so D spans [0, 1]
    outputs[: T // 2] = outputs[: T // 2, :1] + 0.3 * outputs[: T // 2]
    return probs, outputs


# --- hand-worked ------------------------------------------------------------------------------

@pytest.mark.parametrize("tau, k_nu", [(0.3, 1), (0.5, 1), (0.6, 2), (0.75, 2), (0.8, 2),
                                       (0.85, 3), (0.9, 3), (0.95, 4), (1.0, 4)])
def test_care_k_nucleus_hand_worked(tau: float, k_nu: int) -> None:
    agree = torch.ones(1, 4, 3)  # identical outputs: D = 0, no extension
    k, d = care_k(P4, agree, tau=tau)
    assert k.tolist() == [k_nu] and float(d) == pytest.approx(0.0, abs=1e-7)
    sel = Care(tau).select(P4, ref_fn(P4, agree))
    assert sel.k.tolist() == [k_nu] and int(sel.mask.sum()) == k_nu


def test_care_k_extension_hand_worked() -> None:
    # tau=0.75 admits experts 0, 1 (p~ = 5/8, 3/8) with opposite outputs:
    # m2 = 1, e_bar = (1/4, 0) -> D = 1 - 1/16 = 15/16; rho = (15/16 - .55)/.45 = 0.8611
    e = torch.zeros(1, 4, 2)
    e[0, 0, 0], e[0, 1, 0] = 1.0, -1.0
    k, d = care_k(P4, e, tau=0.75)
    assert float(d) == pytest.approx(15 / 16, abs=1e-6)
    assert k.tolist() == [4]                                   # 2 + ceil(2 * 0.861)
    assert care_k(P4, e, tau=0.75, gamma=1.0)[0].tolist() == [3]   # 2 + ceil(0.861)
    assert care_k(P4, e, tau=0.75, delta=0.95)[0].tolist() == [2]  # D < delta
    assert care_k(P4, e, tau=0.75, k_max=3)[0].tolist() == [3]     # clipped
    assert care_k(P4, torch.ones(1, 4, 2), tau=0.3, k_min=2)[0].tolist() == [2]


def test_disagreement_hand_worked_and_paper_form() -> None:
    w = torch.tensor([[0.5, 0.5, 0.0]])
    e = torch.tensor([[[1.0, 0.0], [-1.0, 0.0], [5.0, 5.0]]])
    assert disagreement(w, e).tolist() == pytest.approx([1.0])   # e_bar = 0, excluded expert
    # paper Eq. "disagree": sum_c Var_p~[e_c] / mean ||e||^2, on random data
    probs, out = random_case(1, T=8, N=5, d=4)
    w = probs * (torch.rand(8, 5, generator=torch.Generator().manual_seed(2)) < 0.6)
    w[:, 0] += 0.1
    p = w / w.sum(-1, keepdim=True)
    mean = (p[..., None] * out).sum(1, keepdim=True)
    var = (p[..., None] * (out - mean) ** 2).sum(1).sum(-1)
    m2 = (p * out.pow(2).sum(-1)).sum(-1)
    torch.testing.assert_close(disagreement(w, out), var / (m2 + EPS), rtol=1e-12, atol=1e-12)


def test_disagreement_all_zero_outputs_is_zero_not_nan() -> None:
    assert disagreement(torch.ones(3, 4), torch.zeros(3, 4, 5)).tolist() == [0.0, 0.0, 0.0]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(1, 5), st.integers(0, 2**31 - 1), st.floats(0.01, 100))
def test_disagreement_in_unit_interval_and_zero_for_one_expert(n: int, d: int, seed: int,
                                                               scale: float) -> None:
    g = torch.Generator().manual_seed(seed)
    w = torch.rand(7, n, generator=g, dtype=torch.float64) + 1e-3
    out = torch.randn(7, n, d, generator=g, dtype=torch.float64) * scale
    D = disagreement(w, out)
    assert ((D >= 0) & (D <= 1)).all()
    one = torch.zeros_like(w)
    one[:, seed % n] = w[:, seed % n]
    assert torch.allclose(disagreement(one, out), torch.zeros(7, dtype=torch.float64), atol=1e-12)
    same = out[:, :1].expand_as(out)                           # experts agree
    assert torch.allclose(disagreement(w, same), torch.zeros(7, dtype=torch.float64), atol=1e-9)


# --- vectorised gates vs reference ------------------------------------------------------------

@pytest.mark.parametrize("tau, gamma, delta, k_min, k_max", [
    (0.5, 2.0, 0.55, 1, 8), (0.8, 2.0, 0.3, 1, 8), (0.9, 0.0, 0.55, 1, 8),
    (0.3, 3.0, 0.1, 2, 6), (1.0, 2.0, 0.55, 1, 16), (0.65, 1.5, 0.0, 1, 4)])
def test_care_gate_equals_reference_algorithm(tau, gamma, delta, k_min, k_max) -> None:
    for seed, sharp in ((0, 3.0), (1, 0.5), (2, 8.0)):
        probs, out = random_case(seed, sharp=sharp)
        k_ref, d_ref = care_k(probs, out, tau=tau, gamma=gamma, delta=delta, k_min=k_min,
                              k_max=k_max)
        sel = Care(tau, gamma, delta, k_min, k_max).select(probs, ref_fn(probs, out))
        assert torch.equal(sel.k, k_ref)
        assert torch.equal(sel.mask.sum(-1), sel.k)
        # the admitted set is the top-k by probability
        kth = probs.sort(-1, descending=True).values.gather(1, (sel.k - 1)[:, None])
        assert (probs[sel.mask] >= kth.expand_as(probs)[sel.mask]).all()
        if gamma > 0:
            torch.testing.assert_close(sel.disagreement, d_ref)
        torch.testing.assert_close(disagreement(probs * sel.d_mask, out), d_ref)


def test_care_tau_one_admits_k_max_and_all_for_gamma0_kmax_n() -> None:
    probs, out = random_case(3, sharp=20.0)                     # very peaked: tiny tail mass
    assert (Care(1.0).select(probs, ref_fn(probs, out)).k == 8).all()
    sel = Care(1.0, gamma=0.0, k_max=16).select(probs, ref_fn(probs, out))
    assert sel.mask.all()
    probs32 = probs.float()
    assert Care(1.0, gamma=0.0, k_max=16).select(probs32, ref_fn(probs32, out.float())).mask.all()


def test_nucleus_only_equals_care_gamma0() -> None:
    probs, out = random_case(4)
    for tau in (0.2, 0.5, 0.77, 0.95, 1.0):
        a = NucleusOnly(tau).select(probs, ref_fn(probs, out))
        b = Care(tau, gamma=0.0).select(probs, ref_fn(probs, out))
        assert torch.equal(a.mask, b.mask) and torch.equal(a.k, b.k)
    assert NucleusOnly(0.5).gamma == 0.0


def test_nucleus_k_monotone_in_tau() -> None:
    probs, out = random_case(5)
    ks = [Care(t, gamma=0.0, k_max=16).select(probs, ref_fn(probs, out)).k
          for t in torch.linspace(0.05, 1.0, 40).tolist()]
    assert all((a <= b).all() for a, b in itertools.pairwise(ks))


def test_topk_selects_top_k() -> None:
    probs, out = random_case(6)
    sel = TopK(3).select(probs, ref_fn(probs, out))
    assert (sel.k == 3).all() and torch.equal(sel.mask.sum(-1), sel.k)
    assert torch.equal(sel.mask, probs >= probs.topk(3).values[:, -1:])


def test_entropy_k_rule_and_monotonicity() -> None:
    probs, out = random_case(7, sharp=1.5)
    h = normalized_entropy(probs)
    sel = EntropyK(0.7).select(probs, ref_fn(probs, out))
    expect = torch.ceil(0.7 * h * 8).clamp(1, 8).long()
    assert torch.equal(sel.k, expect)
    ks = [EntropyK(s).select(probs, ref_fn(probs, out)).k for s in (0.0, 0.2, 0.5, 1.0, 3.0)]
    assert (ks[0] == 1).all() and all((a <= b).all() for a, b in itertools.pairwise(ks))
    uniform = torch.full((2, 16), 1 / 16)
    assert (EntropyK(1.0).select(uniform, ref_fn(uniform, torch.ones(2, 16, 1))).k == 8).all()


def test_random_k_follows_histogram_and_is_reproducible() -> None:
    probs, out = random_case(8, T=4000)
    gate = RandomK((0.5, 0.0, 0.5), seed=3)
    sel = gate.select(probs, ref_fn(probs, out))
    assert set(sel.k.unique().tolist()) == {1, 3}
    assert float((sel.k == 1).double().mean()) == pytest.approx(0.5, abs=0.03)
    assert torch.equal(sel.mask, probs >= probs.sort(-1, descending=True).values.gather(
        1, (sel.k - 1)[:, None]))
    again = RandomK((0.5, 0.0, 0.5), seed=3).select(probs, ref_fn(probs, out))
    assert torch.equal(sel.k, again.k)
    rk = RandomK.from_counts([1, 1, 2, 4])
    assert rk.histogram == (0.5, 0.25, 0.0, 0.25) and rk.mean_k == 2.0


@pytest.mark.parametrize("gate", [TopK(2), Care(0.6), NucleusOnly(0.4, k_max=5),
                                  RandomK((0.2, 0.8), seed=1), EntropyK(0.3, k_min=2)])
def test_gate_dict_round_trip(gate) -> None:
    assert gate_from_dict(gate_to_dict(gate)) == gate


# --- validation -------------------------------------------------------------------------------

@pytest.mark.parametrize("make, field", [
    (lambda: TopK(0), "k"),
    (lambda: Care(0.0), "tau"), (lambda: Care(1.2), "tau"), (lambda: Care(-0.1), "tau"),
    (lambda: Care(0.5, k_min=5, k_max=3), "k_max"), (lambda: Care(0.5, k_min=0), "k_min"),
    (lambda: Care(0.5, gamma=-1.0), "gamma"),
    (lambda: Care(0.5, delta=1.0), "delta"), (lambda: Care(0.5, delta=-0.1), "delta"),
    (lambda: NucleusOnly(1.5), "tau"), (lambda: EntropyK(-1.0), "scale"),
    (lambda: EntropyK(1.0, k_min=4, k_max=2), "k_max"),
    (lambda: RandomK(()), "histogram"), (lambda: RandomK((0.5, -0.1)), "histogram"),
])
def test_bad_gate_arguments_name_the_field(make, field) -> None:
    with pytest.raises(ValueError, match=rf"\b{field}="):
        make()


@pytest.mark.parametrize("gate, field", [(TopK(17), "k"), (Care(0.5, k_max=17), "k_max"),
                                         (EntropyK(1.0, k_max=17), "k_max"),
                                         (RandomK((0.0,) * 16 + (1.0,)), "histogram")])
def test_validate_rejects_k_above_n(gate, field) -> None:
    gate.validate(17)
    with pytest.raises(ValueError, match=rf"{field}=.*N=16"):
        gate.validate(16)


def test_care_k_validates() -> None:
    with pytest.raises(ValueError, match="tau"):
        care_k(P4, torch.ones(1, 4, 2), tau=0.0)


# --- gate specs: an unknown kind is an error, never CARE --------------------------------------

def test_unknown_gate_kind_raises_listing_valid_kinds() -> None:
    from uqbench.core.errors import ConfigError
    from uqbench.core.gating import check_spec, gate_kinds
    from uqbench.core.plan import GateSpec

    valid = gate_kinds()
    assert valid[:2] == ["native", "dense"]
    assert {"topk", "care", "nucleus", "random", "entropy", "dynmole"} <= set(valid)
    for budget in (None, 4.0):
        with pytest.raises(ConfigError, match="unknown gate kind 'nucleous'.*valid: native, "
                           "dense, care, dynmole, entropy, nucleus, random, topk"):
            check_spec(GateSpec("typo", "nucleous", budget=budget))
    with pytest.raises(ConfigError, match="needs a budget"):
        check_spec(GateSpec("r", "random"))
    with pytest.raises(ConfigError, match="takes no budget"):
        check_spec(GateSpec("t", "topk", budget=4.0, params={"k": 4}))
    with pytest.raises(ConfigError, match="takes no budget"):
        check_spec(GateSpec("d", "dense", budget=4.0))
    with pytest.raises(ConfigError, match="no parameter.*'gama'.*valid: gamma, delta"):
        check_spec(GateSpec("c", "care", budget=4.0, params={"gama": 1.0}))
    with pytest.raises(ConfigError, match="needs tau"):
        check_spec(GateSpec("c", "care"))
    for k in valid:  # every registered kind is valid with a budget where it needs one
        needs = k in ("random", "entropy")
        check_spec(GateSpec(k, k, budget=4.0 if needs else None,
                            params={"tau": 0.5} if k in ("care", "nucleus") else {}))


def test_the_registry_holds_each_gate_with_its_knob_and_parameters() -> None:
    from uqbench.core.gating import GATES

    care, entropyk, randomk, topk = (GATES.get(k) for k in ("care", "entropy", "random",
                                                               "topk"))
    assert care.cls is Care and care.knob == "tau" and care.bounds[1] == 1.0
    assert care.params == ("gamma", "delta", "k_min", "k_max")
    assert GATES.get("nucleus").params == ("delta", "k_min", "k_max")  # gamma is fixed at 0
    assert entropyk.cls is EntropyK and entropyk.knob == "scale" and entropyk.expand_hi
    assert randomk.cls is RandomK and randomk.proxy == "care" and randomk.params == care.params
    assert topk.cls is TopK and topk.knob is None and not topk.budgeted
    for k in GATES.names():  # every registered class round-trips through its record
        cls = GATES.get(k).cls
        gate = cls(**({"tau": 0.5} if cls in (Care, NucleusOnly) else {"scale": 1.0}
                      if cls is EntropyK else {"histogram": (0.5, 0.5)} if cls is RandomK
                      else {}))
        assert gate_from_dict(gate_to_dict(gate)) == gate


def test_a_gate_has_one_name_its_kind() -> None:
    """The registered kind is the gate's ``name`` (run.json, cache keys, `gate_from_dict`); a
    class naming itself otherwise is refused."""
    from dataclasses import dataclass

    from uqbench.core.gating import GATES, register_gate

    for k in GATES.names():
        assert GATES.get(k).cls.name == k
    assert gate_to_dict(RandomK((1.0,)))["name"] == "random"  # kind `random`, not `randomk`
    assert gate_to_dict(EntropyK(1.0))["name"] == "entropy"

    with pytest.raises(ValueError, match=r"Odd names itself 'odd'; a gate has one name"):
        @register_gate("odd_gate")
        @dataclass(frozen=True)
        class Odd:
            name = "odd"
    assert "odd_gate" not in GATES


@pytest.fixture
def example_gate():
    """The README's gate plugin (`tests/support/example_gate.py`), registered for one test."""
    from uqbench.core.gating import GATES

    with GATES.scoped():
        yield importlib.import_module("tests.support.example_gate")  # executed afresh: registers it
    sys.modules.pop("tests.support.example_gate", None)


def test_a_gate_is_one_decorated_class(example_gate) -> None:
    """The README's "Adding a gate" example: registered, checked, built, serialised."""
    from uqbench.core.gating import GATES, check_spec, gate_kinds
    from uqbench.core.plan import GateSpec

    FractionK = example_gate.FractionK
    assert "fractionk" in gate_kinds() and GATES.get("fractionk").cls is FractionK
    check_spec(GateSpec("quarter", "fractionk", budget=4.0))
    check_spec(GateSpec("quarter", "fractionk", params={"frac": 0.25}))
    sel = FractionK(0.5).select(torch.softmax(torch.randn(3, 8), -1), lambda m: None)
    assert sel.k.tolist() == [4, 4, 4] and sel.mask.sum(-1).tolist() == [4, 4, 4]
    assert gate_from_dict(gate_to_dict(FractionK(0.25))) == FractionK(0.25)


def test_make_gate_refuses_an_unknown_kind_even_past_gatespec() -> None:
    """make_gate checks the kind itself (for a spec changed after GateSpec checked it), before
    any model or calibration work."""
    from baselines.engine import make_gate
    from uqbench.core.errors import ConfigError
    from uqbench.core.plan import GateSpec

    spec = GateSpec("care", "care", budget=4.0)
    object.__setattr__(spec, "kind", "bogus")

    class NoModel:  # any attribute access would mean model work began
        def __getattr__(self, name: str) -> None:
            raise AssertionError(f"model touched: {name}")

    with pytest.raises(ConfigError, match="unknown gate kind 'bogus'; valid: native, dense"):
        make_gate(spec, NoModel(), "sha", engine=None)
