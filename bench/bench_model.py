#!/usr/bin/env python3
"""Training throughput, peak memory and decode latency of a ~340M-parameter GLA language model
against the same-size Transformer++ (LLaMA-style: RoPE, SwiGLU, RMSNorm; torch SDPA attention),
in one process on one GPU.

    python bench/bench_model.py                    # the 340M models, T = 2048 and 8192
    python bench/bench_model.py --preset tiny      # a smoke test (runs on the CPU too)

Training: bf16 autocast with fp32 weights, AdamW, a fixed number of tokens per step (batch =
tokens / T); tokens/s over timed steps after warm-up, peak memory of the whole step. Decode: one
token for --decode-batch sequences through every layer, with the GLA state of each layer or a KV
cache of --kv-len tokens (bf16 weights, caches filled with random values: the time does not depend
on them); median of the timed steps in eager PyTorch, and of the same step replayed as a CUDA graph.
Prints a table and appends it to bench/results_model.md with the date and the card.
"""

import argparse
import datetime
import os
import statistics
import time

import torch

from flashgla.models import GLAConfig, GLAForCausalLM
from flashgla.models.gla_lm import Cache
from flashgla.nn.attention import KVCache
from flashgla.nn.gla import GatedLinearAttention, GLAState

HERE = os.path.dirname(os.path.abspath(__file__))

# GLA 340M as in the paper (hidden 1024, 24 layers, 4 heads, expand_k 0.5) and the Transformer++
# of the same width and depth (16 heads of 64), both with the same SwiGLU MLP and a 32K vocabulary.
PRESETS = {
    "340m": dict(vocab_size=32000, hidden_size=1024, num_hidden_layers=24, num_heads=4, attn_heads=16),
    "tiny": dict(vocab_size=256, hidden_size=128, num_hidden_layers=2, num_heads=2, attn_heads=2),
}


def configs(preset):
    p = PRESETS[preset]
    common = dict(vocab_size=p["vocab_size"], hidden_size=p["hidden_size"], num_hidden_layers=p["num_hidden_layers"])
    gla = GLAConfig(num_heads=p["num_heads"], **common)
    transformer = GLAConfig(num_heads=p["attn_heads"], attn_layers=list(range(p["num_hidden_layers"])),
                            attn_backend="sdpa", **common)
    return {"GLA": gla, "Transformer++": transformer}


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def autocast(device):
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")


def bench_training(config, seq_len, tokens_per_step, steps, warmup, device):
    torch.manual_seed(0)
    model = GLAForCausalLM(config).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    batch = max(1, tokens_per_step // seq_len)
    ids = torch.randint(0, config.vocab_size, (batch, seq_len + 1), device=device)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)

    def step():
        with autocast(device):
            loss = model(ids, labels=ids).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    for _ in range(warmup):
        step()
    synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    synchronize(device)
    elapsed = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")
    result = dict(params=model.num_parameters(), batch=batch, tokens_per_s=batch * seq_len * steps / elapsed,
                  peak_gib=peak)
    del model, optimizer, ids
    return result


def filled_cache(model, batch, kv_len, device, dtype):
    """A cache as after kv_len tokens: random KV caches (room for the decode steps) or GLA states."""
    cache = Cache(len(model.layers))
    for i, layer in enumerate(model.layers):
        attn = layer.attn
        if isinstance(attn, GatedLinearAttention):
            state = 0.01 * torch.randn(batch, attn.num_heads, attn.head_k_dim, attn.head_v_dim, device=device)
            cache.layers[i] = GLAState(state)
        else:
            kv = KVCache.empty(batch, attn.num_kv_heads, attn.head_dim, kv_len + 64, dtype, device)
            kv.k.normal_(), kv.v.normal_()
            kv.length = kv_len
            cache.layers[i] = kv
    cache.seen_tokens = kv_len
    return cache


@torch.no_grad()
def bench_decode(config, batch, kv_len, steps, warmup, device):
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = GLAForCausalLM(config).to(device=device, dtype=dtype).eval()
    cache = filled_cache(model, batch, kv_len, device, dtype)
    token = torch.randint(0, config.vocab_size, (batch, 1), device=device)
    times = []
    for i in range(warmup + steps):
        synchronize(device)
        start = time.perf_counter()
        model(token, cache=cache, use_cache=True)
        synchronize(device)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    cache_gib = 0.0
    for state in cache.layers:
        tensors = [state.recurrent] if isinstance(state, GLAState) else [state.k[:, :state.length],
                                                                         state.v[:, :state.length]]
        cache_gib += sum(t.numel() * t.element_size() for t in tensors) / 2**30
    graph_ms = decode_graph_ms(model, cache, token, steps) if device.type == "cuda" else None
    del model, cache
    return dict(ms=1e3 * statistics.median(times), graph_ms=graph_ms, cache_gib=cache_gib)


def decode_graph_ms(model, cache, token, steps):
    """The same decode step captured in a CUDA graph and replayed: the GPU time without Python and
    launch overhead. (Replays of the Transformer's step write the same cache slot: the cache stays
    at its length, which is what is being timed.)"""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        model(token, cache=cache, use_cache=True)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        model(token, cache=cache, use_cache=True)
    times = []
    for _ in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def card_name(device):
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default="340m")
    p.add_argument("--seq-lens", type=int, nargs="+", default=[2048, 8192])
    p.add_argument("--tokens-per-step", type=int, default=16384)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--decode-batch", type=int, default=64)
    p.add_argument("--kv-len", type=int, default=4096)
    p.add_argument("--decode-steps", type=int, default=30)
    p.add_argument("--results", default=os.path.join(HERE, "results_model.md"))
    p.add_argument("--no-append", action="store_true", help="print only; do not append to --results")
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type != "cuda" and args.preset != "tiny":
        raise SystemExit("bench_model: no GPU; use --preset tiny for a smoke test on the CPU")

    rows = []
    for name, config in configs(args.preset).items():
        for seq_len in args.seq_lens:
            r = bench_training(config, seq_len, args.tokens_per_step, args.steps, args.warmup, device)
            rows.append((name, r["params"], f"train T={seq_len} (B={r['batch']})", f"{r['tokens_per_s']:,.0f} tok/s",
                         f"{r['peak_gib']:.1f} GiB"))
            print(" | ".join(str(c) for c in rows[-1]), flush=True)
        d = bench_decode(config, args.decode_batch, args.kv_len, args.decode_steps, args.warmup, device)
        what = "GLA states" if name == "GLA" else f"KV cache {args.kv_len}"
        speed = f"{d['ms']:.2f} ms" + ("" if d["graph_ms"] is None else f" ({d['graph_ms']:.2f} ms in a CUDA graph)")
        rows.append((name, rows[-1][1], f"decode 1 token x {args.decode_batch} seqs ({what})", speed,
                     f"{d['cache_gib']:.2f} GiB cache"))
        print(" | ".join(str(c) for c in rows[-1]), flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()

    header = "| model | parameters | run | speed | memory |\n|---|---|---|---|---|\n"
    table = header + "".join(f"| {n} | {params / 1e6:.0f}M | {what} | {speed} | {mem} |\n"
                             for n, params, what, speed, mem in rows)
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    title = (f"## {stamp}, {card_name(device)}, torch {torch.__version__}, preset {args.preset}, "
             f"{args.tokens_per_step} tokens/step\n\n")
    print("\n" + title + table)
    if not args.no_append:
        new_file = not os.path.exists(args.results)
        with open(args.results, "a") as f:
            if new_file:
                f.write("# Model benchmarks (bench/bench_model.py)\n\n")
            f.write(title + table + "\n")


if __name__ == "__main__":
    main()
