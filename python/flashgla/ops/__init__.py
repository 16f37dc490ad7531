"""flashgla's PyTorch ops: torch.library custom ops (torch.ops.flashgla.*) with fake implementations for
torch.compile and autograd formulas, over flashgla._C. Needs torch >= 2.4.

- gla: the GLA family with FLA's names (chunk_gla, chunk_simple_gla, fused_recurrent_gla, the linear-attention
  ops, gla_decode_step, gla_prefill, and the per-segment summaries of context parallelism);
- attention: flash_attention; kvcache: flash_attention_with_kvcache;
- norm: the fused norm and gate steps of a GLA layer (rms_norm, rms_norm_gated, logsigmoid_gate).
"""

from .attention import flash_attention
from .gla import (chunk_gla, chunk_gla_segment_state_grads, chunk_gla_segment_states, chunk_linear_attn,
                  chunk_simple_gla, fused_chunk_linear_attn, fused_recurrent_gla, fused_recurrent_linear_attn,
                  fused_recurrent_simple_gla, gla_decode_step, gla_prefill)
from .kvcache import flash_attention_with_kvcache
from .norm import logsigmoid_gate, rms_norm, rms_norm_gated

__all__ = ["chunk_gla", "fused_recurrent_gla", "chunk_simple_gla", "fused_recurrent_simple_gla", "chunk_linear_attn",
           "fused_chunk_linear_attn", "fused_recurrent_linear_attn", "gla_decode_step", "chunk_gla_segment_states",
           "chunk_gla_segment_state_grads", "gla_prefill", "flash_attention", "flash_attention_with_kvcache",
           "rms_norm", "rms_norm_gated", "logsigmoid_gate"]
