"""Run small, untrusted-but-not-malicious Python programs (dataset solutions and their mutants)
in a constrained subprocess.

Threat model: the code is *buggy*, not hostile -- a mutant that loops forever, allocates without
bound, forks by accident, or writes where it should not. Every run is a fresh interpreter
(``sys.executable -s -S -B [-P]`` with a scrubbed environment: the isolation of ``-I``, but the
hash seed can be pinned so that set/dict order, and therefore pass/fail, is reproducible; ``-S``:
standard library only), in a fresh temporary directory as its working directory, deleted
afterwards. `Sandbox.run_many` runs several at once (2 by default).

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
import math
import os
import resource
import select
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

SANDBOX_VERSION = "1"

_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_PR_SET_NO_NEW_PRIVS = 38
_MEMORY_MARK = "uqbench-sandbox: MemoryError"
#: written to the child's stderr by the set-up code when a ``setrlimit`` fails (then parsed into
#: `SandboxResult.limits_failed` and removed from ``stderr_tail``)
_LIMIT_MARK = "uqbench-sandbox: setrlimit failed: "
_PROBE_MARK = "uqbench-probe: "
#: the OS limits the set-up code applies, in order
_RLIMITS = ("RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_FSIZE", "RLIMIT_NOFILE", "RLIMIT_NPROC",
            "RLIMIT_CORE")
#: `SandboxResult.limits_failed` name of the process cap of a run as root: its pids cgroup
_CGROUP_LIMIT = "pids_cgroup"
# What `Sandbox.protections` runs: it reports what the child actually got (its limits, whether
# PR_SET_NO_NEW_PRIVS is set, its network namespace and cgroup, whether sockets are refused).
_PROBE = r'''
import json, os, resource, sys
got = {"limits": {n: list(resource.getrlimit(getattr(resource, n))) for n in %r}}
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
sys.stderr.write("\n%s" + json.dumps(got) + "\n")
''' % (_RLIMITS, _PROBE_MARK)
_STDERR_TAIL = 2000

# The program the child runs: it reads the solution, installs the guards, runs it, and on normal
# completion writes a per-run nonce to stderr (so an early ``os._exit(0)`` or ``sys.exit(0)``
# cannot pass for "all tests ran").
_RUNNER = r'''
import os, sys

def _uqb_guards(work):
    realpath, join, fspath, fsdecode, getcwd = (os.path.realpath, os.path.join, os.fspath,
                                                os.fsdecode, os.getcwd)
    wflags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    blocked = frozenset((
        "os.fork", "os.forkpty", "os.exec", "os.spawn", "os.posix_spawn", "os.system",
        "subprocess.Popen", "os.kill", "os.killpg", "ctypes.dlopen", "ctypes.dlsym",
        "socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo",
        "socket.gethostbyname", "socket.gethostbyaddr", "socket.sendto", "socket.sendmsg",
        "resource.setrlimit", "resource.prlimit", "pty.spawn",
    ))
    blocked_modules = frozenset(("_posixsubprocess", "ctypes", "_ctypes"))
    path_events = {
        "os.remove": (0,), "os.rename": (0, 1), "os.rmdir": (0,), "os.mkdir": (0,),
        "os.chmod": (0,), "os.chown": (0,), "os.link": (0, 1), "os.symlink": (0, 1),
        "os.truncate": (0,), "os.utime": (0,), "os.chdir": (0,), "shutil.rmtree": (0,),
        "os.setxattr": (0,), "os.removexattr": (0,), "shutil.copyfile": (1,),
        "shutil.copytree": (1,), "shutil.move": (0, 1),
    }
    prefix = work.rstrip(os.sep) + os.sep

    def inside(p):
        if p is None or isinstance(p, int):
            return True  # an already-open descriptor
        p = fspath(p)
        if isinstance(p, bytes):
            p = fsdecode(p)
        full = realpath(join(getcwd(), p))
        return full == work or full.startswith(prefix)

    def refuse(what):
        raise PermissionError("uqbench sandbox: " + what + " is not allowed")

    def hook(event, args):
        if event == "open":
            path, mode, flags = args
            writing = ((isinstance(mode, str) and any(c in mode for c in "wax+"))
                       or (isinstance(flags, int) and flags & wflags))
            if writing and not inside(path):
                refuse("writing %r outside the sandbox directory" % (path,))
        elif event in blocked:
            refuse(event)
        elif event == "import":
            if args[0] in blocked_modules:
                refuse("importing " + args[0])
        elif event in path_events:
            for i in path_events[event]:
                if i < len(args) and not inside(args[i]):
                    refuse("%s on %r outside the sandbox directory" % (event, args[i]))

    sys.addaudithook(hook)


def _uqb_main():
    path, nonce, guards = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
    with open(path, encoding="utf-8") as f:
        src = f.read()
    del sys.argv[1:]
    code = compile(src, "<solution>", "exec")
    import linecache
    linecache.cache["<solution>"] = (len(src), None, src.splitlines(True), "<solution>")
    if guards:
        _uqb_guards(os.path.realpath(os.getcwd()))
    g = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        exec(code, g)
    except MemoryError:
        os.write(2, b"\n''' + _MEMORY_MARK + r'''\n")
        os._exit(3)
    except SystemExit as e:
        os.write(2, b"\nuqbench-sandbox: the program exited before finishing\n")
        os._exit(e.code if isinstance(e.code, int) and 0 < e.code < 256 else 4)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:
        pass
    os.write(2, ("\n" + nonce + "\n").encode())
    os._exit(0)


_uqb_main()
'''


@dataclass(frozen=True)
class SandboxResult:
    """Outcome of one run.

    ``passed``: exit status 0 *and* the program ran to its end. ``killed_reason``: why the run was
    stopped from outside or by a limit: "timeout" (wall clock), "cpu_time", "memory" (allocation
    refused under the address-space limit), "signal:NAME"; None for an ordinary exit (pass or
    failing assertion/exception). ``limits_failed``: OS limits that could not be set.
    """

    passed: bool
    returncode: int | None
    timed_out: bool
    killed_reason: str | None
    stderr_tail: str
    elapsed_s: float = 0.0
    #: OS limits whose ``setrlimit`` failed in this run's set-up (e.g. ``("RLIMIT_AS",)``), and
    #: ``"pids_cgroup"`` when a run as root could not be put in its pids cgroup: the run went on
    #: without them
    limits_failed: tuple[str, ...] = ()

    @property
    def killed(self) -> bool:
        return self.killed_reason is not None


_libc: Any = None


def _get_libc() -> Any:
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(None, use_errno=True)
        except OSError:  # pragma: no cover - non-glibc platforms
            _libc = False
    return _libc


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
        self._cg_root = _pids_cgroup_root()
        self._counter = itertools.count()
        self._probe: dict[str, Any] | None = None

    def __getstate__(self) -> dict[str, Any]:  # picklable, e.g. into a process pool
        state = dict(self.__dict__)
        state["_counter"] = None
        state["_probe"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._counter = itertools.count()

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
            res = self.run(_PROBE, timeout_s=timeout)
            got: dict[str, Any] = {}
            for ln in res.stderr_tail.splitlines():
                if ln.startswith(_PROBE_MARK):
                    try:
                        got = json.loads(ln[len(_PROBE_MARK):])
                    except ValueError:
                        got = {}
            try:
                parent_ns: str | None = os.readlink("/proc/self/ns/net")
            except OSError:
                parent_ns = None
            ok, failed = ["wall_timeout_killpg"], {}
            found = got.get("limits", {})
            for name, want in self._limits(timeout).items():
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
            cg = bool(self._cg_root and got.get("cgroup"))
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

    def _cmd(self, root: str, nonce: str) -> list[str]:
        cmd = [sys.executable, "-s", "-B"]
        if not self.site_packages:
            cmd.append("-S")
        if sys.version_info >= (3, 11):
            cmd.append("-P")
        if self.hash_seed is None:
            cmd.append("-E")
        return cmd + [os.path.join(root, "runner.py"), os.path.join(root, "solution.py"), nonce,
                      "1" if self.python_guards else "0"]

    def _env(self) -> dict[str, str]:
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
               "PYTHONDONTWRITEBYTECODE": "1", "PYTHONIOENCODING": "utf-8",
               "HOME": "/nonexistent", "TMPDIR": "."}
        if self.hash_seed is not None:
            env["PYTHONHASHSEED"] = str(int(self.hash_seed))
        return env

    def _limits(self, timeout: float) -> dict[str, tuple[int, int]]:
        """(soft, hard) of each OS limit in `_RLIMITS` for a run of ``timeout`` seconds."""
        mem = self.memory_mb * 1024 * 1024
        cpu = math.ceil(timeout) + 1
        fsize = self.file_size_mb * 1024 * 1024
        return {"RLIMIT_AS": (mem, mem), "RLIMIT_CPU": (cpu, cpu + 1),
                "RLIMIT_FSIZE": (fsize, fsize),
                "RLIMIT_NOFILE": (self.max_open_files, self.max_open_files),
                "RLIMIT_NPROC": (self.max_processes, self.max_processes), "RLIMIT_CORE": (0, 0)}

    def _preexec(self, cgroup: str | None, timeout: float) -> Any:
        # resolved now, in the parent: the child only calls setrlimit and writes bytes
        limits = [(getattr(resource, name), val, (_LIMIT_MARK + name + "\n").encode())
                  for name, val in self._limits(timeout).items()]
        # a pids cgroup was wanted (root with a writable one): not getting into it is a failed
        # limit too, whether it could not be made (`_make_cgroup`) or joined
        cg_mark = (_LIMIT_MARK + _CGROUP_LIMIT + "\n").encode() if self._cg_root else None
        isolate = self.isolate_network and sys.platform == "linux"
        is_root = self._is_root
        libc = _get_libc() if sys.platform == "linux" else False

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
            if isolate and libc and libc.unshare(_CLONE_NEWNET) != 0 and not is_root:
                libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNET)
            for lim, val, mark in limits:
                try:
                    resource.setrlimit(lim, val)
                except (ValueError, OSError):
                    os.write(2, mark)  # reported in SandboxResult.limits_failed
            if libc:
                libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)

        return fn

    def _make_cgroup(self, tag: str) -> str | None:
        if self._cg_root is None:
            return None
        path = os.path.join(self._cg_root, tag)
        try:
            os.mkdir(path)
            with open(os.path.join(path, "pids.max"), "w") as f:
                f.write(str(self.max_processes))
            return path
        except OSError:
            try:
                os.rmdir(path)
            except OSError:
                pass
            return None

    def _start(self, code: str, timeout: float) -> _Job:
        import subprocess

        n = next(self._counter)
        tag = f"uqbench-{os.getpid()}-{n}"
        root = tempfile.mkdtemp(prefix=tag + "-")
        work = os.path.join(root, "work")
        os.mkdir(work, 0o700)
        with open(os.path.join(root, "runner.py"), "w", encoding="utf-8") as f:
            f.write(_RUNNER)
        with open(os.path.join(root, "solution.py"), "w", encoding="utf-8") as f:
            f.write(code)
        nonce = "uqbench-done-" + os.urandom(8).hex()
        cgroup = self._make_cgroup(tag)
        with open(os.path.join(root, "stderr"), "wb") as err:
            start = time.monotonic()
            proc = subprocess.Popen(
                self._cmd(root, nonce), cwd=work, env=self._env(), stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=err, close_fds=True, start_new_session=True,
                # preexec_fn: only async-signal-safe-ish syscalls (setrlimit, unshare, prctl,
                # one write); the sandbox's own callers are single-threaded (run_many needs no
                # threads), see the class docstring.
                preexec_fn=self._preexec(cgroup, timeout))  # noqa: PLW1509
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
        finished = job.nonce in err
        err = err.replace("\n" + job.nonce + "\n", "").replace(job.nonce, "")
        failed = tuple(ln[len(_LIMIT_MARK):].strip() for ln in err.splitlines()
                       if ln.startswith(_LIMIT_MARK))
        if failed:
            err = "".join(ln for ln in err.splitlines(keepends=True)
                          if not ln.startswith(_LIMIT_MARK))
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
        elif _MEMORY_MARK in err:
            killed = "memory"
        passed = rc == 0 and finished and not timed_out
        return SandboxResult(passed=passed, returncode=rc, timed_out=timed_out,
                             killed_reason=killed, stderr_tail=err[-_STDERR_TAIL:],
                             elapsed_s=elapsed, limits_failed=failed)

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
