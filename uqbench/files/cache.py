"""On-disk cache of forward records and trained adapters.

Every entry is addressed by the sha256 of its *key material* (a JSON-able dict: backbone, adapter
checkpoint hash, gate config, split hash, mode, protocol version...) and stores that material
beside the payload. On read the material is compared and the payload fully loaded; a truncated,
corrupt or stale entry is reported, removed and recomputed, never reused. Writes go to a unique
temporary name in the same folder and are published with ``os.replace`` (files) or ``os.rename``
(folders), so a crash or a concurrent run never leaves a half-written entry under the final name.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import uuid
import warnings
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
from numpy.typing import NDArray

#: Bump when anything that changes forward records or metrics changes meaning. 2: frozen-prefix
#: states are computed per text, alone (models trained on version 1 states depended on what the
#: prefix cache held; they are retrained, not reused).
PROTOCOL_VERSION = "2"


class StaleCacheWarning(UserWarning):
    """A cache entry was unreadable or did not match its key and is being recomputed."""


def key_hash(material: Mapping[str, Any]) -> str:
    """sha256 of the canonical JSON of ``material``."""
    blob = json.dumps(material, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()


#: the cache folder when none is given: ``$UQBENCH_CACHE``, else this folder in the working one
CACHE_ENV_VAR, DEFAULT_CACHE_DIR = "UQBENCH_CACHE", ".uqbench-cache"


def resolve_cache_dir(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """``cache_dir`` if given, else ``$UQBENCH_CACHE``, else ``.uqbench-cache``: the one place
    the cache folder is chosen (runs, data builds, converted backbone weights)."""
    return Path(cache_dir if cache_dir is not None
                else os.environ.get(CACHE_ENV_VAR) or DEFAULT_CACHE_DIR)


def source_hash(*modules: ModuleType, extra: str = "") -> str:
    """sha256 of the source of ``modules`` (a package: every module in it) and ``extra``: the
    part of a cache key that changes whenever the code computing the cached values does."""
    import importlib
    import inspect
    import pkgutil

    h = hashlib.sha256()
    for mod in modules:
        subs = [mod]
        if hasattr(mod, "__path__"):  # a package: all of it, in a fixed order
            subs += [importlib.import_module(info.name) for info in sorted(
                pkgutil.walk_packages(mod.__path__, mod.__name__ + "."), key=lambda i: i.name)]
        for m in subs:
            h.update(inspect.getsource(m).encode())
    h.update(extra.encode())
    return h.hexdigest()


def file_sha256(path: str | Path) -> str:
    """sha256 hex digest of a file's bytes, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def tmp_name(path: Path) -> Path:
    """``.NAME.HOST.PID.RANDOM.tmp``: unique, and attributable to its writer by `sweep_orphans`."""
    return path.with_name(f".{path.name}.{socket.gethostname()}.{os.getpid()}."
                          f"{uuid.uuid4().hex[:8]}.tmp")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def sweep_orphans(root: str | Path) -> int:
    """Remove temporary files and folders that writers killed mid-write left under ``root``.

    Only entries written on this host by a process that no longer runs are removed; a live
    writer's, another host's (a cache on a shared file system) and unrecognised names are kept.
    Returns how many were removed.
    """
    mine, removed = (
        re.compile(rf"\.{re.escape(socket.gethostname())}\.(\d+)\.[0-9a-f]{{8}}\.tmp$"),
        0,
    )
    for tmp in list(Path(root).glob("**/.*.tmp")):
        m = mine.search(tmp.name)
        if m is None or not tmp.exists() or _alive(int(m.group(1))):
            continue
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        removed += 1
    return removed


def atomic_write(path: str | Path, write: Callable[[Path], object]) -> None:
    """``write(tmp)`` to a unique temporary name beside ``path``, fsync it, then ``os.replace``
    it onto ``path``: readers see the old file or the whole new one, never a partial file. The
    temporary file is removed if ``write`` fails (`sweep_orphans` removes a killed writer's)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_name(path)
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """`atomic_write` of ``data``."""
    atomic_write(path, lambda tmp: tmp.write_bytes(data))


def atomic_write_text(path: str | Path, text: str) -> None:
    """`atomic_write` of ``text``, UTF-8 encoded."""
    atomic_write_bytes(path, text.encode())


#: the member of an `ArrayCache` entry holding its 0-d arrays as JSON ``{name: [dtype, value]}``
SCALARS = "__scalars__"


class ArrayCache:
    """``kind/<hash>.npz`` entries of named numpy arrays plus their key material; 0-d arrays
    are stored together in one JSON member (`SCALARS`) and read back with their dtypes."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def path(self, kind: str, material: Mapping[str, Any]) -> Path:
        return self.root / kind / f"{key_hash(material)}.npz"

    def get(self, kind: str, material: Mapping[str, Any]) -> dict[str, NDArray[Any]] | None:
        path = self.path(kind, material)
        if not path.exists():
            return None
        try:
            with np.load(path, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}  # reads every member: catches truncation
            stored = json.loads(str(arrays.pop("__key__")))
            if SCALARS in arrays:
                arrays.update({k: np.asarray(v, dtype=t) for k, (t, v)
                               in json.loads(str(arrays.pop(SCALARS))).items()})
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
            self._discard(path, f"unreadable ({type(exc).__name__}: {exc})")
            return None
        if stored != json.loads(json.dumps(material, sort_keys=True, default=str)):
            self._discard(path, "its key does not match (stale entry)")
            return None
        return arrays

    def put(
        self, kind: str, material: Mapping[str, Any], arrays: Mapping[str, NDArray[Any]]
    ) -> Path:
        path = self.path(kind, material)
        key = np.array(json.dumps(material, sort_keys=True, default=str))
        # 0-d numbers and strings go into one JSON member: an npz member costs a header parse
        # on every read, and a scoring entry holds hundreds of scalar columns
        as_arrays = {k: np.asarray(v) for k, v in arrays.items()}
        scalars = {k: (a.dtype.str, a.item()) for k, a in as_arrays.items()
                   if a.ndim == 0 and a.dtype.kind in "biufU"}
        rest = {k: v for k, v in arrays.items() if k not in scalars}

        def write(tmp: Path) -> None:
            with open(tmp, "wb") as f:  # a file object: np.savez would append .npz to a name
                np.savez(f, __key__=key, **({SCALARS: np.array(json.dumps(scalars))}
                                            if scalars else {}), **rest)  # type: ignore[arg-type]

        atomic_write(path, write)
        return path

    def get_or_compute(
        self,
        kind: str,
        material: Mapping[str, Any],
        compute: Callable[[], Mapping[str, NDArray[Any]]],
    ) -> tuple[dict[str, NDArray[Any]], bool]:
        """Return ``(arrays, hit)``; on a miss compute, store and return."""
        hit = self.get(kind, material)
        if hit is not None:
            return hit, True
        arrays = dict(compute())
        self.put(kind, material, arrays)
        return arrays, False

    @staticmethod
    def _discard(path: Path, why: str) -> None:
        warnings.warn(f"cache entry {path.name} is {why}; recomputing it", StaleCacheWarning,
                      stacklevel=3)
        path.unlink(missing_ok=True)


class DirCache:
    """``kind/<hash>/`` folders (trained adapters) published atomically with a ``DONE`` marker.

    ``DONE`` holds the key material plus a sha256 of every file, checked on read.
    """

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def path(self, kind: str, material: Mapping[str, Any]) -> Path:
        return self.root / kind / key_hash(material)

    def get(self, kind: str, material: Mapping[str, Any]) -> Path | None:
        path = self.path(kind, material)
        done = path / "DONE"
        if not path.exists():
            return None
        try:
            meta = json.loads(done.read_text())
            ok = meta["key"] == json.loads(
                json.dumps(material, sort_keys=True, default=str)
            ) and all(file_sha256(path / name) == digest for name, digest in meta["files"].items())
        except (OSError, ValueError, KeyError) as exc:
            ok, why = False, f"incomplete ({type(exc).__name__})"
        else:
            why = "stale or corrupt (key or file hash mismatch)"
        if ok:
            return path
        warnings.warn(f"cached folder {path} is {why}; rebuilding it", StaleCacheWarning,
                      stacklevel=2)
        shutil.rmtree(path, ignore_errors=True)
        return None

    def build(self, kind: str, material: Mapping[str, Any], write: Callable[[Path], None]) -> Path:
        """Run ``write(tmpdir)``, seal it with ``DONE`` and publish it under the final name."""
        final = self.path(kind, material)
        tmp = tmp_name(final)
        tmp.mkdir(parents=True)
        try:
            write(tmp)
            files = {p.name: file_sha256(p) for p in sorted(tmp.iterdir()) if p.is_file()}
            meta = {"key": json.loads(json.dumps(material, sort_keys=True, default=str)),
                    "files": files}
            atomic_write_text(tmp / "DONE", json.dumps(meta, indent=1))
            try:
                os.rename(tmp, final)
            except OSError:  # another run published the same entry first: keep theirs
                shutil.rmtree(tmp, ignore_errors=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return final
