"""Layers built on flashgla's ops: the GLA layer, its norms and short convolution, and softmax
attention for hybrid models."""

from .attention import Attention, KVCache, RotaryEmbedding
from .conv import ShortConvolution
from .gla import GatedLinearAttention, GLAState
from .norm import GatedRMSNorm, RMSNorm

__all__ = ["Attention", "GatedLinearAttention", "GatedRMSNorm", "GLAState", "KVCache", "RMSNorm",
           "RotaryEmbedding", "ShortConvolution"]
