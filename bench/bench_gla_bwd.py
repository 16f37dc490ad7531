"""CUDA GLA backward: fwd+bwd and bwd alone through the PyTorch op, against SDPA.

Run on a CUDA machine with flashgla importable (`pip install .`, or
PYTHONPATH=<cmake build dir with -DFLASHGLA_PYTHON=ON>/python):

    python bench/bench_gla_bwd.py [--out results.md] [--kernels]

Every line times both sides in this process, on this card, on fresh random
inputs (bf16, g = logsigmoid(randn)), as the median of triton's do_bench:
  * ours: flashgla.chunk_gla forward + torch.autograd.grad(o, (q, k, v, g), do)
    ("fwd+bwd"), and the gradient call alone on a kept graph ("bwd");
  * SDPA: F.scaled_dot_product_attention causal (flash backend), [B, H, T, D],
    forward + autograd.grad the same way (no line where K != V);
  * peak memory: the most allocated during one fwd+bwd, over what was
    allocated before it (inputs and do), for ours and SDPA.
--kernels adds the time of each CUDA kernel of our backward (torch.profiler,
one call after warm-up), so that the state scans and the chunk kernel show
separately. --split-compare also times our bwd with the state scans' sequence
split turned off (FLASHGLA_GLA_BWD_SCAN_SPLIT=0), --diag-compare with A's
pairs inside sub-chunks summed element by element (FLASHGLA_GLA_BWD_DIAG=
elementwise), in the same process; --compare NAME=VALUE[,NAME=VALUE] (repeatable)
with any backend environment settings, e.g. FLASHGLA_GLA_BWD_LAYOUT=general.
--shapes "8,4096,16,128,128;8,2048,4,128,256" times only those shapes.
MODEL shapes are those of the 340M GLA model (issue 7: H=4, K=128, V=256).
"""

import argparse
import datetime
import os
import re

import torch
import torch.nn.functional as F
import triton.testing

import flashgla

ANCHORS = [  # B, T, H, K, V, target: a ratio to SDPA's fwd+bwd, or absolute ms
    (8, 4096, 16, 128, 128, ("ratio", 0.45)),
    (8, 2048, 16, 64, 64, ("ratio", 0.7)),
    (2, 16384, 16, 128, 128, ("ms", 3.0)),
    (4, 4096, 4, 256, 512, ("ms", 1.3)),
]
MODEL = [  # the 340M GLA model's attention layers (no target of their own)
    (8, 2048, 4, 128, 256, (None, None)),
    (2, 8192, 4, 128, 256, (None, None)),
]


def median_ms(fn):
    return triton.testing.do_bench(fn, warmup=30, rep=200, return_mode="median")


def gla_inputs(B, T, H, K, V):
    bf = dict(device="cuda", dtype=torch.bfloat16)
    q = torch.randn(B, T, H, K, **bf).requires_grad_()
    k = torch.randn(B, T, H, K, **bf).requires_grad_()
    v = torch.randn(B, T, H, V, **bf).requires_grad_()
    g = F.logsigmoid(torch.randn(B, T, H, K, device="cuda")).to(torch.bfloat16).requires_grad_()
    do = torch.randn(B, T, H, V, **bf)
    return (q, k, v, g), do


def peak_extra_mb(fn):
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def time_ours(B, T, H, K, V):
    inputs, do = gla_inputs(B, T, H, K, V)

    def fwd():
        return flashgla.chunk_gla(*inputs)[0]

    def fwd_bwd():
        torch.autograd.grad(fwd(), inputs, do)

    fwd_ms = median_ms(lambda: fwd())
    both_ms = median_ms(fwd_bwd)
    o = fwd()
    bwd_ms = median_ms(lambda: torch.autograd.grad(o, inputs, do, retain_graph=True))
    del o
    peak = peak_extra_mb(fwd_bwd)
    return fwd_ms, bwd_ms, both_ms, peak, (inputs, do)


def time_sdpa(B, T, H, D):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    bf = dict(device="cuda", dtype=torch.bfloat16)
    q, k, v = (torch.randn(B, H, T, D, **bf).requires_grad_() for _ in range(3))
    do = torch.randn(B, H, T, D, **bf)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        def fwd_bwd():
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            torch.autograd.grad(o, (q, k, v), do)

        ms = median_ms(fwd_bwd)
        peak = peak_extra_mb(fwd_bwd)
    return ms, peak


def kernel_times(inputs, do):
    """Per-kernel device time (ms) of one backward call, by torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    o = flashgla.chunk_gla(*inputs)[0]
    for _ in range(3):
        torch.autograd.grad(o, inputs, do, retain_graph=True)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        torch.autograd.grad(o, inputs, do, retain_graph=True)
        torch.cuda.synchronize()
    times = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            # "void ns::(anonymous namespace)::chunk_kernel<...>(...)": the name before "<" or "("
            found = re.findall(r"([A-Za-z_]\w*)\s*[<(]", e.name)
            name = found[0] if found else e.name[:40]
            times[name] = times.get(name, 0.0) + e.device_time / 1e3
    return times


def time_bwd_with(env, value, inputs, do, with_kernels):
    """bwd ms (and per-kernel times) with one environment setting of the backend."""
    return time_bwd_with_settings({env: value}, inputs, do, with_kernels)


def time_bwd_with_settings(settings, inputs, do, with_kernels):
    """bwd ms (and per-kernel times) with environment settings {name: value} of the backend."""
    old = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)  # flashgla's ops read the tuning switches at every call
    try:
        o = flashgla.chunk_gla(*inputs)[0]
        ms = median_ms(lambda: torch.autograd.grad(o, inputs, do, retain_graph=True))
        del o
        return ms, kernel_times(inputs, do) if with_kernels else {}
    finally:
        for name, value in old.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="also append the table to this markdown file")
    parser.add_argument("--kernels", action="store_true", help="per-kernel times of the backward")
    parser.add_argument("--split-compare", action="store_true", help="also time bwd with the scans unsplit")
    parser.add_argument("--diag-compare", action="store_true",
                        help="also time bwd with A's sub-chunk pairs element by element")
    parser.add_argument("--compare", action="append", default=[], metavar="NAME=VALUE[,NAME=VALUE]",
                        help="also time bwd with these backend environment settings (repeatable)")
    parser.add_argument("--shapes", default=None, metavar="B,T,H,K,V[;B,T,H,K,V]",
                        help="only these shapes of the lists (a short run)")
    args = parser.parse_args()
    only = None if args.shapes is None else {tuple(int(x) for x in s.split(",")) for s in args.shapes.split(";")}
    torch.manual_seed(0)
    card = torch.cuda.get_device_name()
    date = datetime.date.today().isoformat()

    lines = [f"{date}, {card}, bf16, chunk_gla fwd+bwd (autograd.grad over q, k, v, g)", "",
             "| B T H K V | ours fwd ms | ours bwd ms | ours fwd+bwd ms | SDPA fwd+bwd ms | ratio | target | "
             "met | peak MB ours / SDPA |",
             "|---|---|---|---|---|---|---|---|---|"]
    kernels, unsplit, elementwise, compared = [], [], [], []
    print("\n".join(lines), flush=True)
    for B, T, H, K, V, (kind, goal) in MODEL + ANCHORS:  # each row printed as soon as it is measured
        if only is not None and (B, T, H, K, V) not in only:
            continue
        fwd_ms, bwd_ms, both_ms, peak, (inputs, do) = time_ours(B, T, H, K, V)
        shape = f"B{B} T{T} H{H} K{K} V{V}"
        if args.kernels:
            kernels.append((shape, kernel_times(inputs, do)))
            print(f"- {shape}: " + ", ".join(f"{n} {t:.3f}" for n, t in kernels[-1][1].items()), flush=True)
        if args.split_compare:
            off_ms, off_kernels = time_bwd_with("FLASHGLA_GLA_BWD_SCAN_SPLIT", "0", inputs, do, args.kernels)
            unsplit.append(f"- {shape}: bwd {bwd_ms:.3f} ms (default), {off_ms:.3f} ms (scans unsplit)"
                           + "".join(f", {n} {t:.3f}" for n, t in off_kernels.items()))
            print(unsplit[-1], flush=True)
        if args.diag_compare:
            el_ms, el_kernels = time_bwd_with("FLASHGLA_GLA_BWD_DIAG", "elementwise", inputs, do, args.kernels)
            elementwise.append(f"- {shape}: bwd {bwd_ms:.3f} ms (default), {el_ms:.3f} ms (elementwise)"
                               + "".join(f", {n} {t:.3f}" for n, t in el_kernels.items()))
            print(elementwise[-1], flush=True)
        for setting in args.compare:
            settings = dict(item.split("=", 1) for item in setting.split(","))
            with_ms, with_kernels = time_bwd_with_settings(settings, inputs, do, args.kernels)
            compared.append(f"- {shape}: bwd {bwd_ms:.3f} ms (default), {with_ms:.3f} ms ({setting})"
                            + "".join(f", {n} {t:.3f}" for n, t in with_kernels.items()))
            print(compared[-1], flush=True)
        del inputs, do
        sdpa, sdpa_peak = time_sdpa(B, T, H, K) if K == V else (None, None)
        if kind == "ratio":
            ratio = both_ms / sdpa
            target, met = f"<= {goal}x SDPA", ratio <= goal
        elif kind is None:
            ratio = both_ms / sdpa if sdpa else None
            target, met = "-", None
        else:
            ratio = both_ms / sdpa if sdpa else None
            target, met = f"<= {goal} ms", both_ms <= goal
        sdpa_text = "-" if sdpa is None else f"{sdpa:.3f}"
        ratio_text = "-" if ratio is None else f"{ratio:.2f}"
        peak_text = f"{peak:.0f} / " + ("-" if sdpa_peak is None else f"{sdpa_peak:.0f}")
        lines.append(f"| {B} {T} {H} {K} {V} | {fwd_ms:.3f} | {bwd_ms:.3f} | {both_ms:.3f} | {sdpa_text} | "
                     f"{ratio_text} | {target} | {'-' if met is None else 'yes' if met else 'no'} | {peak_text} |")
        print(lines[-1], flush=True)
        torch.cuda.empty_cache()

    if kernels:
        lines += ["", "Backward kernels (torch.profiler, one call, ms):", ""]
        for shape, times in kernels:
            lines.append(f"- {shape}: " + ", ".join(f"{n} {t:.3f}" for n, t in times.items()))
    if unsplit:
        lines += ["", "State scans' sequence split on (default) and off:", ""] + unsplit
    if elementwise:
        lines += ["", "A's sub-chunk pairs: default and FLASHGLA_GLA_BWD_DIAG=elementwise:", ""] + elementwise
    if compared:
        lines += ["", "Default and other backend settings (same process):", ""] + compared
    text = "\n".join(lines)
    print("\n" + text)
    if args.out:
        with open(args.out, "a") as f:
            f.write(text + "\n\n")


if __name__ == "__main__":
    main()
