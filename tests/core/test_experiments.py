"""The CARE paper's experiments: their (model, gate, scorer) rows and the claims each reports."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import builtin_scorers
from uqbench.core.experiments import (
    CONCENTRATION,
    EXPERIMENTS,
    experiment_methods,
    experiment_scorers,
)
from uqbench.core.plan import DET
from uqbench.core.scorer import get_scorer


def _methods(name: str) -> dict[str, object]:
    chosen = [get_scorer(n) for n in builtin_scorers()]
    ms = experiment_methods(name, 4.0, lambda e: experiment_scorers(e) or chosen)
    return {m.name: m for m in ms}


def test_uq_has_every_row_of_the_papers_table() -> None:
    ms = _methods("uq")
    table = ["lora/dense/msp", "hydralora/native/msp", "mixlora/native/msp",
             "dynmole/native/entropy", "flylora/native/msp", "flylora/native/entropy",
             "moe-lora/top4/mc_dropout_msp", "moe-lora/top4/ensemble_msp", "moe-lora/care/care",
             "moe-lora/top4/msp"]
    assert set(table) <= set(ms)
    for name in ("hydralora", "mixlora", "dynmole", "flylora"):
        pairs = {m.pair for m in ms.values() if m.pair.model.name == name}
        # one pair each, under its own routing, logits only: no MC passes, no ensemble members
        assert len(pairs) == 1 and next(iter(pairs)).fields == DET
        assert next(iter(pairs)).gate.kind == ("dense" if name == "flylora" else "native")
    assert not any(m.startswith(("hydralora/care", "flylora/care")) for m in ms)
    # the paper run holds them too
    assert set(table) <= set(_methods("paper"))


def test_ablation_scores_with_care_and_the_concentration_only_read_out() -> None:
    ms = _methods("ablation")
    conc = ms[f"moe-lora/nucleus-only/{CONCENTRATION}"].scorer
    care = ms["moe-lora/care/care"].scorer
    assert (conc.w, care.w) == (0.0, 0.5)  # type: ignore[attr-defined]
    assert f"moe-lora/nucleus-only/{CONCENTRATION}" in _methods("paper")


def test_every_claim_belongs_to_an_experiment(tmp_path: Path) -> None:
    """A single experiment's report lists the claims of its section: every section must be an
    experiment's name, or its claims would be reported by ``paper`` only."""
    from uqbench.reporting.paper import PaperRun, claims

    (tmp_path / "results.jsonl").write_text(json.dumps(
        {"method": "x/y/z", "model": "x", "gate": "y", "scorer": "z", "domain": "pooled"}) + "\n")
    np.savez(tmp_path / "scores.npz", unused=np.zeros(1))
    sections = {c.section for c in claims(PaperRun(tmp_path))}
    assert sections == set(EXPERIMENTS.names()) - {"paper"}


@pytest.fixture(scope="module")
def tiny_env(tmp_path_factory, real_data):
    from tests.run.test_runner import SUITE

    data = real_data
    root = tmp_path_factory.mktemp("experiments")
    (root / "tiny.yaml").write_text(SUITE)
    return root, data


def test_a_single_experiment_run_writes_its_claims(tiny_env) -> None:
    from uqbench.reporting.paper import HOLDS
    from uqbench.run.runner import RunConfig, run

    root, data = tiny_env
    res = run(RunConfig(suite=str(root / "tiny.yaml"), profile="smoke", backbone="tiny-bert",
                        experiment="ablation", out=root / "out", cache_dir=root / "cache",
                        data_dir=data, figures=False, progress=False))
    text = (res.out / "paper_report.md").read_text()
    rows = [ln for ln in text.splitlines() if ln.startswith("| ") and "---" not in ln][1:]
    assert len(rows) == 5 and all(ln.startswith("| ablation |") for ln in rows)
    assert "experiment `ablation` only" in text
    meta = json.loads((res.out / "run.json").read_text())
    assert meta["config"]["experiment"] == "ablation"
    # every ablation claim was measured: none reads "not measured"
    assert not any("not measured" in ln for ln in rows), text
    assert HOLDS in text or "does not hold" in text or "inconclusive" in text


# --- one budget: average experts per token, as the thermostat measures it ---------------------

def test_avg_experts_is_the_per_token_mean_not_the_per_example_mean() -> None:
    from uqbench.results.evaluate import Scored, evaluate

    # two examples: 30 tokens at 2 experts, 10 tokens at 6 experts; per token (60 + 60) / 40 =
    # 3.0, while the mean of the per-example means would be 4.0
    one = np.ones((2, 1))
    ex, tok = np.array([[2.0], [6.0]]), np.array([[30.0], [10.0]])
    id_ = Scored(np.array([[0.1], [0.9]]), one * 0.5, np.array([[1.0], [0.0]]), ex, tok)
    row = evaluate(id_, id_, n_boot=10)
    assert row["avg_experts"] == pytest.approx(3.0) and row["shift_avg_experts"] == pytest.approx(
        3.0
    )
    assert ex.mean() == 4.0
    with pytest.raises(ValueError, match="token counts"):  # never silently per example
        evaluate(Scored(id_.uncertainty, id_.confidence, id_.correct, ex, None), id_, n_boot=10)
    nan = evaluate(Scored(id_.uncertainty, id_.confidence, id_.correct, None), id_, n_boot=10)
    assert np.isnan(nan["avg_experts"])


def test_forward_records_token_counts_and_match_the_thermostats_mean() -> None:
    """`collect`'s ``n_tokens`` are each example's non-padding tokens; with them the per-token
    mean of its ``experts`` equals the thermostat's `mean_k` on the same batches."""
    from baselines.backbones import tiny_backbone
    from baselines.forward import collect
    from baselines.gates import Care
    from baselines.heads import make_moe
    from baselines.moe import set_gate
    from baselines.thermostat import mean_k
    from tests.support.data import SMALL_MOE, toy_records

    model = make_moe(tiny_backbone("encoder"), SMALL_MOE, mode="auto")
    set_gate(model, Care(0.6, k_max=4))
    recs = toy_records(12, seed=3, n_choices=(2, 3, 4))
    rec = collect(model, recs, batch_size=64, max_length=48, progress=False)
    enc = [model.encode([r], 48) for r in recs]
    assert rec["n_tokens"].tolist() == [float(e["attention_mask"].sum()) for e in enc]
    assert np.ptp(rec["experts"]) > 0  # k varies by token, so the two means can differ
    per_token = float((rec["experts"] * rec["n_tokens"]).sum() / rec["n_tokens"].sum())
    expected, _ = mean_k(model, [model.encode(recs, 48)], forward=lambda m, b: m(b))
    assert per_token == pytest.approx(expected, abs=1e-9)
