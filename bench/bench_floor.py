"""chunk_gla against the bytes it must move, against FLA 0.6 and against cuDNN softmax attention (issue #26).

At the anchor shapes (bench_ops.ANCHOR_SHAPES), bf16, g = logsigmoid(randn) in bf16, one process on one GPU:
  - ours: flashgla.chunk_gla forward, and forward+backward (torch.autograd.grad of o against q, k, v, g);
  - the byte floor: the bytes a pass must move at this card's device-to-device copy rate (bytes read + written),
      forward:  q, k, v, g in, o out;
      backward: q, k, v, g, do in, dq, dk, dv, dg out;
    fwd+bwd's floor is the sum of the two;
  - FLA's chunk_gla (flash-linear-attention from the environment or FLA_PATH; its columns stay empty without it);
  - cuDNN: torch SDPA's cuDNN backend, causal, on [B, T, H, K] when K = V (a softmax-attention layer of the same
    width).
Medians of triton.testing.do_bench. Prints one table and appends it, with the date, the card, the copy rate and
the versions, to bench/results_floor.md.

    FLA_PATH=/path/to/flash-linear-attention python bench/bench_floor.py [--shapes 2,3] [--no-append]

Targets (issue #26): ours / floor ≤ 2 (forward) and ≤ 2.5 (fwd+bwd); FLA / ours ≥ 3; GLA fwd+bwd / cuDNN
fwd+bwd ≤ 0.6 at B32 T2K H16 d64 and ≤ 0.45 at T4K d128.
"""

import argparse
import os

import torch
import torch.nn.functional as F

import flashgla
from bench_ops import (ANCHOR_SHAPES, append_results, copy_bandwidth, floor_bytes, fmt, gla_inputs, import_fla,
                       ratio, timed)

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results_floor.md")


def shape_row(B, T, H, K, V, bandwidth, fla_chunk):
    q, k, v, g, do = gla_inputs(B, T, H, K, V)
    inputs = (q, k, v, g)

    def grads(forward):
        return torch.autograd.grad(forward(), inputs, do)

    ours = lambda: flashgla.chunk_gla(q, k, v, g)[0]  # noqa: E731
    row = {}
    with torch.no_grad():
        row["ours_fwd"] = timed(ours)
    row["ours_fb"] = timed(lambda: grads(ours))
    forward, backward = floor_bytes(B, T, H, K, V, gate_bytes=g.element_size())
    row["floor_fwd"] = forward / bandwidth * 1e3
    row["floor_fb"] = (forward + backward) / bandwidth * 1e3

    row["fla_fwd"] = row["fla_fb"] = "—"
    if fla_chunk is not None:
        theirs = lambda: fla_chunk(q, k, v, g)[0]  # noqa: E731
        with torch.no_grad():
            theirs()  # FLA's first call autotunes its kernels
            row["fla_fwd"] = timed(theirs)
        row["fla_fb"] = timed(lambda: grads(theirs))

    row["cudnn_fwd"] = row["cudnn_fb"] = "—"
    if K == V:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))  # [B, H, T, D] views
        dot = do.transpose(1, 2)
        attention = lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)  # noqa: E731
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            with torch.no_grad():
                row["cudnn_fwd"] = timed(attention)
            row["cudnn_fb"] = timed(lambda: torch.autograd.grad(attention(), (qt, kt, vt), dot))
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", help="comma-separated indices into the anchor shapes (default: all)")
    parser.add_argument("--no-append", action="store_true", help="print only; leave results_floor.md alone")
    parser.add_argument("--warm-fla-shape", type=int, metavar="I",
                        help="only run FLA's forward and fwd+bwd once at anchor shape I (its compiles into Triton's "
                             "cache; bench/device_floor.sh's WARM=1 runs one process per shape at once)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_floor: no GPU")
    fla_ops, fla_version = import_fla("gla.chunk_gla")
    fla_chunk = fla_ops["chunk_gla"] if fla_ops else None
    if args.warm_fla_shape is not None:
        if fla_chunk is None:
            raise SystemExit("bench_floor: --warm-fla-shape needs FLA")
        q, k, v, g, do = gla_inputs(*ANCHOR_SHAPES[args.warm_fla_shape])
        torch.autograd.grad(fla_chunk(q, k, v, g)[0], (q, k, v, g), do)
        return
    shapes = ANCHOR_SHAPES if not args.shapes else [ANCHOR_SHAPES[int(i)] for i in args.shapes.split(",")]
    bandwidth = copy_bandwidth()
    card = torch.cuda.get_device_name()
    head = (f"{card}; copy {bandwidth / 1e12:.2f} TB/s; flashgla {flashgla.__version__}; FLA {fla_version}; "
            f"torch {torch.__version__}; bf16, g = logsigmoid(randn) bf16, median ms")
    print(head, flush=True)
    lines = ["| chunk_gla B,T,H,K,V | ours fwd | floor | ours / floor | FLA | FLA / ours | ours fwd+bwd | floor "
             "| ours / floor | FLA | FLA / ours | cuDNN fwd+bwd | ours / cuDNN |",
             "|" + "---|" * 13]
    for B, T, H, K, V in shapes:
        r = shape_row(B, T, H, K, V, bandwidth, fla_chunk)
        lines.append(f"| {B},{T},{H},{K},{V} | {fmt(r['ours_fwd'])} | {fmt(r['floor_fwd'])} "
                     f"| {ratio(r['ours_fwd'], r['floor_fwd'])} | {fmt(r['fla_fwd'])} "
                     f"| {ratio(r['fla_fwd'], r['ours_fwd'])} | {fmt(r['ours_fb'])} | {fmt(r['floor_fb'])} "
                     f"| {ratio(r['ours_fb'], r['floor_fb'])} | {fmt(r['fla_fb'])} | {ratio(r['fla_fb'], r['ours_fb'])} "
                     f"| {fmt(r['cudnn_fb'])} | {ratio(r['ours_fb'], r['cudnn_fb'])} |")
        print(lines[-1], flush=True)
        torch.cuda.empty_cache()
    print("\n".join(lines))
    if not args.no_append:
        append_results(RESULTS, "chunk_gla against its byte floor, FLA and cuDNN (bench/bench_floor.py appends here)",
                       head, lines)


if __name__ == "__main__":
    main()
