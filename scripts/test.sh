#!/usr/bin/env bash
# Builds flashgla and runs every test: the C++ tests (GoogleTest under CTest),
# `flashgla check` at its default shape, and the Python tests. GPU tests run
# where a GPU is present and are reported as skipped otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh

BUILD=${FLASHGLA_BUILD_DIR:-build}
JOBS=${FLASHGLA_JOBS:-$(nproc)}
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi

cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release ${FLASHGLA_CMAKE_ARGS:-}
cmake --build "$BUILD" -j"$JOBS"
ctest --test-dir "$BUILD" --output-on-failure -j"$JOBS"
"$BUILD/flashgla" check
if [ -f scripts/test_python.sh ]; then bash scripts/test_python.sh; fi
