"""Code multiple choice from MBPP and HumanEval: the reference solution among three mutants of
it that *fail the problem's own tests when executed* (in `uqbench.data.sandbox`).

Mutants are single AST edits (`ast` + `ast.unparse`): comparison swaps (< <=, > >=, == !=, in /
not in, direction flips), arithmetic swaps (+ -, * +, / *, // *...), a term dropped (``a + b`` ->
``a``), integer constants +-1 and boolean constants flipped, the first two call arguments
swapped, min/max, any/all, upper/lower, startswith/endswith... swapped, a wrapper dropped
(``abs(x)`` -> ``x``), ``range(n)`` -> ``range(n - 1)`` / ``range(n + 1)``, an index +-1, slice
bounds swapped, ``and`` <-> ``or``, a condition (also a comprehension's, a boolean return)
negated (``not`` inserted, or removed from ``not x``), ``''`` <-> ``' '``; as a last resort
("blunt": used only when the subtle ones do not suffice) ``len(x)`` -> ``x``, ``reverse=True``
added to a sort, a string upper/lower-cased. (A return value replaced by ``None`` and ``*`` ->
``//`` are not used: the options-only classifier learnt ``None`` and ``//`` as marks of a
distractor.) Candidates are tried by tier (`mutation_tier`): swaps that keep the program's
tokens (an operator, constant, builtin, argument order or slice bound swapped) before edits that
insert or delete tokens (``not``, ``- 1``, a dropped term or wrapper), blunt ones last. All four
options are ``ast.unparse`` output with docstrings removed (comments and formatting cannot give
the reference away; the question carries the docstring).

Scheme "square" (default): two failing single mutants a and b at unrelated places, plus the
double mutant a+b, which must fail too. The options {ref, ref+a, ref+b, ref+a+b} are symmetric:
every option differs from two others by one edit and from the third by two, so "pick the option
closest to all others" -- which finds the reference every time among independent single mutants,
since it is their common ancestor -- is at chance by edit distance. What still tells the
reference from the options alone, and what is done about it (each measured with the
options-only check of `uqbench.data.artifacts`):

- *3-gram sets.* An edit's new 3-grams are new to the program while the ones it removes often
  survive elsewhere, so the reference tended to be the shortest, smallest and least central
  option (centroid baseline 0.16, far below chance). Within a tier, edits that shrink the
  3-gram set alternate with those that grow it, so both are among the first tried.
- *Commoner tokens.* Real code says ``==`` more than ``!=``, ``0`` more than ``-1``, ``x`` more
  than ``not x``: the reference was "the option with the commoner tokens" (the classifier
  picked it in 43% of squares with an ``==`` -> ``!=`` edit and in none with ``!=`` -> ``==``).
  A swap (or negation) to a rarer token is tried late in proportion to how much rarer it is
  in real references (`balance_directions`, `SWAP_PRIOR`), so that across a split each pair is
  used about as often one way as the other.
- *Ranks.* Each record draws three target ranks for its reference -- how many options are
  shorter, more central (`centroid_scores`), and of commoner tokens (`commonness`) -- and
  among the verified squares the one closest to them is kept while candidates last.

Scheme "independent": three failing single mutants of different kinds where possible; "square"
falls back to it (``meta["scheme"]`` says which) for tiny programs such as ``return a + b`` that
have no two unrelated edit sites.

Everything is deterministic under (seed, record id): candidates are shuffled by a per-record RNG,
runs are pinned to one hash seed, and a mutant's budget is a multiple of the reference's run time
(a mutant that times out counts as failing; the count is reported as ``killed``).

Running the candidates: by default one `uqbench.data.sandbox.SandboxSession` per problem -- one
sandboxed fork server that runs the reference and then each mutant in its own forked child with
its own limits -- and the times are **CPU** seconds measured inside the child, so a mutant's
budget, and its verdict, do not depend on the machine's load (a wall-clock backstop stays).
``per_candidate_process=True`` runs each candidate in its own fresh interpreter under wall-clock
time (`Sandbox.run`): the reference path the session path is tested against (same records and
statistics on the fingerprint problems, real MBPP and adversarial mutants).
"""
from __future__ import annotations

import ast
import functools
import math
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from uqbench.data.artifacts import centroid_scores, char_ngrams
from uqbench.data.mc.mutations import (
    BOOLISH,
    FUNC_SWAP,
    METHOD_SWAP,
    Mutation,
    ancestry,
    apply_mutations,
    enumerate_mutations,
    is_not,
    opname,
)
from uqbench.data.mc.numeric import record_rng
from uqbench.data.records import MCRecord
from uqbench.data.sandbox import Sandbox, SandboxResult, SandboxSession

CODE_MC_VERSION = "5"  # 4: swap directions balanced; 5: a target rank for commonness
N_CHOICES = 4
SCHEMES = ("square", "independent")
DEFAULT_MAX_TRIES = 16
REFERENCE_TIMEOUT_FACTOR = 6.0

def reference_token_counts(source: str) -> Counter[str]:
    """How often each token a swap trades appears in ``source``: comparison, arithmetic and
    boolean operators by AST name (``Eq``, ``Add``, ``And``), boolean and integer constants
    (``-1`` counted as ``"-1"``), the functions and methods of ``FUNC_SWAP``/``METHOD_SWAP``
    (``min``, ``.upper``), and conditions (of ``if``/``while``/``x if c else y``/a comprehension,
    a boolean return) as ``"Not"`` when negated, else ``"test"``. `SWAP_PRIOR` is its sum over
    the real references."""
    counts: Counter[str] = Counter()
    tree = ast.parse(source)
    negated = {id(n.operand) for n in ast.walk(tree)
               if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub)}
    for n in ast.walk(tree):
        if isinstance(n, ast.Compare):
            counts.update(opname(op) for op in n.ops)
        elif isinstance(n, (ast.BinOp, ast.AugAssign, ast.BoolOp)):
            counts[opname(n.op)] += 1
        elif isinstance(n, ast.Constant) and isinstance(n.value, int):
            counts[("-" if id(n) in negated else "") + str(n.value)] += 1
        elif isinstance(n, ast.Call):
            f = n.func
            if isinstance(f, ast.Name) and f.id in FUNC_SWAP:
                counts[f.id] += 1
            elif isinstance(f, ast.Attribute) and f.attr in METHOD_SWAP:
                counts["." + f.attr] += 1
        tests = (n.test,) if isinstance(n, (ast.If, ast.While, ast.IfExp)) else (
            n.ifs if isinstance(n, ast.comprehension) else ())
        if isinstance(n, ast.Return) and (isinstance(n.value, BOOLISH) or is_not(n.value)):
            tests = (n.value,)
        counts.update("Not" if is_not(t) else "test" for t in tests)
    return counts


#: `reference_token_counts` summed over every MBPP reference (974, all splits) and every
#: HumanEval prompt + canonical solution (164) of the data folder, tokens seen at least 3 times
#: (``tests/data/mc/test_code.py`` recomputes it from the real files).
SWAP_PRIOR: dict[str, int] = {
    "1": 1413, "test": 1144, "Add": 1077, "0": 1057, "Sub": 600, "Eq": 587, "Mult": 469, "2": 463,
    "Mod": 237, "Gt": 179, "-1": 159, "Lt": 156, "False": 155, "True": 148, "And": 131,
    "Div": 129, "NotEq": 108, "LtE": 102, "max": 100, "FloorDiv": 80, "Or": 78, "3": 68, "10": 67,
    "GtE": 61, "In": 55, "min": 52, "4": 39, "Not": 37, "Pow": 29, "RShift": 28, "BitAnd": 27,
    "BitXor": 23, "5": 21, "NotIn": 21, "BitOr": 19, "all": 19, "12": 16, "6": 16, "LShift": 16,
    "8": 13, "9": 12, "100": 11, "2000": 11, "7": 11, "Is": 11, ".isalpha": 10, ".isdigit": 9,
    ".isupper": 9, ".keys": 9, ".values": 9, "any": 9, ".lower": 8, "360": 8, ".islower": 7,
    "26": 7, ".index": 6, "16": 5, "180": 5, "50": 5, "-2": 4, "1000": 4, "11": 4, "20": 4,
    "21": 4, "101": 3, "130": 3, "400": 3, "500": 3, "60": 3,
}


_PRIOR_TOTAL = sum(SWAP_PRIOR.values()) + len(SWAP_PRIOR)


@functools.lru_cache(maxsize=1 << 14)  # a build asks again for the same options
def commonness(source: str) -> float:
    """Log-probability of the program's `reference_token_counts` tokens under a unigram model
    of the real references (`SWAP_PRIOR`, add-one smoothed): lower for each rarer token swapped
    in (``!=`` for ``==``) and for each one inserted (``not``)."""
    return sum(n * math.log((SWAP_PRIOR.get(t, 0) + 1) / _PRIOR_TOTAL)
               for t, n in reference_token_counts(source).items())


def swap_tokens(m: Mutation) -> tuple[str, str] | None:
    """``(old, new)`` for a swap that trades one `reference_token_counts` token for another
    (``("Eq", "NotEq")``, ``("0", "-1")``, ``("min", "max")``), else None."""
    if m.kind in ("comparison", "arithmetic", "boolean", "constant", "builtin", "return") \
            and "->" in m.variant:
        old, new = m.variant.split(":")[-1].split("->")
        return old, new
    if m.variant.startswith(("negate", "unnegate")):
        return ("test", "Not") if m.variant.startswith("negate") else ("Not", "test")
    return None


def balance_directions(muts: Sequence[Mutation], rng: Any) -> list[Mutation]:
    """Keep a swap old -> new in its place with probability min(1, f(new) / f(old)) (f:
    `SWAP_PRIOR` + 1), else try it only after every other swap and insertion/deletion (before
    the blunt edits). Over many programs each swap pair is then used about as often in one
    direction as in the other: count(old -> new) is proportional to f(old) * min(1, f(new) /
    f(old)) = min(f(old), f(new)). (A negation counts as the swap "test" -> "Not".)"""
    def rank(m: Mutation) -> float:
        t = swap_tokens(m)
        if t is None:
            return m.tier
        p = (SWAP_PRIOR.get(t[1], 0) + 1) / (SWAP_PRIOR.get(t[0], 0) + 1)
        return m.tier if p >= 1 or rng.random() < p else 1.5

    return sorted(muts, key=rank)  # stable; rank is called once per mutation, in order


def order_mutations(muts: Sequence[Mutation], rng: Any) -> list[Mutation]:
    """By tier (`mutation_tier`: token-keeping swaps, then insertions/deletions, then blunt),
    round-robin over kinds within a tier (kinds and members shuffled), so the first few
    candidates are of different kinds."""
    ordered: list[Mutation] = []
    for tier in (0, 1, 2):
        groups: dict[str, list[Mutation]] = {}
        for m in muts:
            if m.tier == tier:
                groups.setdefault(m.kind, []).append(m)
        kinds = sorted(groups)
        rng.shuffle(kinds)
        for k in kinds:
            rng.shuffle(groups[k])
        i = 0
        while any(groups.values()):
            k = kinds[i % len(kinds)]
            if groups[k]:
                ordered.append(groups[k].pop(0))
            i += 1
    return ordered


def alternate_signs(muts: Sequence[Mutation], delta: dict[Mutation, int]) -> list[Mutation]:
    """Within each tier, alternate mutations that shrink the set of character 3-grams with those
    that grow it (order kept otherwise), so that both kinds are among the first tried."""
    out: list[Mutation] = []
    for tier in (0, 1, 2):
        groups = ([m for m in muts if m.tier == tier and delta[m] < 0],
                  [m for m in muts if m.tier == tier and delta[m] >= 0])
        for i in range(max(map(len, groups))):
            out += [g[i] for g in groups if i < len(g)]
    return out


# -- building --------------------------------------------------------------------------------

@dataclass(frozen=True)
class CodeProblem:
    """A programming problem, read from its dataset by its source (`uqbench.data.sources.code`):
    all `code_mc` needs, no dataset field."""

    rid: str
    source: str
    question: str
    reference: str      # raw reference source
    tests: str          # appended to a candidate to test it ("": none)
    entry_point: str | None
    meta: Mapping[str, Any]


_DEFAULT_SANDBOX: Sandbox | None = None


def _default_sandbox() -> Sandbox:
    global _DEFAULT_SANDBOX
    if _DEFAULT_SANDBOX is None:
        _DEFAULT_SANDBOX = Sandbox(workers=1)
    return _DEFAULT_SANDBOX


def _outcome(res: SandboxResult) -> str:
    if res.killed_reason:
        return res.killed_reason
    lines = [ln for ln in res.stderr_tail.strip().splitlines() if ln.strip()]
    last = lines[-1] if lines else ""
    name = last.split(":", 1)[0].strip()
    if name == "AssertionError":
        return "assertion"
    return f"error:{name}" if name.isidentifier() else "error"


def _stats(**kw: Any) -> dict[str, Any]:
    base = {"mutants_tried": 0, "mutants_failing": 0, "verified": False,
            "reference_passed": False, "killed": 0, "reason": ""}
    base.update(kw)
    return base


def _build(p: CodeProblem, *, seed: int, sb: Sandbox | SandboxSession, scheme: str,
           max_tries: int, fallback: bool = True) -> tuple[MCRecord | None, dict[str, Any]]:
    unlimited: Counter[str] = Counter()  # runs that went without an OS limit, by limit

    def run(code: str, timeout_s: float) -> SandboxResult:
        res = sb.run(code, timeout_s=timeout_s)
        unlimited.update(res.limits_failed)
        return res

    def done(rec: MCRecord | None, st: dict[str, Any]) -> tuple[MCRecord | None, dict[str, Any]]:
        if unlimited:  # only then: a fully limited build's stats stay as they were
            st["limits_failed"] = dict(sorted(unlimited.items()))
        return rec, st

    try:
        tree = ast.parse(p.reference)
    except SyntaxError as e:
        return None, _stats(reason=f"reference does not parse: {e.msg} (line {e.lineno})")
    ref_text = apply_mutations(tree, [])
    # Some references are slow (MBPP 123 runs ~5 s): give them REFERENCE_TIMEOUT_FACTOR times
    # the sandbox's timeout, and each mutant 5x the reference's time (at least 0.5 s), on the
    # clock the runs are limited by (`SandboxResult.spent_s`: CPU in a session, else wall).
    ref_timeout = REFERENCE_TIMEOUT_FACTOR * sb.timeout_s
    ref = run(ref_text + "\n\n" + p.tests + "\n", timeout_s=ref_timeout)
    if not ref.passed:
        why = ref.killed_reason or _outcome(ref)
        return done(None, _stats(reason=f"reference fails its tests ({why})",
                                 killed=int(ref.killed)))
    budget = min(ref_timeout, max(0.5, 5.0 * ref.spent_s))
    rng = record_rng(seed, p.rid, "code_mc")
    length_target, central_target, common_target = (rng.randrange(N_CHOICES) for _ in range(3))
    muts = order_mutations(enumerate_mutations(tree, p.entry_point), rng)
    ref_grams, ref_common = len(char_ngrams(ref_text)), commonness(ref_text)
    texts: dict[tuple[Mutation, ...], str] = {}  # each mutant unparsed once

    def text_of(ms: Sequence[Mutation]) -> str:
        key = tuple(ms)
        if key not in texts:
            texts[key] = apply_mutations(tree, ms)
        return texts[key]

    muts = alternate_signs(muts, {m: len(char_ngrams(text_of([m]))) - ref_grams for m in muts})
    muts = balance_directions(muts, rng)
    anc = ancestry(tree)
    seen = {ref_text}
    stats = _stats(reference_passed=True, candidates=len(muts), scheme=scheme)
    failing: list[tuple[Mutation, str, str]] = []   # (mutation, text, outcome)

    def test(ms: Sequence[Mutation]) -> tuple[str, str] | None:
        """Run a mutant; (text, outcome) if it fails the tests, None if it passes or is a
        duplicate (duplicates are not run)."""
        text = text_of(ms)
        if text in seen:
            return None
        seen.add(text)
        res = run(text + "\n\n" + p.tests + "\n", timeout_s=budget)
        stats["mutants_tried"] += 1
        stats["killed"] += int(res.killed)
        if res.passed:
            return None
        stats["mutants_failing"] += 1
        return text, _outcome(res)

    def miss(texts: Sequence[str]) -> int:
        """How far the reference is from its target ranks among the options: how many are
        shorter than it, how many are more central (`centroid_scores`), how many have commoner
        tokens (`commonness`)."""
        central = centroid_scores((ref_text, *texts))
        return (abs(sum(len(t) < len(ref_text) for t in texts) - length_target)
                + abs(sum(c > central[0] for c in central[1:]) - central_target)
                + abs(sum(commonness(t) > ref_common for t in texts) - common_target))

    def pair(a: Mutation, b: Mutation) -> list[Mutation]:
        return [a, b] if a.site < b.site else [b, a]

    picked: list[tuple[list[Mutation], str, str]] | None = None
    best = N_CHOICES * 2
    for m in muts:
        if stats["mutants_tried"] >= max_tries or (picked is not None and best == 0):
            break
        r = test([m])
        if r is None:
            continue
        if scheme == "independent":
            failing.append((m, *r))
            if len(failing) == N_CHOICES - 1:
                picked, best = [([fm], t, o) for fm, t, o in failing], 0
            continue
        # partners at unrelated sites, those that put the reference nearest its target ranks
        # first, then of a kind other than m's; a square that misses them is kept while
        # candidates last, in case a better one verifies
        partners = [(miss([f[1], r[0], text_of(pair(f[0], m))]), f)
                    for f in failing
                    if m.site not in anc[f[0].site] and f[0].site not in anc[m.site]]
        partners.sort(key=lambda x: (x[0], x[1][0].kind == m.kind))
        failing.append((m, *r))
        for score, (fm, ftext, fout) in partners:
            if stats["mutants_tried"] >= max_tries or score >= best:
                break
            r2 = test(pair(fm, m))
            if r2 is not None:
                picked = [([fm], ftext, fout), ([m], r[0], r[1]), (pair(fm, m), r2[0], r2[1])]
                best = score
                break
    used = scheme
    if picked is None and scheme == "square" and fallback and len(failing) >= N_CHOICES - 1:
        # tiny programs (``return a + b``) have no two unrelated edit sites
        firsts: list[tuple[Mutation, str, str]] = []
        for tier in (0, 1, 2):  # by tier, then different kinds before repeats
            group = [f for f in failing if f[0].tier == tier]
            for f in group:
                if f[0].kind not in {x[0].kind for x in firsts}:
                    firsts.append(f)
            firsts += [f for f in group if f not in firsts]
        picked = [([fm], t, o) for fm, t, o in firsts[:N_CHOICES - 1]]
        used = "independent"
    if picked is None:
        need = ("no square (2 failing mutants and their failing combination)"
                if scheme == "square" else f"fewer than {N_CHOICES - 1} failing mutants")
        stats["reason"] = (f"found {need} among {stats['mutants_tried']} tried of {len(muts)} "
                           f"candidates ({stats['mutants_failing']} failing)")
        return done(None, stats)

    answer = rng.randrange(N_CHOICES)
    rng.shuffle(picked)
    options: list[tuple[str, list[dict[str, Any]] | None, str | None]] = [
        (t, [x.describe() for x in ms], o) for ms, t, o in picked]
    options.insert(answer, (ref_text, None, None))
    meta = {
        "builder": "code_mc", "version": CODE_MC_VERSION, "scheme": used,
        "choice_mutations": [ms for _, ms, _ in options],
        "python": f"{sys.version_info[0]}.{sys.version_info[1]}",
        **p.meta,
    }
    # how each mutant failed ("assertion", "timeout", "error:IndexError"): in the stats, not the
    # record, since a mutant near its time budget fails by "timeout" on a busy machine
    stats.update(verified=True, reason="ok", scheme=used,
                 choice_outcomes=[o for _, _, o in options])
    return done(MCRecord(id=p.rid, domain="code", question=p.question,
                         choices=tuple(t for t, _, _ in options), answer=answer,
                         source=p.source, meta=meta), stats)


def code_mc(problem: CodeProblem, *, seed: int, sandbox: Sandbox | None = None,
            scheme: str = "square", max_tries: int = DEFAULT_MAX_TRIES,
            per_candidate_process: bool = False) -> tuple[MCRecord | None, dict[str, Any]]:
    """The code MC record of ``problem`` (None when it has no tests, its reference fails them
    or too few failing mutants are found) and the build statistics. The candidates run in one
    `SandboxSession` of ``sandbox`` (CPU-time budgets), or each in its own process with
    ``per_candidate_process`` (wall-clock budgets; the reference path)."""
    if scheme not in SCHEMES:
        raise ValueError(f"code MC scheme {scheme!r}: expected one of {SCHEMES}")
    if not problem.tests.strip():
        return None, _stats(reason="no tests")
    sb = sandbox if sandbox is not None else _default_sandbox()
    if per_candidate_process:
        return _build(problem, seed=seed, sb=sb, scheme=scheme, max_tries=max_tries)
    with sb.session() as session:  # its server starts at the first run
        return _build(problem, seed=seed, sb=session, scheme=scheme, max_tries=max_tries)


__all__ = ["CODE_MC_VERSION", "CodeProblem", "code_mc"]
