"""The ops on CUDA tensors: results and gradients against the CPU fp64
reference, strided inputs, device errors, no host synchronisation, CUDA-graph
capture and replay, torch.compile, and flash_attention against PyTorch's SDPA.

Every test is skipped with reason "no GPU" where torch sees no GPU, and skips
with the library's message where a CUDA op raises NotImplementedError (a
kernel that has not landed, or a wheel built without the CUDA backend)."""

import re

import pytest
import torch
import torch.nn.functional as F

import flashgla
from testing_utils import (GRAD_TOLERANCE, TOLERANCE, assert_close, cu, gla_inputs, naive_attention,
                           poisoned_outputs, randn, rel_rms_error, requires_gpu)

pytestmark = requires_gpu

GATE_OF = {"chunk_gla": "vector", "chunk_simple_gla": "scalar", "chunk_linear_attn": None,
           "fused_recurrent_gla": "vector"}
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def call(op, q, k, v, g, **kwargs):
    if op == "chunk_linear_attn":
        return flashgla.chunk_linear_attn(q, k, v, normalize=False, **kwargs)
    if op == "fused_recurrent_gla":
        return flashgla.fused_recurrent_gla(q, k, v, gk=g, **kwargs)
    return getattr(flashgla, op)(q, k, v, g, **kwargs)


def on_gpu(function, *args, **kwargs):
    """Calls a flashgla op; NotImplementedError (a CUDA kernel not there yet) skips the test."""
    try:
        return function(*args, **kwargs)
    except NotImplementedError as error:
        pytest.skip(f"not implemented: {error}")


def cuda(*tensors):
    return [None if t is None else t.cuda() for t in tensors]


def leaves(*tensors):
    return [t.detach().requires_grad_() for t in tensors if t is not None]


def cpu_reference(op, q, k, v, g, h0, do, dht, **kwargs):
    """o, ht and the gradients of the recurrent op on the CPU in fp64 (the reference)."""
    inputs = leaves(q.double(), k.double(), v.double(), None if g is None else g.double(), h0)
    rq, rk, rv = inputs[:3]
    rg = inputs[3] if g is not None else None
    o, ht = flashgla.fused_recurrent_gla(rq, rk, rv, rg, initial_state=inputs[-1], output_final_state=True,
                                         **kwargs)
    grads = torch.autograd.grad((o, ht), inputs, (do.double(), dht))
    return o, ht, grads


def run_gla(op, q, k, v, g, h0, do, dht, **kwargs):
    inputs = leaves(q, k, v, g, h0)
    rq, rk, rv = inputs[:3]
    rg = inputs[3] if g is not None else None
    o, ht = on_gpu(call, op, rq, rk, rv, rg, initial_state=inputs[-1], output_final_state=True, **kwargs)
    grads = on_gpu(torch.autograd.grad, (o, ht), inputs, (do, dht))
    return o, ht, grads


def check_against_reference(op, dtype, result, reference, has_gate):
    o, ht, grads = result
    o_ref, ht_ref, grads_ref = reference
    assert o.dtype == dtype and ht.dtype == torch.float32
    assert_close(o, o_ref, TOLERANCE[dtype], f"{op} o")
    assert_close(ht, ht_ref, TOLERANCE[dtype], f"{op} final_state")
    names = ["dq", "dk", "dv"] + (["dg"] if has_gate else []) + ["dh0"]
    for name, grad, ref in zip(names, grads, grads_ref):
        assert_close(grad, ref, GRAD_TOLERANCE[dtype], f"{op} {name}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", list(GATE_OF))
@pytest.mark.parametrize("shape", [(2, 300, 4, 64, 64), (1, 65, 2, 128, 32), (3, 1, 2, 16, 16)],
                         ids=lambda s: "B{}T{}H{}K{}V{}".format(*s))
def test_gla_forward_backward(gen, op, dtype, shape):
    B, T, H, K, V = shape
    q, k, v, g, h0 = gla_inputs(gen, B, T, H, K, V, gate=GATE_OF[op], dtype=dtype)
    do = randn(gen, B, T, H, V, dtype=dtype)
    dht = randn(gen, B, H, K, V, dtype=torch.float32)
    with poisoned_outputs():
        result = run_gla(op, *cuda(q, k, v, g, h0, do, dht))
    check_against_reference(op, dtype, result, cpu_reference(op, q, k, v, g, h0, do, dht), g is not None)


@pytest.mark.parametrize("with_host_copy", [False, True], ids=["device_cu_seqlens", "with_host_copy"])
@pytest.mark.parametrize("op", list(GATE_OF))
def test_gla_varlen(gen, op, with_host_copy):
    lengths = [5, 0, 1, 130, 64]
    cu_seqlens = cu(lengths)
    q, k, v, g, h0 = gla_inputs(gen, 1, sum(lengths), 2, 64, 32, gate=GATE_OF[op], num_states=len(lengths),
                                dtype=torch.bfloat16)
    do = randn(gen, *v.shape, dtype=torch.bfloat16)
    dht = randn(gen, *h0.shape, dtype=torch.float32)
    host = {"cu_seqlens_host": cu_seqlens} if with_host_copy else {}
    with poisoned_outputs():
        result = run_gla(op, *cuda(q, k, v, g, h0, do, dht), cu_seqlens=cu_seqlens.cuda(), **host)
    reference = cpu_reference(op, q, k, v, g, h0, do, dht, cu_seqlens=cu_seqlens)
    check_against_reference(op, torch.bfloat16, result, reference, g is not None)


def test_recurrent_reverse(gen):
    q, k, v, g, h0 = gla_inputs(gen, 2, 70, 2, 32, 32, dtype=torch.float32)
    o, ht = on_gpu(flashgla.fused_recurrent_gla, *cuda(q, k, v, g), initial_state=h0.cuda(), output_final_state=True,
                   reverse=True)
    o_ref, ht_ref = flashgla.fused_recurrent_gla(q.double(), k.double(), v.double(), g.double(), initial_state=h0,
                                                 output_final_state=True, reverse=True)
    assert_close(o, o_ref, TOLERANCE[torch.float32], "o")
    assert_close(ht, ht_ref, TOLERANCE[torch.float32], "final_state")


def test_gla_strided_inputs(gen):
    """Slices of a fused projection give the results of their contiguous copies."""
    B, T, H, K, V = 2, 100, 2, 64, 64
    fused = randn(gen, B, T, H, 3 * K + V, dtype=torch.bfloat16).cuda()
    q, k, v, gate = fused.split([K, K, V, K], dim=-1)
    g = F.logsigmoid(gate.float())
    o, _ = on_gpu(flashgla.chunk_gla, q, k, v, g)
    o_dense, _ = flashgla.chunk_gla(q.contiguous(), k.contiguous(), v.contiguous(), g)
    torch.testing.assert_close(o, o_dense)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_decode(gen, dtype):
    q, k, v, g, state = gla_inputs(gen, 64, 1, 4, 128, 64, dtype=dtype)
    o_ref, state_ref = flashgla.fused_recurrent_gla(q.double(), k.double(), v.double(), g.double(),
                                                    initial_state=state, output_final_state=True)
    state = state.cuda()
    with poisoned_outputs():
        o = on_gpu(flashgla.gla_decode_step, *cuda(q, k, v, g), state)
    assert o.shape == (64, 1, 4, 64)
    assert_close(o, o_ref, TOLERANCE[dtype], "o")
    assert_close(state, state_ref, TOLERANCE[torch.float32], "state")


@pytest.mark.parametrize("T", [1, 4, 16])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_decode_pool_tokens(gen, dtype, T):
    """A state pool with padded slots and T tokens per call, with the per-token states, against the CPU
    in fp64; rows no index names stay bit-identical, padded slots give zero outputs and token states."""
    N, P, H, K, V = 5, 9, 4, 128, 96
    q, k, v, g, pool = gla_inputs(gen, N, T, H, K, V, num_states=P, dtype=dtype)
    rows = torch.tensor([7, -1, 0, 4, 8], dtype=torch.int32)
    ref_pool = pool.clone()
    o_ref, states_ref = flashgla.gla_decode_step(q.double(), k.double(), v.double(), g.double(), ref_pool,
                                                 state_indices=rows, output_token_states=True)
    cpool = pool.cuda()
    with poisoned_outputs():
        o, states = on_gpu(flashgla.gla_decode_step, *cuda(q, k, v, g), cpool, state_indices=rows.cuda(),
                           output_token_states=True)
    live = [0, 2, 3, 4]
    assert_close(o[live], o_ref[live], TOLERANCE[dtype], "o")
    assert torch.equal(o[1].cpu(), torch.zeros_like(o[1].cpu()))
    assert_close(cpool, ref_pool, TOLERANCE[torch.float32], "pool")
    untouched = [1, 2, 3, 5, 6]
    assert torch.equal(cpool[untouched].cpu(), pool[untouched])
    assert_close(states[live], states_ref[live], TOLERANCE[torch.float32], "token states")
    assert torch.equal(states[1].cpu(), torch.zeros_like(states[1].cpu()))


def test_decode_pool_out_of_range_row_is_skipped(gen):
    """Rows >= P are not read back on CUDA (no sync): the kernel treats them as padded slots."""
    q, k, v, g, pool = gla_inputs(gen, 3, 2, 2, 64, 64, num_states=4, dtype=torch.bfloat16)
    cpool = pool.cuda()
    o = on_gpu(flashgla.gla_decode_step, *cuda(q, k, v, g), cpool,
               state_indices=torch.tensor([4, 1 << 30, -1], dtype=torch.int32, device="cuda"))
    torch.cuda.synchronize()
    assert torch.equal(o.cpu(), torch.zeros_like(o.cpu()))
    assert torch.equal(cpool.cpu(), pool)


def test_decode_pool_cuda_graph(gen):
    """The pool decode captured in a CUDA graph: each replay reads the current indices and inputs and
    advances the pool rows they name."""
    N, P, T = 4, 6, 2
    q, k, v, g, pool = gla_inputs(gen, N, T, 2, 64, 64, num_states=P, dtype=torch.bfloat16)
    static = cuda(q, k, v, g)
    rows = torch.tensor([5, 0, -1, 2], dtype=torch.int32, device="cuda")
    cpool = pool.cuda()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        on_gpu(flashgla.gla_decode_step, *static, cpool.clone(), state_indices=rows)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = flashgla.gla_decode_step(*static, cpool, state_indices=rows)
    cpool.copy_(pool.cuda())  # capture does not run the kernel; start from the pool again
    ref_pool = pool.double().float().clone()
    for replay, new_rows in enumerate(([5, 0, -1, 2], [1, -1, 3, 5])):
        fresh = gla_inputs(gen, N, T, 2, 64, 64, num_states=P, dtype=torch.bfloat16)
        for target, source in zip(static, fresh[:4]):
            target.copy_(source)
        rows.copy_(torch.tensor(new_rows, dtype=torch.int32))
        graph.replay()
        o_ref = flashgla.gla_decode_step(*(x.double() for x in fresh[:4]), ref_pool,
                                         state_indices=torch.tensor(new_rows, dtype=torch.int32))
        torch.cuda.synchronize()
        assert_close(captured, o_ref, TOLERANCE[torch.bfloat16], f"o (replay {replay})")
        assert_close(cpool, ref_pool, TOLERANCE[torch.float32], f"pool (replay {replay})")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_prefill_into_pool(gen, dtype):
    """gla_prefill on CUDA (varlen, rows read by one sequence and written by another) against the CPU in fp64."""
    lengths = [300, 1, 0, 64]
    q, k, v, g, pool = gla_inputs(gen, 1, sum(lengths), 4, 64, 64, num_states=7, dtype=dtype)
    first = torch.tensor([6, -1, 2, 0], dtype=torch.int32)
    last = torch.tensor([2, 5, 6, -1], dtype=torch.int32)
    ref_pool = pool.clone()
    o_ref = flashgla.gla_prefill(q.double(), k.double(), v.double(), g.double(), ref_pool, last,
                                 initial_state_indices=first, cu_seqlens=cu(lengths))
    cpool = pool.cuda()
    with poisoned_outputs():
        o = on_gpu(flashgla.gla_prefill, *cuda(q, k, v, g), cpool, last.cuda(), initial_state_indices=first.cuda(),
                   cu_seqlens=cu(lengths).cuda())
    assert_close(o, o_ref, TOLERANCE[dtype], "o")
    assert_close(cpool, ref_pool, TOLERANCE[dtype], "pool")  # the chunked GPU path rounds its gated operands to dtype
    assert torch.equal(cpool[[0, 1, 3, 4]].cpu(), pool[[0, 1, 3, 4]])


def raises(kind, argument):
    return pytest.raises(kind, match=rf"^flashgla: {re.escape(argument)}: ")


def test_mixed_devices(gen):
    q, k, v, g, h0 = gla_inputs(gen, 1, 8, 2, 16, 16, num_states=2, dtype=torch.float32)
    cq, ck, cv, cg, ch0 = cuda(q, k, v, g, h0)
    with raises(ValueError, "k"):
        flashgla.chunk_gla(cq, k, cv, cg)
    with raises(ValueError, "g"):
        flashgla.chunk_gla(cq, ck, cv, g)
    with raises(ValueError, "initial_state"):
        flashgla.chunk_gla(cq, ck, cv, cg, initial_state=h0[:1])
    with raises(ValueError, "cu_seqlens"):
        flashgla.chunk_gla(cq, ck, cv, cg, cu_seqlens=cu([3, 5]))
    with raises(ValueError, "cu_seqlens_host"):  # the host copy must be on the host
        flashgla.chunk_gla(cq, ck, cv, cg, cu_seqlens=cu([3, 5]).cuda(), cu_seqlens_host=cu([3, 5]).cuda())
    with raises(ValueError, "cu_seqlens_host"):  # and is checked
        flashgla.chunk_gla(cq, ck, cv, cg, cu_seqlens=cu([3, 5]).cuda(), cu_seqlens_host=cu([3, 4]))
    with raises(ValueError, "k"):  # devices are compared with q's
        flashgla.flash_attention(q, ck, cv)
    with raises(ValueError, "state"):
        flashgla.gla_decode_step(cq[:, 0], ck[:, 0], cv[:, 0], cg[:, 0], ch0[:1].cpu())


def test_other_device_than_current(gen):
    """Tensors on cuda:1 run there even when cuda:0 is current."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    q, k, v, g, _ = gla_inputs(gen, 1, 64, 2, 64, 64, dtype=torch.bfloat16)
    o, _ = on_gpu(flashgla.chunk_gla, *(x.to("cuda:1") for x in (q, k, v, g)))
    assert o.device == torch.device("cuda:1")
    o_ref, _ = flashgla.fused_recurrent_gla(q.double(), k.double(), v.double(), g.double())
    assert_close(o, o_ref, TOLERANCE[torch.bfloat16], "o")


def gla_training_step(q, k, v, g, h0, do, dht, cu_seqlens):
    o, ht = flashgla.chunk_gla(q, k, v, g, initial_state=h0, output_final_state=True, cu_seqlens=cu_seqlens)
    return (o, ht, *torch.autograd.grad((o, ht), (q, k, v, g, h0), (do, dht)))


@pytest.mark.parametrize("varlen", [False, True], ids=["batch", "varlen"])
def test_no_host_synchronisation(gen, varlen):
    """Forward and backward queue work without waiting on the GPU (varlen: no .item() on cu_seqlens)."""
    lengths = [100, 1, 0, 155]
    B, T, N = (1, sum(lengths), len(lengths)) if varlen else (2, 128, 2)
    q, k, v, g, h0 = gla_inputs(gen, B, T, 2, 64, 64, num_states=N, dtype=torch.bfloat16)
    inputs = leaves(*cuda(q, k, v, g, h0))
    do, dht = torch.randn_like(inputs[2]), torch.randn_like(inputs[4])
    cu_seqlens = cu(lengths).cuda() if varlen else None
    on_gpu(gla_training_step, *inputs, do, dht, cu_seqlens)  # warm-up (allocator, lazy init)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        gla_training_step(*inputs, do, dht, cu_seqlens)
        flashgla.flash_attention(inputs[0], inputs[1], inputs[2])
    except NotImplementedError as error:
        pytest.skip(f"not implemented: {error}")
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("varlen", [False, True], ids=["batch", "varlen"])
def test_cuda_graph_capture_and_replay(gen, varlen):
    lengths = [70, 1, 0, 57]
    B, T, N = (1, sum(lengths), len(lengths)) if varlen else (2, 128, 2)
    q, k, v, g, h0 = gla_inputs(gen, B, T, 2, 64, 32, num_states=N, dtype=torch.bfloat16)
    static = leaves(*cuda(q, k, v, g, h0))
    do, dht = torch.randn_like(static[2]), torch.randn_like(static[4])
    cu_seqlens = cu(lengths).cuda() if varlen else None

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the graph, as torch's docs prescribe
        for _ in range(2):
            on_gpu(gla_training_step, *static, do, dht, cu_seqlens)
    torch.cuda.current_stream().wait_stream(side)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = gla_training_step(*static, do, dht, cu_seqlens)

    for _ in range(2):  # new inputs each replay
        fresh = gla_inputs(gen, B, T, 2, 64, 32, num_states=N, dtype=torch.bfloat16)
        with torch.no_grad():
            for target, source in zip(static, fresh):
                target.copy_(source)
        graph.replay()
        eager = gla_training_step(*leaves(*static), do, dht, cu_seqlens)
        torch.cuda.synchronize()
        for name, out, ref in zip(["o", "ht", "dq", "dk", "dv", "dg", "dh0"], captured, eager):
            torch.testing.assert_close(out, ref, msg=f"{name}: graph replay differs from an eager call")


def test_long_varlen_boundaries_read_back_except_under_capture():
    """A varlen batch past 64K tokens whose boundaries are only on the GPU: eager calls read them back to plan the
    sequence split (the same bits as with a host copy); a CUDA graph capture reads nothing back (no split) and
    replays to the same values within rounding."""
    torch.manual_seed(0)
    lengths = [5, 65536 + 17, 300]
    T, H, D = sum(lengths), 2, 128
    cu_seqlens = cu(lengths).cuda()
    q, k, v = (torch.randn(1, T, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    g = F.logsigmoid(torch.randn(1, T, H, D, device="cuda") + 3).to(torch.bfloat16)
    eager = flashgla.chunk_gla(q, k, v, g, cu_seqlens=cu_seqlens)[0]
    with_host = flashgla.chunk_gla(q, k, v, g, cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens.cpu())[0]
    assert torch.equal(eager, with_host)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        flashgla.chunk_gla(q, k, v, g, cu_seqlens=cu_seqlens)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = flashgla.chunk_gla(q, k, v, g, cu_seqlens=cu_seqlens)[0]
    graph.replay()
    torch.cuda.synchronize()
    assert rel_rms_error(captured.float(), eager.float()) < 1e-2


def test_compile_fullgraph(gen):
    torch._dynamo.reset()
    q, k, v, g, h0 = gla_inputs(gen, 2, 128, 2, 64, 64, dtype=torch.bfloat16)
    inputs = leaves(*cuda(q, k, v, g, h0))

    def loss(q, k, v, g, h0):
        o, ht = flashgla.chunk_gla(q, k, v, g, initial_state=h0, output_final_state=True)
        return o.float().square().sum() + ht.square().sum()

    compiled = torch.compile(loss, fullgraph=True)
    grads = on_gpu(lambda: torch.autograd.grad(compiled(*inputs), inputs))
    eager = torch.autograd.grad(loss(*inputs), inputs)
    for name, grad, ref in zip(["dq", "dk", "dv", "dg", "dh0"], grads, eager):
        assert_close(grad, ref, 1e-3, name)


# ---- flash_attention vs PyTorch's scaled_dot_product_attention --------------------------------------

def sdpa(q, k, v, causal):
    """PyTorch's SDPA on [B, T, H, D] tensors (it takes [B, H, T, D])."""
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal,
                                         enable_gqa=q.shape[2] != k.shape[2])
    return out.transpose(1, 2)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shape", [(2, 257, 4, 4, 64), (1, 1024, 8, 2, 128), (2, 65, 2, 2, 256)],
                         ids=lambda s: "B{}T{}Hq{}Hkv{}D{}".format(*s))
def test_flash_attention_vs_sdpa(gen, shape, dtype, causal):
    """No worse than twice SDPA's error (both against the fp64 reference), forward and backward."""
    B, T, Hq, Hkv, D = shape
    q, k, v = randn(gen, B, T, Hq, D, dtype=dtype), randn(gen, B, T, Hkv, D, dtype=dtype), \
        randn(gen, B, T, Hkv, D, dtype=dtype)
    do = randn(gen, B, T, Hq, D, dtype=dtype)
    ref_inputs = leaves(q.double(), k.double(), v.double())
    o_ref = naive_attention(*ref_inputs, causal=causal)
    ref_grads = torch.autograd.grad(o_ref, ref_inputs, do.double())

    ours_inputs, sdpa_inputs = leaves(*cuda(q, k, v)), leaves(*cuda(q, k, v))
    with poisoned_outputs():
        o = on_gpu(flashgla.flash_attention, *ours_inputs, causal=causal)
        grads = on_gpu(torch.autograd.grad, o, ours_inputs, do.cuda())
    o_sdpa = sdpa(*sdpa_inputs, causal)
    grads_sdpa = torch.autograd.grad(o_sdpa, sdpa_inputs, do.cuda())
    for name, ours, theirs, ref in zip(["o", "dq", "dk", "dv"], (o, *grads), (o_sdpa, *grads_sdpa),
                                       (o_ref, *ref_grads)):
        bound = 2 * rel_rms_error(theirs, ref) + 1e-4
        assert_close(ours, ref, bound, f"{name} (SDPA's error {rel_rms_error(theirs, ref):.3g})")


@pytest.mark.parametrize("D", [64, 128])
def test_flash_attention_deterministic_backward(gen, D):
    """deterministic=True: three backward runs give the same bits, close to the default's gradients."""
    q, k, v = (randn(gen, 1, 1500, 8, D, dtype=torch.bfloat16) for _ in range(3))
    do = randn(gen, 1, 1500, 8, D, dtype=torch.bfloat16).cuda()
    inputs = leaves(*cuda(q, k, v))

    def grads(deterministic):
        o = on_gpu(flashgla.flash_attention, *inputs, causal=False, deterministic=deterministic)
        return on_gpu(torch.autograd.grad, o, inputs, do)

    first = grads(True)
    for _ in range(2):
        for name, a, b in zip(("dq", "dk", "dv"), first, grads(True)):
            assert torch.equal(a, b), name
    for name, a, b in zip(("dq", "dk", "dv"), first, grads(False)):
        assert_close(a, b, 1e-2, name)


def test_flash_attention_varlen(gen):
    lengths = [3, 0, 1, 200, 64]
    cu_seqlens = cu(lengths)
    q, k, v = (randn(gen, 1, sum(lengths), 2, 64, dtype=torch.bfloat16) for _ in range(3))
    o = on_gpu(flashgla.flash_attention, *cuda(q, k, v), cu_seqlens=cu_seqlens.cuda())
    assert_close(o, naive_attention(q, k, v, cu_seqlens=cu_seqlens), TOLERANCE[torch.bfloat16], "o")


def test_flash_attention_varlen_own_key_boundaries(gen):
    q_lengths, k_lengths = [1, 0, 1, 130, 1], [3, 5, 1, 200, 64]  # decode steps against caches, and a prefill
    cu_q, cu_k = cu(q_lengths), cu(k_lengths)
    q = randn(gen, 1, sum(q_lengths), 4, 128, dtype=torch.bfloat16)
    k, v = (randn(gen, 1, sum(k_lengths), 2, 128, dtype=torch.bfloat16) for _ in range(2))
    o = on_gpu(flashgla.flash_attention, *cuda(q, k, v), cu_seqlens=cu_q.cuda(), cu_seqlens_k=cu_k.cuda())
    ref = naive_attention(q, k, v, cu_seqlens=cu_q, cu_seqlens_k=cu_k)
    assert_close(o, ref, TOLERANCE[torch.bfloat16], "o")
