"""The `uqbench` command line: parses arguments and calls library functions, nothing more.

    uqbench run --suite pooled [--profile cpu] [--backbone minilm] [--scorers a,b]
                [--plugin MODULE] [--out DIR] [--cache-dir DIR] [--data-dir DIR] [--seeds N]
                [--experiment NAME] [--models a,b] [--gates a,b] [--head cloze|letters]
                [--backend NAME] [--figures NAME] [--compile off|on|auto]
                [--cuda-graph off|on|auto] [--eval-tokens N] [--grad-checkpoint]
    uqbench list WHAT             # scorers gates sources suites backbones backends figures
                                  # experiments profiles models heads
    uqbench score SOURCE [SOURCE ...] --out DIR [--domain NAME=ID_TASK:SHIFT_TASK ...]
                                  # score records made elsewhere: lm-eval samples or an export;
                                  # several sources (or a folder of models): one table of models
    uqbench export RUN_DIR DEST   # copy a run's forward records (for `score` elsewhere)
    uqbench report RUN_DIR        # reprint a finished run's tables (--paper: its paper_report.md,
                                  # --html: (re)write its report.html)
    uqbench compare RUN_A RUN_B [...]  # paired differences of runs over the same splits
    uqbench plot RUN_DIR          # redraw a finished run's figures
    uqbench reproduce RUN_DIR     # rerun it from its run.json, diff results.csv and scores.npz
    uqbench data build --suite pooled --profile PROFILE
    (every command that resolves names takes --plugin MODULE or --plugin FILE.py: imported
    first, it may register scorers, gates, models, sources, suites, backbones, backends,
    figure sets, experiments or profiles)
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from uqbench.core.errors import UserError
from uqbench.core.profiles import COMPILE


def _csv(s: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in s.split(",") if x.strip())


SCORE_WORKERS_HELP = ("processes scoring the methods, a model/gate pair on a domain at a time: "
                      "auto (the cores this process may use; 1 for small runs) or N (1: in this "
                      "process); the rows are the same")


def _workers(s: str) -> int | str:
    """``auto`` or an int (the runner checks its range: `uqbench.results.rows.check_workers`)."""
    try:
        return s if s == "auto" else int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r}: give auto or a whole number >= 1") from None


def _build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="uqbench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="train/load models, score uncertainty, write the report")
    run.add_argument("--suite", default="pooled", help="built-in suite name or a suite YAML file")
    run.add_argument("--profile", default="cpu",
                     help="smoke | cpu | full | gpu, or a plugin's (uqbench list profiles)")
    run.add_argument("--backbone", default="minilm",
                     help="a registered backbone (uqbench list backbones: minilm, smollm2, "
                          "qwen2.5-coder-0.5b, ...), a Hugging Face model id or a local path")
    run.add_argument("--scorers", type=_csv, default=(), help="comma-separated (default: all)")
    run.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                     help="import MODULE (a module name, found also in the current folder, or "
                     "a .py file) first: it may register scorers, gates, models...; repeatable")
    run.add_argument(
        "--out", type=Path, help="results folder (default runs/SUITE-PROFILE-BACKBONE)"
    )
    run.add_argument("--cache-dir", type=Path, help="cache folder (default $UQBENCH_CACHE or "
                     ".uqbench-cache)")
    run.add_argument("--data-dir", type=Path, help="local dataset copies (default $UQBENCH_DATA)")
    run.add_argument("--seeds", type=int, help="repetitions (default: the profile's)")
    run.add_argument("--budget", type=float, default=4.0, help="CARE average experts budget B")
    run.add_argument("--experiment", help="a paper experiment (uqbench list experiments)")
    run.add_argument("--models", type=_csv, default=(),
                     help="comma-separated models to train and score (uqbench list models; "
                     "default: the suite's models:, else lora,moe-lora)")
    run.add_argument("--gates", type=_csv, default=(),
                     help="comma-separated gates the router models run under besides their own: "
                     "KIND or KIND:PARAM=VALUE[:...] (uqbench list gates; e.g. care,topk:k=2; "
                     "budgeted kinds at --budget; default: the suite's gates:, else care)")
    run.add_argument("--backend", default="torch",
                     help="the model side (uqbench list backends; default torch)")
    run.add_argument("--figures", dest="figure_set", default="figures", metavar="NAME",
                     help="the figure set that draws the figures (uqbench list figures)")
    run.add_argument("--head", metavar="NAME",
                     help="how options are scored: encoders bi_encoder (cosine of question and "
                     "option embeddings) or cross_encoder[_cls]; decoders cloze (option "
                     "log-likelihood) or letters (answer letter); default: the suite's head:, "
                     "else auto (the profile's recipe)")
    run.add_argument("--scorer-timeout", type=float, default=300.0, metavar="SECONDS",
                     help="stop the run if one scorer call takes longer (default 300; 0: none)")
    run.add_argument("--threads", type=int, default=None, metavar="N",
                     help="torch intra-op threads (default: the cores this process may use, "
                     "os.sched_getaffinity; on a machine shared with other busy processes 1 "
                     "avoids threads spinning on a busy core)")
    run.add_argument("--score-workers", type=_workers, default="auto", metavar="N",
                     help=SCORE_WORKERS_HELP)
    run.add_argument("--compile", choices=list(COMPILE),
                     help="torch.compile each transformer block in training, with static "
                     "shapes: auto = on where CUDA is available (default: the profile's, off)")
    run.add_argument("--cuda-graph", choices=list(COMPILE),
                     help="replay each training step's forward and backward as CUDA graphs, "
                     "one per batch shape (the eager step is bound by launching kernels): auto = "
                     "on where CUDA is and one process trains; not with --compile on (default: "
                     "the profile's, off)")
    run.add_argument("--eval-tokens", type=int, metavar="N",
                     help="padded tokens one MC-dropout forward may hold, its stacked copies "
                     "counted: longer batches run their copies in groups, same values "
                     "(default: the profile's, no bound; `python -m benchmarks memory` gives "
                     "the bytes a token holds)")
    run.add_argument("--grad-checkpoint", action="store_true", default=None,
                     help="recompute each transformer block's activations in the backward "
                     "instead of keeping them: a large backbone's training step fits a GPU, and "
                     "runs every block's forward twice (not with --compile on or --cuda-graph "
                     "on)")
    run.add_argument("--no-figures", action="store_true")
    run.add_argument("--no-progress", action="store_true")
    run.add_argument("--overwrite", action="store_true",
                     help="replace an --out folder holding another configuration's results")

    sc = sub.add_parser("score", help="score forward records made elsewhere (lm-eval samples, "
                        "a uqbench export) into a run folder, with no model work")
    sc.add_argument("sources", type=Path, nargs="+", metavar="SOURCE",
                    help="a uqbench records folder (uqbench export, or RUN_DIR/records), a run "
                    "folder, an lm-eval --output_path folder, a confidence-only .jsonl/.csv file "
                    "or a folder of HELM runs; several (one per model), or a folder whose "
                    "subfolders are models (lm-eval's <out>/<org>__<model>/), score the models "
                    "side by side: models.{md,csv,json}, a ranking figure")
    sc.add_argument("--out", type=Path, required=True, help="the run folder to write")
    sc.add_argument("--domain", action="append", default=[], metavar="NAME=ID:SHIFT[:CALIB]",
                    help="lm-eval: a domain's ID, shifted and (optional) calib task; repeatable")
    sc.add_argument("--domains", type=Path, metavar="FILE.yaml",
                    help="lm-eval: domains: {NAME: {id: TASK, shift: TASK, calib: TASK}}")
    sc.add_argument("--members", action="append", type=Path, default=[], metavar="DIR",
                    help="lm-eval: another run of the same tasks (seed/model) for the ensemble "
                    "scorers; repeatable")
    sc.add_argument("--normalize", default="auto", choices=["auto", "none", "chars", "bytes"],
                    help="lm-eval: logit = log-likelihood (none: lm-eval's acc), per character "
                    "of the choice (chars: acc_norm) or per UTF-8 byte (bytes: acc_bytes); "
                    "auto (the default): per domain, acc_norm where every task of the domain "
                    "logs it, else acc, so the accuracy is one lm-eval logged")
    sc.add_argument("--calib-fraction", type=float, default=0.2,
                    help="lm-eval: fraction of the ID questions held out for recalibration when a "
                    "domain has no calib task (default 0.2)")
    sc.add_argument("--seed", type=int, default=0, help="lm-eval: seed of that hold-out")
    sc.add_argument("--run", action="append", default=[], metavar="DATE",
                    help="lm-eval: where the folder holds several runs of a task, the one whose "
                    "date (samples_<task>_<DATE>.jsonl, or its start) is DATE (default: the "
                    "newest); repeatable, for tasks run at different dates")
    sc.add_argument("--model-name", action="append", default=[], metavar="NAME",
                    help="lm-eval: a model's name in the method column (default: its "
                    "pretrained= hub id or folder, from the results file); with several "
                    "sources, once per source, in order")
    sc.add_argument("--scorers", type=_csv, default=(),
                    help="comma-separated (default: the run's methods for uqbench records, all "
                    "scorers for lm-eval)")
    sc.add_argument("--rank-scorer", metavar="SCORER",
                    help="several models: the scorer whose rows stand for each model in the "
                    "model table (default msp, or the reported confidence of confidence-only "
                    "records)")
    sc.add_argument("--plugin", action="append", default=[], metavar="MODULE")
    sc.add_argument("--bootstrap", type=int, help="bootstrap resamples (default: the records')")
    sc.add_argument("--cache-dir", type=Path, help="memoise rows here, for later calls "
                    "(default: for this call only)")
    sc.add_argument("--scorer-timeout", type=float, default=300.0, metavar="SECONDS")
    sc.add_argument("--score-workers", type=_workers, default="auto", metavar="N",
                    help=SCORE_WORKERS_HELP)
    sc.add_argument("--no-figures", action="store_true")
    sc.add_argument("--overwrite", action="store_true")

    ex = sub.add_parser("export", help="copy a finished run's forward records to a folder")
    ex.add_argument("run_dir", type=Path)
    ex.add_argument("dest", type=Path)

    lst = sub.add_parser("list", help="list registered names")
    lst.add_argument("what", choices=list(_LISTS))

    rep = sub.add_parser("report", help="print a finished run's table")
    rep.add_argument("run_dir", type=Path)
    rep.add_argument("--domain", default="pooled")
    rep.add_argument("--paper", action="store_true",
                     help="(re)write paper_report.md from an --experiment paper run's numbers")
    rep.add_argument("--html", action="store_true",
                     help="(re)write RUN_DIR/report.html, the self-contained page of the run")

    cmp = sub.add_parser("compare", help="compare runs over the same splits: paired-bootstrap "
                         "differences to the first run; writes compare.{md,csv,html}")
    cmp.add_argument("run_dirs", type=Path, nargs="+", metavar="RUN_DIR")
    cmp.add_argument("--out", type=Path, help="folder of compare.{md,csv,html} (default: .)")
    cmp.add_argument("--bootstrap", type=int, help="paired resamples (default: the fewest the "
                     "runs used for their own CIs)")

    plot = sub.add_parser("plot", help="redraw a finished run's figures")
    plot.add_argument("run_dir", type=Path)
    plot.add_argument("--figures", dest="figure_set", default="figures", metavar="NAME",
                      help="the figure set (uqbench list figures)")

    rp = sub.add_parser("reproduce", help="rerun a finished run from its run.json into a fresh "
                        "cache and diff every results.csv value and scores.npz array; exit 0 "
                        "only when all are equal")
    rp.add_argument("run_dir", type=Path)
    rp.add_argument("--out", type=Path, help="the rerun's folder (default RUN_DIR-reproduced)")
    rp.add_argument("--cache-dir", type=Path,
                    help="the rerun's cache (default: a fresh temporary folder)")
    rp.add_argument("--data-dir", type=Path, help="local dataset copies (default $UQBENCH_DATA)")
    rp.add_argument("--threads", type=int, help="torch threads (default: the recorded ones)")
    rp.add_argument("--atol", type=float, default=0.0,
                    help="tolerance of every value (default 0: bitwise); other thread counts "
                    "need one (README: what is reproducible bit for bit)")
    rp.add_argument("--no-progress", action="store_true")

    data = sub.add_parser("data", help="data utilities")
    dsub = data.add_subparsers(dest="data_command", required=True)
    build = dsub.add_parser("build", help="build and cache a suite's splits, print their table")
    build.add_argument("--suite", default="pooled")
    build.add_argument("--profile", default="cpu")
    build.add_argument("--data-dir", type=Path)
    build.add_argument("--cache-dir", type=Path)
    for p in (lst, rep, plot, build):
        p.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                       help="import MODULE first (it may register names); repeatable")
    return ap


#: ``uqbench list WHAT`` -> the registry (or fixed table) that lists it, as (module, name):
#: every extension point is a registry with an entry-point group ``uqbench.<what>``
_LISTS = {
    "scorers": ("uqbench.core.scorer", "SCORERS"), "gates": ("uqbench.core.gating", "GATES"),
    "sources": ("uqbench.data.sources", "SOURCES"),
    "suites": ("uqbench.data.suites.spec", "SUITES"),
    "backbones": ("uqbench.core.engine", "get_backend"),  # the model side's registry
    "backends": ("uqbench.core.engine", "BACKENDS"), "figures": ("uqbench.core.engine", "DRAWERS"),
    "experiments": ("uqbench.core.experiments", "EXPERIMENTS"),
    "profiles": ("uqbench.core.profiles", "PROFILES"), "models": ("uqbench.core.plan", "MODELS"),
    "heads": ("uqbench.core.heads", "HEADS"),
}


def _list(what: str) -> list[str]:
    import importlib

    module, attr = _LISTS[what]
    obj = getattr(importlib.import_module(module), attr)
    if what == "backbones":
        return list(obj().backbones())
    items = [(n, obj.get(n)) for n in obj.names()] if hasattr(obj, "names") else obj.items()
    return [f"{n:<11} {e.doc}" if hasattr(e, "doc") else n for n, e in items]


def main(argv: list[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    import logging

    logging.basicConfig(level=logging.INFO, format="%(message)s")  # e.g. which figures were skipped
    # matplotlib's PDF font subsetting logs each pruned font table ("GPOS pruned") at INFO
    logging.getLogger("fontTools").setLevel(logging.WARNING)
    try:
        if args.command not in ("run", "score"):  # those import their own plugins
            from uqbench.core.registry import import_plugin

            for module in getattr(args, "plugin", ()):
                import_plugin(module)
        if args.command == "list":
            print("\n".join(_list(args.what)))
        elif args.command == "run":
            from uqbench.run.runner import RunConfig, run
            run(RunConfig(
                suite=args.suite, profile=args.profile, backbone=args.backbone,
                scorers=args.scorers, plugins=tuple(args.plugin), out=args.out,
                cache_dir=args.cache_dir, data_dir=args.data_dir, seeds=args.seeds,
                budget=args.budget, experiment=args.experiment, models=args.models,
                gates=args.gates, backend=args.backend, figure_set=args.figure_set,
                head=args.head, threads=args.threads, compile=args.compile,
                cuda_graph=args.cuda_graph, eval_tokens=args.eval_tokens,
                grad_checkpoint=args.grad_checkpoint,
                figures=not args.no_figures,
                progress=not args.no_progress, overwrite=args.overwrite,
                scorer_timeout=args.scorer_timeout or None, score_workers=args.score_workers))
        elif args.command == "score":
            from uqbench.run.score_records import ScoreConfig, check_out, load_models, score
            check_out(args.out, args.overwrite)  # before reading anything
            records = load_models(args.sources, domains=args.domain, domains_file=args.domains,
                                  members=args.members, normalize=args.normalize,
                                  calib_fraction=args.calib_fraction, seed=args.seed,
                                  model_name=args.model_name, runs=args.run)
            score(records, ScoreConfig(
                out=args.out, scorers=args.scorers, plugins=tuple(args.plugin),
                bootstrap=args.bootstrap, cache_dir=args.cache_dir, figures=not args.no_figures,
                overwrite=args.overwrite, scorer_timeout=args.scorer_timeout or None,
                rank_scorer=args.rank_scorer, score_workers=args.score_workers))
        elif args.command == "export":
            from uqbench.io.recordset import export_run
            print(f"wrote {export_run(args.run_dir, args.dest)}")
        elif args.command == "report":
            from uqbench.files.rundir import read_results
            from uqbench.results.tables import markdown_table, rows_for
            if args.paper:
                from uqbench.reporting.paper import write_paper_report
                print(write_paper_report(args.run_dir).read_text())
            elif args.html:
                from uqbench.reporting.html import write_report
                print(f"wrote {write_report(args.run_dir)}")
            else:
                print(markdown_table(rows_for(read_results(args.run_dir), domain=args.domain)))
        elif args.command == "compare":
            from uqbench.reporting.compare import markdown, write_compare
            comparison, paths = write_compare(args.run_dirs, args.out, n_boot=args.bootstrap)
            print(markdown(comparison))
            print("wrote " + ", ".join(map(str, paths)))
        elif args.command == "plot":
            from uqbench.core.engine import get_drawer
            for path in get_drawer(args.figure_set)(args.run_dir):
                print(path)
        elif args.command == "reproduce":
            from uqbench.run.reproduce import reproduce
            diff = reproduce(args.run_dir, out=args.out, cache_dir=args.cache_dir,
                             data_dir=args.data_dir, threads=args.threads, atol=args.atol,
                             progress=not args.no_progress)
            print("\n".join([*diff.differences, f"reproduce {args.run_dir}: {diff.summary()}"]))
            return 0 if diff.equal else 1
        elif args.command == "data":
            from uqbench.data.suites.table import format_split_table, split_table
            from uqbench.files.cache import resolve_cache_dir
            cache = resolve_cache_dir(args.cache_dir)
            print(format_split_table(split_table(args.suite, args.profile, data_dir=args.data_dir,
                                                 cache_dir=cache / "splits", seed=0)))
    except UserError as exc:
        print(f"uqbench: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("uqbench: interrupted; finished cache entries are kept, rerun to resume",
              file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":   # python -m uqbench.cli works as python -m uqbench does
    raise SystemExit(main())
