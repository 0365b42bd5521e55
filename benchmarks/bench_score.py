"""`uqbench score` on lm-evaluation-harness samples: 100,000 questions x 4 choices (synthetic files
in lm-eval 0.4's samples format: an ID task of 60,000 questions, 20% held out for calibration,
and a shifted task of 40,000), every logits-only scorer, figures included. Goal: <= 60 s on 2
cores. One JSON line: seconds to read the files, to score (rows and their bootstrap intervals)
and to draw the figures (from ``run.json``), in all, the ratio to the goal, and the machine's
1-minute load average before and after (a shared machine's numbers are only comparable at a
similar load)."""
from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

GOAL_S = 60.0


def write_samples(folder: Path, task: str, n: int, seed: int) -> None:
    """``n`` questions of 4 choices as lm-eval writes them (numbers as strings)."""
    rng = np.random.default_rng(seed)
    lls = rng.normal(-10, 3, (n, 4))
    labels = rng.integers(0, 4, n)
    lls[np.arange(n), labels] += rng.normal(1.5, 1, n)  # a model better than chance
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"samples_{task}_2026-01-01T00-00-00.000000.jsonl", "w") as f:
        for i in range(n):
            choices = [f"option {j} of question {i}" + " more" * j for j in range(4)]
            f.write(json.dumps({
                "doc_id": i, "doc": {"id": i}, "target": str(labels[i]),
                "arguments": {f"gen_args_{j}": {"arg_0": f"Q{i}?", "arg_1": " " + c}
                              for j, c in enumerate(choices)},
                "filtered_resps": [[repr(float(x)), "False"] for x in lls[i]],
                "filter": "none", "doc_hash": str(i)}) + "\n")


def run() -> list[dict[str, Any]]:
    from uqbench.run.score_records import ScoreConfig, load_records, score

    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_samples(root / "lm", "big_id", 60_000, 0)
        write_samples(root / "lm", "big_shift", 40_000, 1)
        t0 = time.perf_counter()
        rs = load_records(root / "lm", domains=["synthetic=big_id:big_shift"])
        t_read = time.perf_counter() - t0
        score(rs, ScoreConfig(out=root / "out", scorers=("msp", "entropy", "energy", "margin")))
        total = time.perf_counter() - t0
        figures = len(list((root / "out" / "figures").glob("*.png")))
        phases = json.loads((root / "out" / "run.json").read_text())["seconds"]
    return [{"benchmark": "score_lmeval_100k", "questions": 100_000, "choices": 4,
             "read_s": round(t_read, 2), "scoring_s": round(phases["scoring"], 2),
             "figures_s": round(phases["figures"], 2),
             "score_and_figures_s": round(total - t_read, 2), "total_s": round(total, 2),
             "figures": figures, "goal_s": GOAL_S, "ratio_to_goal": round(total / GOAL_S, 3),
             "load_before": round(load, 2), "load_after": round(os.getloadavg()[0], 2)}]
