"""The real thing at the `smoke` profile: real MiniLM weights, real data, the README's command."""
from __future__ import annotations

import json
import sys

from tests.conftest import REPO, uqbench_env
from uqbench.results.tables import is_reference

# every test here uses the session's shared `smoke_run` (tests/conftest.py), which puts it in
# the slow and e2e tiers; the run itself is made once per session, cold, in a temporary folder


def test_smoke_run_writes_every_table_and_figure(smoke_run):
    root, _, proc = smoke_run
    run = root / "run"
    for name in ("results.csv", "results.jsonl", "results.md", "results.tex", "run.json",
                 "scores.npz"):
        assert (run / name).stat().st_size > 0, name
    rows = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    domains = {r["domain"] for r in rows}
    assert domains == {"science", "knowledge", "math", "code", "pooled"}
    methods = {r["method"] for r in rows}
    assert {"lora/dense/msp", "moe-lora/top4/msp", "moe-lora/top4/mc_dropout_mutual_info",
            "moe-lora/top4/ensemble_entropy", "moe-lora/care/care"} <= methods
    refs = {(r["method"], r["domain"]) for r in rows if is_reference(r)}
    assert refs == {(m, d) for m in ("chance", "options-only") for d in domains}
    for r in rows:
        assert 0 <= r["accuracy"] <= 1 and r["n_id"] > 0 and r["protocol"] and r["split_hashes"]
        if not is_reference(r):  # the reference rows have the accuracy columns only
            assert 0 <= r["ece"] <= 1 and 0 <= r["ood_auroc"] <= 1
    care = next(r for r in rows if r["method"] == "moe-lora/care/care" and r["domain"] == "pooled")
    meta = json.loads((run / "run.json").read_text())
    cal = meta["gates"]["moe-lora/care@0"]["calibration"]
    assert abs(cal["achieved"] - 4.0) <= 0.05 or not cal["met"]
    assert 1.0 <= care["avg_experts"] <= 8.0
    # the printed summary: the model level, then each model's scorers under it (named once)
    assert "moe-lora/care" in proc.stdout and "\n  care " in proc.stdout
    assert set(meta["training"]) == set(meta["trained"]) and "at_chance" in meta
    # MiniLM's bi-encoder has no zero-shot row: the run says so (run.json, stdout), learned NaN
    assert meta["zero_shot"] == {"head": "bi_encoder", "applies": False,
                                 "reason": meta["zero_shot"]["reason"]}
    assert "bi_encoder" in meta["references_skipped"]["zero-shot"]
    assert "no zero-shot reference" in proc.stdout
    assert all(r["learned"] != r["learned"] for r in rows if not is_reference(r))   # NaN
    for t in meta["training"].values():   # step 0 and the per-domain curves of every model
        assert set(t["initial"]["domains"]) == set(t["curves"]["domains"]) == domains - {
            "pooled"}
    pngs = list((run / "figures").glob("*.png"))
    assert pngs and all(p.with_suffix(".pdf").exists() for p in pngs)
    # each PDF keeps its PNG's layout: laid out again, the forest plots' axes collapsed
    assert "constrained_layout not applied" not in proc.stderr


def test_warm_rerun_does_no_forward_pass_and_report_reprints(smoke_run, procs):
    root, env, _ = smoke_run

    def truncated() -> list[dict]:
        meta = json.loads((root / "run" / "run.json").read_text())
        return [f for f in meta["fallbacks"] if f["what"] == "input truncated to max_length"]

    cold = truncated()
    cmd = [sys.executable, "-m", "uqbench", "run", "--suite", "pooled", "--profile", "smoke",
           "--out", str(root / "run"), "--no-progress", "--no-figures"]
    proc = procs.run(cmd, what="the warm smoke rerun", quiet_s=30, env=env, cwd=REPO,
                     watch=[root / "cache", root / "run"])
    assert "forward passes run: 0" in proc.stdout
    # MiniLM at the smoke profile's 96 tokens cuts some code options (functions): listed once
    # per split, by the cold run and by the warm one that read its passes from the cache
    assert cold and {f["where"].split("/")[0] for f in cold} == {"code"}
    assert "code/shift" in {f["where"] for f in cold} and truncated() == cold
    rep = procs.run([sys.executable, "-m", "uqbench", "report", str(root / "run")],
                    what="uqbench report", quiet_s=10, env=env, cwd=REPO)
    assert "moe-lora/care" in rep.stdout and "| care | pooled |" in rep.stdout
    assert "OOD-AUROC" in rep.stdout


def test_cli_user_error_has_no_traceback(tmp_path, procs):
    # needs no finished run: the installed entry point, in a process of its own
    proc = procs.run([sys.executable, "-m", "uqbench", "run", "--suite", "pooledd",
                      "--out", str(tmp_path / "x")], what="uqbench run --suite pooledd",
                     quiet_s=10, env=uqbench_env(), cwd=REPO, check=False)
    assert proc.returncode == 2
    assert "uqbench: error:" in proc.stderr and "Traceback" not in proc.stderr


def test_export_then_score_gives_every_value_of_the_smoke_run(smoke_run, procs, tmp_path):
    """`uqbench export RUN DEST` then `uqbench score DEST`: the same results.csv, value for value,
    and the same per-example scores, with no model work (a GPU run scored on a laptop)."""
    import numpy as np

    root, env, _ = smoke_run
    run = root / "run"
    for cmd, what in (
            (["export", str(run), str(tmp_path / "exported")], "uqbench export"),
            (["score", str(tmp_path / "exported"), "--out", str(tmp_path / "scored"),
              "--no-figures"], "uqbench score of the export")):
        procs.run([sys.executable, "-m", "uqbench", *cmd], what=what, quiet_s=60, env=env,
                  cwd=REPO, watch=[tmp_path])
    assert (tmp_path / "scored" / "results.csv").read_text() == (run / "results.csv").read_text()
    with np.load(run / "scores.npz") as a, np.load(tmp_path / "scored" / "scores.npz") as b:
        assert sorted(a.files) == sorted(b.files)
        assert all(np.array_equal(a[k], b[k]) for k in a.files)
