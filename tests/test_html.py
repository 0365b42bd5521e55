"""``report.html`` (every run folder, `uqbench.reporting.html`) and ``uqbench compare`` (`uqbench.reporting.compare`)
on run folders scored from synthetic records (`tests.test_records.record_set`, seconds), and the
report of the real smoke run in a real browser (headless Chromium, slow tier)."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from tests.conftest import slow_fixture
from tests.test_records import record_set
from uqbench.cli import main
from uqbench.core.errors import UserError
from uqbench.reporting.compare import compare, write_compare
from uqbench.reporting.html import render_report
from uqbench.run.score_records import ScoreConfig, score

SCORERS = ("msp", "entropy")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two run folders over the same splits: 1 seed (with figures) and 2 seeds."""
    root = tmp_path_factory.mktemp("runs")
    score(record_set(1), ScoreConfig(out=root / "seed1", scorers=SCORERS, figures=True))
    score(record_set(2), ScoreConfig(out=root / "seeds2", scorers=SCORERS, figures=False))
    return root / "seed1", root / "seeds2"


def test_every_run_folder_gets_a_self_contained_report(runs) -> None:
    html = (runs[0] / "report.html").read_text()
    pngs = len(list((runs[0] / "figures").glob("*.png")))
    assert pngs >= 5 and html.count('src="data:image/png;base64,') == pngs  # every figure inline
    # no network: nothing fetched from elsewhere (no external script, style sheet or image)
    assert not re.search(r'(src|href)="(?!data:|#)', html) and "<link" not in html
    for section in ("Configuration and data", "Seconds per phase", "Results per domain",
                    "Calibration:", "OOD detection:", "Selective prediction:", "Compute:",
                    "Paper verdicts", "Skipped scorers", "Fallbacks"):
        assert section in html, section
    meta = json.loads((runs[0] / "run.json").read_text())
    for split, info in meta["splits"].items():  # the splits with their hashes
        assert f"<code>{info['hash']}</code>" in html, split
    # one sortable table per domain, rows of every method and the chance reference
    assert html.count('<table class="sortable" data-domain=') == 3  # pooled, science, math
    assert "moe-lora/top4/msp" in html and "chance" in html
    for flag in meta["at_chance"]:  # greyed, with the reason
        assert f"at chance: ID accuracy CI [{flag['accuracy_lo']:.2f}" in html
    # the second run (no figures) says so and still renders
    assert "no figures" in (runs[1] / "report.html").read_text()


def test_a_broken_run_folder_names_each_missing_part_and_renders_the_rest(runs, tmp_path):
    d = tmp_path / "broken"
    shutil.copytree(runs[0], d)
    (d / "scores.npz").unlink()  # an interrupted run
    bad = sorted((d / "figures").glob("reliability_*.png"))[0]
    bad.write_bytes(b"not a png")
    html = render_report(d)
    assert "<b>scores.npz</b>:" in html and "scores.npz is missing" in html
    assert f"{bad.name} is not a PNG image" in html
    assert 'data-domain="pooled"' in html  # the tables still render
    (d / "results.jsonl").unlink()
    (d / "run.json").write_text("{not json")
    html = render_report(d)
    assert "results.jsonl not found" in html and "run.json is unreadable" in html
    assert html.count('src="data:image/png;base64,') >= 4  # the readable figures still show


def test_a_failing_report_warns_records_and_keeps_the_results(tmp_path, monkeypatch, caplog):
    import uqbench.reporting.html

    def boom(run_dir):
        raise RuntimeError("template exploded")

    monkeypatch.setattr(uqbench.reporting.html, "write_report", boom)
    score(record_set(1), ScoreConfig(out=tmp_path / "o", scorers=("msp",), figures=False))
    meta = json.loads((tmp_path / "o" / "run.json").read_text())
    assert meta["report_html_error"] == "RuntimeError: template exploded"
    assert "report.html was not written" in caplog.text
    # the rerun command names the folder the results are in, not the temporary one it was built in
    assert f"`uqbench report {tmp_path / 'o'} --html`" in caplog.text
    assert (tmp_path / "o" / "results.jsonl").exists() and not (tmp_path / "o" / "report.html").exists()


def test_skipped_scorers_and_fallbacks_show_what_and_why(runs, tmp_path):
    # records without a scorer's fields ("missing", e.g. lm-eval files) and scorers that cannot
    # score the training set ("reason") both render; so do the run's fallbacks
    d = tmp_path / "skips"
    shutil.copytree(runs[0], d)
    meta = json.loads((d / "run.json").read_text())
    meta["skipped_scorers"] = [
        {"scorer": "care", "pair": "lm/loglik", "missing": ["disagreement", "route_entropy"]},
        {"scorer": "rmd", "pair": "moe-lora/top4", "reason": "needs 2 train domains"}]
    (d / "run.json").write_text(json.dumps(meta))
    meta["fallbacks"] = [{"what": "input truncated to max_length", "where": "code/shift",
                          "reason": "7 of 24 questions had option text cut"}]
    (d / "run.json").write_text(json.dumps(meta))
    html = render_report(d)
    assert "needs disagreement, route_entropy (missing from the records)" in html
    assert "needs 2 train domains" in html
    # fallbacks (run.json), each with where and why
    assert ("<td>input truncated to max_length</td><td>code/shift</td>"
            "<td>7 of 24 questions had option text cut</td>") in html
    assert "None: every step did what was asked." in render_report(runs[0])


def test_compare_pairs_the_runs_examples_and_writes_three_files(runs, tmp_path, capsys):
    c = compare(runs, n_boot=100)
    assert c.labels == ["seed1", "seeds2"] and {"accuracy", "ece", "ood_auroc", "aurc", "augrc",
                                                "risk_at_80", "cp_lac_10_cov"} <= set(c.columns)
    first, second = c.table["science"]["moe-lora/top4/msp"]
    assert first is not None and second is not None and first["accuracy"].diff is None
    d, lo, hi = second["accuracy"].diff
    # the difference of the two runs' own (seed-mean) accuracies, with a CI around it
    assert d == pytest.approx(second["accuracy"].value - first["accuracy"].value)
    assert lo <= d <= hi
    shutil.copytree(runs[0], tmp_path / "again")
    same = compare([runs[0], tmp_path / "again"], n_boot=50)
    assert all(cells[col].diff == (0.0, 0.0, 0.0)  # a run against itself: zero, exactly
               for methods in same.table.values() for _, cells in methods.values()
               for col in same.columns if cells[col].diff is not None)
    assert main(["compare", str(runs[0]), str(runs[1]), "--out", str(tmp_path),
                 "--bootstrap", "50"]) == 0
    out = capsys.readouterr().out
    assert "## science" in out and "; Δ " in out
    for name in ("compare.md", "compare.csv", "compare.html"):
        assert (tmp_path / name).stat().st_size > 500, name
    assert 'class="sortable"' in (tmp_path / "compare.html").read_text()


def test_compare_refuses_one_run_and_runs_over_other_splits(runs, tmp_path):
    with pytest.raises(UserError, match="at least two run folders"):
        write_compare([runs[0]], tmp_path)
    other = tmp_path / "other"
    shutil.copytree(runs[1], other)
    rows = (other / "results.jsonl").read_text().replace("h00,h01", "x00,h01")
    (other / "results.jsonl").write_text(rows)
    with pytest.raises(UserError, match=r"domain science: seed1 has h00,h01, other has x00,h01"):
        compare([runs[0], other])


# -- the real browser --------------------------------------------------------------------------
@slow_fixture(scope="session", reason="drives a headless Chromium")
def browser():
    """Playwright driving the system's Chromium (CI installs Debian's `chromium`)."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("no Chromium installed (Debian: apt-get install -y chromium; .ci/run does)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="the test extra: playwright")
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=exe, args=["--no-sandbox"])
        yield b
        b.close()


def test_the_smoke_runs_report_in_a_real_browser(smoke_run, browser) -> None:
    run = smoke_run[0] / "run"
    report = run / "report.html"
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.goto(report.as_uri(), wait_until="load")
    assert not errors, errors
    assert all(u.startswith(("file:", "data:")) for u in requests), requests  # offline
    sizes = page.eval_on_selector_all("img", "imgs => imgs.map(i => [i.alt, i.naturalWidth])")
    assert len(sizes) >= 5 and all(w > 0 for _, w in sizes), sizes  # every image decoded
    table = 'table[data-domain="pooled"]'
    col = page.eval_on_selector_all(f"{table} thead th",
                                    "ths => ths.map(t => t.textContent).indexOf('Acc')")

    def accuracies() -> list[float]:
        cells = page.eval_on_selector_all(
            f"{table} tbody tr", f"rs => rs.map(r => r.cells[{col}].getAttribute('data-sort'))")
        return [float(v) for v in cells if v]

    page.click(f"{table} thead th:nth-child({col + 1})")
    up = accuracies()
    assert len(up) >= 3 and up == sorted(up)
    page.click(f"{table} thead th:nth-child({col + 1})")
    assert accuracies() == sorted(up, reverse=True)
    shot = run / "report.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    page.close()
