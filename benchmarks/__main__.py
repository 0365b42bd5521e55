from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import sys
import time

import benchmarks


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=benchmarks.__doc__)
    ap.add_argument(
        "names", nargs="*", help="benchmark modules to run (default: all), e.g. metrics"
    )
    ap.add_argument("--list", action="store_true", help="list benchmark modules and exit")
    args = ap.parse_args(argv)
    mods = sorted(m.name[len("bench_"):] for m in pkgutil.iter_modules(benchmarks.__path__)
                  if m.name.startswith("bench_"))
    if args.list:
        print("\n".join(mods))
        return 0
    unknown = set(args.names) - set(mods)
    if unknown:
        print(f"unknown benchmark(s) {sorted(unknown)}; valid: {mods}", file=sys.stderr)
        return 2
    for name in args.names or mods:
        mod = importlib.import_module(f"benchmarks.bench_{name}")
        for row in mod.run():
            row.setdefault("module", name)
            row.setdefault("when", time.strftime("%Y-%m-%dT%H:%M:%S"))
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
