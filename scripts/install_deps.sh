#!/usr/bin/env bash
# Installs what building and testing flashgla needs on a fresh Debian/Ubuntu
# machine: a C++ compiler, CMake, Ninja and GoogleTest. (The CUDA toolkit is
# optional: the CUDA backend is built when nvcc is found.)
set -euo pipefail

SUDO=""
if [ "$(id -u)" != 0 ] && command -v sudo >/dev/null; then SUDO=sudo; fi

missing=()
command -v g++ >/dev/null || missing+=(g++)
[ -f /usr/include/gtest/gtest.h ] || missing+=(libgtest-dev)
if [ ${#missing[@]} -gt 0 ]; then
  echo "install_deps: apt-get install ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

pip_missing=()
command -v cmake >/dev/null || pip_missing+=("cmake>=3.24")
command -v ninja >/dev/null || pip_missing+=(ninja)
if [ ${#pip_missing[@]} -gt 0 ]; then
  echo "install_deps: pip install ${pip_missing[*]}"
  python3 -m pip install -q "${pip_missing[@]}"
fi

# nvcc is often installed but not on PATH.
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "install_deps: nvcc found at /usr/local/cuda/bin (add it to PATH to build the CUDA backend)"
fi
