"""The MoE-LoRA layer (`MoELoRALinear`, FlyLoRA's `FlyLoRALinear`): routing, the expert mixture
as one rank-``N*r`` matmul pair, CARE's Gram-block disagreement, dropout, and the hand-written
training step of the common path (`TopKStep`) beside the autograd reference."""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from baselines.gates import EPS, Gate, TopK, normalized_entropy
from baselines.moe.config import HMORA_EPSILON, VARIANTS, Variant
from baselines.moe.losses import lb_parts, valid_tokens


def gram_disagreement(weights: Tensor, z: Tensor, gram: Tensor, *, eps: float = EPS,
                      u: Tensor | None = None, u_scale: float = 1.0) -> Tensor:
    """Disagreement ``D`` from Gram blocks, equal to :func:`baselines.gates.disagreement`.

    With ``e_i = B_i z_i`` and ``G = B_stack^T B_stack``: ``||e_i||^2 = z_i^T G_ii z_i`` and
    ``||sum_i p~_i e_i||^2 = u^T G u``, ``u = (p~_i z_i)_i``. Cost O(T (N r)^2), no (T, N, d).

    Parameters
    ----------
    weights : (T, N) zero outside the admitted set (renormalised here).
    z : (T, N, r) expert codes ``A_i h``.
    gram : (N*r, N*r) ``B_stack^T B_stack``.
    u : optional (T, N*r) ``u_scale * (p~_i z_i)_i`` when the caller already has it (the layer's
        scaled mixture codes); saves one (T, N*r) pass.
    """
    T, N, r = z.shape
    p = weights / weights.sum(-1, keepdim=True)                           # (T, N)
    blocks = torch.diagonal(gram.view(N, r, N, r), dim1=0, dim2=2).permute(2, 0, 1)  # (N, r, r)
    zt = z.transpose(0, 1)                                                # (N, T, r)
    e2 = (torch.bmm(zt, blocks) * zt).sum(-1).T                          # (T, N) ||e_i||^2
    m2 = (p * e2).sum(-1)                                                 # (T,)
    if u is None:
        u, u_scale = (p[:, :, None] * z).reshape(T, N * r), 1.0           # (T, N*r)
    mean2 = ((u @ gram) * u).sum(-1)                                      # (T,) ||e_bar||^2
    if u_scale != 1.0:
        mean2 = mean2 / (u_scale * u_scale)
    return ((m2 - mean2) / (m2 + eps)).clamp(0.0, 1.0)


#: ``draws(mask_of, h)``: the keep mask of the (T, E) input ``h``, made by calling ``mask_of``
#: (the layer's own mask drawing) on row blocks of ``h``, each under its own random stream, and
#: concatenating the masks (`MoELoRALinear.mask_draws`; `baselines.forward.collect_mc`)
MaskDraws = Callable[[Callable[[Tensor], Tensor], Tensor], Tensor]


def fast_dropout(h: Tensor, p: float, *, scaled: bool = True,
                 draws: MaskDraws | None = None) -> Tensor:
    """Inverted dropout with 16-bit uniform draws: each element is zeroed with probability
    ``round(p * 2**16) / 2**16`` (0.0500030 for p = 0.05) and the kept ones scaled by
    :func:`dropout_scale`, the inverse keep rate, so ``E[out] = h``; ``scaled=False`` leaves the
    scaling to the caller (the MoE layer folds it into the small ``A``, sparing a (T, d) pass).
    One 64-bit draw of torch's default generator serves four elements, and the mask is applied
    by one ``where`` (its backward saves a bool mask): about 2x cheaper than ``nn.Dropout``,
    whose draws were the largest cost of an MoE-LoRA training step on CPU after the matmuls.
    ``draws`` (:data:`MaskDraws`) splits the mask's drawing into row blocks; under
    ``torch.compile`` the mask is drawn out of place (see ``_keep_mask``)."""
    if round(p * 65536) >= 65536:
        return torch.zeros_like(h)
    keep = _keep_mask(h, p, draws)
    if keep is None:
        return h
    out = torch.where(keep, h, _scalar(0, h))
    return out * dropout_scale(p) if scaled else out


def _keep_mask(h: Tensor, p: float, draws: MaskDraws | None = None) -> Tensor | None:
    """The bool keep mask of :func:`fast_dropout` (None when nothing is dropped: ``p`` rounds
    below 1 in 2**16), ``P(keep) = 1 - thr / 2**16`` with ``thr = round(p * 2**16)``.

    Eager: 16-bit draws, four per 64-bit in-place ``random_`` of the default generator, in
    ``h``'s element order. Under ``torch.compile``: ``torch.rand(h.shape) >= thr / 2**16`` (the
    same probability, exactly: float32 uniforms are multiples of 2**-24), an out-of-place draw
    that dynamo keeps in the graph (the in-place one breaks it) and inductor generates itself, so
    compiled masks are not eager ones; with inductor's ``fallback_random`` they are the masks
    eager ``torch.rand`` draws. ``draws`` (:data:`MaskDraws`): the mask drawn block by block."""
    thr = round(p * 65536)
    if thr <= 0:
        return None
    if draws is not None:
        # thr > 0 here, so each part's mask is a tensor
        return draws(lambda part: cast(Tensor, _keep_mask(part, p)), h)
    if torch.compiler.is_compiling():
        return torch.rand(h.shape, device=h.device) >= thr / 65536
    *lead, d = h.shape
    if d % 4 == 0:   # draw in h's shape: no slice, same draws as the flat layout below
        bits = torch.empty((*lead, d // 4), dtype=torch.int64, device=h.device)
        bits = bits.random_(-2**63, None).view(torch.int16)
    else:
        n = h.numel()
        bits = torch.empty((n + 3) // 4, dtype=torch.int64, device=h.device).random_(-2**63, None)
        bits = bits.view(torch.int16)[:n].view(h.shape)
    return bits >= _scalar(thr - 32768, bits)                             # P = 1 - thr/2^16


#: the 0-dim tensors `_scalar` made, by (value, dtype, device)
SCALARS: dict[tuple[float, torch.dtype, torch.device], Tensor] = {}


def _scalar(value: float, like: Tensor) -> Tensor | float:
    """``value`` as a cached 0-dim tensor of ``like``'s dtype and device: unlike a Python
    number, it is not wrapped into a new tensor on every call, and unlike a CPU tensor it is
    never copied to the device (``where`` copies a CPU operand with a stream sync; a ternary op
    such as ``addcdiv`` refuses one). Under ``torch.compile``, ``value`` itself: a graph holds
    it as a constant, where a read of the cache would make dynamo guard on the cache's contents
    and compile again once it fills."""
    if torch.compiler.is_compiling():
        return value
    key = (value, like.dtype, like.device)
    if key not in SCALARS:
        SCALARS[key] = torch.tensor(value, dtype=like.dtype, device=like.device)
    return SCALARS[key]


def dropout_scale(p: float) -> float:
    """The inverse keep rate of :func:`fast_dropout` with drop probability ``p``."""
    thr = round(p * 65536)
    return 65536 / (65536 - thr) if 0 < thr < 65536 else 1.0


class _Probe:
    """``mask -> D`` for one forward; the Gram matrix is fetched only if a D is asked for."""

    def __init__(self, layer: MoELoRALinear, probs: Tensor, z: Tensor) -> None:
        self.layer, self.probs, self.z = layer, probs, z

    def __call__(self, mask: Tensor) -> Tensor:
        gram = self.layer.gram(self.z.dtype)                              # (N*r, N*r)
        return gram_disagreement(self.probs * mask, self.z, gram)


def trainable_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of the trainable parameters added to a backbone whose weights are ``dtype``:
    float32 on a 16-bit backbone (bfloat16 on a GPU), as peft's ``autocast_adapter_dtype`` makes
    the dense LoRA baseline's, else ``dtype``. A 16-bit parameter loses every AdamW update
    smaller than half its rounding step; the adapter's maths then run in float32 too, its input
    cast up and its output added to the frozen layer's before rounding down, as peft does."""
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


class TopKStep(torch.autograd.Function):
    """The common training forward of :class:`MoELoRALinear` (fixed top-k gate, the Switch
    loss's inputs, dropout folded in) with a hand-written backward: a fraction of the ops
    autograd records for :meth:`MoELoRALinear._forward_reference`, which stays the tested
    reference and serves every other gate, variant and mode.

    With ``c`` the dropout scale, ``s`` the LoRA scaling, ``m`` the top-k mask,
    ``S = sum_{i in m} p_i`` and ``w = s c m p / S`` (= ``s c p~``)::

        y = W0 h + b + B_stack (w ⊙ A_stack hd),   hd = h ⊙ keep,   p = softmax(l),  l = W_r h
        dL/dl = w ⊙ (g - <g, w> / (s c)),   g_i = <dL/du_i, z_i>

    (softmax and renormalisation's Jacobians combined: ``sum w = s c``). Returns ``y`` (T, O),
    the router ``logits`` and ``probs`` (T, N) (both differentiable: the fused Switch loss
    (:class:`SwitchLoss`) sends its gradient to the logits, a per-layer loss to the probs) and
    ``w`` (T, N) (the admitted set is ``w > 0``; no gradient).

    On a 16-bit base (`trainable_dtype`) every term but ``W0 h`` and ``W0^T dL/dy`` is computed
    in the adapter's float32, and ``y`` and ``dL/dh`` are the base's term plus the adapter's,
    added in float32 and rounded once to the base's dtype (as peft adds its LoRA term; autograd
    rounds the adapter's part of ``dL/dh`` before adding it).
    """

    @staticmethod
    def forward(ctx: Any, h: Tensor, lora_A: Tensor, lora_B: Tensor, router_w: Tensor,
                layer: MoELoRALinear, keep: Tensor | None
                ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        v = layer.step_views()
        y = torch.mm(h, v.wt) if v.bias is None else torch.addmm(v.bias, h, v.wt)  # (T, O)
        base_dtype, h_base = h.dtype, h
        mixed = v.a.dtype != base_dtype
        if mixed:   # a 16-bit base: the adapter's maths in its float32
            h = h.to(v.a.dtype)
        logits = torch.mm(h, v.router_t)                                  # (T, N)
        hd = h if keep is None else torch.where(keep, h, _scalar(0, h))
        hd_t = hd.t()                                                     # (E, T)
        z = torch.mm(v.a, hd_t).t()               # (T, N*r) A hd, column-major as u and gu
        probs = torch.softmax(logits, -1)                                 # (T, N)
        scale = layer.scaling * (dropout_scale(layer.dropout.p) if keep is not None else 1.0)
        top = probs.topk(cast(TopK, layer.gate).k, dim=-1)                # (T, k)
        # p on S. The mask scatters a constant: a scatter_ of the top values (a tensor) would take
        # deterministic mode's sorting index_put on CUDA, and training runs in that mode
        admitted = torch.zeros_like(probs, dtype=torch.bool).scatter_(1, top.indices, True)
        pm = torch.where(admitted, probs, _scalar(0, probs))              # (T, N)
        # _scalar is a float under torch.compile, which addcdiv takes there
        w = torch.addcdiv(_scalar(0, pm), pm,  # type: ignore[arg-type]
                          top.values.sum(-1, keepdim=True), value=scale)  # (T, N) s c p~
        # (T, N*r) column-major as z and gu: a product of a row- and a column-major operand
        # runs ~10x slower on CPU than one of two alike
        w_col = w.t().index_select(0, v.expert_of_col).t()
        u = z * w_col                                                     # (T, N*r)
        if base_dtype == h.dtype:
            y.addmm_(u, v.b_rows)
        else:                         # W0 h + B u added in float32, rounded to the base's dtype
            y.add_(torch.mm(u, v.b_rows))
        # mixed: the base's 16-bit input is kept, not its float32 copy and dropped copy (2 bytes
        # an element instead of 8); the backward casts and drops it again
        ctx.save_for_backward(h_base if mixed else h, None if mixed else hd_t, keep, z, u, probs,
                              w, w_col)
        ctx.layer, ctx.scale, ctx.base_dtype, ctx.mixed = layer, scale, base_dtype, mixed
        ctx.mark_non_differentiable(w)
        ctx.set_materialize_grads(False)
        return y, logits, probs, w

    @staticmethod
    def backward(ctx: Any, gy: Tensor | None, glogits: Tensor | None, gprobs: Tensor | None,
                 _: Any) -> tuple[Tensor | None, ...]:
        h, hd_t, keep, z, u, probs, w, w_col = ctx.saved_tensors
        layer, scale = ctx.layer, ctx.scale
        v = layer.step_views()
        N, r = layer.n_experts, layer.rank
        need_h, need_a, need_b, need_r = ctx.needs_input_grad[:4]
        mixed = ctx.mixed                             # a 16-bit base, a float32 adapter
        if mixed and (need_a or need_r):
            h = h.to(v.a.dtype)
            hd_t = (h if keep is None else torch.where(keep, h, _scalar(0, h))).t()
        gh = ga = gb = gr = None
        gl = glogits
        if gy is not None:
            gy_base = gy
            if mixed:
                gy = gy.to(v.a.dtype)
            gy_t = gy.t()                                                 # (O, T)
            gu = torch.mm(v.b_rows, gy_t).t()                             # (T, N*r) dL/du
            if need_b:   # (O, N*r) = lora_B's (O, N, r) storage order: no copy into .grad
                O = gy.shape[1]
                gb = torch.mm(gy_t, u).as_strided((N, O, r), (r, N * r, 1))
            g = torch.mm(gu * z, layer._block_sum(scale))                 # (T, N) dL/dp~
            # the renormalised softmax over S: p~ (g - <g, p~>), one kernel
            pt = w * _scalar(1.0 / scale, w)                              # (T, N) p~
            d = torch._softmax_backward_data(g, pt, -1, g.dtype)
            gl = d if gl is None else gl + d                              # (T, N) dL/dl
            gz = gu * w_col                                               # (T, N*r) dL/dz
            if need_a:   # (E, N*r) = lora_A's (E, N, r) storage order
                E = hd_t.shape[0]
                ga = torch.mm(hd_t, gz).as_strided((N, r, E), (r, 1, N * r))
            if need_h:
                gh = torch.mm(gz, v.a)                                    # (T, E)
                if keep is not None:
                    gh = torch.where(keep, gh, _scalar(0, gh))
                if not mixed:
                    gh = gh.addmm_(gy, v.w)
        if gprobs is not None:
            gs = torch._softmax_backward_data(gprobs, probs, -1, probs.dtype)
            gl = gs if gl is None else gl + gs
        if gl is not None and need_r:
            gr = torch.mm(gl.t(), h)                                      # (N, E)
        if gl is not None and need_h:
            gh = torch.mm(gl, v.router) if gh is None else gh.addmm_(gl, v.router)
        if mixed and gh is not None:  # the base's part plus the adapter's, rounded once
            gh = gh.to(ctx.base_dtype) if gy is None else torch.mm(gy_base, v.w).add_(gh)
        return gh, ga, gb, gr, None, None


def _expert_columns(N: int, r: int, device: torch.device) -> Tensor:
    """(N*r,) expert index of each code column."""
    return torch.arange(N, device=device).repeat_interleave(r)


class _Views(NamedTuple):
    """Parameter views :class:`TopKStep` multiplies by."""
    w: Tensor                 # (O, E) frozen base weight
    wt: Tensor                # (E, O)
    bias: Tensor | None       # (O,)
    router: Tensor            # (N, E)
    router_t: Tensor          # (E, N)
    a: Tensor                 # (N*r, E) A_stack, column-major
    b_rows: Tensor            # (N*r, O) B_stack^T, column-major
    expert_of_col: Tensor     # (N*r,) int64: column i*r + j of the codes belongs to expert i


class MoELoRALinear(nn.Module):
    """``base_layer`` (frozen) plus N gated LoRA experts; see the module docstring.

    Parameters: ``router`` (nn.Linear d -> N, no bias), ``lora_A`` (N, r, d) with peft's
    kaiming-uniform init, ``lora_B`` (N, d_out, r) zero-initialised, so a fresh layer equals its
    base layer exactly. ``dropout`` (an ``nn.Dropout``: its ``p`` and train/eval state) is real
    dropout on the experts' input, drawn by :func:`fast_dropout`.
    ``variant`` (see :data:`VARIANTS`): ``hydralora`` makes ``lora_A`` (1, r, d), one A shared by
    the N B heads; ``hmora`` adds ``task_router`` and ``alpha_logit``, initialised from
    ``depth`` (the layer's block index over the last one, in [0, 1]).
    """

    #: training forwards of the common layer take :class:`TopKStep` (False: always the
    #: autograd reference, :meth:`_forward_reference`)
    fast_path: bool = True
    #: how the dropout's keep masks are drawn: None, by :func:`fast_dropout` from torch's
    #: default generator; set for a pass (`baselines.forward.collect_mc` gives each of the
    #: stacked copies its own stream), a :data:`MaskDraws`
    mask_draws: MaskDraws | None = None

    def __init__(self, base_layer: nn.Linear, *, n_experts: int = 16, rank: int = 8,
                 alpha: float = 16.0, dropout: float = 0.05, gate: Gate | None = None,
                 generator: torch.Generator | None = None, variant: str = "moe-lora",
                 depth: float = 0.0) -> None:
        super().__init__()
        self.base_layer = base_layer
        self.in_features, self.out_features = base_layer.in_features, base_layer.out_features
        self.n_experts, self.rank, self.scaling = n_experts, rank, alpha / rank
        self.variant, spec = variant, VARIANTS[variant]
        self.shared_a, self.task_routed = spec.shared_a, spec.task_router
        w = base_layer.weight
        kw: dict[str, Any] = {"device": w.device, "dtype": trainable_dtype(w.dtype)}
        self.router = nn.Linear(self.in_features, n_experts, bias=False, **kw)
        n_a = 1 if self.shared_a else n_experts
        # lora_A stored as (d, n_A, r) and, with one A per expert, lora_B as (d_out, N, r):
        # A_stack and B_stack^T are then column-major views, which a CPU matmul reads without
        # a resolve_conj op, as it reads the column-major codes they make (the gradients come
        # out in the same layouts: no copy into .grad). HydraLoRA's codes are a broadcast of
        # one A h, row-major: its lora_B stays (N, r, d_out), B_stack^T row-major.
        self.lora_A = nn.Parameter(torch.empty(self.in_features, n_a, rank,
                                               **kw).permute(1, 2, 0))
        b_order = (0, 2, 1) if self.shared_a else (1, 0, 2)
        b_shape = (n_experts, rank, self.out_features) if self.shared_a else (
            self.out_features, n_experts, rank)
        self.lora_B = nn.Parameter(torch.zeros(b_shape, **kw).permute(*b_order))
        self.dropout = nn.Dropout(dropout)
        bound = 1.0 / math.sqrt(self.in_features)  # nn.Linear / peft kaiming_uniform(a=sqrt(5))
        inits = [self.router.weight, self.lora_A]
        if spec.task_router:   # task(sequence)-level router + learnable token/task mixing logit
            self.task_router = nn.Linear(self.in_features, n_experts, bias=False, **kw)
            inits.append(self.task_router.weight)
            self.alpha_logit = nn.Parameter(torch.tensor(
                HMORA_EPSILON * (2.0 * depth - 1.0), **kw))
        with torch.no_grad():
            for p in inits:
                p.copy_(torch.empty(p.shape).uniform_(-bound, bound, generator=generator))
        self.gate: Gate = gate if gate is not None else TopK(min(4, n_experts))
        self.gate.validate(n_experts)
        self.record = False
        self.token_mask: Tensor | None = None      # (B, L) bool, True = real token
        self.last_stats: dict[str, Tensor] | None = None
        self._aux_value: Tensor | None = None   # the variant's auxiliary loss of the last forward
        self._aux_args: tuple[Any, ...] | None = None   # its inputs, evaluated on first read
        self._gram: tuple[tuple[Any, ...], Tensor] | None = None
        self._cache: dict[str, tuple[tuple[Any, ...], Tensor]] = {}
        self._fast_aux: tuple[Tensor, Tensor, Tensor, Tensor | None] | None = None
        self._views_cache: tuple[tuple[Any, ...], _Views] | None = None
        self._block_sums: dict[tuple[Any, ...], Tensor] = {}
        #: whether the last forward took :class:`TopKStep` (benchmarks report it)
        self.took_fast_step = False

    def extra_repr(self) -> str:
        return (f"in={self.in_features}, out={self.out_features}, n_experts={self.n_experts}, "
                f"rank={self.rank}, scaling={self.scaling:g}, gate={self.gate}")

    @property
    def last_aux(self) -> Tensor | None:
        """This variant's auxiliary loss of the last forward (None if its input had no
        tokens; NaN if every token was masked), computed when first read: a forward whose loss
        nobody reads (inference) skips it."""
        if self._fast_aux is not None:
            _, probs, w, mask = self._fast_aux
            self._aux_args = (probs, w > 0, valid_tokens(mask, probs.device), None)
            self._fast_aux = None
        if self._aux_args is not None:
            self._aux_value, self._aux_args = self.aux_loss(*self._aux_args), None
        return self._aux_value

    @last_aux.setter
    def last_aux(self, value: Tensor | None) -> None:
        self._aux_value, self._aux_args, self._fast_aux = value, None, None

    @property
    def forward_state(self) -> tuple[Any, ...]:
        """The layer's state of its last forward (auxiliary-loss value, its inputs, statistics),
        as `forward_state_kept` saves and puts back; for it, tests and diagnostics."""
        return self._aux_value, self._aux_args, self._fast_aux, self.last_stats

    @forward_state.setter
    def forward_state(self, state: tuple[Any, ...]) -> None:
        self._aux_value, self._aux_args, self._fast_aux, self.last_stats = state

    def _derived(self, name: str, params: tuple[Tensor, ...], make: Any) -> Tensor:
        """``make()``, a tensor derived from ``params``; cached until one of them changes
        (version counter, storage, device, dtype) unless autograd needs its graph."""
        if torch.is_grad_enabled() and any(p.requires_grad for p in params):
            return make()
        key = (torch.is_inference_mode_enabled(),   # inference tensors stay in inference mode
               *((p._version, p.data_ptr(), p.device, p.dtype) for p in params))
        hit = self._cache.get(name)
        if hit is None or hit[0] != key:
            with torch.no_grad():
                hit = (key, make())
            self._cache[name] = hit
        return hit[1]

    def b_stack(self) -> Tensor:
        """(d_out, N*r): column ``i*r + j`` is ``lora_B[i, :, j]``."""
        N, O, r = self.lora_B.shape
        return self.lora_B.permute(1, 0, 2).reshape(O, N * r)

    def _b_rows(self) -> Tensor:
        """``b_stack().T`` (N*r, d_out), a view of ``lora_B`` (column-major; HydraLoRA:
        row-major; cached while ``lora_B`` is unchanged and needs no gradient)."""
        N, O, r = self.lora_B.shape
        return self._derived("b_rows", (self.lora_B,),
                             lambda: self.lora_B.transpose(1, 2).reshape(N * r, O))

    def _router_a(self) -> Tensor:
        """(N + n_A*r, d): the router weight stacked on the flattened ``lora_A``, so one matmul
        gives both the router logits and the expert codes when the codes read ``h`` itself."""
        return self._derived("router_a", (self.router.weight, self.lora_A), lambda: torch.cat(
            [self.router.weight, self.lora_A.reshape(-1, self.in_features)]))

    def step_views(self) -> _Views:
        """The matrices :class:`TopKStep` multiplies by, as views of the parameters, made once
        while the parameters keep their storage (an optimiser updates them in place)."""
        base = self.base_layer
        params = (base.weight, base.bias, self.router.weight, self.lora_A, self.lora_B)
        key = tuple(None if p is None else (p.data_ptr(), p.stride(), p.dtype) for p in params)
        if self._views_cache is not None and self._views_cache[0] == key:
            return self._views_cache[1]
        N, r = self.n_experts, self.rank
        with torch.no_grad():
            a = self.lora_A.detach().reshape(N * r, self.in_features)    # (N*r, E)
            b_rows = self.lora_B.detach().transpose(1, 2).reshape(N * r, self.out_features)
            w, router = base.weight.detach(), self.router.weight.detach()
            views = _Views(w, w.t(), None if base.bias is None else base.bias.detach(), router,
                           router.t(), a, b_rows,
                           _expert_columns(N, r, a.device))
        aliased = (a.data_ptr() == self.lora_A.data_ptr()
                   and b_rows.data_ptr() == self.lora_B.data_ptr())
        self._views_cache = (key, views) if aliased else None   # copies: remade per call
        return views

    def _block_sum(self, scale: float) -> Tensor:
        """(N*r, N): ``scale`` where code column ``c`` belongs to expert ``i``, else 0, so
        ``x @ _block_sum(s)`` sums each expert's r columns times ``s``. Column-major (a
        transposed view): the CPU matmul then reads it without a ``resolve_conj`` call."""
        w = self.lora_A
        key = (scale, w.dtype, w.device)
        if self._block_sums.get(key) is None:
            col = _expert_columns(self.n_experts, self.rank, w.device)
            ind = F.one_hot(col, self.n_experts).T.to(w.dtype) * scale    # (N, N*r)
            self._block_sums[key] = ind.contiguous().T
        return self._block_sums[key]

    def takes_fast_step(self, x: Tensor) -> bool:
        """Whether this forward takes :class:`TopKStep`: a training forward of the common
        layer (moe-lora/mixlora, TopK gate, plain frozen nn.Linear base, no statistics)."""
        base = self.base_layer
        return (self.fast_path and torch.is_grad_enabled() and not self.record
                and type(self.gate) is TopK and type(base) is nn.Linear
                and VARIANTS[self.variant] == Variant()
                and x.dtype == base.weight.dtype
                and self.lora_A.dtype in (torch.float32, torch.float64)
                and not base.weight.requires_grad
                and (base.bias is None or not base.bias.requires_grad)
                and round(self.dropout.p * 65536) < 65536
                and (x.requires_grad or self.lora_A.requires_grad or self.lora_B.requires_grad
                     or self.router.weight.requires_grad))

    @torch.no_grad()
    def gram(self, dtype: torch.dtype) -> Tensor:
        """``B_stack^T B_stack`` (N*r, N*r), cached until ``lora_B`` changes (in-place updates
        by an optimiser or ``load_state_dict`` bump its version counter)."""
        key = (self.lora_B._version, self.lora_B.data_ptr(), self.lora_B.device, dtype)
        if self._gram is None or self._gram[0] != key:
            b = self._b_rows().to(dtype)                                  # (N*r, O)
            self._gram = (key, b @ b.T)
        return self._gram[1]

    def forward(self, x: Tensor) -> Tensor:
        lead = x.shape[:-1]
        if self.token_mask is not None and self.token_mask.shape != lead:
            raise ValueError(f"token mask of shape {tuple(self.token_mask.shape)} does not "
                             f"match this input's {tuple(lead)}: call set_token_mask(model, "
                             "mask) with the current batch's mask, or None")
        self.took_fast_step = self.takes_fast_step(x)
        if not self.took_fast_step:
            return self._forward_reference(x)
        h = x.reshape(-1, self.in_features)                               # (T, E)
        keep = (_keep_mask(h, self.dropout.p, self.mask_draws) if self.dropout.training
                else None)
        y, logits, probs, w = TopKStep.apply(h, self.lora_A, self.lora_B, self.router.weight,
                                             self, keep)
        self._aux_args, self._fast_aux = None, (logits, probs, w, self.token_mask)
        self.last_stats = None
        return y.view(*lead, self.out_features)

    def _forward_reference(self, x: Tensor) -> Tensor:
        """The layer's forward in plain autograd ops, for every gate, variant and mode."""
        lead = x.shape[:-1]
        N, r, E, O = self.n_experts, self.rank, self.in_features, self.out_features
        h = x.reshape(-1, E)                                              # (T, E)
        T = h.shape[0]
        cdt = torch.promote_types(x.dtype, torch.float32)   # routing maths in >= float32
        valid = None if self.token_mask is None else valid_tokens(self.token_mask, x.device)
        base = self.base_layer
        if type(base) is nn.Linear:       # (T, O), a fresh tensor: the experts add in place
            y, fresh = F.linear(h, base.weight, base.bias), True
        else:
            y, fresh = base(x).reshape(T, O), False
        dropout = self.dropout.training and self.dropout.p > 0
        train = torch.is_grad_enabled() and (self.lora_A.requires_grad
                                             or self.router.weight.requires_grad)
        if self.lora_A.dtype != h.dtype:  # a 16-bit base: the adapter's maths in its float32
            h = h.to(self.lora_A.dtype)
        if dropout or train:
            logits = self.router(h)                                       # (T, N)
            a = self.lora_A.reshape(-1, E)                                # (n_A*r, E)
            hd = h
            if dropout:
                a = a * dropout_scale(self.dropout.p)                     # scale in A
                hd = fast_dropout(h, self.dropout.p, scaled=False,        # (T, E)
                                  draws=self.mask_draws)
            # (T, n_A*r) A hd. Training with one A per expert: column-major like A_stack, so
            # u is too and the matmul by B_stack^T and its backward need no resolve_conj (see
            # __init__). Otherwise row-major: a GEMM with the tokens as rows rounds each row
            # alike for any number of rows, which stacked MC-dropout passes rely on
            z = (torch.mm(a, hd.t()).t() if train and not self.shared_a
                 else F.linear(hd, a))
        else:                             # no gradient, no dropout: one matmul for both
            rz = F.linear(h, self._router_a())                            # (T, N + n_A*r)
            logits, z = rz[:, :N], rz[:, N:]
        probs = F.softmax(logits.to(cdt), dim=-1)                         # (T, N)
        p_task = None
        if self.task_routed:
            probs, p_task = self.hmora_route(probs, h, lead, valid)
        # (T, N, r) codes; HydraLoRA: every head reads the one shared A h (a broadcast view)
        z3 = z.unsqueeze(1).expand(T, N, r) if self.shared_a else z.view(T, N, r)

        with torch.no_grad():
            probe = _Probe(self, probs.detach().to(cdt), z3.detach().to(cdt))
            sel = self.gate.select(probe.probs, probe)                    # mask (T, N)

        w = probs * sel.mask                                              # (T, N)
        w = w * (self.scaling / w.sum(-1, keepdim=True))                  # scaling * p~
        u = (z3 * w.to(z.dtype).unsqueeze(-1)).reshape(T, N * r)          # (T, N*r) as z
        b_rows = self._b_rows()                                           # (N*r, O)
        if y.dtype != u.dtype:        # W0 h + B u added in float32, rounded to the base's dtype
            y = y.add_(torch.mm(u, b_rows)) if fresh else (y + torch.mm(u, b_rows)).to(y.dtype)
        else:
            y = y.addmm_(u, b_rows) if fresh else torch.addmm(y, u, b_rows)   # (T, O)
        y = y.view(*lead, O)

        self._aux_args, self._fast_aux = (probs, sel.mask, valid, p_task), None
        if self.record:
            with torch.no_grad():
                d = sel.disagreement
                if d is None and sel.d_mask is sel.mask and u.dtype == cdt:
                    # the reported set is the admitted one: reuse u = scaling * (p~_i z_i)_i
                    d = gram_disagreement(w.detach(), probe.z, self.gram(cdt), u=u.detach(),
                                          u_scale=self.scaling)
                elif d is None:
                    d = probe(sel.d_mask)
                stats = {"entropy": normalized_entropy(probe.probs),
                         "top1": probe.probs.max(-1).values,
                         "disagreement": d,
                         "k": sel.k.to(cdt)}
                keep = valid.to(cdt) if valid is not None else None
                self.last_stats = {key: (v * keep if keep is not None else v).float().view(lead)
                                   for key, v in stats.items()}
        else:
            self.last_stats = None
        return y

    def hmora_route(self, p_token: Tensor, h: Tensor, lead: torch.Size, valid: Tensor | None
                     ) -> tuple[Tensor, Tensor]:
        """HMoRA: ``p = (1 - a_l) p_token + a_l p_task``, ``a_l = sigmoid(alpha_logit)``; the
        task router reads the masked mean of the sequence's inputs (sequences: the last
        leading axis; a 2-D input is one sequence). Returns (p (T, N), p_task (S, N))."""
        L = lead[-1] if len(lead) >= 2 else h.shape[0]
        seq = h.view(-1, L, self.in_features)                             # (S, L, E)
        m = (valid.view(-1, L) if valid is not None
             else torch.ones(seq.shape[:2], dtype=torch.bool, device=h.device))
        m = m.to(h.dtype).unsqueeze(-1)                                   # (S, L, 1)
        task = (seq * m).sum(1) / m.sum(1).clamp_min(1.0)                 # (S, E)
        p_task = F.softmax(self.task_router(task).to(p_token.dtype), dim=-1)  # (S, N)
        a = torch.sigmoid(self.alpha_logit).to(p_token.dtype)
        return (1 - a) * p_token + a * p_task.repeat_interleave(L, 0), p_task

    def aux_loss(self, probs: Tensor, mask: Tensor, valid: Tensor | None,
                  p_task: Tensor | None) -> Tensor | None:
        """This variant's auxiliary loss (`Variant.aux_loss`) over the non-masked tokens (None
        if the input had no tokens; NaN if all were masked)."""
        lb = lb_parts(probs, mask, valid)
        return None if lb is None else VARIANTS[self.variant].aux_loss(
            self, probs, lb, valid, p_task)


class FlyLoRALinear(nn.Module):
    """FlyLoRA (Zou et al., NeurIPS 2025, "Boosting Task Decoupling and Parameter Efficiency via
    Implicit Rank-Wise Mixture-of-Experts"): ``base_layer`` (frozen) plus a rank-``R`` LoRA whose
    ranks are the experts::

        z = A dropout(h)  (T, R),   S = top-k_t |z|,   y = W0 h + scaling * B (z * 1[S])

    ``A`` (R, d) is a frozen sparse random projection (each row ``round(d k / R)`` non-zeros
    drawn from N(0, 1/R^2)) and doubles as the implicit router: no router parameters, no
    router distribution (so no routing statistics and no CARE). ``B`` (d_out, R) starts at 0.
    ``A`` is a buffer rebuilt from the injection seed, so checkpoints hold only ``B``.
    Simplification: FlyLoRA's load-balancing expert bias is not implemented.
    """
    lora_A: Tensor   # a buffer (R, d)

    def __init__(self, base_layer: nn.Linear, *, n_experts: int = 32, top_k: int = 8,
                 alpha: float = 2.0, dropout: float = 0.05,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.base_layer = base_layer
        self.in_features, self.out_features = base_layer.in_features, base_layer.out_features
        self.n_experts, self.top_k, self.scaling = n_experts, top_k, alpha
        w = base_layer.weight
        d, R = self.in_features, n_experts
        nnz = max(1, round(d * top_k / R))
        cols = torch.rand(R, d, generator=generator).topk(nnz, dim=-1).indices      # (R, nnz)
        vals = torch.randn(R, nnz, generator=generator) / R
        a = torch.zeros(R, d).scatter_(-1, cols, vals)
        dtype = trainable_dtype(w.dtype)
        self.register_buffer("lora_A", a.to(device=w.device, dtype=dtype))
        self.lora_B = nn.Parameter(torch.zeros(self.out_features, R, device=w.device,
                                               dtype=dtype))
        self.dropout = nn.Dropout(dropout)

    def extra_repr(self) -> str:
        return (f"in={self.in_features}, out={self.out_features}, ranks={self.n_experts}, "
                f"top_k={self.top_k}, scaling={self.scaling:g}")

    def forward(self, x: Tensor) -> Tensor:
        y = self.base_layer(x)                                            # (*, O)
        z = F.linear(self.dropout(x.to(self.lora_B.dtype)), self.lora_A)  # (*, R)
        idx = z.abs().topk(self.top_k, dim=-1).indices                    # (*, k) active ranks
        u = torch.zeros_like(z).scatter(-1, idx, z.gather(-1, idx))       # (*, R)
        # on a 16-bit base (`trainable_dtype`), W0 h + B u rounded once to its dtype
        return (y + self.scaling * F.linear(u, self.lora_B)).to(y.dtype)
