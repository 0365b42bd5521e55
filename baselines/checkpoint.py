"""Adapter checkpoints: the trainable tensors only (experts, routers, dense adapters, head).

A checkpoint directory holds

``adapter.safetensors``
    every parameter with ``requires_grad`` (never a backbone weight), under its
    `MultipleChoiceModel` name;
``adapter_config.json``
    ``format``, ``version``, the backbone identity (`baselines.backbones.make_identity`), the head
    description (mode, dropout, seed, adapter type + config), the caller's ``meta`` and the sha256
    of the tensor file.

Both files are written to a temporary name and moved in place with ``os.replace`` (tensors
first, config last), and the config names the tensor file's hash: an interrupted or mixed write
is detected at load time, never silently used.

Example
-------
>>> save_adapter(model, "ckpt/moe-seed0", meta={"train": {"epochs": 3}})   # doctest: +SKIP
>>> again = load_adapter("ckpt/moe-seed0", load_backbone("minilm"))       # doctest: +SKIP
"""
from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from baselines.backbones import Backbone, identity_mismatch, same_backbone
from baselines.heads import MultipleChoiceModel, make_moe, make_plain
from uqbench.files.cache import atomic_write, atomic_write_text, file_sha256

FORMAT = "uqbench-adapter"
VERSION = 1
TENSORS_FILE = "adapter.safetensors"
WEIGHTS_FILE = TENSORS_FILE   # alias used by the runner
CONFIG_FILE = "adapter_config.json"


def adapter_state(model: MultipleChoiceModel) -> dict[str, torch.Tensor]:
    """The tensors a checkpoint stores: every trainable parameter, detached, on CPU."""
    return {name: p.detach().to("cpu").contiguous()
            for name, p in model.named_parameters() if p.requires_grad}


def save_adapter(model: MultipleChoiceModel, directory: str | os.PathLike[str], *,
                 meta: Mapping[str, Any]) -> Path:
    """Write the model's trainable tensors and config to ``directory`` (created if needed).

    Parameters
    ----------
    model : MultipleChoiceModel
    directory : path
    meta : mapping
        JSON-serialisable extras (training config, losses, data hashes...).

    Returns
    -------
    Path of ``adapter_config.json``.
    """
    try:
        meta_json = json.loads(json.dumps(dict(meta)))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"save_adapter: meta must be JSON-serialisable: {exc}") from exc
    state = adapter_state(model)
    if not state:
        raise ValueError("save_adapter: the model has no trainable tensors to save")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tensors_path = out / TENSORS_FILE
    atomic_write(tensors_path, lambda p: save_file(state, str(p), metadata={"format": "pt"}))
    config = {
        "format": FORMAT,
        "version": VERSION,
        "backbone": dict(model.identity),
        "head": model.describe(),
        "meta": meta_json,
        "tensors": {"file": TENSORS_FILE, "sha256": file_sha256(tensors_path), "count": len(state),
                    "numel": int(sum(t.numel() for t in state.values()))},
    }
    config_path = out / CONFIG_FILE
    atomic_write_text(config_path, json.dumps(config, indent=2, sort_keys=True))
    return config_path


def read_config(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The checkpoint's ``adapter_config.json``, validated (format, version)."""
    path = Path(directory) / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no adapter checkpoint at {str(directory)!r}: {CONFIG_FILE} "
                                "missing (train the model or check the path)")
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"adapter checkpoint {str(directory)!r}: {CONFIG_FILE} is corrupt "
                         f"({exc}); delete the directory and retrain") from exc
    if config.get("format") != FORMAT or config.get("version") != VERSION:
        raise ValueError(f"adapter checkpoint {str(directory)!r} has format "
                         f"{config.get('format')!r} v{config.get('version')}, expected {FORMAT!r} "
                         f"v{VERSION}; retrain it with this version of uqbench")
    return config


def adapter_hash(directory: str | os.PathLike[str]) -> str:
    """sha256 of the checkpoint's tensor file, as recorded at save time (for cache keys)."""
    return str(read_config(directory)["tensors"]["sha256"])


def load_adapter(directory: str | os.PathLike[str], backbone: Backbone, *,
                 copy: bool = True) -> MultipleChoiceModel:
    """Rebuild the model saved by `save_adapter` on ``backbone`` and load its tensors.

    Parameters
    ----------
    directory : path
    backbone : Backbone
        Must be the backbone the checkpoint was trained on (same identity; the name may differ).
    copy : bool
        Build on a clone of the backbone (default), leaving ``backbone`` reusable.

    Returns
    -------
    MultipleChoiceModel in eval mode; its logits equal the saved model's exactly.

    Raises
    ------
    ValueError
        Another backbone (names both and the differing fields), a corrupt or partial checkpoint,
        or tensors that do not fit the rebuilt model.
    """
    config = read_config(directory)
    saved = config["backbone"]
    if not same_backbone(saved, backbone.identity):
        raise ValueError(
            f"adapter checkpoint {str(directory)!r} was trained on backbone "
            f"{saved.get('name')!r}, not on {backbone.name!r} "
            f"({'; '.join(identity_mismatch(saved, backbone.identity))}). Load it with "
            f"load_backbone({saved.get('name')!r}), or retrain the adapter for {backbone.name!r}."
        )
    tensors_path = Path(directory) / config["tensors"]["file"]
    if not tensors_path.is_file():
        raise ValueError(f"adapter checkpoint {str(directory)!r} is incomplete: "
                         f"{tensors_path.name} missing; delete the directory and retrain")
    if file_sha256(tensors_path) != config["tensors"]["sha256"]:
        raise ValueError(f"adapter checkpoint {str(directory)!r} is corrupt or stale: the hash of "
                         f"{tensors_path.name} differs from {CONFIG_FILE}; delete and retrain")

    model = build_from_description(config["head"], backbone, copy=copy)
    state = load_file(str(tensors_path))
    expected = {n for n, p in model.named_parameters() if p.requires_grad}
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise ValueError(f"adapter checkpoint {str(directory)!r} does not fit the rebuilt model: "
                         f"missing {missing[:3]}, unexpected {unexpected[:3]}; retrain it")
    with torch.no_grad():
        params = dict(model.named_parameters())
        for name, t in state.items():
            if params[name].shape != t.shape:
                raise ValueError(f"adapter checkpoint {str(directory)!r}: tensor {name} has shape "
                                 f"{tuple(t.shape)}, model expects {tuple(params[name].shape)}")
            params[name].copy_(t)
    return model.eval()


def build_from_description(head: Mapping[str, Any], backbone: Backbone, *,
                           copy: bool = True) -> MultipleChoiceModel:
    """A fresh (untrained) model from `MultipleChoiceModel.describe` output."""
    adapter = head["adapter"]
    kind, cfg = adapter["type"], dict(adapter["config"])
    common = {"mode": head["mode"], "head_dropout": head["head_dropout"], "seed": head["seed"],
              "copy": copy}
    if kind == "moe":
        from baselines.moe import MoELoRAConfig
        return make_moe(backbone, MoELoRAConfig.from_dict(cfg), **common)
    if kind in ("lora", "dora", "adalora"):
        from baselines.dense import make_dense
        return make_dense(backbone, kind, rank=cfg["rank"], alpha=cfg["alpha"],
                          dropout=cfg["dropout"], target_modules=cfg["target_modules"],
                          total_step=cfg.get("total_step"), **{**common, "seed": cfg["seed"]})
    if kind == "none":
        return make_plain(backbone, **common)
    raise ValueError(f"adapter type {kind!r} unknown; valid: moe, lora, dora, adalora, none")
