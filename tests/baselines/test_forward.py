from __future__ import annotations

import numpy as np
import pytest
import torch

from baselines.backbones import tiny_backbone
from baselines.forward import FORWARD_PASSES, STAT_FIELDS, collect, collect_mc, plan_batches
from baselines.gates import Care
from baselines.heads import MultipleChoiceModel, make_moe, make_plain
from baselines.moe import MoELoRAConfig, set_gate
from baselines.train import TrainConfig, train
from tests.support.data import SMALL_MOE, toy_records
from uqbench.core.errors import ConfigError
from uqbench.core.outputs import PAD_LOGIT, Outputs
from uqbench.data.records import MCRecord


@pytest.fixture(scope="module", params=[("encoder", "auto"), ("decoder", "letters")])
def model(request) -> MultipleChoiceModel:
    kind, mode = request.param
    m = make_moe(tiny_backbone(kind), SMALL_MOE, mode=mode)
    # train briefly so lora_B != 0 (disagreement is 0 for all-zero experts)
    train(m, toy_records(16), TrainConfig(lr=1e-2, epochs=1, batch_size=8, max_length=48),
          progress=False)
    return m


RECS = toy_records(9, seed=4, n_choices=(2, 3, 4))


def test_shapes_ranges_and_outputs_contract(model: MultipleChoiceModel) -> None:
    rec = collect(model, RECS, batch_size=8, progress=False)
    n, c = len(RECS), max(len(r.choices) for r in RECS)
    assert rec["logits"].shape == (n, c) and rec["logits"].dtype == np.float64
    for i, r in enumerate(RECS):
        assert (rec["logits"][i, len(r.choices):] == PAD_LOGIT).all()
    for f in STAT_FIELDS:
        assert rec[f].shape == (n,) and rec[f].dtype == np.float64
    for f in ("route_entropy", "top1_mass", "disagreement"):
        assert ((rec[f] >= 0) & (rec[f] <= 1)).all(), f
    assert np.allclose(rec["experts"], SMALL_MOE.top_k)   # TopK gate: k is constant
    assert rec["disagreement"].max() > 0
    # what truncation cut stays with the pass (the engine reports it); the rest is Outputs'
    assert rec["cut"].dtype == np.int8 and (rec.pop("cut") == 0).all()   # toy texts: nothing
    Outputs(ids=np.array([r.id for r in RECS]), labels=np.array([r.answer for r in RECS]),
            domain=np.array([r.domain for r in RECS]), **rec)   # the runner's record validates


def test_deterministic_calls_identical_and_counted(model: MultipleChoiceModel) -> None:
    before = FORWARD_PASSES.copy()
    a = collect(model, RECS, batch_size=8, progress=False)
    b = collect(model, RECS, batch_size=5, progress=False)   # other batching, same numbers
    assert FORWARD_PASSES["deterministic"] == before["deterministic"] + 2
    assert FORWARD_PASSES["mc_dropout"] == before["mc_dropout"]
    np.testing.assert_allclose(a["logits"], b["logits"], rtol=0, atol=1e-5)
    c = collect(model, RECS, batch_size=8, progress=False)
    for k in a:
        assert np.array_equal(a[k], c[k]), k


def test_mc_dropout_seeded(model: MultipleChoiceModel) -> None:
    det = collect(model, RECS, batch_size=8, progress=False)["logits"]
    before = FORWARD_PASSES["mc_dropout"]
    s1 = collect(model, RECS, batch_size=8, progress=False, mode="mc_dropout", seed=1)
    s1b = collect(model, RECS, batch_size=8, progress=False, mode="mc_dropout", seed=1)
    s2 = collect(model, RECS, batch_size=8, progress=False, mode="mc_dropout", seed=2)
    assert FORWARD_PASSES["mc_dropout"] == before + 3
    assert np.array_equal(s1["logits"], s1b["logits"])
    assert not np.array_equal(s1["logits"], s2["logits"])
    assert not np.array_equal(s1["logits"], det)
    assert not model.training and not any(m.training for m in model.modules())


def test_order_and_padding_invariance(model: MultipleChoiceModel) -> None:
    short = MCRecord(id="s", domain="t", question="which", choices=("good tiger", "apple"),
                     answer=0, source="t")
    long = MCRecord(id="l", domain="t", question="which one " + "river stone " * 12,
                    choices=("cloud " * 9, "good sugar", "paper"), answer=1, source="t")
    alone = collect(model, [short], batch_size=64, progress=False)
    both = collect(model, [long, short], batch_size=64, progress=False)   # padded to `long`
    assert plan_batches(model, [long, short], 64) == [[1, 0]]
    for k in alone:
        np.testing.assert_allclose(both[k][1, :alone[k].shape[-1]] if k == "logits"
                                   else both[k][1], alone[k][0], rtol=0, atol=1e-5, err_msg=k)
    rev = collect(model, RECS[::-1], batch_size=8, progress=False)
    fwd = collect(model, RECS, batch_size=8, progress=False)
    for k in fwd:
        np.testing.assert_allclose(rev[k][::-1], fwd[k], rtol=0, atol=1e-5, err_msg=k)


def test_keep_tokens_pool_to_example_stats(model: MultipleChoiceModel) -> None:
    rec = collect(model, RECS, batch_size=8, progress=False, keep_tokens=True)
    ex = rec["tok_example"]
    assert (np.diff(ex) >= 0).all() and set(ex) == set(range(len(RECS)))
    for tok, field in (("tok_entropy", "route_entropy"), ("tok_top1", "top1_mass"),
                       ("tok_disagreement", "disagreement"), ("tok_k", "experts")):
        assert rec[tok].shape == ex.shape
        means = np.bincount(ex, rec[tok]) / np.bincount(ex)
        np.testing.assert_allclose(means, rec[field], rtol=1e-6, atol=1e-9)
    n_tokens = sum(int(model.encode([r], 128)["attention_mask"].sum()) for r in RECS)
    assert len(ex) == n_tokens


def test_gate_is_used_as_set() -> None:
    m = make_moe(tiny_backbone("encoder"), MoELoRAConfig(n_experts=8, rank=2, top_k=2))
    set_gate(m.backbone, Care(tau=0.9, k_max=8))
    rec = collect(m, RECS, batch_size=8, progress=False)
    assert 1 <= rec["experts"].min() and rec["experts"].max() <= 8
    assert not np.allclose(rec["experts"], 2)


def test_no_moe_gives_logits_features_and_cut_only() -> None:
    m = make_plain(tiny_backbone("encoder"))
    rec = collect(m, RECS, batch_size=8, progress=False)
    assert set(rec) == {"logits", "features", "cut"}
    with pytest.raises(ConfigError, match="no MoE-LoRA layers"):
        collect(m, RECS, keep_tokens=True, progress=False)
    with pytest.raises(ConfigError, match="mode"):
        collect(m, RECS, mode="ensemble", progress=False)
    with pytest.raises(ValueError, match="no records"):
        collect(m, [], progress=False)


def test_real_minilm_with_moe(minilm) -> None:
    """The real backbone: 16 experts on all 36 linears, four records, one pass."""
    bb = minilm
    m = make_moe(bb, MoELoRAConfig(), copy=False)
    recs = [MCRecord(id=f"r{i}", domain="science", question=q, choices=c, answer=0, source="t")
            for i, (q, c) in enumerate([
                ("Which gas do plants absorb from the air?", ("carbon dioxide", "oxygen",
                                                              "helium", "neon")),
                ("What is 7 times 6?", ("42", "36", "48", "56")),
                ("Which planet is known as the red planet?", ("Mars", "Venus", "Jupiter")),
                ("Water boils at what temperature at sea level?", ("100 C", "50 C", "0 C",
                                                                   "200 C")),
            ])]
    rec = collect(m, recs, batch_size=64, max_length=128, progress=False)
    assert rec["logits"].shape == (4, 4) and rec["logits"][2, 3] == PAD_LOGIT
    assert np.isfinite(rec["logits"]).all()
    assert np.allclose(rec["experts"], 4)
    assert ((rec["route_entropy"] > 0.5) & (rec["route_entropy"] <= 1)).all()   # fresh routers
    assert (rec["disagreement"] == 0).all()   # lora_B = 0 at init: every expert outputs 0


def test_stacked_mc_passes_equal_the_sequential_ones_bitwise(model: MultipleChoiceModel) -> None:
    """T copies in one forward, each with its own dropout stream (the MoE-LoRA layers' through
    ``mask_draws``, set for the passes only): every field of every pass equals the pass run
    alone, with the same pass count: integer fields exactly, float fields within float rounding
    (a GEMM over 3x the rows may round its last bit otherwise: bitwise in most runs, once a
    `features` difference in a full-suite run; decoder logits <= 3e-8)."""
    seeds = [0, 1, 5]
    seq = [collect(model, RECS, batch_size=8, progress=False, mode="mc_dropout", seed=s)
           for s in seeds]
    layers = model.moe_layers()

    def own(mask_of, h):   # a layer's own setting: replaced for the stacked passes, then kept
        raise AssertionError("a layer's own mask_draws ran in the stacked passes")

    layers[0].mask_draws = own
    before = FORWARD_PASSES["mc_dropout"]
    stacked = collect_mc(model, RECS, seeds, batch_size=8, progress=False)
    assert FORWARD_PASSES["mc_dropout"] == before + len(seeds)
    assert layers[0].__dict__.pop("mask_draws") is own
    assert not any("mask_draws" in layer.__dict__ for layer in layers)
    assert len(stacked) == len(seeds)
    for s, a, b in zip(seeds, seq, stacked, strict=False):
        assert set(a) == set(b)
        for k in a:
            assert a[k].dtype == b[k].dtype, (s, k)
            if np.issubdtype(a[k].dtype, np.floating):
                np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-6, err_msg=f"{s} {k}")
            else:
                assert np.array_equal(a[k], b[k]), (s, k)
    assert not np.array_equal(stacked[0]["logits"], stacked[1]["logits"])   # masks differ
    assert not any(m.training for m in model.modules())



def test_a_token_bound_runs_the_copies_in_groups_with_the_same_masks(model, monkeypatch) -> None:
    """``max_tokens`` splits a batch's stacked copies into forwards of as many copies as fit
    (at least one): no forward holds more padded tokens than the bound unless it is one copy,
    and every pass equals the pass with all copies in one forward."""
    seeds = [0, 1, 5, 7, 2]
    whole = collect_mc(model, RECS, seeds, batch_size=4, progress=False)
    per_copy = [model.encode([RECS[i] for i in b], 48)["attention_mask"].numel()
                for b in plan_batches(model, RECS, 4)]
    orig = type(model).forward
    for bound in (1, 2 * max(per_copy), 10 ** 6):
        seen: list[int] = []

        def counted(self, batch, seen=seen):
            seen.append(batch["attention_mask"].numel())
            return orig(self, batch)

        monkeypatch.setattr(type(model), "forward", counted)
        got = collect_mc(model, RECS, seeds, batch_size=4, max_length=48, progress=False,
                         max_tokens=bound)
        monkeypatch.undo()
        want = []   # per batch: forwards of g copies (the last one what is left), g >= 1
        for n in per_copy:
            g = max(1, min(len(seeds), bound // n))
            want += [min(g, len(seeds) - c) * n for c in range(0, len(seeds), g)]
        assert seen == want, bound
        assert all(n <= bound for n in seen) or bound < min(per_copy)
        for s, a, b in zip(seeds, whole, got, strict=False):
            for k in a:
                np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-6, err_msg=f"{s} {k}")
    with pytest.raises(ConfigError, match="max_tokens must be >= 1"):
        collect_mc(model, RECS, seeds, max_tokens=0)

def test_stacked_mc_passes_fall_back_when_a_draw_is_not_split(model, monkeypatch) -> None:
    """A random draw the copies cannot be split at is caught (the global generator moved), warned
    about, recorded, and the passes run one after another with the same values."""
    import torch

    from uqbench.core.errors import FallbackWarning, reset_fallbacks

    seq = [collect(model, RECS, batch_size=8, progress=False, mode="mc_dropout", seed=s)
           for s in (2, 3)]
    orig = type(model).forward

    def noisy(self, batch):   # a stray draw, as an unknown stochastic layer would make
        torch.rand(1)
        return orig(self, batch)

    monkeypatch.setattr(type(model), "forward", noisy)
    recorded = reset_fallbacks()   # the live list run.json's fallbacks come from
    with pytest.warns(FallbackWarning, match="stacked MC-dropout"):
        got = collect_mc(model, RECS, [2, 3], batch_size=8, progress=False)
    assert [f["what"] for f in recorded] == ["stacked MC-dropout passes"]
    reset_fallbacks()
    noisy_seq = [collect(model, RECS, batch_size=8, progress=False, mode="mc_dropout", seed=s)
                 for s in (2, 3)]
    for a, b in zip(noisy_seq, got, strict=False):  # what the sequential passes give with that draw
        assert np.array_equal(a["logits"], b["logits"])   # (they are the sequential passes)
    monkeypatch.undo()
    again = collect_mc(model, RECS, [2, 3], batch_size=8, progress=False)
    for a, b in zip(seq, again, strict=False):
        np.testing.assert_allclose(a["logits"], b["logits"], rtol=0, atol=1e-6)


def test_a_profiles_token_bound_reaches_the_passes_and_their_cache_key(tmp_path,
                                                                       monkeypatch) -> None:
    """`Profile.eval_tokens` goes to `collect_mc` as ``max_tokens``; passes computed under a
    bound are cached under their own key (copies in groups may round differently), and a
    profile without one keeps the key it had. A bound < 1 is refused by the profile."""
    from dataclasses import replace
    from types import SimpleNamespace

    from baselines import engine as eng
    from baselines import forward as fwd
    from uqbench.core.engine import RunStats
    from uqbench.core.profiles import get_profile

    model = make_plain(tiny_backbone("decoder"), mode="letters")
    seen: list[object] = []
    real = fwd.collect_mc

    def spy(*a, max_tokens=None, **kw):
        seen.append(max_tokens)
        return real(*a, max_tokens=max_tokens, **kw)

    monkeypatch.setattr(fwd, "collect_mc", spy)
    split = SimpleNamespace(records=RECS, hash="h", name="toy/id")
    spec = SimpleNamespace(name="m")
    pair = SimpleNamespace(model=spec, gate=SimpleNamespace(name="native"), fields=())
    smoke = get_profile("smoke")
    for bound, misses in ((None, [None]), (None, []), (40, [40]), (40, [])):
        e = eng.TorchEngine("tiny-llama", replace(smoke, eval_tokens=bound), None, tmp_path,
                            RunStats(), progress=False)
        monkeypatch.setattr(e, "model", lambda s, seed: (model, "sha"))
        monkeypatch.setattr(e, "gate", lambda p, seed: (None, {}))
        monkeypatch.setattr(e, "backbone_identity", lambda: {"name": "tiny"})
        seen.clear()
        e.forwards(spec, 0, pair, split, "mc_dropout", [0, 1, 2])
        assert seen == misses, bound
    with pytest.raises(ConfigError, match="eval_tokens=0 is out of range"):
        replace(smoke, eval_tokens=0)
    # a GPU's out-of-memory error in the passes names the phase and the option that bounds it

    def full(*a, **k):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(fwd, "collect_mc", full)
    for bound, fix in (
        (None, "rerun with --eval-tokens N"),
        (40, "rerun with an --eval-tokens below 40"),
    ):
        e = eng.TorchEngine("tiny-llama", replace(smoke, eval_tokens=bound), None,
                            tmp_path / "oom", RunStats(), progress=False)
        monkeypatch.setattr(e, "model", lambda s, seed: (model, "sha"))
        monkeypatch.setattr(e, "gate", lambda p, seed: (None, {}))
        monkeypatch.setattr(e, "backbone_identity", lambda: {"name": "tiny"})
        with pytest.raises(ConfigError, match=r"the mc_dropout passes of m@0 on toy/id ran out "
                           r"of GPU memory \(CUDA out of memory\. Tried to allocate 20\.00 GiB\): "
                           + fix):
            e.forwards(spec, 0, pair, split, "mc_dropout", [0, 1, 2])
    # and so does one in a gate's calibration, whose passes hold one copy of a batch
    monkeypatch.setattr(eng, "make_gate", full)
    e = eng.TorchEngine("tiny-llama", smoke, None, tmp_path / "oom", RunStats(), progress=False)
    monkeypatch.setattr(e, "model", lambda s, seed: (model, "sha"))
    with pytest.raises(ConfigError, match=r"calibrating the gate native of m@0 ran out of GPU "
                       r"memory .*a profile with a smaller eval_batch_size"):
        e.gate(pair, 0)
