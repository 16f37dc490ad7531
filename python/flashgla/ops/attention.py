"""Softmax attention (FlashAttention) as a PyTorch op: flashgla::flash_attention
with its fake implementation and autograd formula (flashgla::flash_attention_backward)."""

from typing import Optional, Tuple

import torch
from torch import Tensor

from .. import _C
from .._torch import as_scale, forbid_double_backward, make_args, require_same_device, require_tensors, run_op
from ._memory import require_outputs

__all__ = ["flash_attention"]

_TILED = _C.AttentionAlgorithm.tiled


def _output_shapes(q, v):
    o_shape = (*q.shape[:3], v.shape[-1]) if q.dim() == 4 else v.shape
    lse_shape = (q.shape[0], q.shape[2], q.shape[1]) if q.dim() == 4 else (0,)
    return o_shape, lse_shape


def _forward_outputs(q, v):
    o_shape, lse_shape = _output_shapes(q, v)
    return (torch.empty(o_shape, dtype=q.dtype, device=q.device),
            torch.empty(lse_shape, dtype=torch.float32, device=q.device))


def _backward_outputs(q, k, v):
    return tuple(torch.empty(x.shape, dtype=q.dtype, device=q.device) for x in (q, k, v))


# deterministic is the backward's (kept for it by the autograd formula); the forward is deterministic anyway.
@torch.library.custom_op("flashgla::flash_attention", mutates_args=())
def _flash_attention(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Optional[Tensor],
                     cu_seqlens_k: Optional[Tensor], causal: bool, scale: Optional[float],
                     deterministic: bool) -> Tuple[Tensor, Tensor]:
    o_shape, lse_shape = _output_shapes(q, v)
    require_outputs("flash_attention", q.device, [("o", o_shape, q.dtype), ("lse", lse_shape, torch.float32)])
    o, lse = _forward_outputs(q, v)
    args = make_args(_C.AttentionForwardArgs, q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                     causal=causal, scale=scale, algorithm=_TILED, o=o, lse=lse)
    run_op(_C.attention_forward, args, q.device)
    return o, lse


@_flash_attention.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, scale, deterministic):
    require_same_device(q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    return _forward_outputs(q, v)


@torch.library.custom_op("flashgla::flash_attention_backward", mutates_args=())
def _flash_attention_backward(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Optional[Tensor],
                              cu_seqlens_k: Optional[Tensor], o: Tensor, lse: Tensor, do: Tensor, causal: bool,
                              scale: Optional[float], deterministic: bool) -> Tuple[Tensor, Tensor, Tensor]:
    require_outputs("flash_attention (backward)", q.device,
                    [("dq", q.shape, q.dtype), ("dk", k.shape, q.dtype), ("dv", v.shape, q.dtype)])
    dq, dk, dv = _backward_outputs(q, k, v)
    args = make_args(_C.AttentionBackwardArgs, q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                     causal=causal, scale=scale, algorithm=_TILED, o=o, lse=lse, d_o=do, dq=dq, dk=dk, dv=dv,
                     deterministic=deterministic)
    run_op(_C.attention_backward, args, q.device)
    return dq, dk, dv


@_flash_attention_backward.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, o, lse, do, causal, scale, deterministic):
    require_same_device(q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, o=o, lse=lse, d_o=do)
    return _backward_outputs(q, k, v)


def _setup_context(ctx, inputs, output):
    q, k, v, cu_seqlens_q, cu_seqlens_k, causal, scale, deterministic = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, cu_seqlens_q, cu_seqlens_k, o, lse)
    ctx.causal, ctx.scale, ctx.deterministic = causal, scale, deterministic


def _gradients(ctx, do, dlse):
    # lse is an output only so that the backward can use it; its gradient is ignored.
    q, k, v, cu_seqlens_q, cu_seqlens_k, o, lse = ctx.saved_tensors
    dq, dk, dv = _flash_attention_backward(q, k, v, cu_seqlens_q, cu_seqlens_k, o, lse, do, ctx.causal, ctx.scale,
                                           ctx.deterministic)
    return dq, dk, dv, None, None, None, None, None


_flash_attention.register_autograd(_gradients, setup_context=_setup_context)
forbid_double_backward(_flash_attention_backward, "flash_attention")


def flash_attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = True, scale: Optional[float] = None,
                    cu_seqlens: Optional[Tensor] = None, cu_seqlens_k: Optional[Tensor] = None,
                    deterministic: bool = False) -> Tensor:
    """Softmax attention, o = softmax(scale q k^T + mask) v, computed tile by tile.

    q [B,Tq,Hq,D], k [B,Tk,Hkv,D], v [B,Tk,Hkv,Dv] (fp32/bf16/fp16/fp64; Hkv divides Hq: grouped KV heads).
    causal masks key j > i + Tk - Tq (bottom-right aligned, as FlashAttention >= 2.1); scale defaults to
    D^-1/2. cu_seqlens [N+1] (int32/int64, B == 1) packs N sequences: FlashAttention's cu_seqlens_q, and
    cu_seqlens_k too unless cu_seqlens_k [N+1] gives the keys' own boundaries (for example one new query
    per sequence against its cached keys). Returns o [B,Tq,Hq,Dv] in the dtype of q.

    deterministic: the backward gives bitwise the same gradients on every run (FlashAttention's flag). Only the
    CUDA bf16/fp16 backward at head dims 64 and 128 can differ otherwise (in dq's last bits: it adds the key
    tiles' shares in the order they arrive); deterministic=True makes them take turns, at some cost in speed.
    """
    require_tensors(q=q, k=k, v=v, cu_seqlens=cu_seqlens, cu_seqlens_k=cu_seqlens_k)
    if cu_seqlens_k is not None and cu_seqlens is None:
        raise ValueError("flash_attention: cu_seqlens_k needs cu_seqlens (the queries' boundaries) too")
    cu_seqlens_k = cu_seqlens if cu_seqlens_k is None else cu_seqlens_k
    if not isinstance(deterministic, bool):
        raise TypeError(f"flashgla: deterministic: expected a bool, got {type(deterministic).__name__}")
    o, _ = _flash_attention(q, k, v, cu_seqlens, cu_seqlens_k, bool(causal), as_scale(scale, "flash_attention"),
                            deterministic)
    return o
