#!/bin/bash
# One device-machine run for the CUDA GLA backward: build for sm_90a (tests and
# the Python module); every CudaGlaBackward test (chunked and recurrent: the
# default path and each opt-in path forced by its own tests), with compute-sanitizer
# memcheck and racecheck on the small backward tests beside them; the benchmark
# (bench/bench_gla_bwd.py: ANCHORS and the model's shapes, per-kernel times, the
# default against each setting in COMPARE, same process). Each step is cut at a
# common deadline (BUDGET_S, default 280 s). Logs under $OUT (logs.tgz,
# refreshed after each step), a short summary last.
#   bash bench/device_gla_bwd.sh                   # full (<= 300 s)
#   MODE=quick bash bench/device_gla_bwd.sh        # <= 150 s: BUILD reused if it is
#     there (BUILD=<an existing sm_90a build dir with -DFLASHGLA_PYTHON=ON>), the
#     plain-layout, sub-chunk, state-scan (pairs, pipeline, splits) and
#     sanitizer tests, two shapes
#   PROFILE="B,T,H,K,V[;...]": also Nsight Compute (--set full) of one state
#     scan launch per shape, after the benchmark (details page in the logs)
set -u
OUT=${OUT:-/tmp/gla_bwd_out}
L=/tmp/gla_bwd_logs
mkdir -p "$OUT" "$L"
BUILD=${BUILD:-build-devbwd}
MODE=${MODE:-full}
COMPARE=${COMPARE:-"FLASHGLA_GLA_BWD_SCAN_PIPELINE=0 FLASHGLA_GLA_BWD_LAYOUT=general"}
if [ "$MODE" = quick ]; then
  TESTS="CudaGlaBackward.ChunkedPlainLayout*:CudaGlaBackward.ChunkedMatchesReference:CudaGlaBackward.Chunked*SubChunk*:CudaGlaBackward.ChunkedScanPairs*:CudaGlaBackward.ChunkedScanPipeline*:CudaGlaBackward.ChunkedSplitScans*:CudaGlaBackward.ChunkedLargeHeadDims:CudaGlaBackward.Sanitizer*"
  SHAPES=${SHAPES:-"8,4096,16,128,128;8,2048,4,128,256"}
  BUDGET_S=${BUDGET_S:-140}
else
  TESTS="CudaGlaBackward.*"
  SHAPES=${SHAPES:-}
  BUDGET_S=${BUDGET_S:-280}
fi
summary=()
note() { summary+=("$*"); echo "$*"; tar czf "$OUT/logs.tgz" -C "$L" .; }
counts() {  # ok / failed / skipped tests of a gtest log
  echo "$(grep -cE '^\[       OK \]' "$1") ok, $(grep -cE '^\[  FAILED  \] Cuda' "$1") failed, $(grep -cE '^\[  SKIPPED \]' "$1") skipped"
}

nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee "$L/gpu.txt"
git_commit=$(cat COMMIT 2>/dev/null || echo unknown)
echo "tree: $git_commit" | tee -a "$L/gpu.txt"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .deps/wheels/*.whl && export PYTHONPATH=/tmp/site

deadline=$(($(date +%s) + BUDGET_S))
left() {  # seconds to the deadline, at most $1
  local l=$((deadline - $(date +%s)))
  echo $((l < $1 ? (l > 1 ? l : 1) : $1))
}

start=$(date +%s)
if [ ! -f "$BUILD/build.ninja" ]; then
  cmake -S . -B $BUILD -G Ninja -DFLASHGLA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DFLASHGLA_PYTHON=ON >"$L/build.log" 2>&1
fi
if ! timeout $(left 160) cmake --build $BUILD -j16 --target flashgla_tests flashgla_python >>"$L/build.log" 2>&1; then
  grep -E "error|FAILED" "$L/build.log" | head -40
  note "build failed or timed out"
fi
note "build: $(($(date +%s) - start)) s"

# Tests; the sanitizers beside them (small cases, little GPU time).
start=$(date +%s)
timeout $(left 150) compute-sanitizer --tool memcheck --error-exitcode 9 $BUILD/flashgla_tests \
  --gtest_filter="CudaGlaBackward.Sanitizer*" >"$L/memcheck.log" 2>&1 &
memcheck=$!
timeout $(left 150) compute-sanitizer --tool racecheck --error-exitcode 9 $BUILD/flashgla_tests \
  --gtest_filter="CudaGlaBackward.SanitizerSmallCases" >"$L/racecheck.log" 2>&1 &
racecheck=$!
timeout $(left 120) $BUILD/flashgla_tests --gtest_filter="$TESTS" >"$L/tests.log" 2>&1
note "tests: rc=$? in $(($(date +%s) - start)) s: $(counts "$L/tests.log")"
grep -E '^\[       OK \]|^\[  FAILED  \]|^\[  SKIPPED \]' "$L/tests.log" | sort -u | head -30
grep -E "Failure|Which is|Expected|actual|flashgla:|error" "$L/tests.log" | grep -v "^\[ errors" | head -30
wait $memcheck
note "memcheck: rc=$? $(counts "$L/memcheck.log"); $(grep -m1 'ERROR SUMMARY' "$L/memcheck.log")"
wait $racecheck
note "racecheck: rc=$? $(counts "$L/racecheck.log"); $(grep -m1 -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$L/racecheck.log")"
# Largest error of each gradient (bf16 / fp16 cases), per forced path, from the error lines.
for log in tests; do
[ -f "$L/$log.log" ] || continue
echo "-- $log"
python3 - "$L/$log.log" <<'EOF'

import re, sys, collections
worst = collections.defaultdict(lambda: [0.0] * 5)
for line in open(sys.argv[1]):
    if not line.startswith("[ errors") or line.split("]", 1)[1].split()[0] == "float32":
        continue
    m = re.search(r"dq (\S+) dk (\S+) dv (\S+) dg (\S+) dh0 (\S+)$", line.strip())
    if not m:
        continue
    paths = " ".join(w for w in line.split() if "=" in w and w.split("=")[0].isupper()) or "default"
    vals = [float(x) for x in m.groups()]
    worst[paths] = [max(a, b) for a, b in zip(worst[paths], vals)]
for paths, v in sorted(worst.items()):
    print(f"max errors (16-bit) [{paths}]: dq {v[0]:.2e} dk {v[1]:.2e} dv {v[2]:.2e} dg {v[3]:.2e} dh0 {v[4]:.2e}")
EOF
done | tee "$L/errors.txt"

start=$(date +%s)
compare_args=()
for setting in $COMPARE; do compare_args+=(--compare "$setting"); done
[ -n "$SHAPES" ] && compare_args+=(--shapes "$SHAPES")
PYTHONPATH=$BUILD/python:/tmp/site PYTHONUNBUFFERED=1 timeout $(left 220) python3 bench/bench_gla_bwd.py --kernels \
  "${compare_args[@]}" >"$L/bench.log" 2>&1
note "benchmark: rc=$? in $(($(date +%s) - start)) s"

if [ -n "${PROFILE:-}" ]; then
for shape in ${PROFILE//;/ }; do
  start=$(date +%s)
  name=scan_profile_${shape//,/_}
  PYTHONPATH=$BUILD/python:/tmp/site timeout $(left 90) ncu --kernel-name regex:state_scan_kernel --launch-skip 2 \
    --launch-count 1 --set full --import-source yes -f -o "$L/$name" python3 - "$shape" >"$L/$name.log" 2>&1 <<'EOF'
import sys, torch, torch.nn.functional as F, flashgla
B, T, H, K, V = (int(x) for x in sys.argv[1].split(","))
bf = dict(device="cuda", dtype=torch.bfloat16)
q, k = (torch.randn(B, T, H, K, **bf).requires_grad_() for _ in range(2))
v = torch.randn(B, T, H, V, **bf).requires_grad_()
g = F.logsigmoid(torch.randn(B, T, H, K, device="cuda")).to(torch.bfloat16).requires_grad_()
do = torch.randn(B, T, H, V, **bf)
o = flashgla.chunk_gla(q, k, v, g)[0]
for _ in range(3):
    torch.autograd.grad(o, (q, k, v, g), do, retain_graph=True)
torch.cuda.synchronize()
EOF
  ncu --import "$L/$name.ncu-rep" --page details >"$L/$name.txt" 2>&1
  ncu --import "$L/$name.ncu-rep" --page raw 2>&1 | grep -E "smsp__pcsamp_warps_issue_stalled_[a-z_]+ " |
    awk '{print $NF, $1}' | sort -rn | head -12 >"$L/$name.stalls"
  rm -f "$L/$name.ncu-rep"
  note "profile $shape: $(($(date +%s) - start)) s"
  grep -E "^  [a-z_]+<|Duration|Registers Per|Achieved Occupancy|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|DRAM Throughput|L2 Hit Rate|Memory Throughput" "$L/$name.txt" | head -14
  cat "$L/$name.stalls"
done
fi

echo "==== summary"
printf '%s\n' "${summary[@]}"
cat "$L/errors.txt"
grep -E "^\| [0-9]|^- B" "$L/bench.log" | awk '!seen[$0]++'  # rows are printed as measured and again at the end
