"""Edge values through the chunked ops: gates anywhere in [-inf, 0] (-inf a full
reset, any magnitude legal) against the fp64 recurrence, forward and backward;
a NaN or Inf in v at token t leaves every output before t as it was; check_gate
raises on a gate outside the contract. CPU always, CUDA when present."""

import pytest
import torch

import flashgla
from testing_utils import HAS_GPU, assert_close, gla_inputs, naive_gla, poisoned_outputs

DEVICES = ["cpu"] + (["cuda"] if HAS_GPU and flashgla.cuda_available() else [])
INF = float("inf")


def _edit_gates(g, value, tokens, every=1):
    g = g.clone()
    for t in tokens:
        g[:, t].view(g.shape[0], -1)[:, ::every] = value
    return g


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", ["neg_inf_once", "neg_inf_half_columns", "neg_inf_t0", "minus_1e4_alternating",
                                  "minus_1e30"])
@pytest.mark.parametrize("gate", ["vector", "scalar"])
def test_gates_anywhere_in_minus_inf_to_zero(gen, device, case, gate):
    B, T, H, K, V = 2, 130, 2, 32, 16
    q, k, v, g, h0 = gla_inputs(gen, B, T, H, K, V, gate=gate, dtype=torch.float32)
    edits = {"neg_inf_once": (-INF, [37], 1), "neg_inf_half_columns": (-INF, [37, 100], 2),
             "neg_inf_t0": (-INF, [0], 1), "minus_1e4_alternating": (-1e4, range(11, 120, 2), 1),
             "minus_1e30": (-1e30, [64], 1)}
    value, tokens, every = edits[case]
    g = _edit_gates(g, value, tokens, every)
    ref_inputs = [x.double().clone().requires_grad_() for x in (q, k, v, g, h0)]
    o_ref, ht_ref = naive_gla(*ref_inputs[:4], initial_state=ref_inputs[4])
    do = torch.randn(o_ref.shape, generator=gen, dtype=torch.float64)
    dht = torch.randn(ht_ref.shape, generator=gen, dtype=torch.float64)
    ((o_ref * do).sum() + (ht_ref * dht).sum()).backward()

    inputs = [x.to(device=device, dtype=torch.float32).requires_grad_() for x in (q, k, v, g, h0)]
    op = flashgla.chunk_gla if gate == "vector" else flashgla.chunk_simple_gla
    with poisoned_outputs():
        o, ht = op(*inputs[:4], initial_state=inputs[4], output_final_state=True)
        ((o.double() * do.to(device)).sum() + (ht.double() * dht.to(device)).sum()).backward()
    assert_close(o, o_ref, 1e-5, "o")
    assert_close(ht, ht_ref, 1e-5, "ht")
    for name, x, r in zip(["dq", "dk", "dv", "dg", "dh0"], inputs, ref_inputs):
        assert_close(x.grad, r.grad, 1e-5, name)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("t", [5, 16, 40, 64])
@pytest.mark.parametrize("K", [64, 256])  # bf16 with K = 256 takes the Hopper path on sm_90
def test_nonfinite_v_does_not_reach_earlier_outputs(gen, device, dtype, t, K):
    q, k, v, g, h0 = (x.to(device) for x in gla_inputs(gen, 1, 100, 2, K, 64, gate="vector", dtype=dtype))
    q, k, v = (x.to(dtype) for x in (q, k, v))
    g = g.float()
    clean, _ = flashgla.chunk_gla(q, k, v, g)
    for bad in (float("nan"), INF):
        v_bad = v.clone()
        v_bad[:, t] = bad
        o, _ = flashgla.chunk_gla(q, k, v_bad, g)
        assert torch.isfinite(o[:, :t]).all(), f"value {bad} at t={t} reached an earlier output"
        assert_close(o[:, :t], clean[:, :t], 1e-5 if dtype == torch.float32 else 5e-3, "o before t")


@pytest.mark.parametrize("device", DEVICES)
def test_check_gate_raises_outside_the_contract(gen, device):
    q, k, v, g, _ = (x.to(device) for x in gla_inputs(gen, 1, 20, 2, 16, 16, gate="vector", dtype=torch.float32))
    q, k, v, g = (x.float() for x in (q, k, v, g))
    flashgla.chunk_gla(q, k, v, g, check_gate=True)  # in [-inf, 0]: fine
    flashgla.chunk_gla(q, k, v, _edit_gates(g, -INF, [3]), check_gate=True)
    for bad in (0.5, float("nan")):
        with pytest.raises(ValueError, match="flashgla: g:"):
            flashgla.chunk_gla(q, k, v, _edit_gates(g, bad, [7]), check_gate=True)
        with pytest.raises(ValueError, match="flashgla: g:"):
            flashgla.chunk_simple_gla(q, k, v, g[..., 0].clone().fill_(bad), check_gate=True)
