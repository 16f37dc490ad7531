// The split plan of attention over a KV cache on CUDA (flash-decoding): how many
// key splits each (sequence, KV head, query-row chunk) gets, and how many keys
// a split holds. A pure host function, tested on the CPU
// (tests/test_kvcache_plan.cpp).
//
// Decode is bound by the bytes of K and V, so the plan keeps every SM busy with
// as few splits as it can: a CTA's time is taken as its keys plus a fixed cost
// (reading q, starting its pipeline, writing its output or partial), and the
// kernel's time as the waves of CTAs times that. More splits shorten each CTA
// but, once the CTAs pass one wave, add waves; the fixed cost and the combine
// kernel (combine_keys, paid by any plan of more than one split) make a split
// that buys nothing a loss, so ties go to fewer splits.
#pragma once

#include <algorithm>
#include <cstdint>

namespace flashgla::cuda {

struct KvCachePlanInput {
  int64_t units = 1;         // CTAs per split: B · Hkv · query-row chunks
  int64_t max_seqlen_k = 0;  // host bound on the keys of a sequence
  int64_t slots = 1;         // CTAs resident at once: SMs × CTAs per SM
  int tile = 64;             // split boundaries fall on multiples of this many keys
  int min_keys = 256;        // the fewest keys a split is given (when there are that many)
  int max_splits = 256;
  int fixed_keys = 128;      // a CTA's fixed cost, in keys' worth of time
  int combine_keys = 0;      // the combine kernel's cost, in keys' worth of a CTA's time
  int forced = 0;            // > 0: the caller's num_splits
};

struct KvCachePlan {
  int splits = 1;
  int keys_per_split = 0;  // a multiple of tile; the last split also runs to the sequence's end
};

inline int64_t kvcache_ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// keys_per_split for a given split count: ⌈max_seqlen_k / splits⌉ rounded up to the tile.
inline int64_t kvcache_keys_per_split(int64_t max_seqlen_k, int64_t splits, int64_t tile) {
  return kvcache_ceil_div(kvcache_ceil_div(std::max<int64_t>(max_seqlen_k, 1), splits), tile) * tile;
}

inline KvCachePlan plan_kvcache(const KvCachePlanInput& in) {
  const int64_t tile = std::max(in.tile, 1);
  const int64_t units = std::max<int64_t>(in.units, 1), slots = std::max<int64_t>(in.slots, 1);
  const int64_t keys = std::max<int64_t>(in.max_seqlen_k, 1);
  KvCachePlan plan;
  if (in.forced > 0) {
    plan.splits = in.forced;
    plan.keys_per_split = int(kvcache_keys_per_split(keys, in.forced, tile));
    return plan;
  }
  const int64_t most = std::clamp<int64_t>(keys / std::max(in.min_keys, 1), 1, std::max(in.max_splits, 1));
  int64_t best_cost = -1;
  for (int64_t s = 1; s <= most; ++s) {
    const int64_t per = kvcache_keys_per_split(keys, s, tile);
    const int64_t used = kvcache_ceil_div(keys, per);  // splits that hold keys; more would be empty
    if (used != s) continue;
    const int64_t waves = kvcache_ceil_div(units * s, slots);
    const int64_t cost = waves * (per + in.fixed_keys) + (s > 1 ? in.combine_keys : 0);
    if (best_cost < 0 || cost < best_cost) {
      best_cost = cost;
      plan.splits = int(s);
      plan.keys_per_split = int(per);
    }
  }
  return plan;
}

}  // namespace flashgla::cuda
