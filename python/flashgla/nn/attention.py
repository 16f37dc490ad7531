"""Softmax attention layer (LLaMA style: rotary positions, grouped KV heads, no biases), for hybrid
GLA models and the Transformer++ baseline. The attention itself is flashgla.flash_attention, or
torch's scaled_dot_product_attention with backend="sdpa" (the baseline of bench/bench_model.py)."""

from dataclasses import dataclass
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..ops.attention import flash_attention
from ..ops.kvcache import flash_attention_with_kvcache
from .padding import forward_packed, positions_in_sequence, sequence_ids

__all__ = ["Attention", "KVCache", "RotaryEmbedding"]

_BACKENDS = ("flashgla", "sdpa")


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (RoPE) on [.., T, H, D] tensors, rotating the two halves of D."""

    def __init__(self, dim: int, theta: float = 10000.0):
        super().__init__()
        if dim % 2:
            raise ValueError(f"rotary embedding needs an even head dimension, got {dim}")
        # The frequencies are computed on each call (D/2 numbers) rather than kept in a buffer: a model
        # built on the meta device (transformers' from_pretrained) then needs no re-initialization.
        self.dim, self.theta = dim, float(theta)

    def inv_freq(self, device) -> Tensor:
        return self.theta ** (-torch.arange(0, self.dim, 2, dtype=torch.float32, device=device) / self.dim)

    def forward(self, x: Tensor, positions: Tensor) -> Tensor:
        """x [B, T, H, D]; positions [B, T] or [T] (int)."""
        angles = positions.to(torch.float32).unsqueeze(-1) * self.inv_freq(x.device)  # [.., T, D/2]
        if angles.dim() == 2:
            angles = angles.unsqueeze(0)
        cos, sin = angles.cos().unsqueeze(2), angles.sin().unsqueeze(2)      # [B, T, 1, D/2]
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


@dataclass
class KVCache:
    """Keys and values of the tokens seen so far, [B, capacity, Hkv, D], the first `length` valid; with
    `seqlens` (int32 [B], on the device) sequence b has its own seqlens[b] valid keys from row 0 (left-padded
    prompts keep no padding) and `length` is their maximum, kept on the host."""

    k: Tensor
    v: Tensor
    length: int = 0
    # Static caches (CUDA-graph decoding): the capacity is fixed and the next write position is this
    # device tensor (int64 [1]), advanced by the caller after each step; `length` is only its host mirror.
    position: Optional[Tensor] = None
    seqlens: Optional[Tensor] = None

    def reserve(self, needed: int) -> None:
        """Grows the capacity to at least `needed` rows, geometrically, so that appending one token at a
        time stays cheap."""
        if needed > self.k.shape[1]:
            capacity = max(needed, 2 * self.k.shape[1])
            grow = (0, 0, 0, 0, 0, capacity - self.k.shape[1])
            self.k, self.v = F.pad(self.k, grow), F.pad(self.v, grow)

    def append(self, k: Tensor, v: Tensor) -> Tuple[Tensor, Tensor]:
        """Adds [B, T, Hkv, D] and returns all valid keys and values (views)."""
        needed = self.length + k.shape[1]
        self.reserve(needed)
        self.k[:, self.length:needed] = k
        self.v[:, self.length:needed] = v
        self.length = needed
        return self.k[:, :needed], self.v[:, :needed]

    def lengths(self) -> Tensor:
        """seqlens, made from `length` (every sequence equally long) when absent."""
        if self.seqlens is None:
            self.seqlens = torch.full((self.k.shape[0],), self.length, dtype=torch.int32, device=self.k.device)
        return self.seqlens

    @staticmethod
    def empty(batch: int, num_kv_heads: int, head_dim: int, capacity: int, dtype, device) -> "KVCache":
        shape = (batch, capacity, num_kv_heads, head_dim)
        return KVCache(torch.empty(shape, dtype=dtype, device=device), torch.empty(shape, dtype=dtype, device=device))

    @staticmethod
    def from_packed(k: Tensor, v: Tensor, cu_seqlens: Tensor) -> "KVCache":
        """A cache of N sequences from packed keys and values [1, total, Hkv, D] with boundaries cu_seqlens
        [N+1]: each sequence's keys from row 0, its length in seqlens (reads the longest back to the host)."""
        total = k.shape[1]
        lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).to(torch.int32)
        cache = KVCache.empty(len(lengths), k.shape[2], k.shape[3], max(int(lengths.max()), 1), k.dtype, k.device)
        rows, cols = sequence_ids(cu_seqlens, total), positions_in_sequence(cu_seqlens, total)
        cache.k.zero_(), cache.v.zero_()  # rows past a sequence's length are never attended; keep them finite
        cache.k[rows, cols], cache.v[rows, cols] = k[0], v[0]
        cache.length, cache.seqlens = int(lengths.max()), lengths
        return cache


class Attention(nn.Module):
    """Causal multi-head softmax attention with RoPE. Input and output [B, T, hidden_size]. deterministic: the
    flashgla backend's backward gives bitwise the same gradients on every run (flash_attention's flag)."""

    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: Optional[int] = None,
                 rope_theta: float = 10000.0, backend: str = "flashgla", layer_idx: Optional[int] = None,
                 deterministic: bool = False):
        super().__init__()
        if not isinstance(deterministic, bool):
            raise TypeError(f"attention: deterministic: expected a bool, got {type(deterministic).__name__}")
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if num_heads < 1 or num_kv_heads < 1 or hidden_size % num_heads:
            raise ValueError(f"attention: hidden_size ({hidden_size}) must be divisible by num_heads ({num_heads})")
        if num_heads % num_kv_heads:
            raise ValueError(f"attention: num_kv_heads ({num_kv_heads}) must divide num_heads ({num_heads})")
        if backend not in _BACKENDS:
            raise ValueError(f"attention backend must be one of {_BACKENDS}, got {backend!r}")
        self.hidden_size, self.num_heads, self.num_kv_heads = hidden_size, num_heads, num_kv_heads
        self.head_dim = hidden_size // num_heads
        self.backend, self.layer_idx, self.deterministic = backend, layer_idx, deterministic
        self.q_proj = nn.Linear(hidden_size, hidden_size, bias=False)
        self.k_proj = nn.Linear(hidden_size, num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(hidden_size, hidden_size, bias=False)
        self.rotary = RotaryEmbedding(self.head_dim, rope_theta)

    def forward(self, hidden_states: Tensor, attention_mask: Optional[Tensor] = None,
                cu_seqlens: Optional[Tensor] = None, state: Optional[KVCache] = None,
                use_cache: bool = False, cp_context=None) -> Tuple[Tensor, Optional[KVCache]]:
        """As GatedLinearAttention.forward; the state is a KVCache. A padded or packed prompt starts one (backend
        flashgla: each sequence keeps its own length), which later steps continue unpadded, [B, T].

        cp_context (context parallelism): the rank's local queries attend over the keys and values of
        all ranks (all-gathered; their gradients summed back), up to the rank's own end, with
        bottom-right causal alignment per sequence and RoPE positions from the global offsets."""
        if cp_context is not None:
            return self._forward_cp(hidden_states, attention_mask, cu_seqlens, state, use_cache, cp_context), None
        return forward_packed(self._forward, hidden_states, self.hidden_size, attention_mask, cu_seqlens, state,
                              use_cache)

    def _forward(self, x: Tensor, cu_seqlens: Optional[Tensor], cache: Optional[KVCache],
                 use_cache: bool) -> Tuple[Tensor, Optional[KVCache]]:
        batch, seq_len, _ = x.shape
        if cu_seqlens is not None and cache is not None:
            raise NotImplementedError("attention: continuing a KV cache with packed or padded sequences is not "
                                      "supported; pass one step of every sequence unpadded, [B, T]")
        if cu_seqlens is not None and use_cache and self.backend != "flashgla":
            raise NotImplementedError("attention backend 'sdpa' keeps no KV cache of packed or padded sequences; "
                                      "generate such sequences one at a time")
        q = self.q_proj(x).view(batch, seq_len, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(batch, seq_len, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(batch, seq_len, self.num_kv_heads, self.head_dim)
        if cache is not None and cache.position is not None:
            return self._static_step(q, k, v, cu_seqlens, cache), cache
        if cache is not None and use_cache and self.backend == "flashgla":
            return self._cached_step(q, k, v, cache), cache
        offset = 0 if cache is None else cache.length
        if cu_seqlens is None:
            positions = torch.arange(offset, offset + seq_len, device=x.device)
        else:
            positions = positions_in_sequence(cu_seqlens, seq_len)
        q, k = self.rotary(q, positions), self.rotary(k, positions)
        if use_cache and cu_seqlens is not None:  # packed prompts: one cache row per sequence, no padding
            cache = KVCache.from_packed(k, v, cu_seqlens)
        elif use_cache:
            if cache is None:
                cache = KVCache.empty(batch, self.num_kv_heads, self.head_dim, seq_len, k.dtype, k.device)
            k, v = cache.append(k, v)
        elif cache is not None:
            k, v = torch.cat([cache.k[:, :cache.length], k], 1), torch.cat([cache.v[:, :cache.length], v], 1)
        if self.backend == "flashgla":
            # Causal masking is aligned to the last key, so queries after a cache see all of it.
            o = flash_attention(q, k, v, causal=True, cu_seqlens=cu_seqlens, deterministic=self.deterministic)
        else:
            if cu_seqlens is not None:
                raise NotImplementedError("attention backend 'sdpa' takes no packed or padded sequences")
            o = self._sdpa(q, k, v)
        return self.o_proj(o.reshape(batch, seq_len, self.hidden_size)), (cache if use_cache else None)

    def _cached_step(self, q: Tensor, k: Tensor, v: Tensor, cache: KVCache) -> Tensor:
        """T new tokens per sequence after a growing cache: sequence b's tokens take positions seqlens[b]..
        (its own length, so left-padded prompts decode in one batch), are appended there by
        flash_attention_with_kvcache and attend causally to the sequence's keys."""
        batch, seq_len = q.shape[:2]
        lengths = cache.lengths()
        cache.reserve(cache.length + seq_len)
        positions = lengths.long().unsqueeze(1) + torch.arange(seq_len, device=q.device)  # [B, T]
        q, k = self.rotary(q, positions), self.rotary(k, positions)
        o = self._attend_cache(q, k, v, cache, lengths, positions, cache.length + seq_len)
        lengths.add_(seq_len)
        cache.length += seq_len
        return self.o_proj(o.reshape(batch, seq_len, self.hidden_size))

    def _attend_cache(self, q: Tensor, k: Tensor, v: Tensor, cache: KVCache, lengths: Tensor, positions: Tensor,
                      max_seqlen_k: Optional[int]) -> Tensor:
        """Appends k, v [B, T, Hkv, D] at rows lengths[b].. of the cache and attends causally (query t of
        sequence b sees rows <= positions[b, t] = lengths[b] + t), all on the device. flash_attention_with_kvcache
        where it runs (the CPU; CUDA with D in {64, 128} and no fp64); elsewhere the same through index writes
        and SDPA with a mask over the capacity."""
        if not q.is_cuda or (self.head_dim in (64, 128) and q.dtype != torch.float64):
            return flash_attention_with_kvcache(q, cache.k, cache.v, lengths, k=k, v=v, causal=True,
                                                max_seqlen_k=max_seqlen_k)
        return self._attend_cache_masked(q, k, v, cache, positions)

    def _attend_cache_masked(self, q: Tensor, k: Tensor, v: Tensor, cache: KVCache, positions: Tensor) -> Tensor:
        rows = torch.arange(q.shape[0], device=q.device).unsqueeze(1)
        cache.k[rows, positions], cache.v[rows, positions] = k, v
        visible = torch.arange(cache.k.shape[1], device=q.device) <= positions.unsqueeze(-1)  # [B, T, capacity]
        o = F.scaled_dot_product_attention(q.transpose(1, 2), cache.k.transpose(1, 2), cache.v.transpose(1, 2),
                                           attn_mask=visible.unsqueeze(1), enable_gqa=self.num_kv_heads != self.num_heads)
        return o.transpose(1, 2)

    def _static_step(self, q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Optional[Tensor], cache: KVCache) -> Tensor:
        """One token per sequence against a static cache, without reading anything back to the host, so the
        step can be captured in a CUDA graph. flashgla backend: sequence b's token goes to row seqlens[b]
        (a device tensor this step advances) and attends to its rows through flash_attention_with_kvcache.
        sdpa: keys and values go to row `position` (advanced by the caller), and the query attends to the
        rows up to it (a mask over the capacity)."""
        batch, seq_len = q.shape[:2]
        if seq_len != 1 or cu_seqlens is not None:
            raise NotImplementedError("attention: a static KV cache takes one token per sequence, unpacked")
        if self.backend == "flashgla":
            lengths = cache.lengths()
            positions = lengths.long().unsqueeze(1)
            q, k = self.rotary(q, positions), self.rotary(k, positions)
            o = self._attend_cache(q, k, v, cache, lengths, positions, None)
            lengths.add_(1)
            return self.o_proj(o.reshape(batch, seq_len, self.hidden_size))
        position = cache.position
        q, k = self.rotary(q, position), self.rotary(k, position)
        cache.k.index_copy_(1, position, k)
        cache.v.index_copy_(1, position, v)
        visible = torch.arange(cache.k.shape[1], device=q.device) <= position  # [capacity]
        o = F.scaled_dot_product_attention(q.transpose(1, 2), cache.k.transpose(1, 2), cache.v.transpose(1, 2),
                                           attn_mask=visible.view(1, 1, 1, -1),
                                           enable_gqa=self.num_kv_heads != self.num_heads)
        return self.o_proj(o.transpose(1, 2).reshape(batch, seq_len, self.hidden_size))

    def _forward_cp(self, x: Tensor, attention_mask, cu_seqlens, cache, use_cache, ctx) -> Tensor:
        from ..distributed import attention_layout, check_cp_context, gather_keys_values

        if x.dim() != 3 or x.shape[-1] != self.hidden_size:
            raise ValueError(f"hidden_states: expected [B, T, {self.hidden_size}], got {list(x.shape)}")
        if attention_mask is not None or cu_seqlens is not None or cache is not None or use_cache:
            raise ValueError("flashgla: cp_context: attention under context parallelism takes the boundaries from "
                             "the context: pass no attention_mask, cu_seqlens or cache, and use_cache=False")
        check_cp_context(ctx, x, "hidden_states")
        batch, seq_len, _ = x.shape
        q = self.q_proj(x).view(batch, seq_len, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(batch, seq_len, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(batch, seq_len, self.num_kv_heads, self.head_dim)
        positions = ctx.position_ids(x.device)  # within each sequence, from the global offsets
        q, k = self.rotary(q, positions), self.rotary(k, positions)
        k, v = gather_keys_values(k, v, ctx)  # rotated by their own ranks
        key_begin, key_end, cu_q, cu_k = attention_layout(ctx, batch, x.device)
        k, v = k[:, key_begin:key_end], v[:, key_begin:key_end]
        if self.backend == "flashgla":
            o = flash_attention(q, k, v, causal=True, cu_seqlens=cu_q, cu_seqlens_k=cu_k,
                                deterministic=self.deterministic)
        elif cu_q is None:
            o = self._sdpa(q, k, v)
        else:
            raise NotImplementedError("attention backend 'sdpa' takes no packed sequences (cp_context with "
                                      "several sequences on a rank)")
        return self.o_proj(o.reshape(batch, seq_len, self.hidden_size))

    def _sdpa(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if q.shape[2] == k.shape[2]:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.num_kv_heads != self.num_heads)
        elif q.shape[2] == 1:  # one new token after a cache: it sees every key
            o = F.scaled_dot_product_attention(q, k, v, enable_gqa=self.num_kv_heads != self.num_heads)
        else:  # several new tokens after a cache: causal, aligned to the last key
            offset = k.shape[2] - q.shape[2]
            mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril(offset)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                               enable_gqa=self.num_kv_heads != self.num_heads)
        return o.transpose(1, 2)
