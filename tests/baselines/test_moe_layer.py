"""The hand-written training step (`baselines.moe.layer.TopKStep`) against the autograd
reference."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

from baselines.gates import Care, NucleusOnly, RandomK, TopK
from baselines.moe import (
    MoELoRAConfig,
    MoELoRALinear,
    inject,
    load_balance_loss,
    moe_layers,
    record_stats,
    set_gate,
    set_token_mask,
)
from tests.baselines.test_moe import batch, randomize, tiny_bert, tiny_llama
from tests.support.devices import CpuOperands


def _step(model, fast: bool, b: dict, *, lb: bool = True, dtype=torch.float64):
    """Loss and gradients of one training step, fast path or reference, same dropout draws."""
    for layer in moe_layers(model):
        layer.fast_path = fast
    model.zero_grad(set_to_none=True)
    set_token_mask(model, b["attention_mask"].bool())
    torch.manual_seed(7)
    out = model(**b).last_hidden_state
    proj = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype)
    loss = (out * proj).mean() + (0.01 * load_balance_loss(model) if lb else 0.0)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads


@pytest.mark.parametrize("variant", ["moe-lora", "mixlora"])
@pytest.mark.parametrize("make", [tiny_llama, tiny_bert])
@pytest.mark.parametrize("lb", [True, False])
def test_fast_step_equals_reference(variant: str, make, lb: bool) -> None:
    """Float64: the loss equal to 1e-12 relative, every gradient to 1e-9 relative or 1e-12 of
    the largest gradient of the model (rounding only: the fast path folds the dropout scale
    into the mixture weights and sums in another order). The loss is a fixed random
    projection of the states (mean(h^2) is flat behind BERT's LayerNorm)."""
    model = inject(make(), MoELoRAConfig(n_experts=6, rank=3, top_k=2, dropout=0.2,
                                         variant=variant)).double().train()
    randomize(model, seed=1)
    b = batch()
    fast, ref = _step(model, True, b, lb=lb), _step(model, False, b, lb=lb)
    torch.testing.assert_close(fast[0], ref[0], rtol=1e-12, atol=0)
    assert fast[1].keys() == ref[1].keys() and len(ref[1]) == 3 * len(moe_layers(model))
    scale = max(float(g.abs().max()) for g in ref[1].values())
    for name, g in ref[1].items():
        torch.testing.assert_close(fast[1][name], g, rtol=1e-9, atol=1e-12 * scale, msg=name)


@pytest.mark.parametrize("variant", ["moe-lora", "mixlora"])
def test_fast_step_on_a_bfloat16_base_equals_reference(variant: str) -> None:
    """A bfloat16 base layer (a GPU's backbone) with float32 adapters (`trainable_dtype`) takes
    the fast step. Against the reference, with the layer's Switch loss: the float32 parameters'
    gradients equal to float32 rounding (1e-5 of the largest), the bfloat16 output to one
    bfloat16 rounding (2**-7 relative), the input gradient to one rounding of its largest
    element: the fast step adds the adapter's float32 part of dL/dh to the base's part and
    rounds once, where autograd rounds the adapter's part first, so where the parts cancel the
    two differ by a rounding of the parts, not of the sum."""
    torch.manual_seed(0)
    E, O, T = 48, 40, 64
    base = nn.Linear(E, O).to(torch.bfloat16).requires_grad_(False)
    layer = MoELoRALinear(base, n_experts=6, rank=3, gate=TopK(2), dropout=0.2,
                          variant=variant).train()
    with torch.no_grad():
        layer.lora_B.normal_(0, 0.1)
    assert {p.dtype for p in layer.parameters() if p.requires_grad} == {torch.float32}
    x, gy = torch.randn(T, E, dtype=torch.bfloat16), torch.randn(T, O)
    assert layer.takes_fast_step(x)
    out = {}
    for fast in (True, False):
        layer.fast_path = fast
        layer.zero_grad(set_to_none=True)
        xi = x.clone().requires_grad_(True)
        torch.manual_seed(5)
        y = layer(xi)
        ((y.float() * gy).sum() + layer.last_aux).backward()
        out[fast] = y.detach(), xi.grad, {n: p.grad for n, p in layer.named_parameters()
                                          if p.grad is not None}
    (y, gx, grads), (y_ref, gx_ref, grads_ref) = out[True], out[False]
    assert y.dtype == gx.dtype == torch.bfloat16 and len(grads_ref) == 3
    torch.testing.assert_close(y, y_ref, rtol=2**-7, atol=1e-5)
    torch.testing.assert_close(gx, gx_ref, rtol=0, atol=2**-7 * float(gx_ref.abs().max()))
    for name, g in grads_ref.items():
        torch.testing.assert_close(grads[name], g, rtol=0, atol=1e-5 * float(g.abs().max()),
                                   msg=name)


def test_the_fast_step_on_a_bfloat16_base_keeps_its_input_in_bfloat16() -> None:
    """For the backward, the fast step on a 16-bit base keeps the base's input as it came (and
    the dropout's bool mask), not the float32 copy the adapter multiplies nor its dropped copy:
    2 bytes an element instead of 8, the largest of its saved tensors at a real width."""
    T, E, O = 24, 40, 32
    base = nn.Linear(E, O).to(torch.bfloat16).requires_grad_(False)
    layer = MoELoRALinear(base, n_experts=6, rank=3, gate=TopK(2), dropout=0.2).train()
    x = torch.randn(T, E, dtype=torch.bfloat16, requires_grad=True)
    kept: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
        layer(x)
    assert layer.took_fast_step
    input_sized = {t.dtype for t in kept if sorted(t.shape) == sorted((T, E))}
    assert input_sized == {torch.bfloat16, torch.bool}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_no_cpu_tensor_reaches_a_device_op(dtype) -> None:
    """The fast step, the reference path and an eval pass with statistics, run on the meta
    device (standing in for a GPU), hand no op a CPU tensor (`CpuOperands`)."""
    base = nn.Linear(48, 40, device="meta", dtype=dtype).requires_grad_(False)
    layer = MoELoRALinear(base, n_experts=6, rank=3, gate=TopK(2), dropout=0.2).train()
    x = torch.randn(64, 48, device="meta", dtype=dtype, requires_grad=True)
    mode = CpuOperands()
    for fast in (True, False):
        layer.fast_path = fast
        with mode:
            (layer(x).float().sum() + layer.last_aux).backward()
    layer.eval()
    record_stats(layer, True)
    with mode, torch.no_grad():
        layer(x)
    assert mode.ops == []


def test_fast_step_only_where_it_applies() -> None:
    """Other gates, statistics, eval and no-grad forwards take the reference path; the fast
    path's gradients of lora_A and lora_B land in their parameters' layouts (no copy), which
    make A_stack and B_stack^T column-major views."""
    model = inject(tiny_llama(), MoELoRAConfig(n_experts=4, rank=2, top_k=2)).train()
    layer = moe_layers(model)[0]
    assert layer.takes_fast_step(torch.zeros(2, 32))
    set_gate(model, Care(0.5, k_max=4))
    assert not layer.takes_fast_step(torch.zeros(2, 32))
    set_gate(model, TopK(2))
    record_stats(model, True)
    assert not layer.takes_fast_step(torch.zeros(2, 32))
    record_stats(model, False)
    with torch.no_grad():
        assert not layer.takes_fast_step(torch.zeros(2, 32))
    assert layer.lora_B.shape == (4, layer.out_features, 2)
    model(**batch()).last_hidden_state.pow(2).mean().backward()
    assert layer.lora_B.grad.stride() == layer.lora_B.stride()
    assert layer.lora_A.grad.stride() == layer.lora_A.stride()
    views = layer.step_views()
    # (N*r, E) and (N*r, O), column-major, no copy
    for m, p in ((views.a, layer.lora_A), (views.b_rows, layer.lora_B)):
        assert m.stride(0) == 1 and m.data_ptr() == p.data_ptr()


def _syncs(fn) -> int:
    with profile(activities=[ProfilerActivity.CPU]) as p:
        fn()
    names = ("aten::_local_scalar_dense", "aten::nonzero", "aten::item", "aten::equal")
    return sum(e.name in names for e in p.events())


@pytest.mark.parametrize("gate", [Care(0.5), NucleusOnly(0.5), RandomK((0.5, 0.5)), TopK(2)])
def test_gates_no_host_sync(gate) -> None:
    """A gate's select reads nothing back to the host (Care compared k with torch.equal)."""
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(20, 6, generator=g), -1)
    def d(m):
        return torch.rand(m.shape[0], generator=g)
    assert _syncs(lambda: gate.select(probs, d)) == 0


def test_care_mask_unchanged_without_equal() -> None:
    """The admitted set is the top-k of the clipped k, as with the old torch.equal branch."""
    g = torch.Generator().manual_seed(3)
    probs = torch.softmax(torch.randn(50, 8, generator=g) * 2, -1)
    d = torch.rand(50, generator=g)
    for gate in (Care(0.7, k_max=3), Care(0.7), NucleusOnly(0.9, k_max=2), NucleusOnly(0.9)):
        sel = gate.select(probs, lambda m: d)
        assert torch.equal(sel.mask.sum(-1), sel.k)
        order = probs.argsort(-1, descending=True)
        ranks = torch.empty_like(order).scatter_(-1, order, torch.arange(8).expand(50, 8))
        assert torch.equal(sel.mask, ranks < sel.k[:, None])


def test_random_k_accelerator_draws() -> None:
    """The accelerator draw (inverse CDF with a generator of the device; run here on the CPU)
    follows the histogram and is reproducible from the seed."""
    cpu = torch.device("cpu")
    ks = [RandomK((0.2, 0.0, 0.8), seed=4).draw_inverse_cdf(20000, cpu) for _ in range(2)]
    assert torch.equal(ks[0], ks[1]) and ks[0].dtype == torch.int64
    freq = torch.bincount(ks[0], minlength=4)[1:].double() / ks[0].numel()
    torch.testing.assert_close(freq, torch.tensor([0.2, 0.0, 0.8], dtype=torch.float64),
                               atol=0.01, rtol=0)


@pytest.mark.parametrize("variant", ["moe-lora", "hydralora"])
@pytest.mark.parametrize("dropout", [0.0, 0.1])
@pytest.mark.parametrize("fast", [True, False])
def test_gradients_land_in_parameter_layouts(variant: str, dropout: float, fast: bool) -> None:
    """Both paths' gradients of lora_A and lora_B come out in their parameters' layouts:
    AccumulateGrad copies none of them (it clones a gradient of another layout)."""
    model = inject(tiny_llama(), MoELoRAConfig(n_experts=4, rank=2, top_k=2, dropout=dropout,
                                               variant=variant)).train()
    for layer in moe_layers(model):
        layer.fast_path = fast
    loss = model(**batch()).last_hidden_state.pow(2).mean()
    with profile(activities=[ProfilerActivity.CPU]) as p:
        loss.backward()
    accumulate = [e for e in p.events() if "AccumulateGrad" in e.name]
    assert len(accumulate) >= 3 * len(moe_layers(model))
    copies = [e for e in p.events() if e.name == "aten::copy_" and e.cpu_parent is not None
              and "AccumulateGrad" in e.cpu_parent.name]
    assert copies == []


def _keep_mask_before(h: torch.Tensor, p: float) -> torch.Tensor:
    """The keep mask eager training drew before masks could be drawn by copy or in a compiled
    graph (the code as it was): 16-bit draws, four per in-place 64-bit ``random_``."""
    thr = round(p * 65536)
    *lead, d = h.shape
    if d % 4 == 0:
        bits = torch.empty((*lead, d // 4), dtype=torch.int64, device=h.device)
        bits = bits.random_(-2**63, None).view(torch.int16)
    else:
        n = h.numel()
        bits = torch.empty((n + 3) // 4, dtype=torch.int64, device=h.device).random_(-2**63, None)
        bits = bits.view(torch.int16)[:n].view(h.shape)
    return bits >= torch.tensor(thr - 32768, dtype=torch.int16)


def test_training_draws_the_masks_it_drew_before() -> None:
    """Real training of a tiny Llama MoE-LoRA (fast step, dropout 0.05): with the same seed the
    losses, auxiliary losses and trained weights are bit for bit those of the same training
    whose masks come from the code as it was (set through ``mask_draws``), and not those of a
    training without dropout masks."""
    from baselines.backbones import tiny_backbone
    from baselines.heads import make_moe
    from baselines.train import TrainConfig, train
    from tests.support.data import toy_records

    cfg = MoELoRAConfig(n_experts=4, rank=2, top_k=2, dropout=0.05)
    recs = toy_records(12, seed=3)

    def run(draws):
        torch.manual_seed(5)
        model = make_moe(tiny_backbone("decoder", layers=2), cfg, mode="letters")
        for layer in moe_layers(model.backbone):
            layer.mask_draws = draws
        res = train(model, recs, TrainConfig(lr=5e-3, epochs=2, batch_size=8, max_length=48,
                                             seed=11), progress=False)
        return res, {n: p.detach().clone() for n, p in model.named_parameters()
                     if p.requires_grad}

    before = run(lambda mask_of, h: _keep_mask_before(h, cfg.dropout))
    now = run(None)
    assert now[0].losses == before[0].losses and now[0].aux_losses == before[0].aux_losses
    assert now[1].keys() == before[1].keys()
    assert all(torch.equal(now[1][n], w) for n, w in before[1].items())
    assert any("lora_B" in n and w.abs().sum() > 0 for n, w in now[1].items())   # it trained
    kept = run(lambda mask_of, h: torch.ones_like(h, dtype=torch.bool))   # the masks matter
    assert kept[0].losses != now[0].losses


#: ops that deterministic mode (every training runs in it) replaces on CUDA by slower ones,
#: e.g. a scatter of a tensor by a sorting index_put: (op, overload), None for every overload
DETERMINISTIC_DETOURS = {("scatter", "src"), ("scatter_", "src"), ("scatter_add", None),
                         ("scatter_add_", None), ("scatter_reduce", None),
                         ("scatter_reduce_", None), ("index_add", None), ("index_add_", None),
                         ("index_put", None), ("index_put_", None), ("_index_put_impl_", None),
                         ("index_copy", None), ("index_copy_", None), ("put", None),
                         ("put_", None)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fast_step_takes_no_op_deterministic_mode_replaces_on_cuda(monkeypatch, dtype) -> None:
    """The hand-written step's forward and backward (with the Switch loss), on a float32
    backbone and on a GPU's bfloat16 one, call none of the ops that deterministic mode reroutes
    on CUDA (`DETERMINISTIC_DETOURS`). It scattered the top-k probabilities (a tensor) into the
    mixture weights, which the check sees."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.seen: set[tuple[str, str]] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen.add((func.overloadpacket.__name__, func._overloadname))
            return func(*args, **(kwargs or {}))

    def detours(fn) -> set[tuple[str, str]]:
        with Ops() as ops:
            fn()
        return {(op, o) for op, o in ops.seen
                if (op, o) in DETERMINISTIC_DETOURS or (op, None) in DETERMINISTIC_DETOURS}

    from baselines.moe.layer import TopKStep

    model = inject(tiny_llama().to(dtype), MoELoRAConfig(n_experts=4, rank=2, top_k=2)).train()
    b = batch()
    set_token_mask(model, b["attention_mask"].bool())
    calls, apply = [], TopKStep.apply
    monkeypatch.setattr(TopKStep, "apply", lambda *a: calls.append(1) or apply(*a))
    def step():
        return (model(**b).last_hidden_state.float().pow(2).mean()
                + 0.01 * load_balance_loss(model)).backward()
    assert detours(step) == set()
    assert len(calls) == len(moe_layers(model))                   # every layer took the step
    probs = torch.rand(5, 4)
    top = probs.topk(2, dim=-1)
    assert detours(lambda: torch.zeros_like(probs).scatter_(1, top.indices, top.values)) == {
        ("scatter_", "src")}
