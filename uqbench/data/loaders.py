"""Loaders: the names of the former ``uqbench.data.loaders`` module, kept importable.

The code now lives in one module per concern: `uqbench.data.sources` (the source registry,
`load_source`, `source_files`) with `sources.files` (data folder, manifest, sha256 checks, JSON
streaming), `sources.hub` (the Hugging Face hub path) and one module per source family
(`sources.adapters`, `sources.mmlu`, `sources.math`, `sources.code`); the math and code MC
builders are dispatched by `uqbench.data.builders`.
"""
from __future__ import annotations

from uqbench.data.builders import (
    BUILDERS,
    _equation_hints,
    build_item,
    builder_available,
    builder_info,
    load_records,
)
from uqbench.data.sources import (
    ENV_VAR,
    LOADER_VERSION,
    SOURCES,
    HubLoader,
    Item,
    Loaded,
    Source,
    file_sha256,
    get_source,
    list_sources,
    load_source,
    manifest_records,
    read_manifest,
    register_source,
    resolve_data_dir,
    source_files,
    verified_file,
)
from uqbench.data.sources.adapters import parse_adapters_choices
from uqbench.data.sources.code import mbpp_role
from uqbench.data.sources.mmlu import MMLU_GROUPS, MMLU_SUBJECTS, mmlu_subjects

__all__ = [
    "BUILDERS", "ENV_VAR", "LOADER_VERSION", "MMLU_GROUPS", "MMLU_SUBJECTS", "SOURCES",
    "HubLoader", "Item", "Loaded", "Source", "_equation_hints", "build_item",
    "builder_available", "builder_info", "file_sha256", "get_source", "list_sources",
    "load_records", "load_source", "manifest_records", "mbpp_role", "mmlu_subjects",
    "parse_adapters_choices", "read_manifest", "register_source", "resolve_data_dir",
    "source_files", "verified_file",
]
