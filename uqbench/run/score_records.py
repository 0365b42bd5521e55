"""``uqbench score``: a run folder from forward records made elsewhere, with no model work.

The records come from a uqbench records folder (``RUN_DIR/records`` or ``uqbench export``) or
from lm-evaluation-harness samples (`uqbench.io.lmeval`). Each chosen scorer is paired with every
model/gate pair whose records hold the fields it ``requires``; a scorer no pair can serve is
skipped with the missing fields, warned about and listed in ``run.json`` ``skipped_scorers``.
Scoring, tables, figures and ``run.json`` are those of ``uqbench run`` (`uqbench.run.runner`). The
folder is built under a temporary name and renamed into place when complete, so an interrupted
``score`` leaves no half-written run folder, and a finished run is replaced only with
``overwrite``.
"""
from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from uqbench.core.errors import ConfigError, UserError, reset_fallbacks
from uqbench.core.plan import Method, drop_unusable
from uqbench.core.registry import import_plugin
from uqbench.core.scorer import Scorer, get_scorer, list_scorers, probe_scorers
from uqbench.files.cache import ArrayCache
from uqbench.io.recordset import RecordSet, new_folder, read_record_set
from uqbench.results.columns import skipped_columns
from uqbench.results.rows import score_all
from uqbench.run.folder import print_summary, write_run
from uqbench.run.runner import RunResult, RunStats

log = logging.getLogger(__name__)


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
        from uqbench.io.confidence import ReportedConfidence

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
    for s in skipped:
        log.warning("skipped %s on %s: needs %s, which these records do not hold", s["scorer"],
                    s["pair"], ", ".join(s["missing"]))
    ref = next((o for o in rs.outputs.values() if o.train_domain is not None), None)
    if ms and ref is not None:  # the training set the run's feature scorers would read
        ms, unusable = drop_unusable(ms, ref.train_domain.tolist(), len(ref.train_domain))
        skipped += unusable
    if not ms:
        raise ConfigError("no scorer can run on these records (each needs a field they do not "
                          "hold); choose --scorers among those that read logits, e.g. msp")
    return ms, skipped


def load_records(source: Path, *, domains: Sequence[str] = (), domains_file: Path | None = None,
                 members: Sequence[Path] = (), **lmeval: Any) -> RecordSet:
    """The records at ``source``: a records folder (``manifest.json``), a run folder (its
    ``records/``), a confidence-only ``.jsonl``/``.csv`` file (`uqbench.io.confidence`), a
    folder of HELM runs (`uqbench.io.helm`) or an lm-eval output folder (then
    ``domains``/``domains_file`` pair its tasks or HELM runs, ``members`` are other runs of
    them; ``lmeval``: the other options of `uqbench.io.lmeval.read_lmeval`, unused for uqbench
    records)."""
    from uqbench.io.lmeval import DomainTasks, domains_from_yaml, read_lmeval

    if source.suffix in (".jsonl", ".csv") or source.is_file():
        from uqbench.io.confidence import read_confidence

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
    tasks = [DomainTasks.parse(d) for d in domains]
    if domains_file is not None:
        tasks += domains_from_yaml(domains_file)
    from uqbench.io.helm import is_helm, read_helm

    if is_helm(source):
        if members or lmeval.get("runs"):
            raise ConfigError(f"{source} holds HELM runs: --members and --run are for lm-eval")
        return read_helm(tasks, source, model_name=lmeval.get("model_name"),
                         calib_fraction=lmeval.get("calib_fraction", 0.2),
                         seed=lmeval.get("seed", 0))
    return read_lmeval(tasks, source, members=members, **lmeval)


def score(rs: RecordSet, cfg: ScoreConfig) -> RunResult:
    """Score ``rs`` into the run folder ``cfg.out``: rows, scores, figures and ``run.json``."""
    t0 = time.perf_counter()
    fallbacks = reset_fallbacks()  # run.json `fallbacks`, as `uqbench run` records them
    check_out(cfg.out, cfg.overwrite)
    if cfg.bootstrap is not None and cfg.bootstrap < 1:
        raise ConfigError(f"--bootstrap {cfg.bootstrap}: give at least 1 resample")
    for p in cfg.plugins:
        import_plugin(p)
    rs.check()
    ms, skipped = plan_methods(rs, cfg)
    scorers: Sequence[Scorer] = list(dict.fromkeys(m.scorer for m in ms))
    probe_scorers(scorers, timeout=cfg.scorer_timeout)
    n_boot = cfg.bootstrap or rs.bootstrap
    with tempfile.TemporaryDirectory() as scratch:  # rows are memoised by content: with one
        # domain, `pooled` holds the same examples and is read back, not bootstrapped twice
        rows, arrays = score_all(ms, rs.refs, rs.outputs, rs.seeds, n_boot,
                                 cache=ArrayCache(cfg.cache_dir or scratch),
                                 scorer_timeout=cfg.scorer_timeout, protocol=rs.protocol)
    meta: dict[str, Any] = {
        **rs.meta, "scored_from": rs.meta.get("source", "uqbench records"),
        "domains": list(rs.domains), "seeds": rs.seeds, "bootstrap": n_boot,
        "splits": {k: {"hash": h} for k, h in rs.refs.hashes.items()},
        "methods": [m.name for m in ms], "skipped_scorers": skipped, "fallbacks": fallbacks,
        "references": (["chance"] if rs.refs.n_choices else [])
        + (["options-only"] if rs.refs.options_only is not None else []),
        "seconds": {"scoring": time.perf_counter() - t0},
    }
    if rs.refs.options_only is None:
        meta["references_skipped"] = {"options-only": "needs the option texts of a train split "
                                      "to fit the options-only classifier; these records have "
                                      "none"}
    if not rs.refs.n_choices:
        meta["references_skipped"]["chance"] = "needs each question's option count (n_choices)"
    fields = frozenset.intersection(*(o.available() for (_, split, _), o in rs.outputs.items()
                                      if not split.endswith("/train")))
    if cols := skipped_columns(fields):
        meta["skipped_columns"] = cols
        for c in cols:
            log.warning("columns not computed: %s: %s", ", ".join(c["columns"]), c["reason"])
    with new_folder(cfg.out) as tmp:
        write_run(tmp, rows, arrays, meta, t0=t0, figures=cfg.figures, final=cfg.out)
    print_summary(cfg.out, rows, meta)
    for c in meta.get("skipped_columns", []):
        print(f"columns skipped: {', '.join(c['columns'])} ({c['reason']})", flush=True)
    if skipped:
        print("skipped: " + "; ".join(
            f"{s['scorer']} on {s['pair']}: " + (s["reason"] if "reason" in s else
                                                 f"needs {', '.join(s['missing'])}")
            for s in skipped), flush=True)
    return RunResult(cfg.out, rows, RunStats())


__all__ = ["ScoreConfig", "check_out", "load_records", "plan_methods", "score"]
