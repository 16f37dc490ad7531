"""CUDA GLA forward of long sequences: the split's states pass, old vs new.

Run on a CUDA machine with flashgla importable (PYTHONPATH=<cmake build dir
with -DFLASHGLA_PYTHON=ON>/python):

    python bench/bench_gla_fwd_split.py [--pieces 1,2,4] [--stages 2,3] [--out results.md]

In one process, on the same inputs (bf16 q, k, v; g = logsigmoid(randn)):
  * "old": the states pass of the fast kernel (FLASHGLA_GLA_STATES=fast);
  * "new": the states kernel (the default; FLASHGLA_GLA_STATES=split), the
    planner's piece and stage counts, and for the first two shapes each forced
    pair of --pieces and --stages (FLASHGLA_GLA_STATE_PIECES / _STAGES);
  * "prefix=0": the states kernel with per-split slots that the output pass
    folds itself (FLASHGLA_GLA_STATE_PREFIX=0), for the first two shapes;
  * per-kernel device times (torch.profiler): the states pass of "old" is the
    fast kernel's total minus its output pass (the same kernel runs twice);
  * F.scaled_dot_product_attention causal (flash backend) where K = V;
  * the relative difference of o (new vs old).
Totals are medians of triton's do_bench.
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
    old = {name: os.environ.get(name) for name in settings}
    for name, value in settings.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    try:
        return fn()
    finally:
        for name, value in old.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def kernels(call):
    """(states kernel, fold kernel, fast kernel) mean device ms per call."""
    times = profiled_kernel_ms(call)
    pick = lambda part: sum(ms for key, ms in times.items() if part in key)
    return pick("split_states_kernel"), pick("fold_pieces_kernel"), pick("fast_chunk_kernel")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pieces", default="1,2,3,4", help="forced FLASHGLA_GLA_STATE_PIECES values (first shapes)")
    parser.add_argument("--stages", default="2,3", help="forced FLASHGLA_GLA_STATE_STAGES values (first shapes)")
    parser.add_argument("--out", default=None, help="also append the table to this markdown file")
    args = parser.parse_args()
    torch.manual_seed(0)
    card = torch.cuda.get_device_name()
    bandwidth, _ = copy_bandwidth()
    print(f"{card}: copy {bandwidth / 1e12:.2f} TB/s (read + write)", flush=True)
    lines = [f"{datetime.date.today().isoformat()}, {card} (copy {bandwidth / 1e12:.2f} TB/s read + write)", "",
             "| shape | old ms | new ms | new/old | old states pass ms | new states + fold ms | output pass ms | "
             "SDPA flash causal ms | new/SDPA | rel. diff o | target |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for index, (B, T, H, K, V, gate_dtype, target) in enumerate(SHAPES):
        q, k, v, g = gla_inputs(B, T, H, K, V, gate_dtype=gate_dtype)
        call = lambda: flashgla.chunk_gla(q, k, v, g)
        old_env = {"FLASHGLA_GLA_STATES": "fast", "FLASHGLA_GLA_STATE_PIECES": None, "FLASHGLA_GLA_STATE_STAGES": None}
        new_env = {"FLASHGLA_GLA_STATES": "split", "FLASHGLA_GLA_STATE_PIECES": None, "FLASHGLA_GLA_STATE_STAGES": None}
        old = with_env(old_env, lambda: median_ms(call))
        new = with_env(new_env, lambda: median_ms(call))
        _, _, old_fast = with_env(old_env, lambda: kernels(call))
        new_states, new_fold, output = with_env(new_env, lambda: kernels(call))
        o_old = with_env(old_env, lambda: call()[0].float())
        o_new = with_env(new_env, lambda: call()[0].float())
        diff = ((o_new - o_old).norm() / o_old.norm()).item()
        del o_old, o_new
        sdpa = sdpa_ms(B, T, H, K, V)
        label = f"B{B} T{T} H{H} K{K} V{V}" + (" g fp32" if gate_dtype == F32 else "")
        sdpa_text = f"{sdpa:.4f}" if sdpa else "-"
        ratio = f"{new / sdpa:.2f}x" if sdpa else "-"
        print(f"{label}: old {old:.4f} ms, new {new:.4f} ms (states {new_states:.4f} + fold {new_fold:.4f}, "
              f"output {output:.4f}; old states {old_fast - output:.4f}), SDPA {sdpa_text}, rel. diff {diff:.1e}",
              flush=True)
        lines.append(f"| chunk_gla fwd {label} | {old:.4f} | {new:.4f} | {new / old:.2f} | {old_fast - output:.4f} | "
                     f"{new_states:.4f} + {new_fold:.4f} | {output:.4f} | {sdpa_text} | {ratio} | {diff:.1e} | {target} |")
        if index < 2:
            # Per-split slots folded by the output pass (the protocol before split_prefix), planner's pieces/stages.
            env = {"FLASHGLA_GLA_STATES": "split", "FLASHGLA_GLA_STATE_PREFIX": "0"}
            total = with_env(env, lambda: median_ms(call))
            states, fold, out_pass = with_env(env, lambda: kernels(call))
            print(f"  prefix=0: {total:.4f} ms (states {states:.4f} + fold {fold:.4f}, output {out_pass:.4f})", flush=True)
            lines.append(f"| chunk_gla fwd {label} prefix=0 | - | {total:.4f} | {total / old:.2f} | - | "
                         f"{states:.4f} + {fold:.4f} | {out_pass:.4f} | - | - | - | |")
            for stages in [s for s in args.stages.split(",") if s]:
                for pieces in [p for p in args.pieces.split(",") if p]:
                    env = {"FLASHGLA_GLA_STATES": "split", "FLASHGLA_GLA_STATE_PIECES": pieces,
                           "FLASHGLA_GLA_STATE_STAGES": stages}
                    total = with_env(env, lambda: median_ms(call))
                    states, fold, out_pass = with_env(env, lambda: kernels(call))
                    print(f"  stages={stages} pieces={pieces}: {total:.4f} ms (states {states:.4f} + fold {fold:.4f}, "
                          f"output {out_pass:.4f})", flush=True)
                    lines.append(f"| chunk_gla fwd {label} stages={stages} pieces={pieces} | - | {total:.4f} | "
                                 f"{total / old:.2f} | - | {states:.4f} + {fold:.4f} | {out_pass:.4f} | - | - | - | |")
        del q, k, v, g
        torch.cuda.empty_cache()
    print_table(lines, args.out)


if __name__ == "__main__":
    main()
