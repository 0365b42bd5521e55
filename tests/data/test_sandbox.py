"""The code sandbox: pass/fail, time and memory limits, fork bombs, file writes, network."""
from __future__ import annotations

import glob
import os
import signal
import socket
import sys
import tempfile
import time

import pytest

from uqbench.data.sandbox import Sandbox, SandboxResult

# every test here runs programs in the sandbox (or its pieces): the `sandbox_ok` fixture
# (tests/conftest.py) puts them in the slow tier
pytestmark = [pytest.mark.skipif(sys.platform != "linux", reason="the sandbox targets Linux"),
              pytest.mark.usefixtures("sandbox_ok")]


@pytest.fixture(scope="module")
def sb() -> Sandbox:
    # programs expected to pass get a limit no load can make them miss; those meant to be
    # stopped pass their own short ``timeout_s`` and never finish by themselves
    return Sandbox(timeout_s=60.0, memory_mb=512, max_processes=8)


def _alive(pid: int) -> bool:
    """A process that exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


def test_passing_and_failing_programs(sb: Sandbox) -> None:
    ok = sb.run("def add(a, b):\n    return a + b\nassert add(1, 2) == 3\n")
    assert isinstance(ok, SandboxResult)
    assert ok.passed and ok.returncode == 0 and not ok.timed_out and ok.killed_reason is None
    bad = sb.run("assert 1 + 1 == 3\n")
    assert not bad.passed and bad.returncode == 1 and not bad.timed_out
    assert bad.killed_reason is None and "AssertionError" in bad.stderr_tail
    err = sb.run("1 / 0\n")
    assert not err.passed and "ZeroDivisionError" in err.stderr_tail


def test_early_exit_does_not_count_as_passing(sb: Sandbox) -> None:
    assert not sb.run("import sys\nsys.exit(0)\nassert False\n").passed
    assert not sb.run("import os\nos._exit(0)\nassert False\n").passed


def test_infinite_loop_is_killed_on_time(sb: Sandbox) -> None:
    res = sb.run("while True:\n    pass\n", timeout_s=1.0)
    assert res.timed_out and not res.passed and res.killed_reason == "timeout"
    # a sleeper uses no CPU, so only the wall-clock limit can stop it before its 60 s: a bound
    # that no machine's load can make it miss
    t0 = time.monotonic()
    sleeper = sb.run("import time\ntime.sleep(60)\n", timeout_s=0.5)
    assert sleeper.timed_out and sleeper.killed and time.monotonic() - t0 < 45.0


def test_memory_bomb_is_stopped_not_the_caller(sb: Sandbox) -> None:
    big = sb.run("x = bytearray(4 * 1024 ** 3)\n")
    assert not big.passed and big.killed_reason == "memory"
    grow = sb.run("xs = []\nwhile True:\n    xs.append(' ' * 10 ** 6)\n", timeout_s=5.0)
    assert not grow.passed and grow.killed_reason in ("memory", "timeout", "cpu_time")
    # and this (the test) process is fine
    assert len(bytearray(10 ** 6)) == 10 ** 6


def test_fork_bomb_is_refused(sb: Sandbox) -> None:
    res = sb.run("import os\nwhile True:\n    os.fork()\n", timeout_s=2.0)
    assert not res.passed and "os.fork is not allowed" in res.stderr_tail
    res = sb.run("import subprocess\nsubprocess.run(['true'])\n")
    assert not res.passed and "not allowed" in res.stderr_tail
    res = sb.run("import os\nos.system('true')\n")
    assert not res.passed and "not allowed" in res.stderr_tail


def test_fork_bomb_is_contained_by_the_os() -> None:
    """Without the Python-level guard the OS limit (pids cgroup or RLIMIT_NPROC) must cap the
    processes, and nothing may outlive the run. The 'bomb' is bounded (50 sleeping children),
    so even a broken limit cannot hurt the machine."""
    raw = Sandbox(timeout_s=60.0, max_processes=8, python_guards=False)
    prot = raw.protections()
    if prot["process_limit"] == "python_only":
        pytest.skip("no OS-level process limit here (root without a writable pids cgroup)")
    code = (
        "import os, sys, time\n"
        "pids = []\n"
        "for _ in range(50):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError:\n"
        "        break\n"
        "    if pid == 0:\n"
        "        time.sleep(60)\n"
        "        os._exit(0)\n"
        "    pids.append(pid)\n"
        "sys.stderr.write('PIDS ' + ' '.join(map(str, pids)) + '\\n')\n"
    )
    res = raw.run(code)
    line = next(ln for ln in res.stderr_tail.splitlines() if ln.startswith("PIDS"))
    pids = [int(x) for x in line.split()[1:]]
    assert len(pids) < 8, f"the process cap did not hold: {len(pids)} children"
    deadline = time.monotonic() + 30  # reaping may lag on a loaded machine
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(p) for p in pids), "children outlived the sandbox run"


def test_write_outside_the_directory_is_blocked(sb: Sandbox, tmp_path) -> None:
    target = tmp_path / "escape.txt"
    for code in (f"open({str(target)!r}, 'w').write('x')\n",
                 f"import os\nos.open({str(target)!r}, os.O_WRONLY | os.O_CREAT)\n",
                 f"import pathlib\npathlib.Path({str(target)!r}).write_text('x')\n",
                 f"import os\nos.chdir({str(tmp_path)!r})\nopen('escape.txt', 'w')\n",
                 f"import os\nos.symlink({str(target)!r}, 'link')\nopen('link', 'w')\n"):
        res = sb.run(code)
        assert not res.passed, code
        assert "not allowed" in res.stderr_tail, (code, res.stderr_tail)
        assert not target.exists(), code
    victim = tmp_path / "keep.txt"
    victim.write_text("keep")
    res = sb.run(f"import os\nos.remove({str(victim)!r})\n")
    assert not res.passed and victim.exists()


def test_writes_inside_the_directory_work_and_vanish(sb: Sandbox) -> None:
    code = ("import os, sys\n"
            "open('a.txt', 'w').write('hello')\n"
            "os.mkdir('d')\n"
            "assert open('a.txt').read() == 'hello'\n"
            "sys.stderr.write('CWD ' + os.getcwd() + '\\n')\n")
    res = sb.run(code)
    assert res.passed, res.stderr_tail
    cwd = next(ln for ln in res.stderr_tail.splitlines() if ln.startswith("CWD"))[4:]
    assert not os.path.exists(cwd)


@pytest.fixture()
def listener():
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(5)
    srv.settimeout(0.2)
    yield srv
    srv.close()


def _connect_code(port: int) -> str:
    return ("import socket, sys\n"
            "s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)\n"
            "s.settimeout(2)\n"
            f"s.connect(('127.0.0.1', {port}))\n"
            "sys.stderr.write('CONNECTED\\n')\n")


def _accepted(srv: socket.socket) -> bool:
    try:
        conn, _ = srv.accept()
    except (TimeoutError, OSError):
        return False
    conn.close()
    return True


def test_network_is_refused(sb: Sandbox, listener) -> None:
    port = listener.getsockname()[1]
    res = sb.run(_connect_code(port))
    assert not res.passed and "CONNECTED" not in res.stderr_tail
    assert "uqbench sandbox: socket" in res.stderr_tail  # the sandbox's refusal
    assert not _accepted(listener)


def test_network_namespace_without_python_guards(listener) -> None:
    raw = Sandbox(timeout_s=60.0, python_guards=False)
    if not raw.protections()["network_namespace"]:
        pytest.skip("no network namespace on this machine (needs root or user namespaces)")
    port = listener.getsockname()[1]
    res = raw.run(_connect_code(port))
    assert not res.passed and "CONNECTED" not in res.stderr_tail
    assert not _accepted(listener)


def test_environment_is_minimal_and_hash_seed_pinned(sb: Sandbox) -> None:
    code = ("import os, sys\n"
            "assert 'HOME' not in os.environ or os.environ['HOME'] == '/nonexistent'\n"
            "assert not any(k.startswith(('UQBENCH', 'VIRTUAL_ENV')) for k in os.environ)\n"
            "assert sys.flags.no_user_site and sys.dont_write_bytecode\n"
            "sys.stderr.write('HASH %d\\n' % hash('uqbench'))\n")
    a, b = sb.run(code), sb.run(code)
    assert a.passed, a.stderr_tail
    assert a.stderr_tail == b.stderr_tail and "HASH" in a.stderr_tail


def test_run_many_keeps_order_and_runs_two_at_once(sb: Sandbox) -> None:
    """Two programs that each wait until both runs' folders exist can only pass if they run at
    the same time (run serially, the first would wait for its 60 s limit): no clock involved."""
    wait_both = ("import glob, os, time\n"
                 f"pattern = os.path.join({tempfile.gettempdir()!r}, 'uqbench-{os.getpid()}-*')\n"
                 "while len(glob.glob(pattern)) < 2:\n"
                 "    time.sleep(0.01)\n")
    res = sb.run_many([wait_both] * 2 + ["assert False\n", "pass\n"], workers=2, timeout_s=60.0)
    assert [r.passed for r in res] == [True, True, False, True]
    assert [r.killed_reason for r in res] == [None] * 4


def test_no_leftovers(sb: Sandbox) -> None:
    sb.run("pass\n")
    sb.run("while True: pass\n", timeout_s=0.3)
    tmp = tempfile.gettempdir()
    assert not glob.glob(os.path.join(tmp, f"uqbench-{os.getpid()}-*"))
    assert not glob.glob(f"/sys/fs/cgroup/pids/uqbench-{os.getpid()}-*")


def test_protections_report(sb: Sandbox) -> None:
    p = sb.protections()
    assert p["process_limit"] in ("pids_cgroup", "rlimit_nproc", "python_only")
    assert isinstance(p["network_namespace"], bool)
    if os.geteuid() == 0 and os.access("/sys/fs/cgroup/pids", os.W_OK):
        assert p["process_limit"] == "pids_cgroup"


def test_protections_are_probed_not_assumed(sb: Sandbox) -> None:
    p = sb.protections()
    assert "wall_timeout_killpg" in p["os_limits"]
    # every limit is either found in place or reported as failed, none assumed
    for name in ("RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_FSIZE", "RLIMIT_NOFILE", "RLIMIT_NPROC",
                 "RLIMIT_CORE", "no_new_privs"):
        assert (name in p["os_limits"]) != (name in p["os_limits_failed"]), name
    assert "RLIMIT_AS" in p["os_limits"] and "RLIMIT_NOFILE" in p["os_limits"]
    assert p["python_guards"] is True  # the probe's socket was refused by the audit hook
    assert Sandbox(timeout_s=5.0, python_guards=False).protections()["python_guards"] is False


def _refuse_nofile(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make setrlimit(RLIMIT_NOFILE) fail in this process and the children forked from it."""
    import resource

    real = resource.setrlimit

    def failing(lim: int, val: tuple[int, int]) -> None:
        if lim == resource.RLIMIT_NOFILE:
            raise OSError("refused for the test")
        real(lim, val)

    monkeypatch.setattr(resource, "setrlimit", failing)


def test_failed_setrlimit_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    """A setrlimit that fails in the child's set-up (patched here; the child is forked from
    this process) shows in the run's result and in `protections`, not silently dropped."""
    _refuse_nofile(monkeypatch)
    box = Sandbox(timeout_s=60.0, max_open_files=37)
    res = box.run("pass\n")
    assert res.passed and res.limits_failed == ("RLIMIT_NOFILE",)
    assert "setrlimit" not in res.stderr_tail
    p = box.protections()
    assert "RLIMIT_NOFILE" not in p["os_limits"] and "RLIMIT_AS" in p["os_limits"]
    assert p["os_limits_failed"]["RLIMIT_NOFILE"].startswith("setrlimit failed")
    monkeypatch.undo()
    assert Sandbox(timeout_s=60.0).run("pass\n").limits_failed == ()


def test_a_run_outside_its_pids_cgroup_is_reported(tmp_path, monkeypatch) -> None:
    """As root with a pids cgroup, a run that cannot be put in its cgroup (not joined, or not
    made) has no process cap there: `limits_failed` and `protections` say so (the cgroup is
    pretended where there is none: the child is forked from this process)."""
    box = Sandbox(timeout_s=60.0)
    box.cgroup_root = str(tmp_path)
    monkeypatch.setattr(box, "make_cgroup", lambda tag: str(tmp_path / "gone"))  # join fails
    res = box.run("pass\n")
    assert res.passed and res.limits_failed == ("pids_cgroup",)
    assert "uqbench-sandbox" not in res.stderr_tail
    assert box.protections()["os_limits_failed"]["pids_cgroup"].startswith("could not put")
    monkeypatch.setattr(box, "make_cgroup", lambda tag: None)  # could not be made
    assert box.run("pass\n").limits_failed == ("pids_cgroup",)


def test_code_mc_build_records_runs_without_a_limit(monkeypatch) -> None:
    """A code MC build whose sandboxed runs go without an OS limit counts them per limit in its
    stats, the split recipe sums them (`suites.BuildStats`), and every run using the split warns
    and lists them in run.json ``fallbacks`` (`uqbench.data.suites.build.record_unlimited`)."""
    from uqbench.core.errors import FallbackWarning, reset_fallbacks
    from uqbench.data.mc.code import code_mc
    from uqbench.data.records import Split
    from uqbench.data.sources import get_source
    from uqbench.data.sources.code import mbpp_problem
    from uqbench.data.suites import build as S

    add = {"text": "Add.", "code": "def add(a, b):\n    return a + b", "task_id": 1,
           "test_list": ["assert add(1, 2) == 3", "assert add(5, 7) == 12"]}
    rec, full = code_mc(mbpp_problem(add), seed=0, sandbox=Sandbox(timeout_s=5.0, workers=1))
    assert rec is not None and "limits_failed" not in full  # all limits: stats as before
    _refuse_nofile(monkeypatch)
    rec, stats = code_mc(mbpp_problem(add), seed=0, sandbox=Sandbox(timeout_s=5.0, workers=1))
    assert rec is not None
    assert stats["limits_failed"] == {"RLIMIT_NOFILE": stats["mutants_tried"] + 1}  # + reference
    agg = S.BuildStats(get_source("mbpp"))
    agg.add(rec, stats)
    recipe = {"builder_stats": agg.result()}
    assert recipe["builder_stats"]["sandbox_limits_failed"] == stats["limits_failed"]
    record = reset_fallbacks()
    with pytest.warns(FallbackWarning, match="RLIMIT_NOFILE"):
        S.record_unlimited(Split("code", "id", (rec,), recipe), "pooled: code/id")
    assert [(r["what"], r["where"]) for r in record] == [("sandbox limits", "pooled: code/id")]
    assert f"{stats['mutants_tried'] + 1} without RLIMIT_NOFILE" in record[0]["reason"]
    reset_fallbacks()
    empty = S.BuildStats(get_source("mbpp")).result()
    S.record_unlimited(Split("code", "id", (rec,), {"builder_stats": empty}),
                       "pooled: code/id")
    assert record == []  # every limit enforced: nothing recorded


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        Sandbox(timeout_s=0)


def test_picklable_for_process_pools() -> None:
    import pickle

    clone = pickle.loads(pickle.dumps(Sandbox(timeout_s=3.0, memory_mb=256)))
    assert clone.timeout_s == 3.0 and clone.memory_mb == 256
    assert clone.run("assert True\n").passed


# -- SandboxSession: one fork server, a forked child per program --------------------------------

@pytest.fixture(scope="module")
def session(sb: Sandbox):
    with sb.session() as s:
        yield s


_RECURSION = ("import sys\nn = 0\ndef r():\n    global n\n    n += 1\n    r()\n"
              "try:\n    r()\nexcept RecursionError:\n    pass\n"
              "sys.stderr.write('DEPTH %d\\n' % n)\n")
#: (program, CPU/wall limit or None for the sandbox's): what the sandbox must stop or pass; each
#: must get the same verdict, and be stopped for the same reason, in both paths
ADVERSARIAL = {
    "passes": ("def add(a, b):\n    return a + b\nassert add(1, 2) == 3\n", None),
    "assertion": ("assert 1 + 1 == 3\n", None),
    "error": ("1 / 0\n", None),
    "sys_exit_0": ("import sys\nsys.exit(0)\nassert False\n", None),
    "os_exit_0": ("import os\nos._exit(0)\nassert False\n", None),
    "raise_system_exit_in_finally": ("try:\n    assert False\nfinally:\n    raise SystemExit(0)\n",
                                     None),
    "infinite_loop": ("while True:\n    pass\n", 1.0),
    "memory_bomb": ("x = bytearray(4 * 1024 ** 3)\n", None),
    "fork": ("import os\nwhile True:\n    os.fork()\n", 2.0),
    "subprocess": ("import subprocess\nsubprocess.run(['true'])\n", None),
    "os_system": ("import os\nos.system('true')\n", None),
    "kill_parent": ("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n", None),
    "ctypes": ("import ctypes\n", None),
    "write_outside": ("open('/tmp/uqbench-escape-test.txt', 'w').write('x')\n", None),
    "socket": ("import socket\nsocket.socket().connect(('127.0.0.1', 9))\n", None),
    "recursion_depth": (_RECURSION, None),
    "hash_seed": ("import sys\nsys.stderr.write('HASH %d\\n' % hash('uqbench'))\n", None),
}


def _reported(res: SandboxResult) -> list[str]:
    """The lines a program wrote about itself (DEPTH, HASH), to compare between paths."""
    return [ln for ln in res.stderr_tail.splitlines() if ln.startswith(("DEPTH", "HASH"))]


@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
def test_session_verdict_equals_a_process_per_program(name: str, sb: Sandbox, session) -> None:
    code, limit = ADVERSARIAL[name]
    ref, new = sb.run(code, timeout_s=limit), session.run(code, timeout_s=limit)
    assert (new.passed, new.killed_reason) == (ref.passed, ref.killed_reason), \
        (ref.stderr_tail, new.stderr_tail)
    assert _reported(new) == _reported(ref)
    assert new.passed == (name in ("passes", "recursion_depth", "hash_seed"))
    if "not allowed" in ref.stderr_tail:
        assert "not allowed" in new.stderr_tail
    assert not os.path.exists("/tmp/uqbench-escape-test.txt")
    assert session.run("pass\n").passed  # the session survives every one of them


def test_session_programs_do_not_see_each_other(session) -> None:
    """Whatever a program does to the interpreter (builtins, modules, recursion limit, threads
    left running, signal handlers) or to its folder is gone for the next one."""
    dirty = ("import builtins, os, sys, threading, time, signal\n"
             "threading.Thread(target=time.sleep, args=(60,)).start()\n"
             "open('left.txt', 'w').write('x')\n"
             "os.mkdir('sub')\n"
             "os.chmod('.', 0o500)\n"
             "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
             "sys.modules['json'] = None\n"
             "sys.setrecursionlimit(60)\n"
             "os.getcwd = None\n"
             "builtins.len = lambda x: 0\n")
    assert session.run(dirty).passed
    clean = ("import json, os, signal, sys, threading\n"
             "assert len([1, 2]) == 2 and callable(os.getcwd)\n"
             "assert sys.getrecursionlimit() == 1000 and threading.active_count() == 1\n"
             "assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL\n"
             "assert os.listdir('.') == [] and os.stat('.').st_mode & 0o777 == 0o700\n"
             "open('mine.txt', 'w').write('ok')\n")
    res = session.run(clean)
    assert res.passed, res.stderr_tail


def test_session_protocol_survives_a_program_writing_to_its_stdout(session) -> None:
    """A program's stdout (fd 1) is /dev/null, not the answer pipe: bytes it writes, or the
    descriptors it closes, cannot be taken for the server's answer."""
    res = session.run("import os\nos.write(1, (5).to_bytes(4, 'big') + b'hello')\n"
                      "os.close(0)\nos.close(1)\nassert False\n")
    assert not res.passed and "AssertionError" in res.stderr_tail
    assert session.run("pass\n").passed


def test_session_budget_is_cpu_time_not_wall_time(sb: Sandbox, session) -> None:
    """A program that waits (no CPU) longer than its budget passes in a session (its budget is
    CPU time, measured in the child, whatever the machine's load) and times out under a
    wall-clock limit; one that spins is stopped either way."""
    sleeper = "import time\ntime.sleep(1.0)\n"
    assert not sb.run(sleeper, timeout_s=0.5).passed
    res = session.run(sleeper, timeout_s=0.5)
    assert res.passed and res.spent_s < 0.5 <= res.elapsed_s
    spin = session.run("while True:\n    pass\n", timeout_s=0.5)
    assert spin.timed_out and spin.killed_reason == "timeout" and spin.spent_s >= 0.4


def test_session_wall_backstop_and_ignored_cpu_signal(session, monkeypatch) -> None:
    from uqbench.data.sandbox import host

    monkeypatch.setattr(host, "SESSION_WALL_SLACK_S", 0.5)
    t0 = time.monotonic()
    res = session.run("import time\ntime.sleep(60)\n", timeout_s=0.2)  # backstop: 1.5 s
    assert res.killed_reason == "timeout" and not res.passed and time.monotonic() - t0 < 45
    # a program that ignores the budget's SIGPROF still meets RLIMIT_CPU (ceil(0.2) + 1 s)
    res = session.run("import signal\nsignal.signal(signal.SIGPROF, signal.SIG_IGN)\n"
                      "while True:\n    pass\n", timeout_s=0.2)
    assert not res.passed and res.killed_reason in ("cpu_time", "timeout")


def test_session_child_gets_every_limit(sb: Sandbox, session) -> None:
    """The probe run as a session's child finds every OS limit of a `Sandbox.run` with the same
    time limit, its own network namespace, its pids cgroup (as root) and NoNewPrivs."""
    import json

    from uqbench.data.sandbox.host import PROBE, PROBE_MARK

    res = session.run(PROBE, timeout_s=30.0)
    line = next(ln for ln in res.stderr_tail.splitlines() if ln.startswith(PROBE_MARK))
    got = json.loads(line[len(PROBE_MARK):])
    assert {k: tuple(v) for k, v in got["limits"].items()} == sb.os_limits(30.0)
    assert got["no_new_privs"] and got["sockets_refused"]
    assert got["net_ns"] != os.readlink("/proc/self/ns/net")
    if sb.protections()["process_limit"] == "pids_cgroup":
        assert got["cgroup"]


def test_session_reaps_what_a_program_leaves_behind() -> None:
    """Without the Python guards a program can fork: a grandchild that leaves the process group
    (setsid) is killed by the server (its subreaper) before the next program, and the process
    cap holds per program."""
    raw = Sandbox(timeout_s=60.0, max_processes=8, python_guards=False)
    code = ("import os, sys, time\n"
            "pid = os.fork()\n"
            "if pid == 0:\n"
            "    os.setsid()\n"
            "    time.sleep(60)\n"
            "    os._exit(0)\n"
            "sys.stderr.write('PID %d\\n' % pid)\n")
    with raw.session() as s:
        res = s.run(code)
        assert res.passed, res.stderr_tail
        pid = int(next(ln for ln in res.stderr_tail.splitlines() if ln.startswith("PID"))[4:])
        assert not _alive(pid)  # gone before run() returned
        if raw.protections()["process_limit"] != "python_only":
            bomb = ("import os, time\nn = 0\nfor _ in range(50):\n    try:\n"
                    "        if os.fork() == 0:\n            time.sleep(60)\n"
                    "            os._exit(0)\n        n += 1\n    except OSError:\n"
                    "        break\nassert n < 8, n\n")
            for _ in range(2):  # and again: the first program's processes were freed
                res = s.run(bomb)
                assert res.passed, res.stderr_tail


def test_session_leaves_nothing_and_reports_failed_limits(monkeypatch) -> None:
    _refuse_nofile(monkeypatch)  # in the server's set-up (forked from this process)
    box = Sandbox(timeout_s=60.0, max_open_files=37)
    with box.session() as s:
        assert s.run("pass\n").limits_failed == ("RLIMIT_NOFILE",)
        assert s.run("assert False\n").limits_failed == ("RLIMIT_NOFILE",)
        made = [s.root] + ([s.cgroup] if s.cgroup else [])
        assert all(os.path.isdir(p) for p in made)
    assert not any(os.path.exists(p) for p in made)  # its folder and its cgroup
    monkeypatch.undo()
    with Sandbox(timeout_s=60.0).session() as s:
        assert s.run("pass\n").limits_failed == ()


def test_session_server_death_is_an_error_not_a_verdict() -> None:
    with Sandbox(timeout_s=60.0).session() as s:
        assert s.run("pass\n").passed
        os.kill(s.server_pid, signal.SIGKILL)
        with pytest.raises(RuntimeError, match="sandbox session server failed"):
            s.run("pass\n")
    with pytest.raises(ValueError, match="positive"):
        Sandbox().session().run("pass\n", timeout_s=0)


@pytest.mark.parametrize("name", ["runner", "server"])
def test_each_program_is_the_prelude_then_its_module_in_one_file(name: str) -> None:
    """A sandboxed program runs as one file with no uqbench to import: the prelude module's
    text, then the program module's without its import of the prelude; it compiles."""
    from pathlib import Path

    from uqbench.data.sandbox import host

    here = Path(host.__file__).parent
    text = host.program(name)
    assert text.startswith((here / "prelude.py").read_text())
    assert "uqbench" not in "".join(ln for ln in text.splitlines(True)
                                    if ln.startswith(("import", "from")))
    body = [ln for ln in (here / f"{name}.py").read_text().splitlines(True)
            if not ln.startswith("from uqbench.data.sandbox.prelude import ")]
    assert text.endswith("".join(body))
    compile(text, f"{name}.py", "exec")
