"""What each ``max_length`` cuts and costs, on a profile's real splits: one JSON line per length.

A head keeps the end of a question's input when it is too long (the options and "Answer:" in
``letters``), so a length too short for a domain hides its question, and then its options, from
the model; a run records that in run.json ``fallbacks``. This table chooses the length before a
run: per split, the fraction of questions whose option text (``cut_option``) or only question text
(``cut_question``) would be cut, and the padded tokens a training epoch and one pass over the
evaluated splits (ID, shift, calib) would hold, batched as the training loop and the passes batch
them (`baselines.train.batch_order`, `baselines.forward.plan_batches`), against the profile's
own length (``tokens_ratio``), and the padded tokens of the largest batch of each
(``train_batch_max``, ``eval_batch_max``; the stacked MC-dropout forward holds the profile's
``mc_passes`` copies of an eval batch), which bound the activations' memory. Token counts, not
seconds: a GPU step's time grows with them while it is bound by arithmetic.

    python -m benchmarks.lengths --profile gpu --backbone qwen2.5-coder-0.5b --head letters \\
        --lengths 256,512,768,1024
"""
from __future__ import annotations

import argparse
import sys
from types import SimpleNamespace
from typing import Any

import torch

from benchmarks import emit
from uqbench.files.cache import resolve_cache_dir

EVAL_ROLES = ("id", "shift", "calib")


def padded_tokens(head: Any, tok: Any, records: list[Any], batches: list[list[int]],
                  max_length: int) -> tuple[int, int, int, Any]:
    """(padded, real, largest batch's padded) tokens of ``batches`` of ``records`` encoded by
    ``head`` at ``max_length``, and the (N,) cut codes in record order."""
    padded = real = largest = 0
    cut = torch.zeros(len(records), dtype=torch.int8)
    for b in batches:
        enc = head.encode(tok, [records[i] for i in b], max_length)
        padded += enc["attention_mask"].numel()
        largest = max(largest, enc["attention_mask"].numel())
        real += int(enc["attention_mask"].sum())
        cut[b] = enc["cut"]
    return padded, real, largest, cut


def rows(suite: Any, head: Any, tok: Any, lengths: list[int], batch_size: int,
         eval_batch_size: int) -> list[dict[str, Any]]:
    from baselines.forward import plan_batches
    from baselines.heads.base import CUT_OPTION, CUT_QUESTION
    from baselines.train import batch_order

    planner = SimpleNamespace(scoring=head)
    train = suite.train_records()        # the pooled training set: one shuffle of all domains
    batches = batch_order(train, batch_size, torch.Generator().manual_seed(0))
    out = []
    for length in lengths:
        row: dict[str, Any] = {"max_length": length, "cut_option": {}, "cut_question": {}}
        row["train_tokens"], real, row["train_batch_max"], cut = padded_tokens(
            head, tok, list(train), batches, length)
        cuts, start = {}, 0
        for split in suite.role("train"):
            cuts[split.domain, "train"] = cut[start:start + len(split.records)]
            start += len(split.records)
        row["eval_tokens"] = row["eval_batch_max"] = 0
        for role in EVAL_ROLES:
            for split in suite.role(role):
                recs = list(split.records)
                padded, n, largest, cuts[split.domain, role] = padded_tokens(
                    head, tok, recs, plan_batches(planner, recs, eval_batch_size), length)
                row["eval_tokens"] += padded
                row["eval_batch_max"] = max(row["eval_batch_max"], largest)
                real += n
        row["real_tokens"] = real
        for (domain, role), c in sorted(cuts.items()):
            row["cut_option"][f"{domain}/{role}"] = round(
                float((c == CUT_OPTION).float().mean()), 3
            )
            row["cut_question"][f"{domain}/{role}"] = round(
                float((c == CUT_QUESTION).float().mean()), 3)
        out.append(row)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="gpu")
    ap.add_argument("--backbone", required=True, help="whose tokenizer counts the tokens")
    ap.add_argument("--head", default="letters", help="the scoring head that encodes a question")
    ap.add_argument("--lengths", default="256,512,768,1024",
                    help="comma-separated max_length values to compare")
    ap.add_argument("--suite", default="pooled")
    ap.add_argument("--data-dir", help="local dataset copies (default $UQBENCH_DATA)")
    ap.add_argument("--cache-dir", default=str(resolve_cache_dir()))
    ap.add_argument("--out", help="append the JSON lines here too")
    args = ap.parse_args(argv)
    try:
        lengths = [int(x) for x in args.lengths.split(",")]
    except ValueError:
        ap.error(f"--lengths {args.lengths!r}: give comma-separated integers, e.g. 256,512")
    if not lengths or min(lengths) < 1:
        ap.error(f"--lengths {args.lengths!r}: every length must be >= 1")

    from baselines.backbones import load_backbone
    from baselines.heads.registry import head_class
    from uqbench.core.profiles import get_profile
    from uqbench.data.suites.build import build_suite

    prof = get_profile(args.profile)
    head = head_class(args.head)()
    suite = build_suite(args.suite, prof, data_dir=args.data_dir,
                        cache_dir=f"{args.cache_dir}/splits", progress=False)
    tok = load_backbone(args.backbone, cache_dir=args.cache_dir).tokenizer
    table = rows(suite, head, tok, sorted({*lengths, prof.max_length}), prof.batch_size,
                 prof.eval_batch_size)
    base = next(r for r in table if r["max_length"] == prof.max_length)
    for r in table:
        r = {"benchmark": "max_length", "profile": prof.name, "profile_max_length":
             prof.max_length, "backbone": args.backbone, "head": args.head, **r,
             "tokens_ratio": round((r["train_tokens"] + r["eval_tokens"])
                                   / (base["train_tokens"] + base["eval_tokens"]), 3)}
        emit(r, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
