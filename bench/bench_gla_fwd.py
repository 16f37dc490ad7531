"""CUDA GLA forward, recurrent and decode timings against their references.

Run on a CUDA machine with flashgla importable (`pip install .`, or
PYTHONPATH=<cmake build dir with -DFLASHGLA_PYTHON=ON>/python):

    python bench/bench_gla_fwd.py [--splits 1,2,4] [--out results.md]

Every line times both sides in this process, on this card, on the same
inputs (bf16, g = logsigmoid(randn)), as the median of triton's do_bench
(CUDA-graph replays for the microsecond-scale decode):
  * chunk_gla forward vs F.scaled_dot_product_attention causal (flash backend)
    at the anchor shapes (ANCHORS below) (K = 256, V = 512 has no SDPA: FlashAttention
    needs equal head dims; its line reports the time and the byte floor);
  * fused_recurrent_gla forward (the line shows the absolute target);
  * decode on fp32 states vs a device-to-device copy of the same bytes
    (read + write), i.e. the fraction of copy bandwidth reached.
--splits times the chunked kernel with FLASHGLA_GLA_SPLITS forced to each
value as well (the split of long sequences; 0 = the built-in choice). Each
chunked line also names the general kernel's time ("old",
FLASHGLA_GLA_FAST=0) on the same inputs, and the relative difference of the
two outputs is printed before the table. "ours" is the default choice: the
fast path wherever it applies (bf16/fp16 inputs, K ≤ 256, gate in q's dtype or
fp32), on sm_90 the Hopper path for 128 < K ≤ 256.
--hopper prints only the chunked lines: the default path vs the Hopper path
(FLASHGLA_GLA_HOPPER=1) in this process, with torch.profiler times of the
Hopper path's two kernels and, for long sequences, other split counts.
--quick times K256 V512 (bf16 and fp32 gate) and two K128 lines with the Hopper
path forced: the default (on sm_90 the Hopper path: warp-specialized state
kernel, PDL) vs FLASHGLA_GLA_HOPPER_PDL=0 and
FLASHGLA_GLA_HOPPER=0 (the fast path), with the kernels' times and the relative differences of the outputs.
"""

import argparse
import datetime
import os

import torch
import torch.nn.functional as F
import triton.testing

import flashgla
from bench_ops import floor_bytes, profiled_kernels


def set_switch(name, value=None):
    """Sets (None: unsets) a FLASHGLA_GLA_* tuning switch; flashgla's ops read the switches at every call."""
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value

F32 = torch.float32
ANCHORS = [  # B, T, H, K, V, gate dtype (None: as q), target (ratio to SDPA, or absolute ms where SDPA does not apply)
    (8, 4096, 16, 128, 128, None, "<= 0.35x SDPA"),
    (8, 2048, 16, 64, 64, None, "<= 0.6x SDPA"),
    (4, 4096, 4, 256, 512, None, "<= 0.25 ms"),
    (2, 16384, 16, 128, 128, None, "<= 0.6 ms"),
    # The GLA layer's calls (issue 7): bf16 q, k, v with an fp32 gate; the 340M model's heads and the default head.
    (8, 4096, 16, 128, 128, F32, "-"),
    (8, 2048, 4, 128, 256, F32, "-"),
    (2, 8192, 4, 128, 256, F32, "-"),
    (4, 4096, 4, 256, 512, F32, "<= 0.25 ms"),
]


def print_table(lines, out):
    """Prints the table and, with --out, appends it to that results file."""
    text = "\n".join(lines)
    print(text)
    if out:
        with open(out, "a") as f:
            f.write(text + "\n\n")

def median_ms(fn, graph=False):
    if graph:
        return triton.testing.do_bench_cudagraph(fn, rep=200, return_mode="median")
    return triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median")


def gla_inputs(B, T, H, K, V, dtype=torch.bfloat16, gate_dtype=None):
    q = torch.randn(B, T, H, K, device="cuda", dtype=dtype)
    k = torch.randn(B, T, H, K, device="cuda", dtype=dtype)
    v = torch.randn(B, T, H, V, device="cuda", dtype=dtype)
    g = F.logsigmoid(torch.randn(B, T, H, K, device="cuda", dtype=torch.float32)).to(gate_dtype or dtype)
    return q, k, v, g


def sdpa_ms(B, T, H, K, V):
    if K != V or K > 256:
        return None
    q, k, v = (torch.randn(B, H, T, K, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))


def byte_floor_ms(B, T, H, K, V, bandwidth, gate_bytes=2):
    return floor_bytes(B, T, H, K, V, gate_bytes=gate_bytes)[0] / bandwidth * 1e3


def copy_bandwidth():
    src = torch.empty(1 << 28, dtype=torch.float32, device="cuda").normal_()
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src))
    return 2 * src.numel() * 4 / (ms * 1e-3), ms


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--splits", default="0", help="comma-separated FLASHGLA_GLA_SPLITS values (0 = default)")
    parser.add_argument("--out", default=None, help="also append the table to this markdown file")
    parser.add_argument("--hopper", action="store_true",
                        help="only the chunked lines: the default path vs the Hopper path (FLASHGLA_GLA_HOPPER=1)")
    parser.add_argument("--quick", action="store_true",
                        help="only K256 V512: the default (Hopper path on sm_90) vs FLASHGLA_GLA_HOPPER=0")
    args = parser.parse_args()
    if args.hopper:
        return hopper_table(args)
    if args.quick:
        return quick_table(args)
    torch.manual_seed(0)
    card = torch.cuda.get_device_name()
    date = datetime.date.today().isoformat()
    bandwidth, _ = copy_bandwidth()
    rows = []

    for B, T, H, K, V, gate_dtype, target in ANCHORS:
        q, k, v, g = gla_inputs(B, T, H, K, V, gate_dtype=gate_dtype)
        gate_label = " g fp32" if gate_dtype == F32 else ""
        reference = sdpa_ms(B, T, H, K, V)
        # The general kernel (FLASHGLA_GLA_FAST=0) first, as "old", and its output for a consistency check.
        set_switch("FLASHGLA_GLA_FAST", "0")
        old = median_ms(lambda: flashgla.chunk_gla(q, k, v, g))
        o_old = flashgla.chunk_gla(q, k, v, g)[0].float()
        # "ours": the default choice (the fast path where it applies).
        set_switch("FLASHGLA_GLA_FAST")
        o_new = flashgla.chunk_gla(q, k, v, g)[0].float()
        diff = ((o_new - o_old).norm() / o_old.norm()).item()
        print(f"B{B} T{T} H{H} K{K} V{V}{gate_label}: rel. difference fast vs general output {diff:.2e}", flush=True)
        for splits in args.splits.split(","):
            if splits.strip() == "0":
                set_switch("FLASHGLA_GLA_SPLITS")
            else:
                set_switch("FLASHGLA_GLA_SPLITS", splits.strip())
            ours = median_ms(lambda: flashgla.chunk_gla(q, k, v, g))
            label = "" if splits.strip() == "0" else f" splits={splits.strip()}"
            name = f"chunk_gla fwd B{B} T{T} H{H} K{K} V{V}{gate_label}{label} (old {old:.4f} ms)"
            if reference is not None:
                rows.append((name, ours, reference, "SDPA flash causal", f"{ours / reference:.2f}x", target))
            else:
                floor = byte_floor_ms(B, T, H, K, V, bandwidth, g.element_size())
                rows.append((name, ours, floor, "byte floor", f"{ours / floor:.2f}x", target))
        set_switch("FLASHGLA_GLA_SPLITS")
        set_switch("FLASHGLA_GLA_FAST")
        del q, k, v, g

    q, k, v, g = gla_inputs(8, 2048, 16, 64, 64)
    ours = median_ms(lambda: flashgla.fused_recurrent_gla(q, k, v, g))
    rows.append(("fused_recurrent_gla fwd B8 T2048 H16 K64 V64", ours, None, "-", "-", "<= 1.2 ms"))
    q, k, v, _ = gla_inputs(8, 4096, 16, 128, 128, torch.float32)
    g = F.logsigmoid(torch.randn(8, 4096, 16, 128, device="cuda"))
    ours = median_ms(lambda: flashgla.chunk_gla(q, k, v, g))
    rows.append(("chunk_gla fwd fp32 B8 T4096 H16 K128 V128", ours, None, "-", "-", "-"))
    gs = F.logsigmoid(torch.randn(8, 4096, 16, device="cuda")).to(torch.bfloat16)
    qb, kb, vb, _ = gla_inputs(8, 4096, 16, 128, 128)
    ours = median_ms(lambda: flashgla.chunk_simple_gla(qb, kb, vb, gs))
    rows.append(("chunk_simple_gla fwd B8 T4096 H16 K128 V128", ours, None, "-", "-", "-"))
    del q, k, v, g, qb, kb, vb

    for N, H, K, V in ((64, 16, 128, 128), (256, 16, 128, 128), (64, 4, 256, 512)):
        q = torch.randn(N, H, K, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(N, H, K, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(N, H, V, device="cuda", dtype=torch.bfloat16)
        g = F.logsigmoid(torch.randn(N, H, K, device="cuda")).to(torch.bfloat16)
        state = torch.randn(N, H, K, V, device="cuda")
        ours = median_ms(lambda: flashgla.gla_decode_step(q, k, v, g, state), graph=True)
        copy_dst = torch.empty_like(state)
        copy = median_ms(lambda: copy_dst.copy_(state), graph=True)
        achieved = 2 * state.numel() * 4 / (ours * 1e-3) / 1e12
        rows.append((f"decode N{N} H{H} K{K} V{V} ({achieved:.2f} TB/s)", ours, copy, "copy of the state",
                     f"{copy / ours:.0%} of copy bw", ">= 70%"))

    header = f"{date}, {card}, copy bandwidth {bandwidth / 1e12:.2f} TB/s (read + write)"
    lines = [header, "", "| shape | ours ms | reference ms | reference | ratio | target |", "|---|---|---|---|---|---|"]
    for name, ours, ref, ref_name, ratio, target in rows:
        ref_text = "-" if ref is None else f"{ref:.4f}"
        lines.append(f"| {name} | {ours:.4f} | {ref_text} | {ref_name} | {ratio} | {target} |")
    print_table(lines, args.out)


def profiled_kernel_ms(fn, calls=5):
    """{kernel name: mean device time per call in ms} of the kernels `fn` launches (torch.profiler)."""
    return {key: ms for key, _, ms in profiled_kernels(fn, calls)}


def kernel_times(fn, calls=5):
    """Mean device time per call of each flashgla kernel `fn` launches, as text."""
    parts = [f"{key.split('(')[0].split('<')[0].split('::')[-1]} {ms:.4f} ms"
             for key, ms in profiled_kernel_ms(fn, calls).items() if ms and "flashgla" in key]
    return ", ".join(parts)


def kernel_ms(fn, name_part, calls=5):
    """Mean device time per call of the kernels of `fn` whose name contains name_part."""
    return sum(ms for key, ms in profiled_kernel_ms(fn, calls).items() if name_part in key)


def quick_table(args):
    """K256 V512 (and K128 with the Hopper path forced): the default path (on sm_90 the Hopper path with the
    warp-specialized state kernel, with PDL) vs FLASHGLA_GLA_HOPPER_PDL=0 and FLASHGLA_GLA_HOPPER=0 (the fast
    path), in this process; kernel times by torch.profiler (state kernels without PDL, whose early start would
    count the chunk pass's tail)."""
    torch.manual_seed(0)
    card = torch.cuda.get_device_name()
    lines = [f"{datetime.date.today().isoformat()}, {card}", "",
             "| shape | default ms | again ms | no PDL ms | chunk pass ms | state kernel ms | "
             "FLASHGLA_GLA_HOPPER=0 ms | rel. diff vs fast |",
             "|---|---|---|---|---|---|---|---|"]
    switches = ("FLASHGLA_GLA_HOPPER", "FLASHGLA_GLA_HOPPER_PDL")

    def with_env(**values):
        for name in switches:
            set_switch(name)
        for name, value in values.items():
            set_switch(name, value)

    for B, T, H, K, V, gate_dtype, hopper in ((4, 4096, 4, 256, 512, None, None), (4, 4096, 4, 256, 512, F32, None),
                                              (8, 2048, 4, 128, 256, F32, "1"), (2, 8192, 4, 128, 256, F32, "1"),
                                              (8, 4096, 16, 128, 128, None, "1")):
        q, k, v, g = gla_inputs(B, T, H, K, V, gate_dtype=gate_dtype)
        call = lambda: flashgla.chunk_gla(q, k, v, g)
        forced = {"FLASHGLA_GLA_HOPPER": hopper} if hopper else {}
        with_env(**forced)
        default = median_ms(call)
        o_new = call()[0].float()
        with_env(FLASHGLA_GLA_HOPPER_PDL="0", **forced)
        no_pdl = median_ms(call)
        prep = kernel_ms(call, "hopper_prep2_kernel")  # 0 where the default is not the Hopper path
        state_new = kernel_ms(call, "hopper_ws_kernel")
        with_env(FLASHGLA_GLA_HOPPER="0")
        off = median_ms(call)
        o_off = call()[0].float()
        with_env(**forced)
        again = median_ms(call)
        with_env()
        diff_off = ((o_new - o_off).norm() / o_off.norm()).item()
        label = f"B{B} T{T} H{H} K{K} V{V}" + (" g fp32" if gate_dtype == F32 else "") + (
            " (FLASHGLA_GLA_HOPPER=1)" if hopper else "")
        print(f"{label}: default {default:.4f} / {again:.4f}, no PDL {no_pdl:.4f} ms; "
              f"chunk pass {prep:.4f}, state kernel {state_new:.4f}; fast path {off:.4f} ms; "
              f"rel. diff {diff_off:.2e} (fast)", flush=True)
        lines.append(f"| chunk_gla fwd {label} | {default:.4f} | {again:.4f} | {no_pdl:.4f} | "
                     f"{prep:.4f} | {state_new:.4f} | {off:.4f} | {diff_off:.1e} |")
        del q, k, v, g, o_new, o_off
    print_table(lines, args.out)


def hopper_table(args):
    """The chunked lines, default path ("fast") vs the Hopper path, in this process."""
    torch.manual_seed(0)
    card = torch.cuda.get_device_name()
    bandwidth, _ = copy_bandwidth()
    shapes = ANCHORS + [(8, 2048, 16, 64, 64, F32, "-"), (2, 16384, 16, 128, 128, F32, "<= 0.6 ms")]
    lines = [f"{datetime.date.today().isoformat()}, {card}", "",
             "| shape | fast ms | hopper ms | hopper/fast | reference ms | reference | hopper ratio | target |",
             "|---|---|---|---|---|---|---|---|"]
    for B, T, H, K, V, gate_dtype, target in shapes:
        q, k, v, g = gla_inputs(B, T, H, K, V, gate_dtype=gate_dtype)
        gate_label = " g fp32" if gate_dtype == F32 else ""
        set_switch("FLASHGLA_GLA_HOPPER")
        fast = median_ms(lambda: flashgla.chunk_gla(q, k, v, g))
        o_fast = flashgla.chunk_gla(q, k, v, g)[0].float()
        set_switch("FLASHGLA_GLA_HOPPER", "1")
        hopper = median_ms(lambda: flashgla.chunk_gla(q, k, v, g))
        o_hopper = flashgla.chunk_gla(q, k, v, g)[0].float()
        print(f"  Hopper kernels: {kernel_times(lambda: flashgla.chunk_gla(q, k, v, g))}", flush=True)
        if T >= 8192:  # the sequence split of long sequences: other piece counts
            for splits in ("1", "4", "8"):
                set_switch("FLASHGLA_GLA_SPLITS", splits)
                print(f"  Hopper splits={splits}: {median_ms(lambda: flashgla.chunk_gla(q, k, v, g)):.4f} ms", flush=True)
            set_switch("FLASHGLA_GLA_SPLITS")
        set_switch("FLASHGLA_GLA_HOPPER")
        diff = ((o_hopper - o_fast).norm() / o_fast.norm()).item()
        print(f"B{B} T{T} H{H} K{K} V{V}{gate_label}: fast {fast:.4f} ms, hopper {hopper:.4f} ms, "
              f"rel. difference {diff:.2e}", flush=True)
        reference = sdpa_ms(B, T, H, K, V)
        ref_name = "SDPA flash causal"
        if reference is None:
            reference, ref_name = byte_floor_ms(B, T, H, K, V, bandwidth, g.element_size()), "byte floor"
        lines.append(f"| chunk_gla fwd B{B} T{T} H{H} K{K} V{V}{gate_label} | {fast:.4f} | {hopper:.4f} | "
                     f"{hopper / fast:.2f} | {reference:.4f} | {ref_name} | {hopper / reference:.2f}x | {target} |")
        del q, k, v, g, o_fast, o_hopper
    print_table(lines, args.out)


if __name__ == "__main__":
    main()
