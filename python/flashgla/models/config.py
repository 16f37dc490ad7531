"""Configuration of the GLA causal language model, saved as JSON next to the weights."""

import json
from dataclasses import asdict, dataclass, field, fields
from typing import List, Optional


@dataclass
class GLAConfig:
    """Sizes and options of a GLA Transformer (Yang et al. 2024, §4.4).

    Each block is x + GLA(RMSNorm(x)) then x + SwiGLU(RMSNorm(x)); blocks whose index is in
    attn_layers use softmax attention with rotary positions instead of GLA (a hybrid model). With every
    index in attn_layers and attn_backend "sdpa" the model is the Transformer++ baseline.
    """

    vocab_size: int = 256
    hidden_size: int = 256
    num_hidden_layers: int = 4
    num_heads: int = 4
    num_kv_heads: Optional[int] = None
    expand_k: float = 0.5
    expand_v: float = 1.0
    gate_low_rank_dim: int = 16
    gate_logit_normalizer: float = 16.0
    clamp_min: Optional[float] = None
    use_output_gate: bool = True
    gate_fn: str = "swish"
    use_short_conv: bool = False
    conv_size: int = 4
    mode: str = "chunk"
    intermediate_size: Optional[int] = None  # default: 8/3 * hidden_size, rounded up to a multiple of 64
    norm_eps: float = 1e-6
    attn_layers: List[int] = field(default_factory=list)
    attn_num_heads: Optional[int] = None     # default: num_heads
    attn_num_kv_heads: Optional[int] = None  # default: attn_num_heads
    attn_backend: str = "flashgla"           # or "sdpa" (torch's attention; no packed sequences)
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = False
    initializer_range: float = 0.02

    def __post_init__(self):
        if self.vocab_size < 1 or self.hidden_size < 1 or self.num_hidden_layers < 1:
            raise ValueError(f"vocab_size ({self.vocab_size}), hidden_size ({self.hidden_size}) and "
                             f"num_hidden_layers ({self.num_hidden_layers}) must be at least 1")
        self.attn_layers = sorted(int(i) for i in self.attn_layers)
        bad = [i for i in self.attn_layers if not 0 <= i < self.num_hidden_layers]
        if bad:
            raise ValueError(f"attn_layers {bad} are not layer indices 0..{self.num_hidden_layers - 1}")
        if len(set(self.attn_layers)) != len(self.attn_layers):
            raise ValueError(f"attn_layers has repeated indices: {self.attn_layers}")
        if self.intermediate_size is None:
            self.intermediate_size = -(-self.hidden_size * 8 // 3 // 64) * 64
        if self.intermediate_size < 1:
            raise ValueError(f"intermediate_size must be at least 1, got {self.intermediate_size}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "GLAConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown GLAConfig fields: {unknown}")
        return cls(**values)

    def to_json(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=2, sort_keys=True)
            f.write("\n")

    @classmethod
    def from_json(cls, path: str) -> "GLAConfig":
        with open(path) as f:
            return cls.from_dict(json.load(f))
