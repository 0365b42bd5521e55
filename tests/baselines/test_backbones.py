from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch
from transformers import BertConfig, GPT2Config, LlamaConfig, T5Config

from baselines.backbones import (
    check_backbone,
    identity_mismatch,
    is_decoder_config,
    list_backbones,
    load_backbone,
    minilm_path,
    same_backbone,
    tiny_backbone,
)
from uqbench.core.errors import ConfigError


def test_registry_lists_named_backbones() -> None:
    names = list_backbones()
    assert {"minilm", "tiny-bert", "tiny-llama", "smollm2"} <= set(names)


@pytest.mark.parametrize("name", ["minlm", "bert-tiny-xyz"])
def test_unknown_name_lists_valid_names(name: str) -> None:
    with pytest.raises(ConfigError, match="minilm") as err:
        load_backbone(name)
    assert "unknown backbone" in str(err.value)


def test_close_match_suggested() -> None:
    with pytest.raises(ConfigError, match="did you mean 'minilm'"):
        load_backbone("minilmm")


def test_missing_or_bad_folder(tmp_path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_backbone(str(tmp_path / "nope" / "model"))
    with pytest.raises(ConfigError, match="no config.json"):
        load_backbone(str(tmp_path))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(ConfigError, match="GGUF file"):
        load_backbone(str(gguf), cache_dir=tmp_path / "cache")
    assert not list((tmp_path / "cache" / "backbones").iterdir())   # nothing half-written


def test_unreachable_hub_id_says_how_to_fix(monkeypatch) -> None:
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ConfigError, match="cannot be reached") as err:
        load_backbone("no-such-org/no-such-model")
    assert "config.json" in str(err.value)


@pytest.mark.parametrize("kind", ["encoder", "decoder"])
def test_local_folder_loads_same_identity(tmp_path, kind: str) -> None:
    tiny = tiny_backbone(kind)
    tiny.model.save_pretrained(tmp_path)
    tiny.tokenizer.save_pretrained(tmp_path)
    bb = load_backbone(str(tmp_path))
    assert bb.kind == kind
    assert same_backbone(bb.identity, tiny.identity), identity_mismatch(bb.identity, tiny.identity)
    assert bb.identity["name"] != tiny.identity["name"]   # names may differ
    assert not any(p.requires_grad for p in bb.model.parameters())
    if kind == "decoder":
        assert bb.model.get_output_embeddings() is not None
    ids = torch.tensor([[101, 2054, 102]])
    with torch.no_grad():
        a = tiny.model(input_ids=ids)[0]
        b = bb.model(input_ids=ids)[0]
    assert torch.equal(a, b)


def test_identity_tells_weights_and_configs_apart() -> None:
    a, b = tiny_backbone("encoder", seed=0), tiny_backbone("encoder", seed=0)
    assert same_backbone(a.identity, b.identity)
    c = tiny_backbone("encoder", seed=1)   # same config, other weights
    assert not same_backbone(a.identity, c.identity)
    assert any("weights_hash" in m for m in identity_mismatch(a.identity, c.identity))
    d = tiny_backbone("encoder", layers=3)
    assert not same_backbone(a.identity, d.identity)


@pytest.mark.parametrize(("config", "decoder"), [
    (BertConfig(), False),
    (BertConfig(is_decoder=True), True),
    (LlamaConfig(), True),
    (GPT2Config(), True),
    (BertConfig(architectures=["MyForCausalLM"]), True),
])
def test_decoder_detection(config, decoder: bool) -> None:
    assert is_decoder_config(config) is decoder


def test_encoder_decoder_models_refused() -> None:
    with pytest.raises(ConfigError, match="encoder-decoder"):
        is_decoder_config(T5Config())


@pytest.mark.parametrize("kind", ["encoder", "decoder"])
def test_clone_shares_frozen_weights_not_modules(kind: str) -> None:
    from baselines.moe import MoELoRAConfig, inject, moe_layers

    a = tiny_backbone(kind)
    b = a.clone()
    assert b.model is not a.model and b.tokenizer is a.tokenizer and b.identity == a.identity
    pa, pb = dict(a.model.named_parameters()), dict(b.model.named_parameters())
    assert pa.keys() == pb.keys() and all(pa[k] is pb[k] for k in pa)   # no copy of weights
    inject(b.model, MoELoRAConfig(n_experts=2, rank=2, top_k=1))        # adapters go on b only
    assert moe_layers(b.model) and not moe_layers(a.model)
    assert not any(p.requires_grad for p in a.model.parameters())
    if kind == "decoder":   # tied input/output embeddings stay tied, untied stay apart
        def tied(m):
            return m.get_output_embeddings().weight is m.get_input_embeddings().weight
        assert tied(b.model) == tied(a.model)


def test_minilm_package_folder_is_hf_format() -> None:
    assert (minilm_path() / "config.json").is_file()


def test_check_backbone_without_loading(tmp_path) -> None:
    assert check_backbone("minilm") == "registered"
    assert check_backbone("some-org/some-model") == "hub"
    (tmp_path / "config.json").write_text("{}")
    assert check_backbone(str(tmp_path)) == "folder"
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    assert check_backbone(str(tmp_path / "m.gguf")) == "gguf"
    for bad in ("nope", str(tmp_path / "missing" / "x")):
        with pytest.raises(ConfigError):
            check_backbone(bad)


@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral", "bert"])
def test_architecture_families_load_and_take_moe(tmp_path, family: str) -> None:
    """A saved tiny model of each family loads from its folder and gets MoE-LoRA on the
    architecture's own linears (target modules resolved per model_type)."""
    from transformers import AutoModel, AutoModelForCausalLM, BertConfig, MistralConfig, Qwen2Config

    from baselines.heads import make_moe
    from baselines.moe import AUTO_TARGETS, MoELoRAConfig, moe_layers

    tok = tiny_backbone("encoder").tokenizer
    small = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
             "num_attention_heads": 2, "vocab_size": tok.vocab_size,
             "max_position_embeddings": 128}
    config = {"llama": LlamaConfig(num_key_value_heads=2, **small),
              "qwen2": Qwen2Config(num_key_value_heads=2, **small),
              "mistral": MistralConfig(num_key_value_heads=2, **small),
              "bert": BertConfig(**small)}[family]
    cls = AutoModel if family == "bert" else AutoModelForCausalLM
    torch.manual_seed(0)
    cls.from_config(config).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    bb = load_backbone(str(tmp_path))
    assert bb.kind == ("encoder" if family == "bert" else "decoder")
    model = make_moe(bb, MoELoRAConfig(n_experts=2, rank=2, top_k=1))
    wrapped = {n.rsplit(".", 1)[-1] for n, m in model.backbone.named_modules()
               if m in set(moe_layers(model.backbone))}
    assert {t.rsplit(".", 1)[-1] for t in AUTO_TARGETS[family]} == wrapped


def test_unknown_architecture_lists_its_linears() -> None:
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    from baselines.backbones import from_model
    from baselines.heads import make_moe

    tok = tiny_backbone("encoder").tokenizer
    model = GPTNeoXForCausalLM(GPTNeoXConfig(hidden_size=32, intermediate_size=64,
                                             num_hidden_layers=1, num_attention_heads=2,
                                             vocab_size=tok.vocab_size))
    bb = from_model(model, tok, name="neox")
    with pytest.raises(ConfigError, match="gpt_neox") as err:
        make_moe(bb)
    assert "query_key_value" in str(err.value) and "dense_h_to_4h" in str(err.value)


def test_gpu_placement_is_bf16_with_device_map() -> None:
    """The GPU code path without a GPU: bfloat16 and a device_map (CPU: float32, no map)."""
    from baselines.backbones import device_placement

    assert device_placement(None, None) == (torch.float32, {})
    assert device_placement("cpu", None) == (torch.float32, {})
    assert device_placement("cuda:0", None) == (torch.bfloat16, {"device_map": "auto"})
    assert device_placement("cuda:0", torch.float16) == (torch.float16, {"device_map": "auto"})


def test_architecture_is_checked_from_config_alone_before_any_data_work(tmp_path, capsys,
                                                                        monkeypatch) -> None:
    """`uqbench run --backbone FOLDER` with an architecture MoE-LoRA has no targets for fails in
    validation: from config.json alone (no weights in the folder), before a split is built."""
    import huggingface_hub.constants
    from transformers import GPTNeoXConfig, Qwen2Config

    from baselines.backbones import check_architecture
    from baselines.moe import AUTO_TARGETS
    from uqbench.cli import main
    from uqbench.run import runner

    small = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
             "num_attention_heads": 2, "vocab_size": 100}
    (tmp_path / "qwen").mkdir()
    Qwen2Config(**small).save_pretrained(tmp_path / "qwen")
    assert check_architecture(str(tmp_path / "qwen")) == AUTO_TARGETS["qwen2"]
    assert check_architecture("minilm") is None  # registered: targets known
    GPTNeoXConfig(**small).save_pretrained(tmp_path / "neox")

    def no_data(*a, **k):
        raise AssertionError("data work started before the backbone was validated")

    monkeypatch.setattr(runner, "build_suite", no_data)
    rc = main(["run", "--suite", "pooled", "--profile", "smoke", "--backbone",
               str(tmp_path / "neox"), "--out", str(tmp_path / "out"),
               "--cache-dir", str(tmp_path / "cache")])
    err = capsys.readouterr().err
    assert rc == 2 and "gpt_neox" in err and "query_key_value" in err and "Traceback" not in err
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ConfigError, match="cannot be reached"):
        check_architecture("no-such-org/no-such-model")


# --- the registry: a backbone is one decorated loader (README "Adding a backbone") -------------

@pytest.fixture
def example_backbone():
    import sys

    from baselines.backbones import BACKBONES, minilm_path
    with BACKBONES.scoped():
        mod = importlib.import_module("tests.support.example_backbone")  # afresh: registers
        mod.FOLDER = Path(minilm_path())  # the README's folder, models/my-bert, is not here
        yield mod
    sys.modules.pop("tests.support.example_backbone", None)


def test_a_registered_backbone_is_checked_listed_and_loaded(example_backbone, monkeypatch,
                                                             tmp_path) -> None:
    from uqbench.core.engine import get_backend

    assert "my-bert" in list_backbones() and "my-bert" in get_backend().backbones()
    assert check_backbone("my-bert") == "registered"
    bb = load_backbone("my-bert")
    assert bb.kind == "encoder" and bb.name == "my-bert"
    assert bb.identity["weights_hash"] == load_backbone("minilm").identity["weights_hash"]
    monkeypatch.setattr(example_backbone, "FOLDER", tmp_path)  # its check runs, not a load
    with pytest.raises(ConfigError, match="'my-bert' needs"):
        check_backbone("my-bert")


def test_a_plugin_backbone_runs_through_the_cli_checks(example_backbone, tmp_path) -> None:
    """``--plugin MODULE --backbone NAME``: the runner's checks accept it before any data."""
    from uqbench.run.runner import RunConfig, prepare

    prepare(RunConfig(profile="smoke", backbone="my-bert", out=tmp_path / "o"))
    with pytest.raises(ConfigError, match="unknown backbone 'my-bert2'"):
        prepare(RunConfig(profile="smoke", backbone="my-bert2", out=tmp_path / "o"))
