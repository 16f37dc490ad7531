#!/usr/bin/env bash
# One GPU-machine run of bench/bench_floor.py (issue #26: chunk_gla against its byte floor, FLA 0.6.0 and cuDNN).
# Carry a flashgla package built here for sm_90a and FLA's wheels, neither in the repository:
#   FLASHGLA_CUDA=ON python -m pip install --no-build-isolation --no-deps --target .gpu/site \
#     --config-settings=cmake.define.CMAKE_CUDA_ARCHITECTURES=90a .
#   python -m pip download --no-deps -d .deps/fla fla-core==0.6.0 flash-linear-attention==0.6.0 einops
# then, with carry [".gpu/site", ".deps/fla"] (and .gpu/triton_floor.tgz.part-*, an earlier call's FLA cache,
# where there is one: bench/fla_triton_cache.sh):  SITE=.gpu/site FLA_WHEELS=.deps/fla bash bench/device_floor.sh
# WARM=1 first runs FLA once per anchor shape, one process per shape at once, so that its Triton compiles use the
# machine's cores together (the picks their autotuning makes while they share the GPU are not kept); the timed
# run then only benchmarks the configurations. The table goes to stdout and, appended, to bench/results_floor.md
# (copied to $OUT), with the cache for the next call.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-device_floor_out}
SITE=${SITE:-.gpu/site}
FLA_WHEELS=${FLA_WHEELS:-.deps/fla}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --target /tmp/fla "$FLA_WHEELS"/*.whl >"$OUT/pip.log" 2>&1 ||
  echo "FLA wheels not installed (see $OUT/pip.log): its columns stay empty"
source bench/fla_triton_cache.sh
fla_cache_restore floor
export PYTHONPATH="$SITE:/tmp/fla" PYTHONUNBUFFERED=1
if [ "${WARM:-0}" = 1 ]; then
  for shape in 0 1 2 3 4 5; do
    FLA_CACHE_RESULTS=0 timeout "${WARM_LIMIT:-300}" python3 bench/bench_floor.py --warm-fla-shape $shape \
      >"$OUT/warm_$shape.log" 2>&1 &
  done
  wait
  echo "device_floor: FLA's compiles warmed in $SECONDS s"
fi
timeout "${LIMIT:-500}" python3 bench/bench_floor.py "$@" 2>&1 | tee "$OUT/bench_floor.log" | tail -n 12
cp bench/results_floor.md "$OUT/" 2>/dev/null
fla_cache_save floor
