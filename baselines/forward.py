"""Forward records for the runner: logits and router statistics from ONE pass over a split.

`collect` runs the model once over the records and returns numpy arrays: the logits and, when
the model has MoE-LoRA layers, per-example router statistics pooled (a plain mean) over every
non-padding token of all the example's sequences (one per option, or one in ``letters`` mode)
and over all MoE layers. The statistics come from the same forward that produced the logits.

`FORWARD_PASSES` counts passes per mode, so the runner (and its tests) can prove that a split was
run exactly once deterministically, plus T times with dropout for MC-dropout scorers.
`collect_mc` runs the T MC-dropout passes stacked, T copies of each batch in one forward, each
copy with the dropout masks of its sequential pass.

Under a distributed launch (`baselines.distributed`) the length-sorted batches are dealt
round-robin to the processes and the records gathered back on every process. Batches are the
same whatever the number of processes and dropout masks are seeded per batch, so the records
equal a single process's (the random-k ablation gate excepted: its draws follow the order in
which a process meets its batches; the distribution is the same).
"""
from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch
from numpy.typing import NDArray
from torch import Tensor, nn
from tqdm.auto import tqdm

from baselines import distributed
from baselines.gates import RandomK
from baselines.heads import MultipleChoiceModel
from baselines.train import length_key
from uqbench.core.errors import ConfigError, record_fallback
from uqbench.core.outputs import PAD_LOGIT
from uqbench.data.records import MCRecord

#: completed forward passes over a split, by mode ("deterministic", "mc_dropout"); one per
#: `collect` call, T per `collect_mc` call (one per stacked copy)
FORWARD_PASSES: Counter[str] = Counter()

MODES = ("deterministic", "mc_dropout")
#: what a record holds, in its cache key: records written before ``n_tokens`` are recomputed
RECORD_FIELDS = "logits+router-stats+n_tokens+features+cut"
#: Outputs field <- MoE layer statistic
STAT_FIELDS = {"route_entropy": "entropy", "top1_mass": "top1", "disagreement": "disagreement",
               "experts": "k"}
#: per-token array <- MoE layer statistic (keep_tokens=True)
TOKEN_FIELDS = {"tok_entropy": "entropy", "tok_top1": "top1",
                "tok_disagreement": "disagreement", "tok_k": "k"}


def plan_batches(model: MultipleChoiceModel, records: Sequence[MCRecord], batch_size: int
                 ) -> list[list[int]]:
    """Record indices per forward batch: sorted by length (less padding), at most
    ``batch_size`` sequences per batch (at least one whole example)."""
    order = sorted(range(len(records)), key=lambda i: length_key(records[i]))
    batches: list[list[int]] = []
    cur: list[int] = []
    n_seq = 0
    for i in order:
        s = model.scoring.batch_cost(len(records[i].choices))
        if cur and n_seq + s > batch_size:
            batches.append(cur)
            cur, n_seq = [], 0
        cur.append(i)
        n_seq += s
    if cur:
        batches.append(cur)
    return batches


def collect(model: MultipleChoiceModel, records: Sequence[MCRecord], *, batch_size: int = 64,
            max_length: int = 128, mode: str = "deterministic", seed: int = 0,
            progress: bool = True, keep_tokens: bool = False) -> dict[str, NDArray[np.generic]]:
    """Run the model once over ``records``.

    Parameters
    ----------
    model : MultipleChoiceModel
        Its MoE gate (if any) is used as set (`baselines.moe.set_gate`).
    records : sequence of MCRecord
    batch_size : int
        Max token sequences per forward (an example contributes one per option, or one in
        ``letters`` mode); examples are sorted by length to cut padding, results come back in
        the order of ``records``.
    max_length : int
        Max tokens per sequence.
    mode : {"deterministic", "mc_dropout"}
        ``mc_dropout``: every ``nn.Dropout`` that was on in training (all of them, but those of
        a frozen prefix: `MultipleChoiceModel.mc_dropout_on`) in train mode, everything else in
        eval mode, the dropout masks drawn from ``seed`` (same seed -> same logits).
        Attention-probability dropout that HF implements functionally (gated by the attention
        module's own flag) stays off; hidden, adapter and head dropout are sampled.
    seed : int
        Seed of the dropout masks, drawn afresh for each batch from (seed, batch number) so
        that sharding over processes does not change them (global RNG state is restored
        afterwards).
    progress : bool
        Show a tqdm bar.
    keep_tokens : bool
        Also return per-token router statistics (averaged over MoE layers) of every
        non-padding token: ``tok_entropy``, ``tok_top1``, ``tok_disagreement``, ``tok_k`` and
        ``tok_example`` (row in ``records``), grouped by example in record order.

    Returns
    -------
    dict of numpy arrays
        ``logits`` (N, C_max) float64 (absent options: `PAD_LOGIT`); ``features`` (N, H)
        float32, the pooled final hidden state (`MultipleChoiceModel.last_features`); ``cut``
        (N,) int8, what truncation to ``max_length`` cut from each question's input
        (`baselines.heads.base.CUT_NONE` / ``CUT_QUESTION`` / ``CUT_OPTION``); with MoE layers
        also
        ``route_entropy``, ``top1_mass``, ``disagreement``, ``experts`` (N,) float64: means over
        the example's non-padding tokens and all MoE layers of ``H(p)/log N``, ``p_(1)``, ``D``
        and ``k``; and ``n_tokens`` (N,) float64, the number of those tokens (the average
        experts per token over examples is ``sum(experts * n_tokens) / sum(n_tokens)``).

    Examples
    --------
    >>> rec = collect(model, split.records, batch_size=64)      # doctest: +SKIP
    >>> rec["logits"].shape, rec["route_entropy"].shape          # doctest: +SKIP
    ((150, 4), (150,))
    """
    if mode not in MODES:
        raise ConfigError(f"collect: mode {mode!r} unknown; valid: {', '.join(MODES)}")
    return _collect(model, records, [seed], batch_size=batch_size, max_length=max_length,
                    mode=mode, progress=progress, keep_tokens=keep_tokens)[0]


def collect_mc(model: MultipleChoiceModel, records: Sequence[MCRecord], seeds: Sequence[int], *,
               batch_size: int = 64, max_length: int = 128, progress: bool = True,
               max_tokens: int | None = None) -> list[dict[str, NDArray[np.generic]]]:
    """``[collect(model, records, mode="mc_dropout", seed=s) for s in seeds]``, with the passes
    stacked: each forward holds ``len(seeds)`` copies of a batch (its records repeated, copy
    after copy, so every layer sees the copies as consecutive blocks of rows) instead of one.

    Every dropout draw of the stacked forward (the ``nn.Dropout`` modules in train mode and the
    MoE-LoRA layers' keep masks, through `baselines.moe.MoELoRALinear.mask_draws`) is split by
    copy and each block drawn from its copy's own stream, seeded as the sequential pass would
    be, so copy ``t`` gets the masks of ``collect(..., seed=seeds[t])``. The records equal the
    sequential passes' within float rounding: a GEMM over T times the rows may round its last
    bits otherwise (on CPU the encoder heads' records were bit for bit in the measured runs,
    tiny-bert and MiniLM; a decoder's logits differ by <= 3e-8; once a full-suite run saw
    `features` differ). On an accelerator, kernels chosen by shape may round differently too.

    Sequential passes instead (same records, slower) when a gate draws from its own generator
    (`baselines.gates.RandomK`: its draws follow the order of the passes), and, with a warning
    recorded in run.json ``fallbacks``, when a random draw outside those dropouts ran in the
    stacked forward (checked on every batch: the global generator must be untouched).
    ``batch_size`` counts the sequences of one copy, as in `collect`. ``max_tokens`` bounds the
    padded tokens of one forward, every copy counted (None: no bound): a batch whose ``T``
    copies hold more runs as several forwards of as many copies as fit (at least one), each copy
    with the same masks, so the memory of the longest batches does not grow with ``T``.
    """
    seeds = list(seeds)
    if not seeds:
        raise ValueError("collect_mc: no seeds (give one per MC-dropout pass)")
    if max_tokens is not None and max_tokens < 1:
        raise ConfigError(f"collect_mc: max_tokens must be >= 1 or None, got {max_tokens}")
    kw: dict[str, Any] = {"batch_size": batch_size, "max_length": max_length,
                          "progress": progress}
    stochastic = [type(g).__name__ for g in _gates(model) if isinstance(g, RandomK)]
    if len(seeds) == 1 or stochastic:
        return [collect(model, records, mode="mc_dropout", seed=s, **kw) for s in seeds]
    try:
        return _collect(model, records, seeds, mode="mc_dropout", keep_tokens=False,
                        max_tokens=max_tokens, **kw)
    except _UnsplitDraw as exc:
        record_fallback("stacked MC-dropout passes", type(model.backbone).__name__,
                        f"{exc}; the {len(seeds)} passes ran one after another instead (same "
                        "values, slower)")
        return [collect(model, records, mode="mc_dropout", seed=s, **kw) for s in seeds]


def _gates(model: MultipleChoiceModel) -> list[object]:
    return [layer.gate for layer in model.moe_layers()]


def _collect(model: MultipleChoiceModel, records: Sequence[MCRecord], seeds: list[int], *,
             batch_size: int, max_length: int, mode: str, progress: bool, keep_tokens: bool,
             max_tokens: int | None = None) -> list[dict[str, NDArray[np.generic]]]:
    """`collect` for ``len(seeds)`` copies stacked in each forward (see `collect_mc`)."""
    if not records:
        raise ValueError("collect: no records (empty split)")
    if batch_size < 1:
        raise ConfigError(f"collect: batch_size must be >= 1, got {batch_size}")
    if keep_tokens and not model.has_moe:
        raise ConfigError("collect: keep_tokens=True needs router statistics, but the model has "
                          "no MoE-LoRA layers")
    n_copies = len(seeds)
    acc = _Acc.empty(n_copies, records, int(model.identity["hidden_size"]), model.has_moe)
    flags = {m: m.training for m in model.modules()}
    model.eval()
    if mode == "mc_dropout":
        model.mc_dropout_on()
    if model.has_moe:
        from baselines.moe import record_stats
        record_stats(model.backbone, True)
    batches = plan_batches(model, records, batch_size)
    mine = list(range(distributed.rank(), len(batches), distributed.world()))
    dev = model.device
    try:
        with torch.random.fork_rng(devices=[dev.index or 0] if dev.type == "cuda" else []), \
                torch.inference_mode():
            for b in tqdm(mine, desc=f"forward ({mode})", leave=False,
                          disable=not progress or not distributed.is_main()):
                idx = batches[b]
                recs = [records[i] for i in idx]
                for c0, c1 in _copy_groups(model, recs, n_copies, max_length, max_tokens):
                    _forward_copies(model, recs, idx, b, seeds, slice(c0, c1), max_length, acc,
                                    keep_tokens)
    finally:
        if model.has_moe:
            record_stats(model.backbone, False)
        for m, was_training in flags.items():
            m.training = was_training
    FORWARD_PASSES[mode] += n_copies   # completed passes, one per copy
    results = []
    for t in range(n_copies):
        c_sums = {f: v[t] for f, v in acc.sums.items()}
        if distributed.world() > 1:
            _gather(batches, mine, acc.logits[t], acc.feats[t], c_sums, acc.counts[t], acc.cut,
                    acc.tok_parts)
        result: dict[str, NDArray[np.generic]] = {"logits": acc.logits[t],
                                                  "features": acc.feats[t], "cut": acc.cut.copy()}
        for field, total in c_sums.items():
            result[field] = total / np.maximum(acc.counts[t], 1.0)
        if model.has_moe:  # the per-token mean of a statistic over examples weighs them by this
            result["n_tokens"] = acc.counts[t].copy()
        if keep_tokens:
            ex = torch.cat(acc.tok_parts["tok_example"]).numpy().astype(np.int64)
            order = np.argsort(ex, kind="stable")
            result["tok_example"] = ex[order]
            for field in TOKEN_FIELDS:
                result[field] = torch.cat(acc.tok_parts[field]).numpy().astype(np.float64)[order]
        results.append(result)
    return results


def _copy_groups(model: MultipleChoiceModel, recs: list[MCRecord], n_copies: int,
                 max_length: int, max_tokens: int | None) -> list[tuple[int, int]]:
    """The stacked copies ``[c0, c1)`` of each forward of one batch: all of them, or as many as
    ``max_tokens`` padded tokens hold (at least one)."""
    if max_tokens is None or n_copies == 1:
        return [(0, n_copies)]
    per_copy = model.encode(recs, max_length)["attention_mask"].numel()
    g = max(1, min(n_copies, max_tokens // per_copy))
    return [(c, min(c + g, n_copies)) for c in range(0, n_copies, g)]


@dataclass
class _Acc:
    """The records of ``T`` passes over a split, filled batch by batch: (T, N, ...) arrays."""
    logits: NDArray[np.float64]
    feats: NDArray[np.float32]
    sums: dict[str, NDArray[np.float64]]
    counts: NDArray[np.float64]
    cut: NDArray[np.int8]   # what truncation cut (baselines.heads.CUT_*), the same in every pass
    tok_parts: dict[str, list[Tensor]]

    @classmethod
    def empty(cls, n_copies: int, records: Sequence[MCRecord], hidden: int, moe: bool) -> _Acc:
        n, c_max = len(records), max(len(r.choices) for r in records)
        return cls(logits=np.full((n_copies, n, c_max), PAD_LOGIT, dtype=np.float64),
                   feats=np.zeros((n_copies, n, hidden), dtype=np.float32),
                   sums={f: np.zeros((n_copies, n)) for f in STAT_FIELDS} if moe else {},
                   counts=np.zeros((n_copies, n)), cut=np.zeros(n, dtype=np.int8),
                   tok_parts={f: [] for f in (*TOKEN_FIELDS, "tok_example")})


def _forward_copies(model: MultipleChoiceModel, recs: list[MCRecord], idx: list[int], b: int,
                    seeds: list[int], copies: slice, max_length: int, acc: _Acc,
                    keep_tokens: bool) -> None:
    """One forward of batch ``b`` (``recs``, rows ``idx`` of the split) stacked once for each
    pass in ``copies``, pass ``t`` with the dropout masks of ``seeds[t]``; fills ``acc``."""
    n_copies, B, dev = copies.stop - copies.start, len(idx), model.device
    batch = model.encode(recs * n_copies, max_length)
    if n_copies == 1:
        torch.manual_seed((seeds[copies.start] << 24) + b)
        out = model(batch)                                                # (B, C)
    else:
        with _per_copy_draws(model, [(s << 24) + b for s in seeds[copies]], dev):
            out = model(batch)                                            # (T*B, C)
    acc.logits[copies, idx, :out.shape[1]] = out.double().cpu().numpy().reshape(n_copies, B, -1)
    acc.cut[idx] = batch["cut"][:B].numpy()
    acc.feats[copies, idx] = model.last_features.cpu().numpy().reshape(  # type: ignore[union-attr]
        n_copies, B, -1)
    if not model.has_moe:
        return
    from baselines.moe import layer_stats

    mask = batch["attention_mask"].to(dev).bool()                         # (S, L)
    n_ch = batch["n_choices"].to(dev)
    seq_ex = model.seq_example({"n_choices": n_ch})                       # (S,) row in T*B
    stats = layer_stats(model.backbone)                                   # per layer (S, L)
    mean = {k: torch.stack([s[k].double() for s in stats]).mean(0)        # (S, L)
            for k in STAT_FIELDS.values()}
    tok_ex = seq_ex[:, None].expand_as(mask)[mask]                        # (K,) batch row
    ex_count = torch.zeros(n_copies * B, dtype=torch.float64, device=dev
                           ).index_add_(0, tok_ex, torch.ones_like(tok_ex, dtype=torch.float64))
    acc.counts[copies, idx] = ex_count.cpu().numpy().reshape(n_copies, B)
    for field, key in STAT_FIELDS.items():
        vals = mean[key][mask]                                            # (K,)
        total = torch.zeros(n_copies * B, dtype=torch.float64, device=dev
                            ).index_add_(0, tok_ex, vals)
        acc.sums[field][copies, idx] = total.cpu().numpy().reshape(n_copies, B)
    if keep_tokens:   # one copy (collect)
        for field, key in TOKEN_FIELDS.items():
            acc.tok_parts[field].append(mean[key][mask].cpu())
        acc.tok_parts["tok_example"].append(torch.as_tensor(idx)[tok_ex.cpu()])


class _UnsplitDraw(RuntimeError):
    """A random draw in a stacked forward that `_per_copy_draws` did not split by copy."""


def _rng_state(dev: torch.device) -> tuple[Tensor, Tensor | None]:
    return (torch.get_rng_state(),
            torch.cuda.get_rng_state(dev) if dev.type == "cuda" else None)


def _set_rng_state(state: tuple[Tensor, Tensor | None], dev: torch.device) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], dev)


@contextmanager
def _per_copy_draws(model: MultipleChoiceModel, seeds: list[int], dev: torch.device
                    ) -> Iterator[None]:
    """Within the block, every dropout draw of ``model`` on an input whose rows are
    ``len(seeds)`` stacked copies is made block by block, copy ``t``'s from the default
    generator(s) in copy ``t``'s own state (first seeded with ``seeds[t]``), as ``t``'s
    sequential pass draws them: the MoE-LoRA layers' keep masks through their ``mask_draws``
    (`baselines.moe.layer.MaskDraws`), set for the block; each ``nn.Dropout`` in train mode
    through a ``forward`` set on the instance for the block (its class's, per copy). Raises
    `_UnsplitDraw` on exit if anything else drew."""
    states = []
    for s in seeds:
        torch.manual_seed(s)
        states.append(_rng_state(dev))
    torch.manual_seed(0x5EED)   # a sentinel state: any draw left unsplit moves it
    sentinel = _rng_state(dev)

    def check() -> None:
        now = _rng_state(dev)
        # b is None exactly where a is (the same device's states)
        if not all(a is None or torch.equal(a, cast(Tensor, b))
                   for a, b in zip(now, sentinel, strict=False)):
            raise _UnsplitDraw("a random draw other than nn.Dropout's and the MoE-LoRA "
                               "layers' dropout masks ran in the stacked forward")

    def split(draw: Callable[[Tensor], Tensor], x: Tensor) -> Tensor:
        check()
        if x.shape[0] % len(seeds):
            raise _UnsplitDraw(f"a dropout input of {x.shape[0]} rows is not "
                               f"{len(seeds)} stacked copies")
        parts = []
        for t, chunk in enumerate(x.chunk(len(seeds))):
            _set_rng_state(states[t], dev)
            parts.append(draw(chunk))
            states[t] = _rng_state(dev)
        _set_rng_state(sentinel, dev)
        return torch.cat(parts)

    from baselines.moe import MoELoRALinear

    layers = [m for m in model.moe_layers() if isinstance(m, MoELoRALinear)]
    own = [layer.__dict__.get("mask_draws") for layer in layers]   # put back after, if any
    patched = [m for m in model.modules() if isinstance(m, nn.Dropout) and m.training]
    for m in patched:   # an instance attribute shadows the class's forward for this block
        m.forward = functools.partial(split, type(m).forward.__get__(m))  # type: ignore[method-assign]
    for layer in layers:
        layer.mask_draws = split
    try:
        yield
    finally:
        for layer, draws in zip(layers, own, strict=False):
            if draws is None:
                del layer.mask_draws
            else:
                layer.mask_draws = draws
        for m in patched:
            del m.forward
    check()


def _gather(batches: list[list[int]], mine: list[int], logits: NDArray[np.float64],
            feats: NDArray[np.float32], sums: dict[str, NDArray[np.float64]],
            counts: NDArray[np.float64], cut: NDArray[np.int8],
            tok_parts: dict[str, list[Tensor]]) -> None:
    """Fill in, in place, the rows other processes computed (every process gets every row)."""
    rows = np.array([i for b in mine for i in batches[b]], dtype=np.int64)
    part = {"rows": rows, "logits": logits[rows], "features": feats[rows],
            "counts": counts[rows], "cut": cut[rows],
            "sums": {f: v[rows] for f, v in sums.items()},
            "tok": {f: [t.numpy() for t in ts] for f, ts in tok_parts.items()}}
    for r, p in enumerate(distributed.gather(part)):
        if r == distributed.rank():
            continue
        logits[p["rows"]] = p["logits"]
        feats[p["rows"]] = p["features"]
        counts[p["rows"]] = p["counts"]
        cut[p["rows"]] = p["cut"]
        for f, v in p["sums"].items():
            sums[f][p["rows"]] = v
        for f, ts in p["tok"].items():
            tok_parts[f].extend(torch.from_numpy(t) for t in ts)
