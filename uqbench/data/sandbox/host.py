"""Run small, untrusted-but-not-malicious Python programs (dataset solutions and their mutants)
in a constrained subprocess.

Threat model: the code is *buggy*, not hostile -- a mutant that loops forever, allocates without
bound, forks by accident, or writes where it should not. Every run is a fresh interpreter
(``sys.executable -s -S -B [-P]`` with a scrubbed environment: the isolation of ``-I``, but the
hash seed can be pinned so that set/dict order, and therefore pass/fail, is reproducible; ``-S``:
standard library only), in a fresh temporary directory as its working directory, deleted
afterwards. `Sandbox.run_many` runs several at once (2 by default).

`Sandbox.session` runs many programs through one such process instead, a fork server
(`SandboxSession`): each program runs in a child forked from the server's clean interpreter (no
program ever runs in the server itself), in an empty folder of its own, with every protection
below -- the process-wide ones inherited from the server, the time limit and process cap set in
the child -- and a **CPU-time** limit measured inside the child (so the same whatever the
machine's load) with a wall-clock backstop. Whatever a program leaves (threads, monkeypatched
builtins or modules, its process group, orphaned processes: the server is their subreaper,
files) is gone before the next one starts. A program then costs a fork, not an interpreter
start-up.

What protects what (honest list; `Sandbox.protections` reports what this machine actually got):

OS-enforced (the kernel applies them whatever the code does):
  * wall-clock timeout: the whole process group (``start_new_session``) is SIGKILLed;
  * RLIMIT_CPU (CPU seconds), RLIMIT_AS (address space, i.e. memory), RLIMIT_FSIZE (largest file
    it may write, stderr included), RLIMIT_NOFILE, RLIMIT_CORE = 0;
  * no network, when the kernel lets us create a network namespace (``unshare(CLONE_NEWNET)``; as
    root directly, otherwise inside a new user namespace): the process then sees only a
    loopback interface that is down, so nothing -- not even 127.0.0.1 -- is reachable;
  * a process cap: RLIMIT_NPROC, which the kernel does **not** apply to root; when we run as root
    and a writable ``pids`` cgroup exists, each run goes into its own cgroup with
    ``pids.max = max_processes`` and every process left in it is killed afterwards;
  * ``PR_SET_NO_NEW_PRIVS`` (no privilege gain through setuid binaries).

Python-level (an audit hook installed before the code runs; stops accidents, not an attacker who
digs into interpreter internals):
  * process creation refused: ``os.fork``/``forkpty``, ``os.exec*``, ``os.spawn*``,
    ``os.posix_spawn``, ``os.system``, ``subprocess.Popen``, ``os.kill``/``killpg``; importing
    ``_posixsubprocess`` and ``ctypes`` refused;
  * sockets refused (``socket.__new__``/``connect``/``bind``/``getaddrinfo``...);
  * writes outside the working directory refused: ``open``/``os.open`` with a write mode, and
    ``os.remove``/``rename``/``rmdir``/``mkdir``/``chmod``/``chown``/``link``/``symlink``/
    ``truncate``/``utime``/``chdir``, ``shutil.rmtree`` on paths that resolve outside it;
  * ``resource.setrlimit``/``prlimit`` refused (root could otherwise raise the hard limits).

Not protected: reads anywhere the user may read; writes outside the directory by an attacker who
bypasses the audit hook (as root there is no OS-level file protection; as a normal user the usual
file permissions apply); kernel exploits. Do not run hostile code with this.
"""
from __future__ import annotations

import ctypes
import itertools
import json
import marshal
import math
import os
import resource
import select
import shutil
import signal
import stat
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from uqbench.data.sandbox.prelude import LIMIT_MARK, MEMORY_MARK

SANDBOX_VERSION = "1"

_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_CHILD_SUBREAPER = 36
#: the prefix of the line in which `PROBE` reports to the host
PROBE_MARK = "uqbench-probe: "
#: the OS limits the set-up code applies, in order
_RLIMITS = ("RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_FSIZE", "RLIMIT_NOFILE", "RLIMIT_NPROC",
            "RLIMIT_CORE")
#: `SandboxResult.limits_failed` name of the process cap of a run as root: its pids cgroup
_CGROUP_LIMIT = "pids_cgroup"
# What `Sandbox.protections` runs: it reports what the child actually got (its limits, whether
# PR_SET_NO_NEW_PRIVS is set, its network namespace and cgroup, whether sockets are refused).
PROBE = rf'''
import json, os, resource, sys
got = {{"limits": {{n: list(resource.getrlimit(getattr(resource, n))) for n in {_RLIMITS!r}}}}}
try:
    with open("/proc/self/status") as f:
        got["no_new_privs"] = any(ln.split() == ["NoNewPrivs:", "1"] for ln in f)
except OSError:
    got["no_new_privs"] = None
try:
    got["net_ns"] = os.readlink("/proc/self/ns/net")
except OSError:
    got["net_ns"] = None
try:
    with open("/proc/self/cgroup") as f:
        got["cgroup"] = "uqbench-" in f.read()
except OSError:
    got["cgroup"] = None
try:
    import socket
    socket.socket().close()
    got["sockets_refused"] = False
except PermissionError:
    got["sockets_refused"] = True
except OSError:
    got["sockets_refused"] = None
sys.stderr.write("\n{PROBE_MARK}" + json.dumps(got) + "\n")
'''
_STDERR_TAIL = 2000
#: numbers the temporary folders and cgroups ``uqbench-<pid>-<n>`` of every sandbox in this
#: process (one counter for all: two sandboxes' sessions are open at once)
_TAGS = itertools.count()

def program(name: str) -> str:
    """The text of the sandboxed program ``name`` (``runner`` or ``server``): the prelude's
    module, then the program's, whose import of the prelude it replaces (the program runs as one
    file, with no uqbench to import)."""
    here = Path(__file__).parent
    body = (here / f"{name}.py").read_text(encoding="utf-8").splitlines(keepends=True)
    keep = "".join(ln for ln in body if not ln.startswith(_PRELUDE_IMPORT))
    return (here / "prelude.py").read_text(encoding="utf-8") + keep


_PRELUDE_IMPORT = "from uqbench.data.sandbox.prelude import "
#: One run per process (`Sandbox.run`): `uqbench.data.sandbox.runner`.
_RUNNER = program("runner")
#: The fork server of a `SandboxSession`: `uqbench.data.sandbox.server`.
_SERVER = program("server")


@dataclass(frozen=True)
class SandboxResult:
    """Outcome of one run.

    ``passed``: exit status 0 *and* the program ran to its end. ``killed_reason``: why the run was
    stopped from outside or by a limit: "timeout" (past its time limit: the wall clock for
    `Sandbox.run`; the CPU-time budget, or the wall-clock backstop, for a `SandboxSession` run),
    "cpu_time" (RLIMIT_CPU), "memory" (allocation refused under the address-space limit),
    "signal:NAME"; None for an ordinary exit (pass or failing assertion/exception).
    ``limits_failed``: OS limits that could not be set. ``spent_s``: the run's time on the clock
    its limit counts: wall seconds (``elapsed_s``) for `Sandbox.run`, CPU seconds of the program
    for a `SandboxSession` run.
    """

    passed: bool
    returncode: int | None
    timed_out: bool
    killed_reason: str | None
    stderr_tail: str
    elapsed_s: float = 0.0
    spent_s: float = 0.0
    #: OS limits whose ``setrlimit`` failed in this run's set-up (e.g. ``("RLIMIT_AS",)``), and
    #: ``"pids_cgroup"`` when a run as root could not be put in its pids cgroup: the run went on
    #: without them
    limits_failed: tuple[str, ...] = ()

    @property
    def killed(self) -> bool:
        return self.killed_reason is not None


#: the C library once loaded; False where it cannot be (None: not tried yet)
_libc: ctypes.CDLL | Literal[False] | None = None


def _get_libc() -> ctypes.CDLL | None:
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(None, use_errno=True)
        except OSError:  # pragma: no cover - non-glibc platforms
            _libc = False
    return _libc or None


def _pids_cgroup_root() -> str | None:
    """A directory under which we may create per-run pids cgroups, or None."""
    if sys.platform != "linux" or os.geteuid() != 0:
        return None
    v1 = "/sys/fs/cgroup/pids"
    if os.path.isfile(os.path.join(v1, "cgroup.procs")) and os.access(v1, os.W_OK):
        return v1
    try:  # cgroup v2: our own cgroup must delegate the pids controller to children
        with open("/proc/self/cgroup") as f:
            rel = next((line.split("::", 1)[1].strip() for line in f if line.startswith("0::")),
                       None)
        if rel is not None:
            base = os.path.join("/sys/fs/cgroup", rel.lstrip("/"))
            with open(os.path.join(base, "cgroup.subtree_control")) as f:
                if "pids" in f.read().split() and os.access(base, os.W_OK):
                    return base
    except OSError:
        pass
    return None


class _Job:
    __slots__ = ("cgroup", "deadline", "nonce", "pidfd", "proc", "root", "start")

    def __init__(self, proc: Any, root: str, cgroup: str | None, nonce: str, start: float,
                 deadline: float, pidfd: int | None) -> None:
        self.proc, self.root, self.cgroup, self.nonce = proc, root, cgroup, nonce
        self.start, self.deadline, self.pidfd = start, deadline, pidfd


class Sandbox:
    """Runs Python source in a fresh, limited subprocess; see the module docstring.

    ``timeout_s``: wall-clock limit (CPU limit = ceil(timeout_s) + 1 s). ``memory_mb``: address
    space. ``max_processes``: processes/threads the run may hold at once (cgroup as root,
    RLIMIT_NPROC otherwise -- which counts *all* the user's processes, so in practice a run
    cannot fork). ``python_guards``: install the audit hook (turn off only to test the OS-level
    limits). ``hash_seed``: PYTHONHASHSEED of the child (None: random, as ``-I``).
    ``site_packages``: let the child import installed packages; off by default (``-S``: the
    standard library only, and ~40 ms faster start-up).

    Call it from one thread at a time (the child is set up in ``preexec_fn``, which Python
    documents as unsafe while other threads run); for parallelism use `run_many` or processes.
    """

    def __init__(self, timeout_s: float = 5.0, memory_mb: int = 512, max_processes: int = 8, *,
                 file_size_mb: int = 16, max_open_files: int = 64, workers: int = 2,
                 python_guards: bool = True, isolate_network: bool = True,
                 hash_seed: int | None = 0, site_packages: bool = False) -> None:
        if timeout_s <= 0 or memory_mb <= 0 or max_processes < 1 or workers < 1:
            raise ValueError("Sandbox: timeout_s, memory_mb, max_processes and workers must be "
                             "positive")
        self.timeout_s = float(timeout_s)
        self.memory_mb = int(memory_mb)
        self.max_processes = int(max_processes)
        self.file_size_mb = int(file_size_mb)
        self.max_open_files = int(max_open_files)
        self.workers = int(workers)
        self.python_guards = bool(python_guards)
        self.isolate_network = bool(isolate_network)
        self.hash_seed = hash_seed
        self.site_packages = bool(site_packages)
        self._is_root = os.geteuid() == 0
        #: where per-run pids cgroups are made (None: no pids cgroup), found at construction
        self.cgroup_root = _pids_cgroup_root()
        self._probe: dict[str, Any] | None = None

    def __getstate__(self) -> dict[str, Any]:  # picklable, e.g. into a process pool
        state = dict(self.__dict__)
        state["_probe"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    # -- public API ---------------------------------------------------------------------------

    def run(self, code: str, *, timeout_s: float | None = None) -> SandboxResult:
        """Run one program; it passes when it exits 0 after running to its end."""
        return self.run_many([code], timeout_s=timeout_s)[0]

    def run_many(self, codes: Sequence[str], *, timeout_s: float | None = None,
                 workers: int | None = None) -> list[SandboxResult]:
        """Run programs, up to ``workers`` (default: the sandbox's) at once; results in order."""
        workers = self.workers if workers is None else max(1, int(workers))
        timeout = self.timeout_s if timeout_s is None else float(timeout_s)
        results: list[SandboxResult | None] = [None] * len(codes)
        pending = list(enumerate(codes))[::-1]
        active: dict[int, _Job] = {}
        try:
            while pending or active:
                while pending and len(active) < workers:
                    i, code = pending.pop()
                    active[i] = self._start(code, timeout)
                done = self._wait_any(active)
                for i in done:
                    results[i] = self._finish(active.pop(i))
        finally:
            for job in active.values():  # interrupted: leave nothing running
                self._kill(job)
                self._cleanup(job)
        return [r for r in results if r is not None]

    def session(self) -> SandboxSession:
        """A `SandboxSession`: one sandboxed process that runs many programs, each in its own
        forked child with its own limits (use it as a context manager, or `close` it)."""
        return SandboxSession(self)

    def protections(self) -> dict[str, Any]:
        """What this machine actually enforces, probed once with a tiny run: the probe reads
        its own limits (``getrlimit``), ``NoNewPrivs``, network namespace and cgroup, and tries
        to open a socket; nothing here is assumed.

        Keys: ``running_as_root``; ``network_namespace`` (the probe's differs from ours);
        ``process_limit`` (``pids_cgroup`` | ``rlimit_nproc`` | ``python_only``); ``os_limits``
        (the limits found in place: ``wall_timeout_killpg``, which the parent enforces, the
        ``RLIMIT_*`` whose values match, ``no_new_privs``); ``os_limits_failed`` (limit ->
        what the probe found, or why it could not tell; ``setrlimit`` failures included);
        ``python_guards`` (the audit hook refused the probe's socket); ``file_writes_outside_dir``.
        """
        if self._probe is None:
            timeout = max(self.timeout_s, 30.0)  # a tiny run: no load makes it miss this
            res = self.run(PROBE, timeout_s=timeout)
            got: dict[str, Any] = {}
            for ln in res.stderr_tail.splitlines():
                if ln.startswith(PROBE_MARK):
                    try:
                        got = json.loads(ln[len(PROBE_MARK):])
                    except ValueError:
                        got = {}
            try:
                parent_ns: str | None = os.readlink("/proc/self/ns/net")
            except OSError:
                parent_ns = None
            ok, failed = ["wall_timeout_killpg"], {}
            found = got.get("limits", {})
            for name, want in self.os_limits(timeout).items():
                have = found.get(name)
                if name in res.limits_failed:
                    failed[name] = f"setrlimit failed (limit found: {have})"
                elif have is None:
                    failed[name] = "not probed (the probe run failed: " \
                        f"{res.stderr_tail[-200:].strip()!r})"
                elif tuple(have) != want:
                    failed[name] = f"wanted {list(want)}, found {have}"
                else:
                    ok.append(name)
            if _CGROUP_LIMIT in res.limits_failed:
                failed[_CGROUP_LIMIT] = "could not put the run in its pids cgroup"
            if got.get("no_new_privs"):
                ok.append("no_new_privs")
            else:
                failed["no_new_privs"] = ("not set" if got.get("no_new_privs") is False
                                          else "could not be read")
            net = bool(got.get("net_ns") and parent_ns and got["net_ns"] != parent_ns)
            cg = bool(self.cgroup_root and got.get("cgroup"))
            nproc = "RLIMIT_NPROC" in ok and not self._is_root
            self._probe = {
                "running_as_root": self._is_root,
                "network_namespace": net,
                "process_limit": ("pids_cgroup" if cg else "rlimit_nproc" if nproc
                                  else "python_only"),
                "os_limits": ok,
                "os_limits_failed": failed,
                "python_guards": bool(got.get("sockets_refused")),
                "file_writes_outside_dir": (("python_audit_hook" if got.get("sockets_refused")
                                             else "none") if self._is_root else
                                            ("python_audit_hook + file permissions"
                                             if got.get("sockets_refused")
                                             else "file permissions")),
            }
        return dict(self._probe)

    # -- internals ----------------------------------------------------------------------------

    def _cmd(self, *args: str) -> list[str]:
        """The child's command line: the interpreter and its flags, then ``args``."""
        cmd = [sys.executable, "-s", "-B"]
        if not self.site_packages:
            cmd.append("-S")
        if sys.version_info >= (3, 11):
            cmd.append("-P")
        if self.hash_seed is None:
            cmd.append("-E")
        return cmd + list(args)

    def _env(self) -> dict[str, str]:
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
               "PYTHONDONTWRITEBYTECODE": "1", "PYTHONIOENCODING": "utf-8",
               "HOME": "/nonexistent", "TMPDIR": "."}
        if self.hash_seed is not None:
            env["PYTHONHASHSEED"] = str(int(self.hash_seed))
        return env

    def os_limits(self, timeout: float) -> dict[str, tuple[int, int]]:
        """(soft, hard) of each OS limit in `_RLIMITS` for a run of ``timeout`` seconds."""
        mem = self.memory_mb * 1024 * 1024
        cpu = math.ceil(timeout) + 1
        fsize = self.file_size_mb * 1024 * 1024
        return {"RLIMIT_AS": (mem, mem), "RLIMIT_CPU": (cpu, cpu + 1),
                "RLIMIT_FSIZE": (fsize, fsize),
                "RLIMIT_NOFILE": (self.max_open_files, self.max_open_files),
                "RLIMIT_NPROC": (self.max_processes, self.max_processes), "RLIMIT_CORE": (0, 0)}

    def _preexec(self, cgroup: str | None, limits_s: dict[str, tuple[int, int]], *,
                 subreaper: bool = False) -> Any:
        # resolved now, in the parent: the child only calls setrlimit and writes bytes
        limits = [(getattr(resource, name), val, (LIMIT_MARK + name + "\n").encode())
                  for name, val in limits_s.items()]
        # a pids cgroup was wanted (root with a writable one): not getting into it is a failed
        # limit too, whether it could not be made (`make_cgroup`) or joined
        cg_mark = (LIMIT_MARK + _CGROUP_LIMIT + "\n").encode() if self.cgroup_root else None
        isolate = self.isolate_network and sys.platform == "linux"
        is_root = self._is_root
        libc = _get_libc() if sys.platform == "linux" else None

        def fn() -> None:
            joined = False
            if cgroup is not None:
                try:
                    fd = os.open(os.path.join(cgroup, "cgroup.procs"), os.O_WRONLY)
                    try:
                        os.write(fd, str(os.getpid()).encode())
                        joined = True
                    finally:
                        os.close(fd)
                except OSError:
                    pass
            if cg_mark is not None and not joined:
                os.write(2, cg_mark)  # reported in SandboxResult.limits_failed
            if isolate and libc is not None and libc.unshare(_CLONE_NEWNET) != 0 \
                    and not is_root:
                libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNET)
            for lim, val, mark in limits:
                try:
                    resource.setrlimit(lim, val)
                except (ValueError, OSError):
                    os.write(2, mark)  # reported in SandboxResult.limits_failed
            if libc is not None:
                libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
                if subreaper:  # kept across exec: orphans of its children come back to it
                    libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)

        return fn

    def make_cgroup(self, tag: str, extra: int = 0) -> str | None:
        """A pids cgroup for ``max_processes`` (+ ``extra``: a session's server) processes."""
        if self.cgroup_root is None:
            return None
        path = os.path.join(self.cgroup_root, tag)
        try:
            os.mkdir(path)
            with open(os.path.join(path, "pids.max"), "w") as f:
                f.write(str(self.max_processes + extra))
            return path
        except OSError:
            try:
                os.rmdir(path)
            except OSError:
                pass
            return None

    def _start(self, code: str, timeout: float) -> _Job:
        import subprocess

        n = next(_TAGS)
        tag = f"uqbench-{os.getpid()}-{n}"
        root = tempfile.mkdtemp(prefix=tag + "-")
        work = os.path.join(root, "work")
        os.mkdir(work, 0o700)
        with open(os.path.join(root, "runner.py"), "w", encoding="utf-8") as f:
            f.write(_RUNNER)
        with open(os.path.join(root, "solution.py"), "w", encoding="utf-8") as f:
            f.write(code)
        nonce = "uqbench-done-" + os.urandom(8).hex()
        cgroup = self.make_cgroup(tag)
        with open(os.path.join(root, "stderr"), "wb") as err:
            start = time.monotonic()
            proc = subprocess.Popen(
                self._cmd(
                    os.path.join(root, "runner.py"),
                    os.path.join(root, "solution.py"),
                    nonce,
                    "1" if self.python_guards else "0",
                ),
                cwd=work,
                env=self._env(),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                close_fds=True,
                start_new_session=True,
                # preexec_fn: only async-signal-safe-ish syscalls (setrlimit, unshare, prctl,
                # one write); the sandbox's own callers are single-threaded (run_many needs no
                # threads), see the class docstring.
                preexec_fn=self._preexec(cgroup, self.os_limits(timeout)),
            )  # noqa: PLW1509
        pidfd = None
        if hasattr(os, "pidfd_open"):
            try:
                pidfd = os.pidfd_open(proc.pid)
            except OSError:
                pidfd = None
        return _Job(proc, root, cgroup, nonce, start, start + timeout, pidfd)

    def _wait_any(self, active: dict[int, _Job]) -> list[int]:
        """Block until at least one job exits or hits its deadline; returns their keys."""
        while True:
            now = time.monotonic()
            done = [i for i, j in active.items() if _exited(j.proc.pid) or now >= j.deadline]
            if done:
                return done
            wait = min(j.deadline for j in active.values()) - now
            fds = [j.pidfd for j in active.values() if j.pidfd is not None]
            if len(fds) == len(active):
                select.select(fds, [], [], max(0.0, wait))
            else:
                time.sleep(min(max(0.0, wait), 0.002))

    def _kill(self, job: _Job) -> None:
        try:
            os.killpg(job.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if job.cgroup is not None:
            _kill_cgroup(job.cgroup)

    def _finish(self, job: _Job) -> SandboxResult:
        # The leader is not reaped yet (a zombie at most), so its pid -- the process group id --
        # cannot have been reused: killing the group kills only what this run left behind.
        timed_out = not _exited(job.proc.pid)
        elapsed = time.monotonic() - job.start
        self._kill(job)
        rc = job.proc.wait()
        err = _tail(os.path.join(job.root, "stderr"))
        self._cleanup(job)
        return _verdict(rc, timed_out, err, job.nonce, elapsed, elapsed)

    def _cleanup(self, job: _Job) -> None:
        if job.pidfd is not None:
            try:
                os.close(job.pidfd)
            except OSError:
                pass
            job.pidfd = None
        if job.cgroup is not None:
            _remove_cgroup(job.cgroup)
            job.cgroup = None
        _rmtree(job.root)


#: the wall-clock backstop of a session run with CPU budget t: SESSION_WALL_FACTOR * t +
#: SESSION_WALL_SLACK_S (a program that waits, sleeps or is starved of CPU past any plausible load)
SESSION_WALL_FACTOR = 5.0
SESSION_WALL_SLACK_S = 5.0
#: limits a session's server sets on each child (the rest it sets on itself, and they are
#: inherited): as a normal user RLIMIT_NPROC counts all the user's processes, so the server
#: itself could not fork under it
_CHILD_RLIMITS = ("RLIMIT_CPU", "RLIMIT_NPROC")
#: how long past a run's wall backstop the server may take to answer before it counts as broken
_SERVER_GRACE_S = 60.0


class SandboxSession:
    """Runs many programs under one `Sandbox` configuration through one sandboxed process: a
    fork server that starts as a `Sandbox.run` process would (pids cgroup, network namespace,
    address-space/file-size/open-file limits, no new privileges) and forks one child per
    program. The child starts from the server's clean interpreter state (no program ever runs
    in the server) and sets its own limits: a **CPU-time** budget (``ITIMER_PROF``: measured
    inside the process, so the same whatever the machine's load; RLIMIT_CPU behind it) with a
    wall-clock backstop of ``SESSION_WALL_FACTOR * t + SESSION_WALL_SLACK_S``, and the process
    cap. It runs in its own folder with the same Python guards, and everything it leaves --
    threads, its process group, orphans (the server is their subreaper), files -- is gone
    before the next program starts. A program costs a fork instead of an interpreter start-up.

    ``run(code, timeout_s=t)``: ``t`` is the CPU-time budget (default: the sandbox's
    ``timeout_s``); the result's ``spent_s`` is the program's CPU time. Not thread-safe.
    """

    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox
        self.timeout_s = sandbox.timeout_s
        self._proc: Any = None
        self._root = ""
        self._cgroup: str | None = None
        self._failed: tuple[str, ...] | None = None  # limits the server's set-up could not set

    @property
    def root(self) -> str:
        """The session's folder ("" while no server runs); for tests and diagnostics."""
        return self._root

    @property
    def cgroup(self) -> str | None:
        """The session's pids cgroup (None without one); for tests and diagnostics."""
        return self._cgroup

    @property
    def server_pid(self) -> int | None:
        """The process id of the session's server (None while none runs); for tests and
        diagnostics."""
        return None if self._proc is None else self._proc.pid

    def __enter__(self) -> SandboxSession:  # noqa: PYI034 (typing.Self needs Python 3.11)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, code: str, *, timeout_s: float | None = None) -> SandboxResult:
        """Run one program in a fresh child; it passes when it exits 0 after running to its
        end within its CPU-time budget."""
        budget = self.timeout_s if timeout_s is None else float(timeout_s)
        if budget <= 0:
            raise ValueError(f"SandboxSession.run: timeout_s must be positive, got {budget}")
        if self._proc is None:
            self._open()
        d = os.path.join(self._root, "run")
        self._fresh_work(os.path.join(d, "work"))
        with open(os.path.join(d, "solution.py"), "w", encoding="utf-8") as f:
            f.write(code)
        open(os.path.join(d, "stderr"), "wb").close()  # never the last program's
        nonce = "uqbench-done-" + os.urandom(8).hex()
        wall = SESSION_WALL_FACTOR * budget + SESSION_WALL_SLACK_S
        limits = [(k, *v) for k, v in self.sandbox.os_limits(budget).items()
                  if k in _CHILD_RLIMITS]
        status, late, elapsed, cpu = self._ask((nonce, budget, wall, limits),
                                               wall + _SERVER_GRACE_S)
        err = _tail(os.path.join(d, "stderr"))
        if self._failed is None:  # the server's set-up marks: written before it ran anything
            self._failed = _verdict(0, False, _tail(os.path.join(self._root, "stderr")), "",
                                    0.0, 0.0).limits_failed
        rc = os.waitstatus_to_exitcode(status)
        return _verdict(rc, late or rc == -signal.SIGPROF, err, nonce, elapsed, cpu,
                        self._failed)

    def close(self) -> None:
        """Stop the server and remove everything the session made (idempotent)."""
        proc, self._proc = self._proc, None
        if proc is not None:
            for pipe in (proc.stdin, proc.stdout):
                try:
                    pipe.close()
                except OSError:
                    pass
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
        if self._cgroup is not None:
            _remove_cgroup(self._cgroup)  # kills whatever is still in it
            self._cgroup = None
        if self._root:
            _rmtree(self._root)
            self._root = ""

    @staticmethod
    def _fresh_work(work: str) -> None:
        """Make ``work`` an empty folder of mode 0700, as a new one: the last program's folder
        is kept when it left it so (no files, mode unchanged), else made anew. (Making and
        removing folders costs milliseconds on some file systems: more than a fork.)"""
        try:
            st = os.stat(work, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is not None and stat.S_ISDIR(st.st_mode):
            with os.scandir(work) as it:
                if st.st_mode == 0o40700 and st.st_uid == os.geteuid() and next(it, None) is None:
                    return
            _rmtree(work)
        elif st is not None:  # a link or file put in its place: removed, never followed
            os.unlink(work)
        os.mkdir(work, 0o700)

    def _open(self) -> None:
        import subprocess

        sb = self.sandbox
        tag = f"uqbench-{os.getpid()}-s{next(_TAGS)}"
        self._root = tempfile.mkdtemp(prefix=tag + "-")
        with open(os.path.join(self._root, "server.py"), "w", encoding="utf-8") as f:
            f.write(_SERVER)
        os.mkdir(os.path.join(self._root, "run"), 0o700)
        self._cgroup = sb.make_cgroup(tag, extra=1)  # + the server
        limits = {k: v for k, v in sb.os_limits(sb.timeout_s).items() if k not in _CHILD_RLIMITS}
        cmd = sb._cmd(os.path.join(self._root, "server.py"), self._root,
                      "1" if sb.python_guards else "0")
        with open(os.path.join(self._root, "stderr"), "wb") as err:
            self._proc = subprocess.Popen(
                cmd, cwd=self._root, env=sb._env(), stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=err, close_fds=True, start_new_session=True,
                preexec_fn=sb._preexec(self._cgroup, limits, subreaper=True))  # noqa: PLW1509

    def _ask(self, request: tuple[Any, ...], limit_s: float) -> tuple[int, bool, float, float]:
        """Send one request to the server and wait for its answer."""
        msg = marshal.dumps(request)
        try:
            self._proc.stdin.write(len(msg).to_bytes(4, "big") + msg)
            self._proc.stdin.flush()
            fd = self._proc.stdout.fileno()
            end = time.monotonic() + limit_s
            buf = b""
            while len(buf) < 4 or len(buf) < 4 + int.from_bytes(buf[:4], "big"):
                left = end - time.monotonic()
                if left <= 0 or not select.select([fd], [], [], left)[0]:
                    raise TimeoutError(f"no answer within {limit_s:.0f} s")
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise EOFError("the server exited")
                buf += chunk
        except (OSError, EOFError) as e:  # TimeoutError is an OSError
            err = _tail(os.path.join(self._root, "stderr"))
            self.close()
            raise RuntimeError(f"sandbox session server failed ({e}); its stderr: "
                               f"{err[-500:]!r}") from e
        return marshal.loads(buf[4:])


def _verdict(rc: int, timed_out: bool, err: str, nonce: str, elapsed: float, spent: float,
             failed: tuple[str, ...] = ()) -> SandboxResult:
    """The `SandboxResult` of a run that ended with exit status ``rc`` (``-signal`` if killed),
    after ``timed_out`` or not, with stderr ending in ``err``; ``failed``: limits not set in a
    set-up whose marks are not in ``err`` (a session's server)."""
    finished = nonce in err
    err = err.replace("\n" + nonce + "\n", "").replace(nonce, "")
    marks = [ln for ln in err.splitlines() if ln.startswith(LIMIT_MARK)]
    failed += tuple(ln[len(LIMIT_MARK):].strip() for ln in marks)
    if marks:
        err = "".join(ln for ln in err.splitlines(keepends=True)
                      if not ln.startswith(LIMIT_MARK))
    killed: str | None = None
    if timed_out:
        killed = "timeout"
    elif rc < 0:
        sig = -rc
        if sig in (signal.SIGXCPU, signal.SIGKILL):
            killed = "cpu_time"
        else:
            try:
                killed = "signal:" + signal.Signals(sig).name
            except ValueError:
                killed = f"signal:{sig}"
    elif MEMORY_MARK in err:
        killed = "memory"
    passed = rc == 0 and finished and not timed_out
    return SandboxResult(passed=passed, returncode=rc, timed_out=timed_out,
                         killed_reason=killed, stderr_tail=err[-_STDERR_TAIL:],
                         elapsed_s=elapsed, spent_s=spent, limits_failed=failed)


def _exited(pid: int) -> bool:
    """Whether the child has exited, *without* reaping it."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _tail(path: str, nbytes: int = 8192) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - nbytes))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def _cgroup_pids(cgroup: str) -> list[int]:
    try:
        with open(os.path.join(cgroup, "cgroup.procs")) as f:
            return [int(x) for x in f.read().split()]
    except (OSError, ValueError):
        return []


def _kill_cgroup(cgroup: str, budget_s: float = 2.0) -> None:
    end = time.monotonic() + budget_s
    while True:
        pids = _cgroup_pids(cgroup)
        if not pids or time.monotonic() > end:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.001)


def _remove_cgroup(cgroup: str) -> None:
    for _ in range(200):
        try:
            os.rmdir(cgroup)
            return
        except FileNotFoundError:
            return
        except OSError:
            _kill_cgroup(cgroup, 0.05)
            time.sleep(0.005)


def _rmtree(path: str) -> None:
    def onerror(func: Any, p: str, exc: Any) -> None:
        try:
            os.chmod(os.path.dirname(p), 0o700)
            os.chmod(p, 0o700)
            func(p)
        except OSError:
            pass

    shutil.rmtree(path, onerror=onerror)
