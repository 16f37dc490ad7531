"""Gated linear attention ops (names and semantics of flash-linear-attention).

Each public function calls a torch.library.custom_op of the same name in the
namespace "flashgla" (torch.ops.flashgla.chunk_gla, ...), with a fake (meta)
implementation for torch.compile and an autograd formula that calls the
matching "<name>_backward" op. All checking and computing happens in C++.
"""

import warnings
from typing import Optional, Tuple

import torch
from torch import Tensor

from .. import _C
from .._torch import (as_scale, forbid_double_backward, make_args, on_device, require_same_device, require_tensors,
                      run_op, view)
from ._memory import require_outputs

__all__ = ["chunk_gla", "fused_recurrent_gla", "chunk_simple_gla", "fused_recurrent_simple_gla", "chunk_linear_attn",
           "fused_chunk_linear_attn", "fused_recurrent_linear_attn", "gla_decode_step", "chunk_gla_segment_states",
           "chunk_gla_segment_state_grads", "gla_prefill"]


def _state_shape(q, v, cu_seqlens, state_v_first=False):
    """[N, H, K, V] of the states ([N, H, V, K] with state_v_first); (0,) when q or v is malformed (the C++
    checks say why)."""
    if q.dim() != 4 or v.dim() != 4:
        return (0,)
    num_seqs = q.shape[0]
    if cu_seqlens is not None and cu_seqlens.dim() == 1:
        num_seqs = max(cu_seqlens.shape[0] - 1, 0)
    if state_v_first:
        return (num_seqs, q.shape[2], v.shape[3], q.shape[3])
    return (num_seqs, q.shape[2], q.shape[3], v.shape[3])


def _absent(like):
    """An empty stand-in for an output that was not asked for (ops return tensors only)."""
    return like.new_empty(0, dtype=torch.float32)


def _state_dtype(q):
    """The dtype of final states and of the initial state's gradient: fp32, fp64 for fp64 inputs (an fp64
    computation keeps fp64 accuracy through its states; the C++ API takes f64 states with f64 inputs)."""
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def _forward_outputs(q, v, cu_seqlens, output_final_state, state_dtype=None, state_v_first=False):
    o = torch.empty(v.shape, dtype=q.dtype, device=q.device)
    if output_final_state:
        final_state = torch.empty(_state_shape(q, v, cu_seqlens, state_v_first),
                                  dtype=state_dtype or _state_dtype(q), device=q.device)
    else:
        final_state = _absent(q)
    return o, final_state


def _intra_output(algorithm, q, k, v, g, reverse, g_gamma, save_intra):
    """The forward's intra-chunk scores for the backward (GlaForwardArgs::intra): [B, T, H, 64] where a backward
    will follow (save_intra) and the inputs' dtypes, shapes and device allow them, else an empty stand-in. From
    metadata only, so that the fake op (torch.compile) and the real one agree; gla_forward_saves_intra then says
    whether the forward writes them, and the backward asks the same question before it reads them."""
    if (save_intra and algorithm == _C.GlaAlgorithm.chunked and not reverse and q.is_cuda and g is not None
            and g.dim() == 4 and g_gamma is None and q.dtype in (torch.bfloat16, torch.float16)
            and q.shape[-1] <= 256):
        return torch.empty((*q.shape[:3], _C.GLA_INTRA_COLUMNS), dtype=q.dtype, device=q.device)
    return _absent(q)


def _backward_outputs(q, k, v, g, cu_seqlens, need_dh0, state_dtype=None, g_gamma=None,
                      state_v_first=False):
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=q.dtype, device=q.device)
    dv = torch.empty(v.shape, dtype=q.dtype, device=q.device)
    dg = torch.empty(g.shape, dtype=g.dtype, device=q.device) if g is not None else _absent(q)
    if need_dh0:
        dh0 = torch.empty(_state_shape(q, v, cu_seqlens, state_v_first), dtype=state_dtype or _state_dtype(q),
                          device=q.device)
    else:
        dh0 = _absent(q)
    d_g_gamma = torch.empty(g_gamma.shape, dtype=torch.float32, device=q.device) if g_gamma is not None else _absent(q)
    return dq, dk, dv, dg, dh0, d_g_gamma


_CPU_PATH = {_C.GlaAlgorithm.chunked: "chunked", _C.GlaAlgorithm.recurrent: "recurrent"}


def _require_forward_memory(op, algorithm, q, v, cu_seqlens, output_final_state, state_dtype, state_v_first):
    if not (isinstance(q, Tensor) and isinstance(v, Tensor)):
        return  # the C++ checks say what is wrong
    outputs = [("o", v.shape, q.dtype)]
    if output_final_state:
        outputs.append(("final_state", _state_shape(q, v, cu_seqlens, state_v_first), state_dtype or _state_dtype(q)))
    require_outputs(op, q.device, outputs, cpu_path=_CPU_PATH.get(algorithm, "chunked") + "_forward", q=q, v=v)


def _require_backward_memory(op, algorithm, q, k, v, g, cu_seqlens, need_dh0, state_dtype, state_v_first):
    if not all(isinstance(t, Tensor) for t in (q, k, v)):
        return
    outputs = [("dq", q.shape, q.dtype), ("dk", k.shape, q.dtype), ("dv", v.shape, q.dtype)]
    if isinstance(g, Tensor):
        outputs.append(("dg", g.shape, g.dtype))
    if need_dh0:
        outputs.append(("dh0", _state_shape(q, v, cu_seqlens, state_v_first), state_dtype or _state_dtype(q)))
    require_outputs(op, q.device, outputs, cpu_path=_CPU_PATH.get(algorithm, "chunked") + "_backward", q=q, v=v)


def _run_forward(algorithm, q, k, v, g, initial_state, cu_seqlens, cu_seqlens_host, scale, reverse,
                 output_final_state, state_dtype=None, *, g_gamma=None, state_v_first=False, op="gla_forward",
                 intra=None):
    """state_dtype: of the final state (default _state_dtype(q)). op: the op's name in errors. intra: an
    _intra_output tensor, written where gla_forward_saves_intra says so."""
    _require_forward_memory(op, algorithm, q, v, cu_seqlens, output_final_state, state_dtype, state_v_first)
    o, final_state = _forward_outputs(q, v, cu_seqlens, output_final_state, state_dtype, state_v_first)
    args = make_args(_C.GlaForwardArgs, q=q, k=k, v=v, g=g, initial_state=initial_state, cu_seqlens=cu_seqlens,
                     cu_seqlens_host=cu_seqlens_host, scale=scale, algorithm=algorithm, reverse=reverse, o=o,
                     final_state=final_state if output_final_state else None, g_gamma=g_gamma,
                     state_v_first=bool(state_v_first))
    if intra is not None and intra.numel() > 0 and _C.gla_forward_saves_intra(args):
        args.intra = view(intra, "intra")
    run_op(_C.gla_forward, args, q.device)
    return o, final_state


def _run_backward_all(algorithm, q, k, v, g, initial_state, cu_seqlens, cu_seqlens_host, do, dht, scale, reverse,
                      need_dh0, state_dtype=None, g_gamma=None, state_v_first=False, op="gla_backward", intra=None):
    """dq, dk, dv, dg, dh0 and d_g_gamma (empty stand-ins for what was not asked for). intra: the forward's
    (_run_forward), read where it was written."""
    _require_backward_memory(op, algorithm, q, k, v, g, cu_seqlens, need_dh0, state_dtype, state_v_first)
    dq, dk, dv, dg, dh0, d_g_gamma = _backward_outputs(q, k, v, g, cu_seqlens, need_dh0, state_dtype, g_gamma,
                                                       state_v_first)
    args = make_args(_C.GlaBackwardArgs, q=q, k=k, v=v, g=g, initial_state=initial_state, cu_seqlens=cu_seqlens,
                     cu_seqlens_host=cu_seqlens_host, scale=scale, algorithm=algorithm, reverse=reverse, d_o=do,
                     d_final_state=dht, dq=dq, dk=dk, dv=dv, dg=dg if g is not None else None,
                     d_initial_state=dh0 if need_dh0 else None, g_gamma=g_gamma,
                     d_g_gamma=d_g_gamma if g_gamma is not None else None, state_v_first=bool(state_v_first),
                     intra=intra if intra is not None and intra.numel() > 0 else None)
    run_op(_C.gla_backward, args, q.device)
    return dq, dk, dv, dg, dh0, d_g_gamma


def _in_phases(args, phases_apply, workspace_bytes, run, summary, device, field, results):
    """The summary call of args (flashgla/gla.h, GlaPhase) into `summary`, with a workspace the output call
    shares: returns (summary, output), output(value) setting args.<field> to value (None: left unset, as in the
    summary call), running the output call and returning `results`; None (nothing run) where the phases do
    not apply."""
    with on_device(device):
        if not phases_apply(args):
            return None
        args.phase = _C.GlaPhase.summary
        num_bytes = workspace_bytes(args)
    buffer = torch.empty(num_bytes, dtype=torch.uint8, device=device)
    args.workspace, args.workspace_bytes = buffer.data_ptr(), num_bytes
    args.summary = view(summary, "summary")
    run_op(run, args, device)

    def output(value, _workspace=buffer):  # (_workspace: the buffer the two calls share, alive until here)
        args.phase = _C.GlaPhase.output
        if value is not None:
            setattr(args, field, view(value, field))
        run_op(run, args, device)
        return results

    return summary, output


def _forward_in_phases(q, k, v, g, cu_seqlens, cu_seqlens_host, scale, output_final_state, state_dtype, *,
                       g_gamma=None, state_v_first=False, op="gla_forward"):
    """The chunked forward in two calls (context parallelism): (summary, output) with summary [N, H, K, V+1]
    f32 (each sequence's end state from zero, its summed log gate in column V) and output(initial_state) -> (o,
    final_state); None where the phases do not apply (the caller then runs a pass of its own and the op)."""
    if q.device.type != "cuda":
        return None
    _require_forward_memory(op, _C.GlaAlgorithm.chunked, q, v, cu_seqlens, output_final_state, state_dtype,
                            state_v_first)
    o, final_state = _forward_outputs(q, v, cu_seqlens, output_final_state, state_dtype, state_v_first)
    args = make_args(_C.GlaForwardArgs, q=q, k=k, v=v, g=g, cu_seqlens=cu_seqlens, cu_seqlens_host=cu_seqlens_host,
                     scale=scale, algorithm=_C.GlaAlgorithm.chunked, o=o,
                     final_state=final_state if output_final_state else None, g_gamma=g_gamma,
                     state_v_first=bool(state_v_first))
    N, H, K, V = _state_shape(q, v, cu_seqlens)
    summary = torch.empty(N, H, K, V + 1, dtype=torch.float32, device=q.device)
    return _in_phases(args, _C.gla_forward_phases_apply, _C.gla_forward_workspace_bytes, _C.gla_forward, summary,
                      q.device, "initial_state", (o, final_state))


def _backward_in_phases(q, k, v, g, initial_state, cu_seqlens, cu_seqlens_host, do, scale, state_dtype, *,
                        g_gamma=None, state_v_first=False, op="gla_backward"):
    """The chunked backward in two calls (context parallelism): (summary, output) with summary [N, H, K, V]
    f32 (each sequence's entering-state gradient for a zero gradient at its end) and output(d_final_state) ->
    (dq, dk, dv, dg, d_g_gamma); None where the phases do not apply."""
    if q.device.type != "cuda":
        return None
    _require_backward_memory(op, _C.GlaAlgorithm.chunked, q, k, v, g, cu_seqlens, False, state_dtype, state_v_first)
    dq, dk, dv, dg, _, d_g_gamma = _backward_outputs(q, k, v, g, cu_seqlens, False, state_dtype, g_gamma,
                                                     state_v_first)
    args = make_args(_C.GlaBackwardArgs, q=q, k=k, v=v, g=g, initial_state=initial_state, cu_seqlens=cu_seqlens,
                     cu_seqlens_host=cu_seqlens_host, scale=scale, algorithm=_C.GlaAlgorithm.chunked, d_o=do,
                     dq=dq, dk=dk, dv=dv, dg=dg if g is not None else None, g_gamma=g_gamma,
                     d_g_gamma=d_g_gamma if g_gamma is not None else None, state_v_first=bool(state_v_first))
    summary = torch.empty(_state_shape(q, v, cu_seqlens), dtype=torch.float32, device=q.device)
    return _in_phases(args, _C.gla_backward_phases_apply, _C.gla_backward_workspace_bytes, _C.gla_backward, summary,
                      q.device, "d_final_state", (dq, dk, dv, dg, d_g_gamma))


def _run_backward(algorithm, q, k, v, g, initial_state, cu_seqlens, cu_seqlens_host, do, dht, scale, reverse,
                  need_dh0, state_dtype=None):
    return _run_backward_all(algorithm, q, k, v, g, initial_state, cu_seqlens, cu_seqlens_host, do, dht, scale,
                             reverse, need_dh0, state_dtype)[:5]


def _define_gla_op(name, algorithm):
    """Registers flashgla::<name> and flashgla::<name>_backward; returns the forward op."""

    def forward(q: Tensor, k: Tensor, v: Tensor, g: Optional[Tensor], initial_state: Optional[Tensor],
                cu_seqlens: Optional[Tensor], cu_seqlens_host: Optional[Tensor], scale: Optional[float],
                reverse: bool, output_final_state: bool, g_gamma: Optional[Tensor] = None,
                state_v_first: bool = False, save_intra: bool = False) -> Tuple[Tensor, Tensor, Tensor]:
        """o, final_state and the intra-chunk scores for the backward (_intra_output)."""
        intra = _intra_output(algorithm, q, k, v, g, reverse, g_gamma, save_intra)
        o, final_state = _run_forward(algorithm, q, k, v, g, initial_state, cu_seqlens, cu_seqlens_host, scale,
                                      reverse, output_final_state, g_gamma=g_gamma, state_v_first=state_v_first,
                                      op=name, intra=intra)
        return o, final_state, intra

    def backward(q: Tensor, k: Tensor, v: Tensor, g: Optional[Tensor], initial_state: Optional[Tensor],
                 cu_seqlens: Optional[Tensor], cu_seqlens_host: Optional[Tensor], do: Tensor, dht: Optional[Tensor],
                 scale: Optional[float], reverse: bool, need_dh0: bool, g_gamma: Optional[Tensor] = None,
                 state_v_first: bool = False,
                 intra: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
        return _run_backward_all(algorithm, q, k, v, g, initial_state, cu_seqlens, cu_seqlens_host, do, dht, scale,
                                 reverse, need_dh0, g_gamma=g_gamma, state_v_first=state_v_first,
                                 op=f"{name} (backward)", intra=intra)

    forward_op = torch.library.custom_op(f"flashgla::{name}", forward, mutates_args=())
    backward_op = torch.library.custom_op(f"flashgla::{name}_backward", backward, mutates_args=())

    @forward_op.register_fake
    def _(q, k, v, g, initial_state, cu_seqlens, cu_seqlens_host, scale, reverse, output_final_state, g_gamma=None,
          state_v_first=False, save_intra=False):
        require_same_device(q, k=k, v=v, g=g, initial_state=initial_state, cu_seqlens=cu_seqlens, g_gamma=g_gamma)
        return (*_forward_outputs(q, v, cu_seqlens, output_final_state, state_v_first=state_v_first),
                _intra_output(algorithm, q, k, v, g, reverse, g_gamma, save_intra))

    @backward_op.register_fake
    def _(q, k, v, g, initial_state, cu_seqlens, cu_seqlens_host, do, dht, scale, reverse, need_dh0, g_gamma=None,
          state_v_first=False, intra=None):
        require_same_device(q, k=k, v=v, g=g, initial_state=initial_state, cu_seqlens=cu_seqlens, d_o=do,
                            d_final_state=dht, g_gamma=g_gamma)
        return _backward_outputs(q, k, v, g, cu_seqlens, need_dh0, g_gamma=g_gamma, state_v_first=state_v_first)

    def setup_context(ctx, inputs, output):
        (q, k, v, g, initial_state, cu_seqlens, cu_seqlens_host, scale, reverse, output_final_state, g_gamma,
         state_v_first, _save_intra) = inputs
        ctx.save_for_backward(q, k, v, g, initial_state, cu_seqlens, cu_seqlens_host, g_gamma, output[2])
        ctx.scale, ctx.reverse, ctx.output_final_state = scale, reverse, output_final_state
        ctx.state_v_first = state_v_first

    def gradients(ctx, do, dht, _d_intra):
        q, k, v, g, initial_state, cu_seqlens, cu_seqlens_host, g_gamma, intra = ctx.saved_tensors
        need_dg = g is not None and ctx.needs_input_grad[3]
        need_dh0 = initial_state is not None and ctx.needs_input_grad[4]
        need_dgamma = g_gamma is not None and ctx.needs_input_grad[10]
        dq, dk, dv, dg, dh0, d_g_gamma = backward_op(q, k, v, g, initial_state, cu_seqlens, cu_seqlens_host, do,
                                                     dht if ctx.output_final_state else None, ctx.scale, ctx.reverse,
                                                     need_dh0, g_gamma, ctx.state_v_first, intra)
        # dh0 is fp32 (fp64 for fp64 inputs); an fp32 initial_state of fp64 inputs gets its gradient in fp32.
        dh0 = dh0.to(initial_state.dtype) if need_dh0 else None
        return (dq, dk, dv, dg if need_dg else None, dh0, None, None, None, None, None,
                d_g_gamma if need_dgamma else None, None, None)

    forward_op.register_autograd(gradients, setup_context=setup_context)
    forbid_double_backward(backward_op, name)
    return forward_op


_chunk_gla = _define_gla_op("chunk_gla", _C.GlaAlgorithm.chunked)
_chunk_simple_gla = _define_gla_op("chunk_simple_gla", _C.GlaAlgorithm.chunked)
_chunk_linear_attn = _define_gla_op("chunk_linear_attn", _C.GlaAlgorithm.chunked)
_fused_recurrent_gla = _define_gla_op("fused_recurrent_gla", _C.GlaAlgorithm.recurrent)


# ---- the normaliser of linear attention (normalize=True) ---------------------------------------------


def _z_shape(q, cu_seqlens):
    """FLA's z_state [N, 1, H, K]; (0,) when q is malformed (the C++ checks say why)."""
    if q.dim() != 4:
        return (0,)
    num_seqs = q.shape[0]
    if cu_seqlens is not None and cu_seqlens.dim() == 1:
        num_seqs = max(cu_seqlens.shape[0] - 1, 0)
    return (num_seqs, 1, q.shape[2], q.shape[3])


def _z_view(z, name):
    """[N, 1, H, K] -> the C++ API's [N, H, K]."""
    if z is None:
        return None
    if z.dim() != 4 or z.shape[1] != 1:
        raise ValueError(f"flashgla: {name}: expected z_state [N, 1, H, K] (FLA's layout), got shape {list(z.shape)}")
    return view(z[:, 0], name)


def _normalize_outputs(o_raw, q, cu_seqlens):
    o = torch.empty(o_raw.shape, dtype=q.dtype, device=q.device)
    z = torch.empty(_z_shape(q, cu_seqlens), dtype=_summary_dtype(q), device=q.device)
    return o, z


@torch.library.custom_op("flashgla::linear_attn_normalize", mutates_args=())
def _linear_attn_normalize(o_raw: Tensor, q: Tensor, k: Tensor, z_init: Optional[Tensor], cu_seqlens: Optional[Tensor],
                           cu_seqlens_host: Optional[Tensor], scale: Optional[float],
                           reverse: bool) -> Tuple[Tensor, Tensor]:
    require_outputs("chunk_linear_attn (normalize)", q.device,
                    [("o", o_raw.shape, q.dtype), ("z_state", _z_shape(q, cu_seqlens), _summary_dtype(q))])
    o, z = _normalize_outputs(o_raw, q, cu_seqlens)
    args = make_args(_C.GlaNormalizeArgs, o_raw=o_raw, q=q, k=k, z_init=_z_view(z_init, "z_init"),
                     cu_seqlens=cu_seqlens, cu_seqlens_host=cu_seqlens_host, scale=scale, reverse=reverse, o=o,
                     z_final=_z_view(z, "z_final"))
    run_op(_C.gla_normalize_forward, args, q.device)
    return o, z


@_linear_attn_normalize.register_fake
def _(o_raw, q, k, z_init, cu_seqlens, cu_seqlens_host, scale, reverse):
    require_same_device(q, o_raw=o_raw, k=k, z_init=z_init, cu_seqlens=cu_seqlens)
    return _normalize_outputs(o_raw, q, cu_seqlens)


def _z_grad_output(q, z_init):
    return torch.empty(z_init.shape, dtype=_summary_dtype(q), device=q.device) if z_init is not None else _absent(q)


def _normalize_backward_outputs(o_raw, q, z_init):
    d_o_raw = torch.empty(o_raw.shape, dtype=q.dtype, device=q.device)
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    return d_o_raw, dq, dk, _z_grad_output(q, z_init)


@torch.library.custom_op("flashgla::linear_attn_normalize_backward", mutates_args=())
def _linear_attn_normalize_backward(o_raw: Tensor, q: Tensor, k: Tensor, z_init: Optional[Tensor],
                                    cu_seqlens: Optional[Tensor], cu_seqlens_host: Optional[Tensor], do: Tensor,
                                    dz: Optional[Tensor], scale: Optional[float], reverse: bool,
                                    o_raw_is_output: bool = False) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """o_raw_is_output: o_raw holds the normalised output (the folded forward's), o_raw = o · den."""
    require_outputs("chunk_linear_attn (normalize, backward)", q.device,
                    [("d_o_raw", o_raw.shape, q.dtype), ("dq", q.shape, q.dtype), ("dk", q.shape, q.dtype)])
    d_o_raw, dq, dk, dz_init = _normalize_backward_outputs(o_raw, q, z_init)
    args = make_args(_C.GlaNormalizeBackwardArgs, o_raw=o_raw, q=q, k=k, z_init=_z_view(z_init, "z_init"),
                     cu_seqlens=cu_seqlens, cu_seqlens_host=cu_seqlens_host, scale=scale, reverse=reverse, d_o=do,
                     d_z_final=_z_view(dz, "d_z_final"), d_o_raw=d_o_raw, dq=dq, dk=dk,
                     d_z_init=_z_view(dz_init, "d_z_init") if z_init is not None else None,
                     o_raw_is_output=o_raw_is_output)
    run_op(_C.gla_normalize_backward, args, q.device)
    return d_o_raw, dq, dk, dz_init


@_linear_attn_normalize_backward.register_fake
def _(o_raw, q, k, z_init, cu_seqlens, cu_seqlens_host, do, dz, scale, reverse, o_raw_is_output=False):
    require_same_device(q, o_raw=o_raw, k=k, z_init=z_init, cu_seqlens=cu_seqlens, d_o=do)
    return _normalize_backward_outputs(o_raw, q, z_init)


def _normalize_setup(ctx, inputs, output):
    o_raw, q, k, z_init, cu_seqlens, cu_seqlens_host, scale, reverse = inputs
    ctx.save_for_backward(o_raw, q, k, z_init, cu_seqlens, cu_seqlens_host)
    ctx.scale, ctx.reverse = scale, reverse


def _normalize_gradients(ctx, do, dz):
    o_raw, q, k, z_init, cu_seqlens, cu_seqlens_host = ctx.saved_tensors
    d_o_raw, dq, dk, dz_init = _linear_attn_normalize_backward(o_raw, q, k, z_init, cu_seqlens, cu_seqlens_host, do,
                                                               dz, ctx.scale, ctx.reverse)
    need_dz = z_init is not None and ctx.needs_input_grad[3]
    return d_o_raw, dq, dk, dz_init.to(z_init.dtype) if need_dz else None, None, None, None, None


_linear_attn_normalize.register_autograd(_normalize_gradients, setup_context=_normalize_setup)
forbid_double_backward(_linear_attn_normalize_backward, "chunk_linear_attn")


# The chunked op and the normaliser in one forward call (GlaForwardArgs.normalize: on CUDA the fast kernel
# divides as it stores o, so no o_raw is written or read back). The backward folds the normaliser into the op's
# (GlaBackwardArgs.norm_o) where the forward kept its residuals (gla_normalize_residual_slots > 0: CUDA, bf16, K
# and V of 64 or 128); elsewhere it is the normaliser's own (from o) and then the op's.
def _residual_shapes(q, v, cu_seqlens, keep_residuals):
    """The residuals' shapes, den [B,T,H] and z at each chunk's start [S,H,K], where a backward will follow
    (keep_residuals) and may fold the normaliser in (whether it does is gla_normalize_residual_slots's answer);
    else empty. Shapes only, so that the fake implementation agrees."""
    if (not keep_residuals or q.device.type != "cuda" or q.dtype != torch.bfloat16 or q.dim() != 4 or v.dim() != 4
            or q.shape[3] not in (64, 128) or v.shape[3] not in (64, 128)):
        return (0,), (0,)
    B, T, H, K = q.shape
    if cu_seqlens is not None:
        N = cu_seqlens.shape[0] - 1 if cu_seqlens.dim() == 1 else 0
        slots = T // 64 + N if N > 0 and T > 0 else 0
    else:
        slots = B * ((T + 63) // 64)
    return (B, T, H), (slots, H, K)


def _normalized_outputs(q, v, cu_seqlens, output_final_state, keep_residuals):
    o, final_state = _forward_outputs(q, v, cu_seqlens, output_final_state)
    den_shape, z_shape = _residual_shapes(q, v, cu_seqlens, keep_residuals)
    return (o, final_state, torch.empty(_z_shape(q, cu_seqlens), dtype=_summary_dtype(q), device=q.device),
            torch.empty(den_shape, dtype=torch.float32, device=q.device),
            torch.empty(z_shape, dtype=torch.float32, device=q.device))


def _normalized_args(q, k, v, o, initial_state, z_init, cu_seqlens, cu_seqlens_host, scale, final_state=None,
                     z_final=None):
    return make_args(_C.GlaForwardArgs, q=q, k=k, v=v, initial_state=initial_state, cu_seqlens=cu_seqlens,
                     cu_seqlens_host=cu_seqlens_host, scale=scale, algorithm=_C.GlaAlgorithm.chunked, o=o,
                     final_state=final_state, normalize=True, z_init=_z_view(z_init, "z_init"),
                     z_final=_z_view(z_final, "z_final"))


def _residual_slots(args, den, chunk_z):
    """gla_normalize_residual_slots for these args, where den and chunk_z have room for the residuals; else 0."""
    if den.numel() == 0 or chunk_z.dim() != 3:
        return 0
    slots = _C.gla_normalize_residual_slots(args)
    return slots if slots == chunk_z.shape[0] else 0


@torch.library.custom_op("flashgla::chunk_linear_attn_normalized", mutates_args=())
def _chunk_linear_attn_normalized(q: Tensor, k: Tensor, v: Tensor, initial_state: Optional[Tensor],
                                  z_init: Optional[Tensor], cu_seqlens: Optional[Tensor],
                                  cu_seqlens_host: Optional[Tensor], scale: Optional[float],
                                  output_final_state: bool, keep_residuals: bool = False
                                  ) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """o, final_state, z_final and, with keep_residuals (a backward will follow), the residuals of the backward's
    folded normaliser (den, z at each chunk's start; filled where gla_normalize_residual_slots is > 0)."""
    _require_forward_memory("chunk_linear_attn", _C.GlaAlgorithm.chunked, q, v, cu_seqlens, output_final_state,
                            None, False)
    o, final_state, z, den, chunk_z = _normalized_outputs(q, v, cu_seqlens, output_final_state, keep_residuals)
    args = _normalized_args(q, k, v, o, initial_state, z_init, cu_seqlens, cu_seqlens_host, scale,
                            final_state if output_final_state else None, z)
    if _residual_slots(args, den, chunk_z) > 0:
        args.norm_den, args.norm_chunk_z = view(den, "norm_den"), view(chunk_z, "norm_chunk_z")
    run_op(_C.gla_forward, args, q.device)
    return o, final_state, z, den, chunk_z


@_chunk_linear_attn_normalized.register_fake
def _(q, k, v, initial_state, z_init, cu_seqlens, cu_seqlens_host, scale, output_final_state, keep_residuals=False):
    require_same_device(q, k=k, v=v, initial_state=initial_state, z_init=z_init, cu_seqlens=cu_seqlens)
    return _normalized_outputs(q, v, cu_seqlens, output_final_state, keep_residuals)


@torch.library.custom_op("flashgla::chunk_linear_attn_normalized_backward", mutates_args=())
def _chunk_linear_attn_normalized_backward(q: Tensor, k: Tensor, v: Tensor, o: Tensor, den: Tensor,
                                           chunk_z: Tensor, initial_state: Optional[Tensor],
                                           z_init: Optional[Tensor], cu_seqlens: Optional[Tensor],
                                           cu_seqlens_host: Optional[Tensor], do: Tensor, dht: Optional[Tensor],
                                           dz: Optional[Tensor], scale: Optional[float], need_dh0: bool
                                           ) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """dq, dk, dv, dh0 and dz_init: the op's backward with the normaliser folded in (GlaBackwardArgs.norm_o) where
    the forward kept its residuals (the same question as the forward's, the same answer), else the normaliser's
    own backward from o and then the op's."""
    args = _normalized_args(q, k, v, o, initial_state, z_init, cu_seqlens, cu_seqlens_host, scale)
    if _residual_slots(args, den, chunk_z) == 0:
        d_o_raw, dq_z, dk_z, dz_init = _linear_attn_normalize_backward(o, q, k, z_init, cu_seqlens, cu_seqlens_host,
                                                                       do, dz, scale, False, True)
        dq, dk, dv, _, dh0, _ = torch.ops.flashgla.chunk_linear_attn_backward(
            q, k, v, None, initial_state, cu_seqlens, cu_seqlens_host, d_o_raw, dht, scale, False, need_dh0)
        return dq + dq_z, dk + dk_z, dv, dh0, dz_init
    _require_backward_memory("chunk_linear_attn (normalize, backward)", _C.GlaAlgorithm.chunked, q, k, v, None,
                             cu_seqlens, need_dh0, None, False)
    dq, dk, dv, _, dh0, _ = _backward_outputs(q, k, v, None, cu_seqlens, need_dh0, None, None, False)
    dz_init = _z_grad_output(q, z_init)
    if not do.is_contiguous() or do.data_ptr() % 16:  # the scalar chunk kernel copies whole 16-byte aligned rows
        do = do.clone(memory_format=torch.contiguous_format)
    args = make_args(_C.GlaBackwardArgs, q=q, k=k, v=v, initial_state=initial_state, cu_seqlens=cu_seqlens,
                     cu_seqlens_host=cu_seqlens_host, scale=scale, algorithm=_C.GlaAlgorithm.chunked,
                     d_o=do, d_final_state=dht, dq=dq, dk=dk, dv=dv,
                     d_initial_state=dh0 if need_dh0 else None, norm_o=o, norm_den=den, norm_chunk_z=chunk_z,
                     d_z_final=_z_view(dz, "d_z_final"),
                     d_z_init=_z_view(dz_init, "d_z_init") if z_init is not None else None)
    run_op(_C.gla_backward, args, q.device)
    return dq, dk, dv, dh0, dz_init


@_chunk_linear_attn_normalized_backward.register_fake
def _(q, k, v, o, den, chunk_z, initial_state, z_init, cu_seqlens, cu_seqlens_host, do, dht, dz, scale, need_dh0):
    require_same_device(q, k=k, v=v, o=o, den=den, chunk_z=chunk_z, initial_state=initial_state, z_init=z_init,
                        cu_seqlens=cu_seqlens, d_o=do)
    dq, dk, dv, _, dh0, _ = _backward_outputs(q, k, v, None, cu_seqlens, need_dh0, None, None, False)
    return dq, dk, dv, dh0, _z_grad_output(q, z_init)


def _normalized_setup(ctx, inputs, output):
    q, k, v, initial_state, z_init, cu_seqlens, cu_seqlens_host, scale, output_final_state, _ = inputs
    ctx.save_for_backward(q, k, v, output[0], initial_state, z_init, cu_seqlens, cu_seqlens_host, output[3],
                          output[4])
    ctx.scale, ctx.output_final_state = scale, output_final_state


def _normalized_gradients(ctx, do, dht, dz, _dden, _dchunk_z):
    q, k, v, o, initial_state, z_init, cu_seqlens, cu_seqlens_host, den, chunk_z = ctx.saved_tensors
    need_dh0 = initial_state is not None and ctx.needs_input_grad[3]
    need_dz = z_init is not None and ctx.needs_input_grad[4]
    dq, dk, dv, dh0, dz_init = _chunk_linear_attn_normalized_backward(
        q, k, v, o, den, chunk_z, initial_state, z_init, cu_seqlens, cu_seqlens_host, do,
        dht if ctx.output_final_state else None, dz, ctx.scale, need_dh0)
    return (dq, dk, dv, dh0.to(initial_state.dtype) if need_dh0 else None,
            dz_init.to(z_init.dtype) if need_dz else None, None, None, None, None, None)


_chunk_linear_attn_normalized.register_autograd(_normalized_gradients, setup_context=_normalized_setup)
forbid_double_backward(_chunk_linear_attn_normalized_backward, "chunk_linear_attn")


def _cp(op_name, q, k, v, g, scale, initial_state, output_final_state, cu_seqlens, cu_seqlens_host, cp_context,
        state_v_first=False, g_gamma=None, normalize=False):
    """The context-parallel path: the context (a flashgla.distributed.CPContext, which builds on these ops) runs
    the op across its group."""
    run = getattr(cp_context, "run_chunked_op", None)
    if run is None:
        raise TypeError(f"flashgla: cp_context: expected a CPContext from build_cp_context, got "
                        f"{type(cp_context).__name__}")
    return run(op_name, q, k, v, g, as_scale(scale, op_name), initial_state, output_final_state, cu_seqlens,
               cu_seqlens_host, state_v_first=bool(state_v_first), g_gamma=g_gamma,
               normalize=normalize)


def _gate_dims(q, g, expected, name, op, hint):
    # Only once q has its 4 dimensions: with q, k, v, g all 3-D (the batch dimension left out) the
    # C++ checks name q, the real mistake, instead of the gate.
    if q.dim() == 4 and isinstance(g, Tensor) and g.dim() != expected:
        raise ValueError(f"flashgla: {name}: {op} expects {hint}, got shape {list(g.shape)}")


def _check_gate(g, check_gate, name="g"):
    """check_gate=True: every gate value in [-inf, 0] (the contract), else ValueError. Reads g (a device
    synchronisation on CUDA), hence opt-in."""
    if check_gate and isinstance(g, Tensor) and not bool((g <= 0).all()):
        raise ValueError(f"flashgla: {name}: a log gate in [-inf, 0] (check_gate=True found a value above 0 or a NaN)")


def _flag(value, name, op, hint):
    """A bool argument; a tensor or a number there is a positional argument in FLA 0.5's slot."""
    if isinstance(value, bool):
        return value
    raise TypeError(f"flashgla: {name}: {op} expects a bool, got {type(value).__name__}{hint}")


def _reverse(value, op):
    """reverse of the recurrent ops: anything bool() takes, except a tensor (a positional argument out of place,
    e.g. cu_seqlens, whose bool() would fail without naming the argument or read the device)."""
    if isinstance(value, Tensor):
        raise TypeError(f"flashgla: reverse: {op} expects a bool, got a Tensor (FLA 0.6's order after "
                        "output_final_state: reverse, state_v_first or normalize, cu_seqlens; pass cu_seqlens by "
                        "keyword)")
    return bool(value)


def _host_seqlens(cu_seqlens_cpu, cu_seqlens_host):
    """FLA's cu_seqlens_cpu is flashgla's cu_seqlens_host: either name, or both when they agree."""
    if cu_seqlens_cpu is None:
        return cu_seqlens_host
    if not isinstance(cu_seqlens_cpu, Tensor):
        raise TypeError(f"flashgla: cu_seqlens_cpu: expected a torch.Tensor, got {type(cu_seqlens_cpu).__name__}")
    if cu_seqlens_host is not None and cu_seqlens_host is not cu_seqlens_cpu:
        if (not isinstance(cu_seqlens_host, Tensor) or cu_seqlens_host.shape != cu_seqlens_cpu.shape
                or not torch.equal(cu_seqlens_host.cpu().long(), cu_seqlens_cpu.cpu().long())):
            raise ValueError("flashgla: cu_seqlens_cpu: given together with cu_seqlens_host (the same thing under "
                             "flashgla's name) but different; pass one of them")
    return cu_seqlens_cpu


class _NotGiven:
    """The default of an argument whose mere presence matters (FLA reads it from **kwargs)."""

    def __repr__(self):
        return "<not given>"


_NOT_GIVEN = _NotGiven()


def _renamed_state_v_first(state_v_first, transpose_state_layout):
    """FLA 0.6's recurrent ops take state_v_first's deprecated name transpose_state_layout as FLA does: given at
    all, it warns (DeprecationWarning) and its value is state_v_first; given with a true state_v_first, ValueError."""
    if transpose_state_layout is _NOT_GIVEN:
        return state_v_first
    if state_v_first:
        raise ValueError("flashgla: transpose_state_layout: cannot pass both state_v_first and the deprecated "
                         "transpose_state_layout (its old name); pass state_v_first only")
    warnings.warn("flashgla: transpose_state_layout: deprecated and renamed to state_v_first (as in FLA 0.6)",
                  DeprecationWarning, stacklevel=3)
    return transpose_state_layout


_STATE_V_FIRST_HINT = (" (since FLA 0.6 the argument after output_final_state is state_v_first; pass cu_seqlens by "
                       "keyword)")


def chunk_gla(q: Tensor, k: Tensor, v: Tensor, g: Tensor, scale: Optional[float] = None,
              initial_state: Optional[Tensor] = None, output_final_state: bool = False, state_v_first: bool = False,
              cu_seqlens: Optional[Tensor] = None, cu_seqlens_cpu: Optional[Tensor] = None, *,
              cu_seqlens_host: Optional[Tensor] = None, check_gate: bool = False,
              cp_context=None) -> Tuple[Tensor, Optional[Tensor]]:
    """Chunked GLA with a per-key gate (FLA 0.6's signature).

    q, k [B,T,H,K], v [B,T,H,V] (fp32/bf16/fp16/fp64), g [B,T,H,K] log-space gate (any float dtype) in
    [-inf, 0] (-inf: a full reset), scale (default K^-1/2), initial_state [N,H,K,V] fp32 ([N,H,V,K] with
    state_v_first=True, as is the final state), cu_seqlens [N+1] int32/int64 with B == 1.
    cu_seqlens_cpu (FLA's name) or cu_seqlens_host: a CPU copy of a CUDA cu_seqlens, to have its values checked
    without a sync.
    The gate contract: a gate above 0 (a growing state) is outside the model and not checked by default (the
    check is an extra pass over g, and a synchronisation on CUDA); the chunked kernels may then return Inf/NaN.
    check_gate=True raises ValueError naming g when a gate is above 0 or NaN.
    Returns o [B,T,H,V] (dtype of q) and the final state fp32, fp64 for fp64 inputs (None unless
    output_final_state).
    cp_context: a flashgla.distributed.build_cp_context(...) context: q, k, v, g are this rank's slice of
    the sequence dimension (context parallelism; see flashgla.distributed); the final states are then
    those of the local sequences.
    """
    state_v_first = _flag(state_v_first, "state_v_first", "chunk_gla", _STATE_V_FIRST_HINT)
    cu_seqlens_host = _host_seqlens(cu_seqlens_cpu, cu_seqlens_host)
    require_tensors(q=q, k=k, v=v, g=g, initial_state=initial_state, cu_seqlens=cu_seqlens,
                    cu_seqlens_host=cu_seqlens_host)
    if g is None:
        raise ValueError("flashgla: g: chunk_gla needs a gate; use chunk_linear_attn for none")
    _gate_dims(q, g, 4, "g", "chunk_gla", "a per-key gate [B, T, H, K] (chunk_simple_gla takes [B, T, H])")
    _check_gate(g, check_gate)
    if cp_context is not None:
        return _cp("chunk_gla", q, k, v, g, scale, initial_state, output_final_state, cu_seqlens, cu_seqlens_host,
                   cp_context, state_v_first)
    # A for the backward only where there will be one (inference keeps neither the memory nor the store's time).
    save_intra = torch.is_grad_enabled() and any(isinstance(t, Tensor) and t.requires_grad
                                                 for t in (q, k, v, g, initial_state))
    o, final_state, _ = _chunk_gla(q, k, v, g, initial_state, cu_seqlens, cu_seqlens_host,
                                   as_scale(scale, "chunk_gla"), False, output_final_state, None, state_v_first,
                                   save_intra)
    return o, final_state if output_final_state else None


def _simple_gla_inputs(op, q, g, g_gamma, state_v_first, check_gate):
    state_v_first = _flag(state_v_first, "state_v_first", op, _STATE_V_FIRST_HINT)
    if g_gamma is not None and not isinstance(g_gamma, Tensor):
        raise TypeError(f"flashgla: g_gamma: {op} expects a tensor [H] or None, got {type(g_gamma).__name__} (since "
                        "FLA 0.6 the argument after g is g_gamma; pass scale by keyword)")
    _gate_dims(q, g, 3, "g", op, "a scalar gate [B, T, H] (chunk_gla takes [B, T, H, K])")
    if isinstance(g_gamma, Tensor) and g_gamma.dim() != 1:
        raise ValueError(f"flashgla: g_gamma: {op} expects one log decay per head [H], got shape {list(g_gamma.shape)}")
    _check_gate(g, check_gate)
    _check_gate(g_gamma, check_gate, "g_gamma")
    return state_v_first


def chunk_simple_gla(q: Tensor, k: Tensor, v: Tensor, g: Optional[Tensor] = None, g_gamma: Optional[Tensor] = None,
                     scale: Optional[float] = None, initial_state: Optional[Tensor] = None,
                     output_final_state: bool = False, state_v_first: bool = False,
                     cu_seqlens: Optional[Tensor] = None, cu_seqlens_cpu: Optional[Tensor] = None, *,
                     cu_seqlens_host: Optional[Tensor] = None, check_gate: bool = False,
                     cp_context=None, chunk_size: Optional[int] = None) -> Tuple[Tensor, Optional[Tensor]]:
    """Chunked GLA with a scalar gate per head and step, g [B,T,H] (None: no gate), and/or FLA's per-head constant
    log decay g_gamma [H] (RetNet style; with g, the gate of step t is g[:, t] + g_gamma, as in FLA). g_gamma gets a
    gradient too (the sum of the gate's gradient over every token; FLA gives it none). chunk_size (FLA's tuning
    keyword) is checked as FLA does (a power of 2) and otherwise ignored: the result does not depend on it and the
    kernels pick their own chunking. Gates (g, g_gamma) in [-inf, 0], as in chunk_gla: a gate above 0 is
    outside the contract and unchecked unless check_gate=True (ValueError naming g or g_gamma). Else as
    chunk_gla."""
    if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1
                                   or chunk_size & (chunk_size - 1)):
        raise ValueError(f"flashgla: chunk_size: a power of 2 (as FLA requires), got {chunk_size!r}")
    state_v_first = _simple_gla_inputs("chunk_simple_gla", q, g, g_gamma, state_v_first, check_gate)
    cu_seqlens_host = _host_seqlens(cu_seqlens_cpu, cu_seqlens_host)
    require_tensors(q=q, k=k, v=v, g=g, g_gamma=g_gamma, initial_state=initial_state, cu_seqlens=cu_seqlens,
                    cu_seqlens_host=cu_seqlens_host)
    if cp_context is not None:
        return _cp("chunk_simple_gla", q, k, v, g, scale, initial_state, output_final_state, cu_seqlens,
                   cu_seqlens_host, cp_context, state_v_first, g_gamma=g_gamma)
    o, final_state, _ = _chunk_simple_gla(q, k, v, g, initial_state, cu_seqlens, cu_seqlens_host,
                                          as_scale(scale, "chunk_simple_gla"), False, output_final_state, g_gamma,
                                          state_v_first)
    return o, final_state if output_final_state else None


def fused_recurrent_simple_gla(q: Tensor, k: Tensor, v: Tensor, g: Optional[Tensor] = None,
                               g_gamma: Optional[Tensor] = None, scale: Optional[float] = None,
                               initial_state: Optional[Tensor] = None, output_final_state: bool = False,
                               reverse: bool = False, state_v_first: bool = False,
                               cu_seqlens: Optional[Tensor] = None, *, cu_seqlens_cpu: Optional[Tensor] = None,
                               cu_seqlens_host: Optional[Tensor] = None,
                               transpose_state_layout=_NOT_GIVEN, ssm_state_indices: Optional[Tensor] = None,
                               num_accepted_tokens: Optional[Tensor] = None,
                               inplace_final_state: Optional[bool] = None) -> Tuple[Tensor, Optional[Tensor]]:
    """Token-by-token simple GLA (FLA 0.6's signature): g [B,T,H] and/or g_gamma [H] as in chunk_simple_gla,
    reverse as in fused_recurrent_gla. ssm_state_indices, num_accepted_tokens, inplace_final_state: state pools
    as in fused_recurrent_gla."""
    state_v_first = _renamed_state_v_first(state_v_first, transpose_state_layout)
    state_v_first = _simple_gla_inputs("fused_recurrent_simple_gla", q, g, g_gamma, state_v_first, False)
    cu_seqlens_host = _host_seqlens(cu_seqlens_cpu, cu_seqlens_host)
    require_tensors(q=q, k=k, v=v, g=g, g_gamma=g_gamma, initial_state=initial_state, cu_seqlens=cu_seqlens,
                    cu_seqlens_host=cu_seqlens_host, ssm_state_indices=ssm_state_indices,
                    num_accepted_tokens=num_accepted_tokens)
    return _fused_recurrent("fused_recurrent_simple_gla", q, k, v, g, g_gamma, scale, initial_state,
                            output_final_state, reverse, state_v_first, cu_seqlens, cu_seqlens_host,
                            ssm_state_indices, num_accepted_tokens, inplace_final_state)


def _fused_recurrent(op, q, k, v, g, g_gamma, scale, initial_state, output_final_state, reverse, state_v_first,
                     cu_seqlens, cu_seqlens_host, ssm_state_indices, num_accepted_tokens, inplace_final_state):
    """The recurrent ops after their own argument checks: through the state pools when any pool argument is
    given, else the token-by-token op."""
    if _pooled(ssm_state_indices, num_accepted_tokens, inplace_final_state):
        return _fused_recurrent_pooled(op, q, k, v, g, g_gamma, scale, initial_state, output_final_state, reverse,
                                       state_v_first, cu_seqlens, cu_seqlens_host, ssm_state_indices,
                                       num_accepted_tokens, inplace_final_state)
    o, final_state, _ = _fused_recurrent_gla(q, k, v, g, initial_state, cu_seqlens, cu_seqlens_host,
                                             as_scale(scale, op), _reverse(reverse, op), output_final_state, g_gamma,
                                             state_v_first)
    return o, final_state if output_final_state else None


# FLA users write chunk_linear_attn(q, k, v, g) by habit; the fourth slot is scale.
_NO_GATE_HINT = (" (chunk_linear_attn takes no gate: its fourth argument is scale; for a gate use chunk_simple_gla "
                 "or chunk_gla)")


def _split_linear_attn_state(op, initial_state, normalize):
    """FLA's initial_state: the kv state [N,H,K,V], or with normalize=True a pair (kv_state or None, z_state
    [N,1,H,K] or None); a plain tensor with normalize=True is the kv state, the key sum starting from zero (as FLA
    does)."""
    if isinstance(initial_state, (tuple, list)):
        if not normalize:
            raise TypeError(f"flashgla: initial_state: {op} with normalize=False takes the state tensor [N, H, K, V], "
                            "got a tuple (the (kv_state, z_state) pair belongs to normalize=True)")
        if len(initial_state) != 2:
            raise ValueError(f"flashgla: initial_state: {op} with normalize=True takes a pair (kv_state [N, H, K, V], "
                             f"z_state [N, 1, H, K]), got {len(initial_state)} items")
        kv_state, z_state = initial_state
        require_tensors(initial_state=kv_state, z_state=z_state)
        return kv_state, z_state
    require_tensors(initial_state=initial_state)
    return initial_state, None


_NORMALIZE_HINT = " (since FLA 0.6 the argument after output_final_state is normalize; pass cu_seqlens by keyword)"


def _check_z_state(op, z_state, q, cu_seqlens):
    """z_state (initial_state's second item) against FLA's [N, 1, H, K], in the caller's terms (the C++ API names
    its [N, H, K] view z_init); malformed q or cu_seqlens are left to the C++ checks."""
    if z_state is None or q.dim() != 4 or (cu_seqlens is not None and cu_seqlens.dim() != 1):
        return
    expected = _z_shape(q, cu_seqlens)
    if tuple(z_state.shape) != tuple(expected):
        raise ValueError(f"flashgla: initial_state: {op} takes z_state [N, 1, H, K] = {list(expected)} as the "
                         f"pair's second item, got shape {list(z_state.shape)}")


def _linear_attn(op, op_raw, q, k, v, scale, initial_state, output_final_state, reverse, normalize, cu_seqlens,
                 cu_seqlens_host, hint="", normalize_hint=_NORMALIZE_HINT):
    normalize = _flag(normalize, "normalize", op, normalize_hint)
    kv_state, z_state = _split_linear_attn_state(op, initial_state, normalize)
    require_tensors(q=q, k=k, v=v, cu_seqlens=cu_seqlens, cu_seqlens_host=cu_seqlens_host)
    _check_z_state(op, z_state, q, cu_seqlens)
    scale = as_scale(scale, op, hint)
    if normalize and op_raw is _chunk_linear_attn:
        keep = torch.is_grad_enabled() and any(isinstance(t, Tensor) and t.requires_grad
                                               for t in (q, k, v, kv_state, z_state))
        o, final_state, z, _, _ = _chunk_linear_attn_normalized(q, k, v, kv_state, z_state, cu_seqlens,
                                                                cu_seqlens_host, scale, output_final_state, keep)
        return o, (final_state if output_final_state else None, z)
    o, final_state, _ = op_raw(q, k, v, None, kv_state, cu_seqlens, cu_seqlens_host, scale, reverse,
                               output_final_state)
    final_state = final_state if output_final_state else None
    if not normalize:
        return o, final_state
    o, z = _linear_attn_normalize(o, q, k, z_state, cu_seqlens, cu_seqlens_host, scale, reverse)
    return o, (final_state, z)  # as FLA: the pair even without output_final_state


def chunk_linear_attn(q: Tensor, k: Tensor, v: Tensor, scale: Optional[float] = None,
                      initial_state=None, output_final_state: bool = False, normalize: bool = True,
                      cu_seqlens: Optional[Tensor] = None, *, cu_seqlens_cpu: Optional[Tensor] = None,
                      cu_seqlens_host: Optional[Tensor] = None, cp_context=None):
    """Chunked linear attention (no gate), FLA 0.6's signature and default normalize=True: o_t is divided by
    scale * q_t . z_t + 1e-10 with z_t the running key sum (from z_state of initial_state), and the second result
    is the pair (final_state or None, z_state [N,1,H,K] fp32). normalize=False: plain linear attention, the state as
    in chunk_gla."""
    cu_seqlens_host = _host_seqlens(cu_seqlens_cpu, cu_seqlens_host)
    if cp_context is not None:
        normalize = _flag(normalize, "normalize", "chunk_linear_attn", _NORMALIZE_HINT)
        require_tensors(q=q, k=k, v=v, initial_state=initial_state, cu_seqlens=cu_seqlens,
                        cu_seqlens_host=cu_seqlens_host)
        scale = as_scale(scale, "chunk_linear_attn", _NO_GATE_HINT)
        o, final_state = _cp("chunk_linear_attn", q, k, v, None, scale, initial_state, output_final_state, cu_seqlens,
                             cu_seqlens_host, cp_context, normalize=normalize)
        if not normalize:
            return o, final_state
        o, z = cp_context.run_normalize(o, q, k, scale)
        return o, (final_state, z)  # as without cp_context: the pair even without output_final_state
    return _linear_attn("chunk_linear_attn", _chunk_linear_attn, q, k, v, scale, initial_state, output_final_state,
                        False, normalize, cu_seqlens, cu_seqlens_host, _NO_GATE_HINT)


def fused_chunk_linear_attn(q: Tensor, k: Tensor, v: Tensor, scale: Optional[float] = None, initial_state=None,
                            output_final_state: bool = False, normalize: bool = True,
                            cu_seqlens: Optional[Tensor] = None, *, cu_seqlens_cpu: Optional[Tensor] = None,
                            cu_seqlens_host: Optional[Tensor] = None):
    """FLA's fused_chunk_linear_attn: the same computation as chunk_linear_attn (one chunked implementation here)."""
    cu_seqlens_host = _host_seqlens(cu_seqlens_cpu, cu_seqlens_host)
    return _linear_attn("fused_chunk_linear_attn", _chunk_linear_attn, q, k, v, scale, initial_state,
                        output_final_state, False, normalize, cu_seqlens, cu_seqlens_host)


def fused_recurrent_linear_attn(q: Tensor, k: Tensor, v: Tensor, scale: Optional[float] = None, initial_state=None,
                                output_final_state: bool = False, reverse: bool = False, normalize: bool = False,
                                cu_seqlens: Optional[Tensor] = None, *, cu_seqlens_cpu: Optional[Tensor] = None,
                                cu_seqlens_host: Optional[Tensor] = None):
    """FLA's fused_recurrent_linear_attn (token by token; normalize defaults to False there, as in FLA). With
    reverse=True both the state and the key sum run from each sequence's last token to its first."""
    cu_seqlens_host = _host_seqlens(cu_seqlens_cpu, cu_seqlens_host)
    return _linear_attn("fused_recurrent_linear_attn", _fused_recurrent_gla, q, k, v, scale, initial_state,
                        output_final_state, _reverse(reverse, "fused_recurrent_linear_attn"), normalize, cu_seqlens,
                        cu_seqlens_host,
                        normalize_hint=" (FLA 0.6's order after output_final_state: reverse, normalize, "
                                       "cu_seqlens; pass cu_seqlens by keyword)")


def fused_recurrent_gla(q: Tensor, k: Tensor, v: Tensor, gk: Optional[Tensor] = None, gv: Optional[Tensor] = None,
                        scale: Optional[float] = None, initial_state: Optional[Tensor] = None,
                        output_final_state: bool = False, reverse: bool = False, state_v_first: bool = False,
                        cu_seqlens: Optional[Tensor] = None, *, cu_seqlens_cpu: Optional[Tensor] = None,
                        cu_seqlens_host: Optional[Tensor] = None,
                        transpose_state_layout=_NOT_GIVEN, ssm_state_indices: Optional[Tensor] = None,
                        num_accepted_tokens: Optional[Tensor] = None,
                        inplace_final_state: Optional[bool] = None) -> Tuple[Tensor, Optional[Tensor]]:
    """Token-by-token GLA (FLA 0.6's signature); gk [B,T,H,K] (or a scalar gate [B,T,H], or None). reverse runs
    each sequence from its last token to its first. gv (FLA's value gate) is not supported. On the CPU this is the
    fp64-accumulating reference.

    State pools, vLLM's arguments (those of FLA 0.6's fused_recurrent_kda_fwd; inference only): with
    ssm_state_indices (int32 [N] or [N, T_max], device of q) initial_state is a pool [P,H,K,V] fp32 ([P,H,V,K]
    with state_v_first). Sequence n starts from row ssm_state_indices[n], or ssm_state_indices[n, a - 1] with
    a = num_accepted_tokens[n] (int32 [N], 1 <= a <= T_max; speculative decoding: the state after the accepted
    draft tokens; without it a = 1). A start row of -1 is a padded slot: zero outputs, no pool row read or
    written. inplace_final_state (the default with ssm_state_indices) writes the states back into the pool: the
    final state to the start row with [N]; the state after token t < T_max to row ssm_state_indices[n, t] with
    [N, T_max] (-1: not written); the pool is returned as the final state. inplace_final_state=False leaves the
    pool as it is and, with output_final_state, returns the state after every token, fp32 [B*T,H,K,V] (row:
    the token's position in the packed batch; zeros for padded slots). Rows are checked on the CPU (< P,
    distinct, a in range); on CUDA they are not read back: a start row >= P counts as padded, a write row
    >= P is not written, duplicates are undefined. Same results as running each sequence alone."""
    if gv is not None:
        if not isinstance(gv, Tensor):
            raise TypeError(f"flashgla: gv: fused_recurrent_gla expects a tensor or None, got {type(gv).__name__} "
                            "(since FLA 0.6 the argument after gk is gv; pass scale by keyword)")
        raise NotImplementedError("flashgla: gv: fused_recurrent_gla has no value gate (gv) here; gk only")
    state_v_first = _renamed_state_v_first(state_v_first, transpose_state_layout)
    state_v_first = _flag(state_v_first, "state_v_first", "fused_recurrent_gla", _STATE_V_FIRST_HINT)
    cu_seqlens_host = _host_seqlens(cu_seqlens_cpu, cu_seqlens_host)
    require_tensors(q=q, k=k, v=v, gk=gk, initial_state=initial_state, cu_seqlens=cu_seqlens,
                    cu_seqlens_host=cu_seqlens_host, ssm_state_indices=ssm_state_indices,
                    num_accepted_tokens=num_accepted_tokens)
    return _fused_recurrent("fused_recurrent_gla", q, k, v, gk, None, scale, initial_state, output_final_state,
                            reverse, state_v_first, cu_seqlens, cu_seqlens_host, ssm_state_indices,
                            num_accepted_tokens, inplace_final_state)


# ---- state pools under vLLM's names (fused_recurrent_* with ssm_state_indices) ------------------------


def _pooled(ssm_state_indices, num_accepted_tokens, inplace_final_state):
    """Whether a call takes the state-pool path (any of its arguments given; the C++ checks say what is missing)."""
    return (ssm_state_indices is not None or num_accepted_tokens is not None
            or not (inplace_final_state is None or inplace_final_state is False))


def _pooled_token_states_shape(q, v, state_v_first):
    """[B*T, H, K, V] ([B*T, H, V, K] with state_v_first): the state after every token; (0,) when malformed."""
    if q.dim() != 4 or v.dim() != 4:
        return (0,)
    inner = (v.shape[3], q.shape[3]) if state_v_first else (q.shape[3], v.shape[3])
    return (q.shape[0] * q.shape[1], q.shape[2], *inner)


@torch.library.custom_op("flashgla::gla_recurrent_pooled", mutates_args=("pool",))
def _gla_recurrent_pooled(q: Tensor, k: Tensor, v: Tensor, g: Optional[Tensor], g_gamma: Optional[Tensor],
                          pool: Tensor, ssm_state_indices: Optional[Tensor], num_accepted_tokens: Optional[Tensor],
                          cu_seqlens: Optional[Tensor], cu_seqlens_host: Optional[Tensor], scale: Optional[float],
                          reverse: bool, state_v_first: bool, inplace_final_state: bool,
                          output_token_states: bool) -> Tuple[Tensor, Tensor]:
    o = torch.empty(v.shape, dtype=q.dtype, device=q.device)
    token_states = (torch.zeros(_pooled_token_states_shape(q, v, state_v_first), dtype=torch.float32, device=q.device)
                    if output_token_states else _absent(q))
    args = make_args(_C.GlaForwardArgs, q=q, k=k, v=v, g=g, g_gamma=g_gamma, initial_state=pool,
                     cu_seqlens=cu_seqlens, cu_seqlens_host=cu_seqlens_host, scale=scale,
                     algorithm=_C.GlaAlgorithm.recurrent, reverse=reverse, o=o, state_v_first=state_v_first,
                     final_state=token_states if output_token_states else None, ssm_state_indices=ssm_state_indices,
                     num_accepted_tokens=num_accepted_tokens, inplace_final_state=inplace_final_state)
    run_op(_C.gla_forward, args, q.device)
    return o, token_states


@_gla_recurrent_pooled.register_fake
def _(q, k, v, g, g_gamma, pool, ssm_state_indices, num_accepted_tokens, cu_seqlens, cu_seqlens_host, scale,
      reverse, state_v_first, inplace_final_state, output_token_states):
    require_same_device(q, k=k, v=v, g=g, g_gamma=g_gamma, initial_state=pool, ssm_state_indices=ssm_state_indices,
                        num_accepted_tokens=num_accepted_tokens, cu_seqlens=cu_seqlens)
    o = torch.empty(v.shape, dtype=q.dtype, device=q.device)
    token_states = (torch.empty(_pooled_token_states_shape(q, v, state_v_first), dtype=torch.float32, device=q.device)
                    if output_token_states else _absent(q))
    return o, token_states


def _fused_recurrent_pooled(op, q, k, v, g, g_gamma, scale, initial_state, output_final_state, reverse, state_v_first,
                            cu_seqlens, cu_seqlens_host, ssm_state_indices, num_accepted_tokens, inplace_final_state):
    if initial_state is None:
        raise ValueError(f"flashgla: initial_state: {op} with ssm_state_indices needs the state pool [P, H, K, V] "
                         "(fp32) as initial_state")
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, g, g_gamma, initial_state)):
        raise NotImplementedError(f"flashgla: ssm_state_indices: {op} with state pools has no gradient (inference "
                                  "only, as in vLLM); call it without ssm_state_indices for training")
    inplace = True if inplace_final_state is None else _flag(inplace_final_state, "inplace_final_state", op, "")
    o, token_states = _gla_recurrent_pooled(q, k, v, g, g_gamma, initial_state, ssm_state_indices,
                                            num_accepted_tokens, cu_seqlens, cu_seqlens_host, as_scale(scale, op),
                                            _reverse(reverse, op), state_v_first, inplace,
                                            bool(output_final_state) and not inplace)
    if inplace:
        return o, initial_state
    return o, token_states if output_final_state else None


def _token_states_shape(q, v, state):
    """gla_decode_step's per-token states: [N, T, H, K, V], or [N, H, K, V] for one token."""
    if q.dim() == 4 and v.dim() == 4 and state.dim() == 4:  # [N, T, H, K, V]
        return (q.shape[0], q.shape[1], q.shape[2], q.shape[3], v.shape[3])
    if q.dim() == 3 and v.dim() == 3 and state.dim() == 4:  # one token: [N, H, K, V]
        return (q.shape[0], q.shape[1], q.shape[2], v.shape[2])
    return (0,)  # malformed: the C++ checks say why


def _decode_outputs(q, v, state, output_token_states):
    o = torch.empty(v.shape, dtype=q.dtype, device=q.device)
    if not output_token_states:
        return o, _absent(q)
    return o, torch.empty(_token_states_shape(q, v, state), dtype=torch.float32, device=q.device)


@torch.library.custom_op("flashgla::gla_decode_step", mutates_args=("state",))
def _gla_decode_step(q: Tensor, k: Tensor, v: Tensor, g: Optional[Tensor], state: Tensor,
                     scale: Optional[float], state_indices: Optional[Tensor],
                     output_token_states: bool) -> Tuple[Tensor, Tensor]:
    outputs = [("o", v.shape, q.dtype)]
    if output_token_states:
        outputs.append(("token_states", _token_states_shape(q, v, state), torch.float32))
    require_outputs("gla_decode_step", q.device, outputs)
    o, token_states = _decode_outputs(q, v, state, output_token_states)
    rows = None
    if output_token_states:  # the C++ API takes them as [N*T, H, K, V], row n*T + t
        rows = token_states.view(-1, *token_states.shape[-3:]) if token_states.dim() >= 4 else token_states
    args = make_args(_C.GlaDecodeArgs, q=q, k=k, v=v, g=g, state=state, state_indices=state_indices, scale=scale,
                     o=o, token_states=rows)
    run_op(_C.gla_decode, args, q.device, scratch=False)
    return o, token_states


@_gla_decode_step.register_fake
def _(q, k, v, g, state, scale, state_indices, output_token_states):
    require_same_device(q, k=k, v=v, g=g, state=state, state_indices=state_indices)
    return _decode_outputs(q, v, state, output_token_states)


def _refuse_gradients(op, **tensors):
    """NotImplementedError naming the first tensor that requires grad (with grad mode on) for an op without a
    backward: torch would otherwise return an output that claims a gradient it cannot give, and update a
    state that requires grad in place."""
    if not torch.is_grad_enabled():
        return
    for name, t in tensors.items():
        if t is not None and t.requires_grad:
            what = "is updated in place and " if name == "state" else ""
            raise NotImplementedError(
                f"flashgla: {name}: {op} has no backward (inference only), but {name} {what}requires grad: call it "
                "under torch.no_grad() or pass detached tensors (for training use chunk_gla or fused_recurrent_gla)")


def _check_one_token_shapes(q, k, v, g):
    """The shapes of the one-token form (q [N, H, K]) in the caller's terms: the C++ API checks them after
    adding a token dimension, which its messages would show."""
    if q.dim() != 3:
        return
    N, H, K = q.shape
    expected = [("k", k, (N, H, K), "[N, H, K]")]
    if v.dim() == 3 and v.shape[:2] != q.shape[:2]:
        raise ValueError(f"flashgla: v: expected shape [N, H, V] = [{N}, {H}, V] (N, H of q), got {list(v.shape)}")
    if isinstance(g, Tensor):
        expected.append(("g", g, (N, H, K), "[N, H, K]") if g.dim() == 3 else ("g", g, (N, H), "[N, H]"))
    for name, t, shape, label in expected:
        if t.dim() == len(shape) and tuple(t.shape) != shape:
            raise ValueError(f"flashgla: {name}: expected shape {label} = {list(shape)}, got {list(t.shape)}")


def gla_decode_step(q: Tensor, k: Tensor, v: Tensor, g: Optional[Tensor], state: Tensor,
                    scale: Optional[float] = None, state_indices: Optional[Tensor] = None, *,
                    output_token_states: bool = False):
    """T ≤ 16 tokens per sequence, in order: state = diag(exp g_t) state + k_t^T v_t, o_t = scale q_t state.

    q, k [N,H,K], v [N,H,V], g [N,H,K] or [N,H] (or None) for one token; or with a token dimension
    [N,T,H,K] (g [N,T,H,K] or [N,T,H]), T ≤ 16 (speculative decoding: draft tokens in one call).
    state [N,H,K,V] fp32 is updated in place. With state_indices (int32 [N], device of q), state is a
    pool [P,H,K,V] and sequence i reads and updates row state_indices[i]; a negative index is a padded
    slot (zero outputs, no pool row touched). Indices must be < P and distinct (checked on the CPU; on CUDA
    they are not read back: a row >= P is treated as padded, duplicates are undefined).
    Returns o [N,H,V] (or [N,T,H,V]) in the dtype of q; with output_token_states=True also the state
    after each token, fp32 [N,T,H,K,V] ([N,H,K,V] without a token dimension), so a verifier that
    accepts tokens 0..a of sequence i rolls back with state[state_indices[i]] = token_states[i, a].
    Padded slots' token states are zeros. No gradient: with grad mode on, an input (or state) that requires
    grad is a NotImplementedError (call it under torch.no_grad(), or pass detached tensors).
    """
    require_tensors(q=q, k=k, v=v, g=g, state=state, state_indices=state_indices)
    _refuse_gradients("gla_decode_step", q=q, k=k, v=v, g=g, state=state)
    _check_one_token_shapes(q, k, v, g)
    o, token_states = _gla_decode_step(q, k, v, g, state, as_scale(scale, "gla_decode_step"), state_indices,
                                       bool(output_token_states))
    return (o, token_states) if output_token_states else o


@torch.library.custom_op("flashgla::gla_prefill", mutates_args=("state",))
def _gla_prefill(q: Tensor, k: Tensor, v: Tensor, g: Optional[Tensor], state: Tensor,
                 final_state_indices: Tensor, initial_state_indices: Optional[Tensor],
                 cu_seqlens: Optional[Tensor], cu_seqlens_host: Optional[Tensor], scale: Optional[float]) -> Tensor:
    require_outputs("gla_prefill", q.device, [("o", v.shape, q.dtype)], cpu_path="chunked_forward", q=q, v=v)
    o = torch.empty(v.shape, dtype=q.dtype, device=q.device)
    pool = view(state, "state")  # read (with initial_state_indices) and written
    args = make_args(_C.GlaForwardArgs, q=q, k=k, v=v, g=g,
                     initial_state=pool if initial_state_indices is not None else None, cu_seqlens=cu_seqlens,
                     cu_seqlens_host=cu_seqlens_host, scale=scale, algorithm=_C.GlaAlgorithm.chunked, o=o,
                     final_state=pool, initial_state_indices=initial_state_indices,
                     final_state_indices=final_state_indices)
    run_op(_C.gla_forward, args, q.device)
    return o


@_gla_prefill.register_fake
def _(q, k, v, g, state, final_state_indices, initial_state_indices, cu_seqlens, cu_seqlens_host, scale):
    require_same_device(q, k=k, v=v, g=g, state=state, final_state_indices=final_state_indices,
                        initial_state_indices=initial_state_indices, cu_seqlens=cu_seqlens)
    return torch.empty(v.shape, dtype=q.dtype, device=q.device)


def gla_prefill(q: Tensor, k: Tensor, v: Tensor, g: Optional[Tensor], state: Tensor, final_state_indices: Tensor,
                initial_state_indices: Optional[Tensor] = None, scale: Optional[float] = None,
                cu_seqlens: Optional[Tensor] = None, *, cu_seqlens_host: Optional[Tensor] = None) -> Tensor:
    """The chunked forward (prompt prefill) with its states in a pool: sequence n starts from
    state[initial_state_indices[n]] (zeros without initial_state_indices or for a negative row) and its final
    state is written to state[final_state_indices[n]] (a negative row: not written). state [P,H,K,V] fp32 is
    updated in place; one row may be both read and written. q, k, v, g, scale, cu_seqlens as in chunk_gla, with
    g [B,T,H,K] (per-key gate), [B,T,H] (scalar) or None. Indices are int32 [N] on the device of q, checked
    on the CPU (< P, final rows distinct); on CUDA a row >= P is treated as negative. Returns o [B,T,H,V].
    Inference only (no gradient).
    """
    require_tensors(q=q, k=k, v=v, g=g, state=state, final_state_indices=final_state_indices,
                    initial_state_indices=initial_state_indices, cu_seqlens=cu_seqlens,
                    cu_seqlens_host=cu_seqlens_host)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, g, state)):
        raise NotImplementedError("flashgla: state: gla_prefill has no gradient (inference only); "
                                  "use chunk_gla for training")
    return _gla_prefill(q, k, v, g, state, final_state_indices, initial_state_indices, cu_seqlens, cu_seqlens_host,
                        as_scale(scale, "gla_prefill"))


# ---- per-segment summaries (the context-parallel pre-pass) ------------------------


def _summary_dtype(x):
    """Summaries are fp32, fp64 for fp64 inputs (an fp64 computation keeps fp64 accuracy through them)."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _segment_states_outputs(k, v, cu_seqlens):
    shape = _state_shape(k, v, cu_seqlens)
    dtype = _summary_dtype(k)
    states = torch.empty(shape, dtype=dtype, device=k.device)
    log_decay = torch.empty(shape[:3] if len(shape) == 4 else (0,), dtype=dtype, device=k.device)
    return states, log_decay


@torch.library.custom_op("flashgla::chunk_gla_segment_states", mutates_args=())
def _chunk_gla_segment_states(k: Tensor, v: Tensor, g: Optional[Tensor], cu_seqlens: Optional[Tensor],
                              cu_seqlens_host: Optional[Tensor], g_gamma: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    require_outputs("chunk_gla_segment_states", k.device,
                    [("states", _state_shape(k, v, cu_seqlens), _summary_dtype(k))], argument="k")
    states, log_decay = _segment_states_outputs(k, v, cu_seqlens)
    args = make_args(_C.GlaSegmentStatesArgs, k=k, v=v, g=g, g_gamma=g_gamma, cu_seqlens=cu_seqlens,
                     cu_seqlens_host=cu_seqlens_host, states=states, log_decay=log_decay)
    run_op(_C.gla_segment_states, args, k.device)
    return states, log_decay


@_chunk_gla_segment_states.register_fake
def _(k, v, g, cu_seqlens, cu_seqlens_host, g_gamma=None):
    _require_same_device_as(k, "k", v=v, g=g, g_gamma=g_gamma, cu_seqlens=cu_seqlens)
    return _segment_states_outputs(k, v, cu_seqlens)


@torch.library.custom_op("flashgla::chunk_gla_segment_state_grads", mutates_args=())
def _chunk_gla_segment_state_grads(q: Tensor, do: Tensor, g: Optional[Tensor], scale: Optional[float],
                                   cu_seqlens: Optional[Tensor], cu_seqlens_host: Optional[Tensor],
                                   g_gamma: Optional[Tensor] = None) -> Tensor:
    require_outputs("chunk_gla_segment_state_grads", q.device,
                    [("d_states", _state_shape(q, do, cu_seqlens), _summary_dtype(q))])
    d_states = torch.empty(_state_shape(q, do, cu_seqlens), dtype=_summary_dtype(q), device=q.device)
    args = make_args(_C.GlaSegmentStateGradsArgs, q=q, d_o=do, g=g, g_gamma=g_gamma, scale=scale, cu_seqlens=cu_seqlens,
                     cu_seqlens_host=cu_seqlens_host, d_states=d_states)
    run_op(_C.gla_segment_state_grads, args, q.device)
    return d_states


@_chunk_gla_segment_state_grads.register_fake
def _(q, do, g, scale, cu_seqlens, cu_seqlens_host, g_gamma=None):
    require_same_device(q, d_o=do, g=g, g_gamma=g_gamma, cu_seqlens=cu_seqlens)
    return torch.empty(_state_shape(q, do, cu_seqlens), dtype=_summary_dtype(q), device=q.device)


def _require_same_device_as(lead, lead_name, **tensors):
    for name, t in tensors.items():
        if t is not None and t.device != lead.device:
            raise ValueError(f"flashgla: {name}: expected device {lead.device} (that of {lead_name}), got {t.device}")


def chunk_gla_segment_states(k: Tensor, v: Tensor, g: Optional[Tensor] = None, cu_seqlens: Optional[Tensor] = None,
                             cu_seqlens_host: Optional[Tensor] = None, *,
                             g_gamma: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """Per segment (each sequence of the batch, or of cu_seqlens), the end state from a zero start and the
    summed log decay, without computing any output:

        states[n]    = S = sum_t (k_t * exp(sum_{u>t} g_u))^T v_t     [N, H, K, V]
        log_decay[n] = a = sum_t g_t                                [N, H, K] (0 without a gate)

    so that the end state from any start state h0 is exp(a)[..., None] * h0 + S. k [B,T,H,K], v [B,T,H,V]
    (fp32/bf16/fp16/fp64, one dtype), g [B,T,H,K] or [B,T,H] (scalar gate: its sum repeated over K) or None,
    cu_seqlens [N+1] with B == 1. g_gamma [H] (FLA's simple GLA decay): the gate is g + g_gamma (g [B,T,H] or
    None), staged in fp32 as chunk_simple_gla stages it. Summaries are fp32 (fp64 for fp64 inputs); an empty segment gives zeros;
    a -inf gate gives -inf in log_decay, never NaN. No gradient (a building block of context parallelism).
    """
    require_tensors(k=k, v=v, g=g, cu_seqlens=cu_seqlens, cu_seqlens_host=cu_seqlens_host, g_gamma=g_gamma)
    return _chunk_gla_segment_states(k, v, g, cu_seqlens, cu_seqlens_host, g_gamma)


def chunk_gla_segment_state_grads(q: Tensor, do: Tensor, g: Optional[Tensor] = None, scale: Optional[float] = None,
                                  cu_seqlens: Optional[Tensor] = None,
                                  cu_seqlens_host: Optional[Tensor] = None, *,
                                  g_gamma: Optional[Tensor] = None) -> Tensor:
    """The backward's mirror of chunk_gla_segment_states: per segment, the gradient of its start state when the
    gradient at its end is zero,

        d_states[n] = B = scale * sum_t (q_t * exp(sum_{u<=t} g_u))^T do_t     [N, H, K, V]

    (the initial state's gradient chunk_gla's backward gives with no final-state gradient), so that with an end
    gradient dht it is exp(a)[..., None] * dht + B. q [B,T,H,K], do [B,T,H,V] (one dtype), g and g_gamma as in
    chunk_gla_segment_states, scale default K^-1/2. fp32 (fp64 for fp64 inputs). No gradient.
    """
    require_tensors(q=q, do=do, g=g, cu_seqlens=cu_seqlens, cu_seqlens_host=cu_seqlens_host, g_gamma=g_gamma)
    return _chunk_gla_segment_state_grads(q, do, g, as_scale(scale, "chunk_gla_segment_state_grads"), cu_seqlens,
                                          cu_seqlens_host, g_gamma)
