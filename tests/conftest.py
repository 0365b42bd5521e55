from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from uqbench import Outputs

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    """Tiny models gain nothing from intra-op threads, and on a shared 2-core machine thread
    hand-offs make small ops 10-100x slower. (End-to-end runs are subprocesses: unaffected.)"""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(autouse=True, scope="module")
def _scorer_registry_per_module():
    """Scorers a test module registers (plugins, bad scorers for error tests) leave with it: the
    registry is per process, and later modules iterate over every registered scorer."""
    from uqbench.scorer import SCORERS

    SCORERS.load()
    saved = dict(SCORERS._items)
    yield
    SCORERS._items.clear()
    SCORERS._items.update(saved)


def builtin_scorers() -> tuple[str, ...]:
    """The built-in scorers' names: the registry is per process and some tests register plugin
    scorers, so runs that mean "every scorer" name these."""
    from uqbench.scorer import SCORERS, list_scorers

    return tuple(n for n in list_scorers() if SCORERS.get(n).__module__.startswith("scorers."))


def data_dir() -> Path | None:
    """The real dataset copies: $UQBENCH_DATA, else ../shared/data beside the checkout."""
    env = os.environ.get("UQBENCH_DATA")
    for cand in ([Path(env)] if env else []) + [REPO.parent / "shared" / "data"]:
        if (cand / "MANIFEST.txt").exists():
            return cand
    return None


@pytest.fixture
def real_data_dir() -> Path:
    d = data_dir()
    if d is None:
        pytest.skip("real data not found: set UQBENCH_DATA to a copy of shared/data")
    return d


def make_outputs(n: int = 5, c: int = 4, *, seed: int = 0, t: int = 3, m: int = 2) -> Outputs:
    """Random but valid Outputs with every optional field."""
    rng = np.random.default_rng(seed)
    return Outputs(
        ids=np.array([f"ex{i}" for i in range(n)]),
        labels=rng.integers(0, c, n),
        logits=rng.normal(size=(n, c)) * 2,
        domain=np.array(["a", "b"] * (n // 2) + ["a"] * (n % 2)),
        route_entropy=rng.uniform(size=n),
        top1_mass=rng.uniform(0.1, 1, size=n),
        disagreement=rng.uniform(size=n),
        experts=rng.uniform(1, 8, size=n),
        n_tokens=rng.integers(5, 60, size=n).astype(float),
        mc_logits=rng.normal(size=(t, n, c)),
        member_logits=rng.normal(size=(m, n, c)),
    )


@pytest.fixture
def outputs() -> Outputs:
    return make_outputs(n=37, seed=1)
