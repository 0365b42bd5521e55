"""The `cpu` profile's recipe learns: a small real run on the science domain (ARC-Easy).

The check is the artifact module's exact chance bound: the accuracy must reach the smallest
a/n that a uniform guesser reaches with probability <= 1% (Poisson-binomial over the questions'
option counts; about 0.36 for 120 questions of 4 options). `test_the_check_rejects_chance` shows
that a model at chance fails it.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from uqbench.data.artifacts import chance_threshold
from uqbench.data.records import MCRecord

ALPHA = 0.01


def beats_chance(correct: np.ndarray, records: list[MCRecord]) -> bool:
    return float(np.mean(correct)) >= chance_threshold(records, ALPHA)


def _four_option_records(n: int) -> list[MCRecord]:
    return [MCRecord(f"q{i}", "science", "?", ("a", "b", "c", "d"), i % 4, "toy")
            for i in range(n)]


def test_the_check_rejects_chance() -> None:
    recs = _four_option_records(120)
    rng = np.random.default_rng(0)
    guesses = [(rng.integers(0, 4, 120) == np.array([r.answer for r in recs])).astype(float)
               for _ in range(200)]
    assert sum(beats_chance(g, recs) for g in guesses) <= 4   # a uniform guesser: ~1% pass
    assert not beats_chance(np.r_[np.ones(30), np.zeros(90)], recs)   # exactly chance (0.25)
    assert beats_chance(np.r_[np.ones(48), np.zeros(72)], recs)       # 0.40


@pytest.mark.slow
@pytest.mark.e2e
def test_the_cpu_recipe_learns_science(real_data_dir, tmp_path) -> None:
    from baselines import forward, heads, moe, train
    from baselines.backbones import load_backbone
    from uqbench.core.profiles import get_profile
    from uqbench.data.suites.build import build_suite
    from uqbench.data.suites.spec import SuiteSpec, get_suite_spec

    cpu = get_profile("cpu")
    prof = dataclasses.replace(cpu, train_cap=96, calib_cap=8, id_cap=120, shift_cap=8)
    science = next(d for d in get_suite_spec("pooled").domains if d.name == "science")
    suite = build_suite(SuiteSpec("science-only", (science,)), prof, data_dir=real_data_dir,
                        cache_dir=tmp_path, progress=False)
    model = heads.make_moe(load_backbone("minilm"),
                           moe.MoELoRAConfig(seed=0, target_modules=cpu.target_modules,
                                             top_layers=cpu.top_layers),
                           mode=cpu.encoder_head, seed=0)
    cfg = train.TrainConfig(lr=cpu.lr, head_lr=cpu.head_lr, epochs=cpu.epochs,
                            batch_size=cpu.batch_size, max_length=cpu.max_length, seed=0)
    records = suite.split("science", "train").records

    def logits_of(recs):
        return forward.collect(model, recs, batch_size=cpu.eval_batch_size,
                               max_length=cpu.max_length, progress=False)["logits"]

    def train_ce() -> float:
        lg = logits_of(records)
        lg = lg - lg.max(1, keepdims=True)
        logp = lg - np.log(np.exp(lg).sum(1, keepdims=True))
        return float(-logp[np.arange(len(records)), [r.answer for r in records]].mean())

    before = train_ce()
    result = train.train(model, records, cfg, progress=False)
    assert all(np.isfinite(result.losses)) and result.steps == 6 * cpu.epochs
    assert train_ce() < before   # the recipe fits its training data
    test = list(suite.split("science", "id").records)
    logits = logits_of(test)
    correct = (logits.argmax(1) == np.array([r.answer for r in test])).astype(float)
    assert beats_chance(correct, test), (f"science ID accuracy {correct.mean():.3f} is within "
                                         f"chance (bound {chance_threshold(test, ALPHA):.3f})")


def test_the_gpu_presets_start_from_the_gpu_profile() -> None:
    """The recipe search's ``gpu`` candidate is the ``gpu`` profile's recipe on its backbone,
    so a lease's table compares variants against what `--profile gpu` runs."""
    from benchmarks.gpu_bundle import GPU_BACKBONE
    from benchmarks.recipe_search import parse_candidate
    from uqbench.core.profiles import get_profile

    g = get_profile("gpu")
    _, c = parse_candidate("gpu")
    assert (c["lr"], c["head_lr"], c["epochs"], c["train_cap"], c["targets"], c["top"],
            c["batch"], c["backbone"]) == (g.lr, g.head_lr, g.epochs, g.train_cap,
                                           g.target_modules, g.top_layers, g.batch_size,
                                           GPU_BACKBONE)
    _, c15 = parse_candidate("gpu15")
    assert c15 == {**parse_candidate("gpu")[1], "backbone": "qwen2.5-coder-1.5b"}
    _, c = parse_candidate("gpu-lr2e-3:epochs=2")
    assert (c["lr"], c["epochs"], c["head"], c["top"]) == (2e-3, 2, "letters", 8)
    with pytest.raises(SystemExit, match="unknown preset 'gpu-typo'"):
        parse_candidate("gpu-typo")


def test_id_cap_scores_the_first_questions_of_each_domain(smoke_splits, real_data, tmp_path,
                                                         capsys) -> None:
    """``--id-cap N``: a zero-shot candidate scored on the first N ID questions of each domain
    (the smoke run's splits, a random tiny Llama under the letters head); a cap below 1 is
    refused before any work."""
    import json
    import shutil

    from benchmarks.recipe_search import main

    shutil.copytree(smoke_splits, tmp_path / "splits")
    argv = ["--profile", "smoke", "--data-dir", str(real_data), "--cache-dir", str(tmp_path),
            "--candidates", "t:head=letters,epochs=0,backbone=tiny-llama,train_cap=32"]
    assert main([*argv, "--id-cap", "3"]) == 0
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    doms = [k for k in row if k.startswith("acc_") and k != "acc_pooled"]
    assert row["id_cap"] == 3 and row["id_questions"] == 3 * len(doms) == 12
    assert row["steps"] == 0 and row["final_loss"] is None and row["backbone_load_s"] >= 0
    # no training, yet the row has its step 0: the untrained model's loss per domain
    names = [d[4:] for d in doms]
    assert sorted(row["initial"]["domains"]) == sorted(names) and row["curves"] is None
    for d in names:
        v = row["initial"]["domains"][d]
        assert (row[f"initial_loss_{d}"], row[f"initial_acc_{d}"]) == (v["loss"], v["accuracy"])
        assert v["n"] == 32 and v["loss"] > 0
    with pytest.raises(SystemExit):
        main([*argv, "--id-cap", "0"])
    assert "--id-cap 0" in capsys.readouterr().err


def test_max_length_and_domains_say_what_truncation_cut(smoke_splits, real_data, tmp_path,
                                                        capsys) -> None:
    """``max_length=N`` evaluates at N tokens and ``--domains`` only the named domains; each
    row gives the fraction of questions whose option text was cut, as the letters head's own
    tokenization counts it. An unknown domain is refused before the backbone loads."""
    import json
    import shutil

    from baselines.backbones import load_backbone
    from baselines.heads.decoder import LETTERS
    from benchmarks.recipe_search import main
    from uqbench.core.profiles import get_profile
    from uqbench.data.suites.build import build_suite

    shutil.copytree(smoke_splits, tmp_path / "splits")
    argv = ["--profile", "smoke", "--data-dir", str(real_data), "--cache-dir", str(tmp_path),
            "--domains", "code", "--id-cap", "6"]
    cands = "a:head=letters,epochs=0,backbone=tiny-llama,train_cap=32,max_length=24;" \
            "b:head=letters,epochs=0,backbone=tiny-llama,train_cap=32"
    assert main([*argv, "--candidates", cands]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()[-2:]]
    assert [r["max_length"] for r in rows] == [24, get_profile("smoke").max_length]
    tok = load_backbone("tiny-llama").tokenizer
    recs = build_suite("pooled", get_profile("smoke"), data_dir=real_data,
                       cache_dir=tmp_path / "splits", progress=False
                       ).split("code", "id").records[:6]
    for r in rows:
        assert sorted(k for k in r if k.startswith(("acc_", "cut_"))) == [
            "acc_code", "acc_pooled", "cut_code"]
        lines = ["".join(f"{LETTERS[j]}. {c}\n" for j, c in enumerate(q.choices)) + "Answer:"
                 for q in recs]
        want = sum(len(tok(t, add_special_tokens=False)["input_ids"]) > r["max_length"]
                   for t in lines) / len(recs)
        assert r["cut_code"] == round(want, 3)
    assert rows[0]["cut_code"] > 0
    with pytest.raises(SystemExit, match="no domain chemistry"):
        main([*argv, "--domains", "chemistry", "--candidates",
              "b:head=letters,epochs=0,backbone=tiny-llama,train_cap=32"])


def test_a_diverging_candidate_is_recorded_and_the_search_goes_on(smoke_splits, real_data,
                                                                  tmp_path, capsys,
                                                                  monkeypatch) -> None:
    """A candidate whose training raises on a non-finite loss (a lease's all-blocks recipe did)
    gets a line saying so, with a warning, and the next candidate is still trained and scored;
    the table marks it instead of printing accuracies."""
    import json
    import shutil

    from baselines import train
    from benchmarks.recipe_search import main, table

    def diverge(*args, **kwargs):
        raise FloatingPointError("train: loss is nan at step 3; lower lr/head_lr or check the "
                                 "inputs")

    monkeypatch.setattr(train, "train", diverge)
    shutil.copytree(smoke_splits, tmp_path / "splits")
    out = tmp_path / "search.jsonl"
    with pytest.warns(UserWarning, match="candidate 'hot' diverged"):
        assert main(["--profile", "smoke", "--data-dir", str(real_data), "--cache-dir",
                     str(tmp_path), "--id-cap", "2", "--out", str(out), "--candidates",
                     ("hot:head=letters,epochs=1,backbone=tiny-llama,train_cap=32;"
                      "zero:head=letters,epochs=0,backbone=tiny-llama,train_cap=32")]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["candidate"] for r in rows] == ["hot", "zero"]
    assert "loss is nan at step 3" in rows[0]["diverged"] and rows[0]["steps"] == 0
    assert not any(k.startswith("acc_") for k in rows[0])
    assert "diverged" not in rows[1] and rows[1]["id_questions"] == 8
    lines = table(rows).splitlines()
    assert lines[2].count("| diverged") == 5 and "diverged" not in lines[3]   # 4 + pooled


def test_the_length_table_counts_what_a_run_would_cut_and_pad(smoke_splits, real_data, tmp_path,
                                                              capsys) -> None:
    """`benchmarks.lengths`: per length, the cut of each split equals what the passes report
    (`forward.collect`'s ``cut``), and the padded eval tokens equal each planned batch's rows
    times its longest question, capped at the length; the profile's own length has ratio 1."""
    import json
    import shutil

    import numpy as np

    from baselines import forward, heads
    from baselines.backbones import load_backbone
    from baselines.heads.decoder import LETTERS
    from benchmarks.lengths import EVAL_ROLES, main
    from uqbench.core.profiles import get_profile
    from uqbench.data.suites.build import build_suite

    shutil.copytree(smoke_splits, tmp_path / "splits")
    assert main(["--profile", "smoke", "--backbone", "tiny-llama", "--head", "letters",
                 "--data-dir", str(real_data), "--cache-dir", str(tmp_path),
                 "--lengths", "24,48"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    prof = get_profile("smoke")
    assert [r["max_length"] for r in rows] == [24, 48, prof.max_length]
    assert rows[-1]["tokens_ratio"] == 1.0 and rows[0]["tokens_ratio"] < rows[1]["tokens_ratio"]
    suite = build_suite("pooled", prof, data_dir=real_data, cache_dir=tmp_path / "splits",
                        progress=False)
    model = heads.make_plain(load_backbone("tiny-llama"), mode="letters")
    for r in rows[:2]:
        length, eval_tokens, largest = r["max_length"], 0, 0
        for role in EVAL_ROLES:
            for split in suite.role(role):
                recs = list(split.records)
                cut = forward.collect(model, recs, max_length=length, progress=False)["cut"]
                assert r["cut_option"][f"{split.domain}/{role}"] == round(
                    float(np.mean(cut == heads.base.CUT_OPTION)), 3)
                n = [min(length, len(model.tokenizer(
                    f"Question: {q.question}\n"
                    + "".join(f"{LETTERS[j]}. {c}\n" for j, c in enumerate(q.choices))
                    + "Answer:")["input_ids"])) for q in recs]
                sizes = [len(b) * max(n[i] for i in b)
                         for b in forward.plan_batches(model, recs, prof.eval_batch_size)]
                eval_tokens += sum(sizes)
                largest = max(largest, *sizes)
        assert r["eval_tokens"] == eval_tokens and r["eval_batch_max"] == largest
    assert rows[0]["cut_option"]["code/id"] > rows[-1]["cut_option"]["code/id"]
