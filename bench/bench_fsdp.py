#!/usr/bin/env python3
"""The 340M GLA LM across GPUs: FSDP2 weak scaling and context-parallel training at long context.

    python bench/bench_fsdp.py --gpus 1,2,4                  # FSDP2 weak scaling, 16K tokens per GPU
    python bench/bench_fsdp.py --mode cp --gpus 4            # CP over 4 GPUs at 256K, 512K and 1M tokens
    python bench/bench_fsdp.py --gpus 1,2 --trace /tmp/tr    # plus a profiler trace of rank 0 per run

The driver (this command) starts `torchrun --nproc_per_node N` for each N of --gpus, collects what
rank 0 of each run measured, prints one table and appends it, dated with the card and the GPU
counts, to bench/results_multi_gpu.md.

fsdp mode, per GPU count, the variants (same model, data, bf16 compute, AdamW; --tokens-per-gpu
tokens per GPU and step as batch x --seq-len):
- plain (1 GPU only): no FSDP, fp32 weights under bf16 autocast (bench_model.py's setting);
- tuned: flashgla.parallel.parallelize with its defaults (embedding unit of its own, 4 blocks per unit,
  explicit one-ahead prefetch in forward and backward, last unit kept gathered), fused AdamW.
The variants measured before the defaults were chosen (torch's fully_shard per block, "probe"; no
reshard after forward, "tuned-noreshard"; one block per unit) are in results_multi_gpu.md.
Efficiency = tokens/s per GPU over the same variant's on 1 GPU (weak scaling), and over plain's on
1 GPU (what sharding costs against not sharding at all).

cp mode: one sequence of --contexts tokens split over all GPUs of the run ("dp_shard" 1 x "cp" N;
FSDP over the same ranks), every block checkpointed, chunked LM cross-entropy; tokens/s and peak
memory per context.
"""

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results_multi_gpu.md")

MODEL_340M = dict(vocab_size=32000, hidden_size=1024, num_hidden_layers=24, num_heads=4)
MODEL_TINY = dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_heads=2)
VARIANTS = ("plain", "tuned")


# ---- worker (one rank of a torchrun) ----------------------------------------------------------------------

def worker(args):
    import torch
    import torch.distributed as dist

    from flashgla.distributed import build_cp_context, local_slice
    from flashgla.parallel import compile_blocks, init_mesh, parallelize
    from flashgla.models import GLAConfig, GLAForCausalLM

    cuda = torch.cuda.is_available() and not args.cpu
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    config = GLAConfig(**(MODEL_TINY if args.tiny else MODEL_340M))
    results = []

    def synchronize():
        if cuda:
            torch.cuda.synchronize(device)

    def peak_gib():
        value = torch.tensor([torch.cuda.max_memory_allocated(device) / 2**30 if cuda else float("nan")],
                             device=device)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return value.item()

    def timed(step, steps, warmup, trace_name):
        for _ in range(warmup):
            step()
        synchronize()
        dist.barrier()
        profiler = None
        if args.trace and rank == 0:
            profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU] +
                                              ([torch.profiler.ProfilerActivity.CUDA] if cuda else []))
            profiler.__enter__()
        start = time.perf_counter()
        for _ in range(steps):
            step()
        synchronize()
        elapsed = time.perf_counter() - start
        if profiler is not None:
            profiler.__exit__(None, None, None)
            os.makedirs(args.trace, exist_ok=True)
            profiler.export_chrome_trace(os.path.join(args.trace, f"{trace_name}-{world}gpu.json"))
        slowest = torch.tensor([elapsed], device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        return slowest.item()

    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda)

    if args.mode == "fsdp":
        seq_len = args.seq_len
        batch = max(1, args.tokens_per_gpu // seq_len)
        g = torch.Generator().manual_seed(1 + rank)
        ids = torch.randint(0, config.vocab_size, (batch, seq_len + 1), generator=g).to(device)
        for variant in args.variants:
            if variant == "plain" and world > 1:
                continue
            torch.manual_seed(0)
            model = GLAForCausalLM(config).to(device)
            if args.compile:  # before sharding, as parallelize(compile=True) does: every variant alike
                compile_blocks(model)
            if variant != "plain":
                units = {} if args.blocks_per_unit is None else dict(blocks_per_unit=args.blocks_per_unit)
                parallelize(model, init_mesh(device.type), **units)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=cuda or None)
            if cuda:
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(device)

            def step():
                with autocast:
                    loss = model(ids, labels=ids).loss
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()

            elapsed = timed(step, args.steps, args.warmup, variant)
            tokens = batch * seq_len * args.steps
            results.append(dict(mode="fsdp", variant=variant, gpus=world, seq_len=seq_len, batch=batch,
                                tokens_per_s_per_gpu=tokens / elapsed, tokens_per_s=tokens * world / elapsed,
                                peak_gib=peak_gib()))
            del model, optimizer
    else:
        mesh = init_mesh(device.type, cp=world)
        group = mesh["cp"].get_group()
        for context in args.contexts:
            torch.manual_seed(0)
            model = GLAForCausalLM(config).to(device)
            parallelize(model, mesh, activation_checkpointing=True, loss_chunk_size=args.loss_chunk_size)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=cuda or None)
            g = torch.Generator().manual_seed(7)  # the same sequence on every rank; each takes its part
            ids = torch.randint(0, config.vocab_size, (1, context), generator=g)
            cu = torch.tensor([0, context], dtype=torch.int32)
            ctx = build_cp_context(cu.to(device), group, conv1d_kernel_size=None, cu_seqlens_cpu=cu)
            local_ids = local_slice(ids, ctx).to(device)
            local_labels = local_ids  # labels = input_ids: the model shifts them, across the ranks too
            if cuda:
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(device)

            def step():
                with autocast:
                    loss = model(local_ids, labels=local_labels, cp_context=ctx).loss
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()

            try:
                elapsed = timed(step, args.steps, args.warmup, f"cp{context}")
                results.append(dict(mode="cp", variant="cp", gpus=world, context=context,
                                    tokens_per_s=context * args.steps / elapsed,
                                    tokens_per_s_per_gpu=context * args.steps / elapsed / world, peak_gib=peak_gib()))
            except torch.cuda.OutOfMemoryError:
                results.append(dict(mode="cp", variant="cp", gpus=world, context=context, oom=True))
            del model, optimizer
    if rank == 0:
        with open(args.json, "w") as f:
            json.dump(dict(card=torch.cuda.get_device_name(device) if cuda else "CPU", torch=torch.__version__,
                           results=results), f)
    dist.barrier()
    dist.destroy_process_group()


# ---- driver -----------------------------------------------------------------------------------------------

def table(runs, mode):
    base = {r["variant"]: r["tokens_per_s_per_gpu"] for r in runs if r["gpus"] == 1 and "tokens_per_s_per_gpu" in r}
    if mode == "fsdp":
        lines = ["| variant | GPUs | T | batch/GPU | tokens/s | tokens/s per GPU | efficiency vs 1 GPU | vs plain 1 GPU "
                 "| peak GiB |", "|---|---|---|---|---|---|---|---|---|"]
        for r in sorted(runs, key=lambda r: (VARIANTS.index(r["variant"]), r["gpus"])):
            eff = r["tokens_per_s_per_gpu"] / base[r["variant"]] if r["variant"] in base else float("nan")
            plain = r["tokens_per_s_per_gpu"] / base["plain"] if "plain" in base else float("nan")
            lines.append(f"| {r['variant']} | {r['gpus']} | {r['seq_len']} | {r['batch']} | {r['tokens_per_s']:,.0f} | "
                         f"{r['tokens_per_s_per_gpu']:,.0f} | {eff:.0%} | {plain:.0%} | {r['peak_gib']:.1f} |")
    else:
        lines = ["| GPUs | context | tokens/s | tokens/s per GPU | peak GiB |", "|---|---|---|---|---|"]
        for r in sorted(runs, key=lambda r: (r["gpus"], r["context"])):
            if r.get("oom"):
                lines.append(f"| {r['gpus']} | {r['context']:,} | out of memory | | |")
            else:
                lines.append(f"| {r['gpus']} | {r['context']:,} | {r['tokens_per_s']:,.0f} | "
                             f"{r['tokens_per_s_per_gpu']:,.0f} | {r['peak_gib']:.1f} |")
    return "\n".join(lines) + "\n"


def driver(args, argv):
    runs, card, torch_version = [], "?", "?"
    for gpus in args.gpus:
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "rank0.json")
            command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={gpus}",
                       os.path.abspath(__file__), "--worker", "--json", out, *argv]
            print("$ " + " ".join(command), flush=True)
            done = subprocess.run(command, timeout=args.timeout)
            if done.returncode != 0 or not os.path.exists(out):
                raise SystemExit(f"bench_fsdp: the run on {gpus} GPUs failed (exit code {done.returncode})")
            with open(out) as f:
                data = json.load(f)
            card, torch_version = data["card"], data["torch"]
            runs += data["results"]
    text = table(runs, args.mode)
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    if args.mode == "fsdp":
        what = f"FSDP2 weak scaling, {args.tokens_per_gpu} tokens per GPU, T = {args.seq_len}"
    else:
        what = f"context parallelism (block checkpointing, chunked CE of {args.loss_chunk_size} tokens)"
    if args.compile:
        what += ", blocks compiled"
    if args.blocks_per_unit is not None:
        what += f", {args.blocks_per_unit} blocks per FSDP unit"
    model = "tiny GLA LM (smoke test)" if args.tiny else "340M GLA LM"
    title = (f"## {stamp}, {card} x {','.join(str(g) for g in args.gpus)} GPUs, torch {torch_version}: {model}, "
             f"{what}, {args.steps} timed steps after {args.warmup}\n\n")
    print("\n" + title + text)
    if not args.no_append:
        new_file = not os.path.exists(args.results)
        with open(args.results, "a") as f:
            if new_file:
                f.write("# Multi-GPU results (bench/bench_fsdp.py; bench/bench_cp.py has the op-level ones)\n\n")
            f.write(title + text + "\n")
        print(f"appended to {args.results}")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=["fsdp", "cp"], default="fsdp")
    p.add_argument("--gpus", type=lambda s: [int(x) for x in s.split(",")], default=None,
                   help="GPU counts, one torchrun each (default 1,2,4 for fsdp, 4 for cp)")
    p.add_argument("--variants", type=lambda s: s.split(","), default=list(VARIANTS))
    p.add_argument("--tokens-per-gpu", type=int, default=16384)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--contexts", type=lambda s: [int(x) for x in s.split(",")], default=[262144, 524288, 1048576])
    p.add_argument("--loss-chunk-size", type=int, default=8192)
    p.add_argument("--steps", type=int, default=None, help="timed steps (default 10 fsdp, 3 cp)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 3 fsdp, 1 cp)")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile each block's forward (flashgla.parallel.compile_blocks), every variant")
    p.add_argument("--blocks-per-unit", type=int, default=None,
                   help="parallelize's blocks_per_unit (default: parallelize's own)")
    p.add_argument("--trace", default=None, help="directory for a profiler trace of rank 0's timed steps")
    p.add_argument("--tiny", action="store_true", help="a tiny model (smoke test; runs on CPUs with gloo)")
    p.add_argument("--cpu", action="store_true", help="gloo on the CPU even with GPUs (smoke test)")
    p.add_argument("--timeout", type=int, default=600, help="seconds per torchrun")
    p.add_argument("--results", default=RESULTS)
    p.add_argument("--no-append", action="store_true", help="print only; leave the results file alone")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--json", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    bad = [v for v in args.variants if v not in VARIANTS]
    if bad:
        raise SystemExit(f"bench_fsdp: --variants: unknown {bad}; expected some of {list(VARIANTS)}")
    if args.gpus is None:
        args.gpus = [1, 2, 4] if args.mode == "fsdp" else [4]
    if args.steps is None:
        args.steps = 10 if args.mode == "fsdp" else 3
    if args.warmup is None:
        args.warmup = 3 if args.mode == "fsdp" else 1
    if args.worker:
        worker(args)
    else:
        driver(args, argv)


if __name__ == "__main__":
    main()
