#!/bin/bash
# One device-machine run for the CUDA FlashAttention kernels: build for
# sm_90a, the attention GPU tests with the Hopper forward required
# (FLASHGLA_ATTENTION_KERNEL=hopper first: a wrong mbarrier phase hangs, so
# every step has a time limit), with the default choice and (TEST_PORTABLE=1)
# with the portable forward forced,
# compute-sanitizer on small cases with the default choice, the benchmark
# (flashgla next to SDPA flash and cuDNN, one process), and optionally
# Nsight Compute on the forward and the backward (flashgla command). Logs go to
# $OUT/attention_logs.tgz (repacked after every step); a summary prints last.
#   bash bench/device_attention.sh      # BENCH_ARGS="..." to change the benchmark, PROFILE=1 for ncu
# BWD=hopper (or portable) forces the backward (FLASHGLA_ATTENTION_BACKWARD) in the
# strict test run and the sanitizers; SKIP_DEFAULT=1 skips the default-choice tests and sanitizers.
# The flashgla command and the tests read these variables through tools/tuning_env (the args' AttentionTuning).
set -u
OUT=${OUT:-/tmp/attention_out}
mkdir -p "$OUT"
LOGS=$(mktemp -d)
BUILD=build-devattn
BENCH_ARGS=${BENCH_ARGS:---quick --kernels portable}
FAST="*/AttentionCuda.*:AttentionCudaApi.*"
# Small cases for the sanitizers: T = 129 (d 64 and 128, causal and full),
# grouped heads, varlen (see the case lists in tests/test_attention_cuda.cpp).
SMALL="Lengths/AttentionCuda.*/12:Lengths/AttentionCuda.*/13:Lengths/AttentionCuda.*/32:Lengths/AttentionCuda.*/33"
SMALL="$SMALL:GroupedHeads/AttentionCuda.*/2:GroupedHeads/AttentionCuda.*/9:Varlen/AttentionCuda.*/2:Varlen/AttentionCuda.*/5:Varlen/AttentionCuda.*/8"
summary=()

# step NAME SECONDS COMMAND...: time limit, log in $LOGS/NAME.log, one summary line.
step() {
  local name=$1 limit=$2; shift 2
  local start=$SECONDS rc=0
  timeout -k 5 "$limit" "$@" >"$LOGS/$name.log" 2>&1 || rc=$?
  local tests=""
  if grep -q "^\[==========\]" "$LOGS/$name.log"; then
    tests=": $(grep -cE '^\[       OK \]' "$LOGS/$name.log") ok, $(grep -cE '^\[  FAILED  \] .*\.' "$LOGS/$name.log") failed, $(grep -cE '^\[  SKIPPED \]' "$LOGS/$name.log") skipped"
  fi
  summary+=("$name: rc=$rc in $((SECONDS - start)) s$tests $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$LOGS/$name.log")")
  echo "${summary[-1]}"
  [ $rc = 0 ] || { grep -E "Failure|Expected|Which is|errors:|What|error|Error" "$LOGS/$name.log" | head -30; tail -5 "$LOGS/$name.log"; }
  tar czf "$OUT/attention_logs.tgz" -C "$LOGS" .
}

nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,driver_version --format=csv,noheader | tee "$LOGS/gpu.txt"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .deps/wheels/*.whl 2>/dev/null && export PYTHONPATH=/tmp/site

step configure 60 cmake -S . -B $BUILD -G Ninja -DFLASHGLA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DFLASHGLA_PYTHON=ON
targets="flashgla_tests flashgla_cli flashgla_python"
if ! grep -q "Generating done" "$LOGS/configure.log"; then  # no nanobind: the tests alone
  step configure_no_python 60 cmake -S . -B $BUILD -G Ninja -DFLASHGLA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
    -DFLASHGLA_PYTHON=OFF
  targets="flashgla_tests flashgla_cli"
fi
# shellcheck disable=SC2086
step build 200 cmake --build $BUILD -j16 --target $targets
grep -E "error|FAILED" "$LOGS/build.log" | head -20

export FLASHGLA_ATTENTION_BACKWARD=${BWD:-auto}
step tests_hopper 90 env FLASHGLA_ATTENTION_KERNEL=hopper $BUILD/flashgla_tests --gtest_filter="$FAST"
# shellcheck disable=SC2086
step bench ${BENCH_S:-150} env PYTHONPATH=$BUILD/python:${PYTHONPATH:-} PYTHONUNBUFFERED=1 \
  python3 bench/bench_attention.py $BENCH_ARGS --json "$LOGS/bench.json"
if [ -n "${TEST_PORTABLE:-}" ]; then
  step tests_portable 80 env FLASHGLA_ATTENTION_KERNEL=portable FLASHGLA_ATTENTION_BACKWARD=portable \
    $BUILD/flashgla_tests --gtest_filter="$FAST"
fi
# The default choice (tests incl. the generic kernels, sanitizers); SKIP_DEFAULT=1 skips all of it
# (tests_hopper above already ran the default kernels, strict).
if [ -z "${SKIP_DEFAULT:-}" ]; then
  step tests_default 80 env FLASHGLA_ATTENTION_BACKWARD=auto $BUILD/flashgla_tests \
    --gtest_filter="$FAST:*AttentionGenericCuda*"
  step memcheck 60 compute-sanitizer --tool memcheck --error-exitcode 9 \
    $BUILD/flashgla_tests --gtest_filter="$SMALL:AttentionCudaApi.BadDeviceBoundariesStayInBounds"
  step racecheck 60 compute-sanitizer --tool racecheck --error-exitcode 9 \
    $BUILD/flashgla_tests --gtest_filter="Lengths/AttentionCuda.*/13:Lengths/AttentionCuda.*/33"
  step synccheck 40 compute-sanitizer --tool synccheck --error-exitcode 9 \
    $BUILD/flashgla_tests --gtest_filter="Lengths/AttentionCuda.*/33"
fi

if [ -n "${PROFILE:-}" ]; then
  # One launch each through the flashgla command (bf16, B=2, T=8K, H=16, d=128, causal): the Hopper
  # forward (the library's variant) and the Hopper backward's main kernel.
  for kernel in forward_hopper backward_hopper; do
    step "ncu_$kernel" 90 env FLASHGLA_ATTENTION_KERNEL=hopper ncu --kernel-name "regex:attention_$kernel" \
      --launch-count 1 --set full --import-source yes -f -o /tmp/$kernel $BUILD/flashgla bench --ops attention -B 2 \
      -T 8192 -H 16 -K 128 -V 128 --causal --warmup 0 --repeat 1 --pass fwd,bwd
    ncu -i /tmp/$kernel.ncu-rep --page details >"$LOGS/ncu_$kernel.txt" 2>&1
    ncu -i /tmp/$kernel.ncu-rep --page source --csv --print-source sass >"$LOGS/ncu_${kernel}_sass.csv" 2>&1
    grep -E "Duration|Registers Per|Achieved Occupancy|Executed Ipc A|Issue Slots Busy|No Eligible|Compute \(SM\) Thr|Memory Thr|Warp Cycles Per Issued|Bank Conflicts|L1/TEX Hit|Local" \
      "$LOGS/ncu_$kernel.txt" | head -16
  done
  tar czf "$OUT/attention_logs.tgz" -C "$LOGS" .
fi

echo "==== summary"
printf '%s\n' "${summary[@]}"
grep -E "^accuracy check|FAIL" "$LOGS/bench.log" | head -12
grep -E "^T=" "$LOGS/bench.log" | sed -E 's/ TF\/s//g; s/ ms / /g'
