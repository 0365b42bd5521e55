"""Where a MoE-LoRA training diverges: one JSON line per training step, per adapted layer.

Trains one `recipe_search` candidate (default ``gpu-all-blocks``: MoE-LoRA on every attention
and MLP linear of Qwen2.5-Coder-0.5B, lr 5e-4, the ``gpu`` profile's splits) through the real
training loop, with hooks that read, for every step:

- per adapted linear, in forward order: the largest |input| (``h``: outlier activations of the
  backbone), |router logit|, |expert code| ``A h`` (``z``), |adapter output| ``B u``
  (``delta``), |output| (``out``) and |dL/d output| (``gy``), and whether its output and
  its output's gradient are finite;
- per trainable parameter, its gradient's norm before clipping (``grad_total``: the global
  norm that clipping reads; ``grad_top``: the largest few);
- the first layer whose output was non-finite (``first_nonfinite_forward``) and the first,
  in backward order, whose output gradient was (``first_nonfinite_backward``), and the
  parameters whose gradient was (``grad_nonfinite``).

It stops after the first step with a non-finite value (or after ``--steps``). The training
loop raises on a non-finite loss at its next log read; the lines say which step and layer
came first.

    python -m benchmarks.divergence --profile gpu --candidate gpu-all-blocks \\
        --steps 40 --out divergence.jsonl

The backbone trains in bfloat16 on the CPU too, as on a GPU. docs/recipe.md says what the CPU
runs of this setting showed and why the recorded NaN needs a GPU to be reached.
"""
from __future__ import annotations

import argparse
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from benchmarks import emit

#: layers listed per quantity in a step's line (the largest)
TOP = 6


class _StopAfter(Exception):
    """Raised by a hook to end training once the wanted steps are recorded."""


class StepProbe:
    """Hooks on a model's MoE-LoRA layers and trainable parameters that record one row per
    training step (see the module docstring); ``rows`` holds the finished steps. A step starts
    at the model's forward; ``stop_after`` (steps) ends training by raising from that hook."""

    def __init__(self, model: nn.Module, stop_after: int | None = None,
                 out: str | None = None) -> None:
        from baselines.moe.layer import MoELoRALinear

        self.model, self.stop_after, self.out = model, stop_after, out
        self.rows: list[dict[str, Any]] = []
        self.cur: dict[str, Any] | None = None
        self._t = time.perf_counter()
        self.layers = {id(m): _short(n) for n, m in model.named_modules()
                       if isinstance(m, MoELoRALinear)}
        self.handles = [model.register_forward_pre_hook(self._step_start)]
        for m in model.modules():
            if id(m) in self.layers:
                self.handles.append(m.register_forward_hook(self._layer))
        for n, p in model.named_parameters():
            if p.requires_grad:
                self.handles.append(p.register_post_accumulate_grad_hook(self._grad_hook(n)))

    def close(self) -> None:
        """Emit the last step and remove the hooks."""
        self._finish()
        for h in self.handles:
            h.remove()

    # -- hooks ----------------------------------------------------------------------------
    def _step_start(self, module: nn.Module, args: Any) -> None:
        if not module.training:
            return
        self._finish()
        if self.stop_after is not None and len(self.rows) >= self.stop_after:
            raise _StopAfter
        if self.rows and _nonfinite(self.rows[-1]):
            raise _StopAfter
        self.cur = {"step": len(self.rows), "layers": {}, "grads": {}, "backward": []}

    @torch.no_grad()
    def _layer(self, m: Any, inp: tuple[Tensor, ...], out: Tensor) -> None:
        if self.cur is None:
            return
        name = self.layers[id(m)]
        h = inp[0].reshape(-1, m.in_features)
        if m.token_mask is not None:
            h = h[m.token_mask.reshape(-1).to(h.device)]
        h = h.to(m.router.weight.dtype)
        logits = h @ m.router.weight.t()                                  # (T, N)
        probs = logits.softmax(-1)
        top = probs.topk(m.gate.k, -1)
        w = torch.zeros_like(probs).scatter(
            1, top.indices, top.values / top.values.sum(-1, keepdim=True)) * m.scaling
        z = torch.einsum("te,nre->tnr", h, m.lora_A)                      # (T, N, r)
        delta = (z * w[:, :, None]).reshape(len(h), -1) @ m._b_rows()    # (T, O)
        self.cur["layers"][name] = {
            "h": _amax(h), "logit": _amax(logits), "z": _amax(z), "delta": _amax(delta),
            "out": _amax(out), "finite": bool(torch.isfinite(out).all())}
        if out.requires_grad:
            out.register_hook(self._gy_hook(name))

    def _gy_hook(self, name: str) -> Any:
        cur = self.cur

        def hook(g: Tensor) -> None:
            assert cur is not None
            cur["layers"][name]["gy"] = _amax(g)
            cur["layers"][name]["gy_finite"] = bool(torch.isfinite(g).all())
            cur["backward"].append(name)
        return hook

    def _grad_hook(self, name: str) -> Any:
        def hook(p: Tensor) -> None:
            if self.cur is not None and p.grad is not None:
                self.cur["grads"][name] = float(p.grad.detach().float().norm())
        return hook

    # -- rows -----------------------------------------------------------------------------
    def _finish(self) -> None:
        if self.cur is None:
            return
        cur, self.cur = self.cur, None
        layers, grads = cur.pop("layers"), cur.pop("grads")
        order = cur.pop("backward")
        finite = [v for v in grads.values() if math.isfinite(v)]
        row: dict[str, Any] = {
            "name": "divergence_step", "step": cur["step"],
            "seconds": round(time.perf_counter() - self._t, 2),
            "grad_total": math.sqrt(sum(v * v for v in finite)) if finite else None,
            "grad_top": sorted(((n, round(v, 4)) for n, v in grads.items() if math.isfinite(v)),
                               key=lambda kv: -kv[1])[:TOP],
            "grad_nonfinite": sorted(n for n, v in grads.items() if not math.isfinite(v)),
            "first_nonfinite_forward": next((n for n, v in layers.items() if not v["finite"]),
                                            None),
            "first_nonfinite_backward": next((n for n in order
                                              if not layers[n].get("gy_finite", True)), None)}
        for key in ("h", "logit", "z", "delta", "out", "gy"):
            row[f"top_{key}"] = sorted(((n, round(v[key], 4)) for n, v in layers.items()
                                        if key in v), key=lambda kv: -kv[1])[:TOP]
        self._t = time.perf_counter()
        self.rows.append(row)
        emit(row, self.out)


def _nonfinite(row: dict[str, Any]) -> bool:
    return bool(row["grad_nonfinite"] or row["first_nonfinite_forward"]
                or row["first_nonfinite_backward"])


def _amax(t: Tensor) -> float:
    return float(t.detach().abs().max()) if t.numel() else 0.0


def _short(name: str) -> str:
    """``backbone.model.model.layers.3.mlp.down_proj`` -> ``3.mlp.down_proj``."""
    return name.split("layers.", 1)[-1]


@contextmanager
def probed(model: nn.Module, stop_after: int | None = None, out: str | None = None
           ) -> Iterator[StepProbe]:
    """A `StepProbe` on ``model`` for the block; training ended by it is not an error."""
    probe = StepProbe(model, stop_after, out)
    try:
        yield probe
    except _StopAfter:
        pass
    finally:
        probe.close()


def run(candidate: str, profile: str, steps: int, data_dir: str | None, cache_dir: str,
        out: str | None) -> list[dict[str, Any]]:
    """Train ``candidate`` (a `recipe_search` candidate) under a `StepProbe`; its rows."""
    import dataclasses

    from baselines import heads, moe, train
    from baselines.backbones import load_backbone
    from benchmarks.recipe_search import parse_candidate, target_modules
    from uqbench.core.profiles import get_profile
    from uqbench.data.suites.build import build_suite

    name, cand = parse_candidate(candidate)
    base = get_profile(profile)
    prof = dataclasses.replace(base, train_cap=int(cand["train_cap"]),
                               max_length=int(cand["max_length"]) or base.max_length)
    suite = build_suite("pooled", prof, data_dir=data_dir, cache_dir=f"{cache_dir}/splits",
                        progress=False)
    bb = load_backbone(cand["backbone"], cache_dir=cache_dir,
                       device="cuda" if torch.cuda.is_available() else None,
                       dtype=torch.bfloat16)
    torch.manual_seed(0)
    adapter = moe.MoELoRAConfig(seed=0, target_modules=target_modules(cand["targets"]),
                                top_layers=int(cand["top"]) or None)
    model = heads.make_moe(bb, adapter, mode=cand["head"], seed=0, copy=False)
    records = [r for s in suite.role("train") for r in s.records]
    cfg = train.TrainConfig(lr=cand["lr"], head_lr=cand["head_lr"], epochs=int(cand["epochs"]),
                            batch_size=int(cand["batch"]), max_length=prof.max_length, seed=0)
    emit({"name": "divergence_setting", "candidate": name, **cand, "profile": profile,
          "max_length": prof.max_length, "device": str(model.device),
          "dtype": str(next(model.backbone.parameters()).dtype),
          "train_records": len(records)}, out)
    with probed(model, steps, out) as probe:
        try:
            train.train(model, records, cfg, progress=False)
        except FloatingPointError as exc:
            emit({"name": "divergence_stop", "error": str(exc)}, out)
    return probe.rows


def main(argv: list[str] | None = None) -> int:
    from uqbench.files.cache import resolve_cache_dir

    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--candidate", default="gpu-all-blocks",
                    help="a recipe_search preset or name:key=value,... (default gpu-all-blocks)")
    ap.add_argument("--profile", default="gpu")
    ap.add_argument("--steps", type=int, default=40, help="steps recorded at most")
    ap.add_argument("--data-dir", help="local dataset copies (default $UQBENCH_DATA)")
    ap.add_argument("--cache-dir", default=str(resolve_cache_dir()))
    ap.add_argument("--out", help="append the JSON lines here too")
    a = ap.parse_args(argv)
    run(a.candidate, a.profile, a.steps, a.data_dir, a.cache_dir, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
