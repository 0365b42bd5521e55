"""The step benchmarks' architecture-only backbone: a folder with a decoder's config.json and
tokenizer but no weights gives that architecture with random weights (a lease carries a few MB,
not the weights), and a folder with weights is not mistaken for one."""
from __future__ import annotations

import shutil

import pytest
import torch
from transformers import LlamaConfig

from baselines.backbones import minilm_path
from benchmarks.bench_train_step import architecture_only, step_backbone


def _arch_folder(tmp_path):
    folder = tmp_path / "tiny-arch"
    folder.mkdir()
    LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=3, num_attention_heads=2,
                num_key_value_heads=2, vocab_size=30522, pad_token_id=0,
                architectures=["LlamaForCausalLM"]).save_pretrained(folder)
    for f in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (minilm_path() / f).is_file():
            shutil.copy(minilm_path() / f, folder / f)
    return folder


def test_a_config_folder_gives_its_architecture_with_random_weights(tmp_path, monkeypatch):
    folder = _arch_folder(tmp_path)
    assert architecture_only(folder)
    monkeypatch.setenv("UQBENCH_BENCH_BACKBONE", str(folder))
    name, bb = step_backbone()
    assert name == "tiny-arch (random weights)"
    assert bb.kind == "decoder" and bb.model.config.num_hidden_layers == 3
    assert bb.model.dtype == torch.float32            # no GPU here: float32, as real weights
    assert not any(p.requires_grad for p in bb.model.parameters())
    # seeded: the same folder gives the same weights (identities match across calls)
    assert step_backbone()[1].identity == bb.identity


def test_a_folder_with_weights_is_not_architecture_only(tmp_path):
    folder = _arch_folder(tmp_path)
    (folder / "model.safetensors").write_bytes(b"")
    assert not architecture_only(folder)
    assert not architecture_only(tmp_path / "missing")


@pytest.mark.slow
def test_the_step_profile_lists_the_ops_and_finds_no_sync(tmp_path, monkeypatch):
    """`python -m benchmarks step_profile` on the CPU: a line for MoE-LoRA and one for dense LoRA,
    the ops taking most time, and no op waiting for the device in either step (the letters
    head's forward and backward read nothing back)."""
    from benchmarks import bench_step_profile

    monkeypatch.setenv("UQBENCH_BENCH_BACKBONE", str(_arch_folder(tmp_path)))
    lines = list(bench_step_profile.run())
    assert [ln["model"] for ln in lines] == ["moe-lora", "lora"]
    for ln in lines:
        assert ln["time"] == "cpu" and ln["tokens"] == 16 * ln["max_length"]
        assert len(ln["top_ops"]) == bench_step_profile.TOP
        assert "aten::mm" in {op["name"] for op in ln["top_ops"]}
        assert ln["step_syncs_per_step"] == {}
        assert ln["s_per_step"] > 0 and ln["s_per_step_deterministic"] > 0
    assert lines[0]["aten_ops_per_step"] > lines[1]["aten_ops_per_step"]


def test_the_memory_benchmark_measures_an_architecture_and_sizes_the_profiles(tmp_path,
                                                                             monkeypatch):
    """`python -m benchmarks memory` on an architecture folder: bytes per token of the MC pass
    and of a training step per block, checkpointing keeping less a block, the weights' bytes
    as the model holds them; the profiles' gigabytes from a row, worked by hand."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from benchmarks import bench_memory

    folder = _arch_folder(tmp_path)
    monkeypatch.setenv("UQBENCH_BENCH_BACKBONE", str(folder))
    monkeypatch.setenv("UQBENCH_BENCH_TARGETS", "auto")
    (row,) = bench_memory.run()
    assert (row["architecture"], row["targets"], row["blocks"]) == ("tiny-arch", "auto", 3)
    assert row["eval_bytes_per_token"] > 0 and row["train_bytes_per_token_block"] > 0
    assert 0 < row["train_ckpt_bytes_per_token_block"] < row["train_bytes_per_token_block"]
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder),
                                             dtype=torch.bfloat16)
    assert row["weights_bytes"] == 2 * sum(p.numel() for p in model.parameters())
    assert set(row["profiles"]) == {"full"}   # the profile adapting attention and MLP
    # gpu: 8 copies x 64 rows x 1024 tokens; 16 x 1024 tokens over its 8 adapted blocks
    made = {"targets": "ffn", "blocks": 24, "eval_bytes_per_token": 100_000,
            "train_bytes_per_token_one_block": 200_000, "train_bytes_per_token_block": 100_000,
            "train_ckpt_bytes_per_token_one_block": 50_000,
            "train_ckpt_bytes_per_token_block": 10_000, "weights_bytes": 40e9}
    gpu = bench_memory.profile_gb(made)["gpu"]
    assert gpu == {"mc_pass": 52.4, "train_step": 14.7, "train_step_ckpt": 2.0, "weights": 40.0,
                   "eval_tokens_for_80gb": 320_000}   # (0.9 * 80e9 - 40e9) / 1e5
    assert bench_memory.profile_gb({**made, "weights_bytes": 1e9})["gpu"][
        "eval_tokens_for_80gb"] is None                  # 710,000 >= 524,288: fits as it is
