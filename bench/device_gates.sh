#!/bin/bash
# One device-machine run of bench/bench_gates.py beside FLA 0.6.0 (issue 23, items 1 and 4), keeping FLA's
# Triton compiles and autotuning between calls. FLA 0.6.0 asks Triton to cache its autotune results
# (FLA_CACHE_RESULTS=1, where Triton's autotune takes cache_results), and Triton caches every compiled kernel,
# both under TRITON_CACHE_DIR. A call starts from the cache an earlier call left, if one is carried, and leaves
# its own in $OUT. In one 290 s call FLA's first compiles and tuning never finished both shapes.
#
#   carry [".deps", ".gpu"]: .deps/wheels holds FLA 0.6.0's wheels (scripts/fla_tests.sh says how to get
#   them); .gpu/triton_gates.tgz is an earlier call's cache (copy it there from that call's files), if any.
#   SITE=/tmp/site LIMIT=420 bash bench/device_gates.sh [bench_gates.py arguments, e.g. --shapes 8x4096x16x128]
# SITE: where flashgla's package is importable (unpacked or built before this script). Leaves
# $OUT/gates.log (the table) and $OUT/triton_gates.tgz (the cache to carry next time).
set -u
OUT=${OUT:-/tmp/gates_out}
mkdir -p "$OUT"
CACHE_IN=${CACHE_IN:-.gpu/triton_gates.tgz}
python3 -m pip install -q --no-index --no-deps --target /tmp/fla_site .deps/wheels/*.whl >"$OUT/pip.log" 2>&1 ||
  { echo "device_gates: FLA's wheels did not install"; tail -3 "$OUT/pip.log"; }
export TRITON_CACHE_DIR=/tmp/triton_gates
mkdir -p "$TRITON_CACHE_DIR"
[ -f "$CACHE_IN" ] && tar xzf "$CACHE_IN" -C "$TRITON_CACHE_DIR" && echo "device_gates: started from $CACHE_IN"
export PYTHONPATH=${SITE:-/tmp/site}:/tmp/fla_site PYTHONUNBUFFERED=1 FLA_CACHE_RESULTS=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
timeout "${LIMIT:-420}" python3 bench/bench_gates.py --no-append "$@" >"$OUT/gates.log" 2>&1
echo "bench_gates: rc $?" >>"$OUT/gates.log"
tar czf "$OUT/triton_gates.tgz" -C "$TRITON_CACHE_DIR" .
echo "cache: $(du -h "$OUT/triton_gates.tgz" | cut -f1) (files back from \$OUT: 16 MiB each at most)"
tail -n 20 "$OUT/gates.log"
