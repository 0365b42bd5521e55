"""The real thing at the `smoke` profile: real MiniLM weights, real data, the README's command."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO
from uqbench.report import is_reference

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    from tests.conftest import data_dir

    data = data_dir()
    if data is None:
        pytest.skip("real data not found: set UQBENCH_DATA to a copy of shared/data")
    root = tmp_path_factory.mktemp("e2e")
    env = {**os.environ, "UQBENCH_DATA": str(data), "HF_HUB_OFFLINE": "1",
           "UQBENCH_CACHE": str(root / "cache")}
    cmd = [sys.executable, "-m", "uqbench", "run", "--suite", "pooled", "--profile", "smoke",
           "--out", str(root / "run"), "--no-progress"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root, env, proc


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
    assert "moe-lora/care/care" in proc.stdout  # the printed summary
    assert set(meta["training"]) == set(meta["trained"]) and "at_chance" in meta
    pngs = list((run / "figures").glob("*.png"))
    assert pngs and all(p.with_suffix(".pdf").exists() for p in pngs)


def test_warm_rerun_does_no_forward_pass_and_report_reprints(smoke_run):
    root, env, _ = smoke_run
    cmd = [sys.executable, "-m", "uqbench", "run", "--suite", "pooled", "--profile", "smoke",
           "--out", str(root / "run"), "--no-progress", "--no-figures"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "forward passes run: 0" in proc.stdout
    rep = subprocess.run([sys.executable, "-m", "uqbench", "report", str(root / "run")],
                         capture_output=True, text=True, env=env, cwd=REPO, check=True)
    assert "moe-lora/care/care" in rep.stdout and "OOD-AUROC" in rep.stdout


def test_cli_user_error_has_no_traceback(smoke_run):
    root, env, _ = smoke_run
    proc = subprocess.run([sys.executable, "-m", "uqbench", "run", "--suite", "pooledd",
                           "--out", str(root / "x")], capture_output=True, text=True, env=env,
                          cwd=REPO)
    assert proc.returncode == 2
    assert "uqbench: error:" in proc.stderr and "Traceback" not in proc.stderr
