"""Decode attention over a KV cache: flashgla.flash_attention_with_kvcache at batch 1, 8, 64 and cache
lengths 1K..32K (bf16, D 128; Hq 16 / Hkv 16, or --gqa for Hq 32 / Hkv 8), one new query per sequence.

Run on a GPU machine with flashgla importable (`pip install .`):

    python bench/bench_kvcache.py                # the table; appends it to bench/results_kvcache.md
    python bench/bench_kvcache.py --quick        # fewer shapes
    python bench/bench_kvcache.py --paged 256    # a paged cache (block size 256, shuffled block table)

Reported per shape: the median time (µs) of flashgla (automatic split plan; the whole cache valid),
the bandwidth it achieves on the KV bytes it must read (2·B·L·Hkv·D·2 bytes, K and V), the bandwidth of
a device-to-device copy of a tensor of the same size in the same process (counting its read and its
write; capped at 4 GiB), their ratio (the target: ≥ 0.8 at B ≥ 8, L ≥ 4K), and SDPA's time on the same
cache (its default backend choice on [B, H, 1, D] queries against the cache's transposed views; with
--gqa it repeats nothing: enable_gqa). Times are medians of triton.testing.do_bench. Each shape is first
checked against SDPA in fp32 on the same bf16 data: the relative RMS error, and FlashAttention's rule
(max abs error at most 2x that of SDPA's math backend run in bf16, plus 1e-5).
"""

import argparse
import datetime
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashgla

DEVICE = "cuda"  # the benchmark runs on the GPU; a CPU dry run of run_shape sets "cpu"

try:
    import triton.testing

    def bench_ms(fn):
        return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
except ImportError:  # pragma: no cover - triton ships with CUDA builds of torch

    def bench_ms(fn):
        for _ in range(5):
            fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(30):
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        return sorted(times)[len(times) // 2]


def run_shape(B, L, Hq, Hkv, D, paged, copy_cache):
    dtype, device = torch.bfloat16, DEVICE
    q = torch.randn(B, 1, Hq, D, dtype=dtype, device=device)
    if paged:
        per_seq = (L + paged - 1) // paged
        k_cache = torch.randn(B * per_seq, paged, Hkv, D, dtype=dtype, device=device)
        v_cache = torch.randn_like(k_cache)
        table = torch.randperm(B * per_seq, device=device).view(B, per_seq).to(torch.int32)
        j = torch.arange(L, device=device)
        k_dense = k_cache[table[:, j // paged].long(), j % paged]  # [B, L, Hkv, D], for SDPA and the check
        v_dense = v_cache[table[:, j // paged].long(), j % paged]
    else:
        k_cache = torch.randn(B, L, Hkv, D, dtype=dtype, device=device)
        v_cache = torch.randn_like(k_cache)
        table, k_dense, v_dense = None, k_cache, v_cache
    lens = torch.full((B,), L, dtype=torch.int32, device=device)

    def ours():
        return flashgla.flash_attention_with_kvcache(q, k_cache, v_cache, lens, block_table=table, max_seqlen_k=L)

    def sdpa(qq=q, kk=k_dense, vv=v_dense):
        return F.scaled_dot_product_attention(qq.transpose(1, 2), kk.transpose(1, 2), vv.transpose(1, 2),
                                              enable_gqa=Hq != Hkv).transpose(1, 2)

    ref = sdpa(q.float(), k_dense.float(), v_dense.float())
    out = ours().float()
    err = ((out - ref).norm() / ref.norm()).item()
    # FlashAttention's rule: max abs error at most 2x that of PyTorch's attention in the same dtype (+1e-5).
    with sdpa_kernel(SDPBackend.MATH):
        same_dtype = sdpa().float()
    rule = (out - ref).abs().max().item() <= 2 * (same_dtype - ref).abs().max().item() + 1e-5
    t_ours = bench_ms(ours) * 1e3
    t_sdpa = bench_ms(sdpa) * 1e3
    kv_bytes = 2 * B * L * Hkv * D * 2
    n = min(kv_bytes, 4 << 30) // 2
    src = copy_cache.get(n)
    if src is None:
        copy_cache.clear()
        src = copy_cache[n] = torch.empty(n, dtype=dtype, device=device).normal_()
    dst = torch.empty_like(src)
    t_copy = bench_ms(lambda: dst.copy_(src)) * 1e3
    bw = kv_bytes / t_ours / 1e3  # GB/s
    bw_copy = 2 * n * 2 / t_copy / 1e3
    del dst
    return dict(B=B, L=L, us=t_ours, bw=bw, copy=bw_copy, ratio=bw / bw_copy, sdpa=t_sdpa, err=err,
                rule="ok" if rule else "FAIL")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--gqa", action="store_true", help="Hq 32 / Hkv 8 instead of 16 / 16")
    parser.add_argument("--paged", type=int, default=0, help="block size of a paged cache (0: contiguous)")
    parser.add_argument("--results", default=os.path.join(os.path.dirname(__file__), "results_kvcache.md"))
    parser.add_argument("--no-append", action="store_true", help="print only")
    args = parser.parse_args()
    if not flashgla.cuda_available():
        raise SystemExit("bench_kvcache: needs a CUDA build of flashgla and a GPU")
    Hq, Hkv, D = (32, 8, 128) if args.gqa else (16, 16, 128)
    batches = (1, 8, 64)
    lengths = (1024, 4096, 16384) if args.quick else (1024, 2048, 4096, 8192, 16384, 32768)
    props = torch.cuda.get_device_properties(0)
    title = (f"## {datetime.date.today()}, {props.name} ({props.multi_processor_count} SMs), torch {torch.__version__}"
             f"\n\nbf16, Hq {Hq} / Hkv {Hkv}, D {D}, one query per sequence, "
             f"{f'paged (block {args.paged})' if args.paged else 'contiguous'} cache; "
             "`python bench/bench_kvcache.py" + " ".join([""] + [a for a in sys.argv[1:]]) + "`\n")
    lines = ["| B | L | flashgla µs | GB/s on KV | copy GB/s | ratio | SDPA µs | rel err vs fp32 | 2x rule |",
             "|---|---|---|---|---|---|---|---|---|"]
    print(title)
    print("\n".join(lines))
    copy_cache = {}
    for B in batches:
        for L in lengths:
            if 4 * B * L * Hkv * D * 2 > props.total_memory * 0.7:  # cache + dense views + copy buffers
                continue
            r = run_shape(B, L, Hq, Hkv, D, args.paged, copy_cache)
            line = (f"| {r['B']} | {r['L']} | {r['us']:.1f} | {r['bw']:.0f} | {r['copy']:.0f} | {r['ratio']:.2f} | "
                    f"{r['sdpa']:.1f} | {r['err']:.1e} | {r['rule']} |")
            lines.append(line)
            print(line, flush=True)
            torch.cuda.empty_cache()
    if not args.no_append:
        with open(args.results, "a") as f:
            if f.tell() == 0:
                f.write("# Decode attention over a KV cache (flash_attention_with_kvcache) results\n\n")
            f.write(title + "\n" + "\n".join(lines) + "\n\n")


if __name__ == "__main__":
    main()
