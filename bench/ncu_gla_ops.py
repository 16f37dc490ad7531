"""One GLA op, three times, for Nsight Compute to profile one of its launches:

    ncu --kernel-name regex:split_states_kernel --launch-skip 2 --launch-count 1 --set full \\
        python bench/ncu_gla_ops.py long

ops (forward only, bf16):
  long        chunk_gla, B1 T1M H16 d128, a bf16 vector gate (issue #24 item 1: the split states pass);
  linear      chunk_linear_attn(normalize=False), B32 T2K H16 d64 (issue #23 item 1's baseline);
  normalized  chunk_linear_attn(normalize=True), the same shape.
"""

import sys

import torch
import torch.nn.functional as F

import flashgla

SHAPES = {"long": (1, 1 << 20, 16, 128), "linear": (32, 2048, 16, 64), "normalized": (32, 2048, 16, 64)}


def main():
    op = sys.argv[1] if len(sys.argv) > 1 else "long"
    if op not in SHAPES:
        raise SystemExit(f"ncu_gla_ops: expected one of {', '.join(SHAPES)}, got {op!r}")
    torch.manual_seed(0)
    B, T, H, D = SHAPES[op]
    q, k, v = (torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    with torch.no_grad():
        for _ in range(3):
            if op == "long":
                g = F.logsigmoid(torch.randn(B, T, H, D, device="cuda")).to(torch.bfloat16) / 16
                flashgla.chunk_gla(q, k, v, g)
            else:
                flashgla.chunk_linear_attn(q.abs() / 8, k.abs() / 8, v, normalize=op == "normalized")
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
