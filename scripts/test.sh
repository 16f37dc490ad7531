#!/usr/bin/env bash
# Builds flashgla and runs every test: the C++ tests (GoogleTest under CTest),
# `flashgla check` at its default shape, and the Python tests. GPU tests run
# where a GPU is present and are counted as skipped otherwise; the last lines
# say how many tests passed and how many were skipped.
# The CUDA backend is built when a GPU is visible and nvcc found, or with
# FLASHGLA_CUDA=ON (scripts/cuda_choice.sh); the first line says which.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/cuda_choice.sh
flashgla_choose_cuda scripts/test.sh
bash scripts/install_deps.sh

BUILD=${FLASHGLA_BUILD_DIR:-build}
JOBS=${FLASHGLA_JOBS:-$(nproc)}
LOGS="$BUILD/test-logs"

cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHGLA_CUDA="$FLASHGLA_CUDA_BUILD" \
  ${FLASHGLA_CMAKE_ARGS:-}
cmake --build "$BUILD" -j"$JOBS"
mkdir -p "$LOGS"

# CTest's summary counts a skipped test (GTEST_SKIP) as passed: scripts/ctest_summary.awk rewrites it
# as "CTest: N passed, N skipped, N failed out of N" and leaves the skipped tests' names to the log.
ctest --test-dir "$BUILD" --output-on-failure -j"$JOBS" 2>&1 | tee "$LOGS/ctest.log" |
  awk -v logfile="$LOGS/ctest.log" -f scripts/ctest_summary.awk
cpp_total=$(grep -oE 'tests passed.* out of [0-9]+' "$LOGS/ctest.log" | tail -n 1 | grep -oE '[0-9]+$' || echo 0)
cpp_failed=$(grep -oE '[0-9]+ tests? failed' "$LOGS/ctest.log" | tail -n 1 | grep -oE '^[0-9]+' || echo 0)
cpp_skipped=$(grep -cE ' \(Skipped\)$' "$LOGS/ctest.log" || true)
cpp_passed=$((cpp_total - cpp_failed - cpp_skipped))

"$BUILD/flashgla" check

py_passed=0 py_skipped=0 py_failed=0
if [ -f scripts/test_python.sh ]; then
  bash scripts/test_python.sh 2>&1 | tee "$LOGS/pytest.log"
  py_line=$(grep -E '[0-9]+ (passed|failed|skipped)' "$LOGS/pytest.log" | tail -n 1)
  count() { echo "$py_line" | grep -oE "[0-9]+ $1" | grep -oE '^[0-9]+' || echo 0; }
  py_passed=$(count passed) py_skipped=$(count skipped) py_failed=$(count failed)
fi

why=""
flashgla_gpu_visible || why=" (GPU tests: no GPU visible)"
echo
echo "Summary"
echo "  C++ (CTest):    $cpp_passed passed, $cpp_skipped skipped$why, $cpp_failed failed"
echo "  flashgla check: passed"
echo "  Python:         $py_passed passed, $py_skipped skipped$why, $py_failed failed"
# The last line in the plain form CI reads ("N passed, N failed, N skipped"), alone on its line.
[ -n "$why" ] && echo "  skipped:$why"
echo "$((cpp_passed + py_passed)) passed, $((cpp_failed + py_failed)) failed, $((cpp_skipped + py_skipped)) skipped"
