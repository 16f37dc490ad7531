"""The forward's intra-chunk scores A saved for the backward (flashgla/gla.h, GlaForwardArgs::intra): what the
fast forward kernel writes against A computed here, the backward that reads them against the one that
recomputes them (dq, dk and dg do not read A: bitwise; dv within bf16 rounding) and against the fp64 reference,
which inputs ask for them (gla_forward_saves_intra) and the errors of a misuse."""

import pytest
import torch
import torch.nn.functional as F

import flashgla
from flashgla import _C
from flashgla._torch import make_args
from flashgla.ops.gla import _intra_output, _run_backward_all, _run_forward
from testing_utils import assert_close, naive_gla, requires_gpu

CHUNKED = _C.GlaAlgorithm.chunked


def _inputs(B, T, H, K, V, device, dtype=torch.bfloat16, gate_dtype=None, seed=0, neg_inf_at=()):
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, T, H, K, generator=gen) for _ in range(2))
    v, do = (torch.randn(B, T, H, V, generator=gen) for _ in range(2))
    g = F.logsigmoid(torch.randn(B, T, H, K, generator=gen) + 2.0)
    for t in neg_inf_at:
        if t < T:
            g[:, t, :, ::3] = float("-inf")
    return ([t.to(device, dtype) for t in (q, k, v, do)]) + [g.to(device, gate_dtype or dtype)]


def _reference_intra(q, k, g, cu_seqlens=None):
    """A of every chunk of 64 tokens of each sequence, unscaled, in fp64: [B, T, H, 64]."""
    B, T, H, _ = q.shape
    q, k, g = q.double().cpu(), k.double().cpu(), g.double().cpu()
    out = torch.zeros(B, T, H, 64, dtype=torch.float64)
    bounds = [(b, 0, T) for b in range(B)] if cu_seqlens is None else [
        (0, s, e) for s, e in zip(cu_seqlens.tolist()[:-1], cu_seqlens.tolist()[1:])]
    for b, start, end in bounds:
        for c0 in range(start, end, 64):
            c1 = min(c0 + 64, end)
            n = c1 - c0
            w = torch.zeros(n, n, H, g.shape[-1], dtype=torch.float64)  # exp Σ_{j<u≤i} g_u (exact with −inf)
            for j in range(n):
                w[j, j] = 1.0
                w[j + 1:, j] = g[b, c0 + j + 1:c1].cumsum(0).exp()
            a = torch.einsum("ihk,jhk,ijhk->ihj", q[b, c0:c1], k[b, c0:c1], w)
            out[b, c0:c1, :, :n] = a
    return out


def _forward(q, k, v, g, h0=None, cu=None, save=True):
    intra = _intra_output(CHUNKED, q, k, v, g, False, None, True) if save else None
    o, ht = _run_forward(CHUNKED, q, k, v, g, h0, cu, None if cu is None else cu.cpu(), None, False, True,
                         intra=intra)
    return o, ht, intra


def _backward(q, k, v, g, h0, cu, do, intra):
    return _run_backward_all(CHUNKED, q, k, v, g, h0, cu, None if cu is None else cu.cpu(), do, None, None, False,
                             h0 is not None, intra=intra)


@requires_gpu
@pytest.mark.parametrize("dtype,gate_dtype", [(torch.bfloat16, None), (torch.bfloat16, torch.float32),
                                              (torch.float16, None)])
@pytest.mark.parametrize("B,T,H,K,V", [(2, 200, 3, 64, 64), (1, 130, 2, 128, 128), (2, 64, 2, 64, 128),
                                       (1, 100, 2, 128, 64), (1, 130, 2, 128, 256), (1, 100, 2, 256, 64)])
def test_intra_written_and_read(dtype, gate_dtype, B, T, H, K, V):
    q, k, v, do, g = _inputs(B, T, H, K, V, "cuda", dtype, gate_dtype, neg_inf_at=(5, 70))
    h0 = torch.randn(B, H, K, V, device="cuda")
    o, ht, intra = _forward(q, k, v, g, h0)
    o_plain, ht_plain, _ = _forward(q, k, v, g, h0, save=False)
    assert torch.equal(o, o_plain) and torch.equal(ht, ht_plain), "writing intra changes nothing else"
    assert intra.shape == (B, T, H, 64) and intra.dtype == dtype
    ref = _reference_intra(q, k, g.float())
    assert_close(intra.double().cpu(), ref, 1e-2, "intra")

    saved = _backward(q, k, v, g, h0, None, do, intra)
    recomputed = _backward(q, k, v, g, h0, None, do, None)
    for name, a, b in zip(("dq", "dk", "dg", "dh0"), (saved[0], saved[1], saved[3], saved[4]),
                          (recomputed[0], recomputed[1], recomputed[3], recomputed[4])):
        assert torch.equal(a, b), f"{name} does not read A"
    assert_close(saved[2].float(), recomputed[2].float(), 1e-2, "dv from the saved A")

    # Against the fp64 reference, through the op's autograd (which saves intra itself).
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, g, h0)]
    o_op, _ = flashgla.chunk_gla(*leaves[:4], initial_state=leaves[4], output_final_state=False)
    torch.autograd.backward(o_op, do)
    ref_leaves = [t.detach().double().cpu().requires_grad_() for t in (q, k, v, g, h0)]
    o_ref, _ = naive_gla(*ref_leaves[:4], initial_state=ref_leaves[4])
    torch.autograd.backward(o_ref, do.double().cpu())
    for name, a, b in zip(("dq", "dk", "dv", "dg", "dh0"), leaves, ref_leaves):
        assert_close(a.grad.double().cpu(), b.grad, 2e-2, name)


@requires_gpu
def test_intra_varlen():
    cu = torch.tensor([0, 70, 71, 200, 330], device="cuda", dtype=torch.int32)
    q, k, v, do, g = _inputs(1, 330, 2, 64, 64, "cuda")
    o, _, intra = _forward(q, k, v, g, cu=cu)
    assert_close(intra.double().cpu(), _reference_intra(q, k, g.float(), cu.cpu()), 1e-2, "intra (varlen)")
    saved = _backward(q, k, v, g, None, cu, do, intra)
    recomputed = _backward(q, k, v, g, None, cu, do, None)
    assert torch.equal(saved[0], recomputed[0]) and torch.equal(saved[3], recomputed[3])
    assert_close(saved[2].float(), recomputed[2].float(), 1e-2, "dv (varlen)")


@requires_gpu
def test_which_inputs_save_intra():
    def asks(q, k, v, g):
        o = torch.empty(v.shape, dtype=q.dtype, device=q.device)
        return _C.gla_forward_saves_intra(make_args(_C.GlaForwardArgs, q=q, k=k, v=v, g=g, o=o))

    q, k, v, _, g = _inputs(1, 64, 2, 64, 64, "cuda")
    assert asks(q, k, v, g)
    assert not asks(q, k, v, None), "no gate"
    assert not asks(q, k, v, g[..., 0]), "a scalar gate"
    assert not asks(q.float(), k.float(), v.float(), g.float()), "fp32 inputs"
    hopper = torch.cuda.get_device_capability() == (9, 0)
    q2, k2, v2, _, g2 = _inputs(1, 64, 2, 256, 128, "cuda")
    assert asks(q2, k2, v2, g2) == hopper, "K = 256: the Hopper path's (sm_90)"
    q4, k4, v4, _, g4 = _inputs(1, 64, 2, 100, 64, "cuda")
    assert asks(q4, k4, v4, g4) == hopper, "K = 100: q and k rows not 16-byte aligned, the Hopper path's (sm_90)"
    q3, k3, v3, _, g3 = _inputs(1, 64, 2, 64, 100, "cuda")
    assert not asks(q3, k3, v3, g3), "V = 100: v rows not 16-byte aligned"
    # Allocated from metadata but not written there: the backward recomputes A.
    intra = _intra_output(CHUNKED, q3, k3, v3, g3, False, None, True)
    assert intra.shape == (1, 64, 2, 64)
    do3 = torch.randn_like(v3)
    intra.fill_(float("nan"))
    _run_forward(CHUNKED, q3, k3, v3, g3, None, None, None, None, False, False, intra=intra)
    assert intra.isnan().all(), "not written where gla_forward_saves_intra is false"
    grads = _backward(q3, k3, v3, g3, None, None, do3, intra)
    assert all(torch.isfinite(t).all() for t in grads[:4]), "not read where it was not written"


def test_intra_errors_on_the_cpu():
    q, k, v, do, g = _inputs(1, 10, 2, 8, 8, "cpu", torch.float32)
    o = torch.empty_like(v)
    args = make_args(_C.GlaForwardArgs, q=q, k=k, v=v, g=g, o=o)
    assert not _C.gla_forward_saves_intra(args)
    args.intra = flashgla._torch.view(torch.empty(1, 10, 2, 64), "intra")
    with pytest.raises(NotImplementedError, match="intra"):
        _C.gla_forward(args)
    args.intra = flashgla._torch.view(torch.empty(1, 10, 2, 32), "intra")
    with pytest.raises(ValueError, match=r"intra.*\[B, T, H, 64\]"):
        _C.gla_forward(args)
    args.intra = flashgla._torch.view(torch.empty(1, 10, 2, 64, dtype=torch.float64), "intra")
    with pytest.raises(TypeError, match="intra"):
        _C.gla_forward(args)
    args.intra = flashgla._torch.view(torch.empty(1, 10, 64, 2).transpose(2, 3), "intra")
    with pytest.raises(ValueError, match="intra.*contiguous"):
        _C.gla_forward(args)
    # The backward checks it as an input of the same shape and dtype.
    with pytest.raises(ValueError, match=r"intra.*\[B, T, H, 64\]"):
        _backward(q, k, v, g, None, None, do, torch.empty(1, 10, 2, 63))
    with pytest.raises(TypeError, match="intra"):
        _backward(q, k, v, g, None, None, do, torch.empty(1, 10, 2, 64, dtype=torch.float64))
    # The backward reads intra only where the forward writes it: on the CPU it recomputes, whatever intra holds.
    nan = torch.full((1, 10, 2, 64), float("nan"))
    with_intra = _backward(q, k, v, g, None, None, do, nan)
    without = _backward(q, k, v, g, None, None, do, None)
    for a, b in zip(with_intra[:4], without[:4]):
        assert torch.equal(a, b)
    assert _intra_output(CHUNKED, q, k, v, g, False, None, True).numel() == 0, "no intra asked for on the CPU"


def test_chunk_gla_saves_intra_only_for_a_backward(monkeypatch):
    """chunk_gla asks its op for A only where autograd will run the backward: inference keeps neither the memory
    nor the forward's store."""
    import flashgla.ops.gla as gla_ops
    asked = []
    real = gla_ops._chunk_gla

    def spy(*args):
        asked.append(args[-1])
        return real(*args)

    monkeypatch.setattr(gla_ops, "_chunk_gla", spy)
    q, k, v, _, g = _inputs(1, 10, 2, 8, 8, "cpu", torch.float32)
    flashgla.chunk_gla(q, k, v, g)
    flashgla.chunk_gla(q, k, v, g.requires_grad_())
    with torch.no_grad():
        flashgla.chunk_gla(q, k, v, g)
    assert asked == [False, True, False]


@requires_gpu
def test_no_intra_without_grad():
    q, k, v, _, g = _inputs(1, 64, 2, 64, 64, "cuda")
    assert _C.GLA_INTRA_COLUMNS == 64
    assert gla_ops_chunk_gla(q, k, v, g, False)[2].numel() == 0
    assert gla_ops_chunk_gla(q, k, v, g, True)[2].shape == (1, 64, 2, 64)


def gla_ops_chunk_gla(q, k, v, g, save_intra):
    return flashgla.ops.gla._chunk_gla(q, k, v, g, None, None, None, None, False, False, None, False, save_intra)
