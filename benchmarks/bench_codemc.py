"""Code-MC build: one process per candidate (the reference path) vs one sandboxed fork server per
problem (`uqbench.data.sandbox.SandboxSession`), on real MBPP problems, in one run.

The first UQBENCH_BENCH_CODEMC_N (default 30) MBPP test problems of the data folder
(``UQBENCH_DATA``) are built with seed 0 by both paths, problem by problem, alternating which
goes first (so both see the same load). Every sandboxed run is logged: a row per path gives the
build time, the candidates run, seconds per candidate (all; and those that end by themselves,
which is what a process start costs), the candidates stopped by their time budget with their
wall and budget-clock seconds (the session's budget is CPU time: under load a looping mutant
takes longer in wall time to use it up), and the builder's own seconds outside the sandbox; the
``compare`` row gives the speed-ups and whether records, build statistics and each candidate's
verdict are the same. Target: the session path at least 3x faster per finished
candidate, with the same verdicts.
"""
from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

from uqbench.data.mc.code import CodeProblem, code_mc
from uqbench.data.sandbox import Sandbox, SandboxResult, SandboxSession
from uqbench.data.sources import load_source
from uqbench.data.sources.code import mbpp_problem

TARGET_SPEEDUP = 3.0
PATHS = ("process", "session")


class RecordingSandbox(Sandbox):
    """A `Sandbox` that logs (program, result, seconds the call took) of every run, its
    sessions' included."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.log: list[tuple[str, SandboxResult, float]] = []

    def run(self, code: str, *, timeout_s: float | None = None) -> SandboxResult:
        t = time.perf_counter()
        res = super().run(code, timeout_s=timeout_s)
        self.log.append((code, res, time.perf_counter() - t))
        return res

    def session(self) -> SandboxSession:
        return _RecordingSession(self)


class _RecordingSession(SandboxSession):
    sandbox: RecordingSandbox

    def run(self, code: str, *, timeout_s: float | None = None) -> SandboxResult:
        t = time.perf_counter()
        res = super().run(code, timeout_s=timeout_s)
        self.sandbox.log.append((code, res, time.perf_counter() - t))
        return res


def build_both(problems: list[CodeProblem], seed: int = 0) -> dict[str, dict[str, Any]]:
    """Build each problem by both paths, as the suites do (`code_mc` with a sandbox of 1
    worker); per path: seconds, and per problem the (record, stats) and the run log."""
    out: dict[str, dict[str, Any]] = {p: {"seconds": 0.0, "built": [], "logs": []} for p in PATHS}
    for i, problem in enumerate(problems):
        for path in PATHS if i % 2 == 0 else PATHS[::-1]:
            sb = RecordingSandbox(workers=1)
            t = time.perf_counter()
            built = code_mc(problem, seed=seed, sandbox=sb,
                            per_candidate_process=path == "process")
            out[path]["seconds"] += time.perf_counter() - t
            out[path]["built"].append(built)
            out[path]["logs"].append(sb.log)
    return out


def run() -> Iterator[dict[str, object]]:
    n = int(os.environ.get("UQBENCH_BENCH_CODEMC_N", "30"))
    load = os.getloadavg()[0]
    raws = [it.raw or {} for it in load_source("mbpp", "test").items[:n]]
    both = build_both([mbpp_problem(r) for r in raws])
    finished = {}  # seconds per candidate that ends by itself (not stopped by its budget)
    for path in PATHS:
        b = both[path]
        runs = [(res, s) for log in b["logs"] for _, res, s in log]
        done = [s for res, s in runs if not res.killed]
        stopped = [(res, s) for res, s in runs if res.killed]
        finished[path] = sum(done) / max(1, len(done))
        yield {"name": f"code_mc_build_{path}", "problems": len(raws), "candidates": len(runs),
               "seconds": round(b["seconds"], 2),
               "s_per_candidate": round(b["seconds"] / max(1, len(runs)), 4),
               "s_per_finished_candidate": round(finished[path], 4),
               "stopped_by_budget": len(stopped),
               "stopped_wall_s": round(sum(s for _, s in stopped), 2),
               "stopped_spent_s": round(sum(r.spent_s for r, _ in stopped), 2),
               "builder_s": round(b["seconds"] - sum(s for _, s in runs), 2),
               "passed": sum(r.passed for r, _ in runs),
               "built": sum(rec is not None for rec, _ in b["built"]),
               "load_avg_1m_at_start": load}
    old, new = both["process"], both["session"]
    verdicts = [(code, a.passed, b.passed)
                for la, lb in zip(old["logs"], new["logs"], strict=False)
                for (code, a, _), (code_b, b, _) in zip(la, lb, strict=False) if code == code_b]
    ratio = finished["process"] / finished["session"]
    same = (all(len(la) == len(lb) for la, lb in zip(old["logs"], new["logs"], strict=False))
            and len(verdicts) == sum(map(len, old["logs"]))
            and all(a == b for _, a, b in verdicts))
    yield {"name": "code_mc_build_compare", "problems": len(raws),
           "ratio_s_per_finished_candidate_process_over_session": round(ratio, 2),
           "ratio_build_s_process_over_session": round(old["seconds"] / new["seconds"], 2),
           "same_candidates_and_verdicts": same,
           "verdicts_compared": len(verdicts),
           "verdicts_differing": sum(a != b for _, a, b in verdicts),
           "same_records": [r and r.to_json() for r, _ in old["built"]]
           == [r and r.to_json() for r, _ in new["built"]],
           "same_stats": [s for _, s in old["built"]] == [s for _, s in new["built"]],
           "target": f">= {TARGET_SPEEDUP:.0f}x per finished candidate, same verdicts",
           "met": same and ratio >= TARGET_SPEEDUP, "load_avg_1m_at_start": load}
