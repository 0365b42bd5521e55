"""Code: MBPP and HumanEval, raw problems read into `CodeProblem`s that
`uqbench.data.mc.code.code_mc` turns into code MC with sandbox-verified failing mutants.

MBPP's one file holds the google-research splits by task id (`mbpp_role`); the hub's splits
(prompt, test, validation, train) are merged and put back in task-id order.
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from uqbench.data.mc.code import CODE_MC_VERSION, CodeProblem, code_mc
from uqbench.data.mc.numeric import MATH_MC_VERSION
from uqbench.data.records import MCRecord
from uqbench.data.sandbox import SANDBOX_VERSION
from uqbench.data.sources.api import (
    Bad,
    HubRows,
    Item,
    Source,
    hub_raw,
    hub_row,
    need,
    raw_item,
    register_source,
)

#: Bump when parsing or selection changes what these sources return for the same files.
VERSION = "1"

_MBPP_FIELDS = ("task_id", "text", "code", "test_list")
_MBPP_HUB = ("google-research-datasets/mbpp", "full", ("prompt", "test", "validation", "train"))
_HUMANEVAL_FIELDS = ("task_id", "prompt", "entry_point", "canonical_solution", "test")
#: code_mc's output depends on its own version, the sandbox's and the numeric builder's record RNG
_VERSIONS = {"code_mc_version": CODE_MC_VERSION, "math_mc_version": MATH_MC_VERSION,
             "sandbox_version": SANDBOX_VERSION}


def mbpp_problem(raw: Mapping[str, Any]) -> CodeProblem:
    """An MBPP line {"text", "code", "task_id", "test_setup_code", "test_list", ...}; the
    question quotes its first test."""
    tests = [str(t) for t in raw.get("test_list", [])]
    text = str(raw.get("text", "")).strip()
    question = f"{text} Your code should pass: {tests[0].strip()}" if tests else text
    setup = str(raw.get("test_setup_code", "") or "").replace("\r\n", "\n")
    return CodeProblem(
        rid=f"mbpp/{raw['task_id']}", source="mbpp", question=question,
        reference=str(raw.get("code", "")).replace("\r\n", "\n"),
        tests=((setup + "\n" if setup.strip() else "") + "\n".join(tests)) if tests else "",
        entry_point=None, meta={"task_id": raw["task_id"], "n_tests": len(tests)})


def humaneval_problem(raw: Mapping[str, Any]) -> CodeProblem:
    """A HumanEval line {"task_id", "prompt", "canonical_solution", "test", "entry_point"}."""
    num = str(raw["task_id"]).rsplit("/", 1)[-1]
    entry = str(raw["entry_point"])
    return CodeProblem(
        rid=f"humaneval/{num}", source="humaneval", question=str(raw["prompt"]).strip("\n"),
        reference=str(raw["prompt"]) + str(raw["canonical_solution"]),
        tests=str(raw["test"]) + f"\n\ncheck({entry})\n", entry_point=entry,
        meta={"task_id": raw["task_id"], "entry_point": entry})


def _code(problem: Callable[[Mapping[str, Any]], CodeProblem]) -> dict[str, Any]:
    """``register_source`` arguments of a code source: its ``problem`` reader, then `code_mc`."""
    def build(src: Source, split: str, item: Item, seed: int
              ) -> tuple[MCRecord | None, dict[str, Any]]:
        return code_mc(problem(item.raw or {}), seed=seed)
    build.__qualname__ = f"code_mc({problem.__name__})"  # names it in recipes
    return {"build": build, "versions": _VERSIONS, "sandboxed": True}


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


@register_source("mbpp", domain="code", version=VERSION, **_code(mbpp_problem),
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


@register_source("humaneval", domain="code", version=VERSION, **_code(humaneval_problem),
                 splits={"test": ("humaneval/HumanEval.jsonl.gz",)},
                 hub={"test": ("openai/openai_humaneval", None, ("test",))},
                 hub_parse=hub_raw(*_HUMANEVAL_FIELDS, make_id=_humaneval_id),
                 description="HumanEval as code MC (test 164 raw)")
def parse_humaneval(src: Source, split: str, i: int, d: Any) -> Item:
    return raw_item(src, split, i, d, _HUMANEVAL_FIELDS, make_id=_humaneval_id)
