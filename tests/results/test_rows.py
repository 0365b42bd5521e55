"""Scoring in worker processes (`uqbench.results.rows.score_all` with ``workers`` > 1): the same
files as one process, byte for byte; the workers' warnings re-emitted and their fallbacks
recorded as one process would; a scorer's error or timeout stops the run with the serial
message; a scorer that cannot be sent to a worker is scored in process, said so; a warm rerun
reads every row from the shared cache."""
from __future__ import annotations

import dataclasses
import json
import os
import textwrap
import warnings
from pathlib import Path

import pytest

from tests.conftest import builtin_scorers
from tests.io.test_recordset import record_set
from uqbench.core.errors import ConfigError, FallbackWarning, PluginError
from uqbench.core.scorer import Scorer, register_scorer
from uqbench.results.rows import check_workers, score_workers
from uqbench.run.score_records import ScoreConfig, plan_methods, score

#: a plugin module (imported by path, in the parent and in each worker): a scorer that warns
#: and records a fallback on real records (not on the 8-example probe), one that raises, one
#: that hangs
PLUGIN = """
    import time
    import warnings
    import numpy as np
    from uqbench import Scorer, register_scorer
    from uqbench.core.errors import record_fallback

    class PluginNote(UserWarning):
        pass

    @register_scorer("sw_fallback")
    class Fallback(Scorer):
        def __call__(self, outputs):
            if outputs.n > 8:
                warnings.warn(f"plugin note on {outputs.n} examples", PluginNote)
                record_fallback("plugin step", f"{outputs.n} examples", "did something else")
            return 1.0 - self.predictive(outputs).max(axis=1)

    @register_scorer("sw_raising")
    class Raising(Scorer):
        def __call__(self, outputs):
            if outputs.n > 8:
                raise ValueError(f"no good on {outputs.n} examples")
            return np.zeros(outputs.n)

    @register_scorer("sw_slow")
    class Slow(Scorer):
        def __call__(self, outputs):
            if outputs.n > 8:
                time.sleep(600)  # only the time limit ends this test in time
            return np.zeros(outputs.n)
"""
FILES = ("results.csv", "results.jsonl", "scores.npz")


@pytest.fixture(scope="module")
def plugin(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("plugin") / "sw_scorers.py"
    path.write_text(textwrap.dedent(PLUGIN))
    return str(path)


def _score(out: Path, plugin: str, workers: int | str, scorers: tuple[str, ...], seeds: int = 2,
           **kw) -> tuple[dict, list[tuple[str, str, str, int]]]:
    """``score`` of the test records; run.json and every warning (category, message, place)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        score(record_set(seeds), ScoreConfig(out=out, scorers=scorers, plugins=(plugin,),
                                            figures=False, score_workers=workers, **kw))
    meta = json.loads((out / "run.json").read_text())
    return meta, [(w.category.__name__, str(w.message), w.filename, w.lineno) for w in caught]


def _entries(cache: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_ino, p.stat().st_mtime_ns) for p in cache.rglob("*")}


@pytest.mark.slow   # starts worker processes: the fast tier leaves subprocesses out
def test_workers_write_the_serial_files_warnings_and_fallbacks_and_share_the_cache(
        tmp_path, plugin, monkeypatch):
    import uqbench.results.conformal_risk as CR
    import uqbench.results.evaluate as EV

    names = (*builtin_scorers(), "sw_fallback")
    # as in a fresh process: conformal notes are warned once per process, and an interval
    # memoised by an earlier test would warn nothing
    for module, name, empty in ((CR, "WARNED", set), (EV, "INTERVALS", dict)):
        monkeypatch.setattr(module, name, empty())
    serial, serial_w = _score(tmp_path / "serial", plugin, 1, names)
    monkeypatch.setattr(CR, "WARNED", set())
    par, par_w = _score(tmp_path / "par", plugin, 2, names, cache_dir=tmp_path / "cache")
    assert (serial["score_workers"], par["score_workers"]) == (1, 2)
    for f in FILES:
        assert (tmp_path / "serial" / f).read_bytes() == (tmp_path / "par" / f).read_bytes(), f
    # every warning, in order and at its place; the plugin's own and the conformal notes among
    # them, each once where one process warns once
    assert par_w == serial_w
    kinds = {w[0] for w in par_w}
    assert {"PluginNote", "FallbackWarning", "ConformalNote"} <= kinds
    assert sum(w[1].startswith("plugin step (30 examples)") for w in par_w) == 1
    assert par["fallbacks"] == serial["fallbacks"] != []
    assert {"what": "plugin step", "where": "26 examples",
            "reason": "did something else"} in par["fallbacks"]
    # a warm rerun reads every row from the cache the workers wrote: no entry written again
    before = _entries(tmp_path / "cache")
    assert any(p.endswith(".npz") for p in before)
    _score(tmp_path / "warm", plugin, 2, names, cache_dir=tmp_path / "cache")
    assert _entries(tmp_path / "cache") == before
    for f in FILES:
        assert (tmp_path / "warm" / f).read_bytes() == (tmp_path / "serial" / f).read_bytes(), f


@pytest.mark.slow   # starts worker processes
@pytest.mark.parametrize("scorer, timeout, message", [
    ("sw_raising", 300.0, (r"^scorer 'sw_raising' raised while computing uncertainty: "
                           r"ValueError: no good on \d+ examples$")),
    ("sw_slow", 0.5, r"^scorer 'sw_slow' took longer than 0.5 s to compute uncertainty"),
])
def test_a_scorer_error_in_a_worker_stops_with_the_serial_message(tmp_path, plugin, scorer,
                                                                  timeout, message):
    errors = []
    for workers in (1, 2):
        with pytest.raises(PluginError, match=message) as exc:
            _score(tmp_path / f"w{workers}", plugin, workers, (scorer,), seeds=1,
                   scorer_timeout=timeout)
        errors.append(str(exc.value))
        assert not (tmp_path / f"w{workers}").exists()
    assert errors[0] == errors[1]


def test_a_scorer_that_cannot_be_sent_is_scored_in_process_and_said_so(tmp_path, plugin):
    @register_scorer("sw_local")
    class Local(Scorer):  # a local class: pickle cannot name it
        def __call__(self, outputs):
            return 1.0 - self.predictive(outputs).max(axis=1)

    meta, caught = _score(tmp_path / "o", plugin, 2, ("msp", "sw_local"), seeds=1)
    assert [w[1] for w in caught if w[0] == "FallbackWarning"] == [(
        "scoring in worker processes (scorer 'sw_local'): the scorer cannot be sent to another "
        "process (Can't pickle local object 'test_a_scorer_that_cannot_be_sent_is_scored_in_"
        "process_and_said_so.<locals>.Local'); scored in this process instead, one method after "
        "another. Define its class in an importable module and load it with --plugin MODULE")]
    assert meta["score_workers"] == 1
    assert [f["what"] for f in meta["fallbacks"]] == ["scoring in worker processes"]
    assert "sw_local" in meta["fallbacks"][0]["where"]
    _score(tmp_path / "serial", plugin, 1, ("msp", "sw_local"), seeds=1)
    for f in FILES:
        assert (tmp_path / "o" / f).read_bytes() == (tmp_path / "serial" / f).read_bytes(), f

    Local.__module__ = "__main__"  # picklable here, but a spawned worker cannot import it
    rs = record_set(1)
    ms, _ = plan_methods(rs, ScoreConfig(out=tmp_path / "x", scorers=("msp", "sw_local")))
    with pytest.warns(FallbackWarning, match="defined in __main__"):
        assert score_workers(2, ms, rs.outputs, 50) == 1


def test_auto_scores_small_runs_in_process_and_caps_at_tasks_and_cores(tmp_path):
    rs = record_set(1)
    ms, _ = plan_methods(rs, ScoreConfig(out=tmp_path / "x", scorers=("msp", "entropy")))
    assert score_workers("auto", ms, rs.outputs, 50) == 1  # 4 methods x 152 examples x 50
    cores = len(os.sched_getaffinity(0))
    tasks = len(ms) * (2 + 1)  # 4 methods x (science, math, pooled)
    assert score_workers("auto", ms, rs.outputs, 10**6) == min(cores, tasks)
    assert score_workers(8, ms, rs.outputs, 50) == 8
    assert score_workers(50, ms, rs.outputs, 50) == tasks


def test_tasks_keep_a_pairs_methods_together_unless_workers_would_idle(tmp_path):
    from uqbench.results.rows import task_groups

    rs = record_set(1)
    ms, _ = plan_methods(rs, ScoreConfig(out=tmp_path / "x", scorers=("msp", "entropy",
                                                                        "margin")))
    names = [[m.name for m in g] for g in task_groups(ms, 2, 3)]
    assert names == [[m.name for m in ms if m.pair == p] for p in rs.pairs]
    # one domain and one pair for 3 workers: its methods in turns over 3 tasks
    one = [m for m in ms if m.pair == rs.pairs[1]]
    assert [[m.scorer.name for m in g] for g in task_groups(one, 3, 1)] == [
        ["msp"], ["entropy"], ["margin"]]
    assert [[m.scorer.name for m in g] for g in task_groups(one, 2, 1)] == [
        ["msp", "margin"], ["entropy"]]
    assert sum(map(len, task_groups(one, 9, 1))) == 3
    for bad in (0, -1, "4", 1.5, True):
        with pytest.raises(ConfigError, match="--score-workers"):
            check_workers(bad)


def test_a_run_scored_by_workers_writes_the_files_of_one_process(tmp_path, real_data):
    """`uqbench run` on tiny-bert (real data: the slow tier), scored in this process, then
    again from the same forward records by two workers."""
    import shutil

    from tests.support.suites import arc_suite
    from uqbench.run.runner import RunConfig, run

    (tmp_path / "tiny.yaml").write_text(arc_suite())
    base = {"suite": str(tmp_path / "tiny.yaml"), "profile": "smoke", "backbone": "tiny-bert",
            "scorers": builtin_scorers(), "data_dir": real_data, "figures": False,
            "progress": False}
    run(RunConfig(out=tmp_path / "serial", cache_dir=tmp_path / "cache", score_workers=1,
                  **base))
    # the models and forward records without the memoised rows: every row computed again
    shutil.copytree(tmp_path / "cache", tmp_path / "cache2", ignore=shutil.ignore_patterns(
        "evaluate", "recalibrate", "conformal", "risk"))
    par = run(RunConfig(out=tmp_path / "par", cache_dir=tmp_path / "cache2", score_workers=2,
                        **base))
    assert par.stats.total() == 0 and par.stats.trained == []
    assert json.loads((tmp_path / "par" / "run.json").read_text())["score_workers"] == 2
    for f in FILES:
        assert (tmp_path / "serial" / f).read_bytes() == (tmp_path / "par" / f).read_bytes(), f


def one_domain(rs):
    """``rs`` cut to its first domain."""
    d = rs.domains[0]

    def mine(split: str) -> bool:
        return split.split("/")[0] == d

    refs = rs.refs
    refs = dataclasses.replace(
        refs, domains=(d,), n_choices={k: v for k, v in refs.n_choices.items() if mine(k)},
        options_only={k: v for k, v in refs.options_only.items() if mine(k)},
        hashes={k: v for k, v in refs.hashes.items() if mine(k)})
    return dataclasses.replace(rs, outputs={k: o for k, o in rs.outputs.items() if mine(k[1])},
                               refs=refs)


def test_pooled_over_one_domain_is_that_domain_scored_once(tmp_path, monkeypatch):
    import numpy as np

    from uqbench.results import rows as R

    rs = one_domain(record_set(2))
    calls = []
    evaluate = R.evaluate_cached
    monkeypatch.setattr(R, "evaluate_cached", lambda *a, **k: calls.append(1) or evaluate(*a, **k))
    score(rs, ScoreConfig(out=tmp_path / "run", scorers=("msp", "entropy"), figures=False,
                          score_workers=1))
    rows = [json.loads(line) for line in (tmp_path / "run" / "results.jsonl").read_text()
            .splitlines()]
    methods = [r for r in rows
               if r["domain"] == rs.domains[0] and r["scorer"] in ("msp", "entropy")]
    assert len(calls) == len(methods) == 4   # 2 pairs x 2 scorers, once each
    pooled = {r["method"]: r for r in rows if r["domain"] == "pooled"}
    for r in methods:
        assert {**r, "domain": "pooled"} == pooled[r["method"]]
    with np.load(tmp_path / "run" / "scores.npz") as z:
        keys = [k for k in z.files if k.split("|")[1] == rs.domains[0]]
        assert keys and sorted(k for k in z.files if k.split("|")[1] == "pooled") == sorted(
            k.replace(f"|{rs.domains[0]}|", "|pooled|") for k in keys)
        for k in keys:
            np.testing.assert_array_equal(z[k], z[k.replace(f"|{rs.domains[0]}|", "|pooled|")])


@pytest.mark.slow   # starts worker processes
def test_workers_score_one_domain_as_one_process(tmp_path):
    rs = one_domain(record_set(2))
    rs = dataclasses.replace(rs, pairs=rs.pairs[1:])   # one pair: its methods split over tasks
    for workers in (1, 3):
        score(rs, ScoreConfig(out=tmp_path / str(workers), scorers=("msp", "entropy"),
                              figures=False, score_workers=workers))
    assert json.loads((tmp_path / "3" / "run.json").read_text())["score_workers"] == 2
    for f in FILES:
        assert (tmp_path / "1" / f).read_bytes() == (tmp_path / "3" / f).read_bytes(), f
