"""Many models in one table (``uqbench score SRC1 SRC2 ...``, or a folder of models): the
model-by-metric table, its values against a direct computation from the samples, the paired
differences to the best model, the mismatch errors, and the report's section.

The models are the committed lm-eval run of the tiny model (tests/support/fixtures/lmeval/mc) and
copies of it whose log-likelihoods are perturbed, with lm-eval's per-sample acc / acc_norm /
acc_bytes recomputed as lm-eval 0.4 does (so the reader verifies them) and the results file naming
another model, in lm-eval's ``--output_path`` layout ``<out>/<org>__<model>/``."""
from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import numpy as np
import pytest

from tests.support import lmeval

MC = lmeval.COMMITTED / "mc"
DOMAIN = "science=arc_easy_local:arc_challenge_local"
CALIB = 0.25
B = 40  # bootstrap resamples


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def model_copy(dest: Path, name: str | None, seed: int | None, *, keep: int | None = None
               ) -> Path:
    """The committed ARC run in ``dest``: with ``seed``, each log-likelihood moved by a seeded
    normal (sd 2) and the per-sample metrics recomputed; with ``name``, the results file naming
    that model; with ``keep``, only the first ``keep`` questions of each task."""
    rng = None if seed is None else np.random.default_rng(seed)
    dest.mkdir(parents=True)
    for src in sorted(MC.iterdir()):
        text = src.read_text()
        if src.name.startswith("samples_"):
            rows = _rows(src)[:keep]
            for r in rows:
                if rng is None:
                    continue
                ll = np.array([float(x) for x, _ in r["filtered_resps"]])
                ll = ll + rng.normal(0.0, 2.0, ll.size)
                r["filtered_resps"] = [[repr(float(x)), "False"] for x in ll]
                r["resps"] = [[x] for x in r["filtered_resps"]]
                choices, gold = r["doc"]["choices"], int(r["target"])
                for metric, length in (("acc", lambda c: 1), ("acc_norm", len),
                                       ("acc_bytes", lambda c: len(c.encode()))):
                    r[metric] = float(np.argmax(ll / [length(c) for c in choices]) == gold)
            text = "".join(json.dumps(r) + "\n" for r in rows)
        elif name is not None:
            text = text.replace('"tiny-llama"', json.dumps(name))
        (dest / src.name).write_text(text)
    return dest


def models_folder(root: Path) -> Path:
    """lm-eval's ``--output_path`` after three models: ``root/<org>__<model>/``."""
    model_copy(root / "tiny-llama", None, None)
    model_copy(root / "org__noisy-a", "org/noisy-a", 1)
    model_copy(root / "org__noisy-b", "org/noisy-b", 2)
    return root


def args(sources: list[Path], out: Path, *extra: str) -> list[str]:
    return ["score", *map(str, sources), "--out", str(out), "--domain", DOMAIN,
            "--calib-fraction", str(CALIB), "--scorers", "msp,entropy", "--bootstrap", str(B),
            *extra]


@pytest.fixture(scope="module")
def scored(tmp_path_factory, png_figures: None, heavy_compute: None) -> Path:
    """A folder of three models scored once, with figures."""
    from uqbench import cli

    tmp = tmp_path_factory.mktemp("many")
    assert cli.main(args([models_folder(tmp / "lm")], tmp / "run")) == 0
    return tmp / "run"


def test_a_folder_of_models_gives_one_model_by_metric_table(scored: Path) -> None:
    """One pair per model, named from the results files; models.csv holds every (domain, model,
    metric) once; the best model of a column has no difference, the others one each."""
    from uqbench.reporting.models import read_models
    from uqbench.results.tables import MODEL_COLUMNS

    meta = json.loads((scored / "run.json").read_text())
    models = ["org/noisy-a/loglik-per-char", "org/noisy-b/loglik-per-char",
              "tiny-llama/loglik-per-char"]
    assert meta["model_table"]["models"] == models and meta["model_table"]["scorer"] == "msp"
    assert sorted(meta["models"]) == models
    rows = list(csv.DictReader((scored / "models.csv").open()))
    assert len(rows) == 2 * len(models) * len(MODEL_COLUMNS)  # pooled and science
    assert {(r["domain"], r["model"], r["metric"]) for r in rows} == {
        (d, m, c) for d in ("pooled", "science") for m in models for c in MODEL_COLUMNS}
    t = read_models(scored)
    assert t is not None
    for table in t.cells.values():
        for c in t.columns:
            best = [m for m in models if table[m][c].best]
            assert len(best) == 1
            assert table[best[0]][c].diff is None
            assert all(table[m][c].diff is not None for m in models if m != best[0])
    md = (scored / "models.md").read_text()
    assert md.count("| tiny-llama/loglik-per-char |") == 2 and "(best)" in md


def _direct(scored: Path) -> dict:
    """Per model, from the samples files alone: the ID and shifted questions (the calib hold-out
    as run.json records it), lm-eval's own acc_norm and the MSP uncertainty of the softmax of
    ll / len(choice)."""
    meta = json.loads((scored / "run.json").read_text())
    out = {}
    for pair, m in meta["models"].items():
        files = m["lmeval"]["files"]
        held = set(m["lmeval"]["calib_held_out"]["doc_ids"]["science"])
        got = {}
        for role, task in (("id", "arc_easy_local"), ("shift", "arc_challenge_local")):
            rows = [r for r in _rows(Path(files[task]))
                    if role == "shift" or r["doc_id"] not in held]
            u = []
            for r in rows:
                z = np.array([float(x) for x, _ in r["filtered_resps"]]) / [
                    len(c) for c in r["doc"]["choices"]]
                p = np.exp(z - z.max())
                u.append(1.0 - p.max() / p.sum())
            got[role] = (np.array([r["acc_norm"] for r in rows]), np.array(u))
        out[pair] = got
    return out


def test_values_cis_and_differences_equal_a_direct_computation(scored: Path) -> None:
    """The accuracy of each model is lm-eval's acc_norm on the ID questions, its CI the
    percentile bootstrap of those 0/1 values; the accuracy and OOD-AUROC differences to the
    best model are paired bootstraps over the same questions, recomputed here from the samples
    files (same seed, same resamples)."""
    from uqbench.reporting.models import read_models
    from uqbench.stats import metrics as M

    t = read_models(scored)
    assert t is not None
    d = _direct(scored)
    table = t.cells["science"]
    for m in t.models:
        acc = d[m]["id"][0]
        cell = table[m]["accuracy"]
        assert cell.value == pytest.approx(acc.mean(), abs=1e-12)
        _, lo, hi = M.bootstrap_ci(np.mean, acc, n_resamples=B, seed=0)
        assert (cell.lo, cell.hi) == pytest.approx((lo, hi), abs=1e-12)
    for col, two, arrays in (("accuracy", False, lambda m: [d[m]["id"][0]]),
                             ("ood_auroc", True, lambda m: [d[m]["id"][1], d[m]["shift"][1]])):
        best = next(m for m in t.models if table[m][col].best)
        values = {m: table[m][col].value for m in t.models}
        assert values[best] == (max(values.values()))  # both: higher is better
        metric = np.mean if col == "accuracy" else M.ood_auroc
        for m in t.models:
            if m == best:
                continue
            want = M.paired_difference(metric, arrays(best), arrays(m), two_sample=two,
                                       n_resamples=B, seed=0)
            assert table[m][col].diff == pytest.approx(want, abs=1e-9), (col, m)
            assert table[m][col].diff[0] == pytest.approx(values[m] - values[best], abs=1e-9)


def test_the_report_shows_the_models_side_by_side(scored: Path) -> None:
    """report.html opens on the models: the table with every model, the ranking figure and
    one reliability figure per domain holding every model's diagram."""
    html = (scored / "report.html").read_text()
    start = html.index('id="models-side-by-side"')
    assert start < html.index('id="scorers"')
    section = html[start:html.index('<div class="filter">')]
    for m in ("org/noisy-a", "org/noisy-b", "tiny-llama"):
        assert f'data-model="{m}/loglik-per-char"' in section
    assert section.count('data-domain="pooled"') == 3 + 1  # 3 rows, the table
    for stem in ("models_ranking", "models_reliability_pooled", "models_reliability_science"):
        assert (scored / "figures" / f"{stem}.png").is_file()
        assert f'alt="{stem}"' in section
    assert "models_ranking" not in html[html.index('id="figures"'):]  # not repeated below


def test_ranking_figure_draws_the_results_cells(scored: Path) -> None:
    """Each point of the ranking figure is a value of results.jsonl, each bar its CI; models
    sorted best first on pooled."""
    from figures.data import load_run
    from figures.ranking import ranking_figure

    run = load_run(scored)
    fig = ranking_figure(run)
    assert fig is not None
    for ax in fig.axes:
        for line in ax.get_lines():
            gid = line.get_gid()
            if not gid or gid.startswith(("ci|", "random")):  # CIs, the random reference
                continue
            col, model, dom = gid.split("|")
            row = run.row(f"{model}/msp", dom)
            assert line.get_xdata()[0] == row[col]
    acc = next(ax for ax in fig.axes if ax.get_title().startswith("Acc"))
    labels = [t.get_text() for t in acc.get_yticklabels()]  # one gate: named in the title
    assert "all /loglik-per-char" in fig.get_suptitle()
    vals = [run.row(f"{m}/loglik-per-char/msp", "pooled")["accuracy"] for m in labels]
    assert vals == sorted(vals, reverse=True)


def test_several_sources_equal_a_folder_of_models(scored: Path, tmp_path: Path) -> None:
    """The model folders given one by one make the same table."""
    from uqbench import cli

    lm = models_folder(tmp_path / "lm")
    out = tmp_path / "run"
    assert cli.main(args(sorted(lm.iterdir()), out, "--no-figures")) == 0
    assert (out / "models.csv").read_text() == (scored / "models.csv").read_text()


def test_mismatched_questions_and_models_are_refused_before_any_output(tmp_path, capsys):
    """Other questions (another --limit), another label, one model twice, --model-name or
    --members with several models, and a --rank-scorer not run: errors naming the problem;
    nothing is written."""
    from uqbench import cli

    a = model_copy(tmp_path / "a", None, None)
    cases = {
        "limit": (model_copy(tmp_path / "limit", "org/x", 1, keep=6), (),
                  (r"not over the same questions.*split science/id.*question ids: \d+ vs \d+ "
                   r"questions; \d+ only in the first \(e.g. arc_easy_local/")),
        "twice": (model_copy(tmp_path / "twice", None, 3), (),
                  r"both hold model 'tiny-llama/loglik-per-char': two runs of one model"),
        "name": (model_copy(tmp_path / "name", "org/y", 1), ("--model-name", "m"),
                 r"1 --model-name for 2 model source\(s\) .*give one name per source"),
        "members": (tmp_path / "name", ("--members", str(a)),
                    r"--members belong to one model"),
        "rank": (tmp_path / "name", ("--rank-scorer", "energy"),
                 r"--rank-scorer 'energy' is not among the scorers run"),
    }
    for case, (other, extra, match) in cases.items():
        out = tmp_path / f"out-{case}"
        assert cli.main(args([a, other], out, "--no-figures", *extra)) == 2, case
        err = capsys.readouterr().err
        assert re.search(match, err), (case, err)
        assert not out.exists()


def test_a_label_that_differs_between_models_is_refused(tmp_path: Path) -> None:
    """The same question with another gold answer in one model's file: refused, naming it."""
    from uqbench.core.errors import UserError
    from uqbench.run.score_records import load_models

    a = model_copy(tmp_path / "a", None, None)
    b = model_copy(tmp_path / "b", "org/b", 1)
    path = next(b.glob("samples_arc_challenge_local_*.jsonl"))
    rows = _rows(path)
    r = rows[3]
    r["target"] = str((int(r["target"]) + 1) % len(r["doc"]["choices"]))
    r["doc"]["gold"] = int(r["target"])
    r.pop("acc"), r.pop("acc_norm"), r.pop("acc_bytes")
    path.write_text("".join(json.dumps(x) + "\n" for x in rows))
    with pytest.raises(UserError, match=r"split science/shift: .* other contents"):
        load_models([a, b], domains=[DOMAIN], calib_fraction=CALIB)


def test_an_unreadable_model_table_is_named_on_the_page(scored: Path, tmp_path: Path) -> None:
    """report.html of a run whose models.json is corrupt names it and renders the rest."""
    import shutil

    from uqbench.reporting.html import render_report

    run = Path(shutil.copytree(scored, tmp_path / "run"))
    (run / "models.json").write_text("{not json")
    html = render_report(run)
    assert 'data-part="models.json"' in html and 'id="models-side-by-side"' not in html
    assert 'id="scorers"' in html


def test_a_split_listed_in_another_order_is_paired_question_by_question(tmp_path) -> None:
    """A model whose shifted file lists the questions in reverse is read into the first model's
    order: its records equal those of the same file in order."""
    from uqbench.run.score_records import load_models

    a = model_copy(tmp_path / "a", None, None)
    b = model_copy(tmp_path / "b", "org/b", 1)
    rev = model_copy(tmp_path / "rev", "org/b", 1)
    path = next(rev.glob("samples_arc_challenge_local_*.jsonl"))
    path.write_text("".join(reversed(path.read_text().splitlines(keepends=True))))
    key = ("org/b/loglik-per-char", "science/shift", 0)
    plain = load_models([a, b], domains=[DOMAIN], calib_fraction=CALIB).outputs[key]
    merged = load_models([a, rev], domains=[DOMAIN], calib_fraction=CALIB)
    assert merged.outputs[key].ids.tolist() == plain.ids.tolist()
    assert merged.outputs[key].ids.tolist() != [f"arc_challenge_local/{r['doc_id']}"
                                                for r in _rows(path)]
    np.testing.assert_array_equal(merged.outputs[key].logits, plain.logits)
    np.testing.assert_array_equal(merged.outputs[key].labels, plain.labels)


def test_models_are_named_as_people_know_them(tmp_path: Path, capsys) -> None:
    """A hub id stays ORG/NAME, a Hugging Face cache path is ORG/NAME, a local folder is its
    name (never a snapshot hash); two sources sharing a base path with other model_args (an
    adapter) are named by their folders, saying so; --model-name names each source in order;
    equal model_args stay two runs of one model."""
    from uqbench.core.errors import UserError
    from uqbench.io.lmeval import model_label
    from uqbench.run.score_records import load_models

    sha = "3548789f2a0d5c1b9e6a4f7c8d2b1a0e9f8c7d6b"
    cache = f"/hub/models--google--gemma-3-27b/snapshots/{sha}"
    here = Path("lm-out")
    assert model_label(cache, json.dumps({"pretrained": cache}), here) == "google/gemma-3-27b"
    assert model_label("x", json.dumps("pretrained=Qwen/Qwen2.5-7B,dtype=bfloat16"),
                       here) == "Qwen/Qwen2.5-7B"
    assert model_label(f"/ckpt/my-model/{sha}", None, here) == "my-model"
    assert model_label(None, None, Path("details_org__m")) == "org__m"

    base = model_copy(tmp_path / "gemma-base", cache, None)
    lofit = model_copy(tmp_path / "gemma-lofit", cache, 1)
    res = next(lofit.glob("results_*.json"))
    doc = json.loads(res.read_text())
    doc["config"]["model_args"]["peft"] = "/adapters/lofit"
    res.write_text(json.dumps(doc))
    rs = load_models([base, lofit], domains=[DOMAIN], calib_fraction=CALIB)
    assert [p.name for p in rs.pairs] == ["gemma-base/loglik-per-char",
                                          "gemma-lofit/loglik-per-char"]
    assert "named by their folders: gemma-base, gemma-lofit" in capsys.readouterr().out
    assert "named by its folder" in rs.meta["models"]["gemma-lofit/loglik-per-char"]["renamed"]
    named = load_models([base, lofit], domains=[DOMAIN], calib_fraction=CALIB,
                        model_name=["base", "lofit"])
    assert [p.name for p in named.pairs] == ["base/loglik-per-char", "lofit/loglik-per-char"]
    same = model_copy(tmp_path / "same", cache, 2)
    with pytest.raises(UserError, match=r"both hold model 'google/gemma-3-27b/loglik-per-char'"):
        load_models([base, same], domains=[DOMAIN], calib_fraction=CALIB)


def test_a_base_and_its_adapter_in_lm_evals_own_layout_are_named_by_their_folders(
        tmp_path: Path, capsys) -> None:
    """lm-eval names its ``--output_path`` subfolder after ``pretrained=``, so a base and its
    adapter are ``base/<model>/`` and ``lofit/<model>/``; given as those inner folders, or as
    ``simple_evaluate`` dumps that are both ``results.json``, they are named by the nearest
    folders that differ (``base``, ``lofit``), not refused as two runs of one model."""
    from tests.io.test_lmeval import dump_of
    from uqbench.reporting.html import render_report
    from uqbench.run.score_records import ScoreConfig, apart, load_models, score

    base = model_copy(tmp_path / "cli" / "base" / "tiny-llama", None, None)
    lofit = model_copy(tmp_path / "cli" / "lofit" / "tiny-llama", None, 1)
    res = next(lofit.glob("results_*.json"))
    doc = json.loads(res.read_text())
    doc["config"]["model_args"]["peft"] = "/adapters/lofit"
    res.write_text(json.dumps(doc))
    dumps = [dump_of(d, tmp_path / "se" / n / "results.json")
             for n, d in (("base", base), ("lofit", lofit))]
    for sources in ([base, lofit], dumps):
        rs = load_models(sources, domains=[DOMAIN], calib_fraction=CALIB)
        assert [p.name for p in rs.pairs] == ["base/loglik-per-char", "lofit/loglik-per-char"]
        assert "named by their folders: base, lofit" in capsys.readouterr().out
    out = tmp_path / "o"
    score(rs, ScoreConfig(out=out, scorers=("msp",), figures=False, bootstrap=20))
    page = render_report(out)
    assert "<h1>uqbench: base, lofit scored from lm-eval 0.4.13</h1>" in page
    (tmp_path / "x.json").write_text("{}")
    assert apart([dumps[0], tmp_path / "x.json"]) == ["results", "x"]
    assert apart([base, base]) is None
    # lm-eval 0.4.13 names an adapter run's subfolder after peft=: the sanitised local paths
    assert apart([Path("/o/__ckpt__SmolLM2"), Path("/o/__ckpt__SmolLM2-lora")]) == [
        "SmolLM2", "SmolLM2-lora"]
    assert apart([Path("/a/__x__m"), Path("/b/__y__m")]) == ["a", "b"]


def test_one_models_tasks_in_several_folders_are_one_model(tmp_path: Path) -> None:
    """lm-eval run once per task into ``TASK/<org>__<model>/`` (as published task folders
    often are): the folders whose results files all name one model are that model's source,
    not one model per folder; folders of other models stay one source each."""
    from uqbench.run.score_records import load_models, model_sources

    root = tmp_path / "tasks"
    for task in ("arc_easy_local", "arc_challenge_local"):
        folder = root / task / "tiny-llama"
        folder.mkdir(parents=True)
        for src in MC.iterdir():
            if src.name.startswith("results_") or task + "_2" in src.name:
                (folder / src.name).write_text(src.read_text())
    assert model_sources(root) == [root]
    rs = load_models([root], domains=[DOMAIN], calib_fraction=CALIB)
    direct = load_models([MC], domains=[DOMAIN], calib_fraction=CALIB)
    assert [p.name for p in rs.pairs] == [p.name for p in direct.pairs]
    assert rs.meta["lmeval"]["accuracy"] == direct.meta["lmeval"]["accuracy"]
    assert model_sources(models_folder(tmp_path / "three")) == [
        tmp_path / "three" / n for n in ("org__noisy-a", "org__noisy-b", "tiny-llama")]


def test_several_sources_without_a_domain_score_each_task_alone(tmp_path: Path) -> None:
    """No --domain with two models: each model's tasks alone (the same domains for both), no
    shift split, and the absent shift columns' reason recorded once."""
    from uqbench.io.lmeval import NO_SHIFT
    from uqbench.run.score_records import load_models

    a = model_copy(tmp_path / "a", None, None)
    b = model_copy(tmp_path / "b", "org/b", 1)
    rs = load_models([a, b], calib_fraction=CALIB)
    assert set(rs.domains) == {"arc_challenge_local", "arc_easy_local"}
    assert {p.model.name for p in rs.pairs} == {"tiny-llama", "org/b"}
    assert not any(split.endswith("/shift") for _, split, _ in rs.outputs)
    assert {(p, s) for p, s, _ in rs.outputs} == {
        (p.name, f"{d}/{r}") for p in rs.pairs for d in rs.domains for r in ("id", "calib")}
    rs.check()
    assert NO_SHIFT in json.dumps(rs.meta)
