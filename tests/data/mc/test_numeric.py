"""Numeric multiple choice (GSM8K, MATH-500, generic): distractors, formatting, determinism,
and no options-only artifacts (gold rank / position / 'hub' number)."""
from __future__ import annotations

import collections
import json
import math
from pathlib import Path

import pytest

from uqbench.data.mc.numeric import MATH_MC_VERSION, NumericProblem, format_number, numeric_mc
from uqbench.data.records import MCRecord
from uqbench.data.sources import Item, get_source, load_source
from uqbench.data.sources.math import gsm8k_gold, gsm8k_hints, parse_integer_answer
from uqbench.data.suites.build import make_record


def _source_mc(source: str, split: str, raw: dict, *, seed: int, index: int = 0
               ) -> MCRecord | None:
    """What ``source``'s registered build makes of one raw line (its id left as the builder's)."""
    src = get_source(source)
    assert src.build is not None
    return src.build(src, split, Item(f"{source}/{split}/{index}", index, "", raw=raw), seed)[0]


def _gsm8k_mc(raw: dict, *, seed: int, index: int, split: str = "train") -> MCRecord | None:
    return _source_mc("gsm8k", split, raw, seed=seed, index=index)


def _num(question: str, gold: float, *, seed: int, id: str, source: str,
         hints: tuple[float, ...] = ()) -> MCRecord:
    return numeric_mc(NumericProblem(id, source, question, gold,
                                     tuple((h, "hint") for h in hints)), seed=seed)


def _made(d: Path, source: str, split: str) -> list[MCRecord]:
    """Every record of a real (source, split) the way a suite makes them (seed 0)."""
    made = (make_record(source, split, it, 0)[0]
            for it in load_source(source, split, data_dir=d).items)
    return [r for r in made if r is not None]

def _jsonl(d: Path, rel: str) -> list[dict]:
    """The real data file ``rel`` (``d``: the `real_data` fixture, which marks the test slow)."""
    if not (d / rel).is_file():
        pytest.skip(f"data file {rel} not found (set UQBENCH_DATA to the data folder)")
    with open(d / rel, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


TOY = {
    "question": "A shop sells 5 boxes of 6 pens. 12 pens break. How many pens are left?",
    "answer": ("The shop has 5*6=<<5*6=30>>30 pens.\n"
               "After the breakage it has 30-12=<<30-12=18>>18 pens.\n#### 18"),
}


def _check_record(r: MCRecord) -> None:
    assert len(r.choices) == 4
    assert len(set(r.choices)) == 4
    assert len({float(c) for c in r.choices}) == 4
    assert r.meta["gold"] == r.choices[r.answer]
    assert r.meta["choice_methods"][r.answer] == "gold"
    assert r.meta["version"] == MATH_MC_VERSION
    json.dumps(r.to_json())  # meta is JSON-serialisable


def test_gsm8k_parsing() -> None:
    assert gsm8k_gold(TOY["answer"]) == 18
    assert gsm8k_gold("... #### 1,250") == 1250
    hints = gsm8k_hints(TOY["answer"])
    calc = [v for v, m in hints if m == "intermediate"]
    assert calc == [18, 30]  # latest first; the gold is dropped later
    assert {5, 6, 12} <= {v for v, m in hints if m == "solution_number"}


def test_toy_record_uses_the_intermediates() -> None:
    recs = [_gsm8k_mc(TOY, seed=s, index=7, split="test") for s in range(40)]
    for r in recs:
        assert r is not None
        _check_record(r)
        assert r.id == "gsm8k/test/7" and r.source == "gsm8k" and r.domain == "math"
        assert r.choices[r.answer] == "18"
        assert all(c.lstrip("-").isdigit() for c in r.choices)
        assert all(float(c) > 0 for c in r.choices)
    # the intermediate result 30 (and the question's 12) are the natural distractors
    with_30 = sum("30" in r.choices for r in recs)
    from_solution = sum(any(m in ("intermediate", "solution_number") for m in
                            r.meta["choice_methods"]) for r in recs)
    assert with_30 >= 20 and from_solution >= 30


def test_determinism_and_seed_dependence() -> None:
    a = _gsm8k_mc(TOY, seed=3, index=0)
    b = _gsm8k_mc(TOY, seed=3, index=0)
    assert a is not None and b is not None and a.to_json() == b.to_json()
    recs = [_gsm8k_mc(TOY, seed=s, index=0) for s in range(10)]
    variants = {tuple(r.choices) for r in recs if r is not None}
    assert len(variants) > 3


def test_gold_position_is_uniform() -> None:
    counts = collections.Counter(
        _num("q", 37 + i % 50, seed=0, id=f"toy/{i}", source="toy").answer
        for i in range(800))
    for pos in range(4):
        assert 0.19 <= counts[pos] / 800 <= 0.31, counts


def test_formatting() -> None:
    assert format_number(18.0, 0) == "18"
    assert format_number(2.5, 1) == "2.5"
    assert format_number(-0.0, 0) == "0"
    r = _num("q", 2.75, seed=0, id="dec", source="toy")
    _check_record(r)
    assert all(len(c.split(".")[1]) == 2 for c in r.choices), r.choices
    r = _num("q", 12, hints=(12.5, 30.0, 9.0), seed=0, id="int", source="toy")
    assert all("." not in c for c in r.choices) and "12.5" not in r.choices
    r = _num("q", -40, seed=1, id="neg", source="toy")
    _check_record(r)
    assert sum(float(c) < 0 for c in r.choices) >= 3


def test_no_bracketing_pairs() -> None:
    """gold-d and gold+d (or gold/2 and 2*gold) would point at the gold -- unless another option
    is bracketed alike (a run such as 19, 20, 21, 22)."""
    for i in range(300):
        g = 20 + i
        r = _num("q", g, seed=0, id=f"b/{i}", source="toy")
        vals = {float(c) for c in r.choices}
        for d in (1, 2, 10):
            if g - d in vals and g + d in vals:
                assert any(v != g and v - d in vals and v + d in vals for v in vals), r.choices
        assert not (g / 2 in vals and 2 * g in vals), r.choices


@pytest.mark.parametrize("answer, expected", [
    ("5", 5), ("-4", -4), ("\\boxed{12}", 12), ("$36$", 36), ("\\$32,\\!348", 32348),
    ("10,\\!080", 10080), ("58,500", 58500), (" 7 ", 7), ("{3}", 3),
    ("\\frac{1}{2}", None), ("3\\sqrt{2}", None), ("1,-2", None), ("3, 5, 7", None),
    ("90^\\circ", None), ("2516_8", None), ("18.90", None), ("4.5", None), ("x+1", None),
    ("(1,2)", None), ("", None),
])
def test_math_integer_filter(answer: str, expected: int | None) -> None:
    assert parse_integer_answer(answer) == expected


def test_math500_record() -> None:
    raw = {"problem": "Compute $7 \\cdot 6 - 2$.", "solution": "We get $7\\cdot 6 = 42$, and "
           "$42 - 2 = \\boxed{40}$.", "answer": "40", "subject": "Prealgebra", "level": 1,
           "unique_id": "test/prealgebra/1.json"}
    r = _source_mc("math500", "test", raw, seed=0)
    assert r is not None
    _check_record(r)
    assert r.id == "math500/test/prealgebra/1" and r.source == "math500"
    assert r.meta["level"] == 1 and r.meta["subject"] == "Prealgebra"
    assert _source_mc("math500", "test", {**raw, "answer": "\\frac{1}{2}"}, seed=0) is None


def _hub_accuracy(recs: list[MCRecord]) -> float:
    """Options-only attack: pick the number most others are a simple step away from."""
    def step(x: float, y: float) -> bool:
        if x == 0:
            return False
        return abs(y - x) in (1, 2, 10) or any(abs(y / x - q) < 1e-9
                                               for q in (2, 0.5, 1.1, 0.9, 1.25, 0.75))
    acc = 0.0
    for r in recs:
        v = [float(c) for c in r.choices]
        deg = [sum(step(v[i], v[j]) for j in range(4) if j != i) for i in range(4)]
        best = [i for i in range(4) if deg[i] == max(deg)]
        acc += (r.answer in best) / len(best)
    return acc / len(recs)


def test_gsm8k_real_data_has_no_magnitude_artifact(real_data: Path) -> None:
    raws = _jsonl(real_data, "gsm8k/test.jsonl")
    recs = _made(real_data, "gsm8k", "test")
    assert len(recs) == len(raws)
    n = len(recs)
    ranks = collections.Counter(r.meta["gold_rank"] for r in recs)
    positions = collections.Counter(r.answer for r in recs)
    for k in range(4):
        assert 0.15 <= ranks[k] / n <= 0.35, ranks
        assert 0.20 <= positions[k] / n <= 0.30, positions
    assert _hub_accuracy(recs) < 0.32
    for r in recs[:200]:
        _check_record(r)
        g = float(r.choices[r.answer])
        assert all(math.copysign(1, float(c)) == math.copysign(1, g) for c in r.choices)
    # most records use numbers from the solution
    used = sum(any(m in ("intermediate", "solution_number") or "(" in m
                   for m in r.meta["choice_methods"]) for r in recs)
    assert used / n > 0.6


def test_math500_real_data(real_data: Path) -> None:
    raws = _jsonl(real_data, "math/math500_test.jsonl")
    recs = _made(real_data, "math500", "test")
    expected = sum(parse_integer_answer(r["answer"]) is not None for r in raws)
    assert expected == len(recs)
    assert 250 <= expected <= 400  # 316 at the time of writing
    for r in recs:
        _check_record(r)
    ranks = collections.Counter(r.meta["gold_rank"] for r in recs)
    for k in range(4):
        assert 0.12 <= ranks[k] / len(recs) <= 0.38, ranks
