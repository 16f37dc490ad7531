#!/usr/bin/env python3
"""Train a small byte-level GLA language model on the King James Bible (data/kjv.txt.gz).

    python examples/train_gla_lm.py                      # tiny model, CPU, a few minutes
    python examples/train_gla_lm.py --preset small       # a larger one for a GPU
    python examples/sample.py runs/gla-tiny --prompt "And God said"
    torchrun --nproc_per_node 4 examples/train_gla_lm.py --preset small          # FSDP2 on 4 GPUs
    torchrun --nproc_per_node 4 examples/train_gla_lm.py --preset small --context-parallel 2   # 2 data x 2 context
    torchrun --nproc_per_node 4 examples/train_gla_lm.py --preset 340m --context-parallel 4 --batch-size 1 \
        --seq-len 1048575 --activation-checkpointing --loss-chunk-size 8192   # one 1M-token window per step

Every byte is a token (vocab 256). The last 5% of the text (at least one window) is held out for
evaluation. The run prints a progress line (loss, tokens/s), evaluates every --eval-every steps (loss in
nats and bits per byte, tokens/s, and on GPUs rank 0's peak memory),
saves the model to --out (config.json + model.pt, loadable with GLAForCausalLM.from_pretrained) and
model + optimizer as a torch.distributed.checkpoint in --out/checkpoint for --resume, writes losses.json and, when matplotlib is installed, loss.png, and
finally prints a sampled continuation of --prompt.

Under torchrun (WORLD_SIZE > 1) the model is sharded with FSDP2 (flashgla.parallel.parallelize:
bf16 parameters and fp32 gradient reduction on GPUs, fp32 on the CPU with gloo), each data-parallel
rank draws its own batches, and rank 0 prints the progress, evaluates (the evaluation batches split
over the ranks) and plots. Each evaluation and the logged loss average over all ranks. --context-parallel N
(--cp N) splits every sequence over N ranks (context parallelism; the batch's windows are packed into
one sequence of batch-size x (seq-len + 1) tokens per group of N ranks, which N must divide).
Checkpoints go through torch.distributed.checkpoint into <out>/checkpoint (any number of ranks can
--resume from them, one process included); rank 0 also writes config.json + model.pt for sample.py.
"""

import argparse
import gc
import gzip
import json
import math
import os
import sys
import time

import torch
import torch.distributed as dist

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
    # ~300M parameters (the 340M GLA LM's blocks; a byte vocabulary): for GPUs, and long context under torchrun.
    "340m": dict(hidden_size=1024, num_hidden_layers=24, num_heads=4, seq_len=2048, batch_size=8, steps=2000,
                 lr=3e-4, eval_every=250),
}


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny",
                   help="model size and training settings (tiny: CPU, about a minute; small: a GPU); "
                        "the options below override them")
    p.add_argument("--data", default=DEFAULT_DATA, help="text file (.txt or .txt.gz)")
    p.add_argument("--out", default=None, help="checkpoint directory (default runs/gla-<preset>)")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto")
    p.add_argument("--steps", type=int, help="total optimizer steps, counting those of a --resume'd run (preset)")
    p.add_argument("--batch-size", type=int, help="windows per step on each data-parallel rank (preset)")
    p.add_argument("--seq-len", type=int, help="bytes per training window (preset)")
    p.add_argument("--lr", type=float, help="peak learning rate of the warm-up + cosine schedule (preset)")
    p.add_argument("--hidden-size", type=int, help="model width (preset)")
    p.add_argument("--num-hidden-layers", type=int, help="number of blocks (preset)")
    p.add_argument("--num-heads", type=int, help="attention heads per block (preset)")
    p.add_argument("--attn-layers", default="", help="comma-separated indices of softmax-attention layers")
    p.add_argument("--mode", choices=["chunk", "fused_recurrent"], default="chunk",
                   help="GLA kernel in training: chunked or token by token")
    p.add_argument("--use-short-conv", action="store_true",
                   help="causal depthwise convolution on q, k, v in every GLA layer")
    p.add_argument("--warmup", type=int, default=None, help="warm-up steps (default: 5%% of --steps)")
    p.add_argument("--weight-decay", type=float, default=0.1, help="AdamW weight decay of the matrices")
    p.add_argument("--eval-every", type=int, help="steps between held-out evaluations and checkpoints (preset)")
    p.add_argument("--eval-batches", type=int, default=8, help="held-out batches per evaluation")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights, the batches and the sample")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --out from its checkpoint (an error when there is none)")
    p.add_argument("--overwrite", action="store_true",
                   help="start a new run in --out even when it holds a run (its files are replaced)")
    p.add_argument("--context-parallel", "--cp", dest="cp", type=int, default=1,
                   help="context-parallel ranks per sequence (under torchrun)")
    p.add_argument("--activation-checkpointing", action="store_true", help="recompute each block in the backward")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile each block (flashgla.parallel.compile_blocks): less host work per step")
    p.add_argument("--loss-chunk-size", type=int, default=None,
                   help="tokens per chunk of the LM head + cross-entropy (never materialises all logits)")
    p.add_argument("--prompt", default="And God said", help="text the sample at the end continues")
    p.add_argument("--sample-tokens", type=int, default=300, help="bytes sampled at the end")
    p.add_argument("--temperature", type=float, default=0.8, help="sampling temperature of the sample at the end")
    p.add_argument("--top-k", type=int, default=40, help="the sample at the end draws among the k most likely bytes")
    return p


def parse_args(argv=None):
    p = build_parser()
    args = p.parse_args(argv)
    if not args.prompt:
        p.error("--prompt is empty: the sample at the end needs at least one character to continue")
    for key, value in PRESETS[args.preset].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.steps < 1:
        p.error(f"--steps {args.steps}: give at least 1 (the total number of steps, those already done included)")
    if args.warmup is None:
        args.warmup = max(1, args.steps // 20)
    if args.out is None:
        args.out = os.path.join("runs", f"gla-{args.preset}")
    if args.resume and args.overwrite:
        p.error("--resume and --overwrite: give one (--resume continues the run in --out, --overwrite replaces it)")
    return args


RUN_FILES = ("config.json", "model.pt", "losses.json", os.path.join("checkpoint", ".metadata"))


def check_run_folder(args, distributed):
    """Refuses what would lose a run or silently start over: a new run in a folder that holds one
    (without --overwrite), and --resume without a checkpoint to continue."""
    held = [name for name in RUN_FILES if os.path.exists(os.path.join(args.out, name))]
    if not args.resume:
        if held and not args.overwrite:
            raise SystemExit(f"--out {args.out}: this folder holds a run ({', '.join(held)}); pass --resume to "
                             f"continue it, --overwrite to replace it, or another --out")
        return
    if os.path.exists(os.path.join(args.out, "checkpoint", ".metadata")):
        return
    if os.path.exists(os.path.join(args.out, "model.pt")) and not distributed:
        return  # the weights alone: training restarts from step 0 with them
    found = f"it holds only {', '.join(held)}" if held else ("it does not exist" if not os.path.isdir(args.out)
                                                            else "it holds no run")
    need = "" if distributed else f" (or the weights {os.path.join(args.out, 'model.pt')})"
    raise SystemExit(f"--resume: no checkpoint to continue in {args.out}: {found}; expected "
                     f"{os.path.join(args.out, 'checkpoint')}{need}, written by an earlier run of this script "
                     f"with the same --out. Drop --resume to start a new run")


def load_bytes(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long()


class Batches:
    """Random windows of seq_len + 1 bytes from the training split; fixed windows for evaluation."""

    def __init__(self, data, seq_len, batch_size, seed):
        split = min(int(len(data) * 0.95), len(data) - seq_len - 1)  # at least one window held out
        if split < seq_len + 2:
            raise SystemExit(f"--seq-len {seq_len}: the data ({len(data):,} bytes) holds fewer than two windows of "
                             f"{seq_len + 1} bytes (one to train on, one held out)")
        self.train, self.val = data[:split], data[split:]
        self.seq_len, self.batch_size = seq_len, batch_size
        self.generator = torch.Generator().manual_seed(seed)

    def next(self):
        starts = torch.randint(0, len(self.train) - self.seq_len - 1, (self.batch_size,), generator=self.generator)
        return torch.stack([self.train[s:s + self.seq_len + 1] for s in starts.tolist()])

    def evaluation(self, count):
        last = len(self.val) - self.seq_len - 1  # the last start of a whole window (windows repeat past it)
        stride = max(1, last // (count * self.batch_size))
        windows = [self.val[min(i * stride, last):min(i * stride, last) + self.seq_len + 1]
                   for i in range(count * self.batch_size)]
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


class Ranks:
    """Where this process sits: one process, or a torchrun rank with its data- and context-parallel places."""

    def __init__(self, args):
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.distributed = self.world > 1
        if args.cp < 1 or (args.cp > 1 and not self.distributed):
            raise SystemExit(f"--context-parallel {args.cp}: context parallelism needs torchrun with a multiple of {args.cp} processes")
        self.rank, self.dp_rank, self.dp_size, self.cp_rank, self.cp, self.cp_group, self.mesh = 0, 0, 1, 0, 1, None, None
        if not self.distributed:
            self.device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                                       "cpu" if args.device == "auto" else args.device)
            return
        from flashgla.parallel import init_mesh

        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        cuda = args.device != "cpu" and torch.cuda.is_available()
        self.device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
        if cuda:
            torch.cuda.set_device(self.device)
        dist.init_process_group("nccl" if cuda else "gloo", device_id=self.device if cuda else None)
        self.rank = dist.get_rank()
        self.mesh = init_mesh(self.device.type, cp=args.cp)
        self.dp_rank, self.dp_size = self.mesh["dp_shard"].get_local_rank(), self.mesh["dp_shard"].size()
        self.cp_rank, self.cp, self.cp_group = self.mesh["cp"].get_local_rank(), args.cp, self.mesh["cp"].get_group()

    @property
    def main(self):
        return self.rank == 0

    def close(self):
        if self.distributed:
            # Cyclic garbage can keep the group alive into interpreter finalization, where gloo's threads abort.
            gc.collect()
            dist.barrier()
            dist.destroy_process_group()

    def mean(self, total, count):
        """sum(total) / sum(count) over all ranks (floats); under CP each group's value counts once."""
        if not self.distributed:
            return total / count
        values = torch.tensor([total, count], dtype=torch.float64, device=self.device)
        dist.all_reduce(values)
        return (values[0] / values[1]).item()


class Step:
    """Runs the model on a batch of windows [B, seq_len + 1]: the whole batch on one rank or a
    data-parallel rank; under --cp the windows packed into one sequence (a sequence per window) and
    split over the CP ranks. One rule on every path: labels = the input bytes, shifted by the model
    (each window's bytes 1..seq_len are the targets of its bytes 0..seq_len-1; under CP the model takes
    a rank's last target from the next rank)."""

    def __init__(self, model, ranks, args):
        self.model, self.ranks, self.context = model, ranks, None
        if ranks.cp > 1:
            from flashgla.distributed import build_cp_context

            window = args.seq_len + 1
            total = args.batch_size * window
            if total % ranks.cp:
                raise SystemExit(f"--context-parallel {ranks.cp}: batch-size x (seq-len + 1) = {args.batch_size} x {window} = "
                                 f"{total} tokens must divide into the {ranks.cp} CP ranks")
            cu_seqlens = torch.arange(0, total + 1, window, dtype=torch.int32)
            conv = model.config.conv_size if model.config.use_short_conv else None
            self.context = build_cp_context(cu_seqlens.to(ranks.device), ranks.cp_group, conv1d_kernel_size=conv,
                                            cu_seqlens_cpu=cu_seqlens)
            self.local = total // ranks.cp

    def loss(self, windows):
        windows = windows.to(self.ranks.device, non_blocking=True)
        if self.context is None:
            return self.model(windows, labels=windows).loss
        ids = windows.reshape(1, -1)[:, self.ranks.cp_rank * self.local:(self.ranks.cp_rank + 1) * self.local]
        return self.model(ids, labels=ids, cp_context=self.context).loss


@torch.no_grad()
def evaluate(step, batches, device):
    """Mean held-out loss over the batches (each data-parallel rank evaluates its share)."""
    model = step.model
    model.eval()
    total = 0.0
    for batch in batches:
        with autocast(device):
            total += step.loss(batch).item()
    model.train()
    return step.ranks.mean(total, len(batches))


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


def build_model(args, ranks):
    """The model (the same initial weights on every rank), sharded with FSDP2 under torchrun."""
    checkpoint = os.path.join(args.out, CHECKPOINT_DIR)
    if args.resume and os.path.exists(os.path.join(checkpoint, "config.json")):
        config = GLAConfig.from_json(os.path.join(checkpoint, "config.json"))
    elif args.resume and os.path.exists(os.path.join(args.out, "config.json")):
        config = GLAConfig.from_json(os.path.join(args.out, "config.json"))
    else:
        attn_layers = [int(i) for i in args.attn_layers.split(",") if i.strip()]
        config = GLAConfig(vocab_size=256, hidden_size=args.hidden_size, num_hidden_layers=args.num_hidden_layers,
                           num_heads=args.num_heads, attn_layers=attn_layers, mode=args.mode,
                           use_short_conv=args.use_short_conv)
    model = GLAForCausalLM(config).to(ranks.device)
    if ranks.distributed:
        from flashgla.parallel import parallelize

        # bf16 parameters with fp32 gradient reduction on GPUs; fp32 throughout on the CPU (gloo).
        parallelize(model, ranks.mesh, param_dtype=torch.bfloat16 if ranks.device.type == "cuda" else None,
                    reduce_dtype=torch.float32, activation_checkpointing=args.activation_checkpointing,
                    loss_chunk_size=args.loss_chunk_size, compile=args.compile)
    else:
        from flashgla.parallel import apply_activation_checkpointing, compile_blocks

        if args.activation_checkpointing:
            for block in model.layers:
                apply_activation_checkpointing(block)
        if args.compile:
            compile_blocks(model)
        model.loss_chunk_size = args.loss_chunk_size
    return model


def save_plain_model(model, ranks, directory):
    """config.json + model.pt (full tensors, rank 0) for GLAForCausalLM.from_pretrained and sample.py."""
    if not ranks.distributed:
        model.save_pretrained(directory)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if ranks.main:
        model.config.to_json(os.path.join(directory, "config.json"))
        torch.save(state, os.path.join(directory, "model.pt"))


CHECKPOINT_DIR = "checkpoint"


def main(argv=None):
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    check_run_folder(args, int(os.environ.get("WORLD_SIZE", "1")) > 1)
    ranks = Ranks(args)
    device = ranks.device
    torch.manual_seed(args.seed)
    from flashgla.parallel import load_checkpoint, save_checkpoint

    data = load_bytes(args.data)
    # Each data-parallel group draws its own windows; the ranks of a CP group share theirs.
    batches = Batches(data, args.seq_len, args.batch_size, args.seed + 1000 * ranks.dp_rank)
    per_rank = -(-args.eval_batches // ranks.dp_size)  # every rank runs the same number of forwards
    eval_batches = batches.evaluation(per_rank * ranks.dp_size)[ranks.dp_rank::ranks.dp_size]
    os.makedirs(args.out, exist_ok=True)
    checkpoint = os.path.join(args.out, CHECKPOINT_DIR)
    history_path = os.path.join(args.out, "losses.json")

    model = build_model(args, ranks)
    model.train()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95))
    start, history = 0, {"train": [], "eval": []}
    if args.resume and os.path.exists(os.path.join(checkpoint, ".metadata")):
        # DCP reshards: a checkpoint of any number of ranks loads here (one process included).
        extra = load_checkpoint(checkpoint, model, optimizer, extra={"step": torch.tensor(0)})
        start = int(extra["step"])
        if os.path.exists(history_path):
            with open(history_path) as f:
                history = json.load(f)
        batches.generator.manual_seed(args.seed + 1000 * ranks.dp_rank + start)
    elif args.resume and os.path.exists(os.path.join(args.out, "model.pt")) and not ranks.distributed:
        model.load_state_dict(torch.load(os.path.join(args.out, "model.pt"), map_location=device, weights_only=True))

    if start >= args.steps:
        if ranks.main:
            print(f"nothing to do: the run in {args.out} has done {start} steps and --steps is {args.steps}; "
                  f"pass a larger --steps to train on")
        ranks.close()
        return

    config = model.config
    parameters = sum(p.numel() for p in model.parameters())
    embeddings = model.embeddings.weight.numel()
    if ranks.main:
        print(f"data: {args.data}: {len(batches.train):,} training bytes, {len(batches.val):,} held out")
        print(f"model: {parameters:,} parameters ({parameters - embeddings:,} without embeddings), "
              f"{config.num_hidden_layers} layers, hidden {config.hidden_size}, device {device}")
        if ranks.distributed:
            print(f"torchrun: {ranks.world} ranks = {ranks.dp_size} data-parallel x {ranks.cp} context-parallel, "
                  f"FSDP2 over all of them")
    step_runner = Step(model, ranks, args)
    tokens_per_step = args.batch_size * args.seq_len * ranks.dp_size
    if start == 0:
        initial = evaluate(step_runner, eval_batches, device)
        history["eval"].append({"step": 0, "loss": initial})
        if ranks.main:
            print(f"step 0: held-out loss {initial:.4f} ({initial / math.log(2):.3f} bits/byte)")

    progress = Progress(args.steps, start) if ranks.main else None
    window_tokens, window_start = 0, time.time()
    tokens_per_second = 0.0
    for step in range(start, args.steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, args)
        batch = batches.next()
        with autocast(device):
            loss = step_runner.loss(batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        window_tokens += tokens_per_step
        if step % 10 == 0 or step + 1 == args.steps:
            value = ranks.mean(loss.item(), 1.0)  # synchronises with the device, so the rate below is honest
            elapsed = time.time() - window_start
            tokens_per_second = window_tokens / elapsed if elapsed > 0 else 0.0
            window_tokens, window_start = 0, time.time()
            history["train"].append({"step": step + 1, "loss": value})
            if progress:
                progress.update(step, loss=f"{value:.4f}", lr=f"{learning_rate(step, args):.2e}",
                                tok_s=f"{tokens_per_second:,.0f}")
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            held_out = evaluate(step_runner, eval_batches, device)
            history["eval"].append({"step": step + 1, "loss": held_out})
            if progress:
                progress.close()
                peak = (f", peak {torch.cuda.max_memory_allocated(device) / 2**30:.1f} GiB on rank 0"
                        if device.type == "cuda" else "")
                print(f"step {step + 1}: held-out loss {held_out:.4f} ({held_out / math.log(2):.3f} bits/byte), "
                      f"{tokens_per_second:,.0f} tokens/s{peak}")
            save_checkpoint(checkpoint, model, optimizer, extra={"step": torch.tensor(step + 1)})
            save_plain_model(model, ranks, args.out)
            if ranks.main:
                with open(history_path, "w") as f:
                    json.dump(history, f, indent=1)
    if progress:
        progress.close()

    if ranks.main:
        if plot(history, os.path.join(args.out, "loss.png")):
            print(f"loss curve: {os.path.join(args.out, 'loss.png')}")
        else:
            print("no loss.png: matplotlib is not installed (pip install matplotlib, or pip install .[examples] "
                  "from the flashgla repository); the losses are in losses.json")
        first, last = history["eval"][0]["loss"], history["eval"][-1]["loss"]
        print(f"held-out loss {first:.4f} -> {last:.4f}; checkpoint in {args.out}")
        # Sampling needs no other rank: rank 0 reloads the full model it just wrote.
        sampler = GLAForCausalLM.from_pretrained(args.out, map_location=device) if ranks.distributed else model
        sampler.eval()
        prompt = torch.tensor([list(args.prompt.encode())], dtype=torch.long, device=device)
        generator = torch.Generator(device=device).manual_seed(args.seed)
        with autocast(device):
            out = sampler.generate(prompt, args.sample_tokens, do_sample=True, temperature=args.temperature,
                                   top_k=args.top_k, generator=generator)
        print("---- sample ----")
        print(bytes(out[0].tolist()).decode("utf-8", errors="replace"))
    ranks.close()


if __name__ == "__main__":
    main()
