"""Data sources: every staged dataset into `Item`s (a parsed `MCRecord`, or a raw item that the
source's own ``build`` turns into one, see `register_source`).

Two ways in, one result:

* **offline** from a local folder in the layout of ``shared/data`` (``data_dir`` argument, else
  ``$UQBENCH_DATA``), every file checked against the folder's manifest first (`files`);
* **online** through ``datasets.load_dataset`` from the Hugging Face hub, for the sources with a
  hub mapping (`hub`), when no data folder is given.

One module per family registers its sources with `register_source`: `adapters` (ARC,
OpenBookQA, SIQA, WinoGrande, BoolQ, PIQA), `mmlu`, `math` (AQuA, GSM8K, MATH, SVAMP, MAWPS)
and `code` (MBPP, HumanEval). A new dataset is one more such module, imported before use.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from uqbench.data.sources.base import (
    LOADER_VERSION,
    SOURCES,
    Bad,
    Item,
    Loaded,
    MCBuild,
    Source,
    get_source,
    list_sources,
    mc,
    need,
    raw_item,
    read_records,
    register_source,
    text,
)
from uqbench.data.sources.files import (
    ENV_VAR,
    file_sha256,
    iter_by_suffix,
    manifest_records,
    read_manifest,
    resolve_data_dir,
    verified_file,
)
from uqbench.data.sources.hub import HubLoader, hub_rows


def _rel_files(source: Source, split: str, root: Path, rel: str, verify: bool,
               subjects: Sequence[str] | None) -> dict[str, str]:
    """The verified files of one entry of ``source.splits[split]`` (a file, or MMLU's folder)."""
    if source.files is not None:
        return source.files(source, split, root, rel, verify, subjects)
    return {rel: verified_file(root, rel, verify=verify, source=source.name)[1]}


def load_source(name: str, split: str, *, data_dir: str | Path | None = None,
                verify: bool = True, subjects: Sequence[str] | None = None,
                hub_loader: HubLoader | None = None) -> Loaded:
    """Read one (source, split) into `Item`s, locally (verified) or from the hub.

    Parameters
    ----------
    name, split : str
        A registered source (`list_sources`) and one of its splits.
    data_dir : path, optional
        Local data folder; default ``$UQBENCH_DATA``; if neither, the Hugging Face hub.
    verify : bool
        Check each file's sha256 against the folder's manifest (default True).
    subjects : sequence of str, optional
        Keep these subjects (names or groups) of a source that has them (`Source.subjects`:
        MMLU's, see `mmlu.mmlu_subjects`).
    hub_loader : callable, optional
        ``load_dataset``-compatible ``(repo, config, split=...) -> iterable of dict rows``;
        default ``datasets.load_dataset``. Only used on the hub path.

    Raises
    ------
    DataError
        Missing folder/file, changed file, malformed record (with file and line), hub failure.
    ConfigError
        Unknown source, split or subject.
    """
    source = get_source(name, split)
    subs = source.select_subjects(subjects)
    root = resolve_data_dir(data_dir)
    if root is None:
        rows, tags = hub_rows(source, split, hub_loader)
        assert source.hub_parse is not None  # a hub mapping comes with its parser
        return Loaded(name, split, tuple(source.hub_parse(source, split, rows, subs)), tags,
                      "hub")
    stream = source.stream or iter_by_suffix
    files: dict[str, str] = {}
    items: list[Item] = []
    for rel in source.splits[split]:
        rel_files = _rel_files(source, split, root, rel, verify, subs)
        files.update(rel_files)
        part = [it for f in rel_files for it in read_records(
            root / f, f, lambda i, obj: source.parse(source, split, i, obj), stream)]
        # positions run start, start + 2, ...: the numbering the splits were first built with;
        # only their order matters, and GSM8K's record RNG id (`math.gsm8k_problem`), so
        # renumbering them changes the GSM8K records (tests/test_fingerprints.py)
        start = len(items)
        items.extend(dataclasses.replace(it, position=start + 2 * k) for k, it in enumerate(part))
    return Loaded(name, split, tuple(items), files, "local")


def source_files(name: str, split: str, *, data_dir: str | Path | None = None,
                 verify: bool = True, subjects: Sequence[str] | None = None,
                 hub_loader: HubLoader | None = None) -> dict[str, str]:
    """``{file: sha256}`` a (source, split) reads, checked, without parsing (cheap).

    On the hub path this has to load the rows (their hash is the only identity available).
    """
    source = get_source(name, split)
    root = resolve_data_dir(data_dir)
    if root is None:
        return hub_rows(source, split, hub_loader)[1]
    subs = source.select_subjects(subjects) if source.subjects is not None else None
    out: dict[str, str] = {}
    for rel in source.splits[split]:
        out.update(_rel_files(source, split, root, rel, verify, subs))
    return out


__all__ = [
    "ENV_VAR", "LOADER_VERSION", "SOURCES", "Bad", "HubLoader", "Item", "Loaded", "MCBuild",
    "Source",
    "file_sha256", "get_source", "list_sources", "load_source", "manifest_records", "mc",
    "need", "raw_item", "read_manifest", "register_source", "resolve_data_dir", "source_files",
    "text", "verified_file",
]
