"""RMSNorm modules over flashgla's fused kernel (flashgla.ops.norm)."""

import torch
from torch import Tensor, nn

from ..ops.norm import rms_norm, rms_norm_gated


class RMSNorm(nn.Module):
    """y = x * rsqrt(mean(x^2) + eps) * weight over the last dimension."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.weight.numel()}, eps={self.eps}"


class GatedRMSNorm(nn.Module):
    """y = rmsnorm(x) * weight * act(gate) over the last dimension (act: swish or sigmoid).

    The output normalization of GLA: x is the per-head output [B, T, H, V], normalized over V.
    """

    def __init__(self, dim: int, eps: float = 1e-6, activation: str = "swish"):
        super().__init__()
        self.eps, self.activation = eps, activation
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor, gate: Tensor) -> Tensor:
        return rms_norm_gated(x, gate, self.weight, self.eps, self.activation)

    def extra_repr(self) -> str:
        return f"{self.weight.numel()}, eps={self.eps}, activation={self.activation}"
