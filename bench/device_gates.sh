#!/bin/bash
# One device-machine run of bench/bench_gates.py beside FLA 0.6.0 (issue 23, items 1 and 4), keeping FLA's
# Triton compiles and autotuning between calls (bench/fla_triton_cache.sh). In one 290 s call FLA's first
# compiles and tuning never finished both shapes; 360 + 540 s on one warm machine (the cache kept in /tmp between
# the calls) finished the d128 shape (results_gates.md).
# WARM=1 first compiles FLA's kernels in one process per case at once (the machine's cores compile in parallel;
# their autotune picks, made while they share the GPU, are not kept), so that the timed run, alone on the GPU,
# only benchmarks its autotuning's configurations.
#
#   carry [".deps", ".gpu"]: .deps/wheels holds FLA 0.6.0's wheels (scripts/fla_tests.sh says how to get
#   them); .gpu/triton_gates.tgz.part-* are an earlier call's cache (copy them there from that call's files), if
#   any.
#   SITE=/tmp/site LIMIT=420 bash bench/device_gates.sh [bench_gates.py arguments, e.g. --shapes 8x4096x16x128]
# SITE: where flashgla's package is importable (unpacked or built before this script). Leaves
# $OUT/gates.log (the table) and $OUT/triton_gates.tgz.part-* (the cache to carry next time).
set -u
OUT=${OUT:-/tmp/gates_out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/fla_site .deps/wheels/*.whl >"$OUT/pip.log" 2>&1 ||
  { echo "device_gates: FLA's wheels did not install"; tail -3 "$OUT/pip.log"; }
source bench/fla_triton_cache.sh
fla_cache_restore gates
export PYTHONPATH=${SITE:-/tmp/site}:/tmp/fla_site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
if [ "${WARM:-0}" = 1 ]; then
  for case in 0 1 2 3 4 5; do
    FLA_CACHE_RESULTS=0 timeout "${WARM_LIMIT:-300}" python3 bench/bench_gates.py --warm-fla-case $case "$@" \
      >"$OUT/warm_$case.log" 2>&1 &
  done
  wait
  echo "device_gates: FLA's compiles warmed in $SECONDS s"
fi
timeout "${LIMIT:-420}" python3 bench/bench_gates.py --no-append "$@" >"$OUT/gates.log" 2>&1
echo "bench_gates: rc $?" >>"$OUT/gates.log"
fla_cache_save gates
tail -n 20 "$OUT/gates.log"
