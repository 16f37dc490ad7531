#!/usr/bin/env python3
"""Generate text with a byte-level GLA model saved by examples/train_gla_lm.py.

    python examples/sample.py runs/gla-tiny --prompt "In the beginning" --tokens 400
    python examples/sample.py runs/gla-tiny --greedy

The prompt is prefilled with the chunked GLA kernel; each new byte is then decoded with the
one-token decode kernel, which updates every layer's state in place.
"""

import argparse
import time

import torch

from flashgla.models import GLAForCausalLM


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("checkpoint", help="directory with config.json and model.pt")
    p.add_argument("--prompt", default="And it came to pass", help="text the model continues (UTF-8 bytes)")
    p.add_argument("--tokens", type=int, default=300, help="bytes to generate")
    p.add_argument("--greedy", action="store_true", help="take the most likely byte instead of sampling")
    p.add_argument("--temperature", type=float, default=0.8,
                   help="divides the logits before sampling: lower is more conservative (ignored with --greedy)")
    p.add_argument("--top-k", type=int, default=40,
                   help="sample among the k most likely bytes only (ignored with --greedy)")
    p.add_argument("--num-samples", type=int, default=1, help="continuations generated together as a batch")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampling generator")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N, or auto (a GPU when present)")
    return p


def main(argv=None):
    p = build_parser()
    args = p.parse_args(argv)
    if not args.prompt:
        p.error("--prompt is empty: give at least one character for the model to continue")

    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          "cpu" if args.device == "auto" else args.device)
    model = GLAForCausalLM.from_pretrained(args.checkpoint, map_location=device).eval()
    if model.config.vocab_size != 256:
        raise SystemExit(f"{args.checkpoint}: not a byte-level model (vocab_size {model.config.vocab_size})")
    prompt = torch.tensor([list(args.prompt.encode())] * args.num_samples, dtype=torch.long, device=device)
    generator = torch.Generator(device=device).manual_seed(args.seed)
    start = time.time()
    out = model.generate(prompt, args.tokens, do_sample=not args.greedy, temperature=args.temperature,
                         top_k=args.top_k, generator=generator)
    elapsed = time.time() - start
    for row in out.tolist():
        print(bytes(row).decode("utf-8", errors="replace"))
        print("----")
    print(f"{args.num_samples} x {args.tokens} bytes in {elapsed:.2f} s "
          f"({args.num_samples * args.tokens / elapsed:,.0f} bytes/s, prefill included)")


if __name__ == "__main__":
    main()
