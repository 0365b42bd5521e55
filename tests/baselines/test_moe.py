"""MoE-LoRA layer, injection and statistics on tiny randomly initialised BERT / Llama models."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from transformers import BertConfig, BertModel, LlamaConfig, LlamaModel

from baselines.gates import Care, EntropyK, NucleusOnly, RandomK, TopK, care_k, disagreement
from baselines.moe import (
    BERT_TARGETS,
    MoELoRAConfig,
    MoELoRALinear,
    get_gates,
    gram_disagreement,
    inject,
    layer_stats,
    load_balance_loss,
    moe_layers,
    record_stats,
    set_gate,
    set_token_mask,
    trainable_parameters,
)


def tiny_bert() -> BertModel:
    torch.manual_seed(0)
    return BertModel(BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                intermediate_size=64, vocab_size=100)).eval()


def tiny_llama() -> LlamaModel:
    torch.manual_seed(0)
    return LlamaModel(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                  num_attention_heads=2, num_key_value_heads=2,
                                  vocab_size=100)).eval()


def batch(B: int = 3, L: int = 9, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    am = torch.ones(B, L, dtype=torch.long)
    am[0, L - 3:] = 0
    return {"input_ids": torch.randint(0, 100, (B, L), generator=g), "attention_mask": am}


def randomize(model: nn.Module, seed: int = 0, router_std: float = 1.0) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in moe_layers(model):
            layer.lora_B.copy_(torch.randn(layer.lora_B.shape, generator=g) * 0.2)
            layer.router.weight.copy_(torch.randn(layer.router.weight.shape, generator=g)
                                      * router_std)


def tiny_layer(d: int = 12, o: int = 10, N: int = 6, r: int = 3, dtype=torch.float64,
               gate=None) -> MoELoRALinear:
    torch.manual_seed(1)
    layer = MoELoRALinear(nn.Linear(d, o, dtype=dtype), n_experts=N, rank=r, alpha=2 * r,
                          dropout=0.0, gate=gate).eval()
    with torch.no_grad():
        layer.lora_B.normal_()
        layer.router.weight.mul_(4.0)
    return layer


def naive_expert_outputs(layer: MoELoRALinear, h: torch.Tensor) -> torch.Tensor:
    """(T, N, O) ``e_i = B_i A_i h``: the materialised path the layer avoids."""
    return torch.einsum("nor,nrd,td->tno", layer.lora_B, layer.lora_A, h)


# --- config -----------------------------------------------------------------------------------

def test_config_round_trip_and_help() -> None:
    c = MoELoRAConfig(n_experts=8, target_modules=["query", "value"], top_k=2)
    assert c.target_modules == ("query", "value")
    assert MoELoRAConfig.from_dict(c.to_dict()) == c
    assert MoELoRAConfig.from_dict(MoELoRAConfig().to_dict()) == MoELoRAConfig()
    from dataclasses import fields
    assert all(f.metadata.get("help") for f in fields(MoELoRAConfig))


@pytest.mark.parametrize("kw, field", [({"n_experts": 0}, "n_experts"), ({"rank": 0}, "rank"),
                                       ({"alpha": 0.0}, "alpha"), ({"dropout": 1.0}, "dropout"),
                                       ({"top_k": 17}, "top_k"), ({"lb_coef": -1.0}, "lb_coef"),
                                       ({"target_modules": ()}, "target_modules"),
                                       ({"target_modules": "all"}, "target_modules")])
def test_config_validation_names_field(kw, field) -> None:
    with pytest.raises(ValueError, match=rf"{field}="):
        MoELoRAConfig(**kw)
    with pytest.raises(ValueError, match="unknown keys"):
        MoELoRAConfig.from_dict({"n_expert": 3})


# --- injection --------------------------------------------------------------------------------

@pytest.mark.parametrize("make, n_wrapped, suffixes", [
    (tiny_bert, 12, BERT_TARGETS),
    (tiny_llama, 14, ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                      "down_proj")),
])
def test_inject_wraps_targets_keeps_base_and_freezes(make, n_wrapped, suffixes) -> None:
    model = make()
    originals = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    inject(model, MoELoRAConfig())
    wrapped = {n: m for n, m in model.named_modules() if isinstance(m, MoELoRALinear)}
    assert len(wrapped) == len(moe_layers(model)) == n_wrapped
    for name, layer in wrapped.items():
        assert name.split(".")[-1] in {s.split(".")[-1] for s in suffixes}
        assert layer.base_layer is originals[name]
        assert isinstance(layer.dropout, nn.Dropout)
    assert "pooler.dense" not in wrapped
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(n.endswith(("lora_A", "lora_B", "router.weight")) for n in trainable)
    assert len(trainable) == 3 * n_wrapped
    per = 16 * 8 * 32 + 16 * 8 + 16 * 32  # lora_A + lora_B + router, for 32 -> 32 linears
    assert trainable_parameters(model) >= n_wrapped * per * 0.9
    assert model.moe_lora_config == MoELoRAConfig()


@pytest.mark.parametrize("make", [tiny_bert, tiny_llama])
def test_fresh_injection_equals_base_model_exactly(make) -> None:
    model, b = make(), batch()
    ref = model(**b).last_hidden_state
    inject(model, MoELoRAConfig(dropout=0.3))
    record_stats(model, True)
    assert torch.equal(model(**b).last_hidden_state, ref)


def test_inject_explicit_targets_and_errors() -> None:
    model = inject(tiny_bert(), MoELoRAConfig(target_modules=("query", "value")))
    assert len(moe_layers(model)) == 4
    with pytest.raises(ValueError, match="already has MoE-LoRA layers"):
        inject(model, MoELoRAConfig())
    with pytest.raises(ValueError, match=r"target_modules=.*match no nn.Linear.*attention\.self\."
                                         r"query"):
        inject(tiny_bert(), MoELoRAConfig(target_modules=("q_proj",)))
    with pytest.raises(ValueError, match="inject"):
        set_gate(tiny_bert(), TopK(2))


# --- layer maths ------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "gate",
    [
        TopK(1),
        TopK(3),
        Care(0.7, k_max=6),
        Care(0.5, delta=0.2, k_max=6),
        NucleusOnly(0.8, k_max=6),
        EntropyK(0.6, k_max=6),
        RandomK((0.3, 0.3, 0.4), seed=2),
    ],
)
def test_layer_output_matches_naive_formula(gate) -> None:
    layer = tiny_layer(gate=gate)
    layer.record = True
    h = torch.randn(2, 5, 12, dtype=torch.float64)
    y = layer(h)
    k = layer.last_stats["k"].reshape(-1).long()
    probs = layer.router(h.reshape(-1, 12)).softmax(-1)
    mask = probs >= probs.sort(-1, descending=True).values.gather(1, (k - 1)[:, None])
    w = probs * mask
    w = w / w.sum(-1, keepdim=True)
    e = naive_expert_outputs(layer, h.reshape(-1, 12))
    expect = layer.base_layer(h) + layer.scaling * torch.einsum("tn,tno->to", w, e).view(2, 5, 10)
    torch.testing.assert_close(y, expect, rtol=1e-10, atol=1e-10)


def test_topk_n_equals_dense_mixture() -> None:
    layer = tiny_layer(gate=TopK(6))
    h = torch.randn(7, 12, dtype=torch.float64)
    probs = layer.router(h).softmax(-1)
    dense = torch.einsum("tn,tno->to", probs, naive_expert_outputs(layer, h))
    torch.testing.assert_close(layer(h) - layer.base_layer(h), layer.scaling * dense,
                               rtol=1e-10, atol=1e-10)


def test_gram_disagreement_equals_reference() -> None:
    g = torch.Generator().manual_seed(0)
    for T, N, r, o in ((50, 16, 8, 40), (30, 5, 2, 3), (20, 1, 4, 6)):
        z = torch.randn(T, N, r, generator=g, dtype=torch.float64)
        B = torch.randn(N, o, r, generator=g, dtype=torch.float64)
        w = torch.rand(T, N, generator=g, dtype=torch.float64)
        w = w * (torch.rand(T, N, generator=g) < 0.5)
        w[:, 0] += 0.05
        b_stack = B.permute(1, 0, 2).reshape(o, N * r)
        fast = gram_disagreement(w, z, b_stack.T @ b_stack)
        ref = disagreement(w, torch.einsum("nor,tnr->tno", B, z))
        torch.testing.assert_close(fast, ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("gate", [TopK(4), Care(0.6, k_max=6), Care(0.9, delta=0.3, k_max=5)])
def test_layer_disagreement_and_k_equal_reference(gate) -> None:
    """Fast in-layer D (Gram blocks) and k equal the reference Algorithm 1 on naive outputs."""
    layer = tiny_layer(gate=gate)
    layer.record = True
    h = torch.randn(40, 12, dtype=torch.float64)
    layer(h)
    st = layer.last_stats
    probs = layer.router(h).softmax(-1)
    e = naive_expert_outputs(layer, h)
    if isinstance(gate, Care):
        k_ref, d_ref = care_k(probs, e, tau=gate.tau, gamma=gate.gamma, delta=gate.delta,
                              k_min=gate.k_min, k_max=gate.k_max)
        assert torch.equal(st["k"].long(), k_ref)
    else:
        top = probs >= probs.topk(gate.k).values[:, -1:]
        d_ref = disagreement(probs * top, e)
        assert (st["k"] == gate.k).all()
    torch.testing.assert_close(st["disagreement"].double(), d_ref.float().double(),
                               rtol=0, atol=1e-6)   # stats are stored as float32


def test_stats_shapes_ranges_and_padding() -> None:
    model = inject(tiny_bert(), MoELoRAConfig())
    randomize(model)
    b = batch()
    with pytest.raises(ValueError, match="record_stats"):
        layer_stats(model)
    record_stats(model, True)
    set_token_mask(model, b["attention_mask"].bool())
    set_gate(model, Care(0.7))
    model(**b)
    stats = layer_stats(model)
    assert len(stats) == 12
    pad = ~b["attention_mask"].bool()
    for st in stats:
        assert set(st) == {"entropy", "top1", "disagreement", "k"}
        for v in st.values():
            assert v.shape == (3, 9) and v.dtype == torch.float32 and torch.isfinite(v).all()
            assert (v[pad] == 0).all()
        real = ~pad
        assert ((st["entropy"][real] >= 0) & (st["entropy"][real] <= 1)).all()
        assert ((st["top1"][real] >= 1 / 16) & (st["top1"][real] <= 1)).all()
        assert ((st["disagreement"][real] >= 0) & (st["disagreement"][real] <= 1)).all()
        assert ((st["k"][real] >= 1) & (st["k"][real] <= 8)).all()
        assert (st["disagreement"][real] > 0).any()
    with pytest.raises(ValueError, match="token mask"):
        model(**batch(B=2))
    set_token_mask(model, None)
    record_stats(model, False)
    model(**b)
    with pytest.raises(ValueError, match="record_stats"):
        layer_stats(model)


def test_set_gate_per_layer_and_validation() -> None:
    model = inject(tiny_llama(), MoELoRAConfig(n_experts=6, top_k=2))
    randomize(model)
    n = len(moe_layers(model))
    gates = [Care(0.3 + 0.05 * i, k_max=6) for i in range(n)]
    set_gate(model, gates)
    assert get_gates(model) == gates
    with pytest.raises(ValueError, match="k=7 .*N=6"):
        set_gate(model, TopK(7))
    with pytest.raises(ValueError, match="k_max=8 .*N=6"):
        set_gate(model, Care(0.5))
    with pytest.raises(ValueError, match="one per layer"):
        set_gate(model, gates[:3])
    assert get_gates(model) == gates   # a failed set_gate changes nothing


def test_dropout_is_real_and_deterministic_in_eval() -> None:
    layer = tiny_layer()
    layer.dropout.p = 0.5
    h = torch.randn(20, 12, dtype=torch.float64)
    assert torch.equal(layer(h), layer(h))
    layer.dropout.train()
    torch.manual_seed(0)
    a = layer(h)
    assert not torch.equal(a, layer(h))


def test_load_balance_loss_values_mask_and_grad() -> None:
    layer = tiny_layer(gate=TopK(2))
    model = nn.Sequential(layer)
    with pytest.raises(ValueError, match="forward"):
        load_balance_loss(model)
    with torch.no_grad():
        layer.router.weight.zero_()                            # uniform p: loss = 1 exactly
    layer(torch.randn(10, 12, dtype=torch.float64))
    assert float(load_balance_loss(model).detach()) == pytest.approx(1.0)
    tiny = tiny_layer(gate=TopK(2))
    model = nn.Sequential(tiny)
    h = torch.randn(2, 6, 12, dtype=torch.float64)
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1, 2:] = False
    set_token_mask(model, mask)
    tiny(h)
    masked = load_balance_loss(model)
    set_token_mask(model, None)
    tiny(h[mask])                                              # only the real tokens
    torch.testing.assert_close(masked, load_balance_loss(model))
    masked.backward()
    assert tiny.router.weight.grad is not None and tiny.router.weight.grad.abs().sum() > 0
    assert tiny.base_layer.weight.grad is None


def test_training_step_reaches_experts_and_router_only() -> None:
    model = inject(tiny_bert(), MoELoRAConfig())
    randomize(model)
    model.train()
    out = model(**batch()).last_hidden_state
    (out.pow(2).mean() + 0.01 * load_balance_loss(model)).backward()
    for name, p in model.named_parameters():
        assert (p.grad is not None) == p.requires_grad, name
    layer = moe_layers(model)[0]
    assert layer.lora_A.grad.abs().sum() > 0 and layer.lora_B.grad.abs().sum() > 0


def test_gram_cache_follows_lora_b_updates() -> None:
    layer = tiny_layer(gate=Care(0.8, k_max=6))
    layer.record = True
    h = torch.randn(16, 12, dtype=torch.float64)
    layer(h)
    d0 = layer.last_stats["disagreement"].clone()
    with torch.no_grad():
        layer.lora_B.mul_(torch.linspace(0.1, 3.0, 6, dtype=torch.float64)[:, None, None])
    layer(h)
    e = naive_expert_outputs(layer, h)
    probs = layer.router(h).softmax(-1)
    _, d_ref = care_k(probs, e, tau=0.8, k_max=6)
    torch.testing.assert_close(layer.last_stats["disagreement"].double(), d_ref, rtol=0,
                               atol=1e-6)
    assert not torch.equal(d0, layer.last_stats["disagreement"])


# --- real backbone ----------------------------------------------------------------------------

def test_real_minilm_injection_and_stats(monkeypatch, minilm_path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from transformers import AutoModel, AutoTokenizer

    path = str(minilm_path)
    model = AutoModel.from_pretrained(path).eval()
    tok = AutoTokenizer.from_pretrained(path)
    b = tok(["The mitochondria is the powerhouse of the cell.", "Which gas do plants absorb?",
             "2 + 2 = 4"], padding=True, return_tensors="pt")
    inject(model, MoELoRAConfig())
    assert len(moe_layers(model)) == 36
    randomize(model, router_std=0.1)
    set_gate(model, Care(0.5))
    record_stats(model, True)
    set_token_mask(model, b["attention_mask"].bool())
    with torch.no_grad():
        out = model(**b).last_hidden_state
    assert torch.isfinite(out).all()
    real = b["attention_mask"].bool()
    stats = layer_stats(model)
    assert len(stats) == 36
    for st in stats:
        for v in st.values():
            assert v.shape == real.shape and torch.isfinite(v).all()
        assert ((st["entropy"][real] > 0) & (st["entropy"][real] <= 1)).all()
        assert ((st["top1"][real] > 0) & (st["top1"][real] <= 1)).all()
        assert ((st["disagreement"][real] >= 0) & (st["disagreement"][real] <= 1)).all()
        assert ((st["k"][real] >= 1) & (st["k"][real] <= 8)).all()
        assert (st["k"][~real] == 0).all()
    assert not math.isnan(float(load_balance_loss(model)))


# --- fast paths against their references ------------------------------------------------------

def _unfused_reference(layer: MoELoRALinear, x: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """Output and stats by the plain formula: separate router and A matmuls, u = p~ z (no
    reuse), D from :func:`gram_disagreement` on a freshly built B_stack, the gate on top."""
    from baselines.moe import lb_parts as _lb_parts
    lead = x.shape[:-1]
    N, r = layer.n_experts, layer.rank
    h = x.reshape(-1, layer.in_features)
    T = h.shape[0]
    valid = layer.token_mask.reshape(-1) if layer.token_mask is not None else None
    probs = layer.router(h).softmax(-1)
    if layer.variant == "hmora":
        probs, _ = layer.hmora_route(probs, h, lead, valid)
    z = h @ layer.lora_A.reshape(-1, layer.in_features).T
    if layer.shared_a:
        z = z.repeat(1, N)
    b_stack = layer.lora_B.permute(1, 0, 2).reshape(layer.out_features, N * r)
    gram = b_stack.T @ b_stack
    z3 = z.view(T, N, r)
    sel = layer.gate.select(probs, lambda m: gram_disagreement(probs * m, z3, gram))
    w = probs * sel.mask
    w = w / w.sum(-1, keepdim=True)
    u = (w[:, :, None] * z3).reshape(T, N * r)
    y = layer.base_layer(x) + layer.scaling * (u @ b_stack.T).view(*lead, -1)
    d = (sel.disagreement if sel.disagreement is not None
         else gram_disagreement(probs * sel.d_mask, z3, gram))
    stats = {"k": sel.k.double(), "disagreement": d, "top1": probs.max(-1).values}
    if valid is not None:
        stats = {k: v * valid for k, v in stats.items()}
    assert _lb_parts(probs, sel.mask, valid) is not None
    return y, {k: v.view(lead) for k, v in stats.items()}


@pytest.mark.parametrize("variant", ["moe-lora", "loramoe", "hydralora", "mixlora", "dynmole",
                                     "hmora"])
@pytest.mark.parametrize("gate", [TopK(2), Care(0.7, k_max=5), Care(0.6, delta=0.2, k_max=6),
                                  NucleusOnly(0.8, k_max=6), EntropyK(0.6, k_max=6)])
def test_fast_forward_equals_unfused_reference(variant, gate) -> None:
    """Fused router+A matmul, in-place expert add, cached B rows and D from the layer's own u
    equal the plain formula on random inputs, for every routed variant (HydraLoRA's shared A,
    HMoRA's task router included), with a token mask."""
    torch.manual_seed(3)
    layer = MoELoRALinear(nn.Linear(12, 10, dtype=torch.float64), n_experts=6, rank=3,
                          alpha=6.0, dropout=0.1, gate=gate, variant=variant, depth=0.5).eval()
    with torch.no_grad():
        layer.lora_B.normal_()
        layer.router.weight.mul_(4.0)
    layer.record = True
    x = torch.randn(3, 7, 12, dtype=torch.float64)
    mask = torch.ones(3, 7, dtype=torch.bool)
    mask[1, 4:] = False
    layer.token_mask = mask
    for _ in range(2):                      # the second forward reads the caches
        y = layer(x)
        y_ref, st_ref = _unfused_reference(layer, x)
        torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
        for key, v in st_ref.items():
            torch.testing.assert_close(layer.last_stats[key].double(), v.float().double(),
                                       rtol=0, atol=1e-6)
        with torch.no_grad():               # caches must follow in-place updates
            layer.lora_B.mul_(1.5)
            layer.router.weight.add_(0.3)
            layer.lora_A.mul_(0.7)


def test_fused_path_gradients_equal_unfused_path(monkeypatch) -> None:
    """With dropout off the router and A share one matmul; its gradients (and the aux loss's)
    equal those of the separate matmuls the dropout path uses."""
    import baselines.moe.layer as moe_mod

    grads = []
    for fused in (True, False):
        layer = tiny_layer(gate=TopK(3))
        layer.train()
        if fused:
            layer.dropout.p = 0.0
        else:                               # dropout path with an identity dropout
            layer.dropout.p = 0.1
            monkeypatch.setattr(moe_mod, "fast_dropout", lambda h, p, **kw: h)
            monkeypatch.setattr(moe_mod, "dropout_scale", lambda p: 1.0)
        h = torch.randn(2, 5, 12, dtype=torch.float64, requires_grad=True)
        y = layer(h)
        (y.pow(2).mean() + 0.1 * load_balance_loss(nn.Sequential(layer))).backward()
        grads.append([layer.router.weight.grad, layer.lora_A.grad, layer.lora_B.grad, h.grad])
    for a, b in zip(*grads, strict=False):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_fast_dropout_rate_mean_and_gradient() -> None:
    from baselines.moe import dropout_scale, fast_dropout

    h = torch.ones(400, 500, requires_grad=True)
    torch.manual_seed(0)
    out = fast_dropout(h, 0.05)
    zero = out == 0
    assert abs(float(zero.float().mean()) - 0.05) < 3e-3
    assert float(out.detach().mean()) == pytest.approx(1.0, abs=3e-3)
    keep_scale = 65536 / (65536 - round(0.05 * 65536))
    torch.testing.assert_close(out[~zero], torch.full_like(out[~zero], keep_scale))
    out.sum().backward()
    torch.testing.assert_close(h.grad, out.detach())          # d out / d h = mask * scale
    torch.manual_seed(0)
    assert torch.equal(fast_dropout(h.detach(), 0.05), out.detach())   # seeded
    assert not torch.equal(fast_dropout(h.detach(), 0.05), out.detach())
    assert torch.equal(fast_dropout(h.detach(), 0.0), h.detach())
    torch.manual_seed(0)
    unscaled = fast_dropout(h.detach(), 0.05, scaled=False)
    torch.testing.assert_close(unscaled * dropout_scale(0.05), out.detach())
    odd = torch.randn(3, 7)                                   # numel not a multiple of 4
    assert fast_dropout(odd, 0.5).shape == odd.shape


def test_inject_keeps_train_eval_mode() -> None:
    model = inject(tiny_bert(), MoELoRAConfig())              # tiny_bert() is in eval mode
    assert all(not m.training for m in moe_layers(model))
    assert all(not layer.dropout.training for layer in moe_layers(model))
    model.train()
    assert all(layer.dropout.training for layer in moe_layers(model))


def test_dropout_path_equals_formula_on_the_dropped_input() -> None:
    """In train mode the experts read fast_dropout(h) (its scale folded into A): the output is
    the naive formula on that dropped input, the router reading h itself."""
    from baselines.moe import fast_dropout

    layer = tiny_layer(gate=TopK(3))
    layer.dropout.p = 0.3
    layer.dropout.train()
    h = torch.randn(15, 12, dtype=torch.float64)
    torch.manual_seed(5)
    y = layer(h)
    torch.manual_seed(5)
    hd = fast_dropout(h, 0.3)
    probs = layer.router(h).softmax(-1)
    top = probs >= probs.topk(3).values[:, -1:]
    w = probs * top
    w = w / w.sum(-1, keepdim=True)
    expect = layer.base_layer(h) + layer.scaling * torch.einsum(
        "tn,tno->to", w, naive_expert_outputs(layer, hd))
    torch.testing.assert_close(y, expect, rtol=1e-10, atol=1e-10)
