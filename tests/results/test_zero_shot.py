"""The ``zero-shot`` reference (the frozen backbone through the run's head) and the ``learned``
column (a model's accuracy minus it, paired bootstrap): hand-worked values, a numpy reference
of the bootstrap, and the engine's one cached pass on a tiny random decoder."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from tests.support.data import toy_records
from uqbench.core.engine import RunStats
from uqbench.core.profiles import get_profile
from uqbench.results.references import (
    ReferenceInputs,
    is_reference,
    learned_columns,
    reference_rows,
)

#: 0/1 correctness of the zero-shot backbone and of a model (two seeds) on 8 ID questions
ZS_A = np.array([1, 0, 0, 1, 0, 0, 1, 0], dtype=float)           # 3/8
MODEL_A = np.array([[1, 1], [1, 0], [0, 0], [1, 1], [1, 1], [0, 1], [1, 1], [0, 0]], dtype=float)
ZS_B = np.array([1, 1, 0, 1], dtype=float)                      # 3/4
MODEL_B = np.array([[0, 0], [1, 1], [0, 1], [1, 1]], dtype=float)


def refs(zero_shot: dict | None = None) -> ReferenceInputs:
    ks = {f"{d}/{r}": np.full(n // (1 + (r == "shift")), 4) for d, n in (("a", 8), ("b", 4))
          for r in ("id", "shift")}
    zs = {"a/id": ZS_A, "a/shift": ZS_A[:4], "b/id": ZS_B, "b/shift": ZS_B[1:3]}
    hashes = {f"{d}/{r}": f"{d}{r}" for d in "ab" for r in ("id", "shift")}
    return ReferenceInputs(("a", "b"), ks, None, hashes, zs if zero_shot is None else zero_shot)


def numpy_paired(model: np.ndarray, zs: np.ndarray, n_boot: int, seed: int) -> tuple[float, ...]:
    """The reference: the same question indices for both sides, drawn as numpy draws them."""
    idx = np.random.default_rng(seed).integers(0, len(zs), size=(n_boot, len(zs)))
    diffs = model[idx].mean(axis=(1, 2)) - zs[idx].mean(axis=1)
    lo, hi = np.quantile(diffs, [0.025, 0.975])
    return model.mean() - zs.mean(), lo, hi


def test_learned_is_accuracy_minus_zero_shot_with_a_paired_bootstrap_ci() -> None:
    got = learned_columns(refs(), ["a"], MODEL_A, n_boot=300)
    # by hand: the model's seeds get 5/8 and 5/8 right, the backbone 3/8: +2/8
    assert got["learned"] == pytest.approx(0.25)
    d, lo, hi = numpy_paired(MODEL_A, ZS_A, 300, 0)
    assert (got["learned"], got["learned_lo"], got["learned_hi"]) == pytest.approx((d, lo, hi))
    # pooled: the domains' questions concatenated in order (a then b)
    pooled = learned_columns(refs(), ["a", "b"], np.concatenate([MODEL_A, MODEL_B]), n_boot=300)
    # model: (5 + 5 + 2 + 3) / 24 seeds-questions = 15/24; backbone 6/12
    assert pooled["learned"] == pytest.approx(15 / 24 - 6 / 12)
    ref = numpy_paired(np.concatenate([MODEL_A, MODEL_B]), np.concatenate([ZS_A, ZS_B]), 300, 0)
    assert (pooled["learned"], pooled["learned_lo"], pooled["learned_hi"]) == pytest.approx(ref)
    # a model that answers exactly as the backbone learned nothing, with no spread at all
    same = learned_columns(refs(), ["a"], np.stack([ZS_A, ZS_A], 1), n_boot=100)
    assert (same["learned"], same["learned_lo"], same["learned_hi"]) == (0.0, 0.0, 0.0)
    # without a zero-shot the columns are there, NaN
    none = learned_columns(ReferenceInputs(("a",), {}, None, {}), ["a"], MODEL_A, n_boot=100)
    assert all(np.isnan(v) for v in none.values()) and set(none) == {
        "learned", "learned_lo", "learned_hi"}


@pytest.mark.filterwarnings("ignore:evaluate. the ID Scored has no predictive")
def test_learned_draws_the_accuracy_columns_resamples() -> None:
    """One seed for both: the CI of the learned column resamples the questions the accuracy
    column's CI resamples, so a backbone that is right everywhere shifts it by exactly 1."""
    from uqbench.results.evaluate import Scored, evaluate

    s = Scored(np.zeros_like(MODEL_A), np.full_like(MODEL_A, 0.5), MODEL_A, None)
    row = evaluate(s, s, n_boot=300, seed=0)
    got = learned_columns(refs({"a/id": np.ones(8), "a/shift": np.ones(4)}), ["a"], MODEL_A,
                          n_boot=300)
    assert got["learned"] == pytest.approx(row["accuracy"] - 1)
    assert (got["learned_lo"], got["learned_hi"]) == pytest.approx(
        (row["accuracy_lo"] - 1, row["accuracy_hi"] - 1))


def test_zero_shot_rows_beside_chance_with_hand_worked_accuracy() -> None:
    rows = {(r["method"], r["domain"]): r for r in reference_rows(refs(), n_boot=200)}
    assert {m for m, _ in rows} == {"chance", "zero-shot"}   # no options-only table given
    a, b, pooled = (rows["zero-shot", d] for d in ("a", "b", "pooled"))
    assert (a["accuracy"], a["shift_accuracy"]) == (3 / 8, 2 / 4)
    assert (b["accuracy"], b["shift_accuracy"]) == (3 / 4, 1 / 2)
    assert (pooled["accuracy"], pooled["n_id"], pooled["n_shift"]) == (6 / 12, 12, 6)
    assert pooled["shift_accuracy"] == 3 / 6
    idx = np.random.default_rng(0).integers(0, 8, size=(200, 8))
    assert (a["accuracy_lo"], a["accuracy_hi"]) == pytest.approx(
        tuple(np.quantile(ZS_A[idx].mean(1), [0.025, 0.975])))
    assert (a["model"], a["gate"], a["scorer"]) == ("zero-shot", "-", "-")
    assert is_reference(a) and np.isnan(a["ece"])
    assert not any(m == "zero-shot" for m, _ in
                   {(r["method"], r["domain"]) for r in reference_rows(
                       ReferenceInputs(("a",), {"a/id": np.full(8, 4), "a/shift": np.full(4, 4)},
                                       None, {"a/id": "x", "a/shift": "y"}), n_boot=50)})


def _engine(backbone: str, tmp_path, stats: RunStats | None = None):
    from baselines.engine import TorchEngine

    return TorchEngine(backbone, get_profile("smoke"), None, tmp_path, stats or RunStats(),
                       progress=False)


def test_zero_shot_pass_is_the_frozen_backbone_through_the_head_once_then_cached(tmp_path
                                                                                ) -> None:
    from baselines.forward import FORWARD_PASSES, collect
    from baselines.heads import make_plain

    recs = toy_records(7, n_choices=(3, 4))
    split = SimpleNamespace(records=recs, hash="h-toy", name="toy/id", role="id")
    stats = RunStats()
    e = _engine("tiny-llama", tmp_path, stats)
    assert e.zero_shot_log == {"head": "letters", "applies": True}
    before = FORWARD_PASSES["deterministic"]
    out = e.zero_shot(split)
    assert out is not None and FORWARD_PASSES["deterministic"] == before + 1
    assert stats.passes["zero-shot", 0, "-", "toy/id", "deterministic"] == 1
    # the backbone itself is left without adapters: a plain head on a fresh copy scores alike
    want = collect(make_plain(e.backbone(), mode="letters"), recs, batch_size=64, max_length=96,
                   progress=False)["logits"]
    np.testing.assert_allclose(out.logits, want, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(out.labels, [r.answer for r in recs])
    # a second engine on the same cache reads the record back: no pass
    stats2 = RunStats()
    again = _engine("tiny-llama", tmp_path, stats2).zero_shot(split)
    assert again is not None and stats2.cache_hits == 1 and not stats2.passes
    np.testing.assert_array_equal(again.logits, out.logits)
    # the cloze head is its own record
    cloze = _engine("tiny-llama", tmp_path)
    cloze.head = "cloze"
    assert cloze.zero_shot_log["head"] == "cloze"
    assert cloze.zero_shot(split).logits.shape == (7, 4)   # type: ignore[union-attr]


def test_an_encoder_head_has_no_zero_shot_and_says_why(tmp_path) -> None:
    e = _engine("tiny-bert", tmp_path)
    log = e.zero_shot_log
    assert log["head"] == "bi_encoder" and log["applies"] is False
    assert "similar" in log["reason"]
    assert e.zero_shot(SimpleNamespace(records=toy_records(3), hash="h", name="t/id")) is None
    e.head = "cross_encoder"
    assert "random before training" in e.zero_shot_log["reason"]


def test_learned_lines_name_the_domains_training_improved() -> None:
    """The report's words: per model/gate, the domains whose learned CI lies above 0, those
    whose CI includes it, those below; without a zero-shot the reason run.json gives."""
    from uqbench.files.rundir import RunFolder
    from uqbench.reporting.answers import learned, learned_lines

    def row(dom: str, v: float, lo: float, hi: float, scorer: str = "msp") -> dict:
        return {"method": f"lora/dense/{scorer}", "model": "lora", "gate": "dense",
                "scorer": scorer, "domain": dom, "accuracy": 0.5 + v, "learned": v,
                "learned_lo": lo, "learned_hi": hi}

    rows = [row("pooled", 0.02, -0.01, 0.05), row("science", 0.12, 0.05, 0.19),
            row("code", -0.06, -0.1, -0.02), row("science", 0.12, 0.05, 0.19, "entropy")]
    got = learned(RunFolder(Path("x"), rows))
    assert [(x.domain, x.verdict) for x in got] == [
        ("pooled", "not shown"), ("science", "improved"), ("code", "worse")]
    assert learned_lines(RunFolder(Path("x"), rows)) == [
        ("lora/dense: training improved on science (+0.120 [+0.050, +0.190]); did not improve "
        "on pooled (+0.020 [-0.010, +0.050]); made worse code (-0.060 [-0.100, -0.020]).")]
    nan = [dict(r, learned=float("nan")) for r in rows]
    meta = {"suite": "pooled",
            "references_skipped": {"zero-shot": "head 'bi_encoder' gives no answer untrained"}}
    assert learned_lines(RunFolder(Path("x"), nan, meta=meta)) == [
        ("What training added over the backbone is unknown: no zero-shot reference (head "
        "'bi_encoder' gives no answer untrained).")]
    # predictions scored from elsewhere (no suite: nothing was trained) ask no such question
    scored = {"scored_from": "lm-evaluation-harness samples",
              "references_skipped": {"zero-shot": "these records hold none"}}
    assert learned_lines(RunFolder(Path("x"), nan, meta=scored)) == []
    merged = {"source": "several models", "models": {"a": {"suite": "pooled"}, "b": {}}}
    assert learned_lines(RunFolder(Path("x"), nan, meta={
        **merged, "references_skipped": meta["references_skipped"]})) != []


def test_a_decoder_run_has_zero_shot_rows_and_learned_columns_end_to_end(
        real_data, tmp_path, capsys) -> None:
    """`uqbench run` on a tiny random decoder (letters head) and the real ARC science domain:
    a zero-shot row per domain, every model row's learned column equal to its accuracy minus
    it (paired CI), the run.json fields, the report's words; `uqbench score` of the run's
    records gives the same results; an encoder run says why it has none."""
    import json

    from tests.support.suites import arc_suite
    from uqbench.io.recordset import read_record_set
    from uqbench.run.runner import RunConfig, run
    from uqbench.run.score_records import ScoreConfig, score

    (tmp_path / "tiny.yaml").write_text(arc_suite(caps=(12, 8, 10, 10), header="choices: 4\n"))
    res = run(RunConfig(suite=str(tmp_path / "tiny.yaml"), profile="smoke",
                        backbone="tiny-llama", models=("lora",), scorers=("msp", "entropy"),
                        out=tmp_path / "out", cache_dir=tmp_path / "cache", data_dir=real_data,
                        figures=False, progress=False, score_workers=1))
    zs = {r["domain"]: r for r in res.rows if r["method"] == "zero-shot"}
    assert set(zs) == {"science", "pooled"} and zs["science"]["accuracy"] == zs["pooled"][
        "accuracy"]
    models = [r for r in res.rows if not is_reference(r)]
    assert models and all(r["learned"] == pytest.approx(r["accuracy"] - zs[r["domain"]][
        "accuracy"]) and r["learned_lo"] <= r["learned"] <= r["learned_hi"] for r in models)
    meta = json.loads((res.out / "run.json").read_text())
    assert meta["zero_shot"] == {"head": "letters", "applies": True}
    assert "references_skipped" not in meta
    assert meta["forward_passes_run"]["zero-shot/0/-/science/id/deterministic"] == 1
    assert "lora/dense: training" in capsys.readouterr().out
    again = score(read_record_set(res.out / "records"),
                  ScoreConfig(out=tmp_path / "scored", figures=False))
    assert (tmp_path / "scored" / "results.csv").read_text() == \
        (res.out / "results.csv").read_text()
    assert len(again.rows) == len(res.rows)
    # the same suite on an encoder: no zero-shot row, NaN learned, and the reason recorded
    enc = run(RunConfig(suite=str(tmp_path / "tiny.yaml"), profile="smoke",
                        backbone="tiny-bert", models=("lora",), scorers=("msp",),
                        out=tmp_path / "enc", cache_dir=tmp_path / "cache", data_dir=real_data,
                        figures=False, progress=False, score_workers=1))
    assert not any(r["method"] == "zero-shot" for r in enc.rows)
    assert all(np.isnan(r["learned"]) for r in enc.rows if not is_reference(r))
    meta = json.loads((enc.out / "run.json").read_text())
    assert meta["zero_shot"]["applies"] is False
    assert "bi_encoder" in meta["references_skipped"]["zero-shot"]
    html = (enc.out / "report.html").read_text()
    assert "no zero-shot reference" in html and "zero-shot</b> reference row left out" in html
