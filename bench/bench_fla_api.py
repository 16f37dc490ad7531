"""What FLA 0.6's options cost on top of the plain ops (GPU, bf16, fwd and fwd+bwd), in one process:

- chunk_linear_attn(normalize=True) (FLA's default: the normaliser's forward and backward kernels) against
  normalize=False;
- chunk_simple_gla(g, g_gamma) (the gate g + g_gamma materialised, its gradient reduced) against
  chunk_simple_gla(g) with the same gate precomputed;
- chunk_gla(state_v_first=True) (strided state reads and writes) against the [K, V] layout.

    python bench/bench_fla_api.py                        # B8 T4096 H16 d128 and B32 T2048 H16 d64
    python bench/bench_fla_api.py --shapes 8x4096x16x128 --no-append

Appends a dated table to bench/results_fla_api.md (median ms, ratio to the plain op).
"""

import argparse
import os

import torch
import torch.nn.functional as F

import flashgla
from bench_ops import append_results, median_ms

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results_fla_api.md")


def cases(B, T, H, D):
    gen = torch.Generator(device="cuda").manual_seed(0)

    def leaf(*shape, positive=False):
        x = torch.randn(*shape, device="cuda", generator=gen)
        x = x.sigmoid() if positive else x
        return x.to(torch.bfloat16).requires_grad_()

    q, k, v = leaf(B, T, H, D, positive=True), leaf(B, T, H, D, positive=True), leaf(B, T, H, D)
    g_s = F.logsigmoid(torch.randn(B, T, H, device="cuda", generator=gen) + 3).requires_grad_()
    g_v = F.logsigmoid(torch.randn(B, T, H, D, device="cuda", generator=gen) + 3).to(torch.bfloat16).requires_grad_()
    gamma = (-torch.rand(H, device="cuda", generator=gen) * 0.1).requires_grad_()
    h0 = torch.randn(B, H, D, D, device="cuda", generator=gen).requires_grad_()
    h0_t = h0.detach().transpose(-1, -2).contiguous().requires_grad_()
    g_sum = (g_s.detach() + gamma.detach()).requires_grad_()
    return {
        "chunk_linear_attn normalize=True": (lambda: flashgla.chunk_linear_attn(q, k, v)[0],
                                             lambda: flashgla.chunk_linear_attn(q, k, v, normalize=False)[0]),
        "chunk_simple_gla g + g_gamma": (lambda: flashgla.chunk_simple_gla(q, k, v, g_s, gamma)[0],
                                         lambda: flashgla.chunk_simple_gla(q, k, v, g_sum)[0]),
        "chunk_gla state_v_first": (
            lambda: flashgla.chunk_gla(q, k, v, g_v, initial_state=h0_t, output_final_state=True,
                                       state_v_first=True)[0],
            lambda: flashgla.chunk_gla(q, k, v, g_v, initial_state=h0, output_final_state=True)[0]),
    }, (q, k, v, g_s, g_v, gamma, h0, h0_t, g_sum)


def fwd_bwd(forward, leaves):
    def run():
        o = forward()
        torch.autograd.grad(o, [x for x in leaves if x.requires_grad], torch.ones_like(o), allow_unused=True)
    return run


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="8x4096x16x128,32x2048x16x64", help="BxTxHxD, comma-separated")
    parser.add_argument("--no-append", action="store_true")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_fla_api: needs a CUDA device")
    lines = ["| shape | option | fwd ms (plain) | ratio | fwd+bwd ms (plain) | ratio |", "|---|---|---|---|---|---|"]
    for shape in args.shapes.split(","):
        B, T, H, D = (int(x) for x in shape.split("x"))
        table, leaves = cases(B, T, H, D)
        for name, (option, plain) in table.items():
            with torch.no_grad():
                f_opt, f_plain = median_ms(option), median_ms(plain)
            b_opt, b_plain = median_ms(fwd_bwd(option, leaves)), median_ms(fwd_bwd(plain, leaves))
            line = (f"| B{B} T{T} H{H} d{D} | {name} | {f_opt:.3f} ({f_plain:.3f}) | {f_opt / f_plain:.2f} | "
                    f"{b_opt:.3f} ({b_plain:.3f}) | {b_opt / b_plain:.2f} |")
            print(line, flush=True)
            lines.append(line)
    if not args.no_append:
        append_results(RESULTS, "FLA 0.6 options: cost over the plain ops", torch.cuda.get_device_name(), lines)


if __name__ == "__main__":
    main()
