#!/bin/bash
# One device-machine run (<= 340 s) for the CUDA GLA backward: build for sm_90a
# (tests and the Python module, in the build tree, with line info for the
# profiler); every CudaGlaBackward test (chunked and recurrent: the default
# path and each opt-in path forced by its own tests), with compute-sanitizer
# memcheck and racecheck on the small backward tests beside them; the benchmark
# (bench/bench_gla_bwd.py: ANCHORS and the model's shapes, per-kernel times,
# the default against each opt-in setting in COMPARE, same process); then, in
# the time left, Nsight Compute on the state scans and the chunk kernel at B8
# T4096 H16 d128 (default path). Each step is cut at a common deadline. Logs
# under $OUT (logs.tgz, refreshed after each step), a short summary last.
#   bash bench/device_gla_bwd.sh
set -u
OUT=${OUT:-/tmp/gla_bwd_out}
L=/tmp/gla_bwd_logs
mkdir -p "$OUT" "$L"
BUILD=build-devbwd
COMPARE=${COMPARE:-"FLASHGLA_GLA_BWD_GATE=registers FLASHGLA_GLA_BWD_LAYOUT=general FLASHGLA_GLA_BWD_LAYOUT=general,FLASHGLA_GLA_BWD_OVERLAP=0"}
summary=()
note() { summary+=("$*"); echo "$*"; tar czf "$OUT/logs.tgz" -C "$L" .; }
counts() {  # ok / failed / skipped tests of a gtest log
  echo "$(grep -cE '^\[       OK \]' "$1") ok, $(grep -cE '^\[  FAILED  \] Cuda' "$1") failed, $(grep -cE '^\[  SKIPPED \]' "$1") skipped"
}

nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee "$L/gpu.txt"
git_commit=$(cat COMMIT 2>/dev/null || echo unknown)
echo "tree: $git_commit" | tee -a "$L/gpu.txt"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .deps/wheels/*.whl && export PYTHONPATH=/tmp/site

deadline=$(($(date +%s) + ${BUDGET_S:-330}))
left() {  # seconds to the deadline, at most $1
  local l=$((deadline - $(date +%s)))
  echo $((l < $1 ? (l > 1 ? l : 1) : $1))
}

start=$(date +%s)
cmake -S . -B $BUILD -G Ninja -DFLASHGLA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DFLASHGLA_PYTHON=ON \
  -DCMAKE_CUDA_FLAGS=-lineinfo >"$L/build.log" 2>&1
if ! timeout $(left 170) cmake --build $BUILD -j16 --target flashgla_tests flashgla_python >>"$L/build.log" 2>&1; then
  grep -E "error|FAILED" "$L/build.log" | head -40
  note "build failed or timed out"
fi
note "build: $(($(date +%s) - start)) s"

# Tests; the sanitizers beside them (small cases, little GPU time).
start=$(date +%s)
timeout $(left 110) compute-sanitizer --tool memcheck --error-exitcode 9 $BUILD/flashgla_tests \
  --gtest_filter="CudaGlaBackward.Sanitizer*" >"$L/memcheck.log" 2>&1 &
memcheck=$!
timeout $(left 110) compute-sanitizer --tool racecheck --error-exitcode 9 $BUILD/flashgla_tests \
  --gtest_filter="CudaGlaBackward.SanitizerSmallCases" >"$L/racecheck.log" 2>&1 &
racecheck=$!
timeout $(left 110) $BUILD/flashgla_tests --gtest_filter="CudaGlaBackward.*" >"$L/tests.log" 2>&1
note "tests: rc=$? in $(($(date +%s) - start)) s: $(counts "$L/tests.log")"
grep -E '^\[       OK \]|^\[  FAILED  \]|^\[  SKIPPED \]' "$L/tests.log" | sort -u | head -30
grep -E "Failure|Which is|Expected|actual|flashgla:|error" "$L/tests.log" | grep -v "^\[ errors" | head -30
wait $memcheck
note "memcheck: rc=$? $(counts "$L/memcheck.log"); $(grep -m1 'ERROR SUMMARY' "$L/memcheck.log")"
wait $racecheck
note "racecheck: rc=$? $(counts "$L/racecheck.log"); $(grep -m1 -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$L/racecheck.log")"
# Largest error of each gradient (bf16 / fp16 cases), per forced path, from the error lines.
python3 - "$L/tests.log" <<'EOF' | tee "$L/errors.txt"
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

start=$(date +%s)
compare_args=()
for setting in $COMPARE; do compare_args+=(--compare "$setting"); done
PYTHONPATH=$BUILD/python:/tmp/site PYTHONUNBUFFERED=1 timeout $(left 120) python3 bench/bench_gla_bwd.py --kernels \
  "${compare_args[@]}" >"$L/bench.log" 2>&1
note "benchmark: rc=$? in $(($(date +%s) - start)) s"

# Nsight Compute: the second call's state scans and chunk kernel at the main shape.
start=$(date +%s)
cat >/tmp/one_bwd.py <<'EOF'
import torch, torch.nn.functional as F, flashgla
B, T, H, D = 8, 4096, 16, 128
bf = dict(device="cuda", dtype=torch.bfloat16)
q, k, v = (torch.randn(B, T, H, D, **bf).requires_grad_() for _ in range(3))
g = F.logsigmoid(torch.randn(B, T, H, D, device="cuda")).to(torch.bfloat16).requires_grad_()
do = torch.randn(B, T, H, D, **bf)
o = flashgla.chunk_gla(q, k, v, g)[0]
for _ in range(2):
    torch.autograd.grad(o, (q, k, v, g), do, retain_graph=True)
torch.cuda.synchronize()
EOF
PYTHONPATH=$BUILD/python:/tmp/site timeout $(left 100) ncu --kernel-name regex:"chunk_kernel|state_scan_kernel" \
  --launch-skip 2 --launch-count 2 --set full --import-source no -f -o /tmp/bwd_prof python3 /tmp/one_bwd.py \
  >"$L/ncu_run.log" 2>&1
note "ncu: rc=$? in $(($(date +%s) - start)) s"
if [ -f /tmp/bwd_prof.ncu-rep ]; then
  ncu -i /tmp/bwd_prof.ncu-rep --page details >"$L/ncu_details.txt" 2>&1
  timeout $(left 40) ncu -i /tmp/bwd_prof.ncu-rep --page source --csv --print-source sass,cuda \
    --kernel-name regex:chunk_kernel >"$L/ncu_source_chunk.csv" 2>&1
  gzip -f "$L/ncu_source_chunk.csv"
  cp /tmp/bwd_prof.ncu-rep "$OUT/" 2>/dev/null
  tar czf "$OUT/logs.tgz" -C "$L" .
fi

echo "==== summary"
printf '%s\n' "${summary[@]}"
cat "$L/errors.txt"
grep -E "^\| [0-9]|^- B" "$L/bench.log" | awk '!seen[$0]++'  # rows are printed as measured and again at the end
grep -E "Duration|Registers Per|Achieved Occupancy|Compute \(SM\) Throughput|Memory Throughput|Issued Ipc|Warp Cycles Per Issued" "$L/ncu_details.txt" 2>/dev/null | head -24
