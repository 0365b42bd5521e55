"""Multiple-choice models on a frozen backbone: one score per option -> logits (B, C).

Four heads, one interface (`MultipleChoiceModel.encode` then `forward`):

``bi_encoder`` (encoder backbones; the default, chosen by the recipe search in docs/recipe.md)
    The question and each option are encoded separately (the question once, not once per
    option), mean-pooled over non-padding tokens (the sentence-transformers pooling that
    all-MiniLM-L6-v2 and all-mpnet-base-v2 were trained with), passed through ``dropout`` and
    L2-normalised; an option's score is ``exp(logit_scale) * cos(question, option)`` with a
    learned temperature (initialised at scale 20, sentence-transformers' contrastive scale). It
    starts from what the sentence-embedding space already knows and has one parameter.
``cross_encoder`` (encoder backbones)
    Each (question, option) pair is one sequence ``[CLS] question [SEP] option [SEP]``; the
    question is truncated first (``only_first``; ``longest_first`` for a pair whose option alone
    is too long). Token states are mean-pooled over non-padding tokens, then
    ``dropout -> Linear(hidden, 1)`` gives the option's score. ``cross_encoder_cls``: the same
    with the ``[CLS]`` state instead of the mean.
``cloze`` (decoder backbones)
    Score of an option = mean log-likelihood of its tokens given ``"Question: q\\nAnswer:"``
    (length-normalised, as lm-evaluation-harness' ``acc_norm`` by tokens). No extra parameters.
``letters`` (decoder backbones; the default for decoders)
    One sequence per question listing the lettered options, ending in ``"Answer:"``; the logits
    of the tokens ``" A"``, ``" B"``, ... at the last position. One sequence per question, so C
    times cheaper than ``cloze``. No extra parameters.

Choice counts may differ within a batch: absent options get `uqbench.outputs.PAD_LOGIT` (finite,
probability exactly 0 in float64, zero gradient), so logits are always (B, C_max) and finite.

When the backbone has MoE-LoRA layers, `forward` hands them the token mask (padding excluded
from routing statistics and the load-balancing loss).
"""
from __future__ import annotations

import json
import math
import os
import re
import sys
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from baselines.backbones import Backbone
from uqbench.data.records import MCRecord
from uqbench.errors import ConfigError
from uqbench.outputs import PAD_LOGIT

HEAD_MODES = ("bi_encoder", "cross_encoder", "cross_encoder_cls", "cloze", "letters")
ENCODER_MODES = ("bi_encoder", "cross_encoder", "cross_encoder_cls")
#: initial ``exp(logit_scale)`` of the bi-encoder head
BI_ENCODER_SCALE = 20.0
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _pad(rows: Sequence[Sequence[int]], value: int) -> Tensor:
    """Right-pad lists of ints into a (len(rows), max_len) long tensor."""
    width = max(len(r) for r in rows)
    out = torch.full((len(rows), width), value, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, :len(r)] = torch.as_tensor(r, dtype=torch.long)
    return out


def _encode_pair(tok: Any, question: str, option: str, max_length: int) -> Any:
    """One pair, question truncated first; ``longest_first`` when the option alone is too long."""
    try:
        return tok(question, option, truncation="only_first", max_length=max_length)
    except Exception as exc:   # the tokenizers library raises a bare Exception
        if "Truncation" not in str(exc):
            raise
        return tok(question, option, truncation="longest_first", max_length=max_length)


def _mean_pool(h: Tensor, mask: Tensor) -> Tensor:
    """(S, L, H) token states -> (S, H) mean over the non-padding tokens of ``mask`` (S, L)."""
    m = mask.unsqueeze(-1).to(h.dtype)
    return (h * m).sum(1) / m.sum(1).clamp_min(1.0)


def _per_example(states: Tensor, n_choices: Tensor) -> Tensor:
    """(S, H) states of the option sequences -> (B, H) float32 mean over each example's."""
    ex = torch.repeat_interleave(torch.arange(n_choices.numel(), device=states.device), n_choices)
    total = states.new_zeros((n_choices.numel(), states.shape[1]), dtype=torch.float32)
    return total.index_add_(0, ex, states.float()) / n_choices[:, None].float()


def _scatter_choices(scores: Tensor, n_choices: Tensor) -> Tensor:
    """(S,) scores of the real options, S = sum(n_choices) -> (B, C_max), PAD_LOGIT elsewhere."""
    b, c = n_choices.numel(), int(n_choices.max())
    col = torch.arange(c, device=n_choices.device)
    present = col[None, :] < n_choices[:, None]                          # (B, C)
    out = scores.new_full((b, c), PAD_LOGIT)
    return out.masked_scatter(present, scores)                           # row-major fill


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
        self._items: OrderedDict[tuple[str, int, bytes], Tensor] = OrderedDict()

    def clear(self) -> None:
        self._items.clear()
        self.bytes = self.hits = self.misses = 0

    def states(self, model: MultipleChoiceModel, start: int, ids: Tensor, mask: Tensor,
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
        found = {k: self._items[k] for k in keys if k in self._items}
        for k in found:
            self._items.move_to_end(k)
        fresh = {k: self._alone(model, start, ids[i:i + 1, :lengths[i]],
                                None if token_types is None else token_types[i:i + 1, :lengths[i]])
                 for i, k in enumerate(keys) if k not in found}
        self.hits += len(keys) - len(fresh)
        self.misses += len(fresh)
        for k, v in fresh.items():
            self._put(k, v)
        found.update(fresh)
        out = torch.zeros(ids.shape[0], ids.shape[1], int(model.identity["hidden_size"]),
                          device=ids.device, dtype=model.backbone.dtype)
        for i, k in enumerate(keys):
            out[i, :lengths[i]] = found[k]
        return out

    @staticmethod
    def _alone(model: MultipleChoiceModel, start: int, ids: Tensor,
               token_types: Tensor | None) -> Tensor:
        """(L, H) states of one unpadded text (1, L), computed alone. Not in the batch that first
        needed it: padding to a longer batch-mate, or other batch-mates of the same length
        (another GEMM shape, another kernel), changes the last bits (MiniLM: up to 3e-6), and
        training amplifies that, so a model would depend on which texts were cached before it."""
        extra = {} if token_types is None else {"token_type_ids": token_types}
        with torch.no_grad():
            h = _run_blocks(model.backbone, model.backbone.embeddings(input_ids=ids, **extra),
                            torch.ones_like(ids), 0, start)                     # (1, L, H)
        return h[0].clone()

    def _put(self, key: tuple[str, int, bytes], value: Tensor) -> None:
        self._items[key] = value
        self.bytes += value.numel() * value.element_size()
        while self.bytes > self.max_bytes and len(self._items) > 1:
            _, old = self._items.popitem(last=False)
            self.bytes -= old.numel() * old.element_size()


PREFIX_CACHE = PrefixCache(float(os.environ.get("UQBENCH_PREFIX_CACHE_MB", "4096")))


def _run_blocks(bert: nn.Module, h: Tensor, mask: Tensor, start: int, stop: int | None) -> Tensor:
    """Blocks ``start:stop`` of a BERT-family encoder on hidden states ``h`` (S, L, H), with the
    bidirectional attention mask that the model's own forward would build from ``mask``."""
    from transformers.masking_utils import create_bidirectional_mask

    att = create_bidirectional_mask(config=bert.config, inputs_embeds=h, attention_mask=mask)
    for block in bert.encoder.layer[start:stop]:
        h = block(h, att)
        h = h[0] if isinstance(h, tuple) else h
    return h


def adapter_layers(model: nn.Module) -> list[str]:
    """Names of adapter modules (MoE-LoRA layers, peft tuner layers) already in ``model``."""
    from baselines.moe import MoELoRALinear

    kinds: tuple[type, ...] = (MoELoRALinear,)
    if "peft" in sys.modules:   # peft layers exist only if peft was imported (slow import)
        from peft.tuners.tuners_utils import BaseTunerLayer
        kinds += (BaseTunerLayer,)
    return [n for n, m in model.named_modules() if isinstance(m, kinds)]


class MultipleChoiceModel(nn.Module):
    """A backbone plus a multiple-choice head; logits (B, C) for a batch of `MCRecord`.

    Parameters
    ----------
    backbone : Backbone
        Used in place (its model becomes ``self.backbone``); builders such as `make_moe` and
        `baselines.dense.make_dense` clone it first unless told not to.
    mode : {"auto", "bi_encoder", "cross_encoder", "cross_encoder_cls", "cloze", "letters"}
        ``"auto"``: ``bi_encoder`` for encoders, ``letters`` for decoders.
    head_dropout : float
        Dropout before the scoring head (cross-encoder only; an ``nn.Dropout``, so MC dropout
        samples it). 0.1 = BERT's classifier dropout.
    seed : int
        Seed of the scoring head's initialisation (independent of the global RNG).
    adapter : mapping, optional
        ``{"type": "none" | "moe" | "lora" | "dora" | "adalora", "config": {...}}``, recorded by
        the builders so `baselines.checkpoint` can rebuild the model.

    Attributes
    ----------
    head : ``nn.Linear(hidden, 1, bias=False)`` (cross-encoder modes) or None. No bias: the
        softmax over choices is shift-invariant, a bias would get zero gradient.
    logit_scale : scalar ``nn.Parameter`` (bi-encoder mode) or None: log of the temperature.
    """

    def __init__(self, backbone: Backbone, *, mode: str = "auto", head_dropout: float = 0.1,
                 seed: int = 0, adapter: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        if mode == "auto":
            mode = "bi_encoder" if backbone.kind == "encoder" else "letters"
        if mode not in HEAD_MODES:
            raise ConfigError(f"head mode {mode!r} unknown; valid: auto, {', '.join(HEAD_MODES)}")
        if (mode in ENCODER_MODES) != (backbone.kind == "encoder"):
            want = " or ".join(ENCODER_MODES) if backbone.kind == "encoder" else "cloze or letters"
            raise ConfigError(f"head mode {mode!r} does not fit {backbone.kind} backbone "
                              f"{backbone.name!r}; use {want}")
        if not 0.0 <= head_dropout < 1.0:
            raise ConfigError(f"head_dropout must be in [0, 1), got {head_dropout}")
        self.backbone = backbone.model
        self.tokenizer = backbone.tokenizer
        self.kind = backbone.kind
        self.identity = dict(backbone.identity)
        self.mode = mode
        self.head_dropout = head_dropout
        self.seed = seed
        self.adapter: dict[str, Any] = dict(adapter or _infer_adapter(backbone))
        hidden = int(self.identity["hidden_size"])
        w = self.backbone.get_input_embeddings().weight
        self.head: nn.Linear | None = None
        self.logit_scale: nn.Parameter | None = None
        if mode in ENCODER_MODES:
            self.dropout = nn.Dropout(head_dropout)
        if mode.startswith("cross_encoder"):
            self.head = nn.Linear(hidden, 1, bias=False, device=w.device, dtype=w.dtype)
            gen = torch.Generator().manual_seed(seed)
            with torch.no_grad():   # BERT's initializer_range
                self.head.weight.copy_(torch.randn(self.head.weight.shape, generator=gen) * 0.02)
        elif mode == "bi_encoder":
            self.logit_scale = nn.Parameter(torch.tensor(math.log(BI_ENCODER_SCALE),
                                                         device=w.device, dtype=torch.float32))
        self._moe = bool(_moe_layers(self.backbone))
        self._letter_ids: list[int] | None = None
        #: (B, H) float32 pooled final hidden state of the last forward, one per example
        self.last_features: Tensor | None = None
        self.prefix_start = self._frozen_prefix()

    def _frozen_prefix(self) -> int:
        """The first adapted block of a BERT-family encoder whose blocks below carry no adapter
        (their states come from `PREFIX_CACHE`); 0 when there is no such prefix."""
        if self.kind != "encoder" or self.identity.get("model_type") != "bert":
            return 0
        try:
            import transformers.masking_utils  # noqa: F401  (transformers >= 5)
        except ImportError:
            return 0
        names = adapter_layers(self.backbone)
        blocks = [int(m.group(1)) for n in names if (m := re.match(r"encoder\.layer\.(\d+)\.", n))]
        return min(blocks) if names and len(blocks) == len(names) else 0

    def _prefix_modules(self) -> list[nn.Module]:
        bert = self.backbone
        return [bert.embeddings, *bert.encoder.layer[:self.prefix_start]]

    def train(self, mode: bool = True) -> MultipleChoiceModel:
        """As ``nn.Module.train``, but a frozen prefix (`prefix_start` > 0) stays in eval mode:
        it has nothing to learn, and in eval mode its states are the cached ones. MC-dropout
        samples dropout where training did (`mc_dropout_on`), so it reads the cached states too."""
        super().train(mode)
        if self.prefix_start:
            for m in self._prefix_modules():
                m.eval()
        return self

    def mc_dropout_on(self) -> None:
        """MC-dropout: every ``nn.Dropout`` that training samples in train mode (all but those of
        a frozen prefix, which trains in eval mode), everything else as it is (eval)."""
        frozen = {id(m) for p in self._prefix_modules() for m in p.modules()} \
            if self.prefix_start else set()
        for m in self.modules():
            if isinstance(m, nn.Dropout) and id(m) not in frozen:
                m.train()

    def encoder_states(self, ids: Tensor, mask: Tensor,
                       token_types: Tensor | None = None) -> Tensor:
        """Last hidden states (S, L, H) of the encoder backbone; the frozen prefix's states come
        from `PREFIX_CACHE` when no module of it is in training mode."""
        start = self.prefix_start
        if not start or any(m.training for p in self._prefix_modules() for m in p.modules()):
            extra = {} if token_types is None else {"token_type_ids": token_types}
            return self.backbone(input_ids=ids, attention_mask=mask, **extra).last_hidden_state
        h = PREFIX_CACHE.states(self, start, ids, mask, token_types)
        return _run_blocks(self.backbone, h, mask, start, None)

    # -- properties -------------------------------------------------------------------------
    @property
    def has_moe(self) -> bool:
        """Whether the backbone carries MoE-LoRA layers (router statistics available)."""
        return self._moe

    @property
    def device(self) -> torch.device:
        return self.backbone.get_input_embeddings().weight.device

    def head_parameters(self) -> list[nn.Parameter]:
        """The scoring head's parameters (trained at ``TrainConfig.head_lr``)."""
        if self.logit_scale is not None:
            return [self.logit_scale]
        return list(self.head.parameters()) if self.head is not None else []

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]

    def describe(self) -> dict[str, Any]:
        """JSON-serialisable description used by checkpoints."""
        return {"mode": self.mode, "head_dropout": self.head_dropout, "seed": self.seed,
                "adapter": self.adapter}

    # -- encoding ---------------------------------------------------------------------------
    def encode(self, records: Sequence[MCRecord], max_length: int) -> dict[str, Tensor]:
        """Tokenize a batch of records.

        Returns
        -------
        dict with ``input_ids``, ``attention_mask`` (and ``token_type_ids`` for BERT-like
        tokenizers) of shape (S, L), right-padded to the longest sequence; ``n_choices`` (B,).
        ``S = sum(n_choices)`` (one sequence per option) except for ``letters`` where S = B.
        ``cloze`` adds ``target_mask`` (S, L) bool: the option tokens whose log-likelihood is
        scored. ``letters`` adds ``letter_ids`` (C_max,). ``bi_encoder`` encodes the B questions
        and the S options separately (``q_*`` and ``o_*`` keys, each padded to its own longest
        sequence); its ``attention_mask`` is the (B + S, L) stack of both masks, the layout of
        its router statistics (`seq_example`).
        """
        if not records:
            raise ValueError("encode: empty batch of records")
        limit = getattr(self.backbone.config, "max_position_embeddings", None)
        if limit is not None and max_length > limit:
            max_length = int(limit)
        if max_length < 8:
            raise ConfigError(f"max_length must be >= 8 tokens, got {max_length}")
        n_choices = torch.tensor([len(r.choices) for r in records], dtype=torch.long)
        if self.mode == "bi_encoder":
            batch = self._encode_separately(records, max_length)
        elif self.mode.startswith("cross_encoder"):
            batch = self._encode_pairs(records, max_length)
        elif self.mode == "cloze":
            batch = self._encode_cloze(records, max_length)
        else:
            batch = self._encode_letters(records, max_length)
        batch["n_choices"] = n_choices
        return batch

    def _encode_pairs(self, records: Sequence[MCRecord], max_length: int) -> dict[str, Tensor]:
        tok = self.tokenizer
        qs = [r.question for r in records for _ in r.choices]
        opts = [c for r in records for c in r.choices]
        try:
            enc = tok(qs, opts, truncation="only_first", max_length=max_length)
            cols = {k: list(v) for k, v in enc.items()}
        except Exception as exc:   # the tokenizers library raises a bare Exception
            if "Truncation" not in str(exc):
                raise
            # some option alone exceeds max_length: per pair, so every other pair is encoded
            # exactly as in a batch without it (encodings never depend on batch-mates)
            cols = {}
            for q, o in zip(qs, opts):
                for k, v in _encode_pair(tok, q, o, max_length).items():
                    cols.setdefault(k, []).append(v)
        out = {"input_ids": _pad(cols["input_ids"], tok.pad_token_id),
               "attention_mask": _pad(cols["attention_mask"], 0)}
        if "token_type_ids" in cols:
            out["token_type_ids"] = _pad(cols["token_type_ids"], 0)
        return out

    def _encode_separately(self, records: Sequence[MCRecord], max_length: int
                           ) -> dict[str, Tensor]:
        tok = self.tokenizer
        out: dict[str, Tensor] = {}
        for key, texts in (("q", [r.question for r in records]),
                           ("o", [c for r in records for c in r.choices])):
            enc = tok(texts, truncation=True, max_length=max_length)
            out[f"{key}_input_ids"] = _pad(enc["input_ids"], tok.pad_token_id)
            out[f"{key}_attention_mask"] = _pad(enc["attention_mask"], 0)
        qm, om = out["q_attention_mask"], out["o_attention_mask"]
        width = max(qm.shape[1], om.shape[1])
        out["attention_mask"] = torch.cat([F.pad(qm, (0, width - qm.shape[1])),
                                           F.pad(om, (0, width - om.shape[1]))])
        return out

    def seq_example(self, batch: Mapping[str, Tensor]) -> Tensor:
        """(R,) the example (row of the batch) of each row of ``batch["attention_mask"]``."""
        n_choices = batch["n_choices"]
        ex = torch.arange(n_choices.numel(), device=n_choices.device)
        if self.mode == "letters":
            return ex
        per_option = torch.repeat_interleave(ex, n_choices)
        return torch.cat([ex, per_option]) if self.mode == "bi_encoder" else per_option

    def _encode_cloze(self, records: Sequence[MCRecord], max_length: int) -> dict[str, Tensor]:
        tok = self.tokenizer
        ids, targets = [], []
        for r in records:
            prompt = tok(f"Question: {r.question}\nAnswer:")["input_ids"]
            for choice in r.choices:
                cont = tok(f" {choice}", add_special_tokens=False)["input_ids"]
                if not cont:   # an empty option: scored as ending the text
                    cont = [tok.eos_token_id if tok.eos_token_id is not None else tok.sep_token_id]
                cont = cont[:max_length // 2] if len(prompt) + len(cont) > max_length else cont
                ctx = prompt[-(max_length - len(cont)):]   # keep the end of the question
                ids.append(ctx + cont)
                targets.append([0] * len(ctx) + [1] * len(cont))
        return {"input_ids": _pad(ids, tok.pad_token_id),
                "attention_mask": _pad([[1] * len(x) for x in ids], 0),
                "target_mask": _pad(targets, 0).bool()}

    def _encode_letters(self, records: Sequence[MCRecord], max_length: int) -> dict[str, Tensor]:
        tok = self.tokenizer
        c_max = max(len(r.choices) for r in records)
        if c_max > len(LETTERS):
            raise ConfigError(f"letters mode supports at most {len(LETTERS)} choices, got {c_max}")
        ids = []
        for r in records:
            lines = "".join(f"{LETTERS[j]}. {c}\n" for j, c in enumerate(r.choices))
            prompt = tok(f"Question: {r.question}\n{lines}Answer:")["input_ids"]
            ids.append(prompt[-max_length:])   # keep the options and "Answer:" at the end
        return {"input_ids": _pad(ids, tok.pad_token_id),
                "attention_mask": _pad([[1] * len(x) for x in ids], 0),
                "letter_ids": torch.tensor(self.letter_ids()[:c_max], dtype=torch.long)}

    def letter_ids(self) -> list[int]:
        """Token ids of ``" A"``, ``" B"``, ...; each must be a single token."""
        if self._letter_ids is None:
            ids = []
            for letter in LETTERS:
                t = self.tokenizer(f" {letter}", add_special_tokens=False)["input_ids"]
                if len(t) != 1:
                    raise ConfigError(f"letters mode: the tokenizer splits ' {letter}' into "
                                      f"{len(t)} tokens; use mode='cloze'")
                ids.append(t[0])
            if len(set(ids)) != len(ids):
                raise ConfigError("letters mode: answer letters share token ids; use mode='cloze'")
            self._letter_ids = ids
        return self._letter_ids

    # -- forward ----------------------------------------------------------------------------
    def forward(self, batch: Mapping[str, Tensor]) -> Tensor:
        """Logits (B, C_max) for a batch from `encode`; absent options get `PAD_LOGIT`.

        Also sets `last_features`, the (B, H) state the head scores from, one per question:
        bi-encoder: the mean-pooled question embedding (before dropout and normalisation);
        cross-encoder: the [CLS] (``cross_encoder_cls``) or mean-pooled state of each
        (question, option) sequence, averaged over the options; cloze: the mean-pooled final
        hidden state of each option sequence, averaged over the options; letters: the final
        hidden state at the answer position (the last prompt token)."""
        dev = self.device
        n_choices = batch["n_choices"].to(dev)                            # (B,)
        if self.mode == "bi_encoder":
            return self._bi_encoder(batch, n_choices)
        ids = batch["input_ids"].to(dev)                                  # (S, L)
        mask = batch["attention_mask"].to(dev)                            # (S, L)
        if self._moe:
            from baselines.moe import set_token_mask
            set_token_mask(self.backbone, mask.bool())
        try:
            if self.mode.startswith("cross_encoder"):
                tt = batch["token_type_ids"].to(dev) if "token_type_ids" in batch else None
                h = self.encoder_states(ids, mask, tt)
                if self.mode == "cross_encoder_cls":
                    pooled = h[:, 0]                                      # (S, H)
                else:
                    pooled = _mean_pool(h, mask)                          # (S, H)
                self.last_features = _per_example(pooled.detach(), n_choices)
                scores = self.head(self.dropout(pooled)).squeeze(-1)      # (S,)
                return _scatter_choices(scores.float(), n_choices)
            h = self.backbone.base_model(input_ids=ids, attention_mask=mask).last_hidden_state
            if self.mode == "cloze":
                self.last_features = _per_example(_mean_pool(h, mask).detach(), n_choices)
                return _scatter_choices(self._cloze_scores(h, ids, batch["target_mask"].to(dev)),
                                        n_choices)
            last = mask.sum(1) - 1                                        # (B,) right padding
            h_last = h[torch.arange(h.shape[0], device=dev), last]        # (B, H)
            self.last_features = h_last.detach().float()
            letters = batch["letter_ids"].to(dev)                         # (C,)
            logits = self._lm_logits(h_last)[:, letters]                  # (B, C)
            col = torch.arange(letters.numel(), device=dev)
            return logits.masked_fill(col[None, :] >= n_choices[:, None], PAD_LOGIT)
        finally:
            if self._moe:
                set_token_mask(self.backbone, None)

    def _bi_encoder(self, batch: Mapping[str, Tensor], n_choices: Tensor) -> Tensor:
        """Two backbone calls (questions, options); with MoE-LoRA layers their statistics are
        stacked in the layout of ``batch["attention_mask"]`` and their auxiliary losses
        averaged, so readers of one forward's statistics see both calls."""
        dev = self.device
        layers = _moe_layers(self.backbone) if self._moe else []
        embs, stats, aux = [], [], []
        for key in ("q", "o"):
            ids = batch[f"{key}_input_ids"].to(dev)
            mask = batch[f"{key}_attention_mask"].to(dev)
            if layers:
                from baselines.moe import set_token_mask
                set_token_mask(self.backbone, mask.bool())
            try:
                h = self.encoder_states(ids, mask)
            finally:
                if layers:
                    set_token_mask(self.backbone, None)
            pooled = _mean_pool(h, mask)                                  # (B or S, H)
            if key == "q":
                self.last_features = pooled.detach().float()
            embs.append(F.normalize(self.dropout(pooled).float(), dim=-1))
            stats.append([layer.last_stats for layer in layers])
            aux.append([layer._aux for layer in layers])
        width = batch["attention_mask"].shape[1]
        for i, layer in enumerate(layers):
            sq, so = stats[0][i], stats[1][i]
            layer.last_stats = None if sq is None or so is None else {
                k: torch.cat([F.pad(sq[k], (0, width - sq[k].shape[1])),
                              F.pad(so[k], (0, width - so[k].shape[1]))]) for k in sq}
            terms = [a[i] for a in aux if a[i] is not None]
            layer._aux = torch.stack(terms).mean() if terms else None
        q = embs[0].repeat_interleave(n_choices, dim=0)                   # (S, H)
        assert self.logit_scale is not None
        scores = self.logit_scale.exp() * (q * embs[1]).sum(-1)           # (S,)
        return _scatter_choices(scores, n_choices)

    def _lm_logits(self, h: Tensor) -> Tensor:
        """Vocabulary logits (float32) from final hidden states (..., H) through the LM head."""
        logits = self.backbone.get_output_embeddings()(h).float()
        cap = getattr(self.backbone.config, "final_logit_softcapping", None)
        return torch.tanh(logits / cap) * cap if cap else logits

    def _cloze_scores(self, h: Tensor, ids: Tensor, target: Tensor) -> Tensor:
        """Mean log p(option tokens | prompt) per sequence: (S, L, H) -> (S,)."""
        # token t is predicted from position t-1: only the scored positions go through the head
        pred_pos = target[:, 1:]                                          # (S, L-1)
        rows, cols = pred_pos.nonzero(as_tuple=True)                      # (K,), (K,)
        logp = F.log_softmax(self._lm_logits(h[rows, cols]), dim=-1)      # (K, V)
        tok_logp = logp.gather(1, ids[rows, cols + 1].unsqueeze(1)).squeeze(1)  # (K,)
        total = torch.zeros(ids.shape[0], device=h.device).index_add(0, rows, tok_logp)
        return total / pred_pos.sum(1).clamp_min(1)


def _infer_adapter(backbone: Backbone) -> dict[str, Any]:
    """The adapter description of a backbone injected by hand (``moe.inject`` then this class)."""
    layers = adapter_layers(backbone.model)
    if not layers:
        return {"type": "none", "config": {}}
    config = getattr(backbone.model, "moe_lora_config", None)
    if config is not None and _moe_layers(backbone.model):
        return {"type": "moe", "config": config.to_dict()}
    raise ConfigError(f"backbone {backbone.name!r} carries adapter layers ({layers[0]}, ...) that "
                      "MultipleChoiceModel cannot describe for checkpoints; build dense adapters "
                      "with baselines.dense.make_dense and MoE-LoRA with make_moe")


def _moe_layers(model: nn.Module) -> list[nn.Module]:
    from baselines.moe import moe_layers
    return list(moe_layers(model))


def _prepare(backbone: Backbone, copy: bool) -> Backbone:
    bb = backbone.clone() if copy else backbone
    existing = adapter_layers(bb.model)
    if existing:
        raise ValueError(
            f"backbone {bb.name!r} already carries adapter layers ({existing[0]}, ...); build "
            "each model on a fresh backbone: pass copy=True or load_backbone() again"
        )
    return bb


def make_moe(backbone: Backbone, config: Any = None, *, mode: str = "auto",
             head_dropout: float = 0.1, seed: int = 0, copy: bool = True) -> MultipleChoiceModel:
    """A MoE-LoRA multiple-choice model: inject experts + routers, add the head.

    Parameters
    ----------
    backbone : Backbone
    config : baselines.moe.MoELoRAConfig, optional
        Defaults to ``MoELoRAConfig()`` (16 experts of rank 8, top-4 in training).
    mode, head_dropout, seed : see `MultipleChoiceModel`.
    copy : bool
        Inject into a clone of the backbone (default), leaving ``backbone`` reusable.

    Trainable: experts and routers (``inject`` freezes the backbone) and the scoring head.
    """
    from baselines.moe import MoELoRAConfig, inject

    config = MoELoRAConfig() if config is None else config
    bb = _prepare(backbone, copy)
    inject(bb.model, config)
    return MultipleChoiceModel(bb, mode=mode, head_dropout=head_dropout, seed=seed,
                               adapter={"type": "moe", "config": config.to_dict()})


def make_plain(backbone: Backbone, *, mode: str = "auto", head_dropout: float = 0.1,
               seed: int = 0, copy: bool = True) -> MultipleChoiceModel:
    """A head-only model on the frozen backbone (no adapter): a floor for the baselines."""
    return MultipleChoiceModel(_prepare(backbone, copy), mode=mode, head_dropout=head_dropout,
                               seed=seed)


__all__ = ["HEAD_MODES", "PREFIX_CACHE", "MultipleChoiceModel", "PrefixCache", "adapter_layers",
           "make_moe", "make_plain"]
