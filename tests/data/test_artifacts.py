"""Artifact check: options-only baselines near chance on a balanced synthetic set, flagged on
planted artifacts; the exact chance bound; the build report table."""
from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest

from uqbench.data import artifacts as A
from uqbench.data.records import MCRecord

WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "river",
    "stone",
    "cloud",
    "paper",
    "green",
    "quick",
    "small",
    "large",
    "north",
    "south",
    "light",
    "heavy",
    "warm",
    "cold",
    "seven",
    "eight",
    "metal",
    "glass",
    "water",
    "plant",
]


def _phrase(rng: random.Random, n: int | None = None) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n or rng.randint(2, 6)))


def balanced(n: int, seed: int = 0) -> list[MCRecord]:
    """Options drawn independently of which one is gold; gold position uniform."""
    rng = random.Random(seed)
    return [MCRecord(f"b{seed}/{i}", "d", "hidden question", tuple(_phrase(rng) for _ in range(4)),
                     rng.randrange(4), "synthetic") for i in range(n)]


def gold_longest(n: int, seed: int = 0) -> list[MCRecord]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        ch = [_phrase(rng, 2) for _ in range(3)]
        a = rng.randrange(4)
        ch.insert(a, _phrase(rng, 5))
        out.append(MCRecord(f"l{seed}/{i}", "d", "q", tuple(ch), a, "synthetic"))
    return out


def perturbed_numbers(n: int, seed: int = 0) -> list[MCRecord]:
    """Gold g with distractors g-2d, g+2d, g+d or g-d: the gold is closest to their mean."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        g, d = rng.randint(10, 500), rng.choice([1, 2, 10])
        vals = [g, g - 2 * d, g + 2 * d, rng.choice([g + d, g - d])]
        rng.shuffle(vals)
        out.append(MCRecord(f"n{seed}/{i}", "math", "q", tuple(map(str, vals)), vals.index(g),
                            "synthetic"))
    return out


def test_balanced_set_is_near_chance() -> None:
    train, test = balanced(300, seed=1), balanced(300, seed=2)
    for check in (A.artifact_check(train, test, seed=0), A.artifact_check(train, seed=0)):
        assert check.chance == pytest.approx(0.25)
        assert not check.flag, check
        for name in A.BASELINES:
            assert abs(check.accuracy[name] - 0.25) < 0.08, (name, check.accuracy)
            assert check.accuracy[name] < check.threshold
    assert set(check.to_json()) >= {"accuracy", "p_value", "threshold", "flagged"}


def test_planted_artifacts_are_flagged() -> None:
    chk = A.artifact_check(gold_longest(200, 1), gold_longest(200, 2))
    assert chk.flag and {"longest", "classifier"} <= set(chk.flagged)
    assert chk.accuracy["longest"] == 1.0
    chk = A.artifact_check(perturbed_numbers(200, 1), perturbed_numbers(200, 2))
    assert "centroid" in chk.flagged and chk.accuracy["centroid"] == 1.0
    pos = [MCRecord(r.id, r.domain, r.question, r.choices, 2, r.source)
           for r in balanced(200, 3)]
    chk = A.artifact_check(pos[:100], pos[100:])
    assert "position" in chk.flagged and chk.accuracy["position"] == 1.0
    cv = A.artifact_check(pos)  # on the train split itself: cross-fitted, still flagged
    assert "position" in cv.flagged


def test_tie_credit_and_centroid_scores() -> None:
    r = MCRecord("t", "d", "q", ("aa", "bb", "c", "d"), 0, "s")
    assert A.longest_option_accuracy([r]) == 0.5  # two longest: half the credit
    assert A.centroid_scores(("10", "11", "12", "40")) == (-905.0, -843.0, -789.0, -2525.0)
    assert A.majority_position([r, r, MCRecord("u", "d", "q", ("a", "b"), 1, "s")]) == 0


def _brute_tail(ks: list[int], a: int) -> float:
    """P(sum of Bernoulli(1/k) >= a) by enumeration."""
    total = 0.0
    for outcome in itertools.product((0, 1), repeat=len(ks)):
        if sum(outcome) >= a:
            total += math.prod(
                (1 / k) if o else (1 - 1 / k) for o, k in zip(outcome, ks, strict=False)
            )
    return total


def test_exact_chance_tail_and_threshold() -> None:
    ks = [2, 3, 4, 4, 5, 2, 4, 3]
    recs = [MCRecord(f"r{i}", "d", "q", tuple("abcde"[:k]), 0, "s") for i, k in enumerate(ks)]
    for a in range(len(ks) + 1):
        assert A.chance_p_value(recs, a / len(ks)) == pytest.approx(_brute_tail(ks, a), abs=1e-12)
    from scipy.stats import binom

    recs4 = [MCRecord(f"r{i}", "d", "q", ("a", "b", "c", "d"), 0, "s") for i in range(150)]
    thr = A.chance_threshold(recs4, 0.01 / 4)
    a = round(thr * 150)
    assert binom.sf(a - 1, 150, 0.25) <= 0.0025 < binom.sf(a - 2, 150, 0.25)
    assert 0.33 < thr < 0.38


def test_alpha_and_empty_inputs() -> None:
    with pytest.raises(ValueError, match="alpha"):
        A.artifact_check(balanced(10), balanced(10), alpha=1.5)
    with pytest.raises(ValueError, match="non-empty"):
        A.artifact_check(balanced(10), [])
    one = [MCRecord("x", "d", "q", ("a", "b"), 0, "s")]
    assert np.isnan(A.classifier_accuracy([], one))


def test_split_table_on_a_small_real_suite(tmp_path, real_data) -> None:
    from tests.conftest import REPO
    from uqbench.data.suites.table import format_split_table, split_table

    d = real_data
    rows = split_table(str(REPO / "examples/suites/commonsense.yaml"), "smoke", data_dir=d,
                        cache_dir=tmp_path, seed=0, progress=False)
    assert [(r["domain"], r["role"]) for r in rows] == [
        (dom, role) for dom in ("openbook", "trivia") for role in ("train", "calib", "id", "shift")]
    for r in rows:
        assert r["n"] > 0 and len(r["hash"]) == 16 and r["chance"] == pytest.approx(0.25)
        assert all(0 <= r[f"acc_{b}"] <= 1 for b in A.BASELINES)
        assert isinstance(r["flag"], bool) and r["build"] == {}
    text = format_split_table(rows)
    lines = text.splitlines()
    assert lines[0].split()[:4] == ["domain", "role", "n", "hash"]
    assert len({len(x) for x in lines[2:2 + len(rows)]}) >= 1 and "openbook" in lines[2]
    assert "Bonferroni" in text and format_split_table([]) == "(no splits)"
