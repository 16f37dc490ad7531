"""Configuration of the GLA causal language model, saved as JSON next to the weights."""

import contextlib
import contextvars
import json
import math
import numbers
from dataclasses import asdict, dataclass, field, fields
from typing import List, Optional

# Where the values being checked come from (a config.json path, or the class), named in every error.
_SOURCE = contextvars.ContextVar("flashgla_config_source", default="GLAConfig")


@contextlib.contextmanager
def config_source(source: str):
    """Names `source` (e.g. a config.json path) in the errors of the GLAConfigs made inside."""
    token = _SOURCE.set(source)
    try:
        yield
    finally:
        _SOURCE.reset(token)


def _got(value) -> str:
    return f"{value!r} ({type(value).__name__})"


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


# name: (kind, lowest, optional); kind "int" / "float" (any finite number) / "bool" / a tuple of the allowed
# strings; lowest: the smallest legal number (None: any), ">0": above zero.
_FIELD_RULES = {
    "vocab_size": ("int", 1, False), "hidden_size": ("int", 1, False), "num_hidden_layers": ("int", 1, False),
    "num_heads": ("int", 1, False), "num_kv_heads": ("int", 1, True), "expand_k": ("float", ">0", False),
    "expand_v": ("float", ">0", False), "gate_low_rank_dim": ("int", 1, False),
    "gate_logit_normalizer": ("float", ">0", False), "clamp_min": ("float", None, True),
    "use_output_gate": ("bool", None, False), "gate_fn": (("swish", "silu", "sigmoid"), None, False),
    "use_short_conv": ("bool", None, False), "conv_size": ("int", 1, False),
    "mode": (("chunk", "fused_recurrent"), None, False), "intermediate_size": ("int", 1, True),
    "norm_eps": ("float", ">0", False), "attn_num_heads": ("int", 1, True), "attn_num_kv_heads": ("int", 1, True),
    "attn_backend": (("flashgla", "sdpa"), None, False), "attn_deterministic": ("bool", None, False),
    "rope_theta": ("float", ">0", False),
    "tie_word_embeddings": ("bool", None, False), "initializer_range": ("float", 0, False),
}


def _check_field(name: str, value) -> None:
    """TypeError (wrong type) or ValueError (out of range) naming the field, what it takes and what it got."""
    kind, lowest, optional = _FIELD_RULES[name]
    if value is None:
        if optional:
            return
        raise TypeError(f"{name}: expected {'a bool' if kind == 'bool' else 'a value'}, got None")
    if isinstance(kind, tuple):
        if not isinstance(value, str):
            raise TypeError(f"{name}: expected one of {list(kind)}, got {_got(value)}")
        if value not in kind:
            raise ValueError(f"{name}: expected one of {list(kind)}, got {value!r}")
        return
    if kind == "bool":
        if not isinstance(value, bool):
            raise TypeError(f"{name}: expected true or false, got {_got(value)}")
        return
    whole = kind == "int"
    what = "an int" if whole else "a number"
    if lowest == ">0":
        what += " > 0"
    elif lowest is not None:
        what += f" >= {lowest}"
    if optional:
        what += " (or null)"
    if not (_is_int(value) if whole else _is_real(value)):
        raise TypeError(f"{name}: expected {what}, got {_got(value)}")
    if (lowest == ">0" and not value > 0) or (lowest not in (None, ">0") and value < lowest):
        raise ValueError(f"{name}: expected {what}, got {value!r}")


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
    attn_deterministic: bool = False         # flashgla's attention backward bitwise the same on every run
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = False
    initializer_range: float = 0.02

    def __post_init__(self):
        try:
            self._check()
        except (TypeError, ValueError) as error:
            raise type(error)(f"flashgla: {_SOURCE.get()}: {error}") from None

    def _check(self) -> None:
        """Field by field: type, then range (the messages name the field)."""
        for name in _FIELD_RULES:
            _check_field(name, getattr(self, name))
        if self.clamp_min is not None and self.clamp_min > 0:
            raise ValueError(f"clamp_min: expected a number <= 0 (a lower bound of the log gate) or null, got "
                             f"{self.clamp_min!r}")
        if isinstance(self.attn_layers, (str, bytes)) or not hasattr(self.attn_layers, "__iter__"):
            raise TypeError(f"attn_layers: expected a list of layer indices, got {_got(self.attn_layers)}")
        layers = list(self.attn_layers)
        wrong = [i for i in layers if not _is_int(i)]
        if wrong:
            raise TypeError(f"attn_layers: expected a list of layer indices (ints), got {layers}")
        self.attn_layers = sorted(int(i) for i in layers)
        bad = [i for i in self.attn_layers if not 0 <= i < self.num_hidden_layers]
        if bad:
            raise ValueError(f"attn_layers: {bad} are not layer indices 0..{self.num_hidden_layers - 1}")
        if len(set(self.attn_layers)) != len(self.attn_layers):
            raise ValueError(f"attn_layers: repeated indices: {self.attn_layers}")
        if self.intermediate_size is None:
            self.intermediate_size = -(-self.hidden_size * 8 // 3 // 64) * 64

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict, source: Optional[str] = None) -> "GLAConfig":
        """source: where the values come from (a config.json path), named in errors."""
        where = source or _SOURCE.get()
        if not isinstance(values, dict):
            raise TypeError(f"flashgla: {where}: expected a JSON object of config fields, got "
                            f"{type(values).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"flashgla: {where}: unknown GLAConfig fields: {unknown}")
        with config_source(where):
            return cls(**values)

    def to_json(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=2, sort_keys=True)
            f.write("\n")

    @classmethod
    def from_json(cls, path: str) -> "GLAConfig":
        return cls.from_dict(read_json(path), path)


def read_json(path: str):
    """The JSON value of a file; ValueError naming the file when it is not JSON text."""
    try:
        with open(path, "rb") as f:
            data = f.read()
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"flashgla: {path}: not a JSON file (not UTF-8 text: corrupt or of another "
                         "format)") from None
    except json.JSONDecodeError as error:
        what = "empty" if not data.strip() else f"not valid JSON ({error.msg} at line {error.lineno} column " \
                                               f"{error.colno})"
        raise ValueError(f"flashgla: {path}: {what}; expected a JSON object of config fields") from None
