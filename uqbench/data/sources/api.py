"""The source API: `Source` and its registry (`register_source`, `get_source`), `Item` and
`Loaded`, the record checks (`need`, `text`, `mc`), and `load_source`, which reads one
(source, split) into items, two ways in, one result:

* **offline** from a local folder in the layout of ``shared/data`` (``data_dir`` argument, else
  ``$UQBENCH_DATA``), every file checked against the folder's manifest first
  (`uqbench.data.sources.files`) and streamed through the source's record parser with file and
  line in every error (`read_records`);
* **online** through ``datasets.load_dataset`` from the Hugging Face hub (`hub_rows`), for the
  sources with a hub mapping, when no data folder is given. The loader is injectable
  (``hub_loader=``, ``load_dataset``-compatible) so the mapping from the hub schema is testable
  offline; each family maps rows to items in its ``hub_parse``.

A source family is one module that registers its sources with `register_source`; importing it
is what registers them (`SOURCES` imports the built-in families on first lookup).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from uqbench.core.errors import ConfigError, DataError
from uqbench.core.registry import Registry
from uqbench.data.records import MCRecord
from uqbench.data.sources.files import ENV_VAR, iter_by_suffix, resolve_data_dir, verified_file

#: Bump when the shared machinery (manifest checks, streaming, hub rows) changes what a loader
#: returns for the same files. Each family has its own ``VERSION`` (`Source.version`).
LOADER_VERSION = "1"


@dataclass(frozen=True)
class Item:
    """One loaded example: a parsed `MCRecord`, or a ``raw`` dict its source's ``build`` turns
    into one.

    ``position`` is its index in source order, ``where`` its origin for error messages
    (``file:line``), ``stratum`` a grouping key (MMLU subject) for stratified halves.
    """

    id: str
    position: int
    where: str
    record: MCRecord | None = None
    raw: Mapping[str, Any] | None = None
    stratum: str = ""


@dataclass(frozen=True)
class Loaded:
    """All items of one (source, split) plus where they came from.

    ``files`` maps each data file (relative path) to its sha256; for the hub path it maps
    ``hub:<repo>/<config>/<split>`` to a sha256 of the rows.
    """

    source: str
    split: str
    items: tuple[Item, ...]
    files: Mapping[str, str]
    origin: str  # "local" or "hub"


#: ``parse(source, split, index, obj) -> Item | None``: one record of a data file (None: skip)
RecordParser = Callable[["Source", str, int, Any], "Item | None"]
#: ``hub_parse(source, split, rows, subjects) -> items``: rows are ``(tag, index, dict)``
HubParser = Callable[["Source", str, list[tuple[str, int, dict[str, Any]]],
                      "Sequence[str] | None"], list[Item]]
#: ``files(source, split, data_dir, rel, verify, subjects) -> {file: sha256}`` (verified)
FileLister = Callable[..., dict[str, str]]
#: ``stream(path) -> (line, obj)``: the records of one data file
Streamer = Callable[[Path], Iterator[tuple[int, Any]]]


#: ``build(source, split, item, seed) -> (record or None, stats)``: a raw item's MC form. The
#: source's module reads the dataset's fields into a typed problem and hands it to a builder
#: (`uqbench.data.mc.numeric.numeric_mc`, `uqbench.data.mc.code.code_mc`); the record's id
#: and domain are then set by the split (`uqbench.data.suites.build`). None: the builder
#: rejects the item.
MCBuild = Callable[["Source", str, Item, int], "tuple[MCRecord | None, dict[str, Any]]"]


@dataclass(frozen=True)
class Source:
    """One dataset: its default domain, files and hub mapping, parser and MC builder.

    ``parse`` turns one record of a data file into an `Item`: a parsed `MCRecord`, or a raw item
    when the source has a ``build`` (math, code), which makes the MC form of a raw item;
    ``versions`` then names the version constants of that builder (``{"math_mc_version": "1"}``):
    they key the split cache, so bump one when the builder's output changes. ``sandboxed``
    builders run candidate programs (`uqbench.data.sandbox`): they are run by a process pool and
    their statistics count verified records and runs without OS limits; ``rejects`` is the
    reason counted for an item ``build`` rejects without giving one.
    ``splits`` maps a split name to its data files (relative to the data folder); ``hub`` maps a
    split to ``(repo, config, hub_splits)``, read by ``hub_parse``.
    ``version`` is its family's ``VERSION``: part of the split cache key.
    ``stream`` and ``files`` replace the defaults (JSON array for ``.json``, JSON lines for
    ``.jsonl[.gz]``; one verified file per entry of ``splits``), MMLU's CSV folders use them.
    ``subjects``: for a source whose questions have subjects (MMLU), the names and groups a
    split may be narrowed to -> the subject names (a ConfigError for an unknown one); None: a
    suite role or `uqbench.data.sources.load_source` naming subjects for it is an error.
    """

    name: str
    domain: str
    splits: Mapping[str, tuple[str, ...]]
    parse: RecordParser
    version: str
    hub: Mapping[str, tuple[str, str | None, tuple[str, ...]]] = field(default_factory=dict)
    hub_parse: HubParser | None = None
    description: str = ""
    stream: Streamer | None = None
    files: FileLister | None = None
    build: MCBuild | None = None
    versions: Mapping[str, str] = field(default_factory=dict)
    sandboxed: bool = False
    rejects: str = "rejected by builder"
    subjects: Callable[[Sequence[str]], tuple[str, ...]] | None = None

    def select_subjects(self, subjects: Sequence[str] | None) -> tuple[str, ...] | None:
        """The subject names ``subjects`` (names or groups) stand for; None for None. A
        ConfigError for a source without subjects."""
        if subjects is None:
            return None
        if self.subjects is None:
            raise ConfigError(f"'subjects' only applies to MMLU sources (those with subjects), "
                              f"not {self.name!r}")
        return self.subjects(subjects)

    @property
    def hub_repo(self) -> str | None:
        """The Hugging Face repository of its first hub split; None without a hub mapping."""
        return next(iter(self.hub.values()))[0] if self.hub else None


SOURCES: Registry[Source] = Registry("data source", builtins=(
    "uqbench.data.sources.adapters", "uqbench.data.sources.mmlu",
    "uqbench.data.sources.math", "uqbench.data.sources.code"),
    entry_point_group="uqbench.sources", expects=Source)


def register_source(name: str, *, domain: str, splits: Mapping[str, tuple[str, ...]],
                    version: str, build: MCBuild | None = None,
                    versions: Mapping[str, str] | None = None, sandboxed: bool = False,
                    rejects: str = "rejected by builder",
                    hub: Mapping[str, tuple[str, str | None, tuple[str, ...]]] | None = None,
                    hub_parse: HubParser | None = None, description: str = "",
                    stream: Streamer | None = None, files: FileLister | None = None,
                    subjects: Callable[[Sequence[str]], tuple[str, ...]] | None = None
                    ) -> Callable[[RecordParser], RecordParser]:
    """Decorator: register the record parser it decorates as source ``name`` (see `Source`).

    Decorators stack: one parser may serve several sources (ARC-Easy, ARC-Challenge...).
    A duplicate name is a ValueError, and so are a hub mapping without a ``hub_parse`` and a
    ``build`` without ``versions`` (or the reverse): a builder's output must key the cache.
    """
    if hub and hub_parse is None:
        raise ValueError(f"source {name!r} maps splits to the hub but gives no hub_parse")
    if (build is None) != (not versions) or any(
            not isinstance(k, str) or not isinstance(v, str) for k, v in (versions or {}).items()):
        raise ValueError(f"source {name!r}: a build needs its versions and versions need a build "
                         f"(got build={build!r}, versions={versions!r}); versions map a "
                         "constant's name to its value, e.g. {'math_mc_version': '1'}")

    def deco(parse: RecordParser) -> RecordParser:
        SOURCES.add(name, Source(name, domain, dict(splits), parse, version, dict(hub or {}),
                                 hub_parse, description, stream, files, build,
                                 dict(sorted((versions or {}).items())), sandboxed, rejects,
                                 subjects))
        return parse

    return deco


def list_sources() -> list[str]:
    return SOURCES.names()


def get_source(name: str, split: str | None = None) -> Source:
    """The `Source` called ``name`` (unknown -> `UnknownNameError` listing the valid ones);
    ConfigError listing its splits for a split it lacks."""
    src = SOURCES.get(name)
    if split is not None and split not in src.splits:
        raise ConfigError(f"source {name!r} has no split {split!r}; valid splits: "
                          f"{', '.join(src.splits)}")
    return src


# -- record checks ----------------------------------------------------------------------------

class Bad(Exception):
    """A malformed record; the caller adds file and line."""


def need(d: Any, *keys: str) -> None:
    """``d`` is a mapping holding ``keys`` (else `Bad`)."""
    if not isinstance(d, Mapping):
        raise Bad(f"expected a JSON object, got {type(d).__name__}")
    missing = [k for k in keys if k not in d]
    if missing:
        raise Bad(f"missing field(s) {', '.join(map(repr, missing))}")


def text(d: Mapping[str, Any], key: str) -> str:
    """``d[key]``, which must be a string (else `Bad`)."""
    v = d[key]
    if not isinstance(v, str):
        raise Bad(f"field {key!r} should be a string, got {type(v).__name__}")
    return v


def mc(id_: str, domain: str, question: str, choices: Sequence[str], answer: int, source: str,
       meta: Mapping[str, Any] | None = None) -> MCRecord:
    """A stripped `MCRecord`; empty question or options (or a bad answer) are `Bad`."""
    if not question.strip():
        raise Bad("empty question")
    if any(not isinstance(c, str) or not c.strip() for c in choices):
        raise Bad(f"empty or non-string option in {list(choices)!r}")
    try:
        return MCRecord(id=id_, domain=domain, question=question.strip(),
                        choices=tuple(c.strip() for c in choices), answer=answer, source=source,
                        meta=dict(meta or {}))
    except ValueError as exc:
        raise Bad(str(exc)) from None


def read_records(path: Path, rel: str, parse: Callable[[int, Any], Item | None],
                 stream: Streamer) -> list[Item]:
    """``parse(index, obj)`` over the records of one file; errors name ``path:line``."""
    out: list[Item] = []
    for ln, obj in stream(path):
        try:
            item = parse(len(out), obj)
        except Bad as exc:
            raise DataError(f"{path}:{ln}: malformed record ({exc}). The file does not have "
                            f"the expected format for {rel}; restore it from shared/data."
                            ) from None
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
            raise DataError(f"{path}:{ln}: malformed record ({type(exc).__name__}: {exc}). "
                            f"The file does not have the expected format for {rel}; restore it "
                            "from shared/data.") from None
        if item is not None:
            out.append(dataclasses.replace(item, where=f"{rel}:{ln}"))
    return out


def raw_item(src: Source, split: str, i: int, d: Any, fields: Sequence[str], *,
             make_id: Callable[[Mapping[str, Any]], str] | None = None,
             rename: Mapping[str, str] | None = None) -> Item:
    """A raw item for a builder: ``d`` with ``fields`` checked and keys renamed; its id
    ``make_id(raw)``, default ``<source>/<split>/<i>``."""
    need(d, *fields)
    raw = {(rename or {}).get(k, k): v for k, v in d.items()}
    return Item(make_id(raw) if make_id else f"{src.name}/{split}/{i}", i, "", raw=raw)


# -- the Hugging Face hub -------------------------------------------------------------------

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


# -- loading ---------------------------------------------------------------------------------

def _rel_files(source: Source, split: str, root: Path, rel: str, verify: bool,
               subjects: Sequence[str] | None) -> dict[str, str]:
    """The verified files of one entry of ``source.splits[split]`` (a file, or MMLU's folder)."""
    if source.files is not None:
        return source.files(source, split, root, rel, verify, subjects)
    return {rel: verified_file(root, rel, verify=verify, source=source.name,
                               hub_repo=source.hub_repo)[1]}


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
        # renumbering them changes the GSM8K records (tests/data/suites/test_cache.py)
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
