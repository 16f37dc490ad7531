"""flashgla against flash-linear-attention (FLA, Triton) in one process on one GPU.

At the anchor shapes (the list below): chunk_gla forward and forward+backward
(time and peak memory), SDPA (flash backend, causal) beside them where the
head dims allow; fused_recurrent_gla forward; one decode step. FLA is not a
dependency of flashgla: point FLA_PATH at a checkout of
flash-linear-attention (the `fla` package directory's parent; it needs einops
and Triton). Times are medians of triton.testing.do_bench after FLA's own
autotuning has run once per shape (its first call is excluded).

    FLA_PATH=/path/to/flash-linear-attention python bench/bench_vs_fla.py [--shapes 0,3]

Prints one table and appends it, with the date, card and versions, to
bench/results_vs_fla.md. "diff" is the relative RMS difference of flashgla's
output (and of its gradients, fwd+bwd) from FLA's: both are bf16 computations of
the same function, so a large value would mean the two are not comparable.
"""

import argparse
import os

import torch
import torch.nn.functional as F

import flashgla
from bench_ops import ANCHOR_SHAPES, append_results, fmt, gla_inputs, import_fla, median_ms, ratio

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results_vs_fla.md")


def rel_diff(a, b):
    a, b = a.float(), b.float()
    return ((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt().clamp_min(1e-30)).item()


def peak_mb(function):
    """Peak memory allocated during `function` above what was allocated before it, in MB."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    function()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def chunked_row(B, T, H, K, V, fla_chunk):
    q, k, v, g, do = gla_inputs(B, T, H, K, V)
    inputs = (q, k, v, g)

    def ours():
        return flashgla.chunk_gla(q, k, v, g)[0]

    def theirs():
        return fla_chunk(q, k, v, g)[0]

    def grads(forward):
        return torch.autograd.grad(forward(), inputs, do)

    row = {}
    with torch.no_grad():
        o_ours, o_fla = ours(), theirs()  # FLA's first call autotunes its kernels
    row["diff_o"] = rel_diff(o_ours, o_fla)
    g_ours, g_fla = grads(ours), grads(theirs)
    row["diff_grad"] = max(rel_diff(a, b) for a, b in zip(g_ours, g_fla))
    del o_ours, o_fla, g_ours, g_fla
    with torch.no_grad():
        row["ours_fwd"], row["fla_fwd"] = median_ms(ours), median_ms(theirs)
    row["ours_fb"], row["fla_fb"] = median_ms(lambda: grads(ours)), median_ms(lambda: grads(theirs))
    row["ours_mb"], row["fla_mb"] = peak_mb(lambda: grads(ours)), peak_mb(lambda: grads(theirs))
    row["sdpa_fb"] = row["sdpa_mb"] = "—"
    if K == V:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))
        dot = do.transpose(1, 2)

        def sdpa_grads():
            return torch.autograd.grad(F.scaled_dot_product_attention(qt, kt, vt, is_causal=True), (qt, kt, vt), dot)

        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            row["sdpa_fb"], row["sdpa_mb"] = median_ms(sdpa_grads), peak_mb(sdpa_grads)
    return row


def recurrent_row(B, T, H, K, V, fla_recurrent):
    dtype = torch.bfloat16
    q, k = (torch.randn(B, T, H, K, device="cuda", dtype=dtype) for _ in range(2))
    v = torch.randn(B, T, H, V, device="cuda", dtype=dtype)
    g = F.logsigmoid(torch.randn(B, T, H, K, device="cuda")).to(dtype)
    with torch.no_grad():
        ours = lambda: flashgla.fused_recurrent_gla(q, k, v, g)[0]  # noqa: E731
        theirs = lambda: fla_recurrent(q, k, v, gk=g)[0]  # noqa: E731
        diff = rel_diff(ours(), theirs())
        return median_ms(ours), median_ms(theirs), diff


def decode_row(N, H, K, V, fla_recurrent):
    """One token per sequence with an fp32 state [N,H,K,V]: ours updates it in place, FLA reads and returns it."""
    dtype = torch.bfloat16
    q, k = (torch.randn(N, 1, H, K, device="cuda", dtype=dtype) for _ in range(2))
    v = torch.randn(N, 1, H, V, device="cuda", dtype=dtype)
    g = F.logsigmoid(torch.randn(N, 1, H, K, device="cuda")).to(dtype)
    state = torch.randn(N, H, K, V, device="cuda")
    state_ours = state.clone()
    with torch.no_grad():
        o_fla, state_fla = fla_recurrent(q, k, v, gk=g, initial_state=state, output_final_state=True)
        o_ours = flashgla.gla_decode_step(q, k, v, g, state_ours)
        diff = max(rel_diff(o_ours, o_fla), rel_diff(state_ours, state_fla))
        ours_ms = median_ms(lambda: flashgla.gla_decode_step(q, k, v, g, state_ours))
        fla_ms = median_ms(lambda: fla_recurrent(q, k, v, gk=g, initial_state=state, output_final_state=True))
    return ours_ms, fla_ms, diff


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", help="comma-separated indices into the anchor shapes (default: all)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_vs_fla: no GPU")
    fla_ops, fla_version = import_fla("gla.chunk_gla", "gla.fused_recurrent_gla", required=True)
    fla_chunk, fla_recurrent = fla_ops["chunk_gla"], fla_ops["fused_recurrent_gla"]
    shapes = ANCHOR_SHAPES if not args.shapes else [ANCHOR_SHAPES[int(i)] for i in args.shapes.split(",")]
    card = torch.cuda.get_device_name()
    head = (f"{card}; flashgla {flashgla.__version__}; FLA {fla_version}; torch {torch.__version__}; "
            "bf16, g = logsigmoid(randn), median ms; peak MB = fwd+bwd allocations above the inputs")
    print(head)

    lines = ["| chunk_gla B,T,H,K,V | ours fwd | FLA fwd | FLA/ours | ours fwd+bwd | FLA fwd+bwd | FLA/ours "
             "| SDPA fwd+bwd | ours peak MB | FLA peak MB | SDPA peak MB | diff o | diff grads |",
             "|" + "---|" * 13]
    for B, T, H, K, V in shapes:
        print(f"B={B} T={T} H={H} K={K} V={V}", flush=True)
        r = chunked_row(B, T, H, K, V, fla_chunk)
        lines.append(f"| {B},{T},{H},{K},{V} | {fmt(r['ours_fwd'])} | {fmt(r['fla_fwd'])} "
                     f"| {ratio(r['fla_fwd'], r['ours_fwd'])} | {fmt(r['ours_fb'])} | {fmt(r['fla_fb'])} "
                     f"| {ratio(r['fla_fb'], r['ours_fb'])} | {fmt(r['sdpa_fb'])} | {fmt(r['ours_mb'], 0)} "
                     f"| {fmt(r['fla_mb'], 0)} | {fmt(r['sdpa_mb'], 0)} | {r['diff_o']:.1e} | {r['diff_grad']:.1e} |")
        print(lines[-1], flush=True)
        torch.cuda.empty_cache()

    lines += ["", "| other op | ours ms | FLA ms | FLA/ours | diff |", "|---|---|---|---|---|"]
    ours_ms, fla_ms, diff = recurrent_row(8, 2048, 16, 64, 64, fla_recurrent)
    lines.append(f"| fused_recurrent_gla fwd B8 T2048 H16 d64 | {fmt(ours_ms)} | {fmt(fla_ms)} "
                 f"| {ratio(fla_ms, ours_ms)} | {diff:.1e} |")
    for N, H, K, V in ((64, 16, 128, 128), (256, 16, 128, 128), (64, 4, 256, 512)):
        ours_ms, fla_ms, diff = decode_row(N, H, K, V, fla_recurrent)
        lines.append(f"| decode step N{N} H{H} K{K} V{V} (fp32 state) | {fmt(ours_ms, 4)} | {fmt(fla_ms, 4)} "
                     f"| {ratio(fla_ms, ours_ms)} | {diff:.1e} |")
    print("\n".join(lines))
    append_results(RESULTS, "flashgla vs FLA (bench/bench_vs_fla.py appends here)", head, lines)


if __name__ == "__main__":
    main()
