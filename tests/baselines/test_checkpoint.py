"""Adapter checkpoints (`baselines.checkpoint`): round trips give identical logits, only trainable
tensors are saved, a wrong backbone, a stale config or a corrupt file is refused."""
from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file

from baselines.backbones import Backbone, tiny_backbone
from baselines.checkpoint import (
    CONFIG_FILE,
    TENSORS_FILE,
    adapter_hash,
    load_adapter,
    read_config,
    save_adapter,
)
from baselines.heads import make_moe, make_plain
from baselines.moe import MoELoRAConfig
from baselines.train import TrainConfig, train
from tests.support.data import SMALL_MOE, toy_records


@pytest.fixture(scope="module")
def encoder() -> Backbone:
    return tiny_backbone("encoder")


def _logits(model, records) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(model.encode(records, 48))


def _trained(bb: Backbone, mode: str = "auto"):
    model = make_moe(bb, SMALL_MOE, mode=mode)
    train(model, toy_records(16), TrainConfig(lr=1e-2, epochs=1, batch_size=8, max_length=48),
          progress=False)
    return model


@pytest.mark.parametrize(("kind", "mode"), [("encoder", "auto"), ("decoder", "letters")])
def test_round_trip_gives_identical_logits(tmp_path, kind: str, mode: str) -> None:
    bb = tiny_backbone(kind)
    model = _trained(bb, mode)
    recs = toy_records(6, seed=5, n_choices=(2, 3))
    save_adapter(model, tmp_path, meta={"note": "test", "losses": [1.0, 0.5]})
    again = load_adapter(tmp_path, bb)
    assert torch.equal(_logits(model, recs), _logits(again, recs))
    assert again.mode == model.mode and again.adapter == model.adapter
    assert read_config(tmp_path)["meta"] == {"note": "test", "losses": [1.0, 0.5]}


def test_checkpoint_holds_only_trainable_tensors(tmp_path, encoder: Backbone) -> None:
    model = _trained(encoder)
    save_adapter(model, tmp_path, meta={})
    state = load_file(str(tmp_path / TENSORS_FILE))
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert set(state) == set(trainable)
    assert not any("embeddings" in k or k.endswith("base_layer.weight") for k in state)
    numel = sum(t.numel() for t in state.values())
    backbone_numel = sum(p.numel() for p in encoder.model.parameters())
    assert numel < backbone_numel / 2
    assert os.path.getsize(tmp_path / TENSORS_FILE) < 4 * numel + 64 * 1024
    assert set(os.listdir(tmp_path)) == {CONFIG_FILE, TENSORS_FILE}   # no temp files left
    assert adapter_hash(tmp_path) == read_config(tmp_path)["tensors"]["sha256"]


def test_head_only_model_round_trips(tmp_path, encoder: Backbone) -> None:
    model = make_plain(encoder, seed=3)
    save_adapter(model, tmp_path, meta={})
    recs = toy_records(3)
    assert torch.equal(_logits(model, recs), _logits(load_adapter(tmp_path, encoder), recs))


def test_wrong_backbone_refused(tmp_path, encoder: Backbone) -> None:
    save_adapter(make_moe(encoder, SMALL_MOE), tmp_path, meta={})
    other = tiny_backbone("encoder", seed=1)
    object.__setattr__(other, "name", "other-bert")
    with pytest.raises(ValueError, match="tiny-bert") as err:
        load_adapter(tmp_path, other)
    msg = str(err.value)
    assert "other-bert" in msg and "weights_hash" in msg and "load_backbone('tiny-bert')" in msg
    with pytest.raises(ValueError, match="config_class"):
        load_adapter(tmp_path, tiny_backbone("decoder"))


def test_corrupt_or_missing_checkpoint(tmp_path, encoder: Backbone) -> None:
    with pytest.raises(FileNotFoundError, match=CONFIG_FILE):
        load_adapter(tmp_path / "nothing", encoder)
    save_adapter(make_moe(encoder, SMALL_MOE), tmp_path, meta={})
    with open(tmp_path / TENSORS_FILE, "r+b") as f:
        f.seek(-4, os.SEEK_END)
        f.write(b"\x00\x01\x02\x03")
    with pytest.raises(ValueError, match="corrupt or stale"):
        load_adapter(tmp_path, encoder)
    (tmp_path / CONFIG_FILE).write_text("{not json")
    with pytest.raises(ValueError, match="corrupt"):
        load_adapter(tmp_path, encoder)


def test_stale_config_is_refused(tmp_path, encoder: Backbone) -> None:
    save_adapter(make_moe(encoder, SMALL_MOE), tmp_path, meta={})
    cfg = json.loads((tmp_path / CONFIG_FILE).read_text())
    cfg["head"]["adapter"]["config"] = MoELoRAConfig(n_experts=8, rank=2, top_k=2).to_dict()
    (tmp_path / CONFIG_FILE).write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="shape"):
        load_adapter(tmp_path, encoder)


def test_meta_must_be_json(tmp_path, encoder: Backbone) -> None:
    with pytest.raises(ValueError, match="JSON"):
        save_adapter(make_plain(encoder), tmp_path, meta={"x": object()})


def test_overwrite_and_reuse_backbone(tmp_path, encoder: Backbone) -> None:
    first = make_moe(encoder, SMALL_MOE)
    save_adapter(first, tmp_path, meta={"v": 1})
    second = _trained(encoder)
    save_adapter(second, tmp_path, meta={"v": 2})
    recs = toy_records(4)
    a, b = load_adapter(tmp_path, encoder), load_adapter(tmp_path, encoder)
    assert torch.equal(_logits(a, recs), _logits(second, recs))
    assert torch.equal(_logits(b, recs), _logits(second, recs))
    assert read_config(tmp_path)["meta"] == {"v": 2}


def test_hand_injected_moe_round_trips(tmp_path, encoder: Backbone) -> None:
    """``moe.inject(bb.model, cfg)`` then ``MultipleChoiceModel(bb)`` (the runner's path)."""
    from baselines.heads import MultipleChoiceModel
    from baselines.moe import inject

    bb = encoder.clone()
    inject(bb.model, SMALL_MOE)
    model = MultipleChoiceModel(bb)
    assert model.adapter == {"type": "moe", "config": SMALL_MOE.to_dict()}
    save_adapter(model, tmp_path, meta={})
    recs = toy_records(3)
    assert torch.equal(_logits(model, recs), _logits(load_adapter(tmp_path, encoder), recs))
