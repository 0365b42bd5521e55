"""`uqbench score` on lm-evaluation-harness samples: 100,000 questions x 4 choices (synthetic files
in lm-eval 0.4's samples format: an ID task of 60,000 questions, 20% held out for calibration,
and a shifted task of 40,000), every logits-only scorer, figures included. Goal: <= 60 s on 2
cores. One JSON line (scored in a child process, `SCALE_CHILD`): seconds to read the files, to
score (rows and their bootstrap intervals) and to draw the figures (from ``run.json``), in
all, the child's CPU seconds and peak RSS, the ratio to the goal, and the machine's
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
368 s on the H200 (benchmarks/results/gpu-leases.md).

``figure_workers``: the figures of the cpu-like records' run folder drawn in this process and by
``auto`` worker processes (`figures.run.draw_run`), in one run: both times, their ratio, and
whether the PNG files are byte-identical (a PDF holds its creation time).

``score_lmeval_1m`` and ``score_lmeval_50_models`` (`lmeval_1m_line`, `models_50_line`): a
leaderboard's scale, 10^6 questions of one model (goal 60 s, 2 GiB peak RSS) and 50 models of
10^4 questions in one table (goal 120 s), each scored in a child process: seconds per phase,
its CPU seconds and peak RSS."""
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


def write_samples(folder: Path, task: str, n: int, seed: int, *, model: int = 0) -> None:
    """``n`` questions of 4 choices as lm-eval writes them (numbers as strings, per-sample
    ``acc``/``acc_norm``), the questions and labels set by ``seed``, the log-likelihoods also
    by ``model`` (another model's answers to the same questions)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 4, n)
    lls = np.random.default_rng([seed, model]).normal(-10, 3, (n, 4))
    lls[np.arange(n), labels] += 1.5 + np.random.default_rng([seed, model, 1]).normal(0, 1, n)
    folder.mkdir(parents=True, exist_ok=True)
    lengths = np.array([[len(f" option {j} of question {i}" + " more" * j) - 1 for j in range(4)]
                        for i in range(n)])
    acc = (lls.argmax(1) == labels).astype(int)
    acc_norm = ((lls / lengths).argmax(1) == labels).astype(int)
    with open(folder / f"samples_{task}_2026-01-01T00-00-00.000000.jsonl", "w") as f:
        for i in range(n):
            choices = [f"option {j} of question {i}" + " more" * j for j in range(4)]
            f.write(json.dumps({
                "doc_id": i, "doc": {"id": i}, "target": str(labels[i]),
                "arguments": {f"gen_args_{j}": {"arg_0": f"Q{i}?", "arg_1": " " + c}
                              for j, c in enumerate(choices)},
                "resps": [[[repr(float(x)), "False"]] for x in lls[i]],
                "filtered_resps": [[repr(float(x)), "False"] for x in lls[i]],
                "filter": "none", "metrics": ["acc", "acc_norm"], "doc_hash": str(i),
                "acc": int(acc[i]), "acc_norm": int(acc_norm[i])}) + "\n")


def write_results(folder: Path, name: str, tasks: dict[str, int]) -> None:
    """The results file of the run of ``tasks`` (task -> questions) by the model ``name``."""
    folder.mkdir(parents=True, exist_ok=True)
    conf = {"output_type": "multiple_choice", "target_delimiter": " "}
    (folder / "results_2026-01-01T00-00-00.000000.json").write_text(json.dumps({
        "results": {t: {"alias": t} for t in tasks}, "configs": {t: conf for t in tasks},
        "n-shot": dict.fromkeys(tasks, 0), "config": {"model": "hf", "model_args":
                                                      f"pretrained={name}", "limit": None},
        "n-samples": {t: {"original": n, "effective": n} for t, n in tasks.items()},
        "model_name": name, "lm_eval_version": "0.4.13"}))


def run() -> list[dict[str, Any]]:
    return [lmeval_line(), score_workers_line(), bootstrap_chunks_line(), figure_workers_line(),
            lmeval_1m_line(), models_50_line()]


#: ``uqbench score`` at a leaderboard's scale, in a child process (its own peak RSS): one model
#: of 10^6 questions (argv: the folder, "one"), or 50 models of 10^4 in one table ("many")
SCALE_CHILD = """
import contextlib, io, json, resource, sys, time
from pathlib import Path
t0 = time.perf_counter()
from uqbench.run.score_records import ScoreConfig, load_models, score
root, kind = Path(sys.argv[1]), sys.argv[2]
srcs = [root / "lm"] if kind == "one" else sorted((root / "models").iterdir())
with contextlib.redirect_stdout(io.StringIO()):
    rs = load_models(srcs, domains=["synthetic=big_id:big_shift"])
    t_read = time.perf_counter() - t0
    rss_read = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    score(rs, ScoreConfig(out=root / "out", scorers=("msp", "entropy", "energy", "margin")))
total = time.perf_counter() - t0
phases = json.loads((root / "out" / "run.json").read_text())["seconds"]
# this process and its workers: CPU seconds (user + system) and the largest peak RSS
own, workers = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
print(json.dumps({"read_s": t_read, "scoring_s": phases["scoring"],
                  "figures_s": phases.get("figures"), "total_s": total,
                  "read_peak_rss_mb": rss_read, "models": len(rs.pairs),
                  "figures": len(list((root / "out" / "figures").glob("*.png"))),
                  "peak_rss_mb": max(own.ru_maxrss, workers.ru_maxrss) / 1024,
                  "cpu_s": sum(u.ru_utime + u.ru_stime for u in (own, workers))}))
"""


def _scale_run(root: Path, kind: str) -> dict[str, Any]:
    """`SCALE_CHILD` on ``root``: its JSON line, with its own peak RSS (MiB, ``ru_maxrss``, its
    workers' included) and CPU seconds (user + system, its workers' included: on a shared
    machine the wall time measures the others' load as well), whatever ran before it."""
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", SCALE_CHILD, str(root), kind], env=env,
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _scale_line(name: str, child: dict[str, Any], load: float, goal_s: float,
                **extra: Any) -> dict[str, Any]:
    return {"benchmark": name, **extra, **{k: round(v, 2) if isinstance(v, float) else v
                                           for k, v in child.items()},
            "goal_s": goal_s, "ratio_to_goal_s": round(child["total_s"] / goal_s, 3),
            "cores": len(os.sched_getaffinity(0)), "load_before": round(load, 2),
            "load_after": round(os.getloadavg()[0], 2)}


def lmeval_1m_line() -> dict[str, Any]:
    """One model's lm-eval samples of 10^6 questions x 4 choices (an ID task of 600,000, 20%
    held out for calibration, a shifted task of 400,000), every logits-only scorer, figures
    included: seconds per phase and peak RSS against the goals (60 s, 2 GiB)."""
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_samples(root / "lm", "big_id", 600_000, 0)
        write_samples(root / "lm", "big_shift", 400_000, 1)
        write_results(root / "lm", "org/model", {"big_id": 600_000, "big_shift": 400_000})
        child = _scale_run(root, "one")
    line = _scale_line("score_lmeval_1m", child, load, GOAL_S, questions=10**6, choices=4)
    return {**line, "goal_rss_mb": 2048.0, "ratio_to_goal_rss": round(
        child["peak_rss_mb"] / 2048.0, 3)}


def models_50_line() -> dict[str, Any]:
    """50 models' lm-eval samples of the same 10^4 questions (6,000 ID, 4,000 shifted) scored
    into one table (`uqbench.reporting.models`): seconds per phase against the goal (120 s)."""
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for k in range(50):
            folder = root / "models" / f"model-{k:02d}"
            write_samples(folder, "big_id", 6_000, 0, model=k)
            write_samples(folder, "big_shift", 4_000, 1, model=k)
            write_results(folder, f"org/model-{k:02d}", {"big_id": 6_000, "big_shift": 4_000})
        child = _scale_run(root, "many")
    return _scale_line("score_lmeval_50_models", child, load, 120.0, models=50,
                       questions_per_model=10**4, choices=4)


def lmeval_line() -> dict[str, Any]:
    """100,000 questions of one model (60,000 ID, 40,000 shifted), scored as `lmeval_1m_line`
    scores 10^6: seconds per phase, CPU seconds and peak RSS against the goal (60 s)."""
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_samples(root / "lm", "big_id", 60_000, 0)
        write_samples(root / "lm", "big_shift", 40_000, 1)
        write_results(root / "lm", "org/model", {"big_id": 60_000, "big_shift": 40_000})
        child = _scale_run(root, "one")
    return _scale_line("score_lmeval_100k", child, load, GOAL_S, questions=100_000, choices=4)


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
