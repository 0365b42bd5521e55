"""Worker for tests/baselines/test_accelerate.py:
train a tiny MoE-LoRA model and collect its forward
records, in however many processes it was launched with; process 0 saves everything to
``sys.argv[1]`` (an .npz). Run alone it is the single-process reference."""
from __future__ import annotations

import sys

import numpy as np
import torch

from baselines import distributed, forward, heads, moe, train
from baselines.backbones import tiny_backbone
from uqbench.data.records import MCRecord

WORDS = ["apple", "river", "stone", "tiger", "cloud", "lamp", "green", "seven", "honey", "bridge"]


def records(n: int, seed: int) -> list[MCRecord]:
    """Questions of varied length and 2-4 options (so batches hold uneven shares)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        q = " ".join(rng.choice(WORDS, size=int(rng.integers(2, 12))))
        c = int(rng.integers(2, 5))
        choices = tuple(" ".join(rng.choice(WORDS, size=int(rng.integers(1, 4)))) for _ in range(c))
        out.append(MCRecord(id=f"r{i}", domain="t", question=q, choices=choices,
                            answer=int(rng.integers(c)), source="test"))
    return out


def main(path: str) -> None:
    torch.set_num_threads(1)
    results: dict[str, np.ndarray] = {}
    # dropout 0: masks are per process, the one thing DDP cannot make equal to one process
    cfg = moe.MoELoRAConfig(n_experts=4, rank=2, top_k=2, dropout=0.0, lb_coef=0.0)
    for mode in ("letters", "cloze"):
        model = heads.make_moe(tiny_backbone("decoder"), cfg, mode=mode)
        # 13 records, batch 4: the last step has 1 record, so process 1 runs it at weight 0
        res = train.train(model, records(13, 0), train.TrainConfig(
            epochs=2, batch_size=4, lr=1e-2, max_length=32), progress=False)
        results[f"{mode}_losses"] = np.array(res.losses)
        results[f"{mode}_weights"] = np.concatenate([
            p.detach().reshape(-1).numpy() for p in model.trainable_parameters()])
        # records of a fixed (not trained here) model: must equal one process's exactly
        fixed = heads.make_moe(tiny_backbone("decoder"), moe.MoELoRAConfig(
            n_experts=4, rank=2, top_k=2, dropout=0.3), mode=mode)
        gen = torch.Generator().manual_seed(7)
        with torch.no_grad():
            for p in fixed.trainable_parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
        eval_recs = records(21, 1)
        det = forward.collect(fixed, eval_recs, batch_size=6, max_length=32, progress=False,
                              keep_tokens=True)
        for k, v in det.items():
            results[f"{mode}_det_{k}"] = v
        results[f"{mode}_mc_logits"] = forward.collect(
            fixed, eval_recs, batch_size=6, max_length=32, mode="mc_dropout", seed=3,
            progress=False)["logits"]
        results[f"{mode}_mc_stacked_logits"] = np.stack([r["logits"] for r in forward.collect_mc(
            fixed, eval_recs, [3, 4], batch_size=6, max_length=32, progress=False)])
    results["world"] = np.array(distributed.world())
    if distributed.is_main():
        np.savez(path, **results)


if __name__ == "__main__":
    main(sys.argv[1])
