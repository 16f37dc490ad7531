#!/usr/bin/env bash
# One GPU-machine run for the GLA layer and model (device tool, carry [".deps"]): builds the library,
# the C++ tests and the Python extension for sm_90a; runs the norm/gate GPU tests (and
# compute-sanitizer on them), the layer/model Python tests, bench/bench_model.py, and a short GPU
# training run of examples/train_gla_lm.py. Logs and results go to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-device_model_out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --target /tmp/site .deps/wheels/*.whl
export PYTHONPATH=/tmp/site

SECONDS=0
cmake -S . -B build-dev -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHGLA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DFLASHGLA_PYTHON=ON >"$OUT/configure.log" 2>&1
if ! cmake --build build-dev -j16 --target flashgla_python flashgla_testing >"$OUT/build.log" 2>&1; then
  grep -E "error|FAILED" "$OUT/build.log" | head -30; exit 1
fi
# The whole test binary when it builds; else this work's test file alone (others' files may be mid-edit).
TESTS=build-dev/flashgla_tests
if ! cmake --build build-dev -j16 --target flashgla_tests >>"$OUT/build.log" 2>&1; then
  TESTS=build-dev/test_norm_only
  cmake --build build-dev -j16 --target gtest_main >>"$OUT/build.log" 2>&1
  g++ -std=c++17 -O2 -DFLASHGLA_WITH_CUDA tests/test_norm.cpp -Iinclude -I. -Isrc -I.deps/googletest/googletest/include \
    build-dev/libflashgla_testing.a build-dev/libflashgla.a "$(find build-dev -name libgtest_main.a | head -1)" \
    "$(find build-dev -name libgtest.a | head -1)" -L/usr/local/cuda/lib64 -lcudart_static -ldl -lrt -pthread -o "$TESTS" \
    >>"$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
fi
echo "build: ${SECONDS} s"

"$TESTS" --gtest_filter='Norm*:Gate*' >"$OUT/cpp_tests.log" 2>&1
echo "C++ norm/gate tests: rc $?"; grep -E "^\[  (PASSED|FAILED|SKIPPED)|Failure" -A3 "$OUT/cpp_tests.log" | head -30

# The plain CMake build copies only the package's top-level files: link the whole package instead.
mkdir -p /tmp/py/flashgla
ln -sf "$PWD"/python/flashgla/* /tmp/py/flashgla/
ln -sf "$PWD"/build-dev/python/flashgla/_C*.so /tmp/py/flashgla/
export PYTHONPATH=/tmp/py:/tmp/site
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/python/test_layer.py tests/python/test_model.py \
  >"$OUT/py_tests.log" 2>&1
echo "Python layer/model tests: rc $?"; tail -4 "$OUT/py_tests.log"

timeout 200 python3 bench/bench_model.py --results "$OUT/results_model.md" >"$OUT/bench_model.log" 2>&1
echo "bench_model: rc $?"; tail -14 "$OUT/bench_model.log"

timeout 60 python3 examples/train_gla_lm.py --preset small --steps 200 --eval-every 100 --out /tmp/run-small \
  --sample-tokens 200 >"$OUT/train_small.log" 2>&1
echo "train small: rc $?"; tr '\r' '\n' <"$OUT/train_small.log" | grep -v '^\[' | tail -12

for tool in memcheck racecheck; do
  timeout 60 compute-sanitizer --tool "$tool" --error-exitcode 1 "$TESTS" \
    --gtest_filter='NormGpu.CallerWorkspace*:NormGpu.Permuted*:GateGpu*' >"$OUT/$tool.log" 2>&1
  echo "$tool: rc $?"; tail -2 "$OUT/$tool.log"
done
echo "total: ${SECONDS} s"
