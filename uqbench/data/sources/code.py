"""Code: MBPP and HumanEval, raw problems that `uqbench.data.codemc` turns into code MC with
sandbox-verified failing mutants.

MBPP's one file holds the google-research splits by task id (`mbpp_role`); the hub's splits
(prompt, test, validation, train) are merged and put back in task-id order.
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

from uqbench.data.sources.base import Bad, Item, Source, need, raw_item, register_source
from uqbench.data.sources.hub import HubRows, hub_raw, hub_row

#: Bump when parsing or selection changes what these sources return for the same files.
VERSION = "1"

_MBPP_FIELDS = ("task_id", "text", "code", "test_list")
_MBPP_HUB = ("google-research-datasets/mbpp", "full", ("prompt", "test", "validation", "train"))
_HUMANEVAL_FIELDS = ("task_id", "prompt", "entry_point", "canonical_solution", "test")


def mbpp_role(task_id: int) -> str:
    """The google-research MBPP split of a task id: 11-510 test, 1-10 and 511-974 train."""
    return "test" if 11 <= task_id <= 510 else "train"


def _mbpp_hub(src: Source, split: str, rows: HubRows, subjects: Sequence[str] | None
              ) -> list[Item]:
    items: list[Item] = []
    for tag, i, r in rows:
        with hub_row(src.name, f"{tag} row {i}"):
            need(r, *_MBPP_FIELDS)
            if split != "all" and mbpp_role(int(r["task_id"])) != split:
                continue
            items.append(Item(f"mbpp/{r['task_id']}", len(items), f"{tag} row {i}", raw=r))
    items.sort(key=lambda it: int(it.id.split("/")[1]))  # the hub splits are not in id order
    return [dataclasses.replace(it, position=p) for p, it in enumerate(items)]


@register_source("mbpp", domain="code", kind="mbpp", version=VERSION,
                 splits={"train": ("mbpp/mbpp.jsonl",), "test": ("mbpp/mbpp.jsonl",),
                         "all": ("mbpp/mbpp.jsonl",)},
                 hub={"train": _MBPP_HUB, "test": _MBPP_HUB, "all": _MBPP_HUB},
                 hub_parse=_mbpp_hub, description="MBPP as code MC (train = task ids 1-10 and "
                 "511-974: 474; test = 11-510: 500)")
def parse_mbpp(src: Source, split: str, i: int, d: Any) -> Item | None:
    """An MBPP problem, if its task id is in ``split`` (``all``: every one)."""
    item = raw_item(src, split, i, d, _MBPP_FIELDS, make_id=lambda r: f"mbpp/{r['task_id']}")
    tid = d["task_id"]
    if not isinstance(tid, int):
        raise Bad(f"task_id {tid!r} is not an integer")
    return item if split == "all" or mbpp_role(tid) == split else None


def _humaneval_id(raw: Mapping[str, Any]) -> str:
    tid = str(raw["task_id"])
    if not re.fullmatch(r"HumanEval/\d+", tid):
        raise Bad(f"task_id {tid!r} is not 'HumanEval/<n>'")
    return "humaneval/" + tid.split("/")[1]


@register_source("humaneval", domain="code", kind="humaneval", version=VERSION,
                 splits={"test": ("humaneval/HumanEval.jsonl.gz",)},
                 hub={"test": ("openai/openai_humaneval", None, ("test",))},
                 hub_parse=hub_raw(*_HUMANEVAL_FIELDS, make_id=_humaneval_id), description="HumanEval as code MC (test 164 raw)")
def parse_humaneval(src: Source, split: str, i: int, d: Any) -> Item:
    return raw_item(src, split, i, d, _HUMANEVAL_FIELDS, make_id=_humaneval_id)
