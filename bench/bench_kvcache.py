"""Decode attention over a KV cache: flashgla.flash_attention_with_kvcache at batch 1, 8, 64 and cache
lengths 1K..32K (bf16, D 128; Hq 16 / Hkv 16, or --gqa for Hq 32 / Hkv 8, --gqa 8 for Hq 64 / Hkv 8), one new
query per sequence.

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
(max abs error at most 2x that of SDPA's math backend run in bf16, plus 1e-5). The fp32 reference is computed
a few batch rows at a time (whole, its K and V copies would be 4x the bf16 cache: 16 GiB at B 64, L 16K);
`python bench/bench_kvcache.py --check-reference` checks that on the CPU against the whole-batch reference.
"""

import argparse
import datetime
import math
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


# fp32 K and V of one piece of batch rows of the reference, counted at Hq heads (what a GQA repeat makes).
REFERENCE_PIECE_BYTES = 1 << 30


def sdpa(q, k, v):
    """torch SDPA on [B, 1, Hq, D] queries against a [B, L, Hkv, D] cache; returns [B, 1, Hq, D]."""
    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                          enable_gqa=q.shape[2] != k.shape[2]).transpose(1, 2)


def reference_errors(out, q, k, v, piece_bytes=REFERENCE_PIECE_BYTES):
    """Errors of out ([B, 1, Hq, D]) against SDPA in fp32 on the same q ([B, 1, Hq, D]), k and v ([B, L, Hkv, D]),
    computed over pieces of batch rows whose fp32 K and V take at most piece_bytes (one row at least).
    Returns (relative RMS error over the whole batch, max abs error of out, max abs error of SDPA's math
    backend in the inputs' dtype): the square sums add over pieces, so the figures are the whole batch's."""
    B, L, _, D = k.shape
    rows = max(1, piece_bytes // (2 * L * q.shape[2] * D * 4))
    diff_sq = ref_sq = max_out = max_same_dtype = 0.0
    for b in range(0, B, rows):
        piece = slice(b, b + rows)
        ref = sdpa(q[piece].float(), k[piece].float(), v[piece].float())
        diff = out[piece].float() - ref
        diff_sq += diff.double().square().sum().item()
        ref_sq += ref.double().square().sum().item()
        max_out = max(max_out, diff.abs().max().item())
        with sdpa_kernel(SDPBackend.MATH):
            same_dtype = sdpa(q[piece], k[piece], v[piece]).float()
        max_same_dtype = max(max_same_dtype, (same_dtype - ref).abs().max().item())
        del ref, diff, same_dtype
    return math.sqrt(diff_sq / ref_sq), max_out, max_same_dtype


def check_reference():
    """On the CPU: reference_errors in pieces of 2, 2 and 1 rows gives the whole-batch figures (MHA and GQA)."""
    torch.manual_seed(0)
    for Hq, Hkv in ((4, 4), (8, 2)):
        B, L, D = 5, 300, 32
        q = torch.randn(B, 1, Hq, D, dtype=torch.bfloat16)
        k, v = (torch.randn(B, L, Hkv, D, dtype=torch.bfloat16) for _ in range(2))
        out = (sdpa(q.float(), k.float(), v.float()) + 1e-3 * torch.randn(B, 1, Hq, D)).to(torch.bfloat16)
        ref = sdpa(q.float(), k.float(), v.float())
        with sdpa_kernel(SDPBackend.MATH):
            same_dtype = sdpa(q, k, v).float()
        whole = (((out.float() - ref).norm() / ref.norm()).item(), (out.float() - ref).abs().max().item(),
                 (same_dtype - ref).abs().max().item())
        pieces = reference_errors(out, q, k, v, piece_bytes=2 * (2 * L * Hq * D * 4))
        one_piece = reference_errors(out, q, k, v)
        print(f"Hq {Hq} / Hkv {Hkv}: whole {whole}, pieces of 2 rows {pieces}, one piece {one_piece}")
        # The figures are of order 1e-3..1e-2; fp32 rounding of the reference moves them by ~1e-7.
        for got in (pieces, one_piece):
            assert abs(got[0] - whole[0]) <= 1e-4 * whole[0], (got, whole)
            assert all(abs(a - b) <= 1e-6 for a, b in zip(got[1:], whole[1:])), (got, whole)
    print("check_reference: ok")


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

    err, max_ours, max_same_dtype = reference_errors(ours(), q, k_dense, v_dense)
    # FlashAttention's rule: max abs error at most 2x that of PyTorch's attention in the same dtype (+1e-5).
    rule = max_ours <= 2 * max_same_dtype + 1e-5
    t_ours = bench_ms(ours) * 1e3
    t_sdpa = bench_ms(lambda: sdpa(q, k_dense, v_dense)) * 1e3
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
    parser.add_argument("--gqa", type=int, nargs="?", const=4, default=0, metavar="GROUP",
                        help="Hq = GROUP · 8 / Hkv 8 instead of 16 / 16 (GROUP 4 when left out)")
    parser.add_argument("--paged", type=int, default=0, help="block size of a paged cache (0: contiguous)")
    parser.add_argument("--results", default=os.path.join(os.path.dirname(__file__), "results_kvcache.md"))
    parser.add_argument("--no-append", action="store_true", help="print only")
    parser.add_argument("--check-reference", action="store_true",
                        help="check the fp32 reference in pieces against the whole-batch one on the CPU, then exit")
    args = parser.parse_args()
    if args.check_reference:
        check_reference()
        return
    if not flashgla.cuda_available():
        raise SystemExit("bench_kvcache: needs a CUDA build of flashgla and a GPU")
    if args.gqa < 0:
        raise SystemExit(f"bench_kvcache: --gqa: expected a group size >= 1, got {args.gqa}")
    Hq, Hkv, D = (8 * args.gqa, 8, 128) if args.gqa else (16, 16, 128)
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
