"""The compiled training path (`TrainConfig.compile`): static shapes by padding that changes no
real row's value, and compiled blocks that train as the eager ones."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from baselines.backbones import tiny_backbone
from baselines.heads import make_moe
from baselines.moe import MoELoRAConfig, load_balance_loss
from baselines.train import (
    LENGTH_BUCKET,
    TrainConfig,
    compile_context,
    static_shapes,
    train,
    transformer_blocks,
)
from tests.support.data import toy_records

#: dropout 0: the masks are then no question (inductor draws its own random numbers)
MOE = MoELoRAConfig(n_experts=4, rank=2, top_k=2, dropout=0.0)


def _padded(model, recs, n_rows: int, cap: int):
    """``recs`` padded to ``n_rows`` records with copies (as `train` does), then bucketed."""
    full = recs + [recs[i % len(recs)] for i in range(n_rows - len(recs))]
    return static_shapes(model.encode(full, cap), len(recs), cap,
                         model.tokenizer.pad_token_id or 0)


@pytest.mark.parametrize(("kind", "mode"), [("decoder", "letters"), ("decoder", "cloze"),
                                            ("encoder", "cross_encoder"),
                                            ("encoder", "bi_encoder")])
def test_padding_changes_no_real_row(kind: str, mode: str) -> None:
    """Lengths bucketed and the batch padded with masked copies: the real rows' logits and the
    load-balancing loss (padding tokens excluded) equal the unpadded batch's."""
    model = make_moe(tiny_backbone(kind), MOE, mode=mode).eval()
    recs = toy_records(5, seed=2, n_choices=(2, 3, 4))
    plain = model.encode(recs, 80)
    padded = _padded(model, recs, 8, 80)
    for key, t in padded.items():
        if t.dim() == 2:
            assert t.shape[1] in (LENGTH_BUCKET, 80) and t.shape[1] >= plain[key].shape[1], key
    assert len(padded["n_choices"]) == 8
    with torch.no_grad():
        ref, lb_ref = model(plain), load_balance_loss(model.backbone)
        out, lb = model(padded), load_balance_loss(model.backbone)
    assert torch.allclose(out[:5, :ref.shape[1]], ref, rtol=1e-5, atol=1e-6)
    assert torch.allclose(lb, lb_ref, rtol=1e-5, atol=1e-7)


def test_transformer_blocks_found() -> None:
    for kind in ("encoder", "decoder"):
        blocks = transformer_blocks(tiny_backbone(kind, layers=2).model)
        assert [type(b).__name__ for b in blocks] == \
            [{"encoder": "BertLayer", "decoder": "LlamaDecoderLayer"}[kind]] * 2


def test_compiled_blocks_restored_after_training() -> None:
    """Inference runs eagerly: the blocks' forwards are put back, an instance's own too; the
    MoE-LoRA layers take their autograd path while compiled (the hand-written step would break
    the graph) and their own setting after."""
    from baselines.moe import moe_layers

    model = make_moe(tiny_backbone("decoder", layers=2), MOE, mode="letters")
    blocks = transformer_blocks(model.backbone)
    hooked = blocks[1].forward
    blocks[1].forward = hooked                     # as accelerate's hooks set it
    layers = moe_layers(model.backbone)
    layers[0].fast_path = False                    # a layer's own choice is kept
    with compile_context(model, True):
        assert all(type(b.forward).__name__ != "method" for b in blocks)
        assert not any(layer.fast_path for layer in layers)
    assert "forward" not in blocks[0].__dict__ and blocks[1].__dict__["forward"] is hooked
    assert layers[0].fast_path is False and all(layer.fast_path for layer in layers[1:])
    assert "fast_path" not in layers[1].__dict__


def test_compile_option_validated() -> None:
    from uqbench.core.errors import ConfigError

    with pytest.raises(ConfigError, match="compile"):
        TrainConfig(compile="yes")


def test_compiled_training_equals_eager_and_compiles_once(heavy_compute) -> None:
    """Inductor on the CPU, a 1-block tiny Llama: the compiled blocks' gradients and the
    training losses equal eager ones (float32, rtol 1e-4: fused kernels sum in another order);
    the second epoch compiles nothing (same length bucket, last batch padded)."""
    recs = toy_records(12, seed=3)           # batches of 8 and 4 (padded to 8)
    cfg = TrainConfig(lr=5e-3, head_lr=1e-2, epochs=2, batch_size=8, max_length=64,
                      warmup_ratio=0.1)

    def fresh():
        return make_moe(tiny_backbone("decoder", layers=1), MOE, mode="letters")

    # one step's gradients: eager on the plain batch, compiled on the padded one
    eager, comp = fresh(), fresh()
    grads = []
    for model, compiled in ((eager, False), (comp, True)):
        model.train()
        batch = _padded(model, recs[:5], 8, 64) if compiled else model.encode(recs[:5], 64)
        labels = torch.tensor([r.answer for r in recs[:5]])
        with torch.random.fork_rng(), compile_context(model, compiled):
            torch.manual_seed(0)
            logits = model(batch)[:5]
            (F.cross_entropy(logits, labels) + load_balance_loss(model.backbone)).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()
                      if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) >= 4
    for n, g in grads[0].items():
        assert torch.allclose(grads[1][n], g, rtol=1e-4, atol=1e-7), n

    ref = train(fresh(), recs, cfg, progress=False)
    res = train(fresh(), recs, TrainConfig(**{**cfg.__dict__, "compile": "on"}), progress=False)
    assert ref.compile is None and res.steps == ref.steps == 4
    for got, want in ((res.losses, ref.losses), (res.aux_losses, ref.aux_losses),
                      (res.train_accuracy, ref.train_accuracy)):
        assert got == pytest.approx(want, rel=1e-4, abs=1e-7)
    log = res.compile
    assert log["blocks"] == 1 and log["graph_breaks"] == 0
    assert log["compiles_per_epoch"][0] >= 1 and log["compiles_per_epoch"][1] == 0
    assert res.to_json()["compile"] == log


def test_compile_option_plumbing() -> None:
    """``--compile`` reaches the profile of the run and the models' TrainConfig; auto is on
    only on CUDA."""
    from baselines.engine import train_config
    from baselines.train import compile_enabled
    from uqbench.cli import build_parser
    from uqbench.core.errors import ConfigError
    from uqbench.core.profiles import get_profile
    from uqbench.run.runner import RunConfig, prepare

    assert build_parser().parse_args(["run", "--compile", "on"]).compile == "on"
    assert get_profile("cpu").compile == "off"  # until a GPU measures the compiled step
    prof = prepare(RunConfig(profile="smoke", compile="on", scorers=("msp",)))[0]
    assert prof.compile == "on" and train_config(prof, 0).compile == "on"
    assert "compile" not in RunConfig().identity()
    with pytest.raises(ConfigError, match="compile"):
        prepare(RunConfig(profile="smoke", compile="always"))
    auto = TrainConfig(compile="auto")
    assert not compile_enabled(auto, torch.device("cpu"))
    assert compile_enabled(auto, torch.device("cuda"))
    assert compile_enabled(TrainConfig(compile="on"), torch.device("cpu"))


def test_compiled_dropout_stays_in_the_graph_and_draws_as_eager_rand(heavy_compute) -> None:
    """Dropout 0.05 under inductor on the CPU: the MoE-LoRA keep masks are drawn out of place in
    the graph (no graph break). With ``fallback_random`` inductor draws through aten, so one
    step's gradients equal eager ones whose masks come from the same ``torch.rand`` form (set
    through ``mask_draws``) within the float tolerance above (rtol 1e-4); eager's own draws
    (in-place 16-bit) give other masks, hence other gradients."""
    import torch._inductor.config

    from baselines.moe import moe_layers

    moe = MoELoRAConfig(n_experts=4, rank=2, top_k=2, dropout=0.05)
    recs = toy_records(5, seed=3)
    labels = torch.tensor([r.answer for r in recs])
    thr = round(moe.dropout * 65536) / 65536

    def rand_form(mask_of, h):   # the compiled path's mask, drawn eagerly
        return torch.rand(h.shape, device=h.device) >= thr

    def step(draws, compiled: bool):
        torch.manual_seed(7)
        model = make_moe(tiny_backbone("decoder", layers=1), moe, mode="letters").train()
        for layer in moe_layers(model.backbone):   # lora_B != 0: the masks reach every grad
            torch.nn.init.normal_(layer.lora_B, std=0.1)
            layer.mask_draws = draws
        batch = _padded(model, recs, 8, 64)        # the same shapes, hence the same draws
        with torch.random.fork_rng(), compile_context(model, compiled) as log, \
                torch._inductor.config.patch(fallback_random=True):
            torch.manual_seed(0)
            logits = model(batch)[:5]
            (F.cross_entropy(logits, labels) + load_balance_loss(model.backbone)).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        return grads, log

    (comp, log), (eager, _), (own, _) = (step(None, True), step(rand_form, False),
                                        step(None, False))
    assert log.to_json()["graph_breaks"] == 0
    assert comp.keys() == eager.keys() and any("lora_A" in n for n in comp)
    for n, g in eager.items():
        assert torch.allclose(comp[n], g, rtol=1e-4, atol=1e-7), n
    assert not all(torch.allclose(own[n], g, rtol=1e-4, atol=1e-7) for n, g in eager.items())


def test_compiled_fast_dropout_is_one_graph_at_its_keep_rate(heavy_compute) -> None:
    """`fast_dropout` compiles whole (``fullgraph``: no break) and, with inductor's own random
    numbers, keeps elements at its rate ``1 - round(p * 2**16) / 2**16`` (within 6 standard
    errors over 2**18 elements) and scales the kept ones as eager does; seeded draws repeat."""
    from baselines.moe import dropout_scale, fast_dropout

    p = 0.05
    drop = torch.compile(lambda h: fast_dropout(h, p), fullgraph=True, dynamic=False)
    h = torch.randn(512, 512)
    torch.manual_seed(3)
    out = drop(h)
    kept = out != 0
    rate, n = 1 - round(p * 65536) / 65536, h.numel()
    assert abs(kept.float().mean().item() - rate) < 6 * (rate * (1 - rate) / n) ** 0.5
    assert torch.equal(out[kept], h[kept] * dropout_scale(p))
    torch.manual_seed(3)
    assert torch.equal(drop(h), out)


def test_blocks_share_their_graphs_whatever_the_depth(heavy_compute, monkeypatch) -> None:
    """One graph per input kind (the first block's input needs no gradient, the others' do),
    not one per block, and none more on the next step: a training forward builds no KV cache,
    whose per-layer state dynamo would guard on (a 30-block model then compiled ~30 graphs per
    shape), and the dropout's zero is a constant of the graph, not a read of the layer's scalar
    cache, which the first eager backward fills (a guard on its contents compiled once more).
    Dynamo's eager backend: the guards are dynamo's, the same under inductor."""
    import functools

    from torch._dynamo.utils import counters

    from baselines.moe import layer

    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    recs = toy_records(4, seed=1)
    frames = {}
    for layers in (2, 5):
        torch._dynamo.reset()
        monkeypatch.setattr(layer, "SCALARS", {})  # as in a fresh process
        model = make_moe(tiny_backbone("decoder", layers=layers),
                         replace(MOE, dropout=0.05), mode="letters").train()
        batch = _padded(model, recs, 4, 64)
        for step in range(2):
            seen = counters["frames"]["ok"]
            with compile_context(model, True) as log:
                model(batch).sum().backward()
            frames[layers, step] = counters["frames"]["ok"] - seen
            assert log.to_json()["graph_breaks"] == 0
    assert frames == {(2, 0): 2, (2, 1): 0, (5, 0): 2, (5, 1): 0}
