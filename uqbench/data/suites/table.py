"""``uqbench data build``: build (or load) a suite's splits and tabulate them.

One row per domain x role: size, content hash, source, chance level, the options-only artifact
baselines (`uqbench.data.artifacts`) with their flag, the records dropped by the option-count
filter, and for built domains (math, code) the builder's statistics (problems tried / built,
code problems with 3 verified failing mutants, distractor methods).
"""
from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from uqbench.core.profiles import Profile
from uqbench.data.artifacts import BASELINES, check_suite
from uqbench.data.suites.build import build_suite


def split_table(suite_name: str, profile: Profile | str, *, data_dir: str | Path | None = None,
                 cache_dir: str | Path | None = None, seed: int = 0, progress: bool = True,
                 verify: bool = True) -> list[dict[str, Any]]:
    """Build ``suite_name`` at ``profile`` and describe every split.

    Returns
    -------
    list of dict
        One row per (domain, role) in suite order with keys ``suite, profile, domain, role, n,
        n_choices, hash, source, chance, acc_<baseline>`` (longest, position, centroid,
        classifier), ``threshold`` (accuracy above which a baseline is flagged), ``flag``
        (bool), ``flagged`` (baseline names), ``dropped`` (questions without the required
        number of options in the role's pool), ``build`` (builder statistics, ``{}`` for
        parsed sources) and ``seconds`` (suite build time, same on every row).
    """
    t0 = time.perf_counter()
    suite = build_suite(suite_name, profile, data_dir=data_dir, cache_dir=cache_dir, seed=seed,
                        progress=progress, verify=verify)
    seconds = time.perf_counter() - t0
    checks = check_suite(suite, seed=seed)
    rows: list[dict[str, Any]] = []
    for dom in suite.domains:
        for role in ("train", "calib", "id", "shift"):
            split = suite.split(dom, role)
            chk = checks[dom, role]
            rec = split.recipe
            src = rec.get("source", {})
            pool = rec.get("pool", {})
            row: dict[str, Any] = {
                "suite": suite.name, "profile": suite.profile, "domain": dom, "role": role,
                "n": len(split.records), "n_choices": split.n_choices, "hash": split.hash,
                "source": _source_label(pool.get("key")
                                        or f"{src.get('name', '?')}:{src.get('split', '?')}"),
                "chance": chk.chance,
                **{f"acc_{b}": chk.accuracy[b] for b in BASELINES},
                "threshold": chk.threshold, "flag": chk.flag, "flagged": list(chk.flagged),
                "dropped": (pool.get("dropped_choices") or {}).get("dropped", 0),
                "pool": pool.get("size"),
                "build": dict(rec.get("builder_stats", {})),
                "seconds": seconds,
            }
            rows.append(row)
    return rows


def _source_label(pool_key: str) -> str:
    """``mmlu:test[high_school]#half0#choices4`` -> ``mmlu:test[high_school]#half0``."""
    return re.sub(r"#choices\d+", "", pool_key).replace("[*]", "")


def _build_note(b: Mapping[str, Any]) -> str:
    if not b:
        return ""
    parts = [f"built {b.get('built', '?')}/{b.get('tried', '?')}"]
    if "verified" in b:
        parts.append(f"3 verified mutants: {b['verified']}")
    tot = b.get("totals", {})
    if "mutants_tried" in tot or "mutants_failing" in tot:
        parts.append(f"mutants failing {tot.get('mutants_failing', '?')}/"
                     f"{tot.get('mutants_tried', '?')}")
    if b.get("distractor_methods"):
        top = sorted(b["distractor_methods"].items(), key=lambda kv: -kv[1])[:3]
        parts.append("distractors " + " ".join(f"{k}:{v}" for k, v in top))
    rej = b.get("rejected") or {}
    if rej:
        top = sorted(rej.items(), key=lambda kv: -kv[1])[:2]
        parts.append("rejected " + "; ".join(f"{k}: {v}" for k, v in top))
    return ", ".join(parts)


def format_split_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """A fixed-width text table of `split_table` rows (plus a legend)."""
    if not rows:
        return "(no splits)"
    head = ["domain", "role", "n", "hash", "source", "drop", "chance", "long", "pos", "centr",
            "clf", "thr", "flag", "build"]
    table = [head]
    for r in rows:
        table.append([
            r["domain"], r["role"], str(r["n"]), r["hash"], r["source"], str(r["dropped"]),
            f"{r['chance']:.3f}", *(_f(r[f"acc_{b}"]) for b in BASELINES), f"{r['threshold']:.3f}",
            ("FLAG:" + ",".join(r["flagged"])) if r["flag"] else "ok", _build_note(r["build"]),
        ])
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    right = {2, 5, 6, 7, 8, 9, 10, 11}
    lines = []
    for k, row in enumerate(table):
        cells = [c.rjust(w) if i in right else c.ljust(w)
                 for i, (c, w) in enumerate(zip(row, widths, strict=False))]
        lines.append("  ".join(cells).rstrip())
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    r0 = rows[0]
    lines.append("")
    lines.append(
        f"suite {r0['suite']}, profile {r0['profile']}; built or loaded in {r0['seconds']:.1f}s. "
        "Options-only baselines (question hidden): long = longest option, pos = train's most "
        "common gold position, centr = option most similar to the others, clf = TF-IDF char "
        "n-gram + logistic regression on options (train role: 5-fold cross-fitted). thr = "
        "accuracy above chance at p < 0.01/4 (exact Poisson-binomial, Bonferroni over the 4 "
        "baselines); FLAG = a baseline reached it. drop = questions of the source left out for "
        "not having the suite's number of options.")
    return "\n".join(lines)


def _f(x: float) -> str:
    return "  nan" if math.isnan(x) else f"{x:.3f}"


__all__ = ["format_split_table", "split_table"]
