"""Suites: the pooled suite at smoke on the real data (deterministic, disjoint, capped, 4
options), the split cache (reuse, rebuild on a changed source, corrupt entries), custom YAML
suites and their errors."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import warnings
from pathlib import Path

import pytest

from tests.conftest import REPO
from uqbench.core.errors import ConfigError, DataError
from uqbench.core.profiles import get_profile
from uqbench.data import sources as L
from uqbench.data.records import content_hash
from uqbench.data.suites import build as S
from uqbench.data.suites import spec as SP
from uqbench.files.cache import StaleCacheWarning

SMOKE = get_profile("smoke")
CAPS = {"train": SMOKE.train_cap, "calib": SMOKE.calib_cap, "id": SMOKE.id_cap,
        "shift": SMOKE.shift_cap}


class _NoBuild:
    """Patch for `SplitMaker.make_split` that fails the test if anything is built."""

    def __call__(self, *a, **k):
        raise AssertionError("a split was built although it should come from the cache")


def _count_builds(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    built: list[str] = []
    orig = S.SplitMaker.make_split

    def spy(self, domain, role, rs, start):
        built.append(f"{domain}/{role}")
        return orig(self, domain, role, rs, start)

    monkeypatch.setattr(S.SplitMaker, "make_split", spy)
    return built


# -- pooled at smoke ---------------------------------------------------------------------------

def _check_split_basics(suite: SP.Suite) -> None:
    """Caps reached exactly (pools are large enough at smoke), 4 options, hashes, recipes."""
    for (dom, role), split in suite.splits.items():
        assert len(split.records) == CAPS[role], f"{dom}/{role}"
        assert all(len(r.choices) == 4 and r.domain == dom for r in split.records)
        assert split.hash == content_hash(split.records)
        rec = split.recipe
        assert rec["selection"]["cap"] == CAPS[role] and rec["selection"]["seed"] == 0
        assert rec["filters"]["choices"] == 4
        assert rec["source"]["files"] and all(len(h) == 64
                                              for h in rec["source"]["files"].values())
        assert rec["builder"]["method"]


def _check_disjoint(suite: SP.Suite) -> None:
    for dom in suite.domains:
        ids = {r: {x.id for x in suite.split(dom, r).records} for r in SP.ROLES}
        for a in SP.ROLES:
            for b in SP.ROLES:
                if a < b:
                    assert not ids[a] & ids[b], f"{dom}: {a} and {b} share records"


def test_pooled_science_knowledge_math_deterministic_disjoint_capped(real_data: Path) -> None:
    """The fast domains of pooled (code, slow to build, is covered by the tests below)."""
    d = real_data
    fast = SP.SuiteSpec("pooled", SP.SUITES.get("pooled").domains[:3])
    one = S.build_suite(fast, "smoke", data_dir=d, progress=False)
    two = S.build_suite(fast, "smoke", data_dir=d, progress=False)
    assert {k: s.hash for k, s in one.splits.items()} == {k: s.hash for k, s in two.splits.items()}
    _check_split_basics(one)
    _check_disjoint(one)
    assert one.split("science", "train").recipe["pool"]["dropped_choices"]["dropped"] == 10
    assert one.split("math", "shift").recipe["builder_stats"]["rejected"]
    subj = {r: {x.meta["subject"] for x in one.split("knowledge", r).records} for r in SP.ROLES}
    for r in ("train", "calib", "id"):
        assert all(s.startswith("high_school_") for s in subj[r])
    assert all(s.startswith(("college_", "professional_")) for s in subj["shift"])
    assert {x.source for x in one.split("math", "shift").records} == {"math500"}
    assert {x.source for x in one.split("science", "shift").records} == {"arc-challenge"}


@pytest.fixture(scope="module")
def pooled(real_data: Path, smoke_splits: Path) -> tuple[SP.Suite, Path, Path]:
    """The session's pooled smoke suite (`smoke_splits`: built cold once), read from its cache."""
    d = real_data
    suite = S.build_suite("pooled", "smoke", data_dir=d, cache_dir=smoke_splits, progress=False)
    return suite, smoke_splits, d


def test_pooled_shape_caps_and_four_choices(pooled: tuple[SP.Suite, Path, Path]) -> None:
    suite, _, _ = pooled
    assert suite.name == "pooled" and suite.profile == "smoke"
    assert suite.domains == ("science", "knowledge", "math", "code")
    assert set(suite.splits) == {(d, r) for d in suite.domains for r in SP.ROLES}
    _check_split_basics(suite)
    _check_disjoint(suite)
    code = suite.split("code", "id").recipe["builder_stats"]
    assert code["verified"] == code["built"] == CAPS["id"]
    # how each of the 3 distractors per record failed its tests (not in the records: load-dependent)
    assert sum(code["mutant_outcomes"].values()) == 3 * code["built"]
    assert len(suite.train_records()) == 4 * CAPS["train"]
    assert [s.domain for s in suite.role("calib")] == list(suite.domains)
    task = {r: {int(x.id.split("/")[1]) for x in suite.split("code", r).records}
            for r in ("train", "calib", "id")}
    assert all(t <= 10 or t >= 511 for t in task["train"] | task["calib"])
    assert all(11 <= t <= 510 for t in task["id"])
    assert {x.source for x in suite.split("code", "shift").records} == {"humaneval"}


def test_pooled_is_deterministic(pooled: tuple[SP.Suite, Path, Path]) -> None:
    suite, _, d = pooled
    spec = SP.SUITES.get("pooled")
    fast = SP.SuiteSpec("pooled", spec.domains[:3])  # same keys; code below at tiny caps
    again = S.build_suite(fast, "smoke", data_dir=d, cache_dir=None, progress=False)
    for key, split in again.splits.items():
        assert split.hash == suite.splits[key].hash, key
        assert split.records == suite.splits[key].records
    tiny = SP.SuiteSpec("tiny-code", spec.domains[3:],
                       caps={"train": 2, "calib": 1, "id": 2, "shift": 2})
    h1 = S.build_suite(tiny, "smoke", data_dir=d, progress=False)
    h2 = S.build_suite(tiny, "smoke", data_dir=d, progress=False)
    assert {k: s.hash for k, s in h1.splits.items()} == {k: s.hash for k, s in h2.splits.items()}


def test_pooled_warm_cache_builds_nothing(pooled: tuple[SP.Suite, Path, Path],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # (fails, correctly, if a loader's or builder's version constant is bumped while it runs:
    # the versions are part of the cache key; see tests/data/suites/test_cache.py)
    suite, cache, d = pooled
    monkeypatch.setattr(S.SplitMaker, "make_split", _NoBuild())
    warm = S.build_suite("pooled", "smoke", data_dir=d, cache_dir=cache, progress=False)
    assert {k: s.hash for k, s in warm.splits.items()} == \
        {k: s.hash for k, s in suite.splits.items()}
    assert warm.splits == suite.splits


# -- cache -------------------------------------------------------------------------------------

SCIENCE_FILES = ["arc-easy/llm-adapters_train.json", "arc-easy/llm-adapters_test.json",
                 "arc-challenge/llm-adapters_test.json"]


def _mini(tmp: Path, src: Path) -> Path:
    entries = []
    for rel in SCIENCE_FILES:
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / rel, tmp / rel)
        entries.append({"file": rel, "sha256": hashlib.sha256((tmp / rel).read_bytes())
                        .hexdigest(), "records": None})
    (tmp / "manifest.json").write_text(json.dumps(entries))
    return tmp


def _science() -> SP.SuiteSpec:
    return SP.SuiteSpec("sci", (SP.SUITES.get("pooled").domain("science"),),
                       caps={"train": 20, "calib": 5, "id": 10, "shift": 10})


def _restamp(d: Path, rel: str) -> None:
    man = json.loads((d / "manifest.json").read_text())
    for e in man:
        if e["file"] == rel:
            e["sha256"] = hashlib.sha256((d / rel).read_bytes()).hexdigest()
    (d / "manifest.json").write_text(json.dumps(man))


def test_cache_rebuilds_when_a_source_changes(real_data: Path, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    d, cache = _mini(tmp_path / "data", real_data), tmp_path / "cache"
    built = _count_builds(monkeypatch)
    first = S.build_suite(_science(), "smoke", data_dir=d, cache_dir=cache, progress=False)
    assert len(built) == 4 and len(list((cache / "sci").glob("*.json"))) == 4
    S.build_suite(_science(), "smoke", data_dir=d, cache_dir=cache, progress=False)
    assert len(built) == 4, "warm cache: nothing rebuilt"
    rel = "arc-easy/llm-adapters_train.json"
    (d / rel).write_text((d / rel).read_text().replace("Answer1: ", "Answer1: (edited) "))
    with pytest.raises(DataError, match="changed"):  # a changed file is refused...
        S.build_suite(_science(), "smoke", data_dir=d, cache_dir=cache, progress=False)
    _restamp(d, rel)  # ...until the manifest says so (or verify=False)
    second = S.build_suite(_science(), "smoke", data_dir=d, cache_dir=cache, progress=False)
    assert len(built) == 8, "every split of the domain rebuilt, none reused"
    for role in ("train", "calib"):
        new, old = second.split("science", role), first.split("science", role)
        assert new.hash != old.hash
        assert new.recipe["source"]["files"][rel] != old.recipe["source"]["files"][rel]
    (d / rel).write_text((d / rel).read_text().replace("(edited) ", "(again) "))
    S.build_suite(_science(), "smoke", data_dir=d, cache_dir=cache, progress=False, verify=False)
    assert len(built) == 12, "verify=False still keys the cache on the actual sha256"


def test_cache_key_is_version_constants_not_code(real_data: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """No hash of source code in the key (a comment edit keeps the cache); a bumped family
    VERSION rebuilds that family's splits."""
    d, cache = _mini(tmp_path / "data", real_data), tmp_path / "cache"
    built = _count_builds(monkeypatch)
    S.build_suite(_science(), "smoke", data_dir=d, cache_dir=cache, progress=False)
    (entry,) = (cache / "sci").glob("science-id-*.json")
    key = json.loads(entry.read_text())["key"]
    assert key["sources"] == {"arc-challenge": "1", "arc-easy": "1"}
    assert key["builders"] == {n: {"method": "source options", "loader_version": "1"}
                               for n in ("arc-challenge", "arc-easy")}
    assert "code_sha256" not in key and "sha256" not in json.dumps(
        {k: v for k, v in key.items() if k != "files"})
    arc = L.get_source("arc-easy")
    with L.SOURCES.scoped({"arc-easy": dataclasses.replace(arc, version="2")}, replace=True):
        S.build_suite(_science(), "smoke", data_dir=d, cache_dir=cache, progress=False)
    assert len(built) == 8, "a bumped source version rebuilds the domain"


@pytest.mark.parametrize("damage", ["truncate", "garbage", "tamper", "rekey"])
def test_corrupt_cache_entry_is_rebuilt(real_data: Path, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch, damage: str) -> None:
    d, cache = _mini(tmp_path / "data", real_data), tmp_path / "cache"
    first = S.build_suite(_science(), "smoke", data_dir=d, cache_dir=cache, progress=False)
    (entry,) = (cache / "sci").glob("science-id-*.json")
    text = entry.read_text()
    if damage == "truncate":
        entry.write_text(text[: len(text) // 2])
    elif damage == "garbage":
        entry.write_bytes(b"\x00\xff not json")
    else:
        blob = json.loads(text)
        if damage == "tamper":  # valid JSON, a record changed: content hash mismatch
            blob["records"][0]["answer"] = (blob["records"][0]["answer"] + 1) % 4
        else:  # an entry whose stored key is not this split's
            blob["key"]["seed"] = 99
        entry.write_text(json.dumps(blob))
    built = _count_builds(monkeypatch)
    with pytest.warns(StaleCacheWarning, match="corrupt or stale"):
        again = S.build_suite(_science(), "smoke", data_dir=d, cache_dir=cache, progress=False)
    assert built == ["science/id"]
    assert again.split("science", "id").hash == first.split("science", "id").hash
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        S.build_suite(_science(), "smoke", data_dir=d, cache_dir=cache, progress=False)


def test_an_inconsistent_cache_entry_is_an_error_not_a_rebuild(real_data: Path, tmp_path: Path
                                                                ) -> None:
    """A cached split whose slice does not start where the roles before it end cannot come from
    an intact key (the key fixes them all): an error naming the file and the fix, no rebuild."""
    d, cache = _mini(tmp_path / "data", real_data), tmp_path / "cache"
    S.build_suite(_science(), "smoke", data_dir=d, cache_dir=cache, progress=False)
    (entry,) = (cache / "sci").glob("science-train-*.json")
    blob = json.loads(entry.read_text())
    blob["recipe"]["selection"]["start"] += 1  # the records (and their hash) stay intact
    entry.write_text(json.dumps(blob))
    with pytest.raises(DataError, match=r"science-train-.*starts at item 6 .* end at 5.*"
                                        r"Delete the cache's sci/ folder"):
        S.build_suite(_science(), "smoke", data_dir=d, cache_dir=cache, progress=False)


def test_a_build_needs_versions_and_they_key_the_cache() -> None:
    """A source's builder versions key the split cache: a build without them (or versions
    without a build) is refused at registration, and a bumped one changes the key."""
    with pytest.raises(ValueError, match="a build needs its versions"):
        L.register_source("nope", domain="x", splits={"t": ("x.json",)}, version="1",
                          build=lambda src, split, it, seed: (None, {}))
    with pytest.raises(ValueError, match="a build needs its versions"):
        L.register_source("nope", domain="x", splits={"t": ("x.json",)}, version="1",
                          versions={"v": "1"})
    gsm = L.get_source("gsm8k")
    info = S.builder_info(gsm)
    assert info["math_mc_version"] == gsm.versions["math_mc_version"]
    assert info["build_item_version"] == S.BUILD_ITEM_VERSION
    bumped = dataclasses.replace(gsm, versions={"math_mc_version": "bumped"})
    assert S.builder_info(bumped)["math_mc_version"] == "bumped"
    assert S.builder_info(L.get_source("arc-easy")) == {"method": "source options",
                                                        "loader_version": L.LOADER_VERSION}
    assert "nope" not in L.list_sources()


def test_caps_none_takes_the_rest_of_the_pool(real_data: Path, tmp_path: Path) -> None:
    d = _mini(tmp_path / "data", real_data)
    spec = SP.SuiteSpec("sci", _science().domains, caps={"train": None, "calib": 7, "id": 3,
                                                         "shift": 3})
    s = S.build_suite(spec, "smoke", data_dir=d, progress=False)
    assert len(s.split("science", "calib").records) == 7
    assert len(s.split("science", "train").records) == 2241 - 7  # 4-option ARC-Easy train
    small = S.build_suite(_science(), "smoke", data_dir=d, progress=False)
    # calib is the head of the pool order: it does not move when the train cap changes
    calib7 = {r.id for r in s.split("science", "calib").records}
    calib5 = {r.id for r in small.split("science", "calib").records}
    assert calib5 <= calib7


# -- YAML --------------------------------------------------------------------------------------

EXAMPLE = REPO / "examples" / "suites" / "commonsense.yaml"


def test_example_yaml_parses_and_builds(real_data: Path) -> None:
    spec = SP.load_suite_file(EXAMPLE)
    assert spec.name == "commonsense" and [d.name for d in spec.domains] == ["openbook", "trivia"]
    assert spec.caps == {"train": 200, "id": 100, "shift": 100}
    ob = spec.domain("openbook")
    assert ob.roles["calib"] == ob.roles["train"] and ob.roles["shift"].source == "arc-challenge"
    assert all(rs.choices == 4 for d in spec.domains for rs in d.roles.values())
    d = real_data
    suite = S.build_suite(str(EXAMPLE), "smoke", data_dir=d, progress=False)
    assert suite.name == "commonsense"
    assert len(suite.split("openbook", "train").records) == 200
    assert len(suite.split("trivia", "calib").records) == SMOKE.calib_cap
    assert suite.spec is not None and suite.spec.origin == str(EXAMPLE)


GOOD = {"name": "x", "domains": {"d": {"train": {"source": "openbookqa", "split": "train"},
                                       "id": {"source": "openbookqa", "split": "test"},
                                       "shift": {"source": "arc-challenge", "split": "test"}}}}


def _with(path: tuple[str, ...], value: object) -> dict:
    data = json.loads(json.dumps(GOOD))
    node = data
    for k in path[:-1]:
        node = node[k]
    if value is _DEL:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return data


_DEL = object()

BAD_SUITES = [
    (_with(("domains", "d", "train", "source"), "obqa"),
     r"unknown data source 'obqa'.*valid: .*openbookqa"),
    (_with(("domains", "d", "id", "split"), "validation"),
     r"role 'id'.*no split 'validation'; valid splits: train, test"),
    (_with(("domains", "d", "shift"), _DEL), r"missing role\(s\) shift"),
    (_with(("domains", "d", "eval"), {"source": "piqa", "split": "test"}),
     r"unknown role\(s\) 'eval'"),
    (_with(("caps",), {"train": -5}), r"cap for 'train' must be a positive integer"),
    (_with(("caps",), {"train": "all"}), r"cap for 'train' must be a positive integer"),
    (_with(("caps",), {"test": 5}), r"unknown role 'test' in 'caps'"),
    (_with(("caps",), [1, 2]), r"'caps' must be a mapping"),
    (_with(("domains",), {}), r"'domains' must be a non-empty mapping"),
    (_with(("domians",), {}), r"unknown key\(s\) 'domians'"),
    (_with(("domains", "d", "train", "subjects"), ["college"]), r"only applies to MMLU"),
    (_with(("domains", "d", "train"), {"source": "mmlu", "split": "test", "subjects": ["cooking"]}),
     r"unknown MMLU subject 'cooking'"),
    (_with(("domains", "d", "train", "half"), 2), r"'half' must be 0 or 1"),
    (_with(("domains", "d", "train", "choices"), 1), r"'choices' must be an integer >= 2"),
    (_with(("domains", "d", "train", "shuffle"), True), r"unknown key\(s\) 'shuffle'"),
    (_with(("domains", "d", "train"), "openbookqa"), r"expected \{source: NAME, split: NAME\}"),
    (_with(("name",), "my suite!"), r"'name' must be a simple name"),
    ([1, 2], r"must be a mapping"),
]


@pytest.mark.parametrize(("data", "match"), BAD_SUITES, ids=[m[:30] for _, m in BAD_SUITES])
def test_bad_suite_files(tmp_path: Path, data: object, match: str,
                         monkeypatch: pytest.MonkeyPatch) -> None:
    import yaml

    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(data))
    monkeypatch.setattr(S.SplitMaker, "make_split", _NoBuild())
    with pytest.raises(ConfigError, match=match) as e:
        S.build_suite(str(p), "smoke", data_dir=tmp_path, progress=False)
    assert str(p) in str(e.value)


def test_yaml_syntax_error_and_missing_file(tmp_path: Path) -> None:
    p = tmp_path / "broken.yaml"
    p.write_text("name: x\ndomains: {d: [unclosed\n")
    with pytest.raises(ConfigError, match=r"broken\.yaml: invalid YAML"):
        SP.get_suite_spec(str(p))
    with pytest.raises(ConfigError, match=r"does not exist.*pooled"):
        SP.get_suite_spec(str(tmp_path / "nope.yaml"))


def test_unknown_suite_and_profile_names() -> None:
    with pytest.raises(ConfigError, match=r"unknown suite 'poold' \(did you mean 'pooled', "
                                          r"'pooled-plus'\?\); valid: pooled, pooled-plus, or "
                                          r"the path to a suite YAML"):
        S.build_suite("poold", "smoke")
    with pytest.raises(ConfigError, match=r"unknown profile 'tiny'.*smoke"):
        S.build_suite("pooled", "tiny")
    assert "pooled" in SP.list_suites()


def test_missing_file_fails_before_any_split_is_built(real_data: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    d = _mini(tmp_path / "data", real_data)
    spec = SP.parse_suite({"name": "two", "domains": {
        "sci": GOOD["domains"]["d"] | {"train": {"source": "arc-easy", "split": "train"},
                                       "id": {"source": "arc-easy", "split": "test"}},
        "piqa": {"train": {"source": "piqa", "split": "test", "half": 0},
                 "id": {"source": "piqa", "split": "test", "half": 1},
                 "shift": {"source": "siqa", "split": "test"}}}})
    monkeypatch.setattr(S.SplitMaker, "make_split", _NoBuild())
    with pytest.raises(DataError, match=r"piqa/llm-foundry_piqa_val\.jsonl.*UQBENCH_DATA"):
        S.build_suite(spec, "smoke", data_dir=d, progress=False)


def test_roles_sharing_a_pool_are_disjoint_or_refused(real_data: Path, tmp_path: Path) -> None:
    d = _mini(tmp_path / "data", real_data)
    arc = {"source": "arc-easy", "split": "test"}
    shared = SP.parse_suite({"name": "s", "domains": {"a": {
        "train": arc, "id": arc, "shift": {"source": "arc-challenge", "split": "test"}}},
        "caps": {"train": 30, "calib": 5, "id": 30, "shift": 5}})
    s = S.build_suite(shared, "smoke", data_dir=d, progress=False)
    ids = [{r.id for r in s.split("a", role).records} for role in ("train", "calib", "id")]
    assert not (ids[0] & ids[1] or ids[0] & ids[2] or ids[1] & ids[2])
    greedy = SP.SuiteSpec("s", shared.domains, caps={"train": None, "calib": 5, "id": 5,
                                                    "shift": 5})
    with pytest.raises(ConfigError, match=r"a/id would be empty"):
        S.build_suite(greedy, "smoke", data_dir=d, progress=False)
    overlap = SP.parse_suite({"name": "o", "domains": {"a": {
        "train": {"source": "arc-easy", "split": "test", "half": 0},
        "id": arc, "shift": {"source": "arc-challenge", "split": "test"}}}})
    with pytest.raises(ConfigError, match=r"is in both"):
        S.build_suite(overlap, "full", data_dir=d, progress=False)
