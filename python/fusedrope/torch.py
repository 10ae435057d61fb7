"""PyTorch integration: RoPE on q and k as differentiable operators whose
gradient is the library's backward.

``rope_qk(q, k, cache, ...)``, ``rope(x, cache, ...)`` and
``norm_rope_qk(q, k, q_weight, k_weight, cache, ...)`` (the fused per-head
RMSNorm + RoPE) are ``torch.library`` custom ops (``fusedrope::rope_qk``,
``fusedrope::rope``, ``fusedrope::norm_rope_qk``),
so torch.compile keeps them in its graph; they return new tensors (out of
place) and run on the tensors' device and PyTorch's current CUDA stream
(CUDA-graph capturable).  On a PyTorch without ``torch.library.custom_op``
(< 2.4) the same functions go through ``torch.autograd.Function``, which
torch.compile runs eagerly between its graphs (a graph break).

Importing this module needs PyTorch; ``import fusedrope`` does not.
"""
try:
    import torch
except ImportError as e:  # pragma: no cover - exercised where torch is absent
    raise ImportError("fusedrope.torch needs PyTorch (pip install torch); the rest of "
                      "fusedrope works without it") from e

from typing import Optional

import fusedrope as _fr

__all__ = ["rope_qk", "rope", "norm_rope_qk", "RopeQKFunction", "NormRopeQKFunction"]


def _cache(cache_id):
    try:
        return _fr._caches[cache_id]
    except KeyError:
        raise ValueError(f"fusedrope cache {cache_id} no longer exists") from None


def _keep(ctx, cache_id):
    """The ops take a cache by its id (an op's arguments are tensors and
    scalars); the autograd context holds the Cache itself, so that a cache
    the caller dropped after the forward (rope_qk(q, k, fusedrope.Cache(...)))
    still serves the backward.  Under torch.compile a function given a
    second Cache sees the id change, which its automatic dynamic shapes turn
    into a SymInt: int() makes the graph specialise on the id (one graph a
    cache) instead."""
    ctx.fusedrope_cache = _cache(int(cache_id))


def _run_qk(q, k, cache_id, style, layout, backward, ids, offsets, cu_seqlens, cp_size,
            cp_rank):
    qo = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    ko = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    fn = _fr.backward_qk if backward else _fr.forward_qk
    fn(_cache(cache_id), q.detach(), k.detach(), out=(qo, ko), style=style, layout=layout,
       ids=ids, offsets=offsets, cu_seqlens=cu_seqlens, cp_size=cp_size, cp_rank=cp_rank)
    return qo, ko


def _run(x, cache_id, style, layout, backward, ids, offsets, cu_seqlens, cp_size, cp_rank):
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    fn = _fr.backward if backward else _fr.forward
    fn(_cache(cache_id), x.detach(), out=y, style=style, layout=layout, ids=ids,
       offsets=offsets, cu_seqlens=cu_seqlens, cp_size=cp_size, cp_rank=cp_rank)
    return y


_HAS_CUSTOM_OP = hasattr(torch, "library") and hasattr(torch.library, "custom_op")


def _eager(fn, *args):
    """fn.apply(*args) for the autograd.Function forms, which torch.compile
    cannot trace (Dynamo stops at the cache lookup and raises, where PyTorch
    has no custom_op): marked for Dynamo to leave alone, so that a compiled
    function runs them eagerly between its graphs (a graph break, which
    fullgraph=True refuses)."""
    return fn.apply(*args)


if not _HAS_CUSTOM_OP:  # only there: importing Dynamo takes ~1.5 s (torch 2.15, CPU)
    try:
        import torch._dynamo
        _eager = torch._dynamo.disable(_eager)
    except (ImportError, AttributeError):  # pragma: no cover - a PyTorch without Dynamo
        pass

if _HAS_CUSTOM_OP:
    @torch.library.custom_op("fusedrope::rope_qk", mutates_args=())
    def _rope_qk_op(q: torch.Tensor, k: torch.Tensor, cache_id: int, style: str, layout: str,
                    backward: bool, ids: Optional[torch.Tensor], offsets: Optional[torch.Tensor],
                    cu_seqlens: Optional[torch.Tensor], cp_size: int,
                    cp_rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        return _run_qk(q, k, cache_id, style, layout, backward, ids, offsets, cu_seqlens,
                       cp_size, cp_rank)

    @_rope_qk_op.register_fake
    def _(q, k, cache_id, style, layout, backward, ids, offsets, cu_seqlens, cp_size, cp_rank):
        return q.new_empty(q.shape), k.new_empty(k.shape)

    def _qk_setup(ctx, inputs, output):
        (q, k, ctx.cache_id, ctx.style, ctx.layout, ctx.backward, ids, offsets, cu,
         ctx.cp_size, ctx.cp_rank) = inputs
        _keep(ctx, ctx.cache_id)
        ctx.save_for_backward(ids, offsets, cu)

    def _qk_grad(ctx, gq, gk):
        ids, offsets, cu = ctx.saved_tensors
        # The gradient of a rotation is its transpose: the other direction.
        dq, dk = _rope_qk_op(gq.contiguous(), gk.contiguous(), ctx.cache_id, ctx.style,
                             ctx.layout, not ctx.backward, ids, offsets, cu, ctx.cp_size,
                             ctx.cp_rank)
        return dq, dk, None, None, None, None, None, None, None, None, None

    _rope_qk_op.register_autograd(_qk_grad, setup_context=_qk_setup)

    @torch.library.custom_op("fusedrope::rope", mutates_args=())
    def _rope_op(x: torch.Tensor, cache_id: int, style: str, layout: str, backward: bool,
                 ids: Optional[torch.Tensor], offsets: Optional[torch.Tensor],
                 cu_seqlens: Optional[torch.Tensor], cp_size: int, cp_rank: int) -> torch.Tensor:
        return _run(x, cache_id, style, layout, backward, ids, offsets, cu_seqlens, cp_size,
                    cp_rank)

    @_rope_op.register_fake
    def _(x, cache_id, style, layout, backward, ids, offsets, cu_seqlens, cp_size, cp_rank):
        return x.new_empty(x.shape)

    def _setup(ctx, inputs, output):
        (x, ctx.cache_id, ctx.style, ctx.layout, ctx.backward, ids, offsets, cu, ctx.cp_size,
         ctx.cp_rank) = inputs
        _keep(ctx, ctx.cache_id)
        ctx.save_for_backward(ids, offsets, cu)

    def _grad(ctx, g):
        ids, offsets, cu = ctx.saved_tensors
        dx = _rope_op(g.contiguous(), ctx.cache_id, ctx.style, ctx.layout, not ctx.backward,
                      ids, offsets, cu, ctx.cp_size, ctx.cp_rank)
        return dx, None, None, None, None, None, None, None, None, None

    _rope_op.register_autograd(_grad, setup_context=_setup)


class RopeQKFunction(torch.autograd.Function):
    """The autograd.Function form of rope_qk (used where torch.library's
    custom_op is missing; usable directly too)."""

    @staticmethod
    def forward(ctx, q, k, cache_id, style, layout, backward, ids, offsets, cu_seqlens, cp_size,
                cp_rank):
        ctx.args = (cache_id, style, layout, backward, cp_size, cp_rank)
        _keep(ctx, cache_id)
        ctx.save_for_backward(ids, offsets, cu_seqlens)
        return _run_qk(q, k, cache_id, style, layout, backward, ids, offsets, cu_seqlens,
                       cp_size, cp_rank)

    @staticmethod
    def backward(ctx, gq, gk):
        cache_id, style, layout, backward, cp_size, cp_rank = ctx.args
        ids, offsets, cu = ctx.saved_tensors
        # never None: autograd gives zeros for an unused output
        # (materialize_grads is left on)
        gq, gk = gq.contiguous(), gk.contiguous()
        dq, dk = RopeQKFunction.apply(gq, gk, cache_id, style, layout, not backward, ids,
                                      offsets, cu, cp_size, cp_rank)
        return dq, dk, None, None, None, None, None, None, None, None, None


def _check(cache, **tensors):
    """The cache's id; a clear TypeError for a cache or a tensor of the
    call that is neither (k=None: the q-only forms are fusedrope.forward
    and fusedrope.norm_forward_qk, or rope for rotation alone)."""
    if not isinstance(cache, _fr.Cache):
        raise TypeError(f"cache must be a fusedrope.Cache, not {type(cache).__name__}")
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, not {type(t).__name__}")
    return cache.id


def rope_qk(q, k, cache, *, style="neox", layout="sbhd", ids=None, offsets=None,
            cu_seqlens=None, cp_size=1, cp_rank=0):
    """(q_out, k_out): q and k rotated (fusedrope_forward_qk), differentiable."""
    args = (_check(cache, q=q, k=k), style, layout, False, ids, offsets, cu_seqlens,
            int(cp_size), int(cp_rank))
    if _HAS_CUSTOM_OP:
        return _rope_qk_op(q, k, *args)
    return _eager(RopeQKFunction, q, k, *args)


def rope(x, cache, *, style="neox", layout="sbhd", ids=None, offsets=None, cu_seqlens=None,
         cp_size=1, cp_rank=0):
    """x rotated (fusedrope_forward), differentiable."""
    cache_id = _check(cache, x=x)
    if _HAS_CUSTOM_OP:
        return _rope_op(x, cache_id, style, layout, False, ids, offsets, cu_seqlens,
                        int(cp_size), int(cp_rank))
    k = x.new_empty(x.shape[:-2] + (0, x.shape[-1]))
    return _eager(RopeQKFunction, x, k, cache_id, style, layout, False, ids, offsets,
                  cu_seqlens, int(cp_size), int(cp_rank))[0]


# ------------------------------------------------------------ fused norm

def _rstd_shape(x, layout):
    """[batch, seq, heads] (thd: [tokens, heads]) of a tensor in `layout`."""
    if layout == "thd":
        return x.shape[:2]
    s, b = (x.shape[0], x.shape[1]) if layout == "sbhd" else (x.shape[1], x.shape[0])
    return (b, s, x.shape[2])


def _run_norm(q, k, qw, kw, cache_id, weight, rounding, eps, style, layout, ids, offsets,
              cu_seqlens, cp_size, cp_rank):
    # contiguous, as the fake kernel's (empty_like keeps a view's strides,
    # which torch.compile's graph did not expect)
    qo = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    ko = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    rq = torch.empty(_rstd_shape(q, layout), dtype=torch.float32, device=q.device)
    rk = torch.empty(_rstd_shape(k, layout), dtype=torch.float32, device=k.device)
    _fr.norm_forward_qk(_cache(cache_id), q.detach(), k.detach(),
                        None if qw is None else qw.detach(), None if kw is None else kw.detach(),
                        weight=weight, rounding=rounding, eps=eps, rstd=(rq, rk), style=style,
                        layout=layout, out=(qo, ko), ids=ids, offsets=offsets,
                        cu_seqlens=cu_seqlens, cp_size=cp_size, cp_rank=cp_rank)
    return qo, ko, rq, rk


def _run_norm_grad(q, k, qw, kw, rq, rk, gq, gk, cache_id, weight, rounding, eps, style,
                   layout, ids, offsets, cu_seqlens, cp_size, cp_rank):
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    gw = weight != "none"
    dqw = torch.empty(q.shape[-1], dtype=torch.float32, device=q.device) if gw else None
    dkw = torch.empty(k.shape[-1], dtype=torch.float32, device=k.device) if gw else None
    _fr.norm_backward_qk(_cache(cache_id), q.detach(), gq.detach(), k.detach(), gk.detach(),
                         None if qw is None else qw.detach(),
                         None if kw is None else kw.detach(), rstd=(rq.detach(), rk.detach()),
                         weight=weight,
                         rounding=rounding, eps=eps, dweight=(dqw, dkw) if gw else None,
                         style=style, layout=layout, out=(dq, dk), ids=ids, offsets=offsets,
                         cu_seqlens=cu_seqlens, cp_size=cp_size, cp_rank=cp_rank)
    if gw:
        dqw, dkw = dqw.to(qw.dtype), dkw.to(kw.dtype)
    return dq, dk, dqw, dkw


if _HAS_CUSTOM_OP:
    @torch.library.custom_op("fusedrope::norm_rope_qk", mutates_args=())
    def _norm_op(q: torch.Tensor, k: torch.Tensor, qw: Optional[torch.Tensor],
                 kw: Optional[torch.Tensor], cache_id: int, weight: str, rounding: str,
                 eps: float, style: str, layout: str, ids: Optional[torch.Tensor],
                 offsets: Optional[torch.Tensor], cu_seqlens: Optional[torch.Tensor],
                 cp_size: int, cp_rank: int
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return _run_norm(q, k, qw, kw, cache_id, weight, rounding, eps, style, layout, ids,
                         offsets, cu_seqlens, cp_size, cp_rank)

    @_norm_op.register_fake
    def _(q, k, qw, kw, cache_id, weight, rounding, eps, style, layout, ids, offsets,
          cu_seqlens, cp_size, cp_rank):
        return (q.new_empty(q.shape), k.new_empty(k.shape),
                q.new_empty(_rstd_shape(q, layout), dtype=torch.float32),
                k.new_empty(_rstd_shape(k, layout), dtype=torch.float32))

    @torch.library.custom_op("fusedrope::norm_rope_qk_backward", mutates_args=())
    def _norm_grad_op(q: torch.Tensor, k: torch.Tensor, qw: Optional[torch.Tensor],
                      kw: Optional[torch.Tensor], rq: torch.Tensor, rk: torch.Tensor,
                      gq: torch.Tensor, gk: torch.Tensor, cache_id: int, weight: str,
                      rounding: str, eps: float, style: str, layout: str,
                      ids: Optional[torch.Tensor], offsets: Optional[torch.Tensor],
                      cu_seqlens: Optional[torch.Tensor], cp_size: int, cp_rank: int
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        # an op returns tensors only: no weight, no gradient -> empty ones
        dq, dk, dqw, dkw = _run_norm_grad(q, k, qw, kw, rq, rk, gq, gk, cache_id, weight,
                                          rounding, eps, style, layout, ids, offsets,
                                          cu_seqlens, cp_size, cp_rank)
        def none():
            return q.new_empty((0,), dtype=torch.float32)
        return dq, dk, none() if dqw is None else dqw, none() if dkw is None else dkw

    @_norm_grad_op.register_fake
    def _(q, k, qw, kw, rq, rk, gq, gk, cache_id, weight, rounding, eps, style, layout, ids,
          offsets, cu_seqlens, cp_size, cp_rank):
        return (q.new_empty(q.shape), k.new_empty(k.shape),
                q.new_empty((0,), dtype=torch.float32) if qw is None else qw.new_empty(qw.shape),
                q.new_empty((0,), dtype=torch.float32) if kw is None else kw.new_empty(kw.shape))

    def _norm_setup(ctx, inputs, output):
        q, k, qw, kw, *ctx.args = inputs
        _keep(ctx, ctx.args[0])
        ctx.save_for_backward(q, k, qw, kw, output[2], output[3])

    def _norm_grad(ctx, gq, gk, _grq, _grk):
        q, k, qw, kw, rq, rk = ctx.saved_tensors
        gq = torch.zeros_like(q) if gq is None else gq.contiguous()
        gk = torch.zeros_like(k) if gk is None else gk.contiguous()
        dq, dk, dqw, dkw = _norm_grad_op(q, k, qw, kw, rq, rk, gq, gk, *ctx.args)
        return (dq, dk, None if qw is None else dqw, None if kw is None else dkw) + (None,) * 11

    _norm_op.register_autograd(_norm_grad, setup_context=_norm_setup)


class NormRopeQKFunction(torch.autograd.Function):
    """The autograd.Function form of norm_rope_qk (where torch.library's
    custom_op is missing)."""

    @staticmethod
    def forward(ctx, q, k, qw, kw, *args):
        qo, ko, rq, rk = _run_norm(q, k, qw, kw, *args)
        ctx.args = args
        _keep(ctx, args[0])
        ctx.save_for_backward(q, k, qw, kw, rq, rk)
        return qo, ko

    @staticmethod
    def backward(ctx, gq, gk):
        q, k, qw, kw, rq, rk = ctx.saved_tensors
        gq = torch.zeros_like(q) if gq is None else gq.contiguous()
        gk = torch.zeros_like(k) if gk is None else gk.contiguous()
        dq, dk, dqw, dkw = _NormGradFunction.apply(q, k, qw, kw, rq, rk, gq, gk, *ctx.args)
        return (dq, dk, dqw, dkw) + (None,) * 11


class _NormGradFunction(torch.autograd.Function):
    """NormRopeQKFunction's backward as a node of its own: under
    create_graph=True its outputs hang on q, k, the weights and the incoming
    gradients, so a double backward reaches this node and fails, as the
    custom op's does (the library's backward has no derivative), instead of
    returning a gradient without the norm's second-order term."""

    @staticmethod
    def forward(ctx, q, k, qw, kw, rq, rk, gq, gk, *args):
        return _run_norm_grad(q, k, qw, kw, rq, rk, gq, gk, *args)

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError("fusedrope: the fused norm's backward is not differentiable: a double "
                           "backward (create_graph=True) through norm_rope_qk is not supported")


def norm_rope_qk(q, k, q_weight, k_weight, cache, *, weight=None, rounding="once", eps=1e-6,
                 style="neox", layout="sbhd", ids=None, offsets=None, cu_seqlens=None,
                 cp_size=1, cp_rank=0):
    """(q_out, k_out): per-head RMSNorm of q and k, then their RoPE, in one
    pass (fusedrope_norm_forward_qk), differentiable in q, k and the weights
    (fusedrope_norm_backward_qk from the saved inputs).  weight: "w" (Qwen3,
    GLM-4.5), "1+w" (Gemma 3, Qwen3.5), "none" (Llama 4; weights None), None:
    "w" when weights are given; rounding "once", "llama" (Qwen3) or "gemma"
    (Gemma 3): see fusedrope.norm_forward_qk."""
    if weight is None:
        weight = "w" if q_weight is not None else "none"
    args = (_check(cache, q=q, k=k), weight, rounding, _fr._real(eps, "eps"), style, layout,
            ids, offsets, cu_seqlens, int(cp_size), int(cp_rank))
    if _HAS_CUSTOM_OP:
        return _norm_op(q, k, q_weight, k_weight, *args)[:2]
    return _eager(NormRopeQKFunction, q, k, q_weight, k_weight, *args)
