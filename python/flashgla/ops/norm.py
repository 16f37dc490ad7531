"""The fused norm and gate steps of a GLA layer as PyTorch ops.

- ``rms_norm_gated(x, gate, weight, eps, activation)``: y = rmsnorm(x) * weight * act(gate) over the
  last dimension (per head when x is [B, T, H, V]); ``rms_norm(x, weight, eps)`` is the same without
  a gate (the RMSNorm of a Transformer block).
- ``logsigmoid_gate(x, normalizer, clamp_min)``: g = max(logsigmoid(x) / normalizer, clamp_min), the
  log-space forget gate of GLA.

Each is a torch.library.custom_op in the namespace "flashgla" with a fake implementation for
torch.compile and an autograd formula that calls a "<name>_backward" op. All checking and computing
happens in C++ (flashgla/norm.h).
"""

from typing import Optional, Tuple

import torch
from torch import Tensor

from .. import _C
from .._torch import forbid_double_backward, make_args, run_op
from ._memory import require_outputs

__all__ = ["rms_norm", "rms_norm_gated", "logsigmoid_gate"]

_ACTIVATIONS = {"swish": _C.GateActivation.swish, "silu": _C.GateActivation.swish,
                "sigmoid": _C.GateActivation.sigmoid}


def _activation(name: str):
    try:
        return _ACTIVATIONS[name]
    except KeyError:
        raise ValueError(f"flashgla: activation: expected one of {sorted(_ACTIVATIONS)}, got {name!r}") from None


def _empty_like(t: Tensor, dtype=None) -> Tensor:
    """An output with t's shape, contiguous (t itself may be a strided view)."""
    return torch.empty(t.shape, dtype=t.dtype if dtype is None else dtype, device=t.device)


# ---- gated RMSNorm -----------------------------------------------------------------------------------

@torch.library.custom_op("flashgla::rms_norm_gated", mutates_args=())
def _rms_norm_gated(x: Tensor, weight: Optional[Tensor], gate: Optional[Tensor], eps: float,
                    activation: str) -> Tensor:
    require_outputs("rms_norm_gated", x.device, [("y", x.shape, x.dtype)], argument="x")
    y = _empty_like(x)
    args = make_args(_C.RmsNormForwardArgs, x=x, weight=weight, gate=gate, activation=_activation(activation), eps=eps,
                     y=y)
    run_op(_C.rms_norm_forward, args, x.device, scratch=False)
    return y


@_rms_norm_gated.register_fake
def _(x, weight, gate, eps, activation):
    return _empty_like(x)


@torch.library.custom_op("flashgla::rms_norm_gated_backward", mutates_args=())
def _rms_norm_gated_backward(x: Tensor, weight: Optional[Tensor], gate: Optional[Tensor], dy: Tensor, eps: float,
                             activation: str, need_dweight: bool) -> Tuple[Tensor, Tensor, Tensor]:
    require_outputs("rms_norm_gated (backward)", x.device,
                    [("dx", x.shape, x.dtype)] + ([("dgate", gate.shape, gate.dtype)] if gate is not None else []),
                    argument="x")
    dx = _empty_like(x)
    dgate = _empty_like(gate) if gate is not None else x.new_empty(0)
    need_dweight = need_dweight and weight is not None
    dweight = _empty_like(weight) if need_dweight else x.new_empty(0)
    args = make_args(_C.RmsNormBackwardArgs, x=x, weight=weight, gate=gate, activation=_activation(activation), eps=eps,
                     dy=dy, dx=dx, dgate=dgate if gate is not None else None,
                     dweight=dweight if need_dweight else None)
    run_op(_C.rms_norm_backward, args, x.device)
    return dx, dgate, dweight


@_rms_norm_gated_backward.register_fake
def _(x, weight, gate, dy, eps, activation, need_dweight):
    dgate = _empty_like(gate) if gate is not None else x.new_empty(0)
    dweight = _empty_like(weight) if need_dweight and weight is not None else x.new_empty(0)
    return _empty_like(x), dgate, dweight


def _norm_setup_context(ctx, inputs, output):
    x, weight, gate, eps, activation = inputs
    ctx.save_for_backward(x, weight, gate)
    ctx.eps, ctx.activation = eps, activation


def _norm_gradients(ctx, dy):
    x, weight, gate = ctx.saved_tensors
    need_dweight = weight is not None and ctx.needs_input_grad[1]
    dx, dgate, dweight = _rms_norm_gated_backward(x, weight, gate, dy, ctx.eps, ctx.activation, need_dweight)
    return (dx, dweight if need_dweight else None, dgate if gate is not None and ctx.needs_input_grad[2] else None,
            None, None)


_rms_norm_gated.register_autograd(_norm_gradients, setup_context=_norm_setup_context)
forbid_double_backward(_rms_norm_gated_backward, "rms_norm_gated")


def rms_norm_gated(x: Tensor, gate: Optional[Tensor], weight: Optional[Tensor] = None, eps: float = 1e-6,
                   activation: str = "swish") -> Tensor:
    """y = x * rsqrt(mean(x^2) + eps) * weight * act(gate), normalized over the last dimension.

    x [..., D] (1 to 4 dims; fp32/bf16/fp16, fp64 on the CPU), gate: shape and dtype of x or None,
    weight [D] (any float dtype) or None, activation "swish" (= "silu", r * sigmoid(r)) or "sigmoid".
    Returns y in the dtype of x. Differentiable in x, gate and weight.
    """
    return _rms_norm_gated(x, weight, gate, float(eps), activation)


def rms_norm(x: Tensor, weight: Optional[Tensor] = None, eps: float = 1e-6) -> Tensor:
    """y = x * rsqrt(mean(x^2) + eps) * weight over the last dimension (rms_norm_gated without a gate)."""
    return _rms_norm_gated(x, weight, None, float(eps), "swish")


# ---- log-sigmoid gate ---------------------------------------------------------------------------------

@torch.library.custom_op("flashgla::logsigmoid_gate", mutates_args=())
def _logsigmoid_gate(x: Tensor, normalizer: float, clamp_min: Optional[float], float32_output: bool) -> Tensor:
    require_outputs("logsigmoid_gate", x.device, [("g", x.shape, torch.float32 if float32_output else x.dtype)],
                    argument="x")
    g = _empty_like(x, torch.float32 if float32_output else None)
    args = make_args(_C.LogSigmoidGateForwardArgs, x=x, normalizer=normalizer, clamp_min=clamp_min, g=g)
    run_op(_C.logsigmoid_gate_forward, args, x.device, scratch=False)
    return g


@_logsigmoid_gate.register_fake
def _(x, normalizer, clamp_min, float32_output):
    return _empty_like(x, torch.float32 if float32_output else None)


@torch.library.custom_op("flashgla::logsigmoid_gate_backward", mutates_args=())
def _logsigmoid_gate_backward(x: Tensor, dg: Tensor, normalizer: float, clamp_min: Optional[float]) -> Tensor:
    require_outputs("logsigmoid_gate (backward)", x.device, [("dx", x.shape, x.dtype)], argument="x")
    dx = _empty_like(x)
    args = make_args(_C.LogSigmoidGateBackwardArgs, x=x, normalizer=normalizer, clamp_min=clamp_min, dg=dg, dx=dx)
    run_op(_C.logsigmoid_gate_backward, args, x.device, scratch=False)
    return dx


@_logsigmoid_gate_backward.register_fake
def _(x, dg, normalizer, clamp_min):
    return _empty_like(x)


def _gate_setup_context(ctx, inputs, output):
    x, normalizer, clamp_min, float32_output = inputs
    ctx.save_for_backward(x)
    ctx.normalizer, ctx.clamp_min = normalizer, clamp_min


def _gate_gradients(ctx, dg):
    (x,) = ctx.saved_tensors
    return _logsigmoid_gate_backward(x, dg, ctx.normalizer, ctx.clamp_min), None, None, None


_logsigmoid_gate.register_autograd(_gate_gradients, setup_context=_gate_setup_context)
forbid_double_backward(_logsigmoid_gate_backward, "logsigmoid_gate")


def logsigmoid_gate(x: Tensor, normalizer: float = 16.0, clamp_min: Optional[float] = None,
                    float32_output: bool = False) -> Tensor:
    """g = max(logsigmoid(x) / normalizer, clamp_min) (no clamp when clamp_min is None), elementwise.

    x: any shape up to 4 dims (fp32/bf16/fp16, fp64 on the CPU). Returns g in the dtype of x, or fp32 with
    float32_output=True. The gradient is 0 where the clamp is active.
    """
    return _logsigmoid_gate(x, float(normalizer), None if clamp_min is None else float(clamp_min),
                            bool(float32_output))
