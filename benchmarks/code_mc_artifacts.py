"""Options-only artifact checks of the pooled suite's code splits, over seeds (not timed).

    python -m benchmarks.code_mc_artifacts --seeds 0 1 2 [--profile cpu] [--data-dir DIR]

Builds the code domain of ``pooled`` (MBPP train/calib/ID, HumanEval shift: the code-MC builder
runs every mutant in the sandbox, about 3.5 minutes per seed at ``cpu`` on 2 cores) without a
cache, runs `uqbench.data.artifacts.check_suite` and prints one JSON line per (seed, split):
the four options-only baselines, the flag threshold and what is flagged. The table in
docs/code_mc.md comes from it; run it after any change to `uqbench.data.mc.code`.
"""
from __future__ import annotations

import argparse
import json
import time

from uqbench.data.artifacts import check_suite
from uqbench.data.mc import code as codemc
from uqbench.data.suites import build as S
from uqbench.data.suites import spec as SP


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.code_mc_artifacts",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--profile", default="cpu")
    ap.add_argument("--data-dir", help="local dataset copies (default $UQBENCH_DATA)")
    args = ap.parse_args(argv)
    pooled = SP.SUITES.get("pooled")
    spec = SP.SuiteSpec("pooled", tuple(d for d in pooled.domains if d.name == "code"))
    for seed in args.seeds:
        t = time.perf_counter()
        suite = S.build_suite(spec, args.profile, data_dir=args.data_dir, seed=seed,
                              progress=False)
        built_s = time.perf_counter() - t
        for (_, role), c in check_suite(suite, seed=seed).items():
            print(json.dumps({"code_mc_version": codemc.CODE_MC_VERSION, "seed": seed,
                              "split": role, "n": c.n,
                              **{k: round(v, 3) for k, v in c.accuracy.items()},
                              "threshold": round(c.threshold, 3), "flagged": list(c.flagged),
                              "build_s": round(built_s, 1)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
