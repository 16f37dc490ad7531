"""torch.compile (fullgraph: no graph break) and torch.library.opcheck of the
custom ops (schema, fake kernels, autograd registration), on the CPU."""

import pytest
import torch

import flashgla
from testing_utils import TOLERANCE, assert_close, cu, gla_inputs, randn


def loss_of_chunk_gla(q, k, v, g, h0, cu_seqlens):
    o, ht = flashgla.chunk_gla(q, k, v, g, initial_state=h0, output_final_state=True, cu_seqlens=cu_seqlens)
    return (o * o).sum() + (ht * ht).sum()


@pytest.mark.parametrize("varlen", [False, True], ids=["batch", "varlen"])
def test_compile_fullgraph_forward_backward(gen, varlen):
    torch._dynamo.reset()
    lengths = [20, 1, 67]
    cu_seqlens = cu(lengths) if varlen else None
    B, T = (1, sum(lengths)) if varlen else (2, 40)
    q, k, v, g, h0 = gla_inputs(gen, B, T, 2, 16, 8, num_states=len(lengths) if varlen else B,
                                dtype=torch.float32)
    leaves = [x.requires_grad_() for x in (q, k, v, g, h0)]

    compiled = torch.compile(loss_of_chunk_gla, fullgraph=True)
    loss = compiled(*leaves, cu_seqlens)
    grads = torch.autograd.grad(loss, leaves)

    eager_loss = loss_of_chunk_gla(*leaves, cu_seqlens)
    eager_grads = torch.autograd.grad(eager_loss, leaves)
    assert_close(loss, eager_loss, TOLERANCE[torch.float32], "loss")
    for name, grad, ref in zip(["dq", "dk", "dv", "dg", "dh0"], grads, eager_grads):
        assert_close(grad, ref, TOLERANCE[torch.float32], name)


def test_compile_fullgraph_attention_and_decode(gen):
    torch._dynamo.reset()

    def model(q, k, v, g, state):
        o = flashgla.flash_attention(q, k, v)
        step = flashgla.gla_decode_step(q[:, -1], k[:, -1], v[:, -1], g[:, -1], state)
        return o, step

    q, k, v, g, state = gla_inputs(gen, 2, 9, 2, 8, 8, dtype=torch.float32)
    eager_state = state.clone()
    o, step = torch.compile(model, fullgraph=True)(q, k, v, g, state)
    o_ref, step_ref = model(q, k, v, g, eager_state)
    assert_close(o, o_ref, TOLERANCE[torch.float32], "o")
    assert_close(step, step_ref, TOLERANCE[torch.float32], "decode o")
    assert_close(state, eager_state, TOLERANCE[torch.float32], "decode state (mutated in the graph)")


def gla_op_args(gen, op, varlen):
    gate = {"chunk_gla": "vector", "chunk_simple_gla": "scalar", "chunk_linear_attn": None,
            "fused_recurrent_gla": "vector"}[op]
    lengths = [3, 0, 5]
    B, T = (1, sum(lengths)) if varlen else (2, 6)
    q, k, v, g, h0 = gla_inputs(gen, B, T, 2, 4, 3, gate=gate, num_states=3 if varlen else B)
    for x in (q, k, v, g, h0):
        if x is not None:
            x.requires_grad_()
    return (q, k, v, g, h0, cu(lengths) if varlen else None, None, None, False, True)


@pytest.mark.parametrize("varlen", [False, True], ids=["batch", "varlen"])
@pytest.mark.parametrize("op", ["chunk_gla", "chunk_simple_gla", "chunk_linear_attn", "fused_recurrent_gla"])
def test_opcheck_gla(gen, op, varlen):
    torch.library.opcheck(getattr(torch.ops.flashgla, op).default, gla_op_args(gen, op, varlen))


def test_opcheck_attention_and_decode(gen):
    q, k, v = (randn(gen, 1, 7, 2, 4).requires_grad_() for _ in range(3))
    attention = torch.ops.flashgla.flash_attention.default
    torch.library.opcheck(attention, (q, k, v, cu([3, 4]), cu([3, 4]), True, None, False))
    q = randn(gen, 1, 2, 2, 4).requires_grad_()
    torch.library.opcheck(attention, (q, k, v, cu([1, 1]), cu([3, 4]), True, None, True))  # deterministic
    q, k, v, g, state = gla_inputs(gen, 3, 1, 2, 4, 5)
    torch.library.opcheck(torch.ops.flashgla.gla_decode_step.default,
                          (q[:, 0], k[:, 0], v[:, 0], g[:, 0], state.float(), 0.5, None, False))
    q, k, v, g, pool = gla_inputs(gen, 3, 4, 2, 4, 5, num_states=5)
    rows = torch.tensor([4, -1, 0], dtype=torch.int32)
    torch.library.opcheck(torch.ops.flashgla.gla_decode_step.default,
                          (q, k, v, g, pool.float(), None, rows, True))
    q, k, v, g, pool = gla_inputs(gen, 2, 5, 2, 4, 5, num_states=4)
    last, first = torch.tensor([3, 0], dtype=torch.int32), torch.tensor([0, -1], dtype=torch.int32)
    torch.library.opcheck(torch.ops.flashgla.gla_prefill.default,
                          (q, k, v, g, pool.float(), last, first, None, None, None))


def loss_of_fla_06_options(q, k, v, g, g_gamma, h0_vk, z0, cu_seqlens):
    """FLA 0.6's options in one graph: g_gamma with state_v_first, and the normalised linear attention."""
    o, ht = flashgla.chunk_simple_gla(q, k, v, g, g_gamma, initial_state=h0_vk, output_final_state=True,
                                      state_v_first=True, cu_seqlens=cu_seqlens)
    o2, (ht2, z) = flashgla.chunk_linear_attn(q.abs(), k.abs(), v, initial_state=(None, z0), output_final_state=True,
                                              cu_seqlens=cu_seqlens)
    return (o * o).sum() + (ht * ht).sum() + (o2 * o2).sum() + (ht2 * ht2).sum() + (z * z).sum()


def test_compile_fullgraph_fla_06_options(gen):
    torch._dynamo.reset()
    lengths = [9, 0, 40]
    q, k, v, g, _ = gla_inputs(gen, 1, sum(lengths), 2, 8, 4, gate="scalar", dtype=torch.float32)
    h0_vk = randn(gen, 3, 2, 4, 8, dtype=torch.float32)
    z0 = randn(gen, 3, 1, 2, 8, dtype=torch.float32).abs()
    g_gamma = -torch.rand(2, generator=gen)
    leaves = [x.requires_grad_() for x in (q, k, v, g, g_gamma, h0_vk, z0)]
    loss = torch.compile(loss_of_fla_06_options, fullgraph=True)(*leaves, cu(lengths))
    grads = torch.autograd.grad(loss, leaves)
    eager_loss = loss_of_fla_06_options(*leaves, cu(lengths))
    eager_grads = torch.autograd.grad(eager_loss, leaves)
    assert_close(loss, eager_loss, TOLERANCE[torch.float32], "loss")
    for name, grad, ref in zip(["dq", "dk", "dv", "dg", "d_g_gamma", "dh0", "dz0"], grads, eager_grads):
        assert_close(grad, ref, TOLERANCE[torch.float32], name)


@pytest.mark.parametrize("varlen", [False, True], ids=["batch", "varlen"])
def test_opcheck_fla_06_options(gen, varlen):
    lengths = [3, 0, 5]
    B, T = (1, sum(lengths)) if varlen else (3, 6)
    cu_seqlens = cu(lengths) if varlen else None
    q, k, v, g, _ = gla_inputs(gen, B, T, 2, 4, 3, gate="scalar")
    h0_vk = randn(gen, 3, 2, 3, 4)
    g_gamma = -torch.rand(2, generator=gen, dtype=torch.float64)
    for x in (q, k, v, g, g_gamma, h0_vk):
        x.requires_grad_()
    torch.library.opcheck(torch.ops.flashgla.chunk_simple_gla.default,
                          (q, k, v, g, h0_vk.float(), cu_seqlens, None, None, False, True, g_gamma, True))
    o_raw = randn(gen, B, T, 2, 3).requires_grad_()
    z0 = randn(gen, 3, 1, 2, 4).abs().requires_grad_()
    torch.library.opcheck(torch.ops.flashgla.linear_attn_normalize.default,
                          (o_raw, q.abs(), k.abs(), z0, cu_seqlens, None, 0.5, varlen))


@pytest.mark.parametrize("checkpointed", [False, True], ids=["plain", "activation-checkpointing"])
def test_compile_blocks_is_one_graph_for_all_blocks_with_eager_gradients(checkpointed):
    """flashgla.parallel.compile_blocks: the blocks' forwards compiled (the hooks and parameter names left
    as they are); every block runs the one graph, without a break, and the loss and gradients are eager's."""
    from flashgla.models import GLAConfig, GLAForCausalLM
    from flashgla.parallel import apply_activation_checkpointing, compile_blocks

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()  # counted over this test only
    torch.manual_seed(3)
    config = GLAConfig(vocab_size=40, hidden_size=32, num_hidden_layers=3, num_heads=2, use_short_conv=True)
    eager = GLAForCausalLM(config)
    model = GLAForCausalLM(config)
    model.load_state_dict(eager.state_dict())
    if checkpointed:
        for block in model.layers:
            apply_activation_checkpointing(block)
    assert compile_blocks(model) is model
    assert list(model.state_dict()) == list(eager.state_dict())
    ids = torch.randint(0, 40, (2, 19), generator=torch.Generator().manual_seed(1))
    loss = model(ids, labels=ids).loss
    grads = torch.autograd.grad(loss, list(model.parameters()))
    eager_loss = eager(ids, labels=ids).loss
    eager_grads = torch.autograd.grad(eager_loss, list(eager.parameters()))
    counters = torch._dynamo.utils.counters
    assert dict(counters["graph_break"]) == {}, f"graph breaks: {dict(counters['graph_break'])}"
    assert counters["stats"]["unique_graphs"] == 1, f"expected one graph for the 3 blocks, got {counters['stats']}"
    assert_close(loss, eager_loss, TOLERANCE[torch.float32], "loss")
    for (name, _), grad, ref in zip(model.named_parameters(), grads, eager_grads):
        assert_close(grad, ref, TOLERANCE[torch.float32], f"d{name}")
