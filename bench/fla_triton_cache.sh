# Sourced by the device scripts that run FLA 0.6.0 beside flashgla (device_gates.sh, device_floor.sh): FLA's
# Triton compiles and autotune picks kept from one GPU-machine call to the next. FLA 0.6.0 asks Triton to cache
# its autotune results (FLA_CACHE_RESULTS=1, where Triton's autotune takes cache_results), and Triton caches every
# compiled kernel, both under TRITON_CACHE_DIR. A call starts from the cache an earlier call left, if one is
# carried, and leaves its own in $OUT in pieces of 15 MiB (the limit per returned file). A machine still warm from
# the last call keeps its cache in /tmp anyway.
#   fla_cache_restore NAME   TRITON_CACHE_DIR=/tmp/triton_NAME, filled from ${CACHE_IN:-.gpu/triton_NAME.tgz}
#                            (its .part-* pieces, copied there from an earlier call's files, or one archive)
#   fla_cache_save NAME      $OUT/triton_NAME.tgz.part-*

fla_cache_restore() {
  local name=$1 archive=${CACHE_IN:-.gpu/triton_$1.tgz}
  export TRITON_CACHE_DIR=/tmp/triton_$name FLA_CACHE_RESULTS=1
  mkdir -p "$TRITON_CACHE_DIR"
  if ls "$archive".part-* >/dev/null 2>&1; then
    cat "$archive".part-* | tar xzf - -C "$TRITON_CACHE_DIR" && echo "$name: FLA's Triton cache from $archive.part-*"
  elif [ -f "$archive" ]; then
    tar xzf "$archive" -C "$TRITON_CACHE_DIR" && echo "$name: FLA's Triton cache from $archive"
  fi
}

fla_cache_save() {
  local name=$1
  tar czf - -C "/tmp/triton_$name" . | split -b 15M - "$OUT/triton_$name.tgz.part-"
  echo "$name: FLA's Triton cache, $(cat "$OUT"/triton_"$name".tgz.part-* | wc -c) bytes in" \
    "$(ls "$OUT"/triton_"$name".tgz.part-* | wc -l) pieces"
}
