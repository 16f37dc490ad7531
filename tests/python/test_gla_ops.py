"""GLA ops on CPU tensors: results and gradients against the fp64 references
(the recurrent op on fp64 inputs, and a pure-PyTorch recurrence), gradcheck."""

import pytest
import torch

import flashgla
from testing_utils import (GRAD_TOLERANCE, TOLERANCE, assert_close, cu, gla_inputs, naive_gla, poisoned_outputs)

LOW_PRECISION = [torch.float32, torch.bfloat16, torch.float16]


def call(op, q, k, v, g, **kwargs):
    """Calls a GLA op by name with the gate passed the way that op takes it."""
    if op == "chunk_linear_attn":
        return flashgla.chunk_linear_attn(q, k, v, normalize=False, **kwargs)
    if op == "fused_recurrent_gla":
        return flashgla.fused_recurrent_gla(q, k, v, gk=g, **kwargs)
    return getattr(flashgla, op)(q, k, v, g, **kwargs)


GATE_OF = {"chunk_gla": "vector", "chunk_simple_gla": "scalar", "chunk_linear_attn": None,
           "fused_recurrent_gla": "vector"}
OPS = list(GATE_OF)


def fp64_reference(q, k, v, g, h0, **kwargs):
    """The CPU fp64 reference: the recurrent op on fp64-upcast inputs."""
    with torch.no_grad():
        return flashgla.fused_recurrent_gla(q.double(), k.double(), v.double(),
                                            None if g is None else g.double(), initial_state=h0,
                                            output_final_state=True, **kwargs)


def test_recurrent_fp64_matches_pure_pytorch(gen):
    q, k, v, g, h0 = gla_inputs(gen, 2, 37, 3, 8, 12)
    o, ht = flashgla.fused_recurrent_gla(q, k, v, g, initial_state=h0, output_final_state=True)
    o_ref, ht_ref = naive_gla(q, k, v, g, initial_state=h0)
    assert_close(o, o_ref, 1e-12, "o")
    assert_close(ht, ht_ref, 1e-6, "ht")  # ht is fp32


@pytest.mark.parametrize("dtype", LOW_PRECISION, ids=str)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("shape", [(1, 1, 1, 16, 16), (2, 63, 2, 32, 48), (1, 64, 2, 16, 16), (2, 65, 3, 64, 32)],
                         ids=lambda s: "B{}T{}H{}K{}V{}".format(*s))
def test_forward(gen, op, dtype, shape):
    B, T, H, K, V = shape
    q, k, v, g, h0 = gla_inputs(gen, B, T, H, K, V, gate=GATE_OF[op], dtype=dtype)
    with poisoned_outputs():
        o, ht = call(op, q, k, v, g, initial_state=h0, output_final_state=True)
    assert o.dtype == dtype and ht.dtype == torch.float32 and o.shape == (B, T, H, V) and ht.shape == (B, H, K, V)
    o_ref, ht_ref = naive_gla(q, k, v, g, initial_state=h0)
    o_rec, ht_rec = fp64_reference(q, k, v, g, h0)
    assert_close(o, o_ref, TOLERANCE[dtype], "o vs the PyTorch recurrence")
    assert_close(ht, ht_ref, TOLERANCE[dtype], "final_state vs the PyTorch recurrence")
    assert_close(o, o_rec, TOLERANCE[dtype], "o vs the fp64 recurrent op")
    assert_close(ht, ht_rec, TOLERANCE[dtype], "final_state vs the fp64 recurrent op")


@pytest.mark.parametrize("op", OPS)
def test_forward_without_state(gen, op):
    q, k, v, g, _ = gla_inputs(gen, 2, 70, 2, 16, 24, gate=GATE_OF[op], dtype=torch.float32)
    with poisoned_outputs():
        o, ht = call(op, q, k, v, g, scale=0.3)
    assert ht is None
    assert_close(o, naive_gla(q, k, v, g, scale=0.3)[0], TOLERANCE[torch.float32], "o")


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("op", OPS)
def test_varlen(gen, op, index_dtype):
    lengths = [5, 0, 1, 70, 64]  # an empty and a length-1 sequence, one across a chunk boundary
    cu_seqlens = cu(lengths, index_dtype)
    q, k, v, g, h0 = gla_inputs(gen, 1, sum(lengths), 2, 16, 8, gate=GATE_OF[op], num_states=len(lengths),
                                dtype=torch.float32)
    with poisoned_outputs():
        o, ht = call(op, q, k, v, g, initial_state=h0, output_final_state=True, cu_seqlens=cu_seqlens)
    o_ref, ht_ref = naive_gla(q, k, v, g, initial_state=h0, cu_seqlens=cu_seqlens)
    assert_close(o, o_ref, TOLERANCE[torch.float32], "o")
    assert_close(ht, ht_ref, TOLERANCE[torch.float32], "final_state")


@pytest.mark.parametrize("gate_scale", [1e-4, 30.0], ids=["gates_near_0", "gates_very_negative"])
@pytest.mark.parametrize("op", ["chunk_gla", "chunk_simple_gla"])
def test_extreme_gates(gen, op, gate_scale):
    q, k, v, g, h0 = gla_inputs(gen, 1, 130, 2, 16, 16, gate=GATE_OF[op], dtype=torch.float32,
                                gate_scale=gate_scale)
    with poisoned_outputs():
        o, ht = call(op, q, k, v, g, initial_state=h0, output_final_state=True)
    o_ref, ht_ref = naive_gla(q, k, v, g, initial_state=h0)
    assert_close(o, o_ref, TOLERANCE[torch.float32], "o")
    assert_close(ht, ht_ref, TOLERANCE[torch.float32], "final_state")


def test_recurrent_reverse(gen):
    lengths = [3, 1, 40]
    cu_seqlens = cu(lengths)
    q, k, v, g, h0 = gla_inputs(gen, 1, sum(lengths), 2, 8, 8, num_states=3, dtype=torch.float32)
    with poisoned_outputs():
        o, ht = flashgla.fused_recurrent_gla(q, k, v, g, initial_state=h0, output_final_state=True, reverse=True,
                                             cu_seqlens=cu_seqlens)
    o_ref, ht_ref = naive_gla(q, k, v, g, initial_state=h0, cu_seqlens=cu_seqlens, reverse=True)
    assert_close(o, o_ref, TOLERANCE[torch.float32], "o")
    assert_close(ht, ht_ref, TOLERANCE[torch.float32], "final_state")


def gradients(outputs, inputs, grad_outputs):
    inputs = [x for x in inputs if x is not None and x.requires_grad]
    return torch.autograd.grad(outputs, inputs, grad_outputs)


@pytest.mark.parametrize("dtype", LOW_PRECISION, ids=str)
@pytest.mark.parametrize("op", OPS)
def test_backward(gen, op, dtype):
    B, T, H, K, V = 2, 67, 2, 16, 24
    q, k, v, g, h0 = gla_inputs(gen, B, T, H, K, V, gate=GATE_OF[op], dtype=dtype)
    do = torch.randn(B, T, H, V, generator=gen, dtype=torch.float64).to(dtype)
    dht = torch.randn(B, H, K, V, generator=gen, dtype=torch.float64).float()
    inputs = [x.requires_grad_() for x in (q, k, v, g, h0) if x is not None]
    with poisoned_outputs():
        o, ht = call(op, q, k, v, g, initial_state=h0, output_final_state=True)
        grads = gradients((o, ht), inputs, (do, dht))

    ref_inputs = [x.detach().double().requires_grad_() for x in inputs]
    rq, rk, rv = ref_inputs[:3]
    rg = ref_inputs[3] if g is not None else None
    o_ref, ht_ref = naive_gla(rq, rk, rv, rg, initial_state=ref_inputs[-1])
    ref_grads = torch.autograd.grad((o_ref, ht_ref), ref_inputs, (do.double(), dht.double()))
    names = ["dq", "dk", "dv"] + (["dg"] if g is not None else []) + ["dh0"]
    for name, grad, ref, x in zip(names, grads, ref_grads, inputs):
        assert grad.dtype == x.dtype, f"{name}: dtype {grad.dtype}, expected {x.dtype}"
        assert_close(grad, ref, GRAD_TOLERANCE[dtype], name)


@pytest.mark.parametrize("op", OPS)
def test_backward_varlen_without_final_state_gradient(gen, op):
    """Only o is used: the final state's gradient is absent (zero), h0 still gets its gradient."""
    lengths = [1, 0, 66, 9]
    cu_seqlens = cu(lengths)
    q, k, v, g, h0 = gla_inputs(gen, 1, sum(lengths), 2, 8, 16, gate=GATE_OF[op], num_states=4,
                                dtype=torch.float32)
    inputs = [x.requires_grad_() for x in (q, k, v, g, h0) if x is not None]
    do = torch.randn(1, sum(lengths), 2, 16, generator=gen)
    with poisoned_outputs():
        o, _ = call(op, q, k, v, g, initial_state=h0, output_final_state=True, cu_seqlens=cu_seqlens)
        grads = gradients(o, inputs, do)
    ref_inputs = [x.detach().double().requires_grad_() for x in inputs]
    rg = ref_inputs[3] if g is not None else None
    o_ref, _ = naive_gla(*ref_inputs[:3], rg, initial_state=ref_inputs[-1], cu_seqlens=cu_seqlens)
    ref_grads = torch.autograd.grad(o_ref, ref_inputs, do.double())
    for grad, ref in zip(grads, ref_grads):
        assert_close(grad, ref, GRAD_TOLERANCE[torch.float32], "gradient")


# ---- gradcheck in fp64 (the CPU backend computes fp64 inputs in fp64) ------------------------------

def gradcheck_case(gen, op, lengths=None, with_state=True, reverse=False):
    T = sum(lengths) if lengths else 6
    B = 1 if lengths else 2
    N = len(lengths) if lengths else B
    q, k, v, g, h0 = gla_inputs(gen, B, T, 1, 4, 3, gate=GATE_OF[op], num_states=N)
    h0 = h0.double() if with_state else None  # only to perturb it; made fp32 inside the function
    inputs = [x.requires_grad_() for x in (q, k, v, g, h0) if x is not None]
    cu_seqlens = cu(lengths) if lengths else None
    extra = {"reverse": True} if reverse else {}

    def function(*args):
        q, k, v = args[:3]
        g = args[3] if GATE_OF[op] else None
        h0 = args[-1].float() if with_state else None
        o, ht = call(op, q, k, v, g, initial_state=h0, output_final_state=with_state, cu_seqlens=cu_seqlens,
                     **extra)
        return (o, ht.double()) if with_state else o

    return function, inputs


@pytest.mark.parametrize("op", OPS)
def test_gradcheck_fp64(gen, op):
    function, inputs = gradcheck_case(gen, op, with_state=False)
    assert torch.autograd.gradcheck(function, inputs, eps=1e-6, atol=1e-8, rtol=1e-6)


@pytest.mark.parametrize("op", OPS)
def test_gradcheck_fp64_varlen(gen, op):
    function, inputs = gradcheck_case(gen, op, lengths=[2, 0, 1, 67], with_state=False)
    assert torch.autograd.gradcheck(function, inputs, eps=1e-6, atol=1e-8, rtol=1e-6)


# h0 and ht are fp32 by the API: finite differences through them need a larger
# step and a looser tolerance (fp32 rounding over a step of 1e-3 is ~1e-4).
@pytest.mark.parametrize("op", OPS)
def test_gradcheck_state(gen, op):
    function, inputs = gradcheck_case(gen, op, lengths=[2, 0, 1, 6])
    assert torch.autograd.gradcheck(function, inputs, eps=1e-3, atol=2e-3, rtol=2e-3)


def test_gradcheck_reverse(gen):
    function, inputs = gradcheck_case(gen, "fused_recurrent_gla", lengths=[3, 4], reverse=True)
    assert torch.autograd.gradcheck(function, inputs, eps=1e-3, atol=2e-3, rtol=2e-3)
