"""Figures: a synthetic run folder in the layout `uqbench run` writes, drawn end to end; the
drawn data checked against the `uqbench.stats.metrics` curve functions."""
from __future__ import annotations

import json
import logging
import warnings
import zlib
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import pytest
from matplotlib.figure import Figure

from figures import calibration, compute, forest, mechanism, ood, selective
from figures.data import RunData, load_run
from figures.run import draw_run
from uqbench.core.errors import UserError
from uqbench.reporting.paper import matched_budget
from uqbench.results.tables import FOREST_COLUMNS, chance_reasons, random_ranking
from uqbench.stats import metrics as M

matplotlib.use("Agg")

DOMAINS = ("science", "math")
N = {"id": 140, "shift": 110}
ROUTER = ("route_entropy", "top1_mass", "disagreement", "experts")
RECAL = ("confidence_ts", "confidence_hb", "confidence_iso")


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _gates(frontier: bool, extra: bool) -> dict[str, tuple[str, float]]:
    """gate -> (kind, knob): topk (k), care (budget) or caretau (tau)."""
    g: dict[str, tuple[str, float]] = {"top4": ("topk", 4), "care": ("care", 4.0)}
    if frontier:
        g |= {f"top{k}": ("topk", k) for k in (1, 2, 3, 5, 6, 8)}
        g |= {f"care-b{b}": ("care", b) for b in (2, 3, 4, 5)}
    if extra:
        g |= {f"care-tau{t:g}": ("caretau", t) for t in (0.4, 0.5, 0.6, 0.7, 0.8)}
        g |= {"fixed-k": ("topk", 4), "random-k": ("topk", 3.7), "entropy-k": ("care", 3.8),
              "nucleus-only": ("care", 3.9)}
    return g


def make_run(root: Path, *, frontier: bool = True, extra: bool = True,
             degenerate: bool = False, empty_shift: bool = False) -> Path:
    """A run folder: results.jsonl, scores.npz (the documented keys) and run.json."""
    rng = np.random.default_rng(0)
    arrays: dict[str, np.ndarray] = {}
    # One latent difficulty per example, shared by every pair (same examples everywhere).
    z = {(d, r): rng.normal(size=N[r]) + (0.9 if r == "shift" else 0.0) + 0.3 * i
         for i, d in enumerate(DOMAINS) for r in N}
    pairs: dict[str, tuple[str, float]] = {"lora/dense": ("dense", 0.0)}
    pairs |= {f"moe-lora/{g}": v for g, v in _gates(frontier, extra).items()}
    methods: list[tuple[str, str]] = []
    for pair, (kind, knob) in pairs.items():
        scorers = ["msp", "entropy"] if pair in ("lora/dense", "moe-lora/top4") else ["msp"]
        if kind == "care" or pair == "moe-lora/top4":
            scorers.append("care")
        methods += [(pair, s) for s in scorers]
        for (dom, role), zz in z.items():
            n = zz.size
            noise = np.random.default_rng(zlib.crc32(f"{pair}|{dom}|{role}".encode()))
            if kind == "care":
                experts = np.clip(np.round(knob + 1.3 * zz + noise.normal(0, 0.5, n)), 1, 8)
                skill = 0.25 * knob + 0.25
            elif kind == "caretau":
                experts = np.clip(np.round(8 * knob - 1 + 1.3 * zz), 1, 8)
                skill = 0.25 * experts.mean()
            else:
                experts = np.full(n, knob)
                skill = 0.3 * np.log1p(knob) + (0.2 if kind == "dense" else 0)
            p_corr = _sigmoid(0.6 + skill - zz)
            correct = (noise.uniform(size=n) < p_corr).astype(float)
            conf = np.clip(0.25 + 0.75 * _sigmoid(0.5 + skill - zz + noise.normal(0, 0.8, n)),
                           0.25, 1.0)
            ent = _sigmoid(0.8 * zz + noise.normal(0, 0.7, n))
            dis = 0.8 * _sigmoid(0.6 * zz + noise.normal(0, 0.7, n))
            fields = {"labels": noise.integers(0, 4, n)}
            if kind != "dense":
                fields |= {"route_entropy": ent, "disagreement": dis, "experts": experts,
                           "top1_mass": np.clip(1 - 0.7 * ent + noise.normal(0, 0.05, n), 0, 1)}
            for f, a in fields.items():
                arrays[f"{pair}|{dom}|{role}|{f}"] = a
            for s in scorers:
                u = {"msp": 1 - conf, "entropy": (1 - conf) ** 0.5 + noise.normal(0, 0.05, n),
                     "care": 0.5 * ent + 0.5 * dis}[s]
                key = f"{pair}/{s}|{dom}|{role}"
                arrays[f"{key}|uncertainty"], arrays[f"{key}|confidence"] = u, conf
                arrays[f"{key}|correct"] = correct
                if role == "id":  # stand-ins for the runner's recalibrated confidences
                    logit = np.log(conf) - np.log1p(-np.minimum(conf, 1 - 1e-9))
                    arrays[f"{key}|confidence_ts"] = _sigmoid(logit / 1.7)
                    arrays[f"{key}|confidence_hb"] = np.round(conf * 10) / 10
                    arrays[f"{key}|confidence_iso"] = 0.9 * conf + 0.05
    if degenerate:  # a method that is always right
        methods.append(("stub/dense", "msp"))
        for (dom, role), zz in z.items():
            key = f"stub/dense/msp|{dom}|{role}"
            arrays[f"{key}|uncertainty"] = arrays[f"{key}|confidence"] = np.full(zz.size, 0.5)
            arrays[f"{key}|correct"] = np.ones(zz.size)
    for pair, s in methods:  # pooled = concatenation of the domains
        for role in N:
            for f in ("uncertainty", "confidence", "correct", *ROUTER, "labels", *RECAL):
                parts = [
                    arrays.get(f"{pair}/{s}|{d}|{role}|{f}", arrays.get(f"{pair}|{d}|{role}|{f}"))
                    for d in DOMAINS
                ]
                if all(p is not None for p in parts):
                    tgt = pair if f in (*ROUTER, "labels") else f"{pair}/{s}"
                    arrays[f"{tgt}|pooled|{role}|{f}"] = np.concatenate(parts)
    if empty_shift:
        for f in ("uncertainty", "confidence", "correct"):
            arrays[f"lora/dense/entropy|science|shift|{f}"] = np.zeros(0)
    rows = []
    for pair, s in methods:
        model, gate = pair.split("/")
        for dom in (*DOMAINS, "pooled"):
            a = {(r, f): arrays[f"{pair}/{s}|{dom}|{r}|{f}"] for r in N
                 for f in ("uncertainty", "confidence", "correct")}
            exp = {r: arrays.get(f"{pair}|{dom}|{r}|experts") for r in N}
            acc = float(a["id", "correct"].mean())
            row: dict[str, Any] = {
                "method": f"{pair}/{s}", "model": model, "gate": gate, "scorer": s, "domain": dom,
                "accuracy": acc, "accuracy_lo": acc - 0.03, "accuracy_hi": acc + 0.03,
                "ece": M.expected_calibration_error(a["id", "confidence"], a["id", "correct"],
                                                    n_bins=12),
                "aurc": M.aurc(a["id", "uncertainty"], a["id", "correct"]),
                "sel_acc_80": M.selective_accuracy(a["id", "uncertainty"], a["id", "correct"]),
                "sel_acc_10": M.helm_selective_accuracy(a["id", "uncertainty"],
                                                        a["id", "correct"]),
                "shift_accuracy": float(a["shift", "correct"].mean()) if a["shift", "correct"].size
                else float("nan"),
                "avg_experts": float("nan") if exp["id"] is None else float(exp["id"].mean()),
                "shift_avg_experts": float("nan") if exp["shift"] is None
                else float(exp["shift"].mean()),
                "forward_passes": 1, "seeds": 1,
            }
            row["ood_auroc"] = (M.ood_auroc(a["id", "uncertainty"], a["shift", "uncertainty"])
                                if a["shift", "uncertainty"].size else float("nan"))
            with warnings.catch_warnings():  # the method that is always right: PRR undefined
                warnings.simplefilter("ignore", M.UndefinedMetricWarning)
                row["prr"] = M.prediction_rejection_ratio(a["id", "uncertainty"],
                                                          a["id", "correct"])
            for c in ("ece", "ood_auroc", "aurc", "sel_acc_80", "sel_acc_10", "prr"):
                row[f"{c}_lo"], row[f"{c}_hi"] = row[c] - 0.02, row[c] + 0.02
            rows.append(row)
    root.mkdir(parents=True, exist_ok=True)
    (root / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    np.savez_compressed(root / "scores.npz", **arrays)
    (root / "run.json").write_text(json.dumps({
        "suite": "pooled", "profile": "smoke", "backbone": "minilm",
        "config": {"budget": 4.0},
        "gates": {"moe-lora/care@0": {"name": "care", "kind": "care", "tau": 0.62,
                                      "achieved": 4.01}}}))
    return root


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_run(tmp_path_factory.mktemp("run") / "full", degenerate=True, empty_shift=True)


@pytest.fixture(scope="module")
def run(run_dir: Path) -> RunData:
    return load_run(run_dir)


def _lines(fig: Any) -> dict[str, Any]:
    return {ln.get_gid(): ln for ax in fig.axes for ln in ax.get_lines() if ln.get_gid()}


def _texts(ax: Any) -> str:
    return " ".join(t.get_text() for t in ax.texts)


# -- end to end ------------------------------------------------------------------------------


def test_draw_run_writes_every_figure_png_and_pdf(heavy_compute, run_dir: Path) -> None:
    paths = draw_run(run_dir, max_methods=3)  # every code path; fewer panels, faster
    stems = {"frontier", "thermostat", "allocation", "ablation", "mechanism", "ood_hist_pooled",
             "reliability_recalibrated_pooled",
             *(f"forest_{c}" for c in FOREST_COLUMNS if c != "augrc"),  # no augrc in this run
             *(f"{kind}_{d}" for kind in ("reliability", "risk_coverage", "ood_roc")
               for d in ("pooled", *DOMAINS))}
    expected = {run_dir / "figures" / f"{s}.{ext}" for s in stems for ext in ("png", "pdf")}
    assert set(paths) == expected
    for p in paths:
        head = p.read_bytes()[:8]
        assert head.startswith(b"\x89PNG" if p.suffix == ".png" else b"%PDF"), p
        assert p.stat().st_size > 5000, p


def test_figures_drawn_by_worker_processes_are_those_drawn_in_process(
        heavy_compute, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    runs = [make_run(tmp_path / name, frontier=False, extra=False) for name in ("one", "two")]
    with caplog.at_level(logging.INFO, logger="figures"):
        alone = draw_run(runs[0], max_methods=3, workers=1)
        caplog.clear()
        shared = draw_run(runs[1], max_methods=3, workers=2)
    assert [p.name for p in shared] == [p.name for p in alone]   # the same files, same order
    for a, b in zip(alone, shared, strict=False):   # PDFs too: no file holds the time it was drawn
        assert a.read_bytes() == b.read_bytes(), a.name
    # what a worker skipped is said in this process, as drawing alone says it
    assert "--experiment frontier" in caplog.text and "--experiment thermostat" in caplog.text
    with pytest.raises(UserError, match="figure workers"):
        draw_run(runs[0], workers=0)


def test_default_run_skips_experiment_figures_with_a_note(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    run = load_run(make_run(tmp_path / "plain", frontier=False, extra=False))
    with caplog.at_level(logging.INFO, logger="figures"):
        assert compute.frontier_figure(run) is None
        assert compute.thermostat_figure(run) is None
        assert compute.ablation_figure(run) is None
    assert "--experiment frontier" in caplog.text and "--experiment thermostat" in caplog.text
    # Mechanism: (a) and (b) only; (c) needs a top-5 pair.
    fig = mechanism.mechanism_figure(run)
    assert fig is not None
    assert [ax.get_title().split("\n")[0] for ax in fig.axes if ax.get_title()] == [
        "(a) routing confidence", "(b) CARE experts vs difficulty"]


# -- drawn data == metrics curves ------------------------------------------------------------


def test_forest_plots_draw_the_results_cells_sorted_with_random_ranking(run: RunData) -> None:
    assert FOREST_COLUMNS == ("ood_auroc", "aurc", "augrc", "sel_acc_80", "prr", "sel_acc_10")
    flagged = chance_reasons(run.rows + run.references)
    assert forest.forest_figure(run, "augrc") is None  # a column the run has no value of
    for col in ("ood_auroc", "aurc", "sel_acc_80"):
        fig = forest.forest_figure(run, col)
        lines = _lines(fig)
        ax = fig.axes[0]
        labels = [t.get_text() for t in ax.get_yticklabels()]
        assert sorted(labels) == sorted(run.methods)  # every method, once
        first = [run.row(m, run.domains[0])[col] for m in labels]
        finite = [v for v in first if not np.isnan(v)]
        higher = col != "aurc" and col != "augrc"
        assert finite == sorted(finite, reverse=higher)  # best first (at the top)
        for m in run.methods:
            for d in run.domains:
                row = run.row(m, d)
                if row is None or np.isnan(row[col]):
                    assert f"{m}|{d}" not in lines
                    continue
                point = lines[f"{m}|{d}"]
                assert point.get_xdata()[0] == row[col]  # the results.jsonl cell, as is
                np.testing.assert_array_equal(lines[f"ci|{m}|{d}"].get_xdata(),
                                              [row[f"{col}_lo"], row[f"{col}_hi"]])
                assert (point.get_markerfacecolor() == "white") == ((m, d) in flagged)
                if col != "ood_auroc":
                    assert lines[f"random|{m}|{d}"].get_xdata()[0] == random_ranking(col, row)
        if col == "ood_auroc":
            assert list(lines["random"].get_xdata()) == [0.5, 0.5]


def test_risk_coverage_lines_are_the_metric_curves(run: RunData) -> None:
    methods = ["moe-lora/top4/msp", "moe-lora/care/care", "lora/dense/msp"]
    fig = selective.risk_coverage_figure(run, "pooled", methods)
    lines = _lines(fig)
    legend = " | ".join(t.get_text() for t in fig.axes[0].get_legend().get_texts())
    oracle_y = []
    for m in methods:
        s = run.scores(m, "pooled", "id")
        cov, risk, _ = M.risk_coverage_curve(s.uncertainty, s.correct)
        np.testing.assert_array_equal(lines[m].get_xdata(), cov)
        np.testing.assert_array_equal(lines[m].get_ydata(), risk)
        sel = lines[f"{m}|sel"]
        assert sel.get_xdata()[0] == 0.8
        assert sel.get_ydata()[0] == pytest.approx(1 - M.selective_accuracy(s.uncertainty,
                                                                            s.correct))
        assert f"{m} (AURC {M.aurc(s.uncertainty, s.correct):.3f}" in legend
        ocov, orisk, _ = M.risk_coverage_curve(1 - s.correct, s.correct)
        oracle_y.append((tuple(ocov), tuple(orisk)))
    oracles = [(tuple(ln.get_xdata()), tuple(ln.get_ydata()))
               for ln in fig.axes[0].get_lines() if ln.get_gid() == "oracle"]
    assert set(oracles) == set(oracle_y)  # one oracle per distinct correctness vector
    randoms = sorted(ln.get_ydata()[0] for ln in fig.axes[0].get_lines()
                     if ln.get_gid() == "random")
    assert randoms == sorted({o[1][-1] for o in oracle_y})  # the error rates


def test_reliability_bars_are_the_metric_bins(run: RunData) -> None:
    m = "moe-lora/top4/msp"
    fig = calibration.reliability_figure(run, "science", [m])
    ax = next(a for a in fig.axes if a.get_title())
    s = run.scores(m, "science", "id")
    curve = M.reliability_curve(s.confidence, s.correct, n_bins=12)
    filled = curve.count > 0
    assert not filled.all()  # the synthetic confidences leave low bins empty: no bar drawn
    bars = [p for p in ax.patches if p.get_gid() == "accuracy"]
    np.testing.assert_allclose([b.get_height() for b in bars], curve.accuracy[filled])
    np.testing.assert_allclose([b.get_x() for b in bars], curve.edges[:-1][filled])
    gaps = [p for p in ax.patches if p.get_gid() == "gap"]
    np.testing.assert_allclose([g.get_y() + g.get_height() for g in gaps],
                               curve.confidence[filled])
    counts = [p.get_height() for a in fig.axes for p in a.patches if p.get_gid() == "count"]
    np.testing.assert_array_equal(counts, curve.count[filled])
    ece = M.expected_calibration_error(s.confidence, s.correct, n_bins=12)
    assert f"ECE {ece:.3f}" in ax.get_title()
    assert bars[0].get_facecolor()[:3] == pytest.approx(matplotlib.colors.to_rgb(
        run.styles.color(m)))
    keys = {t.get_text(): h for t, h in zip(fig.legends[0].get_texts(),
                                               fig.legends[0].legend_handles, strict=False)}
    assert list(keys) == ["perfect", "accuracy", "gap to mean confidence"]
    assert keys["accuracy"].get_facecolor() == pytest.approx(matplotlib.colors.to_rgba(
        run.styles.color(m), 0.85))  # the key is full strength even where the bars fade


def test_recalibrated_reliability_draws_the_stored_confidences(run: RunData) -> None:
    from figures.recalibrated import KINDS, recalibrated_reliability_figure

    methods = ["moe-lora/care/care", "moe-lora/top4/msp"]
    fig = recalibrated_reliability_figure(run, "pooled", methods)
    assert fig is not None
    panels = [a for a in fig.axes if any(p.get_gid() == "accuracy" for p in a.patches)]
    assert len(panels) == len(methods) * len(KINDS)  # rows: methods; columns: raw, ts, hb, iso
    for i, m in enumerate(methods):
        s = run.scores(m, "pooled", "id")
        for j, (kind, title) in enumerate(KINDS):
            ax = panels[i * len(KINDS) + j]
            conf = run.arrays[f"{m}|pooled|id|confidence_{kind}"] if kind else s.confidence
            curve = M.reliability_curve(conf, s.correct, n_bins=12)
            filled = curve.count > 0
            bars = [p for p in ax.patches if p.get_gid() == "accuracy"]
            np.testing.assert_allclose([b.get_height() for b in bars], curve.accuracy[filled])
            np.testing.assert_allclose([b.get_x() for b in bars], curve.edges[:-1][filled])
            ece = M.expected_calibration_error(conf, s.correct, n_bins=12)
            assert f"ECE {ece:.3f}" in ax.get_title()
            assert (title in ax.get_title()) == (i == 0)  # column heads on the first row


def test_recalibrated_reliability_is_skipped_without_recalibrated_arrays(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from figures.recalibrated import recalibrated_reliability_figure

    d = make_run(tmp_path / "old", frontier=False, extra=False)
    with np.load(d / "scores.npz") as z:
        kept = {k: z[k] for k in z.files if not k.endswith(RECAL)}
    np.savez_compressed(d / "scores.npz", **kept)  # a run written before recalibration
    run = load_run(d)
    with caplog.at_level(logging.INFO, logger="figures"):
        assert recalibrated_reliability_figure(run, "pooled", run.methods) is None
    assert "no recalibrated confidences" in caplog.text


def test_reliability_bars_fade_with_their_bins_count() -> None:
    # 100 examples at confidence 0.95 (bin 11), 1 example at 0.55 (bin 6, wrong: a full gap)
    conf = np.r_[np.full(100, 0.95), 0.55]
    correct = np.r_[np.ones(95), np.zeros(5), 0.0]
    disp = calibration.ReliabilityDisplay.from_predictions(conf, correct, n_bins=12)
    fig = Figure()
    ax = fig.add_subplot()
    disp.plot(ax, color="#0072B2")
    bars = [p for p in ax.patches if p.get_gid() == "accuracy"]
    gaps = [p for p in ax.patches if p.get_gid() == "gap"]
    assert [b.get_x() for b in bars] == pytest.approx([0.5, 11 / 12])
    # opacity 0.85 * sqrt(count / 100), floored at 0.15: the lone example's bars are faint
    assert [b.get_facecolor()[3] for b in bars] == pytest.approx([0.85 * 0.15, 0.85])
    assert [g.get_edgecolor()[3] for g in gaps] == pytest.approx([0.15, 1.0])
    assert gaps[0].get_height() == pytest.approx(0.55)  # the gap itself is still drawn whole


def test_roc_lines_are_the_metric_curves(run: RunData) -> None:
    methods = ["moe-lora/top4/msp", "moe-lora/care/care"]
    fig = ood.roc_figure(run, "math", methods)
    lines = _lines(fig)
    legend = " | ".join(t.get_text() for t in fig.axes[0].get_legend().get_texts())
    for m in methods:
        uid, ush = (run.scores(m, "math", r).uncertainty for r in ("id", "shift"))
        fpr, tpr, _ = M.ood_roc_curve(uid, ush)
        np.testing.assert_array_equal(lines[m].get_xdata(), fpr)
        np.testing.assert_array_equal(lines[m].get_ydata(), tpr)
        assert f"AUROC {M.ood_auroc(uid, ush):.3f}" in legend


def test_a_method_keeps_its_colour_across_figures(run: RunData) -> None:
    methods = ["lora/dense/msp", "moe-lora/top4/msp", "moe-lora/top4/care", "moe-lora/care/care"]
    rc = _lines(selective.risk_coverage_figure(run, "pooled", methods))
    roc = _lines(ood.roc_figure(run, "pooled", list(reversed(methods))))
    colours = [rc[m].get_color() for m in methods]
    assert colours == [roc[m].get_color() for m in methods]
    assert len(set(zip(colours, (rc[m].get_linestyle() for m in methods), strict=False))) == len(
        methods
    )
    assert run.styles.color("moe-lora/care/care") == "#D55E00"  # CARE: vermillion, every run


# -- compute figures -------------------------------------------------------------------------


def test_frontier_draws_table_cells_and_states_the_saving(run: RunData) -> None:
    fig = compute.frontier_figure(run)
    assert fig is not None
    ax = fig.axes[0]
    fixed = [run.gate_rows(f"top{k}") for k in (1, 2, 3, 4, 5, 6, 8)]
    # errorbar() puts the label on its container; the data line is the container's first artist
    cont = next(c for c in ax.containers if c.get_label() == "fixed top-$k$")
    line = cont.lines[0]
    # (errorbar keeps object arrays for unit support)
    np.testing.assert_allclose(np.asarray(line.get_xdata(), float),
                               [r["avg_experts"] for r in fixed])
    np.testing.assert_allclose(np.asarray(line.get_ydata(), float),
                               [r["accuracy"] for r in fixed])
    care = [run.gate_rows(f"care-b{b}") for b in (2, 3, 4, 5)]
    target = run.gate_rows("top4")["accuracy"]
    match = matched_budget([r["avg_experts"] for r in care], [r["accuracy"] for r in care],
                           target)
    text = next(t for t in ax.texts if t.get_gid() == "matched").get_text()
    if match is None:
        assert "never reaches" in text
    else:
        assert f"{match[0]:.2f} experts" in text and "fewer" in text


def test_frontier_says_more_when_care_needs_more_experts(tmp_path: Path) -> None:
    d = make_run(tmp_path / "r", extra=False)
    rows = [json.loads(x) for x in (d / "results.jsonl").read_text().splitlines()]
    top4 = next(r for r in rows if r["gate"] == "top4" and r["domain"] == "pooled")
    for r in rows:  # CARE at budgets 2..5 below top-4 except at 5: a crossing between 4 and 5
        if r["gate"].startswith("care-b"):
            r["accuracy"] = top4["accuracy"] + (0.02 if r["gate"] == "care-b5" else -0.02)
    (d / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = load_run(d)
    care = [run.gate_rows(f"care-b{b}") for b in (2, 3, 4, 5)]
    x, exact = matched_budget([r["avg_experts"] for r in care], [r["accuracy"] for r in care],
                              top4["accuracy"])
    x_ref = run.gate_rows("top4")["avg_experts"]
    assert exact and x > x_ref
    text = next(t for t in compute.frontier_figure(run).axes[0].texts
                if t.get_gid() == "matched").get_text()
    assert f"{x:.2f} experts: {x - x_ref:.2f} more ({(x - x_ref) / x_ref:.0%})" in text


def test_frontier_says_when_care_never_matches(tmp_path: Path) -> None:
    d = make_run(tmp_path / "r", extra=False)
    rows = [json.loads(x) for x in (d / "results.jsonl").read_text().splitlines()]
    for r in rows:
        if r["gate"].startswith("care-b"):
            r["accuracy"] = r["accuracy_lo"] = r["accuracy_hi"] = 0.1
    (d / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    fig = compute.frontier_figure(load_run(d))
    text = next(t for t in fig.axes[0].texts if t.get_gid() == "matched").get_text()
    assert "never reaches fixed top-4 accuracy" in text


def test_thermostat_and_allocation_draw_the_rows(run: RunData) -> None:
    fig = compute.thermostat_figure(run)
    exp = next(ln for ln in fig.axes[0].get_lines() if ln.get_gid() == "experts")
    np.testing.assert_allclose(exp.get_xdata(), [0.4, 0.5, 0.6, 0.7, 0.8])
    np.testing.assert_allclose(exp.get_ydata(), [run.gate_rows(f"care-tau{t:g}")["avg_experts"]
                                                 for t in (0.4, 0.5, 0.6, 0.7, 0.8)])
    # one legend, below the axes, so it cannot cover either curve
    assert len(fig.legends) == 1 and fig.axes[0].get_legend() is None
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["mean experts", "accuracy"]
    fig = compute.allocation_figure(run)
    bars = [p.get_height() for p in fig.axes[0].patches if p.get_gid() == "id"]
    assert bars == pytest.approx([run.gate_rows("care", d)["avg_experts"] for d in DOMAINS])
    assert "0.62" in fig.axes[0].get_title()  # the calibrated tau from run.json


def test_mechanism_has_three_panels_in_a_frontier_run(run: RunData) -> None:
    fig = mechanism.mechanism_figure(run)
    titles = [ax.get_title().split("\n")[0] for ax in fig.axes if ax.get_title()]
    assert titles == ["(a) routing confidence", "(b) CARE experts vs difficulty",
                      "(c) gain of a 5th expert"]
    assert all(not ax.texts for ax in fig.axes)  # drawn, not replaced by a note


def test_quantile_bins_are_equal_mass_and_keep_ties() -> None:
    b = mechanism.quantile_bins(np.arange(10.0), 5)
    np.testing.assert_array_equal(b, [0, 0, 1, 1, 2, 2, 3, 3, 4, 4])
    b = mechanism.quantile_bins(np.array([1.0, 1.0, 1.0, 1.0, 2.0]), 5)
    assert len(set(b[:4])) == 1


# -- bad input -------------------------------------------------------------------------------


def test_missing_scores_npz_is_a_user_error_naming_it(tmp_path: Path) -> None:
    d = make_run(tmp_path / "r", frontier=False, extra=False)
    (d / "scores.npz").unlink()
    with pytest.raises(UserError, match=r"scores\.npz is missing.*uqbench run \.\.\. --out"):
        draw_run(d)
    assert not (d / "figures").exists()


def test_missing_results_is_a_user_error_naming_it(tmp_path: Path) -> None:
    d = make_run(tmp_path / "r", frontier=False, extra=False)
    (d / "results.jsonl").unlink()
    with pytest.raises(UserError, match=r"results\.jsonl not found.*--out"):
        draw_run(d)


def test_corrupt_scores_npz_is_a_user_error(tmp_path: Path) -> None:
    d = make_run(tmp_path / "r", frontier=False, extra=False)
    (d / "scores.npz").write_bytes(b"not a zip")
    with pytest.raises(UserError, match=r"scores\.npz is unreadable"):
        load_run(d)


def test_single_class_method_is_explained_not_drawn(run: RunData) -> None:
    methods = ["stub/dense/msp", "moe-lora/top4/msp"]
    fig = calibration.reliability_figure(run, "pooled", methods)
    stub_ax = next(ax for ax in fig.axes if ax.get_title().startswith("stub/dense"))
    n = len(run.scores("stub/dense/msp", "pooled", "id").correct)
    assert f"all {n} predictions correct (single class)" in _texts(stub_ax)
    assert not stub_ax.patches
    fig = selective.risk_coverage_figure(run, "pooled", methods)
    assert "stub/dense/msp" not in _lines(fig)
    assert f"stub/dense/msp: all {n} predictions correct" in _texts(fig.axes[0])


def test_empty_split_is_explained_not_drawn(run: RunData) -> None:
    methods = ["lora/dense/entropy", "lora/dense/msp"]
    fig = ood.roc_figure(run, "science", methods)
    assert "lora/dense/entropy: shifted split is empty" in _texts(fig.axes[0])
    assert set(_lines(fig)) == {"lora/dense/msp"}
    fig = ood.histogram_figure(run, "science", methods)
    assert "shifted split is empty" in _texts(fig.axes[0])


def test_unknown_method_is_a_user_error(run_dir: Path) -> None:
    with pytest.raises(UserError, match="unknown method"):
        draw_run(run_dir, methods=["nope/x/msp"])


# -- training curves and reference rows ------------------------------------------------------


def _training_log(steps: int, *, learns: bool, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    t = np.arange(steps)
    loss = np.log(4) - (0.8 * t / steps if learns else 0) + rng.normal(0, 0.05, steps)
    acc = np.clip((0.25 + (0.6 * t / steps if learns else 0)) + rng.normal(0, 0.1, steps), 0, 1)
    return {"steps": steps, "seconds": 1.5, "losses": loss.tolist(),
            "aux_losses": [0.01] * steps, "train_accuracy": acc.tolist(),
            "summary": {"first_loss": float(loss[:10].mean()),
                        "last_loss": float(loss[-10:].mean()),
                        "first_train_accuracy": float(acc[:10].mean()),
                        "last_train_accuracy": float(acc[-10:].mean()), "window": 10,
                        "chance_loss": float(np.log(4)), "chance_accuracy": 0.25}}


def test_training_figure_from_run_json_and_reference_rows_skipped(heavy_compute,
                                                                  tmp_path: Path) -> None:
    """run.json's training logs give one column per model (loss with the ln C line, train
    accuracy with the chance line); the chance / options-only rows of results.jsonl are no
    method: no figure draws them."""
    from figures import training

    d = make_run(tmp_path / "r", frontier=False, extra=False)
    meta = json.loads((d / "run.json").read_text())
    meta["training"] = {"lora@0": _training_log(60, learns=True, seed=0),
                        "moe-lora@0": _training_log(60, learns=False, seed=1),
                        "moe-lora@1": None}  # a checkpoint from before logs were kept
    (d / "run.json").write_text(json.dumps(meta))
    rows = [json.loads(x) for x in (d / "results.jsonl").read_text().splitlines()]
    for method, acc in (("chance", 0.25), ("options-only", 0.31)):
        for dom in (*DOMAINS, "pooled"):
            rows.append({"method": method, "model": method, "gate": "-", "scorer": "-",
                         "domain": dom, "accuracy": acc, "accuracy_lo": acc - 0.05,
                         "accuracy_hi": acc + 0.05, "ece": float("nan"),
                         "ood_auroc": float("nan"), "forward_passes": float("nan")})
    (d / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = load_run(d)
    assert "chance" not in run.methods and "-" not in run.gates
    assert {r["method"] for r in run.references} == {"chance", "options-only"}
    fig = training.training_figure(run)
    assert fig is not None and len(fig.axes) == 4  # two models with logs, loss + accuracy
    lines = {ln.get_gid(): ln for ln in fig.axes[0].get_lines()}
    assert {"loss_raw", "loss_smooth", "aux", "chance_loss"} <= set(lines)
    assert lines["chance_loss"].get_ydata()[0] == pytest.approx(np.log(4))
    acc = {ln.get_gid(): ln for ln in fig.axes[1].get_lines()}
    assert acc["chance_acc"].get_ydata()[0] == pytest.approx(0.25)
    assert list(acc["acc_raw"].get_ydata()) == meta["training"]["lora@0"]["train_accuracy"]
    assert fig.axes[0].get_title().startswith("lora@0")
    # per-domain curves: the logged points from the step-0 loss, exactly as logged
    log = meta["training"]["lora@0"]
    log["initial"] = {"domains": {"sci": {"loss": 1.5, "accuracy": 0.2, "n": 64},
                                  "code": {"loss": 1.4, "accuracy": 0.3, "n": 40}},
                      "loss": 1.46, "accuracy": 0.24, "n": 104}
    log["curves"] = {"steps": [16, 32, 40], "domains": {
        "sci": {"loss": [1.3, 1.1, 0.9], "accuracy": [0.3, 0.5, 0.6], "n": [40, 41, 20]},
        "code": {"loss": [1.4, None, 1.35], "accuracy": [0.25, None, 0.3], "n": [24, 0, 4]}}}
    (d / "run.json").write_text(json.dumps(meta))
    fig = training.training_figure(load_run(d))
    assert fig is not None
    loss = {ln.get_gid(): ln for ln in fig.axes[0].get_lines()}
    assert list(loss["domain_loss_sci"].get_xdata()) == [0, 15, 31, 39]
    assert list(loss["domain_loss_sci"].get_ydata()) == [1.5, 1.3, 1.1, 0.9]
    assert list(loss["domain_loss_code"].get_xdata()) == [0, 15, 39]   # no question: no point
    assert list(loss["initial_loss_code"].get_ydata()) == [1.4]
    acc = {ln.get_gid(): ln for ln in fig.axes[1].get_lines()}
    assert list(acc["domain_accuracy_code"].get_ydata()) == [0.3, 0.25, 0.3]
    assert "domain_loss_sci" not in {ln.get_gid() for ln in fig.axes[2].get_lines()}
    paths = draw_run(d, max_methods=3)
    assert d / "figures" / "training.png" in paths and (d / "figures" / "training.pdf").exists()
    # without logs the figure is skipped, with a note
    del meta["training"]
    (d / "run.json").write_text(json.dumps(meta))
    assert training.training_figure(load_run(d)) is None


def test_smooth_is_a_trailing_moving_average() -> None:
    from figures.training import smooth

    x, y = smooth([1.0, 2.0, 3.0, 4.0, 5.0], window=2)
    assert list(x) == [1, 2, 3, 4] and list(y) == [1.5, 2.5, 3.5, 4.5]
    x, y = smooth([3.0, 1.0])  # fewer than 20 steps: the raw series
    assert list(y) == [3.0, 1.0]
