"""Where the time of one long sequence goes (issue #24, item 1): chunk_gla forward and forward+backward per token
at B = 1 and long T against the batched anchor B8 T4096, with the CUDA time of each kernel (torch.profiler).

    python bench/profile_long_sequence.py

bf16 q, k, v; a vector gate in bf16 or fp32 (bench_cp.py passes an fp32 gate); d = 128. Timed with CUDA events
over 5 calls after 3 warm-ups; the kernel list is of one more call. Prints the table last.
"""

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

import flashgla

SHAPES = [(8, 4096, 16, torch.bfloat16), (8, 4096, 16, torch.float32), (1, 32768, 16, torch.bfloat16),
          (1, 524288, 16, torch.bfloat16), (1, 524288, 16, torch.float32), (8, 4096, 4, torch.bfloat16),
          (1, 1048576, 4, torch.bfloat16)]


def main(D=128):
    torch.manual_seed(0)
    rows = []
    for B, T, H, gate_dtype in SHAPES:
        q, k, v = (torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16).requires_grad_() for _ in range(3))
        g = (F.logsigmoid(torch.randn(B, T, H, D, device="cuda")).to(gate_dtype) / 16).requires_grad_()
        do = torch.randn_like(v)

        def forward():
            with torch.no_grad():
                flashgla.chunk_gla(q, k, v, g)

        def forward_backward():
            o, _ = flashgla.chunk_gla(q, k, v, g)
            torch.autograd.grad(o, (q, k, v, g), do)

        for name, fn in (("fwd", forward), ("fwd+bwd", forward_backward)):
            for _ in range(3):
                fn()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(5):
                fn()
            end.record()
            torch.cuda.synchronize()
            ms = start.elapsed_time(end) / 5
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                fn()
                torch.cuda.synchronize()
            kernels = sorted(((e.key, e.device_time_total / 1000) for e in prof.key_averages()
                              if e.device_time_total > 0), key=lambda r: -r[1])
            label = f"B{B} T{T} H{H} g {str(gate_dtype).removeprefix('torch.')}"
            print(f"== {label} {name}: {ms:.3f} ms, {ms * 1e3 / (B * T):.4f} us/token")
            for key, kernel_ms in kernels[:6]:
                print(f"   {kernel_ms:8.3f} ms  {key[:110]}")
            rows.append((label, name, ms, ms * 1e3 / (B * T)))
        del q, k, v, g, do
        torch.cuda.empty_cache()
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}, d {D}, bf16 q/k/v\n")
    print("| shape | pass | ms | us/token |\n|---|---|---|---|")
    for label, name, ms, per_token in rows:
        print(f"| {label} | {name} | {ms:.3f} | {per_token:.4f} |")


if __name__ == "__main__":
    main()
