"""FLA 0.6's API on flashgla's ops: state_v_first, g_gamma, normalize (with FLA's (kv_state, z_state) pair) and
cu_seqlens_cpu, forward and backward against the fp64 references, on the CPU and (skipped without one) the GPU;
FLA 0.6's signatures; the errors of misuse."""

import inspect
import re
import warnings

import pytest
import torch
import torch.nn.functional as F

import flashgla
from testing_utils import (GRAD_TOLERANCE, TOLERANCE, assert_close, cu, gla_inputs, naive_gla, naive_normalize,
                           poisoned_outputs, randn, requires_gpu)

DEVICES = ["cpu", pytest.param("cuda", marks=requires_gpu)]


def raises(kind, argument, *fragments):
    pattern = rf"^flashgla: {re.escape(argument)}: " + "".join(rf"(?=.*{re.escape(f)})" for f in fragments)
    return pytest.raises(kind, match=pattern)


def dtype_for(device):
    """The CPU runs fp32 (tight tolerances), the GPU bf16 (what models use)."""
    return torch.float32 if device == "cpu" else torch.bfloat16


def to(device, *tensors):
    return [None if t is None else t.to(device) for t in tensors]


def grads_of(outputs, leaves, grad_outputs):
    pairs = [(o, g) for o, g in zip(outputs, grad_outputs) if o is not None]
    return torch.autograd.grad([o for o, _ in pairs], leaves, [g for _, g in pairs])


def positive(gen, *shape, dtype):
    """Feature-mapped queries and keys (as normalised linear attention uses): positive, so that q . z is away from 0."""
    return (torch.rand(*shape, generator=gen, dtype=torch.float64) + 0.05).to(dtype)


# ---- normalize ------------------------------------------------------------------------------------

NORMALIZED_OPS = {"chunk_linear_attn": False, "fused_chunk_linear_attn": False,
                  "fused_recurrent_linear_attn": False, "fused_recurrent_linear_attn_reverse": True}


def call_linear_attn(op, *args, **kwargs):
    if op == "fused_recurrent_linear_attn_reverse":
        return flashgla.fused_recurrent_linear_attn(*args, reverse=True, **kwargs)
    return getattr(flashgla, op)(*args, **kwargs)


def normalized_inputs(gen, B, T, H, K, V, N, dtype):
    """(q, k, v, h0, z_init) of a normalised linear attention, and the gradients (do, dht, dz) of its outputs."""
    q, k = positive(gen, B, T, H, K, dtype=dtype), positive(gen, B, T, H, K, dtype=dtype)
    v = randn(gen, B, T, H, V, dtype=dtype)
    h0 = randn(gen, N, H, K, V, dtype=torch.float32)
    z0 = positive(gen, N, 1, H, K, dtype=torch.float32)
    do = randn(gen, B, T, H, V, dtype=dtype)
    dht, dz = randn(gen, N, H, K, V, dtype=torch.float32), randn(gen, N, 1, H, K, dtype=torch.float32)
    return (q, k, v, h0, z0), (do, dht, dz)


def check_normalized(outputs, grads, inputs, grad_outputs, cu_seqlens, dtype, reverse=False):
    """o, both final states and the gradients of (q, k, v, h0, z_init) against the fp64 references."""
    o, ht, z = outputs
    ref = [x.detach().double().requires_grad_() for x in inputs]
    o_raw, ht_ref = naive_gla(*ref[:3], initial_state=ref[3], cu_seqlens=cu_seqlens, reverse=reverse)
    o_ref, z_ref = naive_normalize(o_raw, ref[0], ref[1], z_init=ref[4], cu_seqlens=cu_seqlens, reverse=reverse)
    ref_grads = torch.autograd.grad((o_ref, ht_ref, z_ref), ref, [g.double() for g in grad_outputs])
    assert_close(o, o_ref, TOLERANCE[dtype], "o")
    assert_close(ht, ht_ref, TOLERANCE[dtype], "kv final state")
    assert_close(z, z_ref, TOLERANCE[torch.float32], "z_state")
    for name, grad, ref_grad in zip(["dq", "dk", "dv", "dh0", "dz_init"], grads, ref_grads):
        assert_close(grad, ref_grad, GRAD_TOLERANCE[dtype], name)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("varlen", [False, True], ids=["batch", "varlen"])
@pytest.mark.parametrize("op", list(NORMALIZED_OPS))
def test_normalize_forward_and_backward(gen, op, varlen, device):
    """o = o_raw / (scale q.z + 1e-10), states (ht, z_state) and every gradient (q, k, v, h0, z_init) with
    gradients flowing into both final states, against fp64 references; an empty and a one-token sequence."""
    reverse = NORMALIZED_OPS[op]
    dtype = dtype_for(device)
    lengths = [5, 0, 1, 70, 64] if varlen else None
    B, T, H, K, V = (1, sum(lengths), 2, 16, 24) if varlen else (2, 67, 2, 16, 24)
    N = len(lengths) if varlen else B
    cu_seqlens = cu(lengths) if varlen else None
    inputs, grad_outputs = normalized_inputs(gen, B, T, H, K, V, N, dtype)
    leaves = [x.to(device).requires_grad_() for x in inputs]
    with poisoned_outputs():
        o, (ht, z) = call_linear_attn(op, *leaves[:3], initial_state=(leaves[3], leaves[4]), output_final_state=True,
                                      normalize=True, cu_seqlens=None if cu_seqlens is None else cu_seqlens.to(device))
        grads = grads_of((o, ht, z), leaves, to(device, *grad_outputs))
    assert o.dtype == dtype and ht.shape == (N, H, K, V) and z.shape == (N, 1, H, K) and z.dtype == torch.float32
    check_normalized((o, ht, z), grads, inputs, grad_outputs, cu_seqlens, dtype, reverse)


@requires_gpu
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_normalize_chunked_scan_gpu(gen, dtype, reverse):
    """The CUDA normaliser (a scan over 64-token chunks) alone, through its op, against fp64 on sequences of
    many chunks, lengths off the chunk and empty ones, at FLA's d128: o, z_state and the gradients of
    o_raw, q, k and z_init."""
    from flashgla.ops.gla import _linear_attn_normalize
    lengths = [0, 700, 1, 0, 1300]
    B, T, H, K, V, N = 1, sum(lengths), 2, 128, 128, len(lengths)
    cu_seqlens = cu(lengths)
    q, k = positive(gen, B, T, H, K, dtype=dtype), positive(gen, B, T, H, K, dtype=dtype)
    o_raw = randn(gen, B, T, H, V, dtype=dtype)
    z0 = positive(gen, N, 1, H, K, dtype=torch.float32)
    do, dz = randn(gen, B, T, H, V, dtype=dtype), randn(gen, N, 1, H, K, dtype=torch.float32)
    leaves = [x.cuda().requires_grad_() for x in (o_raw, q, k, z0)]
    with poisoned_outputs():
        o, z = _linear_attn_normalize(*leaves, cu_seqlens.cuda(), cu_seqlens, None, reverse)
        grads = torch.autograd.grad((o, z), leaves, (do.cuda(), dz.cuda()))
    ref = [x.detach().double().requires_grad_() for x in (o_raw, q, k, z0)]
    o_ref, z_ref = naive_normalize(ref[0], ref[1], ref[2], z_init=ref[3], cu_seqlens=cu_seqlens, reverse=reverse)
    ref_grads = torch.autograd.grad((o_ref, z_ref), ref, (do.double(), dz.double()))
    assert_close(o, o_ref, TOLERANCE[dtype], "o")
    assert_close(z, z_ref, TOLERANCE[torch.float32], "z_state")
    for name, grad, ref_grad in zip(["d_o_raw", "dq", "dk", "dz_init"], grads, ref_grads):
        assert_close(grad, ref_grad, GRAD_TOLERANCE[dtype], name)


def folds_the_normaliser_backward(q, k, v, cu_seqlens):
    """Whether the CUDA backward folds the normaliser in for these inputs (gla_normalize_residual_slots)."""
    from flashgla import _C
    from flashgla.ops.gla import _normalized_args
    o = torch.empty(v.shape, dtype=q.dtype, device=q.device)
    return _C.gla_normalize_residual_slots(_normalized_args(q, k, v, o, None, None, cu_seqlens, None, None)) > 0


@requires_gpu
@pytest.mark.parametrize("shape", ["varlen d128", "varlen d128 split scan", "batch K64 V128", "batch K128 V64",
                                   "batch d64", "batch d64 chain", "batch K128 V64 chain"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_normalize_folded_into_the_chunked_forward_gpu(gen, dtype, shape, monkeypatch):
    """chunk_linear_attn(normalize=True) on the GPU: the fast kernel divides by the normaliser as it stores o; in
    bf16 the backward folds the normaliser into the op's (its residuals kept by the forward; the state scans cut
    into pieces of 2 chunks in the split case), in fp16 it starts from that o; against fp64 on sequences of many
    chunks, lengths off the chunk and empty ones: o, both final states and every gradient. In the chain cases the
    chunk kernel hands the key sum's gradient from chunk to chunk itself (FLASHGLA_GLA_BWD_NORM=chain)."""
    if shape == "varlen d128 split scan":
        monkeypatch.setenv("FLASHGLA_GLA_BWD_SCAN_SPLIT", "2")
    if shape.endswith(" chain"):
        monkeypatch.setenv("FLASHGLA_GLA_BWD_NORM", "chain")
        shape = shape[:-len(" chain")]
    if shape.startswith("varlen d128"):
        lengths = [0, 700, 1, 0, 1300]
        B, T, H, K, V, N = 1, sum(lengths), 2, 128, 128, len(lengths)
        cu_seqlens = cu(lengths)
    else:
        B, T, H, K, V = {"batch K64 V128": (2, 300, 2, 64, 128), "batch K128 V64": (2, 300, 2, 128, 64),
                         "batch d64": (3, 129, 2, 64, 64)}[shape]
        N, cu_seqlens = B, None
    inputs, grad_outputs = normalized_inputs(gen, B, T, H, K, V, N, dtype)
    leaves = [x.cuda().requires_grad_() for x in inputs]
    cu_dev = None if cu_seqlens is None else cu_seqlens.cuda()
    assert folds_the_normaliser_backward(*leaves[:3], cu_dev) == (dtype == torch.bfloat16)
    with poisoned_outputs():
        o, (ht, z) = flashgla.chunk_linear_attn(*leaves[:3], initial_state=(leaves[3], leaves[4]),
                                                output_final_state=True, cu_seqlens=cu_dev)
        grads = grads_of((o, ht, z), leaves, to("cuda", *grad_outputs))
    check_normalized((o, ht, z), grads, inputs, grad_outputs, cu_seqlens, dtype)


@requires_gpu
@pytest.mark.parametrize("D", [64, 128])
def test_normalize_chain_sums_as_the_passes_gpu(gen, D, monkeypatch):
    """The folded normaliser's two ways to the key sum's gradient dz after each chunk (bf16): the chain inside the
    chunk kernel sums dz in the passes' order, so d_z_init comes out bit for bit the same, and so do dq, dv and
    dh0; dk, which the chain rounds once instead of twice, agrees to bf16 rounding. Reruns of the chain are
    bitwise equal."""
    B, T, H = 3, 64 * 9 + 17, 5
    inputs, grad_outputs = normalized_inputs(gen, B, T, H, D, D, B, torch.bfloat16)
    leaves = [x.cuda().requires_grad_() for x in inputs]
    assert folds_the_normaliser_backward(*leaves[:3], None)

    def gradients(way):
        monkeypatch.setenv("FLASHGLA_GLA_BWD_NORM", way)
        o, (ht, z) = flashgla.chunk_linear_attn(*leaves[:3], initial_state=(leaves[3], leaves[4]),
                                                output_final_state=True)
        return grads_of((o, ht, z), leaves, to("cuda", *grad_outputs))

    passes, chain, again = gradients("passes"), gradients("chain"), gradients("chain")
    for name, x, y, z in zip(["dq", "dk", "dv", "dh0", "dz_init"], passes, chain, again):
        assert torch.equal(y, z), f"{name}: the chain's reruns differ"
        if name == "dk":
            torch.testing.assert_close(y.float(), x.float(), rtol=1.6e-2, atol=1e-2 * x.float().abs().max().item())
        else:
            assert torch.equal(x, y), f"{name}: the chain and the passes differ"


@pytest.mark.parametrize("device", DEVICES)
def test_normalize_is_the_default_and_keeps_fla_conventions(gen, device):
    """chunk_linear_attn normalises by default (FLA 0.6); the pair comes back even without output_final_state;
    a plain tensor initial_state is the kv state with the key sum starting from zero (FLA's reading); an absent
    z_state gives the same as zeros."""
    dtype = dtype_for(device)
    B, T, H, K, V = 2, 40, 2, 8, 8
    q, k = (positive(gen, B, T, H, K, dtype=dtype).to(device) for _ in range(2))
    v = randn(gen, B, T, H, V, dtype=dtype).to(device)
    h0 = randn(gen, B, H, K, V, dtype=torch.float32).to(device)
    o, state = flashgla.chunk_linear_attn(q, k, v)
    assert isinstance(state, tuple) and state[0] is None and state[1].shape == (B, 1, H, K)
    o_raw, _ = flashgla.chunk_linear_attn(q, k, v, normalize=False)
    o_ref, _ = naive_normalize(o_raw.cpu(), q.cpu(), k.cpu())
    assert_close(o, o_ref, TOLERANCE[dtype], "default (normalised) o")
    assert (o - o_raw).abs().max() > 1e-2  # the normaliser is not a no-op on these inputs
    o_plain, (ht_plain, _) = flashgla.chunk_linear_attn(q, k, v, initial_state=h0, output_final_state=True)
    zeros = torch.zeros(B, 1, H, K, device=device)
    o_pair, (ht_pair, _) = flashgla.chunk_linear_attn(q, k, v, initial_state=(h0, zeros), output_final_state=True)
    o_none, _ = flashgla.chunk_linear_attn(q, k, v, initial_state=(h0, None))
    torch.testing.assert_close(o_plain, o_pair)
    torch.testing.assert_close(o_none, o_pair)
    torch.testing.assert_close(ht_plain, ht_pair)
    # Chaining: the second half from the first half's (kv_state, z_state) equals the whole.
    o_all, (ht_all, z_all) = flashgla.chunk_linear_attn(q, k, v, output_final_state=True)
    o_a, state_a = flashgla.chunk_linear_attn(q[:, :17], k[:, :17], v[:, :17], output_final_state=True)
    o_b, (ht_b, z_b) = flashgla.chunk_linear_attn(q[:, 17:], k[:, 17:], v[:, 17:], initial_state=state_a,
                                                  output_final_state=True)
    assert_close(torch.cat([o_a, o_b], 1), o_all, TOLERANCE[dtype], "chained o")
    assert_close(z_b, z_all, TOLERANCE[torch.float32], "chained z_state")


# ---- g_gamma ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("varlen", [False, True], ids=["batch", "varlen"])
@pytest.mark.parametrize("with_g", [False, True], ids=["gamma_alone", "gamma_plus_g"])
@pytest.mark.parametrize("op", ["chunk_simple_gla", "fused_recurrent_simple_gla"])
def test_g_gamma(gen, op, with_g, varlen, device):
    """The gate of step t is g_t + g_gamma (g_gamma alone without g), as in FLA; gradients of q, k, v, g, h0 and
    g_gamma (the sum of the gate's gradient over every token) against the fp64 recurrence."""
    dtype = dtype_for(device)
    lengths = [3, 0, 66, 9] if varlen else None
    B, T, H, K, V = (1, sum(lengths), 3, 16, 8) if varlen else (2, 70, 3, 16, 8)
    N = len(lengths) if varlen else B
    cu_seqlens = cu(lengths) if varlen else None
    q, k, v, g, h0 = gla_inputs(gen, B, T, H, K, V, gate="scalar", num_states=N, dtype=dtype)
    g = g if with_g else None
    g_gamma = -torch.rand(H, generator=gen, dtype=torch.float64).float() * 0.3 - 0.01
    do, dht = randn(gen, B, T, H, V, dtype=dtype), randn(gen, N, H, K, V, dtype=torch.float32)
    inputs = [x for x in (q, k, v, g, g_gamma, h0) if x is not None]
    leaves = [x.to(device).requires_grad_() for x in inputs]
    lq, lk, lv = leaves[:3]
    lg = leaves[3] if with_g else None
    with poisoned_outputs():
        o, ht = getattr(flashgla, op)(lq, lk, lv, lg, leaves[-2], initial_state=leaves[-1], output_final_state=True,
                                      cu_seqlens=None if cu_seqlens is None else cu_seqlens.to(device))
        grads = grads_of((o, ht), leaves, to(device, do, dht))
    ref = [x.detach().double().requires_grad_() for x in inputs]
    gate = ref[-2][None, None, :].expand(B, T, H) + (ref[3] if with_g else 0)
    o_ref, ht_ref = naive_gla(*ref[:3], gate, initial_state=ref[-1], cu_seqlens=cu_seqlens)
    ref_grads = torch.autograd.grad((o_ref, ht_ref), ref, (do.double(), dht.double()))
    assert_close(o, o_ref, TOLERANCE[dtype], "o")
    assert_close(ht, ht_ref, TOLERANCE[dtype], "final_state")
    names = ["dq", "dk", "dv"] + (["dg"] if with_g else []) + ["d_g_gamma", "dh0"]
    for name, grad, ref_grad, x in zip(names, grads, ref_grads, leaves):
        assert grad.dtype == x.dtype, f"{name}: dtype {grad.dtype}, expected {x.dtype}"
        assert_close(grad, ref_grad, GRAD_TOLERANCE[dtype], name)


# ---- state_v_first ------------------------------------------------------------------------------------

STATE_OPS = {"chunk_gla": "vector", "chunk_simple_gla": "scalar", "fused_recurrent_gla": "vector",
             "fused_recurrent_simple_gla": "scalar", "fused_recurrent_gla_reverse": "vector",
             "fused_recurrent_simple_gla_reverse": "scalar"}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("varlen", [False, True], ids=["batch", "varlen"])
@pytest.mark.parametrize("op", list(STATE_OPS))
def test_state_v_first(gen, op, varlen, device):
    """initial_state, final_state, dh0 (and the final state's gradient) laid out [N, H, V, K]: the fp64 recurrence's
    results, transposed (the recurrent ops also with reverse=True)."""
    reverse = op.endswith("_reverse")
    function = getattr(flashgla, op.removesuffix("_reverse"))
    extra = {"reverse": True} if reverse else {}
    dtype = dtype_for(device)
    lengths = [2, 0, 70] if varlen else None
    B, T, H, K, V = (1, sum(lengths), 2, 16, 24) if varlen else (2, 65, 2, 16, 24)
    N = len(lengths) if varlen else B
    cu_seqlens = cu(lengths) if varlen else None
    q, k, v, g, h0 = gla_inputs(gen, B, T, H, K, V, gate=STATE_OPS[op], num_states=N, dtype=dtype)
    h0_vk = h0.transpose(-1, -2).contiguous()  # [N, H, V, K]
    do, dht_vk = randn(gen, B, T, H, V, dtype=dtype), randn(gen, N, H, V, K, dtype=torch.float32)
    leaves = [x.to(device).requires_grad_() for x in (q, k, v, g, h0_vk)]
    with poisoned_outputs():
        o, ht = function(*leaves[:4], initial_state=leaves[4], output_final_state=True, state_v_first=True,
                         cu_seqlens=None if cu_seqlens is None else cu_seqlens.to(device), **extra)
        grads = grads_of((o, ht), leaves, to(device, do, dht_vk))
    assert ht.shape == (N, H, V, K) and grads[4].shape == (N, H, V, K)
    ref = [x.detach().double().requires_grad_() for x in (q, k, v, g, h0)]
    o_ref, ht_ref = naive_gla(*ref[:4], initial_state=ref[4], cu_seqlens=cu_seqlens, reverse=reverse)
    ref_grads = torch.autograd.grad((o_ref, ht_ref), ref, (do.double(), dht_vk.double().transpose(-1, -2)))
    assert_close(o, o_ref, TOLERANCE[dtype], "o")
    assert_close(ht, ht_ref.transpose(-1, -2), TOLERANCE[dtype], "final_state [N, H, V, K]")
    for name, grad, ref_grad in zip(["dq", "dk", "dv", "dg"], grads, ref_grads):
        assert_close(grad, ref_grad, GRAD_TOLERANCE[dtype], name)
    assert_close(grads[4], ref_grads[4].transpose(-1, -2), GRAD_TOLERANCE[dtype], "dh0 [N, H, V, K]")


# ---- cu_seqlens_cpu --------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["chunk_gla", "chunk_simple_gla", "chunk_linear_attn", "fused_recurrent_gla",
                                "fused_recurrent_simple_gla", "fused_recurrent_linear_attn",
                                "fused_chunk_linear_attn"])
def test_cu_seqlens_cpu(gen, op, device):
    """FLA's cu_seqlens_cpu is flashgla's cu_seqlens_host: the same results, values checked on the host."""
    lengths = [4, 0, 30]
    gate = {"chunk_gla": "vector", "fused_recurrent_gla": "vector", "chunk_simple_gla": "scalar",
            "fused_recurrent_simple_gla": "scalar"}.get(op)
    q, k, v, g, _ = gla_inputs(gen, 1, sum(lengths), 2, 8, 8, gate=gate, dtype=dtype_for(device))
    q, k = q.abs() + 0.05, k.abs() + 0.05  # the normalised ops divide by q . z
    q, k, v, g = to(device, q, k, v, g)
    cu_seqlens = cu(lengths)
    function = getattr(flashgla, op)
    call = (lambda **kw: function(q, k, v, g, **kw)) if gate else (lambda **kw: function(q, k, v, **kw))
    o_host, _ = call(cu_seqlens=cu_seqlens.to(device), cu_seqlens_host=cu_seqlens)
    o_cpu, _ = call(cu_seqlens=cu_seqlens.to(device), cu_seqlens_cpu=cu_seqlens)
    torch.testing.assert_close(o_cpu, o_host, rtol=0, atol=0)
    o_both, _ = call(cu_seqlens=cu_seqlens.to(device), cu_seqlens_cpu=cu_seqlens, cu_seqlens_host=cu_seqlens.clone())
    torch.testing.assert_close(o_both, o_host, rtol=0, atol=0)
    with raises(ValueError, "cu_seqlens_cpu", "cu_seqlens_host"):
        call(cu_seqlens=cu_seqlens.to(device), cu_seqlens_cpu=cu_seqlens, cu_seqlens_host=cu([4, 1, 29]))
    with raises(ValueError, "cu_seqlens_host", "end"):  # checked on the host (under flashgla's name): the end is T
        call(cu_seqlens=cu_seqlens.to(device), cu_seqlens_cpu=cu([4, 0, 31]))


# ---- signatures -------------------------------------------------------------------------------------

# FLA 0.6.0's parameters (name, default) in order, for the ops flashgla has; flashgla may add keyword-only ones.
_E = inspect.Parameter.empty
FLA_SIGNATURES = {
    "chunk_gla": [("q", _E), ("k", _E), ("v", _E), ("g", _E), ("scale", None), ("initial_state", None),
                  ("output_final_state", False), ("state_v_first", False), ("cu_seqlens", None),
                  ("cu_seqlens_cpu", None)],
    "chunk_simple_gla": [("q", _E), ("k", _E), ("v", _E), ("g", None), ("g_gamma", None), ("scale", None),
                         ("initial_state", None), ("output_final_state", False), ("state_v_first", False),
                         ("cu_seqlens", None), ("cu_seqlens_cpu", None)],
    "fused_recurrent_gla": [("q", _E), ("k", _E), ("v", _E), ("gk", None), ("gv", None), ("scale", None),
                            ("initial_state", None), ("output_final_state", False), ("reverse", False),
                            ("state_v_first", False), ("cu_seqlens", None)],
    "fused_recurrent_simple_gla": [("q", _E), ("k", _E), ("v", _E), ("g", None), ("g_gamma", None), ("scale", None),
                                   ("initial_state", None), ("output_final_state", False), ("reverse", False),
                                   ("state_v_first", False), ("cu_seqlens", None)],
    "chunk_linear_attn": [("q", _E), ("k", _E), ("v", _E), ("scale", None), ("initial_state", None),
                          ("output_final_state", False), ("normalize", True), ("cu_seqlens", None)],
    "fused_chunk_linear_attn": [("q", _E), ("k", _E), ("v", _E), ("scale", None), ("initial_state", None),
                                ("output_final_state", False), ("normalize", True), ("cu_seqlens", None)],
    "fused_recurrent_linear_attn": [("q", _E), ("k", _E), ("v", _E), ("scale", None), ("initial_state", None),
                                    ("output_final_state", False), ("reverse", False), ("normalize", False),
                                    ("cu_seqlens", None)],
}


@pytest.mark.parametrize("op", list(FLA_SIGNATURES))
def test_signatures_match_fla_0_6(op):
    params = list(inspect.signature(getattr(flashgla, op)).parameters.values())
    positional = [(p.name, p.default) for p in params if p.kind == p.POSITIONAL_OR_KEYWORD]
    assert positional == FLA_SIGNATURES[op]
    keyword = {p.name for p in params if p.kind == p.KEYWORD_ONLY}
    assert "cu_seqlens_host" in keyword
    assert "cu_seqlens_cpu" in keyword or "cu_seqlens_cpu" in dict(positional)


# ---- errors -------------------------------------------------------------------------------------------

def test_errors_name_the_argument(gen):
    q, k, v, g, h0 = gla_inputs(gen, 2, 9, 3, 8, 4, gate="scalar", dtype=torch.float32)
    gamma = -torch.rand(3, generator=gen)
    with raises(ValueError, "g_gamma", "[H]"):
        flashgla.chunk_simple_gla(q, k, v, g, gamma[:2])
    with raises(ValueError, "g_gamma", "[H]"):
        flashgla.chunk_simple_gla(q, k, v, g, gamma[None])
    with raises(TypeError, "g_gamma"):
        flashgla.chunk_simple_gla(q, k, v, g, gamma.to(torch.int32))
    with raises(TypeError, "g_gamma", "scale"):  # FLA 0.5's positional scale lands on g_gamma
        flashgla.chunk_simple_gla(q, k, v, g, 0.5)
    with raises(ValueError, "g_gamma", "check_gate"):
        flashgla.chunk_simple_gla(q, k, v, g, -gamma, check_gate=True)
    with raises(ValueError, "initial_state", "[N, H, V, K]"):
        flashgla.chunk_simple_gla(q, k, v, g, initial_state=h0, state_v_first=True)
    with raises(TypeError, "state_v_first", "cu_seqlens"):  # FLA 0.5's positional cu_seqlens
        flashgla.chunk_gla(q, k, v, F.logsigmoid(q), None, None, False, cu([9]))
    with raises(TypeError, "normalize", "cu_seqlens"):
        flashgla.chunk_linear_attn(q, k, v, None, None, False, cu([9]))
    with raises(TypeError, "normalize", "reverse"):  # fused_recurrent_linear_attn: reverse comes first
        flashgla.fused_recurrent_linear_attn(q, k, v, None, None, False, False, cu([9]))
    with raises(TypeError, "gv", "scale"):
        flashgla.fused_recurrent_gla(q, k, v, F.logsigmoid(q), 0.5)
    with raises(NotImplementedError, "gv"):
        flashgla.fused_recurrent_gla(q, k, v, F.logsigmoid(q), F.logsigmoid(v))
    with raises(TypeError, "initial_state", "normalize=False"):
        flashgla.chunk_linear_attn(q, k, v, initial_state=(h0, None), normalize=False)
    with raises(ValueError, "initial_state", "pair"):
        flashgla.chunk_linear_attn(q, k, v, initial_state=(h0,))
    with raises(ValueError, "initial_state", "z_state [N, 1, H, K] = [2, 1, 3, 8]", "[2, 3, 8]"):
        flashgla.chunk_linear_attn(q, k, v, initial_state=(h0, torch.zeros(2, 3, 8)))
    with raises(ValueError, "initial_state", "z_state [N, 1, H, K] = [2, 1, 3, 8]", "[1, 1, 3, 8]"):
        flashgla.chunk_linear_attn(q, k, v, initial_state=(h0, torch.zeros(1, 1, 3, 8)))
    with raises(ValueError, "z_init", "[N, 1, H, K]"):  # the normaliser op itself: the C++ API's name
        flashgla.ops.gla._linear_attn_normalize(v, q, k, torch.zeros(2, 3, 8), None, None, None, False)
    with raises(TypeError, "reverse", "cu_seqlens"):  # FLA 0.6: reverse comes after output_final_state
        flashgla.fused_recurrent_linear_attn(q, k, v, None, None, False, cu([9]))
    with raises(TypeError, "reverse", "cu_seqlens"):
        flashgla.fused_recurrent_gla(q, k, v, F.logsigmoid(q), None, None, None, False, cu([9]))
    with raises(ValueError, "transpose_state_layout"):
        flashgla.fused_recurrent_gla(q, k, v, transpose_state_layout=True, state_v_first=True)


def test_g_gamma_through_the_c_api_rejects_a_per_key_gate(gen):
    """The C++ API says g_gamma goes with a scalar gate (FLA has it on simple GLA only)."""
    q, k, v, g, _ = gla_inputs(gen, 1, 5, 2, 4, 4, gate="vector", dtype=torch.float32)
    with raises(ValueError, "g_gamma", "scalar gate"):
        flashgla.ops.gla._chunk_gla(q, k, v, g, None, None, None, None, False, False, torch.zeros(2), False)


def test_context_parallel_options_need_a_cp_context(gen):
    """normalize, g_gamma and state_v_first go the CP path (tests/python/cp_cases.py); a cp_context that is no
    CPContext is a TypeError naming it."""
    q, k, v, g, _ = gla_inputs(gen, 1, 8, 2, 4, 4, gate="scalar", dtype=torch.float32)
    with raises(TypeError, "cp_context", "build_cp_context"):
        flashgla.chunk_linear_attn(q, k, v, cp_context=object())
    with raises(TypeError, "cp_context", "build_cp_context"):
        flashgla.chunk_simple_gla(q, k, v, g, -torch.rand(2), cp_context=object())
    with raises(TypeError, "cp_context", "build_cp_context"):
        flashgla.chunk_gla(q, k, v, F.logsigmoid(q), state_v_first=True, cp_context=object())


def test_fla_keywords(gen):
    """chunk_size (checked as FLA does, otherwise without effect) and the deprecated transpose_state_layout."""
    q, k, v, g, h0 = gla_inputs(gen, 1, 20, 2, 4, 4, gate="scalar", dtype=torch.float32)
    o, _ = flashgla.chunk_simple_gla(q, k, v, g)
    torch.testing.assert_close(flashgla.chunk_simple_gla(q, k, v, g, chunk_size=16)[0], o, rtol=0, atol=0)
    with raises(ValueError, "chunk_size", "power of 2"):
        flashgla.chunk_simple_gla(q, k, v, g, chunk_size=48)
    h0_vk = h0.transpose(-1, -2).contiguous()
    for op in (flashgla.fused_recurrent_gla, flashgla.fused_recurrent_simple_gla):
        with pytest.warns(DeprecationWarning, match="transpose_state_layout"):
            _, ht = op(q, k, v, g, initial_state=h0_vk, output_final_state=True, transpose_state_layout=True)
        _, ht_ref = op(q, k, v, g, initial_state=h0, output_final_state=True)
        torch.testing.assert_close(ht, ht_ref.transpose(-1, -2))


@pytest.mark.parametrize("op", ["fused_recurrent_gla", "fused_recurrent_simple_gla"])
def test_transpose_state_layout_is_deprecated_as_in_fla(gen, op):
    """FLA 0.6: transpose_state_layout given at all warns (DeprecationWarning, pointing at the caller) and is
    state_v_first; given with a true state_v_first, ValueError; without it, no warning."""
    q, k, v, g, h0 = gla_inputs(gen, 1, 6, 2, 4, 4, gate="scalar", dtype=torch.float32)
    run = getattr(flashgla, op)
    with pytest.warns(DeprecationWarning, match="transpose_state_layout.*state_v_first") as record:
        _, ht = run(q, k, v, g, initial_state=h0, output_final_state=True, transpose_state_layout=False)
    assert record[0].filename == __file__, "the warning should point at the caller"
    torch.testing.assert_close(ht, run(q, k, v, g, initial_state=h0, output_final_state=True)[1], rtol=0, atol=0)
    with pytest.warns(DeprecationWarning):
        run(q, k, v, g, transpose_state_layout=True)
    with raises(ValueError, "transpose_state_layout", "state_v_first"):
        run(q, k, v, g, state_v_first=True, transpose_state_layout=True)
    with raises(ValueError, "transpose_state_layout", "state_v_first"):
        run(q, k, v, g, state_v_first=True, transpose_state_layout=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run(q, k, v, g, state_v_first=True)
