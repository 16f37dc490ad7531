// The split plan of CUDA attention over a KV cache (src/cuda/attention/kvcache_plan.h) on the CPU: its
// choices at the shapes of bench/bench_kvcache.py on an H100-like device running the tensor-core kernel
// (132 SMs × 2 resident CTAs, 64-key steps, a CTA's fixed cost worth 128 keys), worked out here from the
// rule (waves of CTAs × (keys per split + fixed cost), plus the combine's cost, ties to fewer splits), and its
// invariants.
#include <gtest/gtest.h>

#include <cstdint>

#include "cuda/attention/kvcache_plan.h"

namespace flashgla::cuda {
namespace {

KvCachePlanInput h100(int64_t batch, int64_t kv_heads, int64_t max_seqlen_k) {
  KvCachePlanInput in;
  in.units = batch * kv_heads;  // one query row chunk: decode with a group of at most 16
  in.max_seqlen_k = max_seqlen_k;
  in.slots = 132 * 2;
  in.tile = 64;
  in.min_keys = 64;
  in.fixed_keys = 128;
  return in;
}

void expect_plan(const KvCachePlanInput& in, int splits, int keys_per_split) {
  const KvCachePlan plan = plan_kvcache(in);
  EXPECT_EQ(plan.splits, splits) << "units " << in.units << ", keys " << in.max_seqlen_k;
  EXPECT_EQ(plan.keys_per_split, keys_per_split) << "units " << in.units << ", keys " << in.max_seqlen_k;
}

TEST(KvCachePlan, FewSequencesFillOneWave) {
  // B 1, 16 KV heads: 16 splits make 256 CTAs, one wave of 264; a 17th would start a second wave.
  expect_plan(h100(1, 16, 1024), 16, 64);
  expect_plan(h100(1, 16, 16384), 16, 1024);
  expect_plan(h100(1, 16, 32768), 16, 2048);
  // B 8: 128 units, two splits fill the wave (a third would make 384 CTAs, two waves of 1408 + 128).
  expect_plan(h100(8, 16, 4096), 2, 2048);
  // GQA 32 / 8 at B 8: 64 units, four splits.
  expect_plan(h100(8, 8, 4096), 4, 1024);
}

TEST(KvCachePlan, ManySequencesDoNotSplit) {
  // B 64 × 16 heads = 1024 CTAs already make 3.9 waves: two splits double the waves and add fixed costs.
  expect_plan(h100(64, 16, 1024), 1, 1024);
  expect_plan(h100(64, 16, 16384), 1, 16384);
}

// As the library plans the tensor-core kernel: one CTA per SM (a second shares the SM's issue rate) and the
// combine kernel's cost (192 keys). These are the split counts that measured best, or within 5% of it, in a
// forced sweep on an H200 (bench/results_kvcache.md, 2026-11-29).
KvCachePlanInput one_per_sm(int64_t batch, int64_t kv_heads, int64_t max_seqlen_k) {
  KvCachePlanInput in = h100(batch, kv_heads, max_seqlen_k);
  in.slots = 132;
  in.combine_keys = 192;
  return in;
}

TEST(KvCachePlan, OneCtaPerSmAndTheCombine) {
  // B 1, 16 heads: 8 splits make 128 CTAs; a 9th split would put two CTAs on 12 SMs (50 µs against 40 at L16K).
  expect_plan(one_per_sm(1, 16, 1024), 8, 128);
  expect_plan(one_per_sm(1, 16, 16384), 8, 2048);
  // B 8, 16 heads: 128 CTAs of one split; a second split adds a wave and the combine.
  expect_plan(one_per_sm(8, 16, 1024), 1, 1024);
  // GQA 64 / 8 (8 KV heads): 16 splits at B 1, 2 at B 8.
  expect_plan(one_per_sm(1, 8, 16384), 16, 1024);
  expect_plan(one_per_sm(8, 8, 4096), 2, 2048);
  expect_plan(one_per_sm(64, 16, 16384), 1, 16384);
  // 64 units: two splits (128 CTAs, still one wave) halve each CTA's keys, worth the combine's 192 keys; a
  // combine that cost more than the 1024 keys saved would keep one split.
  KvCachePlanInput in = one_per_sm(1, 64, 2048);
  expect_plan(in, 2, 1024);
  in.combine_keys = 1200;
  expect_plan(in, 1, 2048);
}

TEST(KvCachePlan, ShortAndEmptyCaches) {
  expect_plan(h100(1, 16, 100), 1, 128);  // fewer than two steps' worth of keys: one split
  expect_plan(h100(1, 16, 0), 1, 64);     // an empty cache still gets one split of one tile
  expect_plan(h100(1, 1, 1), 1, 64);
}

TEST(KvCachePlan, ForcedSplits) {
  KvCachePlanInput in = h100(64, 16, 1000);
  in.forced = 3;
  expect_plan(in, 3, 384);  // ⌈1000 / 3⌉ = 334, up to 6 tiles
  in.forced = 40;           // more splits than tiles: the last ones are empty, which the kernels allow
  expect_plan(in, 40, 64);
}

TEST(KvCachePlan, SplitsAreTilesAndNoneIsEmpty) {
  for (int64_t units : {1, 3, 16, 64, 100, 264, 1000})
    for (int64_t keys : {1, 63, 64, 65, 1000, 4096, 12345, 32768, 100000})
      for (int tile : {32, 64}) {
        KvCachePlanInput in = h100(1, 1, keys);
        in.units = units, in.tile = tile;
        const KvCachePlan plan = plan_kvcache(in);
        ASSERT_GE(plan.splits, 1);
        ASSERT_LE(plan.splits, in.max_splits);
        ASSERT_EQ(plan.keys_per_split % tile, 0) << units << " " << keys;
        ASSERT_GE(int64_t(plan.splits) * plan.keys_per_split, keys) << units << " " << keys;  // covers the keys
        ASSERT_LT(int64_t(plan.splits - 1) * plan.keys_per_split, std::max<int64_t>(keys, 1))
            << units << " " << keys;  // the last split holds keys
        ASSERT_GE(plan.keys_per_split, std::min<int64_t>(in.min_keys, keys)) << units << " " << keys;
      }
}

TEST(KvCachePlan, MaxSplitsCaps) {
  KvCachePlanInput in = h100(1, 1, 1 << 20);
  in.slots = 100000;
  in.max_splits = 256;
  const KvCachePlan plan = plan_kvcache(in);
  EXPECT_EQ(plan.splits, 256);
  EXPECT_EQ(plan.keys_per_split, 4096);
}

}  // namespace
}  // namespace flashgla::cuda
