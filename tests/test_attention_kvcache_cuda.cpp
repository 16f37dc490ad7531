// attention_with_kvcache on CUDA against the fp64 reference (skipped without a
// GPU): contiguous and paged caches, GQA, one and several queries, appends,
// empty and full caches, random block tables with invalid unused entries, one
// split and many (flash-decoding, with the combine), long caches at batch 1,
// and the tensor-core kernel at decode sizes (GQA 8:1, block sizes 16 and 256).
// KvCacheCudaSmall.* is small enough for compute-sanitizer (scripts/gpu_check.sh).
#include <gtest/gtest.h>

#include "flashgla/flashgla.h"
#include "kvcache_test_util.h"
#include "test_util.h"

namespace {

using namespace flashgla;
using flashgla::testing::Buffer;
using flashgla::testing::expect_error;
using namespace flashgla::testing::kvcache_test;

const Device kGpu{DeviceType::cuda, 0};

class KvCacheCudaSmall : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no GPU";
  }
};
class KvCacheCudaLong : public KvCacheCudaSmall {};

TEST_P(KvCacheCudaSmall, MatchesReference) { check_case(GetParam(), kGpu, 4321); }
TEST_P(KvCacheCudaLong, MatchesReference) { check_case(GetParam(), kGpu, 99); }

const Case kBf16 = Case{}.with(DType::bf16).dims(64, 64);
const Case kD128 = Case{}.with(DType::bf16).dims(128, 128);

INSTANTIATE_TEST_SUITE_P(
    Shapes, KvCacheCudaSmall,
    ::testing::Values(kBf16, kBf16.with(DType::f16), kBf16.with(DType::f32), kD128, kD128.with(DType::f32),
                      kBf16.lens({0, 96, 37}), kBf16.lens({0, 96, 37}).splits(3),
                      kBf16.queries(5).lens({0, 3, 60, 96}), kBf16.queries(5).lens({2, 50}).full().splits(2),
                      kBf16.heads(8, 1), kD128.heads(16, 2).queries(3).splits(4),
                      kBf16.appending().lens({0, 10, 95}), kD128.appending().queries(7).lens({0, 20, 89}).splits(2),
                      kBf16.paged(16).lens({0, 33, 96, 5}), kBf16.paged(16).lens({0, 33, 96, 5}).splits(5),
                      kBf16.paged(16).appending().queries(3).lens({0, 13, 93}),
                      kD128.paged(8).queries(40).heads(6, 3).cap(160).lens({40, 160}).splits(2),
                      kBf16.with(DType::f32).paged(32).appending().queries(4).cap(128),
                      // Strided caches: rows padded by 8 elements keep 16-byte copies (the tensor-core kernel),
                      // by 1 they do not (bf16 / fp16 then run the general kernel).
                      kBf16.lens({0, 96, 37}).padded(8), kD128.paged(16).appending().queries(3).lens({0, 13, 93}).padded(8),
                      kBf16.lens({0, 96, 37}).padded(1), kBf16.with(DType::f16).paged(16).appending().queries(3).lens({0, 13, 93}).padded(1),
                      kD128.heads(8, 1).queries(2).lens({5, 96}).splits(3).padded(1)));

// Long caches, small batches: the automatic plan splits the keys (and with a
// max_seqlen_k below the real lengths, the last split still covers them).
Case long_case(int64_t cap, std::vector<int64_t> lens) { return kD128.heads(8, 2).cap(cap).lens(std::move(lens)); }
Case underestimated() {
  Case c = long_case(8192, {8000});
  c.max_seqlen_k = 1000;
  return c;
}
INSTANTIATE_TEST_SUITE_P(Split, KvCacheCudaLong,
                         ::testing::Values(long_case(8192, {8192}), long_case(4096, {4000}).heads(16, 16), long_case(16384, {12345, 700}),
                                           long_case(8192, {5000}).heads(32, 4).appending(),
                                           long_case(8192, {8000}).paged(64).heads(8, 2), underestimated()));

// The tensor-core kernel (bf16 / fp16) at decode sizes: many splits of a long cache, GQA 8:1, paged with
// small and large blocks, several causal queries over row chunks, lengths from 0 to the capacity in one
// batch, D 64, a forced split count that leaves splits empty, and keys that end mid-chunk.
INSTANTIATE_TEST_SUITE_P(
    Decode, KvCacheCudaLong,
    ::testing::Values(kD128.heads(16, 16).cap(16384).lens({16384}), kD128.heads(16, 16).cap(16384).lens({16384}).with(DType::f16),
                      long_case(8192, {8000, 3}).heads(32, 4), long_case(8192, {8000, 3}).heads(32, 4).with(DType::f16),
                      long_case(4096, {4000, 0, 1500}).paged(16), long_case(4096, {4000, 0, 1500}).paged(256).heads(16, 2),
                      long_case(4096, {3000, 17, 0}).heads(16, 2).queries(6), long_case(4096, {3000, 40}).heads(8, 8).queries(5).full(),
                      long_case(8192, {0, 8192, 1, 4097, 63, 2048}), long_case(8192, {0, 8191, 1, 4097, 63, 2048}).paged(16).appending(),
                      kBf16.heads(16, 2).cap(8192).lens({8191, 5000}), long_case(4096, {1000}).splits(37),
                      long_case(1024, {1009, 15, 17}).queries(3).appending(),
                      // Scores of spread ±30 or so (scale 1 instead of D^-1/2): chunks that raise a row's running
                      // max by a lot (o rescaled) among chunks that raise none (o left as it is), split or not.
                      long_case(4096, {4000, 1}).scaled(1.0), long_case(4096, {4000, 700}).scaled(1.0).splits(1),
                      long_case(2048, {2000}).paged(16).heads(32, 4).scaled(1.0).with(DType::f16)));

TEST(KvCacheCudaSmallApi, UnsupportedAndBounds) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU";
  // fp64 and D = 96 are refused with NotImplemented-style errors.
  for (const Case& c : {Case{}.with(DType::f64).dims(64, 64), kBf16.dims(96, 96), kBf16.dims(64, 32)}) {
    Inputs in = to_device(make_inputs(c, 5), kGpu);
    Buffer o(c.dtype, {c.batch, c.q_len, c.q_heads, c.value_dim}, kGpu);
    expect_error([&] { attention_with_kvcache(make_args(c, in, o, Buffer{})); }, ErrorKind::unsupported,
                 c.value_dim != c.head_dim ? "v_cache" : "q");
  }
  // Lengths beyond the capacity, negative ones and block indices out of range
  // stay on the device: clamped and masked, never an illegal access (run under
  // compute-sanitizer by scripts/gpu_check.sh); the results are finite.
  Case c = kBf16.paged(16).appending().queries(2);
  Inputs host = make_inputs(c, 6);
  host.cache_seqlens.set_values({1e6, -50});
  std::vector<double> table = host.block_table.values();
  for (size_t i = 0; i < table.size(); i += 2) table[i] = i % 4 ? -3 : 1e5;
  host.block_table.set_values(table);
  Inputs in = to_device(host, kGpu);
  Buffer o(c.dtype, {c.batch, c.q_len, c.q_heads, c.value_dim}, kGpu), lse(DType::f32, {c.batch, c.q_heads, c.q_len}, kGpu);
  o.poison();
  attention_with_kvcache(make_args(c, in, o, lse));
  flashgla::testing::synchronize(kGpu);
  for (double x : o.values()) ASSERT_TRUE(std::isfinite(x));
}

}  // namespace
