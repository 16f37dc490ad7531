"""flashgla: gated linear attention (GLA) and FlashAttention kernels.

The ops take and return torch tensors, with the names and semantics of
flash-linear-attention (FLA), so swapping the import is enough::

    from flashgla import chunk_gla
    o, ht = chunk_gla(q, k, v, g, output_final_state=True)

CPU tensors run on the CPU backend, CUDA tensors on the CUDA backend (on the
current stream). The ops need torch >= 2.4; `import flashgla` itself does not.
"""

try:
    from . import _C
except ImportError as error:  # pragma: no cover - depends on how flashgla was installed
    raise ImportError(
        "flashgla's compiled extension flashgla._C could not be loaded "
        f"({error}). Install the package with `pip install .` from the flashgla "
        "repository (this builds the C++ library and the extension); importing "
        "the python/ folder of a source checkout does not work."
    ) from error

__version__ = _C.__version__

_OPS = (
    "chunk_gla",
    "fused_recurrent_gla",
    "chunk_simple_gla",
    "chunk_linear_attn",
    "fused_recurrent_simple_gla",
    "fused_chunk_linear_attn",
    "fused_recurrent_linear_attn",
    "gla_decode_step",
    "chunk_gla_segment_states",
    "chunk_gla_segment_state_grads",
    "gla_prefill",
    "flash_attention",
    "flash_attention_with_kvcache",
)

MIN_TORCH = (2, 4)


def cuda_available() -> bool:
    """True when this build has the CUDA backend and a CUDA device is visible."""
    return _C.cuda_available()


def _torch_problem():
    """Why the PyTorch ops cannot load here, or None when they can."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    version = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
    if version < MIN_TORCH:
        return f"found torch {torch.__version__}"
    return None


_problem = _torch_problem()
if _problem is None:
    from .ops import (chunk_gla, chunk_gla_segment_state_grads, chunk_gla_segment_states, chunk_linear_attn,
                      chunk_simple_gla, flash_attention, flash_attention_with_kvcache, fused_chunk_linear_attn,
                      fused_recurrent_gla, fused_recurrent_linear_attn, fused_recurrent_simple_gla, gla_decode_step,
                      gla_prefill)

    # transformers' AutoModelForCausalLM learns the "flashgla_gla" model type when transformers is (or
    # gets) imported; flashgla itself never imports transformers (see _hf_hook).
    from . import _hf_hook

    _hf_hook.install()


def __getattr__(name):
    if name in _OPS:
        raise ImportError(
            f"flashgla.{name} is a PyTorch op and needs torch >= {MIN_TORCH[0]}.{MIN_TORCH[1]} "
            f"({_problem}). Install the torch build that fits your machine "
            "(https://pytorch.org/get-started/locally/), then use flashgla again."
        )
    raise AttributeError(f"module 'flashgla' has no attribute {name!r}")


__all__ = ["__version__", "cuda_available", *_OPS]
