#!/usr/bin/env bash
# Every GPU check of a change in two calls on one machine of 2 or 4 GPUs (device tool, kind nvidia-h100-x2
# or -x4, carry [".deps", ".base"]; .base is `git archive` of the commit to compare with, for the A/B):
#   PART=A bash scripts/gpu_session.sh   # builds; then in parallel, one GPU each: C++ tests and
#                                        # compute-sanitizer (with the FLA-option and planner tests on their
#                                        # own); the Python tests. Then the distributed tests over NCCL (2 GPUs; 4 where
#                                        # present).
#   PART=C bash scripts/gpu_session.sh   # one call instead of B where device time is short: builds, the
#                                        # C++ tests named by CPP_FILTER (e.g. what A left unfinished) and
#                                        # the sanitizers on SAN_FILTER beside the A/B; then the decode,
#                                        # generate and FLA-checkpoint benchmarks; then CP scaling if time is left.
#   PART=B bash scripts/gpu_session.sh   # (right after A: the warm machine keeps A's builds) in parallel,
#                                        # one GPU each: the A/B of the flashgla command against .base; the
#                                        # single-GPU benchmarks. Then op-level CP scaling, FSDP2 weak
#                                        # scaling of the 340M LM, and (4 GPUs) the LM with CP at long context.
#   PART=P bash scripts/gpu_session.sh   # nothing built there: the binaries and wheel made here by
#                                        # scripts/pack_gpu_binaries.sh (carry [".gpu"]); the A/B, the C++
#                                        # tests, both sanitizers, the Python and distributed tests in one call
#                                        # on 4 GPUs (PART=P2 then finishes on a machine of fewer).
# Lanes that share the machine run on different GPUs; the A/B and the single-GPU benchmarks run side by
# side on two GPUs of the host (the A/B's ratios compare two builds on the same GPU in the same call).
# Logs and appended results files come back in $OUT/session.tgz; a short table is printed last.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-gpu_session_out}
PART=${PART:-A}
ARCH=${FLASHGLA_CUDA_ARCH:-90a}
WORK=$(mktemp -d)
LOGS=$WORK/logs
mkdir -p "$LOGS" "$OUT"
STATUS=$WORK/status
touch "$STATUS"

# step NAME SECONDS COMMAND...: logs to $LOGS/NAME.log and records PASS/FAIL/TIMEOUT and the time.
step() {
  local name=$1 limit=$2; shift 2
  local start=$SECONDS rc=0
  timeout "$limit" "$@" >"$LOGS/$name.log" 2>&1 || rc=$?
  local result=PASS
  [ $rc = 124 ] && result=TIMEOUT
  [ $rc != 0 ] && [ $rc != 124 ] && result="FAIL (rc $rc)"
  echo "$name|$result|$((SECONDS - start)) s" >>"$STATUS"
  pack  # after every step, so a call cut short still brings back what finished
  return $rc
}
pack() {
  cp bench/results*.md "$LOGS"/ 2>/dev/null
  flock "$WORK/pack.lock" tar czf "$OUT/session.tgz" -C "$WORK" logs status
}

nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
GPUS=$(nvidia-smi -L | wc -l)
[ -d .deps/wheels ] && python3 -m pip install -q --no-index --no-deps --target /tmp/site .deps/wheels/*.whl &&
  export PYTHONPATH=/tmp/site

# The sanitizers run gpu_check.sh's list of small GPU tests unless SAN_FILTER / SANITIZE_FILTER name others.
SAN=${SAN_FILTER:-${SANITIZE_FILTER:-$(grep -oE 'SANITIZE_FILTER:-[^}]*' scripts/gpu_check.sh | cut -d- -f2-)}}
# Today's GPU checks of the FLA 0.6 options and the planner: the C++ tests on their own.
new_checks() {
  step cpp_fla_plan 120 build-gpu/flashgla_tests --gtest_brief=1 --gtest_filter='GlaApiOptions.*:GlaPlan.*'
}

if [ "$PART" = P ]; then
  # Prebuilt on the development machine (scripts/pack_gpu_binaries.sh, sm_90a): carry [".gpu"]. Every lane
  # on its own GPU: the A/B of the flashgla command against the base build; the C++ tests in two shards,
  # then memcheck and racecheck; the Python tests; then the distributed tests on two GPUs. Needs 4 GPUs
  # to end in one call; with fewer, the lanes after the first two wait for a second call (PART=P2).
  unxz_to() {  # xz, or Python's lzma where the machine has no xz
    if command -v xz >/dev/null; then xz -dc "$1" >"$2"
    else python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$1" "$2"; fi
  }
  mkdir -p build-gpu build-base /tmp/site
  for b in flashgla flashgla_tests; do unxz_to ".gpu/$b.xz" "build-gpu/$b"; done
  unxz_to .gpu/flashgla_base.xz build-base/flashgla
  chmod +x build-gpu/* build-base/*
  unxz_to .gpu/site.tar.xz /tmp/site.tar && tar -xf /tmp/site.tar -C /tmp/site && export PYTHONPATH=/tmp/site
  export PATH=$PWD/build-gpu:$PATH  # the flashgla command the Python tests call
  build-gpu/flashgla --version | head -2
  cpp_lane() {  # GPU, shard index, shard count, sanitizer tool
    ( export CUDA_VISIBLE_DEVICES=$1 GTEST_SHARD_INDEX=$2 GTEST_TOTAL_SHARDS=$3
      step "cpp_tests_$2" 330 build-gpu/flashgla_tests --gtest_brief=1
      unset GTEST_SHARD_INDEX GTEST_TOTAL_SHARDS
      step "$4" 150 compute-sanitizer --tool "$4" --error-exitcode 1 build-gpu/flashgla_tests --gtest_filter="$SAN" )
  }
  py_lane() {
    CUDA_VISIBLE_DEVICES=$1 step py_tests 420 python3 -m pytest -q -p no:cacheprovider -rfs --rootdir=/tmp \
      "$PWD/tests/python" --ignore="$PWD/tests/python/test_distributed.py" \
      --ignore="$PWD/tests/python/test_distributed_model.py" --ignore="$PWD/tests/python/test_distributed_gpu.py" \
      --ignore="$PWD/tests/python/test_distributed_model_gpu.py"
  }
  dist_lane() {
    CUDA_VISIBLE_DEVICES=$1 step dist_tests 200 python3 -m pytest -q -p no:cacheprovider -rfs --rootdir=/tmp \
      "$PWD/tests/python/test_distributed_gpu.py" "$PWD/tests/python/test_distributed_model_gpu.py"
  }
  ( CUDA_VISIBLE_DEVICES=0 step ab 420 bash bench/ab_cli.sh build-base/flashgla build-gpu/flashgla "${AB_ROUNDS:-2}" ) &
  if [ "$GPUS" -ge 4 ]; then
    cpp_lane 1 0 2 memcheck & lane1=$!
    cpp_lane 2 1 2 racecheck & lane2=$!
    py_lane 3 &
    wait $lane1 $lane2
    ( CUDA_VISIBLE_DEVICES=1 step cli_check 60 build-gpu/flashgla check ) &
    dist_lane 2,3 &
  else
    cpp_lane $((GPUS - 1)) 0 1 memcheck &
  fi
  wait; pack
  grep -hE "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]" "$LOGS"/cpp_tests_*.log | head -20
  for f in memcheck racecheck; do [ -f "$LOGS/$f.log" ] && grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$LOGS/$f.log"; done
  for f in py_tests dist_tests cli_check; do [ -f "$LOGS/$f.log" ] && { echo "== $f"; tail -4 "$LOGS/$f.log"; }; done
  [ -f "$LOGS/ab.log" ] && { echo "== A/B against .base"; cat "$LOGS/ab.log"; }
elif [ "$PART" = P2 ]; then
  # The rest of PART=P on a machine of fewer than 4 GPUs (the warm machine keeps P's unpacked builds).
  export PYTHONPATH=/tmp/site
  ( CUDA_VISIBLE_DEVICES=0 step py_tests 420 python3 -m pytest -q -p no:cacheprovider -rfs --rootdir=/tmp \
      "$PWD/tests/python" --ignore="$PWD/tests/python/test_distributed.py" \
      --ignore="$PWD/tests/python/test_distributed_model.py" --ignore="$PWD/tests/python/test_distributed_gpu.py" \
      --ignore="$PWD/tests/python/test_distributed_model_gpu.py" ) &
  ( CUDA_VISIBLE_DEVICES=$((GPUS - 1)) step racecheck 150 compute-sanitizer --tool racecheck --error-exitcode 1 \
      build-gpu/flashgla_tests --gtest_filter="$SAN"
    CUDA_VISIBLE_DEVICES=$((GPUS - 1)) step cli_check 60 build-gpu/flashgla check ) &
  wait
  [ "$GPUS" -ge 2 ] && step dist_tests 200 python3 -m pytest -q -p no:cacheprovider -rfs --rootdir=/tmp \
    "$PWD/tests/python/test_distributed_gpu.py" "$PWD/tests/python/test_distributed_model_gpu.py"
  pack
  grep -E "RACECHECK SUMMARY" "$LOGS/racecheck.log"
  for f in py_tests dist_tests cli_check; do [ -f "$LOGS/$f.log" ] && { echo "== $f"; tail -4 "$LOGS/$f.log"; }; done
elif [ "$PART" = C ]; then
  step configure 120 cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHGLA_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$ARCH"
  step build 420 cmake --build build-gpu -j24 &
  step py_install 420 env CMAKE_ARGS="-DCMAKE_CUDA_ARCHITECTURES=$ARCH" FLASHGLA_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=16 \
    python3 -m pip install --no-build-isolation --no-deps . &
  [ -d .base ] && step base_build 420 bash -c "cmake -S .base -B build-base -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DFLASHGLA_CUDA=ON -DFLASHGLA_TESTS=OFF -DCMAKE_CUDA_ARCHITECTURES=$ARCH >/dev/null &&
    cmake --build build-base -j12 --target flashgla_cli" &
  wait; pack
  ( export CUDA_VISIBLE_DEVICES=$((GPUS - 1))
    step cpp_tests 300 build-gpu/flashgla_tests --gtest_filter="${CPP_FILTER:-*}"
    new_checks
    step memcheck 90 compute-sanitizer --tool memcheck --error-exitcode 1 build-gpu/flashgla_tests --gtest_filter="$SAN"
    step racecheck 90 compute-sanitizer --tool racecheck --error-exitcode 1 build-gpu/flashgla_tests --gtest_filter="$SAN"
    step py_tests 60 python3 -m pytest -q -p no:cacheprovider -rfs --rootdir=/tmp "$PWD/tests/python/test_gpu.py" -k "prefill or pool"
    step py_fla_api_cuda 120 python3 -m pytest -q -p no:cacheprovider -rfs --rootdir=/tmp \
      "$PWD/tests/python/test_fla_api.py" -k cuda
  ) &
  ( export CUDA_VISIBLE_DEVICES=0
    step ab 240 bash bench/ab_cli.sh build-base/flashgla build-gpu/flashgla "${AB_ROUNDS:-2}"
    step bench_decode 90 python3 bench/bench_decode.py
    step fla_checkpoint 120 python3 bench/check_fla_checkpoint.py
    step bench_generate 150 python3 bench/bench_generate.py --repeats 2
    step bench_fla_api 150 python3 bench/bench_fla_api.py
  ) &
  wait; pack
  [ "$GPUS" -ge 2 ] && [ -n "${CP:-}" ] && {
    step cp_1gpu 100 python3 bench/bench_cp.py --tokens 524288 --repeats 3
    step cp_2gpu 100 torchrun --nproc_per_node 2 bench/bench_cp.py --tokens 524288 --repeats 3; }
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests? ran" "$LOGS/cpp_tests.log" | head -6
  for f in memcheck racecheck; do grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$LOGS/$f.log"; done
  for f in py_tests py_fla_api_cuda; do tail -2 "$LOGS/$f.log"; done
  for f in bench_decode fla_checkpoint bench_generate bench_fla_api cp_1gpu cp_2gpu; do
    [ -f "$LOGS/$f.log" ] && { echo "== $f"; tail -12 "$LOGS/$f.log"; }
  done
  [ -f "$LOGS/ab.log" ] && { echo "== A/B against .base"; cat "$LOGS/ab.log"; }
elif [ "$PART" = A ]; then
  # Three builds at once: the C++ tests and CLI, the Python package, the base tree's CLI.
  step configure 120 cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHGLA_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$ARCH"
  step build 420 cmake --build build-gpu -j40 &
  step py_install 420 env CMAKE_ARGS="-DCMAKE_CUDA_ARCHITECTURES=$ARCH" FLASHGLA_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=24 \
    python3 -m pip install --no-build-isolation --no-deps . &
  if [ -d .base ]; then
    step base_build 420 bash -c "cmake -S .base -B build-base -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHGLA_CUDA=ON \
      -DFLASHGLA_TESTS=OFF -DCMAKE_CUDA_ARCHITECTURES=$ARCH >/dev/null && cmake --build build-base -j16 --target flashgla_cli" &
  fi
  wait; pack
  ( export CUDA_VISIBLE_DEVICES=$((GPUS - 1))
    step cpp_tests 330 build-gpu/flashgla_tests --gtest_brief=1
    step cli_check 60 build-gpu/flashgla check
    new_checks
    step memcheck 120 compute-sanitizer --tool memcheck --error-exitcode 1 build-gpu/flashgla_tests --gtest_filter="$SAN"
    step racecheck 150 compute-sanitizer --tool racecheck --error-exitcode 1 build-gpu/flashgla_tests --gtest_filter="$SAN"
  ) &
  ( export CUDA_VISIBLE_DEVICES=0
    step py_tests 420 python3 -m pytest -q -p no:cacheprovider -rfs --rootdir=/tmp "$PWD/tests/python" \
      --ignore="$PWD/tests/python/test_distributed.py" --ignore="$PWD/tests/python/test_distributed_model.py" \
      --ignore="$PWD/tests/python/test_distributed_gpu.py" --ignore="$PWD/tests/python/test_distributed_model_gpu.py"
  ) &
  wait; pack
  step dist_tests 240 python3 -m pytest -q -p no:cacheprovider -rfs --rootdir=/tmp \
    "$PWD/tests/python/test_distributed_gpu.py" "$PWD/tests/python/test_distributed_model_gpu.py"
  pack
  for f in cpp_tests cpp_fla_plan; do grep -E "^\[  (PASSED|FAILED|SKIPPED) " "$LOGS/$f.log" | head -5; done
  for f in py_tests dist_tests; do echo "== $f"; tail -3 "$LOGS/$f.log"; done
else
  # A's builds are still there when B follows on the warm machine; otherwise build what B needs.
  python3 -c "import flashgla, sys; sys.exit(not flashgla.cuda_available())" 2>/dev/null ||
    step py_install 420 env CMAKE_ARGS="-DCMAKE_CUDA_ARCHITECTURES=$ARCH" FLASHGLA_CUDA=ON \
      CMAKE_BUILD_PARALLEL_LEVEL=24 python3 -m pip install --no-build-isolation --no-deps . &
  [ -x build-gpu/flashgla ] || step build 420 bash -c "cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DFLASHGLA_CUDA=ON -DFLASHGLA_TESTS=OFF -DCMAKE_CUDA_ARCHITECTURES=$ARCH >/dev/null && cmake --build build-gpu -j16 --target flashgla_cli" &
  [ ! -d .base ] || [ -x build-base/flashgla ] || step base_build 420 bash -c "cmake -S .base -B build-base -G Ninja \
    -DCMAKE_BUILD_TYPE=Release -DFLASHGLA_CUDA=ON -DFLASHGLA_TESTS=OFF -DCMAKE_CUDA_ARCHITECTURES=$ARCH >/dev/null &&
    cmake --build build-base -j16 --target flashgla_cli" &
  wait
  # The A/B of the flashgla command and the single-GPU benchmarks, one GPU each.
  ( export CUDA_VISIBLE_DEVICES=0
    [ -x build-base/flashgla ] && step ab 330 bash bench/ab_cli.sh build-base/flashgla build-gpu/flashgla "${AB_ROUNDS:-3}"
  ) &
  ( export CUDA_VISIBLE_DEVICES=$((GPUS - 1))
    step bench_decode 100 python3 bench/bench_decode.py
    step fla_checkpoint 120 python3 bench/check_fla_checkpoint.py
    step bench_kvcache 100 python3 bench/bench_kvcache.py
    step bench_generate 150 python3 bench/bench_generate.py --repeats 2
    step bench_fla_api 150 python3 bench/bench_fla_api.py
  ) &
  wait; pack
  TOKENS=${TOKENS:-524288,1048576}
  step cp_1gpu 120 python3 bench/bench_cp.py --tokens "$TOKENS" --repeats 3
  step cp_2gpu 120 torchrun --nproc_per_node 2 bench/bench_cp.py --tokens "$TOKENS" --repeats 3
  [ "$GPUS" -ge 4 ] && step cp_4gpu 150 torchrun --nproc_per_node 4 bench/bench_cp.py --tokens "$TOKENS" --repeats 3
  pack
  list=1,2; [ "$GPUS" -ge 4 ] && list=1,2,4
  step fsdp 240 python3 bench/bench_fsdp.py --gpus "$list" --variants "${VARIANTS:-probe,tuned}" --steps 6 --warmup 2
  pack
  [ "$GPUS" -ge 4 ] && step lm_cp 200 python3 bench/bench_fsdp.py --mode cp --gpus 4
  for f in bench_decode fla_checkpoint bench_kvcache bench_generate bench_fla_api cp_1gpu cp_2gpu cp_4gpu fsdp lm_cp; do
    [ -f "$LOGS/$f.log" ] && { echo "== $f"; tail -12 "$LOGS/$f.log"; }
  done
  [ -f "$LOGS/ab.log" ] && { echo "== A/B against .base"; cat "$LOGS/ab.log"; }
fi
pack
echo
printf '%-24s %-14s %s\n' step result time
while IFS='|' read -r a b c; do printf '%-24s %-14s %s\n' "$a" "$b" "$c"; done <"$STATUS"
