"""Times flashgla.chunk_gla (forward, forward+backward) against PyTorch's SDPA
(flash backend, causal, same B, T, H, head dim) at the shapes of
the anchor shapes (ANCHOR_SHAPES below), in one process on one GPU, with triton.testing.do_bench
(median). Prints a table and appends its rows, with the date and the card's
name, to bench/results.md. An op that raises NotImplementedError is reported
as "n/i" rather than stopping the run.

    python bench/bench_ops.py                 # the GPU benchmark
    python bench/bench_ops.py --shapes 0,3    # some of the anchor shapes
    python bench/bench_ops.py --overhead      # Python overhead of one call on CPU tensors

"fraction of the fwd byte floor" is floor / ours: the time to read q, k, v, g
and write o once (bf16) at this card's device-to-device copy bandwidth,
measured here, over our forward time (1.0 would be at the floor).
"""

import argparse
import datetime
import importlib
import os
import statistics
import sys
import timeit

import torch
import torch.nn.functional as F

import flashgla

ANCHOR_SHAPES = [  # B, T, H, K, V: the shapes the project measures against its references
    (8, 2048, 16, 64, 64),
    (8, 4096, 16, 64, 64),
    (32, 2048, 16, 64, 64),
    (8, 4096, 16, 128, 128),
    (4, 4096, 4, 256, 512),
    (2, 16384, 16, 128, 128),
]
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results.md")


def import_fla(*names, required=False):
    """({name: op}, FLA's version) for the ops named "module.op" under fla.ops (flash-linear-attention from the
    environment, or from FLA_PATH first). Without FLA: (None, "n/a") and a note on stderr, or the ImportError
    where `required`."""
    path = os.environ.get("FLA_PATH")
    if path:
        sys.path.insert(0, path)
    try:
        import fla
        ops = {}
        for name in names:
            module, _, op = name.rpartition(".")
            ops[op] = getattr(importlib.import_module(f"fla.ops.{module}"), op)
    except (ImportError, AttributeError) as error:
        if required:
            raise ImportError(f"FLA: {error}") from error
        print(f"{os.path.basename(sys.argv[0])}: FLA not importable ({error}); its columns stay empty",
              file=sys.stderr)
        return None, "n/a"
    return ops, getattr(fla, "__version__", "?")


def median_ms(function):
    try:
        from triton.testing import do_bench
    except ImportError:  # no Triton: CUDA events, median of 100 after warm-up
        for _ in range(10):
            function()
        times = []
        for _ in range(100):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            function()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return statistics.median(times)
    return do_bench(function, return_mode="median")


def timed(function):
    """Median ms, or None when the op is not implemented on this build or device."""
    try:
        function()
        torch.cuda.synchronize()
    except NotImplementedError as error:
        print(f"  n/i: {error}")
        return None
    return median_ms(function)


def append_results(path, file_title, heading, lines):
    """Appends the table `lines` under "## <date time>, <heading>" to the markdown file `path` (created with the
    title `file_title` if missing)."""
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    new_file = not os.path.exists(path)
    with open(path, "a") as results:
        if new_file:
            results.write(f"# {file_title}\n")
        results.write(f"\n## {stamp}, {heading}\n\n" + "\n".join(lines) + "\n")
    print(f"appended to {path}")


def copy_bandwidth():
    """Device-to-device copy bandwidth in bytes/s (bytes read + written)."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * src.numel() / (median_ms(lambda: dst.copy_(src)) * 1e-3)


def profiled_kernels(fn, calls=5, warmup=1):
    """[(kernel name, launches per call, mean device ms per call)] of the kernels `fn` launches, the costliest
    first (torch.profiler, after `warmup` calls)."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    rows = [(event.key, event.count // calls,
             (getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0)) / calls / 1e3)
            for event in prof.key_averages()]
    return sorted(rows, key=lambda row: -row[2])


def gla_inputs(B, T, H, K, V):
    """bf16 q, k, v, g = logsigmoid(randn) (all requiring grad) and do on the GPU, [B, T, H, dim]."""
    dtype = torch.bfloat16
    q = torch.randn(B, T, H, K, device="cuda", dtype=dtype, requires_grad=True)
    k = torch.randn(B, T, H, K, device="cuda", dtype=dtype, requires_grad=True)
    v = torch.randn(B, T, H, V, device="cuda", dtype=dtype, requires_grad=True)
    g = F.logsigmoid(torch.randn(B, T, H, K, device="cuda")).to(dtype).requires_grad_()
    do = torch.randn(B, T, H, V, device="cuda", dtype=dtype)
    return q, k, v, g, do


def floor_bytes(B, T, H, K, V, element_bytes=2, gate_bytes=2):
    """(forward, backward) bytes a chunk_gla pass must move, each input read once and each output written once:
    forward q, k, v, g in and o out; backward q, k, v, g, do in and dq, dk, dv, dg out."""
    n = B * T * H
    qk, v, g = n * K * element_bytes, n * V * element_bytes, n * K * gate_bytes
    forward = 2 * qk + v + g + v
    backward = (2 * qk + v + g + v) + (2 * qk + v + g)
    return forward, backward


def bench_shape(B, T, H, K, V, bandwidth):
    q, k, v, g, do = gla_inputs(B, T, H, K, V)

    def ours_fwd():
        return flashgla.chunk_gla(q, k, v, g)[0]

    row = {"ours_fwd": timed(lambda: ours_fwd()),
           "ours_fwdbwd": timed(lambda: torch.autograd.grad(ours_fwd(), (q, k, v, g), do))}

    row["sdpa_fwd"] = row["sdpa_fwdbwd"] = "—"  # not applicable
    if K == V:  # the flash backend needs one head dim for q, k and v
        from torch.nn.attention import SDPBackend, sdpa_kernel

        qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))  # [B, H, T, D] views
        dot = do.transpose(1, 2)

        def sdpa_fwd():
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)

        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            row["sdpa_fwd"] = timed(sdpa_fwd)
            row["sdpa_fwdbwd"] = timed(lambda: torch.autograd.grad(sdpa_fwd(), (qt, kt, vt), dot))

    row["floor"] = floor_bytes(B, T, H, K, V)[0] / bandwidth * 1e3
    return row


def fmt(x, digits=3):
    """ms with `digits` decimals; "n/i" for an op not implemented; strings pass through."""
    if isinstance(x, str):
        return x
    return "n/i" if x is None else f"{x:.{digits}f}"


def ratio(a, b):
    return f"{a / b:.2f}" if isinstance(a, float) and isinstance(b, float) else "—"


def run_gpu(shapes):
    if not torch.cuda.is_available():
        raise SystemExit("bench_ops: no GPU (use --overhead for the CPU overhead measurement)")
    card = torch.cuda.get_device_name()
    bandwidth = copy_bandwidth()
    print(f"{card}; flashgla {flashgla.__version__}; torch {torch.__version__}; "
          f"copy bandwidth {bandwidth / 1e12:.2f} TB/s; bf16, g = logsigmoid(randn), median ms")
    header = ("| shape B,T,H,K,V | ours fwd ms | SDPA fwd ms | fwd ratio | ours fwd+bwd ms | SDPA fwd+bwd ms "
              "| fwd+bwd ratio | fwd floor ms | fraction of fwd floor |")
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for B, T, H, K, V in shapes:
        print(f"B={B} T={T} H={H} K={K} V={V}")
        r = bench_shape(B, T, H, K, V, bandwidth)
        lines.append(f"| {B},{T},{H},{K},{V} | {fmt(r['ours_fwd'])} | {fmt(r['sdpa_fwd'])} "
                     f"| {ratio(r['ours_fwd'], r['sdpa_fwd'])} | {fmt(r['ours_fwdbwd'])} | {fmt(r['sdpa_fwdbwd'])} "
                     f"| {ratio(r['ours_fwdbwd'], r['sdpa_fwdbwd'])} | {fmt(r['floor'])} "
                     f"| {ratio(r['floor'], r['ours_fwd'])} |")
        torch.cuda.empty_cache()
    print("\n".join(lines))
    append_results(RESULTS, "Benchmark results (bench/bench_ops.py appends here)",
                   f"{card}, flashgla {flashgla.__version__}, torch {torch.__version__}, "
                   f"copy {bandwidth / 1e12:.2f} TB/s", lines)


def run_overhead(repeats):
    """µs per call on a tiny CPU problem: the op as users call it, the custom op, and flashgla._C directly."""
    from flashgla import _C
    from flashgla._torch import make_args

    torch.set_num_threads(1)
    q, k, g = (torch.randn(1, 1, 1, 16) for _ in range(3))
    v = torch.randn(1, 1, 1, 16)
    o = torch.empty_like(v)
    prebuilt = make_args(_C.GlaForwardArgs, q=q, k=k, v=v, g=g, o=o)
    leaves = [x.clone().requires_grad_() for x in (q, k, v, g)]
    op = torch.ops.flashgla.chunk_gla.default
    a, b = torch.randn(16), torch.randn(16)
    cases = {
        "torch.add (for scale)": lambda: torch.add(a, b),
        "flashgla.chunk_gla (no grad)": lambda: flashgla.chunk_gla(q, k, v, g),
        "torch.ops.flashgla.chunk_gla": lambda: op(q, k, v, g, None, None, None, None, False, False),
        "flashgla.chunk_gla (inputs require grad)": lambda: flashgla.chunk_gla(*leaves),
        "_C.gla_forward, args built per call": lambda: _C.gla_forward(
            make_args(_C.GlaForwardArgs, q=q, k=k, v=v, g=g, o=o)),
        "_C.gla_forward, args prebuilt": lambda: _C.gla_forward(prebuilt),
    }
    print(f"B=1 T=1 H=1 K=V=16 fp32 CPU, 1 torch thread; µs per call (best of 30 x {repeats})")
    for name, function in cases.items():
        function()
        best = min(timeit.repeat(function, number=repeats, repeat=30)) / repeats
        print(f"  {name:42s} {best * 1e6:8.2f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", help="comma-separated indices into the anchor shapes (default: all)")
    parser.add_argument("--overhead", action="store_true", help="measure the per-call overhead on CPU tensors")
    parser.add_argument("--repeats", type=int, default=1000, help="calls per timing in --overhead")
    args = parser.parse_args()
    if args.overhead:
        run_overhead(args.repeats)
        return
    shapes = ANCHOR_SHAPES if not args.shapes else [ANCHOR_SHAPES[int(i)] for i in args.shapes.split(",")]
    run_gpu(shapes)


if __name__ == "__main__":
    main()
