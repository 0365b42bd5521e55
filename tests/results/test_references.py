"""Reference rows (chance, options-only) and the at-chance warning, on hand-built splits and
rows."""
from __future__ import annotations

import json
import logging
import math

import numpy as np
import pytest

from uqbench.data.artifacts import chance_interval, classifier_accuracy
from uqbench.data.records import MCRecord, Split
from uqbench.data.suites.spec import Suite
from uqbench.results.evaluate import ROW_COLUMNS
from uqbench.results.references import (
    at_chance,
    at_chance_message,
    reference_inputs,
    reference_rows,
    warn_at_chance,
)
from uqbench.results.tables import is_reference, latex_table, markdown_table, summary, write_results

WORDS = ("apple", "river", "stone", "cloud", "tiger", "maple", "ocean", "piano", "lemon")


def _records(domain: str, n: int, ks: tuple[int, ...], seed: int) -> tuple[MCRecord, ...]:
    """Questions with k options from ``ks`` in turn; the gold option is the longest in most of
    them (an artifact the options-only classifier can learn)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        k = ks[i % len(ks)]
        choices = [str(rng.choice(WORDS)) for _ in range(k)]
        ans = int(rng.integers(k))
        if rng.random() < 0.8:
            choices[ans] = choices[ans] + " and " + str(rng.choice(WORDS))
        out.append(MCRecord(f"{domain}{seed}-{i}", domain, f"question {i}?", tuple(choices),
                            ans, "toy"))
    return tuple(out)


def _suite() -> Suite:
    splits = {}
    for d, ks in (("science", (2, 4)), ("math", (4, 5, 3))):
        for j, (role, n) in enumerate((("train", 80), ("id", 30), ("shift", 24), ("calib", 8))):
            splits[d, role] = Split(d, role, _records(d, n, ks, seed=10 * j + len(d)), {})
    return Suite("toy", "smoke", ("science", "math"), splits)


@pytest.fixture(scope="module")
def suite() -> Suite:
    return _suite()


@pytest.fixture(scope="module")
def refs(suite: Suite) -> dict[tuple[str, str], dict]:
    rows = reference_rows(reference_inputs(suite), n_boot=200)
    return {(r["method"], r["domain"]): r for r in rows}


def test_chance_is_the_mean_of_one_over_k_by_hand(suite: Suite, refs) -> None:
    assert set(refs) == {(m, d) for m in ("chance", "options-only")
                         for d in ("science", "math", "pooled")}
    # science alternates 2 and 4 options over 30 ID questions: 15 x 1/2 + 15 x 1/4
    assert refs["chance", "science"]["accuracy"] == pytest.approx((15 / 2 + 15 / 4) / 30)
    # math cycles 4, 5, 3 options over 30: 10 each
    math_chance = (10 / 4 + 10 / 5 + 10 / 3) / 30
    assert refs["chance", "math"]["accuracy"] == pytest.approx(math_chance)
    pooled = (15 / 2 + 15 / 4 + 10 / 4 + 10 / 5 + 10 / 3) / 60
    assert refs["chance", "pooled"]["accuracy"] == pytest.approx(pooled)
    # shift: 24 questions, science 12 x 2 and 12 x 4 options
    assert refs["chance", "science"]["shift_accuracy"] == pytest.approx((12 / 2 + 12 / 4) / 24)
    # the interval is where a uniform guesser lands (Poisson-binomial quantiles)
    row = refs["chance", "science"]
    lo, hi = chance_interval(suite.split("science", "id").records)
    assert (row["accuracy_lo"], row["accuracy_hi"]) == (lo, hi)
    assert lo < row["accuracy"] < hi


def test_options_only_is_the_artifact_classifier_on_the_id_split(suite: Suite, refs) -> None:
    accs = {}
    for d in ("science", "math"):
        train, test = suite.split(d, "train").records, suite.split(d, "id").records
        accs[d] = classifier_accuracy(train, test, seed=0)
        row = refs["options-only", d]
        assert row["accuracy"] == pytest.approx(accs[d])
        assert row["accuracy_lo"] <= row["accuracy"] <= row["accuracy_hi"]
        shift = suite.split(d, "shift").records
        assert row["shift_accuracy"] == pytest.approx(classifier_accuracy(train, shift, seed=0))
    assert accs["science"] > 0.5  # the longest-option artifact is learnt
    # pooled: the domains' predictions concatenated (30 ID questions each)
    assert refs["options-only", "pooled"]["accuracy"] == pytest.approx(
        (accs["science"] + accs["math"]) / 2)
    again = reference_rows(reference_inputs(suite), n_boot=200)
    assert json.dumps(again) == json.dumps(list(refs.values()))  # deterministic, NaN-safe


def test_reference_rows_have_the_accuracy_columns_only(refs) -> None:
    for row in refs.values():
        assert is_reference(row) and row["gate"] == row["scorer"] == "-"
        assert row["model"] == row["method"] and row["n_id"] > 0
        for c in ROW_COLUMNS:
            if c not in ("accuracy", "shift_accuracy"):
                assert math.isnan(row[c]), c
        assert math.isnan(row["ece_lo"]) and math.isnan(row["forward_passes"])


def _model_row(method: str, domain: str, acc: float, lo: float, hi: float) -> dict:
    model, gate, scorer = method.split("/")
    row = {"method": method, "model": model, "gate": gate, "scorer": scorer, "domain": domain,
           **{c: 0.5 for c in ROW_COLUMNS}, "accuracy": acc, "accuracy_lo": lo, "accuracy_hi": hi,
           "forward_passes": 1, "seeds": 1}
    return row


def test_every_writer_copes_with_reference_rows(tmp_path, refs) -> None:
    rows = [_model_row("moe-lora/top4/msp", d, 0.6, 0.5, 0.7) for d in ("science", "pooled")]
    rows += list(refs.values())
    paths = write_results(tmp_path, rows, {"suite": "toy"})
    md = paths["md"].read_text()
    assert "| chance | pooled |" in md and "| options-only | science |" in md
    assert "options-only" in paths["tex"].read_text() and latex_table(rows)
    lines = summary(rows).splitlines()
    assert any(ln.startswith("chance") for ln in lines)
    assert "–" in next(ln for ln in lines if ln.startswith("chance"))  # no ECE for a reference
    assert markdown_table(rows)
    csv_text = paths["csv"].read_text()
    assert "chance,chance,-,-,pooled" in csv_text


def test_a_run_that_trained_nothing_shows_no_learned_column(tmp_path, refs) -> None:
    """Predictions scored from elsewhere (run.json without a suite): no Learned column in the
    printed summary, results.md and .tex; a trained run (its suite named) keeps it."""
    rows = [_model_row("moe-lora/top4/msp", d, 0.6, 0.5, 0.7) for d in ("science", "pooled")]
    rows += list(refs.values())
    for meta, shown in (({"suite": "toy"}, True), ({"scored_from": "lm-eval samples"}, False)):
        paths = write_results(tmp_path / str(shown), rows, meta)
        model_md = paths["md"].read_text().split("## Model level")[1].split("## Scorer")[0]
        assert ("| Learned |" in model_md) is shown
        assert ("Learned" in paths["tex"].read_text()) is shown
        assert ("Learned" in summary(rows, learned=shown).splitlines()[0]) is shown
        assert "Acc" in summary(rows, learned=shown).splitlines()[0]


def test_the_printed_scorer_level_names_no_model_without_rows() -> None:
    """A model none of whose scorers has a value in the printed scorer columns is not named
    above an empty block; with no such model at all the scorer level is left out."""
    def row(method: str, value: float) -> dict:
        r = _model_row(method, "pooled", 0.6, 0.5, 0.7)
        r.update(dict.fromkeys(("ood_auroc", "aurc", "augrc", "sel_acc_80"), value))
        return r

    lines = summary([row("a/reported/msp", float("nan")), row("b/x/msp", 0.3)]).splitlines()
    scorer = lines[lines.index(next(ln for ln in lines if ln.startswith("Scorer"))):]
    assert "b/x" in scorer and "a/reported" not in scorer
    assert [ln.strip().split()[0] for ln in scorer[1:]] == ["b/x", "msp"]
    only = summary([row("a/reported/msp", float("nan"))])
    assert "Scorer" not in only and only.splitlines()[1].startswith("a/reported")


def test_warning_fires_for_a_model_at_chance_not_above_it(caplog) -> None:
    rows = [
        {"method": "chance", "model": "chance", "gate": "-", "scorer": "-", "domain": "math",
         "accuracy": 0.25, "accuracy_lo": 0.17, "accuracy_hi": 0.34},
        {"method": "chance", "model": "chance", "gate": "-", "scorer": "-", "domain": "pooled",
         "accuracy": 0.30, "accuracy_lo": 0.25, "accuracy_hi": 0.35},
        _model_row("moe-lora/top4/msp", "math", 0.27, 0.21, 0.33),    # CI includes 0.25
        _model_row("moe-lora/care/care", "math", 0.45, 0.36, 0.54),   # above chance
        _model_row("moe-lora/care/care", "pooled", 0.31, 0.30, 0.40),  # includes 0.30
        _model_row("lora/dense/msp", "pooled", 0.20, 0.12, 0.29),     # below chance, CI too
        _model_row("lora/dense/msp", "code", 0.25, 0.2, 0.3),         # no chance row: unchecked
    ]
    flags = at_chance(rows)
    assert [(f["method"], f["domain"]) for f in flags] == [("moe-lora/top4/msp", "math"),
                                                          ("moe-lora/care/care", "pooled")]
    assert flags[0] == {"method": "moe-lora/top4/msp", "domain": "math", "accuracy": 0.27,
                        "accuracy_lo": 0.21, "accuracy_hi": 0.33, "chance": 0.25}
    msg = at_chance_message(flags)
    assert ("moe-lora/top4/msp on math: ID accuracy 0.27 [0.21, 0.33] includes chance 0.25 — "
            "its UQ numbers measure a model at chance") in msg
    assert "care/care on math" not in msg
    with caplog.at_level(logging.WARNING, logger="uqbench.results.references"):
        assert warn_at_chance(rows) == flags
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].getMessage() == msg  # once, listing them all
    caplog.clear()
    above = [r for r in rows if r["method"] == "chance" or r["accuracy_lo"] > 0.34]
    with caplog.at_level(logging.WARNING, logger="uqbench.results.references"):
        assert warn_at_chance(above) == []
    assert not caplog.records and at_chance_message([]) == ""
