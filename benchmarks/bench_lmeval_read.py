"""Reading lm-evaluation-harness samples at leaderboard scale: 10^6 questions x 4 choices
(synthetic files in lm-eval 0.4's samples format, `bench_score.write_samples`: an ID task of
600,000 questions, 20% held out for calibration, and a shifted task of 400,000) turned into
forward records by `uqbench score`'s reader, line by line. Goal: <= 60 s and <= 2 GB peak RSS
on 2 cores. The read runs in a child process, so its peak RSS (``ru_maxrss``, Python and numpy
included) is its own; one JSON line with the seconds, the peak, the files' size, the ratios to
the goals and the machine's 1-minute load average before and after."""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.bench_score import write_samples

GOAL_S = 60.0
GOAL_RSS_MB = 2048.0
N_ID, N_SHIFT = 600_000, 400_000

CHILD = """
import json, sys, time
from pathlib import Path
t0 = time.perf_counter()
from uqbench.run.score_records import load_records
rs = load_records(Path(sys.argv[1]), domains=["synthetic=big_id:big_shift"])
n = sum(len(o.ids) for o in rs.outputs.values())
print(json.dumps({"read_s": time.perf_counter() - t0, "records": n}))
"""


def run() -> list[dict[str, Any]]:
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "lm"
        write_samples(root, "big_id", N_ID, 0)
        write_samples(root, "big_shift", N_SHIFT, 1)
        size = sum(p.stat().st_size for p in root.iterdir())
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")])}
        out = subprocess.run([sys.executable, "-c", CHILD, str(root)], env=env, check=True,
                             capture_output=True, text=True).stdout
        child = json.loads(out.strip().splitlines()[-1])
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    rss_mb = usage.ru_maxrss / 1024  # KiB on Linux
    cpu_s = usage.ru_utime + usage.ru_stime  # a shared machine's wall time holds its load
    return [{"benchmark": "read_lmeval_1m", "questions": N_ID + N_SHIFT, "choices": 4,
             "file_mb": round(size / 2**20, 1), "read_s": round(child["read_s"], 2),
             "records": child["records"], "cpu_s": round(cpu_s, 2),
             "peak_rss_mb": round(rss_mb, 1), "goal_s": GOAL_S,
             "goal_rss_mb": GOAL_RSS_MB, "ratio_to_goal_s": round(child["read_s"] / GOAL_S, 3),
             "ratio_to_goal_rss": round(rss_mb / GOAL_RSS_MB, 3),
             "met": child["read_s"] <= GOAL_S and rss_mb <= GOAL_RSS_MB,
             "load_before": round(load, 2),
             "load_after": round(os.getloadavg()[0], 2)}]
