"""Loaders: every staged dataset into `MCRecord` (or a raw item that a builder turns into one).

Two ways in, one result:

* **offline** from a local folder in the layout of ``shared/data`` (``data_dir`` argument, else
  ``$UQBENCH_DATA``). Every file is checked against the folder's manifest (``manifest.json``,
  else ``MANIFEST.txt``; MMLU folders through their ``SHA256SUMS``) before it is parsed: a
  changed file is a `DataError` unless ``verify=False``.
* **online** through ``datasets.load_dataset`` from the Hugging Face hub, for the six datasets of
  the ``pooled`` suite (`HUB`). Used when no data folder is given. The loader is injectable
  (``hub_loader=``) so the mapping from the hub schema is testable offline.

Sources whose multiple-choice form is *built* (GSM8K, MATH, SVAMP, MAWPS -> numeric MC;
MBPP, HumanEval -> code MC with verified mutants) load as raw items; `build_item` converts one
with the builders of `uqbench.data.mathmc` / `uqbench.data.codemc` (imported lazily).

Parsing notes (checked against the data, see tests/test_loaders.py):

* ARC / OpenBookQA / SIQA come from the LLM-Adapters json (``"...question: Q\\n\\nAnswer1: a
  Answer2: b ...\\n\\nAnswer format: answer1/.../answerK"``). The options are cut at the
  *sequential* markers ``" Answer{k+1}: "`` with K taken from the ``Answer format`` line, so an
  option mentioning "Answer2:" out of sequence cannot split it. This reproduces the llm-foundry
  structured test files exactly (question and options) for every 4-option item, which is why it
  is used for the test split too: the llm-foundry ARC jsonl is *not* used because it is wrong on
  ~4% of items (gold shifted by one position on items whose ARC answer keys are "1".."4"; 3-option
  items padded with a duplicated option; 5-option items truncated to 4).
* PIQA comes from the llm-foundry jsonl (structured; identical to LLM-Adapters up to trailing
  spaces), WinoGrande from LLM-Adapters (sentence with "_", two options), BoolQ from LLM-Adapters
  (question only, choices ("no", "yes")), ``boolq-passage`` from llm-foundry (with passage).
* MMLU: ``final_{dev,test}`` CSVs (header, answer 0-3); ``mmlu-prerelease`` the original
  headerless hendrycks CSVs (answer A-D). ``meta["subject"]``.
* AQuA: ``AQuA_test_orig.json`` (5 options, "A)" prefixes stripped). The LLM-Adapters
  ``aqua/test.json`` is not used: its items are in another order and its answers agree with the
  original on only 49/254 items.
"""
from __future__ import annotations

import ast
import csv
import dataclasses
import gzip
import hashlib
import importlib
import inspect
import json
import math
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from uqbench.data.records import MCRecord
from uqbench.errors import ConfigError, DataError

#: Bump when parsing or selection changes what a loader returns for the same files.
LOADER_VERSION = "1"

ENV_VAR = "UQBENCH_DATA"

MMLU_SUBJECTS: tuple[str, ...] = (
    "abstract_algebra", "anatomy", "astronomy", "business_ethics", "clinical_knowledge",
    "college_biology", "college_chemistry", "college_computer_science", "college_mathematics",
    "college_medicine", "college_physics", "computer_security", "conceptual_physics",
    "econometrics", "electrical_engineering", "elementary_mathematics", "formal_logic",
    "global_facts", "high_school_biology", "high_school_chemistry",
    "high_school_computer_science", "high_school_european_history", "high_school_geography",
    "high_school_government_and_politics", "high_school_macroeconomics",
    "high_school_mathematics", "high_school_microeconomics", "high_school_physics",
    "high_school_psychology", "high_school_statistics", "high_school_us_history",
    "high_school_world_history", "human_aging", "human_sexuality", "international_law",
    "jurisprudence", "logical_fallacies", "machine_learning", "management", "marketing",
    "medical_genetics", "miscellaneous", "moral_disputes", "moral_scenarios", "nutrition",
    "philosophy", "prehistory", "professional_accounting", "professional_law",
    "professional_medicine", "professional_psychology", "public_relations", "security_studies",
    "sociology", "us_foreign_policy", "virology", "world_religions",
)
#: Subject groups usable in suite files (``subjects: [high_school]``): name prefix -> subjects.
MMLU_GROUPS: dict[str, tuple[str, ...]] = {
    g: tuple(s for s in MMLU_SUBJECTS if s.startswith(g + "_"))
    for g in ("high_school", "college", "professional")
}


def mmlu_subjects(names: Sequence[str]) -> tuple[str, ...]:
    """Expand subject names and groups (``high_school``, ``college``, ``professional``)."""
    out: list[str] = []
    for n in names:
        if n in MMLU_GROUPS:
            out.extend(MMLU_GROUPS[n])
        elif n in MMLU_SUBJECTS:
            out.append(n)
        else:
            raise ConfigError(f"unknown MMLU subject {n!r}; valid: the groups "
                              f"{', '.join(MMLU_GROUPS)} or one of {', '.join(MMLU_SUBJECTS)}")
    return tuple(dict.fromkeys(out))


# --------------------------------------------------------------------------------------------
# Sources
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Source:
    """One dataset: its default domain, how its MC form is made, its files and hub mapping.

    ``kind`` is ``"mc"`` (records parsed directly) or the builder that makes MC from a raw item
    (``"gsm8k"``, ``"math500"``, ``"numeric"``, ``"mbpp"``, ``"humaneval"``).
    ``splits`` maps a split name to its data files (relative to the data folder); ``hub`` maps a
    split to ``(repo, config, hub_splits)``.
    """

    name: str
    domain: str
    kind: str
    splits: Mapping[str, tuple[str, ...]]
    hub: Mapping[str, tuple[str, str | None, tuple[str, ...]]] = field(default_factory=dict)
    description: str = ""


_MBPP_HUB = ("google-research-datasets/mbpp", "full", ("prompt", "test", "validation", "train"))

SOURCES: dict[str, Source] = {
    s.name: s for s in (
        Source("arc-easy", "science", "mc",
               {"train": ("arc-easy/llm-adapters_train.json",),
                "test": ("arc-easy/llm-adapters_test.json",)},
               {"train": ("allenai/ai2_arc", "ARC-Easy", ("train",)),
                "test": ("allenai/ai2_arc", "ARC-Easy", ("test",))},
               "ARC-Easy (train 2251, test 2376)"),
        Source("arc-challenge", "science", "mc",
               {"train": ("arc-challenge/llm-adapters_train.json",),
                "test": ("arc-challenge/llm-adapters_test.json",)},
               {"train": ("allenai/ai2_arc", "ARC-Challenge", ("train",)),
                "test": ("allenai/ai2_arc", "ARC-Challenge", ("test",))},
               "ARC-Challenge (train 1119, test 1172)"),
        Source("openbookqa", "science", "mc",
               {"train": ("openbookqa/llm-adapters_train.json",),
                "test": ("openbookqa/llm-adapters_test.json",)},
               description="OpenBookQA (train 4957, test 500)"),
        Source("boolq", "commonsense", "mc",
               {"train": ("boolq/llm-adapters_train.json",),
                "test": ("boolq/llm-adapters_test.json",)},
               description="BoolQ question only, no passage (train 9427, test = dev 3270)"),
        Source("boolq-passage", "commonsense", "mc",
               {"test": ("boolq/llm-foundry_boolq_val.jsonl",)},
               description="BoolQ with passage (test = dev 3270)"),
        Source("piqa", "commonsense", "mc", {"test": ("piqa/llm-foundry_piqa_val.jsonl",)},
               description="PIQA (test = valid 1838; no train staged)"),
        Source("siqa", "commonsense", "mc", {"test": ("siqa/llm-adapters_test.json",)},
               description="Social IQa, 3 options (test = dev 1954; no train staged)"),
        Source("winogrande", "commonsense", "mc",
               {"test": ("winogrande/llm-adapters_test.json",)},
               description="WinoGrande, 2 options (test = dev 1267; no train staged)"),
        Source("mmlu", "knowledge", "mc",
               {"dev": ("mmlu/final_dev",), "test": ("mmlu/final_test",)},
               {"dev": ("cais/mmlu", "all", ("dev",)), "test": ("cais/mmlu", "all", ("test",))},
               "MMLU final release, 57 subjects (dev 285, test 14042)"),
        Source("mmlu-prerelease", "knowledge", "mc",
               {"dev": ("mmlu/prerelease_dev",), "val": ("mmlu/prerelease_val",),
                "test": ("mmlu/prerelease_test",)},
               description="MMLU pre-release CSVs (dev 285, val 1542, test 14079)"),
        Source("aqua", "math", "mc", {"test": ("aqua/AQuA_test_orig.json",)},
               description="AQuA-RAT, 5 options (test 254)"),
        Source("gsm8k", "math", "gsm8k",
               {"train": ("gsm8k/train.jsonl",), "test": ("gsm8k/test.jsonl",)},
               {"train": ("openai/gsm8k", "main", ("train",)),
                "test": ("openai/gsm8k", "main", ("test",))},
               "GSM8K as numeric MC (train 7473, test 1319)"),
        Source("math500", "math", "math500", {"test": ("math/math500_test.jsonl",)},
               {"test": ("HuggingFaceH4/MATH-500", None, ("test",))},
               "MATH-500 integer-answer problems as numeric MC (test 500 raw)"),
        Source("math", "math", "math500", {"test": ("math/llm-foundry_math_test.jsonl",)},
               description="full MATH test (5000 raw; contains MATH-500), integer answers as MC"),
        Source("svamp", "math", "numeric", {"test": ("svamp/SVAMP.json",)},
               description="SVAMP as numeric MC (test 1000 raw)"),
        Source("mawps", "math", "numeric",
               {"train": ("mawps/trainset.json",), "valid": ("mawps/validset.json",),
                "test": ("mawps/testset.json",)},
               description="MAWPS as numeric MC (train 1898, valid 237, test 238 raw)"),
        Source("mbpp", "code", "mbpp",
               {"train": ("mbpp/mbpp.jsonl",), "test": ("mbpp/mbpp.jsonl",),
                "all": ("mbpp/mbpp.jsonl",)},
               {"train": _MBPP_HUB, "test": _MBPP_HUB, "all": _MBPP_HUB},
               "MBPP as code MC (train = task ids 1-10 and 511-974: 474; test = 11-510: 500)"),
        Source("humaneval", "code", "humaneval", {"test": ("humaneval/HumanEval.jsonl.gz",)},
               {"test": ("openai/openai_humaneval", None, ("test",))},
               "HumanEval as code MC (test 164 raw)"),
    )
}


def list_sources() -> list[str]:
    return sorted(SOURCES)


def get_source(name: str, split: str | None = None) -> Source:
    """The `Source` called ``name``; ConfigError listing valid names/splits otherwise."""
    try:
        src = SOURCES[name]
    except KeyError:
        raise ConfigError(f"unknown data source {name!r}; valid sources: "
                          f"{', '.join(list_sources())}") from None
    if split is not None and split not in src.splits:
        raise ConfigError(f"source {name!r} has no split {split!r}; valid splits: "
                          f"{', '.join(src.splits)}")
    return src


def mbpp_role(task_id: int) -> str:
    """The google-research MBPP split of a task id: 11-510 test, 1-10 and 511-974 train."""
    return "test" if 11 <= task_id <= 510 else "train"


# --------------------------------------------------------------------------------------------
# Data folder, manifest, verified files
# --------------------------------------------------------------------------------------------

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


@dataclass(frozen=True)
class ManifestEntry:
    file: str
    sha256: str
    records: int | None


_SHA_CACHE: dict[tuple[str, int, int, int, int], str] = {}


def file_sha256(path: Path) -> str:
    """sha256 of a file, memoised on (path, size, mtime) within the process."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
    if key not in _SHA_CACHE:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        _SHA_CACHE[key] = h.hexdigest()
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


def _missing(path: Path, rel: str, source: str | None) -> DataError:
    src = SOURCES.get(source or "")
    hub = (f" or unset {ENV_VAR} and --data-dir to load {source!r} from the Hugging Face hub "
           f"({next(iter(src.hub.values()))[0]})" if src and src.hub else "")
    return DataError(
        f"data file {rel!r} not found: {str(path)!r} does not exist. Copy it into the data "
        f"folder given by --data-dir / {ENV_VAR} (see shared/data/MANIFEST.txt for where it "
        f"comes from){hub}.")


def verified_file(data_dir: Path, rel: str, *, verify: bool = True,
                  source: str | None = None) -> tuple[Path, str]:
    """``(path, sha256)`` of a data file after checking it against the manifest.

    Raises `DataError` if the file is missing, or (``verify=True``) unlisted or changed.
    Files inside a manifest *folder* entry are checked against the folder's ``SHA256SUMS``,
    which is itself checked against the manifest.
    """
    path = data_dir / rel
    if not path.is_file():
        raise _missing(path, rel, source)
    actual = file_sha256(path)
    if not verify:
        return path, actual
    man = _manifest(data_dir)
    folder = rel.rsplit("/", 1)[0]
    if rel in man:
        expected, listed_in = man[rel].sha256, "MANIFEST"
    elif folder in man:
        sums = data_dir / folder / "SHA256SUMS"
        if not sums.is_file():
            raise _missing(sums, f"{folder}/SHA256SUMS", source)
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


def manifest_records(data_dir: Path, rel: str) -> int | None:
    """The record count the manifest gives for a file or folder (None if absent)."""
    e = _manifest(data_dir).get(rel.rstrip("/"))
    return None if e is None else e.records


# --------------------------------------------------------------------------------------------
# Items
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Item:
    """One loaded example: a parsed `MCRecord`, or a ``raw`` dict a builder turns into one.

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
    kind: str
    items: tuple[Item, ...]
    files: Mapping[str, str]
    origin: str  # "local" or "hub"


class _Bad(Exception):
    """A malformed record; the caller adds file and line."""


def _need(d: Any, *keys: str) -> None:
    if not isinstance(d, Mapping):
        raise _Bad(f"expected a JSON object, got {type(d).__name__}")
    missing = [k for k in keys if k not in d]
    if missing:
        raise _Bad(f"missing field(s) {', '.join(map(repr, missing))}")


def _str(d: Mapping[str, Any], key: str) -> str:
    v = d[key]
    if not isinstance(v, str):
        raise _Bad(f"field {key!r} should be a string, got {type(v).__name__}")
    return v


def _mc(id_: str, domain: str, question: str, choices: Sequence[str], answer: int, source: str,
        meta: Mapping[str, Any] | None = None) -> MCRecord:
    if not question.strip():
        raise _Bad("empty question")
    if any(not isinstance(c, str) or not c.strip() for c in choices):
        raise _Bad(f"empty or non-string option in {list(choices)!r}")
    try:
        return MCRecord(id=id_, domain=domain, question=question.strip(),
                        choices=tuple(c.strip() for c in choices), answer=answer, source=source,
                        meta=dict(meta or {}))
    except ValueError as exc:
        raise _Bad(str(exc)) from None


# -- file readers yielding (line number, object) ---------------------------------------------

def _iter_json_array(path: Path) -> Iterator[tuple[int, Any]]:
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


def _iter_jsonl(path: Path) -> Iterator[tuple[int, Any]]:
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


def _records(path: Path, rel: str, parse: Callable[[int, Any], Item | None],
             reader: Callable[[Path], Iterator[tuple[int, Any]]]) -> list[Item]:
    out: list[Item] = []
    for ln, obj in reader(path):
        try:
            item = parse(len(out), obj)
        except _Bad as exc:
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


# -- format parsers ---------------------------------------------------------------------------

_ADAPTERS_MC = re.compile(
    r"^Please choose the correct answer to the question: (?P<q>.*?)\n\n(?P<opts>Answer1: .*)"
    r"\n\nAnswer format: (?P<fmt>answer1(?:/answer\d+)*)$", re.DOTALL)


def parse_adapters_choices(instruction: str) -> tuple[str, list[str], list[str]]:
    """Question, options and option labels of an LLM-Adapters "AnswerK:" instruction.

    >>> parse_adapters_choices("Please choose the correct answer to the question: Q?\\n\\n"
    ...     "Answer1: a Answer2: b c\\n\\nAnswer format: answer1/answer2")
    ('Q?', ['a', 'b c'], ['answer1', 'answer2'])
    """
    m = _ADAPTERS_MC.match(instruction)
    if not m:
        raise _Bad("instruction is not 'Please choose the correct answer to the question: Q"
                   "\\n\\nAnswer1: ... AnswerK: ...\\n\\nAnswer format: answer1/.../answerK'")
    labels = m.group("fmt").split("/")
    if labels != [f"answer{k}" for k in range(1, len(labels) + 1)]:
        raise _Bad(f"answer labels {labels} are not answer1..answerK")
    opts, choices, pos = m.group("opts"), [], 0
    for k in range(1, len(labels) + 1):
        start = pos + len(f"Answer{k}: ")
        if k < len(labels):
            nxt = opts.find(f" Answer{k + 1}: ", start)
            if nxt < 0:
                raise _Bad(f"option marker 'Answer{k + 1}:' not found")
            choices.append(opts[start:nxt])
            pos = nxt + 1
        else:
            choices.append(opts[start:])
    return m.group("q"), choices, labels


def _adapters_mc(source: str, split: str, domain: str) -> Callable[[int, Any], Item]:
    def parse(i: int, d: Any) -> Item:
        _need(d, "instruction", "answer")
        q, choices, labels = parse_adapters_choices(_str(d, "instruction"))
        ans = _str(d, "answer").strip()
        if ans not in labels:
            raise _Bad(f"answer {ans!r} is not one of {labels}")
        rid = f"{source}/{split}/{i}"
        return Item(rid, i, "", record=_mc(rid, domain, q, choices, labels.index(ans), source))
    return parse


_WINO = re.compile(r"^Please choose the correct answer to fill in the blank to complete the given "
                   r"sentence: (?P<s>.*)\n\nOption1: (?P<o1>.*) Option2: (?P<o2>.*) Answer format: "
                   r"option1/option2$", re.DOTALL)


def _winogrande(source: str, split: str, domain: str) -> Callable[[int, Any], Item]:
    def parse(i: int, d: Any) -> Item:
        _need(d, "instruction", "answer")
        m = _WINO.match(_str(d, "instruction"))
        if not m:
            raise _Bad("instruction is not the WinoGrande 'fill in the blank ... Option1: ... "
                       "Option2: ...' format")
        ans = {"option1": 0, "option2": 1}.get(_str(d, "answer").strip())
        if ans is None:
            raise _Bad(f"answer {d['answer']!r} is not option1/option2")
        rid = f"{source}/{split}/{i}"
        return Item(rid, i, "", record=_mc(rid, domain, m.group("s"), [m.group("o1"),
                                                                       m.group("o2")], ans, source))
    return parse


_BOOLQ = re.compile(r"^Please answer the following question with true or false, question: (?P<q>.*)"
                    r"\n\nAnswer format: true/false$", re.DOTALL)


def _boolq(source: str, split: str, domain: str) -> Callable[[int, Any], Item]:
    def parse(i: int, d: Any) -> Item:
        _need(d, "instruction", "answer")
        m = _BOOLQ.match(_str(d, "instruction"))
        if not m:
            raise _Bad("instruction is not the BoolQ 'answer ... with true or false' format")
        ans = {"false": 0, "true": 1}.get(_str(d, "answer").strip())
        if ans is None:
            raise _Bad(f"answer {d['answer']!r} is not true/false")
        rid = f"{source}/{split}/{i}"
        return Item(rid, i, "", record=_mc(rid, domain, m.group("q"), ["no", "yes"], ans, source))
    return parse


def _foundry(source: str, split: str, domain: str) -> Callable[[int, Any], Item]:
    """llm-foundry ``{"query", "choices", "gold"}`` lines (PIQA, BoolQ with passage)."""
    def parse(i: int, d: Any) -> Item:
        _need(d, "query", "choices", "gold")
        q = _str(d, "query").strip()
        q = q.removeprefix("Question: ")
        if not isinstance(d["choices"], list) or not isinstance(d["gold"], int):
            raise _Bad("'choices' should be a list and 'gold' an integer")
        rid = f"{source}/{split}/{i}"
        return Item(rid, i, "", record=_mc(rid, domain, q, d["choices"], d["gold"], source))
    return parse


def _aqua(source: str, split: str, domain: str) -> Callable[[int, Any], Item]:
    def parse(i: int, d: Any) -> Item:
        _need(d, "sQuestion", "options", "lSolutions")
        opts = d["options"]
        letters = "ABCDEFGH"[: len(opts)]
        if not isinstance(opts, list) or any(
                not isinstance(o, str) or not o.startswith(f"{c})") for o, c in zip(opts, letters)):
            raise _Bad("'options' should be a list of 'A)...', 'B)...' strings")
        ans = _str(d, "lSolutions").strip()
        if ans not in letters:
            raise _Bad(f"answer {ans!r} is not one of {list(letters)}")
        rid = f"{source}/{split}/{i}"
        return Item(rid, i, "", record=_mc(rid, domain, _str(d, "sQuestion"),
                                           [o[2:] for o in opts], letters.index(ans), source))
    return parse


def _raw(source: str, split: str, fields: tuple[str, ...],
         make_id: Callable[[int, Mapping[str, Any]], str] | None = None,
         keep: Callable[[Mapping[str, Any]], bool] | None = None,
         rename: Mapping[str, str] | None = None) -> Callable[[int, Any], Item | None]:
    """Raw items for builders: check fields, optionally filter (MBPP ids) and rename keys."""
    def parse(i: int, d: Any) -> Item | None:
        _need(d, *fields)
        raw = {(rename or {}).get(k, k): v for k, v in d.items()}
        if keep is not None and not keep(raw):
            return None
        rid = make_id(i, raw) if make_id else f"{source}/{split}/{i}"
        return Item(rid, i, "", raw=raw)
    return parse


def _mbpp_keep(split: str) -> Callable[[Mapping[str, Any]], bool]:
    def keep(raw: Mapping[str, Any]) -> bool:
        tid = raw["task_id"]
        if not isinstance(tid, int):
            raise _Bad(f"task_id {tid!r} is not an integer")
        return split == "all" or mbpp_role(tid) == split
    return keep


def _humaneval_id(i: int, raw: Mapping[str, Any]) -> str:
    tid = str(raw["task_id"])
    if not re.fullmatch(r"HumanEval/\d+", tid):
        raise _Bad(f"task_id {tid!r} is not 'HumanEval/<n>'")
    return "humaneval/" + tid.split("/")[1]


def _read_local_file(source: Source, split: str, path: Path, rel: str) -> list[Item]:
    name, dom = source.name, source.domain
    if name in ("arc-easy", "arc-challenge", "openbookqa", "siqa"):
        return _records(path, rel, _adapters_mc(name, split, dom), _iter_json_array)
    if name == "winogrande":
        return _records(path, rel, _winogrande(name, split, dom), _iter_json_array)
    if name == "boolq":
        return _records(path, rel, _boolq(name, split, dom), _iter_json_array)
    if name in ("piqa", "boolq-passage"):
        return _records(path, rel, _foundry(name, split, dom), _iter_jsonl)
    if name == "aqua":
        return _records(path, rel, _aqua(name, split, dom), _iter_json_array)
    if name == "gsm8k":
        return _records(path, rel, _raw(name, split, ("question", "answer")), _iter_jsonl)
    if name == "math500":
        return _records(path, rel, _raw(name, split, ("problem", "answer")), _iter_jsonl)
    if name == "math":
        return _records(path, rel, _raw(name, split, ("context", "answer"), rename={
            "context": "problem", "chain_of_thought": "solution", "category": "subject"}),
            _iter_jsonl)
    if name == "svamp":
        return _records(path, rel, _raw(name, split, ("Body", "sQuestion", "lSolutions"),
                                        make_id=lambda i, r: f"svamp/{split}/{r['ID']}"),
                        _iter_json_array)
    if name == "mawps":
        return _records(path, rel, _raw(name, split, ("id", "original_text", "ans"),
                                        make_id=lambda i, r: f"mawps/{split}/{r['id']}"),
                        _iter_json_array)
    if name == "mbpp":
        return _records(path, rel, _raw(
            name, split, ("task_id", "text", "code", "test_list"),
            make_id=lambda i, r: f"mbpp/{r['task_id']}", keep=_mbpp_keep(split)), _iter_jsonl)
    if name == "humaneval":
        return _records(path, rel, _raw(
            name, split, ("task_id", "prompt", "entry_point", "canonical_solution", "test"),
            make_id=_humaneval_id), _iter_jsonl)
    raise AssertionError(f"no local reader for {name}")  # pragma: no cover


def _read_mmlu_dir(source: Source, split: str, folder: Path, rel: str, *, verify: bool,
                   data_dir: Path, subjects: Sequence[str] | None) -> tuple[list[Item], dict]:
    """MMLU CSVs of one folder: ``<subject>_<split>.csv``; final release has a header row."""
    header = source.name == "mmlu"
    files: dict[str, str] = {}
    items: list[Item] = []
    if not folder.is_dir():
        raise _missing(folder, rel + "/", source.name)
    suffix = "_" + folder.name.split("_", 1)[1] + ".csv"  # final_test -> _test.csv
    wanted = subjects if subjects is not None else MMLU_SUBJECTS
    for subj in wanted:
        frel = f"{rel}/{subj}{suffix}"
        path, sha = verified_file(data_dir, frel, verify=verify, source=source.name)
        files[frel] = sha
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.reader(f)
            row_i = 0
            for row in reader:
                ln = reader.line_num
                if header and ln == 1:
                    if row[:6] != ["question", "choice0", "choice1", "choice2", "choice3",
                                   "answer"]:
                        raise DataError(f"{path}:1: expected the header question,choice0..3,"
                                        f"answer, got {row!r}; restore the file from shared/data")
                    continue
                try:
                    if len(row) != 6:
                        raise _Bad(f"expected 6 columns, got {len(row)}")
                    a, valid = row[5].strip(), ("0123" if header else "ABCD")
                    if len(a) != 1 or a not in valid:
                        raise _Bad(f"answer {a!r} is not one of {', '.join(valid)}")
                    ans = valid.index(a)
                    rid = f"{source.name}/{split}/{subj}/{row_i}"
                    rec = _mc(rid, source.domain, row[0], row[1:5], ans, source.name,
                              {"subject": subj})
                except _Bad as exc:
                    raise DataError(f"{path}:{ln}: malformed record ({exc}); restore the file "
                                    "from shared/data") from None
                items.append(Item(rid, len(items), f"{frel}:{ln}", record=rec, stratum=subj))
                row_i += 1
    return items, files


# -- hub --------------------------------------------------------------------------------------

HubLoader = Callable[..., Any]


def _default_hub_loader() -> HubLoader:
    try:
        from datasets import load_dataset
    except ImportError as exc:  # pragma: no cover - datasets is a dependency
        raise DataError("the Hugging Face `datasets` package is needed to load from the hub; "
                        f"install it or set {ENV_VAR} / --data-dir to a local copy") from exc
    return load_dataset


def _hub_rows(source: Source, split: str, hub_loader: HubLoader | None
              ) -> tuple[list[tuple[str, int, dict[str, Any]]], dict[str, str]]:
    if split not in source.hub:
        raise DataError(
            f"source {source.name!r} split {split!r} has no Hugging Face hub mapping and no "
            f"local data folder was given: set {ENV_VAR} or pass --data-dir to a copy of "
            "shared/data (see its MANIFEST.txt).")
    repo, config, hub_splits = source.hub[split]
    loader = hub_loader or _default_hub_loader()
    rows: list[tuple[str, int, dict[str, Any]]] = []
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


def _parse_hub(source: Source, split: str, rows: list[tuple[str, int, dict[str, Any]]],
               subjects: Sequence[str] | None) -> list[Item]:
    name, dom = source.name, source.domain
    items: list[Item] = []
    counters: dict[str, int] = {}
    for tag, i, r in rows:
        where = f"{tag} row {i}"
        try:
            item: Item | None
            if name in ("arc-easy", "arc-challenge"):
                _need(r, "id", "question", "choices", "answerKey")
                texts, labels = list(r["choices"]["text"]), list(r["choices"]["label"])
                if r["answerKey"] not in labels:
                    raise _Bad(f"answerKey {r['answerKey']!r} not in labels {labels}")
                rid = f"{name}/{split}/{len(items)}"
                item = Item(rid, len(items), where, record=_mc(
                    rid, dom, r["question"], texts, labels.index(r["answerKey"]), name,
                    {"hub_id": r["id"]}))
            elif name == "mmlu":
                _need(r, "question", "subject", "choices", "answer")
                subj = str(r["subject"])
                if subjects is not None and subj not in subjects:
                    continue
                k = counters[subj] = counters.get(subj, -1) + 1
                rid = f"mmlu/{split}/{subj}/{k}"
                item = Item(rid, len(items), where, stratum=subj, record=_mc(
                    rid, dom, r["question"], list(r["choices"]), int(r["answer"]), name,
                    {"subject": subj}))
            elif name == "gsm8k":
                _need(r, "question", "answer")
                item = Item(f"gsm8k/{split}/{len(items)}", len(items), where, raw=r)
            elif name == "math500":
                _need(r, "problem", "answer")
                item = Item(f"math500/{split}/{len(items)}", len(items), where, raw=r)
            elif name == "mbpp":
                _need(r, "task_id", "text", "code", "test_list")
                if split != "all" and mbpp_role(int(r["task_id"])) != split:
                    continue
                item = Item(f"mbpp/{r['task_id']}", len(items), where, raw=r)
            elif name == "humaneval":
                _need(r, "task_id", "prompt", "entry_point", "canonical_solution", "test")
                item = Item(_humaneval_id(i, r), len(items), where, raw=r)
            else:  # pragma: no cover - guarded by Source.hub
                raise AssertionError(name)
        except (_Bad, KeyError, TypeError, ValueError) as exc:
            raise DataError(f"{where}: malformed {name} record ({exc}); the hub schema may "
                            "have changed: use a local copy (--data-dir)") from None
        items.append(item)
    if name == "mbpp":  # the hub splits are not in task-id order; the local file is
        items.sort(key=lambda it: int(it.id.split("/")[1]))
        items = [dataclasses.replace(it, position=p) for p, it in enumerate(items)]
    return items


# -- public -----------------------------------------------------------------------------------

def load_source(name: str, split: str, *, data_dir: str | Path | None = None,
                verify: bool = True, subjects: Sequence[str] | None = None,
                hub_loader: HubLoader | None = None) -> Loaded:
    """Read one (source, split) into `Item`s, locally (verified) or from the hub.

    Parameters
    ----------
    name, split : str
        A source of `SOURCES` and one of its splits.
    data_dir : path, optional
        Local data folder; default ``$UQBENCH_DATA``; if neither, the Hugging Face hub.
    verify : bool
        Check each file's sha256 against the folder's manifest (default True).
    subjects : sequence of str, optional
        MMLU only: keep these subjects (names or groups, see `mmlu_subjects`).
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
    subs = mmlu_subjects(subjects) if subjects is not None else None
    if subs is not None and not name.startswith("mmlu"):
        raise ConfigError(f"'subjects' only applies to MMLU sources, not {name!r}")
    root = resolve_data_dir(data_dir)
    if root is None:
        rows, files = _hub_rows(source, split, hub_loader)
        return Loaded(name, split, source.kind, tuple(_parse_hub(source, split, rows, subs)),
                      files, "hub")
    files = {}
    items: list[Item] = []
    for rel in source.splits[split]:
        if name.startswith("mmlu"):
            part, fs = _read_mmlu_dir(source, split, root / rel, rel, verify=verify,
                                      data_dir=root, subjects=subs)
            files.update(fs)
        else:
            path, sha = verified_file(root, rel, verify=verify, source=name)
            files[rel] = sha
            part = _read_local_file(source, split, path, rel)
        items.extend(dataclasses.replace(it, position=len(items) + k)
                     for k, it in enumerate(part))
    return Loaded(name, split, source.kind, tuple(items), files, "local")


def source_files(name: str, split: str, *, data_dir: str | Path | None = None,
                 verify: bool = True, subjects: Sequence[str] | None = None,
                 hub_loader: HubLoader | None = None) -> dict[str, str]:
    """``{file: sha256}`` a (source, split) reads, checked, without parsing (cheap).

    On the hub path this has to load the rows (their hash is the only identity available).
    """
    source = get_source(name, split)
    root = resolve_data_dir(data_dir)
    if root is None:
        return _hub_rows(source, split, hub_loader)[1]
    out: dict[str, str] = {}
    subs = mmlu_subjects(subjects) if subjects is not None else MMLU_SUBJECTS
    for rel in source.splits[split]:
        if name.startswith("mmlu"):
            if not (root / rel).is_dir():
                raise _missing(root / rel, rel + "/", name)
            suffix = "_" + rel.rsplit("/", 1)[1].split("_", 1)[1] + ".csv"
            for s in subs:
                out[f"{rel}/{s}{suffix}"] = verified_file(root, f"{rel}/{s}{suffix}",
                                                          verify=verify, source=name)[1]
        else:
            out[rel] = verified_file(root, rel, verify=verify, source=name)[1]
    return out


# -- builders (math / code MC), lazily imported -----------------------------------------------

BUILDERS: dict[str, tuple[str, str]] = {
    "gsm8k": ("uqbench.data.mathmc", "gsm8k_mc"),
    "math500": ("uqbench.data.mathmc", "math500_mc"),
    "numeric": ("uqbench.data.mathmc", "numeric_mc"),
    "mbpp": ("uqbench.data.codemc", "mbpp_mc"),
    "humaneval": ("uqbench.data.codemc", "humaneval_mc"),
}


def builder_available(kind: str) -> tuple[bool, str]:
    """``(ok, why_not)`` for a builder kind (``"mc"`` is always available)."""
    if kind == "mc":
        return True, ""
    module, fn = BUILDERS[kind]
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        return False, f"{module} is not importable ({exc})"
    if not callable(getattr(mod, fn, None)):
        return False, f"{module} has no function {fn}()"
    return True, ""


def builder_info(kind: str) -> dict[str, Any]:
    """What made a split's choices: builder function, its module's version and source sha256."""
    if kind == "mc":
        return {"method": "source options", "loader_version": LOADER_VERSION}
    module, fn = BUILDERS[kind]
    info: dict[str, Any] = {"method": f"{module}.{fn}", "loader_version": LOADER_VERSION}
    # the builder's declared versions and the sha256 of its code: any edit rebuilds cached splits
    mods = [module] + (["uqbench.data.mathmc", "uqbench.data.sandbox"]
                       if kind in ("mbpp", "humaneval") else [])
    for m in mods:
        try:
            mod = importlib.import_module(m)
        except ImportError:
            continue
        for attr in sorted(vars(mod)):
            if attr.endswith("VERSION") and isinstance(getattr(mod, attr), (str, int)):
                info[attr.lower()] = str(getattr(mod, attr))
        if mod.__file__:
            info[f"{m.rsplit('.', 1)[1]}_sha256"] = file_sha256(Path(mod.__file__))[:16]
    return info


def _stable_seed(seed: int, rid: str) -> int:
    return int(hashlib.sha256(f"{seed}/{rid}".encode()).hexdigest()[:8], 16)


def _svamp_question(raw: Mapping[str, Any]) -> str:
    body = str(raw["Body"]).strip()
    sep = "" if body.endswith((".", "?", "!")) else "."
    return f"{body}{sep} {str(raw['sQuestion']).strip()}".strip()


def _equation_hints(equation: str) -> list[float]:
    """Plausible wrong answers from a word-problem equation: its sub-results, then operands.

    ``"X=((22.0-14.0)/4.0)"`` -> ``[8.0, 22.0, 14.0, 4.0]`` (the full result is left out).
    """
    expr = equation.split("=", 1)[1] if "=" in equation else equation
    try:
        tree = ast.parse(expr.strip(), mode="eval").body
    except SyntaxError:
        return []
    subs: list[float] = []
    consts: list[float] = []

    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            consts.append(float(node.value))
            return float(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        if isinstance(node, ast.BinOp):
            a, b = ev(node.left), ev(node.right)
            ops: dict[type, Callable[[float, float], float]] = {
                ast.Add: lambda x, y: x + y, ast.Sub: lambda x, y: x - y,
                ast.Mult: lambda x, y: x * y, ast.Div: lambda x, y: x / y}
            if type(node.op) not in ops:
                raise ValueError("unsupported operator")
            v = ops[type(node.op)](a, b)
            if node is not tree:
                subs.append(v)
            return v
        raise ValueError("unsupported expression")

    try:
        ev(tree)
    except (ValueError, ZeroDivisionError):
        return []
    return list(dict.fromkeys(v for v in subs[::-1] + consts if math.isfinite(v)))


def _accepts(fn: Callable[..., Any], name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def build_item(kind: str, item: Item, seed: int, domain: str | None = None
               ) -> tuple[MCRecord | None, dict[str, Any]]:
    """Turn one item into an `MCRecord` (None if the builder rejects it) plus builder stats.

    The builder gets a per-item seed derived from ``(seed, item.id)``, so the result does not
    depend on which other items are built or in which process. The record's id is the item's id
    and its domain ``domain`` (default: the builder's).
    """
    stats: dict[str, Any] = {}
    if kind == "mc":
        assert item.record is not None
        rec: MCRecord | None = item.record
    else:
        module, fn_name = BUILDERS[kind]
        fn = getattr(importlib.import_module(module), fn_name)
        s = _stable_seed(seed, item.id)
        raw = dict(item.raw or {})
        split = item.id.split("/")[1] if item.id.count("/") >= 2 else "test"
        if kind == "gsm8k":
            kw: dict[str, Any] = {"split": split} if _accepts(fn, "split") else {}
            rec = fn(raw, seed=s, index=item.position, **kw)
        elif kind == "math500":
            rec = fn(raw, seed=s)
        elif kind == "numeric":
            if "Body" in raw:  # SVAMP
                q, gold, eq = _svamp_question(raw), float(raw["lSolutions"]), raw.get("Equation")
            else:  # MAWPS
                q, gold, eq = str(raw["original_text"]), float(raw["ans"]), raw.get("equation")
            hints = [h for h in _equation_hints(str(eq or "")) if h != gold]
            try:
                rec = fn(q, gold, hints=hints, seed=s, id=item.id, source=item.id.split("/")[0])
            except ValueError as exc:  # e.g. a non-finite gold
                rec, stats = None, {"reason": f"numeric_mc: {exc}"}
        else:
            out = fn(raw, seed=s)
            rec, stats = out if isinstance(out, tuple) else (out, {})
        if isinstance(rec, tuple):  # tolerate builders that also return stats
            rec, stats = rec
        stats = dict(stats or {})
    if rec is not None:
        rec = dataclasses.replace(rec, id=item.id, domain=domain or rec.domain)
    return rec, stats


def load_records(name: str, split: str, *, data_dir: str | Path | None = None,
                 verify: bool = True, seed: int = 0, subjects: Sequence[str] | None = None,
                 hub_loader: HubLoader | None = None) -> list[MCRecord]:
    """All `MCRecord`s of a (source, split), in source order.

    For built sources (math, code) every item goes through its builder (code MC executes tests:
    slow for a whole split; suites build only what their caps need). Items the builder rejects
    (e.g. a MATH answer that is not an integer) are left out.
    """
    loaded = load_source(name, split, data_dir=data_dir, verify=verify, subjects=subjects,
                         hub_loader=hub_loader)
    if loaded.kind != "mc":
        ok, why = builder_available(loaded.kind)
        if not ok:
            raise DataError(f"source {name!r} needs the {loaded.kind} MC builder, which is not "
                            f"available: {why}. Use load_source() for its raw items.")
    out = []
    for it in loaded.items:
        rec, _ = build_item(loaded.kind, it, seed)
        if rec is not None:
            out.append(rec)
    return out


__all__ = [
    "BUILDERS",
    "ENV_VAR",
    "LOADER_VERSION",
    "MMLU_GROUPS",
    "MMLU_SUBJECTS",
    "SOURCES",
    "Item",
    "Loaded",
    "Source",
    "build_item",
    "builder_available",
    "builder_info",
    "file_sha256",
    "get_source",
    "list_sources",
    "load_records",
    "load_source",
    "manifest_records",
    "mbpp_role",
    "mmlu_subjects",
    "parse_adapters_choices",
    "read_manifest",
    "resolve_data_dir",
    "source_files",
    "verified_file",
]
