"""Open LLM Leaderboard details and older lm-eval samples as `uqbench score` sources
(`uqbench.io.leaderboard`, `uqbench.io.lmeval`), on files written here in the published schemas
from the committed lm-eval samples (real log-likelihoods of a tiny model): v2 (lm-eval's samples
in ``<org>__<model>/``, ``leaderboard_*`` tasks, JSON lines or a parquet copy), v1
(``details_harness|<task>|<n>_<date>.parquet``: 2023's columns, and lighteval's of 2024), and
lm-eval <= 0.4.2's JSON arrays."""
from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.support import lmeval
from uqbench.core.errors import UserError
from uqbench.io.lmeval import DomainTasks, array_items, read_lmeval, read_task

MC = lmeval.COMMITTED / "mc"
VC = lmeval.COMMITTED / "vc"
STAMP = "2024-06-26T16-17-28.123456"
V1_STAMP = "2023-08-19T16:35:46.942696"


def samples(part: Path, task: str) -> list[dict]:
    (path,) = part.glob(f"samples_{task}_*.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


def file_acc(rows: list[dict], metric: str) -> np.ndarray:
    return np.array([r[metric] for r in rows], dtype=float)


def uq_correct(path: Path, task: str, normalize: str) -> np.ndarray:
    ts = read_task(path, task)
    return (ts.logits(normalize).argmax(axis=1) == ts.labels).astype(float)


# -- v2: lm-eval samples as the leaderboard publishes them -----------------------------------

def v2_folder(root: Path, parquet: bool = False) -> Path:
    """``<org>__<model>/samples_leaderboard_<task>_<date>.jsonl`` (or ``.parquet``: the same
    columns, in row groups of 5) of the committed ARC and 3-to-10-choice runs."""
    folder = root / "org__model"
    folder.mkdir(parents=True)
    for part, task, name in ((MC, "arc_easy_local", "leaderboard_arc_easy"),
                             (MC, "arc_challenge_local", "leaderboard_arc_challenge"),
                             (VC, lmeval.VC_TASK, "leaderboard_mmlu_pro")):
        rows = samples(part, task)
        dest = folder / f"samples_{name}_{STAMP}.{'parquet' if parquet else 'jsonl'}"
        if parquet:
            pq.write_table(pa.Table.from_pylist(rows), dest, row_group_size=5)
        else:
            dest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


@pytest.mark.parametrize("parquet", [False, True])
def test_v2_accuracy_equals_the_files_own_metrics(tmp_path: Path, parquet: bool) -> None:
    folder = v2_folder(tmp_path / "hub", parquet)
    for part, task, name in ((MC, "arc_easy_local", "leaderboard_arc_easy"),
                             (VC, lmeval.VC_TASK, "leaderboard_mmlu_pro")):
        (path,) = folder.glob(f"samples_{name}_*")
        rows = samples(part, task)
        for normalize, metric in (("none", "acc"), ("chars", "acc_norm"), ("bytes", "acc_bytes")):
            np.testing.assert_array_equal(uq_correct(path, name, normalize),
                                          file_acc(rows, metric))
    rs = read_lmeval([DomainTasks.parse("science=leaderboard_arc_easy:leaderboard_mmlu_pro")],
                     tmp_path / "hub", calib_fraction=0.25)
    assert rs.pairs[0].name == "org__model/loglik-per-char"  # the folder names the model
    assert rs.meta["lmeval"]["files"]["leaderboard_mmlu_pro"].endswith(
        f"{STAMP}.{'parquet' if parquet else 'jsonl'}")
    shift = rs.outputs["org__model/loglik-per-char", "science/shift", 0]
    n = rs.refs.n_choices["science/shift"]
    assert (n.min(), n.max()) == (3, 10)
    assert np.mean(shift.logits.argmax(1) == shift.labels) == np.mean(
        file_acc(samples(VC, lmeval.VC_TASK), "acc_norm"))


def test_v2_parquet_reads_as_its_json_lines(tmp_path: Path) -> None:
    a = read_task(next(v2_folder(tmp_path / "j").glob("*mmlu_pro*")), "leaderboard_mmlu_pro")
    b = read_task(next(v2_folder(tmp_path / "p", True).glob("*mmlu_pro*")),
                  "leaderboard_mmlu_pro")
    assert a.doc_ids == b.doc_ids and a.verified == b.verified == ("acc", "acc_norm", "acc_bytes")
    np.testing.assert_array_equal(a.lls, b.lls)
    np.testing.assert_array_equal(a.labels, b.labels)


def test_v2_models_in_two_folders_are_refused(tmp_path: Path) -> None:
    v2_folder(tmp_path / "hub")
    (tmp_path / "hub" / "org__other").mkdir()
    moved = next((tmp_path / "hub" / "org__model").glob("*arc_challenge*"))
    moved.rename(tmp_path / "hub" / "org__other" / moved.name)
    with pytest.raises(UserError, match="different model folders .*org__model.*org__other"):
        read_lmeval([DomainTasks.parse("s=leaderboard_arc_easy:leaderboard_arc_challenge")],
                    tmp_path / "hub")


def test_parquet_samples_without_a_needed_column_are_refused(tmp_path: Path) -> None:
    rows = [{k: v for k, v in r.items() if k != "filtered_resps"}
            for r in samples(MC, "arc_easy_local")]
    path = tmp_path / f"samples_t_{STAMP}.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    with pytest.raises(UserError, match=r"samples_t_.*\.parquet: no column filtered_resps "
                       r"\(its columns: doc_id, doc, target, arguments, resps"):
        read_task(path, "t")
    path.write_text("not parquet")
    with pytest.raises(UserError, match="not a readable parquet file"):
        read_task(path, "t")


# -- lm-eval <= 0.4.2: one JSON array per task -------------------------------------------------

def old_rows(rows: list[dict]) -> list[dict]:
    """Samples as lm-eval 0.4.0-0.4.2 logged them: ``arguments`` a [context, continuation] pair
    per choice, numbers and booleans as JSON, no hashes."""
    out = []
    for r in rows:
        o = {k: v for k, v in r.items() if not k.endswith("_hash")}
        o["arguments"] = [[a["arg_0"], a["arg_1"]] for a in r["arguments"].values()]
        o["resps"] = [[[float(x), g == "True"] for x, g in rs] for rs in r["resps"]]
        o["filtered_resps"] = [[float(x), g == "True"] for x, g in r["filtered_resps"]]
        o["target"] = int(r["target"])
        out.append(o)
    return out


def test_lmeval_042_json_arrays_read_as_the_same_samples(tmp_path: Path) -> None:
    """``<model_args>_<task>.jsonl`` beside ``results.json`` (0.4.0-0.4.2) and the tracker's
    ``<model>/samples_<task>_<date>.json`` (May-June 2024), each one JSON array written with
    ``indent=2``: the same labels, log-likelihoods and verification as the JSON lines."""
    (results,) = MC.glob("results_*.json")
    res = json.loads(results.read_text())
    res["config"]["model_args"] = "pretrained=org/tiny,dtype=float32"
    del res["model_name"]  # 0.4.2's results name the model by its model_args only
    old, tracker = tmp_path / "old", tmp_path / "tracker" / "org__tiny"
    old.mkdir()
    tracker.mkdir(parents=True)
    (old / "results.json").write_text(json.dumps(res))
    for task in lmeval.MC_TASKS:
        dumped = json.dumps(old_rows(samples(MC, task)), indent=2)
        (old / f"pretrained__org__tiny,dtype__float32_{task}.jsonl").write_text(dumped)
        (tracker / f"samples_{task}_{STAMP}.json").write_text(dumped)
    dom = [DomainTasks.parse("science=arc_easy_local:arc_challenge_local")]
    ref = read_lmeval(dom, MC)
    for src, model in ((old, "org/tiny"), (tracker, "org__tiny")):
        rs = read_lmeval(dom, src)
        assert rs.pairs[0].name == f"{model}/loglik-per-char"
        assert rs.meta["lmeval"]["labels"]["arc_easy_local"]["verified"] == [
            "acc", "acc_norm", "acc_bytes"]
        for (_, split, seed), o in ref.outputs.items():
            mine = rs.outputs[f"{model}/loglik-per-char", split, seed]
            np.testing.assert_array_equal(mine.ids, o.ids)
            np.testing.assert_array_equal(mine.labels, o.labels)
            np.testing.assert_allclose(mine.logits, o.logits, rtol=0, atol=0)


def test_json_array_is_decoded_element_by_element(tmp_path: Path) -> None:
    """Chunks far smaller than one element: the same elements as `json.load`, each with the line
    it starts on; a truncated array is refused naming where."""
    items = old_rows(samples(MC, "arc_easy_local"))
    text = json.dumps(items, indent=2)
    got = list(array_items(tmp_path, io.StringIO(text), chunk=64))
    assert [d for _, d in got] == items
    starts = [i + 2 for i, line in enumerate(text.splitlines()[1:]) if line == "  {"]
    assert [line for line, _ in got] == starts
    with pytest.raises(UserError, match=rf"line {starts[-1]}: not JSON"):
        list(array_items(tmp_path, io.StringIO(text[:-40]), chunk=64))
    with pytest.raises(UserError, match="ends without its closing"):
        list(array_items(tmp_path, io.StringIO(text[:-1]), chunk=64))


# -- v1: details_harness|<task>|<n>_<date>.parquet ----------------------------------------------

def v1_table(rows: list[dict], *, lighteval: bool = False) -> pa.Table:
    """The committed samples in the v1 details schema: 2023's top-level ``gold``, ``acc``,
    ``acc_norm`` and ``predictions`` of floats, or lighteval's ``gold_index``, ``metrics``
    struct and ``[log-likelihood, is_greedy]`` predictions (columns sorted, as it wrote them)."""
    out = []
    for r in rows:
        choices = r["doc"]["choices"]
        ll = [float(x) for x, _ in r["filtered_resps"]]
        prompt = r["arguments"]["gen_args_0"]["arg_0"]
        row = {"example": r["doc"]["query"], "full_prompt": prompt, "choices": choices,
               "num_asked_few_shots": 25, "num_effective_few_shots": 25,
               "input_tokens": [[1, 2, 3]] * len(choices), "cont_tokens": [[4]] * len(choices),
               "truncated": [0] * len(choices), "padded": [0] * len(choices)}
        if lighteval:
            row |= {"gold": [choices[int(r["target"])]], "gold_index": [int(r["target"])],
                    "instruction": "", "pred_logits": [],
                    "predictions": [[x, float(g == "True")] for x, (_, g)
                                    in zip(ll, r["filtered_resps"], strict=False)],
                    "metrics": {"acc": float(r["acc"]), "acc_norm": float(r["acc_norm"])}}
        else:
            row |= {"gold": int(r["target"]), "predictions": ll, "acc": float(r["acc"]),
                    "acc_norm": float(r["acc_norm"])}
        out.append(dict(sorted(row.items())))
    return pa.Table.from_pylist(out)


def v1_repo(root: Path, model: str = "org__model", stamp: str = V1_STAMP,
            lighteval: bool = False, edit: dict[int, dict] | None = None) -> Path:
    """A downloaded ``details_<model>`` dataset: ``<date>/details_harness|arc:easy|25_<date>``
    and ``...|arc:challenge|25...`` from the committed ARC samples; ``edit``: row -> values."""
    folder = root / f"details_{model}" / stamp
    folder.mkdir(parents=True)
    for task, name in (("arc_easy_local", "arc:easy"), ("arc_challenge_local", "arc:challenge")):
        table = v1_table(samples(MC, task), lighteval=lighteval).to_pylist()
        for row, values in (edit or {}).items():
            table[row].update(values)
        pq.write_table(pa.Table.from_pylist(table),
                       folder / f"details_harness|{name}|25_{stamp}.parquet", row_group_size=3)
    return folder


V1_DOMAIN = [DomainTasks.parse("science=harness_arc_easy_25:harness_arc_challenge_25")]


@pytest.mark.parametrize("lighteval", [False, True])
def test_v1_accuracy_equals_the_files_acc_and_acc_norm(tmp_path: Path, lighteval: bool) -> None:
    folder = v1_repo(tmp_path, lighteval=lighteval)
    for _task, name in (("arc_easy_local", "arc:easy"), ("arc_challenge_local", "arc:challenge")):
        path = folder / f"details_harness|{name}|25_{V1_STAMP}.parquet"
        table = pq.read_table(path).to_pylist()
        metrics = [r["metrics"] if lighteval else r for r in table]
        assert read_task(path, name).verified == ("acc", "acc_norm")
        for normalize, metric in (("none", "acc"), ("chars", "acc_norm")):
            np.testing.assert_array_equal(uq_correct(path, name, normalize),
                                          [m[metric] for m in metrics])
    rs = read_lmeval(V1_DOMAIN, tmp_path, normalize="none", calib_fraction=0.25)
    assert rs.pairs[0].name == "org__model/loglik"
    ids = rs.outputs["org__model/loglik", "science/shift", 0].ids
    assert ids[0] == "harness_arc_challenge_25/0" and len(ids) == 8
    # the raw task name, as a --domains YAML may hold it
    rs = read_lmeval([DomainTasks("science", "harness|arc:easy|25", "harness|arc:challenge|25")],
                     tmp_path, calib_fraction=0.25)
    assert rs.meta["lmeval"]["labels"]["harness|arc:easy|25"]["verified"] == ["acc", "acc_norm"]


def test_v1_disagreeing_row_is_refused_naming_it(tmp_path: Path) -> None:
    """A gold index the row's own acc/acc_norm contradict: refused naming the file, the row
    and the metric, and nothing written."""
    from uqbench import cli

    rows = v1_table(samples(MC, "arc_easy_local")).to_pylist()
    r = rows[3]
    wrong = next(i for i in range(len(r["choices"])) if i != r["gold"])
    v1_repo(tmp_path / "hub", edit={3: {"gold": wrong}})
    out = tmp_path / "out"
    with pytest.raises(UserError, match=r"details_harness\|arc:easy\|25_.*\.parquet, row 3: "
                       r"lm-eval logged acc="):
        read_lmeval(V1_DOMAIN, tmp_path / "hub")
    assert cli.main(["score", str(tmp_path / "hub"), "--out", str(out), "--domain",
                     "science=harness_arc_easy_25:harness_arc_challenge_25"]) == 2
    assert not out.exists()


@pytest.mark.parametrize(("edit", "match"), [
    ({"acc": None, "acc_norm": None}, r"row 0: neither `acc` nor `acc_norm` is logged"),
    ({"predictions": [-1.0]}, r"row 0: 1 predictions for 4 choices"),
    ({"gold": 7}, r"row 0: gold 7 is not an index among the 4 choices"),
    ({"acc": 0.5}, r"row 0: `acc` is 0.5: a probability, not a correctness"),
    ({"predictions": [float("nan")] * 4}, r"row 0: non-finite log-likelihood"),
])
def test_v1_bad_rows_are_refused(tmp_path: Path, edit: dict, match: str) -> None:
    v1_repo(tmp_path, edit={0: edit})
    with pytest.raises(UserError, match=match):
        read_lmeval(V1_DOMAIN, tmp_path)


def test_v1_wrong_schema_is_refused_before_any_row(tmp_path: Path) -> None:
    folder = v1_repo(tmp_path)
    path = folder / f"details_harness|arc:easy|25_{V1_STAMP}.parquet"
    table = pq.read_table(path)
    pq.write_table(table.drop_columns(["predictions", "acc", "acc_norm"]), path)
    with pytest.raises(UserError, match=r"no column predictions, acc or acc_norm or metrics "
                       r"\(its columns: "):
        read_task(path, "harness|arc:easy|25")
    gen = table.to_pylist()  # a generative task: the predictions are text
    for r in gen:
        r["predictions"] = ["The answer is"]
    pq.write_table(pa.Table.from_pylist(gen), path)
    with pytest.raises(UserError, match=r"row 0: `predictions` \['The answer is'\] holds "
                       "something other than log-likelihoods"):
        read_task(path, "harness|arc:easy|25")


def test_v1_mixed_models_and_runs(tmp_path: Path) -> None:
    """Two models' repos under one folder: refused (by folder, and by the results files'
    model names); two runs of one model: the newest, or ``--run``."""
    v1_repo(tmp_path / "two", "org__a")
    v1_repo(tmp_path / "two", "org__b")
    with pytest.raises(UserError, match="in several folders"):
        read_lmeval(V1_DOMAIN, tmp_path / "two")
    a = v1_repo(tmp_path / "mixed", "org__a")
    b = v1_repo(tmp_path / "mixed", "org__b")
    next(b.glob("*arc:easy*")).unlink()
    next(a.glob("*arc:challenge*")).unlink()
    with pytest.raises(UserError, match="different model folders"):
        read_lmeval(V1_DOMAIN, tmp_path / "mixed")
    for repo, model in ((a, "org/a"), (b, "org/b")):
        (repo.parent / f"results_{V1_STAMP}.json").write_text(json.dumps(
            {"config_general": {"model_name": model}, "results": {}}))
    with pytest.raises(UserError, match="different models: .*'org/a'.*'org/b'"):
        read_lmeval(V1_DOMAIN, tmp_path / "mixed")
    later = "2023-09-15T09-53-02.418861"
    v1_repo(tmp_path / "runs", stamp=V1_STAMP)
    v1_repo(tmp_path / "runs", stamp=later, edit={0: {"example": "changed"}})
    new = read_lmeval(V1_DOMAIN, tmp_path / "runs")
    assert new.meta["lmeval"]["files"]["harness_arc_easy_25"].endswith(f"{later}.parquet")
    assert new.meta["lmeval"]["runs_not_read"]["harness_arc_easy_25"] == [V1_STAMP]
    old = read_lmeval(V1_DOMAIN, tmp_path / "runs", runs=["2023-08-19T16:35"])
    assert old.meta["lmeval"]["files"]["harness_arc_easy_25"].endswith(f"{V1_STAMP}.parquet")
    assert old.refs.hashes != new.refs.hashes  # the changed question is another question
