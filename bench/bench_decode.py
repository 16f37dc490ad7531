"""Times flashgla.gla_decode_step (H16, K = V = 128, fp32 state, bf16 q/k/v/g) at N = 1, 8, 64, 256
sequences, against a device-to-device copy of the same number of state bytes measured in the same
process, and appends a dated table to bench/results_decode.md.

    python bench/bench_decode.py                  # the GPU benchmark
    python bench/bench_decode.py --batches 1,64   # some batch sizes
    python bench/bench_decode.py --no-append      # print only

Every timing replays a CUDA graph of many calls (so launch overhead is that of a captured step, as in
generation) and divides by the number of calls; the median of the replays is reported.
- "dense": one [N,H,K,V] state updated by every call (at small N it stays in L2 between calls).
- "pool": state_indices rotate through a pool of at least 256 MiB (> L2), so every call reads and
  writes rows from DRAM, as a serving step whose states were evicted by the other layers would.
- "T=4", "T=4+states": four tokens per call (speculative decoding), dense, without and with the
  per-token states output (which writes 4 more states).
- "ssm": vLLM's path, fused_recurrent_gla with ssm_state_indices [N] (inplace_final_state) on the
  same > L2 pool, one token per sequence ([N, 1, H, *] inputs); "ssm % of copy" is pool copy / ssm.
- "ssm T=4": ssm_state_indices [N, 4] with num_accepted_tokens (speculative decoding): each sequence
  reads one pool row and writes four (one per draft token), so its traffic is 5 states, not 2.
"copy" copies the state bytes once (read + write, the decode's own traffic); "% of copy" is
copy time / decode time. Targets (issue 18): >= 90% of copy at N = 64, <= 4 us at N = 1.
"""

import argparse
import os
import statistics

import torch
import torch.nn.functional as F

import flashgla
from bench_ops import append_results

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results_decode.md")
H, K, V = 16, 128, 128
POOL_BYTES = 256 << 20


def graph_us(step, calls, replays=30):
    """Median µs per call of `step(j)` for j in range(calls), captured in one CUDA graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the graph
        for j in range(min(calls, 3)):
            step(j)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for j in range(calls):
            step(j)
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(times)


def inputs(N, T=None):
    shape = (N, H) if T is None else (N, T, H)
    q, k = (torch.randn(*shape, K, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    v = torch.randn(*shape, V, device="cuda", dtype=torch.bfloat16)
    g = F.logsigmoid(torch.randn(*shape, K, device="cuda")).to(torch.bfloat16)
    return q, k, v, g


def bench_batch(N):
    row = {"N": N}
    q, k, v, g = inputs(N)
    state = torch.randn(N, H, K, V, device="cuda")
    row["dense"] = graph_us(lambda j: flashgla.gla_decode_step(q, k, v, g, state), calls=20)
    copy_dst = torch.empty_like(state)
    row["copy"] = graph_us(lambda j: copy_dst.copy_(state), calls=20)

    slice_bytes = H * K * V * 4
    cycle = max(2, -(-POOL_BYTES // (N * slice_bytes)))  # calls until a row comes back
    pool = torch.randn(cycle * N, H, K, V, device="cuda")
    rows = [torch.arange(j * N, (j + 1) * N, device="cuda", dtype=torch.int32) for j in range(cycle)]
    row["pool"] = graph_us(lambda j: flashgla.gla_decode_step(q, k, v, g, pool, state_indices=rows[j % cycle]),
                           calls=max(cycle, 20))
    pool_src = pool.view(cycle, -1)
    pool_dst = torch.empty_like(pool_src[0])
    row["pool_copy"] = graph_us(lambda j: pool_dst.copy_(pool_src[j % cycle]), calls=max(cycle, 20))
    del pool_src, pool_dst

    q1, k1, v1, g1 = (x[:, None] for x in (q, k, v, g))  # [N, 1, H, *]: fused_recurrent's layout
    row["ssm"] = graph_us(lambda j: flashgla.fused_recurrent_gla(q1, k1, v1, g1, initial_state=pool,
                                                                 ssm_state_indices=rows[j % cycle],
                                                                 inplace_final_state=True), calls=max(cycle, 20))
    del pool, rows

    q4, k4, v4, g4 = inputs(N, 4)
    cycle4 = max(2, -(-POOL_BYTES // (4 * N * slice_bytes)))
    pool4 = torch.randn(cycle4 * 4 * N, H, K, V, device="cuda")
    rows4 = [torch.arange(j * 4 * N, (j + 1) * 4 * N, device="cuda", dtype=torch.int32).view(N, 4)
             for j in range(cycle4)]
    accepted = torch.randint(1, 5, (N,), device="cuda", dtype=torch.int32)
    row["ssm_t4"] = graph_us(lambda j: flashgla.fused_recurrent_gla(q4, k4, v4, g4, initial_state=pool4,
                                                                    ssm_state_indices=rows4[j % cycle4],
                                                                    num_accepted_tokens=accepted,
                                                                    inplace_final_state=True),
                             calls=max(cycle4, 20))
    del pool4, rows4

    row["t4"] = graph_us(lambda j: flashgla.gla_decode_step(q4, k4, v4, g4, state), calls=20)
    row["t4_states"] = graph_us(
        lambda j: flashgla.gla_decode_step(q4, k4, v4, g4, state, output_token_states=True), calls=20)
    row["bytes"] = 2 * state.numel() * 4
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", default="1,8,64,256")
    parser.add_argument("--no-append", action="store_true")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_decode.py needs a CUDA GPU")
    torch.set_grad_enabled(False)  # the state-pool path is inference only
    card = torch.cuda.get_device_name()
    lines = ["| N | state MB | dense us | copy us | % of copy | TB/s | pool us | pool copy us | pool % of copy | "
             "ssm us | ssm % of copy | ssm T=4 us | T=4 us | T=4+states us | target |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for N in (int(x) for x in args.batches.split(",")):
        r = bench_batch(N)
        target = {1: "<= 4 us", 64: ">= 90% of copy"}.get(N, "-")
        lines.append(
            f"| {N} | {r['bytes'] / 2 / 1e6:.1f} | {r['dense']:.2f} | {r['copy']:.2f} | {r['copy'] / r['dense']:.0%} | "
            f"{r['bytes'] / (r['dense'] * 1e-6) / 1e12:.2f} | {r['pool']:.2f} | {r['pool_copy']:.2f} | "
            f"{r['pool_copy'] / r['pool']:.0%} | {r['ssm']:.2f} | {r['pool_copy'] / r['ssm']:.0%} | "
            f"{r['ssm_t4']:.2f} | {r['t4']:.2f} | {r['t4_states']:.2f} | {target} |")
        print(lines[-1], flush=True)
    heading = (f"{card}, H{H} K{K} V{V}, fp32 state, bf16 inputs, CUDA-graph replays "
               f"(torch {torch.__version__}, flashgla {flashgla.__version__})")
    print("\n".join([heading, ""] + lines))
    if not args.no_append:
        append_results(RESULTS, "GLA decode step: time per call against a copy of the state bytes", heading, lines)


if __name__ == "__main__":
    main()
