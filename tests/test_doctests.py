"""Every docstring example of `uqbench` runs: the doctests of each module pass, and the modules
known to hold examples are among those that have them (so a lost example is seen)."""
from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import uqbench

#: the programs a sandbox child runs (`uqbench.data.sandbox.host.program`): importing one runs
#: it on this process's argv, under the sandbox's guards, so they are never imported here
PROGRAMS = ("uqbench.data.sandbox.runner", "uqbench.data.sandbox.server")
MODULES = sorted(info.name for info in pkgutil.walk_packages(uqbench.__path__, "uqbench.")
                 if not info.name.endswith("__main__") and info.name not in PROGRAMS)
#: modules whose docstrings hold examples (a module losing all of them fails the last test)
WITH_EXAMPLES = ("uqbench.stats.conformal", "uqbench.stats.risk",
                 "uqbench.stats.metrics.calibration", "uqbench.stats.metrics.selective",
                 "uqbench.core.scorer", "uqbench.data.seeds")


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_pass(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name),
                             optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} examples fail"


def test_the_modules_with_examples_are_found() -> None:
    finder = doctest.DocTestFinder()
    have = {name for name in MODULES
            if any(t.examples for t in finder.find(importlib.import_module(name)))}
    assert set(WITH_EXAMPLES) <= have
