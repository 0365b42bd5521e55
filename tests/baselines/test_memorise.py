"""Training is sound on real weights: on SmolLM2-135M (CPU), dense LoRA and MoE-LoRA (the
default variant, trained with its fixed top-k gate) each memorise 32 real ARC-Easy training
questions through `baselines.train.train` (the runner's training entry) with the letters head,
with the backbone in float32 and in bfloat16 (adapters in float32, as on a GPU).

The setting (`MEMORISE`): the 32 ARC-Easy training questions of shortest letters prompt (26-30
tokens, none cut at max_length 48), adapters on every linear of the top 2 blocks, batches of 8,
16 epochs (64 steps), lr 1e-2 with the default warm-up and cosine decay. Memorised: the last
epoch's training loss (each question once, in train mode, before its step's update) below 0.3
and its training accuracy at least 0.9.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

N_TRAIN = 32
MAX_LENGTH = 48
TOP_LAYERS = 2
#: the training settings of every configuration
MEMORISE: dict[str, Any] = {"lr": 1e-2, "epochs": 16, "batch_size": 8, "max_length": MAX_LENGTH,
                            "seed": 0}
LOSS_BELOW, ACCURACY_AT_LEAST = 0.3, 0.9


@pytest.fixture(scope="module")
def training_questions(real_data: Path, smollm2_cold: tuple[Any, list[str], Path]) -> list[Any]:
    """The `N_TRAIN` ARC-Easy training questions with the shortest letters prompts."""
    from baselines.heads.decoder import letters_prompt
    from uqbench.data.sources import load_source

    tok = smollm2_cold[0].tokenizer
    records = [it.record for it in load_source("arc-easy", "train", data_dir=real_data).items]
    length = {r.id: len(tok(letters_prompt(r))["input_ids"]) for r in records}
    chosen = sorted(records, key=lambda r: (length[r.id], r.id))[:N_TRAIN]
    assert max(length[r.id] for r in chosen) <= MAX_LENGTH   # nothing is cut
    return chosen


@pytest.fixture(scope="module")
def backbones(smollm2_cold: tuple[Any, list[str], Path], heavy_compute: None) -> dict[str, Any]:
    """SmolLM2 in float32 (the session's) and in bfloat16 (read from the same cached folder)."""
    from baselines.backbones import load_backbone

    bb, _, cache = smollm2_cold
    return {"float32": bb,
            "bfloat16": load_backbone("smollm2", dtype=torch.bfloat16, cache_dir=cache)}


def build(adapter: str, bb: Any) -> Any:
    """The model the runner builds for ``adapter`` (`baselines.engine.TorchEngine.fresh_model`)
    on every linear of the top `TOP_LAYERS` blocks, letters head."""
    from baselines.dense import make_dense
    from baselines.heads import make_moe
    from baselines.moe import MoELoRAConfig

    if adapter == "lora":
        return make_dense(bb, kind="lora", top_layers=TOP_LAYERS, mode="letters")
    return make_moe(bb, MoELoRAConfig(top_layers=TOP_LAYERS), mode="letters")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("adapter", ["lora", "moe-lora"])
def test_memorises_32_training_questions(adapter: str, dtype: str, backbones: dict[str, Any],
                                         training_questions: list[Any]) -> None:
    from baselines import train
    from baselines.moe import MoELoRAConfig, moe_layers

    bb = backbones[dtype]
    model = build(adapter, bb)
    trainable = model.trainable_parameters()
    assert trainable and all(p.dtype == torch.float32 for p in trainable)
    assert next(model.backbone.parameters()).dtype == getattr(torch, dtype)
    if adapter == "moe-lora":
        assert len(moe_layers(model.backbone)) == 7 * TOP_LAYERS
        assert MoELoRAConfig.from_dict(model.adapter["config"]).variant == "moe-lora"
    result = train.train(model, training_questions, train.TrainConfig(**MEMORISE),
                         progress=False)
    per_epoch = math.ceil(N_TRAIN / MEMORISE["batch_size"])
    assert result.steps == per_epoch * MEMORISE["epochs"]
    last = slice(-per_epoch, None)
    loss = sum(result.losses[last]) / per_epoch
    accuracy = sum(result.train_accuracy[last]) / per_epoch
    first = sum(result.losses[:per_epoch]) / per_epoch
    print(f"{adapter} {dtype}: {result.steps} steps, loss {first:.3f} -> {loss:.3f}, "
          f"train accuracy {accuracy:.3f}, {result.seconds:.0f} s")
    assert loss < LOSS_BELOW and accuracy >= ACCURACY_AT_LEAST, (
        f"{adapter} in {dtype} did not memorise {N_TRAIN} questions in {result.steps} steps: "
        f"last epoch's loss {loss:.3f}, accuracy {accuracy:.3f}")
