#!/bin/bash
# Whether a refactor left the device code of some CUDA files unchanged, without a GPU: compiles each file to
# PTX (sm_90a, -O3, as the build) at two commits and compares every kernel entry of the second with those of
# the first, modulo names (anonymous-namespace and file hashes and the number nvcc appends to some of them,
# basic-block numbers, the kernel's own name, so that a removed template parameter still matches). Also counts
# the kernel entries at both commits.
#   bash scripts/ptx_same.sh <old commit> <new commit> src/cuda/gla/kernels/gla_fwd_fast.cu [more .cu files]
# A file that moved between the commits is named OLD_PATH:NEW_PATH.
# Prints per file: entries old -> new, how many new entries equal an old one, and the names of those that do
# not. Slow on a small machine (a minute or more per file and commit).
# Moving kernel code into __forceinline__ functions keeps the PTX only under a few rules (src/cuda/gla/stages/
# chunk_fwd.cuh and chunk_bwd.cuh say why): the kernel declares the register arrays and aggregates (accumulators,
# fragments, gate tiles) and passes them by reference; shared-memory pointers are derived from `smem` inside the
# function as the kernel did; values the kernel computes once are passed; indices the compiler must bound are
# recomputed from threadIdx inside.
set -euo pipefail
old=$1 new=$2
shift 2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for c in "$old" "$new"; do
  mkdir -p "$work/$c" && git archive "$c" src include | tar -x -C "$work/$c"
done
for spec in "$@"; do
  f=${spec#*:}
  for c in "$old" "$new"; do
    path=$f; [ "$c" = "$old" ] && path=${spec%%:*}
    nvcc -ptx -std=c++17 --expt-relaxed-constexpr -O3 -DNDEBUG -DFLASHGLA_WITH_CUDA -arch=sm_90a \
      -I"$work/$c/src" -I"$work/$c/include" "$work/$c/$path" -o "$work/$c.$(basename "$f").ptx"
  done
  python3 - "$work/$old.$(basename "$f").ptx" "$work/$new.$(basename "$f").ptx" "$f" <<'EOF'
import collections, re, sys
hashes = re.compile(r'_GLOBAL__N__[0-9a-f]{8}_|_cu_[0-9a-f]{8}_[0-9]+|_cu_[0-9a-f]{8}|L__BB[0-9]+_|_INTERNAL_[0-9a-f]{8}_')
def entries(path):
    text = open(path).read()
    return {m.group(1): m.group(0) for m in re.finditer(r'(?:\.visible\s+)?\.entry\s+(\S+)\((.*?)\n\}\n', text, re.S)}
def norm(body, name):
    # Operand lists as inline asm spells them ('{%r1, %r2}' or '{%r1,%r2}'): PTX ignores that whitespace.
    # Blank lines (an inline asm string ending in a newline leaves one) mean nothing either.
    body = re.sub(r'\n\s*\n', '\n', body)
    return re.sub(r',[ \t]+', ',', hashes.sub('#', body.replace(name, 'NAME')))
old, new = entries(sys.argv[1]), entries(sys.argv[2])
old_bodies = collections.Counter(norm(v, k) for k, v in old.items())
new_bodies = collections.Counter(norm(v, k) for k, v in new.items())
same = sum((old_bodies & new_bodies).values())
print(f"{sys.argv[3]}: {len(old)} -> {len(new)} kernel entries; {same} of {len(new)} identical to an old one")
unmatched = new_bodies - old_bodies
for k, v in new.items():
    if unmatched[norm(v, k)]:
        print(f"  differs: {k}")
EOF
done
