"""``uqbench score``: a run folder from forward records made elsewhere, with no model work.

The records come from a uqbench records folder (``RUN_DIR/records`` or ``uqbench export``) or
from lm-evaluation-harness samples (`uqbench.io.lmeval`). Each chosen scorer is paired with every
model/gate pair whose records hold the fields it ``requires``; a scorer no pair can serve is
skipped with the missing fields, warned about and listed in ``run.json`` ``skipped_scorers``.
Scoring, tables, figures and ``run.json`` are those of ``uqbench run`` (`uqbench.run.runner`). The
folder is built under a temporary name and renamed into place when complete, so an interrupted
``score`` leaves no half-written run folder, and a finished run is replaced only with
``overwrite``.

Several models (`load_models`: several sources, or one folder whose subfolders are models, as
lm-eval's ``--output_path`` holds ``<org>__<model>/``) become the model/gate pairs of one
`RecordSet` (`merge_models`), scored by the same code path; their questions must be the same
(ids, labels, choice counts and split contents), each split in one order, so every per-example
array pairs question with question. `score` then also writes the model-by-metric table
(`uqbench.reporting.models`) beside the usual tables.
"""
from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from uqbench.core.errors import ConfigError, UserError, reset_fallbacks
from uqbench.core.plan import Method, drop_unusable
from uqbench.core.registry import import_plugin
from uqbench.core.scorer import Scorer, get_scorer, list_scorers, probe_scorers
from uqbench.files.cache import ArrayCache
from uqbench.files.rundir import RunFolder
from uqbench.io.confidence import ReportedConfidence, read_confidence
from uqbench.io.helm import is_helm, read_helm
from uqbench.io.lmeval import (
    NO_SHIFT,
    DomainTasks,
    domains_from_yaml,
    dump_files,
    dump_index,
    known_pairs,
    read_lmeval,
    run_models,
    task_names,
)
from uqbench.io.recordset import RecordSet, new_folder, read_record_set
from uqbench.reporting.models import FILES, markdown, model_table, write_models
from uqbench.results.columns import skipped_columns
from uqbench.results.references import NO_SHIFT_COLUMNS, zero_shot_skipped
from uqbench.results.rows import check_workers, score_all, score_workers
from uqbench.run.folder import print_summary, write_run
from uqbench.run.runner import RunResult, RunStats

log = logging.getLogger(__name__)
#: the scorer that stands for each model in a many-model table unless --rank-scorer names one:
#: the MSP, or a confidence-only record's own reported confidence
RANK_SCORERS = ("msp", "reported")


@dataclass(frozen=True)
class ScoreConfig:
    out: Path
    scorers: tuple[str, ...] = ()  # empty: the methods of the run the records came from, or all
    plugins: tuple[str, ...] = ()
    bootstrap: int | None = None  # None: the records' (the run's profile; lm-eval: 1000)
    cache_dir: Path | None = None  # memoises rows by content; None: for this call only
    figures: bool = True
    overwrite: bool = False
    scorer_timeout: float | None = 300.0
    #: the scorer whose rows stand for each model in the model table (None: `RANK_SCORERS`)
    rank_scorer: str | None = None
    #: processes scoring the methods (`uqbench.results.rows.score_workers`): auto, or N
    score_workers: int | str = "auto"


def check_out(out: Path, overwrite: bool) -> None:
    """Refuse to replace a finished run folder unless asked (before any work)."""
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file, not a folder; give a folder path")
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise UserError(f"{out} already exists and is not empty; pass another --out, or "
                        "--overwrite to replace it")


def plan_methods(rs: RecordSet, cfg: ScoreConfig
                 ) -> tuple[list[Method], list[dict[str, Any]]]:
    """The methods to score, and the (scorer, pair) combinations skipped with what is missing.

    A pair's fields are those every one of its evaluation records holds (not what its model
    could produce; its train records, the feature scorers' reference, hold logits and features
    only). Unknown scorer names are a `ConfigError`."""
    pairs = [replace(p, fields=frozenset.intersection(*(  # train records: features only
        o.available() for (name, split, _), o in rs.outputs.items()
        if name == p.name and not split.endswith("/train"))))
        for p in rs.pairs]
    wanted: list[tuple[str | None, Scorer]]  # (the pair it is for, None: every pair; scorer)
    try:
        if cfg.scorers or rs.methods is None:
            wanted = [(None, get_scorer(n)) for n in cfg.scorers or list_scorers()]
        else:  # the run's own methods, in its order and under its names
            wanted = []
            for m in rs.methods:
                sc = get_scorer(m.registered, **m.params)
                sc.name = m.scorer
                wanted.append((m.pair, sc))
    except KeyError as exc:
        raise ConfigError(str(exc.args[0])) from None
    if any("confidence" in p.fields for p in pairs):  # confidence-only records' own method
        wanted.insert(0, (None, ReportedConfidence()))
    ms: list[Method] = []
    skipped: list[dict[str, Any]] = []
    for pair_name, sc in wanted:
        for p in pairs:
            if pair_name not in (None, p.name):
                continue
            missing = sorted(sc.requires - p.fields)
            if missing:
                skipped.append({"scorer": sc.name, "pair": p.name, "missing": missing})
            else:
                ms.append(Method(p, sc))
    for line in skipped_summary(skipped):
        log.warning("%s", line)
    train_domain = next((o.train_domain for o in rs.outputs.values()
                         if o.train_domain is not None), None)
    if ms and train_domain is not None:  # the training set the run's feature scorers would read
        ms, unusable = drop_unusable(ms, train_domain.tolist(), len(train_domain))
        skipped += unusable
    if not ms:
        raise ConfigError("no scorer can run on these records (each needs a field they do not "
                          "hold); choose --scorers among those that read logits, e.g. msp")
    return ms, skipped


def skipped_summary(skipped: Sequence[dict[str, Any]]) -> list[str]:
    """One line for the scorers skipped because the records lack the fields they need (lm-eval
    samples hold no model internals), one per other skip (its reason)."""
    missing = [s for s in skipped if "missing" in s and "reason" not in s]
    lines = [f"{s['scorer']} on {s['pair']} skipped: {s['reason']}" for s in skipped
             if "reason" in s]
    if missing:
        names = list(dict.fromkeys(s["scorer"] for s in missing))
        fields = sorted({f for s in missing for f in s["missing"]})
        lines.insert(0, f"{len(names)} scorer(s) need model internals these records do not "
                     f"hold ({', '.join(fields)}): {', '.join(names)}; each with what it "
                     "needs in run.json skipped_scorers")
    return lines


def load_records(source: Path, *, domains: Sequence[str] = (), domains_file: Path | None = None,
                 members: Sequence[Path] = (), **lmeval: Any) -> RecordSet:
    """The records at ``source``: a records folder (``manifest.json``), a run folder (its
    ``records/``), a confidence-only ``.jsonl``/``.csv`` file (`uqbench.io.confidence`), a
    folder of HELM runs (`uqbench.io.helm`) or an lm-eval output folder (then
    ``domains``/``domains_file`` pair its tasks or HELM runs, ``members`` are other runs of
    them; ``lmeval``: the other options of `uqbench.io.lmeval.read_lmeval`, unused for uqbench
    records)."""
    if source.is_file() and source.suffix == ".json" and dump_files(source):
        pass  # a simple_evaluate result: read_lmeval below
    elif source.suffix in (".jsonl", ".csv") or source.is_file():
        if domains or domains_file or members or lmeval.get("runs"):
            raise ConfigError(f"{source} holds confidence-only records, which name their "
                              "domains and splits: drop --domain/--domains/--members/--run")
        return read_confidence(source, model_name=lmeval.get("model_name"),
                               calib_fraction=lmeval.get("calib_fraction", 0.2),
                               seed=lmeval.get("seed", 0))

    for folder in (source, source / "records"):
        if (folder / "manifest.json").is_file():
            if domains or domains_file or members or lmeval.get("runs"):
                raise ConfigError(f"{folder} holds uqbench records, which know their domains "
                                  "and members: drop --domain/--domains/--members/--run")
            return read_record_set(folder)
    if list(domains) == ["auto"]:
        tasks = known_pairs(task_names(source))
        if not tasks:
            raise ConfigError(f"--domain auto: the tasks of {source} ("
                              f"{', '.join(task_names(source)) or 'none'}) form no known ID -> "
                              "shift pair (ARC-Easy -> Challenge, MMLU high-school -> college "
                              "subject, BBH logical deduction 3 -> 7 objects); pair them with "
                              "--domain NAME=ID:SHIFT")
        print("--domain auto: " + " ".join(f"{d.name}={d.id}:{d.shift}" for d in tasks),
              flush=True)
    else:
        tasks = [DomainTasks.parse(d) for d in domains]
    if domains_file is not None:
        tasks += domains_from_yaml(domains_file)
    if is_helm(source):
        if members or lmeval.get("runs"):
            raise ConfigError(f"{source} holds HELM runs: --members and --run are for lm-eval")
        return read_helm(tasks, source, model_name=lmeval.get("model_name"),
                         calib_fraction=lmeval.get("calib_fraction", 0.2),
                         seed=lmeval.get("seed", 0))
    return read_lmeval(tasks, source, members=members, **lmeval)


def model_sources(source: Path) -> list[Path]:
    """The models under ``source``: itself when it holds one model's records (a records or run
    folder, or samples files of its own), each `simple_evaluate` result file in it when they
    are of several models (other ``model_args``), else each of its subfolders holding some
    (lm-eval's ``--output_path`` layout ``<out>/<org>__<model>/samples_*.jsonl``) when there are
    two or more, unless their results files all name one model (its tasks run into several
    folders: then itself); itself otherwise (then its reader names what is missing)."""
    def holds_records(d: Path) -> bool:
        return (d / "manifest.json").is_file() or (d / "records" / "manifest.json").is_file()

    if not source.is_dir() or holds_records(source):
        return [source]
    dumps = dump_files(source)
    if len({dump_index(d)[2] for d in dumps}) > 1:  # simple_evaluate results of several models
        return dumps
    if dumps or any(source.glob("samples_*.json*")):
        return [source]
    subs = [d for d in sorted(source.iterdir()) if d.is_dir() and (
        holds_records(d) or next(d.rglob("samples_*.json*"), None) is not None)]
    models = [run_models(d) for d in subs] if len(subs) > 1 and not any(
        map(holds_records, subs)) else []
    if models and all(models) and len(set().union(*models)) == 1:
        return [source]  # one model's tasks in several folders (e.g. TASK/MODEL/ per run)
    return subs if len(subs) > 1 else [source]


def load_models(sources: Sequence[Path], *, model_name: str | Sequence[str] | None = None,
                members: Sequence[Path] = (), **kw: Any) -> RecordSet:
    """The records of one or several models: each of ``sources`` (a folder of models counts as
    its subfolders, `model_sources`) read by `load_records` with the options ``kw``, then
    merged into one `RecordSet` (`merge_models`). ``model_name``: one name per source, in order
    (a string: the one source's); ``members`` belong to one model: refused with several. Two
    lm-eval sources whose names collide but whose ``model_args`` differ (a base model and its
    fine-tuned adapter share the base's path) are named by their source folders, saying so."""
    found = [m for s in sources for m in model_sources(Path(s))]
    names = [model_name] if isinstance(model_name, str) else list(model_name or ())
    if names and len(names) != len(found):
        raise ConfigError(f"{len(names)} --model-name for {len(found)} model source(s) ("
                          f"{', '.join(map(str, found))}): give one name per source, in order")
    if len(found) == 1:
        return load_records(found[0], members=members, model_name=next(iter(names), None),
                            **kw)
    if len(set(found)) < len(found):
        raise ConfigError("a source is given twice: " + ", ".join(
            sorted({str(p) for p in found if found.count(p) > 1})))
    if members:
        raise ConfigError(f"--members belong to one model, and the sources hold {len(found)} "
                          f"({', '.join(map(str, found))}): score one source at a time to use "
                          "them")
    loaded: list[tuple[Path, RecordSet]] = []
    for k, p in enumerate(found):
        print(f"model {len(loaded) + 1} of {len(found)}: {p}", flush=True)
        loaded.append((p, load_records(p, model_name=names[k] if names else None, **kw)))
    return merge_models(name_apart(loaded))


def _model_args(rs: RecordSet) -> str | None:
    lm = rs.meta.get("lmeval") or {}
    return lm.get("model_args") if lm.get("model_args") not in (None, "null") else None


def name_apart(loaded: Sequence[tuple[Path, RecordSet]]) -> list[tuple[Path, RecordSet]]:
    """``loaded`` with each lm-eval source whose model name another one shares, while their
    ``model_args`` differ, renamed after its source folder (printed; run.json ``models``
    ``renamed``). Sources of equal model_args keep their names: `merge_models` refuses them
    as two runs of one model."""
    by_name: dict[str, list[int]] = {}
    for k, (_, rs) in enumerate(loaded):
        for p in rs.pairs:
            by_name.setdefault(p.model.name, []).append(k)
    out = list(loaded)
    for name, ks in by_name.items():
        args = [_model_args(loaded[k][1]) for k in ks]
        if len(ks) < 2 or None in args or len(set(args)) < len(args):
            continue
        folders = apart([loaded[k][0] for k in ks])
        if folders is None:
            continue
        for k, folder in zip(ks, folders, strict=False):
            src, rs = loaded[k]
            out[k] = (src, renamed(rs, folder, f"{name!r} names {len(ks)} sources of other "
                                   f"model_args ({', '.join(folders)}): named by its folder"))
        print(f"model {name!r}: {len(ks)} sources with other model_args (e.g. an adapter on "
              f"the same base) share the name; named by their folders: {', '.join(folders)} "
              "(give --model-name once per source to choose)", flush=True)
    return out


def apart(sources: Sequence[Path]) -> list[str] | None:
    """A name per source that tells them apart: the nearest part of their paths, from the
    leaf up, that differs between all of them (a file by its stem). lm-eval names its
    ``--output_path`` subfolder after ``pretrained=``, so a base and its adapter written to
    ``gemma-base/`` and ``gemma-lofit/`` are ``gemma-base/<org>__<model>/`` and
    ``gemma-lofit/<org>__<model>/``: named ``gemma-base`` and ``gemma-lofit``. A local
    ``pretrained=`` makes that subfolder lm-eval's sanitised path (``__ckpt__my-model``): named
    by its last part (``my-model``). None when no part tells them apart."""
    paths = [p.resolve() for p in sources]
    parts = [[p.stem if p.is_file() else p.name, *(a.name for a in p.parents)] for p in paths]
    for depth in range(min(map(len, parts))):
        names = [ps[depth].rsplit("__", 1)[-1] if ps[depth].startswith("__") else ps[depth]
                 for ps in parts]
        if all(names) and len(set(names)) == len(names):
            return names
    return None


def renamed(rs: RecordSet, model: str, why: str) -> RecordSet:
    """``rs`` with its (lm-eval) pairs' model named ``model``; ``why`` goes to its meta."""
    new = {p.name: replace(p, model=replace(p.model, name=model)) for p in rs.pairs}
    outputs = {(new[pair].name if pair in new else pair, split, seed): o
               for (pair, split, seed), o in rs.outputs.items()}
    return replace(rs, pairs=list(new.values()), outputs=outputs,
                   meta={**rs.meta, "renamed": why})


def _mismatch(what: str, a: Sequence[str], b: Sequence[str]) -> str:
    only_a, only_b = sorted(set(a) - set(b)), sorted(set(b) - set(a))
    return (f"{what}: {len(a)} vs {len(b)} questions; " + "; ".join(
        f"{len(x)} only in {w} (e.g. {', '.join(x[:3])})" for w, x in (("the first", only_a),
                                                                       ("the other", only_b))
        if x))


def merge_models(loaded: Sequence[tuple[Path, RecordSet]]) -> RecordSet:
    """One `RecordSet` holding every model/gate pair of ``loaded`` ((source, records) of each
    model), each split's records in the first source's question order, so that example i is
    the same question for every model (the model table pairs its bootstrap on it).

    Refused with a `UserError` naming the sources and the mismatch: two sources with a pair of
    the same name (two runs of one model, or uqbench runs of the same model kinds), other
    domains or seed counts, or a split whose question ids, labels, choice counts or contents
    (its hash) differ."""
    (src0, first), rest = loaded[0], loaded[1:]
    owner: dict[str, Path] = {}
    for src, rs in loaded:
        for p in rs.pairs:
            if p.name in owner:
                raise UserError(
                    f"{owner[p.name]} and {src} both hold model {p.name!r}: two runs of one "
                    "model cannot be told apart in one table; give one run per model, or "
                    "--model-name once per source (lm-eval names a model by its model_args; "
                    "`uqbench compare RUN_A RUN_B` compares two uqbench runs of the same models)")
            owner[p.name] = src
    outputs = dict(first.outputs)
    for src, rs in rest:
        if rs.domains != first.domains or rs.seeds != first.seeds:
            raise UserError(f"{src} has domains {list(rs.domains)} and {rs.seeds} seed(s), "
                            f"{src0} {list(first.domains)} and {first.seeds}: the models must "
                            "be scored over the same domains (give the same --domain)")
        for (pair, split, seed), o in rs.outputs.items():
            if split.endswith("/train"):  # the model's own feature reference: nothing to pair
                outputs[pair, split, seed] = o
                continue
            ref = first.outputs[first.pairs[0].name, split, seed]
            ids, ref_ids = o.ids.astype(str), ref.ids.astype(str)
            if set(ids) != set(ref_ids) or len(ids) != len(ref_ids):
                raise UserError(f"{src} and {src0} are not over the same questions, so their "
                                f"models cannot be paired: split {split}, "
                                + _mismatch("question ids", ref_ids.tolist(), ids.tolist())
                                + "; run lm-eval on the same tasks with the same --limit (and "
                                "score with the same --calib-fraction and --seed)")
            if not np.array_equal(ids, ref_ids):  # the same questions in another order
                at = {q: k for k, q in enumerate(ids)}
                o = o.select(np.array([at[q] for q in ref_ids]))
            elif rs.refs.hashes[split] != first.refs.hashes[split]:
                raise UserError(f"split {split}: {src} and {src0} hold the same question ids "
                                f"but other contents (hash {rs.refs.hashes[split]} vs "
                                f"{first.refs.hashes[split]}): the questions' documents or "
                                "labels differ; score runs over the same data")
            # confidence-only records hold each model's correctness, no label: only two
            # sources that both have labels can disagree on one
            if o.labels is not None and ref.labels is not None:
                bad = np.flatnonzero(o.labels != ref.labels)
                if len(bad):
                    raise UserError(f"split {split}: question {ref_ids[bad[0]]} has label "
                                    f"{o.labels[bad[0]]} in {src} and {ref.labels[bad[0]]} in "
                                    f"{src0} ({len(bad)} of {len(ref_ids)} differ); score "
                                    "runs of the same task version")
            outputs[pair, split, seed] = o
    for src, rs in rest:
        for split, n in rs.refs.n_choices.items():
            order = outputs[rs.pairs[0].name, split, 0].ids.astype(str)
            mine = dict(
                zip(rs.outputs[rs.pairs[0].name, split, 0].ids.astype(str), n, strict=False)
            )
            if [mine[i] for i in order] != list(first.refs.n_choices[split]):
                raise UserError(f"split {split}: the questions have other choice counts in "
                                f"{src} than in {src0}; score runs of the same task version")
    def shared(tables: list[Any]) -> Any:
        """The first source's reference table where every source has the same one, else None
        (e.g. the zero-shot of several backbones)."""
        t0 = tables[0]
        same = t0 is not None and all(
            t is not None and t.keys() == t0.keys() and all(
                np.array_equal(t[k], t0[k]) for k in t) for t in tables)
        return t0 if same else None

    refs = replace(first.refs, options_only=shared([rs.refs.options_only for _, rs in loaded]),
                   zero_shot=shared([rs.refs.zero_shot for _, rs in loaded]))
    methods = None if any(rs.methods is None for _, rs in loaded) else [
        m for _, rs in loaded for m in rs.methods or ()]
    meta = {"source": "several models", "models": {
        p.name: {"source": str(src), **{k: rs.meta[k] for k in ("source", "lmeval", "suite",
                                                                  "backbone", "renamed")
                                        if k in rs.meta}}
        for src, rs in loaded for p in rs.pairs}}
    return RecordSet([p for _, rs in loaded for p in rs.pairs], outputs, first.seeds, refs,
                     min(rs.bootstrap for _, rs in loaded), methods, meta, first.protocol)


def score(rs: RecordSet, cfg: ScoreConfig) -> RunResult:
    """Score ``rs`` into the run folder ``cfg.out``: rows, scores, figures and ``run.json``."""
    t0 = time.perf_counter()
    fallbacks = reset_fallbacks()  # run.json `fallbacks`, as `uqbench run` records them
    check_out(cfg.out, cfg.overwrite)
    if cfg.bootstrap is not None and cfg.bootstrap < 1:
        raise ConfigError(f"--bootstrap {cfg.bootstrap}: give at least 1 resample")
    check_workers(cfg.score_workers)
    for p in cfg.plugins:
        import_plugin(p)
    rs.check()
    ms, skipped = plan_methods(rs, cfg)
    many = "models" in rs.meta  # several sources merged (`merge_models`): the model table
    ran = {m.scorer.name for m in ms}
    rank_scorer = cfg.rank_scorer or next((n for n in RANK_SCORERS if n in ran), "msp")
    if many and rank_scorer not in ran:
        raise ConfigError(f"--rank-scorer {rank_scorer!r} is not among the scorers run "
                          f"({', '.join(dict.fromkeys(m.scorer.name for m in ms))}); the model "
                          "table ranks each model by that scorer's row")
    scorers: Sequence[Scorer] = list(dict.fromkeys(m.scorer for m in ms))
    probe_scorers(scorers, timeout=cfg.scorer_timeout)
    n_boot = cfg.bootstrap or rs.bootstrap
    workers = score_workers(cfg.score_workers, ms, rs.outputs, n_boot)
    with tempfile.TemporaryDirectory() as scratch:  # rows are memoised by content: scorers
        # of one predictive distribution share their recalibration and conformal columns
        rows, arrays = score_all(ms, rs.refs, rs.outputs, rs.seeds, n_boot,
                                 cache=ArrayCache(cfg.cache_dir or scratch),
                                 scorer_timeout=cfg.scorer_timeout, protocol=rs.protocol,
                                 workers=workers, plugins=cfg.plugins)
    meta: dict[str, Any] = {
        **rs.meta, "scored_from": rs.meta.get("source", "uqbench records"),
        "domains": list(rs.domains), "seeds": rs.seeds, "bootstrap": n_boot,
        "splits": {k: {"hash": h} for k, h in rs.refs.hashes.items()},
        "methods": [m.name for m in ms], "skipped_scorers": skipped, "fallbacks": fallbacks,
        "references": (["chance"] if rs.refs.n_choices else [])
        + (["options-only"] if rs.refs.options_only is not None else [])
        + (["zero-shot"] if rs.refs.zero_shot is not None else []),
        "seconds": {"scoring": time.perf_counter() - t0}, "score_workers": workers,
    }
    skipped_refs: dict[str, str] = {}
    if rs.refs.options_only is None:
        skipped_refs["options-only"] = ("needs the option texts of a train split to fit the "
                                        "options-only classifier; these records have none")
    if not rs.refs.n_choices:
        skipped_refs["chance"] = "needs each question's option count (n_choices)"
    if rs.refs.zero_shot is None:
        skipped_refs["zero-shot"] = zero_shot_skipped(rs.meta.get("zero_shot"))
    if skipped_refs:
        meta["references_skipped"] = skipped_refs
    fields = frozenset.intersection(*(o.available() for (_, split, _), o in rs.outputs.items()
                                      if not split.endswith("/train")))
    cols = skipped_columns(fields)
    if no_shift := [d for d in rs.domains if f"{d}/shift" not in rs.refs.hashes]:
        cols.append({"columns": list(NO_SHIFT_COLUMNS), "domains": no_shift,
                     "reason": NO_SHIFT})
    if cols:
        meta["skipped_columns"] = cols
        for c in cols:
            log.warning("columns not computed: %s: %s", ", ".join(c["columns"]), c["reason"])
    table = None
    if many:
        table = model_table(RunFolder(cfg.out, rows, arrays, meta), scorer=rank_scorer,
                            n_boot=n_boot)
        meta["model_table"] = {"scorer": table.scorer, "models": table.models,
                               "left_out": table.left_out, "files": sorted(FILES.values())}
    with new_folder(cfg.out) as tmp:
        if table is not None:
            write_models(tmp, table)
        write_run(tmp, rows, arrays, meta, t0=t0, figures=cfg.figures, final=cfg.out)
    print_summary(cfg.out, rows, meta)
    for c in meta.get("skipped_columns", []):
        print(f"columns skipped: {', '.join(c['columns'])} ({c['reason']})", flush=True)
    if table is not None:
        print("\n" + markdown(table) + f"\nwrote {cfg.out}/models.{{md,csv,json}}", flush=True)
    return RunResult(cfg.out, rows, RunStats())


__all__ = ["ScoreConfig", "check_out", "load_models", "load_records", "merge_models",
           "model_sources", "plan_methods", "score"]
