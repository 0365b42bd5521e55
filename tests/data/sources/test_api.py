"""The source and suite registries: a dataset added in one new file (the README's "Adding a
dataset" example, run as written), duplicate and unknown names."""
from __future__ import annotations

import hashlib
import importlib
import json
import sys
import textwrap
from pathlib import Path

import pytest

from uqbench.core.errors import ConfigError, DataError
from uqbench.data import sources
from uqbench.data.suites import build as S
from uqbench.data.suites import spec as SP

#: The README example, verbatim.
PLUGIN = '''
# my_datasets.py -- then: uqbench run --plugin my_datasets --suite my-suite.yaml
from uqbench.data.sources import Item, mc, need, register_source

@register_source("trivia", domain="knowledge", version="1",
                 splits={"train": ("trivia/train.jsonl",), "test": ("trivia/test.jsonl",)})
def parse_trivia(src, split, i, d):
    """One JSON line {"q": "...", "options": ["...", ...], "gold": 0}; a bad one names its line."""
    need(d, "q", "options", "gold")
    rid = f"{src.name}/{split}/{i}"
    return Item(rid, i, "", record=mc(rid, src.domain, d["q"], d["options"], d["gold"], src.name))
'''


@pytest.fixture
def trivia(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "my_datasets.py").write_text(textwrap.dedent(PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path))
    with sources.SOURCES.scoped():  # the built-ins first, so the plugin's name is checked
        importlib.import_module("my_datasets")
        yield sources.get_source("trivia")
    sys.modules.pop("my_datasets")


def _data(root: Path) -> Path:
    entries = []
    for split, n in (("train", 30), ("test", 12)):
        p = root / "trivia" / f"{split}.jsonl"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("".join(json.dumps({"q": f"{split} question {i}?", "options": [
            "a", "b", "c", f"d{i}"], "gold": i % 4}) + "\n" for i in range(n)))
        entries.append({"file": f"trivia/{split}.jsonl",
                        "sha256": hashlib.sha256(p.read_bytes()).hexdigest()})
    (root / "manifest.json").write_text(json.dumps(entries))
    return root


def test_a_dataset_in_one_new_file(trivia, tmp_path: Path) -> None:
    d = _data(tmp_path / "data")
    assert "trivia" in sources.list_sources() and trivia.build is None
    items = sources.load_source("trivia", "test", data_dir=d).items
    assert [it.id for it in items[:2]] == ["trivia/test/0", "trivia/test/1"]
    assert items[3].record.choices[items[3].record.answer] == "d3"
    spec = SP.parse_suite({"name": "t", "domains": {"knowledge": {
        "train": {"source": "trivia", "split": "train"},
        "id": {"source": "trivia", "split": "test"},
        "shift": {"source": "trivia", "split": "test"}}},
        "caps": {"train": 10, "calib": 5, "id": 4, "shift": 4}})
    built = S.build_suite(spec, "smoke", data_dir=d, progress=False)
    assert len(built.split("knowledge", "train").records) == 10
    (d / "trivia/test.jsonl").write_text('{"q": "x?", "options": ["a", "b"]}\n')
    with pytest.raises(DataError, match=r"test\.jsonl: sha256 .* does not match"):
        sources.load_source("trivia", "test", data_dir=d)
    assert len(sources.load_source("trivia", "train", data_dir=d).items) == 30  # still intact
    with pytest.raises(DataError, match=r"test\.jsonl:1: malformed record.*'gold'"):
        sources.load_source("trivia", "test", data_dir=d, verify=False)


def test_duplicate_and_unknown_source_names() -> None:
    with pytest.raises(ValueError, match="'arc-easy' is already registered"):
        sources.register_source("arc-easy", domain="science", version="1",
                                splits={"test": ("x.json",)})(lambda *a: None)
    with pytest.raises(ValueError, match="gives no hub_parse"):
        sources.register_source("x", domain="d", version="1", splits={"test": ("x.json",)},
                                hub={"test": ("org/x", None, ("test",))})
    with pytest.raises(ConfigError, match=r"unknown data source 'mmlu2' .*; valid: .*mmlu"):
        sources.get_source("mmlu2")


def test_suite_registry_decorator() -> None:
    pooled = SP.SUITES.get("pooled")
    with pytest.raises(ValueError, match="'pooled' is already registered"):
        SP.register_suite("pooled")(lambda: SP.SuiteSpec("pooled", pooled.domains))
    with pytest.raises(ValueError, match="returned a suite named 'other'"):
        SP.register_suite("mine")(lambda: SP.SuiteSpec("other", pooled.domains))
    assert "mine" not in SP.list_suites() and "other" not in SP.list_suites()
    with pytest.raises(ConfigError, match=r"unknown suite 'poold' \(did you mean 'pooled'"):
        SP.get_suite_spec("poold")


def test_subjects_are_a_property_a_source_registers() -> None:
    """MMLU's sources register their subjects (names and groups); naming subjects for a source
    without them is a ConfigError naming the source, and no loader tests a source's name."""
    from uqbench.core.errors import ConfigError
    from uqbench.data.sources import get_source
    from uqbench.data.sources.mmlu import mmlu_subjects

    mmlu = get_source("mmlu")
    assert mmlu.subjects is mmlu_subjects and get_source("mmlu-prerelease").subjects
    assert mmlu.select_subjects(["college"]) == mmlu_subjects(["college"])
    assert mmlu.select_subjects(None) is None
    with pytest.raises(ConfigError, match="only applies to MMLU sources.*'arc-easy'"):
        get_source("arc-easy").select_subjects(["college"])
