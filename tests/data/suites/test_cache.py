"""Builder fingerprints: what each loader and builder makes of a fixed tiny input, hashed, next
to the version constant that keys the split cache (`uqbench.data.suites.cache`).

A fingerprint that changes while its version does not means cached splits would be reused
although the code now builds different ones: the test fails until the version is bumped and the
fingerprint updated (``python -m tests.data.suites.test_cache --update`` rewrites
tests/support/fixtures/builder_fingerprints.json after the bump). The code builders run the
sandbox (slow tier); the others take well under a second.
"""
from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from uqbench.data import sources
from uqbench.data.sources import adapters, code, math, mmlu
from uqbench.data.sources.api import LOADER_VERSION
from uqbench.data.suites import build as S
from uqbench.data.suites import spec as SP

FINGERPRINTS = Path(__file__).parents[2] / "support" / "fixtures" / "builder_fingerprints.json"

# -- the fixed tiny inputs ---------------------------------------------------------------------

_ARC = ("Please choose the correct answer to the question: Which is a gas {i}?\n\nAnswer1: iron "
        "Answer2: oxygen Answer3: wood Answer4: salt\n\nAnswer format: answer1/answer2/answer3/"
        "answer4")
ADD = {"task_id": 11, "text": "Write a function to add two numbers.",
       "code": "def add(a, b):\r\n    return a + b", "test_setup_code": "",
       "test_list": ["assert add(1, 2) == 3", "assert add(5, 7) == 12", "assert add(-1, 1) == 0"],
       "challenge_test_list": []}
DOUBLE = {
    "task_id": "HumanEval/3",
    "prompt": ('def double_evens(xs: list) -> list:\n    """Double the even numbers, drop the odd '
               'ones.\n    >>> double_evens([1, 2, 4])\n    [4, 8]\n    """\n'),
    "canonical_solution": "    return [x * 2 for x in xs if x % 2 == 0]\n",
    "test": ("\n\ndef check(candidate):\n    assert candidate([1, 2, 4]) == [4, 8]\n"
             "    assert candidate([]) == []\n    assert candidate([3, 6]) == [12]\n"),
    "entry_point": "double_evens"}
FILES: dict[str, Any] = {
    "arc-easy/llm-adapters_train.json": [
        {"instruction": _ARC.format(i=i), "input": "", "output": "", "answer": f"answer{2 + i % 2}"}
        for i in range(24)],
    "winogrande/llm-adapters_test.json": [{
        "instruction": "Please choose the correct answer to fill in the blank to complete the "
        "given sentence: Sarah was a better cook than Maria, so _ got the job.\n\nOption1: Sarah "
        "Option2: Maria Answer format: option1/option2", "answer": "option1"}],
    "boolq/llm-adapters_train.json": [{
        "instruction": "Please answer the following question with true or false, question: is "
        "the sky blue?\n\nAnswer format: true/false", "answer": "true"}],
    "piqa/llm-foundry_piqa_val.jsonl": [{"query": "Question: How to dry a towel?",
                                         "choices": ["hang it", "soak it"], "gold": 0}],
    "mmlu/final_dev/anatomy_dev.csv": "question,choice0,choice1,choice2,choice3,answer\n"
                                      "Q one?,a,b,c,d,1\n\"Q, two?\",w,x,y,z,3\n",
    "mmlu/prerelease_dev/anatomy_dev.csv": "Q one?,a,b,c,d,B\n",
    "aqua/AQuA_test_orig.json": [{"sQuestion": "2+3?", "options": ["A)4", "B)5", "C)6", "D)7",
                                                                 "E)8"], "lSolutions": "B"}],
    "gsm8k/train.jsonl": [{"question": "Tom has 2 apples and buys 3. How many?",
                           "answer": "2+3=<<2+3=5>>5\n#### 5"}],
    "math/math500_test.jsonl": [{"problem": "What is $2+2$?", "solution": "$\\boxed{4}$",
                                 "answer": "4", "subject": "Algebra", "level": 1}],
    "math/llm-foundry_math_test.jsonl": [{"context": "Half of 1?", "answer": "\\frac{1}{2}",
                                          "chain_of_thought": "x", "category": "Algebra"}],
    "svamp/SVAMP.json": [{"ID": "chal-1", "Body": "A pack costs 76 dollars and you have 25",
                          "Question": "", "sQuestion": "How much more do you need?",
                          "Equation": "( 76.0 - 25.0 )", "lSolutions": 51.0}],
    "mawps/testset.json": [{"id": 926, "original_text": "22 minus 14, divided by 4?",
                            "equation": "X=((22.0-14.0)/4.0)", "ans": 2.0}],
    "mbpp/mbpp.jsonl": [{**ADD, "task_id": 1}, ADD],
    "humaneval/HumanEval.jsonl.gz": [DOUBLE],
}
HUB: dict[str, list[dict[str, Any]]] = {
    "allenai/ai2_arc": [{"id": "M_1", "question": "Numeric labels?", "answerKey": "2", "choices": {
        "text": ["one", "two", "three", "four"], "label": ["1", "2", "3", "4"]}}],
    "cais/mmlu": [{"question": "Q?", "subject": "anatomy", "choices": ["w", "x", "y", "z"],
                   "answer": 2}],
    "openai/gsm8k": FILES["gsm8k/train.jsonl"],
    "google-research-datasets/mbpp": [ADD, {**ADD, "task_id": 1}],
    "openai/openai_humaneval": [DOUBLE],
}


def _write(root: Path) -> Path:
    for rel, content in FILES.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, str):
            p.write_text(content)
        elif rel.endswith(".json"):
            p.write_text(json.dumps(content, indent=1))
        else:
            lines = "".join(json.dumps(r) + "\n" for r in content).encode()
            p.write_bytes(gzip.compress(lines, mtime=0) if rel.endswith(".gz") else lines)
    return root


def _hub(repo: str, config: str | None, *, split: str) -> list[dict[str, Any]]:
    return HUB[repo] if split in ("train", "test", "dev") else []


def _sha(x: Any) -> str:
    return hashlib.sha256(json.dumps(x, sort_keys=True, default=str).encode()).hexdigest()


# -- what each builder makes of them -----------------------------------------------------------

def _load(root: Path, name: str, split: str) -> list[dict[str, Any]]:
    subjects = ["anatomy"] if name.startswith("mmlu") else None  # the one subject staged
    local = sources.load_source(name, split, data_dir=root, verify=False, subjects=subjects)
    return [dataclasses.asdict(it) for it in local.items]


def _family(names: list[tuple[str, str]], hub: list[tuple[str, str]]
            ) -> Callable[[Path], Any]:
    def run(root: Path) -> Any:
        out = [_load(root, n, s) for n, s in names]
        env = os.environ.pop(sources.ENV_VAR, None)  # no data folder: the hub path
        try:
            for n, s in hub:
                loaded = sources.load_source(n, s, hub_loader=_hub)
                out.append([dataclasses.asdict(it) for it in loaded.items])
        finally:
            if env is not None:
                os.environ[sources.ENV_VAR] = env
        return out
    return run


def _build(name: str, split: str) -> Callable[[Path], Any]:
    def run(root: Path) -> Any:
        items = sources.load_source(name, split, data_dir=root, verify=False).items
        out = []
        for it in items:
            rec, stats = S.make_record(name, split, it, seed=0)
            out.append([None if rec is None else rec.to_json(), stats])
        return out
    return run


def _suite(root: Path) -> Any:
    spec = SP.parse_suite({"name": "fp", "domains": {"science": {
        "train": {"source": "arc-easy", "split": "train"},
        "id": {"source": "arc-easy", "split": "train"},
        "shift": {"source": "arc-easy", "split": "train"}}},
        "caps": {"train": 8, "calib": 4, "id": 5, "shift": 5}})
    built = S.build_suite(spec, "smoke", data_dir=root, verify=False, progress=False)
    return [[k, [r.to_json() for r in s.records], s.recipe["selection"], s.recipe["pool"]]
            for k, s in sorted(built.splits.items())]


def _family_version(module: Any) -> str:
    return (f"{module.__name__}.VERSION={module.VERSION}, "
            f"uqbench.data.sources.api.LOADER_VERSION={LOADER_VERSION}")


def _builder_version(source: str) -> str:
    versions = {"build_item_version": S.BUILD_ITEM_VERSION,
                **sources.get_source(source).versions}
    return ", ".join(f"{k}={v}" for k, v in sorted(versions.items()))


#: the sources each "builders.*" fingerprint builds
BUILT = {"builders.gsm8k": ("gsm8k",), "builders.math500": ("math500", "math"),
         "builders.numeric": ("svamp", "mawps"), "builders.mbpp": ("mbpp",),
         "builders.humaneval": ("humaneval",)}

#: name -> (version label: the constants to bump, output of the fixed input, needs the sandbox)
BUILDERS: dict[str, tuple[Callable[[], str], Callable[[Path], Any], bool]] = {
    "sources.adapters": (lambda: _family_version(adapters), _family(
        [("arc-easy", "train"), ("winogrande", "test"), ("boolq", "train"), ("piqa", "test")],
        [("arc-easy", "train")]), False),
    "sources.mmlu": (lambda: _family_version(mmlu), _family(
        [("mmlu", "dev"), ("mmlu-prerelease", "dev")], [("mmlu", "dev")]), False),
    "sources.math": (lambda: _family_version(math), _family(
        [("aqua", "test"), ("gsm8k", "train"), ("math500", "test"), ("math", "test"),
         ("svamp", "test"), ("mawps", "test")], [("gsm8k", "train")]), False),
    "sources.code": (lambda: _family_version(code), _family(
        [("mbpp", "all"), ("mbpp", "test"), ("humaneval", "test")],
        [("mbpp", "train"), ("humaneval", "test")]), False),
    "builders.gsm8k": (lambda: _builder_version("gsm8k"), _build("gsm8k", "train"), False),
    "builders.math500": (lambda: _builder_version("math500"),
                         lambda r: [_build(n, "test")(r) for n in ("math500", "math")], False),
    "builders.numeric": (lambda: _builder_version("svamp"),
                         lambda r: [_build(n, "test")(r) for n in ("svamp", "mawps")], False),
    "builders.mbpp": (lambda: _builder_version("mbpp"), _build("mbpp", "test"), True),
    "builders.humaneval": (lambda: _builder_version("humaneval"), _build("humaneval", "test"),
                           True),
    "suites": (lambda: f"SUITE_VERSION={S.SUITE_VERSION}", _suite, False),
}


def fingerprint(name: str, root: Path) -> dict[str, str]:
    version, run, _ = BUILDERS[name]
    return {"version": version(), "sha256": _sha(run(root))}


def check(name: str, root: Path, stored: dict[str, dict[str, str]]) -> None:
    """Fail when ``name``'s output changed and its version did not (or the file is stale)."""
    now = fingerprint(name, root)
    old = stored.get(name)
    update = "python -m tests.data.suites.test_cache --update"
    if old is None:
        pytest.fail(f"no fingerprint for builder {name}; run {update}")
    if now["sha256"] != old["sha256"] and now["version"] == old["version"]:
        pytest.fail(f"output of builder {name} changed; bump the version constant of the code "
                    f"you changed ({now['version']}) and update the fingerprint ({update}), "
                    "so that split caches built by the old code are not reused")
    if now != old:
        pytest.fail(f"builder {name}: version {old['version']} -> {now['version']} but the "
                    f"fingerprint file was not updated; run {update}")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write(tmp_path_factory.mktemp("fingerprint-data"))


@pytest.fixture(scope="module")
def stored() -> dict[str, dict[str, str]]:
    return json.loads(FINGERPRINTS.read_text())


FAST = [n for n, (_, _, sandbox) in BUILDERS.items() if not sandbox]
SANDBOX = [n for n, (_, _, sandbox) in BUILDERS.items() if sandbox]


@pytest.mark.parametrize("name", FAST)
def test_fingerprint(name: str, tiny: Path, stored: dict[str, dict[str, str]]) -> None:
    check(name, tiny, stored)


@pytest.mark.parametrize("name", SANDBOX)
def test_fingerprint_code_builders(name: str, tiny: Path, stored: dict[str, dict[str, str]],
                                   sandbox_ok: None) -> None:
    check(name, tiny, stored)


def test_every_builder_and_source_family_is_fingerprinted(stored: dict) -> None:
    assert set(stored) == set(BUILDERS)
    assert set(BUILT) <= set(BUILDERS)
    built = {n for names in BUILT.values() for n in names}
    for name in sources.list_sources():  # the version the cache key uses is the family's
        src = sources.get_source(name)
        assert (src.build is not None) == (name in built), name
        for names in BUILT.values():  # one version label per fingerprint
            assert name not in names or src.versions == sources.get_source(names[0]).versions
        family = sys.modules[src.parse.__module__]
        assert f"sources.{family.__name__.rsplit('.', 1)[1]}" in BUILDERS
        assert src.version == family.VERSION, name


def test_a_changed_output_without_a_bump_fails(tiny: Path, stored: dict,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The check can fail: a parser that strips one more character changes the fingerprint."""
    orig = adapters.parse_boolq

    def changed(src, split, i, d):  # type: ignore[no-untyped-def]
        it = orig(src, split, i, d)
        return dataclasses.replace(it, record=dataclasses.replace(
            it.record, question=it.record.question[:-1]))

    boolq = sources.get_source("boolq")
    with sources.SOURCES.scoped({"boolq": dataclasses.replace(boolq, parse=changed)},
                                replace=True):
        with pytest.raises(pytest.fail.Exception,
                           match="output of builder sources.adapters changed"):
            check("sources.adapters", tiny, stored)
        monkeypatch.setattr(adapters, "VERSION", "bumped")
        with pytest.raises(pytest.fail.Exception, match="fingerprint file was not updated"):
            check("sources.adapters", tiny, stored)


def main(argv: list[str]) -> int:
    """``--update``: recompute every fingerprint (sandbox included) into the JSON file."""
    if argv != ["--update"]:
        print(__doc__)
        return 2
    with tempfile.TemporaryDirectory() as d:
        root = _write(Path(d))
        out = {name: fingerprint(name, root) for name in BUILDERS}
    FINGERPRINTS.parent.mkdir(parents=True, exist_ok=True)
    FINGERPRINTS.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"wrote {FINGERPRINTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
