"""One attention op, a few times, for Nsight Compute to profile one of its launches (bf16, D 128):

    ncu --kernel-name regex:attention_forward_hopper --launch-skip 2 --launch-count 1 --set full \\
        python bench/ncu_attention_ops.py fwd

ops: fwd, bwd, bwd-deterministic (B2 T8K H16 causal, the anchor shape of issue #25), kvcache (one query per
sequence; B64 L16K Hq = Hkv = 16 unless given as `kvcache B L Hq Hkv`) and kvcache-sdpa (torch SDPA on the same
cache, the reference). Each runs three times; the backward ops run their forward first.
"""

import sys

import torch
import torch.nn.functional as F

import flashgla


def main():
    op = sys.argv[1] if len(sys.argv) > 1 else "fwd"
    ops = ("fwd", "bwd", "bwd-deterministic", "kvcache", "kvcache-sdpa")
    if op not in ops:
        raise SystemExit(f"ncu_attention_ops: expected one of {', '.join(ops)}, got {op!r}")
    torch.manual_seed(0)
    if op.startswith("kvcache"):
        B, L, Hq, Hkv = (int(x) for x in sys.argv[2:6]) if len(sys.argv) >= 6 else (64, 16384, 16, 16)
        q = torch.randn(B, 1, Hq, 128, device="cuda", dtype=torch.bfloat16)
        k_cache = torch.randn(B, L, Hkv, 128, device="cuda", dtype=torch.bfloat16)
        v_cache = torch.randn_like(k_cache)
        lengths = torch.full((B,), L, dtype=torch.int32, device="cuda")
        for _ in range(3):
            if op == "kvcache":
                flashgla.flash_attention_with_kvcache(q, k_cache, v_cache, lengths)
            else:
                F.scaled_dot_product_attention(q.transpose(1, 2), k_cache.transpose(1, 2), v_cache.transpose(1, 2),
                                               enable_gqa=Hq != Hkv)
    else:
        q, k, v = (torch.randn(2, 8192, 16, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        do = torch.randn(2, 8192, 16, 128, device="cuda", dtype=torch.bfloat16)
        for _ in range(3):
            o = flashgla.flash_attention(q, k, v, causal=True, deterministic=op == "bwd-deterministic")
            if op != "fwd":
                torch.autograd.grad(o, (q, k, v), do)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
