"""Builders: the multiple-choice form of sources whose items are raw (``Source.kind``).

``gsm8k``, ``math500`` and ``numeric`` (SVAMP, MAWPS) make numeric MC with
`uqbench.data.mathmc`; ``mbpp`` and ``humaneval`` make code MC with sandbox-verified mutants
with `uqbench.data.codemc`. The builder modules are imported lazily (`builder_available` says
whether one can be), and each `Builder` names the version constants its output depends on:
they, not the code's bytes, key the split cache (`builder_info`), so bump the right one by hand
when a builder's output changes (tests/test_fingerprints.py fails until you do).
"""
from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from uqbench.data.records import MCRecord
from uqbench.data.seeds import derive_seed
from uqbench.data.sources import LOADER_VERSION, HubLoader, Item, load_source
from uqbench.errors import DataError

#: Bump when `build_item` (per-item seeds, equation hints, the SVAMP question) changes a record.
BUILD_ITEM_VERSION = "1"

Built = tuple[MCRecord | None, dict[str, Any]]


@dataclass(frozen=True)
class Builder:
    """How one ``kind`` of raw item becomes MC: ``module.function`` (imported lazily), called
    through ``call(fn, item, seed)``; ``versions`` are the ``module.CONSTANT`` names whose values
    key the split cache."""

    kind: str
    module: str
    function: str
    call: Callable[[Callable[..., Any], Item, int], Built]
    versions: tuple[str, ...]


BUILDERS: dict[str, Builder] = {}
_MATH = ("uqbench.data.mathmc.MATH_MC_VERSION",)
_CODE = ("uqbench.data.codemc.CODE_MC_VERSION", "uqbench.data.mathmc.MATH_MC_VERSION",
         "uqbench.data.sandbox.SANDBOX_VERSION")


def register_builder(kind: str, module: str, function: str, versions: Sequence[str]
                     ) -> Callable[[Callable[..., Built]], Callable[..., Built]]:
    """Decorator: register ``call(fn, item, seed)`` as the builder of ``kind``."""
    def deco(call: Callable[..., Built]) -> Callable[..., Built]:
        if kind in BUILDERS:
            raise ValueError(f"builder {kind!r} is already registered; pick another kind")
        BUILDERS[kind] = Builder(kind, module, function, call, tuple(versions))
        return call
    return deco


def _accepts(fn: Callable[..., Any], name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


@register_builder("gsm8k", "uqbench.data.mathmc", "gsm8k_mc", _MATH)
def _gsm8k(fn: Callable[..., Any], item: Item, seed: int) -> Built:
    split = item.id.split("/")[1] if item.id.count("/") >= 2 else "test"
    kw: dict[str, Any] = {"split": split} if _accepts(fn, "split") else {}
    return fn(dict(item.raw or {}), seed=seed, index=item.position, **kw), {}


@register_builder("math500", "uqbench.data.mathmc", "math500_mc", _MATH)
def _math500(fn: Callable[..., Any], item: Item, seed: int) -> Built:
    return fn(dict(item.raw or {}), seed=seed), {}


@register_builder("numeric", "uqbench.data.mathmc", "numeric_mc", _MATH)
def _numeric(fn: Callable[..., Any], item: Item, seed: int) -> Built:
    """SVAMP (``Body`` + ``sQuestion``) or MAWPS, with hints from the equation."""
    raw = dict(item.raw or {})
    if "Body" in raw:  # SVAMP
        q, gold, eq = _svamp_question(raw), float(raw["lSolutions"]), raw.get("Equation")
    else:  # MAWPS
        q, gold, eq = str(raw["original_text"]), float(raw["ans"]), raw.get("equation")
    hints = [h for h in _equation_hints(str(eq or "")) if h != gold]
    try:
        return fn(q, gold, hints=hints, seed=seed, id=item.id, source=item.id.split("/")[0]), {}
    except ValueError as exc:  # e.g. a non-finite gold
        return None, {"reason": f"numeric_mc: {exc}"}


def _code(fn: Callable[..., Any], item: Item, seed: int) -> Built:
    out = fn(dict(item.raw or {}), seed=seed)
    return out if isinstance(out, tuple) else (out, {})


register_builder("mbpp", "uqbench.data.codemc", "mbpp_mc", _CODE)(_code)
register_builder("humaneval", "uqbench.data.codemc", "humaneval_mc", _CODE)(_code)


def builder_available(kind: str) -> tuple[bool, str]:
    """``(ok, why_not)`` for a builder kind (``"mc"`` is always available)."""
    if kind == "mc":
        return True, ""
    b = BUILDERS[kind]
    try:
        mod = importlib.import_module(b.module)
    except ImportError as exc:
        return False, f"{b.module} is not importable ({exc})"
    if not callable(getattr(mod, b.function, None)):
        return False, f"{b.module} has no function {b.function}()"
    try:
        builder_versions(kind)
    except DataError as exc:
        return False, str(exc)
    return True, ""


def builder_versions(kind: str) -> dict[str, str]:
    """``{"math_mc_version": "1", ...}``: the version constants a builder's output depends on
    (`BUILD_ITEM_VERSION` included). They key the split cache, so one that cannot be read is a
    `DataError`, never left out of the key."""
    out = {"build_item_version": BUILD_ITEM_VERSION}
    for name in BUILDERS[kind].versions:
        module, attr = name.rsplit(".", 1)
        try:
            out[attr.lower()] = str(getattr(importlib.import_module(module), attr))
        except (ImportError, AttributeError) as exc:
            raise DataError(
                f"the {kind} MC builder's output depends on {name}, which cannot be read "
                f"({type(exc).__name__}: {exc}); without it the split cache could not tell "
                f"builds of different versions apart. Fix that import (or the builder's "
                "`versions`).") from exc
    return dict(sorted(out.items()))


def builder_info(kind: str) -> dict[str, Any]:
    """What made a split's choices: the builder function and its version constants."""
    if kind == "mc":
        return {"method": "source options", "loader_version": LOADER_VERSION}
    b = BUILDERS[kind]
    return {"method": f"{b.module}.{b.function}", "loader_version": LOADER_VERSION,
            **builder_versions(kind)}


def _stable_seed(seed: int, rid: str) -> int:
    return derive_seed(seed, rid, nbytes=4, byteorder="big")


def _svamp_question(raw: Mapping[str, Any]) -> str:
    body = str(raw["Body"]).strip()
    sep = "" if body.endswith((".", "?", "!")) else "."
    return f"{body}{sep} {str(raw['sQuestion']).strip()}".strip()


def _equation_hints(equation: str) -> list[float]:
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


def build_item(kind: str, item: Item, seed: int, domain: str | None = None) -> Built:
    """Turn one item into an `MCRecord` (None if the builder rejects it) plus builder stats.

    The builder gets a per-item seed derived from ``(seed, item.id)``, so the result does not
    depend on which other items are built or in which process. The record's id is the item's id
    and its domain ``domain`` (default: the builder's).
    """
    stats: dict[str, Any] = {}
    if kind == "mc":
        assert item.record is not None
        rec: MCRecord | None = item.record
    else:
        b = BUILDERS[kind]
        fn = getattr(importlib.import_module(b.module), b.function)
        rec, stats = b.call(fn, item, _stable_seed(seed, item.id))
        if isinstance(rec, tuple):  # tolerate builders that also return stats
            rec, stats = rec
        stats = dict(stats or {})
    if rec is not None:
        rec = dataclasses.replace(rec, id=item.id, domain=domain or rec.domain)
    return rec, stats


def load_records(name: str, split: str, *, data_dir: str | Path | None = None,
                 verify: bool = True, seed: int = 0, subjects: Sequence[str] | None = None,
                 hub_loader: HubLoader | None = None) -> list[MCRecord]:
    """All `MCRecord`s of a (source, split), in source order.

    For built sources (math, code) every item goes through its builder (code MC executes tests:
    slow for a whole split; suites build only what their caps need). Items the builder rejects
    (e.g. a MATH answer that is not an integer) are left out.
    """
    loaded = load_source(name, split, data_dir=data_dir, verify=verify, subjects=subjects,
                         hub_loader=hub_loader)
    if loaded.kind != "mc":
        ok, why = builder_available(loaded.kind)
        if not ok:
            raise DataError(f"source {name!r} needs the {loaded.kind} MC builder, which is not "
                            f"available: {why}. Use load_source() for its raw items.")
    out = []
    for it in loaded.items:
        rec, _ = build_item(loaded.kind, it, seed)
        if rec is not None:
            out.append(rec)
    return out


__all__ = [
    "BUILDERS", "BUILD_ITEM_VERSION", "Builder", "build_item", "builder_available",
    "builder_info", "builder_versions", "load_records", "register_builder",
]
