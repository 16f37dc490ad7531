"""gla_decode_step on CPU tensors: one token per sequence, state updated in place."""

import pytest
import torch

import flashgla
from testing_utils import TOLERANCE, assert_close, gla_inputs, naive_gla, poisoned_outputs


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
