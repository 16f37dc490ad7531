"""Reading checkpoints: safetensors and torch weight files (single or sharded), and the translation of
checkpoints written by flash-linear-attention's (FLA's) GLAForCausalLM (config.json with model_type "gla")
into flashgla's GLAConfig and parameter names.

Needs neither transformers nor the safetensors package: the safetensors format (an 8-byte header length,
a JSON header, raw little-endian tensor bytes) is read here directly.
"""

import json
import os
import pickle
import struct
import zipfile
from typing import Dict, Optional, Tuple

import torch
from torch import Tensor

from .config import GLAConfig, config_source

__all__ = ["FLA_MODEL_TYPE", "HF_MODEL_TYPE", "config_from_fla", "load_torch_file", "load_weights",
           "read_safetensors", "safetensors_problem", "state_dict_from_fla", "weights_problem"]

FLA_MODEL_TYPE = "gla"             # FLA's GLAConfig.model_type
HF_MODEL_TYPE = "flashgla_gla"     # flashgla's transformers model type (flashgla.models.hf)

_SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}


# A safetensors header longer than this is not a header (the format caps it at 100 MB).
_SAFETENSORS_MAX_HEADER = 100_000_000


def _starts_as(head: bytes) -> str:
    """What a file's first bytes say it is, for errors about files that are not what their name says."""
    if head.startswith(b"PK\x03\x04"):
        return "a zip archive (torch.save's format)"
    if head[:1] == b"\x80":
        return "a pickle (torch.save's legacy format)"
    if len(head) >= 9 and head[8:9] == b"{":
        return "a safetensors file"
    if head.lstrip()[:1] in (b"{", b"["):
        return "JSON text"
    if head.startswith(b"\x1f\x8b"):
        return "a gzip file"
    if head.startswith(b"GGUF"):
        return "a GGUF file"
    if head.lstrip()[:1] == b"<":
        return "HTML or XML text (a download error page?)"
    return "unknown bytes " + head[:8].hex(" ")


def _safetensors_layout(data: bytes, path: str):
    """(header, body) of a safetensors file's bytes; ValueError naming the file and saying whether it is
    truncated, corrupt or of another format."""
    if len(data) < 8:
        raise ValueError(f"flashgla: {path}: truncated: {len(data)} bytes, shorter than a safetensors file's "
                         "8-byte header length")
    (header_len,) = struct.unpack("<Q", data[:8])
    if header_len > _SAFETENSORS_MAX_HEADER or data[8:9] not in (b"{", b""):
        raise ValueError(f"flashgla: {path}: not a safetensors file (corrupt, or of another format: it starts as "
                         f"{_starts_as(data[:16])})")
    if 8 + header_len > len(data):
        raise ValueError(f"flashgla: {path}: truncated: its header needs {8 + header_len} bytes, the file has "
                         f"{len(data)}")
    try:
        header = json.loads(data[8:8 + header_len])
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ValueError(f"flashgla: {path}: corrupt: its safetensors header is not valid JSON") from None
    if not isinstance(header, dict):
        raise ValueError(f"flashgla: {path}: corrupt: its safetensors header is not a JSON object")
    body = memoryview(data)[8 + header_len:]
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, stop = (int(x) for x in info["data_offsets"])
            info["shape"], info["dtype"]
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"flashgla: {path}: corrupt: tensor {name!r} has no valid dtype, shape and "
                             "data_offsets in the header") from None
        if not 0 <= begin <= stop:
            raise ValueError(f"flashgla: {path}: corrupt: tensor {name!r} has data_offsets {[begin, stop]}")
        end = max(end, stop)
    if end > len(body):
        raise ValueError(f"flashgla: {path}: truncated: its tensors need {8 + header_len + end} bytes, the file "
                         f"has {len(data)}")
    return header, body


def safetensors_problem(path: str) -> Optional[str]:
    """Why the safetensors file at path cannot be read (truncated, corrupt, another format), or None."""
    try:
        with open(path, "rb") as f:
            _safetensors_layout(f.read(), path)
    except ValueError as error:
        return str(error)
    return None


def read_safetensors(path: str) -> Dict[str, Tensor]:
    """All tensors of a .safetensors file, on the CPU."""
    with open(path, "rb") as f:
        data = f.read()
    header, body = _safetensors_layout(data, path)
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = _SAFETENSORS_DTYPES.get(info["dtype"])
        if dtype is None:
            raise NotImplementedError(f"flashgla: {path}: tensor {name}: dtype {info['dtype']} is not supported")
        begin, end = info["data_offsets"]
        if end - begin == 0:
            tensors[name] = torch.empty(info["shape"], dtype=dtype)
        else:
            try:
                flat = torch.frombuffer(bytearray(body[begin:end]), dtype=dtype)
                tensors[name] = flat.reshape(info["shape"])
            except (ValueError, RuntimeError):
                raise ValueError(f"flashgla: {path}: corrupt: tensor {name!r}'s {end - begin} bytes do not hold "
                                 f"shape {info['shape']} of {info['dtype']}") from None
    return tensors


def torch_file_problem(path: str, error: Optional[BaseException] = None) -> str:
    """Why torch.load(path, weights_only=True) failed, in words: truncated, corrupt, of another format, or
    holding objects other than tensors."""
    size = os.path.getsize(path)
    if size == 0:
        return "truncated: the file is empty (0 bytes)"
    with open(path, "rb") as f:
        head = f.read(16)
    if head.startswith(b"PK\x03\x04"):
        if not zipfile.is_zipfile(path):
            return (f"truncated: a torch checkpoint (zip archive) without its end ({size} bytes, no central "
                    "directory), e.g. from an interrupted save or copy")
        try:
            with zipfile.ZipFile(path) as archive:
                bad = archive.testzip()
        except (zipfile.BadZipFile, OSError, EOFError) as zip_error:
            return f"corrupt: a torch checkpoint (zip archive) that cannot be read ({zip_error})"
        if bad is not None:
            return f"corrupt: a torch checkpoint (zip archive) whose member {bad} fails its checksum"
    if isinstance(error, pickle.UnpicklingError) and "unsupported global" in str(error).lower():
        return ("holds Python objects other than tensors, which a weights-only load refuses (a pickled model? save "
                "model.state_dict() instead)")
    if head[:1] == b"\x80":
        return f"truncated or corrupt: a legacy torch checkpoint (pickle) that does not load ({type(error).__name__})"
    if head.startswith(b"PK\x03\x04"):
        return f"corrupt: a torch checkpoint that does not load ({type(error).__name__})"
    return f"not a torch checkpoint: corrupt or of another format (it starts as {_starts_as(head)})"


def load_torch_file(path: str):
    """torch.load(path, weights_only=True) on the CPU, with a ValueError naming the file and saying whether it
    is truncated, corrupt or of another format (never torch's advice to load it unsafely)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (FileNotFoundError, IsADirectoryError, PermissionError):
        raise
    except Exception as error:  # torch raises RuntimeError, UnpicklingError, EOFError, ... by cause
        problem = torch_file_problem(path, error)
    raise ValueError(f"flashgla: {path}: {problem}")


def weights_problem(directory: str) -> Optional[str]:
    """Why a local checkpoint directory's weight files cannot be read, or None (used to explain the errors of
    loaders that do not name the file, e.g. transformers' safetensors reader)."""
    if not os.path.isdir(directory):
        return None
    names = []
    for single, index in (("model.safetensors", "model.safetensors.index.json"),
                          ("pytorch_model.bin", "pytorch_model.bin.index.json")):
        if os.path.exists(os.path.join(directory, single)):
            names.append(single)
        elif os.path.exists(os.path.join(directory, index)):
            try:
                with open(os.path.join(directory, index)) as f:
                    names += sorted(set(json.load(f)["weight_map"].values()))
            except (ValueError, KeyError, TypeError, AttributeError):
                return f"flashgla: {os.path.join(directory, index)}: corrupt: not a JSON index with a weight_map"
    for name in names:
        path = os.path.join(directory, name)
        if not os.path.exists(path):
            return f"flashgla: {path}: missing (named by the checkpoint's index)"
        if name.endswith(".safetensors"):
            problem = safetensors_problem(path)
            if problem is not None:
                return problem
        else:
            try:
                load_torch_file(path)
            except ValueError as error:
                return str(error)
    return None


def load_weights(directory: str) -> Dict[str, Tensor]:
    """The state dict of a transformers-style checkpoint directory: model.safetensors, a sharded
    model.safetensors.index.json, pytorch_model.bin or its sharded index."""
    def load(name: str) -> Dict[str, Tensor]:
        path = os.path.join(directory, name)
        if name.endswith(".safetensors"):
            return read_safetensors(path)
        return load_torch_file(path)

    for single, index in (("model.safetensors", "model.safetensors.index.json"),
                          ("pytorch_model.bin", "pytorch_model.bin.index.json")):
        if os.path.exists(os.path.join(directory, single)):
            return load(single)
        if os.path.exists(os.path.join(directory, index)):
            index_path = os.path.join(directory, index)
            try:
                with open(index_path) as f:
                    shards = sorted(set(json.load(f)["weight_map"].values()))
            except (ValueError, KeyError, TypeError, AttributeError):
                raise ValueError(f"flashgla: {index_path}: corrupt: expected a JSON object with a weight_map "
                                 "(tensor name -> shard file)") from None
            weights = {}
            for shard in shards:
                weights.update(load(shard))
            return weights
    raise FileNotFoundError(f"flashgla: {directory}: no model.safetensors, pytorch_model.bin or sharded index found")


# ---- FLA's GLA checkpoints ------------------------------------------------------------------------------

def _attn_spec(attn, num_layers: int) -> Tuple[list, Optional[dict]]:
    """FLA's `attn` entry (None, one dict, or a list of dicts) -> the attention layers and their shared
    settings; flashgla's config has one setting for all attention layers."""
    if attn is None:
        return [], None
    specs = [attn] if isinstance(attn, dict) else list(attn)
    layers, shared = [], None
    for spec in specs:
        if not isinstance(spec, dict) or "layers" not in spec or "num_heads" not in spec:
            raise ValueError(f"flashgla: config.json: attn: expected a dict with 'layers' and 'num_heads' "
                             f"(or a list of such dicts), got {attn!r}")
        if spec.get("qkv_bias", False):
            raise NotImplementedError("flashgla: config.json: attn.qkv_bias = true is not supported "
                                      "(flashgla's attention layer has no projection biases)")
        if spec.get("window_size") is not None:
            raise NotImplementedError("flashgla: config.json: attn.window_size: sliding-window attention "
                                      "is not supported")
        if spec.get("qk_norm", False):
            raise NotImplementedError("flashgla: config.json: attn.qk_norm = true is not supported")
        settings = (int(spec["num_heads"]), int(spec.get("num_kv_heads") or spec["num_heads"]),
                    float(spec.get("rope_theta", 10000.0) or 10000.0))
        if shared is not None and settings != shared:
            raise NotImplementedError("flashgla: config.json: attn: attention layers with different heads or "
                                      "rope_theta are not supported (one setting for all attention layers)")
        shared = settings
        layers += [int(i) for i in spec["layers"]]
    return layers, dict(attn_num_heads=shared[0], attn_num_kv_heads=shared[1], rope_theta=shared[2])


def config_from_fla(values: dict, source: str = "config.json") -> GLAConfig:
    """FLA's GLAConfig fields (config.json, model_type "gla") -> flashgla's GLAConfig; options flashgla's
    model cannot reproduce raise NotImplementedError naming the field; a field of the wrong type or range is
    a TypeError or ValueError naming it and `source` (the file)."""
    def get(name, default=None):
        value = values.get(name, default)
        return default if value is None else value

    def number(name, default, kind):
        """The field as an int / float; TypeError naming it when it is not a number (or not whole)."""
        value = get(name, default)
        whole = kind is int
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (whole and value != int(value)):
            raise TypeError(f"flashgla: {source}: {name}: expected {'an int' if whole else 'a number'}, got "
                            f"{value!r} ({type(value).__name__})")
        return kind(value)

    if "hidden_size" not in values:
        raise ValueError(f"flashgla: {source}: hidden_size: missing (FLA's config names the model width)")

    unsupported = [
        ("feature_map", get("feature_map") is not None, "a feature map on q and k"),
        ("attnres_block_size", get("attnres_block_size") is not None, "attention residuals"),
        ("elementwise_affine", get("elementwise_affine", True) is False, "norms without weights"),
    ]
    for name, bad, what in unsupported:
        if bad:
            raise NotImplementedError(f"flashgla: config.json: {name} = {values.get(name)!r} ({what}) is not "
                                      "supported by flashgla's GLA model")
    hidden_act = get("hidden_act", "swish")
    if hidden_act not in ("swish", "silu"):
        raise NotImplementedError(f"flashgla: config.json: hidden_act = {hidden_act!r}: the MLP supports "
                                  "'swish' (SwiGLU) only")
    hidden_size = number("hidden_size", None, int)
    if get("intermediate_size") is not None:
        intermediate_size = number("intermediate_size", None, int)
    else:  # FLA's GatedMLP: 2/3 of hidden_ratio * hidden_size, up to a multiple of 256
        ratio = number("hidden_ratio", 4, float)
        intermediate_size = 256 * ((int(hidden_size * ratio * 2 / 3) + 255) // 256)
    num_layers = number("num_hidden_layers", 24, int)
    with config_source(source):
        attn_layers, attn = _attn_spec(values.get("attn"), num_layers)
        mode = get("attn_mode", "chunk")
        return GLAConfig(
            vocab_size=number("vocab_size", 32000, int), hidden_size=hidden_size, num_hidden_layers=num_layers,
            num_heads=number("num_heads", 4, int), num_kv_heads=get("num_kv_heads"),
            expand_k=number("expand_k", 0.5, float), expand_v=number("expand_v", 1.0, float),
            # FLA's block leaves these two at the layer's defaults (16, 16) unless a config names them.
            gate_low_rank_dim=number("gate_low_rank_dim", 16, int),
            gate_logit_normalizer=number("gate_logit_normalizer", 16, float),
            clamp_min=get("clamp_min"), use_output_gate=bool(get("use_output_gate", True)),
            gate_fn="swish" if hidden_act == "silu" else hidden_act,
            use_short_conv=bool(get("use_short_conv", False)), conv_size=number("conv_size", 4, int),
            mode="fused_recurrent" if mode == "fused_recurrent" else "chunk",
            intermediate_size=intermediate_size, norm_eps=number("norm_eps", 1e-6, float),
            attn_layers=attn_layers, tie_word_embeddings=bool(get("tie_word_embeddings", False)),
            initializer_range=number("initializer_range", 0.02, float), **(attn or {}))


def state_dict_from_fla(weights: Dict[str, Tensor], config: GLAConfig) -> Dict[str, Tensor]:
    """FLA's parameter names and shapes -> flashgla's GLAForCausalLM state dict.

    model.embeddings -> embeddings, model.layers.N.* -> layers.N.*, model.norm -> norm; the GLA output
    norm (g_norm_swish_gate when fused, g_norm otherwise) -> attn.g_norm; the short convolutions
    q/k/v_conv1d ([C, 1, W] Conv1d weights) -> q/k/v_conv ([C, W]); a fused MLP gate_proj holding gate
    and up rows -> gate_proj + up_proj; tied embeddings give lm_head. Unknown names raise ValueError.
    """
    out = {}
    for name, tensor in weights.items():
        key = name[len("model."):] if name.startswith("model.") else name
        if key.endswith("rotary.inv_freq"):
            continue  # a buffer FLA recomputes; flashgla recomputes it too
        parts = key.split(".")
        if len(parts) > 3 and parts[0] == "layers" and parts[2] == "attn":
            if parts[3] == "g_norm_swish_gate":
                parts[3] = "g_norm"
            elif parts[3] in ("q_conv1d", "k_conv1d", "v_conv1d"):
                if parts[-1] == "bias":
                    raise NotImplementedError(f"flashgla: {name}: short convolutions with a bias are not supported")
                parts[3] = parts[3][0] + "_conv"
                tensor = tensor.reshape(tensor.shape[0], tensor.shape[-1])
        key = ".".join(parts)
        if key.endswith("mlp.gate_proj.weight") and tensor.shape[0] == 2 * config.intermediate_size:
            # older FLA: one projection holding the gate rows, then the up rows
            gate, up = tensor.chunk(2, dim=0)
            out[key] = gate
            out[key.replace("gate_proj", "up_proj")] = up
            continue
        out[key] = tensor
    if "lm_head.weight" not in out and config.tie_word_embeddings and "embeddings.weight" in out:
        out["lm_head.weight"] = out["embeddings.weight"]
    return out
