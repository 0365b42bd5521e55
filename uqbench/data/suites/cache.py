"""The split cache: each built split is a JSON file
``cache_dir/<suite>/<domain>-<role>-<key>.json`` whose ``<key>`` is the sha256 of its key
material (`uqbench.files.cache.key_hash`).

**Key material** (`uqbench.data.suites.build`): the suite spec of the domain, caps, seed, the sha256
of every source file of the domain (a changed source file never hits an old entry), and the
*version constants* of the code that made it: ``SUITE_VERSION`` (selection), ``LOADER_VERSION``
(shared loading machinery), each source family's ``VERSION`` and each built source's
``versions`` (`uqbench.data.suites.build.builder_info`: ``BUILD_ITEM_VERSION``, ``MATH_MC_VERSION``,
``CODE_MC_VERSION``, ``SANDBOX_VERSION``). An edit that changes what a loader or builder
returns must bump its constant by hand; tests/data/suites/test_cache.py fails until it does, while
an edit that changes nothing (a comment, a refactoring) keeps every cached split -- notably the
sandbox-verified code splits, which are slow to rebuild.

Entries are written atomically (`uqbench.files.cache.atomic_write_text`); on read the stored key and
the records' content hash are checked and a corrupt or stale entry is removed (with a
`StaleCacheWarning`) and rebuilt.
"""
from __future__ import annotations

import json
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from uqbench.data.records import MCRecord, Split, content_hash
from uqbench.files.cache import StaleCacheWarning, atomic_write_text, key_hash

#: Cache file format.
CACHE_FORMAT = 1


def canon(x: Any) -> Any:
    """``x`` as it reads back from JSON (sorted keys, tuples as lists, others as str)."""
    return json.loads(json.dumps(x, sort_keys=True, default=str))


class SplitCache:
    """``root/<suite>/<domain>-<role>-<keyhash>.json`` entries (see the module doc); no root:
    nothing is cached. ``used`` maps (domain, role) to the entry this cache last served or
    wrote: the files a suite was built from (another profile's entry of the same split has
    another key)."""

    def __init__(self, root: str | Path | None) -> None:
        self.root = Path(root) if root is not None else None
        self.used: dict[tuple[str, str], Path] = {}

    def path(self, suite: str, domain: str, role: str, material: Mapping[str, Any]) -> Path:
        assert self.root is not None
        return self.root / suite / f"{domain}-{role}-{key_hash(material)[:24]}.json"

    def get(self, suite: str, domain: str, role: str, material: Mapping[str, Any]
            ) -> Split | None:
        if self.root is None:
            return None
        path = self.path(suite, domain, role, material)
        if not path.exists():
            return None
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
            if d.get("format") != CACHE_FORMAT or d["key"] != canon(material):
                raise ValueError("key mismatch (stale entry)")
            records = tuple(MCRecord.from_json(r) for r in d["records"])
            h = content_hash(records)
            if h != d["hash"]:
                raise ValueError(f"content hash {h} != stored {d['hash']}")
            split = Split(d["domain"], d["role"], records, d["recipe"], h)
            if (split.domain, split.role) != (domain, role):
                raise ValueError("domain/role mismatch")
            int(split.recipe["selection"]["stop"])
            self.used[domain, role] = path
            return split
        except (OSError, ValueError, KeyError, TypeError) as exc:
            warnings.warn(f"cached split {path} is corrupt or stale ({type(exc).__name__}: "
                          f"{exc}); rebuilding it", StaleCacheWarning, stacklevel=3)
            path.unlink(missing_ok=True)
            return None

    def put(self, suite: str, material: Mapping[str, Any], split: Split) -> None:
        if self.root is None:
            return
        path = self.path(suite, split.domain, split.role, material)
        blob = {"format": CACHE_FORMAT, "key": canon(material), "domain": split.domain,
                "role": split.role, "hash": split.hash, "recipe": canon(split.recipe),
                "records": [r.to_json() for r in split.records]}
        atomic_write_text(path, json.dumps(blob, ensure_ascii=False, sort_keys=True))
        self.used[split.domain, split.role] = path


__all__ = ["CACHE_FORMAT", "SplitCache", "canon"]
