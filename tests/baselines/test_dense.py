"""The dense peft baselines (`baselines.dense`: LoRA, DoRA, AdaLoRA): built, trained and reloaded
on the MoE-LoRA's targets; bad kinds and values refused."""
from __future__ import annotations

import pytest
import torch

from baselines.backbones import Backbone, tiny_backbone
from baselines.checkpoint import load_adapter, save_adapter
from baselines.dense import DENSE_KINDS, make_dense
from baselines.forward import collect
from baselines.heads import adapter_layers, make_moe
from baselines.moe import moe_layers
from baselines.train import TrainConfig, train
from tests.support.data import SMALL_MOE, toy_records
from uqbench.core.errors import ConfigError

#: trainable tensor names per kind (besides the head)
ADAPTER_PARAMS = {
    "lora": ("lora_A.default.weight", "lora_B.default.weight"),
    "dora": ("lora_A.default.weight", "lora_B.default.weight",
             "lora_magnitude_vector.default.weight"),
    "adalora": ("lora_A.default", "lora_B.default", "lora_E.default"),
}


@pytest.fixture(scope="module")
def encoder() -> Backbone:
    return tiny_backbone("encoder")


@pytest.mark.parametrize("kind", DENSE_KINDS)
def test_construct_train_round_trip(tmp_path, encoder: Backbone, kind: str) -> None:
    model = make_dense(encoder, kind, rank=4, alpha=8, mode="cross_encoder")
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    assert "head.weight" in names
    assert all(n == "head.weight" or n.endswith(ADAPTER_PARAMS[kind]) for n in names)
    assert not model.has_moe
    recs = toy_records(16)
    result = train(model, recs, TrainConfig(lr=1e-2, epochs=1, batch_size=8, max_length=48),
                   progress=False)
    assert result.steps == 2 and all(map(torch.isfinite, map(torch.tensor, result.losses)))
    if kind == "adalora":   # the schedule follows the real run
        cfg = model.peft_model.peft_config["default"]
        assert cfg.total_step == 2 and model.adapter["config"]["total_step"] == 2
        assert all(a > 0 for a in result.aux_losses)   # orthogonality regulariser
    save_adapter(model, tmp_path, meta={})
    again = load_adapter(tmp_path, encoder)
    a = collect(model, recs, batch_size=16, progress=False)["logits"]
    b = collect(again, recs, batch_size=16, progress=False)["logits"]
    assert (a == b).all()
    assert adapter_layers(encoder.model) == []   # the shared backbone was not touched


def test_same_targets_as_moe(encoder: Backbone) -> None:
    dense = make_dense(encoder, "lora")
    moe = make_moe(encoder, SMALL_MOE)
    assert len(adapter_layers(dense.backbone)) == len(moe_layers(moe.backbone)) == 12


def test_matching_rank_and_decoder(encoder: Backbone) -> None:
    model = make_dense(tiny_backbone("decoder"), "lora", rank=8, mode="cloze")
    a = next(p for n, p in model.named_parameters() if "lora_A" in n)
    assert a.shape[0] == 8
    logits = collect(model, toy_records(3), batch_size=8, progress=False)["logits"]
    assert logits.shape == (3, 3)


def test_bad_kind_and_values(encoder: Backbone) -> None:
    with pytest.raises(ConfigError, match="lora, dora, adalora"):
        make_dense(encoder, "ia3")
    with pytest.raises(ConfigError, match="rank"):
        make_dense(encoder, "lora", rank=0)
