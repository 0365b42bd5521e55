"""`uqbench score` on lm-evaluation-harness samples: 100,000 questions x 4 choices (synthetic files
in lm-eval 0.4's samples format: an ID task of 60,000 questions, 20% held out for calibration,
and a shifted task of 40,000), every logits-only scorer, figures included. Goal: <= 60 s on 2
cores. One JSON line: seconds to read the files, to score (rows and their bootstrap intervals)
and to draw the figures (from ``run.json``), in all, the ratio to the goal, and the machine's
1-minute load average before and after (a shared machine's numbers are only comparable at a
similar load).

``score_workers``: the same cpu-like records (`cpu_like_records`) scored in this process and
by worker processes (`uqbench.results.rows.score_workers`), in one run: both times, their
ratio, and whether the files are byte-identical.

``score_bootstrap_chunks``: records shaped like the ``gpu`` profile's (300 ID, 250 shifted and
200 calib questions per domain, 8 MC-dropout passes, 896 features: Qwen2.5-0.5B's width), scored
in this process with the bootstrap's resamples evaluated a chunk at a time (the default,
`uqbench.stats.metrics.bootstrap.CHUNK_ELEMENTS`) and one at a time, in one run: both times,
their ratio and whether the files are byte-identical. Scoring was 98 s of the ``gpu`` profile's
368 s on the H200 (docs/gpu.md).

``figure_workers``: the figures of the cpu-like records' run folder drawn in this process and by
``auto`` worker processes (`figures.run.draw_run`), in one run: both times, their ratio, and
whether the PNG files are byte-identical (a PDF holds its creation time)."""
from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

GOAL_S = 60.0


def write_samples(folder: Path, task: str, n: int, seed: int) -> None:
    """``n`` questions of 4 choices as lm-eval writes them (numbers as strings)."""
    rng = np.random.default_rng(seed)
    lls = rng.normal(-10, 3, (n, 4))
    labels = rng.integers(0, 4, n)
    lls[np.arange(n), labels] += rng.normal(1.5, 1, n)  # a model better than chance
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"samples_{task}_2026-01-01T00-00-00.000000.jsonl", "w") as f:
        for i in range(n):
            choices = [f"option {j} of question {i}" + " more" * j for j in range(4)]
            f.write(json.dumps({
                "doc_id": i, "doc": {"id": i}, "target": str(labels[i]),
                "arguments": {f"gen_args_{j}": {"arg_0": f"Q{i}?", "arg_1": " " + c}
                              for j, c in enumerate(choices)},
                "filtered_resps": [[repr(float(x)), "False"] for x in lls[i]],
                "filter": "none", "doc_hash": str(i)}) + "\n")


def run() -> list[dict[str, Any]]:
    return [lmeval_line(), score_workers_line(), bootstrap_chunks_line(), figure_workers_line()]


def lmeval_line() -> dict[str, Any]:
    from uqbench.run.score_records import ScoreConfig, load_records, score

    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_samples(root / "lm", "big_id", 60_000, 0)
        write_samples(root / "lm", "big_shift", 40_000, 1)
        t0 = time.perf_counter()
        rs = load_records(root / "lm", domains=["synthetic=big_id:big_shift"])
        t_read = time.perf_counter() - t0
        score(rs, ScoreConfig(out=root / "out", scorers=("msp", "entropy", "energy", "margin")))
        total = time.perf_counter() - t0
        figures = len(list((root / "out" / "figures").glob("*.png")))
        phases = json.loads((root / "out" / "run.json").read_text())["seconds"]
    return {"benchmark": "score_lmeval_100k", "questions": 100_000, "choices": 4,
             "read_s": round(t_read, 2), "scoring_s": round(phases["scoring"], 2),
             "figures_s": round(phases["figures"], 2),
             "score_and_figures_s": round(total - t_read, 2), "total_s": round(total, 2),
             "figures": figures, "goal_s": GOAL_S, "ratio_to_goal": round(total / GOAL_S, 3),
             "load_before": round(load, 2), "load_after": round(os.getloadavg()[0], 2)}


#: the ``gpu`` profile's split sizes (ID, shift, calib) and training questions per domain
GPU_SIZES, GPU_TRAIN = (300, 250, 200), 600


def cpu_like_records(*, domains: int = 4, sizes: tuple[int, int, int] = (120, 120, 200),
                     n_train: int = 100, seed: int = 0, mc: int = 5, members: int = 3,
                     dim: int = 32) -> Any:
    """Random records shaped like the cpu profile's (``sizes``: ID, shift, calib questions per
    domain; 4 choices): LoRA (dense gate) and MoE-LoRA under two gates, every field the
    built-in scorers read (router statistics, 5 MC-dropout passes, 3 members, features and
    the training reference)."""
    from uqbench.core.outputs import Outputs, with_train
    from uqbench.core.plan import DET, ROUTER, GateSpec, ModelSpec, Pair
    from uqbench.io.recordset import RecordSet
    from uqbench.results.references import ReferenceInputs

    extra = frozenset({"mc_logits", "member_logits", "features"})
    moe = ModelSpec("moe-lora", "moe")
    pairs = [Pair(ModelSpec("lora", "lora"), GateSpec("dense", "dense"), DET | extra),
             Pair(moe, GateSpec("top4", "topk", params={"k": 4}), ROUTER | extra),
             Pair(moe, GateSpec("care", "care", budget=4.0), ROUTER | extra)]
    rng = np.random.default_rng(seed)
    outputs, n_choices, hashes = {}, {}, {}
    names = [f"d{i}" for i in range(domains)]
    for d in names:
        for role, n in zip(("id", "shift", "calib", "train"), (*sizes, n_train), strict=False):
            split = f"{d}/{role}"
            hashes[split] = f"{d}-{role}"
            labels = rng.integers(0, 4, n)
            n_choices[split] = np.full(n, 4)
            for p in pairs:
                logits = rng.normal(size=(n, 4)) * 2
                logits[np.arange(n), labels] += 1.0  # better than chance
                router = p.gate.name != "dense"
                outputs[p.name, split, 0] = Outputs(
                    ids=np.array([f"{split}/{i}" for i in range(n)]), labels=labels,
                    logits=logits, domain=np.full(n, d),
                    route_entropy=rng.uniform(size=n) if router else None,
                    top1_mass=rng.uniform(0.1, 1, n) if router else None,
                    disagreement=rng.uniform(size=n) if router else None,
                    experts=rng.uniform(1, 8, n) if router else None,
                    n_tokens=rng.integers(5, 60, n).astype(float) if router else None,
                    mc_logits=logits + rng.normal(size=(mc, n, 4)),
                    member_logits=logits + rng.normal(size=(members, n, 4)),
                    features=rng.normal(size=(n, dim)))
    refs = ReferenceInputs(tuple(names), {k: v for k, v in n_choices.items()
                                          if k.endswith(("/id", "/shift"))}, None, hashes)
    return RecordSet(pairs, with_train(outputs), 1, refs, bootstrap=1000, meta={})


def score_workers_line() -> dict[str, Any]:
    """Serial (``--score-workers 1``) against parallel (``auto``) scoring of the same
    cpu-like records, every built-in scorer, 1000 resamples: seconds of each, the ratio, the
    workers used and whether the results are byte-identical."""
    from uqbench.run.score_records import ScoreConfig, score

    rs = cpu_like_records()
    load, seconds, workers, csv = os.getloadavg()[0], {}, {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in (1, "auto"):
            out = Path(tmp) / str(mode)
            t0 = time.perf_counter()
            score(rs, ScoreConfig(out=out, figures=False, score_workers=mode))
            seconds[mode] = time.perf_counter() - t0
            meta = json.loads((out / "run.json").read_text())
            workers[mode] = meta["score_workers"]
            csv[mode] = (out / "results.csv").read_bytes() + (out / "scores.npz").read_bytes()
    return {"benchmark": "score_workers", "methods": len(meta["methods"]),
            "questions_per_pair": sum(o.n for (p, s, _), o in rs.outputs.items()
                                      if p == rs.pairs[0].name and not s.endswith("/train")),
            "bootstrap": 1000, "serial_s": round(seconds[1], 2),
            "parallel_s": round(seconds["auto"], 2), "workers": workers["auto"],
            "cores": len(os.sched_getaffinity(0)),
            "ratio_parallel_to_serial": round(seconds["auto"] / seconds[1], 3),
            "identical": csv[1] == csv["auto"],
            "load_before": round(load, 2), "load_after": round(os.getloadavg()[0], 2)}


def _score_gpu_like(out: Path, chunk: int) -> float:
    """Seconds to score the gpu-like records into ``out`` in this process, with bootstrap
    chunks of ``chunk`` index elements (run in a fresh process: no memo of the other mode)."""
    from uqbench.run.score_records import ScoreConfig, score
    from uqbench.stats.metrics import bootstrap

    bootstrap.CHUNK_ELEMENTS = chunk
    rs = cpu_like_records(sizes=GPU_SIZES, n_train=GPU_TRAIN, mc=8, dim=896)
    with contextlib.redirect_stdout(io.StringIO()):   # the run's printed tables
        t0 = time.perf_counter()
        score(rs, ScoreConfig(out=out, figures=False, score_workers=1))
        return time.perf_counter() - t0


def bootstrap_chunks_line() -> dict[str, Any]:
    """Serial scoring of gpu-like records with the bootstrap's resamples in chunks and one at a
    time, each in its own fresh process: seconds of each, the ratio, and whether the results
    are byte-identical."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    from uqbench.stats.metrics.bootstrap import CHUNK_ELEMENTS

    load, seconds, files = os.getloadavg()[0], {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, chunk in (("chunked", CHUNK_ELEMENTS), ("one_at_a_time", 1)):
            out = Path(tmp) / name
            with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as ex:
                seconds[name] = ex.submit(_score_gpu_like, out, chunk).result()
            files[name] = (out / "results.csv").read_bytes() + (out / "scores.npz").read_bytes()
    return {"benchmark": "score_bootstrap_chunks", "profile_like": "gpu",
            "sizes_per_domain": list(GPU_SIZES), "bootstrap": 1000, "workers": 1,
            "chunk_elements": CHUNK_ELEMENTS, "chunked_s": round(seconds["chunked"], 2),
            "one_at_a_time_s": round(seconds["one_at_a_time"], 2),
            "ratio": round(seconds["chunked"] / seconds["one_at_a_time"], 3),
            "identical": files["chunked"] == files["one_at_a_time"],
            "load_before": round(load, 2), "load_after": round(os.getloadavg()[0], 2)}


def figure_workers_line() -> dict[str, Any]:
    """The figures of one run folder drawn in process and by ``auto`` workers."""
    from figures.run import draw_run
    from uqbench.run.score_records import ScoreConfig, score

    load, seconds, pngs = os.getloadavg()[0], {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        with contextlib.redirect_stdout(io.StringIO()):
            score(cpu_like_records(), ScoreConfig(out=out, figures=False))
        for mode in (1, "auto"):
            t0 = time.perf_counter()
            paths = draw_run(out, workers=mode)
            seconds[mode] = time.perf_counter() - t0
            pngs[mode] = [p.read_bytes() for p in paths if p.suffix == ".png"]
    return {"benchmark": "figure_workers", "figures": len(pngs[1]),
            "serial_s": round(seconds[1], 2), "auto_s": round(seconds["auto"], 2),
            "cores": len(os.sched_getaffinity(0)),
            "ratio_auto_to_serial": round(seconds["auto"] / seconds[1], 3),
            "identical_png": pngs[1] == pngs["auto"],
            "load_before": round(load, 2), "load_after": round(os.getloadavg()[0], 2)}
