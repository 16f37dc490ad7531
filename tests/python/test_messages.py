"""Issue 14: messages that name the real mistake. Each case is a mistake a new user makes (the batch
dimension left out, FLA's argument order, a token id outside the vocabulary, an empty prompt, a host
copy of cu_seqlens that disagrees, a gradient of a gradient) and must raise a clear error naming the
argument. CPU only, tiny sizes."""

import os
import re
import subprocess
import sys

import pytest
import torch

import flashgla
from flashgla.ops import norm as ops_norm
from flashgla.models import GLAConfig, GLAForCausalLM
from testing_utils import cu, gla_inputs, requires_gpu

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def raises(kind, *fragments):
    return pytest.raises(kind, match="(?s)" + "".join(f"(?=.*{re.escape(f)})" for f in fragments))


def inputs(gen, T=21, H=2, K=8, V=16, gate="vector", requires_grad=False):
    q, k, v, g, h0 = gla_inputs(gen, 1, T, H, K, V, gate=gate, dtype=torch.float32)
    if requires_grad:
        for t in (q, k, v, g):
            t.requires_grad_()
    return q, k, v, g, h0


# ---- the batch dimension left out -----------------------------------------------------------------

@pytest.mark.parametrize("op", ["chunk_gla", "fused_recurrent_gla", "chunk_simple_gla"])
def test_three_dimensional_inputs_blame_q_not_the_gate(gen, op):
    q, k, v, g, _ = inputs(gen, gate="scalar" if op == "chunk_simple_gla" else "vector")
    q3, k3, v3, g3 = q[0], k[0], v[0], g[0]  # [T, H, K] as FLA's head-first-free callers sometimes pass
    with pytest.raises(ValueError) as error:
        getattr(flashgla, op)(q3, k3, v3, g3)
    message = str(error.value)
    assert message.startswith("flashgla: q:"), message
    assert "batch dimension B missing" in message and str(list(q3.shape)) in message, message


# ---- FLA's chunk_linear_attn(q, k, v, g) --------------------------------------------------------------

def test_tensor_in_the_scale_slot_is_a_type_error_naming_scale(gen):
    q, k, v, g, _ = inputs(gen)
    with raises(TypeError, "flashgla: scale:", "chunk_linear_attn", "no gate", str(list(g.shape))):
        flashgla.chunk_linear_attn(q, k, v, g)
    with raises(TypeError, "flashgla: scale:", "chunk_gla"):
        flashgla.chunk_gla(q, k, v, g, torch.zeros(1, 2, 3))
    with raises(TypeError, "flashgla: scale:", "str"):
        flashgla.chunk_gla(q, k, v, g, scale="0.5")
    # A scale is a number; a 0-d tensor too is refused (it would get no gradient).
    with raises(TypeError, "flashgla: scale:", "0-d tensor", "float(scale)"):
        flashgla.chunk_linear_attn(q, k, v, torch.tensor(0.25))


# ---- cu_seqlens_host that contradicts cu_seqlens --------------------------------------------------------

def test_cu_seqlens_host_contradicting_cu_seqlens_on_the_cpu(gen):
    q, k, v, g, _ = inputs(gen, T=21)
    cu_seqlens = cu([5, 9, 7])
    wrong = cu([6, 8, 7], dtype=torch.int64)  # valid on its own, but not a copy
    for op in (flashgla.chunk_gla, flashgla.fused_recurrent_gla):
        with raises(ValueError, "flashgla: cu_seqlens_host:", "differs at index 1"):
            op(q, k, v, g, cu_seqlens=cu_seqlens, cu_seqlens_host=wrong)
        op(q, k, v, g, cu_seqlens=cu_seqlens, cu_seqlens_host=cu_seqlens.clone())  # a true copy passes


# ---- double backward ----------------------------------------------------------------------------------

@pytest.mark.parametrize("op", ["chunk_gla", "fused_recurrent_gla", "chunk_linear_attn", "flash_attention"])
def test_double_backward_says_it_is_not_supported(gen, op):
    q, k, v, g, _ = inputs(gen, requires_grad=True)
    if op == "chunk_gla":
        o, _ = flashgla.chunk_gla(q, k, v, g)
    elif op == "fused_recurrent_gla":
        o, _ = flashgla.fused_recurrent_gla(q, k, v, g)
    elif op == "chunk_linear_attn":
        o, _ = flashgla.chunk_linear_attn(q, k, v)
    else:
        o = flashgla.flash_attention(q, k, v)
    (dq,) = torch.autograd.grad(o.square().sum(), q, create_graph=True)
    assert torch.isfinite(dq).all()  # the first-order gradient itself works
    with raises(NotImplementedError, f"flashgla: {op}:", "double backward is not supported"):
        dq.square().sum().backward()


def test_double_backward_of_the_norm_and_gate_ops(gen):
    x = torch.randn(2, 5, 8, generator=gen, requires_grad=True)
    for name, y in (("rms_norm_gated", ops_norm.rms_norm(x)),
                    ("logsigmoid_gate", ops_norm.logsigmoid_gate(x))):
        (dx,) = torch.autograd.grad(y.square().sum(), x, create_graph=True)
        with raises(NotImplementedError, f"flashgla: {name}:", "double backward"):
            dx.sum().backward()


# ---- the model: token ids and prompts ---------------------------------------------------------------------

def tiny_model(vocab_size=40):
    torch.manual_seed(0)
    return GLAForCausalLM(GLAConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=1,
                                    num_heads=2)).eval()


@pytest.mark.parametrize("bad", ["too_large", "negative"])
def test_token_id_outside_the_vocabulary_names_id_and_size(gen, bad):
    vocab_size = int(torch.randint(20, 60, (1,), generator=gen))
    model = tiny_model(vocab_size)
    ids = torch.randint(0, vocab_size, (2, 9), generator=gen)
    wrong = vocab_size + int(torch.randint(0, 5, (1,), generator=gen)) if bad == "too_large" else -1
    ids[1, 4] = wrong
    with raises(ValueError, "flashgla: input_ids:", f"token id {wrong}", "[1, 4]", f"[0, {vocab_size})"):
        model(ids)
    with raises(ValueError, "flashgla: input_ids:", f"token id {wrong}", f"vocab_size = {vocab_size}"):
        model.generate(ids, 3)


def test_empty_prompt_to_generate(gen):
    model = tiny_model()
    for shape in ((1, 0), (3, 0)):
        with raises(ValueError, "flashgla: input_ids:", "at least one token", str(list(shape))):
            model.generate(torch.zeros(shape, dtype=torch.long), 5)


def run_example(script, *args):
    return subprocess.run([sys.executable, os.path.join(REPO, "examples", script), *args], capture_output=True,
                          text=True, timeout=120)


def test_empty_prompt_to_the_examples(tmp_path):
    result = run_example("sample.py", str(tmp_path), "--prompt", "")
    assert result.returncode == 2, result.stderr
    assert "--prompt is empty" in result.stderr and "Traceback" not in result.stderr, result.stderr
    result = run_example("train_gla_lm.py", "--prompt", "", "--out", str(tmp_path))
    assert result.returncode == 2, result.stderr
    assert "--prompt is empty" in result.stderr and "Traceback" not in result.stderr, result.stderr


# ---- a fresh environment -----------------------------------------------------------------------------------

def test_import_prints_no_warning():
    """`import flashgla` (and its ops, and the model) warns about nothing: every warning is an error here."""
    code = "import flashgla, flashgla.nn, flashgla.models, flashgla.ops.norm, flashgla.distributed, flashgla.parallel"
    result = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stderr == "", result.stderr


def test_numpy_is_installed_with_flashgla():
    """torch prints "Failed to initialize NumPy" on every import where numpy is missing (its CPU wheels do
    not install it), so flashgla depends on numpy: a fresh environment of torch and flashgla imports quietly."""
    import importlib.metadata
    requirements = importlib.metadata.requires("flashgla") or []
    assert any(re.match(r"numpy\b", r) and "extra ==" not in r for r in requirements), requirements


# ---- the same on the GPU (skipped without one) -----------------------------------------------------------

@requires_gpu
def test_gpu_prompt_token_id_outside_the_vocabulary_is_a_value_error(gen):
    """generate reads its CUDA prompt back once: a ValueError, not a device-side assert that poisons the context."""
    model = tiny_model(50).cuda()
    ids = torch.randint(0, 50, (2, 7), generator=gen)
    ids[0, 3] = 50
    with raises(ValueError, "flashgla: input_ids:", "token id 50", "[0, 50)"):
        model.generate(ids.cuda(), 2)
    assert model.generate(ids.clamp(max=49).cuda(), 2).shape == (2, 9)  # the context still works


@requires_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_double_backward_says_it_is_not_supported(gen, dtype):
    q, k, v, g, _ = (t.cuda().to(dtype if i < 3 else torch.float32) for i, t in enumerate(inputs(gen)))
    q.requires_grad_()
    o, _ = flashgla.chunk_gla(q, k, v, g)
    (dq,) = torch.autograd.grad(o.float().square().sum(), q, create_graph=True)
    with raises(NotImplementedError, "flashgla: chunk_gla:", "double backward is not supported"):
        dq.float().square().sum().backward()
