"""Misuses of the ops (issue 27): each gets a clear error naming the argument and what was expected, or the
documented result."""

import re

import pytest
import torch

import flashgla
from flashgla.ops import _memory
from testing_utils import HAS_GPU, gla_inputs, naive_gla, randn


def raises(kind, *fragments):
    return pytest.raises(kind, match="(?s)" + "".join(f"(?=.*{re.escape(f)})" for f in fragments))


def huge(*shape, device="cpu", dtype=torch.float32):
    """A tensor of any size that costs no memory (one element, expanded)."""
    return torch.zeros(1, dtype=dtype, device=device).expand(*shape)


# ---- outputs that cannot fit ------------------------------------------------------------------------------

def test_outputs_that_cannot_fit_name_q_the_op_and_the_sizes():
    x = huge(64, 2 ** 20, 64, 128)  # 2 TiB of output
    with raises(MemoryError, "flashgla: q:", "chunk_gla needs about", "o [64, 1048576, 64, 128] float32 (2048.0 GiB)",
                "available", "split the call"):
        flashgla.chunk_gla(x, x, x, x)


def test_the_fatal_cpu_case_is_a_memory_error_before_allocating(monkeypatch):
    # [1, 2^24, 2, 64]: 8 GiB of output (the chunked CPU path's scratch is per range of tokens, so that is its
    # need); once killed by the kernel's OOM. Available memory is pinned so the test does not depend on this
    # machine.
    monkeypatch.setattr(_memory, "_cpu_available", lambda: 4 << 30)
    x = huge(1, 2 ** 24, 2, 64)
    with raises(MemoryError, "flashgla: q:", "chunk_gla", "o [1, 16777216, 2, 64] float32 (8.0 GiB)",
                "the CPU has 4.0 GiB available"):
        flashgla.chunk_gla(x, x, x, x)


def test_the_recurrent_cpu_reference_counts_its_scratch(monkeypatch):
    # The recurrent reference copies whole sequences in fp64: more than its 8 GiB of output.
    monkeypatch.setattr(_memory, "_cpu_available", lambda: 16 << 30)
    x = huge(1, 2 ** 24, 2, 64)
    with raises(MemoryError, "flashgla: q:", "o [1, 16777216, 2, 64] float32 (8.0 GiB)", "CPU backend's scratch",
                "the CPU has 16.0 GiB available"):
        flashgla.fused_recurrent_gla(x, x, x, x)


@pytest.mark.parametrize("op", ["chunk_simple_gla", "chunk_linear_attn", "fused_recurrent_gla",
                                "fused_recurrent_simple_gla", "fused_recurrent_linear_attn", "flash_attention",
                                "rms_norm", "logsigmoid_gate", "chunk_gla_segment_states", "gla_prefill"])
def test_every_op_checks_its_outputs(op, monkeypatch):
    monkeypatch.setattr(_memory, "_cpu_available", lambda: 16 << 30)  # not this machine's: 64 GiB may fit here
    x = huge(64, 2 ** 20, 64, 128)
    if op == "rms_norm" or op == "logsigmoid_gate":
        call, argument = (lambda: getattr(flashgla.ops, op)(x)), "x"
    elif op == "chunk_gla_segment_states":  # its outputs are the states: 64 GiB of [N, H, K, V]
        s = huge(4096, 1, 64, 256)
        call, argument = (lambda: flashgla.chunk_gla_segment_states(s, s)), "k"
    elif op == "gla_prefill":
        state = torch.zeros(64, 64, 128, 128)
        rows = torch.arange(64, dtype=torch.int32)
        call, argument = (lambda: flashgla.gla_prefill(x, x, x, None, state, rows)), "q"
    else:
        call, argument = (lambda: getattr(flashgla, op)(x, x, x)), "q"
    # the recurrent ops share one registered op, fused_recurrent_gla, whose name the message gives
    named = "fused_recurrent" if op.startswith("fused_recurrent") else op
    with raises(MemoryError, f"flashgla: {argument}:", named, "GiB", "available"):
        call()


def test_the_backward_checks_its_gradients(monkeypatch, gen):
    q, k, v, g, _ = gla_inputs(gen, 1, 21, 2, 8, 16, dtype=torch.float32)
    for t in (q, k, v, g):
        t.requires_grad_()
    monkeypatch.setattr(_memory, "CHECK_FROM_BYTES", 0)
    available = [1 << 40]
    monkeypatch.setattr(_memory, "_cpu_available", lambda: available[0])
    o, _ = flashgla.chunk_gla(q, k, v, g)  # fits
    available[0] = 1000
    with raises(MemoryError, "flashgla: q:", "chunk_gla (backward)", "dq [1, 21, 2, 8] float32", "dg [1, 21, 2, 8]"):
        o.sum().backward()


def test_small_calls_do_not_look_at_the_memory(monkeypatch, gen):
    def unexpected():
        raise AssertionError("a small call read the available memory")

    monkeypatch.setattr(_memory, "_cpu_available", unexpected)
    q, k, v, g, _ = gla_inputs(gen, 1, 21, 2, 8, 16, dtype=torch.float32)
    o, _ = flashgla.chunk_gla(q, k, v, g)
    assert o.shape == v.shape


def test_on_cuda_the_error_is_torch_out_of_memory(monkeypatch):
    # The CUDA branch without a GPU: free memory pinned at 1 GiB.
    monkeypatch.setattr(_memory, "_cuda_available", lambda device: 1 << 30)
    with raises(torch.OutOfMemoryError, "flashgla: q: chunk_gla needs about 5.0 GiB", "cuda:0 has 1.0 GiB available"):
        _memory.require_memory("chunk_gla", torch.device("cuda", 0), 5 << 30, "o")
    _memory.require_memory("chunk_gla", torch.device("cuda", 0), 1 << 30, "o")  # checked, and fits


@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA device")
def test_cuda_outputs_that_cannot_fit_name_q_and_the_device():
    x = huge(64, 2 ** 20, 64, 128, device="cuda", dtype=torch.bfloat16)
    g = huge(64, 2 ** 20, 64, 128, device="cuda")
    with raises(torch.OutOfMemoryError, "flashgla: q:", "chunk_gla needs about",
                "o [64, 1048576, 64, 128] bfloat16 (1024.0 GiB)", "cuda"):
        flashgla.chunk_gla(x, x, x, g)


# ---- gla_decode_step ----------------------------------------------------------------------------------

def decode_inputs(gen, N=3, H=2, K=16, V=16):
    return (randn(gen, N, H, K, dtype=torch.float32), randn(gen, N, H, K, dtype=torch.float32),
            randn(gen, N, H, V, dtype=torch.float32), torch.zeros(N, H, K, V))


def test_decode_shapes_are_named_in_the_one_token_layout(gen):
    q, k, v, state = decode_inputs(gen)
    with raises(ValueError, "flashgla: g: expected shape [N, H, K] = [3, 2, 16], got [3, 2, 17]"):
        flashgla.gla_decode_step(q, k, v, torch.zeros(3, 2, 17), state)
    with raises(ValueError, "flashgla: g: expected shape [N, H] = [3, 2], got [3, 4]"):
        flashgla.gla_decode_step(q, k, v, torch.zeros(3, 4), state)
    with raises(ValueError, "flashgla: k: expected shape [N, H, K] = [3, 2, 16], got [3, 2, 8]"):
        flashgla.gla_decode_step(q, k[..., :8], v, None, state)
    with raises(ValueError, "flashgla: v: expected shape [N, H, V] = [3, 2, V]", "got [3, 1, 16]"):
        flashgla.gla_decode_step(q, k, v[:, :1], None, state)


def test_decode_refuses_inputs_that_require_grad(gen):
    q, k, v, state = decode_inputs(gen)
    before = state.clone()
    with raises(NotImplementedError, "flashgla: q: gla_decode_step has no backward", "torch.no_grad()"):
        flashgla.gla_decode_step(q.requires_grad_(), k, v, None, state)
    assert torch.equal(state, before)
    with torch.no_grad():  # inference: fine, and the output claims no gradient
        o = flashgla.gla_decode_step(q, k, v, None, state)
    assert not o.requires_grad


def test_decode_refuses_a_state_that_requires_grad(gen):
    q, k, v, _ = decode_inputs(gen)
    state = torch.zeros(3, 2, 16, 16, requires_grad=True)
    with raises(NotImplementedError, "flashgla: state: gla_decode_step", "updated in place", "requires grad"):
        flashgla.gla_decode_step(q, k, v, None, state)
    assert torch.equal(state.detach(), torch.zeros(3, 2, 16, 16))


# ---- scale ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("op", ["chunk_gla", "fused_recurrent_gla", "chunk_simple_gla", "flash_attention",
                                "gla_decode_step"])
@pytest.mark.parametrize("requires_grad", [False, True])
def test_a_tensor_scale_is_a_type_error_naming_scale(gen, op, requires_grad):
    q, k, v, g, _ = gla_inputs(gen, 1, 9, 2, 8, 8, dtype=torch.float32, gate="scalar" if "simple" in op else "vector")
    scale = torch.tensor(0.5, requires_grad=requires_grad)
    with raises(TypeError, "flashgla: scale:", op, "0-d tensor", "float(scale)"):
        if op == "flash_attention":
            flashgla.flash_attention(q, k, v, scale=scale)
        elif op == "gla_decode_step":
            flashgla.gla_decode_step(q[0], k[0], v[0], None, torch.zeros(9, 2, 8, 8), scale=scale)
        else:
            getattr(flashgla, op)(q, k, v, g, scale=scale)


# ---- the state dtype: fp64 inputs keep fp64 states ----------------------------------------------------------

@pytest.mark.parametrize("op", ["chunk_gla", "fused_recurrent_gla", "chunk_simple_gla"])
def test_fp64_inputs_keep_fp64_states(gen, op):
    gate = "scalar" if "simple" in op else "vector"
    q, k, v, g, h0 = gla_inputs(gen, 2, 70, 2, 8, 16, gate=gate, dtype=torch.float64)
    h0 = h0.double().requires_grad_()
    for t in (q, k, v, g):
        t.requires_grad_()
    o, ht = getattr(flashgla, op)(q, k, v, g, initial_state=h0, output_final_state=True)
    assert ht.dtype == torch.float64
    o_ref, ht_ref = naive_gla(q, k, v, g, initial_state=h0)
    assert (ht - ht_ref).abs().max() < 1e-10 * ht_ref.abs().max()  # fp64 accuracy, not fp32's
    dht = randn(gen, *ht.shape)
    (dh0,) = torch.autograd.grad((o.sum() + (ht * dht).sum()), h0)
    (dh0_ref,) = torch.autograd.grad((o_ref.sum() + (ht_ref * dht).sum()), h0)
    assert dh0.dtype == torch.float64
    assert (dh0 - dh0_ref).abs().max() < 1e-10 * dh0_ref.abs().max()


def test_fp64_inputs_with_an_fp32_initial_state(gen):
    q, k, v, g, h0 = gla_inputs(gen, 1, 21, 2, 8, 16, dtype=torch.float64)
    h0.requires_grad_()
    o, ht = flashgla.chunk_gla(q, k, v, g, initial_state=h0, output_final_state=True)
    assert ht.dtype == torch.float64
    (o.sum() + ht.sum()).backward()
    assert h0.grad.dtype == torch.float32  # a gradient has its input's dtype


# ---- positive gates: the contract, and check_gate -----------------------------------------------------------

@pytest.mark.parametrize("op", ["chunk_gla", "chunk_simple_gla"])
def test_check_gate_names_g(gen, op):
    gate = "scalar" if "simple" in op else "vector"
    q, k, v, g, _ = gla_inputs(gen, 1, 21, 2, 8, 16, gate=gate, dtype=torch.float32)
    g = g.clone()
    g[0, 5] = 2.0
    with raises(ValueError, "flashgla: g:", "[-inf, 0]", "check_gate=True"):
        getattr(flashgla, op)(q, k, v, g, check_gate=True)


@pytest.mark.parametrize("op", ["chunk_gla", "chunk_simple_gla"])
def test_the_gate_contract_is_in_the_docstrings(op):
    doc = getattr(flashgla, op).__doc__
    assert "[-inf, 0]" in doc and "check_gate" in doc, doc
