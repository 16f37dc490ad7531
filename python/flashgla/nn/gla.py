"""The gated linear attention (GLA) layer of Yang et al., "Gated Linear Attention Transformers with
Hardware-Efficient Training" (2024), §4.4, with the options of flash-linear-attention's layer.

Per head h, with x_t the input:
    q_t = x_t W_q,  k_t = x_t W_k,  v_t = x_t W_v             (optionally through a short convolution)
    g_t = max(logsigmoid(x_t W_1 W_2 + b) / normalizer, clamp_min)   (log forget gate, low rank)
    S_t = diag(exp g_t) S_{t-1} + k_t^T v_t,   o_t = q_t S_t / sqrt(d_k)
    y_t = [rmsnorm(o_t^h) * w * swish(x_t W_r^h)]_h W_o               (normalized per head)

The recurrence, the gate and the gated normalization run in flashgla's C++/CUDA kernels; the
projections are ordinary torch layers.
"""

from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from torch import Tensor, nn

from ..ops.gla import chunk_gla, fused_recurrent_gla, gla_decode_step
from ..ops.norm import logsigmoid_gate
from .conv import ShortConvolution
from .norm import GatedRMSNorm, RMSNorm
from .padding import forward_packed

__all__ = ["GatedLinearAttention", "GLAState"]

_MODES = ("chunk", "fused_recurrent")
_GATE_FNS = ("swish", "silu", "sigmoid")


@dataclass
class GLAState:
    """What a GLA layer carries from one call to the next in generation (updated in place by decoding)."""

    recurrent: Tensor                                   # [N, H, K, V] fp32 (fp64 in an fp64 model)
    conv: Optional[Tuple[Tensor, Tensor, Tensor]] = None  # last conv_size-1 inputs of q, k, v: [N, W-1, C]


def _whole(value: float, what: str) -> int:
    if value != int(value):
        raise ValueError(f"{what} = {value} must be a whole number")
    return int(value)


class GatedLinearAttention(nn.Module):
    """Multi-head GLA layer. Input and output [B, T, hidden_size].

    Args:
        hidden_size: model width.
        num_heads: GLA heads; num_kv_heads (default num_heads) must divide it (grouped k, v and gate).
        expand_k, expand_v: key and value widths over hidden_size (0.5 and 1.0 in the paper).
        gate_low_rank_dim: rank of the gate projection W_1 W_2.
        gate_logit_normalizer: the gate is logsigmoid(.) / normalizer (16 in the paper).
        clamp_min: optional lower bound of the log gate (a value ≤ 0).
        use_output_gate, gate_fn: the output gate r = act(x W_r) ("swish" or "sigmoid") of the norm.
        norm_eps: epsilon of the per-head RMSNorm.
        use_short_conv, conv_size: causal depthwise convolution with SiLU on q, k, v.
        mode: "chunk" (chunked, for training and prefill) or "fused_recurrent" (token by token).
    """

    def __init__(self, hidden_size: int = 1024, num_heads: int = 4, num_kv_heads: Optional[int] = None,
                 expand_k: float = 0.5, expand_v: float = 1.0, gate_low_rank_dim: int = 16,
                 gate_logit_normalizer: float = 16.0, clamp_min: Optional[float] = None,
                 use_output_gate: bool = True, gate_fn: str = "swish", norm_eps: float = 1e-5,
                 use_short_conv: bool = False, conv_size: int = 4, mode: str = "chunk",
                 layer_idx: Optional[int] = None):
        super().__init__()
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if hidden_size < 1 or num_heads < 1 or num_kv_heads < 1:
            raise ValueError(f"hidden_size ({hidden_size}), num_heads ({num_heads}) and num_kv_heads "
                             f"({num_kv_heads}) must be at least 1")
        if num_heads % num_kv_heads:
            raise ValueError(f"num_kv_heads ({num_kv_heads}) must divide num_heads ({num_heads})")
        key_dim = _whole(hidden_size * expand_k, f"hidden_size * expand_k ({hidden_size} * {expand_k})")
        value_dim = _whole(hidden_size * expand_v, f"hidden_size * expand_v ({hidden_size} * {expand_v})")
        for name, dim in (("key", key_dim), ("value", value_dim)):
            if dim < num_heads or dim % num_heads:
                raise ValueError(f"the {name} width hidden_size * expand_{name[0]} = {dim} (hidden_size "
                                 f"{hidden_size}) is not divisible into num_heads = {num_heads} heads")
        if mode not in _MODES:
            raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
        if gate_fn not in _GATE_FNS:
            raise ValueError(f"gate_fn must be one of {_GATE_FNS}, got {gate_fn!r}")
        if gate_low_rank_dim < 1:
            raise ValueError(f"gate_low_rank_dim must be at least 1, got {gate_low_rank_dim}")
        if not gate_logit_normalizer > 0:
            raise ValueError(f"gate_logit_normalizer must be > 0, got {gate_logit_normalizer}")
        if clamp_min is not None and clamp_min > 0:
            raise ValueError(f"clamp_min bounds a log gate (≤ 0) from below and must be ≤ 0, got {clamp_min}")
        if not norm_eps > 0:
            raise ValueError(f"norm_eps must be > 0, got {norm_eps}")
        if use_short_conv and conv_size < 1:
            raise ValueError(f"conv_size must be at least 1, got {conv_size}")

        self.hidden_size, self.num_heads, self.num_kv_heads = hidden_size, num_heads, num_kv_heads
        self.num_kv_groups = num_heads // num_kv_heads
        self.key_dim, self.value_dim = key_dim, value_dim
        self.head_k_dim, self.head_v_dim = key_dim // num_heads, value_dim // num_heads
        self.gate_logit_normalizer, self.clamp_min = float(gate_logit_normalizer), clamp_min
        self.use_output_gate, self.use_short_conv, self.mode = use_output_gate, use_short_conv, mode
        self.layer_idx = layer_idx

        kv_key_dim, kv_value_dim = num_kv_heads * self.head_k_dim, num_kv_heads * self.head_v_dim
        self.q_proj = nn.Linear(hidden_size, key_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, kv_key_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, kv_value_dim, bias=False)
        if use_short_conv:
            self.q_conv = ShortConvolution(key_dim, conv_size)
            self.k_conv = ShortConvolution(kv_key_dim, conv_size)
            self.v_conv = ShortConvolution(kv_value_dim, conv_size)
        self.gk_proj = nn.Sequential(nn.Linear(hidden_size, gate_low_rank_dim, bias=False),
                                     nn.Linear(gate_low_rank_dim, kv_key_dim, bias=True))
        if use_output_gate:
            self.g_proj = nn.Linear(hidden_size, value_dim, bias=False)
            self.g_norm = GatedRMSNorm(self.head_v_dim, eps=norm_eps, activation=gate_fn)
        else:
            self.g_norm = RMSNorm(self.head_v_dim, eps=norm_eps)
        self.o_proj = nn.Linear(value_dim, hidden_size, bias=False)

    def forward(self, hidden_states: Tensor, attention_mask: Optional[Tensor] = None,
                cu_seqlens: Optional[Tensor] = None, state: Optional[GLAState] = None,
                use_cache: bool = False, cp_context=None) -> Tuple[Tensor, Optional[GLAState]]:
        """hidden_states [B, T, hidden_size]; attention_mask [B, T] (1: token, 0: padding) or cu_seqlens
        [N+1] with B == 1 (packed sequences); state: the previous call's (one sequence per batch row, or
        per packed sequence). Returns the output [B, T, hidden_size] (zeros at padding) and, with
        use_cache, the state after the last token of each sequence.

        cp_context: a flashgla.distributed.build_cp_context(...) context (context parallelism):
        hidden_states is this rank's slice [1, T/P, hidden] of the packed batch (or [B, T/P, hidden]
        with a context of [0, T]); the boundaries come from the context. No mask, cu_seqlens or state."""
        if cp_context is not None:
            return self._forward_cp(hidden_states, attention_mask, cu_seqlens, state, use_cache, cp_context)
        return forward_packed(self._forward, hidden_states, self.hidden_size, attention_mask, cu_seqlens, state,
                              use_cache)

    def _forward_cp(self, x: Tensor, attention_mask, cu_seqlens, state, use_cache, cp_context):
        from ..distributed import check_cp_context

        if x.dim() != 3 or x.shape[-1] != self.hidden_size:
            raise ValueError(f"hidden_states: expected [B, T, {self.hidden_size}], got {list(x.shape)}")
        if attention_mask is not None or cu_seqlens is not None:
            raise ValueError("flashgla: cp_context: the layer takes the boundaries from the context; pass no "
                             "attention_mask or cu_seqlens (pack padded batches before splitting them)")
        if state is not None or use_cache:
            raise NotImplementedError("flashgla: cp_context: a GLA layer under context parallelism keeps no state "
                                      "(training and prefill only): pass no state and use_cache=False")
        if self.mode != "chunk":
            raise NotImplementedError(f"flashgla: cp_context: context parallelism runs the chunked op; the layer's "
                                      f"mode is {self.mode!r}")
        check_cp_context(cp_context, x, "hidden_states")
        return self._forward(x, None, None, False, cp_context)

    def _short_conv_cp(self, q: Tensor, k: Tensor, v: Tensor, ctx) -> Tuple[Tensor, Tensor, Tensor]:
        """The three convolutions of a rank's slice, with one exchange of the W-1 preceding rows of q, k, v."""
        from ..distributed import conv_with_halo, exchange_halo

        width = self.q_conv.kernel_size
        if q.shape[1] < width - 1:
            raise ValueError(f"flashgla: cp_context: the short convolution (conv_size {width}) needs {width - 1} "
                             f"rows of the previous rank, but each rank holds only {q.shape[1]} tokens "
                             f"({ctx.total_tokens} over {ctx.world_size} ranks)")
        cu_seqlens = ctx.local_cu_seqlens(q.device) if q.shape[0] == 1 else None
        rows = width - 1
        tails = torch.cat([t[:, q.shape[1] - rows:] for t in (q, k, v)], dim=-1)
        halo = exchange_halo(tails, ctx, width)
        hq, hk, hv = halo.split([q.shape[-1], k.shape[-1], v.shape[-1]], dim=-1)
        return (conv_with_halo(self.q_conv, q, hq, cu_seqlens), conv_with_halo(self.k_conv, k, hk, cu_seqlens),
                conv_with_halo(self.v_conv, v, hv, cu_seqlens))

    def _forward(self, x: Tensor, cu_seqlens: Optional[Tensor], state: Optional[GLAState],
                 use_cache: bool, cp_context=None) -> Tuple[Tensor, Optional[GLAState]]:
        batch, seq_len, _ = x.shape
        if state is not None:
            self._check_state(state, cu_seqlens.shape[0] - 1 if cu_seqlens is not None else batch)
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        conv_state = None
        if self.use_short_conv and cp_context is not None:
            q, k, v = self._short_conv_cp(q, k, v, cp_context)
        elif self.use_short_conv:
            caches = state.conv if state is not None and state.conv is not None else (None, None, None)
            q, q_cache = self.q_conv(q, caches[0], cu_seqlens, use_cache)
            k, k_cache = self.k_conv(k, caches[1], cu_seqlens, use_cache)
            v, v_cache = self.v_conv(v, caches[2], cu_seqlens, use_cache)
            conv_state = (q_cache, k_cache, v_cache)
        # 16-bit activations get an fp32 gate: its cumulative sums decide the decay over the whole sequence.
        gate_logits = self.gk_proj(x)
        g = logsigmoid_gate(gate_logits, self.gate_logit_normalizer, self.clamp_min,
                            float32_output=gate_logits.dtype in (torch.bfloat16, torch.float16))

        q = q.view(batch, seq_len, self.num_heads, self.head_k_dim)
        k = k.view(batch, seq_len, self.num_kv_heads, self.head_k_dim)
        v = v.view(batch, seq_len, self.num_kv_heads, self.head_v_dim)
        g = g.view(batch, seq_len, self.num_kv_heads, self.head_k_dim)
        if self.num_kv_groups > 1:  # query head h reads k/v/gate head h // groups
            k, v, g = (t.repeat_interleave(self.num_kv_groups, dim=2) for t in (k, v, g))

        initial = None if state is None else state.recurrent
        if cp_context is not None:  # the boundaries and the entering states come from the context
            o, final = chunk_gla(q, k, v, g, cp_context=cp_context)
        elif (initial is not None and seq_len == 1 and cu_seqlens is None and initial.dtype == torch.float32
              and not self._needs_grad(q, k, v, g, initial)):
            # One token per sequence: the decode kernel updates the (fp32) state in place.
            final = initial if use_cache else initial.clone()
            o = gla_decode_step(q, k, v, g, final)
        else:
            op = chunk_gla if self.mode == "chunk" else fused_recurrent_gla
            o, final = op(q, k, v, g, initial_state=initial, output_final_state=use_cache, cu_seqlens=cu_seqlens)

        if self.use_output_gate:
            o = self.g_norm(o, self.g_proj(x).view(batch, seq_len, self.num_heads, self.head_v_dim))
        else:
            o = self.g_norm(o)
        out = self.o_proj(o.reshape(batch, seq_len, self.value_dim))
        return out, (GLAState(final, conv_state) if use_cache else None)

    def _check_state(self, state, num_seqs: int) -> None:
        """ValueError naming `state` when it is not a GLAState of this layer for num_seqs sequences (e.g. the
        state of a call with another batch size), before any op sees it under its own argument names."""
        if not isinstance(state, GLAState) or not isinstance(state.recurrent, Tensor):
            raise TypeError(f"flashgla: state: expected a GLAState (the state a previous call returned with "
                            f"use_cache=True), got {type(state).__name__}")
        expected = (num_seqs, self.num_heads, self.head_k_dim, self.head_v_dim)
        if tuple(state.recurrent.shape) != expected:
            held = state.recurrent.shape[0] if state.recurrent.dim() == 4 else "?"
            raise ValueError(f"flashgla: state: expected state.recurrent of shape [N, H, K, V] = {list(expected)} "
                             f"for this call's {num_seqs} sequences, got {list(state.recurrent.shape)} (a state "
                             f"of {held} sequences: pass the state of a call with the same batch, or none)")

    @staticmethod
    def _needs_grad(*tensors: Tensor) -> bool:
        return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)

    def extra_repr(self) -> str:
        return (f"hidden_size={self.hidden_size}, num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, "
                f"head_k_dim={self.head_k_dim}, head_v_dim={self.head_v_dim}, mode={self.mode!r}")
