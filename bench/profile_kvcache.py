"""Where a flash_attention_with_kvcache call spends its time, against torch SDPA (bf16, D 128, one query per
sequence, contiguous cache), per shape:

- host µs per call: 2000 calls in a row, timed before the one synchronize at the end (the Python and launch cost
  where it exceeds the GPU's);
- graph µs per call: 20 calls captured in a CUDA graph and replayed (the GPU time alone);
- the kernels' own times, from torch.profiler.

    python bench/profile_kvcache.py
    python bench/profile_kvcache.py --splits 0,1,2,4,8,16,32   # graph µs per call with num_splits forced (0: the plan)
"""

import argparse
import re
import time

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

import flashgla

SHAPES = [(1, 1024, 16, 16), (1, 1024, 64, 8), (1, 4096, 64, 8), (1, 16384, 64, 8), (8, 4096, 64, 8),
          (64, 16384, 16, 16)]  # B, L, Hq, Hkv


SPLIT_SHAPES = [(B, L, Hq, Hkv) for B in (1, 8, 64) for L in (1024, 4096, 16384) for Hq, Hkv in ((16, 16), (64, 8))]


def calls(B, L, Hq, Hkv, D=128, num_splits=0):
    q = torch.randn(B, 1, Hq, D, device="cuda", dtype=torch.bfloat16)
    k_cache = torch.randn(B, L, Hkv, D, device="cuda", dtype=torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    lengths = torch.full((B,), L, dtype=torch.int32, device="cuda")

    def ours():
        return flashgla.flash_attention_with_kvcache(q, k_cache, v_cache, lengths, num_splits=num_splits)

    def sdpa():
        return F.scaled_dot_product_attention(q.transpose(1, 2), k_cache.transpose(1, 2), v_cache.transpose(1, 2),
                                              enable_gqa=Hq != Hkv)
    return ours, sdpa


def host_us(fn, n=2000, warmup=50):
    """Host µs per call: n back-to-back calls after `warmup`, the queue never drained in between."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    host = time.perf_counter() - start
    torch.cuda.synchronize()
    return host / n * 1e6


def graph_us(fn, n=20, replays=20):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(n):
            fn()
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(replays):
        graph.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / (replays * n) * 1e6


def kernel_times(fn, n=10):
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    times = {}
    for event in prof.events():
        if event.device_type.name == "CUDA":
            found = re.search(r"(\w+_kernel)", event.name)
            times.setdefault(found.group(1) if found else event.name[:40], []).append(event.device_time)
    return ", ".join(f"{name} {sum(t) / len(t):.1f}" for name, t in times.items())


def split_sweep(splits):
    print("| B | L | Hq / Hkv | " + " | ".join(f"{s or 'plan'}" for s in splits) + " | SDPA |")
    print("|---|---|---|" + "---|" * (len(splits) + 1))
    for B, L, Hq, Hkv in SPLIT_SHAPES:
        times = [graph_us(calls(B, L, Hq, Hkv, num_splits=s)[0]) for s in splits]
        sdpa = graph_us(calls(B, L, Hq, Hkv)[1])
        print(f"| {B} | {L} | {Hq} / {Hkv} | " + " | ".join(f"{t:.1f}" for t in times) + f" | {sdpa:.1f} |",
              flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--splits", default="", help="comma-separated num_splits to sweep (0: the plan's)")
    args = parser.parse_args()
    props = torch.cuda.get_device_properties(0)
    print(f"# {props.name}, torch {torch.__version__}")
    if args.splits:
        split_sweep([int(s) for s in args.splits.split(",")])
        return
    print("| B | L | Hq / Hkv | host µs: flashgla | SDPA | graph µs: flashgla | SDPA | flashgla kernels µs |")
    print("|---|---|---|---|---|---|---|---|")
    for B, L, Hq, Hkv in SHAPES:
        ours, sdpa = calls(B, L, Hq, Hkv)
        print(f"| {B} | {L} | {Hq} / {Hkv} | {host_us(ours):.1f} | {host_us(sdpa):.1f} | {graph_us(ours):.1f} | "
              f"{graph_us(sdpa):.1f} | {kernel_times(ours)} |", flush=True)


if __name__ == "__main__":
    main()
