"""``make gpu-check``: the GPU code path, step by step, one JSON line per step.

    python -m benchmarks.gpu_check [--out FILE] [--cache-dir DIR] [--cpu] [--full-backbone NAME]

Steps, in order, each in its own process under its own time limit (`LIMITS`):

``env``            the machine: GPUs and their memory, torch / CUDA versions, bfloat16 support;
``smoke-smollm2``  the ``smoke`` profile of ``pooled`` with SmolLM2-135M (decoder, letters head);
``smoke-minilm``   the same with MiniLM (encoder, bi-encoder head);
``full``           the ``full`` profile (one seed, MoE-LoRA) capped to `FULL_CAPS` questions per
                   domain, on the largest backbone installed here (`FULL_CANDIDATES`, the first
                   that is installed and fits the GPU's free memory; ``--full-backbone`` names
                   any backbone instead: the dry run's test takes ``tiny-llama``, whose 2 random
                   layers run the full profile's path -- every block, attention and MLP
                   adapters, 3 epochs, 256 tokens -- in seconds, where SmolLM2 takes minutes
                   on 2 cores);
``gpu``            the ``gpu`` profile (`uqbench.core.profiles.GPU`): the whole pooled suite, every
                   default model, gate and scorer, one seed, at the profile's own sizes, on
                   `GPU_CANDIDATES` (the first installed and fitting; SmolLM2 only as the
                   fallback) or ``--gpu-backbone``, on ``--gpu-suite`` (default ``pooled``); a
                   worker configuration with a ``recipe`` (`benchmarks.gpu_lease`) runs the
                   profile with that recipe-search candidate's recipe; its line has the run's
                   wall time by phase
                   (``run_seconds``) and the accuracies. ``make gpu-bundle`` carries what it
                   needs to a lease and runs it (`benchmarks.gpu_bundle`);
``accelerate``     ``accelerate launch`` with 2 processes (one per GPU; needs 2 GPUs) on SmolLM2
                   (``--accelerate-backbone`` names another: the dry run's test takes
                   ``tiny-llama``), then one process on the adapters it trained: the two
                   reports must agree.

Each line: ``step``, ``status`` (ok | skipped | failed), ``reason``, ``seconds``,
``peak_gpu_mem_mb``, ``accuracy`` (per domain: MoE-LoRA, top-4 gate), ``tokens_per_s`` (the
deterministic pass of the comparison below) and ``matches_cpu``: what was compared, the largest
difference, the tolerance and whether it held. For the runs it compares the deterministic option
probabilities of the run's trained MoE-LoRA on the first `COMPARE_N` ID questions of each domain
on the run's device and dtype against the same weights in float32 on the CPU; for
``accelerate`` the 2-process report against the 1-process one. Lines also carry the placement
(device, dtype, ``device_map``), the head and the run's phase times.

Without CUDA (or with ``--cpu``) it is a dry run: the same steps, the same functions, on the
CPU at `DRY_CAPS` (float32 placement, the letters head, a 2-process gloo group), and the ``env``
line says that no GPU was found. A step whose backbone is not installed, that needs more GPU
memory than is free, or 2 GPUs where there are fewer, is skipped with the reason (and the pip
command, for a missing backbone) and the next step runs. Exit status 1 only when a step that
could run failed.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import emit

STEPS = ("env", "smoke-smollm2", "smoke-minilm", "full", "gpu", "accelerate")
#: seconds each step may take (the dry run's in brackets: its caps are tiny, its cores few)
LIMITS = {"env": (120, 120), "smoke-smollm2": (900, 900), "smoke-minilm": (600, 600),
          "full": (1800, 900), "gpu": (600, 900), "accelerate": (900, 900)}
#: per-domain caps of the ``full`` step on a GPU: a few hundred questions per domain
FULL_CAPS = {"train": 300, "calib": 128, "id": 300, "shift": 300}
#: per-domain caps of every run of the dry run
DRY_CAPS = {"train": 4, "calib": 2, "id": 2, "shift": 2}
#: scorers of the dry run's runs (no MC-dropout or ensemble passes) and of the accelerate step
DRY_SCORERS = ("msp", "routing_entropy")
#: ``full`` backbones, largest first (parameters, for the GPU-memory check)
FULL_CANDIDATES = {"qwen2.5-coder-1.5b": 1.54e9, "qwen2.5-coder-0.5b": 0.49e9, "smollm2": 0.135e9}
#: ``gpu`` backbones, in order of preference: a 0.5B decoder that can learn, SmolLM2 the fallback
GPU_CANDIDATES = ("qwen2.5-coder-0.5b", "smollm2")
#: parameters of every backbone the steps name, for the GPU-memory check (others: 0)
PARAMS = {**FULL_CANDIDATES, "minilm": 0.023e9}
#: first ID questions per domain compared against the CPU
COMPARE_N = 8
#: largest difference of option probabilities allowed against the CPU in float32: float32 runs
#: must agree to rounding; bfloat16 (8-bit mantissa) drifts over the layers: on an H200 the smoke
#: runs differed by 0.050 (SmolLM2, 30 layers) and 0.0020 (MiniLM)
#: (benchmarks/results/gpu-check-h200.jsonl)
TOLERANCE = {"float32": 1e-5, "bfloat16": 0.1}
RESULT = "GPU_CHECK_RESULT "


# -- the parent: plan, skip, run each step in its own process ---------------------------------
def _env() -> dict[str, str]:
    repo = str(Path(__file__).resolve().parents[1])
    return {**os.environ, "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1"),
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONPATH": os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")]))}


def _tail(text: str, n: int = 1500) -> str:
    text = "\n".join(text.strip().splitlines())   # progress bars redraw with \r
    return text if len(text) <= n else "..." + text[-n:]


def _die_with_parent() -> None:
    """(Linux) the step's process is killed when the check is: a killed check leaves no step
    running behind it."""
    if sys.platform == "linux":
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG


def execute(cmd: Sequence[str], limit: float, *, env: dict[str, str] | None = None
            ) -> tuple[dict[str, Any] | None, str | None]:
    """Run ``cmd`` (its own process group) for at most ``limit`` seconds: (the result line it
    printed, None) or (None, why it failed: timeout, exit status, no result; stderr tail)."""
    # preexec_fn: Popen has no argument that sets PR_SET_PDEATHSIG (the hook only calls prctl)
    p = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env or _env(), start_new_session=True,
                         preexec_fn=_die_with_parent)  # noqa: PLW1509
    try:
        out, err = p.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return None, f"timed out after {limit:.0f} s; stderr: {_tail(err)}"
    finally:   # this process is being stopped: its step stops too
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    lines = [ln[len(RESULT):] for ln in out.splitlines() if ln.startswith(RESULT)]
    if p.returncode != 0:
        return None, f"exit status {p.returncode}; stderr: {_tail(err)}"
    if not lines:
        return None, f"no result line; stdout: {_tail(out)}; stderr: {_tail(err)}"
    return json.loads(lines[-1]), None


def worker_command(step: str, conf: dict[str, Any]) -> list[str]:
    """The Python arguments that run ``step`` with ``conf`` in a worker process."""
    return ["-m", "benchmarks.gpu_check", "--worker", step, "--config", json.dumps(conf)]


def launch_2(args: Sequence[str]) -> list[str]:
    """``accelerate launch`` of ``args`` (``-m module ...``) in 2 processes on this machine."""
    import socket

    with socket.socket() as s:   # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    return [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu",
            "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
            "--dynamo_backend", "no", "--main_process_port", port, *args]


def _link_cache(src: Path, dst: Path, kinds: Sequence[str]) -> None:
    """``dst`` gets ``src``'s ``kinds`` folders (splits, converted backbones, adapters) as hard
    links (copies across file systems): another run starts from them."""
    def link(a: str, b: str) -> None:
        try:
            os.link(a, b)
        except OSError:   # another file system: the same bytes, copied
            shutil.copy2(a, b)

    for kind in kinds:
        if (src / kind).is_dir():
            shutil.copytree(src / kind, dst / kind, copy_function=link, dirs_exist_ok=True)


def missing_backbone(backbone: str) -> str | None:
    """Why ``backbone`` cannot be loaded here (not installed: with the pip command), or None."""
    from baselines.backbones import check_backbone
    from uqbench.core.errors import ConfigError

    try:
        check_backbone(backbone)
    except ConfigError as exc:
        return str(exc)
    return None


def free_gb() -> float:
    """Free memory of the current GPU, in GiB."""
    import torch

    return torch.cuda.mem_get_info()[0] / 2**30


def _needs_gb(params: float) -> float:
    """A bound on one run's GPU memory: bfloat16 weights, 5 adapters, activations, workspace."""
    return 4 * 2 * params / 2**30 + 4.0


def _why_not(backbone: str, gpu: bool) -> str | None:
    """Why a step on ``backbone`` cannot run here: not installed, or (GPU) too little free
    memory for it; None when it can."""
    why = missing_backbone(backbone)
    need = _needs_gb(PARAMS.get(backbone, 0.0))
    if why is None and gpu and need > free_gb():
        why = f"{backbone} needs about {need:.0f} GiB of GPU memory, {free_gb():.1f} GiB free"
    return why


def plan(gpu: bool, work: Path, cache: Path, full_backbone: str | None = None,
         accelerate_backbone: str = "smollm2", gpu_backbone: str | None = None,
         gpu_profile: str = "gpu", cuda_graph: str | None = None, gpu_suite: str = "pooled"
         ) -> dict[str, tuple[dict[str, Any] | None, str | None]]:
    """Step -> (its worker configuration, None) or (None, why it is skipped). ``cuda_graph``:
    every run step's ``--cuda-graph`` (None: the profiles'); ``gpu_suite``: the gpu step's."""
    import torch

    caps = None if gpu else DRY_CAPS

    def run_conf(name: str, backbone: str, profile: str, **kw: Any) -> dict[str, Any]:
        conf = {"backbone": backbone, "profile": profile, "caps": caps, "models": [],
                "scorers": [], "seeds": None, "cache": str(cache), "out": str(work / name),
                "threads": None, "compare": True, "cuda_graph": cuda_graph}
        if not gpu:   # the dry run: the smallest runs through the same functions
            conf.update(models=["moe-lora"], scorers=list(DRY_SCORERS), seeds=1)
        return {**conf, **kw}

    steps: dict[str, tuple[dict[str, Any] | None, str | None]] = {"env": ({}, None)}
    for name, bb in (("smoke-smollm2", "smollm2"), ("smoke-minilm", "minilm")):
        why = _why_not(bb, gpu)
        steps[name] = (None, why) if why else (run_conf(name, bb, "smoke"), None)

    def first_fit(name: str, candidates: Sequence[str], profile: str, **kw: Any
                  ) -> tuple[dict[str, Any] | None, str | None]:
        tried = {}
        for bb in candidates:
            why = _why_not(bb, gpu)
            if why is None:
                conf = run_conf(name, bb, profile, **kw)
                conf["not_chosen"] = tried   # earlier candidates and why they were passed over
                return conf, None
            tried[bb] = why
        return None, f"no backbone for the {profile} profile: " + "; ".join(
            f"{b}: {w}" for b, w in tried.items())

    steps["full"] = first_fit("full", [full_backbone] if full_backbone else list(FULL_CANDIDATES),
                              "full", models=["moe-lora"], seeds=1,
                              caps=FULL_CAPS if gpu else DRY_CAPS)
    steps["gpu"] = first_fit("gpu", [gpu_backbone] if gpu_backbone else list(GPU_CANDIDATES),
                             gpu_profile, suite=gpu_suite)
    n_gpus = torch.cuda.device_count() if gpu else 0
    why = _why_not(accelerate_backbone, gpu)
    if gpu and n_gpus < 2:
        why = f"needs 2 GPUs, found {n_gpus}"
    steps["accelerate"] = (None, why) if why else (run_conf(
        "accelerate", accelerate_backbone, "smoke", models=["moe-lora"], scorers=list(DRY_SCORERS),
        seeds=1, compare=False, threads=None if gpu else 1), None)   # 2 processes, 1 core each
    return steps


def run_step(name: str, conf: dict[str, Any] | None, skip: str | None, gpu: bool,
             max_seconds: float | None = None, env: dict[str, str] | None = None
             ) -> dict[str, Any]:
    """One step's JSON line (``env``: its process's environment; default this one's)."""
    row: dict[str, Any] = {"step": name, "status": "skipped", "reason": skip, "seconds": 0.0}
    if conf is None:
        warnings.warn(f"gpu-check step {name} skipped: {skip}", stacklevel=2)
        return row
    limit = min(LIMITS[name][0 if gpu else 1], max_seconds or math.inf)
    t = time.perf_counter()
    if name == "accelerate":
        result, why = run_accelerate(conf, limit)
    else:
        result, why = execute([sys.executable, *worker_command(name, conf)], limit, env=env)
    row["seconds"] = round(time.perf_counter() - t, 1)
    if result is None:
        row.update(status="failed", reason=why)
        return row
    row.update(result)
    if (result.get("matches_cpu") or {}).get("equal") is False:
        row.update(status="failed", reason="results differ from the CPU beyond the tolerance")
    elif row.get("status") != "failed":
        row["status"] = "ok"
    return row


def run_accelerate(conf: dict[str, Any], limit: float) -> tuple[dict[str, Any] | None, str | None]:
    """2 processes train and report; 1 process on their adapters (splits, backbone and models
    linked from their cache, passes and calibration redone) must report the same numbers."""
    t0 = time.perf_counter()
    root, shared = Path(conf["out"]), Path(conf["cache"])
    two = {**conf, "out": str(root / "two"), "cache": str(root / "cache2")}
    _link_cache(shared, Path(two["cache"]), ("splits", "backbones"))
    env = {**_env(), **({"OMP_NUM_THREADS": "1"} if conf["threads"] == 1 else {})}
    result, why = execute(launch_2(worker_command("accelerate", two)), limit, env=env)
    if result is None:
        return None, f"2-process launch: {why}"
    one = {**conf, "out": str(root / "one"), "cache": str(root / "cache1"),
           "reference": two["out"]}
    _link_cache(Path(two["cache"]), Path(one["cache"]), ("splits", "backbones", "models"))
    ref, why = execute([sys.executable, *worker_command("accelerate", one)],
                       max(1.0, limit - (time.perf_counter() - t0)), env=env)
    if ref is None:
        return None, f"1-process reference: {why}"
    return {**result, "matches_cpu": ref["matches_cpu"]}, None


def main(argv: Sequence[str] | None = None) -> int:
    from uqbench.core.profiles import COMPILE

    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="also write the JSON lines to this file")
    ap.add_argument("--cache-dir", type=Path,
                    help="cache shared by the steps (default $UQBENCH_CACHE or .uqbench-cache)")
    ap.add_argument("--work", type=Path, help="run folders (default: a temporary folder)")
    ap.add_argument("--cpu", action="store_true", help="the dry run even where CUDA is found")
    ap.add_argument("--full-backbone", metavar="NAME",
                    help="backbone of the full step (default: the largest of "
                         f"{', '.join(FULL_CANDIDATES)} installed and fitting the GPU)")
    ap.add_argument("--gpu-backbone", metavar="NAME",
                    help="backbone of the gpu step (default: the first of "
                         f"{', '.join(GPU_CANDIDATES)} installed and fitting the GPU)")
    ap.add_argument("--gpu-profile", metavar="NAME", default="gpu",
                    help="profile of the gpu step (default: gpu)")
    ap.add_argument("--gpu-suite", metavar="SUITE", default="pooled",
                    help="suite of the gpu step: a registered one or a YAML file (default: pooled)")
    ap.add_argument("--cuda-graph", choices=COMPILE,
                    help="every run step's --cuda-graph (default: the profiles')")
    ap.add_argument("--accelerate-backbone", metavar="NAME", default="smollm2",
                    help="backbone of the accelerate step (default: smollm2)")
    ap.add_argument("--step-limit", type=float, metavar="SECONDS",
                    help="cap every step's time limit: a step that runs out of it is reported "
                         "(with the tail of its progress) instead of lost with a killed check")
    ap.add_argument("--steps", default=",".join(STEPS), help=f"subset of {','.join(STEPS)}")
    ap.add_argument("--worker", choices=STEPS, help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return _worker_main(args.worker, json.loads(args.config or "{}"))
    steps = [s for s in args.steps.split(",") if s]
    if bad := [s for s in steps if s not in STEPS]:
        ap.error(f"unknown step(s) {bad}; valid: {', '.join(STEPS)}")
    import torch

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # stop the running step too
    gpu = torch.cuda.is_available() and not args.cpu
    from uqbench.files.cache import resolve_cache_dir

    cache = resolve_cache_dir(args.cache_dir)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("")
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        todo = plan(gpu, work, cache, args.full_backbone, args.accelerate_backbone,
                    args.gpu_backbone, args.gpu_profile, args.cuda_graph, args.gpu_suite)
        failed = False
        for name in steps:
            conf, skip = todo[name]
            row = run_step(name, None if conf is None else {**conf, "gpu": gpu}, skip, gpu,
                           args.step_limit)
            failed |= row["status"] == "failed"
            emit(row, args.out)
    return 1 if failed else 0


# -- the workers: one step in this process ----------------------------------------------------
def _worker_main(step: str, conf: dict[str, Any]) -> int:
    result = environment(bool(conf.get("gpu"))) if step == "env" else run_and_compare(conf)
    if result is not None:   # None: not process 0 of a launch
        print(RESULT + json.dumps(result, default=str), flush=True)
    return 0


def environment(gpu: bool) -> dict[str, Any]:
    import importlib.metadata as md

    import torch

    row: dict[str, Any] = {
        "torch": torch.__version__, "cuda": torch.version.cuda, "cpu_cores": os.cpu_count(),
        "packages": {p: md.version(p) for p in ("transformers", "accelerate", "peft")},
        "gpus": [{"name": torch.cuda.get_device_name(i),
                  "memory_gb": round(torch.cuda.get_device_properties(i).total_memory / 2**30, 1)}
                 for i in range(torch.cuda.device_count())],
    }
    if gpu:
        row["bf16"] = torch.cuda.is_bf16_supported()
    else:
        row["bf16"] = None
        row["dry_run"] = True
        row["reason"] = ("no GPU found (torch.cuda.is_available() is False)"
                         if not torch.cuda.is_available() else "--cpu given")
        row["reason"] += f": dry run on the CPU at caps {DRY_CAPS}, float32"
    return row


def _suite(caps: dict[str, int] | None, base: str = "pooled") -> str:
    """``base`` itself, or ``base`` under ``caps`` (registered in this process)."""
    if not caps:
        return base
    from uqbench.data.suites.spec import SUITES, get_suite_spec, register_suite

    spec = get_suite_spec(base)
    name = f"{spec.name}-gpu-check"
    if name not in SUITES:
        register_suite(dataclasses.replace(spec, name=name, caps=caps))
    return name


def _profile(conf: dict[str, Any]) -> str:
    """The step's profile, or (``recipe``: a `benchmarks.recipe_search` candidate) that profile
    with the candidate's recipe, registered in this process as ``<profile>+<candidate>``."""
    if not conf.get("recipe"):
        return str(conf["profile"])
    from benchmarks.recipe_search import recipe_profile
    from uqbench.core.profiles import PROFILES, get_profile, register_profile

    name = f"{conf['profile']}+{conf['recipe']['candidate']}"
    if name not in PROFILES:
        register_profile(recipe_profile(get_profile(conf["profile"]), conf["recipe"], name))
    return name


def run_and_compare(conf: dict[str, Any]) -> dict[str, Any] | None:
    """``uqbench run`` of one step; on process 0 the line's numbers (and the comparison)."""
    import torch

    from baselines import distributed
    from uqbench.core.plan import MOE, TOP4
    from uqbench.run.runner import RunConfig, run

    cfg = RunConfig(suite=_suite(conf["caps"], conf.get("suite") or "pooled"),
                    profile=_profile(conf),
                    backbone=conf["backbone"], models=tuple(conf["models"]),
                    scorers=tuple(conf["scorers"]), seeds=conf["seeds"], figures=False,
                    # on a GPU the progress bars go to stderr, whose tail a step that runs out
                    # of time reports: where its time went (the first full step gave no clue)
                    progress=bool(conf.get("gpu")), out=Path(conf["out"]),
                    cache_dir=Path(conf["cache"]),
                    threads=conf["threads"], cuda_graph=conf.get("cuda_graph"))
    res = run(cfg)
    peak = torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None
    peaks = distributed.gather(peak)
    if not distributed.is_main():
        return None
    row: dict[str, Any] = {
        "backbone": cfg.backbone, "profile": cfg.profile, "caps": conf["caps"],
        "cuda_graph": cfg.cuda_graph,
        "processes": distributed.world(),
        "peak_gpu_mem_mb": None if peak is None else round(max(peaks)),
        "accuracy": {r["domain"]: round(r["accuracy"], 4) for r in res.rows
                     if r.get("model") == MOE.name and r.get("gate") == TOP4.name
                     and r.get("scorer") == "msp"},
        "run_seconds": {k: round(v, 1) for k, v in res.stats.seconds.items()},
        "trained": res.stats.trained,
    }
    if conf.get("not_chosen"):
        row["not_chosen"] = conf["not_chosen"]
    if conf.get("recipe"):
        row["recipe"] = conf["recipe"]
    if conf.get("reference"):
        row["matches_cpu"] = same_report(Path(conf["reference"]), res.out)
    elif conf["compare"]:
        row.update(compare_cpu(cfg))
    return row


def compare_cpu(cfg: Any) -> dict[str, Any]:
    """The run's trained MoE-LoRA (top-4, from the cache) on its device and dtype against the
    same weights in float32 on the CPU: deterministic option probabilities of the first
    `COMPARE_N` ID questions of each domain. Also the device pass's tokens per second and the
    placement."""
    import numpy as np
    import torch

    from baselines import checkpoint, forward
    from baselines.backbones import load_backbone
    from baselines.engine import TorchEngine
    from uqbench.core.engine import RunStats
    from uqbench.core.plan import MOE
    from uqbench.core.probs import softmax
    from uqbench.core.profiles import get_profile
    from uqbench.data.suites.build import build_suite
    from uqbench.data.suites.spec import get_suite_spec
    from uqbench.run.runner import resolve_dirs

    _, cache, data = resolve_dirs(cfg)
    prof = get_profile(cfg.profile)
    suite = build_suite(cfg.suite, prof, data_dir=data, cache_dir=cache / "splits",
                        progress=False)
    engine = TorchEngine(cfg.backbone, prof, suite, cache, RunStats(), progress=False,
                         head=cfg.head or get_suite_spec(cfg.suite).head)
    model, _ = engine.model(MOE, 0)   # the adapter the run trained: a cache hit
    records = [r for d in suite.domains for r in suite.split(d, "id").records[:COMPARE_N]]
    kw: dict[str, Any] = {"batch_size": prof.eval_batch_size, "max_length": prof.max_length,
                          "progress": False}
    t = time.perf_counter()
    dev = forward.collect(model, records, **kw)
    seconds = time.perf_counter() - t
    bb = engine.backbone()
    dtype = str(bb.model.dtype).removeprefix("torch.")
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint.save_adapter(model, tmp, meta={"model": MOE.name, "seed": 0})
        cpu_bb = load_backbone(cfg.backbone, dtype=bb.model.dtype, device="cpu", cache_dir=cache)
        ref = checkpoint.load_adapter(tmp, cpu_bb, copy=False).to(torch.float32)
    cpu = forward.collect(ref, records, **kw)
    p_dev, p_cpu = softmax(dev["logits"]), softmax(cpu["logits"])
    diff = float(np.abs(p_dev - p_cpu).max())
    tol = TOLERANCE.get(dtype, TOLERANCE["bfloat16"])
    where = f"{model.device} in {dtype}"
    return {
        "placement": {
            "device": str(model.device),
            "dtype": dtype,
            "device_map": getattr(bb.model, "hf_device_map", None),
            "head": model.mode,
        },
        "tokens_per_s": round(float(dev["n_tokens"].sum()) / seconds, 1),
        "matches_cpu": {
            "compared": f"deterministic option probabilities of the trained MoE-LoRA (top-4) on "
            f"the first (up to) {COMPARE_N} ID questions of each domain, "
            f"{len(records)} in all: {where} vs the CPU in float32"
            + (" (no GPU: both sides ran on the CPU)" if model.device.type == "cpu" else ""),
            "n": len(records),
            "max_abs_diff": diff,
            "tolerance": tol,
            "argmax_agreement": float((p_dev.argmax(1) == p_cpu.argmax(1)).mean()),
            "equal": diff <= tol,
        },
    }


def same_report(two: Path, one: Path) -> dict[str, Any]:
    """The 2-process report against the 1-process one on the same adapters: every MoE-LoRA row's
    deterministic columns (on CPU and on one kind of GPU, the same numbers)."""
    from uqbench.files.rundir import read_results

    def rows(out: Path) -> dict[tuple[str, str], dict[str, Any]]:
        return {(r["method"], r["domain"]): r for r in read_results(out)}

    a, b = rows(two), rows(one)
    cols = ("accuracy", "ece", "ood_auroc", "aurc", "avg_experts")
    diffs = [abs(a[k][c] - b[k][c]) for k in a.keys() & b.keys() if a[k].get("model")
             for c in cols if a[k].get(c) is not None and b[k].get(c) is not None]
    diff = max(diffs, default=float("nan"))
    return {"compared": f"{', '.join(cols)} of every MoE-LoRA row: 2 processes vs 1 process on "
                        "the adapters the 2 processes trained",
            "n": len(diffs), "max_abs_diff": diff, "tolerance": 1e-9,
            "same_rows": a.keys() == b.keys(), "equal": a.keys() == b.keys() and diff <= 1e-9}


if __name__ == "__main__":
    raise SystemExit(main())
