"""Builder statistics of a split (``recipe["builder_stats"]``): problems tried and built,
rejections grouped by reason, summed counters (code: mutants tried / failing) and the
distractor methods and designs of the records built."""
from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from typing import Any

from uqbench.data.records import MCRecord

#: Builders that execute code (their stats count the records with verified mutants).
CODE_KINDS = frozenset({"mbpp", "humaneval"})


class StatsAgg:
    """Sums builder statistics (code: mutants; math: distractor methods) over a split."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.tried = self.built = 0
        self.rejected: Counter[str] = Counter()
        self.sums: dict[str, float] = {}
        self.flags: Counter[str] = Counter()
        self.methods: Counter[str] = Counter()
        self.designs: Counter[str] = Counter()
        self.outcomes: Counter[str] = Counter()
        self.limits_failed: Counter[str] = Counter()

    def add(self, rec: MCRecord | None, st: Mapping[str, Any]) -> None:
        self.tried += 1
        if rec is None:
            why = str(st.get("reason") or _REJECT_REASON.get(self.kind, "rejected by builder"))
            # group by kind of reason: drop the per-problem details
            self.rejected[re.split(r" among |: ", why, maxsplit=1)[0]] += 1
        else:
            self.built += 1
        for k, v in st.items():
            if isinstance(v, bool):
                self.flags[k] += int(v)
            elif isinstance(v, (int, float)):
                self.sums[k] = self.sums.get(k, 0) + v
        self.outcomes.update(o for o in st.get("choice_outcomes", ()) if o)  # code: how mutants fail
        self.limits_failed.update(st.get("limits_failed", {}))  # code: runs without an OS limit
        if rec is not None:
            for m in _distractor_methods(rec.meta):
                self.methods[m.split(":")[0]] += 1  # family: "perturbation:plus_one" -> ...
            if isinstance(rec.meta.get("design"), str):
                self.designs[rec.meta["design"]] += 1

    def result(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": self.kind, "tried": self.tried, "built": self.built,
                             "rejected": dict(sorted(self.rejected.items()))}
        if self.sums:
            d["totals"] = {k: (int(v) if float(v).is_integer() else v)
                           for k, v in sorted(self.sums.items())}
        if self.kind in CODE_KINDS:
            d["verified"] = self.flags.get("verified", 0)
            # sandboxed runs that went without an OS limit, by limit ({}: all were enforced)
            d["sandbox_limits_failed"] = dict(sorted(self.limits_failed.items()))
        d.update({f"n_{k}": v for k, v in sorted(self.flags.items()) if k != "verified"})
        if self.methods:
            d["distractor_methods"] = dict(self.methods.most_common())
        if self.designs:
            d["designs"] = dict(self.designs.most_common())
        if self.outcomes:
            d["mutant_outcomes"] = dict(self.outcomes.most_common())
        return d


_REJECT_REASON = {"math500": "answer not an integer", "gsm8k": "no final number",
                  "numeric": "no numeric answer"}


def _distractor_methods(meta: Mapping[str, Any]) -> list[str]:
    """Distractor provenance labels a builder left in ``meta`` (best effort, any of the keys)."""
    for key in ("choice_methods", "distractor_methods", "distractor_sources", "distractors",
                "methods", "mutants"):
        v = meta.get(key)
        if isinstance(v, Mapping):
            v = list(v.values())
        if isinstance(v, list) and all(isinstance(x, str) for x in v):
            return [x for x in v if x != "gold"]
        if isinstance(v, list) and all(isinstance(x, Mapping) for x in v):
            return [str(x.get("method", x.get("kind", "?"))) for x in v]
    return []


__all__ = ["CODE_KINDS", "StatsAgg"]
