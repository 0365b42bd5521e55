"""The main job: suite -> models (train or load) -> forward records (cached) -> scorers -> report.

The runner never imports torch or the model code: models, gates and forward passes come from a
backend (`uqbench.core.engine.Backend`, ``"torch"``: `baselines.engine`) found by name when a run
starts, figures from a figure set (`uqbench.core.engine.get_drawer`). Order of work, so that bad input
fails before anything expensive: profile, plugins, scorers, gates, backbone name, methods,
output folder -> data -> models -> passes.
"""
from __future__ import annotations

import hashlib
import inspect
import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from uqbench.core.engine import Backend, RunStats, get_backend, get_drawer
from uqbench.core.errors import ConfigError, UserError, reset_fallbacks
from uqbench.core.gating import check_spec
from uqbench.core.outputs import Outputs, with_train
from uqbench.core.plan import (
    DET,
    Method,
    default_pairs,
    drop_unusable,
    methods,
    model_pairs,
    needed_fields,
)
from uqbench.core.profiles import Profile, get_profile
from uqbench.core.registry import import_plugin
from uqbench.core.scorer import get_scorer, list_scorers, probe_scorers
from uqbench.files import rundir
from uqbench.files.cache import (
    PROTOCOL_VERSION,
    ArrayCache,
    atomic_write_text,
    resolve_cache_dir,
    sweep_orphans,
)
from uqbench.files.environment import environment
from uqbench.files.rundir import SCORE_FIELDS, score_key
from uqbench.io.recordset import RecordSet, method_entries, write_record_set
from uqbench.results.evaluate import Scored, evaluate_cached
from uqbench.results.references import (
    ReferenceInputs,
    reference_inputs,
    reference_rows,
    warn_at_chance,
)
from uqbench.results.tables import summary, write_results
from uqbench.stats.metrics import ECE_BINS

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
    head: str | None = None  # one of uqbench.core.profiles.HEADS; None: the suite's `head:`
    figures: bool = True
    progress: bool = True
    overwrite: bool = False
    scorer_timeout: float | None = 300.0  # seconds per scorer call; None: no limit
    threads: int | None = None  # torch intra-op threads; None: the cores we may use
    compile: str | None = None  # off | on | auto: compiled training; None: the profile's

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
        if d["compile"] is None:
            d.pop("compile")
        return d


@dataclass(frozen=True)
class RunResult:
    out: Path
    rows: list[dict[str, Any]]
    stats: RunStats


def resolve_dirs(cfg: RunConfig) -> tuple[Path, Path, Path | None]:
    from uqbench.data.sources.files import resolve_data_dir

    data, cache = resolve_data_dir(cfg.data_dir), resolve_cache_dir(cfg.cache_dir)
    stem = lambda s: Path(s).stem if ("/" in s or s.endswith((".yaml", ".yml"))) else s
    out = cfg.out or Path("runs") / f"{stem(cfg.suite)}-{cfg.profile}-{stem(cfg.backbone)}" \
        f"{'-' + cfg.experiment if cfg.experiment else ''}"
    return out, cache, data


def _check_out_dir(out: Path, cfg: RunConfig) -> None:
    """Never silently replace a finished run of another configuration."""
    meta = out / rundir.META
    if not (out / rundir.RESULTS).exists() or cfg.overwrite:
        return
    try:
        old = json.loads(meta.read_text()).get("config", {})
    except (OSError, ValueError):
        old = {}
    if old != json.loads(json.dumps(cfg.identity(), default=str)):
        raise UserError(f"{out} already holds the results of a different run configuration; "
                        "pass another --out, or --overwrite to replace them")


def prepare(cfg: RunConfig, backend: Backend | None = None
            ) -> tuple[Profile, list[Method], Path, Path, Path | None]:
    """All validation that needs no data and no model. Raises UserError subclasses.

    ``backend``: the model side (default: the registered ``"torch"`` backend)."""
    prof = get_profile(cfg.profile)
    if cfg.compile is not None:
        prof = replace(prof, compile=cfg.compile)  # validated by Profile
    backend = backend or get_backend()
    _check_numbers(cfg, backend.n_experts)
    for p in cfg.plugins:
        import_plugin(p)
    from uqbench.core.experiments import experiment_methods, experiment_scorers

    chosen = [get_scorer(n) for n in cfg.scorers or list_scorers()]  # UnknownNameError
    if cfg.experiment and cfg.models:
        raise ConfigError("--models and --experiment cannot be combined: an experiment fixes its "
                          "own models (the CARE paper's MoE-LoRA); drop one of them")
    if cfg.experiment:
        def scorers_for(exp: Any) -> list[Any]:
            return chosen if cfg.scorers else (experiment_scorers(exp) or chosen)

        ms = experiment_methods(cfg.experiment, cfg.budget, scorers_for)
    else:
        from uqbench.data.suite_spec import get_suite_spec

        models = cfg.models or get_suite_spec(cfg.suite).models
        ms = methods(model_pairs(models, cfg.budget) if models else default_pairs(cfg.budget),
                     chosen)
    for spec in dict.fromkeys(m.pair.gate for m in ms):
        check_spec(spec)  # unknown kind (never a fallback), budget rules, parameter names
    probe_scorers(dict.fromkeys(m.scorer for m in ms), timeout=cfg.scorer_timeout)
    backend.check_backbone(cfg.backbone)  # unknown name, unreachable id, unknown architecture
    if cfg.head is not None:
        from uqbench.data.suite_spec import check_head

        check_head(cfg.head)
    from uqbench.data.suite_spec import get_suite_spec

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
    if cfg.scorer_timeout is not None and not cfg.scorer_timeout > 0:
        raise ConfigError(f"--scorer-timeout {cfg.scorer_timeout:g}: give a positive number of "
                          "seconds, or 0 on the command line for no limit")


def run(cfg: RunConfig, backend: Backend | None = None) -> RunResult:
    """Run ``cfg``: prepare, build the data, get every method's outputs from ``backend``'s
    engine (default: the ``"torch"`` backend), score them, write the report and figures."""
    t0 = time.perf_counter()
    fallbacks = reset_fallbacks()  # run.json `fallbacks`: what this run did instead of asked
    backend = backend or get_backend()
    prof, ms, out, cache, data = prepare(cfg, backend)
    if (n := sweep_orphans(cache)):
        log.info("removed %d temporary file(s) left in %s by killed runs", n, cache)
    why = "--threads" if cfg.threads else "the cores this process may use"
    threads = backend.set_threads(cfg.threads)
    print(f"torch threads: {threads} ({why})", flush=True)
    from uqbench.data.suite_spec import get_suite_spec
    from uqbench.data.suites import build_suite

    with backend.main_first():  # process 0 builds the split cache, the others read it
        suite = build_suite(cfg.suite, prof, data_dir=data, cache_dir=cache / "splits",
                            progress=cfg.progress)
    train = suite.role("train")  # a scorer that cannot score this training set is skipped now
    ms, skipped = drop_unusable(ms, [s.domain for s in train], sum(len(s.records) for s in train))
    stats = RunStats()
    stats.seconds["data"] = time.perf_counter() - t0
    engine = backend.engine(cfg.backbone, prof, suite, cache, stats, progress=cfg.progress,
                            head=cfg.head or get_suite_spec(cfg.suite).head)
    n_seeds = cfg.seeds or prof.seeds
    pairs = list(dict.fromkeys(m.pair for m in ms))
    # calib: every method's ECE is reported beside its recalibrated ECE (`uqbench.stats.recalibration`)
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
    t_score = time.perf_counter()  # models+passes: backbone, trainings, calibration, passes
    stats.seconds["models+passes"] = t_score - t0 - stats.seconds["data"]
    if not backend.is_main():  # every process holds every record; process 0 reports
        return RunResult(out, [], stats)
    refs = reference_inputs(suite)
    rows, arrays = score_all(ms, refs, outs, n_seeds, prof.bootstrap, cache=ArrayCache(cache),
                             scorer_timeout=cfg.scorer_timeout)
    stats.seconds["scoring"] = time.perf_counter() - t_score
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
        "fallbacks": fallbacks,  # {what, where, reason}: `uqbench.core.errors.record_fallback`
        "skipped_scorers": skipped,  # {scorer, pair, reason}: `uqbench.core.plan.drop_unusable`
        "processes": backend.world(),
        "environment": environment(threads, n_seeds, engine.training_log,
                                   (s.recipe for s in suite.splits.values())),
        "seconds": {**stats.seconds},
    }
    # the forward records themselves, so that `uqbench score`/`export` need no model work
    records = RecordSet(pairs, dict(outs), n_seeds, refs,
                        prof.bootstrap, method_entries(ms),
                        {"suite": cfg.suite, "profile": prof.name, "backbone": cfg.backbone,
                         "gates": engine.gate_log, "training": engine.training_log})
    write_record_set(out / rundir.RECORDS, records)
    write_run(out, rows, arrays, meta, t0=t0, figures=cfg.figures)
    if cfg.experiment:  # paper_report.md: the claims of this experiment (paper: all)
        from uqbench.reporting.paper import write_paper_report

        print(write_paper_report(out, cfg.experiment).read_text(), flush=True)
    print_summary(out, rows, meta)
    print(f"forward passes run: {stats.total()}, cache hits: {stats.cache_hits}", flush=True)
    return RunResult(out, rows, stats)


def write_run(out: Path, rows: list[dict[str, Any]], arrays: Mapping[str, np.ndarray],
              meta: dict[str, Any], *, t0: float, figures: bool, final: Path | None = None
              ) -> None:
    """Write a run folder's tables, ``run.json`` (with ``at_chance`` and ``seconds``), scores,
    figures and ``report.html``; ``t0``: when the run started (``perf_counter``), for
    ``seconds.total``; ``final``: where ``out`` will be renamed to (messages name it)."""
    meta["at_chance"] = warn_at_chance(rows)  # one WARNING listing every method at chance
    meta["seconds"]["total"] = time.perf_counter() - t0
    write_results(out, rows, meta)
    rundir.write_scores(out, arrays)
    if figures:
        t_fig = time.perf_counter()
        _draw_figures(out, arrays, meta.get("training", {}))
        meta["seconds"]["figures"] = time.perf_counter() - t_fig
        meta["seconds"]["total"] = time.perf_counter() - t0
        atomic_write_text(out / rundir.META, json.dumps(meta, indent=1, default=str))
    _write_html_report(out, meta, final or out)
    print("seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in meta["seconds"].items()),
          flush=True)


def _write_html_report(out: Path, meta: dict[str, Any], final: Path) -> None:
    """``report.html`` (`uqbench.reporting.html`), which must never fail a run: if rendering fails, the
    error is warned about and recorded in ``run.json`` ``report_html_error``; results stay."""
    from uqbench.reporting.html import write_report

    try:
        write_report(out)
    except Exception as exc:  # noqa: BLE001 -- any rendering error: the run's results stand
        meta["report_html_error"] = f"{type(exc).__name__}: {exc}"
        log.warning("report.html was not written (%s); the results are complete, rerun "
                    "`uqbench report %s --html` after fixing it", meta["report_html_error"], final)
        atomic_write_text(out / rundir.META, json.dumps(meta, indent=1, default=str))


def print_summary(out: Path, rows: Sequence[Mapping[str, Any]], meta: Mapping[str, Any]) -> None:
    """The pooled table, the at-chance warning and where the files are."""
    print(summary(rows), flush=True)
    if meta["at_chance"]:  # the list went to the log (stderr) once; the summary points at it
        print(f"\nWARNING: {len(meta['at_chance'])} method/domain result(s) have an ID accuracy "
              "CI that includes chance (listed in the log, on stderr, and in run.json "
              "`at_chance`): their UQ numbers measure a model at chance", flush=True)
    print(f"\nwrote {out}/results.{{md,csv,jsonl,tex}}", flush=True)


def score_all(ms: Sequence[Method], refs: ReferenceInputs,
              outs: Mapping[tuple[str, str, int], Outputs], n_seeds: int, n_boot: int,
              cache: ArrayCache | None = None, scorer_timeout: float | None = None,
              protocol: str = PROTOCOL_VERSION
              ) -> tuple[list[dict[str, Any]], dict[str, np.ndarray]]:
    """One row per method per domain of ``refs`` and ``pooled``, then the reference rows
    (``chance``, ``options-only``: `uqbench.results.references`); also the per-example arrays for
    figures. ``outs`` is keyed ``(pair name, "domain/role", seed)``; ``n_boot`` bootstrap
    resamples. With ``cache``, rows already evaluated on identical scores are read back.
    ``protocol``: the forward-record protocol the rows name (records made elsewhere keep the
    one they were made under).

    ``outs`` holds the ``calib`` split of every domain too: each row's ``ece_ts``/``ece_hb``/
    ``ece_iso`` are the ECE on the ID split after recalibrating on it (`uqbench.stats.recalibration`)."""
    from uqbench.results.conformal_risk import conformal_risk_columns
    from uqbench.stats.recalibration import CALIBRATORS, recalibrate_cached

    rows: list[dict[str, Any]] = []
    arrays: dict[str, np.ndarray] = {}
    domains = list(refs.domains)
    for m in ms:
        for dom in [*domains, "pooled"]:
            parts = domains if dom == "pooled" else [dom]

            id_outs, sh_outs, cal_outs = (
                [Outputs.concat([outs[m.pair.name, f"{d}/{role}", r] for d in parts])
                 for r in range(n_seeds)]
                for role in ("id", "shift", "calib"))
            id_s, sh_s, cal_s = (Scored.of(m.scorer, o, timeout=scorer_timeout)
                                 for o in (id_outs, sh_outs, cal_outs))
            metrics = evaluate_cached(cache, id_s, sh_s, n_bins=ECE_BINS, n_boot=n_boot, seed=0)
            recal, recal_conf = recalibrate_cached(
                cache, m.scorer, cal_outs, id_outs, cal_s.confidence, id_s.confidence,
                id_s.correct, where=f"{m.name} on {dom}", n_bins=ECE_BINS, n_boot=n_boot, seed=0)
            at = list(metrics).index("ece_hi") + 1  # the recalibrated ECEs beside the raw one
            row: dict[str, Any] = {
                "method": m.name, "model": m.pair.model.name, "gate": m.pair.gate.name,
                "scorer": m.scorer.name, "domain": dom,
                **dict(list(metrics.items())[:at]), **recal, **dict(list(metrics.items())[at:]),
                "forward_passes": m.scorer.passes(id_outs[0]),
                "n_id": id_outs[0].n, "n_shift": sh_outs[0].n, "n_calib": cal_outs[0].n,
                "seeds": n_seeds, "protocol": protocol,
                "split_hashes": ",".join(refs.hashes[f"{d}/{r}"] for d in parts
                                         for r in ("id", "shift")),
                "calib_hashes": ",".join(refs.hashes[f"{d}/calib"] for d in parts),
            }
            # conformal sets and selective risk control, fitted on calib
            groups = {r: o[0].domain for r, o in (("calib", cal_outs), ("id", id_outs),
                                                   ("shift", sh_outs))} if len(parts) > 1 else None
            row.update(conformal_risk_columns(cache, cal_s, id_s, sh_s, n_boot=n_boot,
                                       arrays=arrays, owner=(m.name, dom), groups=groups))
            rows.append(row)
            # per-example arrays are (N, seeds): verdicts and figures pool every seed
            for kind in CALIBRATORS:
                arrays[score_key(m.name, dom, "id", f"confidence_{kind}")] = \
                    recal_conf.confidence[kind]
            for role, os_ in (("id", id_outs), ("shift", sh_outs)):
                for f in ("route_entropy", "top1_mass", "disagreement", "experts", "labels"):
                    if getattr(os_[0], f) is not None:
                        arrays[score_key(m.pair.name, dom, role, f)] = np.stack(
                            [getattr(o, f) for o in os_], 1)
            for role, sc in (("id", id_s), ("shift", sh_s)):
                for f in SCORE_FIELDS:
                    arrays[score_key(m.name, dom, role, f)] = getattr(sc, f)
    rows += reference_rows(refs, n_boot=n_boot, seed=0, protocol=protocol)  # chance, options-only
    return rows, arrays


def _draw_figures(out: Path, arrays: Mapping[str, np.ndarray], training: Any) -> None:
    """Draw the run's figures unless ``figures/STAMP`` shows they were drawn from these very
    results by this very figures code and are all still there (a warm rerun then costs nothing)."""
    draw = get_drawer()
    h = hashlib.sha256((out / rundir.RESULTS).read_bytes())
    h.update(json.dumps(training, sort_keys=True).encode())  # the training figure's input
    for k in sorted(arrays):
        h.update(k.encode() + np.ascontiguousarray(arrays[k]).tobytes())
    for src in sorted(Path(inspect.getfile(draw)).parent.glob("*.py")):  # the figures code
        h.update(src.read_bytes())
    stamp = out / rundir.FIGURES / "STAMP"
    try:
        old = json.loads(stamp.read_text())
        if old["hash"] == h.hexdigest() and all((out / rundir.FIGURES / f).exists() for f in old["files"]):
            log.info("figures are up to date with these results; not redrawn")
            return
    except (OSError, ValueError, KeyError, TypeError):
        pass
    paths = draw(out)
    atomic_write_text(stamp, json.dumps({"hash": h.hexdigest(), "files": [p.name for p in paths]}))


__all__ = ["RunConfig", "RunResult", "RunStats", "prepare", "print_summary", "run",
           "score_all", "write_run"]
