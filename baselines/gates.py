"""Expert-admission gates for MoE-LoRA layers, and CARE's reference functions.

A gate decides, per token, which experts are admitted. Gates are small frozen dataclasses and
can be swapped at inference without retraining (:func:`baselines.moe.set_gate`). They all admit
the top-``k`` experts by router probability; they differ only in how ``k`` is chosen:

=============  =================================================================================
``TopK``       fixed ``k`` (training gate; ``TopK(N)`` is the dense mixture)
``Care``       paper Algorithm 1: nucleus ``k_nu`` plus ``ceil(gamma * rho)`` on disagreement
``NucleusOnly`` ``Care`` with ``gamma = 0``
``RandomK``    ``k`` drawn per token from a histogram (CARE's, measured at the same budget)
``EntropyK``   ``k = clip(ceil(scale * H(p) * k_max), k_min, k_max)``, ``H`` normalised entropy
``DynMoLE``    DynMoLE's hybrid routing: top-p, or all experts when the Tsallis entropy is high
=============  =================================================================================

Gate protocol: ``select(probs, disagreement) -> Selection`` where ``probs`` is the (T, N) router
distribution and ``disagreement`` a callable mapping an admitted-set mask (T, N) bool to the
set's disagreement (T,). Only gates that need ``D`` call it (CARE with ``gamma > 0``), so TopK
pays nothing for it unless the layer records statistics. ``validate(n_experts)`` is called by
``set_gate`` to check ``k`` against the layer's ``N``.

Each gate class is registered for `uqbench.core.plan.GateSpec` kinds with ``@register_gate(kind,
knob=...)`` (`uqbench.core.gating`): the kind a spec names -- also the gate's one ``name``, which
run.json and the cache keys use --, the field the thermostat calibrates for a budget, and (from
the dataclass fields) the parameters a spec may set. A new gate is one such
class, in this module or in a plugin module.

Reference functions (plain and slow, written for reading and for testing the fast paths):
:func:`disagreement` (paper Eq. "disagree") and :func:`care_k` (paper Algorithm 1, per token).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Protocol, cast

import torch
from torch import Tensor

from uqbench.core.gating import GATES, register_gate

#: ``epsilon`` of the disagreement denominator (paper Eq. "disagree"). Absolute, on the unscaled
#: expert outputs ``e_i = B_i A_i h``: ``D = 0`` (not NaN) when every admitted output is 0, e.g.
#: right after LoRA's ``B = 0`` initialisation; negligible once ``sum p_i ||e_i||^2 >> 1e-8``.
EPS: float = 1e-8

#: Lower end of the tau search: ``C_1 >= 1e-6`` always, so every token gets ``k_nu = 1``.
TAU_MIN = 1e-6

DisagreementFn = Callable[[Tensor], Tensor]


def cumsum_tolerance(n_experts: int, dtype: torch.dtype) -> float:
    """Slack on ``C_k >= tau`` absorbing float rounding of the cumulative sum: ``N * eps(dtype)``.

    With it, ``p = [0.5, 0.3, 0.1, 0.1]`` and ``tau = 0.9`` admit 3 experts in float32 as in exact
    arithmetic. ``tau = 1`` is special-cased to admit all ``N`` experts (softmax weights are all
    positive, so ``min{k : C_k >= 1} = N`` exactly), whatever the rounding.
    """
    return n_experts * torch.finfo(dtype).eps


# --------------------------------------------------------------------------------------------
# reference functions
# --------------------------------------------------------------------------------------------


def disagreement(weights: Tensor, expert_outputs: Tensor, *, eps: float = EPS) -> Tensor:
    """Disagreement ``D`` of the admitted experts (paper Eq. "disagree"), reference version.

    ``D = (sum_i p~_i ||e_i||^2 - ||e_bar||^2) / (sum_i p~_i ||e_i||^2 + eps)`` with
    ``e_bar = sum_i p~_i e_i`` and ``p~`` the weights renormalised over the admitted set. The
    numerator equals ``sum_c Var_p~[e_{i,c}]`` (weighted variance summed over coordinates), the
    denominator the weighted mean squared norm, so ``D`` is in [0, 1]; ``D = 0`` when one expert is
    admitted or all admitted outputs agree. Clamped to [0, 1] against float rounding only.

    Parameters
    ----------
    weights : (T, N) router weights, zero outside the admitted set (renormalised here).
    expert_outputs : (T, N, d) expert outputs ``e_i``.

    Returns
    -------
    (T,) disagreement in [0, 1].

    Examples
    --------
    >>> w = torch.tensor([[0.5, 0.5]]); e = torch.tensor([[[1.0, 0.0], [-1.0, 0.0]]])
    >>> disagreement(w, e)
    tensor([1.])
    """
    if weights.ndim != 2 or expert_outputs.ndim != 3 or expert_outputs.shape[:2] != weights.shape:
        raise ValueError(f"disagreement: weights must be (T, N) and expert_outputs (T, N, d); got "
                         f"{tuple(weights.shape)} and {tuple(expert_outputs.shape)}")
    p = weights / weights.sum(-1, keepdim=True)                           # (T, N)
    mean = torch.einsum("tn,tnd->td", p, expert_outputs)                  # (T, d)
    m2 = (p * expert_outputs.pow(2).sum(-1)).sum(-1)                      # (T,)
    return ((m2 - mean.pow(2).sum(-1)) / (m2 + eps)).clamp(0.0, 1.0)


def care_k(probs: Tensor, expert_outputs: Tensor, *, tau: float, gamma: float = 2.0,
           delta: float = 0.55, k_min: int = 1, k_max: int = 8) -> tuple[Tensor, Tensor]:
    """CARE's expert count per token, paper Algorithm 1, one token at a time (reference).

    sort ``p`` descending; ``C_k`` cumulative mass; ``k_nu = min{k : C_k >= tau}``;
    ``S`` = top-``k_nu``; ``D = disagreement(S)``; ``rho = max(0, (D - delta) / (1 - delta))``;
    ``k = clip(k_nu + ceil(gamma * rho), k_min, k_max)``.
    ``C_k >= tau`` is tested with :func:`cumsum_tolerance` slack and ``tau = 1`` admits all.

    Parameters
    ----------
    probs : (T, N) router distribution.
    expert_outputs : (T, N, d) expert outputs.

    Returns
    -------
    k : (T,) int64 expert count; disagreement : (T,) ``D`` of the nucleus set ``S``.

    Examples
    --------
    >>> p = torch.tensor([[0.5, 0.3, 0.1, 0.1]]); e = torch.ones(1, 4, 2)
    >>> care_k(p, e, tau=0.75)[0]
    tensor([2])
    """
    Care(tau, gamma, delta, k_min, k_max)  # validates the arguments
    probs, expert_outputs = probs.detach(), expert_outputs.detach()
    T, N = probs.shape
    tol = cumsum_tolerance(N, probs.dtype)
    ks, ds = [], []
    for t in range(T):
        p = probs[t]
        order = sorted(range(N), key=lambda i: -float(p[i]))
        c, k_nu = 0.0, N
        if tau < 1.0:
            for j, i in enumerate(order, start=1):
                c += float(p[i])
                if c >= tau - tol:
                    k_nu = j
                    break
        w = torch.zeros_like(p)
        w[order[:k_nu]] = p[order[:k_nu]]
        d = disagreement(w[None], expert_outputs[t][None])[0]
        rho = max(0.0, (float(d) - delta) / (1.0 - delta))
        ks.append(min(max(k_nu + math.ceil(gamma * rho), k_min), k_max))
        ds.append(d)
    return torch.tensor(ks, dtype=torch.long), torch.stack(ds)


def normalized_entropy(probs: Tensor) -> Tensor:
    """``H(p) = -sum_i p_i log p_i / log N`` in [0, 1]; (..., N) -> (...); 0 when ``N = 1``."""
    n = probs.shape[-1]
    h = -torch.special.xlogy(probs, probs).sum(-1)
    return h / math.log(n) if n > 1 else torch.zeros_like(h)


def tsallis_entropy(probs: Tensor, q: float) -> Tensor:
    """Tsallis entropy ``S_q(p) = (1 - sum_i p_i^q) / (q - 1)``; (..., N) -> (...).

    Tends to the Shannon entropy as ``q -> 1``; ``q = 1`` is not allowed (use
    :func:`normalized_entropy`). Used by DynMoLE's routing rule and auxiliary loss.
    """
    if q <= 0 or q == 1:
        raise ValueError(f"tsallis_entropy: q={q!r} is invalid; use q > 0, q != 1")
    return (1.0 - probs.clamp_min(0).pow(q).sum(-1)) / (q - 1.0)


# --------------------------------------------------------------------------------------------
# gates
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Selection:
    """A gate's decision for T tokens.

    mask : (T, N) bool, the admitted experts (the layer renormalises ``p`` over it).
    k : (T,) int64, ``mask.sum(-1)``.
    d_mask : (T, N) bool, the set whose disagreement the layer reports (CARE: its nucleus set,
        as Algorithm 1 measures ``D`` there; other gates: ``mask``).
    disagreement : (T,) ``D`` of ``d_mask`` if the gate already computed it, else None.
    """
    mask: Tensor
    k: Tensor
    d_mask: Tensor
    disagreement: Tensor | None = None


class Gate(Protocol):
    name: ClassVar[str]

    def select(self, probs: Tensor, disagreement: DisagreementFn) -> Selection: ...

    def validate(self, n_experts: int) -> None: ...


def _err(gate: str, fld: str, value: Any, fix: str) -> ValueError:
    return ValueError(f"{gate}: {fld}={value!r} is invalid; {fix}")


def top_mask(probs: Tensor, k: Tensor) -> Tensor:
    """(T, N) bool mask of each token's top-``k[t]`` experts by probability; k: (T,) int."""
    order = probs.argsort(-1, descending=True)                            # (T, N)
    return _mask_from_order(order, k)


def _mask_from_order(order: Tensor, k: Tensor) -> Tensor:
    ranks = torch.arange(order.shape[-1], device=order.device)           # (N,)
    sorted_mask = ranks < k[:, None]                                      # (T, N)
    return torch.zeros_like(sorted_mask).scatter_(-1, order, sorted_mask)


def _check_k_range(gate: str, k_min: int, k_max: int) -> None:
    if k_min < 1:
        raise _err(gate, "k_min", k_min, "use k_min >= 1")
    if k_max < k_min:
        raise _err(gate, "k_max", k_max, f"k_min={k_min} exceeds it; use k_min <= k_max")


def _check_n(gate: str, fld: str, k: int, n_experts: int) -> None:
    if k > n_experts:
        raise _err(gate, fld, k, f"the layer has only N={n_experts} experts; use {fld} <= "
                   f"{n_experts}")


@register_gate("topk")
@dataclass(frozen=True)
class TopK:
    """Fixed top-``k`` admission (paper Eq. "moelora"); the training gate. ``TopK(N)`` = dense."""
    name: ClassVar[str]  # the registered kind, set by register_gate
    k: int = 4

    def __post_init__(self) -> None:
        if self.k < 1:
            raise _err("TopK", "k", self.k, "use k >= 1")

    def validate(self, n_experts: int) -> None:
        _check_n("TopK", "k", self.k, n_experts)

    def select(self, probs: Tensor, disagreement: DisagreementFn) -> Selection:
        idx = probs.topk(self.k, dim=-1).indices                          # (T, k)
        mask = torch.zeros_like(probs, dtype=torch.bool).scatter_(-1, idx, True)
        k = torch.full(probs.shape[:1], self.k, dtype=torch.long, device=probs.device)
        return Selection(mask, k, mask)


@register_gate("care", knob="tau", bounds=(TAU_MIN, 1.0))
@dataclass(frozen=True)
class Care:
    """CARE admission, paper Algorithm 1, vectorised over tokens.

    ``k_nu = min{k : C_k(p) >= tau}`` (``tau = 1`` admits all ``N``; float slack
    :func:`cumsum_tolerance`), ``D`` = disagreement of the top-``k_nu`` set,
    ``rho = max(0, (D - delta) / (1 - delta))``, ``k = clip(k_nu + ceil(gamma rho), k_min,
    k_max)``. ``tau`` is set by :func:`baselines.thermostat.calibrate` for a budget.
    """
    name: ClassVar[str]  # the registered kind, set by register_gate
    tau: float
    gamma: float = 2.0
    delta: float = 0.55
    k_min: int = 1
    k_max: int = 8

    def __post_init__(self) -> None:
        g = type(self).__name__
        if not 0.0 < self.tau <= 1.0:
            raise _err(g, "tau", self.tau, "use a threshold in (0, 1] (calibrate() finds one)")
        if self.gamma < 0:
            raise _err(g, "gamma", self.gamma, "use gamma >= 0 (0 disables the extension)")
        if not 0.0 <= self.delta < 1.0:
            raise _err(g, "delta", self.delta, "use delta in [0, 1)")
        _check_k_range(g, self.k_min, self.k_max)

    def validate(self, n_experts: int) -> None:
        _check_n(type(self).__name__, "k_max", self.k_max, n_experts)

    def nucleus_k(self, sorted_probs: Tensor) -> Tensor:
        """(T, N) probabilities sorted descending -> (T,) ``k_nu``."""
        n = sorted_probs.shape[-1]
        if self.tau >= 1.0:
            return torch.full(sorted_probs.shape[:1], n, dtype=torch.long,
                              device=sorted_probs.device)
        c = sorted_probs.cumsum(-1)                                       # (T, N)
        below = c < self.tau - cumsum_tolerance(n, sorted_probs.dtype)
        return (below.sum(-1) + 1).clamp_max(n)

    def select(self, probs: Tensor, disagreement: DisagreementFn) -> Selection:
        n = probs.shape[-1]
        sp, order = probs.sort(-1, descending=True)                       # (T, N) each
        k_nu = self.nucleus_k(sp)                                         # (T,)
        rank = torch.empty_like(order).scatter_(                          # (T, N) each
            -1, order, torch.arange(n, device=order.device).expand_as(order))  # expert's place
        nucleus = rank < k_nu[:, None]                                    # (T, N)
        k, d = k_nu, None
        if self.gamma > 0:
            d = disagreement(nucleus)                                     # (T,)
            rho = ((d - self.delta) / (1.0 - self.delta)).clamp_min(0.0)
            k = k_nu + torch.ceil(self.gamma * rho).long()
        k = k.clamp(self.k_min, min(self.k_max, n))
        # no torch.equal(k, k_nu) (a host sync per layer): the nucleus is the admitted set
        # whenever the clip cannot bind and nothing extends it
        fixed = self.gamma == 0 and self.k_min <= 1 and self.k_max >= n
        mask = nucleus if fixed else rank < k[:, None]
        return Selection(mask, k, nucleus, d)


@register_gate("nucleus", knob="tau", bounds=(TAU_MIN, 1.0))
@dataclass(frozen=True)
class NucleusOnly(Care):
    """Nucleus admission without the disagreement extension: ``Care`` with ``gamma = 0``."""
    gamma: float = field(default=0.0, init=False)


@register_gate("random", fixed=False, proxy="care")
@dataclass(frozen=True)
class RandomK:
    """``k`` drawn per token from a histogram, then the top-``k`` experts admitted.

    ``histogram[j]`` is the fraction of tokens with ``k = j + 1`` (normalised here). Built from
    CARE's measured ``k`` at the same budget (:meth:`from_counts`,
    :func:`baselines.thermostat.care_k_histogram`), it keeps CARE's compute distribution but
    assigns it to tokens at random. Draws come from a generator seeded with ``seed`` when the
    gate is built, so a run is reproducible; successive forwards get fresh draws.
    """
    name: ClassVar[str]  # the registered kind, set by register_gate
    histogram: tuple[float, ...]
    seed: int = 0
    _gen: torch.Generator = field(init=False, repr=False, compare=False)
    #: per accelerator: (its generator seeded with ``seed``, the histogram's CDF there)
    _dev: dict[torch.device, tuple[torch.Generator, Tensor]] = field(
        init=False, repr=False, compare=False, default_factory=dict)

    def __post_init__(self) -> None:
        h = tuple(float(x) for x in self.histogram)
        if not h or any(x < 0 or not math.isfinite(x) for x in h) or sum(h) <= 0:
            raise _err("RandomK", "histogram", self.histogram,
                       "give non-negative finite fractions for k = 1, 2, ... with a positive sum")
        s = sum(h)
        if abs(s - 1.0) > 1e-12:   # leave normalised input untouched: to/from_dict round-trips
            h = tuple(x / s for x in h)
        object.__setattr__(self, "histogram", h)
        object.__setattr__(self, "_gen", torch.Generator().manual_seed(self.seed))

    @classmethod
    def from_counts(cls, ks: Tensor | Sequence[int], seed: int = 0) -> RandomK:
        """Histogram of observed integer ``k`` values (e.g. CARE's per-token ``k``)."""
        k = torch.as_tensor(ks).reshape(-1).round().long()
        if k.numel() == 0 or int(k.min()) < 1:
            raise _err("RandomK", "ks", "<counts>", "give a non-empty set of k values >= 1")
        counts = torch.bincount(k - 1).double()
        return cls(tuple((counts / counts.sum()).tolist()), seed)

    @property
    def mean_k(self) -> float:
        return sum((j + 1) * p for j, p in enumerate(self.histogram))

    def validate(self, n_experts: int) -> None:
        k_hi = max(j + 1 for j, p in enumerate(self.histogram) if p > 0)
        _check_n("RandomK", "histogram", k_hi, n_experts)

    def draw(self, n: int, device: torch.device) -> Tensor:
        """(n,) int64 draws of ``k``. On the CPU from ``torch.multinomial`` with the CPU
        generator; on an accelerator by inverse CDF with a generator of that device (no draw
        copied from the host per layer, no sync), so GPU draws differ from CPU ones."""
        if device.type == "cpu":
            hist = torch.tensor(self.histogram, dtype=torch.float64)
            return torch.multinomial(hist, n, replacement=True, generator=self._gen) + 1
        return self.draw_inverse_cdf(n, device)

    def draw_inverse_cdf(self, n: int, device: torch.device) -> Tensor:
        """(n,) int64 draws of ``k`` by inverse CDF with a generator of ``device`` (seeded by
        ``seed``), as `draw` takes them on an accelerator."""
        if device not in self._dev:
            cdf = torch.tensor(self.histogram, dtype=torch.float64).cumsum(0)
            self._dev[device] = (torch.Generator(device).manual_seed(self.seed),
                                 (cdf / cdf[-1]).to(device))
        gen, cdf = self._dev[device]
        u = torch.rand(n, generator=gen, device=device, dtype=torch.float64)
        return torch.searchsorted(cdf, u, right=True).clamp_max(cdf.numel() - 1) + 1

    def select(self, probs: Tensor, disagreement: DisagreementFn) -> Selection:
        k = self.draw(probs.shape[0], probs.device)
        mask = top_mask(probs, k)
        return Selection(mask, k, mask)


@register_gate("entropy", knob="scale", fixed=False, expand_hi=True)
@dataclass(frozen=True)
class EntropyK:
    """``k`` rising with router entropy: ``k = clip(ceil(scale * H(p) * k_max), k_min, k_max)``.

    ``H`` is the entropy normalised by ``log N`` (in [0, 1]). The rule is monotone
    non-decreasing in both ``H`` and ``scale``: ``scale = 0`` gives ``k_min`` everywhere, a
    uniform router reaches ``k_max`` at ``scale >= 1``. ``scale`` is set for a budget by
    :func:`baselines.thermostat.calibrate` with ``param="scale"``.
    """
    name: ClassVar[str]  # the registered kind, set by register_gate
    scale: float
    k_min: int = 1
    k_max: int = 8

    def __post_init__(self) -> None:
        if not (self.scale >= 0 and math.isfinite(self.scale)):
            raise _err("EntropyK", "scale", self.scale, "use a finite scale >= 0")
        _check_k_range("EntropyK", self.k_min, self.k_max)

    def validate(self, n_experts: int) -> None:
        _check_n("EntropyK", "k_max", self.k_max, n_experts)

    def select(self, probs: Tensor, disagreement: DisagreementFn) -> Selection:
        h = normalized_entropy(probs)                                     # (T,)
        k = torch.ceil(self.scale * h * self.k_max).long()
        k = k.clamp(self.k_min, min(self.k_max, probs.shape[-1]))
        mask = top_mask(probs, k)
        return Selection(mask, k, mask)


@register_gate("dynmole")
@dataclass(frozen=True)
class DynMoLE:
    """DynMoLE's hybrid routing (DynMoLE, 2025, "Boosting Mixture of LoRA Experts Fine-Tuning
    with a Hybrid Routing Mechanism"; rule as in the authors' MoE-PEFT code).

    Top-p: the experts whose cumulative probability (sorted descending) stays ``<= top_p``, at
    least ``keep_top_k`` of them; a token whose router is uncertain, Tsallis entropy
    ``S_q(p) > threshold`` (:func:`tsallis_entropy`), gets every expert (soft routing).
    Defaults: ``q = 1.1``, ``threshold = 0.9``, ``top_p = 0.75``, ``keep_top_k = 2``.
    """
    name: ClassVar[str]  # the registered kind, set by register_gate
    top_p: float = 0.75
    keep_top_k: int = 2
    threshold: float = 0.9
    q: float = 1.1

    def __post_init__(self) -> None:
        if not 0.0 < self.top_p <= 1.0:
            raise _err("DynMoLE", "top_p", self.top_p, "use top_p in (0, 1]")
        if self.keep_top_k < 1:
            raise _err("DynMoLE", "keep_top_k", self.keep_top_k, "use keep_top_k >= 1")
        if not self.threshold > 0:
            raise _err("DynMoLE", "threshold", self.threshold, "use threshold > 0")
        if self.q <= 0 or self.q == 1:
            raise _err("DynMoLE", "q", self.q, "use q > 0, q != 1")

    def validate(self, n_experts: int) -> None:
        _check_n("DynMoLE", "keep_top_k", self.keep_top_k, n_experts)

    def select(self, probs: Tensor, disagreement: DisagreementFn) -> Selection:
        n = probs.shape[-1]
        sp, order = probs.sort(-1, descending=True)                       # (T, N) each
        k = (sp.cumsum(-1) <= self.top_p).sum(-1).clamp_min(self.keep_top_k)  # (T,) a prefix
        k = torch.where(tsallis_entropy(probs, self.q) > self.threshold, n, k)
        mask = _mask_from_order(order, k)
        return Selection(mask, k, mask)


def gate_to_dict(gate: Gate) -> dict[str, Any]:
    """JSON-able ``{"name": ..., **fields}`` (inverse: :func:`gate_from_dict`)."""
    d = {f.name: getattr(gate, f.name) for f in fields(gate)  # type: ignore[arg-type]
         if f.init and not f.name.startswith("_")}
    if "histogram" in d:
        d["histogram"] = list(d["histogram"])
    return {"name": gate.name, **d}


def gate_from_dict(d: dict[str, Any]) -> Gate:
    """The gate of a `gate_to_dict` record: ``name`` is the class's ``name``, of any gate class
    in the registry (`uqbench.core.gating.GATES`)."""
    classes = {cast("type[Gate]", e.cls).name: e.cls for e in map(GATES.get, GATES.names())}
    d = dict(d)
    name = d.pop("name", None)
    if name not in classes:
        raise ValueError(f"gate_from_dict: unknown gate name {name!r}; valid: {sorted(classes)}")
    if "histogram" in d:
        d["histogram"] = tuple(d["histogram"])
    return classes[name](**d)
