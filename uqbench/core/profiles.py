"""Run profiles: how much data and compute one run uses.

``smoke`` is for CI (minutes on 2 CPU cores), ``cpu`` is the default (the full protocol at capped
sizes on a laptop), ``full`` uses all data and is meant for a GPU, ``gpu`` is the whole pooled
suite on one GPU within one short lease (`GPU`).
"""
from __future__ import annotations

from dataclasses import dataclass

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
    # --compile overrides it. Off until a GPU shows the compiled step faster than eager
    # (`python -m benchmarks compile` on a lent GPU); the compiled path is tested equal to eager
    compile: str = "off"

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
                  ("compile", self.compile in COMPILE, " | ".join(COMPILE))]
        for name, ok, valid in checks:
            if not ok:
                raise ConfigError(f"profile {self.name!r}: {name}={getattr(self, name)!r} is out "
                                  f"of range; valid: {valid}")


#: the training recipe of `smoke` and `cpu`, chosen by `benchmarks.recipe_search` (docs/recipe.md)
RECIPE = {"lr": 1e-3, "head_lr": 0.1, "encoder_head": "bi_encoder", "target_modules": "ffn",
          "top_layers": 2}

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
                max_length=256, batch_size=16, eval_batch_size=64, mc_passes=10,
                ensemble_members=5, seeds=3, bootstrap=1000),
    )
}


#: The ``gpu`` profile: the whole pooled suite (four domains; ID, shift and calib splits), LoRA,
#: MoE-LoRA under top-4 and CARE, a 3-member ensemble and MC-dropout, one seed, on one H100/H200
#: in <= 8 minutes including data, with a 0.5B decoder that can learn (``make gpu-bundle`` and
#: ``make gpu-check`` run it on ``qwen2.5-coder-0.5b``).
#:
#: PROVISIONAL SIZES, NOT MEASURED ON A GPU. No GPU was lent when they were chosen; they come
#: from the one H200 measurement on record and the arithmetic of the 0.5B model:
#:
#: - the H200 trained SmolLM2's ``full`` adapter (210 adapted linears) at 1.4 steps/s, ~0.7 s a
#:   step of ~50k leaf ops: ~14 us per op, launch-bound. Qwen2.5-0.5B has 24 blocks; adapting the
#:   FFN (3 linears) of the top 8 blocks is 24 linears: at ~240 ops per linear plus a frozen
#:   step of a few thousand ops, ~9k ops, ~0.12 s a step (44 ops per linear since the
#:   hand-written step: docs/benchmarks.md);
#: - the arithmetic: ~0.36B non-embedding parameters, 16 x <= 256 tokens a step, forward through
#:   all blocks and backward through the top 8: ~3 TFLOP a step, ~10 ms at 300 TFLOP/s bf16;
#: - 3 x 800 + 173 training questions (code keeps 173 once calib has its 200) in 1 epoch are
#:   ~160 steps a model; LoRA + 3 MoE-LoRA members are ~650 steps, ~80 s; the passes
#:   (deterministic, CARE and its thermostat on calib, T=8 MC-dropout, 3 members) over
#:   ~3,000 calib/ID/shift questions are ~1,500 batches of 64, ~75 s;
#:   plus ~40 s to dequantise and load the GGUF, the scoring and bootstrap on the CPU:
#:   ~5-6 minutes, leaving room under 8.
#:
#: The next lease must measure, on the bundle (``make gpu-bundle PROFILE=gpu``): seconds per
#: training step and per pass batch of qwen2.5-coder-0.5b at these settings, and the run's wall
#: time by phase (``run_seconds`` of the ``gpu`` step of ``make gpu-check``); then set train_cap,
#: epochs, top_layers and max_length from that table (largest train_cap x epochs that keeps the
#: run under 8 minutes) and drop this note.
GPU = Profile("gpu", train_cap=800, calib_cap=200, id_cap=300, shift_cap=300, epochs=1,
              max_length=256, batch_size=16, eval_batch_size=64, mc_passes=8,
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
