"""Host time per eager call of flash_attention_with_kvcache, and of its parts, at B1 L1K (where the GPU's
work, about 7 µs, is shorter than the host's): `python bench/kvcache_host_time.py` on a CUDA machine.

Each row is the mean over 5000 back-to-back calls after 200 of warm-up, with the queue never drained in
between, so it is the host's time per call. SDPA (cuDNN) on the same tensors is the reference. The parts are
timed alone, so they do not add up exactly to the whole.
"""

import functools

import torch
import torch.nn.functional as F

import flashgla
from flashgla import _C
from flashgla._torch import make_args, on_device, run_op, stream_of, view, workspace
from flashgla.ops import kvcache as kv
from profile_kvcache import host_us


def main():
    B, L, D = 1, 1024, 128
    dev = torch.device("cuda", 0)
    bf16 = dict(device=dev, dtype=torch.bfloat16)
    q = torch.randn(B, 1, 16, D, **bf16)
    k = torch.randn(B, L, 16, D, **bf16)
    v = torch.randn_like(k)
    q_gqa = torch.randn(B, 1, 64, D, **bf16)
    k_gqa = torch.randn(B, L, 8, D, **bf16)
    v_gqa = torch.randn_like(k_gqa)
    lens = torch.full((B,), L, dtype=torch.int32, device=dev)

    o, lse = kv._outputs(q, v)
    fields = dict(q=q, k_cache=k, v_cache=v, cache_seqlens=lens, causal=True, o=o, lse=lse)
    args = make_args(_C.AttentionKvCacheArgs, **fields)
    args.stream = stream_of(dev)
    one_split = make_args(_C.AttentionKvCacheArgs, **fields, num_splits=1)
    one_split.stream = args.stream
    allocate = functools.partial(workspace, dev)
    sdpa = functools.partial(F.scaled_dot_product_attention, q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    sdpa_gqa = functools.partial(F.scaled_dot_product_attention, q_gqa.transpose(1, 2), k_gqa.transpose(1, 2),
                                 v_gqa.transpose(1, 2), enable_gqa=True)
    output_sizes = [("o", (*q.shape[:3], v.shape[-1]), q.dtype), ("lse", (B, 16, 1), torch.float32)]
    rows = [
        ("whole call, 16 / 16", lambda: flashgla.flash_attention_with_kvcache(q, k, v, lens)),
        ("whole call with lse", lambda: flashgla.flash_attention_with_kvcache(q, k, v, lens, return_softmax_lse=True)),
        ("SDPA, 16 / 16", sdpa),
        ("whole call, GQA 64 / 8", lambda: flashgla.flash_attention_with_kvcache(q_gqa, k_gqa, v_gqa, lens)),
        ("SDPA, GQA 64 / 8", sdpa_gqa),
        ("_run (with lse)", lambda: kv._run(q, k, v, lens, None, None, None, True, None, None, 0)),
        ("run_op", lambda: run_op(_C.attention_with_kvcache, args, dev)),
        ("C++ op, with the scratch callback", lambda: _C.attention_with_kvcache(args, allocate)),
        ("C++ op, 1 split (no scratch, no combine)", lambda: _C.attention_with_kvcache(one_split, allocate)),
        ("make_args", lambda: make_args(_C.AttentionKvCacheArgs, **fields)),
        ("one TensorView", lambda: view(q, "q")),
        ("_outputs (o and lse)", lambda: kv._outputs(q, v)),
        ("one torch.empty", lambda: torch.empty((1, 1, 16, 128), **bf16)),
        ("workspace(64 KiB)", lambda: workspace(dev, 65536)),
        ("stream_of", lambda: stream_of(dev)),
        ("torch.cuda.current_stream().cuda_stream", lambda: torch.cuda.current_stream(dev).cuda_stream),
        ("on_device", lambda: on_device(dev)),
        ("require_outputs", lambda: kv.require_outputs("x", dev, output_sizes)),
        ("_plain_eager", lambda: kv._plain_eager((q, k, v, lens, None, None, None))),
    ]
    print(f"# {torch.cuda.get_device_name(dev)}, torch {torch.__version__}: host µs per call, B1 L1K D128 bf16")
    print("| what | µs |")
    print("|---|---|")
    for name, fn in rows:
        print(f"| {name} | {host_us(fn, n=5000, warmup=200):.2f} |")


if __name__ == "__main__":
    main()
