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
    assert set(lmeval_run.samples) == set(lmeval.MC_TASKS)
    assert_samples_match_results(lmeval_run.samples, lmeval_run.results, 20)
    rows = [r for p in lmeval_run.samples.values() for r in read_samples(p)]
    # the tiny model's log-likelihoods are not all tied: length normalisation changes answers
    assert any(r["acc"] != r["acc_norm"] for r in rows)


def test_committed_samples_match_their_results() -> None:
    mc = {t: one(MC, f"samples_{t}_*.jsonl") for t in lmeval.MC_TASKS}
    assert_samples_match_results(mc, one(MC, "results_*.json"), 8)
    gen = {lmeval.GEN_TASK: one(GEN, f"samples_{lmeval.GEN_TASK}_*.jsonl")}
    assert_samples_match_results(gen, one(GEN, "results_*.json"), 2)
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
    assert len(files) == 5
    for f in files:
        text = f.read_text()
        for path in (tempfile.gettempdir(), str(Path.home()), str(lmeval.REPO)):
            assert path not in text, (f.name, path)
    for results in (one(MC, "results_*.json"), one(GEN, "results_*.json")):
        res = json.loads(results.read_text())
        assert res["model_name"] == res["config"]["model_args"]["pretrained"] == "tiny-llama"
        assert res["pretty_env_info"] == lmeval.ENV_INFO_PLACEHOLDER
        for config in res["configs"].values():
            assert config["dataset_kwargs"]["data_files"]["test"].startswith("${UQBENCH_DATA}/")


@pytest.mark.parametrize("task", [*lmeval.MC_TASKS, lmeval.GEN_TASK])
def test_committed_runs_used_the_example_yamls(task: str) -> None:
    """The committed files come from the YAMLs of examples/lmeval as they are now."""
    example = yaml.safe_load((lmeval.TASKS_DIR / f"{task}.yaml").read_text())
    results = one(MC if task in lmeval.MC_TASKS else GEN, "results_*.json")
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
                "arc-challenge/llm-foundry_arc_challenge_test.jsonl", "gsm8k/test.jsonl"):
        (data / rel).parent.mkdir(parents=True, exist_ok=True)
        (data / rel).write_text("{}\n")
    out = lmeval.render_tasks(data, tmp_path / "tasks")
    rendered = {p.stem: yaml.safe_load(p.read_text()) for p in out.glob("*.yaml")}
    assert set(rendered) == {*lmeval.MC_TASKS, lmeval.GEN_TASK}
    for task, config in rendered.items():
        assert Path(config["dataset_kwargs"]["data_files"]["test"]).is_file(), task
    # the regexes' own `$` stay as they are
    assert "\\$" in rendered[lmeval.GEN_TASK]["metric_list"][0]["regexes_to_ignore"]


def test_uqbench_score_of_a_real_lm_eval_run_equals_lm_evals_accuracy(lmeval_run, tmp_path):
    """`uqbench score` on the files of a real lm-eval run: for each normalisation its accuracy
    is lm-eval's own metric (acc, acc_norm, acc_bytes), example for example on the ID part (20%
    held out for calibration) and as the reported aggregate on the shifted task; the run folder
    is complete, and the scorers lm-eval gives no fields for are listed as skipped."""
    from uqbench.score import ScoreConfig, load_records, score

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
