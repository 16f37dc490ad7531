#!/usr/bin/env bash
# The main job: builds flashgla and runs `flashgla check` and `flashgla bench`
# on the default device (a GPU when one is present, the CPU otherwise).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh

BUILD=${FLASHGLA_BUILD_DIR:-build}
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release ${FLASHGLA_CMAKE_ARGS:-}
cmake --build "$BUILD" -j"${FLASHGLA_JOBS:-$(nproc)}" --target flashgla_cli
"$BUILD/flashgla" check
"$BUILD/flashgla" bench
