"""The static checks the project keeps clean: ruff over the repository (pyproject's
``[tool.ruff.lint]`` rules: pycodestyle, pyflakes, import order, bugbear, pyupgrade) and mypy
over pyproject's ``[tool.mypy]`` files (``uqbench/``, ``scorers/``, ``figures/`` and
``baselines/``: every layer), at the versions the test extra pins, so that `make test` fails where a
change breaks either; and the tests use only the public names of the code (`private_uses`), so
that a rename inside a module breaks no test."""
from __future__ import annotations

import ast
import sys
import textwrap

from tests.conftest import REPO, Procs

#: the top-level packages whose names the tests may use only when public
CODE = ("uqbench", "baselines", "benchmarks", "scorers", "figures")


def _private(name: str) -> bool:
    return len(name) > 1 and name.startswith("_") and not name.startswith("__")


def _of_code(module: str | None) -> bool:
    return module is not None and module.split(".")[0] in CODE


def defined_private_names(source_text: str) -> set[str]:
    """The private names a module of the code defines for others to reach: its functions,
    classes and names assigned at module level and in class bodies (methods, class
    attributes), and the attributes its methods set as ``self._x``."""
    tree = ast.parse(source_text)
    names: set[str] = set()
    scopes: list[ast.Module | ast.ClassDef] = [tree]
    while scopes:
        for node in scopes.pop().body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            targets = (node.targets if isinstance(node, ast.Assign) else
                       [node.target] if isinstance(node, ast.AnnAssign) else [])
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
            if isinstance(node, ast.ClassDef):
                scopes.append(node)
    names.update(node.attr for node in ast.walk(tree)
                 if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                 and isinstance(node.value, ast.Name) and node.value.id == "self")
    return {n for n in names if _private(n)}


def code_private_names() -> frozenset[str]:
    """`defined_private_names` of every module of `CODE`."""
    paths = [path for package in CODE for path in sorted((REPO / package).rglob("*.py"))]
    return frozenset().union(*(defined_private_names(p.read_text(encoding="utf-8"))
                               for p in paths))


def private_uses(source_text: str, defined: frozenset[str] = frozenset()
                 ) -> list[tuple[int, str]]:
    """(line, name) of each private name of the code that ``source_text`` uses, by line: a
    private name imported from a module of `CODE`; a private attribute of a name bound by such
    an import (``module._x``, ``Class._x``); a private attribute of any other object
    (``obj._x``, not ``self._x``: a test's own class) whose name is in ``defined``, the private
    names the code defines (`code_private_names`), so that other libraries' (torch's
    ``Tensor._base``) are not seen; a private attribute set, deleted or read through
    ``setattr``/``delattr``/``getattr`` (monkeypatch's too) by its name as a string, on any
    object, or as a dotted ``"package.module._x"`` string."""
    tree = ast.parse(source_text)
    bound: set[str] = set()
    uses: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and _of_code(node.module):
            bound.update(a.asname or a.name for a in node.names)
            uses += [(node.lineno, a.name) for a in node.names if _private(a.name)]
        elif isinstance(node, ast.Import):
            bound.update(a.asname or a.name.split(".")[0] for a in node.names if _of_code(a.name))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if (isinstance(root, ast.Name) and root.id in bound) or (
                    node.attr in defined
                    and not (isinstance(node.value, ast.Name) and node.value.id == "self")):
                uses.append((node.lineno, node.attr))
        elif (isinstance(node, ast.Call) and node.args
              and (node.func.id if isinstance(node.func, ast.Name) else
                   node.func.attr if isinstance(node.func, ast.Attribute) else "")
              in ("setattr", "delattr", "getattr")):
            names = [a.value for a in node.args[:2]
                     if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            for name in names:
                parts = name.split(".")
                if len(parts) == 1 or _of_code(name):
                    uses += [(node.lineno, p) for p in parts if _private(p)]
    return sorted(uses)


def test_ruff_finds_nothing(procs: Procs) -> None:
    procs.run([sys.executable, "-m", "ruff", "check", "."], cwd=REPO,
              what="ruff check", quiet_s=10)


def test_mypy_finds_nothing(procs: Procs) -> None:
    procs.run([sys.executable, "-m", "mypy"], cwd=REPO,
              what="mypy (uqbench, scorers, figures, baselines)", quiet_s=90)


def test_tests_use_only_public_names_of_the_code() -> None:
    defined = code_private_names()
    found = [f"{path.relative_to(REPO)}:{line}:{name}"
             for path in sorted((REPO / "tests").rglob("*.py"))
             for line, name in private_uses(path.read_text(encoding="utf-8"), defined)]
    assert found == [], "tests use private names of the code (give each a public name):\n" \
        + "\n".join(found)


def test_the_private_name_check_reports_a_private_use_and_passes_public_ones() -> None:
    code = textwrap.dedent('''
        _TABLE = {}
        class Layer:
            _slots: int = 0
            def __init__(self, other):
                self._fast, self.public = None, 1
                other._theirs = 1
            def _views(self):
                _local = 1
    ''')
    defined = frozenset(defined_private_names(code))
    assert defined == {"_TABLE", "_slots", "_fast", "_views"}
    source = textwrap.dedent('''
        import uqbench.stats.metrics as M
        from baselines import train as T
        from tests.support import _helper
        from uqbench.reporting.paper import _Hidden, claims

        def test(monkeypatch, obj):
            M._draw(T.GraphSteps, claims(_Hidden()))
            monkeypatch.setattr(T, "_patched", None)
            monkeypatch.setattr("uqbench.files.cache._TABLE", {})
            setattr(obj, "value", getattr(M.bootstrap, "_read"))
            monkeypatch.setattr(T, "__wrapped__", None)
            return obj._fast, _helper, M.__name__, T.GraphSteps._step, "M._x"

        class Helper:
            def run(self, t):
                return self._views, t._base, make()._views(), t._theirs
    ''')
    assert private_uses(source, defined) == [
        (5, "_Hidden"), (8, "_draw"), (9, "_patched"), (10, "_TABLE"), (11, "_read"),
        (13, "_fast"), (13, "_step"), (17, "_views")]
