"""MMLU: ``final_{dev,test}`` CSVs (header row, answer 0-3) and ``mmlu-prerelease``, the
original headerless hendrycks CSVs (answer A-D); one file per subject, checked through the
folder's ``SHA256SUMS``. ``meta["subject"]`` and the item's ``stratum`` are the subject.
"""
from __future__ import annotations

import csv
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from uqbench.core.errors import ConfigError, DataError
from uqbench.data.sources.api import Bad, HubRows, Item, Source, hub_row, mc, need, register_source
from uqbench.data.sources.files import missing, verified_file

#: Bump when parsing or selection changes what these sources return for the same files.
VERSION = "1"

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
_HEADER = ["question", "choice0", "choice1", "choice2", "choice3", "answer"]


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


def _files(src: Source, split: str, data_dir: Path, rel: str, verify: bool,
           subjects: Sequence[str] | None) -> dict[str, str]:
    """The verified ``<subject>_<split>.csv`` files of one folder, in subject order."""
    if not (data_dir / rel).is_dir():
        raise missing(data_dir / rel, rel + "/", src.name, src.hub_repo)
    suffix = "_" + rel.rsplit("/", 1)[-1].split("_", 1)[1] + ".csv"  # final_test -> _test.csv
    out: dict[str, str] = {}
    for subj in subjects if subjects is not None else MMLU_SUBJECTS:
        frel = f"{rel}/{subj}{suffix}"
        out[frel] = verified_file(data_dir, frel, verify=verify, source=src.name,
                                    hub_repo=src.hub_repo)[1]
    return out


def _csv_rows(header: bool) -> Callable[[Path], Iterator[tuple[int, Any]]]:
    """``(line, (subject, row))`` of one subject's CSV, after checking the header row."""
    def stream(path: Path) -> Iterator[tuple[int, Any]]:
        subject = path.stem.rsplit("_", 1)[0]  # anatomy_dev.csv -> anatomy
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.reader(f)
            for row in reader:
                if header and reader.line_num == 1:
                    if row[:6] != _HEADER:
                        raise DataError(f"{path}:1: expected the header question,choice0..3,"
                                        f"answer, got {row!r}; restore the file from shared/data")
                    continue
                yield reader.line_num, (subject, row)
    return stream


def _mmlu_hub(src: Source, split: str, rows: HubRows, subjects: Sequence[str] | None
              ) -> list[Item]:
    """``cais/mmlu`` rows (``all`` config), numbered within each subject."""
    items: list[Item] = []
    counters: dict[str, int] = {}
    for tag, i, r in rows:
        with hub_row(src.name, f"{tag} row {i}"):
            need(r, "question", "subject", "choices", "answer")
            subj = str(r["subject"])
            if subjects is not None and subj not in subjects:
                continue
            k = counters[subj] = counters.get(subj, -1) + 1
            rid = f"mmlu/{split}/{subj}/{k}"
            items.append(Item(rid, len(items), f"{tag} row {i}", stratum=subj, record=mc(
                rid, src.domain, r["question"], list(r["choices"]), int(r["answer"]), src.name,
                {"subject": subj})))
    return items


@register_source("mmlu", domain="knowledge", version=VERSION,
                 splits={"dev": ("mmlu/final_dev",), "test": ("mmlu/final_test",)},
                 hub={"dev": ("cais/mmlu", "all", ("dev",)),
                      "test": ("cais/mmlu", "all", ("test",))},
                 hub_parse=_mmlu_hub, stream=_csv_rows(header=True), files=_files,
                 subjects=mmlu_subjects,
                 description="MMLU final release, 57 subjects (dev 285, test 14042)")
@register_source("mmlu-prerelease", domain="knowledge", version=VERSION,
                 splits={"dev": ("mmlu/prerelease_dev",), "val": ("mmlu/prerelease_val",),
                         "test": ("mmlu/prerelease_test",)},
                 stream=_csv_rows(header=False), files=_files, subjects=mmlu_subjects,
                 description="MMLU pre-release CSVs (dev 285, val 1542, test 14079)")
def parse_mmlu_row(src: Source, split: str, i: int, obj: tuple[str, list[str]]) -> Item:
    """One CSV row ``question, 4 options, answer`` (0-3 with a header row, else A-D)."""
    subj, row = obj
    if len(row) != 6:
        raise Bad(f"expected 6 columns, got {len(row)}")
    a, valid = row[5].strip(), ("0123" if src.name == "mmlu" else "ABCD")
    if len(a) != 1 or a not in valid:
        raise Bad(f"answer {a!r} is not one of {', '.join(valid)}")
    rid = f"{src.name}/{split}/{subj}/{i}"
    return Item(rid, i, "", stratum=subj, record=mc(
        rid, src.domain, row[0], row[1:5], valid.index(a), src.name, {"subject": subj}))
