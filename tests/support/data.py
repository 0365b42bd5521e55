"""Small inputs the tests share: random but valid `Outputs`, a trivially learnable
multiple-choice task and a small MoE-LoRA configuration for tiny models."""
from __future__ import annotations

import random

import numpy as np

from baselines.moe import MoELoRAConfig
from uqbench.core.outputs import Outputs
from uqbench.data.records import MCRecord

WORDS = ["apple", "river", "stone", "cloud", "tiger", "music", "paper", "glass", "night", "sugar"]
SMALL_MOE = MoELoRAConfig(n_experts=4, rank=2, top_k=2)


def toy_records(n: int, *, seed: int = 0, n_choices: tuple[int, ...] = (3,)) -> list[MCRecord]:
    """A trivially learnable task: the right option is the one containing the word "good"."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        c = rng.choice(n_choices)
        ans = rng.randrange(c)
        choices = [rng.choice(WORDS) for _ in range(c)]
        choices[ans] = "good " + choices[ans]
        q = "which one " + " ".join(rng.choice(WORDS) for _ in range(rng.randrange(1, 6)))
        out.append(MCRecord(id=f"toy{i}", domain="toy", question=q, choices=tuple(choices),
                            answer=ans, source="toy"))
    return out


def make_outputs(n: int = 5, c: int = 4, *, seed: int = 0, t: int = 3, m: int = 2,
                 h: int = 6) -> Outputs:
    """Random but valid Outputs with every optional field (``h``: feature width; the training
    reference: 32 questions of two domains)."""
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
        features=rng.normal(size=(n, h)),
        train_features=rng.normal(size=(32, h)),
        train_domain=np.repeat(["a", "b"], 16),
    )
