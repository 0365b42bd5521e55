"""The lm-evaluation-harness side of `uqbench score`: a real ``lm_eval --log_samples`` run on a
tiny model (`lmeval_run`, slow) and the small committed copies of such a run in
``tests/support/fixtures/lmeval/`` (fast), whose format the reader's tests use."""
from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.support import lmeval

MC = lmeval.COMMITTED / "mc"
GEN = lmeval.COMMITTED / "gen"
MI = lmeval.COMMITTED / "mi"
VC = lmeval.COMMITTED / "vc"


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
    vc = {lmeval.VC_TASK: one(VC, f"samples_{lmeval.VC_TASK}_*.jsonl")}
    assert_samples_match_results(vc, one(VC, "results_*.json"), 16)
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
    assert len(files) == 9
    for f in files:
        text = f.read_text()
        for path in (tempfile.gettempdir(), str(Path.home()), str(lmeval.REPO)):
            assert path not in text, (f.name, path)
    for results in (one(MC, "results_*.json"), one(GEN, "results_*.json"),
                    one(MI, "results_*.json"), one(VC, "results_*.json")):
        res = json.loads(results.read_text())
        assert res["model_name"] == res["config"]["model_args"]["pretrained"] == "tiny-llama"
        assert res["pretty_env_info"] == lmeval.ENV_INFO_PLACEHOLDER
        for config in res["configs"].values():
            assert config["dataset_kwargs"]["data_files"]["test"].startswith("${UQBENCH_DATA}/")


@pytest.mark.parametrize("task", [*lmeval.MC_TASKS, lmeval.GEN_TASK, lmeval.MI_TASK,
                                  lmeval.VC_TASK])
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
    assert set(rendered) == {*lmeval.MC_TASKS, lmeval.GEN_TASK, lmeval.MI_TASK, lmeval.VC_TASK}
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
        chars = load_records(lmeval_run.results.parent, domains=domain, normalize="chars",
                             calib_fraction=0.25)
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


# -- questions with 3 to 10 choices (MMLU-Pro-shaped) -------------------------------------------

def test_committed_varying_choice_counts_are_padded_per_question_and_verified() -> None:
    """The committed lm-eval run of ``arc_easy_3to10_local`` (3 to 10 choices): each question
    keeps its own count, the padding is `PAD_LOGIT` (probability exactly 0), and uqbench's
    prediction under each normalisation is lm-eval's own acc/acc_norm/acc_bytes, line for
    line."""
    from uqbench.core.outputs import PAD_LOGIT
    from uqbench.core.probs import softmax
    from uqbench.io.lmeval import read_task

    path = one(VC, f"samples_{lmeval.VC_TASK}_*.jsonl")
    rows = read_samples(path)
    counts = [len(r["filtered_resps"]) for r in rows]
    assert min(counts) == 3 and max(counts) == 10
    ts = read_task(path, lmeval.VC_TASK)
    assert ts.verified == ("acc", "acc_norm", "acc_bytes")
    assert ts.n_choices.tolist() == counts and ts.lls.shape == (16, 10)
    pad = np.arange(10) >= ts.n_choices[:, None]
    assert (ts.lls[pad] == PAD_LOGIT).all() and (ts.lls[~pad] > -1e4).all()
    for normalize, metric in (("none", "acc"), ("chars", "acc_norm"), ("bytes", "acc_bytes")):
        p = softmax(ts.logits(normalize))
        assert (p[pad] == 0).all()
        assert ((p.argmax(1) == ts.labels) == [r[metric] == 1 for r in rows]).all()


def test_varying_choice_counts_score_with_their_true_counts(heavy_compute, tmp_path: Path,
                                                            png_figures) -> None:
    """Scored as an ID task: the accuracy is lm-eval's acc_norm on the ID part, chance is the
    mean of 1/k over the questions' own counts, and no conformal set ever holds a padded
    choice (at q̂ = 1 an LAC or APS set is every real choice)."""
    from uqbench.core.probs import softmax
    from uqbench.run.score_records import ScoreConfig, load_records, score
    from uqbench.stats.conformal import SCORES, prediction_sets

    rows = {r["doc_id"]: r for r in read_samples(one(VC, f"samples_{lmeval.VC_TASK}_*.jsonl"))}
    rs = load_records(lmeval.COMMITTED, domains=[f"v={lmeval.VC_TASK}:arc_challenge_local"],
                      calib_fraction=0.25)
    (pair,) = rs.pairs
    o = rs.outputs[pair.name, "v/id", 0]
    k = np.array([len(rows[int(i.rsplit("/", 1)[1])]["filtered_resps"]) for i in o.ids])
    assert rs.refs.n_choices["v/id"].tolist() == k.tolist() and len(k) == 12
    p = softmax(o.logits)
    pad = np.arange(p.shape[1]) >= k[:, None]
    for name in ("lac", "aps", "raps"):
        sets = prediction_sets(SCORES[name], p, 1.0)
        assert not (sets & pad).any()
        assert name == "raps" or (sets.sum(1) == k).all()  # LAC, APS: every real choice
    res = score(rs, ScoreConfig(out=tmp_path / "o", scorers=("msp",), figures=True))
    row = next(r for r in res.rows if r["method"] == f"{pair.name}/msp" and r["domain"] == "v")
    assert row["accuracy"] == np.mean([rows[int(i.rsplit("/", 1)[1])]["acc_norm"]
                                       for i in o.ids])
    assert all(row[c] <= k.mean() for c in row if c.startswith("cp_") and c.endswith("_size")
               and not math.isnan(row[c]))
    chance = next(r for r in res.rows if r["method"] == "chance" and r["domain"] == "v")
    assert chance["accuracy"] == pytest.approx(np.mean(1 / k), abs=1e-12)
    assert list((tmp_path / "o" / "figures").glob("reliability_*.png"))


def test_uqbench_score_of_a_real_run_with_3_to_10_choices_equals_lm_evals_accuracy(lmeval_run):
    """A real lm-eval run of ``arc_easy_3to10_local``: per sample and in aggregate, uqbench's
    correctness is lm-eval's acc and acc_norm."""
    from uqbench.run.score_records import load_records

    reported = json.loads(lmeval_run.results.read_text())["results"][lmeval.VC_TASK]
    rows = {r["doc_id"]: r for r in read_samples(lmeval_run.samples[lmeval.VC_TASK])}
    assert len({len(r["filtered_resps"]) for r in rows.values()}) > 3
    for normalize, metric in (("none", "acc"), ("chars", "acc_norm")):
        rs = load_records(lmeval_run.results.parent, normalize=normalize,
                          domains=[f"v=arc_easy_local:{lmeval.VC_TASK}"], calib_fraction=0.25)
        o = rs.outputs[rs.pairs[0].name, "v/shift", 0]
        ours = o.logits.argmax(1) == o.labels
        assert ours.tolist() == [rows[int(i.rsplit("/", 1)[1])][metric] == 1 for i in o.ids]
        assert np.mean(ours) == reported[f"{metric},none"]


# -- several runs in one folder ------------------------------------------------------------------

def two_runs(dest: Path, *, other_model: str | None = None) -> tuple[str, str]:
    """The committed ARC run twice in ``dest`` (lm-eval's ``--output_path`` after a rerun): the
    older under its own date, the newer with the first 6 questions only (and, with
    ``other_model``, its results file naming another model). Returns (older, newer) dates."""
    old = one(MC, "results_*.json").stem.removeprefix("results_")
    new = "2026-12-01T09-00-00.000001"
    copy_part(MC, dest)
    for src in MC.iterdir():
        text = src.read_text()
        if src.name.startswith("samples_"):
            text = "".join(line + "\n" for line in text.splitlines()[:6])
        elif other_model:
            text = text.replace('"tiny-llama"', json.dumps(other_model))
        (dest / src.name.replace(old, new)).write_text(text)
    return old, new


def test_several_runs_in_one_folder_read_the_newest_or_the_chosen_one(tmp_path, capsys) -> None:
    """Two runs of each task in one folder: the newest is read by default, printed and recorded
    in run.json; ``--run`` picks the other (by its date or the date's start); a --run that
    matches no run is an error before any output."""
    from uqbench import cli

    old, new = two_runs(tmp_path / "lm")
    domain = ["--domain", "science=arc_easy_local:arc_challenge_local", "--scorers", "msp",
              "--no-figures", "--bootstrap", "20", "--calib-fraction", "0.34"]
    assert cli.main(["score", str(tmp_path / "lm"), "--out", str(tmp_path / "new"), *domain]) == 0
    out = capsys.readouterr().out
    assert f"arc_easy_local: 2 runs under {tmp_path / 'lm'}; reading samples_arc_easy_local_" \
           f"{new}.jsonl (the newest; others: {old}" in out
    meta = json.loads((tmp_path / "new" / "run.json").read_text())["lmeval"]
    assert meta["files"]["arc_challenge_local"].endswith(f"_{new}.jsonl")
    assert meta["runs_not_read"] == {"arc_easy_local": [old], "arc_challenge_local": [old]}
    assert meta["labels"]["arc_easy_local"]["samples"] == 6
    assert cli.main(["score", str(tmp_path / "lm"), "--out", str(tmp_path / "old"),
                     "--run", old[:13], *domain]) == 0
    meta = json.loads((tmp_path / "old" / "run.json").read_text())["lmeval"]
    assert meta["files"]["arc_easy_local"].endswith(f"_{old}.jsonl")
    assert meta["labels"]["arc_easy_local"]["samples"] == 8
    assert cli.main(["score", str(tmp_path / "lm"), "--out", str(tmp_path / "none"),
                     "--run", "2025", *domain]) == 2
    assert "--run 2025 matches 0 of the runs of task 'arc_easy_local'" in capsys.readouterr().err
    assert not (tmp_path / "none").exists()


def test_runs_of_different_models_stay_an_error(tmp_path: Path) -> None:
    """The newer run of one task from another model, the other task's newest from the first:
    refused, as are one task's files in two model folders."""
    from uqbench.core.errors import UserError
    from uqbench.io.lmeval import DomainTasks, read_lmeval

    _, new = two_runs(tmp_path / "lm", other_model="org/other")
    (tmp_path / "lm" / f"samples_arc_challenge_local_{new}.jsonl").unlink()
    dom = [DomainTasks.parse("science=arc_easy_local:arc_challenge_local")]
    with pytest.raises(UserError, match=r"different models: .*'org/other'.*'tiny-llama'"):
        read_lmeval(dom, tmp_path / "lm")
    copy_part(MC, tmp_path / "two" / "a")
    copy_part(MC, tmp_path / "two" / "b")
    with pytest.raises(UserError, match=r"task 'arc_easy_local' in several folders .*point at "
                       "the model's subfolder"):
        read_lmeval(dom, tmp_path / "two")


# -- bad input ------------------------------------------------------------------------------------

def write_lines(folder: Path, task: str, rows: list[dict]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"samples_{task}_2026-11-25T10-00-00.000000.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_acc_mutual_info_samples_are_refused(tmp_path: Path) -> None:
    """A task scored with acc_mutual_info logs 2C log-likelihoods, the last C with an empty
    context (lm-eval 0.4 `ConfigurableTask.construct_requests`): refused, with or without the
    logged metric, rather than read as 2C choices."""
    from uqbench.core.errors import UserError
    from uqbench.io.lmeval import read_task

    rows = read_samples(one(MC, "samples_arc_easy_local_*.jsonl"))
    mi = []
    for r in rows:
        r = json.loads(json.dumps(r))
        n = len(r["arguments"])
        for i in range(n):
            r["arguments"][f"gen_args_{n + i}"] = {"arg_0": "",
                                                  "arg_1": r["arguments"][f"gen_args_{i}"]["arg_1"]}
        r["filtered_resps"] += [["-20.5", "False"]] * n
        mi.append(r)
    for name, lines in (("logged", [dict(r, acc_mutual_info=0.0) for r in mi]), ("bare", mi)):
        with pytest.raises(UserError, match=r"line 1: a task scored with acc_mutual_info: its 8 "
                           r"log-likelihoods are 4 conditional .*drop acc_mutual_info"):
            read_task(write_lines(tmp_path / name, "t", lines), "t")


def test_bad_choice_counts_are_errors_naming_the_line(tmp_path: Path) -> None:
    """One choice, a log-likelihood at the padding logit, and a member whose questions have
    other choice counts are errors before any output."""
    from uqbench.core.errors import UserError
    from uqbench.core.outputs import PAD_LOGIT
    from uqbench.io.lmeval import DomainTasks, read_lmeval, read_task

    rows = read_samples(one(VC, f"samples_{lmeval.VC_TASK}_*.jsonl"))
    single = json.loads(json.dumps(rows[1]))
    single["arguments"] = {"gen_args_0": single["arguments"]["gen_args_0"]}
    single["filtered_resps"] = single["filtered_resps"][:1]
    with pytest.raises(UserError, match=r"line 2: 1 choice \(doc_id 1\): nothing to choose"):
        read_task(write_lines(tmp_path / "one", "t", [rows[0], single]), "t")
    low = json.loads(json.dumps(rows[2]))
    low["filtered_resps"][0][0] = str(PAD_LOGIT)
    with pytest.raises(UserError, match=r"line 3: a log-likelihood -1e\+09 at or below"):
        read_task(write_lines(tmp_path / "low", "t", rows[:2] + [low]), "t")
    # a member of the same questions whose question 0 lost its last choice
    fewer = json.loads(json.dumps(next(r for r in rows if r["acc"] == r["acc_norm"] ==
                                       r["acc_bytes"] == 0 and r["target"] != "0")))
    n = len(fewer["filtered_resps"])
    fewer["filtered_resps"][0][0] = "0.0"  # choice 0, not the gold, is everyone's prediction
    del fewer["arguments"][f"gen_args_{n - 1}"]
    fewer["filtered_resps"].pop()
    copy_part(VC, tmp_path / "main")
    copy_part(MC, tmp_path / "main" / "mc")
    member = copy_part(MC, tmp_path / "member")
    write_lines(member, lmeval.VC_TASK, [fewer if r["doc_id"] == fewer["doc_id"] else r
                                         for r in rows])
    # the results file of the member's run, under its date
    (member / "results_2026-11-25T10-00-00.000000.json").write_text(
        one(VC, "results_*.json").read_text())
    dom = [DomainTasks.parse(f"v={lmeval.VC_TASK}:arc_easy_local")]
    with pytest.raises(UserError, match="other questions than"):
        read_lmeval(dom, tmp_path / "main", members=[member])


# -- the accuracy printed is one lm-eval logged ---------------------------------------------------

def acc_only(part: Path, dest: Path, tasks: tuple[str, ...]) -> Path:
    """``part`` copied to ``dest`` with ``tasks`` as truthfulqa_mc1 logs itself: per-sample
    and aggregated ``acc`` only (no ``acc_norm``/``acc_bytes``)."""
    copy_part(part, dest)
    for f in dest.iterdir():
        if f.name.startswith("samples_") and any(f"samples_{t}_" in f.name for t in tasks):
            rows = [{k: v for k, v in r.items() if k not in ("acc_norm", "acc_bytes")}
                    for r in read_samples(f)]
            f.write_text("".join(json.dumps(r) + "\n" for r in rows))
        elif f.name.startswith("results_"):
            res = json.loads(f.read_text())
            for t in tasks:
                res["results"][t] = {k: v for k, v in res["results"][t].items()
                                     if not k.startswith(("acc_norm", "acc_bytes"))}
            f.write_text(json.dumps(res))
    return dest


def test_auto_normalize_takes_the_metric_every_task_of_the_domain_logs(tmp_path: Path) -> None:
    """--normalize auto: acc_norm where each task of the domain logs it (ARC), acc where one
    task logs only acc (truthfulqa_mc1-like), per domain; the gate name says which, and the
    accuracy check puts lm-eval's logged value beside uqbench's (equal on the shift task and
    over all of a file's questions)."""
    from uqbench.io.lmeval import DomainTasks, read_lmeval

    dom = [DomainTasks.parse("science=arc_easy_local:arc_challenge_local")]
    both = read_lmeval(dom, MC, calib_fraction=0.25)
    assert both.pairs[0].name == "tiny-llama/loglik-per-char"
    assert both.meta["lmeval"]["metric"] == {"science": "acc_norm"}
    assert both.meta["lmeval"]["lm_eval_version"] == "0.4.13"
    res = json.loads(one(MC, "results_*.json").read_text())["results"]
    for c in both.meta["lmeval"]["accuracy"]:
        assert c["metric"] == "acc_norm" and c["lm_eval_from"] == "results file"
        assert c["lm_eval"] == res[c["task"]]["acc_norm,none"] == c["uqbench_all"]
    shift = next(c for c in both.meta["lmeval"]["accuracy"] if c["split"] == "science/shift")
    assert shift["uqbench"] == shift["lm_eval"] and shift["questions"] == shift["of"] == 8
    idc = next(c for c in both.meta["lmeval"]["accuracy"] if c["split"] == "science/id")
    assert (idc["questions"], idc["of"]) == (6, 8)

    mixed = acc_only(MC, tmp_path / "mixed", ("arc_challenge_local",))
    rs = read_lmeval(dom, mixed, calib_fraction=0.25)
    assert rs.pairs[0].name == "tiny-llama/loglik" and rs.meta["lmeval"]["metric"] == {
        "science": "acc"}
    o = rs.outputs[rs.pairs[0].name, "science/shift", 0]
    rows = {r["doc_id"]: r for r in read_samples(one(mixed, "samples_arc_challenge_local_*"))}
    assert (o.logits.argmax(1) == o.labels).tolist() == [
        rows[int(i.rsplit("/", 1)[1])]["acc"] == 1 for i in o.ids]
    for c in rs.meta["lmeval"]["accuracy"]:
        assert c["metric"] == "acc" and c["lm_eval"] == res[c["task"]]["acc,none"]

    # two domains: each its own metric, both in the gate's name
    two = read_lmeval([*dom, DomainTasks.parse("tq=arc_challenge_local:arc_easy_local")],
                      acc_only(MC, tmp_path / "tq", ("arc_challenge_local",)),
                      calib_fraction=0.25)
    assert two.meta["lmeval"]["metric"] == {"science": "acc", "tq": "acc"}
    sep = acc_only(MC, tmp_path / "sep", ())
    assert read_lmeval(dom, sep, calib_fraction=0.25).meta["lmeval"]["not_logged"] == {}


def test_a_normalisation_a_task_does_not_log_warns_and_is_recorded(tmp_path: Path) -> None:
    """--normalize chars on a task that logs only acc: scored as asked, with a warning naming
    the task and what it logs, and run.json lmeval.not_logged; its lm-eval value is absent."""
    from uqbench.io.lmeval import DomainTasks, read_lmeval

    src = acc_only(MC, tmp_path / "lm", ("arc_challenge_local",))
    dom = [DomainTasks.parse("science=arc_easy_local:arc_challenge_local")]
    with pytest.warns(UserWarning, match=r"lm-eval logged no acc_norm for arc_challenge_local "
                      r"\(it logs acc\): under --normalize chars"):
        rs = read_lmeval(dom, src, normalize="chars", calib_fraction=0.25)
    assert rs.pairs[0].name == "tiny-llama/loglik-per-char"
    assert rs.meta["lmeval"]["not_logged"] == {"arc_challenge_local": "acc_norm"}
    shift = next(c for c in rs.meta["lmeval"]["accuracy"] if c["split"] == "science/shift")
    assert shift["lm_eval"] is None and shift["lm_eval_from"] is None


def test_the_report_shows_lm_evals_accuracy_beside_uqbenchs(tmp_path: Path) -> None:
    from uqbench.reporting.html import render_report
    from uqbench.run.score_records import ScoreConfig, load_records, score

    rs = load_records(MC, domains=["science=arc_easy_local:arc_challenge_local"],
                      calib_fraction=0.25)
    score(rs, ScoreConfig(out=tmp_path / "o", scorers=("msp",), figures=False, bootstrap=20))
    page = render_report(tmp_path / "o")
    assert "<h1>uqbench: tiny-llama scored from lm-eval 0.4.13</h1>" in page
    assert "accuracy as acc_norm" in page and "ID arc_easy_local, shift arc_challenge_local" in page
    table = page[page.index('class="lmeval-accuracy"'):]
    table = table[:table.index("</table>")]
    assert table.count("<tr data-split=") == 2 and "arc_challenge_local" in table
    # nothing was trained: no Learned column, no word on what training added
    assert "Learned" not in page and "training add" not in page
    printed = (tmp_path / "o" / "results.md").read_text()
    assert "| Learned |" not in printed


# -- refused, naming the task and why -------------------------------------------------------------

def test_a_samples_file_of_an_unknown_model_is_never_given_another_runs_model(tmp_path, capsys):
    """One model's ARC-Easy samples copied without their results file, beside another run (of
    another task) whose results file names its model: refused, not scored as that model;
    --model-name scores them, saying so."""
    from uqbench.core.errors import UserError
    from uqbench.io.lmeval import DomainTasks, read_lmeval

    src = tmp_path / "lm"
    src.mkdir()
    path = one(MC, "samples_arc_easy_local_*.jsonl")
    (src / path.name).write_text(path.read_text())
    for f in VC.iterdir():
        (src / f.name).write_text(f.read_text())
    dom = [DomainTasks.parse(f"v=arc_easy_local:{lmeval.VC_TASK}")]
    with pytest.raises(UserError, match=r"samples_arc_easy_local_.*cannot be established: no "
                       r"results file of its run .*not assumed to be 'tiny-llama'.*--model-name"):
        read_lmeval(dom, src, calib_fraction=0.25)
    rs = read_lmeval(dom, src, calib_fraction=0.25, model_name="mine")
    assert rs.pairs[0].name == "mine/loglik-per-char"
    assert "arc_easy_local: no results file of its run names the model; scored as " \
           "--model-name 'mine' says" in capsys.readouterr().out


def test_a_results_file_of_another_date_never_names_the_samples_model(tmp_path: Path) -> None:
    """Samples whose own results file is missing beside a results file of another date (another
    run, here of another model): that file is not read as theirs; the model stays unknown
    (named after the folder, recorded as None) and lm-eval's logged accuracy comes from the
    samples themselves."""
    from uqbench.io.lmeval import DomainTasks, read_lmeval

    src = tmp_path / "my-model"
    copy_part(MC, src)
    res = one(src, "results_*.json")
    doc = json.loads(res.read_text())
    doc.update(model_name="org/other",
               config={**doc["config"], "model_args": "pretrained=org/other"})
    res.unlink()
    (src / "results_2026-12-01T09-00-00.000001.json").write_text(json.dumps(doc))
    rs = read_lmeval([DomainTasks.parse("science=arc_easy_local:arc_challenge_local")], src,
                     calib_fraction=0.25)
    assert rs.pairs[0].name == "my-model/loglik-per-char"
    assert rs.meta["lmeval"]["model"] is None and rs.meta["lmeval"]["lm_eval_version"] is None
    assert {c["lm_eval_from"] for c in rs.meta["lmeval"]["accuracy"]} == {
        "mean of the samples' acc_norm"}


def test_tasks_that_are_not_single_answer_multiple_choice_are_refused(tmp_path: Path) -> None:
    """truthfulqa_mc2-style samples (acc a probability), a generate_until task its results
    file declares, and generate_until / loglikelihood_rolling samples without one: each
    refused naming the task (its file) and why."""
    from uqbench.core.errors import UserError
    from uqbench.io.lmeval import DomainTasks, read_lmeval, read_task

    rows = read_samples(one(MC, "samples_arc_easy_local_*.jsonl"))
    mc2 = [dict(r, acc=0.5 + r["doc_id"] / 100, target="0") for r in rows]
    mc2[0]["acc"] = 1.0  # the first lines may look like a correctness
    with pytest.raises(UserError, match=r"samples_truthfulqa_mc2_.*line 2: `acc` is 0.51: a "
                       r"probability.*truthfulqa_mc2-style.*score truthfulqa_mc1 instead"):
        read_task(write_lines(tmp_path / "mc2", "truthfulqa_mc2", mc2), "truthfulqa_mc2")
    both = copy_part(MC, tmp_path / "both")
    for f in GEN.iterdir():
        (both / f.name).write_text(f.read_text())
    with pytest.raises(UserError, match=rf"task '{lmeval.GEN_TASK}' is a generate_until task "
                       r"\(results_.*says so\): it generates text"):
        read_lmeval([DomainTasks.parse(f"m=arc_easy_local:{lmeval.GEN_TASK}")], both)
    gen = read_samples(one(GEN, "samples_*.jsonl"))
    with pytest.raises(UserError, match=r"samples_g_.*line 1: `filtered_resps` holds generated "
                       r"text: this is a generate_until task"):
        read_task(write_lines(tmp_path / "gen", "g", gen), "g")
    rolling = [{"doc_id": 0, "doc": {"page": "text"}, "target": "", "arguments": {
        "gen_args_0": {"arg_0": "text", "arg_1": None}}, "resps": [[-1234.5]],
        "filtered_resps": [-1234.5], "word_perplexity": [-1234.5, 2]}]
    with pytest.raises(UserError, match=r"samples_wikitext_.*line 1: `filtered_resps` holds one "
                       r"number per document: this is a loglikelihood_rolling task"):
        read_task(write_lines(tmp_path / "roll", "wikitext", rolling), "wikitext")


@pytest.mark.parametrize("kind, why", [
    ("loglikelihood", "the log-likelihood of one continuation per document, not one per choice"),
    ("loglikelihood_rolling", "one log-likelihood of a whole text per document")])
def test_a_task_its_results_file_declares_not_multiple_choice_is_refused(tmp_path, kind, why):
    """A results file declaring a task's output_type loglikelihood (LAMBADA-style: one
    continuation) or loglikelihood_rolling (perplexity): refused naming the task and why,
    before any output."""
    from uqbench.core.errors import UserError
    from uqbench.io.lmeval import DomainTasks, read_lmeval

    src = copy_part(MC, tmp_path / "lm")
    res = one(src, "results_*.json")
    doc = json.loads(res.read_text())
    doc["configs"]["arc_challenge_local"]["output_type"] = kind
    res.write_text(json.dumps(doc))
    with pytest.raises(UserError, match=rf"task 'arc_challenge_local' is a {kind} task "
                       rf"\(results_.*says so\): it logs {why}.*drop it from --domain"):
        read_lmeval([DomainTasks.parse("s=arc_easy_local:arc_challenge_local")], src)


# -- warned where a number means nothing ----------------------------------------------------------

def test_mixed_choice_counts_shots_and_limit_runs_warn_and_show_in_the_report(tmp_path):
    """HellaSwag-like ID (4 choices) against a WinoGrande-like shift (2), a shift run 25-shot
    against a 0-shot ID, and --limit runs: each a warning naming the domain, the tasks and the
    columns, in run.json lmeval.warnings and as a banner of the report."""
    from uqbench.io.lmeval import DomainTasks, read_lmeval
    from uqbench.reporting.html import render_report
    from uqbench.run.score_records import ScoreConfig, score

    both = copy_part(MC, tmp_path / "lm")
    for f in MI.iterdir():
        (both / f.name).write_text(f.read_text())
    res = one(both, "results_2026-11-25*.json")
    doc = json.loads(res.read_text())
    doc["n-shot"]["arc_challenge_local"] = 25
    res.write_text(json.dumps(doc))
    doms = [DomainTasks.parse(f"w=arc_easy_local:{lmeval.MI_TASK}"),
            DomainTasks.parse("s=arc_easy_local:arc_challenge_local")]
    with pytest.warns(UserWarning) as caught:
        rs = read_lmeval(doms, both, calib_fraction=0.25)
    said = " | ".join(str(w.message) for w in caught)
    assert (f"domain w: ID task arc_easy_local has 4 choices per question, shift task "
            f"{lmeval.MI_TASK} 2: OOD-AUROC, AUPR-out and FPR95 of every scorer") in said
    assert "domain s: ID task arc_easy_local ran 0-shot, shift task arc_challenge_local " \
           "25-shot" in said
    assert "domain s: task arc_challenge_local ran on a --limit subset (8 of 1172 " in said
    kinds = {(w["domain"], w["kind"]): w for w in rs.meta["lmeval"]["warnings"]}
    assert set(kinds) == {("w", "choices"), ("w", "limit"), ("s", "n-shot"), ("s", "limit")}
    assert kinds["w", "choices"]["tasks"] == ["arc_easy_local", lmeval.MI_TASK]
    assert kinds["w", "choices"]["columns"] == ["ood_auroc", "aupr_out", "fpr95"]
    score(rs, ScoreConfig(out=tmp_path / "o", scorers=("msp",), figures=False, bootstrap=20))
    page = render_report(tmp_path / "o")
    assert page.count('data-part="lmeval-warning"') == len(rs.meta["lmeval"]["warnings"]) == 6
    assert page.index('data-part="lmeval-warning"') < page.index('id="summary"')


# -- simple_evaluate results saved with json.dump -------------------------------------------------

def dump_of(part: Path, dest: Path, tasks: tuple[str, ...] | None = None, **edit) -> Path:
    """``part``'s results and samples as ``lm_eval.simple_evaluate(log_samples=True)`` returns
    them (one dict: ``results``, ``configs``, ``config``, ... and ``samples: {task: [...]}``),
    saved with ``json.dump`` at ``dest``; ``edit``: top-level keys to set."""
    doc = json.loads(one(part, "results_*.json").read_text())
    doc["samples"] = {t: read_samples(one(part, f"samples_{t}_*.jsonl"))
                      for t in tasks or tuple(doc["configs"])}
    doc.update(date=1764107660.0, **edit)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with dest.open("w") as f:
        json.dump(doc, f)
    return dest


def test_a_simple_evaluate_dump_reads_as_its_samples_files(tmp_path: Path) -> None:
    """One dump of two tasks under any name, two dumps of one task each, and a dump file given
    as the source: the same records as the samples files, every metric verified."""
    from uqbench.io.lmeval import DomainTasks, read_lmeval
    from uqbench.run.score_records import load_models

    dom = [DomainTasks.parse("science=arc_easy_local:arc_challenge_local")]
    ref = read_lmeval(dom, MC, calib_fraction=0.25)
    one_file = dump_of(MC, tmp_path / "a" / "my eval.json").parent
    two_files = tmp_path / "b"
    dump_of(MC, two_files / "easy.json", ("arc_easy_local",))
    dump_of(MC, two_files / "sub" / "challenge.json", ("arc_challenge_local",))
    for src in (one_file, two_files, one_file / "my eval.json"):
        rs = load_models([src], domains=["science=arc_easy_local:arc_challenge_local"],
                         calib_fraction=0.25)
        assert rs.pairs[0].name == "tiny-llama/loglik-per-char", src
        assert rs.meta["lmeval"]["labels"]["arc_easy_local"]["verified"] == [
            "acc", "acc_norm", "acc_bytes"]
        for key, o in ref.outputs.items():
            np.testing.assert_array_equal(rs.outputs[key].ids, o.ids)
            np.testing.assert_array_equal(rs.outputs[key].labels, o.labels)
            np.testing.assert_array_equal(rs.outputs[key].logits, o.logits)
        assert [c["lm_eval"] for c in rs.meta["lmeval"]["accuracy"]] == [
            c["lm_eval"] for c in ref.meta["lmeval"]["accuracy"]]


def test_a_dump_of_two_tasks_without_a_domain_scores_each_its_own_samples(
        tmp_path: Path) -> None:
    """No --domain on one `simple_evaluate` dump holding both tasks: each task's domain holds
    that task's records (the samples files' own), not the other task's from the same file."""
    from uqbench.run.score_records import load_models

    ref = load_models([MC], calib_fraction=0.25)
    rs = load_models([dump_of(MC, tmp_path / "lm" / "results.json")], calib_fraction=0.25)
    assert set(rs.outputs) == set(ref.outputs)
    for key, o in ref.outputs.items():
        np.testing.assert_array_equal(rs.outputs[key].ids, o.ids)
        np.testing.assert_array_equal(rs.outputs[key].logits, o.logits)
    assert [(c["split"], c["task"]) for c in rs.meta["lmeval"]["accuracy"]] == [
        ("arc_challenge_local/id", "arc_challenge_local"), ("arc_easy_local/id", "arc_easy_local")]


def test_dumps_of_two_models_in_one_folder_are_two_models(tmp_path: Path) -> None:
    from uqbench.run.score_records import load_models

    dump_of(MC, tmp_path / "lm" / "base.json")
    res = json.loads(one(MC, "results_*.json").read_text())
    dump_of(MC, tmp_path / "lm" / "tuned.json", config={**res["config"], "model_args": {
        "pretrained": "org/tuned", "dtype": "float32"}}, model_name="org/tuned")
    rs = load_models([tmp_path / "lm"], domains=["science=arc_easy_local:arc_challenge_local"],
                     calib_fraction=0.25)
    assert [p.name for p in rs.pairs] == ["tiny-llama/loglik-per-char",
                                          "org/tuned/loglik-per-char"]


def test_a_folder_with_nothing_readable_lists_what_it_found(tmp_path: Path) -> None:
    from uqbench.core.errors import UserError
    from uqbench.io.lmeval import DomainTasks, read_lmeval

    src = tmp_path / "lm"
    src.mkdir()
    res = one(MC, "results_*.json")
    (src / res.name).write_text(res.read_text())
    dump_of(MC, src / "no-samples.json", ())
    doc = json.loads((src / "no-samples.json").read_text())
    del doc["samples"]
    (src / "no-samples.json").write_text(json.dumps(doc))
    dump_of(MC, src / "other.json", ("arc_challenge_local",))
    (src / "notes.json").write_text('{"a": 1}')
    with pytest.raises(UserError, match=r"no samples file of task 'arc_easy_local'.* found: "
                       r"no-samples.json: a simple_evaluate result without samples \(call it "
                       r"with log_samples=True\); notes.json: not lm-eval output; other.json: a "
                       r"simple_evaluate result with samples of arc_challenge_local; results_"
                       r".*: a results file \(aggregates only"):
        read_lmeval([DomainTasks.parse("science=arc_easy_local:arc_challenge_local")], src)


def test_uqbench_score_of_a_real_simple_evaluate_dump_equals_lm_evals_metrics(lmeval_dump,
                                                                              tmp_path):
    """A real ``simple_evaluate(log_samples=True)`` result of the tiny model saved with
    ``json.dump``: scored to lm-eval's own acc_norm, per sample on ID and as the aggregate on
    the shift task."""
    from uqbench.run.score_records import ScoreConfig, load_models, score

    (path,) = lmeval_dump.glob("*.json")
    with path.open() as f:
        doc = json.load(f)
    rs = load_models([lmeval_dump], domains=["science=arc_easy_local:arc_challenge_local"],
                     calib_fraction=0.25)
    (pair,) = rs.pairs
    assert pair.name == f"{Path(lmeval_dump.parent / 'model').name}/loglik-per-char"
    rows = {r["doc_id"]: r for r in doc["samples"]["arc_easy_local"]}
    o = rs.outputs[pair.name, "science/id", 0]
    assert (o.logits.argmax(1) == o.labels).tolist() == [
        rows[int(i.rsplit("/", 1)[1])]["acc_norm"] == 1 for i in o.ids]
    res = score(rs, ScoreConfig(out=tmp_path / "o", scorers=("msp",), figures=False,
                                bootstrap=20))
    row = next(r for r in res.rows if r["method"] == f"{pair.name}/msp"
               and r["domain"] == "science")
    assert row["shift_accuracy"] == doc["results"]["arc_challenge_local"]["acc_norm,none"]


# -- each writer's exact schema -----------------------------------------------------------------

def as_043(row: dict) -> dict:
    """A sample as lm-eval 0.4.3's EvaluationTracker wrote it: ``gen_args_i`` dicts and
    stringified resps as later, but ``target`` still the int doc_to_target gave (str() from
    0.4.4 on)."""
    return {**row, "target": int(row["target"])}


def as_returned(row: dict) -> dict:
    """A sample as ``simple_evaluate`` returns it (any 0.4 version) and ``json.dump`` saves it:
    the evaluator's own record, before the tracker sanitises it: ``arguments`` the requests'
    (context, continuation) tuples, as lists; ``resps``/``filtered_resps`` numbers and booleans."""
    return {**row, "arguments": [[a["arg_0"], a["arg_1"]] for a in row["arguments"].values()],
            "resps": [[[float(x), g == "True"]] for (x, g), in row["resps"]],
            "filtered_resps": [[float(x), g == "True"] for x, g in row["filtered_resps"]],
            "target": int(row["target"])}


def results_042(doc: dict) -> dict:
    """A results dict as lm-eval 0.4.0-0.4.2 made it: no ``higher_is_better``, ``n-samples``,
    ``model_name`` or ``lm_eval_version``; ``config.model_args`` the CLI's string."""
    old = {k: v for k, v in doc.items() if k not in (
        "higher_is_better", "n-samples", "model_name", "model_name_sanitized",
        "lm_eval_version", "date", "start_time", "end_time", "total_evaluation_time_seconds")}
    return {**old, "config": {**doc["config"], "model_args": "pretrained=tiny-llama,dtype=float32"}}


@pytest.mark.parametrize("writer", ["0.4.3 jsonl", "0.4.4-0.4.13 jsonl", "0.4.13 dump",
                                    "0.4.0-0.4.2 dump"])
def test_each_writers_schema_reads_as_the_same_samples(tmp_path: Path, writer: str) -> None:
    """The committed 0.4.13 run rewritten in each writer's schema (lm-eval's source history:
    the tracker's jsonl from 0.4.3, ``str(target)`` from 0.4.4; ``simple_evaluate``'s return
    value saved with json.dump, whose samples the tracker never sanitised; 0.4.0-0.4.2's
    results keys): the same labels and log-likelihoods, every logged metric verified, and
    lm-eval's logged accuracy beside uqbench's."""
    from uqbench.io.lmeval import DomainTasks, read_lmeval

    src = tmp_path / "tiny-llama"
    res_path = one(MC, "results_*.json")
    doc = json.loads(res_path.read_text())
    rows = {t: read_samples(one(MC, f"samples_{t}_*.jsonl")) for t in lmeval.MC_TASKS}
    if writer.endswith("jsonl"):
        copy_part(MC, src)
        if writer.startswith("0.4.3"):
            for t, rs in rows.items():
                one(src, f"samples_{t}_*.jsonl").write_text(
                    "".join(json.dumps(as_043(r)) + "\n" for r in rs))
    else:
        dumped = {**(doc if writer.startswith("0.4.13") else results_042(doc)),
                  "samples": {t: [as_returned(r) for r in rs] for t, rs in rows.items()}}
        src.mkdir()
        (src / "eval.json").write_text(json.dumps(dumped))
    dom = [DomainTasks.parse("science=arc_easy_local:arc_challenge_local")]
    ref = read_lmeval(dom, MC, calib_fraction=0.25)
    rs = read_lmeval(dom, src, calib_fraction=0.25)
    assert rs.pairs[0].name == "tiny-llama/loglik-per-char"
    for t in lmeval.MC_TASKS:
        assert rs.meta["lmeval"]["labels"][t]["verified"] == ["acc", "acc_norm", "acc_bytes"]
    for key, o in ref.outputs.items():
        np.testing.assert_array_equal(rs.outputs[key].labels, o.labels)
        np.testing.assert_array_equal(rs.outputs[key].logits, o.logits)
    checks = {c["split"]: c for c in rs.meta["lmeval"]["accuracy"]}
    shift = checks["science/shift"]
    assert shift["lm_eval"] == doc["results"]["arc_challenge_local"]["acc_norm,none"] \
        == shift["uqbench"] and shift["lm_eval_from"] == "results file"


def bf16(x: float) -> float:
    """``x`` rounded toward zero to bfloat16 (the top 16 bits of its float32)."""
    bits = np.array([x], dtype=np.float32).view(np.uint32) & np.uint32(0xFFFF0000)
    return float(bits.view(np.float32)[0])


def test_bf16_ties_are_broken_as_lm_eval_breaks_them(tmp_path: Path) -> None:
    """Log-likelihoods of a bf16 model tie exactly (8 bits of mantissa): lm-eval's prediction
    is the first of the tied choices (numpy's argmax), and so is uqbench's; the logged acc is
    verified on every sample and the accuracy is lm-eval's, tie or not."""
    from uqbench.io.lmeval import read_task

    rows = read_samples(one(MC, "samples_arc_easy_local_*.jsonl"))
    tied = []
    for k, r in enumerate(rows):
        r = {key: v for key, v in r.items() if key not in ("acc_norm", "acc_bytes")}
        gold = int(r["target"])
        lls = [float(x) for x, _ in r["filtered_resps"]]
        other = (gold + 1) % len(lls) if k % 2 else (gold - 1) % len(lls)
        lls = [bf16(x) for x in lls]
        lls[gold] = lls[other] = bf16(max(lls) + 0.5)   # the two best tie exactly
        r["filtered_resps"] = [[repr(x), "False"] for x in lls]
        r["acc"] = float(int(np.argmax(lls)) == gold)  # lm-eval: the first of the tied ones
        tied.append(r)
    path = write_lines(tmp_path, "arc_easy_local", tied)
    ts = read_task(path, "arc_easy_local")
    assert ts.verified == ("acc",)
    correct = ts.logits("none").argmax(1) == ts.labels
    assert correct.tolist() == [r["acc"] == 1 for r in tied]
    assert 0 < correct.mean() < 1   # gold first in half the ties, second in the other half


def test_without_a_domain_the_known_pairs_are_named_and_auto_forms_them(tmp_path, capsys):
    """No --domain: each task is scored alone and the known ID -> shift pairs (ARC-Easy ->
    Challenge) are named with how to score them; --domain auto scores them; tasks of no known
    pair are refused by auto."""
    from uqbench.core.errors import ConfigError
    from uqbench.io.lmeval import NO_SHIFT, known_pairs
    from uqbench.run.score_records import load_records

    alone = load_records(MC, calib_fraction=0.25)
    assert alone.meta["lmeval"]["domains"] == {t: {"id": t, "shift": None, "calib": None}
                                               for t in ("arc_challenge_local", "arc_easy_local")}
    assert alone.meta["lmeval"]["no_shift"]["reason"] == NO_SHIFT
    assert not any(split.endswith("/shift") for _, split, _ in alone.outputs)
    assert "known ID -> shift pairs: arc_easy_local=arc_easy_local:arc_challenge_local; " \
        "--domain auto scores them with the shift columns" in capsys.readouterr().out
    rs = load_records(MC, domains=["auto"], calib_fraction=0.25)
    assert rs.meta["lmeval"]["domains"] == {"arc_easy_local": {
        "id": "arc_easy_local", "shift": "arc_challenge_local", "calib": None}}
    assert "--domain auto: arc_easy_local=arc_easy_local:arc_challenge_local" in \
        capsys.readouterr().out
    assert [(d.id, d.shift) for d in known_pairs(
        ["mmlu_high_school_physics", "mmlu_college_physics", "mmlu_anatomy",
         "leaderboard_bbh_logical_deduction_three_objects",
         "leaderboard_bbh_logical_deduction_seven_objects"])] == [
        ("mmlu_high_school_physics", "mmlu_college_physics"),
        ("leaderboard_bbh_logical_deduction_three_objects",
         "leaderboard_bbh_logical_deduction_seven_objects")]
    with pytest.raises(ConfigError, match=r"--domain auto: the tasks of .* \(winogrande_local\) "
                       r"form no known ID -> shift pair"):
        load_records(MI, domains=["auto"])


def test_the_pairs_line_names_what_auto_forms_or_that_it_forms_none() -> None:
    """`pairs_line`: the known pairs of the tasks as --domain would take them, and --domain
    auto; or none, with the families it knows and how to pair by hand."""
    from uqbench.io.lmeval import pairs_line

    assert pairs_line(["mmlu_college_physics", "mmlu_high_school_physics", "arc_easy",
                       "arc_challenge", "mmlu_anatomy"]) == (
        "known ID -> shift pairs: mmlu_high_school_physics=mmlu_high_school_physics:"
        "mmlu_college_physics arc_easy=arc_easy:arc_challenge; --domain auto scores them with "
        "the shift columns")
    line = pairs_line(["winogrande", "arc_challenge"])
    assert line.startswith("known ID -> shift pairs: none among these tasks (ARC-Easy -> "
                           "Challenge") and "--domain NAME=ID:SHIFT" in line


def test_without_a_domain_other_tasks_are_left_out_by_name(tmp_path, capsys) -> None:
    """No --domain on a folder with a generate_until task beside MC tasks: it is left out with
    one line naming it and why (run.json lmeval.left_out); a folder of none but it is refused."""
    from uqbench.core.errors import UserError
    from uqbench.run.score_records import load_records

    both = tmp_path / "both"
    both.mkdir()
    for part in (MC, GEN):
        for f in part.iterdir():
            (both / f.name).write_bytes(f.read_bytes())
    rs = load_records(both, calib_fraction=0.25)
    assert list(rs.meta["lmeval"]["left_out"]) == ["gsm8k_local"]
    assert "generate_until" in rs.meta["lmeval"]["left_out"]["gsm8k_local"]
    assert "--domain" not in rs.meta["lmeval"]["left_out"]["gsm8k_local"]  # none was given
    out = capsys.readouterr().out
    assert [line for line in out.splitlines() if line.startswith("gsm8k_local: left out")]
    assert set(rs.domains) == {"arc_challenge_local", "arc_easy_local"}
    with pytest.raises(UserError, match="no single-answer multiple-choice task .*gsm8k_local"):
        load_records(GEN)


def test_no_domain_scores_a_real_lm_eval_run_with_its_accuracy_and_no_shift(lmeval_run,
                                                                              tmp_path):
    """`uqbench score` with no --domain on a real lm-eval run (plus a generate_until task): each
    MC task alone, its ID accuracy lm-eval's own metric example for example; the shift columns
    absent from every row, their reason once in run.json and in the report; the
    generate_until task listed as left out."""
    from uqbench import cli
    from uqbench.io.lmeval import NO_SHIFT
    from uqbench.results.references import shift_column

    folder = tmp_path / "lm"
    folder.mkdir()
    for f in [*lmeval_run.results.parent.iterdir(), *GEN.iterdir()]:
        if f.is_file():
            (folder / f.name).write_bytes(f.read_bytes())
    assert cli.main(["score", str(folder), "--out", str(tmp_path / "run"), "--calib-fraction",
                     "0.25", "--scorers", "msp,entropy", "--bootstrap", "20"]) == 0
    run = tmp_path / "run"
    meta = json.loads((run / "run.json").read_text())
    mc = sorted(set(lmeval.RUN_TASKS))
    assert sorted(meta["lmeval"]["domains"]) == mc
    assert list(meta["lmeval"]["left_out"]) == [lmeval.GEN_TASK]
    assert meta["lmeval"]["no_shift"] == {"domains": mc, "reason": NO_SHIFT}
    assert [c for c in meta["skipped_columns"] if c["reason"] == NO_SHIFT][0]["domains"] == mc
    samples = {t: {r["doc_id"]: r for r in read_samples(p)} for t, p in lmeval_run.samples.items()}
    rows = [json.loads(x) for x in (run / "results.jsonl").read_text().splitlines()]
    assert rows and not [k for r in rows for k in r if shift_column(k)]
    checks = {c["split"]: c for c in meta["lmeval"]["accuracy"]}
    with np.load(run / "scores.npz") as z:
        for t in mc:
            metric = checks[f"{t}/id"]["metric"]  # the lm-eval metric uqbench's accuracy is
            row = next(r for r in rows if r["domain"] == t and r["scorer"] == "msp")
            held = set(meta["lmeval"]["calib_held_out"]["doc_ids"][t])
            theirs = [samples[t][i][metric] for i in sorted(samples[t]) if i not in held]
            assert row["n_id"] == len(theirs) == 15
            assert row["accuracy"] == pytest.approx(float(np.mean(theirs)), abs=1e-12)
            assert f"model/loglik-per-char/msp|{t}|id|confidence" in z.files
            assert not [k for k in z.files if f"|{t}|shift|" in k]
    for t in mc:  # over every question, the accuracy lm-eval logged
        assert checks[f"{t}/id"]["uqbench_all"] == pytest.approx(checks[f"{t}/id"]["lm_eval"])
    assert NO_SHIFT in (run / "report.html").read_text()
    assert (run / "results.md").read_text().count(NO_SHIFT) == 1


@pytest.mark.parametrize(("blocks", "more"), [(0, 1), (0, 2), (1, -1), (1, 0), (1, 1), (2, 3)])
def test_the_content_hash_is_that_of_every_samples_doc_id_label_and_hash_as_json(
        blocks: int, more: int) -> None:
    """The content hash keys caches: it stays the hash of ``json.dumps`` of every sample's
    ``[doc_id, label, doc hash]``, however the samples fall into the blocks it is hashed in."""
    import hashlib

    from uqbench.io.lmeval import HASH_BLOCK, collect
    from uqbench.io.samples import Parsed

    hashes = ["h", "é\"\\\n\u2028", "", "0" * 64]
    rows = [(i, i % 2, hashes[i % len(hashes)]) for i in range(blocks * HASH_BLOCK + more)]
    parsed: list[tuple[int, Parsed]] = [(i + 1, (d, label, [-1.0, -2.0], ["a", "b"], h, False, {}))
                                        for i, (d, label, h) in enumerate(rows)]
    ts = collect(Path("samples_t.jsonl"), "t", "line", parsed)
    assert ts.content_hash == hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]


@pytest.mark.parametrize("raw", ['{"a": 1}\n', '{"a": 1}', '{"a": [1, {"b": NaN}]}\n',
                                 '{"a": 1}  \n', ' {"a": 1}\n', '\ufeff{"a": 1}\n', '{"a": 1}{}\n',
                                 '{"a": 1} x\n', '{"a": \n', '[1]\n', '"x"\n', '{"a": 1}\r\n',
                                 '{"a": "\\ud800"}\n', '{"a": 1, "a": 2}\n', '{"a": 1e400}\n'])
def test_a_samples_line_is_read_as_json_loads_reads_it(raw: str) -> None:
    """`loads`, the lines' reader, returns or refuses what `json.loads` does, with its error."""
    from uqbench.io.lmeval import loads

    def outcome(read):
        try:
            return "value", repr(read(raw))
        except ValueError as exc:
            return type(exc).__name__, str(exc)

    assert outcome(loads) == outcome(json.loads)
