"""Extension points as registries: the shared contract, ``--plugin`` as a user loads it, and a
user's gate and model variant run through ``uqbench run`` with no core edit."""
from __future__ import annotations

import json
import os
import shutil
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REPO
from tests.support.suites import arc_suite
from uqbench.core.errors import PluginError, UnknownNameError
from uqbench.core.registry import Registry, import_plugin

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _body(name: str) -> str:
    """A README example file without its first line (the docstring saying where it is used)."""
    return (REPO / "tests" / "support" / name).read_text().split("\n", 1)[1]


# -- the contract ------------------------------------------------------------------------------

def test_registry_contract_register_get_unregister_scoped() -> None:
    reg: Registry[int] = Registry("widget")
    reg.register("one")(1)
    assert reg.get("one") == 1 and reg.names() == ["one"] and "one" in reg
    with pytest.raises(ValueError, match="widget 'one' is already registered"):
        reg.add("one", 2)
    with pytest.raises(UnknownNameError, match=r"unknown widget 'onw' \(did you mean 'one'\?\)"):
        reg.get("onw")
    with reg.scoped({"two": 2}):
        reg.add("three", 3)
        assert reg.names() == ["one", "three", "two"]
        assert reg.unregister("one") == 1 and "one" not in reg
    assert reg.items() == [("one", 1)]  # everything the block added or removed is undone
    with reg.scoped({"one": 10}, replace=True):
        assert reg.get("one") == 10
    assert reg.get("one") == 1
    with pytest.raises(UnknownNameError, match="unknown widget 'zzz'"):
        reg.unregister("zzz")


@pytest.mark.parametrize("module, registry", [
    ("uqbench.core.scorer", "SCORERS"), ("uqbench.core.gating", "GATES"),
    ("uqbench.core.plan", "MODELS"), ("uqbench.data.sources", "SOURCES"),
    ("uqbench.data.suites.spec", "SUITES"), ("baselines.backbones", "BACKBONES"),
    ("uqbench.core.engine", "BACKENDS"), ("uqbench.core.engine", "DRAWERS"),
    ("uqbench.core.experiments", "EXPERIMENTS"), ("uqbench.core.profiles", "PROFILES"),
    ("uqbench.core.heads", "HEADS")])
def test_every_extension_point_is_a_registry_with_an_entry_point_group(module, registry) -> None:
    import importlib

    reg = getattr(importlib.import_module(module), registry)
    assert isinstance(reg, Registry) and reg.names()
    assert (reg.entry_point_group or "").startswith("uqbench.")
    with pytest.raises(UnknownNameError, match="did you mean"):
        reg.get(reg.names()[0] + "x")


# -- --plugin: a module in the current folder, or a .py path ----------------------------------

@pytest.fixture
def no_cwd_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The console script's view: the current folder (a new one) is not on sys.path."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    return tmp_path


def test_plugin_by_module_name_from_the_current_folder(no_cwd_on_path: Path) -> None:
    from uqbench.core.scorer import SCORERS

    (no_cwd_on_path / "cwd_plug.py").write_text(textwrap.dedent("""
        import numpy as np
        from uqbench import Scorer, register_scorer

        @register_scorer("cwd_plug")
        class P(Scorer):
            def __call__(self, outputs):
                return np.zeros(outputs.n)
    """))
    try:
        with SCORERS.scoped():
            import_plugin("cwd_plug")
            assert "cwd_plug" in SCORERS
    finally:
        sys.modules.pop("cwd_plug", None)


def test_plugin_by_path(no_cwd_on_path: Path) -> None:
    from uqbench.core.gating import GATES

    sub = no_cwd_on_path / "plugins"
    sub.mkdir()
    (sub / "path_gate.py").write_text(_body("example_gate.py"))
    try:
        with GATES.scoped():
            import_plugin(str(sub / "path_gate.py"))
            import_plugin("plugins/path_gate.py")  # the same file again: imported once
            assert GATES.get("fractionk").cls.__module__ == "path_gate"
    finally:
        sys.modules.pop("path_gate", None)
    with pytest.raises(PluginError, match="no such file"):
        import_plugin("plugins/missing.py")


# -- models and gates by name --------------------------------------------------------------------

@pytest.fixture
def user_variant():
    """The README's variant plugin, registered for one test and removed after it."""
    import importlib

    from baselines import variants
    from baselines.moe import VARIANTS
    from uqbench.core.plan import MODELS

    presets, layers = dict(variants.PRESETS), dict(VARIANTS)
    with MODELS.scoped():
        sys.modules.pop("tests.support.example_variant", None)
        yield importlib.import_module("tests.support.example_variant")
    for table, saved in ((variants.PRESETS, presets), (VARIANTS, layers)):
        table.clear()
        table.update(saved)
    sys.modules.pop("tests.support.example_variant", None)


def test_one_registration_fills_every_table(user_variant) -> None:
    """A variant is one `register_variant`: preset, layer pieces and the core's model entry."""
    from baselines.moe import VARIANTS, Variant
    from baselines.variants import PRESETS, register_variant, variant_config
    from uqbench.core.plan import MODELS, ModelSpec, model_pairs
    from uqbench.reporting.paper import simplified_notes

    entry = MODELS.get("wide-moe")
    assert entry.spec == ModelSpec("wide-moe", "wide-moe") and entry.router
    assert PRESETS["wide-moe"] is user_variant.wide_moe
    assert variant_config("wide-moe", seed=3).seed == 3
    assert [p.name for p in model_pairs(["wide-moe"])] == ["wide-moe/native", "wide-moe/care"]

    @register_variant("lean", doc="d", simplified="no aux loss", layer=Variant(routerless=True))
    def lean(seed: int = 0):
        from baselines.moe import MoELoRAConfig
        return MoELoRAConfig(n_experts=8, rank=1, seed=seed, variant="lean")

    assert VARIANTS["lean"] == Variant(routerless=True) and not MODELS.get("lean").router
    assert simplified_notes()["lean"] == "no aux loss"
    with pytest.raises(ValueError, match="'lean' is already registered"):
        register_variant("lean", doc="again")(lean)
    for name in PRESETS:  # the built-ins are registered the same way
        assert MODELS.get(name).router == (not VARIANTS[variant_config(name).variant].routerless)


def test_gates_option_adds_pairs_and_checks_them() -> None:
    from uqbench.core.errors import ConfigError
    from uqbench.core.gating import parse_gate
    from uqbench.core.plan import model_pairs

    gates = [parse_gate(g, 3.0) for g in ("care:k_max=6", "topk:k=2", "random")]
    assert [(g.name, g.budget) for g in gates] == [("care-k_max6", 3.0), ("topk-k2", None),
                                                   ("random", 3.0)]
    assert [p.name for p in model_pairs(["lora", "moe-lora"], 3.0, gates)] == [
        "lora/dense", "moe-lora/top4", "moe-lora/care-k_max6", "moe-lora/topk-k2",
        "moe-lora/random"]
    with pytest.raises(UnknownNameError, match=r"'carre' \(did you mean 'care'\?\)"):
        parse_gate("carre", 4.0)
    with pytest.raises(ConfigError, match="takes no parameter.*'kk'"):
        parse_gate("topk:kk=2", 4.0)
    with pytest.raises(ConfigError, match="is not PARAM=VALUE"):
        parse_gate("topk:k", 4.0)
    with pytest.raises(ConfigError, match="no chosen model has a router"):
        model_pairs(["lora"], 4.0, gates)


# -- backends and figure sets by name ----------------------------------------------------------

class _Backend:
    """A backend that records what the runner asked of it (no model side at all)."""

    n_experts = 16

    def __init__(self) -> None:
        self.checked: list[str] = []

    def check_backbone(self, name: str) -> None:
        self.checked.append(name)

    def check_profile(self, prof: object) -> None:
        self.checked.append(f"profile {prof.name}")  # type: ignore[attr-defined]


def test_backend_and_figure_set_are_selected_by_name(tmp_path: Path, capsys) -> None:
    from uqbench.cli import main
    from uqbench.core.engine import BACKENDS, DRAWERS
    from uqbench.run.runner import RunConfig, prepare

    fake = _Backend()
    with BACKENDS.scoped({"fake": fake}):
        prepare(RunConfig(backend="fake", backbone="any-name", scorers=("msp",),
                          out=tmp_path / "out"))
    assert fake.checked == ["profile cpu", "any-name"]
    assert RunConfig(backend="fake").identity()["backend"] == "fake"
    assert main(["run", "--backend", "torchh", "--out", str(tmp_path / "o")]) == 2
    assert "unknown backend 'torchh' (did you mean 'torch'?)" in capsys.readouterr().err

    drawn: list[Path] = []

    def mine(run_dir: Path) -> list[Path]:
        drawn.append(run_dir)
        return [run_dir / "mine.png"]

    with DRAWERS.scoped({"mine": mine}):
        assert main(["plot", str(tmp_path), "--figures", "mine"]) == 0
    assert drawn == [tmp_path] and capsys.readouterr().out.split() == [str(tmp_path / "mine.png")]
    with pytest.raises(UnknownNameError, match="unknown figure set 'nope'"):
        prepare(RunConfig(figure_set="nope", scorers=("msp",), out=tmp_path / "out"))


# -- the user's way: the console script, in the plugin's folder, no PYTHONPATH -------------------

def _user_cmd(tmp_path: Path) -> list[str]:
    """``uqbench`` as pip's console script runs it: a script whose own folder, not the current
    one, starts sys.path. (It puts this checkout first, as installing it would.)"""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "uqbench"
    script.write_text(f"import sys\nsys.path.insert(0, {str(REPO)!r})\n"
                      "from uqbench.cli import main\nsys.exit(main())\n")
    return [sys.executable, str(script)]


def _user_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {**env, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **extra}


def test_score_plugin_from_the_current_folder(procs, tmp_path: Path) -> None:
    """README: ``uqbench score ... --plugin my_scores`` from the folder holding my_scores.py."""
    readme = (REPO / "README.md").read_text()
    block = readme.split("```python\n# my_scores.py\n", 1)[1].split("```", 1)[0]
    work = tmp_path / "work"
    work.mkdir()
    (work / "my_scores.py").write_text(block)
    src = REPO / "tests" / "support" / "fixtures" / "lmeval" / "mc"
    out = procs.run([*_user_cmd(tmp_path), "score", str(src), "--domain",
                     "science=arc_easy_local:arc_challenge_local", "--calib-fraction", "0.25",
                     "--plugin", "my_scores", "--scorers", "msp,gini", "--out", "scored",
                     "--no-figures", "--bootstrap", "50"],
                    what="uqbench score --plugin my_scores", quiet_s=60, env=_user_env(),
                    cwd=work, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    methods = {r["method"] for r in map(json.loads, (work / "scored" / "results.jsonl")
                                        .read_text().splitlines())}
    assert any(m.endswith("/gini") for m in methods), methods


def test_user_gate_and_variant_run_from_the_cli(procs, tmp_path: Path, real_data: Path) -> None:
    """A gate and a model variant in the user's own modules (the README's), run by ``uqbench
    run`` with ``--models`` and a suite's ``gates:``: trained, calibrated, scored."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "my_gates.py").write_text(_body("example_gate.py"))
    (work / "my_moe.py").write_text(_body("example_variant.py"))
    (work / "s.yaml").write_text(arc_suite("s", caps=(16, 8, 12, 12),
                                           header="choices: 4\ngates: [fractionk]\n"))
    procs.run([*_user_cmd(tmp_path), "run", "--suite", "s.yaml", "--profile", "smoke",
               "--backbone", "tiny-bert", "--plugin", "my_gates", "--plugin", "my_moe.py",
               "--models", "wide-moe", "--scorers", "msp", "--out", "out", "--cache-dir",
               "cache", "--no-figures", "--no-progress", "--threads", "1"],
              what="uqbench run with a user's gate and variant", quiet_s=120,
              env=_user_env(UQBENCH_DATA=str(real_data)), cwd=work, watch=[work / "cache"])
    rows = [json.loads(x) for x in (work / "out" / "results.jsonl").read_text().splitlines()]
    methods = {r["method"] for r in rows} - {"chance", "options-only"}
    assert methods == {"wide-moe/native/msp", "wide-moe/fractionk/msp"}
    meta = json.loads((work / "out" / "run.json").read_text())
    assert meta["config"]["models"] == ["wide-moe"]
    (gate,) = [v for k, v in meta["gates"].items() if k.startswith("wide-moe/fractionk")]
    assert gate["spec"]["kind"] == "fractionk" and gate["spec"]["budget"] == 4.0
    assert np.isfinite(gate["calibration"]["achieved"])  # the thermostat tuned its knob
    shutil.rmtree(work / "cache")
