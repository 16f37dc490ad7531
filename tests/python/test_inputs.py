"""Input handling: strided inputs are read through their strides, bad inputs
raise ValueError/TypeError naming the argument (mostly from the C++ checks)."""

import re

import pytest
import torch
import torch.nn.functional as F

import flashgla
from flashgla import _C
from testing_utils import cu, gla_inputs, randn

B, T, H, K, V = 2, 33, 2, 8, 16


@pytest.fixture
def inputs(gen):
    return gla_inputs(gen, B, T, H, K, V, dtype=torch.float32)


# ---- strides ----------------------------------------------------------------------------------------

def fused_projection(gen, dtype=torch.float32):
    """q, k, v, g as slices of one [B, T, H, 3K + V] projection (none of them contiguous)."""
    fused = randn(gen, B, T, H, 3 * K + V, dtype=dtype)
    q, k, v, gate = fused.split([K, K, V, K], dim=-1)
    return q, k, v, F.logsigmoid(gate.float()).to(dtype)[..., :K]


@pytest.mark.parametrize("op", ["chunk_gla", "fused_recurrent_gla"])
def test_slices_of_a_fused_projection(gen, op):
    q, k, v, g = fused_projection(gen)
    g = torch.cat([g, g], dim=-1)[..., ::2]  # a strided gate as well
    assert not any(x.is_contiguous() for x in (q, k, v, g))
    h0 = randn(gen, B, H, V, K, dtype=torch.float32).transpose(-1, -2)  # a transposed state
    function = getattr(flashgla, op)
    leaves = [x.detach().requires_grad_() for x in (q, k, v, g, h0)]
    contiguous = [x.detach().contiguous().requires_grad_() for x in (q, k, v, g, h0)]
    outputs = []
    for q_, k_, v_, g_, h0_ in (leaves, contiguous):
        o, ht = function(q_, k_, v_, g_, initial_state=h0_, output_final_state=True)
        grads = torch.autograd.grad((o, ht), (q_, k_, v_, g_, h0_), (torch.ones_like(o), torch.ones_like(ht)))
        outputs.append((o, ht, *grads))
    for name, strided, dense in zip(["o", "ht", "dq", "dk", "dv", "dg", "dh0"], *outputs):
        torch.testing.assert_close(strided, dense, msg=f"{name}: strided input read differently")


def test_head_first_transposed_and_broadcast_inputs(gen):
    """[B, H, T, K] tensors transposed to [B, T, H, K], and a key shared by all heads (stride 0)."""
    q = randn(gen, B, H, T, K, dtype=torch.float32).transpose(1, 2)
    k = randn(gen, B, T, 1, K, dtype=torch.float32).expand(B, T, H, K)
    v = randn(gen, B, H, T, V, dtype=torch.float32).transpose(1, 2)
    g = F.logsigmoid(randn(gen, B, T, H, K, dtype=torch.float32))
    o, _ = flashgla.chunk_gla(q, k, v, g)
    o_dense, _ = flashgla.chunk_gla(q.contiguous(), k.contiguous(), v.contiguous(), g)
    torch.testing.assert_close(o, o_dense)


def test_attention_strided(gen):
    fused = randn(gen, B, T, 3 * H, K, dtype=torch.float32)
    q, k, v = fused.chunk(3, dim=2)
    torch.testing.assert_close(flashgla.flash_attention(q, k, v),
                               flashgla.flash_attention(q.contiguous(), k.contiguous(), v.contiguous()))


# ---- errors -----------------------------------------------------------------------------------------

def raises(kind, argument):
    """pytest.raises for a flashgla error about `argument`."""
    return pytest.raises(kind, match=rf"^flashgla: {re.escape(argument)}: ")


def test_shapes(inputs):
    q, k, v, g, h0 = inputs
    with raises(ValueError, "q"):
        flashgla.chunk_gla(q[0], k[0], v[0], g)
    with raises(ValueError, "k"):
        flashgla.chunk_gla(q, k[:, :, :1], v, g)
    with raises(ValueError, "v"):
        flashgla.chunk_gla(q, k, v[:, 1:], g)
    with raises(ValueError, "g"):
        flashgla.chunk_gla(q, k, v, g[..., 1:])
    with raises(ValueError, "g"):
        flashgla.chunk_gla(q, k, v, g[..., 0])  # a scalar gate is chunk_simple_gla's
    with raises(ValueError, "g"):
        flashgla.chunk_simple_gla(q, k, v, g)
    with raises(ValueError, "initial_state"):
        flashgla.chunk_gla(q, k, v, g, initial_state=h0[:1])
    with raises(ValueError, "initial_state"):
        flashgla.fused_recurrent_gla(q, k, v, g, initial_state=h0.transpose(-1, -2))
    with raises(ValueError, "q"):
        flashgla.chunk_linear_attn(q[..., :0], k[..., :0], v)  # K = 0


def test_dtypes(inputs):
    q, k, v, g, h0 = inputs
    with raises(TypeError, "k"):
        flashgla.chunk_gla(q, k.double(), v, g)
    with raises(TypeError, "v"):
        flashgla.chunk_gla(q, k, v.half(), g)
    with raises(TypeError, "q"):
        flashgla.chunk_gla(q.to(torch.int32), k.to(torch.int32), v.to(torch.int32), g)
    with raises(TypeError, "q"):
        flashgla.chunk_gla(q.to(torch.int8), k, v, g)
    with raises(TypeError, "g"):
        flashgla.chunk_gla(q, k, v, g.to(torch.int64))
    with raises(TypeError, "initial_state"):
        flashgla.chunk_gla(q, k, v, g, initial_state=h0.double())
    with raises(TypeError, "initial_state"):
        flashgla.fused_recurrent_gla(q.bfloat16(), k.bfloat16(), v.bfloat16(), g, initial_state=h0.bfloat16())
    with raises(TypeError, "q"):
        flashgla.chunk_gla(q.tolist(), k, v, g)


def test_devices(inputs):
    q, k, v, g, h0 = inputs
    with raises(ValueError, "k"):
        flashgla.chunk_gla(q, k.to("meta"), v, g)
    with raises(ValueError, "initial_state"):
        flashgla.chunk_gla(q, k, v, g, initial_state=h0.to("meta"))
    with raises(ValueError, "v"):
        flashgla.flash_attention(q, k, v.to("meta"))


def test_cu_seqlens(gen):
    q, k, v, g, h0 = gla_inputs(gen, 1, 10, H, K, V, num_states=3, dtype=torch.float32)
    good = cu([3, 0, 7])
    flashgla.chunk_gla(q, k, v, g, initial_state=h0, cu_seqlens=good)
    bad_values = [torch.tensor([1, 3, 10], dtype=torch.int32),  # does not start at 0
                  torch.tensor([0, 7, 3, 10], dtype=torch.int32),  # decreases
                  torch.tensor([0, 3, 9], dtype=torch.int32),  # does not end at T
                  torch.tensor([0], dtype=torch.int32),  # no sequence
                  good[None]]  # 2-D
    for bad in bad_values:
        with raises(ValueError, "cu_seqlens"):
            flashgla.chunk_gla(q, k, v, g, cu_seqlens=bad)
    with raises(TypeError, "cu_seqlens"):
        flashgla.chunk_gla(q, k, v, g, cu_seqlens=good.float())
    with raises(ValueError, "cu_seqlens"):  # varlen packs sequences into B == 1
        q2, k2, v2, g2, _ = gla_inputs(gen, 2, 5, H, K, V, dtype=torch.float32)
        flashgla.chunk_gla(q2, k2, v2, g2, cu_seqlens=cu([2, 3]))
    with raises(ValueError, "initial_state"):  # one state per sequence
        flashgla.chunk_gla(q, k, v, g, initial_state=h0[:2], cu_seqlens=good)
    with raises(ValueError, "cu_seqlens_q"):  # the C++ API's name for flash_attention's cu_seqlens
        flashgla.flash_attention(q, k, v, cu_seqlens=torch.tensor([0, 4, 3, 10]))


def test_attention_key_boundaries(gen):
    q, k, v = randn(gen, 1, 4, H, K), randn(gen, 1, 10, H, K), randn(gen, 1, 10, H, V)
    cu_q = cu([1, 0, 3])
    flashgla.flash_attention(q, k, v, cu_seqlens=cu_q, cu_seqlens_k=cu([3, 0, 7]))
    for bad in (cu([3, 7]),  # another number of sequences than cu_seqlens
                cu([3, 0, 6]),  # does not end at Tk
                torch.tensor([0, 7, 3, 10], dtype=torch.int32)):  # decreases
        with raises(ValueError, "cu_seqlens_k"):
            flashgla.flash_attention(q, k, v, cu_seqlens=cu_q, cu_seqlens_k=bad)
    with raises(TypeError, "cu_seqlens_k"):
        flashgla.flash_attention(q, k, v, cu_seqlens=cu_q, cu_seqlens_k=cu([3, 0, 7]).float())
    with raises(ValueError, "cu_seqlens_k"):
        flashgla.flash_attention(q, k, v, cu_seqlens=cu_q, cu_seqlens_k=cu([3, 0, 7]).to("meta"))


def test_scale(inputs):
    q, k, v, g, _ = inputs
    with raises(ValueError, "scale"):
        flashgla.chunk_gla(q, k, v, g, scale=float("nan"))


def test_decode(gen):
    q, k, v, g, state = gla_inputs(gen, 3, 1, H, K, V, dtype=torch.float32)
    with raises(TypeError, "state"):
        flashgla.gla_decode_step(q, k, v, g, state.double())
    with raises(ValueError, "state"):
        flashgla.gla_decode_step(q, k, v, g, state[:2])
    with raises(ValueError, "k"):  # two tokens for q, one for k
        flashgla.gla_decode_step(q.expand(3, 2, H, K), k, v, g, state)
    with raises(ValueError, "q"):  # more than 16 tokens per sequence
        flashgla.gla_decode_step(q.expand(3, 17, H, K), k.expand(3, 17, H, K), v.expand(3, 17, H, V),
                                 g.expand(3, 17, H, K), state)
    with raises(ValueError, "v"):
        flashgla.gla_decode_step(q[:, 0], k[:, 0], v[:, 0, :1], g[:, 0], state)


def test_attention_heads(gen):
    q = randn(gen, 1, 4, 3, 8, dtype=torch.float32)
    kv = randn(gen, 1, 4, 2, 8, dtype=torch.float32)
    with raises(ValueError, "k"):  # 2 KV heads do not divide 3 query heads
        flashgla.flash_attention(q, kv, kv)


def test_empty_sequences_do_not_crash(gen):
    q, k, v, g, h0 = gla_inputs(gen, 2, 0, H, K, V, dtype=torch.float32)
    o, ht = flashgla.chunk_gla(q, k, v, g, initial_state=h0, output_final_state=True)
    assert o.shape == (2, 0, H, V)
    torch.testing.assert_close(ht, h0)  # no token: the state passes through


@pytest.mark.skipif(_C.built_with_cuda, reason="this build has the CUDA backend")
def test_cuda_tensors_without_cuda_build_raise_not_implemented():
    """ErrorKind::unsupported reaches Python as NotImplementedError (checked through flashgla._C:
    no CUDA tensor can be made here; the pointer is never read, the call stops at dispatch)."""
    fake = _C.TensorView(0x1000, _C.DTYPES["float32"], _C.DEVICE_CUDA, 0, (1, 2, 1, 4), (8, 4, 4, 1))
    args = _C.GlaForwardArgs()
    args.q = args.k = args.v = args.o = fake
    with pytest.raises(NotImplementedError, match="built without CUDA"):
        _C.gla_forward(args)


def test_args_cross_into_the_extension_as_named_structs():
    """flashgla._C takes the C++ API's args structs with their field names; a misspelt field or a value that
    is not a TensorView where a tensor goes fails at once, naming it."""
    from flashgla._torch import make_args, view

    args = _C.GlaForwardArgs()
    assert args.q is None and args.scale is None and args.algorithm == _C.GlaAlgorithm.chunked
    with pytest.raises(AttributeError, match="initial_states"):
        args.initial_states = None
    with pytest.raises(TypeError, match="flashgla: q: expected a flashgla._C.TensorView or None, got tuple"):
        args.q = (0, 1, 0, 0, (2, 3), (3, 1))
    x = torch.zeros(2, 3, 4)[:, 1]
    args = make_args(_C.GlaForwardArgs, q=x, scale=0.5, reverse=True)
    assert (args.q.shape, args.q.strides, args.q.dtype, args.q.device) == ((2, 4), (12, 1), "float32", "cpu")
    assert args.q.data == x.data_ptr() and args.scale == 0.5 and args.reverse and args.k is None
    with pytest.raises(ValueError, match="flashgla: x5: expected at most 4 dimensions, got 5"):
        view(torch.zeros(1, 1, 1, 1, 1), "x5")
