"""The mutants of code multiple choice (`uqbench.data.mc.code`): single AST edits (`ast` +
`ast.unparse`) of a reference solution, enumerated (`enumerate_mutations`), tiered
(`mutation_tier`) and applied (`apply_mutations`).

Edits: comparison swaps (< <=, > >=, == !=, in / not in, direction flips), arithmetic swaps
(+ -, * +, / *, // *...), a term dropped (``a + b`` -> ``a``), integer constants +-1 and boolean
constants flipped, the first two call arguments swapped, min/max, any/all, upper/lower,
startswith/endswith... swapped, a wrapper dropped (``abs(x)`` -> ``x``), ``range(n)`` ->
``range(n - 1)`` / ``range(n + 1)``, an index +-1, slice bounds swapped, ``and`` <-> ``or``, a
condition negated (``not`` inserted, or removed from ``not x``), ``''`` <-> ``' '``; as a last
resort ("blunt") ``len(x)`` -> ``x``, ``reverse=True`` added to a sort, a string upper/lower-cased.
Which of them are tried first, and why, is `uqbench.data.mc.code`'s business.
"""
from __future__ import annotations

import ast
import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

# -- mutation operators ----------------------------------------------------------------------

_CMP: dict[type, tuple[type, ...]] = {
    ast.Lt: (ast.LtE, ast.Gt), ast.LtE: (ast.Lt, ast.GtE), ast.Gt: (ast.GtE, ast.Lt),
    ast.GtE: (ast.Gt, ast.LtE), ast.Eq: (ast.NotEq,), ast.NotEq: (ast.Eq,),
    ast.In: (ast.NotIn,), ast.NotIn: (ast.In,), ast.Is: (ast.IsNot,), ast.IsNot: (ast.Is,),
}
_ARITH: dict[type, tuple[type, ...]] = {
    ast.Add: (ast.Sub, ast.Mult), ast.Sub: (ast.Add,), ast.Mult: (ast.Add,),
    ast.FloorDiv: (ast.Mult, ast.Mod), ast.Div: (ast.Mult, ast.FloorDiv),
    ast.Mod: (ast.FloorDiv,), ast.Pow: (ast.Mult,), ast.BitAnd: (ast.BitOr,),
    ast.BitOr: (ast.BitAnd,), ast.BitXor: (ast.BitOr,), ast.LShift: (ast.RShift,),
    ast.RShift: (ast.LShift,),
}
_BOOL: dict[type, type] = {ast.And: ast.Or, ast.Or: ast.And}
FUNC_SWAP = {"min": "max", "max": "min", "any": "all", "all": "any"}
METHOD_SWAP = {
    "upper": "lower", "lower": "upper", "startswith": "endswith", "endswith": "startswith",
    "isupper": "islower", "islower": "isupper", "isdigit": "isalpha", "isalpha": "isdigit",
    "find": "rfind", "rfind": "find", "index": "rindex", "rindex": "index",
    "lstrip": "rstrip", "rstrip": "lstrip", "keys": "values", "values": "keys",
}
BOOLISH = (ast.Compare, ast.BoolOp)
_WRAPPERS = frozenset(("abs", "set", "sorted", "list", "tuple", "int", "str", "float", "round",
                       "reversed"))
_SORTS = frozenset(("sorted", "sort"))


@dataclass(frozen=True)
class Mutation:
    """One AST edit: ``site`` indexes ``ast.walk(tree)`` of the parsed reference."""

    kind: str
    site: int
    variant: str
    line: int
    tier: int = 0  # `mutation_tier`: 0 token-keeping swap, 1 insertion/deletion, 2 blunt

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "variant": self.variant, "line": self.line}


#: tier 1: edits that insert or delete tokens; tier 2: blunt last resorts (see `mutation_tier`)
_INSERT_DELETE_KINDS = frozenset(("index", "range", "condition", "operand", "call"))
_BLUNT = frozenset((("call", "drop_len"), ("call", "reverse=True"), ("string", "upper"),
                    ("string", "lower")))


def mutation_tier(kind: str, variant: str) -> int:
    """0: a swap that keeps the program's tokens (comparison, arithmetic, boolean operator,
    constant, builtin, argument order, slice bounds, ``''`` <-> ``' '``); 1: an edit that inserts
    or deletes tokens (``not`` inserted or removed, ``+ 1``/``- 1``, a term, minus or wrapper
    dropped); 2: blunt (``len(x)`` -> ``x``, ``reverse=True``, a string's case)."""
    if (kind, variant) in _BLUNT:
        return 2
    if kind in _INSERT_DELETE_KINDS or variant.startswith(("negate", "unnegate", "drop_minus")):
        return 1
    return 0


def opname(op: Any) -> str:
    return type(op).__name__ if not isinstance(op, type) else op.__name__


def _is_str(node: ast.AST) -> bool:
    return (isinstance(node, ast.Constant) and isinstance(node.value, str)) or isinstance(
        node, ast.JoinedStr)


def _docstring_nodes(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            body = node.body
            if (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                    and isinstance(body[0].value.value, str)):
                out.add(id(body[0]))
    return out


def strip_docstrings(tree: ast.AST) -> ast.AST:
    """Remove docstrings in place (a body left empty gets ``pass``); returns the tree."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            body = node.body
            if (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                    and isinstance(body[0].value.value, str)):
                body.pop(0)
                if not body and not isinstance(node, ast.Module):
                    body.append(ast.Pass())
    return tree


def _region(tree: ast.Module, entry_point: str | None) -> set[int]:
    """ids of the nodes that may be mutated: the entry point's body if given (HumanEval: the
    helper functions of the prompt stay intact), else the whole module; never imports,
    docstrings or annotations."""
    roots: list[ast.AST] = list(tree.body)
    if entry_point is not None:
        fn = next((n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                   and n.name == entry_point), None)
        if fn is not None:
            roots = list(fn.body)
    excluded: set[int] = set()
    for root in roots:
        for node in ast.walk(root):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                excluded.update(id(n) for n in ast.walk(node))
            ann = []
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                ann = [node.returns] + [a.annotation for a in (
                    node.args.args + node.args.posonlyargs + node.args.kwonlyargs)]
            elif isinstance(node, ast.AnnAssign):
                ann = [node.annotation]
            for a in ann:
                if a is not None:
                    excluded.update(id(n) for n in ast.walk(a))
    excluded |= _docstring_nodes(tree)
    allowed: set[int] = set()
    for root in roots:
        if id(root) in excluded:
            continue
        for node in ast.walk(root):
            allowed.add(id(node))
    return allowed - excluded


def enumerate_mutations(tree: ast.Module, entry_point: str | None = None) -> list[Mutation]:
    """All single mutations of ``tree`` (not applied), in a fixed order."""
    allowed = _region(tree, entry_point)
    parents: dict[int, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[id(child)] = node
    out: list[Mutation] = []
    for site, node in enumerate(ast.walk(tree)):
        if id(node) not in allowed:
            continue
        line = getattr(node, "lineno", 0)

        def add(kind: str, variant: str, site: int = site, line: int = line) -> None:
            out.append(Mutation(kind, site, variant, line, mutation_tier(kind, variant)))

        if isinstance(node, ast.Compare):
            for j, op in enumerate(node.ops):
                for new in _CMP.get(type(op), ()):
                    add("comparison", f"{j}:{opname(op)}->{new.__name__}")
        elif isinstance(node, (ast.BinOp, ast.AugAssign)):
            left = node.left if isinstance(node, ast.BinOp) else node.target
            right = node.right if isinstance(node, ast.BinOp) else node.value
            if not (_is_str(left) or _is_str(right)):
                for new in _ARITH.get(type(node.op), ()):
                    add("arithmetic", f"{opname(node.op)}->{new.__name__}")
                if isinstance(node, ast.BinOp):  # a term forgotten
                    add("operand", "left_only")
                    add("operand", "right_only")
        elif isinstance(node, ast.BoolOp):
            add("boolean", f"{opname(node.op)}->{_BOOL[type(node.op)].__name__}")
        elif isinstance(node, ast.Constant):
            parent = parents.get(id(node))
            if isinstance(node.value, bool):
                if not isinstance(parent, ast.Return):
                    add("constant", f"{node.value}->{not node.value}")
            elif isinstance(node.value, int):
                negated = isinstance(parent, ast.UnaryOp) and isinstance(parent.op, ast.USub)
                for delta in (1, -1):
                    if negated and node.value + delta == 0:
                        continue
                    add("constant", f"{node.value}->{node.value + delta}")
        elif isinstance(node, ast.Call):
            pos = node.args
            if (len(pos) >= 2 and not any(isinstance(a, ast.Starred) for a in pos[:2])
                    and ast.unparse(pos[0]) != ast.unparse(pos[1])):
                add("arguments", "swap_0_1")
            f = node.func
            if isinstance(f, ast.Name) and f.id in FUNC_SWAP:
                add("builtin", f"{f.id}->{FUNC_SWAP[f.id]}")
            elif isinstance(f, ast.Attribute) and f.attr in METHOD_SWAP:
                add("builtin", f".{f.attr}->.{METHOD_SWAP[f.attr]}")
            if (isinstance(f, ast.Name) and f.id in _WRAPPERS | {"len"} and len(pos) == 1
                    and not node.keywords and not isinstance(pos[0], ast.Starred)):
                add("call", f"drop_{f.id}")  # abs(x) -> x
            name = f.id if isinstance(f, ast.Name) else getattr(f, "attr", None)
            if name in _SORTS and not any(kw.arg == "reverse" for kw in node.keywords):
                add("call", "reverse=True")
            if isinstance(f, ast.Name) and f.id == "range" and 1 <= len(pos) <= 3 and not any(
                    isinstance(a, ast.Starred) for a in pos):
                end = 0 if len(pos) == 1 else 1
                if not isinstance(pos[end], ast.Constant):
                    add("range", "end-1")
                    add("range", "end+1")
                if len(pos) >= 2 and not isinstance(pos[0], ast.Constant):
                    add("range", "start+1")
        elif isinstance(node, ast.Return) and node.value is not None:
            v = node.value
            if isinstance(v, ast.Constant) and isinstance(v.value, bool):
                add("return", f"{v.value}->{not v.value}")
            elif isinstance(v, BOOLISH) or is_not(v):
                add("return", _negation(v))
        elif isinstance(node, (ast.If, ast.While, ast.IfExp)):
            add("condition", _negation(node.test))
        elif isinstance(node, ast.comprehension):
            for j in range(len(node.ifs)):
                add("condition", f"{_negation(node.ifs[j])}_if_{j}")
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and not isinstance(
                node.operand, ast.Constant):
            add("arithmetic", "drop_minus")
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            sl = node.slice
            if isinstance(sl, ast.Slice) and sl.step is None and (sl.lower or sl.upper):
                add("slice", "swap_bounds")  # s[:n] -> s[n:]
            elif isinstance(sl, (ast.Name, ast.BinOp)):
                add("index", "plus_one")
                add("index", "minus_one")
        if (isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value
                and not isinstance(parents.get(id(node)), ast.JoinedStr)):
            if node.value in ("", " "):
                add("string", "space" if node.value == "" else "empty")
            else:
                for cased in (node.value.upper(), node.value.lower()):
                    if cased != node.value:
                        add("string", "upper" if cased == node.value.upper() else "lower")
                        break
    return out


def is_not(expr: ast.AST | None) -> TypeGuard[ast.UnaryOp]:
    return isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Not)


def _negation(expr: ast.AST) -> str:
    """The variant that negates ``expr``: "unnegate" for ``not x`` (-> ``x``), else "negate"."""
    return "unnegate" if is_not(expr) else "negate"


def _negate(expr: ast.expr) -> ast.expr:
    if is_not(expr):
        return expr.operand
    return ast.UnaryOp(op=ast.Not(), operand=expr)


def _apply(node: Any, m: Mutation) -> None:
    """Apply ``m`` to ``node`` (the node at ``m.site`` of a fresh copy), in place."""
    k, v = m.kind, m.variant
    if k == "operand" or v.startswith("drop_"):
        raise AssertionError("this mutation replaces its node; see apply_mutations")
    if k == "comparison":
        at, ops = v.split(":", 1)
        node.ops[int(at)] = getattr(ast, ops.split("->")[1])()
    elif k in ("arithmetic", "boolean"):
        node.op = getattr(ast, v.split("->")[1])()
    elif k == "constant":
        if isinstance(node.value, bool):
            node.value = not node.value
        else:
            node.value = int(v.split("->")[1])
    elif k == "call":
        node.keywords.append(ast.keyword(arg="reverse", value=ast.Constant(True)))
    elif k == "string":
        old = node.value
        node.value = {"space": " ", "empty": "", "upper": old.upper(), "lower": old.lower()}[v]
    elif k == "slice":
        sl = node.slice
        sl.lower, sl.upper = sl.upper, sl.lower
    elif k == "index":
        op = ast.Add() if v == "plus_one" else ast.Sub()
        node.slice = ast.BinOp(left=node.slice, op=op, right=ast.Constant(1))
    elif k == "arguments":
        a = node.args
        a[0], a[1] = a[1], a[0]
    elif k == "builtin":
        new = v.split("->")[1]
        if new.startswith("."):
            node.func.attr = new[1:]
        else:
            node.func.id = new
    elif k == "range":
        pos = node.args
        if v.startswith("end"):
            i = 0 if len(pos) == 1 else 1
            op = ast.Sub() if v == "end-1" else ast.Add()
            pos[i] = ast.BinOp(left=pos[i], op=op, right=ast.Constant(1))
        else:
            pos[0] = ast.BinOp(left=pos[0], op=ast.Add(), right=ast.Constant(1))
    elif k == "return":
        if v in ("negate", "unnegate"):
            node.value = _negate(node.value)
        else:
            node.value = ast.Constant(not node.value.value)
    elif k == "condition":
        if "_if_" in v:
            j = int(v.rsplit("_", 1)[1])
            node.ifs[j] = _negate(node.ifs[j])
        else:
            node.test = _negate(node.test)
    else:  # pragma: no cover
        raise ValueError(f"unknown mutation kind {k!r}")


def apply_mutations(tree: ast.Module, muts: Sequence[Mutation]) -> str:
    """Source of ``tree`` with ``muts`` applied (to a copy; docstrings removed)."""
    t = copy.deepcopy(tree)
    nodes = list(ast.walk(t))
    targets = [nodes[m.site] for m in muts]  # look up before editing: edits shift the walk
    replace: dict[int, ast.AST] = {}
    for node, m in zip(targets, muts, strict=False):
        if m.kind == "operand":
            assert isinstance(node, ast.BinOp)  # enumerate_mutations: a BinOp's terms
            replace[id(node)] = node.left if m.variant == "left_only" else node.right
        elif m.kind == "call" and m.variant.startswith("drop_"):
            assert isinstance(node, ast.Call)  # enumerate_mutations: abs(x), len(x)...
            replace[id(node)] = node.args[0]
        elif m.kind == "arithmetic" and m.variant == "drop_minus":
            assert isinstance(node, ast.UnaryOp)  # enumerate_mutations: -x
            replace[id(node)] = node.operand
        else:
            _apply(node, m)
    if replace:
        t = _Replacer(replace).visit(t)
    strip_docstrings(t)
    return ast.unparse(ast.fix_missing_locations(t))


class _Replacer(ast.NodeTransformer):
    def __init__(self, replace: dict[int, ast.AST]) -> None:
        self.replace = replace

    def visit(self, node: ast.AST) -> Any:
        if id(node) in self.replace:
            return self.visit(self.replace[id(node)])
        return self.generic_visit(node)


def ancestry(tree: ast.Module) -> list[set[int]]:
    """For each site: the sites of its ancestors and itself."""
    nodes = list(ast.walk(tree))
    index = {id(n): i for i, n in enumerate(nodes)}
    parent: dict[int, int] = {}
    for i, n in enumerate(nodes):
        for c in ast.iter_child_nodes(n):
            parent[index[id(c)]] = i
    out = []
    for i in range(len(nodes)):
        chain = {i}
        j = i
        while j in parent:
            j = parent[j]
            chain.add(j)
        out.append(chain)
    return out
