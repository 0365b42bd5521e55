"""The fork server of a `SandboxSession`: argv = its folder, guards on ("1") or off. It reads
requests (4-byte length + marshal of (nonce, cpu_s, wall_s, [(rlimit, soft, hard), ...])) on
fd 0 and forks one child per request. The child takes its own process group, descriptors,
folder and limits (CPU time: an ITIMER_PROF at cpu_s, whose SIGPROF kills it, and RLIMIT_CPU
behind it; the process cap) and runs ``<folder>/run/solution.py`` in ``run/work`` with stderr
to ``run/stderr``. The server never runs candidate code itself, so each child starts
from the same clean state. It waits up to wall_s, kills the child's process group and every
process left below it (it is their subreaper), and answers (4-byte length + marshal of (wait
status, wall backstop hit, wall s, CPU s of the child)) on fd 1. It imports no module that
seeds state a child could share (random, tempfile) or that the guards refuse (ctypes)."""
import linecache  # noqa: F401  # as every `uqb_exec` imports it: once here, not per child
import marshal
import os
import resource
import select
import signal
import sys
import time

from uqbench.data.sandbox.prelude import LIMIT_MARK, uqb_exec  # the prelude's text, in the program

_uqb_root, _uqb_guarded = sys.argv[1], sys.argv[2] == "1"
del sys.argv[1:]


def _uqb_read(n):
    buf = b""
    while len(buf) < n:
        chunk = os.read(0, n - len(buf))
        if not chunk:
            return b""
        buf += chunk
    return buf


def _uqb_child(limits):
    os.setpgid(0, 0)
    d = os.path.join(_uqb_root, "run")
    null = os.open(os.devnull, os.O_RDWR)
    err = os.open(os.path.join(d, "stderr"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(null, 0)  # the request and answer pipes: closed in the child
    os.dup2(null, 1)
    os.dup2(err, 2)
    os.closerange(3, 65536)
    os.chdir(os.path.join(d, "work"))
    for name, soft, hard in limits:
        try:
            resource.setrlimit(getattr(resource, name), (soft, hard))
        except (ValueError, OSError):
            os.write(2, (LIMIT_MARK + name + "\n").encode())
    signal.signal(signal.SIGPROF, signal.SIG_DFL)
    return os.path.join(d, "solution.py")


def _uqb_exited(pid):
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _uqb_reap():
    kids_of = f"/proc/self/task/{os.getpid()}/children"
    while True:
        try:
            with open(kids_of) as f:
                kids = [int(x) for x in f.read().split()]
        except OSError:
            kids = []
        for k in kids:
            try:
                os.kill(k, signal.SIGKILL)
            except OSError:
                pass
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            return
        if not kids:
            return


_uqb_fd: int | None = None  # the child's pidfd, where the OS has them

while True:
    _uqb_head = _uqb_read(4)
    if not _uqb_head:
        break
    _uqb_nonce, _uqb_cpu, _uqb_wall, _uqb_limits = marshal.loads(
        _uqb_read(int.from_bytes(_uqb_head, "big")))
    _uqb_t0 = time.monotonic()
    _uqb_pid = os.fork()
    if _uqb_pid == 0:
        try:
            _uqb_path = _uqb_child(_uqb_limits)
            signal.setitimer(signal.ITIMER_PROF, _uqb_cpu)
            uqb_exec(_uqb_path, _uqb_nonce, _uqb_guarded)
        except BaseException:
            sys.excepthook(*sys.exc_info())  # as the interpreter reports an uncaught error
            try:
                sys.stderr.flush()
            except BaseException:
                pass
        os._exit(1)
    try:
        os.setpgid(_uqb_pid, _uqb_pid)
    except OSError:
        pass
    try:
        _uqb_fd = os.pidfd_open(_uqb_pid)
    except (AttributeError, OSError):
        _uqb_fd = None
    while not _uqb_exited(_uqb_pid):
        _uqb_left = _uqb_t0 + _uqb_wall - time.monotonic()
        if _uqb_left <= 0:
            break
        if _uqb_fd is not None:
            select.select([_uqb_fd], [], [], _uqb_left)
        else:
            time.sleep(min(_uqb_left, 0.002))
    _uqb_elapsed = time.monotonic() - _uqb_t0
    _uqb_late = not _uqb_exited(_uqb_pid)
    if _uqb_fd is not None:
        os.close(_uqb_fd)
    try:
        os.killpg(_uqb_pid, signal.SIGKILL)
    except OSError:
        pass
    _uqb_status, _uqb_ru = os.wait4(_uqb_pid, 0)[1:]
    _uqb_reap()
    _uqb_msg = marshal.dumps((_uqb_status, _uqb_late, _uqb_elapsed,
                              _uqb_ru.ru_utime + _uqb_ru.ru_stime))
    _uqb_msg = len(_uqb_msg).to_bytes(4, "big") + _uqb_msg
    while _uqb_msg:
        _uqb_msg = _uqb_msg[os.write(1, _uqb_msg):]
