#!/bin/bash
# One device-machine run for the CUDA GLA backward: build for sm_90a (tests and
# the Python module, in the build tree), the backward GPU tests,
# compute-sanitizer (memcheck, racecheck) on the small backward tests, the
# benchmark (bench/bench_gla_bwd.py) and Nsight Compute on the backward
# kernels at B8 T4096 H16 K=V=128; logs under $OUT, a short summary last.
#   bash bench/device_gla_bwd.sh            (PROFILE=0 skips Nsight Compute)
# REF_TREE=<dir>: also build the Python module of another source tree (an
# earlier version) and run the same benchmark on it, in this call, to compare.
set -u
OUT=${OUT:-/tmp/gla_bwd_out}
L=/tmp/gla_bwd_logs  # logs, packed into $OUT/logs.tgz after each step (few files come back)
mkdir -p "$OUT" "$L"
BUILD=build-devbwd
TESTS="CudaGlaBackward.*"
summary=()
note() { summary+=("$*"); echo "$*"; tar czf "$OUT/logs.tgz" -C "$L" .; }

nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee "$L/gpu.txt"
# nanobind and scikit-build-core are carried as wheels (the machine has no network).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .deps/wheels/*.whl && export PYTHONPATH=/tmp/site

start=$(date +%s)
cmake -S . -B $BUILD -G Ninja -DFLASHGLA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DFLASHGLA_PYTHON=ON >"$L/build.log" 2>&1
if ! cmake --build $BUILD -j16 --target flashgla_tests flashgla_python >>"$L/build.log" 2>&1; then
  grep -E "error|FAILED" "$L/build.log" | head -40
  note "build failed"
fi
note "build: $(($(date +%s) - start)) s"

start=$(date +%s)
timeout 150 $BUILD/flashgla_tests --gtest_filter="$TESTS" >"$L/tests.log" 2>&1
note "tests: rc=$? in $(($(date +%s) - start)) s: $(grep -cE '^\[       OK \]' "$L/tests.log") ok, $(grep -cE '^\[  FAILED  \] Cuda' "$L/tests.log") failed, $(grep -cE '^\[  SKIPPED \]' "$L/tests.log") skipped"
grep -E '^\[       OK \]|^\[  FAILED  \]|^\[  SKIPPED \]' "$L/tests.log" | sort -u | head -30
grep -E "Failure|Which is|Expected|actual|flashgla:|error" "$L/tests.log" | grep -v "^\[ errors" | head -30

# The chunked tests again with A's pairs inside sub-chunks through the products (opt-in).
start=$(date +%s)
FLASHGLA_GLA_BWD_DIAG=factored timeout 100 $BUILD/flashgla_tests \
  --gtest_filter="CudaGlaBackward.Chunked*:CudaGlaBackward.Varlen*:CudaGlaBackward.Strided*:CudaGlaBackward.State*:CudaGlaBackward.LongSequence*" \
  >"$L/tests_factored.log" 2>&1
note "tests (FLASHGLA_GLA_BWD_DIAG=factored): rc=$? in $(($(date +%s) - start)) s: $(grep -cE '^\[       OK \]' "$L/tests_factored.log") ok, $(grep -cE '^\[  FAILED  \] Cuda' "$L/tests_factored.log") failed"

start=$(date +%s)
PYTHONPATH=$BUILD/python:/tmp/site PYTHONUNBUFFERED=1 timeout 120 python3 bench/bench_gla_bwd.py --kernels \
  >"$L/bench.log" 2>&1
note "benchmark: rc=$? in $(($(date +%s) - start)) s"
start=$(date +%s)
FLASHGLA_GLA_BWD_DIAG=factored PYTHONPATH=$BUILD/python:/tmp/site PYTHONUNBUFFERED=1 timeout 100 \
  python3 bench/bench_gla_bwd.py --kernels >"$L/bench_factored.log" 2>&1
note "benchmark (FLASHGLA_GLA_BWD_DIAG=factored): rc=$? in $(($(date +%s) - start)) s"

if [ -n "${REF_TREE:-}" ]; then
  start=$(date +%s)
  cmake -S "$REF_TREE" -B "$REF_TREE/build-ref" -G Ninja -DFLASHGLA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
    -DFLASHGLA_PYTHON=ON -DFLASHGLA_TESTS=OFF >"$L/build_ref.log" 2>&1 &&
    cmake --build "$REF_TREE/build-ref" -j16 --target flashgla_python >>"$L/build_ref.log" 2>&1 &&
    PYTHONPATH=$REF_TREE/build-ref/python:/tmp/site PYTHONUNBUFFERED=1 timeout 100 \
      python3 bench/bench_gla_bwd.py --kernels >"$L/bench_ref.log" 2>&1
  note "benchmark of $REF_TREE: rc=$? in $(($(date +%s) - start)) s"
fi

start=$(date +%s)
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 $BUILD/flashgla_tests \
  --gtest_filter="CudaGlaBackward.Sanitizer*" >"$L/memcheck.log" 2>&1
note "memcheck: rc=$? in $(($(date +%s) - start)) s; $(grep -m1 'ERROR SUMMARY' "$L/memcheck.log")"
start=$(date +%s)
timeout 60 compute-sanitizer --tool racecheck --error-exitcode 9 $BUILD/flashgla_tests \
  --gtest_filter="CudaGlaBackward.SanitizerSmallCases" >"$L/racecheck.log" 2>&1
note "racecheck: rc=$? in $(($(date +%s) - start)) s; $(grep -m1 -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$L/racecheck.log")"

if [ "${PROFILE:-1}" != 0 ]; then
  # Nsight Compute on the backward kernels of one call (bf16 B8 T4096 H16 K=V=128):
  # a summary of both kernels, then the full set with per-SASS stalls for the chunk kernel.
  start=$(date +%s)
  cat >/tmp/gla_bwd_ncu_input.py <<'PY'
import torch, torch.nn.functional as F, flashgla
B, T, H, K, V = 8, 4096, 16, 128, 128
bf = dict(device="cuda", dtype=torch.bfloat16)
q, k = (torch.randn(B, T, H, K, **bf).requires_grad_() for _ in range(2))
v = torch.randn(B, T, H, V, **bf).requires_grad_()
g = F.logsigmoid(torch.randn(B, T, H, K, device="cuda")).to(torch.bfloat16).requires_grad_()
do = torch.randn(B, T, H, V, **bf)
o = flashgla.chunk_gla(q, k, v, g)[0]
for _ in range(2):
    torch.autograd.grad(o, (q, k, v, g), do, retain_graph=True)
torch.cuda.synchronize()
PY
  export PYTHONPATH=$BUILD/python:/tmp/site
  timeout 100 ncu --kernel-name regex:"state_scan|chunk_kernel" --launch-skip 2 --launch-count 2 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section SchedulerStats \
    --section WarpStateStats --section MemoryWorkloadAnalysis -f -o /tmp/bwd python3 /tmp/gla_bwd_ncu_input.py \
    >"$L/ncu.txt" 2>&1
  ncu -i /tmp/bwd.ncu-rep --page details >>"$L/ncu.txt" 2>&1
  timeout 120 ncu --kernel-name regex:chunk_kernel --launch-skip 1 --launch-count 1 --set full --import-source yes \
    -f -o /tmp/chunk python3 /tmp/gla_bwd_ncu_input.py >"$L/ncu_chunk.txt" 2>&1
  ncu -i /tmp/chunk.ncu-rep --page details >>"$L/ncu_chunk.txt" 2>&1
  ncu -i /tmp/chunk.ncu-rep --page source --csv --print-source cuda,sass >"$L/ncu_chunk_source.csv" 2>&1 ||
    ncu -i /tmp/chunk.ncu-rep --page source --csv --print-source sass >"$L/ncu_chunk_source.csv" 2>&1
  gzip -f "$L/ncu_chunk_source.csv"
  note "profile: $(($(date +%s) - start)) s"
  grep -E "^  [a-zA-Z_:() ]*(state_scan|chunk_kernel)|Duration|Registers Per|Achieved Occupancy|Compute \(SM\) Thr|Memory Thr|DRAM Thr|Warp Cycles Per Issued|Issue Slots Busy" "$L/ncu.txt" | head -30
fi

echo "==== summary"
printf '%s\n' "${summary[@]}"
for log in bench_ref bench_factored bench; do
  [ -f "$L/$log.log" ] && { echo "== $log"; grep -E "^\| [0-9]|^- B" "$L/$log.log"; }
done
