"""Adapters on the last blocks only (``top_layers``) and the frozen-prefix state cache."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from baselines import heads
from baselines.backbones import Backbone, tiny_backbone
from baselines.checkpoint import build_from_description
from baselines.dense import make_dense
from baselines.heads import PREFIX_CACHE, PrefixCache, make_moe
from baselines.moe import MoELoRAConfig, moe_layers, record_stats, resolve_targets
from baselines.train import TrainConfig, train
from tests.support.data import toy_records
from uqbench.core.errors import ConfigError
from uqbench.core.profiles import Profile

SMALL = {"n_experts": 4, "rank": 2, "top_k": 2, "target_modules": "ffn"}


@pytest.fixture(scope="module")
def encoder() -> Backbone:
    return tiny_backbone("encoder", layers=4)


def _perturb(model: heads.MultipleChoiceModel, seed: int = 1) -> None:
    """Non-zero experts (lora_B starts at 0, which would hide a wrong prefix)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in moe_layers(model.backbone):
            layer.lora_B.copy_(torch.randn(layer.lora_B.shape, generator=gen) * 0.3)


def test_top_layers_adapts_only_the_last_blocks(encoder: Backbone) -> None:
    names = resolve_targets(encoder.model, "ffn", top_layers=2)
    assert names == ("encoder.layer.2.intermediate.dense", "encoder.layer.2.output.dense",
                     "encoder.layer.3.intermediate.dense", "encoder.layer.3.output.dense")
    model = make_moe(encoder, MoELoRAConfig(**SMALL, top_layers=2))
    assert len(moe_layers(model.backbone)) == 4 and model.prefix_start == 2
    assert make_moe(encoder, MoELoRAConfig(**SMALL)).prefix_start == 0
    dense = make_dense(encoder, "lora", target_modules="ffn", top_layers=1)
    assert dense.prefix_start == 3
    assert dense.adapter["config"]["target_modules"] == ["encoder.layer.3.intermediate.dense",
                                                         "encoder.layer.3.output.dense"]


@pytest.mark.parametrize("bad", [0, 5, -1])
def test_top_layers_out_of_range_names_the_valid_range(encoder: Backbone, bad: int) -> None:
    with pytest.raises((ConfigError, ValueError), match="top_layers"):
        make_moe(encoder, MoELoRAConfig(**SMALL, top_layers=bad))
    if bad == 5:
        with pytest.raises(ConfigError, match=r"valid: 1\.\.4"):
            resolve_targets(encoder.model, "ffn", top_layers=bad)


def test_profile_rejects_bad_top_layers() -> None:
    with pytest.raises(ConfigError, match="top_layers=0 is out of range"):
        Profile("x", train_cap=1, calib_cap=1, id_cap=1, shift_cap=1, epochs=1, max_length=8,
                batch_size=1, eval_batch_size=1, mc_passes=1, ensemble_members=1, seeds=1,
                bootstrap=1, top_layers=0)


@pytest.mark.parametrize("mode", ["bi_encoder", "cross_encoder"])
def test_cached_prefix_equals_the_full_forward(encoder: Backbone, mode: str) -> None:
    """Logits and router statistics through the cached prefix equal the model's own forward,
    for a batch whose sequences were cached inside other batches (other padding)."""
    model = make_moe(encoder, MoELoRAConfig(**SMALL, top_layers=2), mode=mode).eval()
    _perturb(model)
    record_stats(model.backbone, True)
    recs = toy_records(9, n_choices=(2, 3, 4))
    PREFIX_CACHE.clear()
    with torch.no_grad():
        model(model.encode(recs[:4], 64))   # cache some sequences under other paddings
        model(model.encode(recs[6:], 64))
        hits0 = PREFIX_CACHE.hits
        cached = model(model.encode(recs, 64))
        stats_cached = [layer.last_stats["entropy"].clone() for layer in moe_layers(model.backbone)]
        assert PREFIX_CACHE.hits > hits0
        start, model.prefix_start = model.prefix_start, 0   # the plain HF forward
        full = model(model.encode(recs, 64))
        stats_full = [layer.last_stats["entropy"] for layer in moe_layers(model.backbone)]
        model.prefix_start = start
    torch.testing.assert_close(cached, full, rtol=1e-5, atol=1e-5)
    for a, b in zip(stats_cached, stats_full, strict=False):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_cached_prefix_keeps_the_backbone_dtype(encoder: Backbone) -> None:
    """A bfloat16 backbone (the GPU placement) through the cached prefix: the states keep its
    dtype (float32 states fed its blocks failed on the first GPU run) and equal its own forward."""
    import copy

    bf16 = replace(encoder, model=copy.deepcopy(encoder.model).to(torch.bfloat16))
    model = make_moe(bf16, MoELoRAConfig(**SMALL, top_layers=2)).eval()
    recs = toy_records(5, n_choices=(2, 3))
    PREFIX_CACHE.clear()
    with torch.no_grad():
        model(model.encode(recs[:2], 64))
        cached = model(model.encode(recs, 64))
        assert PREFIX_CACHE.hits > 0
        assert {v.dtype for v in PREFIX_CACHE.entries.values()} == {torch.bfloat16}
        start, model.prefix_start = model.prefix_start, 0
        full = model(model.encode(recs, 64))
        model.prefix_start = start
    torch.testing.assert_close(cached, full, rtol=1e-2, atol=1e-2)


def test_prefix_trains_in_eval_mode_and_mc_dropout_samples_after_it(encoder: Backbone) -> None:
    model = make_moe(encoder, MoELoRAConfig(**SMALL, top_layers=2))
    model.train()
    assert not any(m.training for p in model.prefix_modules() for m in p.modules())
    assert model.backbone.encoder.layer[3].training and model.training
    model.eval().mc_dropout_on()
    drops = {n: m.training for n, m in model.named_modules() if isinstance(m, torch.nn.Dropout)}
    assert not any(on for n, on in drops.items()
                   if n.startswith(("backbone.embeddings", "backbone.encoder.layer.1.")))
    assert drops["backbone.encoder.layer.2.output.dropout"] and drops["dropout"]
    PREFIX_CACHE.clear()
    recs = toy_records(3)
    with torch.no_grad():
        a, b = model(model.encode(recs, 64)), model(model.encode(recs, 64))
    assert PREFIX_CACHE.hits > 0 and not torch.equal(a, b)   # cached prefix, sampled masks


def test_training_through_the_prefix_learns_and_reloads(encoder: Backbone) -> None:
    model = make_moe(encoder, MoELoRAConfig(**SMALL, top_layers=2), seed=0).eval()
    recs = toy_records(48, seed=3)
    PREFIX_CACHE.clear()
    with torch.inference_mode():   # states cached by an inference pass serve training too
        model(model.encode(recs, 64))
    result = train(model, recs, TrainConfig(lr=3e-3, head_lr=0.1, epochs=2, batch_size=8),
                   progress=False)
    assert all(torch.isfinite(torch.tensor(result.losses)))
    assert sum(result.losses[-3:]) < sum(result.losses[:3])
    assert PREFIX_CACHE.hits >= 2 * len(recs)   # every training text came from the cache
    again = build_from_description(model.describe(), encoder)
    again.load_state_dict(model.state_dict())
    batch = model.encode(recs[:5], 64)
    with torch.no_grad():
        torch.testing.assert_close(again.eval()(batch), model.eval()(batch))
    assert again.prefix_start == 2


def test_prefix_cache_is_bounded_lru() -> None:
    cache = PrefixCache(max_mb=3 * 4 / 2 ** 20)   # room for three float32 values
    for i in range(5):
        cache.put(("m", 1, bytes([i])), torch.zeros(1))
    assert cache.bytes == 12 and [k[2] for k in cache.entries] == [bytes([2]), bytes([3]),
                                                                bytes([4])]


def test_config_dict_omits_top_layers_only_when_unset() -> None:
    """Every-block configs keep the dict (and so the cache keys) they had before top_layers."""
    assert "top_layers" not in MoELoRAConfig(**SMALL).to_dict()
    d = MoELoRAConfig(**SMALL, top_layers=2).to_dict()
    assert d["top_layers"] == 2 and MoELoRAConfig.from_dict(d).top_layers == 2


def test_variants_train_on_the_profiles_blocks(tmp_path) -> None:
    from baselines.engine import TorchEngine
    from uqbench.core.engine import RunStats
    from uqbench.core.plan import ModelSpec
    from uqbench.core.profiles import get_profile

    engine = TorchEngine("tiny-bert", get_profile("cpu"), None, tmp_path, RunStats())
    cfg = engine.variant_preset(ModelSpec("hydralora", "hydralora"), seed=0)
    assert cfg.variant == "hydralora" and cfg.top_layers == get_profile("cpu").top_layers == 2


def _trained_bytes(encoder: Backbone, seed: int, recs: list) -> bytes:
    """The adapter and head of a freshly built model trained on ``recs``, as bytes."""
    model = make_moe(encoder, MoELoRAConfig(**SMALL, top_layers=2), seed=seed)
    train(model, recs, TrainConfig(lr=3e-3, head_lr=0.1, epochs=1, batch_size=5),
          progress=False)
    return b"".join(p.detach().numpy().tobytes() for p in model.trainable_parameters())


def test_trained_model_does_not_depend_on_the_prefix_cache_state(encoder: Backbone) -> None:
    """Byte-equal adapters whether the prefix cache was cold, filled by an inference pass in
    other batch compositions (other paddings), or warm from another model trained before in
    the same process (a retrained ensemble member was once a different model)."""
    recs = toy_records(20, seed=5, n_choices=(2, 3, 4))
    PREFIX_CACHE.clear()
    cold = _trained_bytes(encoder, 0, recs)
    PREFIX_CACHE.clear()
    other = make_moe(encoder, MoELoRAConfig(**SMALL, top_layers=2), seed=1).eval()
    with torch.inference_mode():   # every text cached inside batches of other compositions
        for i in range(0, len(recs), 7):
            other(other.encode(recs[::-1][i:i + 7] + toy_records(3, seed=i), 64))
    assert PREFIX_CACHE.misses > 0
    warm = _trained_bytes(encoder, 0, recs)
    PREFIX_CACHE.clear()
    _trained_bytes(encoder, 1, recs[10:] + toy_records(12, seed=9))   # another model first
    after = _trained_bytes(encoder, 0, recs)
    assert warm == cold and after == cold


def test_prefix_states_of_a_text_do_not_depend_on_its_batch(encoder: Backbone) -> None:
    """A text's cached states are those of the text alone, whatever batch first needed it."""
    model = make_moe(encoder, MoELoRAConfig(**SMALL, top_layers=2)).eval()
    texts = ["which one is good", "a much longer text that pads every other one in its batch",
             "good"]
    enc = model.tokenizer(texts, padding=True, return_tensors="pt")
    alone = model.tokenizer(texts[0], return_tensors="pt")
    PREFIX_CACHE.clear()
    batched = PREFIX_CACHE.states(model, 2, enc["input_ids"], enc["attention_mask"],
                                  enc["token_type_ids"])
    PREFIX_CACHE.clear()
    single = PREFIX_CACHE.states(model, 2, alone["input_ids"], alone["attention_mask"],
                                 alone["token_type_ids"])
    n = single.shape[1]
    assert torch.equal(batched[0, :n], single[0]) and not batched[0, n:].any()


def test_forward_does_not_depend_on_the_prefix_cache_state(encoder: Backbone) -> None:
    """Logits and router statistics bitwise equal from a cold cache and from one filled by
    other batches (the forward records of a model do not depend on what ran before)."""
    model = make_moe(encoder, MoELoRAConfig(**SMALL, top_layers=2)).eval()
    _perturb(model)
    record_stats(model.backbone, True)
    recs = toy_records(8, seed=2, n_choices=(2, 4))

    def forward() -> list[torch.Tensor]:
        with torch.no_grad():
            logits = model(model.encode(recs, 64))
        return [logits] + [layer.last_stats["entropy"].clone() for layer in
                           moe_layers(model.backbone)]

    PREFIX_CACHE.clear()
    cold = forward()
    PREFIX_CACHE.clear()
    long = toy_records(1, seed=7)[0]
    long = replace(long, question=long.question + " and" * 30,
                   choices=tuple(c + " or" * 20 for c in long.choices))
    with torch.no_grad():   # recs' texts cached inside batches padded to a long batch-mate
        model(model.encode(recs[3:] + [long], 64))
        model(model.encode([long] + recs[:3], 64))
    warm = forward()
    assert all(torch.equal(a, b) for a, b in zip(cold, warm, strict=False))
