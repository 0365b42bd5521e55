"""Data sources: every staged dataset into `Item`s (a parsed `MCRecord`, or a raw item that the
source's own ``build`` turns into one). The source API is `uqbench.data.sources.api`; the local
data folder, its manifest and record streams are `uqbench.data.sources.files`.

One module per family registers its sources with `register_source`: `adapters` (ARC,
OpenBookQA, SIQA, WinoGrande, BoolQ, PIQA), `mmlu`, `math` (AQuA, GSM8K, MATH, SVAMP, MAWPS)
and `code` (MBPP, HumanEval). A new dataset is one more such module, imported before use.
"""
from __future__ import annotations

from uqbench.data.sources.api import (
    LOADER_VERSION,
    SOURCES,
    Bad,
    HubLoader,
    Item,
    Loaded,
    MCBuild,
    Source,
    get_source,
    list_sources,
    load_source,
    mc,
    need,
    raw_item,
    register_source,
    source_files,
    text,
)
from uqbench.data.sources.files import (
    ENV_VAR,
    file_sha256,
    manifest_records,
    read_manifest,
    resolve_data_dir,
    verified_file,
)

__all__ = [
    "ENV_VAR", "LOADER_VERSION", "SOURCES", "Bad", "HubLoader", "Item", "Loaded", "MCBuild",
    "Source",
    "file_sha256", "get_source", "list_sources", "load_source", "manifest_records", "mc",
    "need", "raw_item", "read_manifest", "register_source", "resolve_data_dir", "source_files",
    "text", "verified_file",
]
