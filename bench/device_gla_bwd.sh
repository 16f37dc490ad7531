#!/bin/bash
# One device-machine run (<= 330 s) for the CUDA GLA backward: build for sm_90a
# (tests and the Python module, in the build tree); every CudaGlaBackward test
# (chunked and recurrent) on the default path, with compute-sanitizer memcheck
# and racecheck on the small backward tests beside them; the benchmark
# (bench/bench_gla_bwd.py: ANCHORS and the model's shapes, per-kernel times,
# A's sub-chunk pairs factored (default) and element by element, scans split
# and unsplit); then, in the time left, the 340M model's training throughput
# at T = 8192 (bench/bench_model.py, GLA vs Transformer++). Each step is cut at
# a common deadline. Logs under $OUT (logs.tgz, refreshed after each step), a
# short summary last.
#   bash bench/device_gla_bwd.sh
set -u
OUT=${OUT:-/tmp/gla_bwd_out}
L=/tmp/gla_bwd_logs
mkdir -p "$OUT" "$L"
BUILD=build-devbwd
summary=()
note() { summary+=("$*"); echo "$*"; tar czf "$OUT/logs.tgz" -C "$L" .; }
counts() {  # ok / failed / skipped tests of a gtest log
  echo "$(grep -cE '^\[       OK \]' "$1") ok, $(grep -cE '^\[  FAILED  \] Cuda' "$1") failed, $(grep -cE '^\[  SKIPPED \]' "$1") skipped"
}

nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee "$L/gpu.txt"
git_commit=$(cat COMMIT 2>/dev/null || echo unknown)
echo "tree: $git_commit" | tee -a "$L/gpu.txt"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .deps/wheels/*.whl && export PYTHONPATH=/tmp/site

deadline=$(($(date +%s) + ${BUDGET_S:-315}))
left() {  # seconds to the deadline, at most $1
  local l=$((deadline - $(date +%s)))
  echo $((l < $1 ? (l > 1 ? l : 1) : $1))
}

start=$(date +%s)
cmake -S . -B $BUILD -G Ninja -DFLASHGLA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DFLASHGLA_PYTHON=ON >"$L/build.log" 2>&1
if ! timeout $(left 170) cmake --build $BUILD -j16 --target flashgla_tests flashgla_python >>"$L/build.log" 2>&1; then
  grep -E "error|FAILED" "$L/build.log" | head -40
  note "build failed or timed out"
fi
note "build: $(($(date +%s) - start)) s"

# Tests on the default path; the sanitizers beside them (small cases, little GPU time).
start=$(date +%s)
timeout $(left 100) compute-sanitizer --tool memcheck --error-exitcode 9 $BUILD/flashgla_tests \
  --gtest_filter="CudaGlaBackward.Sanitizer*" >"$L/memcheck.log" 2>&1 &
memcheck=$!
timeout $(left 100) compute-sanitizer --tool racecheck --error-exitcode 9 $BUILD/flashgla_tests \
  --gtest_filter="CudaGlaBackward.SanitizerSmallCases" >"$L/racecheck.log" 2>&1 &
racecheck=$!
timeout $(left 100) $BUILD/flashgla_tests --gtest_filter="CudaGlaBackward.*" >"$L/tests.log" 2>&1
note "tests: rc=$? in $(($(date +%s) - start)) s: $(counts "$L/tests.log")"
grep -E '^\[       OK \]|^\[  FAILED  \]|^\[  SKIPPED \]' "$L/tests.log" | sort -u | head -30
grep -E "Failure|Which is|Expected|actual|flashgla:|error" "$L/tests.log" | grep -v "^\[ errors" | head -30
wait $memcheck
note "memcheck: rc=$? $(counts "$L/memcheck.log"); $(grep -m1 'ERROR SUMMARY' "$L/memcheck.log")"
wait $racecheck
note "racecheck: rc=$? $(counts "$L/racecheck.log"); $(grep -m1 -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$L/racecheck.log")"

start=$(date +%s)
PYTHONPATH=$BUILD/python:/tmp/site PYTHONUNBUFFERED=1 timeout $(left 110) python3 bench/bench_gla_bwd.py --kernels \
  --diag-compare --split-compare >"$L/bench.log" 2>&1
note "benchmark: rc=$? in $(($(date +%s) - start)) s"

# The model benchmark needs the whole Python package: the build tree holds only
# its top-level files, so link the sources and the built extension together.
start=$(date +%s)
mkdir -p /tmp/py/flashgla
ln -sf "$PWD"/python/flashgla/* /tmp/py/flashgla/
ln -sf "$PWD"/$BUILD/python/flashgla/_C*.so /tmp/py/flashgla/
PYTHONPATH=/tmp/py:/tmp/site PYTHONUNBUFFERED=1 timeout $(left 120) python3 bench/bench_model.py --no-append \
  --seq-lens 8192 --decode-steps 3 >"$L/model.log" 2>&1
note "model: rc=$? in $(($(date +%s) - start)) s"

echo "==== summary"
printf '%s\n' "${summary[@]}"
grep -E "^\| [0-9]|^- B" "$L/bench.log" | awk '!seen[$0]++'  # rows are printed as measured and again at the end
grep -E "train T=|decode" "$L/model.log"
