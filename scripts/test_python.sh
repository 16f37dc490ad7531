#!/usr/bin/env bash
# Python tests: builds and installs the flashgla package into a virtual
# environment of its own (.venv-py, reused when present) and runs
# `pytest -q tests/python`; exits with pytest's status.
#
# CUDA backend of the wheel: FLASHGLA_PYTHON_CUDA=ON|OFF|AUTO, else
# FLASHGLA_CUDA, is passed through when set (.ci/run compiles the CUDA sources
# in the C++ build and keeps the wheel CPU-only). When neither is set, the wheel
# is built without CUDA on a machine with no GPU (the CUDA kernels could not run
# there, and compiling them takes long on a small machine), and with AUTO (CUDA
# when nvcc is found and a GPU visible) where a GPU is present.
#
# Needs python3 3.9+ and PyPI (torch==2.13.0 comes from a local wheel where
# pip is configured with one); venv, the Python headers and a C++ compiler are
# installed with apt-get when missing, CMake and Ninja with pip.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${FLASHGLA_VENV:-.venv-py}
PYTHON=${PYTHON:-python3}

# What a fresh Debian/Ubuntu may lack: venv (ensurepip), the Python headers, a C++ compiler.
missing=()
"$PYTHON" -c "import ensurepip" 2>/dev/null || missing+=(python3-venv)
"$PYTHON" -c "import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h')))" ||
  missing+=(python3-dev)
command -v c++ >/dev/null || missing+=(g++)
if [ ${#missing[@]} -gt 0 ] && command -v apt-get >/dev/null; then
  SUDO=""
  if [ "$(id -u)" != 0 ] && command -v sudo >/dev/null; then SUDO=sudo; fi
  echo "test_python: apt-get install ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "test_python: creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"

# The build tools live in the venv too: with --no-build-isolation the build
# directory (build-py/, see pyproject.toml) is reused and a second run rebuilds
# only what changed (an isolated build environment forces a full rebuild).
tools=("scikit-build-core>=0.10" "nanobind>=2.0")
cmake_version=$(cmake --version 2>/dev/null | head -1 | grep -oE '[0-9]+\.[0-9]+' | head -1 || true)
if [ -z "$cmake_version" ] || ! printf '3.24\n%s\n' "$cmake_version" | sort -V -C; then tools+=("cmake>=3.24"); fi
command -v ninja >/dev/null || tools+=(ninja)
"$PY" -m pip install -q torch==2.13.0 pytest numpy transformers safetensors accelerate "${tools[@]}"

FLASHGLA_CUDA=${FLASHGLA_PYTHON_CUDA:-${FLASHGLA_CUDA:-}}
if [ -z "$FLASHGLA_CUDA" ]; then
  if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
    export FLASHGLA_CUDA=AUTO
  else
    export FLASHGLA_CUDA=OFF
  fi
fi
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
export FLASHGLA_CUDA
echo "test_python: pip install . (FLASHGLA_CUDA=$FLASHGLA_CUDA)"
"$PY" -m pip install -q --no-build-isolation .

exec "$PY" -m pytest -q tests/python
