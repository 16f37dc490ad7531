"""Language models built from flashgla's layers."""

from .config import GLAConfig
from .gla_lm import Cache, CausalLMOutput, GLABlock, GLAForCausalLM, SwiGLU

__all__ = ["Cache", "CausalLMOutput", "GLABlock", "GLAConfig", "GLAForCausalLM", "SwiGLU"]
