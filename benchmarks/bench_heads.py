"""Tokens the encoder runs per question: the bi-encoder head against the cross-encoder.

A cross-encoder encodes ``[CLS] question [SEP] option [SEP]`` once per option; the bi-encoder
encodes the question once and each option alone. One line per domain of the pooled suite's ID
test splits at the `cpu` caps: real (non-padding) tokens of each head and their ratio
(cross / bi; the target of issue "Models that learn" is 2-3x on science, knowledge and math).
Needs the real data (``UQBENCH_DATA``); tokenization only, no model forward.
"""
from __future__ import annotations

import os
from collections.abc import Iterator


def run() -> Iterator[dict[str, object]]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from baselines.backbones import load_backbone
    from baselines.heads import make_plain
    from uqbench.core.profiles import get_profile
    from uqbench.data.suites.build import build_suite
    from uqbench.files.cache import resolve_cache_dir

    prof = get_profile("cpu")
    suite = build_suite("pooled", prof, cache_dir=resolve_cache_dir() / "splits",
                        progress=False)
    bb = load_backbone("minilm")
    heads = {m: make_plain(bb, mode=m) for m in ("cross_encoder", "bi_encoder")}
    for dom in suite.domains:
        recs = suite.split(dom, "id").records
        tokens = {}
        for mode, model in heads.items():
            enc = [model.encode(recs[i:i + 16], prof.max_length) for i in range(0, len(recs), 16)]
            keys = ("q_attention_mask", "o_attention_mask") if mode == "bi_encoder" \
                else ("attention_mask",)
            tokens[mode] = sum(int(e[k].sum()) for e in enc for k in keys)
        ratio = tokens["cross_encoder"] / tokens["bi_encoder"]
        yield {"name": f"bi_encoder_tokens_{dom}", "cross_encoder_tokens": tokens["cross_encoder"],
               "bi_encoder_tokens": tokens["bi_encoder"], "ratio": round(ratio, 3),
               "target": ">= 2 on science, knowledge, math",
               "met": ratio >= 2 if dom != "code" else None, "questions": len(recs)}
