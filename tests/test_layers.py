"""The layering rule, checked on the real import graph: scorers, figures and the metric/report
side of `uqbench` never load torch or the model code (`baselines`), not even transitively."""
from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("torch", "transformers", "peft", "accelerate", "baselines")

_PROBE = """
import importlib, json, pkgutil, sys
names = ["scorers", "figures", "uqbench.metrics", "uqbench.scorer", "uqbench.outputs",
         "uqbench.report", "uqbench.paper", "uqbench.experiments", "uqbench.evaluate"]
for pkg in ("scorers", "figures"):
    names += [f"{pkg}.{m.name}" for m in pkgutil.iter_modules(importlib.import_module(pkg).__path__)]
for name in names:
    importlib.import_module(name)
print(json.dumps({"imported": names, "loaded": sorted({m.split(".")[0] for m in sys.modules})}))
"""


def test_scorers_figures_and_metrics_never_load_torch_or_models() -> None:
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                         check=True).stdout
    got = json.loads(out)
    assert "scorers.care" in got["imported"] and "figures.calibration" in got["imported"]
    assert "numpy" in got["loaded"]  # the probe does see what was loaded
    heavy = sorted(set(got["loaded"]) & set(HEAVY))
    assert not heavy, f"scorers/figures/metrics pull in {heavy}: import them lazily where used"
