"""Suite YAML for the tests that run a tiny suite: ARC's science domain (and MMLU's knowledge
domain) at small caps, the one definition the runner, reliability, variant, extension and
multi-process tests write to their folders."""
from __future__ import annotations

SCIENCE = """  science:
    train: {source: arc-easy, split: train}
    id: {source: arc-easy, split: test}
    shift: {source: arc-challenge, split: test}
"""
KNOWLEDGE = """  knowledge:
    train: {source: mmlu, split: test, subjects: [high_school], half: 0}
    id: {source: mmlu, split: test, subjects: [high_school], half: 1}
    shift: {source: mmlu, split: test, subjects: [college, professional]}
"""


def arc_suite(name: str = "tiny", *, caps: tuple[int, int, int, int] = (12, 8, 10, 10),
              header: str = "", knowledge: bool = False) -> str:
    """The YAML of a suite ``name`` with the science domain (and knowledge), ``caps`` =
    (train, calib, id, shift) questions per domain, and ``header`` lines after the name
    (``choices: 4\\n``, ``head: cloze\\n``, ``models: [...]\\n``...)."""
    train, calib, id_, shift = caps
    return (f"name: {name}\n{header}domains:\n{SCIENCE}{KNOWLEDGE if knowledge else ''}"
            f"caps: {{train: {train}, calib: {calib}, id: {id_}, shift: {shift}}}\n")
