// The generic CUDA attention kernels (src/cuda/attention/attention_generic.cu), which
// run what the fast kernels do not take: fp32, head dims D and Dv from 1 to
// 512, D != Dv. Checked against the CPU fp64 naive reference on the same
// rounded inputs: o, lse, dq, dk and dv over dtypes, head dims, causal and
// full masks, Tq != Tk (rows that see no key), grouped KV heads, varlen with
// empty and length-1 sequences, strided tensors (padded rows, and a stride of
// 2 along the head dim), bad device boundaries, determinism, the caller's
// workspace, and what stays unsupported. Every output is poisoned (NaN)
// before each call, so an element never written fails.
//
// Cases named Small... are the ones the GPU script runs under
// compute-sanitizer (filter *Cuda*Small*; a full name reads
// Group/AttentionGenericCuda.MatchesFp64Reference/SmallF32Varlen or
// AttentionGenericCudaApi.SmallInterleavedStrides).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <ostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "attention_test_util.h"
#include "flashgla/attention.h"
#include "flashgla/error.h"
#include "flashgla/flashgla.h"
#include "testing/buffer.h"

namespace {

using namespace flashgla;
using namespace flashgla::testing::attention_test;
using flashgla::testing::Buffer;
using flashgla::testing::rel_rms_error;

// Error bounds. fp32: fixed; fp32 arithmetic lands near 1e-7 to 1e-6 on these
// shapes. bf16/fp16: no worse than twice the error of the same computation on
// the CPU, plus 1e-6 (FlashAttention's rule): the CPU's tiled algorithm with
// the same rounding points (inputs and outputs in the dtype, fp32 arithmetic,
// dsum from the rounded o), itself held against the fp64 reference by
// test_attention_cpu.cpp. Rounding o before dsum makes the gradients of rows
// that see few keys up to ~2.5x less accurate than rounding the exact
// gradients, so the fp64 algorithm with rounded outputs is too strict a
// baseline here. lse is fp32 in every case.
constexpr double kF32Bound = 1e-5;
constexpr double kLseBound = 5e-6;

void check_case(const Case& c, uint64_t seed = 1) {
  const Tensors host = make_inputs(c, seed);
  const Results ref = run(c, as_f64(host), {}, AttentionAlgorithm::naive, 0);
  const Results gpu = run(c, to_device(host, c.row_padding), kCuda, AttentionAlgorithm::tiled, c.row_padding);
  const bool half = c.dtype != DType::f32;
  const Results cpu = half ? run(c, host, {}, AttentionAlgorithm::tiled, 0) : Results{};

  const double e_lse = lse_error(gpu.lse.values(), ref.lse.values());
  std::printf("  lse %.2e", e_lse);
  EXPECT_LE(e_lse, kLseBound) << "lse";
  auto expect_close = [&](const char* name, const Buffer& out, const Buffer& expected, const Buffer& cpu_out) {
    const double error = rel_rms_error(out.values(), expected.values());
    const double bound = half ? 2 * rel_rms_error(cpu_out.values(), expected.values()) + 1e-6 : kF32Bound;
    std::printf(" %s %.2e (<= %.2e)", name, error, bound);
    EXPECT_LE(error, bound) << name;
  };
  expect_close("o", gpu.o, ref.o, cpu.o);
  expect_close("dq", gpu.dq, ref.dq, cpu.dq);
  expect_close("dk", gpu.dk, ref.dk, cpu.dk);
  expect_close("dv", gpu.dv, ref.dv, cpu.dv);
  std::printf("\n");
}

// A case and the name GoogleTest gives it (letters and digits only).
struct Named {
  std::string name;
  Case c;
};

void PrintTo(const Named& n, std::ostream* os) {
  *os << n.name << " (";
  PrintTo(n.c, os);
  *os << ")";
}

std::string case_name(const ::testing::TestParamInfo<Named>& info) { return info.param.name; }

class AttentionGenericCuda : public ::testing::TestWithParam<Named> {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no GPU";
  }
};

TEST_P(AttentionGenericCuda, MatchesFp64Reference) { check_case(GetParam().c); }

const std::pair<DType, const char*> kDtypes[] = {{DType::f32, "F32"}, {DType::bf16, "Bf16"}, {DType::f16, "F16"}};
const char* mask_name(bool causal) { return causal ? "Causal" : "Full"; }

// Small enough for compute-sanitizer: every path at least once (varlen with
// an empty and a length-1 sequence, rows that see no key, grouped heads,
// padded rows, D != Dv both ways).
std::vector<Named> small_cases() {
  return {
      {"SmallF32VarlenCausal", Case()
                                   .with_dtype(DType::f32)
                                   .dims(32, 48)
                                   .heads(4, 2)
                                   .padded(3)
                                   .varlen({5, 0, 1, 9, 6}, {7, 3, 1, 4, 0})},
      {"SmallBf16Full", Case().dims(100, 16).lens(9, 13).heads(2, 1).masked(false)},
      {"SmallF16CausalTqAboveTk", Case().fp16().dims(16, 100).lens(12, 5).padded(1)},
  };
}
INSTANTIATE_TEST_SUITE_P(Sanitizer, AttentionGenericCuda, ::testing::ValuesIn(small_cases()), case_name);

std::vector<Named> head_dims() {
  std::vector<Named> cases;
  for (auto [dtype, type] : kDtypes)
    for (int64_t d : {16, 32, 100})
      for (int64_t dv : {16, 48, 100})
        for (bool causal : {true, false})
          cases.push_back({std::string(type) + "D" + std::to_string(d) + "Dv" + std::to_string(dv) + mask_name(causal),
                           Case().with_dtype(dtype).dims(d, dv).lens(77, 91).heads(4, 2).masked(causal)});
  return cases;
}
INSTANTIATE_TEST_SUITE_P(HeadDims, AttentionGenericCuda, ::testing::ValuesIn(head_dims()), case_name);

// The ends of the range, each bucket of the kernels' register rows (32, 64,
// 128, 256, 512 elements per warp), the fast kernels' head dims in fp32 or
// with D != Dv, and a custom (negative) scale.
std::vector<Named> dim_range() {
  const Case base = Case().lens(70, 83).heads(2, 1);
  return {
      {"F32D1Dv1", base.with_dtype(DType::f32).dims(1, 1)},
      {"F32D33Dv7", base.with_dtype(DType::f32).dims(33, 7).masked(false)},
      {"Bf16D200Dv33", base.dims(200, 33)},
      {"F16D256Dv300", base.fp16().dims(256, 300).masked(false)},
      {"F32D512Dv512", base.with_dtype(DType::f32).dims(512, 512)},
      {"Bf16D512Dv1", base.dims(512, 1).masked(false)},
      {"F32D64Dv64", base.with_dtype(DType::f32).dim(64)},
      {"F32D128Dv128Full", base.with_dtype(DType::f32).dim(128).masked(false)},
      {"Bf16D64Dv128", base.dims(64, 128)},
      {"F16D128Dv64", base.fp16().dims(128, 64)},
      {"Bf16D96", base.dim(96)},
      {"F32ScaleNegative", base.with_dtype(DType::f32).dims(32, 48).with_scale(-0.3).masked(false)},
      {"Bf16Scale1", base.dims(48, 48).with_scale(1.0)},
  };
}
INSTANTIATE_TEST_SUITE_P(DimRange, AttentionGenericCuda, ::testing::ValuesIn(dim_range()), case_name);

// Tq != Tk both ways; causal with Tq > Tk leaves the first Tq − Tk rows
// without a key (o = 0, lse = −inf, dq = 0) and no keys at all does the same.
std::vector<Named> lengths() {
  std::vector<Named> cases;
  const std::pair<int64_t, int64_t> lens[] = {{1, 1}, {1, 70}, {70, 1}, {65, 200}, {200, 65}, {0, 5}, {5, 0}};
  for (auto [dtype, type] : {kDtypes[0], kDtypes[1]})
    for (auto [tq, tk] : lens)
      for (bool causal : {true, false})
        cases.push_back({std::string(type) + "Tq" + std::to_string(tq) + "Tk" + std::to_string(tk) + mask_name(causal),
                         Case().with_dtype(dtype).dims(32, 48).lens(tq, tk).masked(causal)});
  cases.push_back({"Bf16Tq1000Tk1000Causal", Case().dims(32, 48).lens(1000, 1000).with_batch(1).heads(2, 1)});
  cases.push_back({"F32Tq300Tk1000Full", Case().with_dtype(DType::f32).dims(100, 16).lens(300, 1000).with_batch(1)
                                              .masked(false)});
  return cases;
}
INSTANTIATE_TEST_SUITE_P(Lengths, AttentionGenericCuda, ::testing::ValuesIn(lengths()), case_name);

std::vector<Named> grouped_heads() {
  std::vector<Named> cases;
  for (auto [dtype, type] : {kDtypes[0], kDtypes[1]})
    for (int64_t hkv : {1, 2, 8})
      for (bool causal : {true, false})
        cases.push_back({std::string(type) + "Hq8Hkv" + std::to_string(hkv) + mask_name(causal),
                         Case().with_dtype(dtype).dims(100, 48).lens(90, 120).heads(8, hkv).masked(causal)});
  return cases;
}
INSTANTIATE_TEST_SUITE_P(GroupedHeads, AttentionGenericCuda, ::testing::ValuesIn(grouped_heads()), case_name);

// Varlen with an empty and a length-1 sequence, Tq > Tk (rows that see no key
// when causal), Tq < Tk, and a sequence with no keys; then padded rows.
std::vector<Named> varlen_and_strides() {
  std::vector<Named> cases;
  for (auto [dtype, type] : kDtypes)
    for (bool causal : {true, false}) {
      const std::string suffix = std::string(type) + mask_name(causal);
      const Case base = Case().with_dtype(dtype).masked(causal);
      cases.push_back({"Varlen" + suffix,
                       base.dims(32, 48).heads(4, 2).varlen({70, 0, 1, 200, 129, 3}, {70, 5, 1, 64, 300, 0})});
      cases.push_back({"VarlenEqual" + suffix, base.dims(100, 16).heads(2, 1).varlen({1, 64, 127}, {1, 64, 127})});
      cases.push_back({"Padded3" + suffix, base.dims(16, 100).lens(100, 150).padded(3)});
      cases.push_back({"Padded8" + suffix, base.dims(100, 100).lens(150, 100).padded(8)});
      cases.push_back({"VarlenPadded" + suffix, base.dims(48, 32).padded(5).varlen({50, 0, 100}, {30, 70, 0})});
    }
  return cases;
}
INSTANTIATE_TEST_SUITE_P(VarlenAndStrides, AttentionGenericCuda, ::testing::ValuesIn(varlen_and_strides()),
                         case_name);

// ---- calls that need more than one run ---------------------------------------------

class AttentionGenericCudaApi : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no GPU";
  }
};

// A [.., n] view of every other element along the last dimension of a [.., 2n] buffer.
TensorView every_other(const Buffer& wide) {
  TensorView v = wide.view();
  v.shape[v.ndim - 1] /= 2;
  v.stride[v.ndim - 1] *= 2;
  return v;
}

// The elements of a [.., 2n] buffer that every_other() views, as a contiguous [.., n] CPU buffer.
Buffer even_elements(const Buffer& wide) {
  std::vector<int64_t> shape = wide.shape();
  shape.back() /= 2;
  Buffer out(wide.dtype(), shape);
  const std::vector<double> all = wide.values();
  std::vector<double> even;
  for (size_t i = 0; i < all.size(); i += 2) even.push_back(all[i]);
  out.set_values(even);
  return out;
}

// A stride of 2 along the head dim in every tensor, inputs and outputs, and
// along Tq in lse: the values match the reference, and the elements between
// (poisoned) stay untouched.
TEST_F(AttentionGenericCudaApi, SmallInterleavedStridesAreHonoured) {
  const Case c = Case().with_dtype(DType::f32).dims(20, 12).lens(14, 9).heads(4, 2);  // 5 rows see no key
  std::mt19937_64 rng(11);
  auto wide_random = [&](std::vector<int64_t> shape) {
    Buffer b(c.dtype, std::move(shape));
    b.fill_normal(rng);
    return b;
  };
  const Buffer q = wide_random({c.batch, c.q_len, c.q_heads, 2 * c.head_dim});
  const Buffer k = wide_random({c.batch, c.k_len, c.kv_heads, 2 * c.head_dim});
  const Buffer v = wide_random({c.batch, c.k_len, c.kv_heads, 2 * c.value_dim});
  const Buffer d_o = wide_random({c.batch, c.q_len, c.q_heads, 2 * c.value_dim});
  const Tensors narrow{even_elements(q), even_elements(k), even_elements(v), even_elements(d_o), {}, {}};
  const Results ref = run(c, as_f64(narrow), {}, AttentionAlgorithm::naive, 0);

  const Buffer gq = q.to(kCuda), gk = k.to(kCuda), gv = v.to(kCuda), gd_o = d_o.to(kCuda);
  const Buffer o = poisoned(c.dtype, {c.batch, c.q_len, c.q_heads, 2 * c.value_dim}, kCuda, 0);
  const Buffer lse = poisoned(DType::f32, {c.batch, c.q_heads, 2 * c.q_len}, kCuda, 0);
  const Buffer dq = poisoned(c.dtype, q.shape(), kCuda, 0), dk = poisoned(c.dtype, k.shape(), kCuda, 0),
               dv = poisoned(c.dtype, v.shape(), kCuda, 0);
  AttentionForwardArgs f;
  f.q = every_other(gq), f.k = every_other(gk), f.v = every_other(gv), f.causal = c.causal;
  f.o = every_other(o), f.lse = every_other(lse);
  attention_forward(f);
  AttentionBackwardArgs b;
  b.q = f.q, b.k = f.k, b.v = f.v, b.causal = c.causal, b.o = f.o, b.lse = f.lse, b.d_o = every_other(gd_o);
  b.dq = every_other(dq), b.dk = every_other(dk), b.dv = every_other(dv);
  attention_backward(b);
  flashgla::testing::synchronize(kCuda);

  auto expect_interleaved = [](const char* name, const Buffer& wide, const Buffer& expected, bool is_lse) {
    const std::vector<double> all = wide.values();
    std::vector<double> viewed, between;
    for (size_t i = 0; i < all.size(); ++i) (i % 2 == 0 ? viewed : between).push_back(all[i]);
    const double error = is_lse ? lse_error(viewed, expected.values()) : rel_rms_error(viewed, expected.values());
    EXPECT_LE(error, is_lse ? kLseBound : kF32Bound) << name;
    for (double x : between) ASSERT_TRUE(std::isnan(x)) << name << ": an element outside the view was written";
  };
  expect_interleaved("o", o, ref.o, false);
  expect_interleaved("lse", lse, ref.lse, true);
  expect_interleaved("dq", dq, ref.dq, false);
  expect_interleaved("dk", dk, ref.dk, false);
  expect_interleaved("dv", dv, ref.dv, false);
}

// Boundaries on the device are not validated by the API: nonsense values must
// still stay inside the tensors (compute-sanitizer memcheck watches this).
TEST_F(AttentionGenericCudaApi, SmallBadDeviceBoundariesStayInBounds) {
  const Case c = Case().with_dtype(DType::f32).dims(32, 48).varlen({40, 40, 40}, {40, 40, 40});
  Tensors in = to_device(make_inputs(c, 5), 0);
  for (const std::vector<double>& bad : {std::vector<double>{-5, 100, 30, 1000000}, {0, 200, 10, 120}}) {
    Buffer cu(DType::i32, {4});
    cu.set_values(bad);
    in.cu_q = cu.to(kCuda), in.cu_k = cu.to(kCuda);
    EXPECT_NO_THROW(run(c, in, kCuda, AttentionAlgorithm::tiled, 0));
    EXPECT_NO_THROW(flashgla::testing::synchronize(kCuda));  // no fault left behind on the device
  }
}

// No atomics anywhere: two runs give the same bits (a race would not).
TEST_F(AttentionGenericCudaApi, ForwardAndBackwardAreDeterministic) {
  const Case c = Case().dims(100, 48).lens(300, 350).heads(4, 2);
  const Tensors in = to_device(make_inputs(c, 7), 0);
  const Results a = run(c, in, kCuda, AttentionAlgorithm::tiled, 0);
  const Results b = run(c, in, kCuda, AttentionAlgorithm::tiled, 0);
  EXPECT_EQ(a.o.values(), b.o.values());
  EXPECT_EQ(a.lse.values(), b.lse.values());
  EXPECT_EQ(a.dq.values(), b.dq.values());
  EXPECT_EQ(a.dk.values(), b.dk.values());
  EXPECT_EQ(a.dv.values(), b.dv.values());
}

TEST_F(AttentionGenericCudaApi, CallerWorkspaceGivesTheSameGradients) {
  const Case c = Case().with_dtype(DType::f32).dims(32, 48).lens(100, 120).heads(4, 2);
  const Tensors in = to_device(make_inputs(c, 3), 0);
  const Results own = run(c, in, kCuda, AttentionAlgorithm::tiled, 0);

  AttentionBackwardArgs b;
  b.q = in.q.view(), b.k = in.k.view(), b.v = in.v.view(), b.causal = c.causal;
  b.o = own.o.view(), b.lse = own.lse.view(), b.d_o = in.d_o.view();
  const Buffer dq = poisoned(c.dtype, in.q.shape(), kCuda, 0), dk = poisoned(c.dtype, in.k.shape(), kCuda, 0),
               dv = poisoned(c.dtype, in.v.shape(), kCuda, 0);
  b.dq = dq.view(), b.dk = dk.view(), b.dv = dv.view();
  const size_t bytes = attention_backward_workspace_bytes(b);
  ASSERT_GT(bytes, 0u);
  Buffer scratch(DType::f32, {int64_t((bytes + 3) / 4)}, kCuda);
  scratch.poison();  // the backward must write what it reads
  b.workspace = scratch.view().data, b.workspace_bytes = bytes;
  attention_backward(b);
  flashgla::testing::synchronize(kCuda);
  EXPECT_EQ(dq.values(), own.dq.values());
  EXPECT_EQ(dk.values(), own.dk.values());
  EXPECT_EQ(dv.values(), own.dv.values());

  b.workspace_bytes = bytes - 4;
  try {
    attention_backward(b);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "workspace");
  }
}

void expect_unsupported(const Case& c, const std::string& argument) {
  const Tensors in = to_device(make_inputs(c, 1), 0);
  try {
    run(c, in, kCuda, AttentionAlgorithm::tiled, 0);
    FAIL() << "expected an unsupported error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::unsupported) << e.what();
    EXPECT_EQ(e.argument(), argument) << e.what();
  }
}

TEST_F(AttentionGenericCudaApi, Float64PointsToTheCpu) {
  expect_unsupported(Case().with_dtype(DType::f64).dims(32, 48).lens(16, 16), "q");
}

TEST_F(AttentionGenericCudaApi, HeadDimsAbove512AreUnsupported) {
  expect_unsupported(Case().dims(513, 64).lens(4, 4), "q");
  expect_unsupported(Case().with_dtype(DType::f32).dims(64, 513).lens(4, 4), "v");
}

}  // namespace
