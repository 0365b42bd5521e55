from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from uqbench import Outputs, Scorer, get_scorer, list_scorers, register_scorer
from uqbench.core.errors import ConfigError, PluginError, UnknownNameError
from uqbench.core.registry import Registry, import_plugin
from uqbench.core.scorer import SCORERS, run_scorer


def test_builtins_are_registered():
    assert {"msp", "entropy", "care", "ensemble_mutual_info"} <= set(list_scorers())


def test_duplicate_name_raises_value_error():
    with pytest.raises(ValueError, match="already registered"):
        @register_scorer("msp")
        class Dup(Scorer):
            pass


def test_unknown_name_suggests_close_matches():
    with pytest.raises(UnknownNameError, match=r"unknown scorer 'entropi' \(did you mean "
                                                 r"'entropy'.*\?\); valid: care, ") as err:
        get_scorer("entropi")
    assert isinstance(err.value, ConfigError) and isinstance(err.value, KeyError)
    assert str(err.value).startswith("unknown scorer")  # the message, not KeyError's repr


#: every extension point: ``uqbench list`` name -> (module, registry)
EXTENSION_POINTS = {
    "scorers": ("uqbench.core.scorer", "SCORERS"), "gates": ("uqbench.core.gating", "GATES"),
    "sources": ("uqbench.data.sources", "SOURCES"),
    "suites": ("uqbench.data.suites.spec", "SUITES"),
    "backbones": ("baselines.backbones", "BACKBONES"),
    "backends": ("uqbench.core.engine", "BACKENDS"), "figures": ("uqbench.core.engine", "DRAWERS"),
}


@pytest.mark.parametrize("what", sorted(EXTENSION_POINTS))
def test_every_extension_point_keeps_one_contract(what, capsys):
    """One entry-point group ``uqbench.<what>``, one `uqbench list` entry listing the members,
    unknown names -> `UnknownNameError` with close matches and the valid names, duplicates ->
    ValueError."""
    import importlib

    from uqbench.cli import main

    module, attr = EXTENSION_POINTS[what]
    reg = getattr(importlib.import_module(module), attr)
    assert reg.entry_point_group == f"uqbench.{what}"
    names = reg.names()
    assert main(["list", what]) == 0
    assert capsys.readouterr().out.split() == names
    with pytest.raises(UnknownNameError, match=rf"did you mean '{names[0]}'.*valid: "):
        reg.get(names[0] + "x")
    with pytest.raises(ValueError, match="already registered"):
        reg.add(names[0], object())


@pytest.mark.parametrize("argv", [["list", "scorers"], ["report", "RUN"], ["plot", "RUN"],
                                  ["data", "build", "--suite", "pooled"]])
def test_every_command_that_resolves_names_takes_plugins(argv, tmp_path, capsys):
    """--plugin is imported first: a broken one stops the command, naming itself, before any
    work (here: before the run folder, which does not exist, is read)."""
    from uqbench.cli import main

    argv = [a.replace("RUN", str(tmp_path / "no-run")) for a in argv]
    assert main([*argv, "--plugin", "no_such_plugin_xyz"]) == 2
    assert "plugin module 'no_such_plugin_xyz' failed to import" in capsys.readouterr().err
    (tmp_path / "cli_plug.py").write_text(textwrap.dedent("""
        import numpy as np
        from uqbench import Scorer, register_scorer

        @register_scorer("test_cli_plug")
        class Plug(Scorer):
            def __call__(self, outputs):
                return np.zeros(outputs.n)
    """))
    sys.path.insert(0, str(tmp_path))
    try:
        if argv[0] == "list":
            assert main([*argv, "--plugin", "cli_plug"]) == 0
            assert "test_cli_plug" in capsys.readouterr().out.split()
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("cli_plug", None)
        if "test_cli_plug" in SCORERS:
            SCORERS.unregister("test_cli_plug")


def test_register_non_scorer_is_type_error():
    with pytest.raises(TypeError):
        register_scorer("not_a_scorer")(object)


def test_decorator_registration_reaches_get_scorer():
    @register_scorer("test_registry_const")
    class Const(Scorer):
        def __call__(self, outputs):
            return np.zeros(outputs.n)

    try:
        sc = get_scorer("test_registry_const")
        assert sc.name == "test_registry_const" and isinstance(sc, Const)
    finally:
        SCORERS.unregister("test_registry_const")


def _write_plugin_dist(root, body, ep_value="myplug:Plug"):
    (root / "myplug.py").write_text(textwrap.dedent(body))
    dist = root / "myplug-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: myplug\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[uqbench.scorers]\nplug_scorer = {ep_value}\n")


def test_entry_point_registration_in_a_fresh_interpreter(tmp_path):
    # The plugin class is NOT decorated: the entry point alone registers it.
    _write_plugin_dist(tmp_path, """
        import numpy as np
        from uqbench import Scorer
        class Plug(Scorer):
            def __call__(self, outputs):
                return np.full(outputs.n, 0.5)
    """)
    code = ("from uqbench import get_scorer, list_scorers; s = get_scorer('plug_scorer'); "
            "print(s.name, 'plug_scorer' in list_scorers())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"PYTHONPATH": str(tmp_path), "PATH": ""}, check=True)
    assert out.stdout.split() == ["plug_scorer", "True"]


def test_broken_entry_point_names_itself(tmp_path, monkeypatch):
    _write_plugin_dist(tmp_path, "raise RuntimeError('boom')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    reg = Registry("scorer", entry_point_group="uqbench.scorers")
    with pytest.raises(PluginError, match=r"plugin 'plug_scorer'.*RuntimeError: boom"):
        reg.names()


def test_entry_point_taking_a_used_name_raises_value_error(tmp_path, monkeypatch):
    """An installed plugin whose entry-point name is taken by another member is an error
    naming both (the README's promise), never silently ignored."""
    _write_plugin_dist(tmp_path, """
        class Plug:
            pass
    """)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, "myplug", None)  # so that teardown removes the module
    monkeypatch.delitem(sys.modules, "myplug")
    reg = Registry("scorer", entry_point_group="uqbench.scorers")
    reg.add("plug_scorer", object())
    with pytest.raises(ValueError, match=r"plugin 'plug_scorer' \(myplug:Plug\) from "
                                         r"entry-point group 'uqbench.scorers'.*already "
                                         r"registered.*Rename that entry point"):
        reg.names()
    again = Registry("scorer", entry_point_group="uqbench.scorers")
    import myplug

    again.add("plug_scorer", myplug.Plug)  # the very object the entry point names: fine
    assert again.get("plug_scorer") is myplug.Plug


def test_import_plugin_failure_is_plugin_error():
    with pytest.raises(PluginError, match="'no_such_module_xyz' failed to import"):
        import_plugin("no_such_module_xyz")


class _Bad(Scorer):
    def __init__(self, fn):
        self.fn, self.name = fn, "bad"

    def __call__(self, outputs):
        return self.fn(outputs)


@pytest.mark.parametrize("fn, match", [
    (lambda o: np.zeros(o.n + 1), r"shape \(38,\); expected \(37,\)"),
    (lambda o: np.full(o.n, np.nan), "NaN/inf uncertainty for 37 of 37"),
    (lambda o: 1 / 0, "raised while computing uncertainty: ZeroDivisionError"),
])
def test_run_scorer_rejects_bad_plugin_output(outputs: Outputs, fn, match):
    with pytest.raises(PluginError, match=match):
        run_scorer(_Bad(fn), outputs)


def _write_dist(root, group, name, module, body):
    (root / f"{module}.py").write_text(textwrap.dedent(body))
    dist = root / f"{module}-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[{group}]\n{name} = {module}:Plug\n")


def _in_fresh_interpreter(root, code):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={"PYTHONPATH": str(root), "PATH": ""}, check=False)


def test_a_decorated_gate_from_an_installed_entry_point_is_its_gate_kind(tmp_path):
    """The entry point names the decorated class; importing it registers the `GateKind`, which
    is what the registry then holds (not the class, and not "already registered")."""
    _write_dist(tmp_path, "uqbench.gates", "plug_gate", "gateplug", """
        from dataclasses import dataclass
        from uqbench.core.gating import register_gate
        @register_gate("plug_gate", knob="tau")
        @dataclass(frozen=True)
        class Plug:
            tau: float = 0.5
    """)
    out = _in_fresh_interpreter(tmp_path, (
        "from uqbench.core.gating import GATES; g = GATES.get('plug_gate'); "
        "print(type(g).__name__, g.cls.__name__, g.knob, g.budgeted)"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["GateKind", "Plug", "tau", "True"]


def test_an_undecorated_head_from_an_entry_point_says_how_to_register_it(tmp_path):
    _write_dist(tmp_path, "uqbench.heads", "plug_head", "headplug", """
        class Plug:
            name, kind = "plug_head", "encoder"
    """)
    out = _in_fresh_interpreter(tmp_path, "from uqbench.core.heads import HEADS; HEADS.names()")
    assert out.returncode != 0
    assert "head plugin 'plug_head' (headplug:Plug)" in out.stderr
    assert "registered nothing under 'plug_head'" in out.stderr and "not a HeadKind" in out.stderr
