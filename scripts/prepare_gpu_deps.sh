#!/usr/bin/env bash
# Fills .deps/ (git-ignored) with what the GPU machine lacks and cannot download:
# GoogleTest sources and the Python build tools as wheels. Run here, then pass
# carry [".deps"] to the device tool.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .deps/wheels
[ -d .deps/googletest ] || cp -r /usr/src/googletest .deps/googletest
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 -d .deps/wheels \
  scikit-build-core==1.1.2 pathspec packaging nanobind==3.1.0
ls .deps .deps/wheels
