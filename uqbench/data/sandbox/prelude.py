"""What every sandboxed program runs first: the guards and `uqb_exec`, which reads the solution,
installs the guards, runs it, and on normal completion writes a per-run nonce to stderr (so an
early ``os._exit(0)`` or ``sys.exit(0)`` cannot pass for "all tests ran"). The runner and the server
call `uqb_exec` from module level, so the solution runs at the same stack depth in both (a
recursion near the limit fails, or not, alike).

Its text comes first in both programs (`uqbench.data.sandbox.host.program`), which run as
one file with no uqbench to import; the marks are what the host reads back from stderr."""
import os
import sys

#: written to stderr when the program runs out of memory
MEMORY_MARK = "uqbench-sandbox: MemoryError"
#: written to the child's stderr by the set-up code when a ``setrlimit`` fails (then parsed into
#: `uqbench.data.sandbox.host.SandboxResult.limits_failed` and removed from ``stderr_tail``)
LIMIT_MARK = "uqbench-sandbox: setrlimit failed: "

def uqb_guards(work):
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
                refuse(f"writing {path!r} outside the sandbox directory")
        elif event in blocked:
            refuse(event)
        elif event == "import":
            if args[0] in blocked_modules:
                refuse("importing " + args[0])
        elif event in path_events:
            for i in path_events[event]:
                if i < len(args) and not inside(args[i]):
                    refuse(f"{event} on {args[i]!r} outside the sandbox directory")

    sys.addaudithook(hook)


def uqb_exec(path, nonce, guards):
    with open(path, encoding="utf-8") as f:
        src = f.read()
    code = compile(src, "<solution>", "exec")
    import linecache
    linecache.cache["<solution>"] = (len(src), None, src.splitlines(True), "<solution>")
    if guards:
        uqb_guards(os.path.realpath(os.getcwd()))
    g = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        exec(code, g)
    except MemoryError:
        os.write(2, ("\n" + MEMORY_MARK + "\n").encode())
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
