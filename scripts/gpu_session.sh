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
#   PART=P bash scripts/gpu_session.sh   # nothing built there: the binaries and package made here by
#                                        # scripts/pack_gpu_binaries.sh (carry [".gpu"]); the A/B, the C++
#                                        # tests, both sanitizers, the Python and distributed tests, each
#                                        # spread over every GPU (P_STEPS picks; about 10 minutes on 4 GPUs).
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
  # Prebuilt on the development machine (scripts/pack_gpu_binaries.sh, sm_90a): carry [".gpu"]. P_STEPS picks
  # (default all, in this order): ab — the A/B of the flashgla command against the base build, its shapes dealt
  # out over every GPU; cpp — the C++ tests in one shard a GPU, then memcheck and racecheck and `flashgla
  # check` on three of them; py — the Python tests, their files dealt out over the GPUs; dist — the distributed
  # tests on every GPU. Steps run one after another, so a timing never shares its GPU.
  unxz_to() {  # xz, or Python's lzma where the machine has no xz
    if command -v xz >/dev/null; then xz -dc "$1" >"$2"
    else python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$1" "$2"; fi
  }
  mkdir -p build-gpu build-base /tmp/site
  for b in flashgla flashgla_tests; do unxz_to ".gpu/$b.xz" "build-gpu/$b"; done
  [ -f .gpu/flashgla_base.xz ] && unxz_to .gpu/flashgla_base.xz build-base/flashgla
  chmod +x build-gpu/* build-base/* 2>/dev/null
  unxz_to .gpu/site.tar.xz /tmp/site.tar && tar -xf /tmp/site.tar -C /tmp/site && export PYTHONPATH=/tmp/site
  export PATH=$PWD/build-gpu:$PATH  # the flashgla command the Python tests call
  build-gpu/flashgla --version | head -2
  steps=${P_STEPS:-ab cpp py dist}
  last=$((GPUS - 1))
  all_gpus=$(seq -s ' ' 0 "$last")
  if [[ " $steps " == *" ab "* ]] && [ -x build-base/flashgla ]; then
    AB_GPUS=$all_gpus step ab 480 bash bench/ab_cli.sh build-base/flashgla build-gpu/flashgla "${AB_ROUNDS:-2}"
  fi
  if [[ " $steps " == *" cpp "* ]]; then
    for g in $(seq 0 "$last"); do
      ( export CUDA_VISIBLE_DEVICES=$g GTEST_SHARD_INDEX=$g GTEST_TOTAL_SHARDS=$GPUS
        step "cpp_tests_$g" 330 build-gpu/flashgla_tests --gtest_brief=1
        unset GTEST_SHARD_INDEX GTEST_TOTAL_SHARDS
        case $g in
          0) step memcheck 150 compute-sanitizer --tool memcheck --error-exitcode 1 build-gpu/flashgla_tests \
               --gtest_filter="$SAN" ;;
          1) step racecheck 150 compute-sanitizer --tool racecheck --error-exitcode 1 build-gpu/flashgla_tests \
               --gtest_filter="$SAN" ;;
          2) step cli_check 60 build-gpu/flashgla check ;;
        esac ) &
    done
    wait
  fi
  if [[ " $steps " == *" py "* ]]; then
    mapfile -t files < <(ls tests/python/test_*.py | grep -v distributed)
    for g in $(seq 0 "$last"); do
      mine=()
      for i in "${!files[@]}"; do [ $((i % GPUS)) = "$g" ] && mine+=("$PWD/${files[$i]}"); done
      CUDA_VISIBLE_DEVICES=$g step "py_tests_$g" 420 python3 -m pytest -q -p no:cacheprovider -rfs --rootdir=/tmp \
        "${mine[@]}" &
    done
    wait
  fi
  if [[ " $steps " == *" dist "* ]]; then
    step dist_tests 200 python3 -m pytest -q -p no:cacheprovider -rfs --rootdir=/tmp \
      "$PWD/tests/python/test_distributed_gpu.py" "$PWD/tests/python/test_distributed_model_gpu.py"
  fi
  pack
  for f in "$LOGS"/cpp_tests_*.log; do [ -f "$f" ] && grep -hE "^\[  (PASSED|FAILED|SKIPPED) " "$f" | head -8; done
  for f in memcheck racecheck; do [ -f "$LOGS/$f.log" ] && grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$LOGS/$f.log"; done
  for f in "$LOGS"/py_tests_*.log "$LOGS"/dist_tests.log "$LOGS"/cli_check.log; do
    [ -f "$f" ] && { echo "== $(basename "$f")"; grep -E "^(FAILED|ERROR) " "$f" | head -10; tail -2 "$f"; }
  done
  [ -f "$LOGS/ab.log" ] && { echo "== A/B against .base"; cat "$LOGS/ab.log"; }
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
