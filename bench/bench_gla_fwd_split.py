"""CUDA GLA forward of long sequences: the split's states pass (the states kernel, then the fold).

Run on a CUDA machine with flashgla importable (PYTHONPATH=<cmake build dir
with -DFLASHGLA_PYTHON=ON>/python):

    python bench/bench_gla_fwd_split.py [--pieces 1,2,4] [--out results.md]

In one process, on the same inputs (bf16 q, k, v; g = logsigmoid(randn)):
  * the default: the states kernel with the planner's piece count, and for the
    first two shapes each forced --pieces (FLASHGLA_GLA_STATE_PIECES);
  * per-kernel device times (torch.profiler): states kernel, fold, output pass;
  * F.scaled_dot_product_attention causal (flash backend) where K = V.
Totals are medians of triton's do_bench. (The variants this benchmark used to
compare, the fast kernel's own states pass, per-split slots and 3 stages, are
retired: bench/notes_gla_fwd.md, "Retired variants".)
"""

import argparse
import datetime
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_gla_fwd import F32, copy_bandwidth, gla_inputs, median_ms, print_table, profiled_kernel_ms, sdpa_ms  # noqa: E402

import flashgla  # noqa: E402

SHAPES = [  # B, T, H, K, V, gate dtype (None: as q), target
    (2, 16384, 16, 128, 128, None, "<= 0.6 ms"),
    (2, 16384, 16, 128, 128, F32, "-"),
    (2, 16384, 16, 64, 64, None, "-"),
    (2, 8192, 4, 128, 256, F32, "-"),  # the 340M model's heads
    (1, 65536, 8, 128, 128, None, "-"),
]


def with_env(settings, fn):
    """fn() with the tuning switches {name: value or None} (flashgla's ops read them at every call)."""
    old = {name: os.environ.get(name) for name in settings}

    def apply(values):
        for name, value in values.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

    apply(settings)
    try:
        return fn()
    finally:
        apply(old)


def kernels(call):
    """(states kernel, fold kernel, fast kernel) mean device ms per call."""
    times = profiled_kernel_ms(call)
    pick = lambda part: sum(ms for key, ms in times.items() if part in key)
    return pick("split_states_kernel"), pick("fold_pieces_kernel"), pick("fast_chunk_kernel")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pieces", default="1,2,3,4", help="forced FLASHGLA_GLA_STATE_PIECES values (first shapes)")
    parser.add_argument("--out", default=None, help="also append the table to this markdown file")
    args = parser.parse_args()
    torch.manual_seed(0)
    card = torch.cuda.get_device_name()
    bandwidth, _ = copy_bandwidth()
    print(f"{card}: copy {bandwidth / 1e12:.2f} TB/s (read + write)", flush=True)
    lines = [f"{datetime.date.today().isoformat()}, {card} (copy {bandwidth / 1e12:.2f} TB/s read + write)", "",
             "| shape | ms | states + fold ms | output pass ms | SDPA flash causal ms | ms/SDPA | target |",
             "|---|---|---|---|---|---|---|"]
    for index, (B, T, H, K, V, gate_dtype, target) in enumerate(SHAPES):
        q, k, v, g = gla_inputs(B, T, H, K, V, gate_dtype=gate_dtype)
        call = lambda: flashgla.chunk_gla(q, k, v, g)
        default_env = {"FLASHGLA_GLA_STATE_PIECES": None}
        total = with_env(default_env, lambda: median_ms(call))
        states, fold, output = with_env(default_env, lambda: kernels(call))
        sdpa = sdpa_ms(B, T, H, K, V)
        label = f"B{B} T{T} H{H} K{K} V{V}" + (" g fp32" if gate_dtype == F32 else "")
        sdpa_text = f"{sdpa:.4f}" if sdpa else "-"
        ratio = f"{total / sdpa:.2f}x" if sdpa else "-"
        print(f"{label}: {total:.4f} ms (states {states:.4f} + fold {fold:.4f}, output {output:.4f}), SDPA {sdpa_text}",
              flush=True)
        lines.append(f"| chunk_gla fwd {label} | {total:.4f} | {states:.4f} + {fold:.4f} | {output:.4f} | {sdpa_text} "
                     f"| {ratio} | {target} |")
        if index < 2:
            for pieces in [p for p in args.pieces.split(",") if p]:
                env = {"FLASHGLA_GLA_STATE_PIECES": pieces}
                forced = with_env(env, lambda: median_ms(call))
                states, fold, out_pass = with_env(env, lambda: kernels(call))
                print(f"  pieces={pieces}: {forced:.4f} ms (states {states:.4f} + fold {fold:.4f}, output {out_pass:.4f})",
                      flush=True)
                lines.append(f"| chunk_gla fwd {label} pieces={pieces} | {forced:.4f} | {states:.4f} + {fold:.4f} | "
                             f"{out_pass:.4f} | - | - | |")
        del q, k, v, g
        torch.cuda.empty_cache()
    print_table(lines, args.out)


if __name__ == "__main__":
    main()
