"""Budget thermostat (paper Eq. "budget"): bisection on a gate's threshold so that the mean
number of active experts, over non-padding tokens and all MoE layers, equals a budget ``B``.

``k`` at later layers depends on the routing of earlier ones, so every bisection step re-runs the
real forward over the whole (unlabeled) calibration set. Mean ``k`` is a step function of ``tau``:
when no threshold lands within ``tol`` of the budget the nearest achieved value is returned and
``met`` is False; the result never claims more than it measured.

Usage::

    res = calibrate(model, batches, budget=4.0)               # global tau; model left gated
    res = calibrate(model, batches, 4.0, per_layer=True)      # one tau per layer, front to back
    res = calibrate_entropy_k(model, batches, 4.0)            # EntropyK's scale
    gate, res = calibrate_kind(GATES.get("care"), model, batches, 4.0, {})  # any registered kind
    set_gate(model, random_k_from_care(model, batches, res.tau))  # RandomK at the same budget
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from baselines.gates import TAU_MIN, Care, EntropyK, Gate, RandomK
from baselines.moe import (
    get_gates,
    moe_layers,
    record_stats,
    set_gate,
    set_token_mask,
)
from uqbench.core.gating import GATES, GateKind

Forward = Callable[[nn.Module, Any], Any]


@dataclass(frozen=True)
class CalibrationResult:
    """tau : calibrated parameter (``tau`` for Care/NucleusOnly, ``scale`` for EntropyK); one
    float, or one per MoE layer when ``per_layer``. achieved : mean ``k`` measured at ``tau``
    over non-padding tokens and all layers. target : the budget. iterations : forward passes
    over the calibration set. met : ``|achieved - target| <= tol`` (per layer when
    ``per_layer``). layer_achieved : mean ``k`` of each layer at ``tau``.
    """
    tau: float | list[float]
    achieved: float
    target: float
    iterations: int
    per_layer: bool
    met: bool
    layer_achieved: list[float]


def _default_forward(model: nn.Module, batch: Any) -> Any:
    return model(**batch)


def mean_k(model: nn.Module, batches: Sequence[Any], forward: Forward | None = None
           ) -> tuple[float, list[float]]:
    """Mean active experts over non-padding tokens: (all layers, per layer), current gates.

    Runs ``forward(model, batch)`` under ``no_grad`` in eval mode (restored afterwards), with the
    token mask set from ``batch["attention_mask"]`` when the batch is a mapping that has one.
    """
    ks = measure_k(model, batches, forward)
    per = [float(k.double().mean()) for k in ks]
    total = torch.cat(ks).double()
    return float(total.mean()), per


def measure_k(model: nn.Module, batches: Sequence[Any], forward: Forward | None = None, *,
              only_layer: int | None = None) -> list[Tensor]:
    """Per MoE layer, the (n_tokens,) int64 ``k`` of every non-padding calibration token.

    ``only_layer=i`` measures layer i alone and cuts each forward short right after it (layer
    i's routing depends only on earlier layers); the other entries are then empty.
    """
    forward = forward or _default_forward
    layers = moe_layers(model)
    modes = [(m, m.training) for m in model.modules()]
    prev_record = [layer.record for layer in layers]
    out: list[list[Tensor]] = [[] for _ in layers]
    hook = None
    if only_layer is not None:
        def stop(module: nn.Module, args: Any, output: Any) -> None:
            raise _StopForward

        hook = layers[only_layer].register_forward_hook(stop)
    model.eval()
    record_stats(model, True)
    try:
        with torch.no_grad():
            for batch in batches:
                am = batch.get("attention_mask") if isinstance(batch, Mapping) else None
                set_token_mask(model, am.bool() if am is not None else None)
                try:
                    forward(model, batch)
                except _StopForward:
                    pass
                measured = range(len(layers)) if only_layer is None else [only_layer]
                ks = []
                for i in measured:
                    last = layers[i].last_stats
                    if last is None:
                        raise ValueError(f"measure_k: MoE layer {i} did not run in forward()")
                    ks.append(last["k"])
                k = torch.stack(ks)                                       # (layers, *lead)
                keep = (am.bool().to(k.device) if am is not None
                        else torch.ones(k.shape[1:], dtype=torch.bool, device=k.device))
                # every layer's tokens read back at once: one wait for a GPU per batch
                for i, row in zip(measured, k[:, keep].round().long().cpu(), strict=False):
                    out[i].append(row)
    finally:
        if hook is not None:
            hook.remove()
        set_token_mask(model, None)
        for layer, rec in zip(layers, prev_record, strict=False):
            layer.record = rec
        for m, training in modes:
            m.training = training
    return [torch.cat(acc) if acc else torch.zeros(0, dtype=torch.long) for acc in out]


class _StopForward(Exception):
    """Raised by a hook to end a forward once the layer being calibrated has run."""


def bisect_budget(f: Callable[[float], float], budget: float, lo: float, hi: float, tol: float,
                  max_iter: int, expand_hi: bool) -> tuple[float, float, int, bool]:
    """Bisection for ``f(x) = budget`` with ``f`` non-decreasing (in practice); returns the
    evaluated ``x`` closest to the budget: (x, f(x), evaluations, met). Guards: the closest
    point seen is kept, so a non-monotone blip can cost precision but never a wrong report."""
    evals: dict[float, float] = {}

    def g(x: float) -> float:
        if x not in evals:
            evals[x] = f(x)
        return evals[x]

    def best() -> tuple[float, float, int, bool]:
        x = min(evals, key=lambda v: (abs(evals[v] - budget), v))
        return x, evals[x], len(evals), abs(evals[x] - budget) <= tol

    if g(hi) < budget - tol and expand_hi:
        while g(hi) < budget - tol and len(evals) < max_iter and hi < 1e6:
            prev, hi = g(hi), hi * 4
            if g(hi) <= prev:    # saturated: more scale admits no more experts
                break
    if g(hi) <= budget + tol or g(lo) >= budget - tol:
        return best()
    xtol = 1e-6 * (hi - lo)   # finer than any tau a finite calibration set can tell apart
    while len(evals) < max_iter and hi - lo > xtol:
        mid = 0.5 * (lo + hi)
        v = g(mid)
        if abs(v - budget) <= tol:
            break
        lo, hi = (mid, hi) if v < budget else (lo, mid)
    return best()


def calibrate(model: nn.Module, batches: Iterable[Any], budget: float = 4.0,
              per_layer: bool = False, *, gate_factory: Callable[[float], Gate] = Care,
              tol: float = 0.05, max_iter: int = 30, forward: Forward | None = None,
              bounds: tuple[float, float] = (TAU_MIN, 1.0), expand_hi: bool = False
              ) -> CalibrationResult:
    """Set a gate's threshold by bisection so that the mean ``k`` equals ``budget``.

    Parameters
    ----------
    model : an injected model; left with the calibrated gate(s) set.
    batches : the unlabeled calibration set (each passed to ``forward``).
    budget : target mean number of active experts per token and layer (paper: B = 4).
    per_layer : calibrate one threshold per MoE layer, front to back, each to ``budget``
        (layer l's k depends only on earlier layers, which are already fixed).
    gate_factory : threshold -> gate, e.g. ``Care`` (default, paper defaults otherwise),
        ``NucleusOnly``, ``lambda t: Care(t, gamma=0.5)``.
    tol : accepted ``|mean k - budget|``; bisection stops at the first threshold inside it.
    max_iter : forward passes over ``batches`` per calibrated threshold.
    forward : ``forward(model, batch)``; default ``model(**batch)``.
    bounds : search interval of the threshold (``(TAU_MIN, 1)`` for tau).
    expand_hi : grow the upper bound by 4x while mean k is below budget (unbounded scales).

    Returns
    -------
    CalibrationResult with the achieved mean k measured at the returned threshold.
    """
    if not budget > 0:
        raise ValueError(f"calibrate: budget={budget!r} is invalid; use a mean expert count > 0")
    if not tol > 0 or max_iter < 2:
        raise ValueError(f"calibrate: tol={tol!r}, max_iter={max_iter!r}; use tol > 0 and "
                         "max_iter >= 2")
    batches = list(batches)
    if not batches:
        raise ValueError("calibrate: batches is empty; give at least one calibration batch")
    layers = moe_layers(model)
    if not layers:
        raise ValueError("calibrate: model has no MoE-LoRA layers; call inject() first")
    lo, hi = bounds

    if not per_layer:
        seen: dict[float, tuple[float, list[float]]] = {}

        def f(x: float) -> float:
            set_gate(model, gate_factory(x))
            seen[x] = mean_k(model, batches, forward)
            return seen[x][0]

        x, _, n, met = bisect_budget(f, budget, lo, hi, tol, max_iter, expand_hi)
        set_gate(model, gate_factory(x))
        achieved, per = seen[x]   # measured at x during the search: no pass to repeat it
        return CalibrationResult(x, achieved, budget, n, False, met, per)

    xs = [hi] * len(layers)
    total, all_met = 0, True
    for i in range(len(layers)):
        def f_layer(x: float, i: int = i) -> float:
            set_gate(model, [gate_factory(v) for v in xs[:i] + [x] + xs[i + 1:]])
            return float(measure_k(model, batches, forward, only_layer=i)[i].double().mean())

        xs[i], _, n, met = bisect_budget(f_layer, budget, lo, hi, tol, max_iter, expand_hi)
        total += n
        all_met &= met
    set_gate(model, [gate_factory(v) for v in xs])
    achieved, per = mean_k(model, batches, forward)
    all_met = all(abs(v - budget) <= tol for v in per)   # re-measured with every layer fixed
    return CalibrationResult(xs, achieved, budget, total, True, all_met, per)


def calibrate_entropy_k(model: nn.Module, batches: Iterable[Any], budget: float = 4.0,
                        per_layer: bool = False, *, k_min: int = 1, k_max: int = 8,
                        tol: float = 0.05, max_iter: int = 30, forward: Forward | None = None
                        ) -> CalibrationResult:
    """:func:`calibrate` for :class:`EntropyK`'s ``scale`` (searched in ``[0, 1]``, widened 4x
    at a time while the budget is out of reach)."""
    return calibrate(model, batches, budget, per_layer,
                     gate_factory=lambda s: EntropyK(s, k_min, k_max), tol=tol,
                     max_iter=max_iter, forward=forward, bounds=(0.0, 1.0), expand_hi=True)


def calibrate_kind(kind: GateKind, model: nn.Module, batches: Iterable[Any], budget: float,
                   params: Mapping[str, Any], *, forward: Forward | None = None
                   ) -> tuple[Gate, CalibrationResult]:
    """Calibrate a registered gate kind (`uqbench.core.gating.GateKind`) for ``budget``: bisection
    on its ``knob`` within its ``bounds`` (:func:`calibrate`), the other fields from ``params``.

    A kind with a ``proxy`` calibrates the proxy's knob instead, then is built from the proxy's
    per-token ``k`` at that knob with ``kind.cls.from_counts(ks, seed=0)`` (RandomK: CARE's
    ``k`` histogram at the budget, as :func:`random_k_from_care`). The model is left gated by
    the calibrated proxy (or the gate itself).
    """
    base = GATES.get(kind.proxy) if kind.proxy else kind
    if base.knob is None:
        raise ValueError(f"calibrate_kind: gate kind {kind.kind!r} has no knob to calibrate")
    knob = base.knob

    def factory(x: float) -> Gate:
        return base.cls(**{knob: x}, **params)  # type: ignore[no-any-return]

    batches = list(batches)
    res = calibrate(model, batches, budget, gate_factory=factory, forward=forward,
                    bounds=base.bounds, expand_hi=base.expand_hi)
    if kind.proxy is None:
        return factory(res.tau), res   # type: ignore[arg-type]
    ks = torch.cat(measure_k(model, batches, forward))   # under the calibrated proxy
    return kind.cls.from_counts(ks, seed=0), res  # type: ignore[attr-defined]


def care_k_histogram(model: nn.Module, batches: Iterable[Any], *, per_layer: bool = False,
                     forward: Forward | None = None) -> tuple[float, ...] | list[tuple[float, ...]]:
    """Histogram of ``k`` under the model's current gates (e.g. calibrated CARE): fractions for
    ``k = 1, 2, ...`` over non-padding tokens of all layers pooled, or one per layer."""
    ks = measure_k(model, list(batches), forward)
    hists = [RandomK.from_counts(k).histogram for k in ks]
    return hists if per_layer else RandomK.from_counts(torch.cat(ks)).histogram


def random_k_from_care(model: nn.Module, batches: Iterable[Any], tau: float | Sequence[float],
                       *, seed: int = 0, per_layer: bool = False,
                       care: Callable[[float], Gate] = Care, forward: Forward | None = None
                       ) -> RandomK | list[RandomK]:
    """RandomK gate(s) with CARE's ``k`` histogram measured at ``tau`` (a calibrated result's
    ``tau``; a list means per-layer taus). The model's gates are restored afterwards."""
    saved = get_gates(model)
    try:
        set_gate(model, [care(t) for t in tau] if isinstance(tau, Sequence) else care(tau))
        h = care_k_histogram(model, batches, per_layer=per_layer, forward=forward)
    finally:
        set_gate(model, saved)
    if per_layer:
        assert isinstance(h, list)
        return [RandomK(hist, seed + i) for i, hist in enumerate(h)]
    assert isinstance(h, tuple)
    return RandomK(h, seed)
