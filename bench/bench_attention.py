"""FlashAttention benchmark and accuracy check: flashgla vs PyTorch SDPA (flash and cuDNN backends).

Run on a GPU machine, with flashgla importable (`pip install .`, or a CMake build with
-DFLASHGLA_PYTHON=ON and PYTHONPATH=<build>/python):

    python bench/bench_attention.py            # accuracy check, then the timing table
    python bench/bench_attention.py --quick    # fewer shapes

"flashgla" is the default dispatch. --kernels portable,hopper adds "flashgla-portable" and
"flashgla-hopper": the forward forced to the portable mma.sync kernel or to the sm_90a kernel
(d <= 128) through FLASHGLA_ATTENTION_KERNEL, with the default backward. --backward portable,hopper
adds "flashgla-bwd-portable" and "flashgla-bwd-hopper": the default forward with the backward forced
through FLASHGLA_ATTENTION_BACKWARD (read when .backward() runs, so each call sets or clears it).
--deterministic adds "flashgla-deterministic": the default kernels, flash_attention(deterministic=True).

Shapes follow the FlashAttention-2 paper: B*T = 16K tokens, H = 2048 / d, bf16, layout [B, T, H, d]
(SDPA gets the transposed [B, H, T, d] views of the same memory). TFLOP/s count 4*B*H*T^2*d for the
forward (half of it when causal) and 2.5x that for the backward. Times are medians of
triton.testing.do_bench, all libraries in one process on the same inputs. To compare builds run in
one call, write each run's --json and pass them to bench/compare_attention.py.

Accuracy (FlashAttention's rule): against an fp32 reference (SDPA's math backend on the bf16 inputs
upcast), flashgla's max abs error of o, dq, dk, dv must be at most 2x that of SDPA's math backend
run in bf16 (plus 1e-5).
"""

import argparse
import datetime
import json
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

try:
    import triton.testing

    def bench_ms(fn, grad_to_none=None):
        return triton.testing.do_bench(fn, warmup=25, rep=100, grad_to_none=grad_to_none, return_mode="median")
except ImportError:  # pragma: no cover - triton ships with CUDA builds of torch

    def bench_ms(fn, grad_to_none=None):
        for _ in range(5):
            fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(30):
            for t in grad_to_none or []:
                t.grad = None
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        return sorted(times)[len(times) // 2]


import flashgla  # noqa: E402


def ours(q, k, v, causal):
    os.environ.pop("FLASHGLA_ATTENTION_BACKWARD", None)
    return flashgla.flash_attention(q, k, v, causal=causal)


def ours_backward(kernel):
    """flashgla with its backward kernel forced (FLASHGLA_ATTENTION_BACKWARD, left set for .backward())."""
    def run(q, k, v, causal):
        os.environ["FLASHGLA_ATTENTION_BACKWARD"] = kernel
        return flashgla.flash_attention(q, k, v, causal=causal)
    return run


def ours_deterministic(q, k, v, causal):
    """flashgla with deterministic=True (its backward adds dq in turns)."""
    os.environ.pop("FLASHGLA_ATTENTION_BACKWARD", None)
    return flashgla.flash_attention(q, k, v, causal=causal, deterministic=True)


def ours_with(kernel):
    """flashgla with its forward kernel forced (FLASHGLA_ATTENTION_KERNEL); the default backward."""
    def run(q, k, v, causal):
        os.environ.pop("FLASHGLA_ATTENTION_BACKWARD", None)
        os.environ["FLASHGLA_ATTENTION_KERNEL"] = kernel
        try:
            return flashgla.flash_attention(q, k, v, causal=causal)
        finally:
            del os.environ["FLASHGLA_ATTENTION_KERNEL"]
    return run


def sdpa(backend):
    def run(q, k, v, causal):
        with sdpa_kernel(backend):
            o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               is_causal=causal)
        return o.transpose(1, 2)
    return run


IMPLS = {
    "flashgla": ours,
    "sdpa-flash": sdpa(SDPBackend.FLASH_ATTENTION),
    "sdpa-cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
}
OURS = ["flashgla"]  # checked for accuracy; --kernels adds the forced ones


def inputs(b, t, h, d, dtype=torch.bfloat16, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    make = lambda: torch.randn(b, t, h, d, device="cuda", dtype=dtype, generator=g).requires_grad_()
    q, k, v = make(), make(), make()
    do = torch.randn(b, t, h, d, device="cuda", dtype=dtype, generator=g)
    return q, k, v, do


def outputs_and_grads(fn, q, k, v, do, causal):
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    o = fn(q, k, v, causal)
    o.backward(do)
    return [o.detach().float(), q.grad.float(), k.grad.float(), v.grad.float()]


def check_accuracy(shapes):
    rows, ok = [], True
    math = sdpa(SDPBackend.MATH)
    for b, t, h, d, causal in shapes:
        q, k, v, do = inputs(b, t, h, d, seed=1)
        up = lambda x: x.detach().float()
        ref = outputs_and_grads(math, up(q), up(k), up(v), do.float(), causal)
        pt = outputs_and_grads(math, q, k, v, do, causal)
        for impl in OURS:
            fg = outputs_and_grads(IMPLS[impl], q, k, v, do, causal)
            for name, r, p, f in zip(("o", "dq", "dk", "dv"), ref, pt, fg):
                err_pt = (p - r).abs().max().item()
                err_fg = (f - r).abs().max().item()
                rel_fg = ((f - r).norm() / r.norm()).item()
                passed = bool(torch.isfinite(f).all()) and err_fg <= 2 * err_pt + 1e-5
                ok &= passed
                rows.append(dict(impl=impl, b=b, t=t, h=h, d=d, causal=causal, tensor=name, max_err_flashgla=err_fg,
                                 max_err_sdpa_math_bf16=err_pt, rel_rms_flashgla=rel_fg, passed=passed))
    return rows, ok


def tflops(b, t, h, d, causal, ms, passes):
    flops = 4 * b * h * t * t * d * (0.5 if causal else 1.0) * passes
    return flops / (ms * 1e-3) / 1e12


def benchmark(ts, ds, modes=("fwd", "fwd+bwd"), tokens=16384):
    rows = []
    for d in ds:
        h = 2048 // d
        for t in ts:
            b = max(1, tokens // t)
            q, k, v, do = inputs(b, t, h, d)
            for causal in (False, True):
                for mode in modes:
                    row = dict(b=b, t=t, h=h, d=d, causal=causal, mode=mode)
                    for name, fn in IMPLS.items():
                        try:
                            if mode == "fwd":
                                with torch.no_grad():
                                    ms = bench_ms(lambda: fn(q, k, v, causal))
                            else:
                                ms = bench_ms(lambda: fn(q, k, v, causal).backward(do), grad_to_none=[q, k, v])
                            row[name] = ms
                        except Exception as error:  # a backend may refuse a shape
                            print(f"  {name} {mode} T={t} d={d} causal={causal}: {error}", file=sys.stderr)
                            row[name] = None
                    rows.append(row)
                    passes = 1.0 if mode == "fwd" else 3.5
                    fmt = lambda ms: "   -   " if ms is None else f"{ms:7.3f}"
                    tf = lambda ms: "  -  " if ms is None else f"{tflops(b, t, h, d, causal, ms, passes):5.0f}"
                    ratio = lambda ours, ref: ("  -  " if row[ours] is None or row[ref] is None
                                               else f"{row[ours] / row[ref]:5.2f}")
                    print(f"T={t:5d} d={d:3d} {'causal' if causal else 'full  '} {mode:7s} | "
                          + " | ".join(f"{n} {fmt(row[n])} ms {tf(row[n])} TF/s" for n in IMPLS)
                          + " | /flash " + " ".join(f"{n[len('flashgla'):] or 'default'} {ratio(n, 'sdpa-flash')}"
                                                    for n in OURS)
                          + f" | default/cudnn {ratio('flashgla', 'sdpa-cudnn')}", flush=True)
            del q, k, v, do
            torch.cuda.empty_cache()
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="T in {2K, 8K} only")
    parser.add_argument("--skip-check", action="store_true")
    parser.add_argument("--json", help="write all numbers here")
    parser.add_argument("--kernels", default="", help="forward kernels to force, e.g. portable,hopper")
    parser.add_argument("--backward", default="", help="backward kernels to force, e.g. portable,hopper")
    parser.add_argument("--dims", default="64,128", help="head dims to time")
    parser.add_argument("--ts", default="", help="sequence lengths to time, e.g. 2048,8192 (overrides --quick)")
    parser.add_argument("--modes", default="fwd,fwd+bwd", help="passes to time: fwd, fwd+bwd or both")
    parser.add_argument("--deterministic", action="store_true",
                        help="add flashgla-deterministic: the default kernels with deterministic=True")
    args = parser.parse_args()
    if args.deterministic:
        IMPLS["flashgla-deterministic"] = ours_deterministic
        OURS.append("flashgla-deterministic")
    for kernel in filter(None, args.kernels.split(",")):
        IMPLS[f"flashgla-{kernel}"] = ours_with(kernel)
        OURS.append(f"flashgla-{kernel}")
    for kernel in filter(None, args.backward.split(",")):
        IMPLS[f"flashgla-bwd-{kernel}"] = ours_backward(kernel)
        OURS.append(f"flashgla-bwd-{kernel}")

    props = torch.cuda.get_device_properties(0)
    print(f"# {datetime.date.today()} {props.name} ({props.multi_processor_count} SMs), torch {torch.__version__}")
    result = dict(date=str(datetime.date.today()), device=props.name, torch=torch.__version__)

    if not args.skip_check:
        shapes = [(2, 1024, 8, d, c) for d in (64, 128) for c in (False, True)] + [(1, 777, 4, 256, True)]
        rows, ok = check_accuracy(shapes)
        for r in rows:
            print(f"check {r['impl']} B={r['b']} T={r['t']} H={r['h']} d={r['d']} {'causal' if r['causal'] else 'full'} "
                  f"{r['tensor']:2s}: max err flashgla {r['max_err_flashgla']:.2e} vs sdpa-math-bf16 "
                  f"{r['max_err_sdpa_math_bf16']:.2e} (rel rms {r['rel_rms_flashgla']:.2e}) "
                  f"{'ok' if r['passed'] else 'FAIL'}", flush=True)
        print("accuracy check:", "PASSED" if ok else "FAILED", flush=True)
        result["check"] = rows

    ts = (2048, 8192) if args.quick else (1024, 2048, 4096, 8192, 16384)
    if args.ts:
        ts = tuple(int(t) for t in args.ts.split(","))
    result["bench"] = benchmark(ts, tuple(int(d) for d in args.dims.split(",")), tuple(args.modes.split(",")))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
