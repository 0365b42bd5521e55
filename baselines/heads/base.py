"""The interface of a scoring head, and the tensor helpers the heads share.

A head is a strategy held by `baselines.heads.MultipleChoiceModel` (``model.scoring``): it
turns records into a batch (`Head.encode`), scores a batch into logits (B, C_max) plus the
per-question features (`Head.scores`), and says which example each sequence of a batch belongs
to (`Head.seq_example`). Its trainable modules live on the model under fixed names (``dropout``,
``head``, ``logit_scale``), the names checkpoints store; the head object itself holds none.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import torch
from torch import Tensor, nn

from uqbench.core.outputs import PAD_LOGIT
from uqbench.data.records import MCRecord

if TYPE_CHECKING:
    from baselines.moe.layer import MoELoRALinear


class HeadedModel(Protocol):
    """What heads and the prefix cache use of `baselines.heads.MultipleChoiceModel` (typing
    only: the model's module imports the heads, never the other way round)."""

    #: the Hugging Face model; ``Any``: the submodules used (``embeddings``, ``encoder.layer``,
    #: ``base_model``) vary by architecture, which ``nn.Module`` does not type
    backbone: Any
    identity: dict[str, Any]
    head: nn.Linear | None
    logit_scale: nn.Parameter | None
    dropout: nn.Module

    @property
    def device(self) -> torch.device: ...

    def encoder_states(self, ids: Tensor, mask: Tensor,
                       token_types: Tensor | None = None) -> Tensor: ...

    def routing_mask(self, mask: Tensor) -> AbstractContextManager[None]: ...

    def moe_layers(self) -> list[MoELoRALinear]: ...


#: ``batch["cut"]`` per question: what truncation to ``max_length`` cut from its input
CUT_NONE, CUT_QUESTION, CUT_OPTION = 0, 1, 2


def cut_codes(question_cut: Sequence[bool], option_cut: Sequence[bool]) -> Tensor:
    """(B,) int8: `CUT_OPTION` where some option text was cut (the model never saw all of
    it), else `CUT_QUESTION` where question text was, else `CUT_NONE`."""
    return torch.tensor([CUT_OPTION if o else CUT_QUESTION if q else CUT_NONE
                         for q, o in zip(question_cut, option_cut, strict=False)], dtype=torch.int8)


def per_question_flags(flags: Sequence[bool], records: Sequence[MCRecord]) -> list[bool]:
    """Per-option flags (records' options in order) -> per question: any of its options."""
    out, i = [], 0
    for r in records:
        out.append(any(flags[i:i + len(r.choices)]))
        i += len(r.choices)
    return out


def pad_rows(rows: Sequence[Sequence[int]], value: int) -> Tensor:
    """Right-pad lists of ints into a (len(rows), max_len) long tensor."""
    width = max(len(r) for r in rows)
    out = torch.full((len(rows), width), value, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, :len(r)] = torch.as_tensor(r, dtype=torch.long)
    return out


def mean_pool(h: Tensor, mask: Tensor) -> Tensor:
    """(S, L, H) token states -> (S, H) mean over the non-padding tokens of ``mask`` (S, L)."""
    m = mask.unsqueeze(-1).to(h.dtype)
    return (h * m).sum(1) / m.sum(1).clamp_min(1.0)


def per_example_mean(states: Tensor, n_choices: Tensor) -> Tensor:
    """(S, H) states of the option sequences -> (B, H) float32 mean over each example's (the
    output size given: nothing read back from the device)."""
    ex = torch.arange(n_choices.numel(), device=states.device)
    ex = torch.repeat_interleave(ex, n_choices, output_size=states.shape[0])
    total = states.new_zeros((n_choices.numel(), states.shape[1]), dtype=torch.float32)
    return total.index_add_(0, ex, states.float()) / n_choices[:, None].float()


def scatter_choices(scores: Tensor, n_choices: Tensor, slots: Tensor) -> Tensor:
    """(S,) scores of the real options, S = sum(n_choices) -> (B, C_max), PAD_LOGIT elsewhere;
    ``slots`` is the batch's ``choice_slot`` (C_max,) (0, 1, ..., C_max - 1), on the device."""
    present = slots[None, :] < n_choices[:, None]                        # (B, C)
    first = torch.cumsum(n_choices, 0) - n_choices                       # (B,) its first row
    rows = (first[:, None] + slots[None, :]).clamp_max(scores.shape[0] - 1)
    # a gather, not masked_scatter: that one's backward sizes its output from the mask's count
    return torch.where(present, scores[rows], PAD_LOGIT)


class Head:
    """One way of scoring the options of a multiple-choice question.

    Subclasses set `name` (the ``mode`` of `MultipleChoiceModel`, stored in checkpoints) and
    `kind` (the backbone kind they fit), and implement `encode` and either `scores` or
    `score_sequences` (one backbone call on ``input_ids``/``attention_mask``).
    """

    name: ClassVar[str]
    #: the backbone kind the head fits: "encoder" or "decoder"
    kind: ClassVar[str]
    #: "" when the frozen backbone answers through the head untrained, with no parameter of its
    #: own to learn (a run's ``zero-shot`` reference row: `baselines.engine.TorchEngine.zero_shot`);
    #: else why it cannot, which run.json and the report give
    no_zero_shot: ClassVar[str] = "the head does not declare that it answers untrained"

    def add_modules(self, model: HeadedModel, hidden: int, like: Tensor, seed: int,
                    dropout: float) -> None:
        """Register the head's trainable modules on ``model`` (none by default). ``like`` is the
        input embedding weight (device and dtype of new layers)."""

    def parameters(self, model: HeadedModel) -> list[nn.Parameter]:
        """The head's parameters on ``model`` (trained at ``TrainConfig.head_lr``)."""
        return []

    def encode(self, tok: Any, records: Sequence[MCRecord], max_length: int
               ) -> dict[str, Tensor]:
        """Tokenize a non-empty batch (``n_choices`` is added by the model)."""
        raise NotImplementedError

    def batch_cost(self, n_choices: int) -> int:
        """How many sequences a question of ``n_choices`` options counts for when
        `baselines.forward.plan_batches` fills a batch: one per option."""
        return n_choices

    def seq_example(self, n_choices: Tensor) -> Tensor:
        """(R,) the example of each row of the batch's ``attention_mask``: one per option."""
        ex = torch.arange(n_choices.numel(), device=n_choices.device)
        return torch.repeat_interleave(ex, n_choices)

    def scores(self, model: HeadedModel, batch: Mapping[str, Tensor], n_choices: Tensor
               ) -> tuple[Tensor, Tensor]:
        """(logits (B, C_max) with `PAD_LOGIT` at absent options, features (B, H) float32, the
        state the head scores from, one per question). By default one backbone call on the
        batch's sequences, MoE-LoRA routing told the token mask."""
        dev = model.device
        ids = batch["input_ids"].to(dev)                                  # (S, L)
        mask = batch["attention_mask"].to(dev)                            # (S, L)
        with model.routing_mask(mask):
            return self.score_sequences(model, batch, ids, mask, n_choices)

    def score_sequences(self, model: HeadedModel, batch: Mapping[str, Tensor],
                        ids: Tensor, mask: Tensor, n_choices: Tensor) -> tuple[Tensor, Tensor]:
        """`scores` of the ``ids`` (S, L) with padding ``mask`` (S, L), on the model's device."""
        raise NotImplementedError
