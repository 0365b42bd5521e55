"""Forward records for the runner: logits and router statistics from ONE pass over a split.

`collect` runs the model once over the records and returns numpy arrays: the logits and, when
the model has MoE-LoRA layers, per-example router statistics pooled (a plain mean) over every
non-padding token of all the example's sequences (one per option, or one in ``letters`` mode)
and over all MoE layers. The statistics come from the same forward that produced the logits.

`FORWARD_PASSES` counts calls per mode, so the runner (and its tests) can prove that a split was
run exactly once deterministically, plus T times with dropout for MC-dropout scorers.

Under a distributed launch (`baselines.distributed`) the length-sorted batches are dealt
round-robin to the processes and the records gathered back on every process. Batches are the
same whatever the number of processes and dropout masks are seeded per batch, so the records
equal a single process's (the random-k ablation gate excepted: its draws follow the order in
which a process meets its batches; the distribution is the same).
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np
import torch
from numpy.typing import NDArray
from torch import Tensor
from tqdm.auto import tqdm

from baselines import distributed
from baselines.heads import MultipleChoiceModel
from baselines.train import length_key
from uqbench.core.errors import ConfigError
from uqbench.core.outputs import PAD_LOGIT
from uqbench.data.records import MCRecord

#: completed forward passes over a split, by mode ("deterministic", "mc_dropout"); one per
#: `collect` call
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
    if not records:
        raise ValueError("collect: no records (empty split)")
    if batch_size < 1:
        raise ConfigError(f"collect: batch_size must be >= 1, got {batch_size}")
    n, c_max = len(records), max(len(r.choices) for r in records)
    logits = np.full((n, c_max), PAD_LOGIT, dtype=np.float64)
    feats = np.zeros((n, int(model.identity["hidden_size"])), dtype=np.float32)
    sums = {f: np.zeros(n) for f in STAT_FIELDS} if model.has_moe else {}
    counts = np.zeros(n)
    cut = np.zeros(n, dtype=np.int8)  # what truncation cut (baselines.heads.CUT_*)
    tok_parts: dict[str, list[Tensor]] = {f: [] for f in (*TOKEN_FIELDS, "tok_example")}
    if keep_tokens and not model.has_moe:
        raise ConfigError("collect: keep_tokens=True needs router statistics, but the model has "
                          "no MoE-LoRA layers")

    flags = {m: m.training for m in model.modules()}
    model.eval()
    if mode == "mc_dropout":
        model.mc_dropout_on()
    if model.has_moe:
        from baselines.moe import layer_stats, record_stats
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
                torch.manual_seed((seed << 24) + b)
                batch = model.encode([records[i] for i in idx], max_length)
                out = model(batch)                                        # (B, C)
                logits[idx, :out.shape[1]] = out.double().cpu().numpy()
                cut[idx] = batch["cut"].numpy()
                feats[idx] = model.last_features.cpu().numpy()  # type: ignore[union-attr]
                if not model.has_moe:
                    continue
                mask = batch["attention_mask"].to(dev).bool()             # (S, L)
                n_ch = batch["n_choices"].to(dev)
                seq_ex = model.seq_example({"n_choices": n_ch})           # (S,)
                stats = layer_stats(model.backbone)                       # per layer (S, L)
                mean = {k: torch.stack([s[k].double() for s in stats]).mean(0)  # (S, L)
                        for k in STAT_FIELDS.values()}
                tok_ex = seq_ex[:, None].expand_as(mask)[mask]            # (K,) batch row
                ex_count = torch.zeros(len(idx), dtype=torch.float64, device=dev
                                       ).index_add_(0, tok_ex, torch.ones_like(tok_ex,
                                                                               dtype=torch.float64))
                counts[idx] = ex_count.cpu().numpy()
                for field, key in STAT_FIELDS.items():
                    vals = mean[key][mask]                                # (K,)
                    total = torch.zeros(len(idx), dtype=torch.float64, device=dev
                                        ).index_add_(0, tok_ex, vals)
                    sums[field][idx] = total.cpu().numpy()
                if keep_tokens:
                    for field, key in TOKEN_FIELDS.items():
                        tok_parts[field].append(mean[key][mask].cpu())
                    tok_parts["tok_example"].append(torch.as_tensor(idx)[tok_ex.cpu()])
    finally:
        if model.has_moe:
            record_stats(model.backbone, False)
        for m, was_training in flags.items():
            m.training = was_training
    FORWARD_PASSES[mode] += 1   # a completed pass
    if distributed.world() > 1:
        _gather(batches, mine, logits, feats, sums, counts, cut, tok_parts)

    result: dict[str, NDArray[np.generic]] = {"logits": logits, "features": feats, "cut": cut}
    for field, total in sums.items():
        result[field] = total / np.maximum(counts, 1.0)
    if model.has_moe:  # the per-token mean of a statistic over examples weighs them by this
        result["n_tokens"] = counts.copy()
    if keep_tokens:
        ex = torch.cat(tok_parts["tok_example"]).numpy().astype(np.int64)
        order = np.argsort(ex, kind="stable")
        result["tok_example"] = ex[order]
        for field in TOKEN_FIELDS:
            result[field] = torch.cat(tok_parts[field]).numpy().astype(np.float64)[order]
    return result


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
