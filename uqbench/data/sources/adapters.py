"""Commonsense and science multiple choice: ARC, OpenBookQA, Social IQa, WinoGrande, BoolQ
(LLM-Adapters json) and PIQA, BoolQ with passage (llm-foundry jsonl).

Parsing notes (checked against the data, see tests/data/sources/test_adapters.py):

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
"""
from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from uqbench.data.sources.api import (
    Bad,
    HubRows,
    Item,
    RecordParser,
    Source,
    hub_row,
    mc,
    need,
    register_source,
    text,
)

#: Bump when parsing or selection changes what these sources return for the same files.
VERSION = "1"

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
        raise Bad("instruction is not 'Please choose the correct answer to the question: Q"
                  "\\n\\nAnswer1: ... AnswerK: ...\\n\\nAnswer format: answer1/.../answerK'")
    labels = m.group("fmt").split("/")
    if labels != [f"answer{k}" for k in range(1, len(labels) + 1)]:
        raise Bad(f"answer labels {labels} are not answer1..answerK")
    opts, choices, pos = m.group("opts"), [], 0
    for k in range(1, len(labels) + 1):
        start = pos + len(f"Answer{k}: ")
        if k < len(labels):
            nxt = opts.find(f" Answer{k + 1}: ", start)
            if nxt < 0:
                raise Bad(f"option marker 'Answer{k + 1}:' not found")
            choices.append(opts[start:nxt])
            pos = nxt + 1
        else:
            choices.append(opts[start:])
    return m.group("q"), choices, labels


def _arc_hub(src: Source, split: str, rows: HubRows, subjects: Sequence[str] | None
             ) -> list[Item]:
    """``allenai/ai2_arc`` rows: choices by label (numeric labels map by label, not value)."""
    items: list[Item] = []
    for tag, i, r in rows:
        with hub_row(src.name, f"{tag} row {i}"):
            need(r, "id", "question", "choices", "answerKey")
            texts, labels = list(r["choices"]["text"]), list(r["choices"]["label"])
            if r["answerKey"] not in labels:
                raise Bad(f"answerKey {r['answerKey']!r} not in labels {labels}")
            rid = f"{src.name}/{split}/{len(items)}"
            items.append(Item(rid, len(items), f"{tag} row {i}", record=mc(
                rid, src.domain, r["question"], texts, labels.index(r["answerKey"]), src.name,
                {"hub_id": r["id"]})))
    return items


def _arc(name: str, config: str, description: str) -> Callable[[RecordParser], RecordParser]:
    """`register_source` for an ARC set: LLM-Adapters files, ``allenai/ai2_arc`` on the hub."""
    return register_source(
        name, domain="science", version=VERSION,
        splits={"train": (f"{name}/llm-adapters_train.json",),
                "test": (f"{name}/llm-adapters_test.json",)},
        hub={"train": ("allenai/ai2_arc", config, ("train",)),
             "test": ("allenai/ai2_arc", config, ("test",))},
        hub_parse=_arc_hub, description=description)


@_arc("arc-easy", "ARC-Easy", "ARC-Easy (train 2251, test 2376)")
@_arc("arc-challenge", "ARC-Challenge", "ARC-Challenge (train 1119, test 1172)")
@register_source("openbookqa", domain="science", version=VERSION,
                 splits={"train": ("openbookqa/llm-adapters_train.json",),
                         "test": ("openbookqa/llm-adapters_test.json",)},
                 description="OpenBookQA (train 4957, test 500)")
@register_source("siqa", domain="commonsense", version=VERSION,
                 splits={"test": ("siqa/llm-adapters_test.json",)},
                 description="Social IQa, 3 options (test = dev 1954; no train staged)")
def parse_adapters_mc(src: Source, split: str, i: int, d: Any) -> Item:
    """An LLM-Adapters "Please choose the correct answer ..." record."""
    need(d, "instruction", "answer")
    q, choices, labels = parse_adapters_choices(text(d, "instruction"))
    ans = text(d, "answer").strip()
    if ans not in labels:
        raise Bad(f"answer {ans!r} is not one of {labels}")
    rid = f"{src.name}/{split}/{i}"
    return Item(rid, i, "", record=mc(rid, src.domain, q, choices, labels.index(ans), src.name))


_WINO = re.compile(r"^Please choose the correct answer to fill in the blank to complete the given "
                   r"sentence: (?P<s>.*)\n\nOption1: (?P<o1>.*) Option2: (?P<o2>.*) Answer format: "
                   r"option1/option2$", re.DOTALL)


@register_source("winogrande", domain="commonsense", version=VERSION,
                 splits={"test": ("winogrande/llm-adapters_test.json",)},
                 description="WinoGrande, 2 options (test = dev 1267; no train staged)")
def parse_winogrande(src: Source, split: str, i: int, d: Any) -> Item:
    """An LLM-Adapters WinoGrande record: a sentence with "_" and two options."""
    need(d, "instruction", "answer")
    m = _WINO.match(text(d, "instruction"))
    if not m:
        raise Bad("instruction is not the WinoGrande 'fill in the blank ... Option1: ... "
                  "Option2: ...' format")
    ans = {"option1": 0, "option2": 1}.get(text(d, "answer").strip())
    if ans is None:
        raise Bad(f"answer {d['answer']!r} is not option1/option2")
    rid = f"{src.name}/{split}/{i}"
    return Item(rid, i, "", record=mc(rid, src.domain, m.group("s"),
                                      [m.group("o1"), m.group("o2")], ans, src.name))


_BOOLQ = re.compile(r"^Please answer the following question with true or false, question: (?P<q>.*)"
                    r"\n\nAnswer format: true/false$", re.DOTALL)


@register_source("boolq", domain="commonsense", version=VERSION,
                 splits={"train": ("boolq/llm-adapters_train.json",),
                         "test": ("boolq/llm-adapters_test.json",)},
                 description="BoolQ question only, no passage (train 9427, test = dev 3270)")
def parse_boolq(src: Source, split: str, i: int, d: Any) -> Item:
    """An LLM-Adapters BoolQ record: the question only, options ("no", "yes")."""
    need(d, "instruction", "answer")
    m = _BOOLQ.match(text(d, "instruction"))
    if not m:
        raise Bad("instruction is not the BoolQ 'answer ... with true or false' format")
    ans = {"false": 0, "true": 1}.get(text(d, "answer").strip())
    if ans is None:
        raise Bad(f"answer {d['answer']!r} is not true/false")
    rid = f"{src.name}/{split}/{i}"
    return Item(rid, i, "", record=mc(rid, src.domain, m.group("q"), ["no", "yes"], ans,
                                      src.name))


@register_source("boolq-passage", domain="commonsense", version=VERSION,
                 splits={"test": ("boolq/llm-foundry_boolq_val.jsonl",)},
                 description="BoolQ with passage (test = dev 3270)")
@register_source("piqa", domain="commonsense", version=VERSION,
                 splits={"test": ("piqa/llm-foundry_piqa_val.jsonl",)},
                 description="PIQA (test = valid 1838; no train staged)")
def parse_foundry(src: Source, split: str, i: int, d: Any) -> Item:
    """llm-foundry ``{"query", "choices", "gold"}`` lines (PIQA, BoolQ with passage)."""
    need(d, "query", "choices", "gold")
    q = text(d, "query").strip()
    q = q.removeprefix("Question: ")
    if not isinstance(d["choices"], list) or not isinstance(d["gold"], int):
        raise Bad("'choices' should be a list and 'gold' an integer")
    rid = f"{src.name}/{split}/{i}"
    return Item(rid, i, "", record=mc(rid, src.domain, q, d["choices"], d["gold"], src.name))
