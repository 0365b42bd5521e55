"""Numeric multiple choice from a `NumericProblem` (`numeric_mc`); the sources (GSM8K,
MATH-500, SVAMP, MAWPS in `uqbench.data.sources.math`) read their fields into one.

Every record has 4 options with distinct numeric values, all formatted alike (integers without
".0"; a non-integer gold gets distractors with the same number of decimals). Distractors, in order
of preference:

1. numbers from the gold solution: intermediate results first (GSM8K calculator annotations
   ``<<a*b=c>>``, values right after "=" in MATH solutions), latest first -- "stopped one step
   short" is the commonest wrong answer -- then other numbers of the solution;
2. perturbations of the gold: off by one, doubled/halved, +-10 %, +-25 %, +-10, leading digit
   +-1, two adjacent digits transposed, sign flipped (only for a negative gold), in a per-record
   random order; at most one from each family, so no symmetric pair such as (g-1, g+1) or
   (g/2, 2g) ever brackets the gold.

Only plausible values are used first (same sign as the gold, within a factor 5 of it, integer if
the gold is). The gold's rank among the sorted option values is drawn uniformly per record and the
distractors are picked to realise it (a neighbouring rank when the candidates do not allow it), so
neither "pick the largest" nor "pick the median" beats chance. All randomness comes from a
per-record RNG seeded by sha256 of (seed, record id): a record never depends on which other
records were built, or on Python's hash seed.
"""
from __future__ import annotations

import itertools
import math
import random
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from uqbench.data.records import MCRecord
from uqbench.data.seeds import derive_seed

MATH_MC_VERSION = "1"
N_CHOICES = 4
_MAX_DECIMALS = 4
_PLAUSIBLE_RATIO = 5.0


def record_rng(seed: int, id: str, salt: str = "") -> random.Random:
    """A RNG that depends only on (seed, id, salt), stable across runs and Python versions."""
    return random.Random(derive_seed(int(seed), id, salt, sep="\x00", nbytes=16,
                                     byteorder="big"))


# -- numbers ---------------------------------------------------------------------------------

_NUM_RE = re.compile(r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?![\w])")


def parse_number(text: str) -> float | None:
    """'1,250' -> 1250.0, '$18' -> 18.0, '-4' -> -4.0, '3.50' -> 3.5; None if not a number."""
    s = str(text).strip().replace(",", "").replace("$", "").replace(" ", "")
    s = s.removesuffix(".")
    if not re.fullmatch(r"[-+]?(\d+(\.\d*)?|\.\d+)", s):
        return None
    v = float(s)
    return v if math.isfinite(v) else None


def decimals_of(x: float) -> int:
    """Decimals needed to write x (0 for an integer value), at most 4."""
    for k in range(_MAX_DECIMALS + 1):
        if abs(round(x, k) - x) <= 1e-9 * max(1.0, abs(x)):
            return k
    return _MAX_DECIMALS


def format_number(x: float, decimals: int) -> str:
    """Integers without '.0' (and without '-0'); otherwise exactly ``decimals`` decimals."""
    if decimals <= 0:
        return str(round(x))
    s = f"{x:.{decimals}f}"
    return "0" + s[2:] if s.startswith("-0") and float(s) == 0 else s


# -- candidates ------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Cand:
    value: float
    method: str          # "intermediate", "solution_number", "hint", "perturbation:<name>"...
    family: str | None   # perturbation family: at most one per record
    tier: int            # lower = preferred


def _valid(v: float, gold: float, k: int, gold_str: str) -> str | None:
    """The formatted value if it may stand beside the gold as a distractor, else None."""
    if not math.isfinite(v):
        return None
    s = format_number(v, k)
    if s == gold_str:
        return None
    if k == 0:
        if abs(v - round(v)) > 1e-9 * max(1.0, abs(v)):
            return None
    else:
        # same shape as the gold: exactly k decimals, last one non-zero, and no rounding
        if decimals_of(v) > k or s[-1] == "0":
            return None
    return s


def _same_sign(v: float, gold: float) -> bool:
    if gold > 0:
        return v > 0
    if gold < 0:
        return v < 0
    return v > 0


def _plausible(v: float, gold: float) -> bool:
    if not _same_sign(v, gold):
        return False
    a, b = abs(v), abs(gold)
    if b < 1e-12:
        return a <= 10
    return (1 / _PLAUSIBLE_RATIO <= a / b <= _PLAUSIBLE_RATIO) or abs(a - b) <= 5


def _digit_swaps(gold: float, k: int) -> list[float]:
    s = format_number(abs(gold), k)
    digits = [c for c in s if c.isdigit()]
    pos = [i for i, c in enumerate(s) if c.isdigit()]
    out = []
    for j in range(len(digits) - 1):
        if digits[j] == digits[j + 1]:
            continue
        chars = list(s)
        chars[pos[j]], chars[pos[j + 1]] = chars[pos[j + 1]], chars[pos[j]]
        t = "".join(chars)
        if t[0] == "0" and len(t.split(".")[0]) > 1:
            continue  # leading zero
        out.append(math.copysign(float(t), gold) if gold else float(t))
    return out


def _perturbations(gold: float, k: int, rng: random.Random) -> list[_Cand]:
    """Single perturbations of the gold, for the last-resort design (shuffled per record)."""
    g = gold
    unit = 1.0 if k == 0 else 10.0 ** -k
    fam: list[tuple[str, list[tuple[str, float]]]] = [
        ("small_offset", [("plus_one", g + 1), ("minus_one", g - 1), ("plus_two", g + 2),
                          ("minus_two", g - 2)]),
        ("scale", [("double", 2 * g), ("half", g / 2)]),
        ("percent", [("plus_10pct", round(g * 1.1, k)), ("minus_10pct", round(g * 0.9, k)),
                     ("plus_25pct", g * 1.25), ("minus_25pct", g * 0.75)]),
    ]
    if k > 0:
        fam[0][1].extend([("plus_unit", g + unit), ("minus_unit", g - unit)])
    big = []
    if abs(g) >= 20:
        big += [("plus_ten", g + 10), ("minus_ten", g - 10)]
    if abs(g) >= 100:
        lead = 10.0 ** math.floor(math.log10(abs(g)))
        big += [("lead_plus", g + lead), ("lead_minus", g - lead)]
    if big:
        fam.append(("big_offset", big))
    swaps = _digit_swaps(g, k)
    if swaps:
        fam.append(("digit_swap", [("digit_swap", rng.choice(swaps))]))
    rng.shuffle(fam)
    for _, opts in fam:
        rng.shuffle(opts)
    out = [_Cand(v, f"perturbation:{name}", family, 2) for family, opts in fam for name, v in opts]
    if g < 0:  # a sign flip only ever for a negative gold, and as a last resort
        out.append(_Cand(-g, "perturbation:sign_flip", "sign_flip", 3))
    return out


def _fillers(gold: float, k: int) -> Iterable[_Cand]:
    """Last-resort distractors: gold +- j units, j = 3, 4, ... (each its own family)."""
    unit = 1.0 if k == 0 else 10.0 ** -k
    for j in range(3, 400):
        for sgn in (1, -1):
            yield _Cand(gold + sgn * j * unit, f"perturbation:offset_{sgn * j}", f"offset{j}",
                        5)


def _greedy(gold: float, k: int, gold_str: str, cands: list[_Cand], rank: int
            ) -> list[tuple[float, str]] | None:
    """Last resort: 3 single perturbations (one per family) with exactly ``rank`` below."""
    need = {True: rank, False: N_CHOICES - 1 - rank}   # key: value < gold
    chosen: list[tuple[float, str]] = []
    seen = {gold_str}
    families: set[str] = set()
    for c in itertools.chain(cands, _fillers(gold, k)):
        if not (_same_sign(c.value, gold) or c.family == "sign_flip"
                or (c.value == 0 and 0 < gold <= 2)):
            continue
        s = _valid(c.value, gold, k, gold_str)
        if s is None or s in seen or (c.family is not None and c.family in families):
            continue
        below = c.value < gold
        if need[below] == 0:
            continue
        need[below] -= 1
        seen.add(s)
        if c.family is not None:
            families.add(c.family)
        chosen.append((c.value, c.method))
        if len(chosen) == N_CHOICES - 1:
            return chosen
    return None


def _shift_ops(gold: float, k: int, rng: random.Random) -> list[tuple[str, Any]]:
    """Perturbations applied alike to two numbers (symmetric: each is undone by another)."""
    offsets = [1.0, 2.0]
    if abs(gold) >= 20:
        offsets.append(10.0)
    if abs(gold) >= 100:
        offsets.append(10.0 ** math.floor(math.log10(abs(gold))))
    names = {1.0: "one", 2.0: "two", 10.0: "ten"}

    def shifts(ds: list[float]) -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = []
        for d in ds:
            nm = names.get(d, format_number(d, _MAX_DECIMALS).rstrip("0").rstrip("."))
            out.append((f"plus_{nm}", lambda x, d=d: x + d))
            out.append((f"minus_{nm}", lambda x, d=d: x - d))
        return out

    ops = [*shifts(offsets), ("double", lambda x: 2 * x), ("half", lambda x: x / 2)]
    rng.shuffle(ops)
    # A change of the last decimal (2.75 -> 2.76) spoils "nice" fractions, which the gold
    # usually is: only when nothing else realises the rank.
    late = shifts([10.0 ** -k]) if k > 0 else []
    rng.shuffle(late)
    return ops + late


def _designs(gold: float, k: int, gold_str: str, naturals: list[tuple[float, str]],
             rng: random.Random) -> list[list[tuple[list[tuple[float, str]], int]]]:
    """Candidate distractor triples, by design class (most preferred first), each with the rank
    of the gold among the 4 values.

    1. three numbers of the solution;
    2. a "square" on one solution number h: {h, op(gold), op(h)} -- gold and h play the same
       role, so the gold is not the one number that all others are simple functions of;
    3. an additive square {gold+a, gold+b, gold+a+b}: every option is one step from two others.
    """
    def ok(triple: list[tuple[float, str]]) -> bool:
        strs = {gold_str}
        for v, _ in triple:
            s = _valid(v, gold, k, gold_str)
            if s is None or s in strs or not _plausible(v, gold):
                return False
            strs.add(s)
        return True

    def rank(triple: list[tuple[float, str]]) -> int:
        return sum(v < gold for v, _ in triple)

    # only the first configuration of each rank matters (see _numeric_mc)
    firsts: list[dict[int, list[tuple[float, str]]]] = [{}, {}, {}]

    def offer(cls: int, t: list[tuple[float, str]]) -> None:
        r = rank(t)
        if r not in firsts[cls] and ok(t):
            firsts[cls][r] = t

    nat = naturals[:8]
    for combo in itertools.combinations(nat, 3):
        offer(0, list(combo))
    ops = _shift_ops(gold, k, rng)
    for h, method in nat[:6]:
        for name, op in ops:
            offer(1, [(h, method), (op(gold), f"perturbation:{name}"),
                      (op(h), f"perturbation:{name}({method})")])
    adds = [(n, op) for n, op in ops if n.startswith(("plus_", "minus_"))]
    for (na, a), (nb, b) in itertools.permutations(adds, 2):
        if na.split("_", 1)[1] == nb.split("_", 1)[1]:
            continue  # +d and -d would bracket the gold
        offer(2, [(a(gold), f"perturbation:{na}"), (b(gold), f"perturbation:{nb}"),
                  (b(a(gold)), f"perturbation:{na}+{nb}")])
    classes = [[(t, r) for r, t in f.items()] for f in firsts]
    return classes


@dataclass(frozen=True)
class NumericProblem:
    """A problem with a numeric answer, read from its dataset by its source
    (`uqbench.data.sources.math`): all `numeric_mc` needs, no dataset field.

    ``id`` seeds the record's RNG (with the seed) and is the record's id; ``hints`` are
    wrong-but-plausible values with how they were found (``"intermediate"``,
    ``"solution_number"``, ``"hint"``), most preferred first; ``meta`` goes into the record's.
    """

    id: str
    source: str
    question: str
    gold: float
    hints: tuple[tuple[float, str], ...] = ()
    meta: Mapping[str, Any] = field(default_factory=dict)


def numeric_mc(problem: NumericProblem, *, seed: int, domain: str = "math") -> MCRecord:
    """A 4-option numeric record (ValueError for a gold that is not a finite number).

    Examples
    --------
    >>> r = numeric_mc(NumericProblem("toy/1", "toy", "2 + 3?", 5), seed=0)
    >>> r.choices[r.answer], len(r.choices)
    ('5', 4)
    """
    return _numeric_mc(problem.question, problem.gold, problem.hints, seed=seed, id=problem.id,
                       source=problem.source, domain=domain, meta=dict(problem.meta) or None)


def _numeric_mc(question: str, gold: float, hints: Sequence[tuple[float, str]], *,
                seed: int, id: str, source: str, domain: str = "math",
                meta: dict[str, Any] | None = None) -> MCRecord:
    g = float(gold)
    if not math.isfinite(g):
        raise ValueError(f"record {id!r}: gold {gold!r} is not a finite number")
    k = decimals_of(g)
    gold_str = format_number(g, k)
    rng = record_rng(seed, id, "math_mc")

    naturals: list[tuple[float, str]] = []
    seen = {gold_str}
    for v, method in sorted(hints, key=lambda h: 0 if h[1] == "intermediate" else 1):
        s = _valid(v, g, k, gold_str)
        if s is not None and s not in seen and _plausible(v, g):
            seen.add(s)
            naturals.append((v, method))

    target = rng.randrange(N_CHOICES)
    by_distance = sorted(range(N_CHOICES), key=lambda r: (abs(r - target), rng.random()))
    classes = _designs(g, k, gold_str, naturals, rng)
    chosen: list[tuple[float, str]] | None = None
    design = ""
    for r in by_distance:
        for name, configs in zip(
            ("solution_numbers", "square", "additive_square"), classes, strict=False
        ):
            chosen = next((t for t, rr in configs if rr == r), None)
            if chosen is not None:
                design = name
                break
        if chosen is not None:
            break
    if chosen is None:
        pert = _perturbations(g, k, rng)
        far = [_Cand(v, m, None, 4) for v, m in hints]
        cands = ([c for c in pert if _plausible(c.value, g) or c.family == "sign_flip"]
                 + [c for c in pert if not _plausible(c.value, g) and c.family != "sign_flip"]
                 + far)
        design = "single_perturbations"
        for r in by_distance:
            chosen = _greedy(g, k, gold_str, cands, r)
            if chosen is not None:
                break
    if chosen is None:  # cannot happen: fillers always reach one side for every rank
        raise ValueError(f"record {id!r}: could not build distractors for gold {gold_str}")
    chosen = [(format_number(v, k), m, v) for v, m in chosen]  # type: ignore[misc]

    answer = rng.randrange(N_CHOICES)
    rng.shuffle(chosen)
    options: list[tuple[str, str, float]] = list(chosen)  # type: ignore[arg-type]
    options.insert(answer, (gold_str, "gold", g))
    values = sorted(v for _, _, v in options)
    record_meta: dict[str, Any] = {
        "builder": "numeric_mc", "version": MATH_MC_VERSION, "gold": gold_str,
        "decimals": k, "choice_methods": [m for _, m, _ in options],
        "design": design, "target_rank": target, "gold_rank": values.index(g),
    }
    if meta:
        record_meta.update(meta)
    return MCRecord(id=id, domain=domain, question=question,
                    choices=tuple(s for s, _, _ in options), answer=answer, source=source,
                    meta=record_meta)
