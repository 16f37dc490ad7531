"""gla_decode_step on CPU tensors: one token per sequence, state updated in place."""

import pytest
import torch

import flashgla
from testing_utils import TOLERANCE, assert_close, cu, gla_inputs, naive_gla, poisoned_outputs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("gate", ["vector", "scalar", None], ids=str)
def test_step_matches_recurrence(gen, gate, dtype):
    N, H, K, V = 3, 2, 16, 24
    q, k, v, g, state = gla_inputs(gen, N, 1, H, K, V, gate=gate, dtype=dtype)
    o_ref, state_ref = naive_gla(q, k, v, g, initial_state=state)
    with poisoned_outputs():
        o = flashgla.gla_decode_step(q[:, 0], k[:, 0], v[:, 0], None if g is None else g[:, 0], state)
    assert o.shape == (N, H, V) and o.dtype == dtype
    assert_close(o, o_ref[:, 0], TOLERANCE[dtype], "o")
    assert_close(state, state_ref, TOLERANCE[torch.float32], "state (updated in place)")


def test_token_dimension_and_scale(gen):
    """[N, 1, H, K] inputs (as a model's decode step has them) give [N, 1, H, V]."""
    q, k, v, g, state = gla_inputs(gen, 4, 1, 2, 8, 8, dtype=torch.float32)
    o_ref, state_ref = naive_gla(q, k, v, g, scale=0.5, initial_state=state)
    o = flashgla.gla_decode_step(q, k, v, g, state, scale=0.5)
    assert o.shape == (4, 1, 2, 8)
    assert_close(o, o_ref, TOLERANCE[torch.float32], "o")
    assert_close(state, state_ref, TOLERANCE[torch.float32], "state")


def test_steps_equal_recurrent_op(gen):
    """T decode steps reproduce fused_recurrent_gla's outputs and final state."""
    q, k, v, g, h0 = gla_inputs(gen, 2, 9, 2, 8, 4, dtype=torch.float32)
    o_ref, ht_ref = flashgla.fused_recurrent_gla(q, k, v, g, initial_state=h0, output_final_state=True)
    state = h0.clone()
    outputs = [flashgla.gla_decode_step(q[:, t], k[:, t], v[:, t], g[:, t], state) for t in range(q.shape[1])]
    assert_close(torch.stack(outputs, dim=1), o_ref, TOLERANCE[torch.float32], "o")
    assert_close(state, ht_ref, TOLERANCE[torch.float32], "state")


# ---- state pools and several tokens per call ---------------------------------------------------

def pool_inputs(gen, N, T, P, gate="vector", dtype=torch.float32, H=2, K=8, V=6):
    q, k, v, g, pool = gla_inputs(gen, N, T, H, K, V, gate=gate, num_states=P, dtype=dtype)
    return q.to(dtype), k.to(dtype), v.to(dtype), None if g is None else g.to(dtype), pool


@pytest.mark.parametrize("gate", ["vector", "scalar", None], ids=str)
@pytest.mark.parametrize("T", [1, 4, 16])
def test_pool_matches_dense_steps(gen, gate, T):
    """A pool call equals T dense one-token calls on the gathered rows, bit for bit; rows no index names
    are untouched, padded slots give zero outputs and token states."""
    q, k, v, g, pool = pool_inputs(gen, 4, T, 7, gate=gate, dtype=torch.bfloat16)
    rows = torch.tensor([5, -1, 0, 3], dtype=torch.int32)
    live = [0, 2, 3]
    dense = pool[rows[live].long()].clone()
    outputs, states = [], []
    for t in range(T):
        outputs.append(flashgla.gla_decode_step(q[live, t], k[live, t], v[live, t],
                                                None if g is None else g[live, t], dense))
        states.append(dense.clone())
    before = pool.clone()
    with poisoned_outputs():
        o, token_states = flashgla.gla_decode_step(q, k, v, g, pool, state_indices=rows, output_token_states=True)
    assert o.shape == (4, T, 2, 6) and token_states.shape == (4, T, 2, 8, 6)
    assert torch.equal(o[live], torch.stack(outputs, dim=1))
    assert torch.equal(o[1], torch.zeros_like(o[1]))
    assert torch.equal(pool[rows[live].long()], dense)
    untouched = [1, 2, 4, 6]
    assert torch.equal(pool[untouched], before[untouched])
    assert torch.equal(token_states[live], torch.stack(states, dim=1))
    assert torch.equal(token_states[1], torch.zeros_like(token_states[1]))


def test_tokens_match_chunk_gla(gen):
    """Several tokens in one call agree with chunk_gla over the same tokens from the same rows."""
    q, k, v, g, pool = pool_inputs(gen, 3, 11, 5, K=16, V=24)
    rows = torch.tensor([4, 1, 2], dtype=torch.int32)
    o_ref, ht_ref = naive_gla(q, k, v, g, initial_state=pool[rows.long()])
    o_chunk, ht_chunk = flashgla.chunk_gla(q, k, v, g, initial_state=pool[rows.long()], output_final_state=True)
    o = flashgla.gla_decode_step(q, k, v, g, pool, state_indices=rows)
    assert_close(o, o_ref, TOLERANCE[torch.float32], "o")
    assert_close(pool[rows.long()], ht_ref, TOLERANCE[torch.float32], "state")
    assert_close(o, o_chunk, 2 * TOLERANCE[torch.float32], "o vs chunk_gla")
    assert_close(pool[rows.long()], ht_chunk, 2 * TOLERANCE[torch.float32], "state vs chunk_gla")


def test_token_states_roll_back(gen):
    """A verifier accepting tokens 0..a of sequence i copies token_states[i, a] into its pool row: the same
    state as decoding only the accepted tokens."""
    q, k, v, g, pool = pool_inputs(gen, 3, 6, 4)
    rows = torch.tensor([3, 0, 1], dtype=torch.int32)
    accepted = torch.tensor([2, 5, 0])
    start = pool.clone()
    o, token_states = flashgla.gla_decode_step(q, k, v, g, pool, state_indices=rows, output_token_states=True)
    pool[rows.long()] = token_states[torch.arange(3), accepted]
    for i, a in enumerate(accepted.tolist()):
        state = start[rows[i].long()][None].clone()
        o_prefix = flashgla.gla_decode_step(q[i:i + 1, :a + 1], k[i:i + 1, :a + 1], v[i:i + 1, :a + 1],
                                            g[i:i + 1, :a + 1], state)
        assert torch.equal(pool[rows[i].long()], state[0])
        assert torch.equal(o[i, :a + 1], o_prefix[0])


def test_one_token_without_token_dim(gen):
    q, k, v, g, pool = pool_inputs(gen, 2, 1, 3, gate="scalar")
    rows = torch.tensor([2, 0], dtype=torch.int32)
    ref = pool.clone()
    o_ref = flashgla.gla_decode_step(q, k, v, g, ref, state_indices=rows)
    o, states = flashgla.gla_decode_step(q[:, 0], k[:, 0], v[:, 0], g[:, 0], pool, state_indices=rows,
                                         output_token_states=True)
    assert o.shape == (2, 2, 6) and states.shape == (2, 2, 8, 6)
    assert torch.equal(o, o_ref[:, 0]) and torch.equal(pool, ref)
    assert torch.equal(states, pool[rows.long()])


def test_pool_bad_inputs(gen):
    q, k, v, g, pool = pool_inputs(gen, 3, 2, 4)
    rows = torch.tensor([3, -1, 0], dtype=torch.int32)
    with pytest.raises(TypeError, match=r"^flashgla: state_indices: .*int32"):
        flashgla.gla_decode_step(q, k, v, g, pool, state_indices=rows.long())
    with pytest.raises(ValueError, match=r"^flashgla: state_indices: .*\[N\]"):
        flashgla.gla_decode_step(q, k, v, g, pool, state_indices=rows[:2])
    with pytest.raises(ValueError, match=r"^flashgla: state_indices: .*< P = 4"):
        flashgla.gla_decode_step(q, k, v, g, pool, state_indices=torch.tensor([3, 4, 0], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"^flashgla: state_indices: .*distinct"):
        flashgla.gla_decode_step(q, k, v, g, pool, state_indices=torch.tensor([3, -1, 3], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"^flashgla: state: "):  # a pool without indices
        flashgla.gla_decode_step(q, k, v, g, pool)
    with pytest.raises(TypeError, match=r"^flashgla: state_indices: "):
        flashgla.gla_decode_step(q, k, v, g, pool, state_indices=[3, -1, 0])
    before = pool.clone()
    assert torch.equal(pool, before)


# ---- prefill into a pool -----------------------------------------------------------------------

@pytest.mark.parametrize("gate", ["vector", "scalar", None], ids=str)
def test_prefill_into_pool(gen, gate):
    """gla_prefill reads and writes pool rows (one row read by one sequence and written by another):
    the same as chunk_gla on the gathered rows, rows no index names untouched."""
    lengths = [70, 3, 0]
    q, k, v, g, pool = gla_inputs(gen, 1, sum(lengths), 2, 16, 8, gate=gate, num_states=6, dtype=torch.float32)
    cu_seqlens = cu(lengths)
    first = torch.tensor([4, -1, 1], dtype=torch.int32)
    last = torch.tensor([1, 5, 4], dtype=torch.int32)
    h0 = torch.stack([pool[4], torch.zeros_like(pool[0]), pool[1]])
    op = {"vector": flashgla.chunk_gla, "scalar": flashgla.chunk_simple_gla}.get(gate)
    if op is None:
        o_ref, ht = flashgla.chunk_linear_attn(q, k, v, initial_state=h0, output_final_state=True, normalize=False,
                                               cu_seqlens=cu_seqlens)
    else:
        o_ref, ht = op(q, k, v, g, initial_state=h0, output_final_state=True, cu_seqlens=cu_seqlens)
    expected = pool.clone()
    expected[last.long()] = ht
    with poisoned_outputs():
        o = flashgla.gla_prefill(q, k, v, g, pool, last, initial_state_indices=first, cu_seqlens=cu_seqlens)
    assert torch.equal(o, o_ref)
    assert torch.equal(pool, expected)


def test_prefill_then_decode_from_pool(gen):
    """A prompt prefilled into pool rows, then decoded from them, equals one forward over prompt and token."""
    q, k, v, g, pool = gla_inputs(gen, 2, 9, 2, 8, 8, num_states=4, dtype=torch.float32)
    rows = torch.tensor([3, 0], dtype=torch.int32)
    o_ref, _ = naive_gla(q, k, v, g)
    pool.normal_()
    flashgla.gla_prefill(q[:, :8], k[:, :8], v[:, :8], g[:, :8], pool, rows)
    o = flashgla.gla_decode_step(q[:, 8:], k[:, 8:], v[:, 8:], g[:, 8:], pool, state_indices=rows)
    assert_close(o, o_ref[:, 8:], TOLERANCE[torch.float32], "o of the decoded token")


def test_prefill_bad_inputs(gen):
    q, k, v, g, pool = gla_inputs(gen, 2, 5, 2, 8, 8, num_states=4, dtype=torch.float32)
    with pytest.raises(ValueError, match=r"^flashgla: final_state_indices: .*distinct"):
        flashgla.gla_prefill(q, k, v, g, pool, torch.tensor([1, 1], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"^flashgla: initial_state_indices: .*< P = 4"):
        flashgla.gla_prefill(q, k, v, g, pool, torch.tensor([1, 2], dtype=torch.int32),
                             initial_state_indices=torch.tensor([4, 0], dtype=torch.int32))
    with pytest.raises(NotImplementedError, match=r"^flashgla: state: "):
        flashgla.gla_prefill(q.requires_grad_(), k, v, g, pool, torch.tensor([1, 2], dtype=torch.int32))
