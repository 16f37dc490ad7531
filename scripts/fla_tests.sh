#!/usr/bin/env bash
# FLA 0.6.0's own op tests (gla, simple_gla, linear_attn) against flashgla's ops, on the GPU machine:
# FLA's test files import fla.ops.gla.chunk_gla & co.; a pytest plugin written here at run time points
# those names at flashgla's ops before the test files are collected, so FLA's tests, references and
# tolerances judge flashgla. Prints the table (test file, passed/total, failures) and writes it to
# $OUT/fla_tests.md. FLA's code is never committed: it comes from a folder carried to the machine.
#
# Prepare, once, on a machine with PyPI (in the repository root; .deps/ is git-ignored):
#   pip download flash-linear-attention==0.6.0 fla-core==0.6.0 --no-deps -d .deps/fla
# and FLA's test files, which those PyPI archives do not hold: the source archive of the v0.6.0 tag of
# the fla-org/flash-linear-attention repository (its tests/ops folder is what runs), saved as a
# .tar.gz in .deps/fla (or unpacked there as a folder holding tests/ops). Without GitHub, a stored mirror's
# tests serve (`git -C MIRROR archive --prefix=fla/ HEAD tests | gzip > .deps/fla/fla-tests.tar.gz`): they are
# another version's files, so say which beside the table (bench/results_fla_tests.md). FLA needs einops, and
# flash-linear-attention needs transformers: as the other device scripts, wheels of those in
# .deps/wheels are installed when present (bench/device_generate.sh). Then (device tool, carry
# [".deps"]):
#   bash scripts/fla_tests.sh
# Environment: FLA_DIR (default .deps/fla), OUT (default /tmp/fla_tests_out), BUILD (default build-fla;
# SKIP_BUILD=1 uses the flashgla importable as it is), CUDA_ARCH (default 90a), FLA_TESTS_K (a pytest
# -k expression for every file instead of the defaults below), FILE_TIMEOUT (default 900 s per file),
# RESULTS (a markdown file to append the dated table to, e.g. bench/results_fla_tests.md).
#
# Which tests: test_gla*.py, test_simple_gla*.py and test_linear_attn*.py of tests/ops, restricted
# with -k to the ops flashgla has: "test_chunk or test_fused_recurrent" (chunk_* and fused_recurrent_*),
# and for linear_attn also "test_fused_chunk" (fused_chunk_linear_attn).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
FLA_DIR=${FLA_DIR:-.deps/fla}
OUT=${OUT:-/tmp/fla_tests_out}
BUILD=${BUILD:-build-fla}
FILE_TIMEOUT=${FILE_TIMEOUT:-900}
mkdir -p "$OUT/junit" "$OUT/logs"
WORK=$(mktemp -d /tmp/fla_tests.XXXXXX)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | tee "$OUT/gpu.txt"

# ---- FLA: the package (wheels) and the test files (a source archive or folder) ----------------------
[ -d "$FLA_DIR" ] || { echo "fla_tests: no $FLA_DIR (see this script's header)"; exit 2; }
SITE=$WORK/site
mkdir -p "$SITE"
wheels=()
for w in .deps/wheels/*.whl "$FLA_DIR"/*.whl; do [ -e "$w" ] && wheels+=("$w"); done
if [ ${#wheels[@]} -gt 0 ]; then
  python3 -m pip install -q --no-index --no-deps --target "$SITE" "${wheels[@]}" >"$OUT/logs/pip.log" 2>&1 ||
    { echo "fla_tests: pip install of the carried wheels failed:"; tail -5 "$OUT/logs/pip.log"; exit 2; }
fi
SRC=""
for archive in "$FLA_DIR"/*.tar.gz; do
  [ -e "$archive" ] || continue
  if tar tzf "$archive" | grep '/tests/ops/' >/dev/null; then  # not grep -q: tar would die of SIGPIPE
    tar xzf "$archive" -C "$WORK" && SRC=$(dirname "$(dirname "$(find "$WORK" -path '*/tests/ops' -type d | head -1)")")
    break
  fi
done
if [ -z "$SRC" ]; then
  found=$(find "$FLA_DIR" -path '*/tests/ops' -type d 2>/dev/null | head -1)
  [ -n "$found" ] && SRC=$(cd "$(dirname "$(dirname "$found")")" && pwd)
fi
[ -n "$SRC" ] || { echo "fla_tests: no FLA test files (tests/ops) in $FLA_DIR: add the v0.6.0 source archive"; exit 2; }
echo "FLA tests from $SRC"

# ---- flashgla: the Python extension for this GPU --------------------------------------------------
PY=$WORK/py
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  SECONDS=0
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHGLA_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90a}" -DFLASHGLA_PYTHON=ON -DFLASHGLA_TESTS=OFF \
    >"$OUT/logs/configure.log" 2>&1 &&
    cmake --build "$BUILD" -j"$(nproc)" --target flashgla_python >"$OUT/logs/build.log" 2>&1 ||
    { grep -E "error|FAILED" "$OUT/logs/build.log" | head -20; exit 1; }
  echo "build: ${SECONDS} s"
  # The CMake build holds the extension only: the package is the source folder plus it.
  mkdir -p "$PY/flashgla"
  for f in "$ROOT"/python/flashgla/*; do ln -sfn "$f" "$PY/flashgla/"; done
  so=$(find "$ROOT/$BUILD" -name '_C*.so' | head -1)
  [ -n "$so" ] || { echo "fla_tests: no flashgla._C in $BUILD"; exit 1; }
  ln -sfn "$so" "$PY/flashgla/"
fi

# ---- the plugin that points FLA's op names at flashgla ---------------------------------------------
mkdir -p "$WORK/plugin"
cat >"$WORK/plugin/flashgla_for_fla.py" <<'EOF'
"""pytest plugin: FLA's op names (in their packages and modules) become flashgla's ops before FLA's test
files import them."""
import importlib

import flashgla

OPS = {
    "fla.ops.gla": ["chunk_gla", "fused_recurrent_gla"],
    "fla.ops.gla.chunk": ["chunk_gla"],
    "fla.ops.gla.fused_recurrent": ["fused_recurrent_gla"],
    "fla.ops.simple_gla": ["chunk_simple_gla", "fused_recurrent_simple_gla"],
    "fla.ops.simple_gla.chunk": ["chunk_simple_gla"],
    "fla.ops.simple_gla.fused_recurrent": ["fused_recurrent_simple_gla"],
    "fla.ops.linear_attn": ["chunk_linear_attn", "fused_chunk_linear_attn", "fused_recurrent_linear_attn"],
    "fla.ops.linear_attn.chunk": ["chunk_linear_attn"],
    "fla.ops.linear_attn.fused_chunk": ["fused_chunk_linear_attn"],
    "fla.ops.linear_attn.fused_recurrent": ["fused_recurrent_linear_attn"],
}
OPS["fla.ops"] = sorted({name for names in OPS.values() for name in names})

PATCHED = []
for module_name, names in OPS.items():
    module = importlib.import_module(module_name)
    for name in names:
        if hasattr(module, name):
            setattr(module, name, getattr(flashgla, name))
            PATCHED.append(f"{module_name}.{name}")
missing = [m for m, names in OPS.items() if m != "fla.ops" and not any(p.startswith(m + ".") for p in PATCHED)]
if missing:
    raise ImportError(f"flashgla_for_fla: FLA has none of the expected ops in {missing}: another FLA layout?")


def pytest_report_header(config):
    return [f"flashgla {flashgla.__version__} ({flashgla.__file__}) in place of: {', '.join(PATCHED)}"]
EOF

export PYTHONPATH=$WORK/plugin:$PY:$SITE${PYTHONPATH:+:$PYTHONPATH}
python3 -c "import flashgla, fla; print('flashgla', flashgla.__version__, flashgla.__file__, '| FLA', fla.__version__, fla.__file__)
import flashgla_for_fla; print('flashgla in place of', ', '.join(flashgla_for_fla.PATCHED))" |
  tee "$OUT/versions.txt"
[ "${PIPESTATUS[0]}" = 0 ] || { echo "fla_tests: flashgla, FLA or the plugin does not import"; exit 1; }

# ---- run each test file ------------------------------------------------------------------------------
cd "$SRC"
files=$(ls tests/ops/test_gla*.py tests/ops/test_simple_gla*.py tests/ops/test_linear_attn*.py 2>/dev/null)
[ -n "$files" ] || { echo "fla_tests: no test_gla*/test_simple_gla*/test_linear_attn* files in $SRC/tests/ops"; exit 2; }
for f in $files; do
  name=$(basename "$f" .py)
  k=${FLA_TESTS_K:-}
  if [ -z "$k" ]; then
    case $name in
      test_linear_attn*) k="test_chunk or test_fused_chunk or test_fused_recurrent" ;;
      *) k="test_chunk or test_fused_recurrent" ;;
    esac
  fi
  echo "$f (-k '$k')"
  echo "$k" >"$OUT/junit/$name.k"
  timeout "$FILE_TIMEOUT" python3 -m pytest -q -p flashgla_for_fla -p no:cacheprovider -k "$k" -rfE \
    --junitxml="$OUT/junit/$name.xml" "$f" >"$OUT/logs/$name.log" 2>&1
  echo "  rc $? ($(tail -1 "$OUT/logs/$name.log"))"
done
cd "$ROOT"

# ---- the table -----------------------------------------------------------------------------------------
python3 - "$OUT" "${RESULTS:-}" <<'EOF'
import datetime
import glob
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

out, results = sys.argv[1], sys.argv[2]
rows = ["| FLA 0.6.0 test file (-k) | passed | failures |", "|---|---|---|"]
SHOWN = 8  # failures listed per file
for path in sorted(glob.glob(os.path.join(out, "junit", "*.xml"))):
    name = os.path.basename(path)[:-4]
    k_path = path[:-4] + ".k"
    k = open(k_path).read().strip() if os.path.exists(k_path) else ""
    # A test that also fails in teardown has two entries: one verdict per test, its first failure.
    verdicts = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        key = (case.get("classname"), case.get("name"))
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if case.find("skipped") is not None and bad is None:
            verdicts.setdefault(key, "skipped")
            continue
        if bad is None:
            verdicts.setdefault(key, None)
            continue
        message = (bad.get("message") or bad.text or "").strip().splitlines()
        if not verdicts.get(key):
            verdicts[key] = f"{key[1]}: {(message[0] if message else '?')[:160]}"
    run = {key: v for key, v in verdicts.items() if v != "skipped"}
    failures = [v for v in run.values() if v]
    listed = failures[:SHOWN] + ([f"... and {len(failures) - SHOWN} more"] if len(failures) > SHOWN else [])
    rows.append(f"| {name}.py ({k}) | {len(run) - len(failures)}/{len(run)} | "
                f"{'<br>'.join(listed).replace('|', '/')} |")
gpu = open(os.path.join(out, "gpu.txt")).read().strip() if os.path.exists(os.path.join(out, "gpu.txt")) else "?"
if os.environ.get("SKIP_BUILD") == "1":  # the flashgla that was importable, not necessarily this tree's
    import flashgla
    tested = f"flashgla {flashgla.__version__} from {os.path.dirname(flashgla.__file__)}"
else:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    tested = f"flashgla built from {commit}"
heading = f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {gpu}, {tested}"
text = "\n".join([heading, ""] + rows) + "\n"
print(text)
open(os.path.join(out, "fla_tests.md"), "w").write(text)
if results:
    with open(results, "a") as f:
        f.write(f"\n## FLA 0.6.0's op tests against flashgla ({heading})\n\n" + "\n".join(rows) + "\n")
EOF
rm -rf "$WORK"
