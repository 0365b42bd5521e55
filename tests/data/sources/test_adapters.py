"""Loaders on the real data (skipped without it), the hub path on a locally saved dataset in the
hub's schema, and every bad-input path (missing file, malformed line, changed file)."""
from __future__ import annotations

import gzip
import hashlib
import json
import shutil
from pathlib import Path

import pytest

from uqbench.core.errors import ConfigError, DataError
from uqbench.data import sources as L
from uqbench.data.records import MCRecord
from uqbench.data.sources.adapters import parse_adapters_choices
from uqbench.data.sources.math import equation_hints
from uqbench.data.sources.mmlu import MMLU_GROUPS, mmlu_subjects
from uqbench.data.suites.build import make_record


def _records(name: str, split: str, **kw: object) -> list[MCRecord]:
    """Every record of a (source, split) the way a suite makes them (`make_record`), seed 0."""
    loaded = L.load_source(name, split, **kw)  # type: ignore[arg-type]
    made = (make_record(name, split, it, 0)[0] for it in loaded.items)
    return [r for r in made if r is not None]


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def mini_data_dir(tmp: Path, src: Path, files: list[str]) -> Path:
    """Copy ``files`` (relative paths) from ``src`` into ``tmp`` with a matching manifest.json."""
    entries = []
    for rel in files:
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / rel, tmp / rel)
        entries.append({"file": rel, "sha256": _sha(tmp / rel), "records": None})
    (tmp / "manifest.json").write_text(json.dumps(entries))
    return tmp


def write_data_dir(tmp: Path, files: dict[str, str | bytes]) -> Path:
    """A data folder holding ``files`` (text) with a matching manifest.json."""
    entries = []
    for rel, text in files.items():
        p = tmp / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(text if isinstance(text, bytes) else text.encode())
        entries.append({"file": rel, "sha256": _sha(p), "records": None})
    (tmp / "manifest.json").write_text(json.dumps(entries))
    return tmp


# -- real data ---------------------------------------------------------------------------------

SPLITS = [(s, sp) for s in L.list_sources() for sp in L.get_source(s).splits]


@pytest.mark.parametrize(("source", "split"), SPLITS, ids=[f"{a}:{b}" for a, b in SPLITS])
def test_counts_match_manifest(real_data_dir: Path, source: str, split: str) -> None:
    loaded = L.load_source(source, split, data_dir=real_data_dir)
    assert loaded.origin == "local"
    rels = L.get_source(source).splits[split]
    expected = sum(L.manifest_records(real_data_dir, r) or 0 for r in rels)
    n = len(loaded.items)
    if source == "mbpp":  # one file, three id ranges
        assert {"train": 474, "test": 500, "all": 974}[split] == n
        assert expected == 974
    else:
        assert n == expected
    assert len({it.id for it in loaded.items}) == n, "ids must be unique"
    assert set(loaded.files) >= {r for r in rels if not r.startswith("mmlu")}
    for it in loaded.items:
        if L.get_source(source).build is None:
            r = it.record
            assert r is not None and 0 <= r.answer < len(r.choices)
            assert r.question and all(c for c in r.choices)
        else:
            assert it.raw is not None


def _rec(data_dir: Path, source: str, split: str, i: int) -> MCRecord:
    r = L.load_source(source, split, data_dir=data_dir).items[i].record
    assert r is not None
    return r


def test_spot_checks(real_data_dir: Path) -> None:
    r = _rec(real_data_dir, "arc-easy", "test", 0)
    assert r.question == ("Which statement best explains why photosynthesis is the foundation "
                          "of most food webs?")
    assert r.choices[r.answer] == "Sunlight is the source of energy for nearly all ecosystems."
    r = _rec(real_data_dir, "arc-easy", "train", 0)
    assert r.question == "Which factor will most likely cause a person to develop a fever?"
    assert r.choices[r.answer] == "a bacterial population in the bloodstream"
    r = _rec(real_data_dir, "arc-challenge", "test", 0)
    assert r.choices[r.answer] == "Planetary days will become shorter."
    r = _rec(real_data_dir, "mmlu", "test", 0)
    assert r.meta["subject"] == "abstract_algebra" and r.choices == ("0", "4", "2", "6")
    assert r.answer == 1
    r = _rec(real_data_dir, "mmlu-prerelease", "test", 0)
    assert r.choices == ("0", "4", "2", "6") and r.answer == 1  # letter "B"
    r = _rec(real_data_dir, "winogrande", "test", 0)
    assert "_" in r.question and r.choices == ("Sarah", "Maria") and r.answer == 1
    r = _rec(real_data_dir, "boolq", "train", 0)
    assert r.question == "do iran and afghanistan speak the same language?"
    assert r.choices == ("no", "yes") and r.answer == 1
    r = _rec(real_data_dir, "piqa", "test", 0)
    assert r.question == "How do I ready a guinea pig cage for it's new occupants?"
    assert "ripped paper strips" in r.choices[r.answer]
    r = _rec(real_data_dir, "siqa", "test", 0)
    assert len(r.choices) == 3 and r.choices[r.answer] == "Find somewhere to go"
    r = _rec(real_data_dir, "aqua", "test", 0)
    assert len(r.choices) == 5 and r.choices[0] == "5(√3 + 1)" and r.answer == 0
    r = _rec(real_data_dir, "openbookqa", "train", 0)
    assert r.choices[r.answer] == "plants sprouting, blooming and wilting"


def test_arc_adapters_matches_foundry_and_fixes_its_keys(real_data_dir: Path) -> None:
    """The LLM-Adapters parse equals the structured llm-foundry file on every 4-option item
    (question and options); the gold differs only where foundry is off by one."""
    adapters = L.load_source("arc-easy", "test", data_dir=real_data_dir).items
    foundry = [json.loads(x) for x in
               (real_data_dir / "arc-easy/llm-foundry_arc_easy_test.jsonl").open()]
    same_gold = 0
    for it, f in zip(adapters, foundry, strict=False):
        r = it.record
        assert r is not None
        assert r.question == f["query"].removeprefix("Question: ").strip()
        if len(r.choices) == 4:
            assert list(r.choices) == f["choices"]
            same_gold += r.answer == f["gold"]
    assert same_gold > 0.95 * len(adapters)
    # an item with numeric ARC answer keys: foundry says "water", the answer is "elements"
    r = next(it.record for it in adapters
             if it.record and it.record.question.startswith("All living and nonliving material"))
    assert r.choices[r.answer] == "elements"


def test_mmlu_subject_groups_and_mbpp_ids(real_data_dir: Path) -> None:
    hs, cp = MMLU_GROUPS["high_school"], MMLU_GROUPS["college"] + MMLU_GROUPS["professional"]
    assert len(hs) == 14 and len(cp) == 10 and not set(hs) & set(cp)
    a = L.load_source("mmlu", "test", data_dir=real_data_dir, subjects=["high_school"])
    b = L.load_source("mmlu", "test", data_dir=real_data_dir, subjects=["college", "professional"])
    assert len(a.items) == 3420 and len(b.items) == 3419
    assert {it.stratum for it in a.items} == set(hs)
    assert not {it.id for it in a.items} & {it.id for it in b.items}
    tr = {int(it.id.split("/")[1]) for it in L.load_source("mbpp", "train",
                                                           data_dir=real_data_dir).items}
    te = {int(it.id.split("/")[1]) for it in L.load_source("mbpp", "test",
                                                           data_dir=real_data_dir).items}
    assert tr == set(range(1, 11)) | set(range(511, 975)) and te == set(range(11, 511))


def test_parse_adapters_choices_sequential_markers() -> None:
    q, ch, labels = parse_adapters_choices(
        "Please choose the correct answer to the question: Which? \n\nAnswer1: says Answer3: x "
        "Answer2: b Answer3: c\n\nAnswer format: answer1/answer2/answer3")
    assert q == "Which? " and ch == ["says Answer3: x", "b", "c"] and len(labels) == 3


# -- hub path on locally saved datasets in the hub's schema ------------------------------------

@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory):
    datasets = pytest.importorskip("datasets")
    root = tmp_path_factory.mktemp("hub")
    arc = datasets.DatasetDict({
        "train": datasets.Dataset.from_list([
            {"id": "Mercury_1", "question": "Which is a gas?",
             "choices": {"text": ["iron", "oxygen", "wood", "salt"], "label": ["A", "B", "C", "D"]},
             "answerKey": "B"},
            {"id": "NYSEDREGENTS_2", "question": "Numeric labels?",
             "choices": {"text": ["one", "two", "three", "four"], "label": ["1", "2", "3", "4"]},
             "answerKey": "2"}]),
        "test": datasets.Dataset.from_list([
            {"id": "T_1", "question": "Three options?",
             "choices": {"text": ["a", "b", "c"], "label": ["A", "B", "C"]}, "answerKey": "C"}]),
    })
    mmlu = datasets.DatasetDict({"test": datasets.Dataset.from_list([
        {"question": "Q hs?", "subject": "high_school_biology", "choices": ["w", "x", "y", "z"],
         "answer": 2},
        {"question": "Q law?", "subject": "professional_law", "choices": ["w", "x", "y", "z"],
         "answer": 0}])})
    gsm = datasets.DatasetDict({"train": datasets.Dataset.from_list([
        {"question": "Tom has 2 apples and buys 3. How many?",
         "answer": "2+3=<<2+3=5>>5\n#### 5"}])})

    def mbpp_rows(ids):
        return [{"task_id": i, "text": f"task {i}", "code": "def f(x):\n    return x",
                 "test_list": ["assert f(1) == 1"], "test_setup_code": "",
                 "challenge_test_list": []} for i in ids]
    mbpp = datasets.DatasetDict({"prompt": datasets.Dataset.from_list(mbpp_rows([1, 2])),
                                 "test": datasets.Dataset.from_list(mbpp_rows([11, 12])),
                                 "validation": datasets.Dataset.from_list(mbpp_rows([511])),
                                 "train": datasets.Dataset.from_list(mbpp_rows([601]))})
    he = datasets.DatasetDict({"test": datasets.Dataset.from_list([
        {"task_id": "HumanEval/7", "prompt": "def g(x):\n", "canonical_solution": "    return x\n",
         "test": "def check(c):\n    assert c(1) == 1\n", "entry_point": "g"}])})
    m500 = datasets.DatasetDict({"test": datasets.Dataset.from_list([
        {"problem": "What is 2+2?", "solution": "2+2=4", "answer": "4", "subject": "Algebra",
         "level": 1, "unique_id": "test/algebra/1.json"}])})
    saved = {}
    for (repo, config), dd in {("allenai/ai2_arc", "ARC-Easy"): arc, ("cais/mmlu", "all"): mmlu,
                               ("openai/gsm8k", "main"): gsm,
                               ("google-research-datasets/mbpp", "full"): mbpp,
                               ("openai/openai_humaneval", None): he,
                               ("HuggingFaceH4/MATH-500", None): m500}.items():
        path = root / repo.replace("/", "__") / str(config)
        dd.save_to_disk(str(path))
        saved[repo, config] = path
    calls: list[tuple[str, str | None, str]] = []

    def load_dataset(path: str, name: str | None = None, *, split: str):
        calls.append((path, name, split))
        return datasets.load_from_disk(str(saved[path, name]))[split]

    load_dataset.calls = calls  # type: ignore[attr-defined]
    return load_dataset


def test_hub_path_maps_the_hub_schema(hub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(L.ENV_VAR, raising=False)
    tr = L.load_source("arc-easy", "train", hub_loader=hub)
    assert tr.origin == "hub" and ("allenai/ai2_arc", "ARC-Easy", "train") in hub.calls
    r0, r1 = (it.record for it in tr.items)
    assert r0.choices[r0.answer] == "oxygen" and r0.meta["hub_id"] == "Mercury_1"
    assert r1.choices[r1.answer] == "two"  # numeric answer keys map by label, not by value
    assert all(k.startswith("hub:allenai/ai2_arc/ARC-Easy/") for k in tr.files)
    assert len(_records("arc-easy", "test", hub_loader=hub)[0].choices) == 3
    mm = L.load_source("mmlu", "test", hub_loader=hub, subjects=["high_school"])
    assert [it.record.question for it in mm.items] == ["Q hs?"]
    assert mm.items[0].record.answer == 2 and mm.items[0].stratum == "high_school_biology"
    mb = L.load_source("mbpp", "train", hub_loader=hub)
    assert [it.id for it in mb.items] == ["mbpp/1", "mbpp/2", "mbpp/511", "mbpp/601"]
    assert [it.id for it in L.load_source("mbpp", "test", hub_loader=hub).items] == \
        ["mbpp/11", "mbpp/12"]
    assert L.load_source("humaneval", "test", hub_loader=hub).items[0].id == "humaneval/7"
    g = L.load_source("gsm8k", "train", hub_loader=hub).items[0]
    assert g.id == "gsm8k/train/0" and g.raw["answer"].endswith("#### 5")
    assert L.load_source("math500", "test", hub_loader=hub).items[0].raw["answer"] == "4"


def test_hub_built_records(hub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(L.ENV_VAR, raising=False)
    (r,) = _records("gsm8k", "train", hub_loader=hub)
    assert r.id == "gsm8k/train/0" and r.choices[r.answer] == "5" and len(r.choices) == 4


def test_numeric_sources_become_four_option_mc(real_data_dir: Path) -> None:
    recs = _records("mawps", "test", data_dir=real_data_dir)
    assert len(recs) == 238 and all(len(r.choices) == 4 for r in recs)
    first = recs[0]
    assert first.id == "mawps/test/926" and first.choices[first.answer] == "1.8333"
    sv = _records("svamp", "test", data_dir=real_data_dir)[0]
    assert sv.question.endswith("How much do you have to pay to buy each pack?")
    assert sv.choices[sv.answer] == "51" and sv.domain == "math"


def test_hub_failure_and_unmapped_source(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(L.ENV_VAR, raising=False)

    def offline(*a, **k):
        raise ConnectionError("hub unreachable")

    with pytest.raises(DataError, match=r"allenai/ai2_arc.*hub unreachable.*UQBENCH_DATA"):
        L.load_source("arc-easy", "train", hub_loader=offline)
    with pytest.raises(DataError, match=r"no Hugging Face hub mapping.*UQBENCH_DATA"):
        L.load_source("piqa", "test", hub_loader=offline)


# -- bad input ---------------------------------------------------------------------------------

def test_unknown_source_split_subject() -> None:
    with pytest.raises(ConfigError, match=r"unknown data source 'arc'.*arc-easy"):
        L.load_source("arc", "train")
    with pytest.raises(ConfigError, match=r"no split 'dev'.*train, test"):
        L.load_source("arc-easy", "dev")
    with pytest.raises(ConfigError, match=r"unknown MMLU subject 'highschool'"):
        mmlu_subjects(["highschool"])


def test_missing_folder_and_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(L.ENV_VAR, str(tmp_path / "nope"))
    with pytest.raises(DataError, match=r"nope.*UQBENCH_DATA.*--data-dir.*hub"):
        L.load_source("arc-easy", "train")
    d = write_data_dir(tmp_path / "d", {"gsm8k/test.jsonl": "{}\n"})
    with pytest.raises(DataError) as e:
        L.load_source("arc-easy", "train", data_dir=d)
    msg = str(e.value)
    assert "arc-easy/llm-adapters_train.json" in msg and "UQBENCH_DATA" in msg
    assert "--data-dir" in msg and "allenai/ai2_arc" in msg


ARC_OK = ("Please choose the correct answer to the question: Q{i}?\n\nAnswer1: a{i} Answer2: b "
          "Answer3: c Answer4: d\n\nAnswer format: answer1/answer2/answer3/answer4")


def _arc_json(bad_at: int | None = None, bad: dict | None = None) -> str:
    rows = [{"instruction": ARC_OK.format(i=i), "input": "", "output": "", "answer": "answer2"}
            for i in range(5)]
    if bad_at is not None:
        rows[bad_at] = bad  # type: ignore[assignment]
    return json.dumps(rows, indent=4)  # one record = 6 lines, the first starts on line 2


@pytest.mark.parametrize("bad", [
    {"instruction": ARC_OK.format(i=9), "input": "", "output": "", "answer": "answer7"},
    {"instruction": "Choose: Q?", "input": "", "output": "", "answer": "answer1"},
    {"input": "", "output": "", "answer": "answer1"},
])
def test_malformed_json_array_record_names_file_and_line(tmp_path: Path, bad: dict) -> None:
    d = write_data_dir(tmp_path, {"arc-easy/llm-adapters_train.json": _arc_json(3, bad)})
    line = 2 + 3 * 6  # records 0-2 take 6 lines each after "["
    assert (d / "arc-easy/llm-adapters_train.json").read_text().splitlines()[line - 1] == "    {"
    with pytest.raises(DataError, match=rf"llm-adapters_train\.json:{line}: malformed record"):
        L.load_source("arc-easy", "train", data_dir=d)


def test_malformed_jsonl_csv_and_syntax_errors(tmp_path: Path) -> None:
    gsm = '{"question": "a", "answer": "#### 1"}\n{"question": "b"}\n'
    he = gzip.compress(b'{"task_id": "HumanEval/0"}\n')
    mmlu = ("question,choice0,choice1,choice2,choice3,answer\nq,a,b,c,d,1\nq2,a,b,c,d,7\n")
    d = write_data_dir(tmp_path, {"gsm8k/train.jsonl": gsm, "humaneval/HumanEval.jsonl.gz": he,
                                  "mmlu/final_dev/SHA256SUMS": "",
                                  "winogrande/llm-adapters_test.json": '[\n\n{"a": \n'})
    with pytest.raises(DataError, match=r"gsm8k/train\.jsonl:2: malformed record.*'answer'"):
        L.load_source("gsm8k", "train", data_dir=d)
    with pytest.raises(DataError, match=r"HumanEval\.jsonl\.gz:1: malformed record"):
        L.load_source("humaneval", "test", data_dir=d)
    with pytest.raises(DataError, match=r"llm-adapters_test\.json:4: invalid JSON"):
        L.load_source("winogrande", "test", data_dir=d)
    # an MMLU folder: files checked through SHA256SUMS, bad answer reported with its CSV line
    f = d / "mmlu/final_dev/anatomy_dev.csv"
    f.write_text(mmlu)
    (d / "mmlu/final_dev/SHA256SUMS").write_text(f"{_sha(f)}  anatomy_dev.csv  records=2\n")
    man = json.loads((d / "manifest.json").read_text())
    man = [e for e in man if not e["file"].startswith("mmlu")] + [
        {"file": "mmlu/final_dev/ (57 csv files)", "records": 2,
         "sha256": f"per-file; sha256(SHA256SUMS)={_sha(d / 'mmlu/final_dev/SHA256SUMS')}"}]
    (d / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(DataError, match=r"anatomy_dev\.csv:3: malformed record.*answer '7'"):
        L.load_source("mmlu", "dev", data_dir=d, subjects=["anatomy"])


def test_sha256_mismatch_detected(real_data_dir: Path, tmp_path: Path) -> None:
    rel = "arc-easy/llm-adapters_train.json"
    d = tmp_path / "data"
    (d / "arc-easy").mkdir(parents=True)
    shutil.copyfile(real_data_dir / rel, d / rel)
    shutil.copyfile(real_data_dir / "MANIFEST.txt", d / "MANIFEST.txt")  # text manifest path
    assert len(L.load_source("arc-easy", "train", data_dir=d).items) == 2251
    raw = (d / rel).read_bytes()
    (d / rel).write_bytes(raw.replace(b"develop a fever", b"develop a cough", 1))
    with pytest.raises(DataError, match=r"llm-adapters_train\.json: sha256 .* does not match "
                                        r"MANIFEST.*changed.*verify=False"):
        L.load_source("arc-easy", "train", data_dir=d)
    items = L.load_source("arc-easy", "train", data_dir=d, verify=False).items
    assert "cough" in items[0].record.question


def test_unlisted_file_needs_opt_out(tmp_path: Path) -> None:
    d = write_data_dir(tmp_path, {"gsm8k/test.jsonl": '{"question": "q", "answer": "#### 1"}\n'})
    (d / "gsm8k/train.jsonl").write_text('{"question": "q", "answer": "#### 1"}\n')
    with pytest.raises(DataError, match=r"not listed in the data folder's MANIFEST"):
        L.load_source("gsm8k", "train", data_dir=d)
    assert len(L.load_source("gsm8k", "train", data_dir=d, verify=False).items) == 1


def test_equation_hints() -> None:
    assert equation_hints("X=((22.0-14.0)/4.0)") == [8.0, 22.0, 14.0, 4.0]
    assert equation_hints("( 76.0 - 25.0 )") == [76.0, 25.0]
    assert equation_hints("x = import os") == []
