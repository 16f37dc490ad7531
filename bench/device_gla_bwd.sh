#!/bin/bash
# One device-machine run (<= 420 s) for the CUDA GLA backward: build for sm_90a
# (tests and the Python module, in the build tree); every CudaGlaBackward test
# (chunked and recurrent) on the default path, with compute-sanitizer memcheck
# and racecheck on the small backward tests beside them; the benchmark
# (bench/bench_gla_bwd.py: ANCHORS and the model's shapes, per-kernel times,
# scans' sequence split on and off); Nsight Compute time per backward kernel.
# Logs under $OUT (logs.tgz, refreshed after each step), a short summary last.
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

start=$(date +%s)
cmake -S . -B $BUILD -G Ninja -DFLASHGLA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DFLASHGLA_PYTHON=ON >"$L/build.log" 2>&1
if ! timeout 160 cmake --build $BUILD -j16 --target flashgla_tests flashgla_python >>"$L/build.log" 2>&1; then
  grep -E "error|FAILED" "$L/build.log" | head -40
  note "build failed or timed out"
fi
note "build: $(($(date +%s) - start)) s"

# Tests on the default path; the sanitizers beside them (small cases, little GPU time).
start=$(date +%s)
timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 $BUILD/flashgla_tests \
  --gtest_filter="CudaGlaBackward.Sanitizer*" >"$L/memcheck.log" 2>&1 &
memcheck=$!
timeout 100 compute-sanitizer --tool racecheck --error-exitcode 9 $BUILD/flashgla_tests \
  --gtest_filter="CudaGlaBackward.SanitizerSmallCases" >"$L/racecheck.log" 2>&1 &
racecheck=$!
timeout 110 $BUILD/flashgla_tests --gtest_filter="CudaGlaBackward.*" >"$L/tests.log" 2>&1
note "tests: rc=$? in $(($(date +%s) - start)) s: $(counts "$L/tests.log")"
grep -E '^\[       OK \]|^\[  FAILED  \]|^\[  SKIPPED \]' "$L/tests.log" | sort -u | head -30
grep -E "Failure|Which is|Expected|actual|flashgla:|error" "$L/tests.log" | grep -v "^\[ errors" | head -30
wait $memcheck
note "memcheck: rc=$? $(counts "$L/memcheck.log"); $(grep -m1 'ERROR SUMMARY' "$L/memcheck.log")"
wait $racecheck
note "racecheck: rc=$? $(counts "$L/racecheck.log"); $(grep -m1 -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$L/racecheck.log")"

start=$(date +%s)
PYTHONPATH=$BUILD/python:/tmp/site PYTHONUNBUFFERED=1 timeout 90 python3 bench/bench_gla_bwd.py --kernels \
  --split-compare >"$L/bench.log" 2>&1
note "benchmark: rc=$? in $(($(date +%s) - start)) s"

# Nsight Compute: device time of each backward kernel (second call of each shape).
start=$(date +%s)
cat >/tmp/gla_bwd_ncu_input.py <<'PY'
import torch, torch.nn.functional as F, flashgla
bf = dict(device="cuda", dtype=torch.bfloat16)
for B, T, H, K, V in [(8, 4096, 16, 128, 128), (2, 8192, 4, 128, 256)]:
    q, k = (torch.randn(B, T, H, K, **bf).requires_grad_() for _ in range(2))
    v = torch.randn(B, T, H, V, **bf).requires_grad_()
    g = F.logsigmoid(torch.randn(B, T, H, K, device="cuda")).to(torch.bfloat16).requires_grad_()
    do = torch.randn(B, T, H, V, **bf)
    o = flashgla.chunk_gla(q, k, v, g)[0]
    for _ in range(2):
        torch.autograd.grad(o, (q, k, v, g), do, retain_graph=True)
    torch.cuda.synchronize()
PY
PYTHONPATH=$BUILD/python:/tmp/site timeout 45 ncu --kernel-name regex:"state_scan|fold_kernel|chunk_kernel" \
  --metrics gpu__time_duration.sum --csv python3 /tmp/gla_bwd_ncu_input.py >"$L/ncu.csv" 2>&1
note "ncu: rc=$? in $(($(date +%s) - start)) s"
grep -E "gpu__time_duration" "$L/ncu.csv" | awk -F'","' '{match($0, /(state_scan_kernel|fold_kernel|chunk_kernel)<[^>]*>/);
  print substr($0, RSTART, RLENGTH), $(NF - 1), $NF}' | tr -d '"' | head -20

echo "==== summary"
printf '%s\n' "${summary[@]}"
grep -E "^\| [0-9]|^- B" "$L/bench.log"
