"""`accelerate launch` with 2 processes on CPU (gloo) gives the same results as 1 process.

Sharded forward records are bitwise equal to one process's (same batches, per-batch dropout
seeds); DDP training equals one process's up to float summation order (dropout off: its masks
are per process). Every launch has a hard timeout (a multiple of its quiet time, see
`tests.conftest.timeout_for`), so a hung collective fails the test, naming the launch and its
output, instead of blocking CI. Both tests use the `procs` fixture: slow tier.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import sys
from pathlib import Path

import numpy as np

from tests.conftest import REPO, Procs
from tests.support import dist_worker
from tests.support.suites import arc_suite
from uqbench.results.tables import is_reference

#: each launch's time on 2 quiet cores (the timeout is `timeout_for` of it: a multiple, so that
#: a busy machine is not a failure, while a hung collective still is)
QUIET_S = {"dist_worker": 40.0, "run": 60.0}


def _launch(procs: Procs, args: list[str], tmp: Path, *, quiet_s: float) -> None:
    """``accelerate launch --multi_gpu --num_processes 2 ARGS``: torchrun-style processes; on a
    machine without GPUs `baselines.distributed` makes them a gloo group on the CPU."""
    with socket.socket() as s:   # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu",
           "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
           "--dynamo_backend", "no", "--main_process_port", str(port), *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(REPO)}
    # own process group: on a timeout the launcher and both workers are killed together, and
    # the failure names the launch, what it had written and its output tails
    procs.run(cmd, what=f"2-process launch {' '.join(args)}", quiet_s=quiet_s, env=env,
              cwd=tmp, watch=[tmp])


def test_sharded_training_and_records_match_one_process(tmp_path, procs) -> None:
    _launch(procs, ["-m", "tests.support.dist_worker", str(tmp_path / "two.npz")], tmp_path,
            quiet_s=QUIET_S["dist_worker"])
    dist_worker.main(str(tmp_path / "one.npz"))
    one, two = np.load(tmp_path / "one.npz"), np.load(tmp_path / "two.npz")
    assert (int(one["world"]), int(two["world"])) == (1, 2)
    for key in one.files:
        if key == "world":
            continue
        if "_det_" in key or "_mc_" in key:   # forward records: bitwise equal
            np.testing.assert_array_equal(one[key], two[key], err_msg=key)
        elif key.endswith("_losses"):          # the global batch-mean loss of every step:
            # before any update only the summation order differs; after it, Adam amplifies that
            np.testing.assert_allclose(one[key][0], two[key][0], rtol=1e-6, err_msg=key)
            np.testing.assert_allclose(one[key], two[key], rtol=1e-4, err_msg=key)
        else:                                  # trained weights (Adam amplifies float noise)
            np.testing.assert_allclose(one[key], two[key], atol=2e-3, err_msg=key)
    assert one["letters_losses"][-1] < one["letters_losses"][0]   # it did train


SUITE = arc_suite("tiny-cloze", caps=(12, 6, 10, 10), header="choices: 4\nhead: cloze\n")


def _rows(out: Path) -> dict[tuple[str, str], dict[str, object]]:
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    return {(r["method"], r["domain"]): r for r in rows}


def test_accelerate_launch_run_matches_one_process(tmp_path, procs, real_data) -> None:
    """`accelerate launch -m uqbench run` (2 processes: DDP training, sharded records, process 0
    reports) and a 1-process run on the adapters it trained report the same numbers."""
    data = real_data
    (tmp_path / "tiny.yaml").write_text(SUITE)
    common = ["--suite", str(tmp_path / "tiny.yaml"), "--profile", "smoke",
              "--backbone", "tiny-llama", "--models", "moe-lora", "--data-dir", str(data),
              "--scorers", "msp,routing_entropy,disagreement", "--no-figures", "--no-progress"]
    _launch(procs, ["-m", "uqbench", "run", *common, "--out", "two", "--cache-dir", "c2"],
            tmp_path, quiet_s=QUIET_S["run"])
    meta = json.loads((tmp_path / "two" / "run.json").read_text())
    assert meta["trained"] == ["moe-lora@0"] and meta["processes"] == 2
    from baselines.checkpoint import read_config

    [adapter] = (tmp_path / "c2" / "models").iterdir()
    assert read_config(adapter)["head"]["mode"] == "cloze"      # the suite's head:
    # one process, same splits and trained adapters, forward records and calibration redone
    for kind in ("splits", "models"):
        shutil.copytree(tmp_path / "c2" / kind, tmp_path / "c1" / kind)
    from uqbench.run.runner import RunConfig, run

    res = run(RunConfig(suite=str(tmp_path / "tiny.yaml"), profile="smoke",
                        backbone="tiny-llama", models=("moe-lora",), data_dir=data,
                        scorers=("msp", "routing_entropy", "disagreement"), figures=False,
                        progress=False, out=tmp_path / "one", cache_dir=tmp_path / "c1"))
    assert res.stats.trained == [] and res.stats.total() > 0
    one, two = _rows(tmp_path / "one"), _rows(tmp_path / "two")
    assert one.keys() == two.keys() and len(one) >= 4
    for key, row in one.items():
        if is_reference(row):  # chance / options-only: no model, accuracy columns only
            assert row["accuracy"] == two[key]["accuracy"], key
            continue
        for col in ("accuracy", "ece", "ood_auroc", "aurc", "avg_experts"):
            assert row[col] == two[key][col], (key, col)
