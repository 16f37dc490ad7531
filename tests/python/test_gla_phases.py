"""A chunked call in two (flashgla/gla.h, GlaPhase: what context parallelism runs on each rank): the summary
call's summaries against chunk_gla_segment_states / _state_grads, the output call against the whole op with
the same initial state or final-state gradient (the forward where its plan splits one long sequence; the
backward with and without split scans); and the clear errors of a phase where the phases do not apply (the
CPU)."""

import pytest
import torch
import torch.nn.functional as F

import flashgla
from flashgla import _C
from flashgla._torch import make_args, view
from flashgla.ops.gla import _backward_in_phases, _forward_in_phases
from testing_utils import assert_close, requires_gpu


def _inputs(B, T, H, K, V, gate, device, seed=0, neg_inf_at=()):
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, T, H, K, generator=gen) for _ in range(2))
    v = torch.randn(B, T, H, V, generator=gen)
    do = torch.randn(B, T, H, V, generator=gen)
    g = None
    if gate == "vector":
        g = F.logsigmoid(torch.randn(B, T, H, K, generator=gen) + 3.0)
    elif gate == "scalar":
        g = F.logsigmoid(torch.randn(B, T, H, generator=gen) + 3.0)
    if g is not None:
        for t in neg_inf_at:
            g[:, t] = float("-inf")
    bf = [t.to(device, torch.bfloat16) for t in (q, k, v, do)]
    return (*bf, None if g is None else g.to(device))


def _whole(q, k, v, g, h0):
    return flashgla.ops.gla._run_forward(_C.GlaAlgorithm.chunked, q, k, v, g, h0, None, None, None, False, True)


def _whole_backward(q, k, v, g, h0, do, dht):
    return flashgla.ops.gla._run_backward_all(_C.GlaAlgorithm.chunked, q, k, v, g, h0, None, None, do, dht, None,
                                              False, False)


@requires_gpu
@pytest.mark.parametrize("gate", ["vector", "scalar", "none"])
def test_forward_in_two_calls(gate):
    """B1 T32K H4: the forward planner splits the sequence with its states kernel."""
    q, k, v, do, g = _inputs(1, 32768, 4, 128, 128, gate, "cuda", neg_inf_at=(20000,))
    phases = _forward_in_phases(q, k, v, g, None, None, None, True, torch.float32)
    assert phases is not None, "the plan of B1 T32K H4 d128 should split with the states kernel"
    summary, output = phases
    states, log_decay = flashgla.chunk_gla_segment_states(k, v, g)
    assert_close(summary[..., :128], states, 5e-3, "summary states")
    assert torch.equal(torch.isneginf(summary[..., 128]), torch.isneginf(log_decay))
    assert torch.isneginf(log_decay).all() == (gate != "none")  # the -inf gate at token 20000
    finite = torch.isfinite(log_decay)
    if finite.any():
        assert_close(summary[..., 128][finite], log_decay[finite], 1e-5, "summary log decay")
    h0 = torch.randn(1, 4, 128, 128, device="cuda")
    o, ht = output(h0)
    o_ref, ht_ref = _whole(q, k, v, g, h0)
    assert torch.equal(o, o_ref), "the output call is the whole call's output pass on the same split states"
    assert torch.equal(ht, ht_ref)


@requires_gpu
@pytest.mark.parametrize("gate", ["vector", "scalar", "none"])
@pytest.mark.parametrize("B, T, H", [(1, 131072, 4), (2, 16384, 16)], ids=["split scans", "one piece"])
def test_backward_in_two_calls(gate, B, T, H):
    """B1 T128K H4: the backward planner splits the state scans; B2 T16K H16: it does not (the output call's
    fold then adds d_final_state to every stored state)."""
    q, k, v, do, g = _inputs(B, T, H, 128, 128, gate, "cuda")
    h0 = torch.randn(B, H, 128, 128, device="cuda")
    phases = _backward_in_phases(q, k, v, g, h0, None, None, do, None, torch.float32)
    assert phases is not None
    summary, output = phases
    grads = flashgla.chunk_gla_segment_state_grads(q, do, g)
    assert_close(summary, grads, 5e-3, "summary")
    for dht in (torch.randn(B, H, 128, 128, device="cuda"), None):
        if dht is None:  # a second summary call: the output call's fold changed the stored states
            summary, output = _backward_in_phases(q, k, v, g, h0, None, None, do, None, torch.float32)
        dq, dk, dv, dg, _ = output(dht)
        rq, rk, rv, rg, _, _ = _whole_backward(q, k, v, g, h0, do, dht)
        for name, x, ref in (("dq", dq, rq), ("dk", dk, rk), ("dv", dv, rv), ("dg", dg, rg)):
            if name == "dg" and g is None:
                continue
            err = ((x.double() - ref.double()).norm() / ref.double().norm()).item()
            assert err < 5e-3, f"{name}: relative error {err:.2e} against the whole call (dht given: {dht is not None})"


def test_phases_do_not_apply_on_the_cpu():
    q, k, v, do, g = _inputs(1, 256, 2, 16, 16, "vector", "cpu")
    assert _forward_in_phases(q, k, v, g, None, None, None, False, torch.float32) is None
    assert _backward_in_phases(q, k, v, g, None, None, None, do, None, torch.float32) is None
    o = torch.empty_like(v)
    args = make_args(_C.GlaForwardArgs, q=q, k=k, v=v, g=g, o=o)
    assert not _C.gla_forward_phases_apply(args)
    args.phase = _C.GlaPhase.summary
    args.summary = view(torch.empty(1, 2, 16, 17), "summary")
    with pytest.raises(NotImplementedError, match="phase"):
        _C.gla_forward(args)
    args = make_args(_C.GlaForwardArgs, q=q, k=k, v=v, g=g, o=o, summary=torch.empty(1, 2, 16, 17))
    with pytest.raises(ValueError, match="summary"):
        _C.gla_forward(args)


@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize("summary, error, message", [
    (None, ValueError, "summary: is required with phase = summary"),
    ("one row too many", ValueError, "summary: expected shape"),
    ("one column short", ValueError, "summary: expected shape"),
    ("float64", TypeError, "summary: expected dtype float32"),
], ids=["missing", "rows", "columns", "dtype"])
def test_bad_summary(direction, summary, error, message):
    """The summary call's output is checked before anything else of the phase, on every backend."""
    q, k, v, do, g = _inputs(2, 64, 3, 16, 8, "vector", "cpu")
    columns = 9 if direction == "forward" else 8
    shape, dtype = [2, 3, 16, columns], torch.float32
    if summary == "one row too many":
        shape[0] = 3
    elif summary == "one column short":
        shape[3] -= 1
    elif summary == "float64":
        dtype = torch.float64
    if direction == "forward":
        args = make_args(_C.GlaForwardArgs, q=q, k=k, v=v, g=g, o=torch.empty_like(v))
        run = _C.gla_forward
    else:
        args = make_args(_C.GlaBackwardArgs, q=q, k=k, v=v, g=g, d_o=do, dq=torch.empty_like(q),
                         dk=torch.empty_like(k), dv=torch.empty_like(v), dg=torch.empty_like(g))
        run = _C.gla_backward
    args.phase = _C.GlaPhase.summary
    if summary is not None:
        args.summary = view(torch.empty(shape, dtype=dtype), "summary")
    with pytest.raises(error, match=message):
        run(args)
