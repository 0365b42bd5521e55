"""The static checks the project keeps clean: ruff over the repository (pyproject's
``[tool.ruff.lint]`` rules: pycodestyle, pyflakes, import order, bugbear, pyupgrade) and mypy
over pyproject's ``[tool.mypy]`` files (``uqbench/``, ``scorers/``, ``figures/`` and
``baselines/``: every layer), at the versions the test extra pins, so that `make test` fails where a
change breaks either."""
from __future__ import annotations

import sys

from tests.conftest import REPO, Procs


def test_ruff_finds_nothing(procs: Procs) -> None:
    procs.run([sys.executable, "-m", "ruff", "check", "."], cwd=REPO,
              what="ruff check", quiet_s=10)


def test_mypy_finds_nothing(procs: Procs) -> None:
    procs.run([sys.executable, "-m", "mypy"], cwd=REPO,
              what="mypy (uqbench, scorers, figures, baselines)", quiet_s=90)
