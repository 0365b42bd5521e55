"""The main job: suite -> models (train or load) -> forward records (cached) -> scorers -> report.

This is the only module of the core that touches torch, and only through `baselines`, imported
lazily inside `Engine`. Order of work, so that bad input fails before anything expensive:
profile, plugins, scorers, backbone name, methods, output folder -> data -> models -> passes.
"""
from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from uqbench.cache import (PROTOCOL_VERSION, ArrayCache, DirCache, atomic_write_bytes,
                           atomic_write_text, sweep_orphans)
from uqbench.errors import ConfigError, UserError
from uqbench.evaluate import Scored, evaluate_cached
from uqbench.outputs import ROUTER_FIELDS, Outputs
from uqbench.plan import (Method, ModelSpec, Pair, default_pairs, methods, model_pairs,
                          needed_fields)
from uqbench.profiles import Profile, get_profile
from uqbench.references import reference_rows, warn_at_chance
from uqbench.registry import import_plugin
from uqbench.report import summary, write_results
from uqbench.scorer import get_scorer, list_scorers, probe_scorers

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunConfig:
    """Everything that defines a run (the CLI fills it from flags)."""

    suite: str = "pooled"
    profile: str = "cpu"
    backbone: str = "minilm"
    scorers: tuple[str, ...] = ()  # empty: every registered scorer
    plugins: tuple[str, ...] = ()
    out: Path | None = None
    cache_dir: Path | None = None
    data_dir: Path | None = None
    seeds: int | None = None  # repetitions; default: the profile's
    budget: float = 4.0
    experiment: str | None = None
    models: tuple[str, ...] = ()  # empty: the suite's `models:`, else lora + moe-lora
    head: str | None = None  # one of uqbench.data.suites.HEADS; None: the suite's `head:`
    figures: bool = True
    progress: bool = True
    overwrite: bool = False
    scorer_timeout: float | None = 300.0  # seconds per scorer call; None: no limit
    threads: int | None = None  # torch intra-op threads; None: the cores we may use

    def identity(self) -> dict[str, Any]:
        """What must match for an existing --out folder to be refreshed in place."""
        d = asdict(self)
        for k in ("out", "cache_dir", "data_dir", "figures", "progress", "overwrite",
                  "scorer_timeout", "threads"):
            d.pop(k)
        if not d["models"]:  # runs without --models keep the identity they always had
            d.pop("models")
        if d["head"] is None:
            d.pop("head")
        return d


@dataclass
class RunStats:
    """Forward passes actually executed (cache misses), keyed by (model, seed, gate, split, mode)."""

    passes: Counter[tuple[str, int, str, str, str]] = field(default_factory=Counter)
    cache_hits: int = 0
    trained: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)

    def add_seconds(self, phase: str, s: float) -> None:
        self.seconds[phase] = self.seconds.get(phase, 0.0) + s

    def total(self, mode: str | None = None) -> int:
        return sum(v for k, v in self.passes.items() if mode is None or k[4] == mode)


@dataclass(frozen=True)
class RunResult:
    out: Path
    rows: list[dict[str, Any]]
    stats: RunStats


def resolve_dirs(cfg: RunConfig) -> tuple[Path, Path, Path | None]:
    data = cfg.data_dir or (Path(os.environ["UQBENCH_DATA"]) if os.environ.get("UQBENCH_DATA") else None)
    cache = cfg.cache_dir or Path(os.environ.get("UQBENCH_CACHE", ".uqbench-cache"))
    stem = lambda s: Path(s).stem if ("/" in s or s.endswith((".yaml", ".yml"))) else s
    out = cfg.out or Path("runs") / f"{stem(cfg.suite)}-{cfg.profile}-{stem(cfg.backbone)}" \
        f"{'-' + cfg.experiment if cfg.experiment else ''}"
    return out, cache, data


def _check_out_dir(out: Path, cfg: RunConfig) -> None:
    """Never silently replace a finished run of another configuration."""
    meta = out / "run.json"
    if not (out / "results.jsonl").exists() or cfg.overwrite:
        return
    try:
        old = json.loads(meta.read_text()).get("config", {})
    except (OSError, ValueError):
        old = {}
    if old != json.loads(json.dumps(cfg.identity(), default=str)):
        raise UserError(f"{out} already holds the results of a different run configuration; "
                        "pass another --out, or --overwrite to replace them")


def prepare(cfg: RunConfig) -> tuple[Profile, list[Method], Path, Path, Path | None]:
    """All validation that needs no data and no model. Raises UserError subclasses."""
    prof = get_profile(cfg.profile)
    _check_numbers(cfg)
    for p in cfg.plugins:
        import_plugin(p)
    from uqbench.experiments import experiment_methods, experiment_scorers

    try:
        chosen = [get_scorer(n) for n in cfg.scorers or list_scorers()]
    except KeyError as exc:
        raise ConfigError(str(exc.args[0])) from None
    if cfg.experiment and cfg.models:
        raise ConfigError("--models and --experiment cannot be combined: an experiment fixes its "
                          "own models (the CARE paper's MoE-LoRA); drop one of them")
    if cfg.experiment:
        def scorers_for(exp: Any) -> list[Any]:
            return chosen if cfg.scorers else (experiment_scorers(exp) or chosen)

        ms = experiment_methods(cfg.experiment, cfg.budget, scorers_for)
    else:
        from uqbench.data.suites import get_suite_spec

        models = cfg.models or get_suite_spec(cfg.suite).models
        ms = methods(model_pairs(models, cfg.budget) if models else default_pairs(cfg.budget),
                     chosen)
    probe_scorers(dict.fromkeys(m.scorer for m in ms), timeout=cfg.scorer_timeout)
    from baselines.backbones import check_architecture

    check_architecture(cfg.backbone)  # unknown name, unreachable id, unknown architecture
    if cfg.head is not None:
        from uqbench.data.suites import check_head

        check_head(cfg.head)
    from uqbench.data.suites import get_suite_spec

    get_suite_spec(cfg.suite)  # unknown name or invalid YAML fails here, before any data work
    out, cache, data = resolve_dirs(cfg)
    for flag, d in (("--out", out), ("--cache-dir", cache)):
        if d.exists() and not d.is_dir():
            raise UserError(f"{flag} {d} is a file, not a folder; give a folder path (it is "
                            "created if missing)")
    _check_out_dir(out, cfg)
    return prof, ms, out, cache, data


def _check_numbers(cfg: RunConfig) -> None:
    from baselines.moe import MoELoRAConfig

    n_experts = MoELoRAConfig().n_experts
    if cfg.seeds is not None and cfg.seeds < 1:
        raise ConfigError(f"--seeds {cfg.seeds}: give at least 1 repetition (or leave it out for "
                          "the profile's default)")
    if not 1 <= cfg.budget <= n_experts:
        raise ConfigError(f"--budget {cfg.budget:g}: CARE's average expert budget must lie in "
                          f"[1, {n_experts}] (the MoE-LoRA layers have {n_experts} experts); "
                          "the paper uses 4")
    if cfg.threads is not None and cfg.threads < 1:
        raise ConfigError(f"--threads {cfg.threads}: give at least 1 thread (or leave it out for "
                          "the cores this process may use)")
    if cfg.scorer_timeout is not None and not cfg.scorer_timeout > 0:
        raise ConfigError(f"--scorer-timeout {cfg.scorer_timeout:g}: give a positive number of "
                          "seconds, or 0 on the command line for no limit")


def run(cfg: RunConfig) -> RunResult:
    t0 = time.perf_counter()
    prof, ms, out, cache, data = prepare(cfg)
    if (n := sweep_orphans(cache)):
        log.info("removed %d temporary file(s) left in %s by killed runs", n, cache)
    from baselines import distributed  # under `accelerate launch`: see its docstring

    why = "--threads" if cfg.threads else "the cores this process may use"
    print(f"torch threads: {set_threads(cfg.threads)} ({why})", flush=True)
    from uqbench.data.suites import build_suite, get_suite_spec

    with distributed.main_first():  # process 0 builds the split cache, the others read it
        suite = build_suite(cfg.suite, prof, data_dir=data, cache_dir=cache / "splits",
                            progress=cfg.progress)
    stats = RunStats()
    stats.seconds["data"] = time.perf_counter() - t0
    engine = Engine(cfg.backbone, prof, suite, cache, stats, progress=cfg.progress,
                    head=cfg.head or get_suite_spec(cfg.suite).head)
    n_seeds = cfg.seeds or prof.seeds
    pairs = list(dict.fromkeys(m.pair for m in ms))
    # calib: every method's ECE is reported beside its recalibrated ECE (`uqbench.recalibration`)
    eval_splits = [s for s in suite.splits.values() if s.role in ("id", "shift", "calib")]
    outs: dict[tuple[str, str, int], Outputs] = {}
    for rep in range(n_seeds):
        for pair in pairs:
            need = needed_fields(pair, ms)
            for split in eval_splits:
                outs[pair.name, split.name, rep] = engine.outputs(pair, split, rep, need)
    t_score = time.perf_counter()  # models+passes: backbone, trainings, calibration, passes
    stats.seconds["models+passes"] = t_score - t0 - stats.seconds["data"]
    if not distributed.is_main():  # every process holds every record; process 0 reports
        return RunResult(out, [], stats)
    rows, arrays = score_all(ms, suite, outs, n_seeds, prof, cache=engine.arrays,
                             scorer_timeout=cfg.scorer_timeout)
    stats.seconds["scoring"] = time.perf_counter() - t_score
    flags = warn_at_chance(rows)  # one WARNING listing every method and domain at chance
    meta = {
        "config": cfg.identity(), "protocol": PROTOCOL_VERSION, "profile": prof.name,
        "profile_settings": asdict(prof),
        "suite": cfg.suite, "backbone": cfg.backbone,
        "splits": {s.name: {"hash": s.hash, "n": len(s.records), "recipe": s.recipe}
                   for s in suite.splits.values()},
        "gates": engine.gate_log,
        "forward_passes_run": {"/".join(map(str, k)): v for k, v in sorted(stats.passes.items())},
        "cache_hits": stats.cache_hits, "trained": stats.trained,
        "training": engine.training_log,
        "at_chance": flags,
        "processes": distributed.world(),
        "seconds": {**stats.seconds, "total": time.perf_counter() - t0},
    }
    write_results(out, rows, meta)
    _save_scores(out / "scores.npz", arrays)
    if cfg.figures:
        t_fig = time.perf_counter()
        _draw_figures(out, arrays, meta["training"])
        meta["seconds"]["figures"] = time.perf_counter() - t_fig
        meta["seconds"]["total"] = time.perf_counter() - t0
        atomic_write_text(out / "run.json", json.dumps(meta, indent=1, default=str))
    print("seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in meta["seconds"].items()),
          flush=True)
    if cfg.experiment:  # paper_report.md: the claims of this experiment (paper: all)
        from uqbench.paper import write_paper_report

        print(write_paper_report(out, cfg.experiment).read_text(), flush=True)
    print(summary(rows), flush=True)
    if flags:  # the list went to the log (stderr) once; the summary points at it
        print(f"\nWARNING: {len(flags)} method/domain result(s) have an ID accuracy CI that "
              "includes chance (listed in the log, on stderr, and in run.json `at_chance`): "
              "their UQ numbers measure a model at chance", flush=True)
    print(f"\nwrote {out}/results.{{md,csv,jsonl,tex}}; forward passes run: {stats.total()}, "
          f"cache hits: {stats.cache_hits}", flush=True)
    return RunResult(out, rows, stats)


def set_threads(n: int | None) -> int:
    """torch's intra-op threads: ``n``, else the cores this process may use."""
    import torch

    if not n:
        n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    n = n or 1
    torch.set_num_threads(n)
    return n


def score_all(ms: Sequence[Method], suite: Any, outs: Mapping[tuple[str, str, int], Outputs],
              n_seeds: int, prof: Profile, cache: ArrayCache | None = None,
              scorer_timeout: float | None = None) -> tuple[list[dict[str, Any]], dict[str, np.ndarray]]:
    """One row per method per domain and ``pooled``, then the reference rows (``chance``,
    ``options-only``: `uqbench.references`); also the per-example arrays for figures. With
    ``cache``, rows already evaluated on identical scores are read back, not recomputed.

    ``outs`` holds the ``calib`` split of every domain too: each row's ``ece_ts``/``ece_hb``/
    ``ece_iso`` are the ECE on the ID split after recalibrating on it (`uqbench.recalibration`)."""
    from uqbench.recalibration import CALIBRATORS, recalibrate_cached

    rows: list[dict[str, Any]] = []
    arrays: dict[str, np.ndarray] = {}
    domains = list(suite.domains)
    for m in ms:
        for dom in [*domains, "pooled"]:
            parts = domains if dom == "pooled" else [dom]

            id_outs, sh_outs, cal_outs = (
                [Outputs.concat([outs[m.pair.name, f"{d}/{role}", r] for d in parts])
                 for r in range(n_seeds)]
                for role in ("id", "shift", "calib"))
            id_s, sh_s, cal_s = (Scored.of(m.scorer, o, timeout=scorer_timeout)
                                 for o in (id_outs, sh_outs, cal_outs))
            metrics = evaluate_cached(cache, id_s, sh_s, n_bins=12, n_boot=prof.bootstrap, seed=0)
            recal, recal_conf = recalibrate_cached(
                cache, m.scorer, cal_outs, id_outs, cal_s.confidence, id_s.confidence,
                id_s.correct, n_bins=12, n_boot=prof.bootstrap, seed=0)
            at = list(metrics).index("ece_hi") + 1  # the recalibrated ECEs beside the raw one
            row: dict[str, Any] = {
                "method": m.name, "model": m.pair.model.name, "gate": m.pair.gate.name,
                "scorer": m.scorer.name, "domain": dom,
                **dict(list(metrics.items())[:at]), **recal, **dict(list(metrics.items())[at:]),
                "forward_passes": m.scorer.passes(id_outs[0]),
                "n_id": id_outs[0].n, "n_shift": sh_outs[0].n, "n_calib": cal_outs[0].n,
                "seeds": n_seeds, "protocol": PROTOCOL_VERSION,
                "split_hashes": ",".join(suite.split(d, r).hash for d in parts for r in ("id", "shift")),
                "calib_hashes": ",".join(suite.split(d, "calib").hash for d in parts),
            }
            rows.append(row)
            # per-example arrays are (N, seeds): verdicts and figures pool every seed
            for kind in CALIBRATORS:
                arrays[f"{m.name}|{dom}|id|confidence_{kind}"] = recal_conf.confidence[kind]
            for role, os_ in (("id", id_outs), ("shift", sh_outs)):
                for f in ("route_entropy", "top1_mass", "disagreement", "experts", "labels"):
                    if getattr(os_[0], f) is not None:
                        arrays[f"{m.pair.name}|{dom}|{role}|{f}"] = np.stack(
                            [getattr(o, f) for o in os_], 1)
            for role, sc in (("id", id_s), ("shift", sh_s)):
                key = f"{m.name}|{dom}|{role}"
                arrays[f"{key}|uncertainty"] = sc.uncertainty
                arrays[f"{key}|confidence"] = sc.confidence
                arrays[f"{key}|correct"] = sc.correct
    rows += reference_rows(suite, n_boot=prof.bootstrap, seed=0)  # chance, options-only
    return rows, arrays


def _draw_figures(out: Path, arrays: Mapping[str, np.ndarray], training: Any) -> None:
    """Draw the run's figures unless ``figures/STAMP`` shows they were drawn from these very
    results by this very figures code and are all still there (a warm rerun then costs nothing)."""
    import figures
    from figures import draw_run

    h = hashlib.sha256((out / "results.jsonl").read_bytes())
    h.update(json.dumps(training, sort_keys=True).encode())  # the training figure's input
    for k in sorted(arrays):
        h.update(k.encode() + np.ascontiguousarray(arrays[k]).tobytes())
    for src in sorted(Path(figures.__file__).parent.glob("*.py")):
        h.update(src.read_bytes())
    stamp = out / "figures" / "STAMP"
    try:
        old = json.loads(stamp.read_text())
        if old["hash"] == h.hexdigest() and all((out / "figures" / f).exists() for f in old["files"]):
            log.info("figures are up to date with these results; not redrawn")
            return
    except (OSError, ValueError, KeyError, TypeError):
        pass
    paths = draw_run(out)
    atomic_write_text(stamp, json.dumps({"hash": h.hexdigest(), "files": [p.name for p in paths]}))


def _save_scores(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)  # type: ignore[arg-type]
    atomic_write_bytes(path, buf.getvalue())


class Engine:
    """Trains/loads models, calibrates gates and runs cached forward passes (torch side)."""

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

    # -- models -----------------------------------------------------------------------------
    def backbone(self) -> Any:
        """The backbone, loaded once; models are built on clones of it."""
        if self._backbone is None:
            from baselines import distributed
            from baselines.backbones import load_backbone

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

    def model(self, spec: ModelSpec, seed: int) -> tuple[Any, str]:
        """(model, adapter sha256): trained once per config, then loaded from the cache."""
        key = (spec.name, seed)
        if key in self._models:
            return self._models[key]
        from baselines import checkpoint, distributed, train

        p = self.prof
        train_cfg = train.TrainConfig(epochs=p.epochs, batch_size=p.batch_size, lr=p.lr,
                                      head_lr=p.head_lr, max_length=p.max_length, seed=seed)
        train_splits = self.suite.role("train")
        material = {
            "protocol": PROTOCOL_VERSION, "backbone": self.backbone_identity(),
            "model": spec.kind, "train": asdict(train_cfg),
            "data": sorted(s.hash for s in train_splits), "seed": seed,
        }
        if spec.kind not in ("moe", "lora", "dora", "adalora"):  # a variant: key by its preset
            material["adapter_config"] = self._variant_config(spec, seed).to_dict()
        else:
            material["target_modules"] = p.target_modules
            if p.top_layers is not None:  # keys of runs adapting every block stay as they were
                material["top_layers"] = p.top_layers
        material["head"] = self.head_mode()

        def write(tmp: Path) -> None:
            t = time.perf_counter()
            model = self._fresh(spec, seed)
            records = [r for s in train_splits for r in s.records]
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

    def _fresh(self, spec: ModelSpec, seed: int) -> Any:
        from baselines import dense, heads, moe

        targets, top, mode = self.prof.target_modules, self.prof.top_layers, self.head_mode()
        if spec.kind == "moe":
            return heads.make_moe(self.backbone(), moe.MoELoRAConfig(
                seed=seed, target_modules=targets, top_layers=top), seed=seed, mode=mode)
        if spec.kind in ("lora", "dora", "adalora"):
            return dense.make_dense(self.backbone(), kind=spec.kind, seed=seed, mode=mode,
                                    target_modules=targets, top_layers=top)
        return heads.make_moe(self.backbone(), self._variant_config(spec, seed), seed=seed,
                              mode=mode)

    def _variant_config(self, spec: ModelSpec, seed: int) -> Any:
        """A variant's preset (its experts, targets, gate, loss) on the profile's blocks."""
        from baselines.variants import variant_config

        return replace(variant_config(spec.kind, seed=seed), top_layers=self.prof.top_layers)

    # -- gates ------------------------------------------------------------------------------
    def gate(self, pair: Pair, seed: int) -> tuple[Any, dict[str, Any]]:
        """The gate object and its full description (calibrated knob, achieved budget)."""
        key = (pair.model.name, seed, pair.gate.name)
        if key in self._gates:
            return self._gates[key]
        from uqbench.gating import make_gate

        model, sha = self.model(pair.model, seed)
        t = time.perf_counter()
        gate, desc = make_gate(pair.gate, model, sha, self)
        self.stats.add_seconds("calibration", time.perf_counter() - t)
        self._gates[key] = (gate, desc)
        self.gate_log[f"{pair.name}@{seed}"] = desc
        return gate, desc

    # -- forward records ----------------------------------------------------------------------
    def forward(self, spec: ModelSpec, seed: int, pair: Pair, split: Any, mode: str,
                index: int = 0) -> dict[str, np.ndarray]:
        from baselines import distributed, forward, gates, moe

        model, sha = self.model(spec, seed)
        gate, desc = self.gate(Pair(spec, pair.gate, pair.fields), seed)
        material = {"protocol": PROTOCOL_VERSION, "backbone": self.backbone_identity(),
                    "adapter": sha, "gate": desc.get("gate"),  # the resolved gate, not its name
                    "split": split.hash, "mode": mode, "record": forward.RECORD_FIELDS,
                    "index": index, "max_length": self.prof.max_length}
        if mode == "mc_dropout":  # masks seeded per batch (same for any number of processes)
            material["dropout_seeds"] = "per-batch"

        def compute() -> dict[str, np.ndarray]:
            if gate is not None:  # a fresh gate per pass: RandomK's draws restart from its seed
                moe.set_gate(model, gates.gate_from_dict(desc["gate"]))
            self.stats.passes[spec.name, seed, pair.gate.name, split.name, mode] += 1
            t = time.perf_counter()
            rec = forward.collect(model, split.records, batch_size=self.prof.eval_batch_size,
                                  max_length=self.prof.max_length, mode=mode, seed=index,
                                  progress=self.progress)
            self.stats.add_seconds("passes", time.perf_counter() - t)
            return rec

        arrays, hit = distributed.get_or_compute(self.arrays, "forward", material, compute)
        self.stats.cache_hits += hit
        return arrays

    def outputs(self, pair: Pair, split: Any, rep: int, need: frozenset[str]) -> Outputs:
        """Assemble the `Outputs` of one pair on one split for repetition ``rep``."""
        base = 1000 * rep
        det = self.forward(pair.model, base, pair, split, "deterministic")
        kw: dict[str, Any] = {k: det[k] for k in ROUTER_FIELDS if k in det}
        if "mc_logits" in need:
            kw["mc_logits"] = np.stack([
                self.forward(pair.model, base, pair, split, "mc_dropout", t)["logits"]
                for t in range(self.prof.mc_passes)])
        if "member_logits" in need:
            kw["member_logits"] = np.stack([det["logits"]] + [  # member 0 is this model
                self.forward(pair.model, base + m, pair, split, "deterministic")["logits"]
                for m in range(1, self.prof.ensemble_members)])
        recs = split.records
        return Outputs(ids=np.array([r.id for r in recs]), labels=np.array([r.answer for r in recs]),
                       logits=det["logits"], domain=np.array([r.domain for r in recs]), **kw)


__all__ = ["RunConfig", "RunResult", "RunStats", "prepare", "run"]
