"""Forward records made elsewhere: the records folder format (round trip, tampering, version),
`uqbench score` on it (skipped scorers, no half-written folder) and the lm-eval samples reader on
files in lm-eval's format (every bad input of the issue named with its file and line)."""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest

from tests.support.data import make_outputs
from uqbench.core.errors import ConfigError, UserError
from uqbench.core.outputs import Outputs, with_train
from uqbench.core.plan import DET, ROUTER, GateSpec, ModelSpec, Pair
from uqbench.io.lmeval import DomainTasks, read_lmeval
from uqbench.io.recordset import RecordSet, export_run, read_record_set, write_record_set
from uqbench.results.references import ReferenceInputs
from uqbench.run.score_records import ScoreConfig, load_records, score

DOMAINS = ("science", "math")
MOE = Pair(ModelSpec("moe-lora", "moe"), GateSpec("top4", "topk", params={"k": 4}),
           ROUTER | {"mc_logits", "member_logits"})
DENSE = Pair(ModelSpec("lora", "lora"), GateSpec("dense", "dense"), DET)


def record_set(seeds: int = 1) -> RecordSet:
    """MoE-LoRA records with features and train records (the feature scorers' reference),
    LoRA records with logits only."""
    outputs, n_choices, hashes, oo = {}, {}, {}, {}
    for i, d in enumerate(DOMAINS):
        for s in range(seeds):
            o = make_outputs(16, 4, seed=1000 + 10 * i + s)
            outputs[MOE.name, f"{d}/train", s] = dataclasses.replace(
                o, domain=np.full(16, d), train_features=None, train_domain=None)
        for j, (role, n) in enumerate((("id", 30), ("shift", 26), ("calib", 20))):
            split = f"{d}/{role}"
            hashes[split] = f"h{i}{j}"
            n_choices[split] = np.full(n, 4)
            oo[split] = (np.arange(n) % 3 == 0).astype(float)
            for s in range(seeds):
                o = make_outputs(n, 4, seed=100 * i + 10 * j + s)
                outputs[MOE.name, split, s] = dataclasses.replace(
                    o, train_features=None, train_domain=None)
                outputs[DENSE.name, split, s] = Outputs(ids=o.ids, labels=o.labels,
                                                        logits=o.logits + 0.5, domain=o.domain)
    refs = ReferenceInputs(DOMAINS, {k: v for k, v in n_choices.items() if "calib" not in k},
                           {k: v for k, v in oo.items() if "calib" not in k}, hashes)
    return RecordSet([DENSE, MOE], with_train(outputs), seeds, refs, bootstrap=50,
                     meta={"training": {}, "gates": {}})


def test_a_records_folder_reads_back_every_array_and_scores_the_same(tmp_path):
    rs = record_set(seeds=2)
    write_record_set(tmp_path / "rec", rs)
    back = read_record_set(tmp_path / "rec")
    assert (
        back.protocol == rs.protocol
        and back.seeds == 2
        and back.domains == DOMAINS
        and [p.name for p in back.pairs] == [DENSE.name, MOE.name]
    )
    for k, o in rs.outputs.items():
        b = back.outputs[k]
        assert b.available() == o.available(), k
        for f in o.available():
            np.testing.assert_array_equal(getattr(b, f), getattr(o, f), err_msg=f"{k} {f}")
    a = score(rs, ScoreConfig(out=tmp_path / "a", scorers=("msp", "entropy"), figures=False))
    b = score(back, ScoreConfig(out=tmp_path / "b", scorers=("msp", "entropy"), figures=False))
    assert (tmp_path / "a" / "results.csv").read_text() == (
        tmp_path / "b" / "results.csv"
    ).read_text()
    assert {r["method"] for r in a.rows} >= {"lora/dense/msp", "moe-lora/top4/entropy",
                                             "chance", "options-only"}
    assert len(a.rows) == len(b.rows) == 2 * 2 * 3 + 2 * 3  # methods x domains, references


def test_tampered_missing_or_foreign_records_are_refused_naming_the_file(tmp_path):
    write_record_set(tmp_path / "rec", record_set())
    f = tmp_path / "rec" / "records" / "0003.npz"
    data = bytearray(f.read_bytes())
    data[-10] ^= 0xFF
    f.write_bytes(bytes(data))
    with pytest.raises(UserError, match=r"0003\.npz does not match the sha256"):
        read_record_set(tmp_path / "rec")
    f.unlink()
    with pytest.raises(UserError, match=r"0003\.npz is missing"):
        read_record_set(tmp_path / "rec")
    mf = tmp_path / "rec" / "manifest.json"
    m = json.loads(mf.read_text())
    mf.write_text(json.dumps({**m, "version": 99}))
    with pytest.raises(
        UserError, match="version 99; this uqbench reads 'uqbench-records' version 1"
    ):
        read_record_set(tmp_path / "rec")
    mf.write_text(json.dumps({k: v for k, v in m.items() if k != "protocol"}))
    with pytest.raises(UserError, match="lacks protocol"):
        read_record_set(tmp_path / "rec")
    with pytest.raises(UserError, match="not a uqbench records folder"):
        read_record_set(tmp_path)


def test_export_copies_a_runs_records_and_never_replaces_a_folder(tmp_path):
    write_record_set(tmp_path / "run" / "records", record_set())
    dest = export_run(tmp_path / "run", tmp_path / "exported")
    assert read_record_set(dest).outputs.keys() == record_set().outputs.keys()
    with pytest.raises(UserError, match="already exists"):
        export_run(tmp_path / "run", tmp_path / "exported")
    with pytest.raises(UserError, match="not a finished uqbench run folder"):
        export_run(tmp_path / "nothing", tmp_path / "x")
    assert load_records(tmp_path / "run").seeds == 1  # a run folder: its records/
    with pytest.raises(UserError, match="drop --domain"):
        load_records(dest, domains=["a=x:y"])


def test_scorers_without_their_fields_are_skipped_and_listed(tmp_path, caplog):
    rs = record_set()
    res = score(rs, ScoreConfig(out=tmp_path / "o", scorers=("msp", "care", "mc_dropout_msp"),
                                figures=False))
    meta = json.loads((tmp_path / "o" / "run.json").read_text())
    skipped = {(s["scorer"], s["pair"]): s["missing"] for s in meta["skipped_scorers"]}
    assert skipped[("care", "lora/dense")] == ["disagreement", "route_entropy"]
    assert skipped[("mc_dropout_msp", "lora/dense")] == ["mc_logits"]
    assert ("care", "moe-lora/top4") not in skipped
    assert {r["method"] for r in res.rows if r["model"] == "lora"} == {"lora/dense/msp"}
    assert "2 scorer(s) need model internals these records do not hold (disagreement, mc_logits, " \
        "route_entropy): care, mc_dropout_msp; each with what it needs in run.json " \
        "skipped_scorers" in caplog.text
    assert caplog.text.count("need model internals") == 1


def test_feature_scorers_are_skipped_on_records_without_features_or_train_records(tmp_path):
    rs = record_set()
    write_record_set(tmp_path / "rec", rs)
    back = read_record_set(tmp_path / "rec")  # the train reference is rebuilt on read
    names = ("msp", "mahalanobis", "rmd", "knn")
    res = score(back, ScoreConfig(out=tmp_path / "o", scorers=names, figures=False))
    meta = json.loads((tmp_path / "o" / "run.json").read_text())
    assert {(s["scorer"], s["pair"]): s["missing"] for s in meta["skipped_scorers"]} == {
        (n, "lora/dense"): ["features", "train_features"] for n in ("mahalanobis", "rmd", "knn10")}
    feats = {r["method"] for r in res.rows if r["domain"] == "pooled" and r["model"] == "moe-lora"}
    assert feats == {f"moe-lora/top4/{n}" for n in ("msp", "mahalanobis", "rmd", "knn10")}
    assert all(math.isfinite(r["ood_auroc"]) for r in res.rows if r["scorer"] == "knn10")
    # records of an older run: features but no train records -> skipped naming train_features
    old = dataclasses.replace(rs, outputs={
        k: dataclasses.replace(o, train_features=None, train_domain=None)
        for k, o in rs.outputs.items() if not k[1].endswith("/train")})
    score(old, ScoreConfig(out=tmp_path / "old", scorers=names, figures=False))
    meta = json.loads((tmp_path / "old" / "run.json").read_text())
    assert {(s["scorer"], s["pair"]): s["missing"] for s in meta["skipped_scorers"]
            if s["pair"] == "moe-lora/top4"} == {
        (n, "moe-lora/top4"): ["train_features"] for n in ("mahalanobis", "rmd", "knn10")}


def test_an_interrupted_score_leaves_no_folder_and_a_finished_one_is_kept(tmp_path, monkeypatch):
    import uqbench.run.score_records as S

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(S, "write_run", boom)
    with pytest.raises(KeyboardInterrupt):
        score(record_set(), ScoreConfig(out=tmp_path / "o", scorers=("msp",), figures=False))
    assert list(tmp_path.iterdir()) == []  # neither the folder nor a temporary
    monkeypatch.undo()
    score(record_set(), ScoreConfig(out=tmp_path / "o", scorers=("msp",), figures=False))
    before = (tmp_path / "o" / "results.csv").read_text()
    with pytest.raises(UserError, match="already exists"):
        score(record_set(), ScoreConfig(out=tmp_path / "o", scorers=("entropy",), figures=False))
    assert (tmp_path / "o" / "results.csv").read_text() == before


# -- lm-eval samples -------------------------------------------------------------------------

def sample(doc_id: int, lls, target, choices, *, acc=None) -> dict:
    """One line as lm-eval 0.4 writes it (`EvaluationTracker.save_results_samples`): numbers as
    strings, one ``gen_args_i`` per choice with the delimiter before the choice."""
    lls = list(lls)
    line = {"doc_id": doc_id, "doc": {"q": f"question {doc_id}"}, "target": str(target),
            "arguments": {f"gen_args_{i}": {"arg_0": f"Question {doc_id}?\nAnswer:",
                                            "arg_1": " " + c} for i, c in enumerate(choices)},
            "resps": [[[str(x), "False"]] for x in lls],
            "filtered_resps": [[str(x), "False"] for x in lls], "filter": "none",
            "metrics": ["acc", "acc_norm"], "doc_hash": f"d{doc_id}", "prompt_hash": "p",
            "target_hash": "t"}
    lab = int(target)
    line["acc"] = float(int(np.argmax(lls)) == lab)
    norm = np.array(lls) / np.array([len(c) for c in choices])
    line["acc_norm"] = float(int(np.argmax(norm)) == lab)
    return line


def write_task(folder: Path, task: str, lines: list[dict], model: str = "org/tiny") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    p = folder / f"samples_{task}_2026-11-25T10-00-00.000000.jsonl"
    p.write_text("".join(json.dumps(x) + "\n" for x in lines))
    # one results file per run, of the samples' date, listing every task of the run (lm-eval's)
    res = folder / "results_2026-11-25T10-00-00.000000.json"
    doc = json.loads(res.read_text()) if res.exists() else {"model_name": model, "configs": {},
                                                            "results": {}}
    doc["configs"][task], doc["results"][task] = {"target_delimiter": " "}, {}
    res.write_text(json.dumps(doc))
    return p


def mc_lines(n: int, seed: int, c: int = 4) -> list[dict]:
    rng = np.random.default_rng(seed)
    words = ["red", "a long answer", "blue sky", "x"]
    return [sample(i, rng.normal(-8, 3, c), (7 * i) % c,  # lls vary by seed, questions do not
                   [words[(i + j) % 4] * (1 + j % 2) for j in range(c)]) for i in range(n)]


@pytest.fixture
def lm(tmp_path) -> Path:
    root = tmp_path / "lm"
    write_task(root / "m", "easy", mc_lines(40, 1))
    write_task(root / "m", "hard", mc_lines(30, 2))
    return root


def test_lmeval_logits_reproduce_acc_and_acc_norm_and_the_calib_hold_out(lm):
    dom = [DomainTasks.parse("science=easy:hard")]
    for normalize, metric in (("none", "acc"), ("chars", "acc_norm")):
        rs = read_lmeval(dom, lm, normalize=normalize, calib_fraction=0.25, seed=3)
        assert rs.meta["lmeval"]["labels"]["easy"]["verified"] == ["acc", "acc_norm"]
        lines = {x["doc_id"]: x for x in mc_lines(40, 1)}
        o = rs.outputs[f"org/tiny/{'loglik' if normalize == 'none' else 'loglik-per-char'}",
                       "science/id", 0]
        ours = o.logits.argmax(1) == o.labels
        theirs = [lines[int(i.split("/")[1])][metric] == 1 for i in o.ids]
        assert list(ours) == theirs
    held = rs.meta["lmeval"]["calib_held_out"]["doc_ids"]["science"]
    cal = rs.outputs["org/tiny/loglik-per-char", "science/calib", 0]
    assert len(held) == 10 and sorted(int(i.split("/")[1]) for i in cal.ids) == held
    assert not set(cal.ids) & set(o.ids) and len(o.ids) == 30  # disjoint, 40 = 30 + 10
    assert rs.refs.options_only is None and rs.refs.n_choices["science/shift"].tolist() == [4] * 30


def test_lmeval_score_skips_router_scorers_and_members_feed_the_ensemble(lm, tmp_path):
    write_task(tmp_path / "seed1" / "m", "easy", mc_lines(40, 11))
    write_task(tmp_path / "seed1" / "m", "hard", mc_lines(30, 12))
    rs = load_records(lm, domains=["science=easy:hard"], members=[tmp_path / "seed1"])
    assert rs.outputs["org/tiny/loglik-per-char", "science/id", 0].member_logits.shape == (2, 32, 4)
    res = score(rs, ScoreConfig(out=tmp_path / "o", scorers=("msp", "ensemble_msp", "care"),
                                figures=False))
    methods = {r["method"] for r in res.rows}
    assert {"org/tiny/loglik-per-char/msp", "org/tiny/loglik-per-char/ensemble_msp",
            "chance"} <= methods
    assert "options-only" not in methods
    meta = json.loads((tmp_path / "o" / "run.json").read_text())
    assert meta["skipped_scorers"] == [{"scorer": "care", "pair": "org/tiny/loglik-per-char",
                                        "missing": ["disagreement", "route_entropy"]}]
    assert "options-only" in meta["references_skipped"]
    assert not math.isnan(next(r for r in res.rows if r["method"] == "chance")["accuracy"])
    assert (tmp_path / "o" / "results.md").read_text().startswith(
        "# uqbench results: scored from lm-evaluation-harness samples, model `org/tiny`\n")
    other = mc_lines(40, 11)[:-1]
    write_task(tmp_path / "short" / "m", "easy", other)
    write_task(tmp_path / "short" / "m", "hard", mc_lines(30, 12))
    with pytest.raises(UserError, match="other questions than"):
        load_records(lm, domains=["science=easy:hard"], members=[tmp_path / "short"])


def _bad(tmp_path, lines_easy, match, *, hard=None, model_hard="org/tiny"):
    import tempfile

    root = Path(tempfile.mkdtemp(dir=tmp_path))
    write_task(root / "a", "easy", lines_easy)
    write_task(root / ("b" if model_hard != "org/tiny" else "a"), "hard",
               hard or mc_lines(30, 2), model=model_hard)
    with pytest.raises(UserError, match=match):
        read_lmeval([DomainTasks.parse("s=easy:hard")], root)


def test_lmeval_bad_input_names_the_file_and_line(tmp_path):
    good = mc_lines(12, 5)
    gen = [dict(good[0], filtered_resps=["The answer is 4"], resps=[["The answer is 4"]])]
    _bad(tmp_path, gen, r"samples_easy_.*line 1: .*generate_until task")
    no_target = [dict(good[0]), {k: v for k, v in good[1].items() if k != "target"}]
    _bad(tmp_path, no_target, r"line 2: no `target` field")
    for bad in ("nan", "inf"):
        line = json.loads(json.dumps(good[2]))
        line["filtered_resps"][1][0] = bad
        _bad(tmp_path, [good[0], line], r"line 2: non-finite log-likelihood")
    _bad(tmp_path, [good[0], good[1], dict(good[2], doc_id=0)],
         r"line 3: doc_id 0 also on line 1")
    _bad(tmp_path, good, r"different models: .*'org/tiny'.*'org/other'", model_hard="org/other")
    _bad(tmp_path, [dict(good[0], target="not a choice")], r"line 1: target 'not a choice'")
    with pytest.raises(ConfigError, match="calib task 'easy' is also its ID task"):
        DomainTasks.parse("s=easy:hard:easy")
    with pytest.raises(UserError, match="no samples file of task 'nope'"):
        read_lmeval([DomainTasks.parse("s=nope:hard")], tmp_path)
