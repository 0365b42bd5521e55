"""The `uqbench` command line: parses arguments and calls library functions, nothing more.

    uqbench run --suite pooled [--profile cpu] [--backbone minilm] [--scorers a,b]
                [--plugin MODULE] [--out DIR] [--cache-dir DIR] [--data-dir DIR] [--seeds N]
                [--experiment NAME] [--models a,b] [--head cloze|letters]
    uqbench list scorers|suites|backbones|experiments|profiles|models
    uqbench report RUN_DIR        # reprint a finished run's tables (--paper: its paper_report.md)
    uqbench plot RUN_DIR          # redraw a finished run's figures
    uqbench reproduce RUN_DIR     # rerun it from its run.json, diff results.csv and scores.npz
    uqbench data build --suite pooled --profile PROFILE
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from uqbench.errors import UserError
from uqbench.profiles import HEADS


def _csv(s: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in s.split(",") if x.strip())


def _build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="uqbench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="train/load models, score uncertainty, write the report")
    run.add_argument("--suite", default="pooled", help="built-in suite name or a suite YAML file")
    run.add_argument("--profile", default="cpu", help="smoke | cpu | full")
    run.add_argument("--backbone", default="minilm",
                     help="minilm | smollm2 | a Hugging Face model id or local path")
    run.add_argument("--scorers", type=_csv, default=(), help="comma-separated (default: all)")
    run.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                     help="import MODULE first (it may @register_scorer); repeatable")
    run.add_argument("--out", type=Path, help="results folder (default runs/SUITE-PROFILE-BACKBONE)")
    run.add_argument("--cache-dir", type=Path, help="cache folder (default $UQBENCH_CACHE or "
                     ".uqbench-cache)")
    run.add_argument("--data-dir", type=Path, help="local dataset copies (default $UQBENCH_DATA)")
    run.add_argument("--seeds", type=int, help="repetitions (default: the profile's)")
    run.add_argument("--budget", type=float, default=4.0, help="CARE average experts budget B")
    run.add_argument("--experiment", help="a paper experiment (uqbench list experiments)")
    run.add_argument("--models", type=_csv, default=(),
                     help="comma-separated models to train and score (uqbench list models; "
                     "default: the suite's models:, else lora,moe-lora)")
    run.add_argument("--head", choices=list(HEADS),
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
    run.add_argument("--no-figures", action="store_true")
    run.add_argument("--no-progress", action="store_true")
    run.add_argument("--overwrite", action="store_true",
                     help="replace an --out folder holding another configuration's results")

    lst = sub.add_parser("list", help="list registered names")
    lst.add_argument("what", choices=["scorers", "suites", "backbones", "experiments", "profiles",
                                      "models"])

    rep = sub.add_parser("report", help="print a finished run's table")
    rep.add_argument("run_dir", type=Path)
    rep.add_argument("--domain", default="pooled")
    rep.add_argument("--paper", action="store_true",
                     help="(re)write paper_report.md from an --experiment paper run's numbers")

    plot = sub.add_parser("plot", help="redraw a finished run's figures")
    plot.add_argument("run_dir", type=Path)

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
    return ap


def _list(what: str) -> list[str]:
    if what == "scorers":
        from uqbench.scorer import list_scorers
        return list_scorers()
    if what == "suites":
        from uqbench.data.suites import list_suites
        return list_suites()
    if what == "backbones":  # the model side's registry (`uqbench.engine.Backend`)
        from uqbench.engine import get_backend
        return get_backend().backbones()
    if what == "models":
        from uqbench.plan import MODELS
        return [f"{name:<11} {e.doc}" for name, e in MODELS.items()]
    if what == "experiments":
        from uqbench.experiments import EXPERIMENTS
        return [f"{e.name:<11} {e.doc}" for e in EXPERIMENTS.values()]
    from uqbench.profiles import PROFILES
    return list(PROFILES)


def main(argv: list[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    import logging

    logging.basicConfig(level=logging.INFO, format="%(message)s")  # e.g. which figures were skipped
    try:
        if args.command == "list":
            print("\n".join(_list(args.what)))
        elif args.command == "run":
            from uqbench.runner import RunConfig, run
            run(RunConfig(
                suite=args.suite, profile=args.profile, backbone=args.backbone,
                scorers=args.scorers, plugins=tuple(args.plugin), out=args.out,
                cache_dir=args.cache_dir, data_dir=args.data_dir, seeds=args.seeds,
                budget=args.budget, experiment=args.experiment, models=args.models,
                head=args.head, threads=args.threads,
                figures=not args.no_figures,
                progress=not args.no_progress, overwrite=args.overwrite,
                scorer_timeout=args.scorer_timeout or None))
        elif args.command == "report":
            from uqbench.report import markdown_table, read_results, rows_for
            if args.paper:
                from uqbench.paper import write_paper_report
                print(write_paper_report(args.run_dir).read_text())
            else:
                print(markdown_table(rows_for(read_results(args.run_dir), domain=args.domain)))
        elif args.command == "plot":
            from uqbench.engine import get_drawer
            for path in get_drawer()(args.run_dir):
                print(path)
        elif args.command == "reproduce":
            from uqbench.reproduce import reproduce
            diff = reproduce(args.run_dir, out=args.out, cache_dir=args.cache_dir,
                             data_dir=args.data_dir, threads=args.threads, atol=args.atol,
                             progress=not args.no_progress)
            print("\n".join([*diff.differences, f"reproduce {args.run_dir}: {diff.summary()}"]))
            return 0 if diff.equal else 1
        elif args.command == "data":
            import os

            from uqbench.data.build import build_report, format_report
            data_dir = args.data_dir or os.environ.get("UQBENCH_DATA")
            cache = args.cache_dir or Path(os.environ.get("UQBENCH_CACHE", ".uqbench-cache"))
            print(format_report(build_report(args.suite, args.profile, data_dir=data_dir,
                                             cache_dir=cache / "splits", seed=0)))
    except UserError as exc:
        print(f"uqbench: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("uqbench: interrupted; finished cache entries are kept, rerun to resume",
              file=sys.stderr)
        return 130
    return 0
