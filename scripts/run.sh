#!/usr/bin/env bash
# The main job: builds flashgla and runs `flashgla check` and `flashgla bench`
# on the default device (a GPU when one is present, the CPU otherwise).
# The CUDA backend is built when a GPU is visible and nvcc found, or with
# FLASHGLA_CUDA=ON (scripts/cuda_choice.sh); the first line says which.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/cuda_choice.sh
flashgla_choose_cuda scripts/run.sh
bash scripts/install_deps.sh

BUILD=${FLASHGLA_BUILD_DIR:-build}
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHGLA_CUDA="$FLASHGLA_CUDA_BUILD" \
  ${FLASHGLA_CMAKE_ARGS:-}
cmake --build "$BUILD" -j"${FLASHGLA_JOBS:-$(nproc)}" --target flashgla_cli
"$BUILD/flashgla" check
"$BUILD/flashgla" bench
