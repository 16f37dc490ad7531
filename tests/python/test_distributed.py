"""Context parallelism (flashgla.distributed) on the CPU: 2 and 4 gloo processes
running the CP ops against one process on the whole batch (cp_cases.py), and
bad input. Each run is a subprocess under a hard timeout, so a hang fails the
test instead of stalling CI."""

import os
import subprocess
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
TIMEOUT_S = 240


def run_cases(tmp_path, world, suite, backend="gloo"):
    env = dict(os.environ, FLASHGLA_NUM_THREADS="1", OMP_NUM_THREADS="1")
    command = [sys.executable, os.path.join(HERE, "cp_cases.py"), "--world", str(world), "--suite", suite,
               "--backend", backend, "--out", str(tmp_path)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{world} processes did not finish within {TIMEOUT_S} s (a hang?): {e.stdout}{e.stderr}")
    assert done.returncode == 0, f"{done.stdout[-20000:]}\n{done.stderr[-8000:]}"
    return done.stdout


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")
@pytest.mark.parametrize("world", [2, 4])
def test_cp_matches_one_process_and_bad_input(tmp_path, world):
    """One group of `world` processes runs both suites of cp_cases.py (one start-up):
    numerics: fp64 (≤ 1e-10) and fp32 (≤ 2e-5) against one process: o, final states, dq, dk, dv, dg on every
    rank; vector, scalar and no gate; one sequence over all ranks, boundaries at and inside rank edges, 1-token
    sequences, local T = 70 and 128, B = 3 rows, reset gates next to a rank edge, and (4 ranks) a sequence
    crossing three ranks; bad input: T not divisible by the ranks, initial_state, cu_seqlens differing between
    ranks (all ranks raise, none hangs), too few tokens for the conv window, a wrong local T or cu_seqlens;
    state_v_first (the final state and its gradient V-first); bad input on one rank only (a wrong local T,
    initial_state, the gate's shape, v's dtype, g_gamma or normalize) and a fault injected into one rank's backward
    pre-pass: every rank raises with that rank's message, none hangs, and the group works afterwards; the
    context's layout fields."""
    run_cases(tmp_path, world, "all")


def test_fold_of_summaries_neg_inf():
    """One process, no group: a sequence cut into pieces; the fold (C++) of the pieces' summaries gives the
    whole sequence's end state and entering-state gradient, with −inf gates inside and at the cuts (exact
    zeros, no NaN)."""
    import flashgla
    from flashgla.distributed import _fold

    gen = torch.Generator().manual_seed(5)
    H, K, V, cuts = 2, 8, 6, [0, 13, 14, 40, 41, 64]
    T = cuts[-1]
    q, k = (torch.randn(1, T, H, K, generator=gen, dtype=torch.float64) for _ in range(2))
    v, do = (torch.randn(1, T, H, V, generator=gen, dtype=torch.float64) for _ in range(2))
    g = torch.nn.functional.logsigmoid(torch.randn(1, T, H, K, generator=gen, dtype=torch.float64))
    g[:, 13, :, ::2] = float("-inf")   # a whole 1-token piece that resets half the keys
    g[:, 40, 0, 1::2] = float("-inf")  # the last token of a piece
    g[:, 20, 1] = float("-inf")        # inside a piece
    whole_s, _ = flashgla.chunk_gla_segment_states(k, v, g)
    whole_b = flashgla.chunk_gla_segment_state_grads(q, do, g, scale=0.5)
    cu = torch.tensor(cuts)
    s, a = flashgla.chunk_gla_segment_states(k, v, g, cu_seqlens=cu)
    b = flashgla.chunk_gla_segment_state_grads(q, do, g, scale=0.5, cu_seqlens=cu)
    P = len(cuts) - 1
    assert torch.isinf(a).any()
    out_s = torch.full((H, K, V), float("nan"), dtype=torch.float64)
    _fold(s, a, 0, P, False, out_s)
    out_b = torch.full((H, K, V), float("nan"), dtype=torch.float64)
    _fold(b, a, 0, P, True, out_b)
    for out, ref in ((out_s, whole_s[0]), (out_b, whole_b[0])):
        assert torch.isfinite(out).all()
        error = ((out - ref).norm() / ref.norm()).item()
        assert error <= 1e-12, error
