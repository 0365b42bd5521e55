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
import logging
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from uqbench.core.engine import BACKENDS, DRAWERS, get_backend, get_drawer
from uqbench.core.errors import UserError
from uqbench.core.experiments import EXPERIMENTS
from uqbench.core.gating import GATES
from uqbench.core.heads import HEADS
from uqbench.core.plan import MODELS
from uqbench.core.profiles import COMPILE, PROFILES
from uqbench.core.registry import Registry, import_plugin
from uqbench.core.scorer import SCORERS
from uqbench.data.sources import SOURCES
from uqbench.data.suites.spec import SUITES
from uqbench.data.suites.table import format_split_table, split_table
from uqbench.files.cache import resolve_cache_dir
from uqbench.files.rundir import read_results
from uqbench.io.recordset import export_run
from uqbench.reporting.compare import markdown, write_compare
from uqbench.reporting.html import write_report
from uqbench.reporting.paper import write_paper_report
from uqbench.results.tables import markdown_table, rows_for
from uqbench.run.reproduce import reproduce
from uqbench.run.runner import RunConfig, run
from uqbench.run.score_records import ScoreConfig, check_out, load_models, score

#: a subcommand's handler: the parsed arguments -> the exit status (None: 0)
Handler = Callable[[argparse.Namespace], int | None]


@dataclass(frozen=True)
class Command:
    """One subcommand: its one-line help, what adds its arguments, what runs it."""

    help: str
    arguments: Callable[[argparse.ArgumentParser], None]
    handle: Handler


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


def _plugin_argument(p: argparse.ArgumentParser,
                     text: str = "import MODULE first (it may register names); repeatable"
                     ) -> None:
    p.add_argument("--plugin", action="append", default=[], metavar="MODULE", help=text)


def _import_plugins(args: argparse.Namespace) -> None:
    """``--plugin`` of the commands that resolve names themselves (run and score import theirs
    in the library, with the configuration that names them)."""
    for module in args.plugin:
        import_plugin(module)


# -- run ------------------------------------------------------------------------------------

def _run_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--suite", default="pooled", help="built-in suite name or a suite YAML file")
    p.add_argument("--profile", default="cpu",
                   help="smoke | cpu | full | gpu, or a plugin's (uqbench list profiles)")
    p.add_argument("--backbone", default="minilm",
                   help="a registered backbone (uqbench list backbones: minilm, smollm2, "
                        "qwen2.5-coder-0.5b, ...), a Hugging Face model id or a local path")
    p.add_argument("--scorers", type=_csv, default=(), help="comma-separated (default: all)")
    _plugin_argument(p, "import MODULE (a module name, found also in the current folder, or a "
                     ".py file) first: it may register scorers, gates, models...; repeatable")
    p.add_argument("--out", type=Path, help="results folder (default runs/SUITE-PROFILE-BACKBONE)")
    p.add_argument("--cache-dir", type=Path, help="cache folder (default $UQBENCH_CACHE or "
                   ".uqbench-cache)")
    p.add_argument("--data-dir", type=Path, help="local dataset copies (default $UQBENCH_DATA)")
    p.add_argument("--seeds", type=int, help="repetitions (default: the profile's)")
    p.add_argument("--budget", type=float, default=4.0, help="CARE average experts budget B")
    p.add_argument("--experiment", help="a paper experiment (uqbench list experiments)")
    p.add_argument("--models", type=_csv, default=(),
                   help="comma-separated models to train and score (uqbench list models; "
                   "default: the suite's models:, else lora,moe-lora)")
    p.add_argument("--gates", type=_csv, default=(),
                   help="comma-separated gates the router models run under besides their own: "
                   "KIND or KIND:PARAM=VALUE[:...] (uqbench list gates; e.g. care,topk:k=2; "
                   "budgeted kinds at --budget; default: the suite's gates:, else care)")
    p.add_argument("--backend", default="torch",
                   help="the model side (uqbench list backends; default torch)")
    p.add_argument("--figures", dest="figure_set", default="figures", metavar="NAME",
                   help="the figure set that draws the figures (uqbench list figures)")
    p.add_argument("--head", metavar="NAME",
                   help="how options are scored: encoders bi_encoder (cosine of question and "
                   "option embeddings) or cross_encoder[_cls]; decoders cloze (option "
                   "log-likelihood) or letters (answer letter); default: the suite's head:, "
                   "else auto (the profile's recipe)")
    p.add_argument("--scorer-timeout", type=float, default=300.0, metavar="SECONDS",
                   help="stop the run if one scorer call takes longer (default 300; 0: none)")
    _run_machine_arguments(p)
    p.add_argument("--no-figures", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an --out folder holding another configuration's results")


def _run_machine_arguments(p: argparse.ArgumentParser) -> None:
    """How the run uses the machine: threads, processes, compiled and graph-replayed steps,
    memory; none of them changes a result."""
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="torch intra-op threads (default: the cores this process may use, "
                   "os.sched_getaffinity; on a machine shared with other busy processes 1 "
                   "avoids threads spinning on a busy core)")
    p.add_argument("--score-workers", type=_workers, default="auto", metavar="N",
                   help=SCORE_WORKERS_HELP)
    p.add_argument("--compile", choices=list(COMPILE),
                   help="torch.compile each transformer block in training, with static "
                   "shapes: auto = on where CUDA is available (default: the profile's, off)")
    p.add_argument("--cuda-graph", choices=list(COMPILE),
                   help="replay each training step's forward and backward as CUDA graphs, "
                   "one per batch shape (the eager step is bound by launching kernels): auto = "
                   "on where CUDA is and one process trains; not with --compile on (default: "
                   "the profile's, off)")
    p.add_argument("--eval-tokens", type=int, metavar="N",
                   help="padded tokens one MC-dropout forward may hold, its stacked copies "
                   "counted: longer batches run their copies in groups, same values "
                   "(default: the profile's, no bound; `python -m benchmarks memory` gives "
                   "the bytes a token holds)")
    p.add_argument("--grad-checkpoint", action="store_true", default=None,
                   help="recompute each transformer block's activations in the backward "
                   "instead of keeping them: a large backbone's training step fits a GPU, and "
                   "runs every block's forward twice (not with --compile on or --cuda-graph "
                   "on)")


def _run(args: argparse.Namespace) -> None:
    run(RunConfig(
        suite=args.suite, profile=args.profile, backbone=args.backbone,
        scorers=args.scorers, plugins=tuple(args.plugin), out=args.out,
        cache_dir=args.cache_dir, data_dir=args.data_dir, seeds=args.seeds,
        budget=args.budget, experiment=args.experiment, models=args.models,
        gates=args.gates, backend=args.backend, figure_set=args.figure_set,
        head=args.head, threads=args.threads, compile=args.compile,
        cuda_graph=args.cuda_graph, eval_tokens=args.eval_tokens,
        grad_checkpoint=args.grad_checkpoint, figures=not args.no_figures,
        progress=not args.no_progress, overwrite=args.overwrite,
        scorer_timeout=args.scorer_timeout or None, score_workers=args.score_workers))


# -- score ----------------------------------------------------------------------------------

def _score_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("sources", type=Path, nargs="+", metavar="SOURCE",
                   help="a uqbench records folder (uqbench export, or RUN_DIR/records), a run "
                   "folder, an lm-eval --output_path folder, a confidence-only .jsonl/.csv file "
                   "or a folder of HELM runs; several (one per model), or a folder whose "
                   "subfolders are models (lm-eval's <out>/<org>__<model>/), score the models "
                   "side by side: models.{md,csv,json}, a ranking figure")
    p.add_argument("--out", type=Path, required=True, help="the run folder to write")
    _score_lmeval_arguments(p)
    p.add_argument("--scorers", type=_csv, default=(),
                   help="comma-separated (default: the run's methods for uqbench records, all "
                   "scorers for lm-eval)")
    p.add_argument("--rank-scorer", metavar="SCORER",
                   help="several models: the scorer whose rows stand for each model in the "
                   "model table (default msp, or the reported confidence of confidence-only "
                   "records)")
    p.add_argument("--plugin", action="append", default=[], metavar="MODULE")
    p.add_argument("--bootstrap", type=int, help="bootstrap resamples (default: the records')")
    p.add_argument("--cache-dir", type=Path, help="memoise rows here, for later calls "
                   "(default: for this call only)")
    p.add_argument("--scorer-timeout", type=float, default=300.0, metavar="SECONDS")
    p.add_argument("--score-workers", type=_workers, default="auto", metavar="N",
                   help=SCORE_WORKERS_HELP)
    p.add_argument("--no-figures", action="store_true")
    p.add_argument("--overwrite", action="store_true")


def _score_lmeval_arguments(p: argparse.ArgumentParser) -> None:
    """How lm-eval outputs become records (`uqbench.run.score_records.load_models`)."""
    p.add_argument("--domain", action="append", default=[], metavar="NAME=ID:SHIFT[:CALIB]",
                   help="lm-eval: a domain's ID, shifted and (optional) calib task; repeatable")
    p.add_argument("--domains", type=Path, metavar="FILE.yaml",
                   help="lm-eval: domains: {NAME: {id: TASK, shift: TASK, calib: TASK}}")
    p.add_argument("--members", action="append", type=Path, default=[], metavar="DIR",
                   help="lm-eval: another run of the same tasks (seed/model) for the ensemble "
                   "scorers; repeatable")
    p.add_argument("--normalize", default="auto", choices=["auto", "none", "chars", "bytes"],
                   help="lm-eval: logit = log-likelihood (none: lm-eval's acc), per character "
                   "of the choice (chars: acc_norm) or per UTF-8 byte (bytes: acc_bytes); "
                   "auto (the default): per domain, acc_norm where every task of the domain "
                   "logs it, else acc, so the accuracy is one lm-eval logged")
    p.add_argument("--calib-fraction", type=float, default=0.2,
                   help="lm-eval: fraction of the ID questions held out for recalibration when a "
                   "domain has no calib task (default 0.2)")
    p.add_argument("--seed", type=int, default=0, help="lm-eval: seed of that hold-out")
    p.add_argument("--run", action="append", default=[], metavar="DATE",
                   help="lm-eval: where the folder holds several runs of a task, the one whose "
                   "date (samples_<task>_<DATE>.jsonl, or its start) is DATE (default: the "
                   "newest); repeatable, for tasks run at different dates")
    p.add_argument("--model-name", action="append", default=[], metavar="NAME",
                   help="lm-eval: a model's name in the method column (default: its "
                   "pretrained= hub id or folder, from the results file); with several "
                   "sources, once per source, in order")


def _score(args: argparse.Namespace) -> None:
    check_out(args.out, args.overwrite)  # before reading anything
    records = load_models(
        args.sources, domains=args.domain, domains_file=args.domains, members=args.members,
        normalize=args.normalize, calib_fraction=args.calib_fraction, seed=args.seed,
        model_name=args.model_name, runs=args.run)
    score(records, ScoreConfig(
        out=args.out, scorers=args.scorers, plugins=tuple(args.plugin),
        bootstrap=args.bootstrap, cache_dir=args.cache_dir, figures=not args.no_figures,
        overwrite=args.overwrite, scorer_timeout=args.scorer_timeout or None,
        rank_scorer=args.rank_scorer, score_workers=args.score_workers))


# -- export, list, report, compare, plot ----------------------------------------------------

def _export_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", type=Path)
    p.add_argument("dest", type=Path)


def _export(args: argparse.Namespace) -> None:
    print(f"wrote {export_run(args.run_dir, args.dest)}")


def _registry_lines(registry: Registry) -> Callable[[], list[str]]:
    """A registry's names, each with its member's one-line ``doc`` where it has one."""
    def lines() -> list[str]:
        return [f"{n:<11} {e.doc}" if hasattr(e, "doc") else n
                for n, e in ((n, registry.get(n)) for n in registry.names())]
    return lines


#: ``uqbench list WHAT`` -> its lines: every extension point is a registry with an entry-point
#: group ``uqbench.<what>``; backbones are the model side's (the backend's registry)
LISTS: dict[str, Callable[[], list[str]]] = {
    "scorers": _registry_lines(SCORERS), "gates": _registry_lines(GATES),
    "sources": _registry_lines(SOURCES), "suites": _registry_lines(SUITES),
    "backbones": lambda: list(get_backend().backbones()),
    "backends": _registry_lines(BACKENDS), "figures": _registry_lines(DRAWERS),
    "experiments": _registry_lines(EXPERIMENTS), "profiles": _registry_lines(PROFILES),
    "models": _registry_lines(MODELS), "heads": _registry_lines(HEADS),
}


def _list_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("what", choices=list(LISTS))
    _plugin_argument(p)


def _list(args: argparse.Namespace) -> None:
    _import_plugins(args)
    print("\n".join(LISTS[args.what]()))


def _report_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", type=Path)
    p.add_argument("--domain", default="pooled")
    p.add_argument("--paper", action="store_true",
                   help="(re)write paper_report.md from an --experiment paper run's numbers")
    p.add_argument("--html", action="store_true",
                   help="(re)write RUN_DIR/report.html, the self-contained page of the run")
    _plugin_argument(p)


def _report(args: argparse.Namespace) -> None:
    _import_plugins(args)
    if args.paper:
        print(write_paper_report(args.run_dir).read_text())
    elif args.html:
        print(f"wrote {write_report(args.run_dir)}")
    else:
        print(markdown_table(rows_for(read_results(args.run_dir), domain=args.domain)))


def _compare_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dirs", type=Path, nargs="+", metavar="RUN_DIR")
    p.add_argument("--out", type=Path, help="folder of compare.{md,csv,html} (default: .)")
    p.add_argument("--bootstrap", type=int, help="paired resamples (default: the fewest the "
                   "runs used for their own CIs)")


def _compare(args: argparse.Namespace) -> None:
    comparison, paths = write_compare(args.run_dirs, args.out, n_boot=args.bootstrap)
    print(markdown(comparison))
    print("wrote " + ", ".join(map(str, paths)))


def _plot_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", type=Path)
    p.add_argument("--figures", dest="figure_set", default="figures", metavar="NAME",
                   help="the figure set (uqbench list figures)")
    _plugin_argument(p)


def _plot(args: argparse.Namespace) -> None:
    _import_plugins(args)
    for path in get_drawer(args.figure_set)(args.run_dir):
        print(path)


# -- reproduce, data ------------------------------------------------------------------------

def _reproduce_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", type=Path)
    p.add_argument("--out", type=Path, help="the rerun's folder (default RUN_DIR-reproduced)")
    p.add_argument("--cache-dir", type=Path,
                   help="the rerun's cache (default: a fresh temporary folder)")
    p.add_argument("--data-dir", type=Path, help="local dataset copies (default $UQBENCH_DATA)")
    p.add_argument("--threads", type=int, help="torch threads (default: the recorded ones)")
    p.add_argument("--atol", type=float, default=0.0,
                   help="tolerance of every value (default 0: bitwise); other thread counts "
                   "need one (README: what is reproducible bit for bit)")
    p.add_argument("--no-progress", action="store_true")


def _reproduce(args: argparse.Namespace) -> int:
    diff = reproduce(args.run_dir, out=args.out, cache_dir=args.cache_dir, data_dir=args.data_dir,
                     threads=args.threads, atol=args.atol, progress=not args.no_progress)
    print("\n".join([*diff.differences, f"reproduce {args.run_dir}: {diff.summary()}"]))
    return 0 if diff.equal else 1


def _data_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="data_command", required=True)
    build = sub.add_parser("build", help="build and cache a suite's splits, print their table")
    build.add_argument("--suite", default="pooled")
    build.add_argument("--profile", default="cpu")
    build.add_argument("--data-dir", type=Path)
    build.add_argument("--cache-dir", type=Path)
    _plugin_argument(build)
    build.set_defaults(handle=_data_build)


def _data_build(args: argparse.Namespace) -> None:
    _import_plugins(args)
    cache = resolve_cache_dir(args.cache_dir)
    print(format_split_table(split_table(args.suite, args.profile, data_dir=args.data_dir,
                                         cache_dir=cache / "splits", seed=0)))


#: the subcommands, in the order ``uqbench --help`` lists them
COMMANDS: dict[str, Command] = {
    "run": Command("train/load models, score uncertainty, write the report", _run_arguments,
                   _run),
    "score": Command("score forward records made elsewhere (lm-eval samples, a uqbench export) "
                     "into a run folder, with no model work", _score_arguments, _score),
    "export": Command("copy a finished run's forward records to a folder", _export_arguments,
                      _export),
    "list": Command("list registered names", _list_arguments, _list),
    "report": Command("print a finished run's table", _report_arguments, _report),
    "compare": Command("compare runs over the same splits: paired-bootstrap differences to the "
                       "first run; writes compare.{md,csv,html}", _compare_arguments, _compare),
    "plot": Command("redraw a finished run's figures", _plot_arguments, _plot),
    "reproduce": Command("rerun a finished run from its run.json into a fresh cache and diff "
                         "every results.csv value and scores.npz array; exit 0 only when all "
                         "are equal", _reproduce_arguments, _reproduce),
    "data": Command("data utilities", _data_arguments, _data_build),
}


def build_parser() -> argparse.ArgumentParser:
    """The parser of every subcommand; ``args.handle`` is the chosen one's handler."""
    ap = argparse.ArgumentParser(prog="uqbench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    for name, command in COMMANDS.items():
        p = sub.add_parser(name, help=command.help)
        p.set_defaults(handle=command.handle)
        command.arguments(p)  # may set a nested subcommand's own handler
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # e.g. which figures were skipped
    # matplotlib's PDF font subsetting logs each pruned font table ("GPOS pruned") at INFO
    logging.getLogger("fontTools").setLevel(logging.WARNING)
    formatwarning, warnings.formatwarning = warnings.formatwarning, _warning_line
    try:
        return args.handle(args) or 0
    except UserError as exc:
        print(f"uqbench: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("uqbench: interrupted; finished cache entries are kept, rerun to resume",
              file=sys.stderr)
        return 130
    finally:
        warnings.formatwarning = formatwarning


def _warning_line(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  line: str | None = None) -> str:
    """A warning as a user reads it: its kind and message, without the source line that
    raised it (which names uqbench's code, not what the user gave)."""
    kind = "warning" if category is UserWarning else category.__name__
    return f"{kind}: {message}\n"


if __name__ == "__main__":   # python -m uqbench.cli works as python -m uqbench does
    raise SystemExit(main())
