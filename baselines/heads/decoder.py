"""Heads of decoder backbones: cloze and letters (no extra parameters)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from baselines.heads.base import (
    Head,
    HeadedModel,
    cut_codes,
    mean_pool,
    pad_rows,
    per_example_mean,
    scatter_choices,
)
from uqbench.core.errors import ConfigError
from uqbench.core.outputs import PAD_LOGIT
from uqbench.data.records import MCRecord

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def cloze_prompt(record: MCRecord) -> str:
    """The text before each option of `Cloze` (the option follows as ``" " + option``)."""
    return f"Question: {record.question}\nAnswer:"


def _letter_lines(choices: Sequence[str]) -> str:
    return "".join(f"{LETTERS[j]}. {c}\n" for j, c in enumerate(choices))


def letters_prompt(record: MCRecord) -> str:
    """The one text of `Letters`: the question, its lettered options, ``"Answer:"``."""
    return f"Question: {record.question}\n{_letter_lines(record.choices)}Answer:"


def _token_rows(tok: Any, ids: list[list[int]]) -> dict[str, Tensor]:
    """``input_ids`` and ``attention_mask`` (S, L) of unpadded token rows, right-padded."""
    return {"input_ids": pad_rows(ids, tok.pad_token_id),
            "attention_mask": pad_rows([[1] * len(x) for x in ids], 0)}


def _lm_logits(model: HeadedModel, h: Tensor) -> Tensor:
    """Vocabulary logits (float32) from final hidden states (..., H) through the LM head."""
    logits = model.backbone.get_output_embeddings()(h).float()
    cap = getattr(model.backbone.config, "final_logit_softcapping", None)
    return torch.tanh(logits / cap) * cap if cap else logits


#: decoders that take a 4D attention mask as it is and read nothing else from it (transformers'
#: Llama family; GPT-2 reshapes the mask to 2D, Falcon and BLOOM build ALiBi from it)
MASK_4D_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2"})


def attention_mask(config: Any, mask: Tensor) -> Tensor:
    """What a decoder call is given as its attention mask for the right-padded ``mask`` (S, L).

    Under sdpa attention, the (S, 1, L, L) bool mask, causal and without the padded keys, that
    transformers builds for sdpa itself when a batch has padding. Given the 2D mask, transformers
    first reads whether it is all ones, to leave the mask out and use sdpa's ``is_causal``: a
    read that waits for the device (twice a call), cannot be captured in a CUDA graph, and makes a
    compiled block see two kinds of batch (with and without a mask). These get the 2D mask:
    other attention implementations (their own mask formats), decoders outside
    `MASK_4D_MODEL_TYPES`, and a model whose layers attend within a window (``sliding_window``,
    ``attention_chunk_size``) shorter than the batch (a mask per layer kind)."""
    L = mask.shape[1]
    windows = [getattr(config, k, None) for k in ("sliding_window", "attention_chunk_size")]
    if (getattr(config, "_attn_implementation", None) != "sdpa"
            or getattr(config, "model_type", None) not in MASK_4D_MODEL_TYPES
            or any(w is not None and w < L for w in windows)):
        return mask
    causal = torch.ones(L, L, dtype=torch.bool, device=mask.device).tril_()
    return causal & mask.bool()[:, None, None, :]


class DecoderHead(Head):
    """A decoder head: scores from the final hidden states of one backbone call."""

    kind = "decoder"
    no_zero_shot = ""   # the language model's own next-token scores: no new parameter

    def score_sequences(self, model: HeadedModel, batch: Mapping[str, Tensor],
                        ids: Tensor, mask: Tensor, n_choices: Tensor) -> tuple[Tensor, Tensor]:
        h = model.backbone.base_model(
            input_ids=ids, attention_mask=attention_mask(model.backbone.config, mask),
            use_cache=False).last_hidden_state
        return self.score_states(model, batch, h, ids, mask, n_choices)

    def score_states(self, model: HeadedModel, batch: Mapping[str, Tensor], h: Tensor,
                     ids: Tensor, mask: Tensor, n_choices: Tensor) -> tuple[Tensor, Tensor]:
        """`Head.scores` from the final hidden states ``h`` (S, L, H)."""
        raise NotImplementedError


class Cloze(DecoderHead):
    """``cloze``: score of an option = mean log-likelihood of its tokens given
    ``"Question: q\\nAnswer:"`` (length-normalised, as lm-evaluation-harness' ``acc_norm`` by
    tokens). The batch adds ``target_mask`` (S, L) bool: the option tokens scored. Features: the
    mean-pooled final hidden state of each option sequence, averaged over the options."""

    name = "cloze"

    def encode(self, tok: Any, records: Sequence[MCRecord], max_length: int
               ) -> dict[str, Tensor]:
        ids, targets, q_cut, o_cut = [], [], [], []
        for r in records:
            prompt = tok(cloze_prompt(r))["input_ids"]
            q_cut.append(False)
            o_cut.append(False)
            for choice in r.choices:
                full = tok(f" {choice}", add_special_tokens=False)["input_ids"]
                if not full:   # an empty option: scored as ending the text
                    full = [tok.eos_token_id if tok.eos_token_id is not None else tok.sep_token_id]
                cont = full[:max_length // 2] if len(prompt) + len(full) > max_length else full
                ctx = prompt[-(max_length - len(cont)):]   # keep the end of the question
                ids.append(ctx + cont)
                targets.append([0] * len(ctx) + [1] * len(cont))
                q_cut[-1] |= len(ctx) < len(prompt)
                o_cut[-1] |= len(cont) < len(full)
        target = pad_rows(targets, 0).bool()
        row, col = target.nonzero(as_tuple=True)    # here, on the host: the step reads nothing
        return {**_token_rows(tok, ids), "target_mask": target, "target_row": row,
                "target_col": col, "cut": cut_codes(q_cut, o_cut)}

    def score_states(self, model: HeadedModel, batch: Mapping[str, Tensor], h: Tensor,
                     ids: Tensor, mask: Tensor, n_choices: Tensor) -> tuple[Tensor, Tensor]:
        dev = ids.device
        features = per_example_mean(mean_pool(h, mask).detach(), n_choices)
        # the K scored tokens (row, col), col >= 1 (a prompt comes first); token t is predicted
        # from position t-1: only those positions go through the head
        rows, cols = batch["target_row"].to(dev), batch["target_col"].to(dev)   # (K,), (K,)
        logp = F.log_softmax(_lm_logits(model, h[rows, cols - 1]), dim=-1)    # (K, V)
        tok_logp = logp.gather(1, ids[rows, cols].unsqueeze(1)).squeeze(1)     # (K,)
        total = torch.zeros(ids.shape[0], device=dev).index_add(0, rows, tok_logp)
        count = batch["target_mask"].to(dev).sum(1).clamp_min(1)            # (S,)
        return scatter_choices(total / count, n_choices, batch["choice_slot"].to(dev)), features


class Letters(DecoderHead):
    """``letters`` (the default for decoders): one sequence per question listing the lettered
    options, ending in ``"Answer:"``; the logits of the tokens ``" A"``, ``" B"``, ... at the last
    position. One sequence per question, so C times cheaper than ``cloze``. The batch adds
    ``letter_ids`` (C_max,). Features: the final hidden state at the answer position (the last
    prompt token)."""

    name = "letters"

    def __init__(self) -> None:
        self._letter_ids: list[int] | None = None

    def letter_ids(self, tok: Any) -> list[int]:
        """Token ids of ``" A"``, ``" B"``, ...; each must be a single token."""
        if self._letter_ids is None:
            ids = []
            for letter in LETTERS:
                t = tok(f" {letter}", add_special_tokens=False)["input_ids"]
                if len(t) != 1:
                    raise ConfigError(f"letters mode: the tokenizer splits ' {letter}' into "
                                      f"{len(t)} tokens; use mode='cloze'")
                ids.append(t[0])
            if len(set(ids)) != len(ids):
                raise ConfigError("letters mode: answer letters share token ids; use mode='cloze'")
            self._letter_ids = ids
        return self._letter_ids

    def encode(self, tok: Any, records: Sequence[MCRecord], max_length: int
               ) -> dict[str, Tensor]:
        c_max = max(len(r.choices) for r in records)
        if c_max > len(LETTERS):
            raise ConfigError(f"letters mode supports at most {len(LETTERS)} choices, got {c_max}")
        ids, q_cut, o_cut = [], [], []
        for r in records:
            prompt = tok(letters_prompt(r))["input_ids"]
            ids.append(prompt[-max_length:])   # keep the options and "Answer:" at the end
            q_cut.append(len(prompt) > max_length)
            # the options' text (tokenized alone: +-1 token at the seam) did not all fit
            lines = f"{_letter_lines(r.choices)}Answer:"
            o_cut.append(len(tok(lines, add_special_tokens=False)["input_ids"]) > max_length)
        return {**_token_rows(tok, ids), "cut": cut_codes(q_cut, o_cut),
                "letter_ids": torch.tensor(self.letter_ids(tok)[:c_max], dtype=torch.long)}

    def batch_cost(self, n_choices: int) -> int:
        return 1

    def seq_example(self, n_choices: Tensor) -> Tensor:
        return torch.arange(n_choices.numel(), device=n_choices.device)

    def score_states(self, model: HeadedModel, batch: Mapping[str, Tensor], h: Tensor,
                     ids: Tensor, mask: Tensor, n_choices: Tensor) -> tuple[Tensor, Tensor]:
        dev = ids.device
        last = mask.sum(1) - 1                                            # (B,) right padding
        h_last = h[torch.arange(h.shape[0], device=dev), last]            # (B, H)
        letters = batch["letter_ids"].to(dev)                             # (C,)
        logits = _lm_logits(model, h_last)[:, letters]                    # (B, C)
        col = batch["choice_slot"].to(dev)                                # (C,)
        return (logits.masked_fill(col[None, :] >= n_choices[:, None], PAD_LOGIT),
                h_last.detach().float())
