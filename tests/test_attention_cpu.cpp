// CPU softmax attention. The fp64 naive algorithm is the reference: its
// forward is checked against the definition written out here, its backward by
// finite differences. The tiled FlashAttention is checked against it, forward
// and backward, over shapes, masks, grouped KV heads, varlen, strides and dtypes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "flashgla/attention.h"
#include "testing/buffer.h"

namespace {

using namespace flashgla;
using flashgla::testing::Buffer;
using flashgla::testing::rel_rms_error;

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// A problem, built by chaining: Shape().lens(100, 80).dims(64, 48).full().
// Varlen after varlen(): B == 1 and Tq, Tk are the totals.
struct Shape {
  int64_t batch = 2, q_len = 64, k_len = 64, q_heads = 4, kv_heads = 2, head_dim = 32, value_dim = 32;
  bool causal = true;
  std::vector<int64_t> seqlens_q, seqlens_k;
  std::optional<double> scale;
  int64_t row_padding = 0;  // > 0: every tensor, inputs and outputs, is a strided slice

  Shape lens(int64_t tq, int64_t tk) const { Shape s = *this; s.q_len = tq, s.k_len = tk; return s; }
  Shape heads(int64_t hq, int64_t hkv) const { Shape s = *this; s.q_heads = hq, s.kv_heads = hkv; return s; }
  Shape dims(int64_t d, int64_t dv) const { Shape s = *this; s.head_dim = d, s.value_dim = dv; return s; }
  Shape full() const { Shape s = *this; s.causal = false; return s; }
  Shape masked(bool causal) const { Shape s = *this; s.causal = causal; return s; }
  Shape with_scale(double scale) const { Shape s = *this; s.scale = scale; return s; }
  Shape padded(int64_t padding) const { Shape s = *this; s.row_padding = padding; return s; }
  Shape varlen(std::vector<int64_t> lens_q, std::vector<int64_t> lens_k) const {
    Shape s = *this;
    s.batch = 1, s.q_len = 0, s.k_len = 0;
    for (int64_t len : lens_q) s.q_len += len;
    for (int64_t len : lens_k) s.k_len += len;
    s.seqlens_q = std::move(lens_q), s.seqlens_k = std::move(lens_k);
    return s;
  }
};

// Names a failing parameter in GoogleTest's output.
void PrintTo(const Shape& s, std::ostream* os) {
  *os << "B=" << s.batch << " Tq=" << s.q_len << " Tk=" << s.k_len << " Hq=" << s.q_heads << " Hkv=" << s.kv_heads
      << " D=" << s.head_dim << " Dv=" << s.value_dim << (s.causal ? " causal" : " full");
  if (!s.seqlens_q.empty()) {
    *os << " varlen q/k:";
    for (size_t n = 0; n < s.seqlens_q.size(); ++n) *os << " " << s.seqlens_q[n] << "/" << s.seqlens_k[n];
  }
  if (s.row_padding > 0) *os << " padding=" << s.row_padding;
}

// Sequence boundaries as an i64 tensor read with stride 2 (a strided view
// over [0, x, b1, x, b2, ...]) when `strided`, else as a contiguous i32 tensor.
struct Boundaries {
  Buffer storage;
  TensorView view;
};

Boundaries boundaries(const std::vector<int64_t>& seqlens, bool strided) {
  if (seqlens.empty()) return {};
  std::vector<double> cumsum{0};
  for (int64_t len : seqlens) cumsum.push_back(cumsum.back() + double(len));
  const int64_t n = int64_t(cumsum.size());
  if (!strided) {
    Buffer b(DType::i32, {n});
    b.set_values(cumsum);
    return {b, b.view()};
  }
  Buffer b(DType::i64, {2 * n});
  std::vector<double> interleaved(size_t(2 * n), -7.0);  // odd slots are never read
  for (int64_t i = 0; i < n; ++i) interleaved[size_t(2 * i)] = cumsum[size_t(i)];
  b.set_values(interleaved);
  TensorView view = b.view();
  view.shape[0] = n, view.stride[0] = 2;
  return {b, view};
}

struct Inputs {
  Buffer q, k, v, d_o;
  Boundaries cu_q, cu_k;
};

Inputs make_inputs(const Shape& s, DType dtype, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Inputs in;
  auto random = [&](std::vector<int64_t> shape) {
    Buffer b(dtype, std::move(shape), {}, s.row_padding);
    b.fill_normal(rng);
    return b;
  };
  in.q = random({s.batch, s.q_len, s.q_heads, s.head_dim});
  in.k = random({s.batch, s.k_len, s.kv_heads, s.head_dim});
  in.v = random({s.batch, s.k_len, s.kv_heads, s.value_dim});
  in.d_o = random({s.batch, s.q_len, s.q_heads, s.value_dim});
  in.cu_q = boundaries(s.seqlens_q, s.row_padding > 0);
  in.cu_k = boundaries(s.seqlens_k, s.row_padding > 0);
  return in;
}

// The same values in f64, to feed the reference.
Inputs as_f64(const Inputs& in) { return {in.q.cast(DType::f64), in.k.cast(DType::f64), in.v.cast(DType::f64),
                                          in.d_o.cast(DType::f64), in.cu_q, in.cu_k}; }

struct Forward {
  Buffer o, lse;
};

Forward run_forward(const Shape& s, const Inputs& in, AttentionAlgorithm algorithm) {
  Forward f{Buffer(in.q.dtype(), {s.batch, s.q_len, s.q_heads, s.value_dim}, {}, s.row_padding),
            Buffer(DType::f32, {s.batch, s.q_heads, s.q_len}, {}, s.row_padding)};
  f.o.poison();
  f.lse.poison();
  AttentionForwardArgs a;
  a.q = in.q.view(), a.k = in.k.view(), a.v = in.v.view();
  a.cu_seqlens_q = in.cu_q.view, a.cu_seqlens_k = in.cu_k.view;
  a.causal = s.causal, a.scale = s.scale, a.algorithm = algorithm;
  a.o = f.o.view(), a.lse = f.lse.view();
  attention_forward(a);
  return f;
}

struct Grads {
  Buffer dq, dk, dv;
};

Grads run_backward(const Shape& s, const Inputs& in, const Forward& f, AttentionAlgorithm algorithm) {
  Grads g{Buffer(in.q.dtype(), in.q.shape(), {}, s.row_padding), Buffer(in.q.dtype(), in.k.shape(), {}, s.row_padding),
          Buffer(in.q.dtype(), in.v.shape(), {}, s.row_padding)};
  g.dq.poison();
  g.dk.poison();
  g.dv.poison();
  AttentionBackwardArgs a;
  a.q = in.q.view(), a.k = in.k.view(), a.v = in.v.view();
  a.cu_seqlens_q = in.cu_q.view, a.cu_seqlens_k = in.cu_k.view;
  a.causal = s.causal, a.scale = s.scale, a.algorithm = algorithm;
  a.o = f.o.view(), a.lse = f.lse.view(), a.d_o = in.d_o.view();
  a.dq = g.dq.view(), a.dk = g.dk.view(), a.dv = g.dv.view();
  attention_backward(a);
  return g;
}

double error(const Buffer& out, const Buffer& ref) { return rel_rms_error(out.values(), ref.values()); }

// lse must be −inf exactly where the reference's is (queries that see no key)
// and close elsewhere.
double lse_error(const Buffer& out, const Buffer& ref) {
  const std::vector<double> o = out.values(), r = ref.values();
  std::vector<double> finite_out, finite_ref;
  for (size_t i = 0; i < r.size(); ++i) {
    if (r[i] == kNegInf) {
      if (o[i] != kNegInf) return std::nan("");
    } else {
      finite_out.push_back(o[i]);
      finite_ref.push_back(r[i]);
    }
  }
  return finite_ref.empty() ? 0.0 : rel_rms_error(finite_out, finite_ref);
}

// ---- the reference against the definition ---------------------------------------

// o_i = Σ_j softmax_j(scale·q_i·k_j) v_j over the keys query i sees, written out
// query by query from the logical (row-major) values.
TEST(AttentionNaive, ForwardMatchesTheDefinition) {
  const Shape s = Shape().heads(4, 2).dims(8, 5).varlen({4, 0, 6, 3, 2}, {7, 3, 2, 0, 2});
  const Inputs in = make_inputs(s, DType::f64, 11);
  const Forward f = run_forward(s, in, AttentionAlgorithm::naive);
  const std::vector<double> q = in.q.values(), k = in.k.values(), v = in.v.values();
  const std::vector<double> o = f.o.values(), lse = f.lse.values();
  const int64_t H = s.q_heads, Hkv = s.kv_heads, D = s.head_dim, Dv = s.value_dim;
  const double scale = 1.0 / std::sqrt(double(D));
  std::vector<double> expected_o(o.size()), expected_lse(lse.size());
  int64_t q_begin = 0, k_begin = 0;
  for (size_t n = 0; n < s.seqlens_q.size(); ++n) {
    const int64_t Tq = s.seqlens_q[n], Tk = s.seqlens_k[n];
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / Hkv);
      for (int64_t i = 0; i < Tq; ++i) {
        const int64_t tq = q_begin + i;
        double sum = 0;
        std::vector<double> weighted(size_t(Dv), 0.0);
        for (int64_t j = 0; j < Tk && j <= i + Tk - Tq; ++j) {
          const int64_t tk = k_begin + j;
          double score = 0;
          for (int64_t d = 0; d < D; ++d) score += q[size_t((tq * H + h) * D + d)] * k[size_t((tk * Hkv + g) * D + d)];
          const double w = std::exp(scale * score);
          sum += w;
          for (int64_t e = 0; e < Dv; ++e) weighted[size_t(e)] += w * v[size_t((tk * Hkv + g) * Dv + e)];
        }
        for (int64_t e = 0; e < Dv; ++e) expected_o[size_t((tq * H + h) * Dv + e)] = sum > 0 ? weighted[size_t(e)] / sum : 0.0;
        expected_lse[size_t(h * s.q_len + tq)] = std::log(sum);  // log(0) = −inf
      }
    }
    q_begin += Tq, k_begin += Tk;
  }
  EXPECT_LE(rel_rms_error(o, expected_o), 1e-14);
  Buffer expected_lse_buffer(DType::f64, {1, H, s.q_len});
  expected_lse_buffer.set_values(expected_lse);
  EXPECT_LE(lse_error(f.lse, expected_lse_buffer), 1e-7);  // lse is stored in f32
}

// dL/dx for L = Σ dO ⊙ o(q, k, v), by central differences on every element.
class AttentionNaiveGradient : public ::testing::TestWithParam<Shape> {};

TEST_P(AttentionNaiveGradient, MatchesFiniteDifferences) {
  const Shape s = GetParam();
  Inputs in = make_inputs(s, DType::f64, 5);
  const Grads g = run_backward(s, in, run_forward(s, in, AttentionAlgorithm::naive), AttentionAlgorithm::naive);
  const std::vector<double> d_o = in.d_o.values();
  auto loss = [&] {
    const std::vector<double> o = run_forward(s, in, AttentionAlgorithm::naive).o.values();
    double sum = 0;
    for (size_t i = 0; i < o.size(); ++i) sum += d_o[i] * o[i];
    return sum;
  };
  const double step = 1e-5;
  auto numeric_gradient = [&](Buffer& x) {
    std::vector<double> values = x.values(), grad(values.size());
    for (size_t i = 0; i < values.size(); ++i) {
      const double original = values[i];
      values[i] = original + step;
      x.set_values(values);
      const double plus = loss();
      values[i] = original - step;
      x.set_values(values);
      grad[i] = (plus - loss()) / (2 * step);
      values[i] = original;
    }
    x.set_values(values);
    return grad;
  };
  EXPECT_LE(rel_rms_error(g.dq.values(), numeric_gradient(in.q)), 1e-8) << "dq";
  EXPECT_LE(rel_rms_error(g.dk.values(), numeric_gradient(in.k)), 1e-8) << "dk";
  EXPECT_LE(rel_rms_error(g.dv.values(), numeric_gradient(in.v)), 1e-8) << "dv";
}

const Shape kTiny = Shape().heads(4, 2).dims(3, 5);

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionNaiveGradient,
                         ::testing::Values(kTiny.lens(5, 7).full(), kTiny.lens(5, 7), kTiny.lens(6, 6),
                                           kTiny.lens(7, 4),  // the first three queries see no key
                                           kTiny.varlen({3, 0, 4, 2}, {2, 3, 0, 5}),
                                           kTiny.full().varlen({3, 0, 4, 2}, {2, 3, 0, 5})));

// ---- tiled against the reference -------------------------------------------------

struct Case {
  std::string name;
  Shape shape;
  DType dtype = DType::f32;
  double slack = 1;  // a sharper softmax (larger scores) loses more digits in exp
};

class AttentionTiled : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionTiled, MatchesNaive) {
  const Case& c = GetParam();
  const Shape& s = c.shape;
  const Inputs in = make_inputs(s, c.dtype, std::hash<std::string>{}(c.name));
  // The reference sees the same (rounded) inputs, in f64.
  const Inputs ref_in = as_f64(in);
  const Forward ref = run_forward(s, ref_in, AttentionAlgorithm::naive);
  const Grads ref_grads = run_backward(s, ref_in, ref, AttentionAlgorithm::naive);

  const Forward f = run_forward(s, in, AttentionAlgorithm::tiled);
  const Grads g = run_backward(s, in, f, AttentionAlgorithm::tiled);
  EXPECT_LE(lse_error(f.lse, ref.lse), 1e-6 * c.slack) << "lse";

  // bf16/fp16: no worse than twice the naive algorithm's error in the same
  // dtype (fp64 inside, so that is the rounding of its outputs alone).
  const bool half = c.dtype == DType::bf16 || c.dtype == DType::f16;
  Forward naive_half;
  Grads naive_half_grads;
  if (half) {
    naive_half = run_forward(s, in, AttentionAlgorithm::naive);
    naive_half_grads = run_backward(s, in, naive_half, AttentionAlgorithm::naive);
  }
  // f32 and f64 against fixed bounds: fp32 accumulation is a few 1e-7 off. f64
  // outputs are exact to ~1e-15, but the backward recomputes P from the f32
  // lse, which bounds dq, dk, dv near 1e-7.
  const double o_tol = c.dtype == DType::f64 ? 1e-12 : 1e-6, grad_tol = 1e-6;
  auto expect_close = [&](const char* output, const Buffer& out, const Buffer& ref_out, const Buffer& naive_out,
                          double fp_tol) {
    const double tol = half ? 2 * error(naive_out, ref_out) + 1e-6 : fp_tol * c.slack;
    EXPECT_LE(error(out, ref_out), tol) << output;
  };
  expect_close("o", f.o, ref.o, naive_half.o, o_tol);
  expect_close("dq", g.dq, ref_grads.dq, naive_half_grads.dq, grad_tol);
  expect_close("dk", g.dk, ref_grads.dk, naive_half_grads.dk, grad_tol);
  expect_close("dv", g.dv, ref_grads.dv, naive_half_grads.dv, grad_tol);
}

std::vector<Case> tiled_cases() {
  std::vector<Case> cases;
  auto add = [&](std::string name, Shape shape, DType dtype = DType::f32, double slack = 1) {
    cases.push_back({std::move(name), shape, dtype, slack});
  };
  for (bool causal : {false, true}) {
    const std::string mask = causal ? "Causal" : "Full";
    const Shape base = Shape().masked(causal);
    for (int64_t t : {1, 63, 64, 65, 200}) add(mask + "T" + std::to_string(t), base.lens(t, t));
    // Tq > Tk with the causal mask leaves the first Tq − Tk queries without keys.
    for (auto [tq, tk] : {std::pair<int64_t, int64_t>{63, 200}, {200, 65}, {1, 64}, {64, 1}, {130, 129}})
      add(mask + "Tq" + std::to_string(tq) + "Tk" + std::to_string(tk), base.lens(tq, tk));
    for (auto [d, dv] : {std::pair<int64_t, int64_t>{16, 16}, {64, 64}, {128, 128}, {16, 48}, {128, 64}, {64, 16}})
      add(mask + "D" + std::to_string(d) + "Dv" + std::to_string(dv),
          base.lens(100, 80).dims(d, dv));
    for (int64_t hkv : {1, 2, 4}) add(mask + "Hkv" + std::to_string(hkv), base.lens(70, 90).heads(4, hkv));
    // Empty sequences on either side, length-1 sequences, and sequences longer than a tile.
    add(mask + "Varlen", base.heads(4, 1).varlen({0, 1, 65, 130, 5, 3, 0}, {4, 1, 65, 70, 0, 9, 0}));
    add(mask + "Strided", base.lens(77, 150).padded(3));
    add(mask + "VarlenStrided",
        base.heads(4, 1).padded(5).varlen({1, 0, 100, 64}, {1, 3, 64, 129}));
    // No queries; no keys (every output row 0, every lse −inf).
    add(mask + "Tq0", base.lens(0, 5));
    add(mask + "Tk0", base.lens(5, 0));
    // Sharp softmax: the running max changes by a lot between key tiles.
    add(mask + "Scale1", base.lens(150, 150).dims(64, 64).with_scale(1.0), DType::f32, 4);
  }
  const std::pair<DType, const char*> dtypes[] = {{DType::f64, "F64"}, {DType::f32, "F32"}, {DType::bf16, "Bf16"}, {DType::f16, "F16"}};
  for (auto [dtype, name] : dtypes) {
    const std::string prefix = name;
    add(prefix + "CausalTq200Tk150", Shape().lens(200, 150).heads(4, 1).dims(64, 48), dtype);
    add(prefix + "FullTq65Tk200", Shape().lens(65, 200).dims(128, 128).full(), dtype);
    add(prefix + "VarlenStrided",
        Shape().dims(64, 64).padded(2).varlen({0, 1, 90, 64}, {3, 1, 90, 0}), dtype);
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cases, AttentionTiled, ::testing::ValuesIn(tiled_cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// ---- queries that see no key -------------------------------------------------------

TEST(AttentionMasking, QueriesWithoutKeysGetZeroOutputMinusInfLseAndZeroGradient) {
  // Causal with Tq = 10 > Tk = 4: queries 0..5 see no key.
  const Shape s = Shape().lens(10, 4).heads(2, 1).dims(8, 8);
  const Inputs in = make_inputs(s, DType::f32, 3);
  const Forward f = run_forward(s, in, AttentionAlgorithm::tiled);
  const Grads g = run_backward(s, in, f, AttentionAlgorithm::tiled);
  const std::vector<double> o = f.o.values(), lse = f.lse.values(), dq = g.dq.values();
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.q_heads; ++h)
      for (int64_t i = 0; i < s.q_len; ++i) {
        const bool sees_keys = i >= s.q_len - s.k_len;
        EXPECT_EQ(lse[size_t((b * s.q_heads + h) * s.q_len + i)] == kNegInf, !sees_keys) << "h=" << h << " i=" << i;
        for (int64_t d = 0; d < s.head_dim; ++d) {
          const size_t at = size_t(((b * s.q_len + i) * s.q_heads + h) * s.head_dim + d);
          EXPECT_FALSE(std::isnan(o[at]) || std::isnan(dq[at]));
          if (!sees_keys) EXPECT_TRUE(o[at] == 0 && dq[at] == 0) << "h=" << h << " i=" << i;
        }
      }
  // Keys are still seen by the later queries: their gradients are not zero.
  const std::vector<double> dk = g.dk.values();
  EXPECT_TRUE(std::any_of(dk.begin(), dk.end(), [](double x) { return x != 0; }));
}

}  // namespace
