#!/usr/bin/env bash
# On an H100/H200 (through the device tool, carry [".deps"]): the kernels a
# build without sm_90a machine code runs there. Builds the tests twice, for
# sm_90a and for plain sm_90 (whose Hopper kernels have empty bodies), then:
#   sm_90a: the attention tests with both Hopper kernels required (an error if
#           the library thinks it cannot run them) and the GLA tests;
#   sm_90:  the same GLA and attention tests with the default choice (they must
#           pass on the portable kernels), and a required Hopper kernel must
#           give the error that it cannot run (no sm_90a machine code).
# Prints a short table last.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-arch_check_out}
mkdir -p "$OUT"
declare -a SUMMARY
step() {
  local name=$1; shift
  local start=$SECONDS rc=0
  "$@" >"$OUT/$name.log" 2>&1 || rc=$?
  SUMMARY+=("$name|$([ $rc = 0 ] && echo PASS || echo "FAIL (rc $rc)")|$((SECONDS - start)) s|$(grep -E '^\[  (PASSED|FAILED) ' "$OUT/$name.log" | tr '\n' ' ')")
  [ $rc = 0 ] || tail -15 "$OUT/$name.log"
}
build() {
  cmake -S . -B "build-$1" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHGLA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$1" &&
    cmake --build "build-$1" -j"$(nproc)" --target flashgla_tests
}
FILTER='*AttentionCuda*:CudaGla*'
step build_90a build 90a
step tests_90a_hopper_required env FLASHGLA_ATTENTION_KERNEL=hopper FLASHGLA_ATTENTION_BACKWARD=hopper \
  build-90a/flashgla_tests --gtest_brief=1 --gtest_filter='Lengths/AttentionCuda.*:GroupedHeads/AttentionCuda.*'
step tests_90a_default build-90a/flashgla_tests --gtest_brief=1 --gtest_filter="$FILTER"
step build_90 build 90
step tests_90_default build-90/flashgla_tests --gtest_brief=1 --gtest_filter="$FILTER"
# A required Hopper kernel without sm_90a code: the test fails with the error naming the variable.
step tests_90_hopper_required_errors bash -c "FLASHGLA_ATTENTION_KERNEL=hopper build-90/flashgla_tests \
  --gtest_filter='Lengths/AttentionCuda.MatchesFp64Reference/0' 2>&1 | grep -q 'no sm_90a machine code'"
echo
printf '%-34s %-12s %-8s %s\n' step result time tests
for row in "${SUMMARY[@]}"; do IFS='|' read -r a b c d <<<"$row"; printf '%-34s %-12s %-8s %s\n' "$a" "$b" "$c" "$d"; done
