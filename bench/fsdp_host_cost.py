"""Host (CPU) time of one training step of the 340M LM's 24 blocks at tiny widths, where compute is negligible:
plain against FSDP2 on one rank (gloo). Issue 24 item 4: what FSDP2 adds to every step on the host.

    python bench/fsdp_host_cost.py
"""
import os, time, torch, torch.distributed as dist
from flashgla.models import GLAConfig, GLAForCausalLM
from flashgla.parallel import init_mesh, parallelize
os.environ.setdefault("MASTER_ADDR", "127.0.0.1"); os.environ.setdefault("MASTER_PORT", "29533")
dist.init_process_group("gloo", rank=0, world_size=1)
torch.set_num_threads(1)
cfg = GLAConfig(vocab_size=256, hidden_size=64, num_hidden_layers=24, num_heads=2)
ids = torch.randint(0, 256, (1, 65))
def bench(model, opt, n=20):
    acc = [0.0, 0.0, 0.0]
    def step(rec):
        t0 = time.perf_counter(); loss = model(ids, labels=ids).loss; t1 = time.perf_counter()
        opt.zero_grad(set_to_none=True); loss.backward(); t2 = time.perf_counter(); opt.step(); t3 = time.perf_counter()
        if rec:
            acc[0] += t1 - t0; acc[1] += t2 - t1; acc[2] += t3 - t2
    for _ in range(3): step(False)
    for _ in range(n): step(True)
    return " / ".join(f"{a / n * 1e3:.1f}" for a in acc) + " ms (fwd / bwd / optimizer)"
torch.manual_seed(0); m = GLAForCausalLM(cfg); o = torch.optim.AdamW(m.parameters(), lr=1e-4, foreach=True)
print(f"plain: {bench(m, o)}")
for reshard in (True, False):
    torch.manual_seed(0); m = GLAForCausalLM(cfg)
    parallelize(m, init_mesh("cpu"), param_dtype=None, reduce_dtype=None, reshard_after_forward=reshard)
    o = torch.optim.AdamW(m.parameters(), lr=1e-4, foreach=True)
    print(f"fsdp reshard={reshard}: {bench(m, o)}")
dist.destroy_process_group()
