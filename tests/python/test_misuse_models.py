"""Misuses of the layers and models (issue 27): broken checkpoint files, bad config fields, generate's
arguments, a state from another batch. Each error names the argument or the file and what was expected."""

import json
import os
import re

import pytest
import torch

from flashgla.models import GLAConfig, GLAForCausalLM
from flashgla.nn import GatedLinearAttention


def raises(kind, *fragments):
    return pytest.raises(kind, match="(?s)" + "".join(f"(?=.*{re.escape(f)})" for f in fragments))


def tiny_model(**options):
    torch.manual_seed(0)
    return GLAForCausalLM(GLAConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_heads=2, **options))


@pytest.fixture
def checkpoint(tmp_path):
    """A saved flashgla checkpoint directory (config.json + model.pt) and its model."""
    model = tiny_model()
    model.save_pretrained(str(tmp_path))
    return tmp_path, model


# ---- model.pt ------------------------------------------------------------------------------------------

def test_a_truncated_model_pt_is_named_and_called_truncated(checkpoint):
    directory, _ = checkpoint
    path = directory / "model.pt"
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])
    with raises(ValueError, f"flashgla: {path}: truncated", "zip archive"):
        GLAForCausalLM.from_pretrained(str(directory))


def test_random_bytes_in_model_pt_are_named_without_unsafe_advice(checkpoint):
    directory, _ = checkpoint
    path = directory / "model.pt"
    path.write_bytes(bytes(range(7, 256)) * 16)
    with pytest.raises(ValueError) as error:
        GLAForCausalLM.from_pretrained(str(directory))
    message = str(error.value)
    assert message.startswith(f"flashgla: {path}: not a torch checkpoint: corrupt or of another format"), message
    # nothing chained either: torch.load's own message advises weights_only=False
    assert "weights_only=False" not in message and error.value.__cause__ is None and error.value.__context__ is None


def test_another_format_in_model_pt_is_named(checkpoint):
    directory, _ = checkpoint
    path = directory / "model.pt"
    path.write_text('{"not": "weights"}')
    with raises(ValueError, f"flashgla: {path}:", "of another format", "JSON text"):
        GLAForCausalLM.from_pretrained(str(directory))


def test_a_pickled_model_is_refused_weights_only(checkpoint):
    directory, model = checkpoint
    path = directory / "model.pt"
    torch.save(model, path)  # the model object, not its state dict
    with raises(ValueError, f"flashgla: {path}:", "other than tensors", "state_dict()"):
        GLAForCausalLM.from_pretrained(str(directory))


def test_an_intact_checkpoint_still_loads(checkpoint):
    directory, model = checkpoint
    loaded = GLAForCausalLM.from_pretrained(str(directory))
    ids = torch.randint(0, 50, (1, 7))
    assert torch.equal(loaded(ids).logits, model(ids).logits)


# ---- config.json ----------------------------------------------------------------------------------------

def test_a_config_that_is_not_json_is_named(checkpoint):
    directory, _ = checkpoint
    path = directory / "config.json"
    path.write_text("{hidden_size: 32")
    with raises(ValueError, f"flashgla: {path}: not valid JSON", "line 1 column 2"):
        GLAForCausalLM.from_pretrained(str(directory))
    path.write_text("[1, 2]")
    with raises(ValueError, f"flashgla: {path}: expected a JSON object", "list"):
        GLAForCausalLM.from_pretrained(str(directory))


@pytest.mark.parametrize("field, value, error, expected", [
    ("hidden_size", "big", TypeError, "hidden_size: expected an int >= 1, got 'big' (str)"),
    ("hidden_size", [32], TypeError, "hidden_size: expected an int >= 1, got [32] (list)"),
    ("hidden_size", 0, ValueError, "hidden_size: expected an int >= 1, got 0"),
    ("num_heads", 2.5, TypeError, "num_heads: expected an int >= 1, got 2.5 (float)"),
    ("norm_eps", -1.0, ValueError, "norm_eps: expected a number > 0, got -1.0"),
    ("mode", "fast", ValueError, "mode: expected one of ['chunk', 'fused_recurrent'], got 'fast'"),
    ("use_short_conv", "yes", TypeError, "use_short_conv: expected true or false, got 'yes' (str)"),
    ("clamp_min", 1.0, ValueError, "clamp_min: expected a number <= 0"),
    ("attn_layers", [7], ValueError, "attn_layers: [7] are not layer indices 0..1"),
    ("attn_layers", "0", TypeError, "attn_layers: expected a list of layer indices"),
])
def test_config_fields_are_checked_by_name_and_file(checkpoint, field, value, error, expected):
    directory, _ = checkpoint
    path = directory / "config.json"
    values = json.loads(path.read_text())
    values[field] = value
    path.write_text(json.dumps(values))
    with raises(error, f"flashgla: {path}: {expected}"):
        GLAForCausalLM.from_pretrained(str(directory))
    with raises(error, f"flashgla: GLAConfig: {expected}"):
        GLAConfig(**{**values, field: value})


def test_fla_config_fields_are_checked_by_name_and_file(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "gla", "hidden_size": "big", "num_hidden_layers": 2}))
    with raises(TypeError, f"flashgla: {path}: hidden_size: expected an int, got 'big' (str)"):
        GLAForCausalLM.from_pretrained(str(tmp_path))
    path.write_text(json.dumps({"model_type": "gla", "hidden_size": 32, "num_hidden_layers": [2]}))
    with raises(TypeError, f"flashgla: {path}: num_hidden_layers: expected an int, got [2] (list)"):
        GLAForCausalLM.from_pretrained(str(tmp_path))


# ---- safetensors ------------------------------------------------------------------------------------------

@pytest.fixture
def hf_checkpoint(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("safetensors")
    from flashgla.models.hf import FlashGLAConfig, FlashGLAForCausalLM

    model = FlashGLAForCausalLM(FlashGLAConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_heads=2))
    model.save_pretrained(str(tmp_path))
    assert (tmp_path / "model.safetensors").exists()
    return tmp_path


@pytest.mark.parametrize("keep", [4, 100, "half"])
def test_a_truncated_safetensors_file_is_named_through_transformers(hf_checkpoint, keep):
    from transformers import AutoModelForCausalLM

    path = hf_checkpoint / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2 if keep == "half" else keep])
    with raises(ValueError, f"flashgla: {path}: truncated"):
        AutoModelForCausalLM.from_pretrained(str(hf_checkpoint))
    with raises(ValueError, f"flashgla: {path}: truncated"):  # flashgla's own loader says the same
        GLAForCausalLM.from_pretrained(str(hf_checkpoint))


def test_a_safetensors_file_of_another_format_is_named(hf_checkpoint):
    from transformers import AutoModelForCausalLM

    path = hf_checkpoint / "model.safetensors"
    path.write_bytes(b"PK\x03\x04" + bytes(200))
    with raises(ValueError, f"flashgla: {path}: not a safetensors file", "zip archive"):
        AutoModelForCausalLM.from_pretrained(str(hf_checkpoint))


def test_a_bad_field_through_transformers_names_the_field(hf_checkpoint):
    from transformers import AutoModelForCausalLM

    path = hf_checkpoint / "config.json"
    values = json.loads(path.read_text())
    values["hidden_size"] = "big"
    path.write_text(json.dumps(values))
    with raises(TypeError, "flashgla: FlashGLAConfig", "config.json", "hidden_size: expected an int >= 1, got 'big'"):
        AutoModelForCausalLM.from_pretrained(str(hf_checkpoint))


# ---- generate ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [2.5, "3", True, None])
def test_max_new_tokens_must_be_an_int(value):
    model = tiny_model()
    with raises(TypeError, "flashgla: max_new_tokens: expected an int >= 0", repr(value)):
        model.generate(torch.zeros(1, 3, dtype=torch.long), value)
    with raises(ValueError, "flashgla: max_new_tokens: expected an int >= 0, got -1"):
        model.generate(torch.zeros(1, 3, dtype=torch.long), -1)


def test_eos_token_id_must_be_in_the_vocabulary():
    model = tiny_model()
    prompt = torch.zeros(1, 3, dtype=torch.long)
    with raises(ValueError, "flashgla: eos_token_id: 999 is outside the vocabulary", "[0, 50)"):
        model.generate(prompt, 4, eos_token_id=999)
    with raises(ValueError, "flashgla: eos_token_id: -1 is outside the vocabulary"):
        model.generate(prompt, 4, eos_token_id=-1)
    with raises(TypeError, "flashgla: eos_token_id: expected one token id (an int) or None", "[1, 2]"):
        model.generate(prompt, 4, eos_token_id=[1, 2])
    assert model.generate(prompt, 4, eos_token_id=49).shape == (1, 7)


def test_generate_progress_prints_to_stderr(capsys):
    model = tiny_model()
    model.PROGRESS_EVERY = 4
    prompt = torch.zeros(2, 3, dtype=torch.long)
    quiet = model.generate(prompt, 10)
    assert capsys.readouterr().err == ""
    loud = model.generate(prompt, 10, progress=True)
    lines = capsys.readouterr().err.strip().splitlines()
    assert torch.equal(quiet, loud)
    assert [line.split(" tokens")[0] for line in lines] == ["generate: 4/10", "generate: 8/10", "generate: 10/10"]
    assert all("2 sequences" in line and "tokens/s" in line for line in lines), lines


# ---- a layer's state from another batch --------------------------------------------------------------------

def test_a_state_from_another_batch_is_named_state():
    torch.manual_seed(0)
    layer = GatedLinearAttention(hidden_size=32, num_heads=2)
    with torch.no_grad():
        _, state = layer(torch.randn(4, 5, 32), use_cache=True)
        for tokens in (1, 3):  # the decode path and the chunked path
            with pytest.raises(ValueError) as error:
                layer(torch.randn(2, tokens, 32), state=state, use_cache=True)
            message = str(error.value)
            assert message.startswith("flashgla: state: expected state.recurrent of shape [N, H, K, V] = "
                                      "[2, 2, 8, 16]"), message
            assert "got [4, 2, 8, 16]" in message and "initial_state" not in message, message


def test_the_model_names_a_cache_from_another_batch():
    model = tiny_model()
    with torch.no_grad():
        cache = model(torch.zeros(3, 4, dtype=torch.long), use_cache=True).cache
        with raises(ValueError, "flashgla: state:", "for this call's 1 sequences", "got [3, "):
            model(torch.zeros(1, 1, dtype=torch.long), cache=cache, use_cache=True)
