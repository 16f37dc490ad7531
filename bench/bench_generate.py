#!/usr/bin/env python3
"""End-to-end generate() speed of the ~340M GLA model, a GLA/attention hybrid of the same size and the
Transformer++ (torch SDPA attention), eager decoding against the decode step captured in a CUDA graph.

    python bench/bench_generate.py                       # 340M, 64 sequences, 128-token prompts, 256 new tokens
    python bench/bench_generate.py --preset tiny         # a smoke test (runs on the CPU: eager only)
    python bench/bench_generate.py --hf                  # also transformers' generate() (flashgla.models.hf)

bf16 weights, greedy decoding (every sequence generates exactly --new-tokens tokens). For each model and
mode: the wall time of generate() (prefill + decoding, median of --repeats runs after a warm-up run),
tokens/s over all sequences, and ms per decoded token: (time of generate(N) - time of generate(1)) / (N - 1),
which leaves the prefill out. Prints a table and appends it to bench/results_generate.md with the date and
the card. Target (issue 18): the 340M GLA model at 64 sequences at or under 3 ms per token.
"""

import argparse
import datetime
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_model import PRESETS, card_name, configs, synchronize  # noqa: E402

from flashgla.models import GLAConfig, GLAForCausalLM  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def models(preset, hybrid_every):
    found = configs(preset)
    gla, transformer = found["GLA"], found["Transformer++"]
    layers = gla.num_hidden_layers
    # The hybrid: softmax attention (16 heads of 64, as the Transformer++) in every hybrid_every-th block.
    attn = [i for i in range(layers) if i % hybrid_every == hybrid_every - 1] or [layers - 1]
    values = gla.to_dict()
    values.update(attn_layers=attn, attn_num_heads=PRESETS[preset]["attn_heads"])
    return {"GLA": gla, f"GLA hybrid (attention in {attn})": GLAConfig(**values), "Transformer++": transformer}


def timed(fn, repeats, device):
    fn()  # warm-up: allocations, kernel selection
    times = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@torch.no_grad()
def bench(model, generate, batch, prompt_len, new_tokens, repeats, device, vocab):
    prompt = torch.randint(0, vocab, (batch, prompt_len), device=device, generator=None)
    full = timed(lambda: generate(model, prompt, new_tokens), repeats, device)
    prefill = timed(lambda: generate(model, prompt, 1), repeats, device)
    return dict(total_s=full, tokens_per_s=batch * new_tokens / full,
                ms_per_token=1e3 * (full - prefill) / max(1, new_tokens - 1))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default="340m")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--hybrid-every", type=int, default=6, help="attention in every n-th block of the hybrid")
    p.add_argument("--hf", action="store_true", help="also time transformers' generate() (needs transformers)")
    p.add_argument("--results", default=os.path.join(HERE, "results_generate.md"))
    p.add_argument("--no-append", action="store_true", help="print only; do not append to --results")
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type != "cuda" and args.preset != "tiny":
        raise SystemExit("bench_generate: no GPU; use --preset tiny for a smoke test on the CPU")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32

    modes = {"eager": lambda m, ids, n: m.generate(ids, n, cuda_graph=False)}
    if device.type == "cuda":
        modes["CUDA graph"] = lambda m, ids, n: m.generate(ids, n, cuda_graph=True)
    rows = []
    for name, config in models(args.preset, args.hybrid_every).items():
        torch.manual_seed(0)
        model = GLAForCausalLM(config).to(device=device, dtype=dtype).eval()
        runs = dict(modes)
        if args.hf:
            from flashgla.models.hf import FlashGLAConfig, FlashGLAForCausalLM
            wrapper = FlashGLAForCausalLM(FlashGLAConfig.from_core(config, eos_token_id=None, pad_token_id=0))
            wrapper.model = model  # the same weights

            def hf_generate(m, ids, n, w=wrapper, graph=None):
                w.cuda_graph = graph
                return w.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                                  do_sample=False)
            runs["transformers generate(), eager"] = lambda m, ids, n: hf_generate(m, ids, n, graph=False)
            if device.type == "cuda":
                runs["transformers generate(), CUDA graph"] = lambda m, ids, n: hf_generate(m, ids, n, graph=True)
        for mode, generate in runs.items():
            r = bench(model, generate, args.batch, args.prompt_len, args.new_tokens, args.repeats, device,
                      config.vocab_size)
            rows.append((name, mode, f"{r['ms_per_token']:.2f}", f"{r['tokens_per_s']:,.0f}", f"{r['total_s']:.3f}"))
            print(" | ".join(rows[-1]), flush=True)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()

    header = ("| model | decoding | ms per token | tokens/s (all sequences) | generate() s |\n"
              "|---|---|---|---|---|\n")
    table = header + "".join("| " + " | ".join(r) + " |\n" for r in rows)
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    title = (f"## {stamp}, {card_name(device)}, torch {torch.__version__}, preset {args.preset}, {dtype}, "
             f"{args.batch} sequences, prompt {args.prompt_len}, {args.new_tokens} new tokens (greedy)\n\n")
    print("\n" + title + table)
    if not args.no_append:
        new_file = not os.path.exists(args.results)
        with open(args.results, "a") as f:
            if new_file:
                f.write("# generate() benchmarks (bench/bench_generate.py)\n\n")
            f.write(title + table + "\n")


if __name__ == "__main__":
    main()
