"""The runner on a tiny random BERT and a small real-data suite: pass counting, warm cache,
plugins, and bad input failing before model work."""
from __future__ import annotations

import hashlib
import json
import sys
import textwrap
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import builtin_scorers
from tests.support.suites import arc_suite
from uqbench.core.errors import ConfigError, PluginError, UserError
from uqbench.core.profiles import get_profile
from uqbench.run.runner import IDENTITY_VERSION, IF_SET, Identity, RunConfig, prepare, run

SUITE = arc_suite(caps=(16, 8, 12, 12), header="choices: 4\n", knowledge=True)

PLUGIN = textwrap.dedent("""
    import numpy as np
    from uqbench import Scorer, register_scorer

    @register_scorer("test_gini")
    class Gini(Scorer):
        requires = frozenset({"logits"})
        def __call__(self, outputs):
            p = self.predictive(outputs)
            return 1.0 - (p ** 2).sum(axis=1)

    @register_scorer("test_nan")
    class NaN(Scorer):
        def __call__(self, outputs):
            return np.full(outputs.n, np.nan)
""")


@pytest.fixture(scope="module")
def env(tmp_path_factory, real_data_dir_module):
    root = tmp_path_factory.mktemp("runner")
    (root / "tiny.yaml").write_text(SUITE)
    (root / "uq_test_plugin.py").write_text(PLUGIN)
    sys.path.insert(0, str(root))
    yield root, real_data_dir_module
    sys.path.remove(str(root))


@pytest.fixture(scope="module")
def real_data_dir_module(real_data):  # tests/conftest.py: skips without data; slow tier
    return real_data


def cfg(env, **kw) -> RunConfig:
    root, data = env
    base = {"suite": str(root / "tiny.yaml"), "profile": "smoke", "backbone": "tiny-bert",
            "scorers": builtin_scorers(), "out": root / "out", "cache_dir": root / "cache",
            "data_dir": data, "figures": False,
            "progress": False}
    base.update(kw)
    return RunConfig(**base)


@pytest.fixture(scope="module")
def cold(env):
    return run(cfg(env))


def test_cold_run_counts_exactly_the_passes_the_plan_needs(cold):
    prof = get_profile("smoke")
    passes = cold.stats.passes
    splits = {k[3] for k in passes if not k[3].endswith("/train")}
    # calib too: every method's ECE is recalibrated on it (uqbench.results.recalibration)
    assert splits == {f"{d}/{r}" for d in ("science", "knowledge")
                      for r in ("id", "shift", "calib")}
    # train: one deterministic pass per (model, gate), the feature scorers' reference
    train = {k: v for k, v in passes.items() if k[3].endswith("/train")}
    assert train == {(m, 0, g, f"{d}/train", "deterministic"): 1
                     for m, g in (("lora", "dense"), ("moe-lora", "top4"), ("moe-lora", "care"))
                     for d in ("science", "knowledge")}
    for split in splits:
        # one deterministic pass per (model, gate, split) for all single-pass scorers together
        assert passes["lora", 0, "dense", split, "deterministic"] == 1
        assert passes["moe-lora", 0, "top4", split, "deterministic"] == 1
        assert passes["moe-lora", 0, "care", split, "deterministic"] == 1
        # T MC-dropout passes and the other M - 1 ensemble members
        assert passes["moe-lora", 0, "top4", split, "mc_dropout"] == prof.mc_passes
        for m in range(1, prof.ensemble_members):
            assert passes["moe-lora", m, "top4", split, "deterministic"] == 1
    per_split = 3 + prof.mc_passes + prof.ensemble_members - 1
    assert cold.stats.total() == per_split * len(splits) + len(train)
    assert cold.stats.cache_hits == 0


def test_forward_passes_column_matches_the_plan(cold):
    prof = get_profile("smoke")
    by = {(r["method"], r["domain"]): r for r in cold.rows}
    assert by["moe-lora/top4/msp", "pooled"]["forward_passes"] == 1
    assert by["moe-lora/care/care", "pooled"]["forward_passes"] == 1
    assert by["moe-lora/top4/mc_dropout_entropy", "pooled"]["forward_passes"] == prof.mc_passes
    assert by["moe-lora/top4/ensemble_msp", "pooled"]["forward_passes"] == prof.ensemble_members
    care = by["moe-lora/care/care", "pooled"]
    assert 1 <= care["avg_experts"] <= 8 and np.isnan(by["lora/dense/msp", "pooled"]["avg_experts"])
    assert 0 <= care["ood_auroc_lo"] <= care["ood_auroc"] <= care["ood_auroc_hi"] <= 1
    meta = json.loads((cold.out / "run.json").read_text())
    assert meta["gates"]["moe-lora/care@0"]["calibration"]["target"] == 4.0


def test_every_row_reports_recalibrated_ece_beside_the_raw_one(cold):
    from uqbench.results.tables import is_reference
    from uqbench.stats.recalibration import CALIBRATORS

    rows = [r for r in cold.rows if not is_reference(r)]
    assert rows
    for r in rows:
        cols = list(r)
        assert cols[cols.index("ece_hi") + 1] == "ece_ts"  # beside the raw ECE
        for kind in CALIBRATORS:
            assert 0 <= r[f"ece_{kind}_lo"] <= r[f"ece_{kind}"] <= r[f"ece_{kind}_hi"] <= 1
        assert r["ts_temperature"] > 0 and r["n_calib"] == (16 if r["domain"] == "pooled" else 8)
    by = {(r["method"], r["domain"]): r for r in rows}
    assert by["moe-lora/top4/msp", "pooled"]["calib_hashes"].count(",") == 1  # two domains
    with np.load(cold.out / "scores.npz") as z:
        for kind in CALIBRATORS:
            conf = z[f"moe-lora/care/care|pooled|id|confidence_{kind}"]
            assert conf.shape == z["moe-lora/care/care|pooled|id|confidence"].shape
    assert "ECE-TS" in (cold.out / "results.md").read_text()


def test_one_gate_under_two_names_is_calibrated_and_run_once(env, cold):
    """The ablation's ``fixed-k`` is ``top4`` and its ``care`` is the default CARE gate: both
    are read from the records the default run wrote; only the new gates cost passes."""
    root, _ = env
    abl = run(cfg(env, experiment="ablation", scorers=("care", "msp"), out=root / "out-ablation"))
    assert {k[2] for k in abl.stats.passes} == {"random-k", "entropy-k", "nucleus-only"}
    meta = json.loads((abl.out / "run.json").read_text())
    assert meta["gates"]["moe-lora/fixed-k@0"]["spec"]["name"] == "fixed-k"  # logged by its name
    by = {(r["method"], r["domain"]): r for r in abl.rows}
    ref = {(r["method"], r["domain"]): r for r in cold.rows}
    assert by["moe-lora/fixed-k/care", "pooled"]["accuracy"] == \
        ref["moe-lora/top4/care", "pooled"]["accuracy"]


def test_cold_run_json_holds_every_trained_models_training_log(cold):
    prof = get_profile("smoke")
    meta = json.loads((cold.out / "run.json").read_text())
    assert set(meta["training"]) == {"lora@0", "moe-lora@0",
                                     *(f"moe-lora@{m}" for m in range(1, prof.ensemble_members))}
    assert sorted(meta["training"]) == sorted(cold.stats.trained)
    for name, t in meta["training"].items():
        assert t["steps"] > 0 and t["seconds"] > 0, name
        assert len(t["losses"]) == len(t["aux_losses"]) == len(t["train_accuracy"]) == t["steps"]
        assert all(0 <= a <= 1 for a in t["train_accuracy"])
        s = t["summary"]
        assert s["first_loss"] == pytest.approx(np.mean(t["losses"][:10]))
        assert s["last_train_accuracy"] == pytest.approx(np.mean(t["train_accuracy"][-10:]))
        assert s["chance_loss"] == pytest.approx(np.log(4))  # the suite keeps 4 options


def test_reference_rows_and_at_chance_in_the_run(cold):
    from uqbench.results.references import at_chance
    from uqbench.results.tables import is_reference

    refs = {(r["method"], r["domain"]): r for r in cold.rows if is_reference(r)}
    assert set(refs) == {(m, d) for m in ("chance", "options-only")
                         for d in ("science", "knowledge", "pooled")}
    assert refs["chance", "pooled"]["accuracy"] == pytest.approx(0.25)  # 4 options everywhere
    assert refs["options-only", "pooled"]["n_id"] == 24
    meta = json.loads((cold.out / "run.json").read_text())
    assert meta["at_chance"] == at_chance(cold.rows)
    md = (cold.out / "results.md").read_text()
    assert "| chance | pooled |" in md and "| options-only | science |" in md


def test_warm_rerun_does_no_model_work_and_gives_identical_numbers(env, cold, monkeypatch):
    import uqbench.results.evaluate

    def no_evaluation(*a, **k):
        raise AssertionError("a warm rerun must read its rows from the evaluation cache")

    training = json.loads((cold.out / "run.json").read_text())["training"]
    monkeypatch.setattr(uqbench.results.evaluate, "evaluate", no_evaluation)
    warm = run(cfg(env))
    assert warm.stats.total() == 0 and warm.stats.trained == []
    assert json.dumps(warm.rows) == json.dumps(cold.rows)  # NaN-safe exact comparison
    # the training logs travel with the cached checkpoints: a warm run shows them too
    assert json.loads((warm.out / "run.json").read_text())["training"] == training


def test_fallbacks_go_to_run_json_on_every_run_and_are_reset_per_run(env, cold, monkeypatch):
    """A failed temperature fit (netcal's fit patched to NaN, on a recalibration cache of its
    own) is listed in run.json ``fallbacks`` for every method, domain and seed -- on the run
    that fitted and on the warm one that read the fit from the cache --, and a run without one
    lists none (the collector is per run)."""
    import netcal.scaling

    import uqbench.results.recalibration as R
    from uqbench.core.errors import FallbackWarning
    from uqbench.stats.recalibration import T_MAX

    assert json.loads((cold.out / "run.json").read_text())["fallbacks"] == []
    monkeypatch.setattr(netcal.scaling.TemperatureScaling, "temperature",
                        property(lambda self: np.array([np.nan])))
    monkeypatch.setattr(R, "fits_code_hash", lambda: "test: failed temperature fits")
    n_rows = sum(r["method"] not in ("chance", "options-only") for r in cold.rows)
    for _ in ("fits", "cached"):
        with pytest.warns(FallbackWarning, match="temperature scaling fit"):
            res = run(cfg(env, out=env[0] / "out-fallbacks"))
        got = json.loads((res.out / "run.json").read_text())["fallbacks"]
        assert len(got) == n_rows * get_profile("smoke").seeds
        assert {r["what"] for r in got} == {"temperature scaling fit"}
        assert all("1/T = nan" in r["reason"] for r in got)
        assert [r["ts_temperature"] for r in res.rows if "ts_temperature" in r] == \
            [T_MAX] * n_rows
    monkeypatch.undo()
    assert json.loads((run(cfg(env)).out / "run.json").read_text())["fallbacks"] == []


def test_a_fallback_is_listed_once_per_run_however_often_it_happens():
    # e.g. a split's truncation, seen by every pass over the split
    import warnings

    from uqbench.core.errors import FallbackWarning, record_fallback, reset_fallbacks

    def record_all() -> None:
        for _ in range(3):
            record_fallback("input truncated", "code/shift", "2 of 24 questions")
        record_fallback("input truncated", "code/id", "1 of 24 questions")

    got = reset_fallbacks()
    with pytest.warns(FallbackWarning) as seen:
        record_all()
    assert len(seen) == 2 and [f["where"] for f in got] == ["code/shift", "code/id"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        reset_fallbacks()
        with pytest.warns(FallbackWarning):  # a new run records it again
            record_fallback("input truncated", "code/shift", "2 of 24 questions")
    assert len(got) == 1


def test_evaluation_cache_is_keyed_by_content_and_options(tmp_path):
    from uqbench.files.cache import ArrayCache
    from uqbench.results.evaluate import Scored, evaluate, evaluate_cached

    rng = np.random.default_rng(0)
    a, b = (Scored(rng.random((50, 1)), rng.random((50, 1)), (rng.random((50, 1)) < .5) * 1.0,
                   None) for _ in range(2))
    cache = ArrayCache(tmp_path)
    first = evaluate_cached(cache, a, b, n_boot=50)
    again = evaluate_cached(cache, a, b, n_boot=50)  # read back; json: NaN-safe comparison
    assert json.dumps(again) == json.dumps(first) == json.dumps(evaluate(a, b, n_boot=50))
    assert evaluate_cached(cache, a, b, n_boot=60) != first  # other options: other entry
    flipped = Scored(a.uncertainty, a.confidence, 1.0 - a.correct, None)
    assert evaluate_cached(cache, flipped, b, n_boot=50)["accuracy"] == 1 - first["accuracy"]
    assert len(list((tmp_path / "evaluate").iterdir())) == 3


def test_figures_are_drawn_once_and_redrawn_when_missing(env, cold, monkeypatch, png_figures):
    import figures

    out = env[0] / "out-fig"
    run(cfg(env, out=out, figures=True))
    stamp = json.loads((out / "figures" / "STAMP").read_text())
    assert "reliability_pooled.png" in stamp["files"]
    drawn = []
    monkeypatch.setattr(figures, "draw_run", lambda d: drawn.append(d) or [])
    run(cfg(env, out=out, figures=True))
    assert drawn == []  # same results, same figures code: nothing to redraw
    (out / "figures" / "reliability_pooled.png").unlink()
    run(cfg(env, out=out, figures=True))
    assert drawn == [out]


def test_user_plugin_scorer_joins_the_table_at_no_forward_cost(env, cold):
    res = run(cfg(env, plugins=("uq_test_plugin",), scorers=("msp", "test_gini"),
                  out=env[0] / "out-plugin"))
    assert res.stats.total() == 0
    gini = [r for r in res.rows if r["scorer"] == "test_gini"]
    assert {r["method"] for r in gini} == {"lora/dense/test_gini", "moe-lora/top4/test_gini",
                                          "moe-lora/care/test_gini"}


def test_plugin_returning_nan_stops_the_run_naming_it(env, cold):
    with pytest.raises(PluginError, match="scorer 'test_nan' returned NaN"):
        run(cfg(env, plugins=("uq_test_plugin",), scorers=("test_nan",), out=env[0] / "o-nan"))
    assert not (env[0] / "o-nan" / "results.jsonl").exists()
    assert any((env[0] / "cache" / "forward").iterdir())  # computed records stay on disk


def test_out_dir_of_another_configuration_is_never_replaced(env, cold):
    with pytest.raises(UserError, match="different run configuration"):
        prepare(cfg(env, budget=3.0))
    prepare(cfg(env, budget=3.0, overwrite=True))  # explicit opt-in is accepted


@pytest.mark.parametrize("kw, match", [
    ({"profile": "quick"}, "unknown profile 'quick'; valid: cpu, full, gpu, smoke"),
    ({"scorers": ("mps",)}, r"unknown scorer 'mps' \(did you mean 'msp'"),
    ({"backbone": "minilmm"}, "unknown backbone 'minilmm'"),
    ({"plugins": ("no_such_plugin_mod",)}, "'no_such_plugin_mod' failed to import"),
    ({"experiment": "ablations"}, "unknown experiment 'ablations'"),
    ({"suite": "pooledd"}, "pooledd"),
])
def test_bad_input_fails_before_any_model_work(env, kw, match):
    with pytest.raises(UserError, match=match):
        prepare(cfg(env, out=env[0] / "never", **kw))
    assert not (env[0] / "never").exists()


def test_scorer_no_model_can_serve_is_rejected_up_front(env):
    from uqbench import get_scorer
    from uqbench.core.plan import DENSE, DET, LORA, Pair, methods

    with pytest.raises(ConfigError, match="scorer 'care' needs field"):
        methods([Pair(LORA, DENSE, DET)], [get_scorer("care")])


def test_every_seed_is_kept_per_example(env):
    """scores.npz holds one column per seed; the CIs and verdicts pool them
    (uqbench.reporting.paper)."""
    root, _ = env
    res = run(cfg(env, seeds=2, scorers=("msp",), out=root / "out-seeds", models=("moe-lora",)))
    with np.load(res.out / "scores.npz") as z:
        correct = z["moe-lora/top4/msp|pooled|id|correct"]
        experts = z["moe-lora/top4|pooled|id|experts"]
    row = next(r for r in res.rows
               if r["method"] == "moe-lora/top4/msp" and r["domain"] == "pooled")
    assert correct.shape == (row["n_id"], 2) and experts.shape == (row["n_id"], 2)
    assert row["accuracy"] == pytest.approx(correct.mean())


def test_scoring_the_runs_own_records_gives_every_value_of_its_table(env, cold, tmp_path):
    """`uqbench score` on the records a run wrote: the same rows, value for value, and the same
    per-example scores; no model work."""
    from uqbench.io.recordset import read_record_set
    from uqbench.run.score_records import ScoreConfig, score

    again = score(read_record_set(cold.out / "records"),
                  ScoreConfig(out=tmp_path / "scored", figures=False))
    assert (tmp_path / "scored" / "results.csv").read_text() == \
        (cold.out / "results.csv").read_text()
    with np.load(cold.out / "scores.npz") as a, np.load(tmp_path / "scored" / "scores.npz") as b:
        assert sorted(a.files) == sorted(b.files)
        for k in a.files:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    meta = json.loads((tmp_path / "scored" / "run.json").read_text())
    assert meta["skipped_scorers"] == [] and meta["methods"] == [r["method"] for r in cold.rows
                                                                 if r["domain"] == "pooled"
                                                                 and r["gate"] != "-"]
    assert len(again.rows) == len(cold.rows)


def test_a_scorer_that_cannot_score_the_training_set_is_skipped_before_model_work(env):
    """rmd on a one-domain suite (its classes are the training domains; with one it is
    identically 0): skipped up front, warned about and listed in run.json, not a crash at
    scoring after the models trained."""
    root, _ = env
    one = SUITE.split("  knowledge:")[0] + "caps: {train: 16, calib: 8, id: 12, shift: 12}\n"
    (root / "one.yaml").write_text(one.replace("name: tiny", "name: one"))
    with pytest.warns(UserWarning, match="scorer 'rmd' skipped: it needs training questions of "
                                         "at least 2 domains"):
        res = run(cfg(env, suite=str(root / "one.yaml"), scorers=("msp", "rmd", "knn"),
                      models=("moe-lora",), out=root / "out-one"))
    meta = json.loads((res.out / "run.json").read_text())
    assert {(s["scorer"], s["pair"]) for s in meta["skipped_scorers"]} == {
        ("rmd", "moe-lora/top4"), ("rmd", "moe-lora/care")}
    assert {r["scorer"] for r in res.rows} - {"-"} == {"msp", "knn10"}  # "-": references


# -- the run's identity ---------------------------------------------------------------------
#: every identity of version 1 starts with these fields, in this order
BASE = {"suite": "pooled", "profile": "cpu", "backbone": "minilm", "scorers": [], "plugins": [],
        "seeds": None, "budget": 4.0, "experiment": None}


@pytest.mark.parametrize("kw, expected", [
    ({}, BASE),
    # where and how the run happens is never part of it
    ({"suite": "my_suite.yaml", "profile": "smoke", "backbone": "tiny-bert",
      "scorers": ("msp", "care"), "plugins": ("my_scores",), "seeds": 2, "budget": 3.0,
      "experiment": "ablation", "out": Path("o"), "cache_dir": Path("c"), "data_dir": Path("d"),
      "figure_set": "mine", "figures": False, "progress": False, "overwrite": True,
      "scorer_timeout": None, "threads": 3, "score_workers": 2},
     {"suite": "my_suite.yaml", "profile": "smoke", "backbone": "tiny-bert",
      "scorers": ["msp", "care"], "plugins": ["my_scores"], "seeds": 2, "budget": 3.0,
      "experiment": "ablation"}),
    # an option is part of it where set, after the fields every run has, in field order
    ({"models": ("mixlora",), "gates": ("care", "topk:k=2"), "backend": "numpy", "head": "cloze"},
     {**BASE, "models": ["mixlora"], "gates": ["care", "topk:k=2"], "backend": "numpy",
      "head": "cloze"}),
    ({"compile": "on", "cuda_graph": "off", "eval_tokens": 4096, "grad_checkpoint": True},
     {**BASE, "compile": "on", "cuda_graph": "off", "eval_tokens": 4096,
      "grad_checkpoint": True}),
    ({"grad_checkpoint": False, "head": "auto"},
     {**BASE, "head": "auto", "grad_checkpoint": False}),
    ({"models": (), "gates": (), "backend": "torch", "head": None, "compile": None}, BASE),
])
def test_identity_is_the_one_run_json_records_for_these_configs(kw, expected) -> None:
    """The identity's JSON text (what run.json holds as ``config`` and an --out folder is
    matched by) for a table of configurations, worked out by hand from the rules of identity
    version 1; equal text, equal hash: existing run folders and their run.json stay valid."""
    got = json.dumps(RunConfig(**kw).identity(), default=str)
    assert got == json.dumps(expected)
    assert hashlib.sha256(got.encode()).hexdigest() == \
        hashlib.sha256(json.dumps(expected).encode()).hexdigest()


def test_every_field_declares_its_identity_rule_and_a_new_option_is_one_declaration() -> None:
    assert all(isinstance(f.metadata.get("identity"), Identity) for f in fields(RunConfig))

    @dataclass(frozen=True)
    class WithOption(RunConfig):
        new_option: int | None = field(default=None, metadata=IF_SET)

    assert WithOption().identity() == RunConfig().identity()   # runs without it keep theirs
    assert WithOption(new_option=3).identity() == {**RunConfig().identity(), "new_option": 3}


def test_an_out_folder_of_the_same_config_written_before_config_version_is_refreshed(
        tmp_path) -> None:
    """A run.json without ``config_version`` (identity version 1) holding this configuration
    lets the run refresh the folder; one of another version or config is refused."""
    cfg = RunConfig(profile="smoke", scorers=("msp",), out=tmp_path)
    (tmp_path / "results.jsonl").write_text("")
    meta = tmp_path / "run.json"
    meta.write_text(json.dumps({"config": json.loads(json.dumps(cfg.identity()))}))
    assert prepare(cfg)[2] == tmp_path
    meta.write_text(json.dumps({"config": cfg.identity(), "config_version": IDENTITY_VERSION}))
    assert prepare(cfg)[2] == tmp_path
    meta.write_text(json.dumps({"config": cfg.identity(), "config_version": IDENTITY_VERSION + 1}))
    with pytest.raises(UserError, match="different run configuration"):
        prepare(cfg)


# -- the command line -----------------------------------------------------------------------
@pytest.mark.parametrize("argv", [["run"], ["score", "x", "--out", "o"], ["export", "a", "b"],
                                  ["list", "scorers"], ["report", "r"], ["compare", "a", "b"],
                                  ["plot", "r"], ["reproduce", "r"], ["data", "build"]])
def test_each_subcommand_dispatches_to_its_own_handler(argv) -> None:
    from uqbench.cli import COMMANDS, build_parser

    handle = build_parser().parse_args(argv).handle
    assert handle is COMMANDS[argv[0]].handle
    assert [c.handle for c in COMMANDS.values()].count(handle) == 1


def test_no_function_of_the_cli_is_over_60_lines() -> None:
    import ast

    import uqbench.cli

    tree = ast.parse(Path(uqbench.cli.__file__).read_text())
    long = {n.name: n.end_lineno - n.lineno + 1 for n in ast.walk(tree)
            if isinstance(n, ast.FunctionDef) and n.end_lineno - n.lineno + 1 > 60}
    assert not long, f"split these into a parser builder and a handler per subcommand: {long}"


def test_the_cli_prints_a_warning_as_its_kind_and_message(monkeypatch, capsys) -> None:
    """A warning raised under `uqbench` reads "warning: ..." (a UserWarning) or "KIND: ...",
    without the source line of uqbench's code; Python's format is back after the command."""
    import dataclasses
    import sys
    import warnings

    from uqbench import cli
    from uqbench.results.conformal_risk import ConformalNote

    def handle(args) -> int:
        warnings.warn("the calib split is small", stacklevel=1)
        warnings.warn("alpha=0.05 not reachable", ConformalNote, stacklevel=1)
        return 0

    before = warnings.formatwarning
    monkeypatch.setitem(cli.COMMANDS, "list", dataclasses.replace(cli.COMMANDS["list"],
                                                                  handle=handle))
    def show(message, category, filename, lineno, file=None, line=None):  # Python's own,
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))

    with warnings.catch_warnings():  # which pytest replaces by its recorder
        warnings.simplefilter("always")
        warnings.showwarning = show
        assert cli.main(["list", "scorers"]) == 0
    err = capsys.readouterr().err
    assert err == ("warning: the calib split is small\n"
                   "ConformalNote: alpha=0.05 not reachable\n")
    assert warnings.formatwarning is before
