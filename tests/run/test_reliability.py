"""Reliability: a table of bad inputs answered by clear errors before model work; stale cache
entries never reused; two runs sharing one cache; SIGKILL then resume; identical numbers across
cold runs. Real code paths on a tiny random BERT and a small real-data suite."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import builtin_scorers
from tests.support.suites import arc_suite
from uqbench.cli import main
from uqbench.files.cache import StaleCacheWarning
from uqbench.run.runner import RunConfig, run
from uqbench.stats import metrics as M

REPO = Path(__file__).resolve().parents[2]

SUITE = arc_suite()

PLUGINS = {
    "rel_raises": "raise RuntimeError('boom at import')",
    "rel_duplicate": """
        from uqbench import Scorer, register_scorer
        @register_scorer("msp")
        class Again(Scorer):
            def __call__(self, outputs):
                return outputs.logits.max(axis=1)
    """,
    "rel_scorers": """
        import time
        import numpy as np
        from uqbench import Scorer, register_scorer

        @register_scorer("rel_raising")
        class Raising(Scorer):
            def __call__(self, outputs):
                raise ZeroDivisionError("division by zero in my scorer")

        @register_scorer("rel_shape")
        class Shape(Scorer):
            def __call__(self, outputs):
                return np.zeros((outputs.n, 2))

        @register_scorer("rel_nan")
        class NaN(Scorer):
            def __call__(self, outputs):
                return np.full(outputs.n, np.nan)

        @register_scorer("rel_slow")
        class Slow(Scorer):
            def __call__(self, outputs):
                time.sleep(600)   # only an interruption ends this test in time
                return np.zeros(outputs.n)

        @register_scorer("rel_conf")
        class Conf(Scorer):
            def __call__(self, outputs):
                return np.zeros(outputs.n)
            def confidence(self, outputs):
                return np.full(outputs.n, 2.0)

        @register_scorer("rel_field")
        class Field(Scorer):
            requires = frozenset({"logits", "attention_maps"})
            def __call__(self, outputs):
                return np.zeros(outputs.n)

        @register_scorer("rel_late")
        class Late(Scorer):  # passes the 8-example probe, fails on the real splits
            def __call__(self, outputs):
                if outputs.n > 8:
                    raise ValueError("cannot handle more than 8 examples")
                return np.zeros(outputs.n)
    """,
}


def _data() -> Path:
    from tests.conftest import data_dir

    d = data_dir()
    if d is None:
        pytest.skip("real data not found: set UQBENCH_DATA to a copy of shared/data")
    return d


@pytest.fixture(scope="module")
def root(tmp_path_factory, real_data):  # real_data (tests/conftest.py): the slow tier
    root = tmp_path_factory.mktemp("reliability")
    (root / "tiny.yaml").write_text(SUITE)
    for name, src in PLUGINS.items():
        (root / f"{name}.py").write_text(textwrap.dedent(src))
    (root / "afile").write_text("not a folder")
    yaml_cases = {
        "syntax.yaml": "name: x\ndomains: {d: [unclosed\n",
        "nodomains.yaml": "name: x\ndomains: {}\n",
        "source.yaml": SUITE.replace(
            "source: arc-easy, split: train", "source: arc-eassy, split: train"
        ),
        "cap.yaml": SUITE.replace("train: 12,", "train: -3,"),
        "key.yaml": SUITE + "shuffle: true\n",
        "role.yaml": SUITE.replace("    shift: {source: arc-challenge, split: test}\n", ""),
    }
    for name, text in yaml_cases.items():
        (root / name).write_text(text)
    # finished-looking run folders with broken pieces
    for name, text in {"corrupt": "{not json\n", "empty": "", "foreign": '{"a": 1}\n',
                       "noscores": json.dumps({"method": "m/g/s", "model": "m", "gate": "g",
                                               "scorer": "s", "domain": "pooled"}) + "\n"}.items():
        (root / "runs" / name).mkdir(parents=True)
        (root / "runs" / name / "results.jsonl").write_text(text)
    (root / "runs" / "other").mkdir()
    (root / "runs" / "other" / "results.jsonl").write_text(
        (root / "runs/noscores/results.jsonl").read_text()
    )
    (root / "runs" / "other" / "run.json").write_text(json.dumps({"config": {"suite": "else"}}))
    # data folders: one file corrupted, one file missing (the rest link to the real copies)
    real = real_data
    for name in ("data-corrupt", "data-missing"):
        d = root / name
        d.mkdir()
        for entry in real.iterdir():
            if entry.name != "arc-easy":
                (d / entry.name).symlink_to(entry)
        (d / "arc-easy").mkdir()
        for f in (real / "arc-easy").iterdir():
            (d / "arc-easy" / f.name).symlink_to(f)
    target = root / "data-corrupt" / "arc-easy" / "llm-adapters_train.json"
    text = target.read_text()
    target.unlink()
    target.write_text(text.replace("Which", "Whihc", 1))
    (root / "data-missing" / "arc-easy" / "llm-adapters_test.json").unlink()
    sys.path.insert(0, str(root))
    yield root
    sys.path.remove(str(root))


RUN = ["run", "--suite", "{root}/tiny.yaml", "--profile", "smoke", "--backbone", "tiny-bert",
       "--out", "{root}/out", "--cache-dir", "{root}/cache", "--data-dir", "{data}",
       "--no-figures", "--no-progress"]

#: (id, extra argv for `uqbench run` or a full argv, message pattern)
CASES = [
    # command-line flags
    ("profile", ["--profile", "quick"], r"unknown profile 'quick'; valid: cpu, full, gpu, smoke"),
    ("scorer", ["--scorers", "mps"], r"unknown scorer 'mps' \(did you mean 'msp'"),
    ("backbone", ["--backbone", "minilmm"], r"unknown backbone 'minilmm'"),
    ("backbone-dir", ["--backbone", "./no/such/model"], r"backbone folder .* does not exist"),
    ("suite", ["--suite", "pooledd"], r"unknown suite 'pooledd'"),
    ("experiment", ["--experiment", "ablations"], r"unknown experiment 'ablations'"),
    ("seeds", ["--seeds", "0"], r"--seeds 0: give at least 1"),
    ("seeds-type", ["--seeds", "two"], r"argument --seeds: invalid int value: 'two'"),
    ("budget-low", ["--budget", "0"], r"--budget 0: .* must lie in \[1, 16\]"),
    ("budget-high", ["--budget", "50"], r"--budget 50: .* must lie in \[1, 16\]"),
    ("timeout", ["--scorer-timeout", "-1"], r"--scorer-timeout -1: give a positive number"),
    ("out-file", ["--out", "{root}/afile"], r"--out .*afile is a file, not a folder"),
    ("cache-file", ["--cache-dir", "{root}/afile"], r"--cache-dir .*afile is a file"),
    ("out-other-run", ["--out", "{root}/runs/other"], r"holds the results of a different run"),
    ("data-dir", ["--data-dir", "{root}/nope"], r"data folder .*nope.* does not exist"),
    ("list", ["list", "models-and-more"], r"argument what: invalid choice"),
    ("report-missing", ["report", "{root}/nope"], r"results.jsonl not found: .* not a finished"),
    ("report-corrupt", ["report", "{root}/runs/corrupt"], r"not valid JSON lines.*redo the run"),
    ("report-empty", ["report", "{root}/runs/empty"], r"holds no results"),
    ("report-foreign", ["report", "{root}/runs/foreign"], r"lack the column\(s\) method"),
    ("plot-scores", ["plot", "{root}/runs/noscores"], r"scores.npz is missing.*uqbench run"),
    ("data-build", ["data", "build", "--suite", "nope"], r"unknown suite 'nope'"),
    # suite YAML files
    ("yaml-missing", ["--suite", "{root}/nofile.yaml"], r"nofile.yaml.*does not exist"),
    ("yaml-syntax", ["--suite", "{root}/syntax.yaml"], r"syntax.yaml: invalid YAML"),
    ("yaml-domains", ["--suite", "{root}/nodomains.yaml"], r"'domains' must be a non-empty"),
    ("yaml-source", ["--suite", "{root}/source.yaml"], r"unknown data source 'arc-eassy'"),
    ("yaml-cap", ["--suite", "{root}/cap.yaml"], r"cap for 'train' must be a positive integer"),
    ("yaml-key", ["--suite", "{root}/key.yaml"], r"unknown key\(s\) 'shuffle'"),
    ("yaml-role", ["--suite", "{root}/role.yaml"], r"missing role\(s\) shift"),
    # data files
    (
        "data-corrupt",
        ["--data-dir", "{root}/data-corrupt"],
        r"llm-adapters_train.json: sha256 .* does not match",
    ),
    (
        "data-missing",
        ["--data-dir", "{root}/data-missing"],
        r"data file 'arc-easy/llm-adapters_test.json' not found",
    ),
    # plugin modules and scorers
    ("plugin-missing", ["--plugin", "rel_nowhere"], r"'rel_nowhere' failed to import"),
    (
        "plugin-import",
        ["--plugin", "rel_raises"],
        r"'rel_raises' failed to import: RuntimeError: boom",
    ),
    ("plugin-duplicate", ["--plugin", "rel_duplicate"], r"'rel_duplicate' failed to import.*msp"),
    (
        "scorer-raises",
        ["--plugin", "rel_scorers", "--scorers", "rel_raising"],
        r"scorer 'rel_raising' raised while computing uncertainty: ZeroDivisionError",
    ),
    (
        "scorer-shape",
        ["--plugin", "rel_scorers", "--scorers", "rel_shape"],
        r"scorer 'rel_shape' returned uncertainty of shape \(8, 2\); expected \(8,\)",
    ),
    (
        "scorer-nan",
        ["--plugin", "rel_scorers", "--scorers", "rel_nan"],
        r"scorer 'rel_nan' returned NaN/inf uncertainty for 8 of 8",
    ),
    (
        "scorer-slow",
        ["--plugin", "rel_scorers", "--scorers", "rel_slow", "--scorer-timeout", "0.5"],
        r"scorer 'rel_slow' took longer than 0.5 s.*--scorer-timeout",
    ),
    (
        "scorer-confidence",
        ["--plugin", "rel_scorers", "--scorers", "rel_conf"],
        r"scorer 'rel_conf' returned confidence outside \[0, 1\]",
    ),
    (
        "scorer-field",
        ["--plugin", "rel_scorers", "--scorers", "rel_field"],
        r"scorer 'rel_field' needs field\(s\) 'attention_maps'",
    ),
]


def _argv(extra: list[str], root: Path) -> list[str]:
    full = extra if extra[0] in ("list", "report", "plot", "data") else RUN + extra
    return [a.format(root=root, data=_data()) for a in full]


@pytest.mark.parametrize("case, extra, pattern", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_a_clear_error_before_model_work(root, case, extra, pattern, capsys,
                                                      monkeypatch):
    from baselines.engine import TorchEngine

    def no_model_work(self):
        raise AssertionError(f"{case}: model work started before the bad input was reported")

    monkeypatch.setattr(TorchEngine, "backbone", no_model_work)
    t0 = time.perf_counter()
    try:
        rc = main(_argv(extra, root))
    except SystemExit as exc:  # argparse's own usage errors
        rc = exc.code
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err
    assert err.startswith(("uqbench: error:", "usage: uqbench")), err
    import re

    assert re.search(pattern, err, re.DOTALL), err
    if case == "scorer-slow":
        assert time.perf_counter() - t0 < 300  # interrupted, not waited for (it sleeps 600 s)
    assert not (root / "out" / "results.jsonl").exists()


def test_matrix_has_at_least_thirty_cases():
    assert len({c[0] for c in CASES}) == len(CASES) >= 30


@pytest.mark.parametrize(
    "call, pattern",
    [
        (
            lambda: M.expected_calibration_error(np.array([0.5, 1.5]), np.array([1, 0])),
            r"confidence.*\[0, 1\]",
        ),
        (
            lambda: M.expected_calibration_error(np.array([0.5, 0.7]), np.array([1, 0, 1])),
            r"length|shape",
        ),
        (lambda: M.ood_auroc(np.array([0.1, 0.2]), np.array([])), r"empty|at least one"),
        (lambda: M.aurc(np.array([0.1, np.nan]), np.array([1, 0])), r"NaN|finite"),
        (lambda: M.expected_calibration_error(np.array([0.5]), np.array([1]), n_bins=0), r"n_bins"),
    ],
    ids=["ece-range", "ece-length", "auroc-empty", "aurc-nan", "ece-bins"],
)
def test_metric_inputs_are_named_in_errors(call, pattern):
    with pytest.raises(ValueError, match=pattern):
        call()


# -- runs on the tiny model: stale entries, determinism, concurrency, crash-resume --------------

def _cfg(root: Path, name: str, **kw) -> RunConfig:
    base = {"suite": str(root / "tiny.yaml"), "profile": "smoke", "backbone": "tiny-bert",
            "scorers": builtin_scorers(),
            "out": root / f"out-{name}", "cache_dir": root / f"cache-{name}", "data_dir": _data(),
            "figures": False, "progress": False}
    return RunConfig(**{**base, **kw})


def _cli(root: Path, name: str, cache: str) -> list[str]:
    return [sys.executable, "-m", "uqbench", "run", "--suite", str(root / "tiny.yaml"),
            "--profile", "smoke", "--backbone", "tiny-bert", "--out", str(root / f"out-{name}"),
            "--cache-dir", str(root / cache), "--data-dir", str(_data()), "--no-figures",
            "--no-progress"]


def _env() -> dict[str, str]:
    # one thread, as in-process (conftest): the same reduction order gives the same bits
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}


def _numbers(out: Path) -> str:
    return (out / "results.csv").read_text()


@pytest.fixture(scope="module")
def cold(root):
    return run(_cfg(root, "cold"))


def test_stale_entries_are_recomputed_never_reused(root, cold, monkeypatch):
    import uqbench.run.runner
    from uqbench.core.profiles import get_profile

    with warnings.catch_warnings():
        warnings.simplefilter("error", StaleCacheWarning)
        warm = run(_cfg(root, "cold"))
    assert warm.stats.total() == 0 and warm.stats.cache_hits > 0
    # a changed protocol version: every model retrained, every pass recomputed
    import baselines.engine

    for module in (uqbench.run.runner, baselines.engine):  # rows and run.json; the cache keys
        monkeypatch.setattr(module, "PROTOCOL_VERSION", "test-bumped")
    bumped = run(_cfg(root, "cold", out=root / "out-bumped"))
    assert bumped.stats.cache_hits == 0 and bumped.stats.total() == cold.stats.total()
    assert bumped.stats.trained == cold.stats.trained
    monkeypatch.undo()
    # a changed training config (epochs) retrains the models and recomputes their passes
    prof = get_profile("smoke")
    monkeypatch.setattr(uqbench.run.runner, "get_profile",
                        lambda name: prof.__class__(**{**prof.__dict__, "epochs": prof.epochs + 1}))
    more = run(_cfg(root, "cold", out=root / "out-epochs"))
    assert more.stats.trained == cold.stats.trained and more.stats.total() == cold.stats.total()
    monkeypatch.undo()
    # changed data (another cap -> another split hash): the evaluation splits are recomputed;
    # the unchanged calib and train splits' records (train: the feature scorers' reference)
    # are read back
    (root / "tiny-cap.yaml").write_text(SUITE.replace("id: 10, shift: 10", "id: 9, shift: 9"))
    capped = run(_cfg(root, "cold", suite=str(root / "tiny-cap.yaml"), out=root / "out-cap"))
    evaluated = {k: v for k, v in cold.stats.passes.items()
                 if not k[3].endswith(("/calib", "/train"))}
    eval_passes = sum(evaluated.values())
    assert capped.stats.trained == [] and dict(capped.stats.passes) == evaluated
    assert capped.stats.total() == eval_passes < cold.stats.total()


def test_late_plugin_failure_names_it_and_keeps_finished_work(root, cold):
    from uqbench.core.errors import PluginError

    with pytest.raises(PluginError, match="scorer 'rel_late' raised.*more than 8 examples"):
        run(_cfg(root, "cold", plugins=("rel_scorers",), scorers=("msp", "rel_late"),
                 out=root / "out-late"))
    assert not (root / "out-late" / "results.jsonl").exists()
    assert (root / "out-cold" / "results.jsonl").exists()  # an earlier finished run is untouched
    assert any((root / "cache-cold" / "forward").glob("*.npz"))


#: a cold `uqbench run` of the tiny suite on tiny-bert in a subprocess, on 2 quiet cores
#: (imports included); timeouts are `timeout_for` of it
QUIET_TINY_RUN_S = 30.0


def test_two_concurrent_cold_runs_share_a_cache_and_match_an_in_process_run(root, cold, procs):
    ps = [procs.start(_cli(root, f"conc{i}", "cache-shared"), env=_env(), cwd=root)
          for i in range(2)]
    for i, p in enumerate(ps):   # two at once on 2 cores: each may take twice its quiet time
        _, err = procs.wait(p, what=f"concurrent cold run {i}", quiet_s=2 * QUIET_TINY_RUN_S,
                            watch=[root / "cache-shared", root / f"out-conc{i}"])
        assert p.returncode == 0, err[-2000:]
    # same seed -> identical numbers across cold runs (in-process, and two processes at once)
    assert _numbers(root / "out-conc0") == _numbers(root / "out-conc1") == _numbers(cold.out)
    cache = root / "cache-shared"
    assert not list(cache.rglob("*.tmp")), "a temporary file was left behind"
    with warnings.catch_warnings():
        warnings.simplefilter("error", StaleCacheWarning)  # every entry whole and matching
        warm = run(_cfg(root, "conc-warm", cache_dir=cache))
    assert warm.stats.total() == 0 and warm.stats.trained == []


def test_sigkill_mid_run_then_rerun_reuses_finished_entries(root, cold, procs):
    from tests.conftest import timeout_for, written

    cache = root / "cache-killed"
    p = procs.start(_cli(root, "killed", "cache-killed"), env=_env(), cwd=root,
                    stdout=subprocess.DEVNULL)
    limit = timeout_for(QUIET_TINY_RUN_S)
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and p.poll() is None:
        if len(list((cache / "forward").glob("*.npz"))) >= 3:
            break
        time.sleep(0.05)
    else:
        if p.poll() is None:   # still running, but not 3 forward records in `limit` seconds
            os.kill(p.pid, signal.SIGKILL)
            p.wait()
            pytest.fail(f"the run wrote fewer than 3 forward records in {limit:.0f} s; where it "
                        f"was: {written([cache])}\n--- stderr tail ---\n"
                        f"{p.stderr.read()[-2000:]}", pytrace=False)
    assert p.poll() is None, "the run finished before it could be killed: " + p.stderr.read()[-500:]
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    finished = {f.name for f in (cache / "forward").glob("*.npz")}
    assert len(finished) >= 3 and not (root / "out-killed" / "results.jsonl").exists()
    killed_tmp = [t for t in cache.rglob("*.tmp") if f".{p.pid}." in t.name]
    with warnings.catch_warnings():
        warnings.simplefilter("error", StaleCacheWarning)  # no partial file under a final name
        resumed = run(_cfg(root, "killed", cache_dir=cache))
    assert resumed.stats.cache_hits >= len(finished)
    # every forward record is either reused or computed once
    assert resumed.stats.total() + resumed.stats.cache_hits == cold.stats.total()
    assert _numbers(resumed.out) == _numbers(cold.out)
    assert not any(t.exists() for t in killed_tmp), "the killed writer's temporaries were kept"
    shutil.rmtree(cache, ignore_errors=True)


def test_every_row_records_protocol_and_split_hashes(cold):
    from uqbench.files.cache import PROTOCOL_VERSION

    meta = json.loads((cold.out / "run.json").read_text())
    hashes = {v["hash"] for k, v in meta["splits"].items() if k.endswith(("/id", "/shift"))}
    for row in cold.rows:
        assert row["protocol"] == PROTOCOL_VERSION
        assert set(row["split_hashes"].split(",")) == hashes  # one domain: pooled = science
