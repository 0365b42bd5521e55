"""End-to-end run time of `uqbench run --suite pooled`: cold (empty cache) and warm, per profile.

Targets: smoke cold <= 180 s, cpu cold <= 20 min, warm <= 10 s, on 2 cores.
The smoke profile always runs; `cpu` runs when UQBENCH_BENCH_PROFILES includes it (it takes
tens of minutes), e.g. ``UQBENCH_BENCH_PROFILES=smoke,cpu python -m benchmarks run``.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

TARGETS = {"smoke": 180.0, "cpu": 1200.0}
WARM_TARGET = 10.0


def _run(profile: str, root: Path) -> float:
    cmd = [sys.executable, "-m", "uqbench", "run", "--suite", "pooled", "--profile", profile,
           "--out", str(root / "out"), "--cache-dir", str(root / "cache"), "--no-progress"]
    t = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return time.perf_counter() - t


def run() -> Iterator[dict[str, object]]:
    profiles = os.environ.get("UQBENCH_BENCH_PROFILES", "smoke").split(",")
    for profile in profiles:
        with tempfile.TemporaryDirectory() as tmp:
            cold = _run(profile, Path(tmp))
            warm = _run(profile, Path(tmp))
        yield {"name": f"pooled_{profile}_cold", "seconds": round(cold, 1),
               "target": f"<= {TARGETS[profile]:.0f} s", "met": cold <= TARGETS[profile],
               "includes": "data build, training, calibration, passes, scoring, figures",
               "load_avg_1m": os.getloadavg()[0]}
        yield {"name": f"pooled_{profile}_warm", "seconds": round(warm, 1),
               "ratio_warm_over_cold": round(warm / cold, 4), "target": f"<= {WARM_TARGET:.0f} s",
               "met": warm <= WARM_TARGET, "load_avg_1m": os.getloadavg()[0]}
