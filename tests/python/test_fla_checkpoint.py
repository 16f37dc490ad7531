"""Loading checkpoints written by flash-linear-attention's (FLA's) GLAForCausalLM: a small script here
writes FLA's layout by hand (config.json with FLA's field names and model_type "gla", a state dict with
FLA's parameter names and shapes) from the weights of a flashgla model built the normal way;
GLAForCausalLM.from_pretrained must then give that model's logits. Every weight is randomized, so a
wrong or swapped mapping fails. CPU, tiny sizes."""

import json

import pytest

torch = pytest.importorskip("torch")

from flashgla.models import GLAConfig, GLAForCausalLM  # noqa: E402
from flashgla.models.checkpoint import read_safetensors  # noqa: E402


def rel_error(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


HIDDEN = 32


def fla_intermediate_size(hidden, ratio=4):
    """FLA's GatedMLP default width, written out independently of flashgla's loader."""
    return 256 * ((int(hidden * ratio * 2 / 3) + 255) // 256)


CASES = {
    # short conv, output gate fused into the norm (FLA's g_norm_swish_gate), a hybrid attention layer
    # with grouped KV heads, grouped GLA heads, tied embeddings, the MLP width from hidden_ratio
    "fused": dict(fla=dict(use_short_conv=True, conv_size=4, fuse_norm=True, num_kv_heads=1,
                           attn={"layers": [1], "num_heads": 4, "num_kv_heads": 2, "rope_theta": 5000.0},
                           tie_word_embeddings=True, hidden_ratio=4, intermediate_size=None),
                  ours=dict(use_short_conv=True, conv_size=4, num_kv_heads=1, attn_layers=[1], attn_num_heads=4,
                            attn_num_kv_heads=2, rope_theta=5000.0, tie_word_embeddings=True,
                            intermediate_size=fla_intermediate_size(HIDDEN))),
    # no output gate (plain RMSNorm g_norm), clamp_min, untied head, explicit MLP width, fused_chunk mode
    "plain": dict(fla=dict(use_output_gate=False, clamp_min=-0.05, fuse_norm=False, intermediate_size=48,
                           attn_mode="fused_chunk", tie_word_embeddings=False, norm_eps=1e-5),
                  ours=dict(use_output_gate=False, clamp_min=-0.05, intermediate_size=48, norm_eps=1e-5)),
}


def fla_config_json(fla_options):
    values = dict(model_type="gla", architectures=["GLAForCausalLM"], vocab_size=40, hidden_size=HIDDEN,
                  num_hidden_layers=3, num_heads=2, num_kv_heads=None, expand_k=0.5, expand_v=1.0, hidden_ratio=4,
                  intermediate_size=None, feature_map=None, attn_mode="chunk", use_short_conv=False, conv_size=4,
                  use_output_gate=True, clamp_min=None, hidden_act="swish", max_position_embeddings=2048,
                  elementwise_affine=True, norm_eps=1e-6, use_gk=True, use_gv=False, attn=None, use_cache=True,
                  pad_token_id=None, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
                  initializer_range=0.02, fuse_norm=True, fuse_swiglu=True, fuse_cross_entropy=True,
                  torch_dtype="float32", transformers_version="4.56.0")
    values.update(fla_options)
    return values


def fla_state_dict(model, config_values):
    """flashgla's weights under FLA's names and shapes (written out by hand, not by the loader)."""
    out = {}
    for name, tensor in model.state_dict().items():
        tensor = tensor.clone()
        if name == "lm_head.weight":
            if config_values["tie_word_embeddings"]:
                continue  # FLA's save_pretrained drops the tied head
            out[name] = tensor
            continue
        fla = "model." + name
        if ".attn.g_norm." in name and config_values["use_output_gate"] and config_values["fuse_norm"]:
            fla = fla.replace(".g_norm.", ".g_norm_swish_gate.")
        for proj in ("q", "k", "v"):
            if f".attn.{proj}_conv.weight" in name:
                fla = fla.replace(f"{proj}_conv", f"{proj}_conv1d")
                tensor = tensor.unsqueeze(1)  # nn.Conv1d depthwise weight [C, 1, W]
        out[fla] = tensor
    return out


def randomized(model):
    """Every parameter random (norm weights too), so no two weights are interchangeable."""
    torch.manual_seed(21)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.3 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5)
    return model


@pytest.mark.parametrize("fmt", ["bin", "safetensors"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_fla_checkpoint_gives_the_logits_of_the_same_weights(tmp_path, case, fmt):
    values = fla_config_json(CASES[case]["fla"])
    config = GLAConfig(vocab_size=40, hidden_size=HIDDEN, num_hidden_layers=3, num_heads=2,
                       **CASES[case]["ours"])
    torch.manual_seed(20)
    model = randomized(GLAForCausalLM(config).double().eval())
    state = fla_state_dict(model, values)
    (tmp_path / "config.json").write_text(json.dumps(values))
    if fmt == "bin":
        torch.save(state, tmp_path / "pytorch_model.bin")
    else:
        safetensors = pytest.importorskip("safetensors.torch", reason="the safetensors package writes the file")
        safetensors.save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "model.safetensors"))
        assert torch.equal(read_safetensors(str(tmp_path / "model.safetensors"))["model.norm.weight"],
                           state["model.norm.weight"])

    loaded = GLAForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float64).eval()
    assert loaded.config == config
    if config.tie_word_embeddings:
        assert loaded.lm_head.weight.data_ptr() == loaded.embeddings.weight.data_ptr()
    ids = torch.randint(0, 40, (2, 11), generator=torch.Generator().manual_seed(22))
    with torch.no_grad():
        expected = model(ids).logits
        got = torch.full_like(expected, float("nan"))
        got.copy_(loaded(ids).logits)
    assert rel_error(got, expected) < 1e-12


def test_fused_mlp_projection_of_older_fla_versions_is_split(tmp_path):
    values = fla_config_json(dict(intermediate_size=48))
    config = GLAConfig(vocab_size=40, hidden_size=HIDDEN, num_hidden_layers=3, num_heads=2, intermediate_size=48)
    model = randomized(GLAForCausalLM(config).double().eval())
    state = fla_state_dict(model, values)
    for i in range(3):  # one projection: the gate rows, then the up rows
        prefix = f"model.layers.{i}.mlp"
        gate, up = state.pop(f"{prefix}.gate_proj.weight"), state.pop(f"{prefix}.up_proj.weight")
        state[f"{prefix}.gate_proj.weight"] = torch.cat([gate, up])
    (tmp_path / "config.json").write_text(json.dumps(values))
    torch.save(state, tmp_path / "pytorch_model.bin")
    loaded = GLAForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float64).eval()
    ids = torch.randint(0, 40, (1, 7))
    with torch.no_grad():
        assert rel_error(loaded(ids).logits, model(ids).logits) < 1e-12


@pytest.mark.parametrize("change, error, message", [
    (dict(feature_map="relu"), NotImplementedError, "feature_map"),
    (dict(hidden_act="powlu"), NotImplementedError, "hidden_act"),
    (dict(attn={"layers": [0], "num_heads": 2, "window_size": 64}), NotImplementedError, "window_size"),
    (dict(attn={"layers": [0], "num_heads": 2, "qkv_bias": True}), NotImplementedError, "qkv_bias"),
    (dict(hidden_size=64), ValueError, "wrong shapes"),
])
def test_unsupported_or_mismatched_fla_checkpoints_raise_clear_errors(tmp_path, change, error, message):
    values = fla_config_json(dict(intermediate_size=48))
    model = GLAForCausalLM(GLAConfig(vocab_size=40, hidden_size=HIDDEN, num_hidden_layers=3, num_heads=2,
                                     intermediate_size=48))
    torch.save(fla_state_dict(model, values), tmp_path / "pytorch_model.bin")
    values.update(change)
    (tmp_path / "config.json").write_text(json.dumps(values))
    with pytest.raises(error, match=message):
        GLAForCausalLM.from_pretrained(str(tmp_path))


def test_sharded_safetensors_checkpoint(tmp_path):
    safetensors = pytest.importorskip("safetensors.torch", reason="the safetensors package writes the files")
    values = fla_config_json(dict(intermediate_size=48, tie_word_embeddings=True))
    config = GLAConfig(vocab_size=40, hidden_size=HIDDEN, num_hidden_layers=3, num_heads=2, intermediate_size=48,
                       tie_word_embeddings=True)
    model = randomized(GLAForCausalLM(config).to(torch.bfloat16).eval())
    state = fla_state_dict(model, values)
    names = sorted(state)
    shards = {"model-00001-of-00002.safetensors": names[:len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    for file, keys in shards.items():
        safetensors.save_file({k: state[k].contiguous() for k in keys}, str(tmp_path / file))
    weight_map = {k: file for file, keys in shards.items() for k in keys}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (tmp_path / "config.json").write_text(json.dumps(values))
    loaded = GLAForCausalLM.from_pretrained(str(tmp_path), dtype=torch.bfloat16).eval()
    for name, tensor in model.state_dict().items():  # bf16 weights arrive bit for bit
        assert torch.equal(loaded.state_dict()[name], tensor), name
