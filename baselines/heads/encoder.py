"""Heads of encoder backbones: the bi-encoder and the cross-encoders."""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from baselines.heads.base import (
    Head,
    HeadedModel,
    cut_codes,
    mean_pool,
    pad_rows,
    per_example_mean,
    per_question_flags,
    scatter_choices,
)
from baselines.moe import trainable_dtype
from uqbench.data.records import MCRecord

#: initial ``exp(logit_scale)`` of the bi-encoder head
BI_ENCODER_SCALE = 20.0


def _encode_pair(tok: Any, question: str, option: str, max_length: int) -> Any:
    """One pair, question truncated first; ``longest_first`` when the option alone is too long."""
    try:
        return tok(question, option, truncation="only_first", max_length=max_length)
    except Exception as exc:   # the tokenizers library raises a bare Exception
        if "Truncation" not in str(exc):
            raise
        # the option alone is too long: it is cut too, which `encode` reports in batch["cut"]
        # (CUT_OPTION) and the engine records in run.json ``fallbacks``, with a warning
        return tok(question, option, truncation="longest_first", max_length=max_length)


class EncoderHead(Head):
    """An encoder head: ``dropout`` (an ``nn.Dropout`` on the model, so MC dropout samples it)
    before the score."""

    kind = "encoder"

    def add_modules(self, model: HeadedModel, hidden: int, like: Tensor, seed: int,
                    dropout: float) -> None:
        model.dropout = nn.Dropout(dropout)


class BiEncoder(EncoderHead):
    """``bi_encoder`` (the default for encoders, chosen by the recipe search in docs/recipe.md).

    The question and each option are encoded separately (the question once, not once per
    option), mean-pooled over non-padding tokens (the sentence-transformers pooling that
    all-MiniLM-L6-v2 and all-mpnet-base-v2 were trained with), passed through ``dropout`` and
    L2-normalised; an option's score is ``exp(logit_scale) * cos(question, option)`` with a
    learned temperature (initialised at scale 20, sentence-transformers' contrastive scale). It
    starts from what the sentence-embedding space already knows and has one parameter,
    ``model.logit_scale``. Features: the mean-pooled question embedding (before dropout and
    normalisation).

    The batch holds the B questions and the S options separately (``q_*`` and ``o_*`` keys, each
    padded to its own longest sequence); its ``attention_mask`` is the (B + S, L) stack of both
    masks, the layout of its router statistics (`seq_example`).
    """

    name = "bi_encoder"
    no_zero_shot = ("untrained, the bi-encoder ranks options by how similar their sentence "
                    "embedding is to the question's: a relatedness the backbone was trained for, "
                    "not its answer (a decoder head reads the language model's own)")

    def add_modules(self, model: HeadedModel, hidden: int, like: Tensor, seed: int,
                    dropout: float) -> None:
        super().add_modules(model, hidden, like, seed, dropout)
        model.logit_scale = nn.Parameter(torch.tensor(math.log(BI_ENCODER_SCALE),
                                                      device=like.device, dtype=torch.float32))

    def parameters(self, model: HeadedModel) -> list[nn.Parameter]:
        assert model.logit_scale is not None
        return [model.logit_scale]

    def encode(self, tok: Any, records: Sequence[MCRecord], max_length: int
               ) -> dict[str, Tensor]:
        out: dict[str, Tensor] = {}
        cut = {}
        for key, texts in (("q", [r.question for r in records]),
                           ("o", [c for r in records for c in r.choices])):
            enc = tok(texts, truncation=True, max_length=max_length)
            out[f"{key}_input_ids"] = pad_rows(enc["input_ids"], tok.pad_token_id)
            out[f"{key}_attention_mask"] = pad_rows(enc["attention_mask"], 0)
            cut[key] = [len(ids) > max_length for ids in tok(texts, verbose=False)["input_ids"]]
        out["cut"] = cut_codes(cut["q"], per_question_flags(cut["o"], records))
        qm, om = out["q_attention_mask"], out["o_attention_mask"]
        width = max(qm.shape[1], om.shape[1])
        out["attention_mask"] = torch.cat([F.pad(qm, (0, width - qm.shape[1])),
                                           F.pad(om, (0, width - om.shape[1]))])
        return out

    def seq_example(self, n_choices: Tensor) -> Tensor:
        ex = torch.arange(n_choices.numel(), device=n_choices.device)
        return torch.cat([ex, super().seq_example(n_choices)])

    def scores(self, model: HeadedModel, batch: Mapping[str, Tensor], n_choices: Tensor
               ) -> tuple[Tensor, Tensor]:
        """Two backbone calls (questions, options); with MoE-LoRA layers their statistics are
        stacked in the layout of ``batch["attention_mask"]`` and their auxiliary losses
        averaged, so readers of one forward's statistics see both calls."""
        dev = model.device
        layers = model.moe_layers()
        embs, stats, aux, features = [], [], [], None
        for key in ("q", "o"):
            ids = batch[f"{key}_input_ids"].to(dev)
            mask = batch[f"{key}_attention_mask"].to(dev)
            with model.routing_mask(mask):
                h = model.encoder_states(ids, mask)
            pooled = mean_pool(h, mask)                                  # (B or S, H)
            if key == "q":
                features = pooled.detach().float()
            embs.append(F.normalize(model.dropout(pooled).float(), dim=-1))
            stats.append([layer.last_stats for layer in layers])
            aux.append([layer.last_aux for layer in layers])
        width = batch["attention_mask"].shape[1]
        for i, layer in enumerate(layers):
            sq, so = stats[0][i], stats[1][i]
            layer.last_stats = None if sq is None or so is None else {
                k: torch.cat([F.pad(sq[k], (0, width - sq[k].shape[1])),
                              F.pad(so[k], (0, width - so[k].shape[1]))]) for k in sq}
            terms = [t for a in aux if (t := a[i]) is not None]
            layer.last_aux = torch.stack(terms).mean() if terms else None
        q = embs[0].repeat_interleave(n_choices, dim=0, output_size=embs[1].shape[0])  # (S, H)
        assert model.logit_scale is not None and features is not None
        scores = model.logit_scale.exp() * (q * embs[1]).sum(-1)          # (S,)
        return scatter_choices(scores, n_choices, batch["choice_slot"].to(dev)), features


class CrossEncoder(EncoderHead):
    """``cross_encoder``: each (question, option) pair is one sequence
    ``[CLS] question [SEP] option [SEP]``; the question is truncated first (``only_first``;
    ``longest_first`` for a pair whose option alone is too long). Token states are mean-pooled
    over non-padding tokens, then ``dropout -> head`` gives the option's score, ``model.head`` a
    ``Linear(hidden, 1, bias=False)`` (the softmax over choices is shift-invariant: a bias would
    get zero gradient) initialised from ``seed`` with BERT's initializer_range. Features: the
    pooled state of each pair, averaged over the question's options."""

    name = "cross_encoder"
    no_zero_shot = "its scoring layer is new (random before training): untrained it guesses"

    def add_modules(self, model: HeadedModel, hidden: int, like: Tensor, seed: int,
                    dropout: float) -> None:
        super().add_modules(model, hidden, like, seed, dropout)
        model.head = nn.Linear(hidden, 1, bias=False, device=like.device,
                               dtype=trainable_dtype(like.dtype))
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():   # BERT's initializer_range
            model.head.weight.copy_(torch.randn(model.head.weight.shape, generator=gen) * 0.02)

    def parameters(self, model: HeadedModel) -> list[nn.Parameter]:
        assert model.head is not None
        return list(model.head.parameters())

    def encode(self, tok: Any, records: Sequence[MCRecord], max_length: int
               ) -> dict[str, Tensor]:
        qs = [r.question for r in records for _ in r.choices]
        opts = [c for r in records for c in r.choices]
        try:
            enc = tok(qs, opts, truncation="only_first", max_length=max_length)
            cols = {k: list(v) for k, v in enc.items()}
        except Exception as exc:   # the tokenizers library raises a bare Exception
            if "Truncation" not in str(exc):
                raise
            # some option alone exceeds max_length: per pair, so every other pair is encoded
            # exactly as in a batch without it (encodings never depend on batch-mates); the
            # cut options are reported in batch["cut"] and recorded in run.json ``fallbacks``
            cols = {}
            for q, o in zip(qs, opts, strict=False):
                for k, v in _encode_pair(tok, q, o, max_length).items():
                    cols.setdefault(k, []).append(v)
        # lengths untruncated: each question tokenized once, not once per option
        special = tok.num_special_tokens_to_add(pair=True)
        q_len = [len(ids) for ids in tok([r.question for r in records], add_special_tokens=False,
                                         verbose=False)["input_ids"]]
        o_len = [len(ids) for ids in tok(opts, add_special_tokens=False,
                                         verbose=False)["input_ids"]]
        q_of = [n for r, n in zip(records, q_len, strict=False) for _ in r.choices]
        pair_cut = [q + o + special > max_length for q, o in zip(q_of, o_len, strict=False)]
        option_cut = [o + special > max_length for o in o_len]
        out = {
            "input_ids": pad_rows(cols["input_ids"], tok.pad_token_id),
            "attention_mask": pad_rows(cols["attention_mask"], 0),
            "cut": cut_codes(
                per_question_flags(pair_cut, records), per_question_flags(option_cut, records)
            ),
        }
        if "token_type_ids" in cols:
            out["token_type_ids"] = pad_rows(cols["token_type_ids"], 0)
        return out

    def pool(self, h: Tensor, mask: Tensor) -> Tensor:
        """(S, L, H) token states -> (S, H): the mean over non-padding tokens."""
        return mean_pool(h, mask)

    def score_sequences(self, model: HeadedModel, batch: Mapping[str, Tensor],
                        ids: Tensor, mask: Tensor, n_choices: Tensor) -> tuple[Tensor, Tensor]:
        tt = batch["token_type_ids"].to(ids.device) if "token_type_ids" in batch else None
        pooled = self.pool(model.encoder_states(ids, mask, tt), mask)     # (S, H)
        features = per_example_mean(pooled.detach(), n_choices)
        assert model.head is not None
        pooled = pooled.to(model.head.weight.dtype)   # float32 on a 16-bit backbone
        scores = model.head(model.dropout(pooled)).squeeze(-1)            # (S,)
        slots = batch["choice_slot"].to(ids.device)
        return scatter_choices(scores.float(), n_choices, slots), features


class CrossEncoderCLS(CrossEncoder):
    """``cross_encoder_cls``: `CrossEncoder` with the ``[CLS]`` state instead of the mean."""

    name = "cross_encoder_cls"

    def pool(self, h: Tensor, mask: Tensor) -> Tensor:
        return h[:, 0]
