"""The per-segment summaries of context parallelism, chunk_gla_segment_states and
chunk_gla_segment_state_grads: against their fp64 definitions, against chunk_gla's final state and
initial-state gradient, -inf gates, torch.compile/opcheck, bad arguments; CUDA twins (skipped without GPU)."""

import math

import pytest
import torch

import flashgla
from testing_utils import (assert_close, cu, gla_inputs, poisoned_outputs, randn, requires_gpu,
                           sequences)

# Summaries are fp32 (fp64 for fp64 inputs); bf16/fp16 inputs are read exactly and accumulated in fp32 on the
# CPU; on CUDA they go through the tensor cores with the gated keys (queries) rounded to the input dtype.
SUMMARY_TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5, torch.bfloat16: 1e-4, torch.float16: 1e-4}
CUDA_TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 5e-3, torch.float16: 5e-3}


def _dense_gate(g, b, begin, end, K):
    """g of one segment as [len, H, K] fp64 (zeros without a gate, a scalar gate repeated over K)."""
    if g is None:
        return None
    piece = g[b, begin:end].double()
    return piece[..., None].expand(*piece.shape, K) if g.dim() == 3 else piece


def reference_states(k, v, g=None, cu_seqlens=None):
    """S and a of every segment in fp64, from the definition with running sums of g (exact for -inf)."""
    B, T, H, K = k.shape
    V = v.shape[-1]
    states, decays = [], []
    for b, begin, end in sequences(B, T, cu_seqlens):
        S = torch.zeros(H, K, V, dtype=torch.float64)
        after = torch.zeros(H, K, dtype=torch.float64)  # sum of g over the later tokens
        gate = _dense_gate(g, b, begin, end, K)
        for t in range(end - 1, begin - 1, -1):
            weighted = k[b, t].double() * after.exp()
            S = S + weighted[:, :, None] * v[b, t].double()[:, None, :]
            if gate is not None:
                after = after + gate[t - begin]
        states.append(S)
        decays.append(after)
    return torch.stack(states), torch.stack(decays)


def reference_state_grads(q, do, g=None, scale=None, cu_seqlens=None):
    B, T, H, K = q.shape
    V = do.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    out = []
    for b, begin, end in sequences(B, T, cu_seqlens):
        D = torch.zeros(H, K, V, dtype=torch.float64)
        upto = torch.zeros(H, K, dtype=torch.float64)
        gate = _dense_gate(g, b, begin, end, K)
        for t in range(begin, end):
            if gate is not None:
                upto = upto + gate[t - begin]
            weighted = scale * q[b, t].double() * upto.exp()
            D = D + weighted[:, :, None] * do[b, t].double()[:, None, :]
        out.append(D)
    return torch.stack(out)


def summary_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def check_against_reference(q, k, v, g, do, cu_seqlens=None, scale=None, device="cpu", tolerance=None):
    dtype = k.dtype
    if tolerance is None:
        tolerance = SUMMARY_TOLERANCE[dtype] if device == "cpu" else CUDA_TOLERANCE[dtype]
    to = (lambda x: None if x is None else x.to(device))
    with poisoned_outputs():
        states, log_decay = flashgla.chunk_gla_segment_states(to(k), to(v), to(g), cu_seqlens=to(cu_seqlens))
        d_states = flashgla.chunk_gla_segment_state_grads(to(q), to(do), to(g), scale=scale,
                                                          cu_seqlens=to(cu_seqlens))
    N = k.shape[0] if cu_seqlens is None else cu_seqlens.numel() - 1
    H, K, V = k.shape[2], k.shape[3], v.shape[3]
    assert states.shape == (N, H, K, V) and states.dtype == summary_dtype(dtype)
    assert log_decay.shape == (N, H, K) and log_decay.dtype == summary_dtype(dtype)
    assert d_states.shape == (N, H, K, V) and d_states.dtype == summary_dtype(dtype)
    ref_states, ref_decay = reference_states(k, v, g, cu_seqlens)
    assert_close(states, ref_states, tolerance, "states")
    assert_close(d_states, reference_state_grads(q, do, g, scale, cu_seqlens), tolerance, "d_states")
    finite = torch.isfinite(ref_decay)
    assert not torch.isnan(log_decay).any(), "log_decay holds NaN"
    assert torch.equal(log_decay.cpu()[~finite].double(), ref_decay[~finite]), "log_decay: -inf not kept"
    if g is None:
        assert (log_decay == 0).all()
    else:
        assert_close(log_decay.cpu()[finite], ref_decay[finite], 1e-12 if dtype == torch.float64 else 1e-5,
                     "log_decay")
    return states, log_decay, d_states


def inputs(gen, B, T, H, K, V, gate, dtype):
    q, k, v, g, _ = gla_inputs(gen, B, T, H, K, V, gate=gate, dtype=dtype)
    do = randn(gen, B, T, H, V, dtype=dtype)
    return q, k, v, g, do


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("gate", ["vector", "scalar", None], ids=str)
def test_matches_definition(gen, gate, dtype):
    q, k, v, g, do = inputs(gen, 2, 75, 2, 16, 24, gate, dtype)  # T not a multiple of 64, K != V
    check_against_reference(q, k, v, g, do)


@pytest.mark.parametrize("gate", ["vector", "scalar", None], ids=str)
def test_varlen_empty_and_one_token(gen, gate):
    lengths = [0, 1, 70, 0, 64, 1]
    cu_seqlens = cu(lengths)
    q, k, v, g, do = inputs(gen, 1, sum(lengths), 2, 8, 12, gate, torch.float64)
    states, log_decay, d_states = check_against_reference(q, k, v, g, do, cu_seqlens=cu_seqlens, scale=0.3)
    for n in (0, 3):
        assert (states[n] == 0).all() and (log_decay[n] == 0).all() and (d_states[n] == 0).all()


def test_minus_infinity_gate(gen):
    q, k, v, g, do = inputs(gen, 1, 90, 2, 8, 8, "vector", torch.float32)
    g[0, 40, :, ::2] = float("-inf")
    cu_seqlens = cu([30, 60])
    _, log_decay, _ = check_against_reference(q, k, v, g, do, cu_seqlens=cu_seqlens)
    assert torch.isneginf(log_decay[1, :, ::2]).all() and torch.isfinite(log_decay[0]).all()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("varlen", [False, True], ids=["batch", "varlen"])
def test_equals_chunk_gla_final_state_and_h0_gradient(gen, varlen, dtype):
    """states = chunk_gla's final state from h0 = 0; d_states = the gradient of h0 = 0 with no dht."""
    lengths = [50, 1, 0, 80]
    B, T, N = (1, sum(lengths), len(lengths)) if varlen else (2, 70, 2)
    cu_seqlens = cu(lengths) if varlen else None
    q, k, v, g, do = inputs(gen, B, T, 2, 16, 8, "vector", dtype)
    h0 = torch.zeros(N, 2, 16, 8, dtype=torch.float32, requires_grad=True)
    o, ht = flashgla.chunk_gla(q, k, v, g, initial_state=h0, output_final_state=True, cu_seqlens=cu_seqlens)
    (o.double() * do.double()).sum().backward()
    states, _ = flashgla.chunk_gla_segment_states(k, v, g, cu_seqlens=cu_seqlens)
    d_states = flashgla.chunk_gla_segment_state_grads(q, do, g, cu_seqlens=cu_seqlens)
    assert_close(states, ht, 1e-5, "states vs chunk_gla final state")
    assert_close(d_states, h0.grad, 1e-5, "d_states vs chunk_gla's h0 gradient")


def test_composes_with_start_state(gen):
    """End state from h0: exp(a) h0 + S (what the context-parallel fold relies on)."""
    q, k, v, g, h0 = gla_inputs(gen, 2, 70, 2, 8, 8, gate="scalar", dtype=torch.float64)
    _, ht = flashgla.fused_recurrent_gla(q, k, v, g, initial_state=h0, output_final_state=True)
    states, log_decay = flashgla.chunk_gla_segment_states(k, v, g)
    assert_close(log_decay.exp()[..., None] * h0.double() + states, ht, 1e-6, "composed end state")  # ht is fp32


def test_compile_and_opcheck(gen):
    q, k, v, g, do = inputs(gen, 1, 9, 2, 4, 3, "vector", torch.float32)
    cu_seqlens = cu([4, 0, 5])
    torch.library.opcheck(torch.ops.flashgla.chunk_gla_segment_states.default, (k, v, g, cu_seqlens, None))
    torch.library.opcheck(torch.ops.flashgla.chunk_gla_segment_state_grads.default,
                          (q, do, g[..., 0], 0.5, cu_seqlens, None))
    torch._dynamo.reset()

    def summaries(q, k, v, g, do):
        states, log_decay = flashgla.chunk_gla_segment_states(k, v, g, cu_seqlens=cu_seqlens)
        return states * 2, log_decay, flashgla.chunk_gla_segment_state_grads(q, do, g, cu_seqlens=cu_seqlens)

    compiled = torch.compile(summaries, fullgraph=True)
    for out, ref in zip(compiled(q, k, v, g, do), summaries(q, k, v, g, do)):
        torch.testing.assert_close(out, ref)


@pytest.mark.parametrize("with_g", [True, False])
def test_g_gamma_equals_the_staged_gate(gen, with_g):
    """g_gamma [H]: the ops equal the same call on the gate staged as chunk_simple_gla stages it (fp32 of the
    fp64 sum g + g_gamma), bit for bit."""
    q, k, v, g, do = inputs(gen, 2, 70, 3, 8, 5, "scalar", torch.bfloat16)
    g_gamma = -torch.rand(3, generator=gen, dtype=torch.float64) * 0.2
    staged = (g.double() + g_gamma).float() if with_g else g_gamma.float().expand(2, 70, 3)
    g = g if with_g else None
    states, log_decay = flashgla.chunk_gla_segment_states(k, v, g, g_gamma=g_gamma)
    ref_states, ref_log_decay = flashgla.chunk_gla_segment_states(k, v, staged)
    assert torch.equal(states, ref_states) and torch.equal(log_decay, ref_log_decay)
    assert torch.equal(flashgla.chunk_gla_segment_state_grads(q, do, g, g_gamma=g_gamma),
                       flashgla.chunk_gla_segment_state_grads(q, do, staged))
    torch.library.opcheck(torch.ops.flashgla.chunk_gla_segment_states.default, (k, v, g, None, None, g_gamma))


def test_bad_arguments(gen):
    q, k, v, g, do = inputs(gen, 2, 8, 2, 4, 6, "vector", torch.float32)
    with pytest.raises(TypeError, match="flashgla: v: expected dtype float32"):
        flashgla.chunk_gla_segment_states(k, v.bfloat16(), g)
    with pytest.raises(ValueError, match=r"flashgla: g_gamma: expected shape \[H\]"):
        flashgla.chunk_gla_segment_states(k, v, None, g_gamma=torch.zeros(3))
    with pytest.raises(TypeError, match="flashgla: g_gamma: expected a float dtype"):
        flashgla.chunk_gla_segment_state_grads(q, do, None, g_gamma=torch.zeros(2, dtype=torch.int32))
    with pytest.raises(ValueError, match="flashgla: g_gamma: adds to a scalar gate"):
        flashgla.chunk_gla_segment_states(k, v, g, g_gamma=torch.zeros(2))
    with pytest.raises(ValueError, match=r"flashgla: g: expected shape \[B, T, H, K\]"):
        flashgla.chunk_gla_segment_states(k, v, g[..., :3])
    with pytest.raises(ValueError, match="flashgla: cu_seqlens: variable-length input packs"):
        flashgla.chunk_gla_segment_states(k, v, g, cu_seqlens=cu([8]))
    with pytest.raises(ValueError, match="flashgla: cu_seqlens: must end at the total number of tokens 8"):
        flashgla.chunk_gla_segment_states(k[:1], v[:1], g[:1], cu_seqlens=cu([3, 4]))
    with pytest.raises(TypeError, match="flashgla: do: expected a torch.Tensor"):
        flashgla.chunk_gla_segment_state_grads(q, 1.0, g)
    with pytest.raises(ValueError, match="flashgla: d_o: expected shape"):
        flashgla.chunk_gla_segment_state_grads(q, do[:, :7], g)
    with pytest.raises(ValueError, match="flashgla: scale: must be finite"):
        flashgla.chunk_gla_segment_state_grads(q, do, g, scale=math.inf)
    with pytest.raises(TypeError, match="flashgla: k: expected a float dtype"):
        flashgla.chunk_gla_segment_states(k.int(), v, g)


# ---- CUDA (skipped without a GPU) -----------------------------------------------------------------------


@requires_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("dims", [(64, 64), (128, 128), (256, 256), (128, 64), (64, 256)],
                         ids=lambda d: "K{}V{}".format(*d))
@pytest.mark.parametrize("gate", ["vector", "scalar", None], ids=str)
def test_cuda_matches_definition(gen, gate, dims, dtype):
    K, V = dims
    q, k, v, g, do = inputs(gen, 2, 333, 2, K, V, gate, dtype)
    check_against_reference(q, k, v, g, do, device="cuda")


@requires_gpu
@pytest.mark.parametrize("with_host_copy", [False, True], ids=["device-only", "host-copy"])
def test_cuda_varlen_long_small_batch(gen, with_host_copy):
    """Long segments with few heads (the sequence split of the kernels), empty and one-token segments."""
    lengths = [0, 1, 4000, 130, 0, 2500]
    cu_seqlens = cu(lengths)
    q, k, v, g, do = inputs(gen, 1, sum(lengths), 1, 128, 128, "vector", torch.bfloat16)
    host = cu_seqlens if with_host_copy else None
    states, log_decay = flashgla.chunk_gla_segment_states(k.cuda(), v.cuda(), g.cuda(), cu_seqlens=cu_seqlens.cuda(),
                                                          cu_seqlens_host=host)
    d_states = flashgla.chunk_gla_segment_state_grads(q.cuda(), do.cuda(), g.cuda(), cu_seqlens=cu_seqlens.cuda(),
                                                      cu_seqlens_host=host)
    ref_states, ref_decay = reference_states(k, v, g, cu_seqlens)
    assert_close(states, ref_states, CUDA_TOLERANCE[torch.bfloat16], "states")
    assert_close(log_decay, ref_decay, 1e-5, "log_decay")
    assert_close(d_states, reference_state_grads(q, do, g, None, cu_seqlens), CUDA_TOLERANCE[torch.bfloat16],
                 "d_states")


@requires_gpu
def test_cuda_minus_infinity_and_compile_and_graph(gen):
    q, k, v, g, do = inputs(gen, 1, 300, 2, 64, 64, "vector", torch.bfloat16)
    g[0, 150, :, ::2] = float("-inf")
    check_against_reference(q, k, v, g, do, device="cuda")
    q, k, v, g, do = (x.cuda() for x in (q, k, v, g, do))
    eager = (*flashgla.chunk_gla_segment_states(k, v, g), flashgla.chunk_gla_segment_state_grads(q, do, g))
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        flashgla.chunk_gla_segment_states(k, v, g), flashgla.chunk_gla_segment_state_grads(q, do, g)
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        captured = (*flashgla.chunk_gla_segment_states(k, v, g), flashgla.chunk_gla_segment_state_grads(q, do, g))
    graph.replay()
    torch.cuda.synchronize()
    for out, ref in zip(captured, eager):
        torch.testing.assert_close(out, ref, equal_nan=False)
