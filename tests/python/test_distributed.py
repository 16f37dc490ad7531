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
def test_cp_matches_one_process(tmp_path, world):
    """fp64 (≤ 1e-10) and fp32 (≤ 2e-5): o, final states, dq, dk, dv, dg on every rank; vector, scalar and no
    gate; one sequence over all ranks, boundaries at and inside rank edges, 1-token sequences, local T = 70 and
    128, B = 3 rows, −inf gates next to a rank edge, and (4 ranks) a sequence crossing three ranks."""
    run_cases(tmp_path, world, "numerics")


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")
@pytest.mark.parametrize("world", [2, 4])
def test_cp_bad_input(tmp_path, world):
    """T not divisible by the ranks, initial_state, cu_seqlens differing between ranks (all ranks raise, none
    hangs), too few tokens for the conv window, a wrong local T or cu_seqlens; the context's layout fields."""
    run_cases(tmp_path, world, "errors")
