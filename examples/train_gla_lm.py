#!/usr/bin/env python3
"""Train a small byte-level GLA language model on the King James Bible (data/kjv.txt.gz).

    python examples/train_gla_lm.py                      # tiny model, CPU, a few minutes
    python examples/train_gla_lm.py --preset small       # a larger one for a GPU
    python examples/sample.py runs/gla-tiny --prompt "And God said"

Every byte is a token (vocab 256). The last 5% of the text is held out for evaluation. The run prints a
progress line (loss, tokens/s), evaluates every --eval-every steps (loss in nats and bits per byte),
saves the model to --out (config.json + model.pt, loadable with GLAForCausalLM.from_pretrained) with
the optimizer state for --resume, writes losses.json and, when matplotlib is installed, loss.png, and
finally prints a sampled continuation of --prompt.
"""

import argparse
import gzip
import json
import math
import os
import sys
import time

import torch

from flashgla.models import GLAConfig, GLAForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_DATA = os.path.join(HERE, "..", "data", "kjv.txt.gz")

# Model sizes and training settings by preset; command-line options override them.
PRESETS = {
    # ~0.4M parameters: about a minute of training on two CPU cores.
    "tiny": dict(hidden_size=128, num_hidden_layers=2, num_heads=2, seq_len=128, batch_size=16, steps=300,
                 lr=3e-3, eval_every=100),
    # ~25M parameters: for a GPU.
    "small": dict(hidden_size=512, num_hidden_layers=8, num_heads=4, seq_len=512, batch_size=32, steps=3000,
                  lr=1e-3, eval_every=250),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    p.add_argument("--data", default=DEFAULT_DATA, help="text file (.txt or .txt.gz)")
    p.add_argument("--out", default=None, help="checkpoint directory (default runs/gla-<preset>)")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto")
    p.add_argument("--steps", type=int)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--seq-len", type=int)
    p.add_argument("--lr", type=float)
    p.add_argument("--hidden-size", type=int)
    p.add_argument("--num-hidden-layers", type=int)
    p.add_argument("--num-heads", type=int)
    p.add_argument("--attn-layers", default="", help="comma-separated indices of softmax-attention layers")
    p.add_argument("--mode", choices=["chunk", "fused_recurrent"], default="chunk")
    p.add_argument("--use-short-conv", action="store_true")
    p.add_argument("--warmup", type=int, default=None, help="warm-up steps (default: 5%% of --steps)")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--eval-every", type=int)
    p.add_argument("--eval-batches", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--resume", action="store_true", help="continue from --out")
    p.add_argument("--prompt", default="And God said")
    p.add_argument("--sample-tokens", type=int, default=300)
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--top-k", type=int, default=40)
    args = p.parse_args(argv)
    if not args.prompt:
        p.error("--prompt is empty: the sample at the end needs at least one character to continue")
    for key, value in PRESETS[args.preset].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.warmup is None:
        args.warmup = max(1, args.steps // 20)
    if args.out is None:
        args.out = os.path.join("runs", f"gla-{args.preset}")
    return args


def load_bytes(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long()


class Batches:
    """Random windows of seq_len + 1 bytes from the training split; fixed windows for evaluation."""

    def __init__(self, data, seq_len, batch_size, seed):
        split = int(len(data) * 0.95)
        self.train, self.val = data[:split], data[split:]
        self.seq_len, self.batch_size = seq_len, batch_size
        self.generator = torch.Generator().manual_seed(seed)

    def next(self):
        starts = torch.randint(0, len(self.train) - self.seq_len - 1, (self.batch_size,), generator=self.generator)
        return torch.stack([self.train[s:s + self.seq_len + 1] for s in starts.tolist()])

    def evaluation(self, count):
        stride = max(1, (len(self.val) - self.seq_len - 1) // (count * self.batch_size))
        windows = [self.val[i * stride:i * stride + self.seq_len + 1] for i in range(count * self.batch_size)]
        return [torch.stack(windows[b * self.batch_size:(b + 1) * self.batch_size]) for b in range(count)]


def learning_rate(step, args):
    """Linear warm-up, then cosine decay to 10% (as in the GLA paper's training recipe)."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    progress = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, progress))))


class Progress:
    """A one-line progress bar on stderr (no dependencies)."""

    def __init__(self, total, start=0):
        self.total, self.start, self.t0 = total, start, time.time()

    def update(self, step, **values):
        done = (step + 1) / self.total
        bar = "#" * int(30 * done) + "-" * (30 - int(30 * done))
        elapsed = time.time() - self.t0
        rate = (step + 1 - self.start) / elapsed if elapsed > 0 else 0.0
        eta = (self.total - step - 1) / rate if rate > 0 else 0.0
        fields = " ".join(f"{k} {v}" for k, v in values.items())
        sys.stderr.write(f"\r[{bar}] {step + 1}/{self.total} {fields} eta {eta:4.0f}s ")
        sys.stderr.flush()

    def close(self):
        sys.stderr.write("\n")


def autocast(device):
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


@torch.no_grad()
def evaluate(model, batches, device):
    model.eval()
    losses = []
    for batch in batches:
        batch = batch.to(device)
        with autocast(device):
            losses.append(model(batch, labels=batch).loss.item())
    model.train()
    return sum(losses) / len(losses)


def plot(history, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([h["step"] for h in history["train"]], [h["loss"] for h in history["train"]], label="train", alpha=0.6)
    ax.plot([h["step"] for h in history["eval"]], [h["loss"] for h in history["eval"]], "o-", label="held out")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats per byte)")
    ax.set_title("byte-level GLA LM on the King James Bible")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def main(argv=None):
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          "cpu" if args.device == "auto" else args.device)
    torch.manual_seed(args.seed)

    data = load_bytes(args.data)
    batches = Batches(data, args.seq_len, args.batch_size, args.seed)
    eval_batches = batches.evaluation(args.eval_batches)
    os.makedirs(args.out, exist_ok=True)
    state_path = os.path.join(args.out, "train_state.pt")

    if args.resume:
        model = GLAForCausalLM.from_pretrained(args.out, map_location=device)
    else:
        attn_layers = [int(i) for i in args.attn_layers.split(",") if i.strip()]
        config = GLAConfig(vocab_size=256, hidden_size=args.hidden_size, num_hidden_layers=args.num_hidden_layers,
                           num_heads=args.num_heads, attn_layers=attn_layers, mode=args.mode,
                           use_short_conv=args.use_short_conv)
        model = GLAForCausalLM(config).to(device)
    model.train()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95))
    start, history = 0, {"train": [], "eval": []}
    if args.resume and os.path.exists(state_path):
        state = torch.load(state_path, map_location=device, weights_only=False)
        optimizer.load_state_dict(state["optimizer"])
        start, history = state["step"], state["history"]
        batches.generator.set_state(state["data_rng"])

    print(f"data: {args.data}: {len(batches.train):,} training bytes, {len(batches.val):,} held out")
    print(f"model: {model.num_parameters():,} parameters ({model.num_parameters(True):,} without embeddings), "
          f"{model.config.num_hidden_layers} layers, hidden {model.config.hidden_size}, device {device}")
    tokens_per_step = args.batch_size * args.seq_len
    if start == 0:
        initial = evaluate(model, eval_batches, device)
        history["eval"].append({"step": 0, "loss": initial})
        print(f"step 0: held-out loss {initial:.4f} ({initial / math.log(2):.3f} bits/byte)")

    progress = Progress(args.steps, start)
    window_tokens, window_start = 0, time.time()
    tokens_per_second = 0.0
    for step in range(start, args.steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, args)
        batch = batches.next().to(device, non_blocking=True)
        with autocast(device):
            loss = model(batch, labels=batch).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        window_tokens += tokens_per_step
        if step % 10 == 0 or step + 1 == args.steps:
            value = loss.item()  # synchronises with the device, so the rate below is honest
            elapsed = time.time() - window_start
            tokens_per_second = window_tokens / elapsed if elapsed > 0 else 0.0
            window_tokens, window_start = 0, time.time()
            history["train"].append({"step": step + 1, "loss": value})
            progress.update(step, loss=f"{value:.4f}", lr=f"{learning_rate(step, args):.2e}",
                            tok_s=f"{tokens_per_second:,.0f}")
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            held_out = evaluate(model, eval_batches, device)
            history["eval"].append({"step": step + 1, "loss": held_out})
            progress.close()
            print(f"step {step + 1}: held-out loss {held_out:.4f} ({held_out / math.log(2):.3f} bits/byte), "
                  f"{tokens_per_second:,.0f} tokens/s")
            model.save_pretrained(args.out)
            torch.save({"optimizer": optimizer.state_dict(), "step": step + 1, "history": history,
                        "data_rng": batches.generator.get_state()}, state_path)
    progress.close()

    with open(os.path.join(args.out, "losses.json"), "w") as f:
        json.dump(history, f, indent=1)
    if plot(history, os.path.join(args.out, "loss.png")):
        print(f"loss curve: {os.path.join(args.out, 'loss.png')}")
    else:
        print("no loss.png: matplotlib is not installed (pip install matplotlib, or pip install .[examples] "
              "from the flashgla repository); the losses are in losses.json")
    first, last = history["eval"][0]["loss"], history["eval"][-1]["loss"]
    print(f"held-out loss {first:.4f} -> {last:.4f}; checkpoint in {args.out}")

    model.eval()
    prompt = torch.tensor([list(args.prompt.encode())], dtype=torch.long, device=device)
    generator = torch.Generator(device=device).manual_seed(args.seed)
    with autocast(device):
        out = model.generate(prompt, args.sample_tokens, do_sample=True, temperature=args.temperature,
                             top_k=args.top_k, generator=generator)
    print("---- sample ----")
    print(bytes(out[0].tolist()).decode("utf-8", errors="replace"))


if __name__ == "__main__":
    main()
