"""The lm-evaluation-harness side of `uqbench score`: a real ``lm_eval --log_samples`` run on a
tiny model (`lmeval_run`, slow) and the small committed copies of such a run in
``tests/data/lmeval/`` (fast), whose format the reader's tests use."""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests import lmeval

MC = lmeval.COMMITTED / "mc"
GEN = lmeval.COMMITTED / "gen"
MI = lmeval.COMMITTED / "mi"


def read_samples(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def one(folder: Path, pattern: str) -> Path:
    (found,) = folder.glob(pattern)
    return found


def assert_samples_match_results(samples: dict[str, Path], results: Path, n: int) -> None:
    """Each task's samples file holds ``n`` documents per filter, and the results' ``M,filter``
    values are the means of the samples' per-document ``M``."""
    res = json.loads(results.read_text())
    for task, path in samples.items():
        rows = read_samples(path)
        filters = sorted({r["filter"] for r in rows})
        assert res["n-samples"][task]["effective"] == n
        for f in filters:
            mine = [r for r in rows if r["filter"] == f]
            assert [r["doc_id"] for r in mine] == list(range(n))
            for metric in mine[0]["metrics"]:
                assert res["results"][task][f"{metric},{f}"] == pytest.approx(
                    np.mean([r[metric] for r in mine]), abs=1e-12)


def test_lmeval_run_logs_20_samples_per_task(lmeval_run) -> None:
    assert set(lmeval_run.samples) == set(lmeval.RUN_TASKS)
    assert_samples_match_results(lmeval_run.samples, lmeval_run.results, 20)
    rows = [r for t in lmeval.MC_TASKS for r in read_samples(lmeval_run.samples[t])]
    # the tiny model's log-likelihoods are not all tied: length normalisation changes answers
    assert any(r["acc"] != r["acc_norm"] for r in rows)


def test_committed_samples_match_their_results() -> None:
    mc = {t: one(MC, f"samples_{t}_*.jsonl") for t in lmeval.MC_TASKS}
    assert_samples_match_results(mc, one(MC, "results_*.json"), 8)
    gen = {lmeval.GEN_TASK: one(GEN, f"samples_{lmeval.GEN_TASK}_*.jsonl")}
    assert_samples_match_results(gen, one(GEN, "results_*.json"), 2)
    mi = {lmeval.MI_TASK: one(MI, f"samples_{lmeval.MI_TASK}_*.jsonl")}
    assert_samples_match_results(mi, one(MI, "results_*.json"), 8)
    assert {r["filter"] for r in read_samples(gen[lmeval.GEN_TASK])} == {
        "strict-match", "flexible-extract"}


def test_committed_mc_metrics_follow_lm_eval_definitions() -> None:
    """What the report of this fixture says of lm-eval 0.4.13, on the committed samples: the
    log-likelihoods are strings in ``filtered_resps[i][0]``, ``target`` is the gold index as a
    string, and acc / acc_norm / acc_bytes are the argmax of the log-likelihoods, divided by
    nothing / the choice's characters / its UTF-8 bytes (without the target delimiter)."""
    differ = 0
    for task in lmeval.MC_TASKS:
        for r in read_samples(one(MC, f"samples_{task}_*.jsonl")):
            ll = np.array([float(x) for x, _greedy in r["filtered_resps"]])
            choices = r["doc"]["choices"]
            assert [a["arg_1"] for a in r["arguments"].values()] == [" " + c for c in choices]
            gold = int(r["target"])
            assert gold == r["doc"]["gold"]
            chars = np.array([len(c) for c in choices])
            nbytes = np.array([len(c.encode()) for c in choices])
            assert r["acc"] == float(np.argmax(ll) == gold)
            assert r["acc_norm"] == float(np.argmax(ll / chars) == gold)
            assert r["acc_bytes"] == float(np.argmax(ll / nbytes) == gold)
            differ += r["acc"] != r["acc_norm"]
    assert differ > 0


def test_committed_files_name_no_machine_path() -> None:
    files = sorted(lmeval.COMMITTED.rglob("*.json*"))
    assert len(files) == 7
    for f in files:
        text = f.read_text()
        for path in (tempfile.gettempdir(), str(Path.home()), str(lmeval.REPO)):
            assert path not in text, (f.name, path)
    for results in (one(MC, "results_*.json"), one(GEN, "results_*.json"),
                    one(MI, "results_*.json")):
        res = json.loads(results.read_text())
        assert res["model_name"] == res["config"]["model_args"]["pretrained"] == "tiny-llama"
        assert res["pretty_env_info"] == lmeval.ENV_INFO_PLACEHOLDER
        for config in res["configs"].values():
            assert config["dataset_kwargs"]["data_files"]["test"].startswith("${UQBENCH_DATA}/")


@pytest.mark.parametrize("task", [*lmeval.MC_TASKS, lmeval.GEN_TASK, lmeval.MI_TASK])
def test_committed_runs_used_the_example_yamls(task: str) -> None:
    """The committed files come from the YAMLs of examples/lmeval as they are now."""
    example = yaml.safe_load((lmeval.TASKS_DIR / f"{task}.yaml").read_text())
    part = next(name for name, (tasks, _) in lmeval.PARTS.items() if task in tasks)
    results = one(lmeval.COMMITTED / part, "results_*.json")
    config = json.loads(results.read_text())["configs"][task]
    assert config["metadata"]["config_source"] == f"examples/lmeval/{task}.yaml"
    for key, value in example.items():
        if key not in ("metadata", "filter_list"):
            assert config[key] == value, key


def test_render_tasks_fills_only_the_data_placeholder(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with pytest.raises(FileNotFoundError, match="arc-easy/llm-foundry_arc_easy_test.jsonl"):
        lmeval.render_tasks(data, tmp_path / "tasks")
    for rel in ("arc-easy/llm-foundry_arc_easy_test.jsonl",
                "arc-challenge/llm-foundry_arc_challenge_test.jsonl", "gsm8k/test.jsonl",
                "winogrande/llm-foundry_winogrande_val.jsonl"):
        (data / rel).parent.mkdir(parents=True, exist_ok=True)
        (data / rel).write_text("{}\n")
    out = lmeval.render_tasks(data, tmp_path / "tasks")
    rendered = {p.stem: yaml.safe_load(p.read_text()) for p in out.glob("*.yaml")}
    assert set(rendered) == {*lmeval.MC_TASKS, lmeval.GEN_TASK, lmeval.MI_TASK}
    for task, config in rendered.items():
        assert Path(config["dataset_kwargs"]["data_files"]["test"]).is_file(), task
    # the regexes' own `$` stay as they are
    assert "\\$" in rendered[lmeval.GEN_TASK]["metric_list"][0]["regexes_to_ignore"]


def test_uqbench_score_of_a_real_lm_eval_run_equals_lm_evals_accuracy(lmeval_run, tmp_path):
    """`uqbench score` on the files of a real lm-eval run: for each normalisation its accuracy
    is lm-eval's own metric (acc, acc_norm, acc_bytes), example for example on the ID part (20%
    held out for calibration) and as the reported aggregate on the shifted task; the run folder
    is complete, and the scorers lm-eval gives no fields for are listed as skipped."""
    from uqbench.run.score_records import ScoreConfig, load_records, score

    folder = lmeval_run.results.parent
    reported = json.loads(lmeval_run.results.read_text())["results"]
    samples = {t: {r["doc_id"]: r for r in read_samples(p)} for t, p in lmeval_run.samples.items()}
    for normalize, metric in (("none", "acc"), ("chars", "acc_norm"), ("bytes", "acc_bytes")):
        rs = load_records(folder, domains=["science=arc_easy_local:arc_challenge_local"],
                          normalize=normalize, calib_fraction=0.25)
        (pair,) = rs.pairs
        for split, task in (("science/id", "arc_easy_local"),
                            ("science/shift", "arc_challenge_local")):
            o = rs.outputs[pair.name, split, 0]
            ours = (o.logits.argmax(axis=1) == o.labels).astype(float)
            theirs = [samples[task][int(i.rsplit("/", 1)[1])][metric] for i in o.ids]
            assert ours.tolist() == theirs, (normalize, split)
        assert len(rs.outputs[pair.name, "science/id", 0].ids) == 15  # 20 - 5 held out
        res = score(rs, ScoreConfig(out=tmp_path / normalize, figures=normalize == "chars"))
        row = next(r for r in res.rows if r["method"] == f"{pair.name}/msp"
                   and r["domain"] == "science")
        assert row["shift_accuracy"] == reported["arc_challenge_local"][f"{metric},none"]
    meta = json.loads((tmp_path / "chars" / "run.json").read_text())
    model = json.loads(lmeval_run.results.read_text())["model_name"]
    assert meta["lmeval"]["normalize"] == "chars" and meta["lmeval"]["model"] == model
    assert {"scorer": "care", "pair": f"{Path(model).name}/loglik-per-char",
            "missing": ["disagreement", "route_entropy"]} in meta["skipped_scorers"]
    assert list((tmp_path / "chars" / "figures").glob("reliability_*.png"))


# -- labels are verified, never guessed ----------------------------------------------------------

def copy_part(part: Path, dest: Path, edit: dict[int, dict] | None = None) -> Path:
    """``part`` (a committed run) copied into ``dest``; ``edit``: line number -> the fields to
    set on that line of every samples file."""
    dest.mkdir(parents=True)
    for src in part.iterdir():
        text = src.read_text()
        if edit and src.name.startswith("samples_"):
            rows = read_samples(src)
            for line, fields in edit.items():
                rows[line - 1].update(fields)
            text = "".join(json.dumps(r) + "\n" for r in rows)
        (dest / src.name).write_text(text)
    return dest


def test_committed_mc_labels_are_the_targets_and_every_metric_is_verified() -> None:
    """The usual task: the label is lm-eval's `target` index, and all three of lm-eval's
    per-sample metrics were recomputed and found equal."""
    from uqbench.io.lmeval import read_task

    for task in lmeval.MC_TASKS:
        path = one(MC, f"samples_{task}_*.jsonl")
        ts = read_task(path, task)
        assert ts.labels.tolist() == [int(r["target"]) for r in read_samples(path)]
        assert not ts.multiple_input and ts.not_verifiable == ()
        assert ts.verified == ("acc", "acc_norm", "acc_bytes")


def test_committed_multiple_input_labels_come_from_acc_and_score_to_lm_evals_accuracy() -> None:
    """WinoGrande as lm-eval runs it logs the shared continuation as `target`: the labels come
    from each sample's `acc` and equal the dataset's gold (the `doc`, which the reader never
    reads); reading the target as text gave every question label 0."""
    from uqbench.io.lmeval import read_task

    path = one(MI, f"samples_{lmeval.MI_TASK}_*.jsonl")
    rows = read_samples(path)
    assert all(r["target"] == r["doc"]["continuation"] for r in rows)
    ts = read_task(path, lmeval.MI_TASK)
    assert ts.multiple_input and ts.verified == () and ts.not_verifiable == ()
    assert ts.labels.tolist() == [r["doc"]["gold"] for r in rows]
    assert set(ts.labels.tolist()) == {0, 1}
    reported = json.loads(one(MI, "results_*.json").read_text())["results"]
    for normalize in ("none", "chars", "bytes"):  # a shared continuation: every one ranks as acc
        acc = float(np.mean(ts.logits(normalize).argmax(1) == ts.labels))
        assert acc == reported[lmeval.MI_TASK]["acc,none"]


@pytest.mark.parametrize(("fields", "match"), [
    ({"acc": 1.0, "acc_norm": 1.0, "acc_bytes": 1.0},
     r"lm-eval logged acc=1 .*likely cause: the `target` is not the gold index"),
    ({"acc_bytes": 1.0}, r"lm-eval logged acc_bytes=1 .*--normalize bytes.*target delimiter"),
])
def test_a_label_lm_evals_own_metric_contradicts_is_an_error_before_any_output(
        tmp_path: Path, fields: dict, match: str) -> None:
    """Line 3 of the committed ARC-Easy run (acc = acc_norm = acc_bytes = 0) with a metric
    flipped: `uqbench score` names the file and the line, and writes nothing."""
    from uqbench import cli
    from uqbench.core.errors import UserError
    from uqbench.io.lmeval import read_task

    (line3,) = [r for r in read_samples(one(MC, "samples_arc_easy_local_*.jsonl"))
                if r["doc_id"] == 2]
    assert (line3["acc"], line3["acc_norm"], line3["acc_bytes"]) == (0, 0, 0)
    src = copy_part(MC, tmp_path / "lm", {3: fields})
    path = one(src, "samples_arc_easy_local_*.jsonl")
    with pytest.raises(UserError, match=rf"samples_arc_easy_local_.*, line 3: {match}"):
        read_task(path, "arc_easy_local")
    out = tmp_path / "scored"
    assert cli.main(["score", str(src), "--out", str(out), "--domain",
                     "science=arc_easy_local:arc_challenge_local", "--no-figures"]) == 2
    assert not out.exists()


def test_multiple_input_gold_left_open_is_refused(tmp_path: Path) -> None:
    """A multiple_input sample determines its gold only through `acc`: acc 1 (the argmax) among
    any number of choices, acc 0 among 2. Three choices with acc 0, or no acc, are refused
    with the reason and the fix."""
    from uqbench.core.errors import UserError
    from uqbench.io.lmeval import read_task

    rows = read_samples(one(MI, f"samples_{lmeval.MI_TASK}_*.jsonl"))

    def third_choice(r: dict) -> dict:
        """``r`` with a third context, less likely than the other two."""
        r = json.loads(json.dumps(r))
        r["arguments"]["gen_args_2"] = {"arg_0": r["arguments"]["gen_args_0"]["arg_0"] + " too",
                                        "arg_1": r["arguments"]["gen_args_0"]["arg_1"]}
        low = str(min(float(x) for x, _ in r["filtered_resps"]) - 1)
        r["filtered_resps"].append([low, "False"])
        return r

    def write(lines: list[dict]) -> Path:
        path = tmp_path / f"{len(list(tmp_path.iterdir()))}" / "samples_w_2026-11-25T10.jsonl"
        path.parent.mkdir()
        path.write_text("".join(json.dumps(r) + "\n" for r in lines))
        return path

    three = [third_choice(r) for r in rows]
    first_wrong = next(i for i, r in enumerate(rows) if r["acc"] == 0)
    right = [r for r in three if r["acc"] == 1]
    ts = read_task(write(right), "w")  # acc 1 determines the gold among 3
    assert ts.labels.tolist() == [r["doc"]["gold"] for r in right] and ts.lls.shape[1] == 3
    with pytest.raises(UserError, match=rf"line {first_wrong + 1}: a multiple_input task .*acc "
                       r"is 0 among 3 choices, which leaves the gold open; score such a task "
                       r"with 2 choices"):
        read_task(write(three), "w")
    # lm-eval's acc_norm of such a task divides by the contexts' lengths (doc_to_choice), which
    # the samples do not hold: listed as not verifiable, never compared
    with_norm = read_task(write([dict(r, acc_norm=1 - r["acc"]) for r in rows]), "w")
    assert with_norm.not_verifiable == ("acc_norm",) and with_norm.verified == ()
    no_acc = [{k: v for k, v in r.items() if k != "acc"} for r in rows]
    with pytest.raises(UserError, match=r"line 1: a multiple_input task .*no per-sample `acc`.*"
                       r"add `- metric: acc` to the task's metric_list"):
        read_task(write(no_acc), "w")


def test_the_id_task_as_its_own_shift_is_refused() -> None:
    from uqbench.core.errors import ConfigError
    from uqbench.io.lmeval import DomainTasks

    with pytest.raises(ConfigError, match="shifted task 'arc_easy' is also its ID task"):
        DomainTasks.parse("c=arc_easy:arc_easy")
    assert DomainTasks.parse("c=arc_easy:arc_challenge").shift == "arc_challenge"


def test_uqbench_score_of_a_real_multiple_input_run_equals_lm_evals_accuracy(lmeval_run,
                                                                              tmp_path):
    """A real lm-eval run of the multiple_input `winogrande_local` as the shifted task: every
    label is the dataset's gold, and uqbench's shift accuracy is lm-eval's aggregated acc (also
    under --normalize chars, which warns that it ranks as acc)."""
    from uqbench.run.score_records import ScoreConfig, load_records, score

    reported = json.loads(lmeval_run.results.read_text())["results"]
    rows = {r["doc_id"]: r for r in read_samples(lmeval_run.samples[lmeval.MI_TASK])}
    domain = [f"science=arc_easy_local:{lmeval.MI_TASK}"]
    with pytest.warns(UserWarning, match=rf"{lmeval.MI_TASK} are multiple_input"):
        chars = load_records(lmeval_run.results.parent, domains=domain, calib_fraction=0.25)
    rs = load_records(lmeval_run.results.parent, domains=domain, normalize="none",
                      calib_fraction=0.25)
    for records in (rs, chars):
        (pair,) = records.pairs
        o = records.outputs[pair.name, "science/shift", 0]
        assert o.labels.tolist() == [rows[int(i.rsplit("/", 1)[1])]["doc"]["gold"]
                                     for i in o.ids]
        assert np.mean(o.logits.argmax(1) == o.labels) == reported[lmeval.MI_TASK]["acc,none"]
    assert rs.meta["lmeval"]["labels"][lmeval.MI_TASK] == {
        "from": "acc (multiple_input)", "multiple_input": True, "verified": [],
        "not_verifiable": [], "samples": 20}
    res = score(rs, ScoreConfig(out=tmp_path / "o", scorers=("msp",), figures=False))
    row = next(r for r in res.rows if r["method"] == f"{rs.pairs[0].name}/msp"
               and r["domain"] == "science")
    assert row["shift_accuracy"] == reported[lmeval.MI_TASK]["acc,none"]
