"""`make gpu-lease` (benchmarks/gpu_lease.py): the lease's two calls, end to end on the CPU.

A bundle of the `pooled-plus` domains at tiny caps (tests/support/fixtures/lease-suite.yaml, carried
as a YAML suite; tiny-llama, no wheels) is unpacked by the search call, which writes the zero-shot
row, one row per trained candidate and one skipped for the time budget, then the choice; the profile
call reuses the unpacked folder, runs the profile with the chosen recipe (registered as
``<profile>+<candidate>``) and reports graph_step as not asked. The choice rule and the time budget
are checked on hand-made rows."""
from __future__ import annotations

import json
from pathlib import Path

from benchmarks import gpu_bundle, gpu_lease

SUITE = Path(__file__).parents[1] / "support" / "fixtures" / "lease-suite.yaml"


def _row(name: str, epochs: int, pooled: float, seconds: float, backbone: str = "b",
         science: float = 0.5) -> dict:
    return {"candidate": name, "epochs": epochs, "backbone": backbone,
            "train_seconds": seconds, "acc_science": [science, 0.0, 1.0],
            "acc_pooled": [pooled, 0.0, 1.0]}


def test_choose_takes_the_best_trained_candidate_and_says_what_it_added() -> None:
    rows = [_row("zero", 0, 0.60, 0.0, science=0.8), _row("a", 1, 0.55, 30.0),
            _row("b", 2, 0.65, 60.0, science=0.9), _row("c", 1, 0.65, 40.0, science=0.85),
            {"candidate": "d", "skipped": "time budget"}]
    got = gpu_lease.choose(rows)
    assert got["chosen"] == "c"   # tied with b on pooled accuracy, and faster
    assert got["ranked"][0][0] in ("b", "c") and got["ranked"][-1] == ["a", "b", 0.55]
    assert got["over_zero_shot"] == {"science": 0.05, "pooled": 0.05}
    none = gpu_lease.choose([rows[0], rows[-1]])
    assert none["chosen"] is None and "d: time budget" in none["reason"]
    assert "no search rows" in gpu_lease.choose([])["reason"]


def test_candidates_keep_the_bundles_caps_and_add_the_extra_backbones_rows() -> None:
    info = {"backbone": "qwen2.5-coder-1.5b", "extra_backbones": ["qwen2.5-coder-0.5b"]}
    got = gpu_lease.candidates_for(info, 800, ["gpu15-zero", "gpu15"], None, "top=2")
    assert got == ["gpu15-zero:backbone=qwen2.5-coder-1.5b,train_cap=800,top=2",
                   "gpu15:backbone=qwen2.5-coder-1.5b,train_cap=800,top=2",
                   "gpu-zero:backbone=qwen2.5-coder-0.5b,train_cap=800,top=2",
                   "gpu:backbone=qwen2.5-coder-0.5b,train_cap=800,top=2"]


def test_the_recipe_profile_is_the_profile_with_the_candidates_recipe() -> None:
    from benchmarks.recipe_search import parse_candidate, recipe_profile
    from uqbench.core.profiles import GPU

    _, cand = parse_candidate("gpu15-attn:epochs=2,top=0")
    prof = recipe_profile(GPU, cand, "gpu+gpu15-attn")
    assert (prof.name, prof.epochs, prof.target_modules, prof.top_layers, prof.lr) == (
        "gpu+gpu15-attn", 2, "auto", None, GPU.lr)
    assert (prof.train_cap, prof.max_length, prof.mc_passes) == (
        GPU.train_cap, GPU.max_length, GPU.mc_passes)


def test_the_lease_dry_run_end_to_end(tmp_path, real_data) -> None:
    cache, bundle, work = tmp_path / "cache", tmp_path / "bundle", tmp_path / "work"
    assert gpu_bundle.main(["make", "--profile", "smoke", "--suite", str(SUITE),
                            "--backbone", "tiny-llama", "--no-wheels", "--part-mib", "2",
                            "--cache-dir", str(cache), "--data-dir", str(real_data),
                            "--out", str(bundle)]) == 0
    first, second = tmp_path / "search.jsonl", tmp_path / "profile.jsonl"
    assert gpu_lease.main(["search", str(bundle), "--cpu", "--work", str(work),
                           "--out", str(first), "--backbone", "tiny-llama", "--set", "top=1",
                           "--candidates", "gpu15-zero,gpu15", "--budget", "900"]) == 0
    rows = [json.loads(x) for x in first.read_text().splitlines()]
    assert [r["step"] for r in rows] == ["bundle", "recipe", "recipe", "search", "choice"]
    b = rows[0]
    assert (b["suite"], b["splits"], b["same_hashes"], b["reused"]) == ("lease-dry", 16, True,
                                                                       False)
    zero, trained = rows[1:3]
    assert zero["epochs"] == 0 and zero["steps"] == 0 and zero["suite"] == "lease-dry"
    assert set(zero["acc_code"]) <= {0.0, 0.5, 1.0} and zero["id_questions"] == 8
    assert trained["candidate"] == "gpu15" and trained["steps"] >= 1
    assert trained["train_cap"] == 32 and trained["top"] == 1   # the bundle's caps: no rebuild
    assert rows[-1]["chosen"] == "gpu15" and "pooled" in rows[-1]["over_zero_shot"]

    assert gpu_lease.main(["profile", str(bundle), "--cpu", "--work", str(work),
                           "--out", str(second), "--graph-s", "0"]) == 0
    rows = {r["step"]: r for r in map(json.loads, second.read_text().splitlines())}
    assert list(rows) == ["bundle", "choice", "gpu", "graph_step"]
    assert rows["bundle"]["reused"] and rows["choice"]["chosen"] == "gpu15"
    run = rows["gpu"]
    assert run["status"] == "ok" and run["profile"] == "smoke+gpu15"
    assert run["recipe"]["candidate"] == "gpu15" and run["recipe"]["top"] == 1
    assert run["trained"] == ["moe-lora@0"] and run["matches_cpu"]["equal"]
    assert set(run["accuracy"]) == {"science", "knowledge", "math", "code", "pooled"}
    assert rows["graph_step"] == {"step": "graph_step", "status": "skipped",
                                  "reason": "--graph-s 0"}


def test_a_profile_call_without_the_bundle_says_what_is_missing(tmp_path, capsys) -> None:
    assert gpu_lease.main(["profile", str(tmp_path / "nothing"), "--cpu",
                           "--work", str(tmp_path / "w")]) == 2
    assert "manifest.json: missing" in capsys.readouterr().err


def test_a_candidate_that_would_end_past_the_budget_is_skipped(monkeypatch, tmp_path) -> None:
    """Fake clock: each candidate takes 40 s; with a 100 s budget the third would end at 120 s."""
    from benchmarks import recipe_search

    now = [0.0]
    monkeypatch.setattr(recipe_search.time, "perf_counter", lambda: now[0])
    ran = []

    def fake(name, cand, *args, **kw):
        ran.append(name)
        now[0] += 40.0
        return {"candidate": name}

    monkeypatch.setattr(recipe_search, "run_candidate", fake)
    monkeypatch.setattr("baselines.train.deterministic_cublas", lambda: None)
    out = tmp_path / "rows.jsonl"
    assert recipe_search.main(["--candidates", "gpu-zero,gpu,gpu-ep3,gpu-lr2e-3",
                               "--time-budget", "100", "--out", str(out)]) == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert ran == ["gpu-zero", "gpu"]
    assert [r["candidate"] for r in rows] == ["gpu-zero", "gpu", "gpu-ep3", "gpu-lr2e-3"]
    assert rows[2]["skipped"] == ("time budget: 80 s of 100 s used, and the longest candidate "
                                  "so far took 40 s")


def test_skipped_rows_render_in_the_table() -> None:
    from benchmarks.recipe_search import table

    rows = [{**_row("z", 0, 0.5, 0.0), "head": "letters", "lr": 5e-4, "head_lr": 0.1,
             "train_cap": 800, "targets": "ffn", "final_loss": None, "eval_seconds": 1.0},
            {"candidate": "s", "head": "letters", "lr": 5e-4, "head_lr": 0.1, "epochs": 1,
             "train_cap": 800, "targets": "ffn", "backbone": "b", "skipped": "time budget"}]
    text = table(rows)
    assert "| s | letters |" in text and "skipped | skipped" in text
