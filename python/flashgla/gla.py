"""Gated linear attention ops (names and semantics of flash-linear-attention).

Each public function calls a torch.library.custom_op of the same name in the
namespace "flashgla" (torch.ops.flashgla.chunk_gla, ...), with a fake (meta)
implementation for torch.compile and an autograd formula that calls the
matching "<name>_backward" op. All checking and computing happens in C++.
"""

from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _C
from ._torch import on_device, require_same_device, require_tensors, run_op, stream_of, view

__all__ = ["chunk_gla", "fused_recurrent_gla", "chunk_simple_gla", "chunk_linear_attn", "gla_decode_step"]


def _state_shape(q, v, cu_seqlens):
    """[N, H, K, V] of the states; (0,) when q or v is malformed (the C++ checks say why)."""
    if q.dim() != 4 or v.dim() != 4:
        return (0,)
    num_seqs = q.shape[0]
    if cu_seqlens is not None and cu_seqlens.dim() == 1:
        num_seqs = max(cu_seqlens.shape[0] - 1, 0)
    return (num_seqs, q.shape[2], q.shape[3], v.shape[3])


def _absent(like):
    """An empty stand-in for an output that was not asked for (ops return tensors only)."""
    return like.new_empty(0, dtype=torch.float32)


def _forward_outputs(q, v, cu_seqlens, output_final_state):
    o = torch.empty(v.shape, dtype=q.dtype, device=q.device)
    if output_final_state:
        final_state = torch.empty(_state_shape(q, v, cu_seqlens), dtype=torch.float32, device=q.device)
    else:
        final_state = _absent(q)
    return o, final_state


def _backward_outputs(q, k, v, g, cu_seqlens, need_dh0):
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=q.dtype, device=q.device)
    dv = torch.empty(v.shape, dtype=q.dtype, device=q.device)
    dg = torch.empty(g.shape, dtype=g.dtype, device=q.device) if g is not None else _absent(q)
    if need_dh0:
        dh0 = torch.empty(_state_shape(q, v, cu_seqlens), dtype=torch.float32, device=q.device)
    else:
        dh0 = _absent(q)
    return dq, dk, dv, dg, dh0


def _run_forward(algorithm, q, k, v, g, initial_state, cu_seqlens, cu_seqlens_host, scale, reverse,
                 output_final_state):
    o, final_state = _forward_outputs(q, v, cu_seqlens, output_final_state)
    args = (
        view(q, "q"), view(k, "k"), view(v, "v"), view(g, "g"), view(initial_state, "initial_state"),
        view(cu_seqlens, "cu_seqlens"), view(cu_seqlens_host, "cu_seqlens_host"), scale, algorithm, reverse,
        view(o, "o"), view(final_state, "final_state") if output_final_state else None,
    )
    run_op(_C.gla_forward, _C.gla_forward_workspace_bytes, q.device, args)
    return o, final_state


def _run_backward(algorithm, q, k, v, g, initial_state, cu_seqlens, cu_seqlens_host, do, dht, scale, reverse,
                  need_dh0):
    dq, dk, dv, dg, dh0 = _backward_outputs(q, k, v, g, cu_seqlens, need_dh0)
    args = (
        view(q, "q"), view(k, "k"), view(v, "v"), view(g, "g"), view(initial_state, "initial_state"),
        view(cu_seqlens, "cu_seqlens"), view(cu_seqlens_host, "cu_seqlens_host"), scale, algorithm, reverse,
        view(do, "d_o"), view(dht, "d_final_state"), view(dq, "dq"), view(dk, "dk"), view(dv, "dv"),
        view(dg, "dg") if g is not None else None, view(dh0, "d_initial_state") if need_dh0 else None,
    )
    run_op(_C.gla_backward, _C.gla_backward_workspace_bytes, q.device, args)
    return dq, dk, dv, dg, dh0


def _define_gla_op(name, algorithm):
    """Registers flashgla::<name> and flashgla::<name>_backward; returns the forward op."""

    def forward(q: Tensor, k: Tensor, v: Tensor, g: Optional[Tensor], initial_state: Optional[Tensor],
                cu_seqlens: Optional[Tensor], cu_seqlens_host: Optional[Tensor], scale: Optional[float],
                reverse: bool, output_final_state: bool) -> Tuple[Tensor, Tensor]:
        return _run_forward(algorithm, q, k, v, g, initial_state, cu_seqlens, cu_seqlens_host, scale, reverse,
                            output_final_state)

    def backward(q: Tensor, k: Tensor, v: Tensor, g: Optional[Tensor], initial_state: Optional[Tensor],
                 cu_seqlens: Optional[Tensor], cu_seqlens_host: Optional[Tensor], do: Tensor, dht: Optional[Tensor],
                 scale: Optional[float], reverse: bool, need_dh0: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        return _run_backward(algorithm, q, k, v, g, initial_state, cu_seqlens, cu_seqlens_host, do, dht, scale,
                             reverse, need_dh0)

    forward_op = torch.library.custom_op(f"flashgla::{name}", forward, mutates_args=())
    backward_op = torch.library.custom_op(f"flashgla::{name}_backward", backward, mutates_args=())

    @forward_op.register_fake
    def _(q, k, v, g, initial_state, cu_seqlens, cu_seqlens_host, scale, reverse, output_final_state):
        require_same_device(q, k=k, v=v, g=g, initial_state=initial_state, cu_seqlens=cu_seqlens)
        return _forward_outputs(q, v, cu_seqlens, output_final_state)

    @backward_op.register_fake
    def _(q, k, v, g, initial_state, cu_seqlens, cu_seqlens_host, do, dht, scale, reverse, need_dh0):
        require_same_device(q, k=k, v=v, g=g, initial_state=initial_state, cu_seqlens=cu_seqlens, d_o=do,
                            d_final_state=dht)
        return _backward_outputs(q, k, v, g, cu_seqlens, need_dh0)

    def setup_context(ctx, inputs, output):
        q, k, v, g, initial_state, cu_seqlens, cu_seqlens_host, scale, reverse, output_final_state = inputs
        ctx.save_for_backward(q, k, v, g, initial_state, cu_seqlens, cu_seqlens_host)
        ctx.scale, ctx.reverse, ctx.output_final_state = scale, reverse, output_final_state

    def gradients(ctx, do, dht):
        q, k, v, g, initial_state, cu_seqlens, cu_seqlens_host = ctx.saved_tensors
        need_dg = g is not None and ctx.needs_input_grad[3]
        need_dh0 = initial_state is not None and ctx.needs_input_grad[4]
        dq, dk, dv, dg, dh0 = backward_op(q, k, v, g, initial_state, cu_seqlens, cu_seqlens_host, do,
                                          dht if ctx.output_final_state else None, ctx.scale, ctx.reverse,
                                          need_dh0)
        return dq, dk, dv, dg if need_dg else None, dh0 if need_dh0 else None, None, None, None, None, None

    forward_op.register_autograd(gradients, setup_context=setup_context)
    return forward_op


_chunk_gla = _define_gla_op("chunk_gla", _C.GlaAlgorithm.chunked)
_chunk_simple_gla = _define_gla_op("chunk_simple_gla", _C.GlaAlgorithm.chunked)
_chunk_linear_attn = _define_gla_op("chunk_linear_attn", _C.GlaAlgorithm.chunked)
_fused_recurrent_gla = _define_gla_op("fused_recurrent_gla", _C.GlaAlgorithm.recurrent)


def _as_scale(scale):
    return None if scale is None else float(scale)


def _gate_dims(g, expected, name, op, hint):
    if g is not None and isinstance(g, Tensor) and g.dim() != expected:
        raise ValueError(f"flashgla: {name}: {op} expects {hint}, got shape {list(g.shape)}")


def _check_gate(g, check_gate):
    """check_gate=True: every gate value in [-inf, 0] (the contract), else ValueError. Reads g (a device
    synchronisation on CUDA), hence opt-in."""
    if check_gate and isinstance(g, Tensor) and not bool((g <= 0).all()):
        raise ValueError("flashgla: g: a log gate in [-inf, 0] (check_gate=True found a value above 0 or a NaN)")


def chunk_gla(q: Tensor, k: Tensor, v: Tensor, g: Tensor, scale: Optional[float] = None,
              initial_state: Optional[Tensor] = None, output_final_state: bool = False,
              cu_seqlens: Optional[Tensor] = None, *,
              cu_seqlens_host: Optional[Tensor] = None, check_gate: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
    """Chunked GLA with a per-key gate.

    q, k [B,T,H,K], v [B,T,H,V] (fp32/bf16/fp16/fp64), g [B,T,H,K] log-space gate (any float dtype) in
    [-inf, 0] (-inf: a full reset), scale (default K^-1/2), initial_state [N,H,K,V] fp32, cu_seqlens [N+1]
    int32/int64 with B == 1.
    cu_seqlens_host: optional CPU copy of a CUDA cu_seqlens, to have its values checked without a sync.
    check_gate: raise ValueError when a gate is above 0 or NaN (reads g: a synchronisation on CUDA).
    Returns o [B,T,H,V] (dtype of q) and the final state [N,H,K,V] fp32 (None unless output_final_state).
    """
    require_tensors(q=q, k=k, v=v, g=g, initial_state=initial_state, cu_seqlens=cu_seqlens,
                    cu_seqlens_host=cu_seqlens_host)
    if g is None:
        raise ValueError("flashgla: g: chunk_gla needs a gate; use chunk_linear_attn for none")
    _gate_dims(g, 4, "g", "chunk_gla", "a per-key gate [B, T, H, K] (chunk_simple_gla takes [B, T, H])")
    _check_gate(g, check_gate)
    o, final_state = _chunk_gla(q, k, v, g, initial_state, cu_seqlens, cu_seqlens_host, _as_scale(scale), False,
                                output_final_state)
    return o, final_state if output_final_state else None


def chunk_simple_gla(q: Tensor, k: Tensor, v: Tensor, g: Optional[Tensor] = None, scale: Optional[float] = None,
                     initial_state: Optional[Tensor] = None, output_final_state: bool = False,
                     cu_seqlens: Optional[Tensor] = None, *,
                     cu_seqlens_host: Optional[Tensor] = None,
                     check_gate: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
    """Chunked GLA with a scalar gate per head and step, g [B,T,H] (None: no gate). Else as chunk_gla."""
    require_tensors(q=q, k=k, v=v, g=g, initial_state=initial_state, cu_seqlens=cu_seqlens,
                    cu_seqlens_host=cu_seqlens_host)
    _gate_dims(g, 3, "g", "chunk_simple_gla", "a scalar gate [B, T, H] (chunk_gla takes [B, T, H, K])")
    _check_gate(g, check_gate)
    o, final_state = _chunk_simple_gla(q, k, v, g, initial_state, cu_seqlens, cu_seqlens_host, _as_scale(scale),
                                       False, output_final_state)
    return o, final_state if output_final_state else None


def chunk_linear_attn(q: Tensor, k: Tensor, v: Tensor, scale: Optional[float] = None,
                      initial_state: Optional[Tensor] = None, output_final_state: bool = False,
                      cu_seqlens: Optional[Tensor] = None, *,
                      cu_seqlens_host: Optional[Tensor] = None) -> Tuple[Tensor, Optional[Tensor]]:
    """Chunked linear attention (no gate). Else as chunk_gla."""
    require_tensors(q=q, k=k, v=v, initial_state=initial_state, cu_seqlens=cu_seqlens,
                    cu_seqlens_host=cu_seqlens_host)
    o, final_state = _chunk_linear_attn(q, k, v, None, initial_state, cu_seqlens, cu_seqlens_host,
                                        _as_scale(scale), False, output_final_state)
    return o, final_state if output_final_state else None


def fused_recurrent_gla(q: Tensor, k: Tensor, v: Tensor, gk: Optional[Tensor] = None, scale: Optional[float] = None,
                        initial_state: Optional[Tensor] = None, output_final_state: bool = False,
                        reverse: bool = False, cu_seqlens: Optional[Tensor] = None, *,
                        cu_seqlens_host: Optional[Tensor] = None) -> Tuple[Tensor, Optional[Tensor]]:
    """Token-by-token GLA; gk [B,T,H,K] (or a scalar gate [B,T,H], or None). reverse runs each
    sequence from its last token to its first. On the CPU this is the fp64-accumulating reference."""
    require_tensors(q=q, k=k, v=v, gk=gk, initial_state=initial_state, cu_seqlens=cu_seqlens,
                    cu_seqlens_host=cu_seqlens_host)
    o, final_state = _fused_recurrent_gla(q, k, v, gk, initial_state, cu_seqlens, cu_seqlens_host,
                                          _as_scale(scale), bool(reverse), output_final_state)
    return o, final_state if output_final_state else None


@torch.library.custom_op("flashgla::gla_decode_step", mutates_args=("state",))
def _gla_decode_step(q: Tensor, k: Tensor, v: Tensor, g: Optional[Tensor], state: Tensor,
                     scale: Optional[float]) -> Tensor:
    o = torch.empty(v.shape, dtype=q.dtype, device=q.device)
    device = q.device
    with on_device(device):
        _C.gla_decode(view(q, "q"), view(k, "k"), view(v, "v"), view(g, "g"), view(state, "state"), scale,
                      view(o, "o"), stream_of(device))
    return o


@_gla_decode_step.register_fake
def _(q, k, v, g, state, scale):
    require_same_device(q, k=k, v=v, g=g, state=state)
    return torch.empty(v.shape, dtype=q.dtype, device=q.device)


def _drop_token_dim(t, name):
    """[N, 1, ...] -> [N, ...] (a view)."""
    if t.dim() < 2 or t.shape[1] != 1:
        raise ValueError(f"flashgla: {name}: expected one token per sequence [N, 1, ...], got shape {list(t.shape)}")
    return t.squeeze(1)


def gla_decode_step(q: Tensor, k: Tensor, v: Tensor, g: Optional[Tensor], state: Tensor,
                    scale: Optional[float] = None) -> Tensor:
    """One token per sequence: state = diag(exp g) state + k^T v, o = scale q state.

    q, k [N,H,K], v [N,H,V], g [N,H,K] or [N,H] (or None); or the same with a token dimension of 1:
    [N,1,H,K] (then g is [N,1,H,K] or [N,1,H]). state [N,H,K,V] fp32 is updated in place.
    Returns o [N,H,V] (or [N,1,H,V]) in the dtype of q. No gradient.
    """
    require_tensors(q=q, k=k, v=v, g=g, state=state)
    with_token_dim = q.dim() == 4
    if with_token_dim:
        q, k, v = _drop_token_dim(q, "q"), _drop_token_dim(k, "k"), _drop_token_dim(v, "v")
        if g is not None:
            g = _drop_token_dim(g, "g")
    o = _gla_decode_step(q, k, v, g, state, _as_scale(scale))
    return o.unsqueeze(1) if with_token_dim else o
