"""Run profiles: how much data and compute one run uses.

``smoke`` is for CI (minutes on 2 CPU cores), ``cpu`` is the default (the full protocol at capped
sizes on a laptop), ``full`` uses all data and is meant for a GPU, ``gpu`` is the whole pooled
suite on one GPU within one short lease (`GPU`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

from uqbench.core.errors import ConfigError
from uqbench.core.registry import Registry

#: ``--compile`` / `Profile.compile` values (`baselines.train.TrainConfig.compile`)
COMPILE = ("off", "on", "auto")


@dataclass(frozen=True)
class Profile:
    name: str
    # data caps per domain (None = all); seeded subsampling
    train_cap: int | None
    calib_cap: int | None
    id_cap: int | None
    shift_cap: int | None
    # training / inference
    epochs: int
    max_length: int
    batch_size: int
    eval_batch_size: int
    mc_passes: int  # T
    ensemble_members: int  # M
    seeds: int  # independent repetitions for mean +- std
    bootstrap: int  # bootstrap resamples for CIs
    # the training recipe (chosen by `benchmarks/recipe_search.py`; see docs/recipe.md)
    lr: float = 2e-4  # AdamW lr of adapters and routers
    head_lr: float = 1e-2  # lr of the scoring head (bi-encoder: its log temperature)
    encoder_head: str = "cross_encoder"  # head of encoder backbones ("auto" resolves to it)
    target_modules: str = "auto"  # MoE-LoRA / LoRA targets: "auto" (attention + FFN) or "ffn"
    top_layers: int | None = None  # adapt only the last N transformer blocks (None: all)
    # torch.compile of the transformer blocks in training: off | on | auto (on where CUDA is);
    # --compile overrides it. Off: on a GPU the compiled step is faster, but a profile's
    # trainings are too short to repay the compile (docs/gpu.md, `python -m benchmarks
    # compile`); the compiled path is tested equal to eager
    compile: str = "off"
    # each training step's forward and backward replayed as CUDA graphs: off | on | auto (on
    # where CUDA is and one process trains); --cuda-graph overrides it. Not with compile on
    cuda_graph: str = "off"
    # padded tokens one MC-dropout forward holds, its stacked copies counted (None: all
    # mc_passes copies of an eval batch in one forward): a long batch's copies then run in
    # groups, with the same masks (`baselines.forward.collect_mc`), so the passes' memory is
    # bounded whatever mc_passes and max_length are; `python -m benchmarks memory` measures
    # the bytes a token holds
    eval_tokens: int | None = None
    # training recomputes each block's activations in the backward instead of keeping them
    # (`baselines.train.TrainConfig.grad_checkpoint`): a large backbone's step then fits a GPU;
    # --grad-checkpoint sets it. Not with cuda_graph or compile on
    grad_checkpoint: bool = False

    def __post_init__(self) -> None:
        checks = [("lr", 0 < self.lr <= 1e-1, "(0, 0.1]"),
                  ("head_lr", 0 < self.head_lr <= 1.0, "(0, 1]"),
                  ("epochs", self.epochs >= 1, "an integer >= 1"),
                  ("encoder_head", isinstance(self.encoder_head, str) and bool(self.encoder_head),
                   "the name of a registered encoder head (checked when a run starts)"),
                  ("target_modules", self.target_modules in ("auto", "ffn"), "auto | ffn"),
                  ("top_layers", self.top_layers is None
                   or (isinstance(self.top_layers, int) and self.top_layers >= 1),
                   "None (every block) or an integer >= 1"),
                  ("eval_tokens", self.eval_tokens is None or (
                      isinstance(self.eval_tokens, int) and not isinstance(self.eval_tokens, bool)
                      and self.eval_tokens >= 1), "None (no bound) or an integer >= 1"),
                  ("compile", self.compile in COMPILE, " | ".join(COMPILE)),
                  ("grad_checkpoint", self.grad_checkpoint in (False, True)
                   and not (self.grad_checkpoint and "on" in (self.compile, self.cuda_graph)),
                   "False or True, and False when compile or cuda_graph is on"),
                  ("cuda_graph", self.cuda_graph in COMPILE
                   and not (self.cuda_graph == "on" and self.compile == "on"),
                   f"{' | '.join(COMPILE)}, and off or auto when compile is on")]
        for name, ok, valid in checks:
            if not ok:
                raise ConfigError(f"profile {self.name!r}: {name}={getattr(self, name)!r} is out "
                                  f"of range; valid: {valid}")


class Recipe(TypedDict):
    """The `Profile` fields of a training recipe."""

    lr: float
    head_lr: float
    encoder_head: str
    target_modules: str
    top_layers: int | None


#: the training recipe of `smoke` and `cpu`, chosen by `benchmarks.recipe_search` (docs/recipe.md)
RECIPE: Recipe = {"lr": 1e-3, "head_lr": 0.1, "encoder_head": "bi_encoder",
                  "target_modules": "ffn", "top_layers": 2}

_BUILTIN_PROFILES = {
    p.name: p
    for p in (
        Profile("smoke", train_cap=32, calib_cap=16, id_cap=24, shift_cap=24, epochs=1,
                max_length=96, batch_size=16, eval_batch_size=64, mc_passes=2,
                ensemble_members=2, seeds=1, bootstrap=200, **RECIPE),
        # calib 200: split-conformal quantiles and risk-control bounds on >= 200 questions per
        # domain; calib is the head of the train pool, so code trains on what is left
        Profile("cpu", train_cap=800, calib_cap=200, id_cap=120, shift_cap=120, epochs=1,
                max_length=128, batch_size=16, eval_batch_size=64, mc_passes=4,
                ensemble_members=3, seeds=1, bootstrap=1000, **RECIPE),
        Profile("full", train_cap=None, calib_cap=256, id_cap=None, shift_cap=None, epochs=3,
                max_length=1024, batch_size=16, eval_batch_size=64, mc_passes=10,
                ensemble_members=5, seeds=3, bootstrap=1000),
    )
}


#: The ``gpu`` profile: the whole pooled suite (four domains; ID, shift and calib splits), LoRA,
#: MoE-LoRA under top-4 and CARE, a 3-member ensemble and MC-dropout, one seed, on one H100/H200
#: in <= 8 minutes including data, with a 0.5B decoder that can learn (``make gpu-bundle`` and
#: ``make gpu-check`` run it on ``qwen2.5-coder-0.5b``).
#:
#: At max_length 256 these sizes ran within the 8 minutes on one H200
#: (benchmarks/results/gpu-leases.md has the run's phases and accuracies); one epoch at lr 5e-4
#: was the best of the recipes a lease compared.
#: max_length 1024 (in the `full` profile too) is the length the code questions need under the
#: letters head, whose options are whole functions: `python -m benchmarks.lengths` gives what
#: each length cuts and costs (docs/gpu.md)
GPU = Profile("gpu", train_cap=800, calib_cap=200, id_cap=300, shift_cap=300, epochs=1,
              max_length=1024, batch_size=16, eval_batch_size=64, mc_passes=8,
              ensemble_members=3, seeds=1, bootstrap=1000, lr=5e-4, head_lr=0.1,
              target_modules="ffn", top_layers=8)
_BUILTIN_PROFILES[GPU.name] = GPU


#: every profile by name: the built-ins above, a plugin's by `register_profile` or through the
#: entry-point group ``uqbench.profiles``
PROFILES: Registry[Profile] = Registry("profile", entry_point_group="uqbench.profiles",
                                      expects=Profile)


def register_profile(profile: Profile) -> Profile:
    """Register ``profile`` under its name (a duplicate is a ValueError)."""
    return PROFILES.add(profile.name, profile)


for _p in _BUILTIN_PROFILES.values():
    register_profile(_p)


def get_profile(name: str) -> Profile:
    """The profile called ``name`` (unknown -> `UnknownNameError` listing the valid ones)."""
    return PROFILES.get(name)
