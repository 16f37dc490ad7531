#!/usr/bin/env bash
# One GPU-machine call for issue #26's profile: chunk_gla's kernels at the anchor shapes (bench/profile_floor.py),
# then Nsight Compute over one forward+backward at each shape asked for, a summary per kernel. Carry a flashgla
# package built here for sm_90a (bench/device_floor.sh says how):
#   SITE=.gpu/site SHAPES=3,2 bash bench/device_floor_profile.sh
# Leaves $OUT/kernels.md (the torch.profiler tables), $OUT/ncu_I.txt (ncu's details page per kernel) and
# $OUT/ncu_I.ncu-rep (the report, for the source page and the stalls).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-device_floor_profile_out}
SITE=${SITE:-.gpu/site}
SHAPES=${SHAPES:-3,2}
mkdir -p "$OUT"
export PYTHONPATH="$SITE" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
timeout 200 python3 bench/profile_floor.py --shapes "$SHAPES" >"$OUT/kernels.md" 2>&1 || echo "profile_floor: rc $?"
for i in ${SHAPES//,/ }; do
  timeout "${NCU_LIMIT:-200}" ncu --profile-from-start off --set full -f -o "$OUT/ncu_$i" \
    python3 bench/profile_floor.py --ncu "$i" >"$OUT/ncu_$i.log" 2>&1 || echo "ncu shape $i: rc $?"
  ncu --import "$OUT/ncu_$i.ncu-rep" --page details 2>/dev/null |
    grep -E "^  [a-z_]|Duration|Executed Instructions  |Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers Per Thread|Issue Slots Busy|No Eligible" \
      >"$OUT/ncu_$i.txt"
done
cat "$OUT/kernels.md"
