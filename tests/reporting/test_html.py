"""``report.html`` (every run folder, `uqbench.reporting.html`), its answers
(`uqbench.reporting.answers`), the two table levels (`uqbench.results.tables`) and ``uqbench
compare`` (`uqbench.reporting.compare`) on run folders scored from synthetic records
(`tests.io.test_recordset.record_set`, seconds), and the report of the real smoke run in a real
browser (headless Chromium, slow tier)."""
from __future__ import annotations

import csv
import json
import math
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tests.conftest import slow_fixture
from tests.io.test_recordset import record_set
from uqbench.cli import main
from uqbench.core.errors import UserError
from uqbench.files.rundir import read_run
from uqbench.reporting.answers import QUESTIONS, answers
from uqbench.reporting.compare import compare, write_compare
from uqbench.reporting.html import render_report
from uqbench.results import tables as T
from uqbench.run.score_records import ScoreConfig, score

#: mc_dropout_msp brings its own predictive distribution (the MC mean): a model-level row of
#: its own; the LoRA records have no MC passes, so it is skipped there
SCORERS = ("msp", "entropy", "mc_dropout_msp")


class _Cells(HTMLParser):
    """Every ``td[data-col]`` of a page: (method, domain, column, data-sort, text, table
    level) from the cell, its row's ``data-method``/``data-domain`` and its table's
    ``data-level`` ("" for the answers)."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: list[tuple[str, ...]] = []
        self._row: dict[str, str] = {}
        self._level = ""
        self._cell: list[str] | None = None
        self._depth = 0  # inside a span (the CI) of the cell

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table":
            self._level = a.get("data-level") or ""
        elif tag == "tr":
            self._row = a
        elif tag == "td" and "data-col" in a:
            self._cell = [self._row.get("data-method", ""), self._row.get("data-domain", ""),
                          a["data-col"], a["data-sort"], ""]
        elif tag == "span" and self._cell is not None:
            self._depth += 1

    def handle_endtag(self, tag):
        if tag == "span" and self._cell is not None:
            self._depth -= 1
        elif tag == "td" and self._cell is not None:
            self.cells.append((*(x.strip() for x in self._cell), self._level))
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None and not self._depth:
            self._cell[4] += data


def report_cells(html: str) -> list[tuple[str, ...]]:
    p = _Cells()
    p.feed(html)
    return p.cells


def assert_numbers_equal_results_csv(html: str, run: Path) -> int:
    """Every number the report shows is the cell of ``results.csv`` of its method, domain and
    column (to the float, and as printed to its digits); returns how many were checked."""
    with open(run / "results.csv", newline="") as f:
        table = {(r["method"], r["domain"]): r for r in csv.DictReader(f)}
    cells = report_cells(html)
    for method, domain, col, sort, text, _ in cells:
        want = table[(method, domain)][col]
        if sort == "":  # no number: results.csv has none either
            assert want in ("", "nan"), (method, domain, col, want)
            assert "–" in text
            continue
        assert float(sort) == float(want), (method, domain, col, sort, want)
        digits = T.digits_of(col)
        assert text.split()[-1] == f"{float(want):.{digits}f}", (method, domain, col, text)
    return len(cells)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, png_figures: None,
         heavy_compute: None) -> tuple[Path, Path]:
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
    # answers first; tables, forest plots, figures; the run's details last, collapsed
    order = ['id="summary"', 'id="filter"', 'id="models"', 'id="scorers"', 'alt="forest_aurc"',
             'id="figures"', "OOD detection:", 'id="paper"', 'id="details"',
             '<details id="fallbacks">', '<details id="skipped">', '<details id="configuration">',
             '<details id="splits">', '<details id="phases">', '<details id="training">']
    at = [html.index(marker) for marker in order]
    assert at == sorted(at), [m for m, i in zip(order, at, strict=False)]
    meta = json.loads((runs[0] / "run.json").read_text())
    for split, info in meta["splits"].items():  # the splits with their hashes
        assert f"<code>{info['hash']}</code>" in html, split
    # one model table and one scorer table per domain: pooled, science, math
    assert html.count('data-level="model" data-domain=') == 3
    assert html.count('data-level="scorer" data-domain=') == 3
    # the forest plots: one per ranking metric with a CI, beside the scorer tables
    for col in T.FOREST_COLUMNS:
        assert f'alt="forest_{col}"' in html
    assert "moe-lora/top4/msp" in html and "chance" in html
    # the second run (no figures) says so and still renders
    assert "no figures" in (runs[1] / "report.html").read_text()


def test_every_number_in_the_report_equals_results_csv(runs) -> None:
    for run in runs:
        n = assert_numbers_equal_results_csv((run / "report.html").read_text(), run)
        assert n > 300, n


def test_model_level_once_per_predictive_and_scorer_level_once_per_scorer(runs) -> None:
    html = (runs[0] / "report.html").read_text()
    rows = read_run(runs[0]).rows
    cells = report_cells(html)
    model_cols = {c for c, _, _ in T.shown("model")}
    scorer_cols = {c for c, _, _ in T.shown("scorer")}
    assert "ece" in model_cols and "ood_auroc" in scorer_cols and not model_cols & scorer_cols
    for dom in ("pooled", "science", "math"):
        # the model table: lora/dense, moe-lora/top4 (msp and entropy share its predictive),
        # moe-lora/top4 · mc_dropout_msp (its own MC mean), then chance and options-only
        shown = [m for m, d, c, _, _, level in cells if d == dom and c == "ece"
                 and level == "model"]
        assert shown[:3] == ["lora/dense/msp", "moe-lora/top4/msp", "moe-lora/top4/mc_dropout_msp"]
        labels = [m.label for m in T.model_rows(rows) if m.domain == dom]
        assert labels == ["lora/dense", "moe-lora/top4", "moe-lora/top4 · mc_dropout_msp",
                          "chance", "options-only"]
        # the scorer table: each ranking metric once per scorer
        ranked = [m for m, d, c, _, _, level in cells if d == dom and c == "ood_auroc"
                  and level == "scorer"]
        assert sorted(ranked) == sorted({r["method"] for r in rows if r["domain"] == dom
                                         and not T.is_reference(r)})
    # a scorer that shares the model's predictive has the model's ECE: shown once, not repeated
    by = {(r["method"], r["domain"]): r for r in rows}
    assert (
        by["moe-lora/top4/entropy", "science"]["ece"] == by["moe-lora/top4/msp", "science"]["ece"]
    )
    assert by["moe-lora/top4/mc_dropout_msp", "science"]["ece"] != \
        by["moe-lora/top4/msp", "science"]["ece"]
    # the at-chance mark: once per model/gate and domain in each table, never per scorer row
    flagged = T.chance_reasons(rows)
    pairs = {(T.pair_of(by[k]), k[1]) for k in flagged}
    models = [m for m in T.model_rows(rows) if m.at_chance]
    assert html.count('at chance</span>') == len(models) + len(pairs) > 0
    # results.md and the printed summary: the same two levels
    md = (runs[0] / "results.md").read_text()
    model_md, scorer_md = md.split("## Model level")[1].split("## Scorer level")
    assert "| Model | Domain | Scorers | Acc |" in model_md and "OOD-AUROC" not in model_md
    assert "| Model | Scorer | Domain | OOD-AUROC |" in scorer_md and "| ECE |" not in scorer_md
    blocks = [ln for ln in scorer_md.splitlines() if ln.startswith("| moe-lora/top4")]
    assert len(blocks) == 3  # the model named once per domain
    printed = T.summary(rows)
    assert "Model" in printed and "Scorer" in printed
    assert [ln.split(" (")[0] for ln in printed.splitlines()].count("moe-lora/top4") == 1
    # results.csv keeps every column of every row
    with open(runs[0] / "results.csv", newline="") as f:
        assert len(list(csv.DictReader(f))) == len(rows)


def test_the_answers_name_the_best_method_and_pair_it_with_msp(runs) -> None:
    run = read_run(runs[0])
    got = answers(run, n_boot=200)
    assert [a.question for a in got[:4]] == list(QUESTIONS) and got[0].domain == "pooled"
    for a in got:
        col, higher = a.column, a.question.higher_is_better
        if a.question.column.level == "model":  # among the model-level rows
            cands = [m.row for m in T.model_rows(run.rows) if m.domain == a.domain
                     and not m.reference]
        else:
            cands = [r for r in run.rows if r["domain"] == a.domain and not T.is_reference(r)]
        best = (max if higher else min)(r[col] for r in cands if not math.isnan(r[col]))
        assert a.best[col] == best, (a.domain, col)
        assert a.verdict in ("yes", "no", "unclear", "not evidence") and a.line
        if a.diff is not None and a.diff != (0.0, 0.0, 0.0):
            d, lo, hi = a.diff  # best − MSP of the same model/gate, same questions resampled
            assert d == pytest.approx(a.best[col] - a.msp[col], abs=1e-12) and lo <= d <= hi
            assert a.msp["scorer"] == "msp" and "MSP" not in a.vs_msp
    # the page shows the headline (pooled) answers first, each with its verdict
    html = (runs[0] / "report.html").read_text()
    summary = html[html.index('id="summary"'):html.index('id="filter"')]
    assert all(q.text in summary for q in QUESTIONS)


def test_an_answer_without_values_says_why_from_the_rows_note(runs) -> None:
    """A calib split too small for alpha = 0.1 leaves no coverage value: the verdict quotes the
    rows' `cp_note` for that alpha (the reason), not only that the column is missing."""
    from dataclasses import replace

    run = read_run(runs[0])
    col = QUESTIONS[3].column.name
    why = "alpha=0.1 not reachable: 8 calibration questions, split conformal needs n >= 9"
    other = "alpha=0.05 not reachable: 8 calibration questions, split conformal needs n >= 19"
    rows = [{**r, col: math.nan, "cp_note": f"{other} | {why}"} for r in run.rows]
    got = [a for a in answers(replace(run, rows=rows), n_boot=50) if a.question is QUESTIONS[3]]
    assert got and all(a.verdict == "unclear" and a.line.endswith(f"on {a.domain}: {why}")
                       for a in got)


def test_a_broken_run_folder_names_each_missing_part_and_renders_the_rest(runs, tmp_path):
    d = tmp_path / "broken"
    shutil.copytree(runs[0], d)
    (d / "scores.npz").unlink()  # an interrupted run
    bad = min((d / "figures").glob("reliability_*.png"))
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
    import uqbench.run.folder

    def boom(run_dir):
        raise RuntimeError("template exploded")

    monkeypatch.setattr(uqbench.run.folder, "write_report", boom)
    score(record_set(1), ScoreConfig(out=tmp_path / "o", scorers=("msp",), figures=False))
    meta = json.loads((tmp_path / "o" / "run.json").read_text())
    assert meta["report_html_error"] == "RuntimeError: template exploded"
    assert "report.html was not written" in caplog.text
    # the rerun command names the folder the results are in, not the temporary one it was built in
    assert f"`uqbench report {tmp_path / 'o'} --html`" in caplog.text
    assert (tmp_path / "o" / "results.jsonl").exists() and not (
        tmp_path / "o" / "report.html"
    ).exists()


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
    c = compare(runs, n_boot=50)
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


def test_compare_refuses_runs_whose_columns_mean_other_things(runs, tmp_path):
    """A run folder written before a column changed its definition (no ``results_schema`` in
    its run.json: schema 1, when ``cp_aps_*`` were the strict sets) is not compared with one
    written after, though its column names match."""
    from uqbench.results.columns import RESULTS_SCHEMA

    assert json.loads((runs[0] / "run.json").read_text())["results_schema"] == RESULTS_SCHEMA
    old = tmp_path / "old"
    shutil.copytree(runs[1], old)
    meta = json.loads((old / "run.json").read_text())
    del meta["results_schema"]
    (old / "run.json").write_text(json.dumps(meta))
    with pytest.raises(UserError, match=rf"different schemas \(seed1: {RESULTS_SCHEMA}, old: 1\): "
                                        r"cp_aps_\* became the standard, inclusive APS"):
        compare([runs[0], old])


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


def test_the_smoke_runs_report_in_a_real_browser(smoke_run, browser, tmp_path) -> None:
    from uqbench.reporting.screenshot import VIEWPORT, screenshot

    run = smoke_run[0] / "run"
    report = run / "report.html"
    assert_numbers_equal_results_csv(report.read_text(), run)
    page = browser.new_page(viewport=VIEWPORT)
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.goto(report.as_uri(), wait_until="load")
    assert not errors, errors
    assert all(u.startswith(("file:", "data:")) for u in requests), requests  # offline
    # the answers are in the first screen, whole
    box = page.locator("#summary").bounding_box()
    assert box is not None and 0 <= box["y"] and box["y"] + box["height"] <= VIEWPORT["height"], box
    assert page.locator("#summary > table.answers > tbody > tr").count() == len(QUESTIONS)
    # every figure decodes, forest plots included
    sizes = page.eval_on_selector_all("img", "imgs => imgs.map(i => [i.alt, i.naturalWidth])")
    assert len(sizes) >= 5 and all(w > 0 for _, w in sizes), sizes
    assert {f"forest_{c}" for c in T.FOREST_COLUMNS} <= {alt for alt, _ in sizes}
    # sorting: a model table by accuracy, a scorer table by OOD-AUROC inside each model's block
    for table, header in (('table[data-level="model"][data-domain="pooled"]', "Acc"),
                          ('table[data-level="scorer"][data-domain="pooled"]', "OOD-AUROC")):
        col = page.eval_on_selector_all(f"{table} thead th",
                                        f"ths => ths.map(t => t.textContent).indexOf('{header}')")
        assert col > 0

        def values(table: str = table, col: int = col) -> list[list[float]]:
            return page.eval_on_selector_all(f"{table} tbody", f"""bs => bs.map(b =>
                Array.from(b.rows).filter(r => !r.classList.contains('group'))
                .map(r => r.cells[{col}].getAttribute('data-sort')).filter(v => v)
                .map(Number))""")

        page.click(f"{table} thead th:nth-child({col + 1})")
        up = values()
        assert sum(map(len, up)) >= 3 and all(v == sorted(v) for v in up), up
        page.click(f"{table} thead th:nth-child({col + 1})")
        assert values() == [sorted(v, reverse=True) for v in up]
        groups = page.eval_on_selector_all(
            f"{table} tbody", "bs => bs.map(b => b.rows[0].className)"
        )
        assert table.find("scorer") < 0 or all(g == "group" for g in groups)  # block headers stay
    # the filter: every word in a row's method/domain key; empty blocks and domains hide
    page.fill("#filter", "top4/msp science")
    visible = page.eval_on_selector_all(
        "tr[data-filter]", "rs => rs.filter(r => r.offsetParent !== null && !r.closest('details'))"
        ".map(r => r.getAttribute('data-filter'))")
    assert visible and all("top4/msp" in v and "science" in v for v in visible), visible
    assert page.locator('section[data-section-domain="pooled"]').first.is_hidden()
    page.fill("#filter", "")
    assert page.locator('section[data-section-domain="pooled"]').first.is_visible()
    page.close()
    # the README's picture: the summary, by one command
    shot = screenshot(run, tmp_path / "report.png", browser=browser)
    assert shot.read_bytes().startswith(b"\x89PNG") and shot.stat().st_size > 10_000


def test_a_run_without_figures_names_the_folder_within_the_run(tmp_path):
    # the page is written before the run folder gets its name: no temporary path on it
    score(record_set(1), ScoreConfig(out=tmp_path / "o", scorers=("msp",), figures=False))
    page = (tmp_path / "o" / "report.html").read_text()
    assert "figures/ is missing: no figures" in page and ".tmp" not in page
