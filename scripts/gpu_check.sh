#!/usr/bin/env bash
# The one command for the GPU machine (run through the device tool with
# carry [".deps"]; prepare .deps here once with scripts/prepare_gpu_deps.sh):
# builds from a clean tree for the local GPU, runs every C++ test (GPU tests
# included), compute-sanitizer memcheck and racecheck on a small filter, the
# Python tests and the benchmarks, and prints a short table last.
# Logs go to $OUT (or ./gpu_check_out).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_check_out}
mkdir -p "$OUT"
BUILD=build-gpu
ARCH=${FLASHGLA_CUDA_ARCH:-90a}
SANITIZE_FILTER=${SANITIZE_FILTER:-*Cuda*Small*}
declare -a SUMMARY

step() {  # step NAME COMMAND...: runs, logs to $OUT/NAME.log, records PASS/FAIL
  local name=$1; shift
  local start=$SECONDS
  if "$@" >"$OUT/$name.log" 2>&1; then SUMMARY+=("$name|PASS|$((SECONDS - start)) s")
  else SUMMARY+=("$name|FAIL (rc $?)|$((SECONDS - start)) s"); tail -25 "$OUT/$name.log"; fi
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"

rm -rf "$BUILD"
step configure cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHGLA_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES="$ARCH"
step build cmake --build "$BUILD" -j"$(nproc)"
step cpp_tests "$BUILD/flashgla_tests" --gtest_brief=1
grep -E "^\[  (PASSED|FAILED|SKIPPED) " "$OUT/cpp_tests.log" | head -5
step cli_check "$BUILD/flashgla" check
step memcheck compute-sanitizer --tool memcheck --error-exitcode 1 "$BUILD/flashgla_tests" --gtest_filter="$SANITIZE_FILTER"
step racecheck compute-sanitizer --tool racecheck --error-exitcode 1 "$BUILD/flashgla_tests" --gtest_filter="$SANITIZE_FILTER"

# Python package with the CUDA backend (build tools carried as wheels: no network there).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .deps/wheels/*.whl && export PYTHONPATH=/tmp/site
step py_install env CMAKE_ARGS="-DCMAKE_CUDA_ARCHITECTURES=$ARCH" FLASHGLA_CUDA=ON \
  python3 -m pip install --no-build-isolation --no-deps -q .
step py_tests python3 -m pytest -q tests/python
tail -3 "$OUT/py_tests.log"

for bench in bench/bench_*.py; do
  [ -f "$bench" ] && step "$(basename "$bench" .py)" python3 "$bench"
done

echo
for bench in "$OUT"/bench_*.log; do [ -f "$bench" ] && { echo "== $bench"; tail -30 "$bench"; }; done
echo
printf '%-22s %-14s %s\n' step result time
for row in "${SUMMARY[@]}"; do IFS='|' read -r a b c <<<"$row"; printf '%-22s %-14s %s\n' "$a" "$b" "$c"; done
