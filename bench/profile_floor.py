"""Where chunk_gla's time goes at the anchor shapes (issue #26): each kernel of one forward and of one
forward+backward, its CUDA time (torch.profiler) and the bytes it would move at the floor's rate.

    python bench/profile_floor.py [--shapes 3,2]             # the kernel tables, printed last
    ncu --profile-from-start off --set full -o /tmp/floor python bench/profile_floor.py --ncu 3

bf16 q, k, v, g = logsigmoid(randn) bf16 (bench_ops.gla_inputs, as bench_floor.py). With --ncu I, only shape I:
three warm-up calls of forward+backward, then one between cudaProfilerStart and cudaProfilerStop, so that
Nsight Compute (--profile-from-start off) sees each kernel of one pass once.
"""

import argparse

import torch

import flashgla
from bench_ops import ANCHOR_SHAPES, copy_bandwidth, floor_bytes, gla_inputs, profiled_kernels


def passes(B, T, H, K, V):
    q, k, v, g, do = gla_inputs(B, T, H, K, V)

    def forward():
        with torch.no_grad():
            flashgla.chunk_gla(q, k, v, g)

    def forward_backward():
        torch.autograd.grad(flashgla.chunk_gla(q, k, v, g)[0], (q, k, v, g), do)

    return forward, forward_backward


def kernel_table(function, calls=10):
    """[(kernel name, launches per call, mean µs per launch, µs per call)], the costliest first."""
    return [(key, n, 1e3 * ms / max(n, 1), 1e3 * ms) for key, n, ms in profiled_kernels(function, calls, warmup=3)
            if ms > 0]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="3,2", help="comma-separated indices into the anchor shapes")
    parser.add_argument("--ncu", type=int, metavar="I", help="one forward+backward at shape I for Nsight Compute")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("profile_floor: no GPU")
    torch.manual_seed(0)
    if args.ncu is not None:
        _, forward_backward = passes(*ANCHOR_SHAPES[args.ncu])
        for _ in range(3):
            forward_backward()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        forward_backward()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
        return
    bandwidth = copy_bandwidth()
    lines = [f"{torch.cuda.get_device_name()}, copy {bandwidth / 1e12:.2f} TB/s, flashgla {flashgla.__version__}"]
    for i in (int(x) for x in args.shapes.split(",")):
        B, T, H, K, V = ANCHOR_SHAPES[i]
        forward, forward_backward = passes(B, T, H, K, V)
        fwd_bytes, bwd_bytes = floor_bytes(B, T, H, K, V)
        for name, function, floor in (("forward", forward, fwd_bytes), ("fwd+bwd", forward_backward,
                                                                         fwd_bytes + bwd_bytes)):
            rows = kernel_table(function)
            total = sum(r[3] for r in rows)
            floor_us = floor / bandwidth * 1e6
            lines += ["", f"B{B} T{T} H{H} K{K} V{V}, {name}: {total:.1f} µs of kernels, floor {floor_us:.1f} µs "
                          f"({total / floor_us:.2f}×)",
                      "| kernel | launches | µs each | µs per pass | share |", "|---|---|---|---|---|"]
            lines += [f"| {key[:90]} | {n} | {each:.1f} | {per:.1f} | {per / total:.0%} |" for key, n, each, per in rows]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
