"""Code multiple choice: AST mutants that fail the problem's tests, the reference that passes,
formatting that does not give the reference away, determinism, real MBPP/HumanEval."""
from __future__ import annotations

import ast
import concurrent.futures as cf
import difflib
import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from uqbench.data.mc.code import CODE_MC_VERSION, code_mc
from uqbench.data.mc.mutations import apply_mutations, enumerate_mutations
from uqbench.data.records import MCRecord
from uqbench.data.sandbox import Sandbox
from uqbench.data.seeds import derive_seed
from uqbench.data.sources import Item, load_source
from uqbench.data.sources.code import humaneval_problem, mbpp_problem
from uqbench.data.suites.build import make_record, worker_context


def mbpp_mc(raw: dict, **kw: Any) -> tuple[MCRecord | None, dict]:
    return code_mc(mbpp_problem(raw), **kw)


def humaneval_mc(raw: dict, **kw: Any) -> tuple[MCRecord | None, dict]:
    return code_mc(humaneval_problem(raw), **kw)


def _make_all(source: str, split: str, items: list[Item], seed: int, workers: int
              ) -> list[tuple[MCRecord | None, dict]]:
    """`make_record` over ``items`` as a suite runs it: in this process, or in a pool."""
    if workers <= 1:
        return [make_record(source, split, it, seed, "code") for it in items]
    n = len(items)
    with cf.ProcessPoolExecutor(workers, mp_context=worker_context()) as ex:
        return list(ex.map(make_record, [source] * n, [split] * n, items, [seed] * n,
                           ["code"] * n))


def _data_file(d: Path, rel: str) -> Path:
    if not (d / rel).is_file():
        pytest.skip(f"data file {rel} not found (set UQBENCH_DATA to the data folder)")
    return d / rel


@pytest.fixture(scope="module")
def sb(sandbox_ok) -> Sandbox:  # sandbox_ok (tests/conftest.py): the slow tier
    return Sandbox(timeout_s=5.0, workers=1)


ADD = {"text": "Write a function to add two numbers.", "code": "def add(a, b):\r\n    return a + b",
       "task_id": 9001, "test_setup_code": "",
       "test_list": ["assert add(1, 2) == 3", "assert add(5, 7) == 12", "assert add(-1, 1) == 0"],
       "challenge_test_list": []}

COUNT = {"text": "Write a function to count the elements of a list greater than k.",
         "code": ("def count_greater(xs, k):\r\n    # count them\r\n    n = 0\r\n"
                  "    for i in range(len(xs)):\r\n        if xs[i] > k:\r\n"
                  "            n = n + 1\r\n    return n"),
         "task_id": 9002, "test_setup_code": "",
         "test_list": ["assert count_greater([1, 5, 3, 8], 3) == 2",
                       "assert count_greater([], 0) == 0",
                       "assert count_greater([4, 4, 9], 4) == 1"],
         "challenge_test_list": []}

HUMANEVAL_LIKE = {
    "task_id": "HumanEval/9003",
    "prompt": ('def helper(x):\n    """Helper."""\n    return x * 2\n\n\n'
               'def double_evens(xs: list) -> list:\n'
               '    """Double the even numbers, drop the odd ones.\n'
               '    >>> double_evens([1, 2, 4])\n    [4, 8]\n    """\n'),
    "canonical_solution": "    return [helper(x) for x in xs if x % 2 == 0]\n",
    "test": ("\n\ndef check(candidate):\n    assert candidate([1, 2, 4]) == [4, 8]\n"
             "    assert candidate([]) == []\n    assert candidate([3, 6]) == [12]\n"),
    "entry_point": "double_evens",
}


def _tests_of(raw: dict) -> str:
    if "test_list" in raw:
        return raw.get("test_setup_code", "") + "\n" + "\n".join(raw["test_list"])
    return raw["test"] + f"\n\ncheck({raw['entry_point']})\n"


def _check_executed(rec: MCRecord, raw: dict, sb: Sandbox) -> None:
    """The gold passes the problem's tests, every other option fails them."""
    results = sb.run_many([c + "\n\n" + _tests_of(raw) + "\n" for c in rec.choices])
    for i, res in enumerate(results):
        assert res.passed == (i == rec.answer), (i, rec.answer, rec.choices[i], res.stderr_tail)


def _check_record(rec: MCRecord) -> None:
    assert len(rec.choices) == 4 and len(set(rec.choices)) == 4
    assert rec.domain == "code" and rec.meta["version"] == CODE_MC_VERSION
    assert rec.meta["choice_mutations"][rec.answer] is None
    assert all(m for i, m in enumerate(rec.meta["choice_mutations"]) if i != rec.answer)
    for c in rec.choices:  # every option is canonical unparse output: no formatting tells
        assert ast.unparse(ast.parse(c)) == c
        assert "\r" not in c and "#" not in c
    json.dumps(rec.to_json())


def test_add_gets_three_failing_mutants(sb: Sandbox) -> None:
    rec, stats = mbpp_mc(ADD, seed=0, sandbox=sb)
    assert rec is not None, stats
    assert stats["verified"] and stats["reference_passed"] and stats["reason"] == "ok"
    assert stats["mutants_failing"] >= 3 and stats["mutants_tried"] >= 3
    assert set(stats) >= {"mutants_tried", "mutants_failing", "verified", "reference_passed",
                          "killed", "reason"}
    _check_record(rec)
    assert rec.id == "mbpp/9001" and rec.source == "mbpp"
    assert rec.choices[rec.answer] == "def add(a, b):\n    return a + b"
    assert rec.question.startswith("Write a function to add two numbers.")
    assert "Your code should pass: assert add(1, 2) == 3" in rec.question
    # `return a + b` has no two unrelated edit sites: independent mutants
    assert rec.meta["scheme"] == "independent"
    _check_executed(rec, ADD, sb)


def test_square_scheme(sb: Sandbox) -> None:
    rec, stats = mbpp_mc(COUNT, seed=1, sandbox=sb)
    assert rec is not None, stats
    _check_record(rec)
    assert rec.meta["scheme"] == "square"
    muts = [m for m in rec.meta["choice_mutations"] if m]
    singles = [m[0] for m in muts if len(m) == 1]
    doubles = [m for m in muts if len(m) == 2]
    assert len(singles) == 2 and len(doubles) == 1
    key = sorted(json.dumps(x, sort_keys=True) for x in singles)
    assert sorted(json.dumps(x, sort_keys=True) for x in doubles[0]) == key
    _check_executed(rec, COUNT, sb)


def _edit(a: str, b: str) -> int:
    sm = difflib.SequenceMatcher(None, a, b, autojunk=False)
    return len(a) + len(b) - 2 * sum(m.size for m in sm.get_matching_blocks())


def _medoid_accuracy(recs: list[MCRecord]) -> float:
    """Options-only attack: pick the option closest (in edits) to all the others."""
    acc = 0.0
    for r in recs:
        tot = [sum(_edit(a, b) for b in r.choices) for a in r.choices]
        best = [i for i, t in enumerate(tot) if t == min(tot)]
        acc += (r.answer in best) / len(best)
    return acc / len(recs)


def test_square_defeats_the_medoid_attack(sb: Sandbox) -> None:
    sq = [mbpp_mc(COUNT, seed=s, sandbox=sb)[0] for s in range(4)]
    ind = [mbpp_mc(COUNT, seed=s, sandbox=sb, scheme="independent")[0] for s in range(4)]
    assert all(r is not None for r in sq + ind)
    assert _medoid_accuracy(ind) == 1.0   # the reference is the common ancestor...
    assert _medoid_accuracy(sq) <= 0.5    # ...unless the options form a square


def test_determinism(sb: Sandbox) -> None:
    a, sa = mbpp_mc(COUNT, seed=5, sandbox=sb)
    b, sb_ = mbpp_mc(COUNT, seed=5, sandbox=sb)
    assert a is not None and b is not None and a.to_json() == b.to_json()
    assert sa == sb_
    items = [Item(f"mbpp/{r['task_id']}", i, "", raw=r) for i, r in enumerate([ADD, COUNT])]
    one = _make_all("mbpp", "test", items, 5, workers=1)
    two = _make_all("mbpp", "test", items, 5, workers=2)
    assert [(r and r.to_json(), st) for r, st in one] == [(r and r.to_json(), st) for r, st in two]
    assert all(r is not None and st["verified"] for r, st in one)
    # the suite's record is code_mc's under the per-item seed, with the item's id and domain
    direct, _ = mbpp_mc(COUNT, seed=derive_seed(5, "mbpp/9002", nbytes=4, byteorder="big"))
    assert direct is not None and one[1][0] is not None
    assert one[1][0].to_json() == direct.to_json()


def test_reference_that_fails_is_skipped(sb: Sandbox) -> None:
    broken = {**ADD, "code": "def add(a, b):\n    return a - b"}
    rec, stats = mbpp_mc(broken, seed=0, sandbox=sb)
    assert rec is None and not stats["reference_passed"] and not stats["verified"]
    assert "reference fails" in stats["reason"]
    bad = {**ADD, "code": "def add(a, b)\n    return a + b"}
    rec, stats = mbpp_mc(bad, seed=0, sandbox=sb)
    assert rec is None and "does not parse" in stats["reason"]
    rec, stats = mbpp_mc({**ADD, "test_list": []}, seed=0, sandbox=sb)
    assert rec is None and stats["reason"] == "no tests"


def test_humaneval_mutates_only_the_entry_point(sb: Sandbox) -> None:
    rec, stats = humaneval_mc(HUMANEVAL_LIKE, seed=0, sandbox=sb)
    assert rec is not None, stats
    _check_record(rec)
    assert rec.id == "humaneval/9003" and rec.source == "humaneval"
    assert rec.question == HUMANEVAL_LIKE["prompt"].strip("\n")
    for c in rec.choices:
        tree = ast.parse(c)
        helper = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "helper")
        assert ast.unparse(helper) == "def helper(x):\n    return x * 2"
        assert ast.get_docstring(tree.body[-1]) is None  # docstrings live in the question
    _check_executed(rec, HUMANEVAL_LIKE, sb)


def test_mutation_catalogue() -> None:
    src = ("def f(xs, k):\n    out = []\n    for i in range(len(xs)):\n"
           "        if xs[i] < k and xs[i] != 0:\n            out.append(abs(xs[i] * 2))\n"
           "    return max(out) if out else -1\n")
    tree = ast.parse(src)
    muts = enumerate_mutations(tree)
    kinds = {m.kind for m in muts}
    assert {"comparison", "arithmetic", "constant", "boolean", "condition", "range", "builtin",
            "call", "index"} <= kinds
    texts = {apply_mutations(tree, [m]) for m in muts}
    assert ast.unparse(tree) not in texts or len(texts) > 1
    for t in texts:
        ast.parse(t)  # every mutant is valid Python
    assert "range(len(xs) - 1)" in "\n".join(texts)
    assert "min(out)" in "\n".join(texts)


def test_real_mbpp_first_twenty(real_data: Path, sandbox_ok) -> None:
    _data_file(real_data, "mbpp/mbpp.jsonl")
    items = list(load_source("mbpp", "test", data_dir=real_data).items[:20])
    assert [it.id for it in items] == [f"mbpp/{i}" for i in range(11, 31)]  # the eval range
    made = _make_all("mbpp", "test", items, 0, workers=2)
    recs = [r for r, _ in made if r is not None]
    verified = sum(bool(st["verified"]) for _, st in made)
    print(f"\nMBPP 11-30: {verified}/20 with 3 verified failing mutants")
    assert all(st["reference_passed"] for _, st in made)
    assert verified >= 15
    for r in recs:
        _check_record(r)
    square = [r for r in recs if r.meta["scheme"] == "square"]
    assert len(square) >= 10 and _medoid_accuracy(square) <= 0.5


def test_real_humaneval_first_five(real_data: Path, sb: Sandbox) -> None:
    path = _data_file(real_data, "humaneval/HumanEval.jsonl.gz")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        raws = [json.loads(line) for line in f][:5]
    ok = 0
    for raw in raws:
        rec, stats = humaneval_mc(raw, seed=0, sandbox=sb)
        assert stats["reference_passed"], stats
        if rec is not None:
            ok += 1
            _check_record(rec)
    assert ok >= 4


def test_token_keeping_swaps_are_tried_before_insertions_and_blunt_edits() -> None:
    """Tier 0 keeps the program's tokens (a swap), tier 1 inserts or deletes some (``not``,
    ``- 1``), tier 2 is blunt; order_mutations tries every tier-0 candidate first."""
    import random

    from uqbench.data.mc.code import order_mutations
    from uqbench.data.mc.mutations import mutation_tier

    tree = ast.parse(COUNT["code"].replace("\r\n", "\n"))
    muts = enumerate_mutations(tree)
    ref_tokens = len(apply_mutations(tree, []).split())
    for m in muts:
        changed = len(apply_mutations(tree, [m]).split()) - ref_tokens
        if m.tier == 0:   # a swap: as many whitespace-separated tokens as the reference
            assert changed == 0, m
        assert m.tier == mutation_tier(m.kind, m.variant)
    kinds = {m.tier: set() for m in muts}
    for m in muts:
        kinds[m.tier].add(m.kind)
    assert {"comparison", "constant"} <= kinds[0] and {"range", "condition"} <= kinds[1]
    assert mutation_tier("call", "drop_len") == 2 and mutation_tier("string", "upper") == 2
    tiers = [m.tier for m in order_mutations(muts, random.Random(0))]
    assert tiers == sorted(tiers)


def test_no_mutation_writes_none_or_floor_division_for_a_product() -> None:
    """``None`` and ``//`` were the options-only classifier's strongest marks of a distractor."""
    src = "def f(a, b):\n    x = a * b\n    return x + 1\n"
    tree = ast.parse(src)
    texts = [apply_mutations(tree, [m]) for m in enumerate_mutations(tree)]
    assert texts and not any("None" in t or "//" in t for t in texts)


def test_shrinking_and_growing_edits_alternate_within_a_tier() -> None:
    """`alternate_signs`: by tier, an edit that shrinks the character 3-gram set, then one
    that grows it, ...; the rest of each sign's order kept."""
    from uqbench.data.mc.code import alternate_signs
    from uqbench.data.mc.mutations import Mutation

    m = [Mutation("k", i, "v", 1, tier=t) for i, t in enumerate([1, 0, 0, 0, 0, 1])]
    delta = {m[0]: -1, m[1]: 2, m[2]: 3, m[3]: -2, m[4]: 0, m[5]: 5}
    assert alternate_signs(m, delta) == [m[3], m[1], m[2], m[4], m[0], m[5]]


def test_swap_prior_is_the_references_token_counts(real_data: Path) -> None:
    """`SWAP_PRIOR` is `reference_token_counts` summed over the real MBPP and HumanEval
    references (tokens seen at least 3 times), not numbers typed in."""
    import warnings
    from collections import Counter

    from uqbench.data.mc.code import SWAP_PRIOR, reference_token_counts

    warnings.simplefilter("ignore", DeprecationWarning)  # MBPP's invalid escapes
    total: Counter[str] = Counter()
    with open(real_data / "mbpp" / "mbpp.jsonl") as f:
        for line in f:
            total += reference_token_counts(json.loads(line)["code"].replace("\r\n", "\n"))
    with gzip.open(real_data / "humaneval" / "HumanEval.jsonl.gz", "rt") as f:
        for line in f:
            raw = json.loads(line)
            total += reference_token_counts(raw["prompt"] + raw["canonical_solution"])
    assert SWAP_PRIOR == {k: v for k, v in total.items() if v >= 3}


def test_reference_token_counts_by_hand() -> None:
    from uqbench.data.mc.code import reference_token_counts

    src = (
        "def f(a, b):\n    if a == -1 and b != 0:\n        return max(a, 1) + 1\n    return not a\n"
    )
    assert reference_token_counts(src) == {"Eq": 1, "NotEq": 1, "And": 1, "-1": 1, "0": 1,
                                           "1": 2, "max": 1, "Add": 1, "test": 1, "Not": 1}
    # a negation inserts "not" in a plain condition and drops it from a negated one
    tree = ast.parse(src)
    negations = {m.variant: apply_mutations(tree, [m]) for m in enumerate_mutations(tree)
                 if m.variant in ("negate", "unnegate")}
    assert "if not (a == -1 and b != 0):" in negations["negate"]
    assert negations["unnegate"].endswith("return a")


def test_rare_direction_of_a_swap_is_tried_late_in_proportion() -> None:
    """`balance_directions`: ``!=`` -> ``==`` (to the commoner token) keeps its place every time;
    ``==`` -> ``!=`` keeps it with probability f(!=) / f(==) (checked over 4,000 draws) and
    otherwise goes after the insertions/deletions, never after the blunt edits."""
    import random

    from uqbench.data.mc.code import SWAP_PRIOR, balance_directions, swap_tokens
    from uqbench.data.mc.mutations import Mutation

    up = Mutation("comparison", 1, "0:NotEq->Eq", 1)
    down = Mutation("comparison", 2, "0:Eq->NotEq", 1)
    ins = Mutation("range", 3, "end-1", 1, tier=1)
    blunt = Mutation("call", 4, "drop_len", 1, tier=2)
    assert swap_tokens(down) == ("Eq", "NotEq") and swap_tokens(ins) is None
    assert swap_tokens(Mutation("condition", 5, "negate_if_0", 1, tier=1)) == ("test", "Not")
    rng = random.Random(0)
    kept = 0
    for _ in range(4000):
        order = balance_directions([down, up, ins, blunt], rng)
        assert order[0] in (down, up) and order[-1] is blunt
        assert order.index(up) < order.index(ins)
        kept += order.index(down) < order.index(ins)
    expected = (SWAP_PRIOR["NotEq"] + 1) / (SWAP_PRIOR["Eq"] + 1)
    assert abs(kept / 4000 - expected) < 0.03


LOOP = {"text": "Write a function to sum the integers below n.",
        "code": ("def sum_below(n):\r\n    i = 0\r\n    total = 0\r\n    while i < n:\r\n"
                 "        total += i\r\n        i += 1\r\n    return total"),
        "task_id": 9004, "test_setup_code": "",
        "test_list": ["assert sum_below(5) == 10", "assert sum_below(0) == 0",
                      "assert sum_below(1) == 0"],
        "challenge_test_list": []}


def _same_both_ways(problems: list, seed: int = 0) -> dict:
    """Build ``problems`` by one sandboxed process per candidate (the reference path) and by one
    session per problem: the same candidates run, with the same verdicts and stop reasons, and
    the same records and build statistics."""
    from benchmarks.bench_codemc import build_both

    both = build_both(problems, seed=seed)
    old, new = both["process"], both["session"]
    for la, lb in zip(old["logs"], new["logs"], strict=False):
        assert [(c, r.passed, r.killed_reason) for c, r, _ in la] == \
            [(c, r.passed, r.killed_reason) for c, r, _ in lb]
    assert [(r and r.to_json(), st) for r, st in old["built"]] == \
        [(r and r.to_json(), st) for r, st in new["built"]]
    return both


def test_session_path_builds_what_the_process_path_builds(sandbox_ok) -> None:
    """The fingerprint problems (tests/data/suites/test_cache.py), the ones above, and one whose
    mutants loop forever (``i += 1`` -> ``i += 0``...): stopped in both paths, as "timeout"."""
    from tests.data.suites.test_cache import ADD as FP_ADD
    from tests.data.suites.test_cache import DOUBLE

    problems = [mbpp_problem(FP_ADD), humaneval_problem(DOUBLE), mbpp_problem(ADD),
                mbpp_problem(COUNT), humaneval_problem(HUMANEVAL_LIKE), mbpp_problem(LOOP)]
    both = _same_both_ways(problems)
    loop_runs = both["session"]["logs"][-1]
    assert any(r.killed_reason == "timeout" for _, r, _ in loop_runs)
    assert all(st["verified"] for _, st in both["session"]["built"])


def test_session_path_on_real_mbpp_with_looping_mutants(real_data: Path, sandbox_ok) -> None:
    """MBPP 36, whose mutants include some stopped by their time budget (``python -m
    benchmarks codemc`` compares the paths on the first 30 problems)."""
    _data_file(real_data, "mbpp/mbpp.jsonl")
    items = {it.id: it for it in load_source("mbpp", "test", data_dir=real_data).items}
    both = _same_both_ways([mbpp_problem(items["mbpp/36"].raw)])
    assert any(r.killed for _, r, _ in both["session"]["logs"][0])


def test_both_paths_reject_a_bad_scheme_before_running_anything() -> None:
    with pytest.raises(ValueError, match="scheme"):
        code_mc(mbpp_problem(ADD), seed=0, scheme="triangle")
