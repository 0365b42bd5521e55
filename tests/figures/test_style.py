"""Figures of `uqbench score` over 1 to 20 models and 1 to 8 domains draw without a layout
warning (matplotlib's constrained layout warns when it cannot fit the axes): every figure of the
run folder, drawn with matplotlib's warnings as errors, at the corners of that range (20
models over 8 domains also passes, but costs more than the slow tier's budget)."""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from uqbench.core.outputs import Outputs
from uqbench.core.plan import DET, GateSpec, ModelSpec, Pair
from uqbench.io.recordset import ROLES, RecordSet
from uqbench.results.references import ReferenceInputs

N = 24  # questions per split


def records(n_models: int, n_domains: int) -> RecordSet:
    """Seeded logits of ``n_models`` lm-eval-like models (4 choices) over ``n_domains``
    domains, merged as `uqbench score` merges several sources (run.json ``models``)."""
    rng = np.random.default_rng(0)
    doms = [f"domain-{k}" for k in range(n_domains)]
    labels = {(d, r): rng.integers(0, 4, N) for d in doms for r in ROLES}
    pairs, outputs = [], {}
    for m in range(n_models):
        pair = Pair(ModelSpec(f"org/model-{m:02d}", "lm-eval"), GateSpec("loglik", "none"), DET)
        pairs.append(pair)
        for d in doms:
            for r in ROLES:
                y = labels[d, r]
                logits = rng.normal(0, 1, (N, 4))
                logits[np.arange(N), y] += 1.0 + 0.1 * m - (0.8 if r == "shift" else 0)
                outputs[pair.name, f"{d}/{r}", 0] = Outputs(
                    ids=np.array([f"{d}/{r}/{i}" for i in range(N)]), labels=y,
                    logits=logits, domain=np.array([d] * N))
    refs = ReferenceInputs(tuple(doms), {f"{d}/{r}": np.full(N, 4) for d in doms
                                         for r in ROLES}, None,
                           {f"{d}/{r}": f"{d}-{r}" for d in doms for r in ROLES})
    meta = {"source": "several models", "models": {p.name: {"source": p.model.name}
                                                   for p in pairs}}
    return RecordSet(pairs, outputs, 1, refs, 2, None, meta)


@pytest.mark.parametrize(("n_models", "n_domains"), [(1, 1), (20, 4), (2, 8)])
def test_figures_draw_without_layout_warnings(heavy_compute, png_figures, tmp_path: Path,
                                              n_models: int, n_domains: int) -> None:
    from uqbench.run.score_records import ScoreConfig, score

    rs = records(n_models, n_domains)
    if n_models == 1:
        rs.meta.pop("models")
    out = tmp_path / "o"
    with warnings.catch_warnings():
        warnings.filterwarnings("error", module="matplotlib")
        warnings.filterwarnings("error", message=".*layout.*")
        score(rs, ScoreConfig(out=out, scorers=("msp",), bootstrap=2, score_workers=1))
    figs = sorted(p.stem for p in (out / "figures").glob("*.png"))
    assert figs and (n_models == 1 or "models_ranking" in figs)
