"""Context parallelism over NCCL, one GPU per rank (skipped with fewer than 2
GPUs): bf16 under CP against the fp64 one-process reference, within 2x the
error of one GPU running the whole batch in bf16, for every layout of
cp_cases.py, on every rank; and the bad-input suite over NCCL."""

import pytest
import torch

from test_distributed import run_cases

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
requires_gpus = pytest.mark.skipif(GPUS < 2, reason="needs 2 or more GPUs")


@requires_gpus
@pytest.mark.parametrize("world", [2, 4])
def test_cp_nccl_bf16(tmp_path, world):
    if world > GPUS:
        pytest.skip(f"needs {world} GPUs")
    print(run_cases(tmp_path, world, "all", backend="nccl"))
