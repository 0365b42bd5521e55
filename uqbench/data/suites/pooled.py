"""The built-in `pooled` suite (README, "Two commands"):

========= ============================== ============================ =========================
domain    train (and calib)              id                           shift
========= ============================== ============================ =========================
science   ARC-Easy train                 ARC-Easy test                ARC-Challenge test
knowledge MMLU high_school_* subjects,   the other half               MMLU college_* and
          seeded per-subject half of test                             professional_* subjects
math      GSM8K train as numeric MC      GSM8K test (MC)              MATH-500 integer answers
code      MBPP ids 1-10, 511-974 (MC)    MBPP ids 11-510              HumanEval
========= ============================== ============================ =========================

Only questions with exactly 4 options are kept (the recipe counts the rest).
"""
from __future__ import annotations

from typing import Any

from uqbench.data.sources.mmlu import MMLU_GROUPS
from uqbench.data.suites.spec import DomainSpec, RoleSpec, SuiteSpec, register_suite


@register_suite("pooled")
def pooled() -> SuiteSpec:
    def r(source: str, split: str, **kw: Any) -> RoleSpec:
        return RoleSpec(source, split, choices=4, **kw)

    hs = MMLU_GROUPS["high_school"]
    cp = MMLU_GROUPS["college"] + MMLU_GROUPS["professional"]
    doms = (
        DomainSpec("science", {"train": r("arc-easy", "train"), "calib": r("arc-easy", "train"),
                               "id": r("arc-easy", "test"), "shift": r("arc-challenge", "test")}),
        DomainSpec("knowledge", {
            "train": r("mmlu", "test", subjects=hs, half=0),
            "calib": r("mmlu", "test", subjects=hs, half=0),
            "id": r("mmlu", "test", subjects=hs, half=1),
            "shift": r("mmlu", "test", subjects=cp)}),
        DomainSpec("math", {"train": r("gsm8k", "train"), "calib": r("gsm8k", "train"),
                            "id": r("gsm8k", "test"), "shift": r("math500", "test")}),
        DomainSpec("code", {"train": r("mbpp", "train"), "calib": r("mbpp", "train"),
                            "id": r("mbpp", "test"), "shift": r("humaneval", "test")}),
    )
    return SuiteSpec("pooled", doms, description="four domains x (train, calib, id, shift)")
