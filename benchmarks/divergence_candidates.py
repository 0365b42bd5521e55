"""Candidate causes of a diverging MoE-LoRA training, measured on the same data and seed: one
JSON line per candidate (docs/recipe.md, "The `gpu` recipe's divergence"; the measured lines in
benchmarks/results/divergence-candidates-cpu.jsonl).

The setting: a decoder backbone in bfloat16 (adapters in float32), on the GPU if there is one,
MoE-LoRA on every linear of its last ``--top`` blocks, the letters head, the ``--records``
ARC-Easy training questions of shortest letters prompt, lr ``--lr`` with the default warm-up
and cosine decay over ``--epochs``, through `baselines.train.train`; training is cut after
``--steps`` steps. Each candidate changes one thing, applied for the measurement only:

- ``none``: the code as it is;
- ``first-token``: the first token (position 0, the attention sink whose state carries the
  massive activations) gets no adapter output: its row of the experts' input is zeroed, so
  its codes ``A h`` are 0 and its routing gets no gradient from the loss;
- ``z-loss=C``: ST-MoE's router z-loss (Zoph et al. 2022), ``C`` times the mean over layers
  and non-padding tokens of ``logsumexp(router logits)^2``, added to the training loss;
- ``slow-router-a=F``: the routers and ``lora_A`` train at ``F`` times lr (``lora_B`` and the
  head at lr);
- ``slow-b=F``: ``lora_B`` trains at ``F`` times lr (the routers, ``lora_A`` and the head
  at lr);
- ``no-down-proj``: no adapter on ``down_proj``, the linear whose input carries the largest
  outliers;
- ``fan-in``: each linear's router and ``lora_A`` train at lr times the backbone's hidden size
  over the linear's input width (LoRA+'s and muP's ``1/n`` for the weights that read an
  ``n``-wide input under Adam: q/k/v/o/gate/up_proj keep lr, down_proj gets hidden/intermediate);
- ``input-l1``: each linear's router and ``lora_A`` train at lr times the median over the
  adapted linears of their input's mean per-token L1 norm over this linear's (at most 1), measured
  on the first training batch before any update: under Adam each weight moves by about lr a
  step, so a logit or code moves by about lr times the input's L1 norm.

Each line gives, per step (the step's forward, before its update; maxima over the adapted
linears): the training loss, the largest |router logit| and |expert code| ``A h`` and
|adapter output| at the first token and at the other tokens (padding included), and the
global gradient norm before clipping.

    python -m benchmarks.divergence_candidates --backbone qwen2.5-coder-0.5b \\
        --candidates none,first-token,z-loss=1e-3,slow-router-a=0.1 --out cands.jsonl
"""
from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from benchmarks import emit

CANDIDATES = ("none", "first-token", "z-loss", "slow-router-a", "slow-b", "no-down-proj",
              "fan-in", "input-l1")
#: the linears of a Llama-type block without down_proj
NO_DOWN = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj")


@contextmanager
def _patched(obj: Any, name: str, value: Any) -> Iterator[None]:
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def _first_token_out(layers: list[Any]) -> ExitStack:
    """Zero the first token's row of each layer's expert input (through its dropout mask)."""
    stack = ExitStack()
    for layer in layers:
        def draws(mask_of: Callable[[Tensor], Tensor], h: Tensor, layer: Any = layer) -> Tensor:
            keep = mask_of(h).clone()
            keep.view(-1, layer.token_mask.shape[1], keep.shape[-1])[:, 0] = False
            return keep
        stack.enter_context(_patched(layer, "mask_draws", draws))
    return stack


def _z_loss(layers: list[Any], coef: float, lb_coef: float) -> Any:
    """`load_balance_loss` plus ``coef / lb_coef`` times the mean router z-loss (the training
    loop multiplies the sum by ``lb_coef``)."""
    from baselines import moe
    from baselines.moe import token_mean, valid_tokens

    base = moe.load_balance_loss

    def loss(model: nn.Module) -> Tensor:
        z = torch.stack([token_mean(torch.logsumexp(m._fast_aux[0].float(), -1).square(),
                                    valid_tokens(m._fast_aux[3], m._fast_aux[0].device))
                         for m in layers]).mean()
        return base(model) + (coef / lb_coef) * z
    return _patched(moe, "load_balance_loss", loss)


def _slow(model: nn.Module, factor: float, parts: tuple[str, ...]) -> Any:
    """AdamW with the adapter parameters whose names hold one of ``parts`` in their own group
    at ``factor`` times lr."""
    names = {id(p): n for n, p in model.named_parameters()}
    adamw = torch.optim.AdamW

    def make(groups: list[dict[str, Any]], **kw: Any) -> torch.optim.Optimizer:
        first, rest = groups[0], list(groups[1:])
        slow = [p for p in first["params"] if any(k in names[id(p)] for k in parts)]
        fast = [p for p in first["params"] if not any(p is q for q in slow)]
        return adamw([{"params": fast, "lr": first["lr"]},
                      {"params": slow, "lr": first["lr"] * factor}, *rest], **kw)
    return _patched(torch.optim, "AdamW", make)


def _per_linear(model: nn.Module, layers: list[Any], factors: list[float]) -> Any:
    """AdamW with each layer's router and ``lora_A`` in a group of its own at its factor
    times lr (the rest as the training loop groups them)."""
    adamw = torch.optim.AdamW

    def make(groups: list[dict[str, Any]], **kw: Any) -> torch.optim.Optimizer:
        first, rest = groups[0], list(groups[1:])
        own = [[m.router.weight, m.lora_A] for m in layers]
        taken = {id(p) for ps in own for p in ps}
        others = [p for p in first["params"] if id(p) not in taken]
        return adamw([{"params": others, "lr": first["lr"]},
                      *({"params": ps, "lr": first["lr"] * f}
                        for ps, f in zip(own, factors, strict=True)),
                      *rest], **kw)
    return _patched(torch.optim, "AdamW", make)


@torch.no_grad()
def _input_l1(model: Any, layers: list[Any], records: list[Any], max_length: int) -> list[float]:
    """Each layer's input's mean per-token L1 norm over the real tokens of ``records``."""
    sums: dict[int, float] = {}

    def hook(m: Any, inp: tuple[Tensor, ...], out: Tensor) -> None:
        h = inp[0].reshape(-1, m.in_features).float()
        keep = m.token_mask.reshape(-1) if m.token_mask is not None else slice(None)
        sums[id(m)] = float(h[keep].abs().sum(-1).mean())
    handles = [m.register_forward_hook(hook) for m in layers]
    try:
        model.eval()
        model(model.encode(records, max_length))
    finally:
        for h in handles:
            h.remove()
        model.train()
    return [sums[id(m)] for m in layers]


class _Watch:
    """Per training step: the loss and, at the first token and the others (padding
    included: the rows every linear computes), the largest |router logit|, |code| and
    |adapter output| over the adapted linears."""

    KEYS = ("logit", "code", "delta")

    def __init__(self, layers: list[Any]) -> None:
        self.rows: list[dict[str, float]] = []
        self.cur = self._empty()
        self.handles = [m.register_forward_hook(self._layer) for m in layers]

    def _empty(self) -> dict[str, float]:
        return {f"{k}_{w}": 0.0 for k in self.KEYS for w in ("first", "other")}

    @torch.no_grad()
    def _layer(self, m: Any, inp: tuple[Tensor, ...], out: Tensor) -> None:
        if not m.training or m.token_mask is None:
            return
        L = m.token_mask.shape[1]
        h = inp[0].reshape(-1, L, m.in_features).to(m.router.weight.dtype)   # (B, L, E)
        vals = {"logit": h @ m.router.weight.t(),                            # (B, L, N)
                "code": torch.einsum("ble,nre->blnr", h, m.lora_A).flatten(2),
                "delta": (out.float() - m.base_layer(inp[0]).float()).reshape(
                    -1, L, m.out_features)}
        for k, v in vals.items():
            v = v.abs()
            self.cur[f"{k}_first"] = max(self.cur[f"{k}_first"], float(v[:, 0].max()))
            self.cur[f"{k}_other"] = max(self.cur[f"{k}_other"], float(v[:, 1:].max()))

    def step(self, loss: float) -> None:
        self.rows.append({"loss": round(loss, 3), **{k: round(v, 1) for k, v in self.cur.items()}})
        self.cur = self._empty()

    def close(self) -> None:
        for h in self.handles:
            h.remove()


class _Stop(Exception):
    pass


def run(backbone: str, candidate: str, *, top: int, lr: float, records: int, batch: int,
        epochs: int, steps: int, max_length: int, data_dir: str | None, cache_dir: str,
        out: str | None, bb: Any = None) -> dict[str, Any]:
    """Train one candidate; its JSON line."""
    from baselines import heads, moe, train
    from baselines.backbones import load_backbone
    from baselines.heads.decoder import letters_prompt
    from uqbench.data.sources import load_source

    name, _, arg = candidate.partition("=")
    if name not in CANDIDATES:
        raise SystemExit(f"unknown candidate {candidate!r}; valid: {', '.join(CANDIDATES)}")
    if bb is None:
        bb = load_backbone(backbone, dtype=torch.bfloat16, cache_dir=cache_dir)
    tok = bb.tokenizer
    pool = [it.record for it in load_source("arc-easy", "train", data_dir=data_dir).items
            if it.record is not None]
    length = {r.id: len(tok(letters_prompt(r))["input_ids"]) for r in pool}
    chosen = sorted(pool, key=lambda r: (length[r.id], r.id))[:records]
    targets = NO_DOWN if name == "no-down-proj" else "auto"
    torch.manual_seed(0)
    adapter = moe.MoELoRAConfig(seed=0, target_modules=targets, top_layers=top)
    model = heads.make_moe(bb, adapter, mode="letters", seed=0, copy=True)
    layers = moe.moe_layers(model.backbone)
    watch = _Watch(layers)
    per_example_ce = train.per_example_ce
    norms: list[float] = []
    grad_norms = train.grad_norms

    def ce(logits: Tensor, labels: Tensor) -> Tensor:
        v = per_example_ce(logits, labels)
        if model.training:
            if len(watch.rows) >= steps:
                raise _Stop
            watch.step(float(v.mean()))
        return v

    def gn(params: Any) -> Any:
        got = grad_norms(params)                    # (P,) one per parameter
        norms.append(round(float(got.norm()), 2))  # the global norm that clipping reads
        return got

    cfg = train.TrainConfig(lr=lr, epochs=epochs, batch_size=batch, max_length=max_length, seed=0)
    t0, error = time.perf_counter(), None
    factors: list[float] | None = None     # per-linear lr factors of the router and lora_A
    with ExitStack() as stack:
        stack.enter_context(_patched(train, "per_example_ce", ce))
        stack.enter_context(_patched(train, "grad_norms", gn))
        if name == "first-token":
            stack.enter_context(_first_token_out(layers))
        elif name == "z-loss":
            stack.enter_context(_z_loss(layers, float(arg or 1e-3), adapter.lb_coef))
        elif name == "slow-router-a":
            stack.enter_context(_slow(model, float(arg or 0.1), ("router", "lora_A")))
        elif name == "slow-b":
            stack.enter_context(_slow(model, float(arg or 0.1), ("lora_B",)))
        elif name == "fan-in":
            hidden = bb.model.config.hidden_size
            factors = [hidden / m.in_features for m in layers]
        elif name == "input-l1":
            l1 = _input_l1(model, layers, chosen[:batch], max_length)
            mid = sorted(l1)[len(l1) // 2]
            factors = [min(1.0, mid / v) for v in l1]
        if factors is not None:
            stack.enter_context(_per_linear(model, layers, factors))
        try:
            train.train(model, chosen, cfg, progress=False)
        except _Stop:
            pass
        except FloatingPointError as exc:
            error = str(exc)
    watch.close()
    rows = watch.rows
    line = {"name": "divergence_candidate", "backbone": backbone, "candidate": candidate,
            "top_layers": top, "targets": "no down_proj" if name == "no-down-proj" else "auto",
            "lr": lr, "batch": batch, "records": len(chosen), "max_length": max_length,
            "epochs": epochs,
            "dtype": str(next(bb.model.parameters()).dtype).removeprefix("torch."),
            "device": str(model.device), "steps": len(rows),
            "seconds": round(time.perf_counter() - t0, 1), "error": error,
            **{k: [r[k] for r in rows] for k in (rows[0] if rows else {})},
            "grad_norm": norms[:len(rows)],
            "lr_factors": None if factors is None else [round(f, 4) for f in factors],
            "max_loss": max((r["loss"] for r in rows), default=None),
            "max_router_logit": max((max(r["logit_first"], r["logit_other"]) for r in rows),
                                    default=None)}
    emit(line, out)
    return line


def main(argv: list[str] | None = None) -> int:
    from uqbench.files.cache import resolve_cache_dir

    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backbone", default="qwen2.5-coder-0.5b")
    ap.add_argument("--candidates", default="none,first-token,z-loss=1e-3,slow-router-a=0.1",
                    help=f"comma-separated, of {', '.join(CANDIDATES)} (=value where it takes one)")
    ap.add_argument("--top", type=int, default=3, help="adapted blocks (the last ones)")
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--records", type=int, default=32)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=6, help="of the schedule (cut at --steps)")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--max-length", type=int, default=64)
    ap.add_argument("--data-dir", help="local dataset copies (default $UQBENCH_DATA)")
    ap.add_argument("--cache-dir", default=str(resolve_cache_dir()))
    ap.add_argument("--out", help="append the JSON lines here too")
    a = ap.parse_args(argv)
    from baselines.backbones import load_backbone

    bb = load_backbone(a.backbone, dtype=torch.bfloat16, cache_dir=a.cache_dir,
                       device="cuda" if torch.cuda.is_available() else None)
    for cand in a.candidates.split(","):
        run(a.backbone, cand, top=a.top, lr=a.lr, records=a.records, batch=a.batch,
            epochs=a.epochs, steps=a.steps, max_length=a.max_length, data_dir=a.data_dir,
            cache_dir=a.cache_dir, out=a.out, bb=bb)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
