"""Host (CPU) time of one training step of the 340M LM's 24 blocks at tiny widths, where compute is negligible:
plain against FSDP2 on one rank (gloo). Issue 24 item 4: what FSDP2 adds to every step on the host.

    python bench/fsdp_host_cost.py
"""
import os
import time

import torch
import torch.distributed as dist

from flashgla.models import GLAConfig, GLAForCausalLM
from flashgla.parallel import init_mesh, parallelize

CONFIG = GLAConfig(vocab_size=256, hidden_size=64, num_hidden_layers=24, num_heads=2)


def host_ms(model, optimizer, ids, steps=20, warmup=3):
    """Mean host time per step: forward / backward / optimizer, in ms."""
    totals = [0.0, 0.0, 0.0]
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        loss = model(ids, labels=ids).loss
        t1 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        t2 = time.perf_counter()
        optimizer.step()
        t3 = time.perf_counter()
        if i >= warmup:
            for j, dt in enumerate((t1 - t0, t2 - t1, t3 - t2)):
                totals[j] += dt
    return " / ".join(f"{t / steps * 1e3:.1f}" for t in totals) + " ms (fwd / bwd / optimizer)"


def main():
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("gloo", rank=0, world_size=1)
    torch.set_num_threads(1)
    ids = torch.randint(0, CONFIG.vocab_size, (1, 65))
    torch.manual_seed(0)
    model = GLAForCausalLM(CONFIG)
    print(f"plain: {host_ms(model, torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True), ids)}")
    for reshard in (True, False):
        torch.manual_seed(0)
        model = GLAForCausalLM(CONFIG)
        parallelize(model, init_mesh("cpu"), param_dtype=None, reduce_dtype=None, reshard_after_forward=reshard)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
        print(f"fsdp reshard={reshard}: {host_ms(model, optimizer, ids)}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
