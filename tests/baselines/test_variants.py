"""The MoE-LoRA baselines (LoRAMoE, HydraLoRA, MixLoRA, DynMoLE, HMoRA, FlyLoRA) on tiny random
models: training, Outputs fields, checkpoints, CARE, each variant's defining structure, selection
by name (`uqbench list models`, ``--models``, suite ``models:``) and bad input."""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from baselines.backbones import tiny_backbone
from baselines.checkpoint import load_adapter, save_adapter
from baselines.forward import collect
from baselines.gates import Care, DynMoLE, TopK, tsallis_entropy
from baselines.heads import make_moe
from baselines.moe import (
    FFN_PATTERN,
    FlyLoRALinear,
    MoELoRAConfig,
    MoELoRALinear,
    get_gates,
    load_balance_loss,
    moe_layers,
    set_gate,
    train_gate,
)
from baselines.train import TrainConfig, train
from baselines.variants import PRESETS, variant_config
from tests.support.data import toy_records
from tests.support.suites import arc_suite
from uqbench import Outputs
from uqbench.core.errors import ConfigError
from uqbench.core.outputs import ROUTER_FIELDS
from uqbench.core.plan import DEFAULT_MODELS, MODELS, default_pairs, model_pairs
from uqbench.core.scorer import get_scorer, list_scorers, run_scorer

FAST = TrainConfig(lr=5e-3, head_lr=1e-2, epochs=3, batch_size=8, max_length=48, warmup_ratio=0.1)
ROUTED = [n for n in PRESETS if n != "flylora"]


@pytest.fixture(scope="module")
def encoder():
    return tiny_backbone("encoder")


@pytest.fixture(scope="module")
def trained(encoder):
    """Each variant trained for 12 steps on a learnable toy task: (model, TrainResult). The toy
    task ("the option containing 'good'") is about the options alone, which a cross-encoder's
    linear head learns in a few steps and a cosine with the question does not."""
    recs = toy_records(32, seed=1)
    out = {}
    for name in PRESETS:
        model = make_moe(encoder, variant_config(name), mode="cross_encoder")
        out[name] = (model, train(model, recs, FAST, progress=False))
    return out


# --- training and Outputs ---------------------------------------------------------------------

@pytest.mark.parametrize("name", list(PRESETS))
def test_variant_trains_and_loss_decreases(trained, name) -> None:
    model, res = trained[name]
    assert res.steps == 12
    assert sum(res.losses[-3:]) < sum(res.losses[:3])
    assert not model.training
    cfg = variant_config(name)
    if cfg.lb_coef > 0:        # the variant's own auxiliary loss is on
        assert all(a > 0 for a in res.aux_losses)
    else:
        assert all(a == 0 for a in res.aux_losses)
    assert get_gates(model.backbone) == [train_gate(cfg)] * len(moe_layers(model.backbone)) \
        if model.has_moe else not moe_layers(model.backbone)


@pytest.mark.parametrize("name", list(PRESETS))
def test_variant_trains_float32_adapters_on_a_bfloat16_backbone(name) -> None:
    """On a GPU's bfloat16 backbone every variant's trainable parameters are float32
    (`baselines.moe.trainable_dtype`, as peft makes dense LoRA's), two training steps move
    every one of them, and an eval pass gives finite logits."""
    bb = tiny_backbone("encoder")
    bb.model.to(torch.bfloat16)
    model = make_moe(bb, variant_config(name), mode="cross_encoder")
    params = model.trainable_parameters()
    assert {p.dtype for p in params} == {torch.float32}
    before = [p.detach().clone() for p in params]
    train(model, toy_records(16, seed=1),
          TrainConfig(epochs=1, batch_size=8, max_length=48, warmup_ratio=0.0), progress=False)
    assert all(not torch.equal(p, b) for p, b in zip(params, before, strict=False))
    assert np.isfinite(collect(model, toy_records(4, seed=2), batch_size=4,
                               progress=False)["logits"]).all()


@pytest.mark.parametrize("name", list(PRESETS))
def test_outputs_carry_router_fields_and_every_scorer_runs(trained, name) -> None:
    model, _ = trained[name]
    recs = toy_records(6, seed=3)
    det = collect(model, recs, progress=False)
    mc = np.stack([collect(model, recs, mode="mc_dropout", seed=t, progress=False)["logits"]
                   for t in range(2)])
    has_router = name != "flylora"
    assert MODELS.get(name).router == has_router == model.has_moe
    assert all((f in det) == has_router for f in ROUTER_FIELDS)
    if has_router:
        for f in ("route_entropy", "top1_mass", "disagreement"):
            assert ((det[f] >= 0) & (det[f] <= 1)).all(), f
        assert (det["experts"] >= 1).all() and (det["experts"] <= 8).all()
    out = Outputs(ids=np.array([r.id for r in recs]), labels=np.array([r.answer for r in recs]),
                  logits=det["logits"], domain=np.array(["toy"] * 6), mc_logits=mc,
                  member_logits=np.stack([det["logits"], mc[0]]),
                  **{f: det[f] for f in ROUTER_FIELDS if f in det})
    ran = 0
    for sname in list_scorers():
        scorer = get_scorer(sname)
        if scorer.requires <= out.available():
            u, c = run_scorer(scorer, out)
            assert u.shape == c.shape == (6,) and np.isfinite(u).all()
            ran += 1
    assert ran >= (8 if has_router else 5)


@pytest.mark.parametrize("name", list(PRESETS))
def test_checkpoint_round_trip_gives_identical_logits(trained, encoder, tmp_path, name) -> None:
    model, _ = trained[name]
    batch = model.encode(toy_records(5, seed=4), 48)
    save_adapter(model, tmp_path, meta={})
    again = load_adapter(tmp_path, encoder)
    with torch.no_grad():
        assert torch.equal(model(batch), again(batch))
    assert again.adapter == model.adapter


# --- CARE -------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ROUTED)
def test_care_gate_and_thermostat_work_on_router_variants(trained, name) -> None:
    from baselines.thermostat import calibrate

    model, _ = trained[name]
    batches = [model.encode(toy_records(8, seed=5), 48)]
    before = get_gates(model.backbone)
    try:
        res = calibrate(model, batches, 3.0, forward=lambda m, b: m(b))
        assert abs(res.achieved - 3.0) <= 0.5
        set_gate(model.backbone, Care(tau=res.tau))
        det = collect(model, toy_records(6, seed=6), progress=False)
        assert 1 <= det["experts"].min() and det["experts"].max() <= 8
        assert not np.allclose(det["experts"], det["experts"][0])   # adaptive k
    finally:
        set_gate(model.backbone, before)


def test_care_under_flylora_is_a_config_error_before_model_work(trained, tmp_path) -> None:
    from baselines.engine import make_gate
    from uqbench.core.plan import CARE
    from uqbench.run.runner import RunConfig, prepare

    with pytest.raises(ConfigError, match="'flylora' have no router distribution"):
        prepare(RunConfig(profile="smoke", models=("flylora",), scorers=("care",),
                          out=tmp_path / "never"))
    assert not (tmp_path / "never").exists()
    with pytest.raises(ConfigError, match="needs a router distribution"):
        make_gate(CARE, trained["flylora"][0], "sha", engine=None)
    assert [p.gate.name for p in model_pairs(["flylora"])] == ["native"]


# --- each variant's defining structure --------------------------------------------------------

def test_flylora_a_is_frozen_sparse_and_routes_top_k(trained, encoder) -> None:
    fresh = make_moe(encoder, variant_config("flylora"))
    model, _ = trained["flylora"]
    layers = [m for m in model.backbone.modules() if isinstance(m, FlyLoRALinear)]
    fresh_layers = [m for m in fresh.backbone.modules() if isinstance(m, FlyLoRALinear)]
    assert len(layers) == 12
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert not any("lora_A" in n for n in trainable)
    assert all(n.endswith("lora_B") or n.startswith("head") for n in trainable)
    for trained_layer, new in zip(layers, fresh_layers, strict=False):
        assert torch.equal(trained_layer.lora_A, new.lora_A)          # unchanged by training
        nnz = (trained_layer.lora_A != 0).sum(-1)
        assert (nnz == round(trained_layer.in_features * 8 / 32)).all()   # sparse rows
    layer = layers[0].eval()
    h = torch.randn(5, layer.in_features)
    z = torch.nn.functional.linear(h, layer.lora_A)
    top = z.abs().topk(8, -1).indices
    u = torch.zeros_like(z).scatter(-1, top, z.gather(-1, top))
    torch.testing.assert_close(layer(h), layer.base_layer(h) + 2.0 * u @ layer.lora_B.T)


def test_hydralora_shares_one_a_per_layer(trained) -> None:
    model, _ = trained["hydralora"]
    layers = moe_layers(model.backbone)
    assert len(layers) == 12
    for layer in layers:
        assert layer.lora_A.shape == (1, 8, layer.in_features)            # one A
        assert layer.lora_B.shape == (8, layer.out_features, 8)           # 8 B heads
    names = [n for n, p in model.named_parameters() if p.requires_grad and "lora_A" in n]
    assert len(names) == len(layers)


@pytest.mark.parametrize("kind", ["encoder", "decoder"])
@pytest.mark.parametrize("name", ["loramoe", "mixlora", "dynmole"])
def test_ffn_variants_only_touch_ffn_linears(kind, name) -> None:
    model = make_moe(tiny_backbone(kind), variant_config(name), mode="auto")
    wrapped = [n for n, m in model.backbone.named_modules() if isinstance(m, MoELoRALinear)]
    assert len(wrapped) == (4 if kind == "encoder" else 6)                # 2 blocks
    assert all(FFN_PATTERN.search(n) for n in wrapped)
    assert not any("attention" in n or "attn" in n for n in wrapped)


def test_hmora_mixes_token_and_task_routing_by_depth(encoder) -> None:
    model = make_moe(encoder, variant_config("hmora"))
    layers = moe_layers(model.backbone)
    a = [float(torch.sigmoid(layer.alpha_logit.detach())) for layer in layers]
    assert a[0] == pytest.approx(1 / (1 + np.exp(2.0))) and a[-1] == pytest.approx(
        1 / (1 + np.exp(-2.0)))                                           # shallow token, deep task
    layer = layers[-1]
    with torch.no_grad():
        layer.alpha_logit.fill_(50.0)                                     # task routing only
        layer.record = True
        x = torch.randn(2, 5, layer.in_features)
        layer(x)
    ent = layer.last_stats["entropy"]                                     # (2, 5)
    assert torch.allclose(ent, ent[:, :1].expand_as(ent))                 # one p per sequence


def test_loramoe_localized_balancing_and_dynmole_tsallis_losses(encoder) -> None:
    for name in ("loramoe", "dynmole", "hmora"):
        model = make_moe(encoder, variant_config(name))
        model(model.encode(toy_records(4), 48))
        loss = load_balance_loss(model.backbone)
        assert loss.requires_grad and torch.isfinite(loss)
    # LoRAMoE: uniform importance within each group -> 0, whatever the groups' totals
    layer = moe_layers(make_moe(encoder, variant_config("loramoe")).backbone)[0]
    probs = torch.tensor([[0.2] * 4 + [0.05] * 4])
    assert float(layer.aux_loss(probs, probs > 0, None, None)) == pytest.approx(0.0, abs=1e-12)


def test_dynmole_gate_rule_by_hand() -> None:
    p = torch.tensor([[0.9, 0.05, 0.03, 0.02], [0.5, 0.3, 0.1, 0.1]])
    assert float(tsallis_entropy(p[1:], 2.0)) == pytest.approx(1 - (0.25 + 0.09 + 0.02))
    # S_1.1 = (1 - sum p^1.1) / 0.1: 0.377 (token 0) and 1.086 (token 1)
    torch.testing.assert_close(tsallis_entropy(p, 1.1), torch.tensor([0.3773, 1.0864]),
                               atol=1e-3, rtol=0)
    sel = DynMoLE(top_p=0.75, keep_top_k=1, threshold=0.9, q=1.1).select(p, lambda m: None)
    assert sel.k.tolist() == [1, 4]            # token 0: top-p (0.9 > 0.75: none, keep 1); 1: all
    assert sel.mask[0].tolist() == [True, False, False, False]
    low = DynMoLE(top_p=0.75, keep_top_k=1, threshold=1.2).select(p, lambda m: None)
    assert low.k.tolist() == [1, 1]            # token 1 now top-p: cumsum 0.5 <= 0.75 < 0.8
    assert DynMoLE(keep_top_k=2, threshold=1.2).select(p, lambda m: None).k.tolist() == [2, 2]
    with pytest.raises(ValueError, match="keep_top_k"):
        DynMoLE(keep_top_k=5).validate(4)


# --- selection by name, defaults unchanged, bad input -----------------------------------------

def test_default_run_is_unchanged() -> None:
    from uqbench.core.plan import DENSE, ENGINE, LORA, MOE, ROUTER, TOP4, GateSpec, Pair
    from uqbench.run.runner import RunConfig

    assert default_pairs(3.0) == model_pairs(DEFAULT_MODELS, 3.0) == [
        Pair(LORA, DENSE, ENGINE), Pair(MOE, TOP4, ROUTER | {"mc_logits", "member_logits"}),
        Pair(MOE, GateSpec("care", "care", budget=3.0), ROUTER)]
    assert not {"models", "gates", "backend", "figure_set"} & RunConfig().identity().keys()
    assert RunConfig(models=("mixlora",)).identity()["models"] == ("mixlora",)
    assert train_gate(MoELoRAConfig()) == TopK(4)
    assert set(MODELS.names()) == {*DEFAULT_MODELS, *PRESETS}


def test_list_models_prints_every_model(capsys) -> None:
    from uqbench.cli import main

    assert main(["list", "models"]) == 0
    out = capsys.readouterr().out
    listed = [line.split()[0] for line in out.splitlines()]
    assert listed == MODELS.names()


def test_unknown_names_list_the_valid_ones(tmp_path) -> None:
    from uqbench.data.suites.spec import parse_suite

    with pytest.raises(ConfigError, match=re.escape("unknown model 'mixlra' (did you mean "
                                                    "'mixlora', 'lora', 'moe-lora'?); valid: "
                                                    "dynmole, flylora")):
        model_pairs(["mixlra"])
    with pytest.raises(ConfigError, match="unknown MoE-LoRA variant 'hydra' .*valid: loramoe"):
        variant_config("hydra")
    with pytest.raises(ValueError, match="variant='x' is invalid; use one of moe-lora"):
        MoELoRAConfig(variant="x")
    with pytest.raises(ValueError, match="use rank=1"):
        MoELoRAConfig(variant="flylora", rank=4)
    suite = {"name": "s", "domains": {"d": {r: {"source": "arc-easy", "split": "test"}
                                           for r in ("train", "id", "shift")}}}
    assert parse_suite({**suite, "models": ["mixlora", "flylora"]}).models == ("mixlora",
                                                                                 "flylora")
    with pytest.raises(ConfigError, match="'models' must be a non-empty list"):
        parse_suite({**suite, "models": []})
    with pytest.raises(ConfigError, match="unknown model 'moe'.*valid: .*lora"):
        model_pairs(parse_suite({**suite, "models": ["moe"]}).models)  # where a run checks it


def test_run_with_models_from_suite_yaml(tmp_path, real_data) -> None:
    """End to end on tiny-bert: the suite's ``models:`` picks the models; router variants get
    router fields and CARE rows, FlyLoRA only its own routing."""
    from uqbench.run.runner import RunConfig, run

    data = real_data
    (tmp_path / "v.yaml").write_text(arc_suite(
        "v", caps=(16, 8, 12, 12), header="choices: 4\nmodels: [hydralora, flylora]\n"))
    res = run(RunConfig(suite=str(tmp_path / "v.yaml"), profile="smoke", backbone="tiny-bert",
                        scorers=("msp", "care"), out=tmp_path / "out",
                        cache_dir=tmp_path / "cache", data_dir=data, figures=False,
                        progress=False))
    methods = {r["method"] for r in res.rows} - {"chance", "options-only"}   # reference rows
    assert methods == {"hydralora/native/msp", "hydralora/native/care", "hydralora/care/msp",
                       "hydralora/care/care", "flylora/native/msp"}
    assert sorted(res.stats.trained) == ["flylora@0", "hydralora@0"]


def test_the_cores_models_and_heads_are_the_baselines_registrations() -> None:
    """Every variant is registered once (`register_variant`: its preset and the core's model
    entry, see tests/core/test_extending.py); every head once (`register_head`: the core's entry
    holds the class baselines builds)."""
    from baselines.dense import DENSE_KINDS
    from baselines.heads import BiEncoder, Letters, head_class
    from uqbench.core.heads import HEADS, heads_for
    from uqbench.core.plan import MODELS

    assert {MODELS.get(n).spec.kind for n in MODELS.names()} <= {"moe", *DENSE_KINDS, *PRESETS}
    assert heads_for("encoder") == ("bi_encoder", "cross_encoder", "cross_encoder_cls")
    assert heads_for("decoder") == ("cloze", "letters")
    assert head_class("bi_encoder") is BiEncoder and HEADS.get("letters").cls is Letters
