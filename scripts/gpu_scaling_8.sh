#!/usr/bin/env bash
# The 8-GPU scaling run (issue: scaling on 8 GPUs). Device tool, kind nvidia-h100-x8 (or -h200-x8),
# carry [".deps"]:
#   bash scripts/gpu_scaling_8.sh
# Installs the package for sm_90a, then: context-parallel chunk_gla fwd+bwd strong scaling at 1M and 2M
# tokens (H16, K = V = 128) on 1, 2, 4, 8 GPUs with the breakdown (bench/bench_cp.py, results_cp.md);
# FSDP2 weak scaling of the 340M LM on 1 -> 8 GPUs at 16K tokens per GPU; the LM with context
# parallelism at 1M and 2M tokens on 8 GPUs (bench/bench_fsdp.py, results_multi_gpu.md).
# NVLink multicast stays off. Results and logs come back in $OUT/scaling8.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-scaling8_out}
LOGS=$(mktemp -d)
mkdir -p "$OUT"
run() { local name=$1 limit=$2; shift 2; echo "== $name"; timeout "$limit" "$@" 2>&1 | tee "$LOGS/$name.log" | tail -14
        cp bench/results_cp.md bench/results_multi_gpu.md "$LOGS"/ 2>/dev/null; tar czf "$OUT/scaling8.tgz" -C "$LOGS" .; }
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --target /tmp/site .deps/wheels/*.whl && export PYTHONPATH=/tmp/site
run install 420 env CMAKE_ARGS="-DCMAKE_CUDA_ARCHITECTURES=90a" FLASHGLA_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
  python3 -m pip install --no-build-isolation --no-deps .
TOKENS=${TOKENS:-1048576,2097152}
run cp_1gpu 300 python3 bench/bench_cp.py --tokens "$TOKENS" --repeats 3
for n in 2 4 8; do run "cp_${n}gpu" 300 torchrun --nproc_per_node "$n" bench/bench_cp.py --tokens "$TOKENS" --repeats 3; done
run fsdp 600 python3 bench/bench_fsdp.py --gpus 1,2,4,8 --variants probe,tuned --steps 6 --warmup 2
run lm_cp 600 python3 bench/bench_fsdp.py --mode cp --gpus 8 --contexts 1048576,2097152
