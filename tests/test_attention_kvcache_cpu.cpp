// attention_with_kvcache on the CPU against the fp64 reference (naive attention
// over each sequence's gathered keys): contiguous and paged caches, grouped KV
// heads, one and several queries, appends, empty and full caches, random block
// tables; and the argument checks.
#include <gtest/gtest.h>

#include "kvcache_test_util.h"
#include "test_util.h"

namespace {

using namespace flashgla;
using flashgla::testing::Buffer;
using flashgla::testing::expect_error;
using namespace flashgla::testing::kvcache_test;

class KvCacheCpu : public ::testing::TestWithParam<Case> {};

TEST_P(KvCacheCpu, MatchesReference) { check_case(GetParam(), Device{}, 1234); }

const Case kBase{};

INSTANTIATE_TEST_SUITE_P(
    Shapes, KvCacheCpu,
    ::testing::Values(kBase, kBase.with(DType::f64), kBase.with(DType::bf16), kBase.with(DType::f16),
                      kBase.lens({0, 96, 37}),                               // empty and full caches
                      kBase.queries(5).lens({0, 3, 60, 96}),                 // Tq > 1, some queries see no key
                      kBase.queries(5).lens({2, 50}).full(),
                      kBase.heads(8, 1).dims(64, 48).with(DType::f64),       // MQA, Dv != D
                      kBase.appending().lens({0, 10, 95}),                   // append one key, up to full
                      kBase.appending().queries(7).lens({0, 20, 89}).with(DType::f64),
                      kBase.paged(16).lens({0, 33, 96, 5}),                  // paged, random block table
                      kBase.paged(16).appending().queries(3).lens({0, 13, 93}),
                      kBase.paged(8).queries(40).heads(6, 3).cap(160).lens({40, 160}).with(DType::bf16),
                      kBase.paged(32).appending().queries(4).cap(128).with(DType::f64),
                      kBase.cap(300).lens({300}).queries(2),
                      kBase.paged(16).appending().queries(3).lens({0, 13, 93}).padded(3)));  // strided cache rows

// The checks name the argument and what was expected.
struct Bad {
  Case c = kBase.paged(16).appending();
  Inputs in = make_inputs(c, 7);
  Buffer o{c.dtype, {c.batch, c.q_len, c.q_heads, c.value_dim}};
  Buffer lse{DType::f32, {c.batch, c.q_heads, c.q_len}};
  AttentionKvCacheArgs args() const { return make_args(c, in, o, lse); }
};

TEST(KvCacheCpuChecks, BadArguments) {
  Bad bad;
  attention_with_kvcache(bad.args());  // the baseline is fine
  auto with = [&](auto edit) {
    AttentionKvCacheArgs a = bad.args();
    edit(a);
    return [a] { attention_with_kvcache(a); };
  };
  Buffer lens_i64(DType::i64, {bad.c.batch});
  lens_i64.fill(1);
  expect_error(with([&](auto& a) { a.cache_seqlens = lens_i64.view(); }), ErrorKind::type, "cache_seqlens");
  Buffer too_long(DType::i32, {bad.c.batch});
  too_long.fill(double(bad.c.capacity));  // full, and one more key is appended
  expect_error(with([&](auto& a) { a.cache_seqlens = too_long.view(); }), ErrorKind::value, "cache_seqlens", "capacity");
  Buffer negative(DType::i32, {bad.c.batch});
  negative.fill(-1);
  expect_error(with([&](auto& a) { a.cache_seqlens = negative.view(); }), ErrorKind::value, "cache_seqlens");
  Buffer table(DType::i32, {bad.c.batch, bad.c.capacity / 16});
  table.fill(1000);
  expect_error(with([&](auto& a) { a.block_table = table.view(); }), ErrorKind::value, "block_table", "num_blocks");
  Buffer short_table(DType::i32, {bad.c.batch + 1, bad.c.capacity / 16});
  short_table.fill(0);
  expect_error(with([&](auto& a) { a.block_table = short_table.view(); }), ErrorKind::value, "block_table");
  expect_error(with([&](auto& a) { a.v = TensorView{}; }), ErrorKind::value, "v", "together");
  expect_error(with([&](auto& a) { a.block_table = TensorView{}; }), ErrorKind::value, "k_cache", "block_table");
  expect_error(with([&](auto& a) { a.max_seqlen_k = bad.c.capacity + 1; }), ErrorKind::value, "max_seqlen_k");
  expect_error(with([&](auto& a) { a.num_splits = -1; }), ErrorKind::value, "num_splits");
  Buffer q_d(bad.c.dtype, {bad.c.batch, bad.c.q_len, bad.c.q_heads, bad.c.head_dim + 1});
  q_d.fill(0.5);
  expect_error(with([&](auto& a) { a.q = q_d.view(); }), ErrorKind::value, "k_cache", "D");
  Buffer q_h(bad.c.dtype, {bad.c.batch, bad.c.q_len, 3, bad.c.head_dim});
  q_h.fill(0.5);
  expect_error(with([&](auto& a) { a.q = q_h.view(); }), ErrorKind::value, "k_cache", "divide");
  Buffer o_bad(DType::f64, {bad.c.batch, bad.c.q_len, bad.c.q_heads, bad.c.value_dim});
  expect_error(with([&](auto& a) { a.o = o_bad.view(); }), ErrorKind::type, "o");
  Buffer k_cache_bf16 = bad.in.k_cache.cast(DType::bf16);
  expect_error(with([&](auto& a) { a.k_cache = k_cache_bf16.view(); }), ErrorKind::type, "k_cache");
}

TEST(KvCacheCpuChecks, LseIsOptional) {
  Case c = kBase.lens({4, 90});
  Inputs in = make_inputs(c, 3);
  Buffer o(c.dtype, {c.batch, c.q_len, c.q_heads, c.value_dim});
  o.poison();
  AttentionKvCacheArgs a = make_args(c, in, o, Buffer{});
  attention_with_kvcache(a);
  EXPECT_LE(flashgla::testing::rel_rms_error(o.values(), reference(c, in).o), 2e-6);
}

}  // namespace
