"""`uqbench.reporting.paper`: verdicts written from a finished run's numbers (synthetic run
folder)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from uqbench.core.errors import UserError
from uqbench.reporting.paper import (
    FAILS,
    HOLDS,
    INCONCLUSIVE,
    PaperRun,
    claims,
    matched_budget,
    verdict_greater,
    verdict_within,
    write_paper_report,
)
from uqbench.stats import metrics as M

N = 200


@pytest.fixture(autouse=True)
def _fewer_resamples(monkeypatch: pytest.MonkeyPatch) -> None:
    """200 paired-bootstrap resamples instead of the report's 1000: these runs are built so that
    each verdict is clear (or exactly zero), and every test here passes alike at 100, 150, 250,
    400 and 1000 resamples (the claims' bootstrap is seeded); 1000 took most of this module's
    time."""
    monkeypatch.setattr("uqbench.reporting.paper.N_BOOT", 200)
CARE, MSP = "moe-lora/care/care", "moe-lora/top4/msp"
MC, ENS = "moe-lora/top4/mc_dropout_msp", "moe-lora/top4/ensemble_msp"


def _arrays(rng: np.random.Generator, separation: float | None) -> dict[str, np.ndarray]:
    """ID and shifted uncertainty; `separation=None` gives one score for all (AUROC 0.5)."""
    if separation is None:
        u_id = u_sh = np.full(N, 0.5)
    else:
        u_id, u_sh = rng.normal(0, 1, N), rng.normal(separation, 1, N)
    correct = rng.random(N) < 0.5
    return {"id|uncertainty": u_id, "id|confidence": np.full(N, 0.5), "id|correct": correct,
            "shift|uncertainty": u_sh, "shift|confidence": np.full(N, 0.5),
            "shift|correct": rng.random(N) < 0.5}


def _row(method: str, domain: str = "pooled", **values: float) -> dict[str, object]:
    model, gate, scorer = method.split("/")
    return {"method": method, "model": model, "gate": gate, "scorer": scorer, "domain": domain,
            **values}


@pytest.fixture()
def run_dir(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    per_method = {CARE: _arrays(rng, 1.5), MSP: _arrays(rng, None), ENS: _arrays(rng, 8.0)}
    per_method[MC] = per_method[CARE]  # identical scores: the paired difference is exactly 0
    arrays, rows = {}, []
    for method, a in per_method.items():
        arrays.update({f"{method}|pooled|{k}": v for k, v in a.items()})
        rows.append(_row(method, accuracy=float(a["id|correct"].mean()),
                         ood_auroc=M.ood_auroc(a["id|uncertainty"], a["shift|uncertainty"]),
                         ece=0.0, sel_acc_80=0.5, shift_sel_acc_80=0.5, shift_accuracy=0.5,
                         avg_experts=4.0))
    order = rng.permutation(N)  # nested correct sets: paired differences are exactly known
    for method, acc in [("moe-lora/care-tau0.4/care", 0.40), ("moe-lora/care-tau0.6/care", 0.45),
                        ("moe-lora/care-tau0.8/care", 0.50), ("moe-lora/top3/msp", 0.45),
                        ("moe-lora/top2/msp", 0.55)]:
        a = dict(per_method[MSP], **{"id|correct": np.isin(np.arange(N), order[:int(acc * N)])})
        arrays.update({f"{method}|pooled|{k}": v for k, v in a.items()})
        if "tau" in method:
            rows.append(_row(method, avg_experts={0.4: 1.5, 0.45: 2.5, 0.5: 3.9}[acc],
                             accuracy=acc))
    arrays[f"{MSP}|pooled|id|correct"] = np.isin(np.arange(N), order[:int(0.55 * N)])
    for budget, k, acc in [(2, 2.0, 0.40), (3, 3.0, 0.50), (4, 4.0, 0.60)]:
        rows.append(_row(f"moe-lora/care-b{budget}/msp", avg_experts=k, accuracy=acc))
    rows.append(_row("moe-lora/top4/msp", domain="science", accuracy=0.55))
    rows[1]["accuracy"] = 0.55  # fixed top-4 pooled accuracy: CARE matches it at 3.5 experts
    for dom, k, acc in [("science", 3.0, 0.9), ("math", 4.0, 0.5), ("code", 5.0, 0.7)]:
        rows.append(_row(CARE, domain=dom, avg_experts=k, accuracy=acc))
    _write_rows(tmp_path, rows)
    np.savez(tmp_path / "scores.npz", **arrays)
    return tmp_path


def _rows(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in (run_dir / "results.jsonl").read_text().splitlines()]


def _write_rows(run_dir: Path, rows: list[dict[str, Any]]) -> None:
    (run_dir / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _by_text(run_dir: Path) -> dict[str, tuple[str, str]]:
    return {c.text: (c.verdict, c.ours) for c in claims(PaperRun(run_dir))}


def test_verdict_rules_by_hand() -> None:
    assert verdict_greater((0.1, 0.02, 0.2)) == HOLDS
    assert verdict_greater((-0.1, -0.2, -0.01)) == FAILS
    assert verdict_greater((0.0, -0.01, 0.01)) == INCONCLUSIVE
    assert verdict_within((0.0, -0.005, 0.008), 0.01) == HOLDS
    assert verdict_within((0.05, 0.02, 0.08), 0.01) == FAILS
    assert verdict_within((0.0, -0.02, 0.005), 0.01) == INCONCLUSIVE


def test_ood_claims_follow_the_paired_bootstrap(run_dir: Path) -> None:
    got = _by_text(run_dir)
    assert got["CARE's OOD-AUROC beats MoE top-4 + MSP"][0] == HOLDS  # ~0.86 vs exactly 0.5
    assert got["CARE's OOD-AUROC beats the deep ensemble"][0] == FAILS  # ensemble is ~1.0
    verdict, ours = got["CARE's OOD-AUROC beats MC-dropout"]
    assert verdict == INCONCLUSIVE and "Δ = +0.000 [+0.000, +0.000]" in ours


def test_missing_methods_are_reported_not_guessed(run_dir: Path) -> None:
    verdict, ours = _by_text(run_dir)["random-k loses accuracy vs fixed-k"]
    assert verdict == INCONCLUSIVE and ours.startswith("not measured")


def test_trend_claims(run_dir: Path) -> None:
    got = _by_text(run_dir)
    assert got["mean experts rises monotonically with τ (point estimates)"][0] == HOLDS
    verdict, ours = got["accuracy rises with τ (highest vs lowest τ, paired)"]
    assert verdict == HOLDS and "Δ = +10.000 pts" in ours  # 0.50 − 0.40, nested correct sets
    # fixed-4 at 0.55 lies halfway between CARE's (3.0, 0.50) and (4.0, 0.60): 3.5 experts,
    # and fixed top-3 (0.45) is less accurate than top-4 (0.55), so the saving is CARE's
    verdict, ours = got["CARE reaches fixed-4 accuracy with fewer experts"]
    assert verdict == HOLDS and ours.startswith("3.50 experts (12% fewer")
    assert "fixed top-4 − top3: Δ = +10.000 pts" in ours
    # experts 3, 4, 5 against error 0.1, 0.5, 0.3: Spearman rho = 0.5
    text = "one global τ spends more experts on harder domains (Spearman ρ of experts vs error)"
    verdict, ours = got[text]
    assert verdict == INCONCLUSIVE and ours.endswith("ρ = 0.50")


def test_a_match_at_the_lowest_budget_is_a_bound(run_dir: Path) -> None:
    rows = _rows(run_dir)
    for r in rows:
        if r["method"] == "moe-lora/care-b2/msp":
            r["accuracy"] = 0.60  # CARE at 2 experts already beats fixed-4's 0.55
    _write_rows(run_dir, rows)
    verdict, ours = _by_text(run_dir)["CARE reaches fixed-4 accuracy with fewer experts"]
    # fixed top-2 is as accurate as top-4 in the fixture (0.55): the saving is not CARE's
    assert verdict == INCONCLUSIVE
    assert ours.startswith("≤ 2.00 experts (≥ 50% fewer")
    assert "fixed top-4 − top2: Δ = +0.000 pts" in ours


def _flatten(run_dir: Path, methods: list[str]) -> None:
    """Give `methods` the correct-set of fixed top-4: a flat accuracy line."""
    with np.load(run_dir / "scores.npz") as z:
        arrays = {k: z[k] for k in z.files}
    for m in methods:
        arrays[f"{m}|pooled|id|correct"] = arrays[f"{MSP}|pooled|id|correct"]
    np.savez(run_dir / "scores.npz", **arrays)


def test_flat_accuracy_lines_are_inconclusive_not_holds(run_dir: Path) -> None:
    """Degenerate data (every gate equally accurate) proves neither trend claim."""
    _flatten(run_dir, ["moe-lora/care-tau0.4/care", "moe-lora/care-tau0.8/care",
                       "moe-lora/top3/msp"])
    got = _by_text(run_dir)
    verdict, ours = got["accuracy rises with τ (highest vs lowest τ, paired)"]
    assert verdict == INCONCLUSIVE and "Δ = +0.000 pts" in ours
    verdict, ours = got["CARE reaches fixed-4 accuracy with fewer experts"]
    assert verdict == INCONCLUSIVE and "fixed top-4 − top3: Δ = +0.000 pts" in ours


def _frontier_above_4(run_dir: Path, b4_accuracy: float) -> None:
    """CARE at budgets 3, 4, 5 -> 0.40, ``b4_accuracy`` (< 0.55), 0.60: fixed-4's 0.55 is matched
    above 4 experts; CARE at B=4's correct set is a subset of fixed-4's (exact paired Δ)."""
    rows = [r for r in _rows(run_dir) if not r["method"].startswith("moe-lora/care-b")]
    for budget, acc in [(3, 0.40), (4, b4_accuracy), (5, 0.60)]:
        rows.append(_row(f"moe-lora/care-b{budget}/msp", avg_experts=float(budget), accuracy=acc))
    _write_rows(run_dir, rows)
    with np.load(run_dir / "scores.npz") as z:
        arrays = {k: z[k] for k in z.files}
    top4 = arrays[f"{MSP}|pooled|id|correct"]  # 0.55 of N, a prefix of the nested order
    b4 = top4.copy()
    b4[np.flatnonzero(top4)[int(b4_accuracy * N):]] = False  # a subset: exact paired difference
    arrays.update({f"moe-lora/care-b4/msp|pooled|{k}": arrays[f"{MSP}|pooled|{k}"]
                   for k in ("id|uncertainty", "id|confidence", "shift|uncertainty",
                             "shift|correct")})
    arrays["moe-lora/care-b4/msp|pooled|id|correct"] = b4
    np.savez(run_dir / "scores.npz", **arrays)


@pytest.mark.parametrize(("b4_accuracy", "verdict", "match", "delta"), [
    (0.48, FAILS, "4.58 experts (15% more", "+7.000"),  # 14 examples fewer: CI above 0
    # 2 examples fewer: a resample misses both with probability ~e^-2 >> 2.5%, CI touches 0
    (0.54, INCONCLUSIVE, "4.17 experts (4% more", "+1.000")])
def test_a_match_above_4_experts_fails_only_if_care_at_b4_is_less_accurate(
        run_dir: Path, b4_accuracy: float, verdict: str, match: str, delta: str) -> None:
    _frontier_above_4(run_dir, b4_accuracy)
    got, ours = _by_text(run_dir)["CARE reaches fixed-4 accuracy with fewer experts"]
    assert got == verdict
    assert ours.startswith(match)
    assert f"fixed top-4 − CARE at B=4: Δ = {delta} pts" in ours


def test_report_file_counts_every_claim(run_dir: Path) -> None:
    path = write_paper_report(run_dir)
    text = path.read_text()
    cs = claims(PaperRun(run_dir))
    assert text.count("\n| ") == len(cs) + 1  # header + one row per claim
    n_hold = sum(c.verdict == HOLDS for c in cs)
    n_fail = sum(c.verdict == FAILS for c in cs)
    assert f"Totals: {n_hold} hold, {n_fail} do not hold, {len(cs) - n_hold - n_fail}" in text


def test_report_command_rewrites_the_paper_report(run_dir: Path, capsys) -> None:
    from uqbench.cli import main

    (run_dir / "paper_report.md").write_text("stale verdicts")
    assert main(["report", str(run_dir), "--paper"]) == 0
    text = (run_dir / "paper_report.md").read_text()
    assert text.startswith("# CARE paper claims") and text in capsys.readouterr().out


def test_run_without_scores_is_a_user_error(run_dir: Path) -> None:
    (run_dir / "scores.npz").unlink()
    with pytest.raises(UserError, match="scores.npz"):
        write_paper_report(run_dir)


def test_matched_budget_interpolates_between_care_points() -> None:
    assert matched_budget([2, 3, 4], [0.50, 0.54, 0.56], 0.53) == (2.75, True)
    assert matched_budget([4, 2, 3], [0.56, 0.50, 0.54], 0.56) == (4.0, True)
    assert matched_budget([2, 3], [0.55, 0.56], 0.53) == (2.0, False)  # at or below
    assert matched_budget([2, 3], [0.50, 0.52], 0.53) is None


def test_claims_resting_on_a_model_at_chance_are_not_evidence(run_dir: Path) -> None:
    """A claim is marked when a method it compares has an ID accuracy CI that includes its
    domain's chance level (the ``chance`` row); its verdict is kept, the annotation beside it."""
    from uqbench.reporting.paper import AT_CHANCE

    assert not any(c.note for c in claims(PaperRun(run_dir)))  # no chance rows: nothing to mark
    rows = _rows(run_dir)
    for r in rows:
        if r["method"] == CARE and r["domain"] in ("pooled", "science"):
            r["accuracy_lo"], r["accuracy_hi"] = 0.20, 0.95  # includes 0.5 and 0.25
        elif r["method"] == MSP and r["domain"] == "pooled":
            r["accuracy_lo"], r["accuracy_hi"] = 0.51, 0.60  # above chance
    for dom, level in (("pooled", 0.5), ("science", 0.25), ("math", 0.25)):
        rows.append({"method": "chance", "model": "chance", "gate": "-", "scorer": "-",
                     "domain": dom, "accuracy": level, "accuracy_lo": level - 0.1,
                     "accuracy_hi": level + 0.1, "ece": float("nan")})
    _write_rows(run_dir, rows)
    by = {c.text: c for c in claims(PaperRun(run_dir))}
    for text in ("CARE's OOD-AUROC beats MoE top-4 + MSP", "CARE's OOD-AUROC beats MC-dropout",
                 "raw ECE comparable between CARE and MSP (|Δ| ≤ 0.03)",
                 ("one global τ spends more experts on harder domains (Spearman ρ of experts vs "
                  "error)")):  # the last rests on CARE's per-domain rows (science at chance)
        assert by[text].note == AT_CHANCE, text
    assert by["CARE's OOD-AUROC beats MoE top-4 + MSP"].verdict == HOLDS  # the verdict stays
    for text in ("mean experts rises monotonically with τ (point estimates)",
                 "CARE reaches fixed-4 accuracy with fewer experts",
                 "random-k loses accuracy vs fixed-k"):
        assert by[text].note == "", text
    report = write_paper_report(run_dir).read_text()
    line = next(ln for ln in report.splitlines() if "beats MoE top-4 + MSP" in ln)
    assert line.endswith(f"**{HOLDS}** — *{AT_CHANCE}* |")
    n = sum(c.note == AT_CHANCE for c in by.values())
    assert n == 7  # CARE vs MSP / MC / ensemble / ECE, the two selective claims, allocation
    assert f"{n} of these rest on a model at chance" in report


# --- Table "uq"'s single-pass MoE baselines; the ablation's concentration-only read-out ---------

EVERY = ("CARE's OOD-AUROC beats every single-pass MoE baseline (HydraLoRA + MSP, MixLoRA + MSP, "
         "DynMoLE + entropy, FlyLoRA + MSP, FlyLoRA + entropy)")


def _add(run_dir: Path, per_method: dict[str, dict[str, np.ndarray]]) -> None:
    with np.load(run_dir / "scores.npz") as z:
        arrays = {k: z[k] for k in z.files}
    rows = _rows(run_dir)
    for method, a in per_method.items():
        arrays.update({f"{method}|pooled|{k}": v for k, v in a.items()})
        rows.append(_row(method, accuracy=float(a["id|correct"].mean()),
                         ood_auroc=M.ood_auroc(a["id|uncertainty"], a["shift|uncertainty"])))
    _write_rows(run_dir, rows)
    np.savez(run_dir / "scores.npz", **arrays)


def test_care_beats_every_single_pass_moe_baseline(heavy_compute, run_dir: Path) -> None:
    from uqbench.reporting.paper import UQ_SINGLE_PASS

    verdict, ours = _by_text(run_dir)[EVERY]
    assert verdict == INCONCLUSIVE and ours.startswith("not measured")
    rng = np.random.default_rng(1)
    _add(run_dir, {m: _arrays(rng, None) for m in UQ_SINGLE_PASS[:-1]})  # AUROC 0.5 each
    verdict, ours = _by_text(run_dir)[EVERY]  # CARE (~0.86) beats the four, the fifth missing
    assert verdict == INCONCLUSIVE and ours.endswith("not measured: flylora/native/entropy")
    assert ours.count("vs ") == 4
    _add(run_dir, {UQ_SINGLE_PASS[-1]: _arrays(rng, None)})
    claim = next(c for c in claims(PaperRun(run_dir)) if c.text == EVERY)
    assert claim.verdict == HOLDS and claim.section == "uq"
    assert set(claim.rests_on) == {(m, "pooled") for m in (CARE, *UQ_SINGLE_PASS)}
    # the report says, next to that claim, that the baselines are simplified re-implementations
    from uqbench.reporting.paper import SIMPLIFIED_MARK, simplified_notes

    report = write_paper_report(run_dir).read_text()
    marked = [ln for ln in report.splitlines() if SIMPLIFIED_MARK in ln]
    assert len(marked) == 1 and marked[0].startswith(f"| uq | {EVERY}{SIMPLIFIED_MARK} |")
    note = report.split("\n‡ ", 1)[1]
    assert note.startswith("The MoE-LoRA baselines are uqbench's re-implementations")
    for model, text in simplified_notes().items():
        assert (text in note) == (model in ("hydralora", "mixlora", "dynmole", "flylora")), model
    with np.load(run_dir / "scores.npz") as z:
        care = {k.split("|", 2)[2]: z[k] for k in z.files if k.startswith(CARE + "|pooled|")}
    _add(run_dir, {"flylora/native/msp": care})  # identical to CARE: Δ = 0 exactly
    assert _by_text(run_dir)[EVERY][0] == INCONCLUSIVE
    _add(run_dir, {"mixlora/native/msp": _arrays(rng, 8.0)})  # one baseline clearly better
    assert _by_text(run_dir)[EVERY][0] == FAILS


def test_disagreement_claim_scores_nucleus_only_by_the_concentration_read_out(
        run_dir: Path) -> None:
    """CARE (w = 0.5) against nucleus-only under the w = 0 read-out; the nucleus-only row
    scored by CARE's own read-out (which holds D already) is not the comparison."""
    from uqbench.core.experiments import CONCENTRATION

    rng = np.random.default_rng(2)
    _add(run_dir, {"moe-lora/nucleus-only/care": _arrays(rng, 8.0),  # would make it fail
                   f"moe-lora/nucleus-only/{CONCENTRATION}": _arrays(rng, None)})
    claim = next(c for c in claims(PaperRun(run_dir)) if c.text.startswith("disagreement term "
                                                                      "raises OOD-AUROC"))
    assert "concentration-only read-out, w = 0" in claim.text and "w = 0.5" in claim.text
    assert claim.verdict == HOLDS
    assert claim.rests_on == ((CARE, "pooled"),
                              (f"moe-lora/nucleus-only/{CONCENTRATION}", "pooled"))


def test_a_single_experiments_report_has_its_own_claims_only(run_dir: Path) -> None:
    everything = claims(PaperRun(run_dir))
    text = write_paper_report(run_dir, "ablation").read_text()
    n_ablation = sum(c.section == "ablation" for c in everything)
    assert n_ablation == 5 and text.count("\n| ablation |") == n_ablation
    assert text.count("\n| ") == n_ablation + 1 and "experiment `ablation` only" in text
    # without an argument: the experiment run.json records; no run.json (or none named): all
    (run_dir / "run.json").write_text(json.dumps({"config": {"experiment": "thermostat"}}))
    text = write_paper_report(run_dir).read_text()
    assert text.count("\n| thermostat |") == 2 and text.count("\n| ") == 3
    (run_dir / "run.json").write_text(json.dumps({"config": {"experiment": None}}))
    assert write_paper_report(run_dir).read_text().count("\n| ") == len(everything) + 1
    with pytest.raises(UserError, match="unknown experiment 'ablations'"):
        write_paper_report(run_dir, "ablations")


def test_paired_verdicts_pool_every_seed(run_dir: Path) -> None:
    """scores.npz holds (N, seeds) arrays; a paired difference resamples examples (the same for
    every seed) and pools the seeds. Seed 0 alone would say the τ=0.8 CARE is 10 points more
    accurate than τ=0.4; seed 1 reverses it exactly, so pooled Δ = 0 with a CI of width 0."""
    from uqbench.reporting.paper import paired_interval

    run = PaperRun(run_dir)
    hi, lo = "moe-lora/care-tau0.8/care", "moe-lora/care-tau0.4/care"
    seed0 = paired_interval(run, hi, lo, "accuracy")
    assert seed0[0] == pytest.approx(0.10)
    c_hi, c_lo = (run.arrays[f"{m}|pooled|id|correct"] for m in (hi, lo))
    for m in (hi, lo):
        for k in ("id|uncertainty", "id|confidence", "shift|correct", "shift|uncertainty"):
            a = run.arrays[f"{m}|pooled|{k}"]
            run.arrays[f"{m}|pooled|{k}"] = np.stack([a, a], 1)
    run.arrays[f"{hi}|pooled|id|correct"] = np.stack([c_hi, c_lo], 1)   # seed 1 reversed
    run.arrays[f"{lo}|pooled|id|correct"] = np.stack([c_lo, c_hi], 1)
    assert paired_interval(run, hi, lo, "accuracy") == pytest.approx((0.0, 0.0, 0.0, 0))
    assert run.a(hi, "id", "correct").shape == (N, 2)


@pytest.mark.parametrize("where, verdict", [("high", HOLDS), ("low", FAILS), (None, INCONCLUSIVE)])
def test_gain_of_a_fifth_expert_against_disagreement(run_dir: Path, where: str | None,
                                                     verdict: str) -> None:
    """Figure "mechanism" (c) as a claim: a 5th expert turns 30 wrong top-4 answers right, all
    among the examples of high (or low) top-4 disagreement: the gain above the median is
    30 / 100 = 30 pts and 0 below, a difference of ±30 pts."""
    from uqbench.reporting.paper import gain_with_disagreement

    run = PaperRun(run_dir)
    c4 = run.arrays[f"{MSP}|pooled|id|correct"].astype(bool)
    dis = np.random.default_rng(1).permutation(N).astype(float)
    if where is None:
        assert "not measured" in gain_with_disagreement(run).ours
        return
    pool = np.flatnonzero(~c4 & ((dis >= N / 2) if where == "high" else (dis < N / 2)))
    c5 = c4.copy()
    c5[pool[:30]] = True
    run.arrays.update({"moe-lora/top5/msp|pooled|id|correct": c5,
                       "moe-lora/top4|pooled|id|disagreement": dis})
    c = gain_with_disagreement(run)
    assert c.verdict == verdict
    assert f"Δ = {'+' if where == 'high' else '-'}30.000 pts" in c.ours
    assert "(200 examples)" in c.ours  # the fixture has no shifted disagreement: ID only


def test_undefined_bootstrap_resamples_are_counted_warned_and_recorded(run_dir: Path) -> None:
    """One example alone has top-4 disagreement above the median: a resample without it has no
    "above" half and an undefined statistic. Those resamples (counted by hand, with the same
    draws) are left out of the CI, warned about, recorded and shown in the claim."""
    from uqbench.core.errors import FallbackWarning, reset_fallbacks
    from uqbench.reporting.paper import N_BOOT, gain_with_disagreement

    run = PaperRun(run_dir)
    dis = np.zeros(N)
    dis[7] = 1.0
    run.arrays.update({"moe-lora/top5/msp|pooled|id|correct": ~run.a(MSP, "id", "correct"),
                       "moe-lora/top4|pooled|id|disagreement": dis})
    rng = np.random.default_rng(0)
    missing = sum(7 not in rng.integers(0, N, N) for _ in range(N_BOOT))
    assert 0 < missing < N_BOOT
    record = reset_fallbacks()
    with pytest.warns(FallbackWarning, match=f"{missing} of {N_BOOT} resamples gave NaN"):
        c = gain_with_disagreement(run)
    assert f"({missing} of {N_BOOT} resamples undefined, left out of the CI)" in c.ours
    assert [(r["what"], r["where"]) for r in record] == [("paper claim bootstrap", c.text)]
    reset_fallbacks()


def _experiment_methods(section: str) -> set[str]:
    from tests.conftest import builtin_scorers
    from uqbench.core.experiments import experiment_methods, experiment_scorers
    from uqbench.core.scorer import get_scorer

    chosen = [get_scorer(n) for n in builtin_scorers()]
    return {m.name for m in experiment_methods(section, 4.0,
                                               lambda e: experiment_scorers(e) or chosen)}


def _unknown(spec: Any, names: set[str]) -> list[str]:
    """The methods (`fnmatch` patterns) of a declared claim that its experiment does not run."""
    from fnmatch import fnmatchcase

    return [p for p in spec.methods if not any(fnmatchcase(n, p) for n in names)]


def test_every_declared_claim_names_methods_of_its_experiment() -> None:
    """A misspelt method would leave its claim "not measured" (inconclusive) on every run: each
    name in `CLAIMS` must be one its section's experiment runs (a single experiment's report
    holds its own section's claims)."""
    from dataclasses import replace

    from uqbench.reporting.paper import CLAIMS

    names = {s: _experiment_methods(s) for s in {spec.section for spec in CLAIMS}}
    for spec in CLAIMS:
        assert spec.methods and not _unknown(spec, names[spec.section]), spec
    typo = replace(CLAIMS[0], b="moe-lora/top4/mps")  # the check sees a typo
    assert _unknown(typo, names["uq"]) == ["moe-lora/top4/mps"]
    assert _unknown(replace(CLAIMS[0], section="kmax"), names["kmax"]) == list(CLAIMS[0].methods)


def test_claims_resting_on_a_model_no_better_than_zero_shot_are_not_evidence(
        run_dir: Path) -> None:
    """A claim is marked when a method it compares has a learned column (trained minus
    zero-shot accuracy) whose CI does not lie above 0; both marks join when both apply."""
    from uqbench.reporting.paper import AT_CHANCE, NOT_LEARNED

    rows = _rows(run_dir)
    for r in rows:
        if r["method"] == CARE and r["domain"] == "pooled":
            r["learned"], r["learned_lo"], r["learned_hi"] = 0.01, -0.02, 0.04   # includes 0
        elif r["method"] == CARE and r["domain"] == "science":
            r["learned"], r["learned_lo"], r["learned_hi"] = 0.10, 0.05, 0.15    # above 0
            r["accuracy_lo"], r["accuracy_hi"] = 0.20, 0.95                      # at chance
        elif r["method"] == CARE and r["domain"] == "math":
            r["learned"], r["learned_lo"], r["learned_hi"] = -0.05, -0.09, -0.01  # below 0
        elif r["method"] == MSP and r["domain"] == "pooled":
            r["learned"], r["learned_lo"], r["learned_hi"] = 0.00, 0.00, 0.03    # lo at 0
    rows.append({"method": "chance", "model": "chance", "gate": "-", "scorer": "-",
                 "domain": "science", "accuracy": 0.25, "accuracy_lo": 0.15,
                 "accuracy_hi": 0.35, "ece": float("nan")})
    _write_rows(run_dir, rows)
    by = {c.text: c for c in claims(PaperRun(run_dir))}
    assert by["CARE's OOD-AUROC beats MoE top-4 + MSP"].note == NOT_LEARNED
    assert by["mean experts rises monotonically with τ (point estimates)"].note == ""
    allocation = ("one global τ spends more experts on harder domains (Spearman ρ of experts vs "
                  "error)")   # rests on CARE's per-domain rows: science and math, both marks
    assert by[allocation].note == f"{AT_CHANCE}; {NOT_LEARNED}"
    report = write_paper_report(run_dir).read_text()
    n = sum(NOT_LEARNED in c.note for c in by.values())
    assert n >= 2 and f"{n} rest on a model no better than its zero-shot backbone" in report
    assert "1 of these rest on a model at chance" in report
