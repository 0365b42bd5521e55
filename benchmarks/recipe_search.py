"""Recipe search: one row per training recipe on the same splits and seed.

Each candidate trains one MoE-LoRA model (16 experts of rank 8, top-4 in training, the runner's
model) on the pooled suite's train splits and reports, per domain, the ID-test accuracy with its
95% percentile-bootstrap CI, the loss before any update (``initial_loss_<domain>``, step 0,
with its accuracy), the training loss and accuracy of the last logging interval
(``train_loss_<domain>``, ``train_acc_<domain>``; the whole curves in ``curves``), the final
train loss (mean of the last 10 steps) and the seconds of training and evaluation. The `cpu`
profile's recipe (`uqbench.core.profiles`) is chosen from this table (docs/recipe.md);
`smoke` keeps the same recipe at smaller caps.

    python -m benchmarks.recipe_search --candidates bi,cross --out recipe.jsonl

A candidate is ``name:key=value,key=value`` or a preset name from `PRESETS`; keys: head
(bi_encoder | cross_encoder | cross_encoder_cls), lr, head_lr, epochs (0 = no training),
train_cap, targets (auto | ffn | module names joined by '+', e.g. q_proj+up_proj), top (adapt
the last N blocks; 0 = all), batch, backbone,
max_length (tokens a question's input keeps; 0 = the profile's). Each row also gives, per
domain, the fraction of ID questions whose option text that length cut (``cut_<domain>``).
On a GPU (``--profile gpu --candidates gpu-zero,gpu,gpu-lr2e-3,...``, `GPU_PRESETS`) the
backbone goes to the GPU in bfloat16, as the runner places it. ``--suite`` takes another
registered suite or a suite YAML file (``benchmarks/suites/math-sets.yaml``: the seed paper's
math sets side by side, for zero-shot rows); ``--time-budget`` writes a ``skipped`` row for
each candidate that would end past it (a lease's call, `benchmarks.gpu_lease`).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
import warnings
from typing import Any

import numpy as np

from benchmarks import emit
from uqbench.files.cache import resolve_cache_dir

BASE: dict[str, Any] = {"head": "bi_encoder", "lr": 1e-3, "head_lr": 1e-2, "epochs": 1,
                        "train_cap": 150, "targets": "auto", "top": 0, "batch": 16,
                        "backbone": "minilm", "max_length": 0}
PRESETS: dict[str, dict[str, Any]] = {
    "bi-zero": {"epochs": 0},
    "cross-zero": {"head": "cross_encoder", "epochs": 0},
    "bi": {},
    "cross": {"head": "cross_encoder"},
    "cross-cls": {"head": "cross_encoder_cls"},
    "cross-paper-lr": {"head": "cross_encoder", "lr": 2e-4},
    "bi-lr2e-4": {"lr": 2e-4},
    "bi-lr3e-3": {"lr": 3e-3},
    "bi-headlr1e-3": {"head_lr": 1e-3},
    "bi-ep2": {"epochs": 2},
    "bi-ep3": {"epochs": 3},
    "bi-cap400": {"train_cap": 400},
    "bi-cap400-ep2": {"train_cap": 400, "epochs": 2},
    "bi-ffn": {"targets": "ffn"},
    "bi-mpnet": {"backbone": "mpnet"},
}
#: the ``gpu`` profile's recipe on its backbone (`uqbench.core.profiles.GPU`, letters head) and
#: its variants: what a GPU lease measures to choose that profile's epochs and lr (docs/gpu.md);
#: not in the default list, which runs on the CPU
GPU_BASE: dict[str, Any] = {"head": "letters", "lr": 5e-4, "head_lr": 0.1, "epochs": 1,
                            "train_cap": 800, "targets": "ffn", "top": 8, "batch": 16,
                            "backbone": "qwen2.5-coder-0.5b"}
GPU_PRESETS: dict[str, dict[str, Any]] = {
    "gpu-zero": {**GPU_BASE, "epochs": 0},
    "gpu": GPU_BASE,
    "gpu-lr2e-3": {**GPU_BASE, "lr": 2e-3},
    "gpu-ep3": {**GPU_BASE, "epochs": 3},
    "gpu-lr2e-3-ep2": {**GPU_BASE, "lr": 2e-3, "epochs": 2},
    "gpu-all-blocks": {**GPU_BASE, "targets": "auto", "top": 0},
    # Qwen2.5-Coder-1.5B, the stronger backbone zero-shot (benchmarks/results/gpu-leases.md has
    # the table); its training time is a lease's to measure
    "gpu15-zero": {**GPU_BASE, "backbone": "qwen2.5-coder-1.5b", "epochs": 0},
    "gpu15": {**GPU_BASE, "backbone": "qwen2.5-coder-1.5b"},
    "gpu15-lr2e-3": {**GPU_BASE, "backbone": "qwen2.5-coder-1.5b", "lr": 2e-3},
    # the lease's candidates on the 1.5B (`benchmarks.gpu_lease.CANDIDATES`; docs/recipe.md
    # says why each is there): more passes, a learning rate between the 0.5B's 5e-4 (barely
    # moved) and 2e-3 (collapsed), attention with the FFN on the same last 8 blocks
    "gpu15-ep2": {**GPU_BASE, "backbone": "qwen2.5-coder-1.5b", "epochs": 2},
    "gpu15-lr1e-3": {**GPU_BASE, "backbone": "qwen2.5-coder-1.5b", "lr": 1e-3},
    "gpu15-attn": {**GPU_BASE, "backbone": "qwen2.5-coder-1.5b", "targets": "auto"},
}


def recipe_profile(base: Any, cand: dict[str, Any], name: str) -> Any:
    """``base`` (a `uqbench.core.profiles.Profile`) with a candidate's recipe, called ``name``:
    what ``uqbench run`` trains with when it runs that candidate (the keys' meanings are this
    module's: ``top`` 0 = every block, ``max_length`` 0 = the profile's)."""
    return dataclasses.replace(
        base, name=name, lr=float(cand["lr"]), head_lr=float(cand["head_lr"]),
        epochs=int(cand["epochs"]), train_cap=int(cand["train_cap"]),
        target_modules=str(cand["targets"]), top_layers=int(cand["top"]) or None,
        batch_size=int(cand["batch"]), max_length=int(cand["max_length"]) or base.max_length)


def parse_candidate(text: str) -> tuple[str, dict[str, Any]]:
    name, _, rest = text.partition(":")
    presets = {**PRESETS, **GPU_PRESETS}
    cand = {**BASE, **presets.get(name, {})}
    if not rest and name not in presets:
        raise SystemExit(f"unknown preset {name!r}; valid: {', '.join(presets)} "
                         "(or name:key=value,...)")
    for kv in filter(None, rest.split(",")):
        k, _, v = kv.partition("=")
        if k not in BASE:
            raise SystemExit(f"unknown recipe key {k!r}; valid: {', '.join(BASE)}")
        cand[k] = type(BASE[k])(float(v)) if isinstance(BASE[k], (int, float)) else v
    return name, cand


def target_modules(value: str) -> str | tuple[str, ...]:
    """A candidate's ``targets``: ``auto``, ``ffn`` or '+'-joined module-name suffixes."""
    return tuple(value.split("+")) if "+" in value else value


def boot_ci(correct: np.ndarray, n_boot: int = 1000, seed: int = 0) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    means = correct[rng.integers(0, len(correct), (n_boot, len(correct)))].mean(1)
    return float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def run_candidate(name: str, cand: dict[str, Any], profile: str, data_dir: str | None,
                  cache_dir: str, backbones: dict[str, Any], id_cap: int | None = None,
                  domains: list[str] | None = None, suite_name: str = "pooled"
                  ) -> dict[str, Any]:
    import torch

    from baselines import forward, heads, moe, train
    from baselines.backbones import load_backbone
    from uqbench.core.profiles import get_profile
    from uqbench.data.suites.build import build_suite

    prof = get_profile(profile)
    prof = dataclasses.replace(prof, train_cap=int(cand["train_cap"]),
                               max_length=int(cand["max_length"]) or prof.max_length)
    suite = build_suite(suite_name, prof, data_dir=data_dir, cache_dir=f"{cache_dir}/splits",
                        progress=False)
    load_s = None   # seconds loading the backbone (a GGUF converted on a first load)
    if cand["backbone"] not in backbones:   # on the GPU where there is one (bfloat16)
        t0 = time.perf_counter()
        backbones[cand["backbone"]] = load_backbone(
            cand["backbone"], cache_dir=cache_dir,
            device="cuda" if torch.cuda.is_available() else None)
        load_s = round(time.perf_counter() - t0, 1)
    torch.manual_seed(0)
    heads.PREFIX_CACHE.clear()  # each candidate pays for its own frozen-prefix states
    adapter = moe.MoELoRAConfig(seed=0, target_modules=target_modules(cand["targets"]),
                                top_layers=int(cand["top"]) or None)
    model = heads.make_moe(backbones[cand["backbone"]], adapter,
                           mode=cand["head"], seed=0)
    records = [r for s in suite.role("train") for r in s.records]
    t0 = time.perf_counter()
    losses: tuple[float, ...] = ()
    diverged, failure = None, None
    initial, curves = None, None
    if cand["epochs"] > 0:
        cfg = train.TrainConfig(lr=cand["lr"], head_lr=cand["head_lr"], epochs=int(cand["epochs"]),
                                batch_size=int(cand["batch"]), max_length=prof.max_length, seed=0)
        try:
            res = train.train(model, records, cfg, progress=False)
            losses, initial, curves = res.losses, res.initial, res.curves
        except FloatingPointError as exc:   # a recipe that diverges is a finding: the search
            diverged, failure = str(exc), exc   # records it and goes on to the next candidate
            warnings.warn(f"recipe_search: candidate {name!r} diverged ({exc}); not scored",
                          stacklevel=2)
    else:   # no training: the untrained model's loss is still the row's step 0
        initial = train.step_zero(model, records, max_length=prof.max_length,
                                  batch_size=prof.eval_batch_size)
    t_train = time.perf_counter() - t0
    row: dict[str, Any] = {"candidate": name, **cand, "max_length": prof.max_length,
                           "device": str(model.device), "suite": suite.name,
                           "profile": profile, "id_cap": id_cap, "backbone_load_s": load_s,
                           "train_records": len(records),
                           "steps": len(losses),
                           "final_loss": float(np.mean(losses[-10:])) if losses else None,
                           "first_loss": float(np.mean(losses[:10])) if losses else None,
                           "train_seconds": round(t_train, 1),
                           **domain_training(initial, curves)}
    if diverged is not None:
        return {**row, "diverged": diverged,
                "diverged_step": getattr(failure, "step", None),
                "diverged_layers": getattr(failure, "layers", None)}
    t0 = time.perf_counter()
    pooled = []
    for dom in domains or suite.domains:
        recs = suite.split(dom, "id").records[:id_cap]
        out = forward.collect(model, recs, batch_size=prof.eval_batch_size,
                              max_length=prof.max_length, progress=False)
        correct = (out["logits"].argmax(1) == np.array([r.answer for r in recs])).astype(float)
        row[f"cut_{dom}"] = round(float(np.mean(out["cut"] == heads.base.CUT_OPTION)), 3)
        pooled.append(correct)
        lo, hi = boot_ci(correct)
        row[f"acc_{dom}"] = [round(float(correct.mean()), 3), round(lo, 3), round(hi, 3)]
    allc = np.concatenate(pooled)
    row["id_questions"] = len(allc)
    lo, hi = boot_ci(allc)
    row["acc_pooled"] = [round(float(allc.mean()), 3), round(lo, 3), round(hi, 3)]
    row["eval_seconds"] = round(time.perf_counter() - t0, 1)
    return row


def domain_training(initial: dict[str, Any] | None, curves: dict[str, Any] | None
                    ) -> dict[str, Any]:
    """A row's per-domain training columns from the training log (`baselines.train.TrainResult`
    ``initial`` and ``curves``): ``initial_loss_<d>``/``initial_acc_<d>`` (step 0), the last
    interval's ``train_loss_<d>``/``train_acc_<d>`` (None where it had no question of ``d``),
    and both logs as they are (``initial``, ``curves``)."""
    out: dict[str, Any] = {"initial": initial, "curves": curves}
    for d, v in ((initial or {}).get("domains") or {}).items():
        out[f"initial_loss_{d}"], out[f"initial_acc_{d}"] = v["loss"], v["accuracy"]
    for d, c in ((curves or {}).get("domains") or {}).items():
        out[f"train_loss_{d}"] = c["loss"][-1] if c["loss"] else None
        out[f"train_acc_{d}"] = c["accuracy"][-1] if c["accuracy"] else None
    return out


def table(rows: list[dict[str, Any]]) -> str:
    """The markdown table of benchmarks/results/recipe-searches.md: one row per candidate."""
    doms = [k[4:] for k in next((r for r in rows if "acc_pooled" in r), rows[0])
            if k.startswith("acc_")]
    head = ["candidate", "head", "lr", "head_lr", "epochs", "train/domain", "targets", "top",
            "batch", "backbone", *doms, "final loss", "train s", "eval s"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        accs = ([f"{a:.3f} [{lo:.2f}, {hi:.2f}]" for a, lo, hi in (r[f"acc_{d}"] for d in doms)]
                if "acc_pooled" in r else ["skipped" if "skipped" in r else "diverged"] * len(doms))
        loss = "-" if r.get("final_loss") is None else f"{r['final_loss']:.3f}"
        cells = [r["candidate"], r["head"], f"{r['lr']:g}", f"{r['head_lr']:g}", r["epochs"],
                 r["train_cap"], r["targets"], r.get("top", 0) or "all", r.get("batch", 16),
                 r["backbone"], *accs, loss, r.get("train_seconds", "-"),
                 r.get("eval_seconds", "-")]
        out.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--candidates", default=",".join(PRESETS),
                    help="';'-separated candidates (preset names or name:key=value,...)")
    ap.add_argument("--profile", default="cpu", help="caps and batch sizes (train_cap overridden)")
    ap.add_argument("--suite", default="pooled",
                    help="a registered suite or a suite YAML file (default: pooled)")
    ap.add_argument("--data-dir", help="local dataset copies (default $UQBENCH_DATA)")
    ap.add_argument("--cache-dir", default=str(resolve_cache_dir()))
    ap.add_argument("--out", help="append JSON lines here too")
    ap.add_argument("--id-cap", type=int, metavar="N", help="evaluate the first N ID questions "
                    "of each domain only (default: the profile's ID split; e.g. a zero-shot "
                    "check of a large backbone on the CPU)")
    ap.add_argument("--domains", help="evaluate only these domains (comma-separated; default: "
                    "all of the suite's)")
    ap.add_argument("--time-budget", type=float, metavar="SECONDS",
                    help="skip (with a row saying so) each candidate that would end past this "
                         "many seconds from the start, judged by the longest candidate so far")
    ap.add_argument("--table", metavar="JSONL", help="print the markdown table of a finished "
                    "search's JSON lines and exit")
    args = ap.parse_args(argv)
    if args.id_cap is not None and args.id_cap < 1:
        ap.error(f"--id-cap {args.id_cap}: give a number of questions >= 1")
    if args.domains:
        from uqbench.data.suites.spec import get_suite_spec

        valid = [d.name for d in get_suite_spec(args.suite).domains]
        if unknown := sorted(set(args.domains.split(",")) - set(valid)):
            raise SystemExit(f"--domains: no domain {', '.join(unknown)} in the suite; valid: "
                             f"{', '.join(valid)}")
    if args.table:
        with open(args.table) as f:
            print(table([json.loads(line) for line in f if line.strip()]))
        return 0
    # ';' separates candidates; without one, a single "name:key=value,..." is one candidate and
    # a list of preset names is comma-separated
    sep = ";" if ";" in args.candidates or ":" in args.candidates else ","
    cands = [parse_candidate(c) for c in args.candidates.split(sep) if c]
    from baselines.train import deterministic_cublas
    deterministic_cublas()   # before the backbone starts CUDA, as a run sets it
    backbones: dict[str, Any] = {}
    start, longest = time.perf_counter(), 0.0
    for name, cand in cands:
        used = time.perf_counter() - start
        if args.time_budget is not None and used + longest > args.time_budget:
            emit({"candidate": name, **cand, "profile": args.profile, "suite": args.suite,
                  "skipped": f"time budget: {used:.0f} s of {args.time_budget:.0f} s used, and "
                             f"the longest candidate so far took {longest:.0f} s"}, args.out)
            continue
        t0 = time.perf_counter()
        row = run_candidate(name, cand, args.profile, args.data_dir, args.cache_dir, backbones,
                            args.id_cap, args.domains.split(",") if args.domains else None,
                            args.suite)
        emit(row, args.out)
        longest = max(longest, time.perf_counter() - t0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
