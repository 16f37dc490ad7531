#!/bin/bash
# One device-machine run for the split's states kernel (bench/notes_gla_fwd.md, "Long sequences: the states
# kernel"): build for sm_90a, its tests and the split/fast-path/Hopper-split tests, memcheck and racecheck on
# its small cases, the benchmark (pieces, SDPA), logs under $OUT, a short summary last.
#   BUDGET=400 bash bench/device_gla_fwd_split.sh
# SPLIT_TESTS / OTHER_TESTS override the test filters.
set -u
OUT=${OUT:-/tmp/gla_fwd_split_out}
mkdir -p "$OUT"
BUILD=${BUILD:-build-devsplit}
SPLIT_TESTS=${SPLIT_TESTS:-"CudaGlaSplit.*"}
# The whole forward suite then runs as it is (the states kernel is the default: every split it plans goes
# through it).
OTHER_TESTS=${OTHER_TESTS:-"CudaGlaForward.*:CudaGlaDecode.*"}
summary=()
note() { summary+=("$*"); echo "$*"; }
deadline=$(($(date +%s) + ${BUDGET:-400}))
left() { local l=$((deadline - $(date +%s))); [ "$l" -gt "$1" ] && l=$1; [ "$l" -lt 1 ] && l=1; echo $l; }
count() { echo "$(grep -cE '^\[       OK \]' "$1") ok, $(grep -cE '^\[  FAILED  \] Cuda' "$1") failed, $(grep -cE '^\[  SKIPPED \]' "$1") skipped"; }

nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee "$OUT/gpu.txt"
start=$(date +%s)
if ls .deps/wheels/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .deps/wheels/*.whl >/dev/null 2>&1 &&
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
cmake -S . -B $BUILD -G Ninja -DFLASHGLA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DFLASHGLA_PYTHON=ON >"$OUT/build.log" 2>&1
timeout $(left 170) cmake --build $BUILD -j16 --target flashgla_tests flashgla_python >>"$OUT/build.log" 2>&1
note "build: rc=$? in $(($(date +%s) - start)) s"
grep -E "error" "$OUT/build.log" | head -10

start=$(date +%s)
timeout $(left 60) $BUILD/flashgla_tests --gtest_filter="$SPLIT_TESTS" >"$OUT/tests_split.log" 2>&1
note "states-kernel tests: rc=$? in $(($(date +%s) - start)) s: $(count "$OUT/tests_split.log")"
grep -E '^\[       OK \]|^\[  FAILED  \]' "$OUT/tests_split.log" | sort -u
grep -E "Failure|rel|Which is|Expected|actual|splits=" "$OUT/tests_split.log" | head -20

start=$(date +%s)
timeout $(left 50) compute-sanitizer --tool memcheck --error-exitcode 9 $BUILD/flashgla_tests \
  --gtest_filter=CudaGlaSplit.SanitizerStatesKernel >"$OUT/memcheck.log" 2>&1
note "memcheck (SanitizerStatesKernel): rc=$? in $(($(date +%s) - start)) s; $(grep -m1 'ERROR SUMMARY' "$OUT/memcheck.log")"

start=$(date +%s)
PYTHONPATH=$BUILD/python${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 timeout $(left 90) \
  python3 bench/bench_gla_fwd_split.py >"$OUT/bench.log" 2>&1
note "benchmark: rc=$? in $(($(date +%s) - start)) s"

start=$(date +%s)
timeout $(left 60) compute-sanitizer --tool racecheck --error-exitcode 9 $BUILD/flashgla_tests \
  --gtest_filter=CudaGlaSplit.SanitizerStatesKernel >"$OUT/racecheck.log" 2>&1
note "racecheck (SanitizerStatesKernel): rc=$? in $(($(date +%s) - start)) s; $(grep -m1 -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/racecheck.log")"

if [ $((deadline - $(date +%s))) -gt 20 ]; then
  start=$(date +%s)
  timeout $(left 100) $BUILD/flashgla_tests --gtest_filter="$OTHER_TESTS" >"$OUT/tests_other.log" 2>&1
  note "forward + decode suite (default path): rc=$? in $(($(date +%s) - start)) s: $(count "$OUT/tests_other.log")"
  grep -E '^\[  FAILED  \]' "$OUT/tests_other.log" | sort -u
else
  note "other tests: skipped (budget)"
fi

echo "==== summary"
printf '%s\n' "${summary[@]}"
grep -E "^\|" "$OUT/bench.log" | tail -n 30
(cd "$OUT" && tar czf logs.tgz --remove-files $(ls | grep -v '^logs.tgz$'))
exit 0
