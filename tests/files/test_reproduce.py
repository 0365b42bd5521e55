"""`uqbench reproduce` and the run.json ``environment`` record: the diff on hand-made run folders,
bad input failing before any work, and the rerun through a stand-in runner (no model)."""
from __future__ import annotations

import csv
import hashlib
import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from uqbench.cli import main
from uqbench.core.errors import DataError, UserError
from uqbench.files.environment import FORMAT, code_hash, environment, package_versions
from uqbench.run.reproduce import ReproducibilityWarning, diff_runs, read_recorded, reproduce
from uqbench.run.runner import RunConfig

ROWS = [{"method": "moe-lora/top4/msp", "domain": "pooled", "accuracy": "0.315", "ece": "nan",
         "split_hashes": "ab,cd"},
        {"method": "chance", "domain": "pooled", "accuracy": "0.25", "ece": "", "split_hashes": ""}]
ARRAYS = {"m|pooled|id|uncertainty": np.array([[0.1], [0.7], [np.nan]]),
          "m|pooled|id|correct": np.array([[True], [False], [True]]),
          "m|pooled|id|labels": np.array([[0], [3], [1]])}


def write_run(d: Path, rows=ROWS, arrays=ARRAYS, env: dict | None = None,
              config: dict | None = None) -> Path:
    """A hand-made run folder: results.csv, scores.npz and run.json."""
    d.mkdir(parents=True, exist_ok=True)
    with (d / "results.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    np.savez_compressed(d / "scores.npz", **arrays)
    meta = {"config": config if config is not None else
            {"suite": "pooled", "profile": "smoke", "backbone": "tiny-bert", "seeds": None,
             "scorers": ["msp"], "plugins": [], "budget": 4.0, "experiment": None},
            "environment": env if env is not None else current_env()}
    (d / "run.json").write_text(json.dumps(meta))
    return d


def current_env(files: dict[str, str] | None = None, threads: int = 1) -> dict:
    recipe = {"source": {"origin": "local", "files": files or {}}}
    return environment(threads, 1, ["moe-lora@0"], [recipe])


# -- the diff ----------------------------------------------------------------------------------
def test_equal_folders_have_no_differences(tmp_path: Path) -> None:
    d = diff_runs(write_run(tmp_path / "a"), write_run(tmp_path / "b"))
    assert d.equal and d.compared == {"results.csv": 10, "scores.npz": 3}   # NaN equals NaN
    assert "no differences (bitwise" in d.summary()


def test_one_value_off_is_named_with_its_row_and_column(tmp_path: Path) -> None:
    rows = [dict(ROWS[0], accuracy="0.31"), ROWS[1]]
    d = diff_runs(write_run(tmp_path / "a"), write_run(tmp_path / "b", rows=rows))
    assert d.differences == ["results.csv moe-lora/top4/msp/pooled accuracy: 0.315 -> 0.31"]
    assert diff_runs(tmp_path / "a", tmp_path / "b", atol=0.01).equal   # within the tolerance
    assert not diff_runs(tmp_path / "a", tmp_path / "b", atol=0.001).equal


def test_one_array_off_by_one_bit_is_a_difference(tmp_path: Path) -> None:
    arrays = dict(ARRAYS)
    u = arrays["m|pooled|id|uncertainty"].copy()
    u[1, 0] = np.nextafter(u[1, 0], 1.0)
    arrays["m|pooled|id|uncertainty"] = u
    d = diff_runs(write_run(tmp_path / "a"), write_run(tmp_path / "b", arrays=arrays))
    assert len(d.differences) == 1
    assert d.differences[0].startswith("scores.npz m|pooled|id|uncertainty: 1 of 3 values differ")
    assert diff_runs(tmp_path / "a", tmp_path / "b", atol=1e-12).equal


def test_missing_file_key_row_and_shape_are_differences(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a")
    arrays = {**ARRAYS, "m|pooled|id|labels": np.array([0, 3, 1]), "extra": np.zeros(2)}
    b = write_run(tmp_path / "b", rows=ROWS[:1], arrays=arrays)
    d = diff_runs(a, b)
    assert "results.csv chance/pooled: row only in the recorded run" in d.differences
    assert "scores.npz extra: only in the rerun" in d.differences
    assert "scores.npz m|pooled|id|labels: int64[3, 1] -> int64[3]" in d.differences
    (b / "scores.npz").unlink()
    assert f"scores.npz: missing in {b}" in diff_runs(a, b).differences


# -- the environment record --------------------------------------------------------------------
def test_environment_records_code_packages_threads_seeds_and_data(tmp_path: Path) -> None:
    env = current_env({"arc/test.jsonl": "ab" * 32}, threads=3)
    assert env["format"] == FORMAT and env["threads"] == 3
    assert env["seeds"] == {"repetitions": 1, "models": ["moe-lora@0"]}
    assert env["data"] == {"origin": ["local"], "files": {"arc/test.jsonl": "ab" * 32}}
    assert env["packages"]["numpy"] == np.__version__ and "torch" in env["packages"]
    assert package_versions(["no-such-dist-xyz"]) == {"no-such-dist-xyz": None}
    assert len(env["code"]["sha256"]) == 64 and "commit" in env["code"]
    pkg = tmp_path / "uqbench"
    pkg.mkdir()
    (pkg / "a.py").write_text("x = 1\n")
    before = code_hash(tmp_path, ["uqbench"])
    (pkg / "a.py").write_text("x = 2\n")
    assert code_hash(tmp_path, ["uqbench"]) != before


# -- bad input, before any work ----------------------------------------------------------------
def never(cfg: RunConfig) -> None:
    raise AssertionError("bad input must fail before the run")


def test_folder_without_run_json(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="run.json is missing"):
        reproduce(tmp_path, runner=never)


@pytest.mark.parametrize(("env", "match"), [
    ({}, "has no environment record; this uqbench reproduces format 1"),
    ({"format": 0}, "has environment format 0; this uqbench reproduces format 1"),
])
def test_run_json_of_another_format(tmp_path: Path, env: dict, match: str) -> None:
    write_run(tmp_path / "a", env=env)
    with pytest.raises(UserError, match=match):
        reproduce(tmp_path / "a", runner=never)


def test_unknown_config_key_and_broken_json(tmp_path: Path) -> None:
    write_run(tmp_path / "a", config={"suite": "pooled", "warp_speed": 9})
    with pytest.raises(UserError, match=r"\['warp_speed'\].*not a configuration"):
        read_recorded(tmp_path / "a")
    (tmp_path / "a" / "run.json").write_text("{")
    with pytest.raises(UserError, match="run.json is unreadable"):
        read_recorded(tmp_path / "a")


def test_a_run_json_of_identity_version_1_reads_back_to_its_configuration(tmp_path: Path) -> None:
    """A version-1 run.json (no ``config_version``; an option appears only where it was set)
    gives the configuration that wrote it, whose identity is the recorded ``config``."""
    config = {"suite": "pooled", "profile": "smoke", "backbone": "tiny-bert", "scorers": ["msp"],
              "plugins": [], "seeds": None, "budget": 3.0, "experiment": None,
              "models": ["mixlora"], "head": "cloze", "eval_tokens": 4096}
    cfg = read_recorded(write_run(tmp_path / "a", config=config)).config
    assert cfg == RunConfig(profile="smoke", backbone="tiny-bert", scorers=("msp",), budget=3.0,
                            models=("mixlora",), head="cloze", eval_tokens=4096)
    assert (cfg.gates, cfg.backend, cfg.compile, cfg.grad_checkpoint) == ((), "torch", None, None)
    assert json.loads(json.dumps(cfg.identity())) == config
    meta = json.loads((tmp_path / "a" / "run.json").read_text())
    (tmp_path / "a" / "run.json").write_text(json.dumps({**meta, "config_version": 2}))
    with pytest.raises(UserError, match="identity version 2; this uqbench reads version 1"):
        read_recorded(tmp_path / "a")


def test_data_files_whose_hash_differs_are_named(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "data"
    (data / "arc").mkdir(parents=True)
    (data / "arc" / "test.jsonl").write_text("changed\n")
    recorded = {"arc/test.jsonl": hashlib.sha256(b"original\n").hexdigest(),
                "arc/train.jsonl": "00" * 32}
    run_dir = write_run(tmp_path / "a", env=current_env(recorded))
    with pytest.raises(DataError, match=r"2 of 2 files\): arc/test.jsonl: sha256 [0-9a-f]{16}"
                                        r"\.\.\. \(recorded [0-9a-f]{16}\.\.\.\); "
                                        r"arc/train.jsonl: missing"):
        reproduce(run_dir, data_dir=data, runner=never)
    monkeypatch.delenv("UQBENCH_DATA", raising=False)
    with pytest.raises(DataError, match="built from local data files; give their folder"):
        reproduce(run_dir, runner=never)


def test_out_folder_must_be_new(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "a")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "x").write_text("")
    for out in (run_dir, tmp_path / "b"):
        with pytest.raises(UserError, match="is the run folder or not empty"):
            reproduce(run_dir, out=out, runner=never)


# -- the rerun, through a stand-in runner --------------------------------------------------------
def fake_runner(calls: list, rows=ROWS) -> object:
    """Writes what the recorded run holds (or ``rows``), as a deterministic run would."""

    def runner(cfg: RunConfig) -> None:
        calls.append(cfg)
        assert cfg.cache_dir is not None and cfg.cache_dir.is_dir()   # a fresh cache
        assert not any(cfg.cache_dir.iterdir())
        write_run(cfg.out, rows=rows, env=current_env(threads=cfg.threads or 1))

    return runner


def test_rerun_uses_the_recorded_config_and_threads_and_a_fresh_cache(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run")
    calls: list[RunConfig] = []
    with warnings.catch_warnings():
        warnings.simplefilter("error", ReproducibilityWarning)   # same code, same packages
        diff = reproduce(run_dir, data_dir=tmp_path, runner=fake_runner(calls))
    cfg = calls[0]
    assert (cfg.suite, cfg.profile, cfg.backbone, cfg.scorers, cfg.threads, cfg.figures) == \
        ("pooled", "smoke", "tiny-bert", ("msp",), 1, False)
    assert cfg.out == tmp_path / "run-reproduced" and not cfg.cache_dir.exists()  # removed
    assert diff.equal
    report = json.loads((cfg.out / "reproduce.json").read_text())
    assert report["equal"] and report["warnings"] == [] and report["differences"] == []


def test_rerun_that_differs_and_environment_warnings_are_reported(tmp_path: Path) -> None:
    env = current_env()
    env["packages"]["numpy"] = "0.0.1"
    env["code"]["sha256"] = "0" * 64
    run_dir = write_run(tmp_path / "run", env=env)
    meta = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps({**meta, "processes": 2}))
    rows = [dict(ROWS[0], ece="0.044"), ROWS[1]]
    with pytest.warns(ReproducibilityWarning) as caught:
        diff = reproduce(run_dir, out=tmp_path / "again", data_dir=tmp_path, threads=2,
                         runner=fake_runner([], rows))
    said = [str(w.message) for w in caught]
    assert any(s.startswith("the installed code differs") for s in said)
    assert f"package numpy: recorded 0.0.1, installed {np.__version__}" in said
    assert any(s.startswith("threads: recorded 1, rerun with 2") for s in said)
    assert any(s.startswith("processes: recorded 2, rerun in one") for s in said)
    assert diff.differences == ["results.csv moe-lora/top4/msp/pooled ece: nan -> 0.044"]
    report = json.loads((tmp_path / "again" / "reproduce.json").read_text())
    assert report["warnings"] == said and not report["equal"]


def test_cli_exit_status(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    import uqbench.run.reproduce

    run_dir = write_run(tmp_path / "run")
    monkeypatch.setattr(uqbench.run.reproduce, "run", fake_runner([]))
    assert main(["reproduce", str(run_dir), "--data-dir", str(tmp_path)]) == 0
    assert "no differences (bitwise; results.csv: 10 compared, scores.npz: 3" in \
        capsys.readouterr().out
    monkeypatch.setattr(uqbench.run.reproduce, "run", fake_runner([], [ROWS[0]]))
    assert main(["reproduce", str(run_dir), "--out", str(tmp_path / "b"),
                 "--data-dir", str(tmp_path)]) == 1
    assert "row only in the recorded run" in capsys.readouterr().out
    assert main(["reproduce", str(tmp_path / "nowhere")]) == 2
    assert "run.json is missing" in capsys.readouterr().err
