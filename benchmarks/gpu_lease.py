"""``make gpu-lease``: the next lease's measurements, in two device calls that each write their
JSON lines as they go (docs/gpu.md, "The next lease").

    python -m benchmarks.gpu_lease search  BUNDLE [--work DIR] [--out FILE] [--budget 270]
                                           [--candidates LIST] [--backbone NAME] [--id-cap N]
                                           [--cpu]
    python -m benchmarks.gpu_lease profile BUNDLE [--work DIR] [--out FILE] [--budget 420]
                                           [--cpu]

``search``  unpacks the bundle (`benchmarks.gpu_bundle.prepare`: parts checked, wheels
            installed, splits checked; a folder an earlier call prepared is reused), then runs
            `benchmarks.recipe_search` on the bundle's suite and profile: the backbone's
            zero-shot row, then each of `CANDIDATES` (one MoE-LoRA model each, per-domain ID
            accuracy with CIs), each candidate skipped with a row saying so when the time
            left is less than the longest one so far took; then the 0.5B's rows when the
            bundle carries its weights (``--extra-backbone``) and time is left. A ``choice``
            line ends it: the candidate the profile call will run and why.
``profile`` runs the bundle's profile (``make gpu-check``'s ``gpu`` step: every model, gate
            and scorer) with the chosen candidate's recipe on its backbone, time-boxed to the
            budget less `GRAPH_S`; then, if `GRAPH_S` are left, ``python -m benchmarks
            graph_step`` on the same backbone (the training step replayed as a CUDA graph).

Every line goes to stdout and ``--out`` as it is made; the search's rows are also kept in
``<work>/search.jsonl``, where the profile call, on the same machine, finds them. A step that
runs out of its time is reported failed with the tail of its progress, and the lines before
it stay. ``--cpu`` is the dry run on the CPU (the tests run it at tiny caps with
``--backbone tiny-llama``).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import emit
from benchmarks.gpu_bundle import REPO, BundleError, prepare, suite_of

#: the search's candidates on the bundle's backbone, in the order they run (why each is there:
#: docs/recipe.md, "The lease's candidates"); the zero-shot row comes first
CANDIDATES = ("gpu15-zero", "gpu15", "gpu15-lr1e-3", "gpu15-attn", "gpu15-ep2")
#: on a bundle that also carries the 0.5B's weights, its rows after the 1.5B's, if time is left
EXTRA = {"qwen2.5-coder-0.5b": ("gpu-zero", "gpu")}
#: default seconds of each call (two calls: each command of a lease runs at most 10 minutes)
BUDGET = {"search": 270.0, "profile": 420.0}
#: seconds the profile call keeps for ``graph_step`` after the run
GRAPH_S = 60.0
SEARCH = "search.jsonl"


def _python(env: dict[str, str], args: Sequence[str], limit: float, out: Path | None,
            tag: dict[str, Any] | None = None) -> tuple[list[dict[str, Any]], str | None]:
    """Run ``python -m ARGS`` for at most ``limit`` seconds; every JSON line it prints is
    emitted (with ``tag``) as it comes. (lines, None) or (lines, why it failed)."""
    p = subprocess.Popen([sys.executable, "-m", *args], cwd=REPO, env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         start_new_session=True)
    rows: list[dict[str, Any]] = []
    deadline = time.monotonic() + limit
    import selectors

    sel = selectors.DefaultSelector()
    assert p.stdout is not None and p.stderr is not None
    sel.register(p.stdout, selectors.EVENT_READ)
    err: list[str] = []
    sel.register(p.stderr, selectors.EVENT_READ)
    open_streams = 2
    why = None
    while open_streams and why is None:
        left = deadline - time.monotonic()
        if left <= 0:
            why = f"timed out after {limit:.0f} s"
            break
        for key, _ in sel.select(timeout=min(left, 5.0)):
            line = key.fileobj.readline()   # type: ignore[union-attr]
            if not line:
                sel.unregister(key.fileobj)
                open_streams -= 1
            elif key.fileobj is p.stderr:
                err.append(line)
                del err[:-40]
            elif line.startswith("{"):
                row = {**json.loads(line), **(tag or {})}
                rows.append(row)
                emit(row, None if out is None else str(out))
    if why is not None:
        import signal

        os.killpg(p.pid, signal.SIGKILL)
    rc = p.wait()
    if why is None and rc != 0:
        why = f"exit status {rc}"
    if why is not None:
        tail = "".join(err).strip().splitlines()
        why += "; stderr: " + " | ".join(x[-300:] for x in tail[-6:])
    return rows, why


def candidates_for(info: dict[str, Any], train_cap: int, names: Sequence[str],
                   backbone: str | None, settings: str = "") -> list[str]:
    """`benchmarks.recipe_search` candidates: ``names`` on the bundle's backbone (or
    ``backbone``) at the bundle's training cap (its splits then need no rebuild), then the
    `EXTRA` rows of the backbones the bundle also carries; ``settings`` (``key=value,...``)
    apply to every one."""
    more = f",{settings}" if settings else ""
    bb = backbone or info["backbone"]
    out = [f"{n}:backbone={bb},train_cap={train_cap}{more}" for n in names]
    for extra in info.get("extra_backbones") or ():
        out += [f"{n}:backbone={extra},train_cap={train_cap}{more}" for n in EXTRA.get(extra, ())]
    return out


def choose(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The trained candidate of highest pooled ID accuracy (ties: the faster), with the
    zero-shot row of its backbone beside it; None where no trained candidate finished."""
    def done(r: dict[str, Any]) -> bool:
        return "acc_pooled" in r

    trained = [r for r in rows if done(r) and r["epochs"] > 0]
    if not trained:
        why = "; ".join(f"{r['candidate']}: {r.get('skipped') or r.get('diverged')}"
                        for r in rows if not done(r))
        return {"step": "choice", "chosen": None,
                "reason": f"no trained candidate finished: {why or 'no search rows'}"}
    best = max(trained, key=lambda r: (r["acc_pooled"][0], -r["train_seconds"]))
    zero = next((r for r in rows if done(r) and r["epochs"] == 0
                 and r["backbone"] == best["backbone"]), None)
    doms = [k[4:] for k in best if k.startswith("acc_") and k != "acc_pooled"]
    row: dict[str, Any] = {
        "step": "choice", "chosen": best["candidate"], "backbone": best["backbone"],
        "ranked": [[r["candidate"], r["backbone"], r["acc_pooled"][0]]
                   for r in sorted(trained, key=lambda r: -r["acc_pooled"][0])],
        "reason": "highest pooled ID accuracy of the trained candidates"}
    if zero is not None:
        row["over_zero_shot"] = {d: round(best[f"acc_{d}"][0] - zero[f"acc_{d}"][0], 3)
                                 for d in [*doms, "pooled"]}
    return row


def search(bundle: Path, work: Path, out: Path | None, *, budget: float, cpu: bool,
           names: Sequence[str] = CANDIDATES, backbone: str | None = None,
           id_cap: int | None = None, settings: str = "") -> int:
    from uqbench.core.profiles import get_profile

    t0 = time.perf_counter()
    info, env, row = prepare(bundle, work, cpu=cpu)
    emit(row, None if out is None else str(out))
    cands = candidates_for(info, get_profile(info["profile"]).train_cap or 0, names, backbone,
                           settings)
    (work / SEARCH).unlink(missing_ok=True)
    left = budget - (time.perf_counter() - t0)
    args = ["benchmarks.recipe_search", "--profile", info["profile"],
            "--suite", suite_of(info, work), "--cache-dir", str(work / "cache"),
            "--candidates", ";".join(cands), "--out", str(work / SEARCH),
            "--time-budget", f"{max(left - 5, 1):.0f}",
            *(["--id-cap", str(id_cap)] if id_cap else [])]
    rows, why = _python({**env, **({"CUDA_VISIBLE_DEVICES": ""} if cpu else {})}, args,
                        max(left, 1.0), out, {"step": "recipe"})
    emit({"step": "search", "status": "ok" if why is None else "failed", "reason": why,
          "candidates": len(cands), "rows": len(rows),
          "seconds": round(time.perf_counter() - t0, 1)}, None if out is None else str(out))
    emit(choose(rows), None if out is None else str(out))
    return 0 if why is None else 1


def profile(bundle: Path, work: Path, out: Path | None, *, budget: float, cpu: bool,
            graph_s: float = GRAPH_S) -> int:
    from benchmarks import gpu_check
    from benchmarks.recipe_search import BASE, GPU_BASE, parse_candidate
    from uqbench.core.profiles import get_profile

    t0 = time.perf_counter()
    info, env, row = prepare(bundle, work, cpu=cpu)
    emit(row, None if out is None else str(out))
    found = work / SEARCH
    rows = [json.loads(x) for x in found.read_text().splitlines()] if found.is_file() else []
    choice = choose(rows)
    if choice["chosen"] is None:   # the profile's own recipe on the bundle's backbone
        name, cand = "profile", {**parse_candidate("gpu")[1], "backbone": info["backbone"],
                                 "train_cap": get_profile(info["profile"]).train_cap}
        choice["reason"] += f" ({found}); running the profile's own recipe ({GPU_BASE})"
    else:
        best = next(r for r in rows if r["candidate"] == choice["chosen"]
                    and r["backbone"] == choice["backbone"])
        name, cand = best["candidate"], {k: best[k] for k in BASE}
    emit(choice, None if out is None else str(out))
    gpu = not cpu and _cuda()
    conf: dict[str, Any] = {
        "backbone": cand["backbone"], "profile": info["profile"], "suite": suite_of(info, work),
        "caps": None, "models": [] if gpu else ["moe-lora"],
        "scorers": [] if gpu else list(gpu_check.DRY_SCORERS), "seeds": None if gpu else 1,
        "cache": str(work / "cache"), "out": str(work / "runs" / f"gpu-{name}"),
        "threads": None, "compare": True, "cuda_graph": None,
        "recipe": {"candidate": name, **cand}, "gpu": gpu}
    left = budget - (time.perf_counter() - t0)
    line = gpu_check.run_step("gpu", conf, None, gpu, max_seconds=max(left - graph_s, 1.0),
                              env=env)
    emit(line, None if out is None else str(out))
    failed = line["status"] == "failed"
    left = budget - (time.perf_counter() - t0)
    if graph_s <= 0 or left < graph_s:
        emit({"step": "graph_step", "status": "skipped",
              "reason": "--graph-s 0" if graph_s <= 0 else
              f"{left:.0f} s left, under the {graph_s:.0f} s it is given"},
             None if out is None else str(out))
    else:
        bench_env = {**env, "UQBENCH_BENCH_BACKBONE": cand["backbone"],
                     **({"CUDA_VISIBLE_DEVICES": ""} if cpu else {})}
        got, why = _python(bench_env, ["benchmarks", "graph_step"], left, out,
                           {"step": "graph_step", "backbone": cand["backbone"]})
        if why is not None:
            failed = True
            emit({"step": "graph_step", "status": "failed", "reason": why, "rows": len(got)},
                 None if out is None else str(out))
    return 1 if failed else 0


def _cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu_lease",
                                 description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    for name in ("search", "profile"):
        p = sub.add_parser(name, help=f"call {1 if name == 'search' else 2} of the lease")
        p.add_argument("bundle", type=Path, help="the folder the bundle's parts were stashed in")
        p.add_argument("--work", type=Path, default=Path("/tmp/uqbench-lease"),
                       help="unpack here; the second call reuses it (default %(default)s)")
        p.add_argument("--out", type=Path, help="the JSON lines also here")
        p.add_argument("--budget", type=float, default=BUDGET[name],
                       help="seconds this call may take (default %(default)s)")
        p.add_argument("--cpu", action="store_true", help="the dry run on the CPU")
        if name == "search":
            p.add_argument("--candidates", default=",".join(CANDIDATES),
                           help="recipe_search presets, in order (default %(default)s)")
            p.add_argument("--backbone", help="every candidate's backbone (default: the "
                                              "bundle's)")
            p.add_argument("--id-cap", type=int, help="first N ID questions per domain")
            p.add_argument("--set", default="", metavar="KEY=VALUE,...",
                           help="recipe keys set on every candidate (e.g. top=1)")
        else:
            p.add_argument("--graph-s", type=float, default=GRAPH_S,
                           help="seconds kept for graph_step after the run (0: no graph_step; "
                                "default %(default)s)")
    args = ap.parse_args(argv)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
    from uqbench.core.errors import UserError

    try:
        if args.command == "search":
            return search(args.bundle, args.work, args.out, budget=args.budget, cpu=args.cpu,
                          names=[c for c in args.candidates.split(",") if c],
                          backbone=args.backbone, id_cap=args.id_cap, settings=args.set)
        return profile(args.bundle, args.work, args.out, budget=args.budget, cpu=args.cpu,
                       graph_s=args.graph_s)
    except (BundleError, UserError) as exc:
        print(f"gpu-lease: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
