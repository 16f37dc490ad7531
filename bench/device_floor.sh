#!/usr/bin/env bash
# One GPU-machine run of bench/bench_floor.py (issue #26: chunk_gla against its byte floor, FLA 0.6.0 and cuDNN).
# Carry a flashgla package built here for sm_90a and FLA's wheels, neither in the repository:
#   FLASHGLA_CUDA=ON python -m pip install --no-build-isolation --no-deps --target .gpu/site \
#     --config-settings=cmake.define.CMAKE_CUDA_ARCHITECTURES=90a .
#   python -m pip download --no-deps -d .deps/fla fla-core==0.6.0 flash-linear-attention==0.6.0 einops
# then, with carry [".gpu/site", ".deps/fla"]:  SITE=.gpu/site FLA_WHEELS=.deps/fla bash bench/device_floor.sh
# The table goes to stdout and, appended, to bench/results_floor.md (copied to $OUT).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-device_floor_out}
SITE=${SITE:-.gpu/site}
FLA_WHEELS=${FLA_WHEELS:-.deps/fla}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --target /tmp/fla "$FLA_WHEELS"/*.whl >"$OUT/pip.log" 2>&1 ||
  echo "FLA wheels not installed (see $OUT/pip.log): its columns stay empty"
PYTHONPATH="$SITE:/tmp/fla" PYTHONUNBUFFERED=1 timeout 500 python3 bench/bench_floor.py "$@" 2>&1 |
  tee "$OUT/bench_floor.log" | tail -n 12
cp bench/results_floor.md "$OUT/" 2>/dev/null
