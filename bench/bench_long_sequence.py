#!/usr/bin/env python3
"""One long sequence against the batched anchor (issue 24, item 1): chunk_gla forward and forward+backward per
token at B = 1 and long T, and for a varlen batch of one long sequence among short ones, against B8 T4096 at the
same H; FLA 0.6.0's chunk_gla in the same process up to --fla-max-tokens per sequence.

    python bench/bench_long_sequence.py                      # the issue's shapes, d = 128
    python bench/bench_long_sequence.py --shapes 1x32768x16  # BxTxH; 'varlen:LONGxNxSHORTxH' for a varlen batch

bf16 q, k, v and a bf16 vector gate (log-sigmoid), K = V = --dim. Medians of triton's do_bench (CUDA events
without Triton). 'per token vs anchor' divides the row's µs per token by B8 T4096's at the same H (issue 24's
target: within 1.1×). Prints the table last and appends it to bench/results_long_sequence.md.
"""

import argparse
import os

import torch
import torch.nn.functional as F

import flashgla
from bench_fla_api import fwd_bwd
from bench_ops import append_results, import_fla, median_ms

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results_long_sequence.md")
SHAPES = ("8x4096x16,1x32768x16,1x131072x16,1x1048576x16,varlen:1048576x32x2048x16,"
          "8x4096x4,1x32768x4,1x131072x4,1x1048576x4,varlen:1048576x32x2048x4")


def parse_shape(text):
    """(label, B, T, H, lengths or None): 'BxTxH', or 'varlen:LONGxNxSHORTxH' (one sequence of LONG tokens, then N
    of SHORT, as one varlen batch)."""
    if text.startswith("varlen:"):
        long, n, short, H = (int(x) for x in text.removeprefix("varlen:").split("x"))
        lengths = [long] + [short] * n
        return f"varlen {long} + {n}×{short} H{H}", 1, sum(lengths), H, lengths
    B, T, H = (int(x) for x in text.split("x"))
    return f"B{B} T{T} H{H}", B, T, H, None


def run_shape(B, T, H, lengths, D, fla_chunk, fla_max_tokens):
    """{(library, pass): ms} for one shape."""
    gen = torch.Generator(device="cuda").manual_seed(0)

    def leaf(dtype=torch.bfloat16):
        return torch.randn(B, T, H, D, device="cuda", generator=gen).to(dtype).requires_grad_()

    q, k, v = leaf(), leaf(), leaf()
    g = F.logsigmoid(torch.randn(B, T, H, D, device="cuda", generator=gen) + 3).to(torch.bfloat16).requires_grad_()
    kw = {}
    if lengths is not None:
        kw["cu_seqlens"] = torch.tensor([0] + lengths, device="cuda").cumsum(0).to(torch.int32)
    libraries = [("ours", lambda: flashgla.chunk_gla(q, k, v, g, **kw)[0])]
    longest = max(lengths) if lengths is not None else T
    if fla_chunk is not None and longest <= fla_max_tokens:
        fla_kw = {"cu_seqlens": kw["cu_seqlens"].long()} if lengths is not None else {}
        libraries.append(("fla", lambda: fla_chunk(q, k, v, g, **fla_kw)[0]))
    times = {}
    for name, forward in libraries:
        with torch.no_grad():
            forward()  # warm-up (FLA's autotuning)
            times[name, "fwd"] = median_ms(forward)
        both = fwd_bwd(forward, [q, k, v, g])
        both()
        times[name, "fwd+bwd"] = median_ms(both)
        print(f"  {name}: fwd {times[name, 'fwd']:.3f} ms, fwd+bwd {times[name, 'fwd+bwd']:.3f} ms", flush=True)
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default=SHAPES, help="comma-separated BxTxH or varlen:LONGxNxSHORTxH")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--fla-max-tokens", type=int, default=131072,
                        help="FLA runs where the longest sequence has at most this many tokens")
    parser.add_argument("--no-append", action="store_true")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_long_sequence: needs a CUDA device")
    fla_ops, fla_version = import_fla("gla.chunk_gla")
    fla_chunk = fla_ops["chunk_gla"] if fla_ops else None
    rows, anchor = [], {}
    for text in args.shapes.split(","):
        label, B, T, H, lengths = parse_shape(text)
        print(f"== {label}", flush=True)
        times = run_shape(B, T, H, lengths, args.dim, fla_chunk, args.fla_max_tokens)
        tokens = B * T
        if (B, T, lengths) == (8, 4096, None):
            anchor[H] = {p: times["ours", p] / tokens for p in ("fwd", "fwd+bwd")}
        rows.append((label, H, tokens, times))
        torch.cuda.empty_cache()

    def cell(value, digits=3):
        return "" if value is None else f"{value:.{digits}f}"

    lines = ["| shape | tokens | fwd ms | fwd µs/token | fwd+bwd ms | fwd+bwd µs/token | per token vs anchor "
             "(fwd, fwd+bwd) | FLA fwd ms | FLA fwd+bwd ms | FLA / ours (fwd, fwd+bwd) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for label, H, tokens, t in rows:
        per = {p: t["ours", p] / tokens for p in ("fwd", "fwd+bwd")}
        vs = ", ".join(f"{per[p] / anchor[H][p]:.2f}" for p in ("fwd", "fwd+bwd")) if H in anchor else ""
        fla = {p: t.get(("fla", p)) for p in ("fwd", "fwd+bwd")}
        fla_ratio = ", ".join(f"{fla[p] / t['ours', p]:.2f}" for p in ("fwd", "fwd+bwd")) if fla["fwd"] else ""
        lines.append(f"| {label} | {tokens} | {t['ours', 'fwd']:.3f} | {per['fwd'] * 1e3:.4f} | "
                     f"{t['ours', 'fwd+bwd']:.3f} | {per['fwd+bwd'] * 1e3:.4f} | {vs} | {cell(fla['fwd'])} | "
                     f"{cell(fla['fwd+bwd'])} | {fla_ratio} |")
    heading = (f"{torch.cuda.get_device_name()}, torch {torch.__version__}, FLA {fla_version}: chunk_gla, bf16, "
               f"K = V = {args.dim}, a bf16 vector gate")
    print(f"\n{heading}\n\n" + "\n".join(lines))
    if not args.no_append:
        append_results(RESULTS, "One long sequence against the batched anchor", heading, lines)


if __name__ == "__main__":
    main()
