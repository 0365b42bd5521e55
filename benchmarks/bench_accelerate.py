"""Sharded run vs one process: `accelerate launch` with 2 processes against 1 process.

``accelerate_2proc_vs_1proc``: the same `uqbench run` (MiniLM, MoE-LoRA: training, CARE
calibration, deterministic + MC-dropout forward records of a one-domain suite of 16 training
and 16 + 16 evaluation questions, small enough for a shared 2-core machine; splits built
beforehand, adapters and records not cached) run by one process with 2 threads and by
``accelerate launch --multi_gpu --num_processes 2`` with 1 thread each: the same 2 cores.
``ratio`` = 2-process wall time / 1-process wall time (whole command, start-up included);
``work_ratio`` compares the run's own "models+passes" seconds (run.json), without start-up.
On CPU (gloo) the target is only that sharding costs no more than it saves (ratio <= 1.1); the
point of the code path is GPUs, where each process has its own device.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

TARGET = 1.1
SUITE = """
name: bench-accelerate
choices: 4
domains:
  science:
    train: {source: arc-easy, split: train}
    id: {source: arc-easy, split: test}
    shift: {source: arc-challenge, split: test}
caps: {train: 16, calib: 8, id: 16, shift: 16}
"""
ARGS = ["--profile", "smoke", "--backbone", "minilm", "--models", "moe-lora",
        "--scorers", "msp,mc_dropout_entropy,routing_entropy", "--no-figures", "--no-progress"]


def _env(threads: int) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false"}


def _timed(cmd: list[str], env: dict[str, str], out: Path) -> tuple[float, float]:
    t = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, env=env)
    wall = time.perf_counter() - t
    from uqbench.files.rundir import read_meta

    return wall, read_meta(out)["seconds"]["models+passes"]


def run() -> Iterator[dict[str, object]]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "suite.yaml").write_text(SUITE)
        uq = [sys.executable, "-m", "uqbench", "run", "--suite", str(root / "suite.yaml"), *ARGS]
        # build the splits once, outside the timings
        subprocess.run([sys.executable, "-m", "uqbench", "data", "build", "--suite",
                        str(root / "suite.yaml"), "--profile", "smoke", "--cache-dir",
                        str(root / "warm")], check=True, capture_output=True, env=_env(2))
        times = {}
        for procs in (1, 2):
            cache, out = root / f"cache{procs}", root / f"out{procs}"
            shutil.copytree(root / "warm" / "splits", cache / "splits")
            cmd = uq + ["--cache-dir", str(cache), "--out", str(out)]
            if procs == 2:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", 0))
                    port = str(s.getsockname()[1])
                cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu",
                       "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
                       "--dynamo_backend", "no", "--main_process_port", port,
                       *cmd[1:]]   # `-m uqbench run ...`
            times[procs] = _timed(cmd, _env(2 // procs), out)
    (w1, k1), (w2, k2) = times[1], times[2]
    yield {"name": "accelerate_2proc_vs_1proc", "seconds_1proc": round(w1, 1),
           "seconds_2proc": round(w2, 1), "ratio": round(w2 / w1, 3),
           "work_seconds_1proc": round(k1, 1), "work_seconds_2proc": round(k2, 1),
           "work_ratio": round(k2 / k1, 3), "target": f"ratio <= {TARGET}",
           "met": w2 / w1 <= TARGET, "cores": os.cpu_count(), "load_avg_1m": os.getloadavg()[0]}
