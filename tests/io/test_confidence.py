"""Confidence-only records (a confidence and a correctness per question: the JSONL/CSV format and
HELM runs in HELM's own schema): scored with every column that needs no distribution over the
choices, equal to the full run's on those columns; the others listed as skipped; every bad input
refused naming its file and line before any output."""
from __future__ import annotations

import csv
import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest

from tests.io.test_recordset import DENSE, DOMAINS, record_set
from uqbench.core.errors import ConfigError, UserError
from uqbench.core.outputs import Outputs
from uqbench.core.probs import softmax
from uqbench.io.confidence import read_confidence
from uqbench.io.helm import read_helm
from uqbench.io.lmeval import DomainTasks
from uqbench.run.score_records import ScoreConfig, load_records, score

#: the columns the full run and its confidence-only copy share (``ece_ts`` is not one: the full
#: run scales the distribution over choices, the copy the binary confidence)
SHARED = ("accuracy", "ece", "mce", "ece_adaptive", "brier_conf", "ood_auroc", "aupr_out",
          "fpr95", "aurc", "e_aurc", "augrc", "sel_acc_80", "shift_accuracy", "shift_sel_acc_80",
          "ece_hb", "ece_iso")


def confidence_rows(rs, pair=DENSE.name) -> list[dict]:
    """The MSP and correctness of ``pair``'s records, one row per question."""
    rows = []
    for d in DOMAINS:
        for role in ("id", "shift", "calib"):
            o = rs.outputs[pair, f"{d}/{role}", 0]
            p = softmax(o.logits)
            for i in range(o.n):
                rows.append({"id": f"{d}/{role}/{o.ids[i]}", "domain": d, "split": role,
                             "confidence": float(p[i].max()),
                             "correct": int(p[i].argmax() == o.labels[i]), "model": "lora",
                             "n_choices": 4})
    return rows


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def write_csv(path: Path, rows: list[dict], fields=None) -> Path:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields or list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path


def test_confidence_only_records_give_the_full_runs_columns(heavy_compute, tmp_path,
                                                              png_figures):
    rs = record_set()
    rs.pairs = [DENSE]
    rs.outputs = {k: o for k, o in rs.outputs.items() if k[0] == DENSE.name}
    full = score(rs, ScoreConfig(out=tmp_path / "full", scorers=("msp",), figures=False))
    src = write_jsonl(tmp_path / "conf.jsonl", confidence_rows(rs))
    conf = score(load_records(src), ScoreConfig(out=tmp_path / "conf", figures=True,
                                                bootstrap=rs.bootstrap))
    f_rows = {r["domain"]: r for r in full.rows if r["method"] == "lora/dense/msp"}
    c_rows = {r["domain"]: r for r in conf.rows if r["method"] == "lora/reported/reported"}
    assert set(f_rows) == set(c_rows) == {*DOMAINS, "pooled"}
    risk = [k for k in f_rows["pooled"] if k.startswith(("rc_", "shift_rc_", "risk_at_"))
            and not k.endswith("note")]
    assert risk
    for dom, f in f_rows.items():
        c = c_rows[dom]
        for col in SHARED:
            for k in (col, f"{col}_std", f"{col}_lo", f"{col}_hi"):
                if k in f:
                    assert c[k] == pytest.approx(f[k], rel=1e-12, abs=1e-15, nan_ok=True), \
                        (dom, k)
        for k in risk:
            assert c[k] == pytest.approx(f[k], rel=1e-12, abs=1e-15, nan_ok=True), (dom, k)
    # the chance rows come from n_choices
    chance = [r for r in conf.rows if r["method"] == "chance"]
    assert len(chance) == 3 and chance[0]["accuracy"] == pytest.approx(0.25)
    # what needs a distribution is skipped and listed, never a number
    run = json.loads((tmp_path / "conf" / "run.json").read_text())
    cols = run["skipped_columns"][0]
    assert {"brier", "nll", "cp_lac_10_cov"} <= set(cols["columns"]) and cols["missing"] == [
        "labels", "logits"]
    assert {"scorer": "entropy", "pair": "lora/reported", "missing": ["logits"]} in \
        run["skipped_scorers"]
    assert run["methods"] == ["lora/reported/reported"]
    row = c_rows["pooled"]
    assert math.isnan(row["brier"]) and math.isnan(row["nll"])
    assert not [k for k in row if k.startswith(("cp_", "shift_cp_", "cpd_")) and k != "cp_note"]
    assert "ece_ts" in row and math.isfinite(row["ece_ts"])  # binary temperature scaling
    assert "cp_lac_10_cov" in f_rows["pooled"]
    html = (tmp_path / "conf" / "report.html").read_text()
    assert "columns not computed" in html and "needs each question&#39;s distribution" in html


def test_brier_conf_is_the_binary_brier_of_the_confidence(tmp_path):
    rows = [{"id": f"q{i}", "domain": "d", "split": s, "confidence": c, "correct": k}
            for i, (s, c, k) in enumerate([("id", 0.9, 1), ("id", 0.6, 0), ("id", 0.8, 1),
                                           ("id", 0.3, 0), ("id", 0.5, 1), ("shift", 0.4, 0),
                                           ("shift", 0.7, 1), ("shift", 0.2, 0),
                                           ("calib", 0.9, 1), ("calib", 0.6, 0),
                                           ("calib", 0.7, 1), ("calib", 0.4, 1)])]
    res = score(read_confidence(write_csv(tmp_path / "c.csv", rows)),
                ScoreConfig(out=tmp_path / "o", figures=False, bootstrap=20))
    row = next(r for r in res.rows if r["domain"] == "d" and r["method"] != "chance")
    # (0.1^2 + 0.6^2 + 0.2^2 + 0.3^2 + 0.5^2) / 5 = 0.75 / 5
    assert row["brier_conf"] == pytest.approx(0.15)
    assert row["accuracy"] == pytest.approx(0.6) and row["shift_accuracy"] == pytest.approx(1 / 3)
    assert not [r for r in res.rows if r["method"] == "chance"]  # no n_choices: no chance row
    run = json.loads((tmp_path / "o" / "run.json").read_text())
    assert "chance" in run["references_skipped"]


def test_csv_and_jsonl_read_the_same_records_and_hold_out_calib_when_absent(tmp_path):
    rows = [r for r in confidence_rows(record_set()) if r["split"] != "calib"]
    a = read_confidence(write_jsonl(tmp_path / "c.jsonl", rows))
    b = read_confidence(write_csv(tmp_path / "c.csv", rows))
    assert a.outputs.keys() == b.outputs.keys()
    for k, o in a.outputs.items():
        for f in ("ids", "domain", "confidence", "correct"):
            np.testing.assert_array_equal(getattr(o, f), getattr(b.outputs[k], f))
        assert o.logits is None and o.labels is None
    held = a.meta["confidence"]["calib_held_out"]
    n_id = sum(1 for r in rows if r["domain"] == "science" and r["split"] == "id")
    cal = a.outputs["lora/reported", "science/calib", 0]
    assert cal.n == round(0.2 * n_id) and list(cal.ids) == held["ids"]["science"]
    assert not set(cal.ids) & set(a.outputs["lora/reported", "science/id", 0].ids)


GOOD = {"id": "q1", "domain": "d", "split": "id", "confidence": 0.7, "correct": 1}


def rows_with(bad: dict | str, at: int = 3) -> list:
    rows = [{**GOOD, "id": f"q{i}", "split": s} for i, s in
            enumerate(["id"] * 6 + ["shift"] * 3 + ["calib"] * 3)]
    rows[at] = bad if isinstance(bad, str) else {**rows[at], **bad}
    return rows


@pytest.mark.parametrize("bad, match", [
    ("[1, 2, 3]", r"c\.jsonl:4: expected an object"),
    ("{not json", r"c\.jsonl:4: not JSON"),
    ({"confidence": None}, r"c\.jsonl:4: missing confidence"),
    ({"confidence": "NaN"}, r"c\.jsonl:4: confidence is nan"),
    ({"confidence": 1.5}, r"c\.jsonl:4: confidence 1\.5 is outside \[0, 1\]"),
    ({"confidence": -0.1}, r"c\.jsonl:4: confidence -0\.1 is outside"),
    ({"correct": 0.5}, r"c\.jsonl:4: correct 0\.5 is not 0 or 1"),
    ({"id": "q0"}, r"c\.jsonl:4: id 'q0' already on .*c\.jsonl:1"),
    ({"split": "test"}, r"c\.jsonl:4: split 'test' is not one of id, shift, calib"),
    ({"model": "gpt2"}, r"mixed models"),
    ({"n_choices": 4}, r"n_choices is given on some lines only"),
    ({"n_choices": 1}, r"c\.jsonl:4: n_choices 1 is not a count"),
])
def test_bad_jsonl_lines_are_refused_naming_file_and_line(tmp_path, bad, match):
    rows = rows_with(bad)
    if "model" in str(bad):
        rows[0] = {**rows[0], "model": "other"}
    with pytest.raises(UserError, match=match):
        read_confidence(write_jsonl(tmp_path / "c.jsonl", rows))


@pytest.mark.parametrize("model, named", [
    ("meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-8B"),   # a hub id keeps its org
    ("/data/hub/models--Qwen--Qwen2.5-7B/snapshots/0123456789abcdef0123", "Qwen/Qwen2.5-7B"),
    ("gpt2", "gpt2"), (None, "c")])   # no model in the rows: the file's name
def test_a_reported_models_name_keeps_its_org_as_lm_eval_sources_do(tmp_path, model, named):
    rows = [{k: v for k, v in r.items() if k != "model"} | ({"model": model} if model else {})
            for r in rows_with({})]
    rs = read_confidence(write_jsonl(tmp_path / "c.jsonl", rows))
    assert [p.name for p in rs.pairs] == [f"{named}/reported"]


def test_bad_csv_and_domains_are_refused_before_any_output(tmp_path):
    rows = rows_with({})
    src = write_csv(tmp_path / "c.csv", [{k: v for k, v in r.items() if k != "correct"}
                                         for r in rows])
    with pytest.raises(UserError, match=r"c\.csv:1: the header lacks correct"):
        read_confidence(src)
    no_shift = [r for r in rows if r["split"] != "shift"]
    with pytest.raises(UserError, match=r"domain 'd' has no shift rows"):
        read_confidence(write_csv(tmp_path / "n.csv", no_shift))
    with pytest.raises(UserError, match=r"domain 'd' has no id rows"):
        read_confidence(write_csv(tmp_path / "m.csv", [r for r in rows if r["split"] != "id"]))
    with pytest.raises(ConfigError, match="are .jsonl or .csv files"):
        read_confidence(write_jsonl(tmp_path / "c.txt", rows))
    # through the CLI: the error, and no run folder
    from uqbench.cli import main

    bad = write_jsonl(tmp_path / "b.jsonl", rows_with({"confidence": 2}))
    assert main(["score", str(bad), "--out", str(tmp_path / "out")]) != 0
    assert not (tmp_path / "out").exists()
    with pytest.raises(ConfigError, match="name their domains"):
        load_records(bad, domains=["d=a:b"])


def test_outputs_validate_confidence_only_records():
    ok = {"ids": np.array(["a", "b"]), "labels": None, "logits": None,
          "domain": np.array(["d", "d"]), "confidence": np.array([0.2, 0.9]),
          "correct": np.array([0, 1])}
    o = Outputs(**ok)
    assert o.n == 2 and o.available() == {"ids", "domain", "confidence", "correct"}
    assert Outputs.concat([o, o.select(np.array([1]))]).confidence.tolist() == [0.2, 0.9, 0.9]
    for bad, match in (({"confidence": np.array([0.2, np.nan])}, "NaN"),
                       ({"confidence": np.array([0.2, 1.1])}, r"in \[0, 1\]"),
                       ({"correct": np.array([0, 2])}, "0 or 1"),
                       ({"correct": None}, "needs"),
                       ({"experts": np.array([1.0, 2.0])}, "cannot hold experts")):
        with pytest.raises(ValueError, match=match):
            Outputs(**{**ok, **bad})


# -- HELM ---------------------------------------------------------------------------------------

def _stat(name: str, x: float, split: str = "test") -> dict:
    """A HELM ``Stat`` of one value, as ``asdict_without_nones`` writes it."""
    return {"name": {"name": name, "split": split}, "count": 1, "sum": x, "sum_squared": x * x,
            "min": x, "max": x, "mean": x, "variance": 0.0, "stddev": 0.0}


def helm_run(root: Path, name: str, conf: list[float], em: list[float],
             model: str = "openai/gpt2", method: str = "multiple_choice_joint") -> Path:
    """A HELM run folder in the schema helm-run writes: per_instance_stats.json (with a
    perturbed copy of the first instance, as robustness runs have) and scenario_state.json."""
    run = root / name
    run.mkdir(parents=True)
    ids = [f"id{100 + i}" for i in range(len(conf))]
    stats = [{"instance_id": i, "train_trial_index": 0,
              "stats": [_stat("num_references", 4), _stat("max_prob", c),
                        _stat("exact_match", e), _stat("predicted_index", 0)]}
             for i, c, e in zip(ids, conf, em, strict=False)]
    stats.append({"instance_id": ids[0], "perturbation": {"name": "typos", "robustness": True,
                                                          "fairness": False, "computed_on":
                                                          "perturbed", "prob": 0.1},
                  "train_trial_index": 0, "stats": [_stat("max_prob", 0.99),
                                                    _stat("exact_match", 0.0)]})
    refs = [{"output": {"text": t}, "tags": ["correct"] if t == "A" else []} for t in "ABCD"]
    state = {"adapter_spec": {"method": method, "model_deployment": f"huggingface/{model}",
                              "model": model, "max_train_instances": 5, "num_outputs": 5,
                              "temperature": 0.0, "max_tokens": 1},
             "request_states": [
                 {"instance": {"input": {"text": f"question {i}"}, "references": refs,
                               "split": "test", "id": i},
                  "train_trial_index": 0, "output_mapping": dict(zip("ABCD", "ABCD", strict=False)),
                  "request": {"model_deployment": f"huggingface/{model}", "model": model,
                              "prompt": "...", "temperature": 0.0, "num_completions": 1,
                              "top_k_per_token": 5, "max_tokens": 1},
                  "result": {"success": True, "embedding": [], "completions": [
                      {"text": " A", "logprob": -0.1, "tokens": []}], "cached": True},
                  "num_train_instances": 5, "prompt_truncated": False} for i in ids]}
    (run / "per_instance_stats.json").write_text(json.dumps(stats, indent=2))
    (run / "scenario_state.json").write_text(json.dumps(state, indent=2))
    return run


ID_RUN = "mmlu:subject=high_school_physics,method=multiple_choice_joint,model=openai_gpt2"
SHIFT_RUN = "mmlu:subject=college_physics,method=multiple_choice_joint,model=openai_gpt2"


def test_helm_runs_read_as_confidence_records(tmp_path):
    rng = np.random.default_rng(0)
    c_id, c_sh = rng.uniform(0.25, 1, 20), rng.uniform(0.25, 1, 12)
    e_id = (rng.uniform(size=20) < c_id).astype(float)
    e_id[3] = 0.5  # a tie among argmax references: HELM's calibration metrics count it as 0
    e_sh = (rng.uniform(size=12) < c_sh).astype(float)
    helm_run(tmp_path / "runs", ID_RUN, list(c_id), list(e_id))
    helm_run(tmp_path / "runs", SHIFT_RUN, list(c_sh), list(e_sh))
    yaml = tmp_path / "d.yaml"
    yaml.write_text(f"domains:\n  physics:\n    id: '{ID_RUN}'\n    shift: '{SHIFT_RUN}'\n")
    with pytest.warns(UserWarning, match="perturbed"):
        rs = load_records(tmp_path / "runs", domains_file=yaml)
    assert [p.name for p in rs.pairs] == ["openai/gpt2/reported"]
    idr, cal, sh = (rs.outputs["openai/gpt2/reported", f"physics/{r}", 0]
                    for r in ("id", "calib", "shift"))
    assert cal.n == 4 and idr.n == 16 and sh.n == 12
    got = dict(zip([*idr.ids, *cal.ids], [*idr.correct, *cal.correct], strict=False))
    want = np.floor(e_id)
    assert [got[f"{ID_RUN}/id{100 + i}"] for i in range(20)] == want.tolist()
    np.testing.assert_array_equal(sh.confidence, c_sh)
    assert rs.refs.n_choices["physics/id"].tolist() == [4] * 16
    assert rs.meta["confidence"]["not_read"] == {"perturbed": 2}
    res = score(rs, ScoreConfig(out=tmp_path / "o", figures=False, bootstrap=20))
    row = next(r for r in res.rows if r["method"] == "openai/gpt2/reported/reported"
               and r["domain"] == "physics")
    assert row["accuracy"] == pytest.approx(idr.correct.mean())


def test_bad_helm_runs_are_refused_naming_the_file(tmp_path):
    runs = tmp_path / "runs"
    helm_run(runs, "a", [0.5, 0.6, 0.7, 0.8, 0.9], [1, 0, 1, 1, 0])
    helm_run(runs, "b", [0.5, 0.6, 0.7], [1, 0, 1], model="meta/llama")
    helm_run(runs, "c", [0.5, 0.6, 0.7], [1, 0, 1])
    dom = [DomainTasks("x", "a", "c")]
    with pytest.warns(UserWarning):
        assert read_helm(dom, runs).outputs
    with pytest.raises(UserError, match="mixed models"):
        read_helm([DomainTasks("x", "a", "b")], runs)
    with pytest.raises(UserError, match="no HELM run 'zz'"):
        read_helm([DomainTasks("x", "a", "zz")], runs)
    stats = runs / "c" / "per_instance_stats.json"
    data = json.loads(stats.read_text())
    data[1]["stats"] = [s for s in data[1]["stats"] if s["name"]["name"] != "max_prob"]
    stats.write_text(json.dumps(data))
    with pytest.raises(UserError, match=r"per_instance_stats\.json entry 1: .* no max_prob"):
        read_helm(dom, runs)
    data[1]["stats"].append(_stat("max_prob", 1.2))
    stats.write_text(json.dumps(data))
    with pytest.raises(UserError, match=r"entry 1: confidence 1\.2 is outside"):
        read_helm(dom, runs)
    stats.write_text(json.dumps({"instance_id": "x"}))
    with pytest.raises(UserError, match="expected a JSON list"):
        read_helm(dom, runs)
    stats.write_text(json.dumps([{"id": "x"}]))
    with pytest.raises(UserError, match=r"entry 0: expected \{instance_id"):
        read_helm(dom, runs)
    (runs / "c" / "scenario_state.json").write_text(json.dumps({"request_states": []}))
    with pytest.raises(UserError, match="lacks adapter_spec"):
        read_helm(dom, runs)


def test_two_confidence_only_models_are_ranked_in_one_table(tmp_path):
    """Two models' files over the same questions: one run folder, a model table ranked by each
    model's reported confidence (the default when no MSP can run), accuracy read off `correct`."""
    from uqbench.reporting.models import read_models
    from uqbench.run.score_records import load_models

    rows = confidence_rows(record_set())
    flipped = [{**r, "model": "other", "correct": 1 - r["correct"] if i % 3 == 0 else
                r["correct"]} for i, r in enumerate(rows)]
    rs = load_models([write_jsonl(tmp_path / "a.jsonl", rows),
                      write_jsonl(tmp_path / "b.jsonl", flipped)])
    out = tmp_path / "run"
    score(rs, ScoreConfig(out=out, figures=False, bootstrap=50))
    meta = json.loads((out / "run.json").read_text())
    assert meta["model_table"]["scorer"] == "reported"
    assert meta["model_table"]["models"] == ["lora/reported", "other/reported"]
    t = read_models(out)
    pooled = t.cells["pooled"]
    for model, src in (("lora/reported", rows), ("other/reported", flipped)):
        ids = [r for r in src if r["split"] == "id"]
        assert pooled[model]["accuracy"].value == pytest.approx(
            np.mean([r["correct"] for r in ids]))


def test_a_confidence_only_model_and_a_labelled_one_merge_in_either_order(tmp_path):
    """A confidence-only file (no labels) and records with labels over the same questions, the
    latter listed in reverse: one RecordSet whichever source comes first, each split in the
    first source's question order (labels are compared only where both sources have them)."""
    from uqbench.io.recordset import RecordSet
    from uqbench.run.score_records import merge_models

    rs = record_set()
    conf = read_confidence(write_jsonl(tmp_path / "a.jsonl", confidence_rows(rs)))
    labelled = {}
    for (pair, split, seed), o in rs.outputs.items():
        if pair == DENSE.name:  # ids as the file names them, in reverse
            o = dataclasses.replace(o, ids=np.array([f"{split}/{i}" for i in o.ids]))
            labelled[pair, split, seed] = o.select(np.arange(o.n)[::-1])
    full = RecordSet([DENSE], labelled, 1, rs.refs, 50, None, {})
    for first, other in ((conf, full), (full, conf)):
        merged = merge_models([(tmp_path / "first", first), (tmp_path / "other", other)])
        assert sorted(p.name for p in merged.pairs) == ["lora/dense", "lora/reported"]
        for d in DOMAINS:
            for role in ("id", "shift", "calib"):
                split = f"{d}/{role}"
                order = first.outputs[first.pairs[0].name, split, 0].ids.tolist()
                for pair in ("lora/dense", "lora/reported"):
                    assert merged.outputs[pair, split, 0].ids.tolist() == order
                dense = merged.outputs["lora/dense", split, 0]
                at = {q: k for k, q in enumerate(labelled[DENSE.name, split, 0].ids)}
                np.testing.assert_array_equal(
                    dense.labels, labelled[DENSE.name, split, 0].labels[[at[q] for q in order]])
