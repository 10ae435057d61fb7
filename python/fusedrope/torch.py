"""PyTorch integration: RoPE on q and k as differentiable operators whose
gradient is the library's backward.

``rope_qk(q, k, cache, ...)`` and ``rope(x, cache, ...)`` are
``torch.library`` custom ops (``fusedrope::rope_qk``, ``fusedrope::rope``),
so torch.compile keeps them in its graph; they return new tensors (out of
place) and run on the tensors' device and PyTorch's current CUDA stream
(CUDA-graph capturable).  On a PyTorch without ``torch.library.custom_op``
(< 2.4) the same functions go through ``torch.autograd.Function``.

Importing this module needs PyTorch; ``import fusedrope`` does not.
"""
try:
    import torch
except ImportError as e:  # pragma: no cover - exercised where torch is absent
    raise ImportError("fusedrope.torch needs PyTorch (pip install torch); the rest of "
                      "fusedrope works without it") from e

from typing import Optional

import fusedrope as _fr

__all__ = ["rope_qk", "rope", "RopeQKFunction"]


def _cache(cache_id):
    try:
        return _fr._caches[cache_id]
    except KeyError:
        raise ValueError(f"fusedrope cache {cache_id} no longer exists") from None


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
        ctx.save_for_backward(ids, offsets, cu_seqlens)
        return _run_qk(q, k, cache_id, style, layout, backward, ids, offsets, cu_seqlens,
                       cp_size, cp_rank)

    @staticmethod
    def backward(ctx, gq, gk):
        cache_id, style, layout, backward, cp_size, cp_rank = ctx.args
        ids, offsets, cu = ctx.saved_tensors
        gq = torch.zeros_like(gq) if gq is None else gq.contiguous()
        gk = torch.zeros_like(gk) if gk is None else gk.contiguous()
        dq, dk = RopeQKFunction.apply(gq, gk, cache_id, style, layout, not backward, ids,
                                      offsets, cu, cp_size, cp_rank)
        return dq, dk, None, None, None, None, None, None, None, None, None


def _check(cache):
    if not isinstance(cache, _fr.Cache):
        raise TypeError(f"cache must be a fusedrope.Cache, not {type(cache).__name__}")
    return cache.id


def rope_qk(q, k, cache, *, style="neox", layout="sbhd", ids=None, offsets=None,
            cu_seqlens=None, cp_size=1, cp_rank=0):
    """(q_out, k_out): q and k rotated (fusedrope_forward_qk), differentiable."""
    args = (_check(cache), style, layout, False, ids, offsets, cu_seqlens, int(cp_size),
            int(cp_rank))
    if _HAS_CUSTOM_OP:
        return _rope_qk_op(q, k, *args)
    return RopeQKFunction.apply(q, k, *args)


def rope(x, cache, *, style="neox", layout="sbhd", ids=None, offsets=None, cu_seqlens=None,
         cp_size=1, cp_rank=0):
    """x rotated (fusedrope_forward), differentiable."""
    if _HAS_CUSTOM_OP:
        return _rope_op(x, _check(cache), style, layout, False, ids, offsets, cu_seqlens,
                        int(cp_size), int(cp_rank))
    k = x.new_empty(x.shape[:-2] + (0, x.shape[-1]))
    return RopeQKFunction.apply(x, k, _check(cache), style, layout, False, ids, offsets,
                                cu_seqlens, int(cp_size), int(cp_rank))[0]
