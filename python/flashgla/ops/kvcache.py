"""Attention over a KV cache (decoding) as a PyTorch op: flashgla::flash_attention_with_kvcache, with
FlashAttention's flash_attn_with_kvcache semantics. Inference only (no autograd formula)."""

import numbers
from typing import Optional, Tuple

import torch
from torch import Tensor

from .. import _C
from .._torch import as_scale, make_args, require_same_device, require_tensors, run_op
from ._memory import require_outputs

__all__ = ["flash_attention_with_kvcache"]


def _outputs(q, v_cache, with_lse=True):
    o = torch.empty((*q.shape[:3], v_cache.shape[-1]), dtype=q.dtype, device=q.device)
    if not with_lse:
        return o, None
    return o, torch.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32, device=q.device)


def _run(q, k_cache, v_cache, cache_seqlens, block_table, k, v, causal, scale, max_seqlen_k, num_splits,
         with_lse=True):
    """o and lse; with_lse=False leaves lse out (None): the kernels then skip it."""
    require_outputs("flash_attention_with_kvcache", q.device,
                    [("o", (*q.shape[:3], v_cache.shape[-1]), q.dtype),
                     ("lse", (q.shape[0], q.shape[2], q.shape[1]), torch.float32)])
    o, lse = _outputs(q, v_cache, with_lse)
    args = make_args(_C.AttentionKvCacheArgs, q=q, k_cache=k_cache, v_cache=v_cache, cache_seqlens=cache_seqlens,
                     block_table=block_table, k=k, v=v, causal=causal, scale=scale, max_seqlen_k=max_seqlen_k,
                     num_splits=num_splits, o=o, lse=lse)
    run_op(_C.attention_with_kvcache, args, q.device)
    return o, lse


@torch.library.custom_op("flashgla::flash_attention_with_kvcache", mutates_args=("k_cache", "v_cache"))
def _flash_attention_with_kvcache(q: Tensor, k_cache: Tensor, v_cache: Tensor, cache_seqlens: Tensor,
                                  block_table: Optional[Tensor], k: Optional[Tensor], v: Optional[Tensor],
                                  causal: bool, scale: Optional[float], max_seqlen_k: Optional[int],
                                  num_splits: int) -> Tuple[Tensor, Tensor]:
    return _run(q, k_cache, v_cache, cache_seqlens, block_table, k, v, causal, scale, max_seqlen_k, num_splits)


def _plain_eager(tensors) -> bool:
    """Whether the custom op would do nothing but call _run: eager (not traced by torch.compile), no
    dispatch or function mode and no functorch transform active, plain tensors that need no gradient. A
    decode step is such a call, and the custom op's dispatch costs it about as much host time as the rest
    (bench/notes_kvcache.md), so there _run is called directly."""
    if torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack() or torch._C._len_torch_function_stack():
        return False
    if torch._C._functorch.peek_interpreter_stack() is not None:
        return False
    return all(t is None or (type(t) is torch.Tensor and not t.requires_grad) for t in tensors)


@_flash_attention_with_kvcache.register_fake
def _(q, k_cache, v_cache, cache_seqlens, block_table, k, v, causal, scale, max_seqlen_k, num_splits):
    require_same_device(q, k_cache=k_cache, v_cache=v_cache, cache_seqlens=cache_seqlens, block_table=block_table,
                        k=k, v=v)
    return _outputs(q, v_cache)


def _count(value, name, minimum):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"flashgla: {name}: expected an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"flashgla: {name}: expected an int >= {minimum}, got {value}")
    return int(value)


def flash_attention_with_kvcache(q: Tensor, k_cache: Tensor, v_cache: Tensor, cache_seqlens: Tensor,
                                 block_table: Optional[Tensor] = None, k: Optional[Tensor] = None,
                                 v: Optional[Tensor] = None, causal: bool = True, scale: Optional[float] = None,
                                 max_seqlen_k: Optional[int] = None, num_splits: int = 0,
                                 return_softmax_lse: bool = False):
    """Attention of new queries over a KV cache, as FlashAttention's flash_attn_with_kvcache.

    q [B, Tq, Hq, D]; k_cache, v_cache [B, Tmax, Hkv, D] (contiguous) or [num_blocks, block_size, Hkv, D]
    with block_table [B, max_blocks] int32 (paged: key j of sequence b is row j % block_size of block
    block_table[b, j // block_size]); cache_seqlens [B] int32, the keys already cached. With k, v
    [B, Tq, Hkv, D] the new keys and values are first written into the cache in place at rows
    cache_seqlens[b].. and attended too (cache_seqlens itself is not changed: advance it yourself).
    Query i of sequence b sees keys j < L_b (L_b = cache_seqlens[b], + Tq with k, v), and with causal
    those with j <= i + L_b - Tq. Hkv divides Hq (grouped KV heads); scale defaults to D^-1/2.

    CUDA: bf16/fp16/fp32 with D in {64, 128} and Dv == D; nothing is read back to the host, so the call
    can be captured in a CUDA graph. The keys are split across CTAs (flash-decoding) by a plan from
    max_seqlen_k, a host-side bound on L_b (default the capacity; a bound too small costs speed, not
    correctness), or num_splits when > 0. On CUDA, lengths past the capacity are clamped and blocks out
    of range are skipped (never an illegal access); the CPU checks them and raises ValueError.

    Returns o [B, Tq, Hq, Dv] in the dtype of q, and with return_softmax_lse also lse [B, Hq, Tq] fp32.
    """
    require_tensors(q=q, k_cache=k_cache, v_cache=v_cache, cache_seqlens=cache_seqlens, block_table=block_table,
                    k=k, v=v)
    if (k is None) != (v is None):
        raise ValueError(f"flashgla: {'v' if k is not None else 'k'}: new keys k and values v are given together "
                         "or not at all")
    if cache_seqlens.dtype != torch.int32:
        raise TypeError(f"flashgla: cache_seqlens: expected dtype torch.int32, got {cache_seqlens.dtype} "
                        "(use cache_seqlens.to(torch.int32))")
    if block_table is not None and block_table.dtype != torch.int32:
        raise TypeError(f"flashgla: block_table: expected dtype torch.int32, got {block_table.dtype}")
    scale = as_scale(scale, "flash_attention_with_kvcache")
    max_seqlen_k = _count(max_seqlen_k, "max_seqlen_k", 0)
    num_splits = _count(num_splits, "num_splits", 0)
    call = (q, k_cache, v_cache, cache_seqlens, block_table, k, v, bool(causal), scale, max_seqlen_k, num_splits)
    if _plain_eager(call[:7]):
        o, lse = _run(*call, with_lse=return_softmax_lse)
        if k is not None:  # the cache was written: what the custom op's mutation bookkeeping records
            torch.autograd.graph.increment_version((k_cache, v_cache))
    else:
        o, lse = _flash_attention_with_kvcache(*call)
    return (o, lse) if return_softmax_lse else o
