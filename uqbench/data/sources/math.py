"""Math: AQuA-RAT (5 options, parsed) and the sources whose MC form is built from a numeric
answer by `uqbench.data.mathmc`: GSM8K, MATH-500 and the full MATH test (integer answers),
SVAMP and MAWPS.

AQuA is read from ``AQuA_test_orig.json`` ("A)" prefixes stripped). The LLM-Adapters
``aqua/test.json`` is not used: its items are in another order and its answers agree with the
original on only 49/254 items.
"""
from __future__ import annotations

from typing import Any

from uqbench.data.sources.base import (
    Bad,
    Item,
    RecordParser,
    Source,
    mc,
    need,
    raw_item,
    register_source,
    text,
)
from uqbench.data.sources.hub import hub_raw

#: Bump when parsing or selection changes what these sources return for the same files.
VERSION = "1"


@register_source("aqua", domain="math", version=VERSION,
                 splits={"test": ("aqua/AQuA_test_orig.json",)},
                 description="AQuA-RAT, 5 options (test 254)")
def parse_aqua(src: Source, split: str, i: int, d: Any) -> Item:
    """An AQuA record: ``options`` "A)..", "B)..", answer letter ``lSolutions``."""
    need(d, "sQuestion", "options", "lSolutions")
    opts = d["options"]
    letters = "ABCDEFGH"[: len(opts)]
    if not isinstance(opts, list) or any(
            not isinstance(o, str) or not o.startswith(f"{c})") for o, c in zip(opts, letters)):
        raise Bad("'options' should be a list of 'A)...', 'B)...' strings")
    ans = text(d, "lSolutions").strip()
    if ans not in letters:
        raise Bad(f"answer {ans!r} is not one of {list(letters)}")
    rid = f"{src.name}/{split}/{i}"
    return Item(rid, i, "", record=mc(rid, src.domain, text(d, "sQuestion"),
                                      [o[2:] for o in opts], letters.index(ans), src.name))


@register_source("gsm8k", domain="math", kind="gsm8k", version=VERSION,
                 splits={"train": ("gsm8k/train.jsonl",), "test": ("gsm8k/test.jsonl",)},
                 hub={"train": ("openai/gsm8k", "main", ("train",)),
                      "test": ("openai/gsm8k", "main", ("test",))},
                 hub_parse=hub_raw("question", "answer"),
                 description="GSM8K as numeric MC (train 7473, test 1319)")
def parse_gsm8k(src: Source, split: str, i: int, d: Any) -> Item:
    return raw_item(src, split, i, d, ("question", "answer"))


@register_source("math500", domain="math", kind="math500", version=VERSION,
                 splits={"test": ("math/math500_test.jsonl",)},
                 hub={"test": ("HuggingFaceH4/MATH-500", None, ("test",))},
                 hub_parse=hub_raw("problem", "answer"),
                 description="MATH-500 integer-answer problems as numeric MC (test 500 raw)")
def parse_math500(src: Source, split: str, i: int, d: Any) -> Item:
    return raw_item(src, split, i, d, ("problem", "answer"))


@register_source("math", domain="math", kind="math500", version=VERSION,
                 splits={"test": ("math/llm-foundry_math_test.jsonl",)},
                 description="full MATH test (5000 raw; contains MATH-500), integer answers as MC")
def parse_math(src: Source, split: str, i: int, d: Any) -> Item:
    """llm-foundry MATH lines, renamed to the MATH-500 schema for the math500 builder."""
    return raw_item(src, split, i, d, ("context", "answer"), rename={
        "context": "problem", "chain_of_thought": "solution", "category": "subject"})


def _by_field(key: str, fields: tuple[str, ...]) -> RecordParser:
    """Raw items with ids ``<source>/<split>/<raw[key]>``."""
    def parse(src: Source, split: str, i: int, d: Any) -> Item:
        return raw_item(src, split, i, d, fields,
                        make_id=lambda r: f"{src.name}/{split}/{r[key]}")
    return parse


register_source("svamp", domain="math", kind="numeric", version=VERSION,
                splits={"test": ("svamp/SVAMP.json",)},
                description="SVAMP as numeric MC (test 1000 raw)",
                )(_by_field("ID", ("Body", "sQuestion", "lSolutions")))
register_source("mawps", domain="math", kind="numeric", version=VERSION,
                splits={"train": ("mawps/trainset.json",), "valid": ("mawps/validset.json",),
                        "test": ("mawps/testset.json",)},
                description="MAWPS as numeric MC (train 1898, valid 237, test 238 raw)",
                )(_by_field("id", ("id", "original_text", "ans")))
