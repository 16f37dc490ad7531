#!/usr/bin/env bash
# One GPU-machine run for the transformers integration and CUDA-graph generation (device tool, carry
# [".deps"]; FLA's wheels fla-core and flash-linear-attention in .deps/wheels for the FLA check):
# builds the Python extension for sm_90a; runs the generate/HF/FLA-checkpoint/model Python tests,
# bench/bench_generate.py (340M GLA, hybrid, Transformer++; eager, CUDA graph, transformers' generate)
# and bench/check_fla_checkpoint.py. Logs and results go to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-device_generate_out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --target /tmp/site .deps/wheels/*.whl
export PYTHONPATH=/tmp/site
python3 -c "import transformers; print('transformers', transformers.__version__)"

SECONDS=0
cmake -S . -B build-dev -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHGLA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DFLASHGLA_PYTHON=ON >"$OUT/configure.log" 2>&1
if ! cmake --build build-dev -j16 --target flashgla_python >"$OUT/build.log" 2>&1; then
  grep -E "error|FAILED" "$OUT/build.log" | head -30; exit 1
fi
echo "build: ${SECONDS} s"

# The plain CMake build copies only the package's top-level files: link the whole package instead.
mkdir -p /tmp/py/flashgla
ln -sf "$PWD"/python/flashgla/* /tmp/py/flashgla/
ln -sf "$PWD"/build-dev/python/flashgla/_C*.so /tmp/py/flashgla/
export PYTHONPATH=/tmp/py:/tmp/site
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/python/test_generate_graph.py tests/python/test_hf.py \
  tests/python/test_fla_checkpoint.py tests/python/test_model.py -rs >"$OUT/py_tests.log" 2>&1
echo "Python generate/HF/FLA/model tests: rc $?"; tail -8 "$OUT/py_tests.log"

timeout 240 python3 bench/check_fla_checkpoint.py >"$OUT/check_fla_checkpoint.log" 2>&1
echo "check_fla_checkpoint: rc $?"; tail -16 "$OUT/check_fla_checkpoint.log"

timeout 400 python3 bench/bench_generate.py --hf --results "$OUT/results_generate.md" >"$OUT/bench_generate.log" 2>&1
echo "bench_generate: rc $?"; tail -14 "$OUT/bench_generate.log"
echo "total: ${SECONDS} s"
