"""The built-in `pooled-plus` suite: `pooled` with a code domain that trains on every verified
MBPP training problem and a math pair a 0.5-1.5B decoder can learn (docs/recipe.md says why):

========= ============================== ============================ =========================
domain    train                          id (calib: its head)         shift
========= ============================== ============================ =========================
science   ARC-Easy train (calib: head)   ARC-Easy test                ARC-Challenge test
knowledge MMLU high_school_* half 0      the other half               MMLU college_* and
          (calib: head)                                               professional_* subjects
math      MAWPS train (calib: head)      MAWPS test (MC)              SVAMP (MC)
code      MBPP ids 1-10, 511-974 (MC),   MBPP ids 11-510: calib the   HumanEval
          all of them                    head, id the rest
========= ============================== ============================ =========================

*Code.* In `pooled` the calib split (200 questions) is the head of the MBPP training pool,
which leaves about 170 verified training questions. Here calib is the head of the MBPP
*test* ids and the ID split is the rest of them: calib and ID are disjoint slices of one
seeded order (`uqbench.data.suites.build`), exchangeable as split-conformal calibration assumes,
and no test problem is ever trained on. The price is a smaller ID split for code.

*Math.* SVAMP is MAWPS-style one- and two-step problems with variations that break
shallow heuristics (Patel et al. 2021): the shift of a model trained on MAWPS.
"""
from __future__ import annotations

from typing import Any

from uqbench.data.suites.pooled import pooled
from uqbench.data.suites.spec import DomainSpec, RoleSpec, SuiteSpec, register_suite


@register_suite("pooled-plus")
def pooled_plus() -> SuiteSpec:
    def r(source: str, split: str, **kw: Any) -> RoleSpec:
        return RoleSpec(source, split, choices=4, **kw)

    base = {d.name: d for d in pooled().domains}
    doms = (
        base["science"], base["knowledge"],
        DomainSpec("math", {"train": r("mawps", "train"), "calib": r("mawps", "train"),
                            "id": r("mawps", "test"), "shift": r("svamp", "test")}),
        DomainSpec("code", {"train": r("mbpp", "train"), "calib": r("mbpp", "test"),
                            "id": r("mbpp", "test"), "shift": r("humaneval", "test")}),
    )
    return SuiteSpec("pooled-plus", doms,
                     description="pooled with every MBPP training problem and MAWPS/SVAMP math")
