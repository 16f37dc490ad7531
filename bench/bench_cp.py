"""Op-level strong scaling of context-parallel chunk_gla (flashgla.distributed).

At a fixed total of T tokens (B = 1, one sequence over all ranks: the longest
chain of state hand-offs), H = 16, K = V = 128, bf16, each of N GPUs holds
T / N tokens. Per T it times, with CUDA events (median of --repeats after a
warm-up, the slowest rank):
  - "plain": chunk_gla forward+backward on the rank's T / N tokens without CP
    (on 1 GPU: the single-GPU baseline for the whole T);
  - "cp": the same with cp_context (what training runs), and its breakdown:
    states pre-pass, all-gather, fold, local op (forward and backward summed; where the local op runs in
    two calls, GlaPhase in flashgla/gla.h, the pre-pass is its summary calls, part of the op's own work, and
    the local op its output calls: then CP − plain, not the pre-pass, is what CP adds);
and the peak memory. Rank 0 prints a table and appends it with the date, the
card and the GPU count to bench/results_cp.md; the strong-scaling efficiency
is plain(1 GPU, T) / (N · cp(N GPUs, T)) when a 1-GPU row of the same card and
T is in that file (run the 1-GPU command first).

    python bench/bench_cp.py --tokens 524288,1048576                          # 1 GPU (baseline)
    torchrun --nproc_per_node 2 bench/bench_cp.py --tokens 524288,1048576
    torchrun --nproc_per_node 4 bench/bench_cp.py --tokens 524288,1048576 --find-max

--cpu-smoke runs the same code on CPU processes over gloo at tiny sizes (a check that the script works,
no figures): `torchrun --nproc_per_node 2 bench/bench_cp.py --cpu-smoke`.

--find-max then doubles T from the largest given while the memory measured
at the given T's, scaled linearly, fits in 90% of every GPU, and runs it to
confirm: the largest T that ran is reported.
"""

import argparse
import datetime
import os
import re
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import flashgla
import flashgla.distributed as fd

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results_cp.md")
PHASES = ("prepass", "allgather", "fold", "local")


class Clock:
    """A CUDA event (GPU) or the host clock (--cpu-smoke)."""

    def __init__(self, cuda):
        self.cuda = cuda
        if cuda:
            self.event = torch.cuda.Event(enable_timing=True)
            self.event.record()
        else:
            self.t = time.perf_counter()

    def ms_since(self, start):
        return start.event.elapsed_time(self.event) if self.cuda else (self.t - start.t) * 1e3


class PhaseTimer:
    """flashgla.distributed.phase_timer: CUDA events around each phase, summed per phase."""

    def __init__(self, cuda):
        self.cuda = cuda
        self.events = []

    def __call__(self, name):
        timer = self

        class _Phase:
            def __enter__(self):
                self.start = Clock(timer.cuda)

            def __exit__(self, *exc):
                timer.events.append((name, self.start, Clock(timer.cuda)))

        return _Phase()

    def totals(self):
        if self.cuda:
            torch.cuda.synchronize()
        out = dict.fromkeys(PHASES, 0.0)
        for name, start, end in self.events:
            out[name] += end.ms_since(start)
        self.events.clear()
        return out


def init(cpu):
    if "WORLD_SIZE" not in os.environ:  # one process without torchrun: a group of one
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29533"),
                          RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    if cpu:
        dist.init_process_group("gloo")
        return dist.get_rank(), dist.get_world_size(), torch.device("cpu")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    dist.init_process_group("nccl", device_id=device)
    return dist.get_rank(), dist.get_world_size(), device


def slowest(value, device):
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def time_ms(step, repeats, cuda, warmup=2):
    for _ in range(warmup):
        step()
    times = []
    for _ in range(repeats):
        dist.barrier()
        if cuda:
            torch.cuda.synchronize()
        start = Clock(cuda)
        step()
        end = Clock(cuda)
        if cuda:
            end.event.synchronize()
        times.append(end.ms_since(start))
    return statistics.median(times)


def bench_tokens(T, world, repeats, device, H=16, K=128, V=128):
    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    local = T // world
    gen = torch.Generator(device=device).manual_seed(1 + dist.get_rank())
    q, k, v = (torch.randn(1, local, H, D, device=device, dtype=dtype, generator=gen).requires_grad_()
               for D in (K, K, V))
    g = F.logsigmoid(torch.randn(1, local, H, K, device=device, generator=gen) + 3).requires_grad_()
    do = torch.randn(1, local, H, V, device=device, dtype=dtype, generator=gen)
    cu = torch.tensor([0, T], dtype=torch.int32, device=device)
    ctx = fd.build_cp_context(cu, cu_seqlens_cpu=cu.cpu())

    def plain():
        o, _ = flashgla.chunk_gla(q, k, v, g)
        torch.autograd.grad(o, (q, k, v, g), do)

    def cp():
        o, _ = flashgla.chunk_gla(q, k, v, g, cp_context=ctx)
        torch.autograd.grad(o, (q, k, v, g), do)

    row = {"T": T, "per_gpu": local}
    row["plain"] = slowest(time_ms(plain, repeats, cuda), device)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    row["cp"] = slowest(time_ms(cp, repeats, cuda), device)
    row["peak_gib"] = slowest(torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0, device)
    timer = PhaseTimer(cuda)
    fd.phase_timer = timer
    try:
        totals = dict.fromkeys(PHASES, 0.0)
        for _ in range(repeats):
            dist.barrier()
            cp()
            for name, ms in timer.totals().items():
                totals[name] += ms / repeats
    finally:
        fd.phase_timer = None
    for name in PHASES:
        row[name] = slowest(totals[name], device)
    del q, k, v, g, do
    if cuda:
        torch.cuda.empty_cache()
    return row


def baseline_ms(card, T):
    """plain fwd+bwd ms of the latest 1-GPU row of this card and T in the results file, or None."""
    if not os.path.exists(RESULTS):
        return None
    found = None
    for line in open(RESULTS):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 8 and cells[1] == card and cells[2] == "1" and re.fullmatch(r"\d+", cells[3] or "x") \
                and int(cells[3]) == T:
            found = float(cells[5])
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", default="524288,1048576", help="total tokens T, comma-separated")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--find-max", action="store_true", help="also find the largest T that runs")
    parser.add_argument("--no-append", action="store_true", help="print only; leave results_cp.md alone")
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny sizes on CPU processes over gloo")
    args = parser.parse_args()
    rank, world, device = init(args.cpu_smoke)
    sizes = dict(H=2, K=16, V=16) if args.cpu_smoke else {}
    if args.cpu_smoke:
        args.tokens, args.no_append, args.find_max = "256,512", True, False
    card = torch.cuda.get_device_name() if device.type == "cuda" else "CPU (smoke test)"
    tokens = [int(t) for t in args.tokens.split(",")]
    rows = []
    for T in tokens:
        if T % world:
            raise SystemExit(f"--tokens: {T} is not divisible by {world} GPUs")
        rows.append(bench_tokens(T, world, args.repeats, device, **sizes))
        if rank == 0:
            print(rows[-1], flush=True)

    largest = None
    if args.find_max:
        total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory / 2**30
        per_token = max(r["peak_gib"] / r["per_gpu"] for r in rows)
        T = max(tokens)
        while True:
            T *= 2
            fits = torch.tensor([per_token * (T // world) <= 0.9 * total], dtype=torch.int32, device=device)
            dist.all_reduce(fits, op=dist.ReduceOp.MIN)  # every rank decides the same
            if not fits.item():
                break
            rows.append(bench_tokens(T, world, max(1, args.repeats // 2), device))
            largest = T
            if rank == 0:
                print(rows[-1], flush=True)

    if rank == 0:
        stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
        lines = ["| date | card | GPUs | T | T per GPU | plain fwd+bwd ms | CP fwd+bwd ms | Mtok/s | pre-pass ms | "
                 "all-gather ms | fold ms | local op ms | (pre-pass+comm)/step | peak GiB | efficiency vs 1 GPU |",
                 "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            base = r["plain"] if world == 1 else baseline_ms(card, r["T"])
            eff = f"{base / (world * r['cp']):.0%}" if base else "n/a (no 1-GPU row)"
            share = (r["prepass"] + r["allgather"] + r["fold"]) / r["cp"]
            lines.append(f"| {stamp} | {card} | {world} | {r['T']} | {r['per_gpu']} | {r['plain']:.2f} | {r['cp']:.2f} | "
                         f"{r['T'] / r['cp'] / 1e3:.2f} | {r['prepass']:.2f} | {r['allgather']:.2f} | "
                         f"{r['fold']:.3f} | {r['local']:.2f} | {share:.1%} | {r['peak_gib']:.1f} | {eff} |")
        if largest:
            lines.append(f"\nLargest T that ran on {world} GPU(s): {largest} tokens.")
        print("\n".join(lines))
        if not args.no_append:
            new = not os.path.exists(RESULTS)
            with open(RESULTS, "a") as f:
                if new:
                    f.write("# Context-parallel chunk_gla: op-level strong scaling (bench/bench_cp.py)\n\n"
                            "B = 1, one sequence over all GPUs, H = 16, K = V = 128, bf16, forward+backward.\n"
                            "'plain' is chunk_gla on the GPU's T / N tokens without CP; the 1-GPU plain time is the\n"
                            "baseline of the efficiency column. Times are the slowest rank's median.\n")
                f.write("\n" + "\n".join(lines) + "\n")
            print(f"appended to {RESULTS}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
