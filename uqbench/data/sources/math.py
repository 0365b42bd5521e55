"""Math: AQuA-RAT (5 options, parsed) and the sources whose MC form is built from a numeric
answer by `uqbench.data.mc.numeric.numeric_mc`: GSM8K, MATH-500 and the full MATH test (integer
answers), SVAMP and MAWPS. Everything that knows these datasets' fields is here: each reads its
raw item into a `NumericProblem` (the gold, and wrong-but-plausible hints from the solution's
intermediate results or the equation).

AQuA is read from ``AQuA_test_orig.json`` ("A)" prefixes stripped). The LLM-Adapters
``aqua/test.json`` is not used: its items are in another order and its answers agree with the
original on only 49/254 items.
"""
from __future__ import annotations

import ast
import math
import re
from collections.abc import Callable, Mapping
from typing import Any, TypedDict

from uqbench.data.mc.numeric import MATH_MC_VERSION, NumericProblem, numeric_mc, parse_number
from uqbench.data.records import MCRecord
from uqbench.data.sources.api import (
    Bad,
    Item,
    MCBuild,
    RecordParser,
    Source,
    hub_raw,
    mc,
    need,
    raw_item,
    register_source,
    text,
)

#: Bump when parsing or selection changes what these sources return for the same files.
VERSION = "1"
_VERSIONS = {"math_mc_version": MATH_MC_VERSION}
_NUM_RE = re.compile(r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?![\w])")


class _Build(TypedDict):
    """The `register_source` arguments of a numeric source's builder."""

    build: MCBuild
    versions: Mapping[str, str]
    rejects: str


def _numeric(problem: Callable[[Source, str, Item], NumericProblem | None]) -> MCBuild:
    """The ``build`` of a numeric source: its ``problem`` reader, then `numeric_mc` (an item
    whose reader finds no gold is rejected)."""
    def build(src: Source, split: str, item: Item, seed: int
              ) -> tuple[MCRecord | None, dict[str, Any]]:
        p = problem(src, split, item)
        if p is None:
            return None, {}
        try:
            return numeric_mc(p, seed=seed), {}
        except ValueError as exc:  # e.g. a non-finite gold
            return None, {"reason": f"numeric_mc: {exc}"}
    build.__qualname__ = f"numeric_mc({problem.__name__})"  # names it in recipes
    return build


def _latest_first(results: list[float], others: list[float], exclude: float | None = None
                  ) -> list[tuple[float, str]]:
    """Hints from a solution: its intermediate ``results``, then its ``others`` numbers, each
    latest first, without repeats (nor ``exclude``)."""
    out: list[tuple[float, str]] = []
    seen = set() if exclude is None else {exclude}
    for vals, method in ((results[::-1], "intermediate"), (others[::-1], "solution_number")):
        for v in vals:
            if v not in seen:
                seen.add(v)
                out.append((v, method))
    return out


# -- GSM8K ------------------------------------------------------------------------------------

_CALC_RE = re.compile(r"<<([^<>]*)>>")


def gsm8k_gold(answer: str) -> float | None:
    """The number after '####' in a GSM8K answer ('1,000' -> 1000.0)."""
    if "####" not in answer:
        return None
    return parse_number(answer.rsplit("####", 1)[1])


def gsm8k_hints(answer: str) -> list[tuple[float, str]]:
    """Calculator results (latest first), then other numbers of the solution (latest first)."""
    body = answer.rsplit("####", 1)[0]
    calc: list[float] = []
    for expr in _CALC_RE.findall(body):
        if "=" in expr:
            v = parse_number(expr.rsplit("=", 1)[1])
            if v is not None:
                calc.append(v)
    text = _CALC_RE.sub(" ", body)
    nums = [v for v in (parse_number(m) for m in _NUM_RE.findall(text)) if v is not None]
    return _latest_first(calc, nums)


def gsm8k_problem(src: Source, split: str, item: Item) -> NumericProblem | None:
    """A GSM8K line {"question", "answer"}; None when the answer has no parsable final number.

    Its RNG id is ``gsm8k/<split>/<position>`` (the numbering its splits were first built
    with, `uqbench.data.sources.load_source`).
    """
    raw = item.raw or {}
    gold = gsm8k_gold(str(raw.get("answer", "")))
    if gold is None or not str(raw.get("question", "")).strip():
        return None
    return NumericProblem(f"gsm8k/{split}/{item.position}", "gsm8k",
                          str(raw["question"]).strip(), gold, tuple(gsm8k_hints(raw["answer"])),
                          {"split": split, "index": int(item.position)})




@register_source("aqua", domain="math", version=VERSION,
                 splits={"test": ("aqua/AQuA_test_orig.json",)},
                 description="AQuA-RAT, 5 options (test 254)")
def parse_aqua(src: Source, split: str, i: int, d: Any) -> Item:
    """An AQuA record: ``options`` "A)..", "B)..", answer letter ``lSolutions``."""
    need(d, "sQuestion", "options", "lSolutions")
    opts = d["options"]
    letters = "ABCDEFGH"[: len(opts)]
    if not isinstance(opts, list) or any(
        not isinstance(o, str) or not o.startswith(f"{c})")
        for o, c in zip(opts, letters, strict=False)
    ):
        raise Bad("'options' should be a list of 'A)...', 'B)...' strings")
    ans = text(d, "lSolutions").strip()
    if ans not in letters:
        raise Bad(f"answer {ans!r} is not one of {list(letters)}")
    rid = f"{src.name}/{split}/{i}"
    return Item(rid, i, "", record=mc(rid, src.domain, text(d, "sQuestion"),
                                      [o[2:] for o in opts], letters.index(ans), src.name))


@register_source("gsm8k", domain="math", version=VERSION,
                 splits={"train": ("gsm8k/train.jsonl",), "test": ("gsm8k/test.jsonl",)},
                 hub={"train": ("openai/gsm8k", "main", ("train",)),
                      "test": ("openai/gsm8k", "main", ("test",))},
                 hub_parse=hub_raw("question", "answer"), build=_numeric(gsm8k_problem),
                 versions=_VERSIONS, rejects="no final number",
                 description="GSM8K as numeric MC (train 7473, test 1319)")
def parse_gsm8k(src: Source, split: str, i: int, d: Any) -> Item:
    return raw_item(src, split, i, d, ("question", "answer"))


# -- MATH -------------------------------------------------------------------------------------

def _unbox(s: str) -> str:
    m = re.search(r"\\boxed\s*\{", s)
    if not m:
        return s
    depth, i = 1, m.end()
    start = i
    while i < len(s) and depth:
        depth += {"{": 1, "}": -1}.get(s[i], 0)
        i += 1
    return s[start:i - 1] if depth == 0 else s


def parse_integer_answer(answer: str) -> int | None:
    """A MATH answer that is a plain integer -> int, else None.

    Strips ``\\boxed{}``, ``$`` and ``\\$``, spaces, ``\\!``, ``\\,`` and thousands separators
    ("10,\\!080" -> 10080). "5" and "-4" are kept; "\\frac{1}{2}", "3\\sqrt{2}", "1,-2",
    "3, 5, 7", "90^\\circ", "2516_8", "18.90" are not.
    """
    s = _unbox(str(answer))
    for t in ("\\!", "\\,", "\\;", "\\ ", "\\$", "$", " ", "{,}"):
        s = s.replace(t, "," if t == "{,}" else "")
    s = s.strip()
    while s.startswith("{") and s.endswith("}"):
        s = s[1:-1].strip()
    if re.fullmatch(r"[-+]?\d{1,3}(,\d{3})+", s):
        s = s.replace(",", "")
    if not re.fullmatch(r"[-+]?\d+", s):
        return None
    return int(s)


def math_hints(solution: str, gold: float) -> list[tuple[float, str]]:
    """Numbers of a MATH solution: those right after '=' (results) first, latest first."""
    text = re.sub(r"\[asy\].*?\[/asy\]", " ", solution, flags=re.DOTALL)
    text = re.sub(r"\\boxed\s*\{[^{}]*\}", " ", text)
    results: list[float] = []
    others: list[float] = []
    for m in _NUM_RE.finditer(text):
        v = parse_number(m.group())
        if v is None:
            continue
        before = text[max(0, m.start() - 3):m.start()].replace(" ", "").replace("$", "")
        (results if before.endswith("=") else others).append(v)
    return _latest_first(results, others, exclude=gold)


def math_problem(src: Source, split: str, item: Item) -> NumericProblem | None:
    """A MATH-500 line (the full MATH test renamed to its schema, `parse_math`); None unless the
    answer is an integer (`parse_integer_answer`). Id and source are ``math500/<unique_id
    without .json>`` and ``math500`` for both sources (the full test has no unique_id)."""
    raw = item.raw or {}
    gold = parse_integer_answer(str(raw.get("answer", "")))
    if gold is None:
        return None
    uid = str(raw.get("unique_id", "")).removesuffix(".json")
    meta = {"subject": raw.get("subject"), "level": raw.get("level"),
            "unique_id": raw.get("unique_id")}
    return NumericProblem(f"math500/{uid}", "math500", str(raw["problem"]).strip(), gold,
                          tuple(math_hints(str(raw.get("solution", "")), float(gold))), meta)


_MATH: _Build = {"build": _numeric(math_problem), "versions": _VERSIONS,
                 "rejects": "answer not an integer"}


@register_source("math500", domain="math", version=VERSION, **_MATH,
                 splits={"test": ("math/math500_test.jsonl",)},
                 hub={"test": ("HuggingFaceH4/MATH-500", None, ("test",))},
                 hub_parse=hub_raw("problem", "answer"),
                 description="MATH-500 integer-answer problems as numeric MC (test 500 raw)")
def parse_math500(src: Source, split: str, i: int, d: Any) -> Item:
    return raw_item(src, split, i, d, ("problem", "answer"))


@register_source("math", domain="math", version=VERSION, **_MATH,
                 splits={"test": ("math/llm-foundry_math_test.jsonl",)},
                 description="full MATH test (5000 raw; contains MATH-500), integer answers as MC")
def parse_math(src: Source, split: str, i: int, d: Any) -> Item:
    """llm-foundry MATH lines, renamed to the MATH-500 schema (`math_problem`)."""
    return raw_item(src, split, i, d, ("context", "answer"), rename={
        "context": "problem", "chain_of_thought": "solution", "category": "subject"})


def _by_field(key: str, fields: tuple[str, ...]) -> RecordParser:
    """Raw items with ids ``<source>/<split>/<raw[key]>``."""
    def parse(src: Source, split: str, i: int, d: Any) -> Item:
        return raw_item(src, split, i, d, fields,
                        make_id=lambda r: f"{src.name}/{split}/{r[key]}")
    return parse


# -- SVAMP and MAWPS: equations -----------------------------------------------------------

def _svamp_question(raw: Mapping[str, Any]) -> str:
    body = str(raw["Body"]).strip()
    sep = "" if body.endswith((".", "?", "!")) else "."
    return f"{body}{sep} {str(raw['sQuestion']).strip()}".strip()


def equation_hints(equation: str) -> list[float]:
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


def word_problem(src: Source, split: str, item: Item) -> NumericProblem:
    """SVAMP (``Body`` + ``sQuestion``) or MAWPS, with hints from the equation."""
    raw = item.raw or {}
    if "Body" in raw:  # SVAMP
        q, gold, eq = _svamp_question(raw), float(raw["lSolutions"]), raw.get("Equation")
    else:  # MAWPS
        q, gold, eq = str(raw["original_text"]), float(raw["ans"]), raw.get("equation")
    hints = tuple((h, "hint") for h in equation_hints(str(eq or "")) if h != gold)
    return NumericProblem(item.id, src.name, q, gold, hints)


_WORDS: _Build = {"build": _numeric(word_problem), "versions": _VERSIONS,
                  "rejects": "no numeric answer"}
register_source("svamp", domain="math", version=VERSION, **_WORDS,
                splits={"test": ("svamp/SVAMP.json",)},
                description="SVAMP as numeric MC (test 1000 raw)",
                )(_by_field("ID", ("Body", "sQuestion", "lSolutions")))
register_source("mawps", domain="math", version=VERSION, **_WORDS,
                splits={"train": ("mawps/trainset.json",), "valid": ("mawps/validset.json",),
                        "test": ("mawps/testset.json",)},
                description="MAWPS as numeric MC (train 1898, valid 237, test 238 raw)",
                )(_by_field("id", ("id", "original_text", "ans")))
