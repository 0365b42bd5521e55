"""`MultipleChoiceModel`: a frozen backbone plus a scoring head (`baselines.heads.HEADS`),
one score per option -> logits (B, C); and the builders `make_moe`, `make_plain`."""
from __future__ import annotations

import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from baselines.backbones import Backbone
from baselines.heads.prefix import PREFIX_CACHE, encoder_attention_mask, run_blocks
from baselines.heads.registry import DEFAULT_HEADS, HEADS, head_class, heads_for
from uqbench.core.errors import ConfigError
from uqbench.data.records import MCRecord

if TYPE_CHECKING:
    from baselines.moe.layer import MoELoRALinear


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
        Dropout before the scoring head (encoder heads only; an ``nn.Dropout``, so MC dropout
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
    dropout : ``nn.Dropout(head_dropout)`` (encoder modes only).
    scoring : `baselines.heads.Head`, the head ``head_class(mode)()`` that encodes and scores.
    """
    #: the Hugging Face model (``Any``: see `baselines.heads.base.HeadedModel`)
    backbone: Any
    #: set by the head's ``add_modules``
    dropout: nn.Module

    def __init__(self, backbone: Backbone, *, mode: str = "auto", head_dropout: float = 0.1,
                 seed: int = 0, adapter: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        if mode == "auto":
            mode = DEFAULT_HEADS[backbone.kind]
        if mode not in HEADS:
            raise ConfigError(
                f"head mode {mode!r} unknown; valid: auto, {', '.join(HEADS.names())}"
            )
        if HEADS.get(mode).kind != backbone.kind:
            raise ConfigError(f"head mode {mode!r} does not fit {backbone.kind} backbone "
                              f"{backbone.name!r}; use {' or '.join(heads_for(backbone.kind))}")
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
        self.head: nn.Linear | None = None
        self.logit_scale: nn.Parameter | None = None
        #: the scoring head (a strategy; its modules are the attributes above and ``dropout``)
        self.scoring = head_class(mode)()
        self.scoring.add_modules(self, int(self.identity["hidden_size"]),
                                 self.backbone.get_input_embeddings().weight, seed, head_dropout)
        self._moe = bool(_moe_layers(self.backbone))
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

    def prefix_modules(self) -> list[nn.Module]:
        """The modules of the frozen prefix: the embeddings and the first `prefix_start` blocks."""
        bert = self.backbone
        return [bert.embeddings, *bert.encoder.layer[:self.prefix_start]]

    def train(self, mode: bool = True) -> MultipleChoiceModel:
        """As ``nn.Module.train``, but a frozen prefix (`prefix_start` > 0) stays in eval mode:
        it has nothing to learn, and in eval mode its states are the cached ones. MC-dropout
        samples dropout where training did (`mc_dropout_on`), so it reads the cached states too."""
        super().train(mode)
        if self.prefix_start:
            for m in self.prefix_modules():
                m.eval()
        return self

    def mc_dropout_on(self) -> None:
        """MC-dropout: every ``nn.Dropout`` that training samples in train mode (all but those of
        a frozen prefix, which trains in eval mode), everything else as it is (eval)."""
        frozen = {id(m) for p in self.prefix_modules() for m in p.modules()} \
            if self.prefix_start else set()
        for m in self.modules():
            if isinstance(m, nn.Dropout) and id(m) not in frozen:
                m.train()

    def encoder_states(self, ids: Tensor, mask: Tensor,
                       token_types: Tensor | None = None) -> Tensor:
        """Last hidden states (S, L, H) of the encoder backbone; the frozen prefix's states come
        from `PREFIX_CACHE` when no module of it is in training mode."""
        start = self.prefix_start
        if not start or any(m.training for p in self.prefix_modules() for m in p.modules()):
            extra = {} if token_types is None else {"token_type_ids": token_types}
            att = encoder_attention_mask(self.backbone.config, mask)
            return self.backbone(input_ids=ids, attention_mask=att, **extra).last_hidden_state
        h = PREFIX_CACHE.states(self, start, ids, mask, token_types)
        return run_blocks(self.backbone, h, mask, start, None)

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
        return self.scoring.parameters(self)

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
        tokenizers) of shape (S, L), right-padded to the longest sequence; ``n_choices`` (B,);
        ``choice_slot`` (C_max,), 0 to C_max - 1: the logits' columns, carried as a shape so
        that no head reads C_max back from the device.
        ``S = sum(n_choices)`` (one sequence per option) except for ``letters`` where S = B.
        ``cloze`` adds ``target_mask`` (S, L) bool, the option tokens whose log-likelihood is
        scored, and their positions ``target_row`` and ``target_col`` (K,). ``letters`` adds
        ``letter_ids`` (C_max,). ``bi_encoder`` encodes the B questions and the S options
        separately (``q_*`` and ``o_*`` keys, each padded to its own longest
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
        batch = self.scoring.encode(self.tokenizer, records, max_length)
        batch["n_choices"] = n_choices
        batch["choice_slot"] = torch.arange(int(n_choices.max()))
        return batch

    def seq_example(self, batch: Mapping[str, Tensor]) -> Tensor:
        """(R,) the example (row of the batch) of each row of ``batch["attention_mask"]``."""
        return self.scoring.seq_example(batch["n_choices"])

    # -- forward ----------------------------------------------------------------------------
    def forward(self, batch: Mapping[str, Tensor]) -> Tensor:
        """Logits (B, C_max) for a batch from `encode`; absent options get `PAD_LOGIT`.

        Also sets `last_features`, the (B, H) float32 state the head scores from, one per
        question (see each head's docstring in `baselines.heads`)."""
        n_choices = batch["n_choices"].to(self.device)                    # (B,)
        logits, self.last_features = self.scoring.scores(self, batch, n_choices)
        return logits

    @contextmanager
    def routing_mask(self, mask: Tensor) -> Iterator[None]:
        """Within the block, MoE-LoRA layers (if any) know the token ``mask`` (S, L): padding is
        excluded from routing statistics and the load-balancing loss."""
        if not self._moe:
            yield
            return
        from baselines.moe import set_token_mask
        set_token_mask(self.backbone, mask.bool())
        try:
            yield
        finally:
            set_token_mask(self.backbone, None)

    def moe_layers(self) -> list[MoELoRALinear]:
        """The backbone's MoE-LoRA layers ([] without)."""
        return _moe_layers(self.backbone) if self._moe else []



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


def _moe_layers(model: nn.Module) -> list[MoELoRALinear]:
    from baselines.moe import moe_layers
    return list(moe_layers(model))


def prepare_backbone(backbone: Backbone, copy: bool) -> Backbone:
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
    bb = prepare_backbone(backbone, copy)
    inject(bb.model, config)
    return MultipleChoiceModel(bb, mode=mode, head_dropout=head_dropout, seed=seed,
                               adapter={"type": "moe", "config": config.to_dict()})


def make_plain(backbone: Backbone, *, mode: str = "auto", head_dropout: float = 0.1,
               seed: int = 0, copy: bool = True) -> MultipleChoiceModel:
    """A head-only model on the frozen backbone (no adapter): a floor for the baselines."""
    return MultipleChoiceModel(
        prepare_backbone(backbone, copy), mode=mode, head_dropout=head_dropout, seed=seed
    )


__all__ = ["MultipleChoiceModel", "adapter_layers", "make_moe", "make_plain"]
