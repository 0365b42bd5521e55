"""The extension examples of the README and docs/extending.md are the code the tests run,
character for character; every docs page the README links to exists."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _blocks() -> list[str]:
    text = (ROOT / "README.md").read_text() + (ROOT / "docs" / "extending.md").read_text()
    return re.findall(r"```python\n(.*?)```", text, re.DOTALL)


def _body(path: Path) -> str:
    """A test example file without its first line (the docstring saying where it is used)."""
    return path.read_text().split("\n", 1)[1]


@pytest.mark.parametrize("marker, tested", [
    ("@register_gate(", lambda: _body(ROOT / "tests" / "support" / "example_gate.py")),
    ("@register_variant(", lambda: _body(ROOT / "tests" / "support" / "example_variant.py")),
    ("@register_backbone(", lambda: _body(ROOT / "tests" / "support" / "example_backbone.py")),
    ("@register_column(", lambda: _body(ROOT / "tests" / "support" / "example_column.py")),
    ("@register_source(", lambda: __import__("tests.data.sources.test_api",
                                              fromlist=["PLUGIN"]).PLUGIN.lstrip("\n")),
])
def test_readme_examples_are_the_tested_code(marker: str, tested) -> None:
    shown = [b for b in _blocks() if marker in b]
    assert len(shown) == 1, f"README + docs should show one {marker} example, found {len(shown)}"
    assert shown[0] == tested()


def test_readme_scorer_example_is_the_one_the_plugin_test_registers() -> None:
    shown = next(b for b in _blocks() if "@register_scorer(" in b)
    body = shown.split("@register_scorer(", 1)[1]
    runner_test = (ROOT / "tests" / "run" / "test_runner.py").read_text()
    for line in ("class Gini(Scorer):", "p = self.predictive(outputs)",
                 "return 1.0 - (p ** 2).sum(axis=1)"):
        assert line in body and line in runner_test


def test_the_readme_is_a_front_door_whose_links_resolve() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    links = re.findall(r"\]\(((?:docs/)?[\w./-]+\.(?:md|png))\)", text)
    assert "docs/results.md" in links and "docs/report.png" in links
    assert [link for link in links if not (ROOT / link).is_file()] == []
    pages = [*(ROOT / "docs").glob("*.md"), *(ROOT / "benchmarks" / "results").glob("*.md")]
    for page in pages:   # the pages' own relative links
        for link in re.findall(r"\]\(([\w./-]+\.(?:md|png|jsonl))(?:#[\w-]+)?\)",
                               page.read_text()):
            assert (page.parent / link).is_file(), f"{page.name} links to a missing {link}"


def test_measurements_live_in_benchmarks_results_and_its_index_names_each_file() -> None:
    """docs/ holds user pages; what was measured is in benchmarks/results/, whose README
    names every file there and is what the README links to."""
    assert [p.name for p in (ROOT / "docs").iterdir() if p.suffix not in (".md", ".png")] == []
    results = ROOT / "benchmarks" / "results"
    index = (results / "README.md").read_text()
    assert [p.name for p in sorted(results.iterdir())
            if p.name != "README.md" and f"]({p.name})" not in index] == []
    assert "](benchmarks/results/README.md)" in (ROOT / "README.md").read_text()


def test_the_test_folders_mirror_the_packages() -> None:
    """Each test file sits in the folder of the stage it tests (tests/<stage>/test_*.py), where a
    stage is a subpackage of uqbench/ or a top-level package; only the checks of the whole tree
    sit at tests/ itself."""
    tests = ROOT / "tests"
    stages = {p.name for p in (ROOT / "uqbench").iterdir() if (p / "__init__.py").is_file()}
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()}
    stages |= packages - {"uqbench", "tests"}
    folders = {p.parent.name for p in tests.glob("*/test_*.py")}
    assert folders <= stages, f"test folders that are no stage: {sorted(folders - stages)}"
    assert {p.name for p in tests.iterdir() if p.is_dir() and p.name != "__pycache__"} \
        == folders | {"support"}
    assert sorted(p.stem for p in tests.glob("test_*.py")) \
        == ["test_doctests", "test_layers", "test_readme", "test_static_checks"]
