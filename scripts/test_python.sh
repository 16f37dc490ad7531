#!/usr/bin/env bash
# Python tests: builds and installs the flashgla package into a virtual
# environment of its own (.venv-py, reused when present) and runs
# `pytest -q tests/python`; exits with pytest's status.
#
# CUDA backend of the wheel: FLASHGLA_CUDA=ON|OFF|AUTO is passed through when
# set. When it is not set, the wheel is built without CUDA on a machine with no
# GPU (the CUDA kernels could not run there, and compiling them takes long on a
# small machine; the C++ build of scripts/test.sh compiles them anyway), and
# with AUTO (CUDA when nvcc is found) where a GPU is present.
#
# Needs python3 with venv and its headers (Debian: python3-venv, python3-dev),
# a C++ compiler, and PyPI (torch==2.13.0 comes from a local wheel where pip
# is configured with one).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${FLASHGLA_VENV:-.venv-py}
PYTHON=${PYTHON:-python3}

if [ ! -x "$VENV/bin/python" ]; then
  echo "test_python: creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"

# The build tools live in the venv too: with --no-build-isolation the build
# directory (build-py/, see pyproject.toml) is reused and a second run rebuilds
# only what changed (an isolated build environment forces a full rebuild).
"$PY" -m pip install -q torch==2.13.0 pytest numpy "scikit-build-core>=0.10" "nanobind>=2.0"

if [ -z "${FLASHGLA_CUDA:-}" ]; then
  if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
    export FLASHGLA_CUDA=AUTO
  else
    export FLASHGLA_CUDA=OFF
  fi
fi
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
echo "test_python: pip install . (FLASHGLA_CUDA=$FLASHGLA_CUDA)"
"$PY" -m pip install -q --no-build-isolation .

exec "$PY" -m pytest -q tests/python
