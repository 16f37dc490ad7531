"""What each gate kind costs, flashgla beside FLA 0.6.0 (Triton) in one process on one GPU (issue #23, item 4).

At B8 T4096 H16 d128 and B32 T2048 H16 d64, bf16 q, k, v, forward and forward+backward:
- chunk_gla, a per-key gate g [B,T,H,K] in bf16 (the reference of the ratio column);
- chunk_simple_gla, a scalar gate g [B,T,H] in fp32 (what FLA's simple GLA layers pass);
- chunk_simple_gla, g + g_gamma (g_gamma [H] fp32, a gradient for both);
- chunk_simple_gla, g_gamma alone (RetNet's fixed decay);
- chunk_linear_attn, no gate, normalize=False;
- chunk_linear_attn, no gate, normalize=True (FLA's default; issue #23 item 1 compares it with the row above).
"vs vector" is the vector gate's time over the row's (above 1: faster than the vector gate). FLA's columns
are the same ops of fla.ops (flash-linear-attention 0.6.0, imported from the environment or FLA_PATH), timed in
the same call after one warm-up call each (its autotuning); "n/i" where FLA is not importable.

    python bench/bench_gates.py [--shapes 8x4096x16x128,32x2048x16x64] [--no-append]
    python bench/bench_gates.py --warm-fla-case I [--shapes ...]   (bench/device_gates.sh: FLA's compiles only)

Appends the table, with the date, card and versions, to bench/results_gates.md.
"""

import argparse
import os
import sys

import torch
import torch.nn.functional as F

import flashgla
from bench_fla_api import fwd_bwd
from bench_ops import append_results, fmt, import_fla, median_ms, ratio

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results_gates.md")


def cases(B, T, H, D, lib):
    """name -> (forward closure, the leaves it differentiates) for one library's ops (flashgla's or FLA's)."""
    gen = torch.Generator(device="cuda").manual_seed(0)

    def leaf(*shape, dtype=torch.bfloat16, positive=False):
        x = torch.randn(*shape, device="cuda", generator=gen)
        return (x.sigmoid() if positive else x).to(dtype).requires_grad_()

    q, k, v = leaf(B, T, H, D, positive=True), leaf(B, T, H, D, positive=True), leaf(B, T, H, D)
    g_vec = F.logsigmoid(torch.randn(B, T, H, D, device="cuda", generator=gen) + 3).to(torch.bfloat16)
    g_vec.requires_grad_()
    g_sca = F.logsigmoid(torch.randn(B, T, H, device="cuda", generator=gen) + 3).requires_grad_()
    gamma = (-torch.rand(H, device="cuda", generator=gen) * 0.1).requires_grad_()
    return {
        "vector g (chunk_gla)": (lambda: lib["chunk_gla"](q, k, v, g_vec)[0], [q, k, v, g_vec]),
        "scalar g fp32 (chunk_simple_gla)": (lambda: lib["chunk_simple_gla"](q, k, v, g_sca)[0], [q, k, v, g_sca]),
        "g + g_gamma (chunk_simple_gla)": (lambda: lib["chunk_simple_gla"](q, k, v, g_sca, gamma)[0],
                                           [q, k, v, g_sca, gamma]),
        "g_gamma alone (chunk_simple_gla)": (lambda: lib["chunk_simple_gla"](q, k, v, None, gamma)[0],
                                             [q, k, v, gamma]),
        "no gate (chunk_linear_attn)": (lambda: lib["chunk_linear_attn"](q, k, v, normalize=False)[0], [q, k, v]),
        "no gate, normalize=True (chunk_linear_attn)": (lambda: lib["chunk_linear_attn"](q, k, v, normalize=True)[0],
                                                        [q, k, v]),
    }


def times(forward, leaves):
    """(forward ms, forward+backward ms); None where the library refuses the call ("n/i" in the table). FLA 0.6.0
    refuses the backward of a gated chunk_simple_gla on Hopper with Triton in [3.4.0, 3.7.1) (its issue #640): the
    forward is still timed."""
    try:
        with torch.no_grad():
            forward()  # warm-up (FLA's autotuning)
    except Exception as error:  # noqa: BLE001 - reported in the table
        print(f"bench_gates: forward: {error}", file=sys.stderr)
        return None, None
    with torch.no_grad():
        f = median_ms(forward)
    both = fwd_bwd(forward, leaves)
    try:
        both()
    except Exception as error:  # noqa: BLE001 - reported in the table
        print(f"bench_gates: backward: {error}", file=sys.stderr)
        return f, None
    return f, median_ms(both)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="8x4096x16x128,32x2048x16x64", help="BxTxHxD, comma-separated")
    parser.add_argument("--no-append", action="store_true")
    parser.add_argument("--warm-fla-case", type=int, metavar="I",
                        help="only run FLA's I-th case (0-5) once per shape, forward and backward, and time nothing: "
                             "fills Triton's compile cache, several cases at once (device_gates.sh)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_gates: needs a CUDA device")
    fla_ops, fla_version = import_fla("gla.chunk_gla", "simple_gla.chunk_simple_gla",
                                      "linear_attn.chunk_linear_attn")
    if args.warm_fla_case is not None:
        if fla_ops is None:
            raise SystemExit("bench_gates: --warm-fla-case needs FLA")
        for shape in args.shapes.split(","):
            forward, leaves = list(cases(*(int(x) for x in shape.split("x")), fla_ops).values())[args.warm_fla_case]
            try:
                with torch.no_grad():
                    forward()
                fwd_bwd(forward, leaves)()
            except Exception as error:  # noqa: BLE001 - a refused backward still leaves the forward compiled
                print(f"bench_gates: warm-up of case {args.warm_fla_case}: {error}", file=sys.stderr)
        return
    ours_ops = {"chunk_gla": flashgla.chunk_gla, "chunk_simple_gla": flashgla.chunk_simple_gla,
                "chunk_linear_attn": flashgla.chunk_linear_attn}
    lines = ["| shape | gate | fwd ms | vs vector | fwd+bwd ms | vs vector | FLA fwd ms | FLA fwd+bwd ms | "
             "FLA / ours fwd | FLA / ours fwd+bwd |", "|---|---|---|---|---|---|---|---|---|---|"]
    for shape in args.shapes.split(","):
        B, T, H, D = (int(x) for x in shape.split("x"))
        ours = {name: times(*case) for name, case in cases(B, T, H, D, ours_ops).items()}
        print(f"B{B} T{T} H{H} d{D} flashgla: {ours}", flush=True)  # before FLA's autotuning, in case time runs out
        theirs = ({name: times(*case) for name, case in cases(B, T, H, D, fla_ops).items()} if fla_ops
                  else {name: (None, None) for name in ours})
        vec_f, vec_b = ours["vector g (chunk_gla)"]
        for name, (f, b) in ours.items():
            ff, fb = theirs[name]
            line = (f"| B{B} T{T} H{H} d{D} | {name} | {fmt(f)} | {ratio(vec_f, f)} | {fmt(b)} | {ratio(vec_b, b)} | "
                    f"{fmt(ff)} | {fmt(fb)} | {ratio(ff, f)} | {ratio(fb, b)} |")
            print(line, flush=True)
            lines.append(line)
    if not args.no_append:
        heading = (f"{torch.cuda.get_device_name()}, torch {torch.__version__}, flashgla {flashgla.__version__}, "
                   f"FLA {fla_version}, bf16 q/k/v")
        append_results(RESULTS, "Gate kinds: flashgla and FLA 0.6.0 (bench/bench_gates.py)", heading, lines)


if __name__ == "__main__":
    main()
