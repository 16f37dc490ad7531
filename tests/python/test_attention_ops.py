"""flash_attention on CPU tensors: results and gradients against a pure-PyTorch
fp64 softmax attention, gradcheck."""

import pytest
import torch

import flashgla
from testing_utils import GRAD_TOLERANCE, TOLERANCE, assert_close, cu, naive_attention, poisoned_outputs, randn

CASES = {  # B, Tq, Tk, Hq, Hkv, D, Dv
    "B2T65": (2, 65, 65, 2, 2, 32, 32),
    "gqa_Dv_ne_D": (1, 70, 70, 4, 2, 16, 24),
    "Tq_lt_Tk": (2, 5, 70, 2, 1, 16, 16),
    "T1": (1, 1, 1, 1, 1, 8, 8),
}


def attention_inputs(gen, B, Tq, Tk, Hq, Hkv, D, Dv, dtype):
    return randn(gen, B, Tq, Hq, D, dtype=dtype), randn(gen, B, Tk, Hkv, D, dtype=dtype), \
        randn(gen, B, Tk, Hkv, Dv, dtype=dtype)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("case", list(CASES))
def test_forward(gen, case, dtype, causal):
    q, k, v = attention_inputs(gen, *CASES[case], dtype)
    with poisoned_outputs():
        o = flashgla.flash_attention(q, k, v, causal=causal)
    assert o.dtype == dtype
    assert_close(o, naive_attention(q, k, v, causal=causal), TOLERANCE[dtype], "o")


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_varlen(gen, causal):
    lengths = [4, 0, 1, 65]
    cu_seqlens = cu(lengths)
    q, k, v = attention_inputs(gen, 1, sum(lengths), sum(lengths), 2, 2, 16, 16, torch.float32)
    with poisoned_outputs():
        o = flashgla.flash_attention(q, k, v, causal=causal, scale=0.2, cu_seqlens=cu_seqlens)
    assert_close(o, naive_attention(q, k, v, causal=causal, scale=0.2, cu_seqlens=cu_seqlens),
                 TOLERANCE[torch.float32], "o")


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_varlen_own_key_boundaries(gen, causal):
    q_lengths, k_lengths = [1, 0, 3, 5], [7, 2, 3, 66]  # e.g. new queries against cached keys
    cu_q, cu_k = cu(q_lengths), cu(k_lengths, torch.int64)
    q, k, v = [x.requires_grad_() for x in
               attention_inputs(gen, 1, sum(q_lengths), sum(k_lengths), 4, 2, 16, 8, torch.float32)]
    with poisoned_outputs():
        o = flashgla.flash_attention(q, k, v, causal=causal, cu_seqlens=cu_q, cu_seqlens_k=cu_k)
    ref_inputs = [x.detach().double().requires_grad_() for x in (q, k, v)]
    ref = naive_attention(*ref_inputs, causal=causal, cu_seqlens=cu_q, cu_seqlens_k=cu_k)
    assert_close(o, ref, TOLERANCE[torch.float32], "o")
    do = torch.randn_like(o)
    grads = torch.autograd.grad(o, (q, k, v), do)
    ref_grads = torch.autograd.grad(ref, ref_inputs, do.double())
    for name, grad, expected in zip(("dq", "dk", "dv"), grads, ref_grads):
        assert_close(grad, expected, GRAD_TOLERANCE[torch.float32], name)


def test_varlen_key_boundaries_need_query_boundaries(gen):
    q, k, v = attention_inputs(gen, 1, 4, 4, 2, 2, 8, 8, torch.float32)
    with pytest.raises(ValueError, match="cu_seqlens_k needs cu_seqlens"):
        flashgla.flash_attention(q, k, v, cu_seqlens_k=cu([4]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("case", ["gqa_Dv_ne_D", "Tq_lt_Tk"])
def test_backward(gen, case, dtype):
    q, k, v = [x.requires_grad_() for x in attention_inputs(gen, *CASES[case], dtype)]
    do = randn(gen, *q.shape[:3], v.shape[-1], dtype=dtype)
    with poisoned_outputs():
        grads = torch.autograd.grad(flashgla.flash_attention(q, k, v), (q, k, v), do)
    ref_inputs = [x.detach().double().requires_grad_() for x in (q, k, v)]
    ref_grads = torch.autograd.grad(naive_attention(*ref_inputs), ref_inputs, do.double())
    for name, grad, ref in zip(("dq", "dk", "dv"), grads, ref_grads):
        assert grad.dtype == dtype
        assert_close(grad, ref, GRAD_TOLERANCE[dtype], name)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_gradcheck_fp64(gen, causal):
    inputs = [x.requires_grad_() for x in attention_inputs(gen, 2, 3, 5, 2, 1, 4, 3, torch.float64)]
    assert torch.autograd.gradcheck(lambda q, k, v: flashgla.flash_attention(q, k, v, causal=causal), inputs)


def test_gradcheck_fp64_varlen(gen):
    cu_seqlens = cu([3, 0, 1, 4])
    inputs = [x.requires_grad_() for x in attention_inputs(gen, 1, 8, 8, 2, 2, 4, 3, torch.float64)]
    assert torch.autograd.gradcheck(lambda q, k, v: flashgla.flash_attention(q, k, v, cu_seqlens=cu_seqlens),
                                    inputs)


def test_deterministic_flag_on_cpu(gen):
    """The CPU backward is deterministic anyway: the flag gives the same gradients; a non-bool is refused."""
    q, k, v = [x.requires_grad_() for x in attention_inputs(gen, *CASES["gqa_Dv_ne_D"], torch.float32)]
    do = randn(gen, *q.shape[:3], v.shape[-1], dtype=torch.float32)
    plain = torch.autograd.grad(flashgla.flash_attention(q, k, v), (q, k, v), do)
    in_turns = torch.autograd.grad(flashgla.flash_attention(q, k, v, deterministic=True), (q, k, v), do)
    for name, a, b in zip(("dq", "dk", "dv"), plain, in_turns):
        assert torch.equal(a, b), name
    with pytest.raises(TypeError, match="deterministic: expected a bool, got int"):
        flashgla.flash_attention(q, k, v, deterministic=1)
