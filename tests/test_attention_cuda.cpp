// CUDA softmax attention against the CPU fp64 naive reference: o, lse, dq, dk
// and dv over head dims, lengths around the tile sizes, causal and full masks,
// Tq != Tk, grouped KV heads, varlen (with empty and length-1 sequences),
// fully masked rows, strided (aligned and unaligned) tensors, custom scales,
// fp16, caller-provided workspace, and bad input. Outputs are poisoned (NaN)
// before every call, so an element never written fails. The forward checked
// is the one the library picks: run the binary with
// FLASHGLA_ATTENTION_KERNEL=hopper to check the (opt-in) sm_90a forward.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "flashgla/attention.h"
#include "flashgla/error.h"
#include "flashgla/flashgla.h"
#include "testing/buffer.h"

namespace {

using namespace flashgla;
using flashgla::testing::Buffer;
using flashgla::testing::rel_rms_error;

const Device kCuda{DeviceType::cuda, 0};

// A problem; with varlen, B == 1 and Tq, Tk are the totals.
struct Case {
  int64_t batch = 2, q_len = 64, k_len = 64, q_heads = 2, kv_heads = 2, head_dim = 64;
  bool causal = true;
  DType dtype = DType::bf16;
  std::vector<int64_t> seqlens_q, seqlens_k;
  std::optional<double> scale;
  int64_t row_padding = 0;  // > 0: every tensor on the GPU, inputs and outputs, is a strided slice

  Case lens(int64_t tq, int64_t tk) const { Case c = *this; c.q_len = tq, c.k_len = tk; return c; }
  Case heads(int64_t hq, int64_t hkv) const { Case c = *this; c.q_heads = hq, c.kv_heads = hkv; return c; }
  Case dim(int64_t d) const { Case c = *this; c.head_dim = d; return c; }
  Case masked(bool causal) const { Case c = *this; c.causal = causal; return c; }
  Case with_batch(int64_t b) const { Case c = *this; c.batch = b; return c; }
  Case fp16() const { Case c = *this; c.dtype = DType::f16; return c; }
  Case with_scale(double s) const { Case c = *this; c.scale = s; return c; }
  Case padded(int64_t p) const { Case c = *this; c.row_padding = p; return c; }
  Case varlen(std::vector<int64_t> lq, std::vector<int64_t> lk) const {
    Case c = *this;
    c.batch = 1, c.q_len = 0, c.k_len = 0;
    for (int64_t l : lq) c.q_len += l;
    for (int64_t l : lk) c.k_len += l;
    c.seqlens_q = std::move(lq), c.seqlens_k = std::move(lk);
    return c;
  }
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << dtype_name(c.dtype) << " B=" << c.batch << " Tq=" << c.q_len << " Tk=" << c.k_len << " Hq=" << c.q_heads
      << " Hkv=" << c.kv_heads << " D=" << c.head_dim << (c.causal ? " causal" : " full");
  if (!c.seqlens_q.empty()) {
    *os << " varlen q/k:";
    for (size_t n = 0; n < c.seqlens_q.size(); ++n) *os << " " << c.seqlens_q[n] << "/" << c.seqlens_k[n];
  }
  if (c.scale) *os << " scale=" << *c.scale;
  if (c.row_padding > 0) *os << " padding=" << c.row_padding;
}

Buffer boundaries(const std::vector<int64_t>& seqlens, Device device) {
  if (seqlens.empty()) return {};
  std::vector<double> cumsum{0};
  for (int64_t len : seqlens) cumsum.push_back(cumsum.back() + double(len));
  Buffer b(DType::i32, {int64_t(cumsum.size())});
  b.set_values(cumsum);
  return b.to(device);
}

struct Tensors {
  Buffer q, k, v, d_o, cu_q, cu_k;
};

Tensors make_inputs(const Case& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto random = [&](std::vector<int64_t> shape) {
    Buffer b(c.dtype, std::move(shape));
    b.fill_normal(rng);
    return b;
  };
  Tensors t;
  t.q = random({c.batch, c.q_len, c.q_heads, c.head_dim});
  t.k = random({c.batch, c.k_len, c.kv_heads, c.head_dim});
  t.v = random({c.batch, c.k_len, c.kv_heads, c.head_dim});
  t.d_o = random({c.batch, c.q_len, c.q_heads, c.head_dim});
  t.cu_q = boundaries(c.seqlens_q, {});
  t.cu_k = boundaries(c.seqlens_k, {});
  return t;
}

Tensors to_device(const Tensors& t, int64_t padding) {
  return {t.q.to(kCuda, padding), t.k.to(kCuda, padding), t.v.to(kCuda, padding), t.d_o.to(kCuda, padding),
          t.cu_q.to(kCuda), t.cu_k.to(kCuda)};
}

Buffer output(DType dtype, std::vector<int64_t> shape, Device device, int64_t padding) {
  Buffer b(dtype, std::move(shape), device, padding);
  b.poison();
  return b;
}

struct Results {
  Buffer o, lse, dq, dk, dv;
};

// Forward, then backward from the forward's own o and lse.
Results run(const Case& c, const Tensors& in, Device device, AttentionAlgorithm algorithm, int64_t padding) {
  Results r;
  const DType out_dtype = in.q.dtype();
  r.o = output(out_dtype, {c.batch, c.q_len, c.q_heads, c.head_dim}, device, padding);
  r.lse = output(DType::f32, {c.batch, c.q_heads, c.q_len}, device, 0);
  AttentionForwardArgs f;
  f.q = in.q.view(), f.k = in.k.view(), f.v = in.v.view();
  f.cu_seqlens_q = in.cu_q.view(), f.cu_seqlens_k = in.cu_k.view();
  f.causal = c.causal, f.scale = c.scale, f.algorithm = algorithm;
  f.o = r.o.view(), f.lse = r.lse.view();
  attention_forward(f);

  r.dq = output(out_dtype, {c.batch, c.q_len, c.q_heads, c.head_dim}, device, padding);
  r.dk = output(out_dtype, {c.batch, c.k_len, c.kv_heads, c.head_dim}, device, padding);
  r.dv = output(out_dtype, {c.batch, c.k_len, c.kv_heads, c.head_dim}, device, padding);
  AttentionBackwardArgs b;
  b.q = f.q, b.k = f.k, b.v = f.v, b.cu_seqlens_q = f.cu_seqlens_q, b.cu_seqlens_k = f.cu_seqlens_k;
  b.causal = c.causal, b.scale = c.scale, b.algorithm = algorithm;
  b.o = r.o.view(), b.lse = r.lse.view(), b.d_o = in.d_o.view();
  b.dq = r.dq.view(), b.dk = r.dk.view(), b.dv = r.dv.view();
  attention_backward(b);
  flashgla::testing::synchronize(device);
  return r;
}

// lse: −inf exactly where the reference has −inf (rows that see no key), and
// a small relative error elsewhere; NaN for any mismatch or non-finite value.
double lse_error(const std::vector<double>& out, const std::vector<double>& ref) {
  std::vector<double> a, b;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isinf(ref[i])) {
      if (out[i] != ref[i]) return std::nan("");
      continue;
    }
    a.push_back(out[i]), b.push_back(ref[i]);
  }
  return b.empty() ? 0.0 : rel_rms_error(a, b);
}

// Error bounds, two to five times the largest errors the portable kernels
// showed on an H100 (2026-11-20): bf16 rounds P, dS and the outputs to 8
// significant bits, fp16 to 11.
struct Tolerance {
  double o, lse, grad;
};
Tolerance tolerance(DType dtype) {
  return dtype == DType::bf16 ? Tolerance{5e-3, 1e-5, 8e-3} : Tolerance{1e-3, 1e-5, 1.5e-3};
}

void check_case(const Case& c, uint64_t seed = 1) {
  const Tensors host = make_inputs(c, seed);
  const Tensors ref_in{host.q.cast(DType::f64), host.k.cast(DType::f64), host.v.cast(DType::f64),
                       host.d_o.cast(DType::f64), host.cu_q, host.cu_k};
  const Results ref = run(c, ref_in, {}, AttentionAlgorithm::naive, 0);
  const Results gpu = run(c, to_device(host, c.row_padding), kCuda, AttentionAlgorithm::tiled, c.row_padding);

  const double e_o = rel_rms_error(gpu.o.values(), ref.o.values());
  const double e_lse = lse_error(gpu.lse.values(), ref.lse.values());
  const double e_dq = rel_rms_error(gpu.dq.values(), ref.dq.values());
  const double e_dk = rel_rms_error(gpu.dk.values(), ref.dk.values());
  const double e_dv = rel_rms_error(gpu.dv.values(), ref.dv.values());
  std::printf("  errors: o %.2e lse %.2e dq %.2e dk %.2e dv %.2e\n", e_o, e_lse, e_dq, e_dk, e_dv);
  const Tolerance tol = tolerance(c.dtype);
  EXPECT_LE(e_o, tol.o) << "o";
  EXPECT_LE(e_lse, tol.lse) << "lse";
  EXPECT_LE(e_dq, tol.grad) << "dq";
  EXPECT_LE(e_dk, tol.grad) << "dk";
  EXPECT_LE(e_dv, tol.grad) << "dv";
}

class AttentionCuda : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no GPU";
  }
};

TEST_P(AttentionCuda, MatchesFp64Reference) { check_case(GetParam()); }

std::vector<Case> lengths_and_dims() {
  std::vector<Case> cases;
  for (int64_t d : {64, 128, 256})
    for (int64_t t : {1, 63, 64, 65, 200, 1000})
      for (bool causal : {true, false}) cases.push_back(Case().dim(d).lens(t, t).masked(causal));
  return cases;
}
INSTANTIATE_TEST_SUITE_P(Lengths, AttentionCuda, ::testing::ValuesIn(lengths_and_dims()));

std::vector<Case> unequal_lengths() {
  std::vector<Case> cases;
  for (int64_t d : {64, 128, 256})
    for (auto [tq, tk] : std::vector<std::pair<int64_t, int64_t>>{{65, 200}, {200, 65}, {1, 1000}, {1000, 1}, {130, 0}})
      for (bool causal : {true, false}) cases.push_back(Case().dim(d).lens(tq, tk).masked(causal));
  return cases;
}
// Causal with Tq > Tk leaves the first Tq − Tk rows without a key (o = 0, lse = −inf, dq = 0).
INSTANTIATE_TEST_SUITE_P(UnequalLengths, AttentionCuda, ::testing::ValuesIn(unequal_lengths()));

std::vector<Case> grouped_heads() {
  std::vector<Case> cases;
  for (int64_t d : {64, 128})
    for (int64_t hkv : {1, 2, 8})
      for (bool causal : {true, false}) cases.push_back(Case().dim(d).heads(8, hkv).lens(200, 200).masked(causal));
  cases.push_back(Case().dim(256).heads(8, 2).lens(130, 70).masked(true));
  return cases;
}
INSTANTIATE_TEST_SUITE_P(GroupedHeads, AttentionCuda, ::testing::ValuesIn(grouped_heads()));

std::vector<Case> varlen() {
  std::vector<Case> cases;
  for (int64_t d : {64, 128, 256})
    for (bool causal : {true, false}) {
      // An empty sequence, a length-1 one, Tq > Tk (fully masked rows when causal) and Tq < Tk.
      cases.push_back(Case().dim(d).heads(4, 2).masked(causal).varlen({70, 0, 1, 200, 129, 3}, {70, 5, 1, 64, 300, 0}));
      cases.push_back(Case().dim(d).heads(2, 1).masked(causal).varlen({1, 64, 127}, {1, 64, 127}));
    }
  return cases;
}
INSTANTIATE_TEST_SUITE_P(Varlen, AttentionCuda, ::testing::ValuesIn(varlen()));

std::vector<Case> strided_and_more() {
  std::vector<Case> cases;
  for (int64_t d : {64, 128, 256}) {
    cases.push_back(Case().dim(d).lens(100, 150).padded(8));  // 16-byte aligned rows: the cp.async path
    cases.push_back(Case().dim(d).lens(100, 150).padded(3));  // unaligned rows: element loads and stores
    cases.push_back(Case().dim(d).lens(150, 100).masked(false).padded(3).varlen({50, 0, 100}, {30, 70, 0}));
    cases.push_back(Case().dim(d).lens(200, 200).fp16());
    cases.push_back(Case().dim(d).lens(90, 90).fp16().masked(false).heads(4, 1));
  }
  cases.push_back(Case().dim(128).lens(300, 300).with_scale(0.37));
  cases.push_back(Case().dim(64).lens(100, 120).masked(false).with_scale(-0.2));
  cases.push_back(Case().dim(128).lens(2048, 2048).with_batch(1).heads(2, 1));
  return cases;
}
INSTANTIATE_TEST_SUITE_P(StridesDtypesScales, AttentionCuda, ::testing::ValuesIn(strided_and_more()));

class AttentionCudaApi : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no GPU";
  }
};

// The forward has no atomics: two runs give the same bits (a race would not).
TEST_F(AttentionCudaApi, ForwardIsDeterministic) {
  for (int64_t d : {64, 128}) {
    const Case c = Case().dim(d).lens(777, 900).heads(4, 2);
    const Tensors in = to_device(make_inputs(c, 7), 0);
    const Results a = run(c, in, kCuda, AttentionAlgorithm::tiled, 0);
    const Results b = run(c, in, kCuda, AttentionAlgorithm::tiled, 0);
    EXPECT_EQ(a.o.values(), b.o.values());
    EXPECT_EQ(a.lse.values(), b.lse.values());
  }
}

TEST_F(AttentionCudaApi, CallerWorkspaceGivesTheSameGradients) {
  const Case c = Case().dim(64).lens(300, 300).heads(4, 2);
  const Tensors in = to_device(make_inputs(c, 3), 0);
  const Results own = run(c, in, kCuda, AttentionAlgorithm::tiled, 0);

  AttentionBackwardArgs b;
  b.q = in.q.view(), b.k = in.k.view(), b.v = in.v.view(), b.causal = c.causal;
  b.o = own.o.view(), b.lse = own.lse.view(), b.d_o = in.d_o.view();
  Buffer dq = output(c.dtype, in.q.shape(), kCuda, 0), dk = output(c.dtype, in.k.shape(), kCuda, 0),
         dv = output(c.dtype, in.v.shape(), kCuda, 0);
  b.dq = dq.view(), b.dk = dk.view(), b.dv = dv.view();
  const size_t bytes = attention_backward_workspace_bytes(b);
  ASSERT_GT(bytes, 0u);
  Buffer scratch(DType::f32, {int64_t((bytes + 3) / 4)}, kCuda);
  scratch.poison();  // the backward must initialize what it accumulates into
  b.workspace = scratch.view().data, b.workspace_bytes = bytes;
  attention_backward(b);
  flashgla::testing::synchronize(kCuda);
  EXPECT_LE(rel_rms_error(dq.values(), own.dq.values()), 1e-2);
  EXPECT_EQ(dk.values(), own.dk.values());  // dk, dv have no atomics
  EXPECT_EQ(dv.values(), own.dv.values());

  b.workspace_bytes = bytes - 4;
  try {
    attention_backward(b);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "workspace");
  }
}

// Boundaries on the device are not validated by the API: nonsense values must
// still stay inside the tensors (compute-sanitizer memcheck watches this).
TEST_F(AttentionCudaApi, BadDeviceBoundariesStayInBounds) {
  const Case c = Case().dim(64).varlen({40, 40, 40}, {40, 40, 40});
  Tensors in = to_device(make_inputs(c, 5), 0);
  Buffer bad(DType::i32, {4});
  bad.set_values({-5, 100, 30, 1000000});
  in.cu_q = bad.to(kCuda), in.cu_k = bad.to(kCuda);
  EXPECT_NO_THROW(run(c, in, kCuda, AttentionAlgorithm::tiled, 0));
  EXPECT_NO_THROW(flashgla::testing::synchronize(kCuda));  // no fault left behind on the device
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

TEST_F(AttentionCudaApi, Fp32AndFp64PointToTheCpu) {
  Case c = Case().lens(16, 16);
  c.dtype = DType::f32;
  expect_unsupported(c, "q");
  c.dtype = DType::f64;
  expect_unsupported(c, "q");
}

TEST_F(AttentionCudaApi, OtherHeadDimsAreUnsupported) {
  expect_unsupported(Case().lens(16, 16).dim(96), "q");
  expect_unsupported(Case().lens(16, 16).dim(32), "q");
}

TEST_F(AttentionCudaApi, ValueDimMustMatch) {
  const Case c = Case().lens(16, 16);
  Tensors in = to_device(make_inputs(c, 1), 0);
  Buffer v(c.dtype, {c.batch, c.k_len, c.kv_heads, 128}, kCuda);
  Buffer o(c.dtype, {c.batch, c.q_len, c.q_heads, 128}, kCuda), lse(DType::f32, {c.batch, c.q_heads, c.q_len}, kCuda);
  AttentionForwardArgs f;
  f.q = in.q.view(), f.k = in.k.view(), f.v = v.view(), f.o = o.view(), f.lse = lse.view();
  try {
    attention_forward(f);
    FAIL() << "expected an unsupported error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::unsupported);
    EXPECT_EQ(e.argument(), "v");
  }
}

}  // namespace
