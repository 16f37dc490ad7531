#!/usr/bin/env bash
# Same-process-style A/B of two builds of the `flashgla` command:
#   [AB_GPUS="0 1 2 3"] [AB_ONLY=regex] bash bench/ab_cli.sh BASE_BIN NEW_BIN [ROUNDS]
# Times each shape with BASE and NEW alternately on one GPU (ROUNDS rounds, default 3) through
# `flashgla bench` (CUDA events, median of 50 after 10 warm-ups; same seed, same inputs)
# and prints one row per shape and pass: the median over rounds of each side and NEW/BASE.
# With AB_GPUS the shapes are dealt out over those GPUs, one lane each (a shape's two sides
# always share their GPU); most of a run is the CPU making the inputs, so lanes save time.
set -euo pipefail
base=$1 new=$2 rounds=${3:-3}
# label|flashgla bench arguments
shapes=(
  "gla B8 T2048 H16 d64|--ops chunked -B 8 -T 2048 -H 16 -K 64 -V 64 --pass fwd,fwdbwd"
  "gla B8 T4096 H16 d128|--ops chunked -B 8 -T 4096 -H 16 -K 128 -V 128 --pass fwd,fwdbwd"
  "gla B2 T16384 H16 d128|--ops chunked -B 2 -T 16384 -H 16 -K 128 -V 128 --pass fwd,fwdbwd"
  "gla B4 T4096 H4 K256 V512|--ops chunked -B 4 -T 4096 -H 4 -K 256 -V 512 --pass fwd,fwdbwd"
  "gla B8 T2048 H4 K128 V256|--ops chunked -B 8 -T 2048 -H 4 -K 128 -V 256 --pass fwd,fwdbwd"
  "gla f16 B8 T4096 H16 d128|--ops chunked --dtype f16 -B 8 -T 4096 -H 16 -K 128 -V 128 --pass fwd,fwdbwd"
  "simple gla B8 T4096 H16 d128|--ops chunked --gate scalar -B 8 -T 4096 -H 16 -K 128 -V 128 --pass fwd,fwdbwd"
  "recurrent B8 T2048 H16 d64|--ops recurrent -B 8 -T 2048 -H 16 -K 64 -V 64 --pass fwd"
  "decode N64 H16 d128|--ops decode -B 64 -H 16 -K 128 -V 128 --pass fwd"
  "decode N1 H16 d128|--ops decode -B 1 -H 16 -K 128 -V 128 --pass fwd"
  "attention B8 T2048 H16 d64|--ops attention -B 8 -T 2048 -H 16 -K 64 -V 64 --pass fwd,fwdbwd"
  "attention B4 T8192 H16 d128|--ops attention -B 4 -T 8192 -H 16 -K 128 -V 128 --pass fwd,fwdbwd"
)
# AB_ONLY: an extended regular expression; only the shapes whose label matches it run.
if [ -n "${AB_ONLY:-}" ]; then
  kept=()
  for s in "${shapes[@]}"; do [[ ${s%%|*} =~ $AB_ONLY ]] && kept+=("$s"); done
  shapes=("${kept[@]}")
fi
# The table of what was measured (also when the run is cut short: TERM).
print_table() {
  echo "== $1"
  printf '%-32s %-7s %10s %10s %7s\n' shape pass base_ms new_ms new/base
  for i in "${!shapes[@]}"; do
    label=${shapes[$i]%%|*}
    for pass in $(awk -v s="$i" '$1 == s { print $2 }' "$tmp/new" | sort -u); do
      med() { awk -v s="$i" -v p="$pass" '$1 == s && $2 == p { print $3 }' "$tmp/$1" | sort -g | awk '{ a[NR] = $1 } END { if (NR) print a[int((NR + 1) / 2)] }'; }
      b=$(med base) n=$(med new)
      printf '%-32s %-7s %10s %10s %7s\n' "$label" "$pass" "$b" "$n" "$(awk -v b="$b" -v n="$n" 'BEGIN { if (b > 0) printf "%.3f", n / b }')"
    done
  done
}
tmp=$(mktemp -d)
read -r -a gpus <<<"${AB_GPUS:-}"
lanes=${#gpus[@]}
[ "$lanes" -gt 0 ] || lanes=1
lane() {  # lane index: its shapes, every round
  for ((r = 0; r < rounds; r++)); do
    for i in "${!shapes[@]}"; do
      [ $((i % lanes)) = "$1" ] || continue
      args=${shapes[$i]#*|}
      for side in base new; do
        bin=$base; [ $side = new ] && bin=$new
        # rows: "op pass ms ..." after the header line
        $bin bench $args --seed 7 2>/dev/null | awk -v s="$i" 'NR > 2 && NF >= 3 { print s, $(NF-3), $(NF-2) }' >>"$tmp/$side.$1"
      done
    done
  done
}
trap 'cat "$tmp"/base.* >"$tmp/base" 2>/dev/null; cat "$tmp"/new.* >"$tmp/new" 2>/dev/null; print_table "cut short"; exit 124' TERM
for ((l = 0; l < lanes; l++)); do
  if [ ${#gpus[@]} -gt 0 ]; then CUDA_VISIBLE_DEVICES=${gpus[$l]} lane "$l" & else lane "$l" & fi
done
wait
cat "$tmp"/base.* >"$tmp/base"
cat "$tmp"/new.* >"$tmp/new"
print_table "$rounds rounds"
