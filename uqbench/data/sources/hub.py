"""The Hugging Face hub path: rows of a source's hub splits, and one error for a bad row.

Used when no data folder is given (``data_dir`` / ``$UQBENCH_DATA``). The loader is injectable
(``hub_loader=``, ``load_dataset``-compatible) so the mapping from the hub schema is testable
offline. Each family maps rows to items in its ``hub_parse``.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from uqbench.core.errors import DataError
from uqbench.data.sources.base import Bad, HubParser, Item, Source, need
from uqbench.data.sources.files import ENV_VAR

HubLoader = Callable[..., Any]
HubRows = list[tuple[str, int, dict[str, Any]]]


def _default_hub_loader() -> HubLoader:
    try:
        from datasets import load_dataset
    except ImportError as exc:  # pragma: no cover - datasets is a dependency
        raise DataError("the Hugging Face `datasets` package is needed to load from the hub; "
                        f"install it or set {ENV_VAR} / --data-dir to a local copy") from exc
    return load_dataset


def hub_rows(source: Source, split: str, hub_loader: HubLoader | None
             ) -> tuple[HubRows, dict[str, str]]:
    """``([(tag, index, row)], {tag: sha256 of the rows})`` of a (source, split) on the hub."""
    if split not in source.hub:
        raise DataError(
            f"source {source.name!r} split {split!r} has no Hugging Face hub mapping and no "
            f"local data folder was given: set {ENV_VAR} or pass --data-dir to a copy of "
            "shared/data (see its MANIFEST.txt).")
    repo, config, hub_splits = source.hub[split]
    loader = hub_loader or _default_hub_loader()
    rows: HubRows = []
    files: dict[str, str] = {}
    for hs in hub_splits:
        tag = f"hub:{repo}/{config or 'default'}/{hs}"
        try:
            ds = loader(repo, config, split=hs)
            part = [dict(r) for r in ds]
        except Exception as exc:  # any hub/network/cache failure -> one clear message
            raise DataError(
                f"could not load {repo!r} (config {config!r}, split {hs!r}) from the Hugging "
                f"Face hub: {type(exc).__name__}: {exc}. No local data folder was given: set "
                f"{ENV_VAR} or pass --data-dir to a copy of shared/data (see its MANIFEST.txt), "
                "or connect to the hub.") from exc
        h = hashlib.sha256()
        for r in part:
            h.update(json.dumps(r, sort_keys=True, default=str).encode())
        files[tag] = h.hexdigest()
        rows.extend((tag, i, r) for i, r in enumerate(part))
    return rows, files


@contextmanager
def hub_row(source: str, where: str) -> Iterator[None]:
    """Turn a malformed hub row (`Bad`, KeyError, ...) into a `DataError` naming ``where``."""
    try:
        yield
    except (Bad, KeyError, TypeError, ValueError) as exc:
        raise DataError(f"{where}: malformed {source} record ({exc}); the hub schema may "
                        "have changed: use a local copy (--data-dir)") from None


def hub_raw(*fields: str, make_id: Callable[[dict[str, Any]], str] | None = None) -> HubParser:
    """Hub rows as raw items after checking ``fields``; ids ``<source>/<split>/<n>`` unless
    ``make_id(row)`` names them."""
    def parse(src: Source, split: str, rows: HubRows, subjects: Sequence[str] | None
              ) -> list[Item]:
        items: list[Item] = []
        for tag, i, r in rows:
            with hub_row(src.name, f"{tag} row {i}"):
                need(r, *fields)
                rid = make_id(r) if make_id else f"{src.name}/{split}/{len(items)}"
                items.append(Item(rid, len(items), f"{tag} row {i}", raw=r))
        return items
    return parse
