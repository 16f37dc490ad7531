#!/usr/bin/env bash
# Compile here, run there: builds what PART=P of scripts/gpu_session.sh runs, for sm_90a only, and packs it
# into .gpu/ (git-ignored; carry [".gpu"], under the device tool's 64 MiB): the flashgla command and the C++
# tests of this tree, the flashgla command of BASE (a commit, for the A/B; default: none), and the Python
# package built for the GPU machine's Python (3.12; PYTHON names an interpreter of that version).
#   bash scripts/pack_gpu_binaries.sh [BASE]
# FLASHGLA_BUILD_DIR: the build folder of this tree (default build-sm90a; an existing sm_90a Release build with
# CUDA on saves its rebuild).
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:-}
PYTHON=${PYTHON:-python3.12}
JOBS=${FLASHGLA_JOBS:-$(nproc)}
arch=(-DCMAKE_BUILD_TYPE=Release -DFLASHGLA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a)
build=${FLASHGLA_BUILD_DIR:-build-sm90a}
# PACK_WHEEL=0 (below) builds the extension in the same folder: configured with it from the start, since it
# compiles the library position-independent (a later switch would rebuild everything).
[ "${PACK_WHEEL:-1}" = 0 ] && py=(-DFLASHGLA_PYTHON=ON -DPython_EXECUTABLE="$(command -v "$PYTHON")") || py=()
mkdir -p .gpu
cmake -S . -B "$build" -G Ninja "${arch[@]}" "${py[@]}" >/dev/null
cmake --build "$build" -j"$JOBS" --target flashgla_cli flashgla_tests
for b in flashgla flashgla_tests; do strip -o ".gpu/$b" "$build/$b" && xz -T"$JOBS" -6 -f ".gpu/$b"; done
if [ -n "$base" ]; then
  rm -rf build-base-src && mkdir build-base-src && git archive "$base" | tar -x -C build-base-src
  cmake -S build-base-src -B build-base-sm90a -G Ninja "${arch[@]}" -DFLASHGLA_TESTS=OFF >/dev/null
  cmake --build build-base-sm90a -j"$JOBS" --target flashgla_cli
  strip -o .gpu/flashgla_base build-base-sm90a/flashgla && xz -T"$JOBS" -6 -f .gpu/flashgla_base
fi
# The Python package as an archive to unpack into a PYTHONPATH folder there. Default: the wheel's package,
# without the wheel's copy of the command (a wheel of both would not fit the carry limit); the wheel compiles the
# library again. PACK_WHEEL=0: the extension built in this build folder instead (only its bindings compile), the
# package's sources beside it; it has no installed metadata, so the five packaging tests of tests/python fail there.
site=$(mktemp -d)
if [ "${PACK_WHEEL:-1}" = 0 ]; then
  cmake --build "$build" -j"$JOBS" --target flashgla_python
  cp -r "$build/python/flashgla" "$site/" && cp python/flashgla/py.typed "$site/flashgla/"
  rm -rf "$site"/flashgla/__pycache__ && strip "$site"/flashgla/_C*.so
else
  wheels=$(mktemp -d)
  FLASHGLA_CUDA=ON CMAKE_ARGS="-DCMAKE_CUDA_ARCHITECTURES=90a" CMAKE_BUILD_PARALLEL_LEVEL=$JOBS \
    "$PYTHON" -m pip wheel -q --no-build-isolation --no-deps . -w "$wheels"
  (cd "$site" && unzip -q "$wheels"/flashgla-*.whl && rm -rf flashgla-*.data && strip flashgla/_C*.so)
  rm -rf "$wheels"
fi
tar -C "$site" -cf - . | xz -T"$JOBS" -6 >.gpu/site.tar.xz
rm -rf "$site"
ls -la .gpu
