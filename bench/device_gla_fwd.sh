#!/bin/bash
# One device-machine run for the CUDA GLA forward: build for sm_90a, the GPU
# tests, the benchmark, compute-sanitizer (memcheck, racecheck) on small
# cases; logs under $OUT, a short summary last.
#   bash bench/device_gla_fwd.sh [benchmark arguments...]
#   BUDGET=380 bash bench/device_gla_fwd.sh --quick   (the Hopper path only: see bench/notes_gla_fwd.md)
set -u
OUT=${OUT:-/tmp/gla_fwd_out}
mkdir -p "$OUT"
BUILD=${BUILD:-build-devfwd}
# The fast-path tests run first, on their own; the rest of the forward and decode tests after the benchmark.
# FAST_TESTS / TESTS override the filters (e.g. the Hopper path's tests first: see bench/notes_gla_fwd.md).
FAST_TESTS=${FAST_TESTS:-"CudaGlaForward.FastPath*:CudaGlaForward.SanitizerFastPath"}
TESTS=${TESTS:-"CudaGlaForward.*:CudaGlaDecode.*:-$FAST_TESTS"}
summary=()
note() { summary+=("$*"); echo "$*"; }
# Every step's timeout also keeps the whole run under BUDGET seconds (the device call's limit).
deadline=$(($(date +%s) + ${BUDGET:-400}))
left() { local l=$((deadline - $(date +%s))); [ "$l" -gt "$1" ] && l=$1; [ "$l" -lt 1 ] && l=1; echo $l; }

nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee "$OUT/gpu.txt"

if [ "${1:-}" = "--quick" ]; then
  # The Hopper path in about BUDGET (300) seconds: build the tests and the Python module, the Hopper tests,
  # memcheck on SanitizerHopperPath, the benchmark (bench_gla_fwd.py --quick: the warp-specialized state
  # kernel vs the first one, PDL on/off, vs FLASHGLA_GLA_HOPPER=0), racecheck, then the other forward and
  # decode tests (K > 128 takes the Hopper path by default) while time is left; a table last.
  start=$(date +%s)
  if ls .deps/wheels/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .deps/wheels/*.whl >/dev/null 2>&1 &&
      export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  fi
  cmake -S . -B $BUILD -G Ninja -DFLASHGLA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DFLASHGLA_PYTHON=ON >"$OUT/build.log" 2>&1
  timeout $(left 150) cmake --build $BUILD -j16 --target flashgla_tests flashgla_python >>"$OUT/build.log" 2>&1
  note "build: rc=$? in $(($(date +%s) - start)) s"
  grep -E "error|FAILED" "$OUT/build.log" | head -20
  start=$(date +%s)
  timeout $(left 60) $BUILD/flashgla_tests \
    --gtest_filter="CudaGlaForward.HopperPath*:CudaGlaForward.SanitizerHopperPath" >"$OUT/tests_hopper.log" 2>&1
  note "Hopper tests: rc=$? in $(($(date +%s) - start)) s: $(grep -cE '^\[       OK \]' "$OUT/tests_hopper.log") ok, $(grep -cE '^\[  FAILED  \] Cuda' "$OUT/tests_hopper.log") failed"
  grep -E '^\[       OK \]|^\[  FAILED  \]' "$OUT/tests_hopper.log" | sort -u
  grep -E "Failure|error [0-9.e+-]+|Which is|Expected|actual|What" "$OUT/tests_hopper.log" | head -20
  start=$(date +%s)
  timeout $(left 50) compute-sanitizer --tool memcheck --error-exitcode 9 $BUILD/flashgla_tests \
    --gtest_filter=CudaGlaForward.SanitizerHopperPath >"$OUT/memcheck.log" 2>&1
  note "memcheck (SanitizerHopperPath): rc=$? in $(($(date +%s) - start)) s; $(grep -m1 'ERROR SUMMARY' "$OUT/memcheck.log")"
  start=$(date +%s)
  PYTHONPATH=$BUILD/python${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 timeout $(left 90) \
    python3 bench/bench_gla_fwd.py --quick >"$OUT/bench.log" 2>&1
  note "benchmark: rc=$? in $(($(date +%s) - start)) s"
  if [ $((deadline - $(date +%s))) -gt 25 ]; then
    start=$(date +%s)
    timeout $(left 50) compute-sanitizer --tool racecheck --error-exitcode 9 $BUILD/flashgla_tests \
      --gtest_filter=CudaGlaForward.SanitizerHopperPath >"$OUT/racecheck.log" 2>&1
    note "racecheck (SanitizerHopperPath): rc=$? in $(($(date +%s) - start)) s; $(grep -m1 -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/racecheck.log")"
  else
    note "racecheck: skipped (budget)"
  fi
  if [ -n "${PROFILE:-}" ] && [ $((deadline - $(date +%s))) -gt 60 ]; then
    # Nsight Compute on one launch each of the chunk pass and the state kernel (K256 V512, bf16 gate).
    start=$(date +%s)
    cat >/tmp/gla_fwd_profile.py <<'PY'
import torch, torch.nn.functional as F, flashgla
B, T, H, K, V = 4, 4096, 4, 256, 512
q, k = (torch.randn(B, T, H, K, device="cuda", dtype=torch.bfloat16) for _ in range(2))
v = torch.randn(B, T, H, V, device="cuda", dtype=torch.bfloat16)
g = F.logsigmoid(torch.randn(B, T, H, K, device="cuda")).to(torch.bfloat16)
for _ in range(3):
    flashgla.chunk_gla(q, k, v, g)
torch.cuda.synchronize()
PY
    PYTHONPATH=$BUILD/python${PYTHONPATH:+:$PYTHONPATH} timeout $(left 80) ncu --kernel-name "regex:hopper_(prep2|ws)_kernel" \
      --launch-skip 2 --launch-count 2 --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
      --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
      python3 /tmp/gla_fwd_profile.py >"$OUT/ncu.txt" 2>&1
    note "profile: rc=$? in $(($(date +%s) - start)) s"
    grep -E "hopper_|stalled|Duration|Registers Per|Achieved Occupancy|Executed Ipc A|Issue Slots Busy|No Eligible|Compute \(SM\) Thr|Memory Thr|L2 Hit|Warp Cycles Per Issued|DRAM Thr|L1/TEX Hit|Stall" "$OUT/ncu.txt" | head -40
  fi
  if [ $((deadline - $(date +%s))) -gt 20 ]; then
    start=$(date +%s)
    timeout $(left 120) $BUILD/flashgla_tests --gtest_filter="CudaGlaForward.*:CudaGlaDecode.*:-CudaGlaForward.HopperPath*:CudaGlaForward.SanitizerHopperPath:CudaGlaForward.FastPath*:CudaGlaForward.SanitizerFastPath" \
      >"$OUT/tests_other.log" 2>&1
    note "other forward/decode tests: rc=$? in $(($(date +%s) - start)) s: $(grep -cE '^\[       OK \]' "$OUT/tests_other.log") ok, $(grep -cE '^\[  FAILED  \] Cuda' "$OUT/tests_other.log") failed (rc 124: stopped at the budget)"
    grep -E '^\[  FAILED  \]' "$OUT/tests_other.log" | sort -u | head
  fi
  echo "==== summary"
  printf '%s\n' "${summary[@]}"
  tail -n 8 "$OUT/bench.log"
  (cd "$OUT" && tar czf logs.tgz --remove-files $(ls | grep -v '^logs.tgz$'))
  exit 0
fi

start=$(date +%s)
# nanobind for the Python module, where the machine lacks it (the wheels travel in .deps).
if ls .deps/wheels/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .deps/wheels/*.whl >/dev/null 2>&1 &&
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
python_on=ON
cmake -S . -B $BUILD -G Ninja -DFLASHGLA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DFLASHGLA_PYTHON=ON \
  >"$OUT/build.log" 2>&1 || {
  python_on=OFF
  cmake -S . -B $BUILD -G Ninja -DFLASHGLA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DFLASHGLA_PYTHON=OFF \
    >>"$OUT/build.log" 2>&1
}
targets="flashgla_tests"
[ "$python_on" = ON ] && targets="flashgla_tests flashgla_python"
if ! cmake --build $BUILD -j16 --target $targets >>"$OUT/build.log" 2>&1; then
  if ! cmake --build $BUILD -j16 --target flashgla_tests >>"$OUT/build.log" 2>&1; then
    grep -E "error|FAILED" "$OUT/build.log" | head -40
    exit 1
  fi
  python_on=OFF
fi
note "build: $(($(date +%s) - start)) s, python module: $python_on"

# The fast path's own tests first (quick signal), then the benchmark, then the other forward and decode tests.
start=$(date +%s)
timeout $(left ${FAST_TIMEOUT:-90}) $BUILD/flashgla_tests --gtest_filter="$FAST_TESTS" \
  >"$OUT/tests_fast.log" 2>&1
note "fast-path tests: rc=$? in $(($(date +%s) - start)) s: $(grep -cE '^\[       OK \]' "$OUT/tests_fast.log") ok, $(grep -cE '^\[  FAILED  \] Cuda' "$OUT/tests_fast.log") failed"
grep -E "Failure|error [0-9.e+-]+|Which is|Expected|actual|What|Trace|flashgla:" "$OUT/tests_fast.log" | head -30

if [ "$python_on" = ON ]; then
  start=$(date +%s)
  PYTHONPATH=$BUILD/python${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 timeout $(left ${BENCH_TIMEOUT:-130}) python3 bench/bench_gla_fwd.py "$@" \
    >"$OUT/bench.log" 2>&1
  note "benchmark: rc=$? in $(($(date +%s) - start)) s"
else
  note "benchmark: the Python module did not build (see build.log)"
fi

start=$(date +%s)
timeout $(left ${TEST_TIMEOUT:-240}) $BUILD/flashgla_tests --gtest_filter="$TESTS" >"$OUT/tests.log" 2>&1
note "tests: rc=$? in $(($(date +%s) - start)) s: $(grep -cE '^\[       OK \]' "$OUT/tests.log") ok, $(grep -cE '^\[  FAILED  \] Cuda' "$OUT/tests.log") failed, $(grep -cE '^\[  SKIPPED \]' "$OUT/tests.log") skipped"
grep -E '^\[       OK \]|^\[  FAILED  \]|^\[  SKIPPED \]' "$OUT/tests.log" | sort -u | head -40
grep -E "Failure|error [0-9.e+-]+|Which is|Expected|actual|What|Trace|flashgla:" "$OUT/tests.log" | head -60

start=$(date +%s)
timeout $(left 60) compute-sanitizer --tool memcheck --error-exitcode 9 $BUILD/flashgla_tests \
  --gtest_filter="${MEMCHECK_TESTS:-CudaGlaForward.SanitizerFastPath}" >"$OUT/memcheck.log" 2>&1
note "memcheck: rc=$? in $(($(date +%s) - start)) s; $(grep -m1 'ERROR SUMMARY' "$OUT/memcheck.log")"
start=$(date +%s)
timeout $(left 60) compute-sanitizer --tool racecheck --error-exitcode 9 $BUILD/flashgla_tests \
  --gtest_filter="${RACECHECK_TESTS:-CudaGlaForward.SanitizerFastPath}" >"$OUT/racecheck.log" 2>&1
note "racecheck: rc=$? in $(($(date +%s) - start)) s; $(grep -m1 -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/racecheck.log")"

if [ -n "${PROFILE:-}" ] && [ "$python_on" = ON ]; then
  # Nsight Compute on one chunked-kernel launch (bf16 B8 T4096 H16 K=V=128): details and per-SASS stalls.
  start=$(date +%s)
  cat >/tmp/gla_fwd_profile.py <<'PY'
import torch, torch.nn.functional as F, flashgla
B, T, H, K, V = 8, 4096, 16, 128, 128
q, k = (torch.randn(B, T, H, K, device="cuda", dtype=torch.bfloat16) for _ in range(2))
v = torch.randn(B, T, H, V, device="cuda", dtype=torch.bfloat16)
g = F.logsigmoid(torch.randn(B, T, H, K, device="cuda")).to(torch.bfloat16)
for _ in range(3):
    flashgla.chunk_gla(q, k, v, g)
torch.cuda.synchronize()
PY
  PYTHONPATH=$BUILD/python timeout 150 ncu --kernel-name "regex:chunk_(forward|kernel)" --launch-skip 2 --launch-count 1 \
    --set full --import-source yes -f -o /tmp/chunk python3 /tmp/gla_fwd_profile.py >"$OUT/ncu_details.txt" 2>&1
  ncu -i /tmp/chunk.ncu-rep --page details >>"$OUT/ncu_details.txt" 2>&1
  ncu -i /tmp/chunk.ncu-rep --page source --csv --print-source sass >"$OUT/ncu_sass.csv" 2>&1
  note "profile: $(($(date +%s) - start)) s"
  grep -E "Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Executed Ipc A|Issue Slots Busy|No Eligible|Compute \(SM\) Thr|Memory Thr|Warp Cycles Per Issued|Bank Conflicts" "$OUT/ncu_details.txt" | head -20
fi

echo "==== summary"
printf '%s\n' "${summary[@]}"
cat "$OUT/bench.log" 2>/dev/null | tail -30
# At most 8 files come back from the device machine: one archive of the logs.
(cd "$OUT" && tar czf logs.tgz --remove-files $(ls | grep -v '^logs.tgz$'))
