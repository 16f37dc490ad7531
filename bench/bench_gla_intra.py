"""chunk_gla with the forward's intra-chunk scores saved for the backward (GlaForwardArgs::intra) against the
same package recomputing them in the backward, in one process: forward (inputs requiring grad), and forward+backward
(torch.autograd.grad of o against q, k, v, g), bf16, g = logsigmoid(randn), at the anchor shapes. The two
variants alternate shape by shape; medians of triton.testing.do_bench (bench_ops.timed). Prints one table and
appends it, with the date and the card, to bench/results_floor.md.

    python bench/bench_gla_intra.py [--shapes 0,3] [--no-append]
"""

import argparse
import os

import torch

import flashgla
import flashgla.ops.gla as gla_ops
from bench_ops import ANCHOR_SHAPES, append_results, fmt, gla_inputs, ratio, timed

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results_floor.md")


def recomputing(function):
    """function with the op asking for no intra (the backward then recomputes A)."""
    def run():
        saved = gla_ops._intra_output
        gla_ops._intra_output = lambda algorithm, q, *rest: gla_ops._absent(q)
        try:
            return function()
        finally:
            gla_ops._intra_output = saved
    return run


def shape_row(B, T, H, K, V):
    q, k, v, g, do = gla_inputs(B, T, H, K, V)
    inputs = (q, k, v, g)

    def forward():
        return flashgla.chunk_gla(q, k, v, g)[0]

    def forward_backward():
        return torch.autograd.grad(forward(), inputs, do)

    # (inputs requiring grad, as in training: under no_grad chunk_gla keeps no A)
    fwd_recomputing = timed(recomputing(forward))
    fwd_saving = timed(forward)
    fb_recomputing = timed(recomputing(forward_backward))
    fb_saving = timed(forward_backward)
    return (f"| {B},{T},{H},{K},{V} | {fmt(fwd_recomputing)} | {fmt(fwd_saving)} | {fmt(fb_recomputing)} | "
            f"{fmt(fb_saving)} | {ratio(fb_recomputing, fb_saving)} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", help="comma-separated indices into the anchor shapes (default: all)")
    parser.add_argument("--no-append", action="store_true", help="print only; leave results_floor.md alone")
    args = parser.parse_args()
    shapes = ANCHOR_SHAPES if args.shapes is None else [ANCHOR_SHAPES[int(i)] for i in args.shapes.split(",")]
    lines = ["| chunk_gla B,T,H,K,V | fwd, A recomputed (ms) | fwd, A saved | fwd+bwd, A recomputed | "
             "fwd+bwd, A saved | recomputed / saved |", "|---|---|---|---|---|---|"]
    for shape in shapes:
        lines.append(shape_row(*shape))
        print(lines[-1], flush=True)
    print("\n".join(lines))
    if not args.no_append:
        card = torch.cuda.get_device_name()
        append_results(RESULTS, "chunk_gla against its byte floor, FLA and cuDNN (bench/bench_floor.py appends here)",
                       f"{card}, flashgla {flashgla.__version__}: A saved by the forward against A recomputed in "
                       "the backward (bench/bench_gla_intra.py)", lines)


if __name__ == "__main__":
    main()
