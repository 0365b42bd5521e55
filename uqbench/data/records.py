"""The canonical multiple-choice record and a built, hashed split."""
from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class MCRecord:
    """One multiple-choice question.

    ``answer`` indexes ``choices``. ``meta`` holds source-specific extras (subject, level, how
    distractors were made...) and must be JSON-serialisable.
    """

    id: str
    domain: str
    question: str
    choices: tuple[str, ...]
    answer: int
    source: str
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.choices) < 2:
            raise ValueError(
                f"record {self.id!r}: needs at least 2 choices, got {len(self.choices)}"
            )
        if not 0 <= self.answer < len(self.choices):
            raise ValueError(f"record {self.id!r}: answer {self.answer} outside "
                             f"[0, {len(self.choices)})")

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "domain": self.domain, "question": self.question,
                "choices": list(self.choices), "answer": self.answer, "source": self.source,
                "meta": dict(self.meta)}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> MCRecord:
        return MCRecord(id=d["id"], domain=d["domain"], question=d["question"],
                        choices=tuple(d["choices"]), answer=int(d["answer"]), source=d["source"],
                        meta=d.get("meta", {}))


def content_hash(records: tuple[MCRecord, ...]) -> str:
    """sha256 over the canonical JSON of the records, in order (first 16 hex digits)."""
    h = hashlib.sha256()
    for r in records:
        h.update(json.dumps(r.to_json(), sort_keys=True, ensure_ascii=False).encode())
        h.update(b"\n")
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class Split:
    """A built split: one domain's ``role`` ("train", "calib", "id" or "shift").

    ``recipe`` says how it was built (sources with their file sha256, filters, caps, seed,
    distractor method) and ``hash`` is `content_hash` of the records.
    """

    domain: str
    role: str
    records: tuple[MCRecord, ...]
    recipe: Mapping[str, Any]
    hash: str = ""

    def __post_init__(self) -> None:
        if not self.records:
            raise ValueError(f"split {self.domain}/{self.role} is empty; check the data source "
                             "and the profile caps")
        if not self.hash:
            object.__setattr__(self, "hash", content_hash(self.records))

    @property
    def name(self) -> str:
        return f"{self.domain}/{self.role}"

    @property
    def n_choices(self) -> int:
        return max(len(r.choices) for r in self.records)
