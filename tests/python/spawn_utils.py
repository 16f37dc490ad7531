"""Runs a test function in N processes joined by a gloo process group, under a hard timeout.

A hang (a collective one rank never reaches) fails the test after `timeout` seconds instead of
stalling CI: every process is killed and the test reports which ranks were still running. An
exception on any rank fails the test with that rank's traceback.
"""

import gc
import os
import socket
import sys
import traceback
from datetime import timedelta

import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(fn, rank, world_size, port, args, errors, timeout, backend):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_RANK=str(rank))
    try:
        options = {}
        if backend == "nccl":  # one GPU per rank
            torch.cuda.set_device(rank)
            options["device_id"] = torch.device("cuda", rank)
        dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout),
                                **options)
        try:
            fn(rank, world_size, *args)
        except BaseException:
            dist.destroy_process_group()
            raise
    except BaseException:  # reported to the parent, which fails the test
        errors.put((rank, traceback.format_exc()))
        raise SystemExit(1)
    leave_group_and_exit()


def leave_group_and_exit() -> None:
    """Ends a rank that finished its work: every rank done, the group destroyed while the interpreter is
    whole, then an exit that skips interpreter finalization.

    Gloo's worker threads can still hold tensors when the interpreter finalizes; freeing them then
    aborts the process ("terminate called without an active exception", about 1 run in 10 of a
    2-process test on a loaded 2-core machine, after all its checks passed; pytorch/pytorch#179291).
    Cyclic garbage may keep the group alive until then, hence the collection first.
    """
    import torch.distributed as dist

    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_distributed(fn, world_size: int, *args, timeout: float = 120.0, backend: str = "gloo") -> None:
    """Calls fn(rank, world_size, *args) on world_size processes (fn must be a module-level function);
    backend "nccl" gives rank r the GPU r."""
    ctx = mp.get_context("spawn")
    errors = ctx.SimpleQueue()
    port = _free_port()
    procs = [ctx.Process(target=_entry, args=(fn, rank, world_size, port, args, errors, timeout, backend), daemon=True)
             for rank in range(world_size)]
    for p in procs:
        p.start()
    import time

    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    hung = [rank for rank, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    messages = []
    while not errors.empty():
        rank, text = errors.get()
        messages.append(f"--- rank {rank} ---\n{text}")
    if messages:
        raise AssertionError("distributed test failed:\n" + "\n".join(messages))
    if hung:
        raise AssertionError(f"distributed test timed out after {timeout:.0f} s (a hang?): ranks {hung} still running")
    bad = [(rank, p.exitcode) for rank, p in enumerate(procs) if p.exitcode != 0]
    if bad:
        raise AssertionError(f"distributed test: processes exited with codes {bad}")
