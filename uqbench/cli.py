"""The `uqbench` command line: parses arguments and calls library functions, nothing more."""
from __future__ import annotations

import argparse
import sys

from uqbench.errors import UserError


def _build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="uqbench", description=__doc__)
    sub = ap.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train/load models, score uncertainty, write the report")
    run.add_argument("--suite", default="pooled")
    run.add_argument("--profile", default="cpu")
    lst = sub.add_parser("list", help="list registered names")
    lst.add_argument("what", choices=["scorers"])
    return ap


def main(argv: list[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    try:
        if args.command == "list":
            from uqbench.scorer import list_scorers

            print("\n".join(list_scorers()))
            return 0
        if args.command == "run":
            print("uqbench run: the runner is not implemented yet; nothing was computed.",
                  file=sys.stderr)
            return 3
    except UserError as exc:
        print(f"uqbench: error: {exc}", file=sys.stderr)
        return 2
    return 0
