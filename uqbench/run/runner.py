"""The main job: suite -> models (train or load) -> forward records (cached) -> scorers -> report.

The runner never imports torch or the model code: models, gates and forward passes come from a
backend (`uqbench.core.engine.Backend`, ``"torch"``: `baselines.engine`) found by name when a run
starts, figures from a figure set (`uqbench.core.engine.get_drawer`). Order of work, so that bad
input fails before anything expensive: profile, plugins, scorers, gates, backbone name, methods,
output folder -> data -> models -> passes.
"""
from __future__ import annotations

import enum
import json
import logging
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from uqbench.core.engine import Backend, RunStats, get_backend, get_drawer
from uqbench.core.errors import ConfigError, UserError, reset_fallbacks
from uqbench.core.experiments import experiment_methods, experiment_scorers
from uqbench.core.gating import check_spec, parse_gate
from uqbench.core.heads import HEADS, check_head, heads_for
from uqbench.core.outputs import Outputs, with_train
from uqbench.core.plan import (
    DEFAULT_MODELS,
    DET,
    Method,
    drop_unusable,
    methods,
    model_pairs,
    needed_fields,
)
from uqbench.core.probs import softmax
from uqbench.core.profiles import Profile, get_profile
from uqbench.core.registry import import_plugin
from uqbench.core.scorer import get_scorer, list_scorers, probe_scorers
from uqbench.data.sources.files import resolve_data_dir
from uqbench.data.suites.build import build_suite
from uqbench.data.suites.spec import get_suite_spec
from uqbench.files import rundir
from uqbench.files.cache import (
    PROTOCOL_VERSION,
    ArrayCache,
    resolve_cache_dir,
    sweep_orphans,
)
from uqbench.files.environment import environment
from uqbench.io.recordset import RecordSet, method_entries, write_record_set
from uqbench.reporting.paper import write_paper_report
from uqbench.results.references import reference_inputs, zero_shot_skipped
from uqbench.results.rows import check_workers, score_all, score_workers
from uqbench.run.folder import print_summary, write_run

log = logging.getLogger(__name__)


#: `RunConfig` fields that override the profile's setting of that name when not None
PROFILE_OVERRIDES = ("compile", "cuda_graph", "eval_tokens", "grad_checkpoint")


class Identity(enum.Enum):
    """Whether a `RunConfig` field is part of the run's identity (`RunConfig.identity`):
    ``ALWAYS``, what the run computes; ``IF_SET``, an option that is part of it when not at its
    default, so that a run which leaves it unset has the identity it has without the option;
    ``NO``, where and how the run happens (folders, threads, display), not what it computes."""

    ALWAYS = "always"
    IF_SET = "if_set"
    NO = "no"

    def keeps(self, value: Any, default: Any) -> bool:
        return self is Identity.ALWAYS or (self is Identity.IF_SET and value != default)


#: the version of the rules `RunConfig.identity` follows, recorded in run.json as
#: ``config_version`` beside ``config``; a run.json without one was written under version 1
IDENTITY_VERSION = 1


#: a `RunConfig` field's metadata: its `Identity` rule
ALWAYS = {"identity": Identity.ALWAYS}
IF_SET = {"identity": Identity.IF_SET}
NO = {"identity": Identity.NO}


@dataclass(frozen=True)
class RunConfig:
    """Everything that defines a run (the CLI fills it from flags). Each field declares whether
    it is part of the run's identity (`Identity`): adding a field is its one declaration."""

    suite: str = field(default="pooled", metadata=ALWAYS)
    profile: str = field(default="cpu", metadata=ALWAYS)
    backbone: str = field(default="minilm", metadata=ALWAYS)
    #: empty: every registered scorer
    scorers: tuple[str, ...] = field(default=(), metadata=ALWAYS)
    plugins: tuple[str, ...] = field(default=(), metadata=ALWAYS)
    out: Path | None = field(default=None, metadata=NO)
    cache_dir: Path | None = field(default=None, metadata=NO)
    data_dir: Path | None = field(default=None, metadata=NO)
    #: repetitions; None: the profile's
    seeds: int | None = field(default=None, metadata=ALWAYS)
    budget: float = field(default=4.0, metadata=ALWAYS)
    experiment: str | None = field(default=None, metadata=ALWAYS)
    #: empty: the suite's `models:`, else lora + moe-lora
    models: tuple[str, ...] = field(default=(), metadata=IF_SET)
    #: gates of router models besides their own (`uqbench.core.gating.parse_gate`); empty: the
    #: suite's `gates:`, else CARE at the budget
    gates: tuple[str, ...] = field(default=(), metadata=IF_SET)
    #: the model side (`uqbench.core.engine.BACKENDS`)
    backend: str = field(default="torch", metadata=IF_SET)
    #: who draws the figures (`uqbench.core.engine.DRAWERS`)
    figure_set: str = field(default="figures", metadata=NO)
    #: a head of uqbench.core.heads.HEADS, or auto; None: the suite's `head:`
    head: str | None = field(default=None, metadata=IF_SET)
    figures: bool = field(default=True, metadata=NO)
    progress: bool = field(default=True, metadata=NO)
    overwrite: bool = field(default=False, metadata=NO)
    #: seconds per scorer call; None: no limit
    scorer_timeout: float | None = field(default=300.0, metadata=NO)
    #: torch intra-op threads; None: the cores this process may use
    threads: int | None = field(default=None, metadata=NO)
    #: off | on | auto: compiled training; None: the profile's
    compile: str | None = field(default=None, metadata=IF_SET)
    #: off | on | auto: graph-replayed training; None: the profile's
    cuda_graph: str | None = field(default=None, metadata=IF_SET)
    #: padded tokens of one MC-dropout forward; None: the profile's
    eval_tokens: int | None = field(default=None, metadata=IF_SET)
    #: recomputed activations in training; None: the profile's
    grad_checkpoint: bool | None = field(default=None, metadata=IF_SET)
    #: processes scoring the methods (`uqbench.results.rows.score_workers`): auto, or N (1: in
    #: this process); the rows are the same
    score_workers: int | str = field(default="auto", metadata=NO)

    def identity(self) -> dict[str, Any]:
        """What must match for an existing --out folder to be refreshed in place: the fields
        whose `Identity` rule keeps them (rules of version `IDENTITY_VERSION`)."""
        d = asdict(self)
        return {f.name: d[f.name] for f in fields(self)
                if f.metadata["identity"].keeps(d[f.name], f.default)}


@dataclass(frozen=True)
class RunResult:
    out: Path
    rows: list[dict[str, Any]]
    stats: RunStats


def resolve_dirs(cfg: RunConfig) -> tuple[Path, Path, Path | None]:
    data, cache = resolve_data_dir(cfg.data_dir), resolve_cache_dir(cfg.cache_dir)

    def stem(s: str) -> str:
        return Path(s).stem if ("/" in s or s.endswith((".yaml", ".yml"))) else s

    out = cfg.out or Path("runs") / f"{stem(cfg.suite)}-{cfg.profile}-{stem(cfg.backbone)}" \
        f"{'-' + cfg.experiment if cfg.experiment else ''}"
    return out, cache, data


def _check_out_dir(out: Path, cfg: RunConfig) -> None:
    """Never silently replace a finished run of another configuration."""
    meta = out / rundir.META
    if not (out / rundir.RESULTS).exists() or cfg.overwrite:
        return
    try:
        old = json.loads(meta.read_text())
    except (OSError, ValueError):
        old = {}
    now = json.loads(json.dumps(cfg.identity(), default=str))
    if (old.get("config_version", 1), old.get("config", {})) != (IDENTITY_VERSION, now):
        raise UserError(f"{out} already holds the results of a different run configuration; "
                        "pass another --out, or --overwrite to replace them")


def prepare(cfg: RunConfig, backend: Backend | None = None
            ) -> tuple[Profile, list[Method], Path, Path, Path | None]:
    """All validation that needs no data and no model. Raises UserError subclasses.

    ``backend``: the model side (default: the registered backend ``cfg.backend``)."""
    prof = get_profile(cfg.profile)
    prof = replace(prof, **{k: v for k in PROFILE_OVERRIDES   # validated by Profile
                            if (v := getattr(cfg, k)) is not None})
    backend = backend or get_backend(cfg.backend)
    backend.check_profile(prof)  # settings the model side cannot run here
    _check_numbers(cfg, backend.n_experts)
    for p in cfg.plugins:
        import_plugin(p)
    chosen = [get_scorer(n) for n in cfg.scorers or list_scorers()]  # UnknownNameError
    if cfg.experiment and (cfg.models or cfg.gates):
        raise ConfigError(f"--{'models' if cfg.models else 'gates'} and --experiment cannot be "
                          "combined: an experiment fixes its own models and gates (the CARE "
                          "paper's MoE-LoRA); drop one of them")
    if cfg.experiment:
        def scorers_for(exp: Any) -> list[Any]:
            return chosen if cfg.scorers else (experiment_scorers(exp) or chosen)

        ms = experiment_methods(cfg.experiment, cfg.budget, scorers_for)
    else:
        suite_spec = get_suite_spec(cfg.suite)
        gates = [parse_gate(g, cfg.budget) for g in cfg.gates or suite_spec.gates]
        ms = methods(model_pairs(cfg.models or suite_spec.models or DEFAULT_MODELS, cfg.budget,
                                 gates), chosen)
    if cfg.figures:
        get_drawer(cfg.figure_set)  # an unknown figure set fails before any work
    for spec in dict.fromkeys(m.pair.gate for m in ms):
        check_spec(spec)  # unknown kind (never a fallback), budget rules, parameter names
    probe_scorers(dict.fromkeys(m.scorer for m in ms), timeout=cfg.scorer_timeout)
    backend.check_backbone(cfg.backbone)  # unknown name, unreachable id, unknown architecture
    if cfg.head is not None:
        check_head(cfg.head)
    check_head(prof.encoder_head, f"profile {prof.name!r}: encoder_head")
    if HEADS.get(prof.encoder_head).kind != "encoder":
        raise ConfigError(f"profile {prof.name!r}: encoder_head {prof.encoder_head!r} is a head "
                          f"for decoders; use one of {', '.join(heads_for('encoder'))}")
    get_suite_spec(cfg.suite)  # unknown name or invalid YAML fails here, before any data work
    out, cache, data = resolve_dirs(cfg)
    for flag, d in (("--out", out), ("--cache-dir", cache)):
        if d.exists() and not d.is_dir():
            raise UserError(f"{flag} {d} is a file, not a folder; give a folder path (it is "
                            "created if missing)")
    _check_out_dir(out, cfg)
    return prof, ms, out, cache, data


def _check_numbers(cfg: RunConfig, n_experts: int) -> None:
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
    check_workers(cfg.score_workers)
    if cfg.scorer_timeout is not None and not cfg.scorer_timeout > 0:
        raise ConfigError(f"--scorer-timeout {cfg.scorer_timeout:g}: give a positive number of "
                          "seconds, or 0 on the command line for no limit")


def run(cfg: RunConfig, backend: Backend | None = None) -> RunResult:
    """Run ``cfg``: prepare, build the data, get every method's outputs from ``backend``'s
    engine (default: the ``"torch"`` backend), score them, write the report and figures."""
    t0 = time.perf_counter()
    fallbacks = reset_fallbacks()  # run.json `fallbacks`: what this run did instead of asked
    backend = backend or get_backend(cfg.backend)
    prof, ms, out, cache, data = prepare(cfg, backend)
    if (n := sweep_orphans(cache)):
        log.info("removed %d temporary file(s) left in %s by killed runs", n, cache)
    why = "--threads" if cfg.threads else "the cores this process may use"
    threads = backend.set_threads(cfg.threads)
    print(f"torch threads: {threads} ({why})", flush=True)
    with backend.main_first():  # process 0 builds the split cache, the others read it
        suite = build_suite(cfg.suite, prof, data_dir=data, cache_dir=cache / "splits",
                            progress=cfg.progress)
    train = suite.role("train")  # a scorer that cannot score this training set is skipped here
    ms, skipped = drop_unusable(ms, [s.domain for s in train], sum(len(s.records) for s in train))
    stats = RunStats()
    stats.seconds["data"] = time.perf_counter() - t0
    engine = backend.engine(cfg.backbone, prof, suite, cache, stats, progress=cfg.progress,
                            head=cfg.head or get_suite_spec(cfg.suite).head)
    n_seeds = cfg.seeds or prof.seeds
    pairs = list(dict.fromkeys(m.pair for m in ms))
    # calib: every method's ECE is reported beside its recalibrated ECE
    # (`uqbench.results.recalibration`)
    eval_splits = [s for s in suite.splits.values() if s.role in ("id", "shift", "calib")]
    outs: dict[tuple[str, str, int], Outputs] = {}
    for rep in range(n_seeds):
        for pair in pairs:
            need = needed_fields(pair, ms)
            for split in eval_splits:
                outs[pair.name, split.name, rep] = engine.outputs(pair, split, rep, need)
            if "train_features" in need:  # the feature scorers' reference: one more pass
                t = time.perf_counter()
                for split in suite.role("train"):
                    outs[pair.name, split.name, rep] = engine.outputs(
                        pair, split, rep, DET | {"features"})
                stats.add_seconds("train features", time.perf_counter() - t)
    outs = with_train(outs)
    zero_shot = zero_shot_correct(engine, [s for s in eval_splits if s.role in ("id", "shift")])
    t_score = time.perf_counter()  # models+passes: backbone, trainings, calibration, passes
    stats.seconds["models+passes"] = t_score - t0 - stats.seconds["data"]
    if not backend.is_main():  # every process holds every record; process 0 reports
        return RunResult(out, [], stats)
    refs = reference_inputs(suite, zero_shot=zero_shot)
    workers = score_workers(cfg.score_workers, ms, outs, prof.bootstrap)
    rows, arrays = score_all(ms, refs, outs, n_seeds, prof.bootstrap, cache=ArrayCache(cache),
                             scorer_timeout=cfg.scorer_timeout, workers=workers,
                             plugins=cfg.plugins)
    stats.seconds["scoring"] = time.perf_counter() - t_score
    meta = {
        "config": cfg.identity(), "config_version": IDENTITY_VERSION,
        "protocol": PROTOCOL_VERSION, "profile": prof.name,
        "profile_settings": asdict(prof),
        "suite": cfg.suite, "backbone": cfg.backbone,
        "splits": {s.name: {"hash": s.hash, "n": len(s.records), "recipe": s.recipe}
                   for s in suite.splits.values()},
        "gates": engine.gate_log,
        "forward_passes_run": {"/".join(map(str, k)): v for k, v in sorted(stats.passes.items())},
        "cache_hits": stats.cache_hits, "trained": stats.trained,
        "training": engine.training_log,
        "zero_shot": engine.zero_shot_log,  # the head, whether the reference applies, why not
        "fallbacks": fallbacks,  # {what, where, reason}: `uqbench.core.errors.record_fallback`
        "skipped_scorers": skipped,  # {scorer, pair, reason}: `uqbench.core.plan.drop_unusable`
        "processes": backend.world(),
        "environment": environment(threads, n_seeds, engine.training_log,
                                   (s.recipe for s in suite.splits.values())),
        "seconds": {**stats.seconds},
        "score_workers": workers,  # processes that scored (`score_workers`)
    }
    if zero_shot is None:
        meta["references_skipped"] = {"zero-shot": zero_shot_skipped(engine.zero_shot_log)}
    # the forward records themselves, so that `uqbench score`/`export` need no model work
    records = RecordSet(pairs, dict(outs), n_seeds, refs,
                        prof.bootstrap, method_entries(ms),
                        {"suite": cfg.suite, "profile": prof.name, "backbone": cfg.backbone,
                         "gates": engine.gate_log, "training": engine.training_log,
                         "zero_shot": engine.zero_shot_log})
    write_record_set(out / rundir.RECORDS, records)
    write_run(out, rows, arrays, meta, t0=t0, figures=cfg.figures, figure_set=cfg.figure_set)
    if cfg.experiment:  # paper_report.md: the claims of this experiment (paper: all)
        print(write_paper_report(out, cfg.experiment).read_text(), flush=True)
    print_summary(out, rows, meta)
    print(f"forward passes run: {stats.total()}, cache hits: {stats.cache_hits}", flush=True)
    return RunResult(out, rows, stats)


def zero_shot_correct(engine: Any, splits: list[Any]) -> dict[str, Any] | None:
    """The frozen backbone's 0/1 correctness per question of each split (`Engine.zero_shot`:
    its head's argmax), keyed by split name; None, warned about, where the head has none."""
    got = {s.name: engine.zero_shot(s) for s in splits} if engine.zero_shot_log["applies"] \
        else {}
    if not got or any(o is None for o in got.values()):
        log.warning("no zero-shot reference: %s", zero_shot_skipped(engine.zero_shot_log))
        return None
    return {name: (softmax(o.logits).argmax(axis=1) == o.labels).astype(np.float64)
            for name, o in got.items()}


__all__ = ["IDENTITY_VERSION", "Identity", "RunConfig", "RunResult", "RunStats", "prepare", "run"]
