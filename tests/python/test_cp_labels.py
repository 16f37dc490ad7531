"""Labels under context parallelism follow the rule of one process: each rank passes its slice of
labels aligned with the input ids, and next_token_targets gives exactly the one-process targets of its
positions (the next token of the same sequence, taken from the next rank at the edge; -100 at every
sequence's last token), for packed sequences that cross, meet or skip the edge and for B > 1 rows."""

import pytest
import torch

from spawn_utils import run_distributed

requires_dist = pytest.mark.skipif(not (torch.distributed.is_available() and torch.distributed.is_gloo_available()),
                                   reason="torch.distributed with gloo is not available")


def one_process_targets(labels, bounds):
    targets = torch.full_like(labels, -100)
    for start, end in zip(bounds[:-1], bounds[1:]):
        targets[:, start:end - 1] = labels[:, start + 1:end]
    return targets


def _targets_worker(rank, world_size, layouts):
    from flashgla.distributed import build_cp_context, local_slice, next_token_targets

    for batch, bounds in layouts:
        labels = torch.randint(0, 50, (batch, bounds[-1]), generator=torch.Generator().manual_seed(len(bounds)))
        labels[:, 3] = -100  # an ignored label stays ignored
        cu = torch.tensor(bounds if batch == 1 else [0, bounds[-1]], dtype=torch.int32)
        ctx = build_cp_context(cu)
        got = next_token_targets(local_slice(labels, ctx), ctx)
        expected = local_slice(one_process_targets(labels, bounds if batch == 1 else [0, bounds[-1]]), ctx)
        assert torch.equal(got, expected), f"rank {rank}, B {batch}, cu_seqlens {bounds}:\n{got}\n!=\n{expected}"
        with pytest.raises(ValueError, match=r"flashgla: labels: expected this rank's slice \[B, "
                                             rf"{ctx.local_tokens}\] of labels aligned with the input ids, got "
                                             r"shape \[1, 2\]"):
            next_token_targets(labels[:1, :2], ctx)


@requires_dist
def test_cp_targets_equal_the_one_process_shift():
    layouts = [(1, [0, 7, 30, 40]),          # a sequence across the edge (20)
               (1, [0, 20, 21, 40]),         # a boundary at the edge, a 1-token sequence
               (1, [0, 5, 5, 20, 20, 40]),   # empty sequences, one at the edge
               (1, [0, 40]),                 # one sequence over both ranks
               (2, [0, 30])]                 # B = 2 rows, each over both ranks
    run_distributed(_targets_worker, 2, layouts, timeout=120)
