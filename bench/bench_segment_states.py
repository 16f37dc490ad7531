"""CUDA per-segment summaries (the context-parallel pre-pass) against the byte floor and chunk_gla.

Run on a CUDA machine with flashgla importable (pip-installed, or PYTHONPATH=<cmake build dir with
-DFLASHGLA_PYTHON=ON>/python):

    python bench/bench_segment_states.py [--out bench/results_segment_states.md]

In one process, bf16 inputs (g = logsigmoid(randn), bf16 or fp32), per shape:
  * states: chunk_gla_segment_states (bf16: the forward's split states kernel, the default) and the same with
    FLASHGLA_GLA_SEGMENT_KERNEL=generic (the fp32 tile kernel);
  * grads: chunk_gla_segment_state_grads (the split states kernel walking forwards), and generic;
  * the byte floor: the bytes of k, v, g (q, do, g) read once at the device's copy rate (read + write);
  * chunk_gla forward, and forward + backward, on the same inputs: what the pre-pass is meant to be small against.
Times are medians of triton's do_bench (CUDA graphs off).
"""

import argparse
import datetime
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_gla_fwd import copy_bandwidth, median_ms, print_table  # noqa: E402

import flashgla  # noqa: E402

SHAPES = [  # B, T, H, K, V, gate dtype
    (1, 131072, 16, 128, 128, torch.bfloat16),  # one CP rank's slice of 1M tokens on 8 GPUs
    (1, 262144, 16, 128, 128, torch.bfloat16),  # ... on 4 GPUs
    (1, 262144, 16, 128, 128, torch.float32),
    (8, 4096, 16, 128, 128, torch.bfloat16),
    (2, 16384, 16, 64, 64, torch.bfloat16),
    (1, 65536, 4, 128, 256, torch.float32),     # the 340M model's heads
]


def with_env(name, value, fn):
    old = os.environ.get(name)
    os.environ[name] = value  # flashgla's ops read the tuning switches at every call
    try:
        return fn()
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="also append the table to this markdown file")
    args = parser.parse_args()
    torch.manual_seed(0)
    card = torch.cuda.get_device_name()
    bandwidth, _ = copy_bandwidth()
    print(f"{card}: copy {bandwidth / 1e12:.2f} TB/s (read + write)", flush=True)
    lines = [f"{datetime.date.today().isoformat()}, {card} (copy {bandwidth / 1e12:.2f} TB/s read + write)", "",
             "| shape | gate | states ms | floor ms | floor/states | generic states ms | grads ms | floor/grads | "
             "generic grads ms | chunk_gla fwd ms | states/fwd | chunk_gla fwd+bwd ms | (states+grads)/(fwd+bwd) | "
             "rel. diff states | rel. diff grads |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for B, T, H, K, V, gate_dtype in SHAPES:
        q, k = (torch.randn(B, T, H, K, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        v = torch.randn(B, T, H, V, device="cuda", dtype=torch.bfloat16)
        do = torch.randn(B, T, H, V, device="cuda", dtype=torch.bfloat16)
        g = F.logsigmoid(torch.randn(B, T, H, K, device="cuda")).to(gate_dtype)
        floor_ms = (k.numel() * 2 + v.numel() * 2 + g.numel() * g.element_size()) / bandwidth * 1e3  # bandwidth counts bytes read + written
        states = lambda: flashgla.chunk_gla_segment_states(k, v, g)
        grads = lambda: flashgla.chunk_gla_segment_state_grads(q, do, g)
        states_ms = median_ms(states)
        generic_ms = with_env("FLASHGLA_GLA_SEGMENT_KERNEL", "generic", lambda: median_ms(states))
        grads_ms = median_ms(grads)
        generic_grads_ms = with_env("FLASHGLA_GLA_SEGMENT_KERNEL", "generic", lambda: median_ms(grads))
        s_split, _ = states()
        s_generic, _ = with_env("FLASHGLA_GLA_SEGMENT_KERNEL", "generic", states)
        diff = ((s_split - s_generic).norm() / s_generic.norm()).item()
        b_split, b_generic = grads(), with_env("FLASHGLA_GLA_SEGMENT_KERNEL", "generic", grads)
        grads_diff = ((b_split - b_generic).norm() / b_generic.norm()).item()
        fwd_ms = median_ms(lambda: flashgla.chunk_gla(q, k, v, g))
        leaves = [x.detach().clone().requires_grad_() for x in (q, k, v, g)]
        o_grad = torch.randn(B, T, H, V, device="cuda", dtype=torch.bfloat16)

        def fwd_bwd():
            o, _ = flashgla.chunk_gla(*leaves)
            torch.autograd.grad(o, leaves, o_grad)

        fwd_bwd_ms = median_ms(fwd_bwd)
        shape = f"B{B} T{T} H{H} K{K} V{V}"
        lines.append(f"| {shape} | {str(gate_dtype).replace('torch.', '')} | {states_ms:.3f} | {floor_ms:.3f} | "
                     f"{floor_ms / states_ms:.0%} | {generic_ms:.3f} | {grads_ms:.3f} | {floor_ms / grads_ms:.0%} | "
                     f"{generic_grads_ms:.3f} | {fwd_ms:.3f} | {states_ms / fwd_ms:.2f} | {fwd_bwd_ms:.3f} | "
                     f"{(states_ms + grads_ms) / fwd_bwd_ms:.2f} | {diff:.1e} | {grads_diff:.1e} |")
        print(lines[-1], flush=True)
        del q, k, v, do, g, leaves, o_grad
        torch.cuda.empty_cache()
    print_table(lines, args.out)


if __name__ == "__main__":
    main()
