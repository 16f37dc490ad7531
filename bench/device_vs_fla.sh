#!/bin/bash
# One device-machine run: flashgla vs FLA (bench/bench_vs_fla.py). FLA travels as a carried folder
# (not in the repository): FLA_DIR holds src/fla (a flash-linear-attention checkout's package) and
# wheels/ (einops). Builds the Python module for sm_90a; logs under $OUT, the table last.
#   FLA_DIR=.carry_fla bash bench/device_vs_fla.sh [--shapes 0,3]
set -u
OUT=${OUT:-/tmp/vs_fla_out}
mkdir -p "$OUT"
BUILD=${BUILD:-build-vsfla}
FLA_DIR=${FLA_DIR:-.carry_fla}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .deps/wheels/*.whl "$FLA_DIR"/wheels/*.whl \
  >"$OUT/pip.log" 2>&1
export PYTHONPATH=/tmp/site
start=$(date +%s)
cmake -S . -B $BUILD -G Ninja -DFLASHGLA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DFLASHGLA_PYTHON=ON \
  -DFLASHGLA_TESTS=OFF >"$OUT/build.log" 2>&1 &&
  cmake --build $BUILD -j16 --target flashgla_python >>"$OUT/build.log" 2>&1
echo "build: rc=$? in $(($(date +%s) - start)) s"
start=$(date +%s)
PYTHONPATH=$BUILD/python:/tmp/site FLA_PATH=$FLA_DIR/src PYTHONUNBUFFERED=1 \
  python3 bench/bench_vs_fla.py "$@" 2>&1 | tee "$OUT/bench.log" | tail -n 30
echo "benchmark: in $(($(date +%s) - start)) s"
cp bench/results_vs_fla.md "$OUT/" 2>/dev/null
