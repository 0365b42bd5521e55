"""The frozen-prefix cache (`baselines.heads.PrefixCache`): each text alone vs in padded batches.

``prefix_states_alone_vs_padded``: the real MiniLM with adapters on its last 2 blocks (the
`smoke`/`cpu` recipe), its 4-block frozen prefix computed for the questions and options of
``N_RECORDS`` 4-option ARC-Easy train records (bi-encoder: questions and options are separate texts)
in the runner's evaluation batches of ``BATCH`` records, on one thread, from a cold cache:
``alone`` is the cache as it is (each text computed by itself, unpadded, so that its states do
not depend on the batch that first needed it), ``padded`` the way it was before (the missing
texts of a batch in one call, right-padded to the longest). ``ratio`` = alone / padded.
``texts_not_bitwise`` counts the texts whose padded states differ from their states alone in
any bit, ``max_abs_diff`` the largest difference: the cause of a past bug (a model retrained
after a cache corruption was another model). Best of ``REPS``.
"""
from __future__ import annotations

import os
import time
from collections.abc import Iterator

from benchmarks.bench_threads import arc_records

N_RECORDS = 128
BATCH = 32
REPS = 3


def run() -> Iterator[dict[str, object]]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from baselines.backbones import load_backbone
    from baselines.heads import PrefixCache, make_moe, run_blocks
    from baselines.moe import MoELoRAConfig

    torch.set_num_threads(1)
    records, what = arc_records(N_RECORDS)
    model = make_moe(load_backbone("minilm"), MoELoRAConfig(target_modules="ffn", top_layers=2))
    model.eval()
    start, bert = model.prefix_start, model.backbone
    batches = []
    for i in range(0, len(records), BATCH):
        enc = model.encode(records[i:i + BATCH], 128)
        batches += [(enc[f"{k}_input_ids"], enc[f"{k}_attention_mask"]) for k in ("q", "o")]

    def alone() -> list[torch.Tensor]:
        cache = PrefixCache(4096)
        return [cache.states(model, start, ids, mask, torch.zeros_like(ids))
                for ids, mask in batches]

    def padded() -> list[torch.Tensor]:
        with torch.no_grad():
            return [run_blocks(bert, bert.embeddings(input_ids=ids), mask, 0, start)
                    * mask[..., None] for ids, mask in batches]

    best = {}
    for _ in range(REPS):
        for name, fn in (("alone", alone), ("padded", padded)):
            t = time.perf_counter()
            out = fn()
            best[name] = min(best.get(name, float("inf")), time.perf_counter() - t)
            best[name + "_states"] = out
    differ, worst, n = 0, 0.0, 0
    for a, p, (_, mask) in zip(best["alone_states"], best["padded_states"], batches, strict=False):
        for i, length in enumerate(mask.sum(1).tolist()):
            d = (a[i, :length] - p[i, :length]).abs().max().item()
            differ += int(not torch.equal(a[i, :length], p[i, :length]))
            worst, n = max(worst, d), n + 1
    yield {"name": "prefix_states_alone_vs_padded", "records": what, "texts": n,
           "alone_s": round(best["alone"], 3), "padded_s": round(best["padded"], 3),
           "ratio": round(best["alone"] / best["padded"], 3), "threads": 1,
           "texts_not_bitwise": differ, "max_abs_diff": worst, "target": "ratio <= 2",
           "met": best["alone"] / best["padded"] <= 2}


