#!/usr/bin/env bash
# The one command for the GPU machine. Through the device tool, with carry
# [".deps"] (prepare .deps here once with scripts/prepare_gpu_deps.sh):
#   bash scripts/gpu_check.sh
# Builds from a clean tree for the local GPU, runs every C++ test (GPU tests
# included), `flashgla check` on the GPU, compute-sanitizer memcheck and
# racecheck on the small GPU tests, installs the Python package and runs its
# tests, then the benchmarks, and prints a short table last. Logs and the benchmark result files come back
# packed in $OUT/gpu_check.tgz (the device tool returns at most 8 files).
# BENCH="ops attention" picks benchmarks (bench/bench_<name>.py; default: ops fla_api; BENCH= for none).
# AB_BASE=DIR (a source tree of an earlier commit, e.g. from `git archive`, carried along)
# also builds that tree's `flashgla` command and times both with bench/ab_cli.sh.
# PY=0 skips the Python install and tests. Wheels in .whl/ (carried) are installed too.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-gpu_check_out}
LOGS=$(mktemp -d)
mkdir -p "$OUT"
BUILD=build-gpu
ARCH=${FLASHGLA_CUDA_ARCH:-90a}
SANITIZE_FILTER=${SANITIZE_FILTER:-CudaGlaForward.Sanitizer*:CudaGlaSplit.Sanitizer*:GlaSegmentCuda.Sanitizer*:GlaNormalizeGpu.FixedLengthOffTheChunkAndOneToken:GlaNormalizeGpu.KeyAndValueOffTheVectors:CudaGlaBackwardF16.EdgeGates:CudaGlaBackward.Sanitizer*:CudaGlaEdges.Sanitizer*:CudaGlaDecode.*:AttentionCudaApi.BadDeviceBoundariesStayInBounds:Sanitizer/AttentionGenericCuda.*:AttentionGenericCudaApi.Small*:NormGpu.*:GateGpu.*:Lengths/AttentionCuda.*/13:Lengths/AttentionCuda.*/33:GroupedHeads/AttentionCuda.*/2:Varlen/AttentionCuda.*/5:Shapes/KvCacheCudaSmall.*:KvCacheCudaSmallApi.*:GlaApiOptions.*}
BENCH=${BENCH-ops fla_api}
AB_BASE=${AB_BASE:-}
PY=${PY:-1}
declare -a SUMMARY

# step NAME SECONDS COMMAND...: runs with a time limit, logs to $LOGS/NAME.log,
# records PASS/FAIL and the time, and repacks the logs (so a call cut short
# still brings back what ran).
step() {
  local name=$1 limit=$2; shift 2
  local start=$SECONDS rc=0
  timeout "$limit" "$@" >"$LOGS/$name.log" 2>&1 || rc=$?
  if [ $rc = 0 ]; then SUMMARY+=("$name|PASS|$((SECONDS - start)) s")
  elif [ $rc = 124 ]; then SUMMARY+=("$name|TIMEOUT|$((SECONDS - start)) s")
  else SUMMARY+=("$name|FAIL (rc $rc)|$((SECONDS - start)) s"); echo "== $name failed:"; tail -25 "$LOGS/$name.log"; fi
  tar czf "$OUT/gpu_check.tgz" -C "$LOGS" .
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
# Build tools the machine lacks, carried as wheels (it has no network).
# shellcheck disable=SC2046  # one word per carried wheel
python3 -m pip install -q --no-index --no-deps --target /tmp/site .deps/wheels/*.whl $(ls .whl/*.whl 2>/dev/null) &&
  export PYTHONPATH=/tmp/site

rm -rf "$BUILD"
step configure 120 cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHGLA_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES="$ARCH"
step build 400 cmake --build "$BUILD" -j"$(nproc)"
step cpp_tests "${CPP_TESTS_S:-300}" "$BUILD/flashgla_tests" --gtest_brief=1
grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests? ran" "$LOGS/cpp_tests.log" | head -8
# The FLA 0.6 options and the planner on their own (also in cpp_tests: a line of their own in the table).
step cpp_fla_plan 120 "$BUILD/flashgla_tests" --gtest_brief=1 --gtest_filter='GlaApiOptions.*:GlaPlan.*'
step cli_check 60 "$BUILD/flashgla" check
step memcheck "${SAN_S:-90}" compute-sanitizer --tool memcheck --error-exitcode 1 "$BUILD/flashgla_tests" --gtest_filter="$SANITIZE_FILTER"
step racecheck "${SAN_S:-90}" compute-sanitizer --tool racecheck --error-exitcode 1 "$BUILD/flashgla_tests" --gtest_filter="$SANITIZE_FILTER"

if [ -n "$AB_BASE" ]; then
  step ab_base_build 300 bash -c "cmake -S '$AB_BASE' -B build-ab-base -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHGLA_CUDA=ON \
    -DFLASHGLA_TESTS=OFF -DCMAKE_CUDA_ARCHITECTURES='$ARCH' >/dev/null && cmake --build build-ab-base -j$(nproc) --target flashgla_cli"
  step ab 400 bash bench/ab_cli.sh build-ab-base/flashgla "$BUILD/flashgla" "${AB_ROUNDS:-3}"
fi

if [ "$PY" = 1 ]; then
# The Python tests run against the package as a user installs it: `pip install .`
# (CUDA, this GPU's architecture) into the machine's Python, which has torch
# (the machine is thrown away after the lease), and pytest from outside the
# source tree.
step py_install 300 env CMAKE_ARGS="-DCMAKE_CUDA_ARCHITECTURES=$ARCH" FLASHGLA_CUDA=ON \
  CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" python3 -m pip install --no-build-isolation --no-deps .
step py_tests "${PY_TESTS_S:-240}" python3 -m pytest -q -p no:cacheprovider -rfs --rootdir=/tmp "$PWD/tests/python"
tail -2 "$LOGS/py_tests.log"
step py_fla_api_cuda 120 python3 -m pytest -q -p no:cacheprovider -rfs --rootdir=/tmp "$PWD/tests/python/test_fla_api.py" \
  -k cuda
tail -2 "$LOGS/py_fla_api_cuda.log"
fi

for name in $BENCH; do step "bench_$name" "${BENCH_S:-300}" python3 "bench/bench_$name.py"; done
cp bench/results*.md "$LOGS"/ 2>/dev/null
tar czf "$OUT/gpu_check.tgz" -C "$LOGS" .

echo
for name in $BENCH; do echo "== bench_$name"; tail -25 "$LOGS/bench_$name.log"; done
[ -f "$LOGS/ab.log" ] && { echo "== A/B against $AB_BASE"; cat "$LOGS/ab.log"; }
echo
printf '%-24s %-14s %s\n' step result time
for row in "${SUMMARY[@]}"; do IFS='|' read -r a b c <<<"$row"; printf '%-24s %-14s %s\n' "$a" "$b" "$c"; done
