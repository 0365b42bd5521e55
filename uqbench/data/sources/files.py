"""Local data files: the data folder, its manifest, sha256-checked files and record streams.

Every file is checked against the folder's manifest (``manifest.json``, else ``MANIFEST.txt``;
MMLU folders through their ``SHA256SUMS``) before it is parsed: a changed file is a `DataError`
unless ``verify=False``.
"""
from __future__ import annotations

import gzip
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from uqbench.core.errors import DataError
from uqbench.files import cache

ENV_VAR = "UQBENCH_DATA"


def resolve_data_dir(data_dir: str | Path | None = None) -> Path | None:
    """``data_dir`` if given, else ``$UQBENCH_DATA``, else None (= the Hugging Face hub).

    A given folder that does not exist is a `DataError`.
    """
    origin = "data_dir / --data-dir"
    if data_dir is None:
        env = os.environ.get(ENV_VAR)
        if not env:
            return None
        data_dir, origin = env, f"${ENV_VAR}"
    path = Path(data_dir).expanduser()
    if not path.is_dir():
        raise DataError(
            f"data folder {str(path)!r} (from {origin}) does not exist. Point {ENV_VAR} or "
            "--data-dir at a copy of shared/data (see its MANIFEST.txt), or unset both to load "
            "the pooled datasets from the Hugging Face hub.")
    return path


# -- manifest ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class ManifestEntry:
    file: str
    sha256: str
    records: int | None


_SHA_CACHE: dict[tuple[str, int, int, int, int], str] = {}


def file_sha256(path: Path) -> str:
    """`uqbench.files.cache.file_sha256`, memoised on (path, size, mtime) within the process."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
    if key not in _SHA_CACHE:
        _SHA_CACHE[key] = cache.file_sha256(path)
    return _SHA_CACHE[key]


def read_manifest(data_dir: Path) -> dict[str, ManifestEntry]:
    """Manifest entries by relative path (``manifest.json``, else ``MANIFEST.txt``).

    Folder entries (``mmlu/final_test/``) are kept under the folder name; their files are
    listed in the folder's ``SHA256SUMS`` (see `verified_file`).
    """
    js, txt = data_dir / "manifest.json", data_dir / "MANIFEST.txt"
    entries: dict[str, ManifestEntry] = {}
    if js.exists():
        try:
            items = json.loads(js.read_text(encoding="utf-8"))
            for it in items:
                name = str(it["file"]).split(" (")[0].rstrip("/")
                entries[name] = ManifestEntry(name, _sums_sha(str(it["sha256"])),
                                              _int_or_none(it.get("records")))
        except (ValueError, KeyError, TypeError) as exc:
            raise DataError(f"{js}: unreadable manifest ({type(exc).__name__}: {exc}); "
                            "restore it from shared/data") from exc
        return entries
    if not txt.exists():
        raise DataError(
            f"data folder {str(data_dir)!r} has no manifest.json or MANIFEST.txt, so its files "
            "cannot be verified. Use a copy of shared/data, or pass verify=False to skip the "
            "sha256 checks.")
    cur: dict[str, str] = {}

    def flush() -> None:
        if "file" in cur and "sha256" in cur:
            entries[cur["file"]] = ManifestEntry(cur["file"], cur["sha256"],
                                                 _int_or_none(cur.get("records")))

    for line in txt.read_text(encoding="utf-8").splitlines():
        if line.startswith("FILE:"):
            flush()
            cur = {"file": line[5:].strip().split(" (")[0].rstrip("/")}
        elif line.startswith("  sha256:"):
            v = line.split(":", 1)[1].strip()
            cur["sha256"] = _sums_sha(v) if "per-file" in v else v
        elif line.startswith("  records:"):
            cur["records"] = line.split(":", 1)[1].strip()
    flush()
    return entries


def _sums_sha(v: str) -> str:
    m = re.search(r"sha256\(SHA256SUMS\)=([0-9a-f]{64})", v)
    return m.group(1) if m else v


def _int_or_none(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


_MANIFEST_CACHE: dict[tuple[Any, ...], dict[str, ManifestEntry]] = {}


def _manifest(data_dir: Path) -> dict[str, ManifestEntry]:
    """`read_manifest`, memoised until the manifest file changes."""
    stamp = []
    for name in ("manifest.json", "MANIFEST.txt"):
        p = data_dir / name
        if p.exists():
            st = p.stat()
            stamp.append((name, st.st_size, st.st_mtime_ns, st.st_ino))
    key = (str(data_dir.resolve()), tuple(stamp))
    if key not in _MANIFEST_CACHE:
        _MANIFEST_CACHE[key] = read_manifest(data_dir)
    return _MANIFEST_CACHE[key]


def manifest_records(data_dir: Path, rel: str) -> int | None:
    """The record count the manifest gives for a file or folder (None if absent)."""
    e = _manifest(data_dir).get(rel.rstrip("/"))
    return None if e is None else e.records


# -- verified files ---------------------------------------------------------------------------

def missing(path: Path, rel: str, source: str | None, hub_repo: str | None = None
            ) -> DataError:
    """The error for a data file (or folder) that is not there, with where to get it: the data
    folder, or source ``source``'s Hugging Face repository ``hub_repo`` when it has one."""
    hub = (f" or unset {ENV_VAR} and --data-dir to load {source!r} from the Hugging Face hub "
           f"({hub_repo})" if source and hub_repo else "")
    return DataError(
        f"data file {rel!r} not found: {str(path)!r} does not exist. Copy it into the data "
        f"folder given by --data-dir / {ENV_VAR} (see shared/data/MANIFEST.txt for where it "
        f"comes from){hub}.")


def verified_file(data_dir: Path, rel: str, *, verify: bool = True,
                  source: str | None = None, hub_repo: str | None = None) -> tuple[Path, str]:
    """``(path, sha256)`` of a data file after checking it against the manifest (``source``
    and ``hub_repo`` name where else to get a missing one, see `missing`).

    Raises `DataError` if the file is missing, or (``verify=True``) unlisted or changed.
    Files inside a manifest *folder* entry are checked against the folder's ``SHA256SUMS``,
    which is itself checked against the manifest.
    """
    path = data_dir / rel
    if not path.is_file():
        raise missing(path, rel, source, hub_repo)
    if not verify:
        return path, file_sha256(path)
    man = _manifest(data_dir)
    folder = rel.rsplit("/", 1)[0]
    if rel in man:
        expected, listed_in = man[rel].sha256, "MANIFEST"
    elif folder in man:
        sums = data_dir / folder / "SHA256SUMS"
        if not sums.is_file():
            raise missing(sums, f"{folder}/SHA256SUMS", source, hub_repo)
        if file_sha256(sums) != man[folder].sha256:
            raise DataError(f"{sums}: sha256 does not match MANIFEST: the checksum list changed "
                            "since the data was staged. Restore it from shared/data, or pass "
                            "verify=False to use the files anyway.")
        table = _read_sums(sums)
        name = rel.rsplit("/", 1)[1]
        if name not in table:
            raise DataError(f"{path}: not listed in {sums}; cannot verify it (pass verify=False "
                            "to skip the check)")
        expected, listed_in = table[name], str(sums.name)
    else:
        raise DataError(f"{path}: not listed in the data folder's MANIFEST, so it cannot be "
                        "verified; use a copy of shared/data or pass verify=False")
    actual = file_sha256(path)
    if actual != expected:
        raise DataError(
            f"{path}: sha256 {actual[:16]}... does not match {listed_in} ({expected[:16]}...): "
            "the file changed since it was staged. Restore the original (source and commit in "
            "MANIFEST.txt) or pass verify=False to use it anyway; splits cached from the old "
            "file are rebuilt, never reused.")
    return path, actual


def _read_sums(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        parts = line.split()
        if len(parts) >= 2:
            out[parts[1]] = parts[0]
    return out


# -- record streams yielding (line number, object) -------------------------------------------

def iter_json_array(path: Path) -> Iterator[tuple[int, Any]]:
    """Elements of a top-level JSON array with the line each starts on."""
    text = path.read_text(encoding="utf-8")
    dec = json.JSONDecoder()
    ws = re.compile(r"\s*")
    i = ws.match(text, 0).end()  # type: ignore[union-attr]
    if not text.startswith("[", i):
        raise DataError(f"{path}:{text.count(chr(10), 0, i) + 1}: expected a JSON array")
    i += 1
    line, last = 1, 0
    while True:
        i = ws.match(text, i).end()  # type: ignore[union-attr]
        if text.startswith("]", i):
            return
        line += text.count("\n", last, i)
        last = i
        try:
            obj, end = dec.raw_decode(text, i)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}:{exc.lineno}: invalid JSON ({exc.msg}); the file is "
                            "corrupt: restore it from shared/data") from None
        yield line, obj
        i = ws.match(text, end).end()  # type: ignore[union-attr]
        if text.startswith(",", i):
            i += 1
        elif not text.startswith("]", i):
            ln = text.count("\n", 0, i) + 1
            raise DataError(f"{path}:{ln}: invalid JSON (expected ',' or ']'); the file is "
                            "corrupt: restore it from shared/data")


def iter_jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    """The objects of a JSON-lines file (``.gz`` read compressed), blank lines skipped."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:  # type: ignore[operator]
            for ln, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    yield ln, json.loads(line)
                except json.JSONDecodeError as exc:
                    raise DataError(f"{path}:{ln}: invalid JSON ({exc.msg}); the line is "
                                    "malformed: restore the file from shared/data") from None
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        if isinstance(exc, DataError):
            raise
        raise DataError(f"{path}: unreadable ({type(exc).__name__}: {exc}); restore it from "
                        "shared/data") from exc


def iter_by_suffix(path: Path) -> Iterator[tuple[int, Any]]:
    """`iter_json_array` for ``.json`` files, `iter_jsonl` for ``.jsonl`` and ``.jsonl.gz``."""
    return iter_json_array(path) if path.suffix == ".json" else iter_jsonl(path)
