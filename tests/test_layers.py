"""The layering rule (README, "Layout"), checked on the real import graph.

Statically, on every ``import`` statement of the four packages (module level or inside a
function, so a lazy import counts): the core `uqbench` never imports `baselines`, torch, the
model libraries, `figures` or `scorers` (it reaches plug-ins by registry name: built-in scorers,
the ``"torch"`` backend, the figure set); `scorers` never imports torch or the model code;
`figures` reads only the core's metric curves, report readers and registry; no two packages
import each other (directly or through a third) and no two modules of one package either. At
run time, importing the metric/report side and the runner loads none of torch, `baselines` or
matplotlib.
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("uqbench", "scorers", "figures", "baselines")
MODEL_LIBS = ("torch", "transformers", "peft", "accelerate", "safetensors")
#: package -> top-level names it must never import
FORBIDDEN = {
    "uqbench": (*MODEL_LIBS, "baselines", "figures", "scorers", "matplotlib", "seaborn"),
    "scorers": (*MODEL_LIBS, "baselines", "figures", "matplotlib", "seaborn"),
    "figures": (*MODEL_LIBS, "baselines", "scorers"),
}
#: the core modules figures may read (metric curves -- conformal's too --, report readers, the
#: column table's names and directions, errors, the registry)
FIGURES_MAY_USE = {"uqbench", "uqbench.stats.metrics", "uqbench.stats.conformal",
                   "uqbench.results.columns",
                   "uqbench.results.tables", "uqbench.reporting.paper", "uqbench.files.rundir",
                   "uqbench.core.errors", "uqbench.core.engine"}
#: `uqbench`'s subpackages by stage, lowest first (README, "Layout"): a module imports only
#: from its own stage and the stages before it; the top-level modules (cli) come last
STAGES = ("core", "files", "stats", "data", "results", "io", "reporting", "run")


def module_imports(root: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    """Module name -> every module it imports (absolute names, any nesting depth)."""
    graph: dict[str, set[str]] = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            is_pkg = parts[-1] == "__init__"
            name = ".".join(parts[:-1] if is_pkg else parts)
            here = name if is_pkg else name.rpartition(".")[0]
            deps: set[str] = set()
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    deps |= {a.name for a in node.names}
                elif isinstance(node, ast.ImportFrom):
                    base = node.module or ""
                    if node.level:  # relative: resolve against this module's package
                        up = here.split(".")[:len(here.split(".")) - node.level + 1]
                        base = ".".join([*up, *([base] if base else [])])
                    deps.add(base)
                    deps |= {f"{base}.{a.name}" for a in node.names}  # `from pkg import mod`
            graph[name] = deps
    return graph


def violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import that breaks `FORBIDDEN` or `FIGURES_MAY_USE` (``from a import b`` once)."""
    out = []
    for mod, deps in sorted(graph.items()):
        pkg = mod.split(".")[0]
        bad = {d for d in deps if d.split(".")[0] in FORBIDDEN.get(pkg, ())}
        if pkg == "figures":
            bad |= {d for d in deps if d.split(".")[0] == "uqbench" and d not in FIGURES_MAY_USE
                and d not in {f"uqbench.{s}" for s in STAGES}  # `from uqbench.stats import m`
                    and d.rpartition(".")[0] not in FIGURES_MAY_USE - {"uqbench"}}
        out += [f"{mod} imports {d}" for d in sorted(bad) if d.rpartition(".")[0] not in bad]
    return out


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def package_edges(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    return {p: {d.split(".")[0] for m, ds in graph.items() if m.split(".")[0] == p for d in ds
                if d.split(".")[0] in PACKAGES and d.split(".")[0] != p} for p in PACKAGES}


def module_edges(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Edges between the modules of the graph (``from pkg import mod`` resolved to ``mod``);
    a package's ``__init__`` re-exporting its own modules is not an edge back to it."""
    out: dict[str, set[str]] = {}
    for mod, deps in graph.items():
        targets = {d for d in deps if d in graph and d != mod}
        out[mod] = {d for d in targets if not d.startswith(mod + ".")}
    return out


GRAPH = module_imports(ROOT)


def test_the_graph_covers_every_package_and_sees_lazy_imports() -> None:
    assert {m.split(".")[0] for m in GRAPH} == set(PACKAGES)
    assert "uqbench.data.suites.build" in GRAPH and "scorers.care" in GRAPH
    assert "torch" in GRAPH["baselines.engine"]  # the torch side is where torch is


def test_no_package_imports_what_its_layer_forbids() -> None:
    bad = violations(GRAPH)
    assert not bad, "reverse or forbidden imports (plug in through a registry instead):\n" + \
        "\n".join(bad)


def test_packages_import_one_way() -> None:
    edges = package_edges(GRAPH)
    assert edges["uqbench"] == set(), edges
    assert edges["baselines"] == edges["scorers"] == edges["figures"] == {"uqbench"}
    assert not cycles(edges)


def stage_violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a `uqbench` module from a later stage (`STAGES`) than its own."""
    def rank(mod: str) -> int:
        parts = mod.split(".")
        return STAGES.index(parts[1]) if len(parts) > 1 and parts[1] in STAGES else len(STAGES)

    return [
        f"{mod} imports {d}"
        for mod, deps in sorted(graph.items())
        if mod.startswith("uqbench.")
        for d in sorted(deps)
        if d in graph and d.startswith("uqbench.") and rank(d) > rank(mod)
    ]


#: what `uqbench.stats` (pure functions of arrays) may import from the rest of `uqbench`
STATS_MAY_USE = {"uqbench.core.errors"}


def impure_stats(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a `uqbench` module outside `uqbench.stats` and `STATS_MAY_USE` from a
    module of `uqbench.stats`: statistics hold no model, no file and no run."""
    return [f"{mod} imports {d}" for mod, deps in sorted(graph.items())
            if mod.startswith("uqbench.stats") for d in sorted(deps)
            if d.startswith("uqbench.") and d != "uqbench.stats" and not d.startswith(
                "uqbench.stats.") and d not in STATS_MAY_USE
            and d.rpartition(".")[0] not in STATS_MAY_USE]


def test_stats_imports_only_the_core_errors() -> None:
    bad = impure_stats(GRAPH)
    assert not bad, "stats imports more than uqbench.core.errors:\n" + "\n".join(bad)
    fake = {"uqbench.stats.a": {"uqbench.core.errors", "uqbench.core.errors.NotReachable",
                                "uqbench.stats.metrics", "numpy", "uqbench.core.outputs"}}
    assert impure_stats(fake) == ["uqbench.stats.a imports uqbench.core.outputs"]


def test_uqbench_stages_import_one_way() -> None:
    assert {m.split(".")[1] for m in GRAPH if m.count(".") >= 2 and m.startswith("uqbench.")} \
        == set(STAGES), "a subpackage of uqbench is missing from STAGES (or STAGES is stale)"
    bad = stage_violations(GRAPH)
    assert not bad, "imports from a later stage:\n" + "\n".join(bad)
    late = {"uqbench.core.scorer": {"uqbench.run.runner"}, "uqbench.run.runner": {"uqbench.cli"}}
    assert stage_violations(late | {"uqbench.run.runner": set(), "uqbench.cli": set()}) == [
        "uqbench.core.scorer imports uqbench.run.runner"]


#: `uqbench.data`'s rooms by seam, lowest first: its top-level modules (records, seeds, the
#: artifact check), the sandbox, the multiple-choice builders, the sources, the suite layer. A
#: module imports only from its own room and the rooms before it
DATA_ROOMS = ("", "sandbox", "mc", "sources", "suites")


def data_room_violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a `uqbench.data` module from a later room (`DATA_ROOMS`) than its own."""
    def room(mod: str) -> int:
        """The room's place in `DATA_ROOMS`; -1 outside `uqbench.data`."""
        parts = mod.split(".")
        if parts[:2] != ["uqbench", "data"] or len(parts) < 3:
            return -1
        return DATA_ROOMS.index(parts[2]) if parts[2] in DATA_ROOMS else 0

    return [f"{mod} imports {d}" for mod, deps in sorted(graph.items()) if room(mod) >= 0
            for d in sorted(deps) if d in graph and room(d) > room(mod)]


def test_data_rooms_import_downwards() -> None:
    rooms = {m.split(".")[2] for m in GRAPH if m.startswith("uqbench.data.") and m.count(".") >= 3}
    assert rooms == set(DATA_ROOMS) - {""}, "a subpackage of uqbench.data is missing from " \
        "DATA_ROOMS (or DATA_ROOMS is stale)"
    bad = data_room_violations(GRAPH)
    assert not bad, "data imports from a later room:\n" + "\n".join(bad)
    fake = {"uqbench.data.mc.code": {"uqbench.data.suites.build", "uqbench.data.records"},
            "uqbench.data.suites.build": set(), "uqbench.data.records": set(),
            "uqbench.data.sources.api": {"uqbench.data.mc.code"}}
    assert data_room_violations(fake) == [
        "uqbench.data.mc.code imports uqbench.data.suites.build"]


def private_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every ``from module import _name`` of a project module from another one, and every import
    of a private module (``pkg._impl``, as scikit-learn's) from outside its package: what a
    module needs of another is public there."""
    def private(name: str) -> bool:
        last = name.rpartition(".")[2]
        return last.startswith("_") and not last.startswith("__")

    bad = []
    for mod, deps in sorted(graph.items()):
        for d in sorted(deps):
            home = d.rpartition(".")[0]
            if not private(d) or home == mod:
                continue
            if d in graph:  # a private module: fine from inside its own package
                if not mod.startswith(home + "."):
                    bad.append(f"{mod} imports {d}")
            elif home in graph:  # an underscore name of another module
                bad.append(f"{mod} imports {d}")
    return bad


def test_no_private_name_crosses_a_module() -> None:
    bad = private_imports(GRAPH)
    assert not bad, "underscore names imported across modules:\n" + "\n".join(bad)
    fake = {"a.b": {"a.c._helper", "a.c.helper", "a.c.__version__", "a._impl"}, "a.c": set(),
            "a._impl": set(), "z.y": {"a._impl"}}
    assert private_imports(fake) == ["a.b imports a.c._helper", "z.y imports a._impl"]


def test_no_module_cycle() -> None:
    found = cycles(module_edges(GRAPH))
    assert not found, f"module import cycles: {found}"


def test_the_checker_fails_on_a_reverse_import(tmp_path: Path) -> None:
    """A lazy core -> baselines import, a figures <-> panel cycle and a package cycle are seen."""
    for pkg in PACKAGES:
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "uqbench" / "run").mkdir()
    (tmp_path / "uqbench" / "run" / "runner.py").write_text(
        "import numpy\n\ndef run():\n    from baselines.moe import MoELoRAConfig\n")
    (tmp_path / "baselines" / "moe.py").write_text("from uqbench.core.errors import ConfigError\n")
    (tmp_path / "figures" / "run.py").write_text("from figures import calibration\n")
    (tmp_path / "figures" / "calibration.py").write_text(
        "from figures.run import RunData\nfrom uqbench.results.evaluate import evaluate\n")
    graph = module_imports(tmp_path)
    assert violations(graph) == ["figures.calibration imports uqbench.results.evaluate",
                                 "uqbench.run.runner imports baselines.moe"]
    assert cycles(package_edges(graph)) == [["baselines", "uqbench"]]
    assert cycles(module_edges(graph)) == [["figures.calibration", "figures.run"]]


_PROBE = """
import importlib, json, pkgutil, sys
names = ["scorers", "figures", "uqbench.stats.metrics", "uqbench.core.scorer",
         "uqbench.core.outputs", "uqbench.results.tables", "uqbench.reporting.paper",
         "uqbench.core.experiments", "uqbench.results.evaluate"]
for pkg in ("scorers", "figures"):
    path = importlib.import_module(pkg).__path__
    names += [f"{pkg}.{m.name}" for m in pkgutil.iter_modules(path)]
for name in names:
    importlib.import_module(name)
print(json.dumps({"imported": names, "loaded": sorted({m.split(".")[0] for m in sys.modules})}))
"""

HEAVY = ("torch", "transformers", "peft", "accelerate", "baselines")


def _loaded(code: str) -> dict[str, list[str]]:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout
    return json.loads(out)  # type: ignore[no-any-return]


def test_scorers_figures_and_metrics_never_load_torch_or_models() -> None:
    got = _loaded(_PROBE)
    assert "scorers.care" in got["imported"] and "figures.calibration" in got["imported"]
    assert "numpy" in got["loaded"]  # the probe does see what was loaded
    heavy = sorted(set(got["loaded"]) & set(HEAVY))
    assert not heavy, f"scorers/figures/metrics pull in {heavy}: import them lazily where used"


@pytest.mark.parametrize("module", ["uqbench.run.runner", "uqbench.cli", "uqbench.core.gating"])
def test_the_runner_and_cli_load_no_torch_models_or_plots(module: str) -> None:
    got = _loaded(f"import json, sys, {module}\n"
                  "print(json.dumps({'loaded': sorted({m.split('.')[0] for m in sys.modules})}))")
    heavy = sorted(set(got["loaded"]) & {*HEAVY, "figures", "matplotlib", "scorers"})
    assert not heavy, f"import {module} loads {heavy}"
