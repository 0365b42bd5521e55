"""The frozen-prefix state cache: hidden states of adapter-free bottom blocks, per text."""
from __future__ import annotations

import json
import os
from collections import OrderedDict
from typing import Any

import torch
from torch import Tensor

from baselines.heads.base import HeadedModel


class PrefixCache:
    """Hidden states of a frozen, adapter-free stack of bottom blocks, per text.

    When every adapter sits in the last blocks of a BERT-family encoder (``top_layers``), the
    embeddings and the blocks below the first adapted one compute the same function for every
    model built on the backbone (the dense baseline, each ensemble member, every gate and every
    pass), in eval mode. Their output for a sequence of token ids is computed once, for that
    sequence alone (so it does not depend on which batch first needed it), kept here (in the
    backbone's dtype, unpadded) and reused; only the adapted blocks run per model and pass. Least
    recently used entries leave when the cache holds more than ``max_mb`` MiB
    (``UQBENCH_PREFIX_CACHE_MB``, default 4096). One cache per process, shared by every model.
    """

    def __init__(self, max_mb: float) -> None:
        self.max_bytes = int(max_mb * 2 ** 20)
        self.bytes = 0
        self.hits = self.misses = 0
        self.entries: OrderedDict[tuple[str, int, bytes], Tensor] = OrderedDict()

    def clear(self) -> None:
        self.entries.clear()
        self.bytes = self.hits = self.misses = 0

    def states(self, model: HeadedModel, start: int, ids: Tensor, mask: Tensor,
               token_types: Tensor | None) -> Tensor:
        """(S, L, H) input of block ``start`` for right-padded ``ids`` (S, L); 0 at padding."""
        ident = json.dumps(model.identity, sort_keys=True)
        lengths = mask.sum(1).tolist()
        keys = []
        for i, n in enumerate(lengths):
            row = ids[i, :n].cpu().numpy().tobytes()
            if token_types is not None:
                row += b"|" + token_types[i, :n].cpu().numpy().tobytes()
            keys.append((ident, start, row))
        found = {k: self.entries[k] for k in keys if k in self.entries}
        for k in found:
            self.entries.move_to_end(k)
        fresh = {k: self._alone(model, start, ids[i:i + 1, :lengths[i]],
                                None if token_types is None else token_types[i:i + 1, :lengths[i]])
                 for i, k in enumerate(keys) if k not in found}
        self.hits += len(keys) - len(fresh)
        self.misses += len(fresh)
        for k, v in fresh.items():
            self.put(k, v)
        found.update(fresh)
        out = torch.zeros(ids.shape[0], ids.shape[1], int(model.identity["hidden_size"]),
                          device=ids.device, dtype=model.backbone.dtype)
        for i, k in enumerate(keys):
            out[i, :lengths[i]] = found[k]
        return out

    @staticmethod
    def _alone(model: HeadedModel, start: int, ids: Tensor,
               token_types: Tensor | None) -> Tensor:
        """(L, H) states of one unpadded text (1, L), computed alone. Not in the batch that first
        needed it: padding to a longer batch-mate, or other batch-mates of the same length
        (another GEMM shape, another kernel), changes the last bits (MiniLM: up to 3e-6), and
        training amplifies that, so a model would depend on which texts were cached before it."""
        extra = {} if token_types is None else {"token_type_ids": token_types}
        with torch.no_grad():
            h = run_blocks(model.backbone, model.backbone.embeddings(input_ids=ids, **extra),
                            torch.ones_like(ids), 0, start)                     # (1, L, H)
        return h[0].clone()

    def put(self, key: tuple[str, int, bytes], value: Tensor) -> None:
        """Keep ``value`` under ``key``, dropping the least recently used entries past
        ``max_bytes`` (the newest stays)."""
        self.entries[key] = value
        self.bytes += value.numel() * value.element_size()
        while self.bytes > self.max_bytes and len(self.entries) > 1:
            _, old = self.entries.popitem(last=False)
            self.bytes -= old.numel() * old.element_size()


PREFIX_CACHE = PrefixCache(float(os.environ.get("UQBENCH_PREFIX_CACHE_MB", "4096")))


#: encoders that take a 4D attention mask as it is (transformers' BERT and its copies)
MASK_4D_ENCODER_TYPES = frozenset({"bert", "roberta", "xlm-roberta", "electra"})


def encoder_attention_mask(config: Any, mask: Tensor) -> Tensor:
    """What an encoder call is given as its attention mask for the padding ``mask`` (S, L).

    Under sdpa attention, for `MASK_4D_ENCODER_TYPES`, the (S, 1, L, L) bool mask without the
    padded keys that transformers builds for sdpa itself when a batch has padding. Given the 2D
    mask, transformers first reads whether it is all ones (to leave the mask out): a read that
    waits for the device. Other models and attention implementations get the 2D mask."""
    if (getattr(config, "_attn_implementation", None) != "sdpa"
            or getattr(config, "model_type", None) not in MASK_4D_ENCODER_TYPES):
        return mask
    S, L = mask.shape
    return mask.bool()[:, None, None, :].expand(S, 1, L, L)


def run_blocks(bert: Any, h: Tensor, mask: Tensor, start: int, stop: int | None) -> Tensor:
    """Blocks ``start:stop`` of a BERT-family encoder on hidden states ``h`` (S, L, H), with the
    bidirectional attention mask that the model's own forward would build from ``mask``."""
    from transformers.masking_utils import create_bidirectional_mask

    att = create_bidirectional_mask(config=bert.config, inputs_embeds=h, attention_mask=mask)
    for block in bert.encoder.layer[start:stop]:
        h = block(h, att)
        h = h[0] if isinstance(h, tuple) else h
    return h
