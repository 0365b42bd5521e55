"""The torch side of a run: the ``"torch"`` backend of `uqbench.core.engine` and its `TorchEngine`.

`TorchEngine` trains or loads each model (checkpoints cached by their training material),
builds and calibrates gates (`make_gate`; the thermostat's result cached by adapter hash,
calibration splits and gate spec) and runs cached forward passes, assembling the `Outputs` the
core scores. `TorchBackend` answers what the runner asks before and around a run (backbone
check, threads, processes). Neither is imported by the core: `uqbench.core.engine.get_backend`
imports this module when a run starts.
"""
from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from baselines import checkpoint, dense, distributed, forward, heads, moe, thermostat, train
from baselines import gates as G
from baselines.backbones import check_architecture, list_backbones, load_backbone
from baselines.variants import variant_config
from uqbench.core.engine import RunStats, register_backend
from uqbench.core.errors import ConfigError, record_fallback
from uqbench.core.gating import get_gate_kind
from uqbench.core.outputs import ROUTER_FIELDS, Outputs
from uqbench.core.plan import GateSpec, ModelSpec, Pair
from uqbench.core.profiles import Profile
from uqbench.files.cache import PROTOCOL_VERSION, ArrayCache, DirCache


def train_config(prof: Profile, seed: int, device: torch.device | None = None
                 ) -> train.TrainConfig:
    """The training settings of every model of a run: the profile's, with this seed; the
    profile's ``cuda_graph`` "auto" is on where ``device`` is CUDA, one process trains and
    activations are kept (no ``grad_checkpoint``)."""
    graph = prof.cuda_graph == "on" or (prof.cuda_graph == "auto" and device is not None
                                        and device.type == "cuda" and distributed.world() == 1
                                        and not prof.grad_checkpoint)
    return train.TrainConfig(epochs=prof.epochs, batch_size=prof.batch_size, lr=prof.lr,
                             head_lr=prof.head_lr, max_length=prof.max_length, seed=seed,
                             compile=prof.compile, cuda_graph=graph,
                             grad_checkpoint=prof.grad_checkpoint)


@register_backend("torch")
class TorchBackend:
    """`uqbench.core.engine.Backend` on torch, transformers and peft (`baselines`)."""

    n_experts = moe.MoELoRAConfig().n_experts

    def check_backbone(self, name: str) -> None:
        check_architecture(name)  # unknown name, unreachable id, unknown architecture

    def check_profile(self, prof: Profile) -> None:
        cuda, world = torch.cuda.is_available(), distributed.world()
        if prof.cuda_graph == "on" and not (cuda and world == 1):
            raise ConfigError(f"profile {prof.name!r}: cuda_graph on needs a CUDA device and one "
                              f"process (here: CUDA {'found' if cuda else 'not found'}, {world} "
                              "process(es)); use --cuda-graph off or auto")

    def backbones(self) -> list[str]:
        return list_backbones()

    def set_threads(self, n: int | None) -> int:
        """Also, before any model work touches the GPU, its deterministic cuBLAS workspace
        (`baselines.train.deterministic_cublas`)."""
        train.deterministic_cublas()
        if not n:
            n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
                else os.cpu_count()
        n = n or 1
        torch.set_num_threads(n)
        return n

    @contextmanager
    def main_first(self) -> Iterator[None]:
        with distributed.main_first():  # under `accelerate launch`: see its docstring
            yield

    def is_main(self) -> bool:
        return distributed.is_main()

    def world(self) -> int:
        return distributed.world()

    def engine(self, backbone: str, prof: Profile, suite: Any, cache_root: Path,
               stats: RunStats, *, progress: bool, head: str) -> TorchEngine:
        return TorchEngine(backbone, prof, suite, cache_root, stats, progress=progress,
                           head=head)


class TorchEngine:
    """Trains/loads models, calibrates gates and runs cached forward passes."""

    def __init__(self, backbone: str, prof: Profile, suite: Any, cache_root: Path,
                 stats: RunStats, *, progress: bool = True, head: str = "auto") -> None:
        self.backbone_name, self.prof, self.suite, self.head = backbone, prof, suite, head
        self.cache_root = cache_root
        self.arrays, self.dirs = ArrayCache(cache_root), DirCache(cache_root)
        self.stats, self.progress = stats, progress
        self._models: dict[tuple[str, int], tuple[Any, str]] = {}
        self._gates: dict[tuple[str, int, str], tuple[Any, dict[str, Any]]] = {}
        self.gate_log: dict[str, Any] = {}
        #: "name@seed" -> the training log stored with its checkpoint (None: trained before
        #: checkpoints kept one)
        self.training_log: dict[str, Any] = {}
        self._backbone: Any = None
        self._zero_shot: Any = None

    # -- models -----------------------------------------------------------------------------
    def backbone(self) -> Any:
        """The backbone, loaded once; models are built on clones of it."""
        if self._backbone is None:
            t = time.perf_counter()
            with distributed.main_first():  # process 0 converts/caches it (GGUF) first
                self._backbone = load_backbone(self.backbone_name, device=distributed.device(),
                                               cache_dir=self.cache_root)
            self.stats.seconds["backbone"] = time.perf_counter() - t
        return self._backbone

    def backbone_identity(self) -> dict[str, Any]:
        return dict(self.backbone().identity)

    def head_mode(self) -> str:
        """The head models are built with: ``auto`` is the profile's recipe for encoders."""
        if self.head == "auto" and self.backbone().kind == "encoder":
            return self.prof.encoder_head
        return self.head

    @property
    def zero_shot_log(self) -> dict[str, Any]:
        """run.json ``zero_shot``: the head (resolved), whether the reference applies, why not."""
        mode = self.head_mode()
        kind = self.backbone().kind
        name = heads.DEFAULT_HEADS[kind] if mode == "auto" else mode
        why = heads.head_class(name).no_zero_shot
        return {"head": name, "applies": not why, **({"reason": why} if why else {})}

    def zero_shot(self, split: Any) -> Outputs | None:
        """`uqbench.core.engine.Engine.zero_shot`: `heads.make_plain` on the backbone itself
        (a decoder head adds no module to it), its record keyed as a forward record by the
        backbone, the head (no adapter), the split and the length."""
        log = self.zero_shot_log
        if not log["applies"]:
            return None
        if self._zero_shot is None:
            self._zero_shot = heads.make_plain(self.backbone(), mode=log["head"], copy=False)
        model = self._zero_shot
        material = {"protocol": PROTOCOL_VERSION, "backbone": self.backbone_identity(),
                    "adapter": "none", "head": log["head"], "split": split.hash,
                    "mode": "deterministic", "record": forward.RECORD_FIELDS,
                    "max_length": self.prof.max_length, "index": 0}

        def compute() -> dict[str, np.ndarray]:
            self.stats.passes["zero-shot", 0, "-", split.name, "deterministic"] += 1
            t = time.perf_counter()
            with _out_of_memory(f"the zero-shot pass on {split.name}",
                               _pass_memory_fix("deterministic", self.prof.eval_tokens)):
                rec = forward.collect(model, split.records, batch_size=self.prof.eval_batch_size,
                                      max_length=self.prof.max_length, progress=self.progress)
            self.stats.add_seconds("passes", time.perf_counter() - t)
            return rec

        det, hit = distributed.get_or_compute(self.arrays, "forward", material, compute)
        self.stats.cache_hits += hit
        recs = split.records
        return Outputs(ids=np.array([r.id for r in recs]),
                       labels=np.array([r.answer for r in recs]), logits=det["logits"],
                       domain=np.array([r.domain for r in recs]))

    def model(self, spec: ModelSpec, seed: int) -> tuple[Any, str]:
        """(model, adapter sha256): trained once per config, then loaded from the cache."""
        key = (spec.name, seed)
        if key in self._models:
            return self._models[key]
        p = self.prof
        train_cfg = train_config(p, seed, self.backbone().model.device)
        train_splits = self.suite.role("train")
        train_key = asdict(train_cfg)
        # eager training keeps its keys; compiled training (equal within float tolerance) its
        # own, as graph-replayed and checkpointed training have by theirs
        if train.compile_enabled(train_cfg, self.backbone().model.device):
            train_key["compile"] = "on"
        else:
            del train_key["compile"]
        if not train_cfg.grad_checkpoint:
            del train_key["grad_checkpoint"]
        material = {
            "protocol": PROTOCOL_VERSION, "backbone": self.backbone_identity(),
            "model": spec.kind, "train": train_key,
            "data": sorted(s.hash for s in train_splits), "seed": seed,
        }
        if spec.kind not in ("moe", "lora", "dora", "adalora"):  # a variant: key by its preset
            material["adapter_config"] = self.variant_preset(spec, seed).to_dict()
        else:
            material["target_modules"] = p.target_modules
            if p.top_layers is not None:  # a run adapting every block has no entry
                material["top_layers"] = p.top_layers
        material["head"] = self.head_mode()
        dtype = self.backbone().model.dtype
        adapter_dtype = moe.trainable_dtype(dtype)
        if adapter_dtype != dtype:   # a 16-bit backbone: since adapters on one train in
            # float32, their checkpoints are not those trained in its dtype before
            material["adapter_dtype"] = str(adapter_dtype).removeprefix("torch.")

        def write(tmp: Path) -> None:
            t = time.perf_counter()
            model = self.fresh_model(spec, seed)
            records = [r for s in train_splits for r in s.records]
            with _out_of_memory(f"training {spec.name}@{seed}",
                               "a profile with a smaller batch_size, or more GPUs (accelerate "
                               "launch)" if train_cfg.grad_checkpoint else
                               "rerun with --grad-checkpoint"):
                result = train.train(model, records, train_cfg, progress=self.progress)
            checkpoint.save_adapter(model, tmp, meta={"model": spec.name, "seed": seed,
                                                      "training": result.to_json()})
            self.stats.trained.append(f"{spec.name}@{seed}")
            self.stats.seconds[f"train {spec.name}@{seed}"] = time.perf_counter() - t

        path = distributed.build_dir(self.dirs, "models", material, write)
        # the log travels with the checkpoint: a warm run (no training) shows it too
        self.training_log[f"{spec.name}@{seed}"] = \
            checkpoint.read_config(path).get("meta", {}).get("training")
        model = checkpoint.load_adapter(path, self.backbone())
        self._models[key] = (model, checkpoint.adapter_hash(path))
        return self._models[key]

    def fresh_model(self, spec: ModelSpec, seed: int) -> Any:
        """The untrained model of ``spec`` on this engine's backbone, seeded by ``seed``."""
        targets, top, mode = self.prof.target_modules, self.prof.top_layers, self.head_mode()
        if spec.kind == "moe":
            return heads.make_moe(self.backbone(), moe.MoELoRAConfig(
                seed=seed, target_modules=targets, top_layers=top), seed=seed, mode=mode)
        if spec.kind in ("lora", "dora", "adalora"):
            return dense.make_dense(self.backbone(), kind=spec.kind, seed=seed, mode=mode,
                                    target_modules=targets, top_layers=top)
        return heads.make_moe(self.backbone(), self.variant_preset(spec, seed), seed=seed,
                              mode=mode)

    def variant_preset(self, spec: ModelSpec, seed: int) -> Any:
        """A variant's preset (its experts, targets, gate, loss) on the profile's blocks."""
        return replace(variant_config(spec.kind, seed=seed), top_layers=self.prof.top_layers)

    # -- gates ------------------------------------------------------------------------------
    def gate(self, pair: Pair, seed: int) -> tuple[Any, dict[str, Any]]:
        """The gate object and its full description (calibrated knob, achieved budget)."""
        key = (pair.model.name, seed, pair.gate.name)
        if key in self._gates:
            return self._gates[key]
        model, sha = self.model(pair.model, seed)
        t = time.perf_counter()
        # a budget's calibration runs one-copy passes over the calib split
        with _out_of_memory(f"calibrating the gate {pair.gate.name} of {pair.model.name}@{seed}",
                            _pass_memory_fix("deterministic", self.prof.eval_tokens)):
            gate, desc = make_gate(pair.gate, model, sha, self)
        self.stats.add_seconds("calibration", time.perf_counter() - t)
        self._gates[key] = (gate, desc)
        self.gate_log[f"{pair.name}@{seed}"] = desc
        return gate, desc

    # -- forward records ----------------------------------------------------------------------
    def forward(self, spec: ModelSpec, seed: int, pair: Pair, split: Any, mode: str,
                index: int = 0) -> dict[str, np.ndarray]:
        return self.forwards(spec, seed, pair, split, mode, [index])[0]

    def forwards(self, spec: ModelSpec, seed: int, pair: Pair, split: Any, mode: str,
                 indices: list[int]) -> list[dict[str, np.ndarray]]:
        """The cached records of passes ``indices`` (MC-dropout: their dropout seeds). Those not
        cached are computed together, from the first miss on: MC-dropout passes stacked in one
        forward per batch (`baselines.forward.collect_mc`)."""
        model, sha = self.model(spec, seed)
        gate, desc = self.gate(Pair(spec, pair.gate, pair.fields), seed)
        base = {"protocol": PROTOCOL_VERSION, "backbone": self.backbone_identity(),
                "adapter": sha, "gate": desc.get("gate"),  # the resolved gate, not its name
                "split": split.hash, "mode": mode, "record": forward.RECORD_FIELDS,
                "max_length": self.prof.max_length}
        if mode == "mc_dropout":  # masks seeded per batch (same for any number of processes)
            base["dropout_seeds"] = "per-batch"
            if model.kind != "encoder":  # a decoder's LM head rounds by batch size: stacked
                base["stacked"] = True   # passes differ from lone ones in the last bits
            if self.prof.eval_tokens is not None:   # so do copies run in groups
                base["eval_tokens"] = self.prof.eval_tokens
        computed: dict[int, dict[str, np.ndarray]] = {}

        def compute(at: int) -> dict[str, np.ndarray]:
            if at not in computed:   # the first miss: it and every later pass, together
                todo = indices[indices.index(at):]
                if gate is not None:  # a fresh gate: RandomK's draws restart from its seed
                    moe.set_gate(model, G.gate_from_dict(desc["gate"]))
                self.stats.passes[spec.name, seed, pair.gate.name, split.name, mode] += len(todo)
                t = time.perf_counter()
                kw: dict[str, Any] = {"batch_size": self.prof.eval_batch_size,
                                      "max_length": self.prof.max_length,
                                      "progress": self.progress}
                with _out_of_memory(f"the {mode} passes of {spec.name}@{seed} on {split.name}",
                                   _pass_memory_fix(mode, self.prof.eval_tokens)):
                    recs = (forward.collect_mc(model, split.records, todo,
                                               max_tokens=self.prof.eval_tokens, **kw)
                            if mode == "mc_dropout" else
                            [forward.collect(model, split.records, mode=mode, seed=i, **kw)
                             for i in todo])
                computed.update(zip(todo, recs, strict=False))
                self.stats.add_seconds("passes", time.perf_counter() - t)
            return computed[at]

        out = []
        for i in indices:
            arrays, hit = distributed.get_or_compute(
                self.arrays, "forward", {**base, "index": i}, functools.partial(compute, i))
            self.stats.cache_hits += hit
            out.append(arrays)
        return out

    def outputs(self, pair: Pair, split: Any, rep: int, need: frozenset[str]) -> Outputs:
        """Assemble the `Outputs` of one pair on one split for repetition ``rep``."""
        base = 1000 * rep
        det = self.forward(pair.model, base, pair, split, "deterministic")
        _record_cut(split.name, det["cut"], self.prof.max_length)
        kw: dict[str, Any] = {k: det[k] for k in ROUTER_FIELDS if k in det}
        if "features" in need:
            kw["features"] = det["features"]
        if "mc_logits" in need:
            kw["mc_logits"] = np.stack([r["logits"] for r in self.forwards(
                pair.model, base, pair, split, "mc_dropout", list(range(self.prof.mc_passes)))])
        if "member_logits" in need:
            kw["member_logits"] = np.stack([det["logits"]] + [  # member 0 is this model
                self.forward(pair.model, base + m, pair, split, "deterministic")["logits"]
                for m in range(1, self.prof.ensemble_members)])
        recs = split.records
        return Outputs(ids=np.array([r.id for r in recs]),
                       labels=np.array([r.answer for r in recs]), logits=det["logits"],
                       domain=np.array([r.domain for r in recs]), **kw)


@contextmanager
def _out_of_memory(what: str, fix: str) -> Iterator[None]:
    """A GPU's out-of-memory error in the block becomes a `ConfigError` naming the phase
    (``what``) and what bounds its memory (``fix``)."""
    try:
        yield
    except torch.cuda.OutOfMemoryError as exc:
        raise ConfigError(
            f"{what} ran out of GPU memory ({str(exc).splitlines()[0]}): {fix}. What finished is "
            "in the cache, so a rerun resumes; `python -m benchmarks memory` measures the bytes "
            "a token holds (docs/gpu.md)") from exc


def _pass_memory_fix(mode: str, eval_tokens: int | None) -> str:
    if mode != "mc_dropout":   # one copy a forward: only the batch's size bounds it
        return "a profile with a smaller eval_batch_size"
    if eval_tokens is None:
        return "rerun with --eval-tokens N, e.g. the tokens of two copies of a batch"
    return f"rerun with an --eval-tokens below {eval_tokens}"


def _record_cut(split: str, cut: np.ndarray, max_length: int) -> None:
    """A split where truncation cut option text goes to run.json ``fallbacks`` (once per run,
    cached pass or not). Question text cut alone is the heads' policy (the question's start
    goes first), not a fallback: its count only rides along."""
    n_opt = int((cut == heads.base.CUT_OPTION).sum())
    if n_opt:
        n_q = int((cut == heads.base.CUT_QUESTION).sum())
        record_fallback(
            "input truncated to max_length", split,
            f"{n_opt} of {cut.size} questions had option text cut at max_length={max_length} "
            f"tokens: the model saw only part of an option ({n_q} more had question text cut); "
            "raise the profile's max_length (or use a backbone with a longer context)")


def make_gate(spec: GateSpec, model: Any, adapter_sha: str, engine: Any
              ) -> tuple[Any, dict[str, Any]]:
    """Turn a `GateSpec` into a gate for one trained model, calibrating it when it has a budget.

    The kind is looked up in the gate registry (`uqbench.core.gating`) first: an unknown kind is a
    ConfigError listing the valid ones, before any model work. Calibration (the thermostat) runs
    on the union of the suite's unlabeled ``calib`` splits and is cached by (adapter checkpoint
    hash, calibration split hashes, gate spec), so a warm run does no bisection. The returned
    description (gate fields, calibrated knob, achieved budget, whether the budget was met)
    keys the forward-record cache and is written to ``run.json``.
    """
    kind = get_gate_kind(spec)
    if spec.kind == "dense":
        return None, {"spec": spec.describe()}
    if not model.has_moe:
        raise ConfigError(f"gate {spec.name!r} needs a router distribution, but model "
                          f"{model.adapter['type']!r} has none (e.g. FlyLoRA's implicit routing); "
                          "evaluate it under its own routing only")
    if kind is None:  # native: the gate the model was trained with
        gate = moe.train_gate(moe.MoELoRAConfig.from_dict(model.adapter["config"]))
        return gate, {"spec": spec.describe(), "gate": G.gate_to_dict(gate)}
    if spec.budget is None:  # a fixed gate, e.g. top-k or the thermostat sweep's tau
        gate = kind.cls(**spec.kwargs)
        return gate, {"spec": spec.describe(), "gate": G.gate_to_dict(gate)}
    calib = engine.suite.role("calib")
    material = {"protocol": PROTOCOL_VERSION, "adapter": adapter_sha, "spec": spec.key(),
                "calib": sorted(s.hash for s in calib), "max_length": engine.prof.max_length}
    cached = engine.arrays.get("thermostat", material)
    if cached is not None:
        desc = {**json.loads(str(cached["desc"])), "spec": spec.describe()}  # under this name
    else:
        records = [r for s in calib for r in s.records]
        bs, n = engine.prof.eval_batch_size, engine.prof.max_length
        batches = [model.encode(records[i:i + bs], max_length=n)
                   for i in range(0, len(records), bs)]
        def fwd(m: Any, b: Any) -> Any:
            return m(b)

        if kind.proxy is None:
            gate, res = thermostat.calibrate_kind(kind, model, batches, float(spec.budget),
                                                  spec.kwargs, forward=fwd)
            calibration = {"knob": res.tau, "achieved": res.achieved, "target": res.target,
                           "met": res.met, "iterations": res.iterations}
        else:  # the proxy's bisection is the proxy gate's own (cached, shared with it), then
            # one pass under it for the k histogram (`thermostat.calibrate_kind`'s proxy path)
            proxy, pdesc = make_gate(replace(spec, name=kind.proxy, kind=kind.proxy), model,
                                     adapter_sha, engine)
            calibration = {k: v for k, v in pdesc["calibration"].items()
                           if k != "calib_tokens_from"}
            saved = moe.get_gates(model)
            try:
                moe.set_gate(model, proxy)
                ks = torch.cat(thermostat.measure_k(model, batches, fwd))
            finally:
                moe.set_gate(model, saved)
            proxied: Any = kind.cls   # a proxied kind's class builds from counts (GateKind)
            gate = proxied.from_counts(ks, seed=0)
        desc = {"spec": spec.describe(), "gate": G.gate_to_dict(gate),
                "calibration": {**calibration, "calib_tokens_from": len(records)}}
        engine.arrays.put("thermostat", material, {"desc": np.array(json.dumps(desc))})
    return G.gate_from_dict(desc["gate"]), desc


__all__ = ["TorchBackend", "TorchEngine", "make_gate", "train_config"]
