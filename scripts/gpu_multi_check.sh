#!/usr/bin/env bash
# The multi-GPU check (device tool, kind nvidia-h100-x4 or -x2, carry [".deps"]):
#   bash scripts/gpu_multi_check.sh            # tests, then op-level CP scaling
#   PART=model bash scripts/gpu_multi_check.sh # the LM: FSDP2 weak scaling and CP at long context
# Installs the package for sm_90a into the machine's Python, runs the distributed GPU tests over NCCL
# and the benchmarks (their results files are appended), and prints a short table last. NVLink
# multicast stays off. Logs and results come back packed in $OUT/gpu_multi.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-gpu_multi_out}
PART=${PART:-op}
TOKENS=${TOKENS:-524288,1048576}
LOGS=$(mktemp -d)
mkdir -p "$OUT"
declare -a SUMMARY
step() {
  local name=$1 limit=$2; shift 2
  local start=$SECONDS rc=0
  timeout "$limit" "$@" >"$LOGS/$name.log" 2>&1 || rc=$?
  if [ $rc = 0 ]; then SUMMARY+=("$name|PASS|$((SECONDS - start)) s")
  elif [ $rc = 124 ]; then SUMMARY+=("$name|TIMEOUT|$((SECONDS - start)) s")
  else SUMMARY+=("$name|FAIL (rc $rc)|$((SECONDS - start)) s"); echo "== $name failed:"; tail -25 "$LOGS/$name.log"; fi
  cp bench/results_cp.md bench/results_multi_gpu.md "$LOGS"/ 2>/dev/null
  tar czf "$OUT/gpu_multi.tgz" -C "$LOGS" .
}
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
gpus=$(nvidia-smi -L | wc -l)
python3 -m pip install -q --no-index --no-deps --target /tmp/site .deps/wheels/*.whl && export PYTHONPATH=/tmp/site
if ! python3 -c "import flashgla, sys; sys.exit(not flashgla.cuda_available())" 2>/dev/null; then
  step py_install 400 env CMAKE_ARGS="-DCMAKE_CUDA_ARCHITECTURES=90a" FLASHGLA_CUDA=ON \
    CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" python3 -m pip install --no-build-isolation --no-deps .
fi
if [ "$PART" = op ]; then
  step dist_tests 420 python3 -m pytest -q -p no:cacheprovider -rfs --rootdir=/tmp \
    "$PWD/tests/python/test_distributed_gpu.py" "$PWD/tests/python/test_distributed_model_gpu.py"
  tail -3 "$LOGS/dist_tests.log"
  step cp_1gpu 300 python3 bench/bench_cp.py --tokens "$TOKENS"
  step cp_2gpu 300 torchrun --nproc_per_node 2 bench/bench_cp.py --tokens "$TOKENS"
  [ "$gpus" -ge 4 ] && step cp_4gpu 400 torchrun --nproc_per_node 4 bench/bench_cp.py --tokens "$TOKENS" ${FIND_MAX:+--find-max}
  for n in 1 2 4; do [ -f "$LOGS/cp_${n}gpu.log" ] && { echo "== cp ${n} GPU"; tail -12 "$LOGS/cp_${n}gpu.log"; }; done
else
  list=1,2; [ "$gpus" -ge 4 ] && list=1,2,4
  step fsdp 540 python3 bench/bench_fsdp.py --gpus "$list" --variants "${VARIANTS:-plain,probe,tuned}"
  [ "$gpus" -ge 4 ] && step lm_cp 400 python3 bench/bench_fsdp.py --mode cp --gpus 4
  for n in fsdp lm_cp; do [ -f "$LOGS/$n.log" ] && { echo "== $n"; tail -20 "$LOGS/$n.log"; }; done
fi
echo
printf '%-14s %-14s %s\n' step result time
for row in "${SUMMARY[@]}"; do IFS='|' read -r a b c <<<"$row"; printf '%-14s %-14s %s\n' "$a" "$b" "$c"; done
