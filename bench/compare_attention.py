"""Compares bench_attention.py runs of several builds made in one call (an A/B, alternating builds).

Each argument is LABEL=FILE, a `--json` output of bench_attention.py; a label given several times (the runs of one
build) counts each shape's fastest run. Prints, per shape of the fwd+bwd mode, each label's fwd+bwd milliseconds
and its backward TFLOP/s (2.5 forward passes over fwd+bwd − fwd, each build's own forward), for flashgla's default
kernels and, where the runs have it (`--deterministic`), the deterministic backward; cuDNN's from the first label.
It needs neither a GPU nor flashgla (hence its own TFLOP/s count, bench_attention.py's formula).

    python bench/compare_attention.py base=r1.json new=r2.json base=r3.json new=r4.json
"""

import argparse
import collections
import json


def tflops(row, ms, passes):
    flops = 4 * row["b"] * row["t"] ** 2 * row["h"] * row["d"] * passes / (2 if row["causal"] else 1)
    return flops / ms / 1e9


def load(pairs):
    """{label: [{(d, t, causal, mode): row}, ...]} in the order the labels first appear."""
    runs = collections.OrderedDict()
    for pair in pairs:
        label, sep, path = pair.partition("=")
        if not sep or not label or not path:
            raise SystemExit(f"compare_attention: expected LABEL=FILE, got {pair!r}")
        with open(path) as f:
            rows = json.load(f)["bench"]
        runs.setdefault(label, []).append({(r["d"], r["t"], r["causal"], r["mode"]): r for r in rows})
    return runs


def fastest(runs, key, impl):
    times = [run[key].get(impl) for run in runs if key in run and run[key].get(impl) is not None]
    return min(times) if times else None


def table(runs):
    labels = list(runs)
    first = runs[labels[0]][0]
    impls = ["flashgla"] + (["flashgla-deterministic"] if any("flashgla-deterministic" in r for r in first.values())
                            else [])
    head = ["d", "T", "mask"]
    for impl in impls:
        name = "det" if impl.endswith("deterministic") else "default"
        head += [f"{name} ms {label}" for label in labels] + [f"{name} bwd TF/s {label}" for label in labels]
    head += ["cuDNN ms"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key in sorted(k for k in first if k[3] == "fwd+bwd"):
        forward_key = key[:3] + ("fwd",)
        cells = [str(key[0]), f"{key[1] // 1024}K", "causal" if key[2] else "full"]
        for impl in impls:
            ms = [fastest(runs[label], key, impl) for label in labels]
            forward = [fastest(runs[label], forward_key, "flashgla") for label in labels]
            cells += ["—" if m is None else f"{m:.3f}" for m in ms]
            cells += ["—" if m is None or f is None else f"{tflops(first[key], m - f, 2.5):.0f}"
                      for m, f in zip(ms, forward)]
        cudnn = fastest(runs[labels[0]], key, "sdpa-cudnn")
        cells.append("—" if cudnn is None else f"{cudnn:.3f}")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="LABEL=FILE, a bench_attention.py --json output")
    print("\n".join(table(load(parser.parse_args().runs))))


if __name__ == "__main__":
    main()
