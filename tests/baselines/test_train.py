from __future__ import annotations

import os
import warnings
from collections import Counter

import pytest
import torch

from baselines.backbones import tiny_backbone
from baselines.gates import Care, TopK
from baselines.heads import make_moe
from baselines.moe import MoELoRAConfig, get_gates, moe_layers, set_gate
from baselines.train import GraphSteps, TrainConfig, batch_order, train
from tests.support.data import SMALL_MOE, toy_records
from uqbench.core.errors import ConfigError

FAST = TrainConfig(lr=5e-3, head_lr=1e-2, epochs=3, batch_size=8, max_length=48, warmup_ratio=0.1)


def _accuracy(model, records) -> float:
    with torch.no_grad():
        logits = model(model.encode(records, 48))
    return float((logits.argmax(1) == torch.tensor([r.answer for r in records])).float().mean())


@pytest.mark.parametrize(("kind", "mode"), [("encoder", "cross_encoder"), ("decoder", "cloze")])
def test_learns_toy_task(kind: str, mode: str) -> None:
    recs = toy_records(32, seed=1)
    model = make_moe(tiny_backbone(kind), SMALL_MOE, mode=mode)
    result = train(model, recs, FAST, progress=False)
    assert result.steps == 12 and len(result.losses) == 12 and result.seconds > 0
    first, last = sum(result.losses[:3]) / 3, sum(result.losses[-3:]) / 3
    assert last < first
    assert _accuracy(model, recs) >= 0.9
    assert all(a > 0 for a in result.aux_losses)   # load balancing is on
    assert not model.training
    # the batches' train accuracy rises with the loss falling
    assert sum(result.train_accuracy[-3:]) / 3 > sum(result.train_accuracy[:3]) / 3


def test_train_accuracy_per_step_and_training_log() -> None:
    """One train accuracy per step, a fraction of that step's batch; the JSON log and summary
    the runner stores with the checkpoint."""
    import json
    import math

    recs = toy_records(20, seed=4, n_choices=(2, 3, 4))
    model = make_moe(tiny_backbone("encoder"), SMALL_MOE)
    cfg = TrainConfig(epochs=2, batch_size=8, max_length=48)
    result = train(model, recs, cfg, progress=False)
    assert result.steps == 6 and len(result.train_accuracy) == result.steps
    assert all(0.0 <= a <= 1.0 for a in result.train_accuracy)
    assert all(any(abs(a * b - round(a * b)) < 1e-9 for b in (8, 4))
               for a in result.train_accuracy)  # a count over a batch of 8 or 4
    ks = [len(r.choices) for r in recs]
    assert result.chance_loss == pytest.approx(sum(map(math.log, ks)) / len(ks))
    assert result.chance_accuracy == pytest.approx(sum(1 / k for k in ks) / len(ks))
    log = json.loads(json.dumps(result.to_json()))
    assert log["steps"] == 6 and log["train_accuracy"] == list(result.train_accuracy)
    assert len(log["losses"]) == len(log["aux_losses"]) == 6 and log["seconds"] > 0
    summ = log["summary"]
    assert summ["first_loss"] == pytest.approx(sum(result.losses) / 6)  # 6 steps < window 10
    assert summ["last_train_accuracy"] == pytest.approx(sum(result.train_accuracy) / 6)
    assert result.summary(window=2)["last_loss"] == pytest.approx(sum(result.losses[-2:]) / 2)


def test_letters_loss_decreases() -> None:
    recs = toy_records(32, seed=2)
    model = make_moe(tiny_backbone("decoder"), SMALL_MOE, mode="letters")
    result = train(model, recs, FAST, progress=False)
    assert sum(result.losses[-4:]) < sum(result.losses[:4])


def test_deterministic_same_seed_and_differs_across_seeds() -> None:
    recs = toy_records(24, seed=3)
    cfg = TrainConfig(epochs=2, batch_size=8, max_length=48, seed=7)
    runs = []
    for seed in (7, 7, 8):
        model = make_moe(tiny_backbone("encoder"), SMALL_MOE)
        cfg_s = TrainConfig(**{**cfg.__dict__, "seed": seed})
        runs.append((train(model, recs, cfg_s, progress=False), model))
    (r1, m1), (r2, m2), (r3, _) = runs
    assert r1.losses == r2.losses
    for (n, p), (_, q) in zip(m1.named_parameters(), m2.named_parameters(), strict=False):
        assert torch.equal(p, q), n
    assert r1.losses != r3.losses


def test_global_rng_and_gates_restored() -> None:
    model = make_moe(tiny_backbone("encoder"), MoELoRAConfig(n_experts=4, rank=2, top_k=2))
    set_gate(model.backbone, Care(tau=0.5, k_max=4))
    torch.manual_seed(123)
    state = torch.get_rng_state()
    train(model, toy_records(8), TrainConfig(epochs=1, batch_size=8, max_length=32),
          progress=False)
    assert torch.equal(torch.get_rng_state(), state)
    assert all(isinstance(g, Care) for g in get_gates(model.backbone))


def test_deterministic_settings_restored_and_no_nan_fill_while_training(monkeypatch) -> None:
    import torch.utils.deterministic as det

    seen = []
    real_step = torch.optim.AdamW.step

    def step(self, *a, **k):                   # the settings in force inside the loop
        seen.append((torch.are_deterministic_algorithms_enabled(), det.fill_uninitialized_memory))
        return real_step(self, *a, **k)

    monkeypatch.setattr(torch.optim.AdamW, "step", step)
    before = (torch.are_deterministic_algorithms_enabled(),
              torch.is_deterministic_algorithms_warn_only_enabled(), det.fill_uninitialized_memory)
    model = make_moe(tiny_backbone("encoder"), MoELoRAConfig(n_experts=4, rank=2, top_k=2))
    train(model, toy_records(8), TrainConfig(epochs=1, batch_size=4, max_length=32),
          progress=False)
    assert seen == [(True, False)] * 2
    assert (torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
            det.fill_uninitialized_memory) == before


@pytest.mark.parametrize(("device", "config", "recorded"),
                         [("cuda", None, True), ("cuda", ":4096:8", False),
                          ("cuda", ":16:8", False), ("cuda", ":1024:2", True),
                          ("cpu", None, False)])
def test_nondeterministic_gpu_matmuls_are_recorded(monkeypatch, device, config,
                                                   recorded) -> None:
    """A training on CUDA without a deterministic cuBLAS workspace is not deterministic (PyTorch
    only warns, on each matmul): it goes to run.json ``fallbacks``, naming the variable's value
    and the settings that would make it deterministic. No CUDA is touched."""
    from baselines.train import deterministic_training
    from uqbench.core.errors import FallbackWarning, reset_fallbacks

    if config is None:
        monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    else:
        monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", config)
    fallbacks = reset_fallbacks()
    with pytest.warns(FallbackWarning) if recorded else warnings.catch_warnings():
        if not recorded:
            warnings.simplefilter("error", FallbackWarning)
        with deterministic_training(torch.device(device)):
            assert torch.are_deterministic_algorithms_enabled()
    assert len(fallbacks) == recorded
    if recorded:
        assert fallbacks[0]["where"] == "cuBLAS"
        assert repr(config) in fallbacks[0]["reason"] and ":4096:8" in fallbacks[0]["reason"]
    reset_fallbacks()


@pytest.mark.parametrize(("gpu", "started", "before", "after"),
                         [(True, False, None, ":4096:8"), (True, False, ":1024:2", ":1024:2"),
                          (True, False, "", ""), (True, True, None, None),
                          (False, False, None, None)])
def test_a_run_makes_gpu_matmuls_deterministic_before_cuda_starts(monkeypatch, gpu, started,
                                                                  before, after) -> None:
    """The torch backend's process setup (`TorchBackend.set_threads`, before any model work)
    sets ``CUBLAS_WORKSPACE_CONFIG`` to ``:4096:8`` only where a GPU is present, CUDA has not
    started (cuBLAS reads it once) and the user set nothing; then a CUDA training records no
    fallback. No CUDA is touched: availability and start are faked."""
    from baselines.engine import TorchBackend
    from baselines.train import deterministic_training
    from uqbench.core.errors import reset_fallbacks

    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: started)
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", before or "")  # restored after, set or not
    if before is None:
        monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
    threads = torch.get_num_threads()
    try:
        assert TorchBackend().set_threads(1) == 1
    finally:
        torch.set_num_threads(threads)
    assert os.environ.get("CUBLAS_WORKSPACE_CONFIG") == after
    fallbacks = reset_fallbacks()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with deterministic_training(torch.device("cuda")):
            pass
    assert len(fallbacks) == (after != ":4096:8")
    reset_fallbacks()


def test_adapters_on_a_bfloat16_backbone_train_in_float32(monkeypatch) -> None:
    """On a 16-bit backbone (a GPU's bfloat16) the MoE-LoRA parameters are float32, as peft makes
    the dense LoRA baseline's, and the training takes the hand-written step: a small AdamW step
    moves every router weight the Switch loss reaches, where in bfloat16 (|w| ~ 0.1, spacing
    ~5e-4) a 1e-5 update rounds away."""
    from baselines.moe import layer as moe_layer

    bb = tiny_backbone("decoder")
    bb.model.to(torch.bfloat16)
    model = make_moe(bb, SMALL_MOE)
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert {p.dtype for p in params.values()} == {torch.float32}
    assert {p.dtype for p in model.parameters() if not p.requires_grad} == {torch.bfloat16}
    steps = []
    apply = moe_layer.TopKStep.apply
    monkeypatch.setattr(moe_layer.TopKStep, "apply",
                        lambda *a: steps.append(1) or apply(*a))
    before = {n: p.detach().clone() for n, p in params.items()}
    train(model, toy_records(8), TrainConfig(epochs=1, batch_size=8, lr=1e-5, warmup_ratio=0.0,
                                             max_length=32), progress=False)
    assert len(steps) == len(moe_layers(model))
    routers = [n for n in params if n.endswith("router.weight")]
    moved = [float((params[n] != before[n]).float().mean()) for n in routers]
    assert routers and min(moved) > 0.9, moved


def _graph_holders(model: torch.nn.Module) -> list[str]:
    """The attributes of ``model``'s modules that hold a tensor of an autograd graph."""
    found: list[str] = []

    def walk(name: str, value: object) -> None:
        if isinstance(value, torch.Tensor):
            if value.grad_fn is not None:
                found.append(name)
        elif isinstance(value, (tuple, list)):
            for i, v in enumerate(value):
                walk(f"{name}[{i}]", v)
        elif isinstance(value, dict):
            for k, v in value.items():
                walk(f"{name}[{k!r}]", v)

    for mod_name, mod in model.named_modules():
        for key, value in vars(mod).items():
            walk(f"{mod_name or 'model'}.{key}", value)
    return found


@pytest.mark.parametrize(("kind", "mode", "variant"), [
    ("decoder", "letters", "moe-lora"), ("decoder", "cloze", "loramoe"),
    ("encoder", "cross_encoder", "moe-lora"), ("decoder", "letters", None)])
def test_no_autograd_graph_outlives_its_training_step(monkeypatch, kind, mode, variant) -> None:
    """When a step's forward starts, nothing the model keeps holds the last step's autograd
    graph: a kept graph holds its gradient accumulators, and on a GPU these run on the stream
    that made them, which breaks a CUDA graph capture of the next step (and keeps memory)."""
    from dataclasses import replace

    from baselines.dense import make_dense

    model = (make_moe(tiny_backbone(kind), replace(SMALL_MOE, variant=variant), mode=mode)
             if variant else make_dense(tiny_backbone(kind), "lora", mode=mode))   # None: LoRA
    held = []
    forward = type(model).forward

    def spy(self, batch):
        held.append(_graph_holders(self))
        return forward(self, batch)

    monkeypatch.setattr(type(model), "forward", spy)
    train(model, toy_records(16), TrainConfig(epochs=1, batch_size=8, max_length=32),
          progress=False)
    # step_zero's two forwards (16 questions of one domain, 8 a batch), then the two steps
    assert len(held) == 4 and held == [[]] * 4, held
    assert _graph_holders(model) == []


def test_trains_with_topk_gate(monkeypatch) -> None:
    model = make_moe(tiny_backbone("encoder"), SMALL_MOE)
    set_gate(model.backbone, Care(tau=0.5, k_max=4))
    seen = []
    forward = type(model).forward

    def spy(self, batch):
        seen.append(get_gates(self.backbone)[0])
        return forward(self, batch)

    monkeypatch.setattr(type(model), "forward", spy)
    train(model, toy_records(8), TrainConfig(epochs=1, batch_size=8, max_length=32),
          progress=False)
    assert seen and all(g == TopK(SMALL_MOE.top_k) for g in seen)


def test_batch_order_covers_every_record_once() -> None:
    recs = toy_records(37)
    for bucket in (True, False):
        gen = torch.Generator().manual_seed(0)
        batches = batch_order(recs, 8, gen, bucket=bucket)
        flat = [i for b in batches for i in b]
        assert sorted(flat) == list(range(37)) and all(1 <= len(b) <= 8 for b in batches)
        again = batch_order(recs, 8, torch.Generator().manual_seed(0), bucket=bucket)
        assert again == batches


@pytest.mark.parametrize("bad", [{"lr": 0}, {"epochs": 0}, {"batch_size": 0},
                                 {"warmup_ratio": 1.0}, {"grad_clip": -1.0}, {"max_length": 2}])
def test_config_validation(bad: dict) -> None:
    with pytest.raises(ConfigError, match=next(iter(bad))):
        TrainConfig(**bad)


def test_empty_records_rejected() -> None:
    with pytest.raises(ConfigError, match="no training records"):
        train(make_moe(tiny_backbone("encoder"), SMALL_MOE), [], TrainConfig(), progress=False)


def test_non_finite_loss_raises_at_the_next_read(monkeypatch) -> None:
    """The loss is read from the device every LOG_EVERY steps (no host sync per step); a
    non-finite one still stops training there, naming its step."""
    import baselines.train as T

    real_ce = T.F.cross_entropy
    calls = []

    def ce(*a, **k):
        calls.append(1)
        out = real_ce(*a, **k)
        return out * float("nan") if len(calls) == 2 else out   # step 1 goes NaN

    monkeypatch.setattr(T, "LOG_EVERY", 3)
    monkeypatch.setattr(T.F, "cross_entropy", ce)
    model = make_moe(tiny_backbone("encoder"), SMALL_MOE)
    with pytest.raises(FloatingPointError, match="loss is nan at step 1"):
        train(model, toy_records(40), TrainConfig(epochs=1, batch_size=4, max_length=32),
              progress=False)
    assert len(calls) == 3   # read after step 3 (index 2), not at the end of the 10 steps


class _FakeGraphs(GraphSteps):
    """`baselines.train.GraphSteps` on the CPU: no stream, and a "graph" that is the captured
    step itself, re-run on each replay from the static buffers it was captured with (what a
    replay's kernels read). Capturing runs nothing, as on a GPU."""

    def __init__(self, device, world) -> None:
        self.graphs, self.eager, self.replays, self.returned = {}, Counter(), 0, []

    def __call__(self, enc, labels, n):
        self.returned.append(super().__call__(enc, labels, n))
        return self.returned[-1]

    def _side_stream(self):
        import contextlib
        return contextlib.nullcontext()

    def _capture(self, fn):
        return fn, None

    def _replay(self, graph, outs):
        self.replays += 1
        return graph()


def test_graph_steps_train_as_the_eager_loop(monkeypatch) -> None:
    """The graph path's bookkeeping, on the CPU with a fake graph (`_FakeGraphs`): each batch
    shape warms up eagerly, is captured once, then every later step of that shape copies its
    batch into the captured buffers and replays. Its training equals, bit for bit, the same
    path with no step captured (so every replay read its own batch), and the eager loop's
    losses within float tolerance (its batches are padded to static shapes; dropout 0, so that
    the masks do not change with the padding). Gradients are zeroed in place, never dropped."""
    from dataclasses import replace

    from baselines import train as train_mod

    recs = toy_records(40, seed=3)   # 5 steps an epoch, the last one of 4 questions: 2 shapes
    cfg = TrainConfig(epochs=3, batch_size=9, max_length=32, warmup_ratio=0.0, lr=1e-2)
    moe = replace(SMALL_MOE, dropout=0.0)
    made: list[_FakeGraphs] = []
    monkeypatch.setattr(train_mod, "GraphSteps",
                        lambda device, world: made.append(_FakeGraphs(device, world)) or made[-1])
    zeroed: list[bool] = []
    zero_grad = torch.optim.AdamW.zero_grad
    monkeypatch.setattr(torch.optim.AdamW, "zero_grad",
                        lambda self, set_to_none=True: zeroed.append(set_to_none)
                        or zero_grad(self, set_to_none))

    def run(warmup: int):
        monkeypatch.setattr(train_mod, "GRAPH_WARMUP", warmup)
        model = make_moe(tiny_backbone("decoder"), moe)
        return model, train(model, recs, replace(cfg, cuda_graph=True), progress=False)

    plain, uncaptured = run(10**6)
    graphed, got = run(2)
    g = made[-1]
    assert len(g.graphs) == 2 and list(g.eager.values()) == [2, 2]
    assert g.replays == got.steps - 4 == 11 and made[0].replays == 0
    # a real runner keeps the captured step's outputs: they hold no autograd graph
    assert len(g.returned) == 15 and not [t for outs in g.returned for t in outs
                                          if t.grad_fn is not None]
    assert zeroed == [False] * 30
    assert (got.losses, got.aux_losses) == (uncaptured.losses, uncaptured.aux_losses)
    for (name, a), b in zip(graphed.named_parameters(), plain.parameters(), strict=False):
        assert torch.equal(a, b), name
    ref = train(make_moe(tiny_backbone("decoder"), moe), recs, cfg, progress=False)
    assert torch.allclose(torch.tensor(got.losses), torch.tensor(ref.losses), rtol=1e-5)
    assert torch.allclose(torch.tensor(got.aux_losses), torch.tensor(ref.aux_losses), rtol=1e-5)


def test_graph_steps_need_cuda_and_refuse_compile() -> None:
    """Asked for where it cannot run, the graph path says so before anything changes."""
    model = make_moe(tiny_backbone("decoder"), SMALL_MOE)
    set_gate(model.backbone, Care(tau=0.5, k_max=4))
    with pytest.raises(ConfigError, match="cuda_graph needs one process with the model on a "
                                          "CUDA device"):
        train(model, toy_records(8), TrainConfig(epochs=1, cuda_graph=True), progress=False)
    assert get_gates(model.backbone)[0] == Care(tau=0.5, k_max=4)   # the model as it was
    with pytest.raises(ConfigError, match="TrainConfig.cuda_graph=True is invalid"):
        TrainConfig(cuda_graph=True, compile="on")


def test_the_cuda_graph_option_reaches_the_training_or_is_refused_before_any_work(
        monkeypatch) -> None:
    """``--cuda-graph``: the profile's setting, overridden by the run; ``auto`` is on only on
    CUDA with one process; ``on`` without CUDA is refused by ``prepare`` (before any data),
    and so is ``on`` beside ``compile on``. A graph-trained model gets its own cache key."""
    from dataclasses import replace

    from baselines import distributed
    from baselines.engine import train_config
    from uqbench.cli import build_parser
    from uqbench.core.profiles import get_profile
    from uqbench.run.runner import RunConfig, prepare

    assert build_parser().parse_args(["run", "--cuda-graph", "auto"]).cuda_graph == "auto"
    assert get_profile("gpu").cuda_graph == "off" and "cuda_graph" not in RunConfig().identity()
    prof = prepare(RunConfig(profile="smoke", cuda_graph="auto", scorers=("msp",)))[0]
    assert prof.cuda_graph == "auto"
    assert not train_config(prof, 0, torch.device("cpu")).cuda_graph
    assert train_config(prof, 0, torch.device("cuda")).cuda_graph
    monkeypatch.setattr(distributed, "world", lambda: 2)
    assert not train_config(prof, 0, torch.device("cuda")).cuda_graph
    monkeypatch.undo()
    assert not train_config(replace(prof, cuda_graph="off"), 0, torch.device("cuda")).cuda_graph
    with pytest.raises(ConfigError, match="cuda_graph on needs a CUDA device and one process "
                                          r"\(here: CUDA not found, 1 process"):
        prepare(RunConfig(profile="smoke", cuda_graph="on", scorers=("msp",)))
    with pytest.raises(ConfigError, match="cuda_graph='on' is out of range"):
        prepare(RunConfig(profile="smoke", cuda_graph="on", compile="on", scorers=("msp",)))


def test_the_memory_options_reach_the_profile_and_training_or_are_refused() -> None:
    """``--eval-tokens`` and ``--grad-checkpoint`` override the profile (which keeps neither by
    default); checkpointing reaches `TrainConfig` and turns ``cuda_graph auto`` off; bad values
    and conflicts are refused by ``prepare``, before any data work."""
    from baselines.engine import train_config
    from uqbench.cli import build_parser
    from uqbench.core.profiles import PROFILES
    from uqbench.run.runner import RunConfig, prepare

    args = build_parser().parse_args(["run", "--eval-tokens", "4096", "--grad-checkpoint"])
    assert (args.eval_tokens, args.grad_checkpoint) == (4096, True)
    plain = build_parser().parse_args(["run"])
    assert (plain.eval_tokens, plain.grad_checkpoint) == (None, None)
    assert all(p.eval_tokens is None and not p.grad_checkpoint
               for p in (PROFILES.get(n) for n in PROFILES.names()))
    assert not {"eval_tokens", "grad_checkpoint"} & set(RunConfig().identity())
    prof = prepare(RunConfig(profile="smoke", eval_tokens=4096, grad_checkpoint=True,
                             cuda_graph="auto", scorers=("msp",)))[0]
    assert (prof.eval_tokens, prof.grad_checkpoint) == (4096, True)
    cfg = train_config(prof, 0, torch.device("cuda"))
    assert cfg.grad_checkpoint and not cfg.cuda_graph
    with pytest.raises(ConfigError, match="eval_tokens=0 is out of range"):
        prepare(RunConfig(profile="smoke", eval_tokens=0, scorers=("msp",)))
    with pytest.raises(ConfigError, match="grad_checkpoint=True is out of range"):
        prepare(RunConfig(profile="smoke", grad_checkpoint=True, compile="on",
                          scorers=("msp",)))

def test_the_step_benchmark_times_the_graph_path_and_restores_the_precision(monkeypatch
                                                                          ) -> None:
    """`benchmarks.bench_train_step`'s graph fields, run on the CPU through the fake graph: the
    marginal step at both matmul precisions, and PyTorch's precision as it was after."""
    from baselines import train as train_mod
    from benchmarks import bench_train_step as bench

    monkeypatch.setattr(train_mod, "GraphSteps", _FakeGraphs)
    monkeypatch.setattr(bench, "STEPS", 2)
    monkeypatch.setattr(bench, "GRAPH_STEPS", 4)
    seen = []
    real_train = train_mod.train
    monkeypatch.setattr(train_mod, "train", lambda *a, **k: seen.append(
        (a[2].cuda_graph, torch.get_float32_matmul_precision())) or real_train(*a, **k))
    before = torch.get_float32_matmul_precision()
    out = bench.graph_fields("moe", make_moe(tiny_backbone("decoder"), SMALL_MOE), 2, 16)
    assert set(out) == {"moe_graph_s_per_step", "moe_graph_tf32_s_per_step",
                        "moe_graph_first_s"}
    assert all(isinstance(v, float) for v in out.values())
    # a short and a long training (each after a warm-up one) at each precision, all graphed
    assert seen == [(True, "highest")] * 4 + [(True, "high")] * 4
    assert torch.get_float32_matmul_precision() == before


def test_the_step_benchmark_alternates_the_models_and_takes_the_median_of_its_rounds(
        monkeypatch) -> None:
    """`benchmarks.bench_train_step` times MoE-LoRA and dense LoRA in alternation (a fake clock:
    each training "takes" the next time of its model's list), reports the median of its rounds
    and each round's ratio, and the floor from the adapter products' extra seconds."""
    from benchmarks import bench_train_step as bench

    times = {"moe": [0.30, 0.10, 0.20], "lora": [0.10, 0.05, 0.20]}
    order = []

    def seconds(model, records, batch, max_length, grad_checkpoint=False):
        kind = "moe" if model.has_moe else "lora"
        order.append(kind + ("_ckpt" if grad_checkpoint else ""))
        return 0.5 if grad_checkpoint else times[kind][sum(o == kind for o in order) - 1]

    monkeypatch.setattr(bench, "seconds_per_step", seconds)
    monkeypatch.setattr(bench, "product_seconds",
                        lambda shapes, tokens, rank, *_: {128: 0.03, 8: 0.01}[rank])
    line = bench.ratio_line("tiny-llama", tiny_backbone("decoder"), 2, 16, 1)
    assert order == ["moe", "lora"] * bench.ROUNDS + ["moe_ckpt"]
    assert (line["moe_s_per_step"], line["lora_s_per_step"]) == (0.2, 0.1)
    assert line["ratio"] == 2.0 and line["met"] is False
    assert line["ratio_rounds"] == [3.0, 2.0, 1.0]
    assert line["extra_product_s_per_step"] == 0.02 and line["floor_ratio"] == 1.2
    assert line["ckpt_ratio"] == 2.5


@pytest.mark.parametrize(("kind", "mode"), [("encoder", "cross_encoder"), ("decoder", "letters")])
def test_gradient_checkpointing_trains_as_without_and_keeps_less(kind: str, mode: str) -> None:
    """``grad_checkpoint``: the same losses and trained weights (the recomputed blocks redraw
    the same dropout masks), a smaller peak of a step's memory, and the backbone as it was
    after; refused beside the graph path and compile on."""
    from baselines.train import checkpointed
    from benchmarks.bench_memory import peak_bytes

    recs = toy_records(16, seed=2)
    cfg = TrainConfig(epochs=1, batch_size=8, max_length=48, lr=5e-3)
    runs = []
    for ckpt in (False, True):
        model = make_moe(tiny_backbone(kind, layers=4, hidden=64), SMALL_MOE, mode=mode)
        calls = Counter()
        moe_layers(model.backbone)[0].register_forward_hook(lambda *_, c=calls: c.update([1]))
        res = train(model, recs, TrainConfig(**{**cfg.__dict__, "grad_checkpoint": ckpt}),
                    progress=False)
        # recomputed in the backward; step_zero's two batches of 8 run once, before
        assert calls[1] == res.steps * (2 if ckpt else 1) + 2
        assert not any(getattr(m, "gradient_checkpointing", False)
                       for m in model.backbone.modules())
        runs.append((res, model))
    (r0, m0), (r1, m1) = runs
    assert r0.losses == pytest.approx(r1.losses, rel=1e-5)
    for (n, p), (_, q) in zip(m0.named_parameters(), m1.named_parameters(), strict=False):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6, msg=n)
    batch, labels = m0.encode(recs[:8], 48), torch.tensor([r.answer for r in recs[:8]])
    m0.train()

    def step() -> None:
        torch.nn.functional.cross_entropy(m0(batch), labels).backward()

    plain = peak_bytes(step, grad=True)
    with checkpointed(m0, True):
        kept = peak_bytes(step, grad=True)
        # the backward's recompute leaves the layers' state of the step's forward (replaced,
        # it would hold every recomputed block's graph, and their activations, to the end)
        logits = m0(batch)
        state = [m.forward_state for m in moe_layers(m0.backbone)]
        assert any(f is not None or a is not None for _, a, f, _ in state)
        torch.nn.functional.cross_entropy(logits, labels).backward()
        assert all(x is y for s, m in zip(state, moe_layers(m0.backbone), strict=False)
                   for x, y in zip(s, m.forward_state, strict=True))
    assert kept < plain
    for other in ({"cuda_graph": True}, {"compile": "on"}):
        with pytest.raises(ConfigError, match="TrainConfig.grad_checkpoint=True is invalid"):
            TrainConfig(grad_checkpoint=True, **other)


def _two_domains(n: int = 24) -> list:
    from dataclasses import replace

    return [replace(r, domain="sci" if i % 3 else "code") for i, r in
            enumerate(toy_records(n, seed=4, n_choices=(3, 4)))]


def test_step_zero_is_the_untrained_models_loss_per_domain() -> None:
    """The loss before any update: the same model's cross-entropy and accuracy on each domain's
    first questions, computed here from its logits by hand (numpy)."""
    import numpy as np

    from baselines.forward import collect
    from baselines.train import step_zero

    recs = _two_domains()
    model = make_moe(tiny_backbone("decoder"), SMALL_MOE, mode="letters")
    got = step_zero(model, recs, max_length=48, batch_size=5)
    logits = collect(model, recs, batch_size=64, max_length=48, progress=False)["logits"]
    labels = np.array([r.answer for r in recs])
    logp = logits - np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1, keepdims=True)) \
        - logits.max(1, keepdims=True)
    ce, right = -logp[np.arange(len(recs)), labels], logits.argmax(1) == labels
    for d in ("sci", "code"):
        mine = np.array([r.domain == d for r in recs])
        assert got["domains"][d]["n"] == mine.sum()
        assert got["domains"][d]["loss"] == pytest.approx(ce[mine].mean(), abs=1e-5)
        assert got["domains"][d]["accuracy"] == pytest.approx(right[mine].mean())
    assert (got["loss"], got["accuracy"], got["n"]) == pytest.approx(
        (ce.mean(), right.mean(), len(recs)), abs=1e-5)
    # capped per domain: the first STEP_ZERO_QUESTIONS of each
    import baselines.train as T
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(T, "STEP_ZERO_QUESTIONS", 3)
        capped = step_zero(model, recs, max_length=48, batch_size=5)
    first = [i for i, r in enumerate(recs) if r.domain == "code"][:3]
    assert capped["domains"]["code"]["loss"] == pytest.approx(ce[first].mean(), abs=1e-5)


def test_per_domain_curves_at_each_read_add_up_to_the_logged_steps(monkeypatch) -> None:
    """Each point of a domain's curve is the mean over its questions in the steps since the
    last read; weighted by their counts, the domains give back each interval's logged batch
    losses and accuracies (weighted by batch size)."""
    import baselines.train as T

    monkeypatch.setattr(T, "LOG_EVERY", 2)
    recs = _two_domains(27)
    model = make_moe(tiny_backbone("encoder"), SMALL_MOE)
    res = train(model, recs, TrainConfig(epochs=2, batch_size=4, max_length=32, lr=5e-3),
                progress=False)
    c = res.curves
    assert c is not None and res.initial is not None
    assert res.steps == 14 and c["steps"] == [2, 4, 6, 8, 10, 12, 14]
    assert res.initial["domains"]["sci"]["n"] == sum(r.domain == "sci" for r in recs)
    doms = c["domains"]
    assert sum(sum(doms[d]["n"]) for d in doms) == 2 * len(recs)   # every question, each epoch
    gen = torch.Generator().manual_seed(0)   # the training's batches: 27 = 6 * 4 + 3 an epoch
    sizes = [len(b) for _ in range(2) for b in batch_order(recs, 4, gen)]
    prev = 0
    for k, step in enumerate(c["steps"]):
        span = range(prev, step)
        n = sum(doms[d]["n"][k] for d in doms)
        assert n == sum(sizes[i] for i in span)
        loss = sum(doms[d]["loss"][k] * doms[d]["n"][k] for d in doms if doms[d]["n"][k])
        acc = sum(doms[d]["accuracy"][k] * doms[d]["n"][k] for d in doms if doms[d]["n"][k])
        assert loss == pytest.approx(sum(res.losses[i] * sizes[i] for i in span), rel=1e-5)
        assert acc == pytest.approx(sum(res.train_accuracy[i] * sizes[i] for i in span))
        prev = step
    log = res.to_json()
    assert log["initial"] == res.initial and log["curves"] == c


def test_non_finite_gradient_stops_training_naming_step_layer_and_setting(monkeypatch) -> None:
    """A gradient forced to NaN in one adapted layer from the third step on: training stops at
    the read after it (`LOG_EVERY`), naming that step, that layer and the setting."""
    import baselines.train as T
    from baselines.train import NonFiniteLoss

    monkeypatch.setattr(T, "LOG_EVERY", 4)
    model = make_moe(tiny_backbone("decoder"), SMALL_MOE, mode="letters")
    name, layer = next((n, m) for n, m in model.named_modules() if m in moe_layers(model.backbone))
    calls = []

    def poison(g):
        calls.append(1)
        return g * float("nan") if len(calls) >= 3 else g

    layer.lora_A.register_hook(poison)
    with pytest.raises(NonFiniteLoss) as err:
        train(model, toy_records(40), TrainConfig(epochs=1, batch_size=4, max_length=32,
                                                   lr=1e-3), progress=False)
    e = err.value
    assert e.step == 2 and e.layers == [name]
    msg = str(e)
    assert "gradients went non-finite at step 2" in msg and name in msg
    for part in ("backbone tiny-llama", "adapter moe", "head letters", "backbone dtype float32",
                 "lr 0.001", "batch_size 4"):
        assert part in msg and part in e.setting
    assert len(calls) == 4   # stopped at the read after step index 3, not at the end (10 steps)


def test_a_run_whose_training_goes_non_finite_writes_no_model(tmp_path, monkeypatch) -> None:
    """The engine trains in a temporary folder of the cache: when training stops on a
    non-finite loss nothing is published (no model entry, no temporary folder left), and a
    rerun trains again rather than loading a half-written model."""
    from types import SimpleNamespace

    from baselines import engine as eng
    from baselines.train import NonFiniteLoss
    from uqbench.core.engine import RunStats
    from uqbench.core.plan import MOE
    from uqbench.core.profiles import get_profile

    split = SimpleNamespace(records=toy_records(20), hash="h-train", name="toy/train")
    suite = SimpleNamespace(role=lambda role: [split])
    e = eng.TorchEngine("tiny-llama", get_profile("smoke"), suite, tmp_path, RunStats(),
                        progress=False)
    fresh = e.fresh_model

    def poisoned(spec, seed):   # one weight of the backbone at infinity: the loss is NaN
        model = fresh(spec, seed)
        with torch.no_grad():
            model.backbone.get_input_embeddings().weight[:] = float("inf")
        return model

    monkeypatch.setattr(e, "fresh_model", poisoned)
    with pytest.raises(NonFiniteLoss, match=r"loss is nan at step 0; every trained layer") as err:
        e.model(MOE, 0)
    assert "backbone tiny-llama" in err.value.setting and "lr 0.001" in err.value.setting
    models = tmp_path / "models"
    assert not models.exists() or list(models.iterdir()) == []
    assert e.stats.trained == [] and "moe-lora@0" not in e.training_log
