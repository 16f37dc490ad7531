"""Reading checkpoints: safetensors and torch weight files (single or sharded), and the translation of
checkpoints written by flash-linear-attention's (FLA's) GLAForCausalLM (config.json with model_type "gla")
into flashgla's GLAConfig and parameter names.

Needs neither transformers nor the safetensors package: the safetensors format (an 8-byte header length,
a JSON header, raw little-endian tensor bytes) is read here directly.
"""

import json
import os
import struct
from typing import Dict, Optional, Tuple

import torch
from torch import Tensor

from .config import GLAConfig

__all__ = ["FLA_MODEL_TYPE", "HF_MODEL_TYPE", "config_from_fla", "load_weights", "read_safetensors",
           "state_dict_from_fla"]

FLA_MODEL_TYPE = "gla"             # FLA's GLAConfig.model_type
HF_MODEL_TYPE = "flashgla_gla"     # flashgla's transformers model type (flashgla.models.hf)

_SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}


def read_safetensors(path: str) -> Dict[str, Tensor]:
    """All tensors of a .safetensors file, on the CPU."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"flashgla: {path}: not a safetensors file (shorter than its header length)")
    (header_len,) = struct.unpack("<Q", data[:8])
    if 8 + header_len > len(data):
        raise ValueError(f"flashgla: {path}: not a safetensors file (header length {header_len} past the end)")
    header = json.loads(data[8:8 + header_len])
    body = memoryview(data)[8 + header_len:]
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
            flat = torch.frombuffer(bytearray(body[begin:end]), dtype=dtype)
            tensors[name] = flat.reshape(info["shape"])
    return tensors


def load_weights(directory: str) -> Dict[str, Tensor]:
    """The state dict of a transformers-style checkpoint directory: model.safetensors, a sharded
    model.safetensors.index.json, pytorch_model.bin or its sharded index."""
    def load(name: str) -> Dict[str, Tensor]:
        path = os.path.join(directory, name)
        if name.endswith(".safetensors"):
            return read_safetensors(path)
        return torch.load(path, map_location="cpu", weights_only=True)

    for single, index in (("model.safetensors", "model.safetensors.index.json"),
                          ("pytorch_model.bin", "pytorch_model.bin.index.json")):
        if os.path.exists(os.path.join(directory, single)):
            return load(single)
        if os.path.exists(os.path.join(directory, index)):
            with open(os.path.join(directory, index)) as f:
                shards = sorted(set(json.load(f)["weight_map"].values()))
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


def config_from_fla(values: dict) -> GLAConfig:
    """FLA's GLAConfig fields (config.json, model_type "gla") -> flashgla's GLAConfig; options flashgla's
    model cannot reproduce raise NotImplementedError naming the field."""
    def get(name, default=None):
        value = values.get(name, default)
        return default if value is None else value

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
    hidden_size = int(values["hidden_size"])
    intermediate_size = get("intermediate_size")
    if intermediate_size is None:  # FLA's GatedMLP: 2/3 of hidden_ratio * hidden_size, up to a multiple of 256
        ratio = get("hidden_ratio", 4)
        intermediate_size = 256 * ((int(hidden_size * ratio * 2 / 3) + 255) // 256)
    num_layers = int(get("num_hidden_layers", 24))
    attn_layers, attn = _attn_spec(values.get("attn"), num_layers)
    mode = get("attn_mode", "chunk")
    return GLAConfig(
        vocab_size=int(get("vocab_size", 32000)), hidden_size=hidden_size, num_hidden_layers=num_layers,
        num_heads=int(get("num_heads", 4)), num_kv_heads=get("num_kv_heads"),
        expand_k=float(get("expand_k", 0.5)), expand_v=float(get("expand_v", 1.0)),
        # FLA's block leaves these two at the layer's defaults (16, 16) unless a config names them.
        gate_low_rank_dim=int(get("gate_low_rank_dim", 16)),
        gate_logit_normalizer=float(get("gate_logit_normalizer", 16)),
        clamp_min=get("clamp_min"), use_output_gate=bool(get("use_output_gate", True)),
        gate_fn="swish" if hidden_act == "silu" else hidden_act,
        use_short_conv=bool(get("use_short_conv", False)), conv_size=int(get("conv_size", 4)),
        mode="fused_recurrent" if mode == "fused_recurrent" else "chunk",
        intermediate_size=int(intermediate_size), norm_eps=float(get("norm_eps", 1e-6)),
        attn_layers=attn_layers, tie_word_embeddings=bool(get("tie_word_embeddings", False)),
        initializer_range=float(get("initializer_range", 0.02)), **(attn or {}))


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
