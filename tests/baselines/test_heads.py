"""The multiple-choice heads (`baselines.heads`): shapes and padding, gradients, truncation
reporting, decoder prompts, cloze scores and bi-encoder scores on tiny models."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from baselines.backbones import Backbone, tiny_backbone
from baselines.heads import HEADS, MultipleChoiceModel, make_moe, make_plain
from baselines.heads.prefix import MASK_4D_ENCODER_TYPES
from baselines.moe import moe_layers
from tests.support.data import SMALL_MOE, toy_records
from uqbench.core.errors import ConfigError
from uqbench.core.outputs import PAD_LOGIT
from uqbench.data.records import MCRecord


@pytest.fixture(scope="module")
def encoder() -> Backbone:
    return tiny_backbone("encoder")


@pytest.fixture(scope="module")
def decoder() -> Backbone:
    return tiny_backbone("decoder")


@pytest.mark.parametrize(("kind", "mode"), [("encoder", "auto"), ("decoder", "auto"),
                                            *((h.kind, name) for name, h in HEADS.items())])
def test_logits_shape_finite_and_padded(request, kind: str, mode: str) -> None:
    bb = request.getfixturevalue(kind)
    model = make_moe(bb, SMALL_MOE, mode=mode).eval()
    recs = toy_records(5, n_choices=(2, 3, 4))
    batch = model.encode(recs, 64)
    with torch.no_grad():
        logits = model(batch)
    c = [len(r.choices) for r in recs]
    assert logits.shape == (5, max(c))
    assert torch.isfinite(logits).all()
    for i, ci in enumerate(c):
        assert (logits[i, ci:] == PAD_LOGIT).all() and (logits[i, :ci] > PAD_LOGIT / 2).all()
    n_seq = {"letters": 5, "bi_encoder": 5 + sum(c)}.get(model.mode, sum(c))
    assert batch["attention_mask"].shape[0] == n_seq == len(model.seq_example(batch))
    assert batch["n_choices"].tolist() == c
    assert [model.scoring.batch_cost(ci) for ci in c] == ([1] * 5 if model.mode == "letters" else c)
    feats = model.last_features   # one float32 state per question
    assert feats is not None and feats.dtype == torch.float32
    assert feats.shape == (5, int(bb.identity["hidden_size"])) and torch.isfinite(feats).all()


def test_auto_mode_and_mismatched_mode(encoder: Backbone, decoder: Backbone) -> None:
    assert make_plain(encoder).mode == "bi_encoder"
    assert make_plain(decoder).mode == "letters"
    with pytest.raises(ConfigError, match="does not fit.*use bi_encoder or cross_encoder or "
                                          "cross_encoder_cls$"):
        MultipleChoiceModel(encoder, mode="cloze")
    with pytest.raises(ConfigError, match="does not fit.*use cloze or letters$"):
        MultipleChoiceModel(decoder, mode="cross_encoder")
    with pytest.raises(ConfigError, match="unknown"):
        MultipleChoiceModel(encoder, mode="pairs")


def test_padded_choices_get_no_gradient_and_finite_loss(encoder: Backbone) -> None:
    model = make_moe(encoder, SMALL_MOE, mode="cross_encoder")
    recs = toy_records(4, n_choices=(2, 4))
    logits = model(model.encode(recs, 64))
    loss = F.cross_entropy(logits, torch.tensor([r.answer for r in recs]))
    assert torch.isfinite(loss)
    loss.backward()
    assert model.head.weight.grad is not None and torch.isfinite(model.head.weight.grad).all()


def test_trainable_parameters_are_adapters_routers_and_head(encoder: Backbone) -> None:
    model = make_moe(encoder, SMALL_MOE, mode="cross_encoder")
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    assert names and all(n.endswith(("lora_A", "lora_B", "router.weight")) or n == "head.weight"
                         for n in names)
    assert "head.weight" in names
    bi = make_moe(encoder, SMALL_MOE, mode="bi_encoder")
    assert bi.head is None and bi.head_parameters() == [bi.logit_scale]
    assert sum(n.endswith("router.weight") for n in names) == len(moe_layers(model.backbone)) == 12
    decoder_model = make_moe(tiny_backbone("decoder"), SMALL_MOE, mode="cloze")
    assert decoder_model.head is None and decoder_model.head_parameters() == []


def test_builders_leave_the_backbone_reusable(encoder: Backbone) -> None:
    make_moe(encoder, SMALL_MOE)
    assert moe_layers(encoder.model) == []
    shared = encoder.clone()
    make_moe(shared, SMALL_MOE, copy=False)
    with pytest.raises(ValueError, match="already carries adapter layers"):
        make_moe(shared, SMALL_MOE, copy=False)


def test_question_truncated_first_and_long_options_fall_back(encoder: Backbone) -> None:
    model = make_plain(encoder, mode="cross_encoder")
    long_q = MCRecord(id="q", domain="t", question="word " * 200, choices=("yes", "no"),
                      answer=0, source="t")
    long_opt = MCRecord(id="o", domain="t", question="short question",
                        choices=("tiger " * 100, "no"), answer=0, source="t")
    batch = model.encode([long_q], 32)
    assert batch["input_ids"].shape == (2, 32)
    sep = model.tokenizer.sep_token_id
    row = batch["input_ids"][0].tolist()
    yes = model.tokenizer("yes", add_special_tokens=False)["input_ids"]
    assert row[-1 - len(yes):-1] == yes and row[-1] == sep   # the option survived intact
    both = model.encode([long_q, long_opt], 32)
    assert both["input_ids"].shape[1] == 32
    # a pair's encoding does not depend on its batch-mates
    assert torch.equal(both["input_ids"][:2], batch["input_ids"])


@pytest.mark.parametrize("mode", HEADS.names())
def test_every_head_says_what_truncation_cut(request, mode: str) -> None:
    """``batch["cut"]`` per question: nothing, question text only, or option text (the
    model never saw all of an option): the forward records carry it to run.json."""
    from baselines.heads.base import CUT_NONE, CUT_OPTION, CUT_QUESTION

    model = make_plain(request.getfixturevalue(HEADS.get(mode).kind), mode=mode)
    fits = MCRecord(id="a", domain="t", question="short question", choices=("yes", "no"),
                    answer=0, source="t")
    long_q = MCRecord(id="b", domain="t", question="word " * 200, choices=("yes", "no"),
                      answer=0, source="t")
    long_opt = MCRecord(id="c", domain="t", question="short question",
                        choices=("no", "tiger " * 100), answer=0, source="t")
    batch = model.encode([fits, long_q, long_opt], 40)
    assert batch["cut"].tolist() == [CUT_NONE, CUT_QUESTION, CUT_OPTION]
    assert model.encode([fits], 40)["cut"].tolist() == [CUT_NONE]


@pytest.mark.parametrize("mode", ["cloze", "letters"])
def test_decoder_prompt_keeps_its_end(decoder: Backbone, mode: str) -> None:
    model = make_plain(decoder, mode=mode)
    rec = MCRecord(id="q", domain="t", question="word " * 300, choices=("red", "blue"), answer=0,
                   source="t")
    batch = model.encode([rec], 48)
    assert batch["input_ids"].shape[1] <= 48
    if mode == "cloze":
        target = batch["target_mask"]
        red = model.tokenizer(" red", add_special_tokens=False)["input_ids"]
        assert batch["input_ids"][0][target[0]].tolist() == red
    else:
        answer = model.tokenizer("Answer:", add_special_tokens=False)["input_ids"]
        ids = batch["input_ids"][0].tolist()
        assert ids[-len(answer) - 1:-1] == answer or ids[-len(answer):] == answer


def test_cloze_score_is_mean_token_loglik(decoder: Backbone) -> None:
    model = make_plain(decoder, mode="cloze").eval()
    rec = MCRecord(id="q", domain="t", question="pick", choices=("red apple", "blue"), answer=0,
                   source="t")
    batch = model.encode([rec], 64)
    with torch.no_grad():
        got = model(batch)[0]
        full = decoder.model(input_ids=batch["input_ids"],
                             attention_mask=batch["attention_mask"]).logits
    logp = full.log_softmax(-1)
    for j in range(2):
        pos = batch["target_mask"][j].nonzero().squeeze(1)
        ids = batch["input_ids"][j, pos]
        want = logp[j, pos - 1, ids].mean()
        assert torch.allclose(got[j], want, atol=1e-5)


def test_decoder_calls_take_the_mask_transformers_builds_for_sdpa(decoder: Backbone) -> None:
    """The (S, 1, L, L) causal mask without padded keys that a decoder call is given: the hidden
    states equal those of transformers' own path from the 2D mask, exactly with padding (it then
    builds the same mask), to float tolerance without (it then uses sdpa's is_causal)."""
    from transformers import GPT2Config

    from baselines.heads.decoder import attention_mask

    config = decoder.model.config
    assert config._attn_implementation == "sdpa"
    ids = torch.randint(5, 1000, (3, 9), generator=torch.Generator().manual_seed(0))
    padded = torch.ones_like(ids)
    padded[1, 6:] = 0
    padded[2, 2:] = 0
    base = decoder.model.base_model
    with torch.no_grad():
        for mask, exact in ((padded, True), (torch.ones_like(ids), False)):
            m4 = attention_mask(config, mask)
            assert m4.shape == (3, 1, 9, 9) and m4.dtype == torch.bool
            got = base(input_ids=ids, attention_mask=m4, use_cache=False).last_hidden_state
            want = base(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
            assert torch.equal(got, want) if exact else torch.allclose(got, want, atol=1e-6)
    assert not m4[0, 0, 3, 4] and m4[0, 0, 4, 3]                 # causal
    assert not attention_mask(config, padded)[2, 0, 5, 3]         # no padded key

    def like(**kw):
        return type(config).from_dict({**config.to_dict(), "_attn_implementation": "sdpa", **kw})

    assert attention_mask(like(), padded).shape == (3, 1, 9, 9)
    assert attention_mask(like(_attn_implementation="eager"), padded) is padded  # its format
    assert attention_mask(like(sliding_window=8), padded) is padded  # a window shorter than L
    assert attention_mask(like(sliding_window=9), padded).shape == (3, 1, 9, 9)  # no effect
    gpt2 = GPT2Config.from_dict({"_attn_implementation": "sdpa"})
    assert gpt2._attn_implementation == "sdpa"
    assert attention_mask(gpt2, padded) is padded                  # reshapes the mask itself


@pytest.mark.parametrize("mode", sorted(HEADS.names()))
def test_a_training_step_reads_nothing_back(request, mode: str) -> None:
    """No op of a head's training forward and backward, MoE-LoRA or LoRA, waits for the device
    (the profiler's ``_local_scalar_dense``: ``item``, ``bool`` of a tensor, ...; ``nonzero``):
    on a GPU nothing stalls the launches, and the step can be captured as a CUDA graph. The
    encoders' adapters sit in every block here: a frozen prefix reads its rows back by design
    (`baselines.heads.PrefixCache`)."""
    from torch.profiler import ProfilerActivity, profile

    from baselines.dense import make_dense

    bb = request.getfixturevalue(HEADS.get(mode).kind)
    batch_recs = toy_records(6, seed=1, n_choices=(2, 3, 4))
    for model in (make_moe(bb, SMALL_MOE, mode=mode), make_dense(bb, "lora", mode=mode)):
        assert model.prefix_start == 0
        model.train()
        batch = model.encode(batch_recs, 64)
        assert not batch["attention_mask"].all()                   # padded rows
        model(batch).sum().backward()                              # warm-up
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            model(batch).sum().backward()
        names = [e.name for e in prof.events()]
        assert names.count("aten::mm") > 0
        for sync in ("aten::_local_scalar_dense", "aten::nonzero"):
            assert names.count(sync) == 0, (type(model).__name__, sync)


@pytest.mark.parametrize("mode", sorted(HEADS.names()))
def test_no_cpu_tensor_reaches_a_device_op(mode: str) -> None:
    """Every head, run on the meta device (standing in for a GPU) with the batch moved there as
    training moves it: a MoE-LoRA and a LoRA training step (with the Switch loss) and a MoE-LoRA
    eval pass under CARE with statistics hand no op a CPU tensor (`CpuOperands`)."""
    from baselines.dense import make_dense
    from baselines.gates import Care
    from baselines.moe import load_balance_loss, record_stats, set_gate
    from tests.support.devices import CpuOperands

    recs = toy_records(6, seed=1, n_choices=(2, 3, 4))
    kind = HEADS.get(mode).kind
    for make in (make_moe, make_dense):
        model = make(tiny_backbone(kind), SMALL_MOE if make is make_moe else "lora", mode=mode)
        model.to("meta").train()
        batch = {k: v.to("meta") for k, v in model.encode(recs, 64).items()}
        ops = CpuOperands()
        with ops:
            loss = model(batch).sum()
            if model.has_moe:
                loss = loss + load_balance_loss(model.backbone)
            loss.backward()
            if model.has_moe:
                model.eval()
                set_gate(model.backbone, Care(0.6, k_max=SMALL_MOE.n_experts))
                record_stats(model.backbone, True)
                with torch.no_grad():
                    model(batch)
        assert ops.ops == [], (make.__name__, ops.ops)


@pytest.mark.parametrize("model_type", sorted(MASK_4D_ENCODER_TYPES))
def test_encoder_calls_take_the_mask_transformers_builds_for_sdpa(model_type: str) -> None:
    """The (S, 1, L, L) mask without padded keys that an encoder call is given: the hidden states
    equal those of transformers' own path from the 2D mask, with padding and without (it then
    leaves the mask out), for every model type it is given to (random weights)."""
    from transformers import AutoConfig, AutoModel

    from baselines.heads.prefix import encoder_attention_mask

    config = AutoConfig.for_model(model_type, vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=4, intermediate_size=64,
                                  max_position_embeddings=64)
    torch.manual_seed(0)
    model = AutoModel.from_config(config, attn_implementation="sdpa").eval()
    ids = torch.randint(5, 100, (3, 9), generator=torch.Generator().manual_seed(0))
    padded = torch.ones_like(ids)
    padded[1, 6:] = 0
    with torch.no_grad():
        for mask in (padded, torch.ones_like(ids)):
            m4 = encoder_attention_mask(model.config, mask)
            assert m4.shape == (3, 1, 9, 9) and m4.dtype == torch.bool
            got = model(input_ids=ids, attention_mask=m4).last_hidden_state
            want = model(input_ids=ids, attention_mask=mask).last_hidden_state
            assert torch.allclose(got, want, atol=1e-6)
    assert not encoder_attention_mask(model.config, padded)[1, 0, 2, 7]   # no padded key
    eager = type(config).from_dict({**config.to_dict(), "_attn_implementation": "eager"})
    assert encoder_attention_mask(eager, padded) is padded              # its own format


def _mean_pooled(bb: Backbone, texts: list[str]) -> torch.Tensor:
    enc = bb.tokenizer(texts, padding=True, truncation=True, max_length=64, return_tensors="pt")
    h = bb.model(**enc).last_hidden_state
    m = enc["attention_mask"].unsqueeze(-1).float()
    return F.normalize((h * m).sum(1) / m.sum(1), dim=-1)


def test_bi_encoder_scores_are_scaled_cosines_of_separate_embeddings(encoder: Backbone) -> None:
    """Worked by hand: each option's logit is 20 * cos(mean-pooled question, mean-pooled option),
    the question encoded once (B + S sequences, not B * C pairs)."""
    model = make_plain(encoder, mode="bi_encoder").eval()
    recs = toy_records(3, n_choices=(2, 3))
    batch = model.encode(recs, 64)
    assert batch["q_input_ids"].shape[0] == 3
    assert batch["o_input_ids"].shape[0] == sum(len(r.choices) for r in recs)
    with torch.no_grad():
        logits = model(batch)
        for i, r in enumerate(recs):
            q = _mean_pooled(encoder, [r.question])
            o = _mean_pooled(encoder, list(r.choices))
            want = 20.0 * (q * o).sum(-1)
            torch.testing.assert_close(logits[i, :len(r.choices)], want, atol=1e-5, rtol=1e-5)


def test_bi_encoder_router_stats_cover_questions_and_options(encoder: Backbone) -> None:
    """Router statistics of both backbone calls land in the batch's stacked mask layout, and
    the auxiliary loss is the mean of the two calls' losses."""
    from baselines.moe import layer_stats, load_balance_loss, record_stats

    model = make_moe(encoder, SMALL_MOE, mode="bi_encoder").eval()
    recs = toy_records(3, n_choices=(2, 4))
    batch = model.encode(recs, 64)
    record_stats(model.backbone, True)
    with torch.no_grad():
        model(batch)
    stats = layer_stats(model.backbone)
    mask = batch["attention_mask"].bool()
    for st in stats:
        assert st["k"].shape == mask.shape
        assert (st["k"][mask] == 2).all() and (st["k"][~mask] == 0).all()   # top-2 per real token
    seq_ex = model.seq_example(batch)
    assert seq_ex.tolist() == [0, 1, 2] + [i for i, r in enumerate(recs) for _ in r.choices]
    # aux: the mean of the per-call Switch losses
    record_stats(model.backbone, False)
    parts = []
    for key in ("q", "o"):
        from baselines.moe import set_token_mask
        set_token_mask(model.backbone, batch[f"{key}_attention_mask"].bool())
        with torch.no_grad():
            model.backbone(input_ids=batch[f"{key}_input_ids"],
                           attention_mask=batch[f"{key}_attention_mask"])
        parts.append(load_balance_loss(model.backbone))
        set_token_mask(model.backbone, None)
    with torch.no_grad():
        model(batch)
    torch.testing.assert_close(load_balance_loss(model.backbone), (parts[0] + parts[1]) / 2)
