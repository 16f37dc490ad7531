// CPU GLA backend: the fp64 recurrent reference against finite differences,
// the chunked algorithm against the reference (forward and backward, every
// gate kind, dtype, varlen, strides, extreme gates), decode, and state
// chaining across calls.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>

#include "cpu/gla/gla_kernels.h"
#include "gla_test_util.h"

namespace flashgla::testing::gla_test {
namespace {

constexpr GlaAlgorithm kChunked = GlaAlgorithm::chunked;
constexpr GlaAlgorithm kRecurrent = GlaAlgorithm::recurrent;

// The chunked algorithm has a baseline build and, on CPUs with AVX2 + FMA, an
// AVX2 build chosen at run time; FLASHGLA_CPU_ISA=baseline forces the former.
// Sets the variable for its lifetime.
class InstructionSet {
 public:
  explicit InstructionSet(const char* isa) {
    if (const char* old = std::getenv(kVariable)) saved_ = old, had_ = true;
    if (isa) ::setenv(kVariable, isa, 1);
    else ::unsetenv(kVariable);
  }
  ~InstructionSet() {
    if (had_) ::setenv(kVariable, saved_.c_str(), 1);
    else ::unsetenv(kVariable);
  }
  // Every build this machine runs: "baseline", and "avx2" where supported.
  static std::vector<const char*> available() {
    InstructionSet automatic(nullptr);
    if (std::string(cpu::gla::chunked_instruction_set()) == "avx2") return {"baseline", "avx2"};
    return {"baseline"};
  }

 private:
  static constexpr const char* kVariable = "FLASHGLA_CPU_ISA";
  std::string saved_;
  bool had_ = false;
};

// ---- the reference against finite differences -----------------------------------

// The loss whose gradients the backward computes: <o, d_o> + <ht, dht>.
double loss(const Case& c, const Inputs& in, bool reverse) {
  const Outputs out = run_forward(c, in, kRecurrent, reverse);
  const std::vector<double> w_o = in.d_o.values();
  double sum = 0;
  for (size_t i = 0; i < out.o.size(); ++i) sum += out.o[i] * w_o[i];
  if (c.dht) {
    const std::vector<double> w_h = in.dht.values();
    for (size_t i = 0; i < out.ht.size(); ++i) sum += out.ht[i] * w_h[i];
  }
  return sum;
}

// Central differences of loss() w.r.t. every element of one input, dividing by
// the step actually stored (h0 is f32, so x ± eps is rounded).
std::vector<double> numeric_gradient(const Case& c, const Inputs& in, Buffer Inputs::*input, double eps, bool reverse) {
  Buffer& x = const_cast<Buffer&>(in.*input);  // perturbed in place and restored
  const std::vector<double> original = x.values();
  std::vector<double> grad(original.size());
  for (size_t i = 0; i < original.size(); ++i) {
    std::vector<double> perturbed = original;
    perturbed[i] = original[i] + eps;
    x.set_values(perturbed);
    const double stored_plus = x.values()[i], loss_plus = loss(c, in, reverse);
    perturbed[i] = original[i] - eps;
    x.set_values(perturbed);
    const double stored_minus = x.values()[i], loss_minus = loss(c, in, reverse);
    grad[i] = (loss_plus - loss_minus) / (stored_plus - stored_minus);
  }
  x.set_values(original);
  return grad;
}

void check_reference_gradients(Case c, bool reverse) {
  c = f64_case(c);
  c.final_state = c.dht;  // the loss reads ht only with a dht
  const Inputs in = make_inputs(c);
  const Grads grads = run_backward(c, in, kRecurrent, reverse);
  // o and ht are linear in each single element of q, k, v and h0, so any step
  // is exact there, and a large one keeps the rounding of the f32 final state
  // (read by the loss when there is a dht) small. g needs a small step; with a
  // dht, the f32 rounding of ht (~1e-7) divided by the step dominates.
  const double linear_step = 0.5, gate_step = c.dht ? 1e-3 : 1e-5, linear_tol = c.dht ? 1e-6 : 1e-7;
  expect_close("dq", grads.dq, numeric_gradient(c, in, &Inputs::q, linear_step, reverse), linear_tol);
  expect_close("dk", grads.dk, numeric_gradient(c, in, &Inputs::k, linear_step, reverse), linear_tol);
  expect_close("dv", grads.dv, numeric_gradient(c, in, &Inputs::v, linear_step, reverse), linear_tol);
  expect_close("dh0", grads.dh0, numeric_gradient(c, in, &Inputs::h0, linear_step, reverse), 1e-6);  // dh0 is f32
  if (c.gate != Gate::none)
    expect_close("dg", grads.dg, numeric_gradient(c, in, &Inputs::g, gate_step, reverse), c.dht ? 2e-4 : 1e-7);
}

TEST(GlaCpuReference, GradientsMatchFiniteDifferences) {
  for (Gate gate : {Gate::vector, Gate::scalar, Gate::none})
    for (bool reverse : {false, true})
      for (bool dht : {false, true}) {
        Case c;
        c.B = 2, c.T = 6, c.H = 2, c.K = 3, c.V = 4, c.gate = gate, c.dht = dht;
        c.seed = 10 + 4 * int(gate) + 2 * reverse + dht;
        SCOPED_TRACE(::testing::Message() << "gate " << int(gate) << " reverse " << reverse << " dht " << dht);
        check_reference_gradients(c, reverse);
      }
}

TEST(GlaCpuReference, VarlenGradientsMatchFiniteDifferences) {
  Case c;
  c.B = 1, c.T = 6, c.H = 2, c.K = 3, c.V = 2, c.cu_seqlens = {0, 2, 2, 3, 6}, c.seed = 30;
  for (bool reverse : {false, true}) {
    SCOPED_TRACE(::testing::Message() << "reverse " << reverse);
    check_reference_gradients(c, reverse);
  }
}

// reverse == the forward direction on the time-flipped sequence.
TEST(GlaCpuReference, ReverseIsForwardOnFlippedTokens) {
  Case c;
  c.B = 2, c.T = 37, c.H = 2, c.K = 16, c.V = 24, c.gate = Gate::scalar, c.dtype = DType::f64, c.seed = 31;
  const Inputs in = make_inputs(c);
  auto flip = [&](const Buffer& b) {  // reverse the token axis of [B, T, H, ...]
    if (!b.defined()) return b;
    const std::vector<double> x = b.values();
    const int64_t B = b.shape()[0], T = b.shape()[1], row = int64_t(x.size()) / (B * T);
    std::vector<double> y(x.size());
    for (int64_t bt = 0; bt < B * T; ++bt) {
      const int64_t flipped = (bt / T) * T + (T - 1 - bt % T);
      std::copy_n(x.begin() + bt * row, row, y.begin() + flipped * row);
    }
    Buffer out(b.dtype(), b.shape());
    out.set_values(y);
    return out;
  };
  Inputs flipped = in;
  flipped.q = flip(in.q), flipped.k = flip(in.k), flipped.v = flip(in.v), flipped.g = flip(in.g);
  flipped.d_o = flip(in.d_o);
  const Outputs rev = run_forward(c, in, kRecurrent, /*reverse=*/true);
  const Grads rev_grads = run_backward(c, in, kRecurrent, /*reverse=*/true);
  for (GlaAlgorithm algorithm : {kRecurrent, kChunked}) {
    SCOPED_TRACE(algorithm == kChunked ? "chunked" : "recurrent");
    const Outputs fwd = run_forward(c, flipped, algorithm);
    const Grads grads = run_backward(c, flipped, algorithm);
    auto unflip = [&](const std::vector<double>& x, const Buffer& like) {
      Buffer b(DType::f64, like.shape());
      b.set_values(x);
      return flip(b).values();
    };
    expect_close("o", unflip(fwd.o, in.d_o), rev.o, 1e-12);
    expect_close("ht", fwd.ht, rev.ht, 1e-6);
    expect_close("dq", unflip(grads.dq, in.q), rev_grads.dq, 1e-12);
    expect_close("dk", unflip(grads.dk, in.k), rev_grads.dk, 1e-12);
    expect_close("dv", unflip(grads.dv, in.v), rev_grads.dv, 1e-12);
    expect_close("dg", unflip(grads.dg, in.g), rev_grads.dg, 1e-12);
    expect_close("dh0", grads.dh0, rev_grads.dh0, 1e-6);
  }
}

// ---- chunked against the reference ---------------------------------------------

struct Tolerance {
  double values;  // o, dq, dk, dv, dg
  double states;  // ht, dh0 (stored in f32 whatever the dtype)
};

Tolerance tolerance_for(DType dtype) {
  switch (dtype) {
    case DType::f64: return {1e-12, 1e-6};
    case DType::f32: return {1e-5, 1e-5};
    default: return {1e-2, 1e-4};  // bf16, f16: outputs rounded to the dtype
  }
}

void check_chunked_outputs(const Case& c, const Inputs& in, const Outputs& ref, const Grads& ref_grads);

void check_chunked_against_reference(const Case& c, const Inputs& in) {
  // The reference runs in fp64 on the very same (rounded) input values.
  const Case ref_case = f64_case(c);
  const Inputs ref_in = as_f64(in);
  const Outputs ref = run_forward(ref_case, ref_in, kRecurrent);
  const Grads ref_grads = run_backward(ref_case, ref_in, kRecurrent);
  for (const auto* x : {&ref.o, &ref.ht, &ref_grads.dq, &ref_grads.dk, &ref_grads.dv, &ref_grads.dg, &ref_grads.dh0})
    ASSERT_TRUE(all_finite(*x)) << "the reference itself is not finite";

  for (const char* isa : InstructionSet::available()) {
    SCOPED_TRACE(isa);
    InstructionSet use(isa);
    check_chunked_outputs(c, in, ref, ref_grads);
  }
}

void check_chunked_against_reference(const Case& c) { check_chunked_against_reference(c, make_inputs(c)); }

void check_chunked_outputs(const Case& c, const Inputs& in, const Outputs& ref, const Grads& ref_grads) {
  const Outputs out = run_forward(c, in, kChunked);
  const Grads grads = run_backward(c, in, kChunked);
  const Tolerance tol = tolerance_for(c.dtype);
  // dg rounded to a 16-bit dtype, or fp64 dg stored in f32, carries that
  // rounding. With gates at -20 per step dg is made of exp(Γ_a − Γ_b) terms
  // only, with Γ near -10^3 within a chunk: an f32 cumsum that large is off by
  // ~1e-4 absolute, hence as much relative error in dg (inherent in the
  // algorithm; fp64 stays far below its tolerance).
  double dg_tol = tol.values;
  if (c.dg_dtype == DType::bf16 || c.dg_dtype == DType::f16) dg_tol = 1e-2;
  if (c.dg_dtype == DType::f32 && c.dtype == DType::f64) dg_tol = 1e-6;
  if (c.dtype != DType::f64 && c.gate_values == GateValues::very_negative) dg_tol = 1e-4;
  expect_close("o", out.o, ref.o, tol.values);
  expect_close("ht", out.ht, ref.ht, tol.states);
  expect_close("dq", grads.dq, ref_grads.dq, tol.values);
  expect_close("dk", grads.dk, ref_grads.dk, tol.values);
  expect_close("dv", grads.dv, ref_grads.dv, tol.values);
  expect_close("dg", grads.dg, ref_grads.dg, dg_tol);
  expect_close("dh0", grads.dh0, ref_grads.dh0, tol.states);

  if (c.dtype == DType::bf16 || c.dtype == DType::f16) {
    // FlashAttention's rule: no worse than twice the error of the reference
    // computed exactly and rounded to the same dtype.
    const Outputs rounded = run_forward(c, in, kRecurrent);
    const Grads rounded_grads = run_backward(c, in, kRecurrent);
    auto within_twice = [](const char* what, const std::vector<double>& out, const std::vector<double>& rounded,
                           const std::vector<double>& exact) {
      if (exact.empty()) return;
      EXPECT_LE(rel_rms_error(out, exact), 2 * rel_rms_error(rounded, exact) + 1e-6) << what;
    };
    within_twice("o", out.o, rounded.o, ref.o);
    within_twice("dq", grads.dq, rounded_grads.dq, ref_grads.dq);
    within_twice("dk", grads.dk, rounded_grads.dk, ref_grads.dk);
    within_twice("dv", grads.dv, rounded_grads.dv, ref_grads.dv);
  }
}

Case make_case(const std::string& name, int64_t B, int64_t T, int64_t H, int64_t K, int64_t V, Gate gate,
               const std::function<void(Case&)>& tweak = {}) {
  Case c;
  c.name = name, c.B = B, c.T = T, c.H = H, c.K = K, c.V = V, c.gate = gate;
  c.seed = std::hash<std::string>{}(name);
  if (tweak) tweak(c);
  return c;
}

// A sample of the grid T × K × V × gate × options × dtype, chosen so that every
// value of each axis appears, rather than the full product.
std::vector<Case> chunked_cases() {
  auto no_h0 = [](Case& c) { c.h0 = false; };
  auto no_states = [](Case& c) { c.h0 = c.final_state = c.dht = false; };
  auto no_dht = [](Case& c) { c.dht = false; };
  auto near_zero = [](Case& c) { c.gate_values = GateValues::near_zero; };
  auto minus_20 = [](Case& c) { c.gate_values = GateValues::very_negative; };
  auto dtype = [](DType d, std::function<void(Case&)> more = {}) {
    return [d, more](Case& c) {
      c.dtype = d;
      if (d == DType::f64) c.gate_dtype = c.dg_dtype = DType::f64;
      if (more) more(c);
    };
  };
  return {
      make_case("T1_K16_V32", 2, 1, 2, 16, 32, Gate::vector),
      make_case("T15_K32_V16_scalar_noh0", 1, 15, 3, 32, 16, Gate::scalar, no_h0),
      make_case("T63_K64_V64_nodht", 1, 63, 2, 64, 64, Gate::vector, no_dht),
      make_case("T64_K100_V64_nogate", 1, 64, 2, 100, 64, Gate::none),
      make_case("T65_K128_V100", 1, 65, 2, 128, 100, Gate::vector),
      make_case("T200_K16_V128_scalar_nostates", 2, 200, 2, 16, 128, Gate::scalar, no_states),
      make_case("T1000_K64_V32", 1, 1000, 2, 64, 32, Gate::vector),
      make_case("T1000_K128_V128_scalar", 1, 1000, 1, 128, 128, Gate::scalar),
      make_case("T1000_K32_V100_nogate", 1, 1000, 1, 32, 100, Gate::none, no_h0),
      make_case("near_zero_vector", 1, 200, 2, 64, 32, Gate::vector, near_zero),
      make_case("near_zero_scalar", 1, 130, 2, 32, 64, Gate::scalar, near_zero),
      make_case("minus20_vector", 1, 200, 2, 64, 48, Gate::vector, minus_20),
      make_case("minus20_scalar", 2, 100, 2, 32, 16, Gate::scalar, minus_20),
      make_case("minus20_f64", 1, 150, 2, 16, 32, Gate::vector, dtype(DType::f64, minus_20)),
      make_case("varlen", 1, 330, 2, 32, 64, Gate::vector,
                [](Case& c) { c.cu_seqlens = {0, 0, 1, 65, 65, 200, 330}; }),
      make_case("varlen_scalar_nogate_states", 1, 140, 2, 64, 16, Gate::scalar,
                [](Case& c) { c.cu_seqlens = {0, 1, 1, 64, 140}; }),
      make_case("varlen_nogate", 1, 100, 1, 16, 16, Gate::none, [](Case& c) { c.cu_seqlens = {0, 37, 37, 99, 100}; }),
      make_case("strided", 2, 100, 2, 32, 48, Gate::vector, [](Case& c) { c.row_padding = 3; }),
      make_case("strided_varlen_scalar", 1, 90, 2, 16, 32, Gate::scalar, [](Case& c) {
        c.row_padding = 5;
        c.cu_seqlens = {0, 1, 1, 90};
      }),
      make_case("bf16", 1, 200, 2, 64, 64, Gate::vector, dtype(DType::bf16)),
      make_case("bf16_gate_bf16", 1, 130, 2, 32, 64, Gate::vector, dtype(DType::bf16, [](Case& c) {
        c.gate_dtype = c.dg_dtype = DType::bf16;
      })),
      make_case("f16", 1, 130, 2, 32, 100, Gate::scalar, dtype(DType::f16)),
      make_case("f16_near_zero", 1, 70, 2, 64, 32, Gate::vector, dtype(DType::f16, near_zero)),
      make_case("f64", 1, 200, 2, 64, 32, Gate::vector, dtype(DType::f64)),
      make_case("f64_scalar_varlen", 1, 150, 2, 32, 16, Gate::scalar,
                dtype(DType::f64, [](Case& c) { c.cu_seqlens = {0, 0, 1, 150}; })),
      make_case("f64_dg_f32", 1, 80, 1, 16, 16, Gate::vector, dtype(DType::f64, [](Case& c) {
        c.dg_dtype = DType::f32;
      })),
      make_case("f32_gate_f64", 1, 70, 2, 16, 16, Gate::vector, [](Case& c) { c.gate_dtype = DType::f64; }),
  };
}

class GlaCpuChunked : public ::testing::TestWithParam<Case> {};

TEST_P(GlaCpuChunked, MatchesRecurrentReference) { check_chunked_against_reference(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Grid, GlaCpuChunked, ::testing::ValuesIn(chunked_cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// Every sequence empty: nothing to compute, the state passes straight through.
TEST(GlaCpuChunked, EmptySequences) {
  for (bool varlen : {false, true})
    for (GlaAlgorithm algorithm : {kChunked, kRecurrent}) {
      Case c;
      c.B = varlen ? 1 : 2, c.T = 0, c.H = 2, c.K = 16, c.V = 8;
      if (varlen) c.cu_seqlens = {0, 0, 0};
      const Inputs in = make_inputs(c);
      const Outputs out = run_forward(c, in, algorithm);
      const Grads grads = run_backward(c, in, algorithm);
      EXPECT_TRUE(out.o.empty() && grads.dq.empty() && grads.dg.empty());
      EXPECT_EQ(out.ht, in.h0.values());
      EXPECT_EQ(grads.dh0, in.dht.values());
    }
}

// ---- range by range ---------------------------------------------------------------
// gla_forward and gla_backward run the chunked kernels on each (sequence, head) pair one range of
// kRangeTokens tokens at a time (cpu/gla/gla_kernels.h), so that their scratch does not grow with T.

// The chunked kernels on each whole (sequence, head) pair at once, from the inputs' values: the results
// gla_forward and gla_backward must give bit for bit. T is float for f32 cases, double for f64 ones.
template <class T>
void whole_sequence_chunked(const Case& c, const Inputs& in, Outputs& out, Grads& grads) {
  ASSERT_EQ(c.gate, Gate::vector);
  const int64_t H = c.H, K = c.K, V = c.V, KV = K * V, N = c.num_seqs();
  const T scale = T(1.0 / std::sqrt(double(K)));  // gla.cpp: q *= T(p.scale)
  const std::vector<double> q = in.q.values(), k = in.k.values(), v = in.v.values(), g = in.g.values(),
                            d_o = in.d_o.values(), h0 = in.h0.values(), dht = in.dht.values();
  out.o.assign(v.size(), 0), out.ht.assign(size_t(N * H * KV), 0);
  grads.dq.assign(q.size(), 0), grads.dk.assign(k.size(), 0), grads.dv.assign(v.size(), 0);
  grads.dg.assign(g.size(), 0), grads.dh0.assign(size_t(N * H * KV), 0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t head = 0; head < H; ++head) {
      const bool varlen = !c.cu_seqlens.empty();
      const int64_t batch = varlen ? 0 : n, begin = varlen ? c.cu_seqlens[size_t(n)] : 0;
      const int64_t len = varlen ? c.cu_seqlens[size_t(n + 1)] - begin : c.T;
      auto at = [&](int64_t i, int64_t D, int64_t d) { return size_t(((batch * c.T + begin + i) * H + head) * D + d); };
      auto rows = [&](const std::vector<double>& x, int64_t D) {
        std::vector<T> y(size_t(len * D));
        for (int64_t i = 0; i < len; ++i)
          for (int64_t d = 0; d < D; ++d) y[size_t(i * D + d)] = T(x[at(i, D, d)]);
        return y;
      };
      auto state = [&](const std::vector<double>& x) {
        return std::vector<T>(x.begin() + (n * H + head) * KV, x.begin() + (n * H + head + 1) * KV);
      };
      std::vector<T> qs = rows(q, K), ks = rows(k, K), vs = rows(v, V), gs = rows(g, K), dos = rows(d_o, V);
      for (T& x : qs) x *= scale;
      const cpu::gla::HeadInputs<T> pair{len, K, V, qs.data(), ks.data(), vs.data(), gs.data(), GateKind::vector};

      std::vector<T> s = state(h0), o(size_t(len * V));
      cpu::gla::chunked_forward(pair, s.data(), o.data());
      const std::vector<T> h = state(h0);
      std::vector<T> ds = state(dht), dq(size_t(len * K)), dk(size_t(len * K)), dv(size_t(len * V)),
                     dg(size_t(len * K)), states(size_t((len + kChunk - 1) / kChunk * KV));
      cpu::gla::chunked_backward(pair, h.data(), dos.data(), ds.data(), dq.data(), dk.data(), dv.data(), dg.data(),
                                 states.data());
      for (T& x : dq) x *= scale;

      for (int64_t i = 0; i < len; ++i) {
        for (int64_t d = 0; d < K; ++d) {
          grads.dq[at(i, K, d)] = dq[size_t(i * K + d)], grads.dk[at(i, K, d)] = dk[size_t(i * K + d)];
          grads.dg[at(i, K, d)] = dg[size_t(i * K + d)];
        }
        for (int64_t d = 0; d < V; ++d)
          out.o[at(i, V, d)] = o[size_t(i * V + d)], grads.dv[at(i, V, d)] = dv[size_t(i * V + d)];
      }
      for (int64_t e = 0; e < KV; ++e) {  // states are f32
        out.ht[size_t((n * H + head) * KV + e)] = float(s[size_t(e)]);
        grads.dh0[size_t((n * H + head) * KV + e)] = float(ds[size_t(e)]);
      }
    }
}

void expect_same_bits(const std::string& what, const std::vector<double>& out, const std::vector<double>& expected) {
  ASSERT_EQ(out.size(), expected.size()) << what;
  size_t differ = 0, first = 0;
  for (size_t i = 0; i < out.size(); ++i)
    if (std::memcmp(&out[i], &expected[i], sizeof(double)) != 0 && differ++ == 0) first = i;
  EXPECT_EQ(differ, 0u) << what << ": " << differ << " elements differ, the first at " << first << " ("
                        << out[first] << " instead of " << expected[first] << ")";
}

// Sequences of several ranges, with resets (−inf and −100 gates) on both sides of range boundaries:
// the API's results are those of the kernels run on each whole sequence, bit for bit.
TEST(GlaCpuChunked, RangeByRangeEqualsWholeSequenceBitForBit) {
  constexpr int64_t R = cpu::gla::kRangeTokens;
  Case fixed = make_case("ranges_f32", 1, 2 * R + 1000, 2, 16, 32, Gate::vector);
  Case varlen = make_case("ranges_varlen", 1, 2 * R + 1000, 2, 16, 16, Gate::vector, [&](Case& c) {
    c.cu_seqlens = {0, 100, 100 + R, 100 + R, 2 * R + 1000};  // one whole range from token 100, then two ranges
  });
  Case f64 = make_case("ranges_f64", 2, R + 70, 1, 16, 16, Gate::vector, [](Case& c) {
    c.dtype = c.gate_dtype = c.dg_dtype = DType::f64;
  });
  for (const Case& c : {fixed, varlen, f64})
    for (const char* isa : InstructionSet::available()) {
      SCOPED_TRACE(::testing::Message() << c.name << " " << isa);
      InstructionSet use(isa);
      Inputs in = make_inputs(c);
      set_token(in.g, R - 1, -std::numeric_limits<double>::infinity(), 2);
      set_token(in.g, R, -100.0, 3);
      if (c.T > 2 * R) set_token(in.g, 2 * R + 1, -std::numeric_limits<double>::infinity());
      Outputs expected;
      Grads expected_grads;
      if (c.dtype == DType::f64) whole_sequence_chunked<double>(c, in, expected, expected_grads);
      else whole_sequence_chunked<float>(c, in, expected, expected_grads);
      const Outputs out = run_forward(c, in, kChunked);
      const Grads grads = run_backward(c, in, kChunked);
      expect_same_bits("o", out.o, expected.o);
      expect_same_bits("ht", out.ht, expected.ht);
      expect_same_bits("dq", grads.dq, expected_grads.dq);
      expect_same_bits("dk", grads.dk, expected_grads.dk);
      expect_same_bits("dv", grads.dv, expected_grads.dv);
      expect_same_bits("dg", grads.dg, expected_grads.dg);
      expect_same_bits("dh0", grads.dh0, expected_grads.dh0);
    }
}

// The scratch of one (sequence, head) pair is bounded by one range whatever T, but for the backward's
// one [K, V] state per range: at T = 2^21, K = V = 64 it is under 1/64 (forward) and 1/16 (backward) of
// one [T, V] output, where gathering whole sequences took 5 and 10 outputs.
TEST(GlaCpuChunked, ScratchIsPerRangeNotPerToken) {
  using cpu::gla::chunked_scratch_elements;
  constexpr int64_t R = cpu::gla::kRangeTokens, K = 64, V = 64, long_T = int64_t(1) << 21;
  const int64_t output = long_T * V;
  EXPECT_EQ(chunked_scratch_elements(long_T, K, V, false), chunked_scratch_elements(R, K, V, false));
  EXPECT_LT(chunked_scratch_elements(long_T, K, V, false), output / 64);
  EXPECT_EQ(chunked_scratch_elements(long_T, K, V, true) - chunked_scratch_elements(R, K, V, true),
            (long_T / R - 1) * K * V);
  EXPECT_LT(chunked_scratch_elements(long_T, K, V, true), output / 16);
  // Short sequences take what they need, not a whole range.
  EXPECT_LT(chunked_scratch_elements(100, K, V, false), chunked_scratch_elements(R, K, V, false) / 10);
  EXPECT_LT(chunked_scratch_elements(100, K, V, true), chunked_scratch_elements(R, K, V, true) / 10);
  EXPECT_EQ(chunked_scratch_elements(0, K, V, false), K * V);  // the state only
}

// ---- decode and state chaining -----------------------------------------------

// A [N, H, D] view of token t of a [B, T, H, D] (or [N, H] of a [B, T, H]) tensor.
TensorView token_view(const TensorView& x, int64_t t) {
  TensorView v = x;
  v.data = static_cast<char*>(x.data) + t * x.stride[1] * int64_t(dtype_size(x.dtype));
  v.ndim = x.ndim - 1;
  v.shape[0] = x.shape[0], v.stride[0] = x.stride[0];
  for (int d = 1; d < v.ndim; ++d) v.shape[d] = x.shape[d + 1], v.stride[d] = x.stride[d + 1];
  return v;
}

TEST(GlaCpuDecode, StepsEqualRecurrentForward) {
  for (Gate gate : {Gate::vector, Gate::scalar, Gate::none})
    for (DType dtype : {DType::f32, DType::bf16}) {
      Case c;
      c.B = 3, c.T = 20, c.H = 2, c.K = 32, c.V = 48, c.gate = gate, c.dtype = dtype, c.row_padding = 2;
      c.seed = 40 + int(gate);
      SCOPED_TRACE(::testing::Message() << "gate " << int(gate) << " dtype " << dtype_name(dtype));
      const Inputs in = make_inputs(c);
      const Outputs ref = run_forward(f64_case(c), as_f64(in), kRecurrent);

      Buffer state = in.h0.to(Device{});  // a copy, updated in place
      Buffer o = poisoned(dtype, {c.B, c.T, c.H, c.V}, c.row_padding);
      for (int64_t t = 0; t < c.T; ++t) {
        GlaDecodeArgs a;
        a.q = token_view(in.q.view(), t), a.k = token_view(in.k.view(), t), a.v = token_view(in.v.view(), t);
        if (in.g.defined()) a.g = token_view(in.g.view(), t);
        a.state = state.view();
        a.o = token_view(o.view(), t);
        gla_decode(a);
      }
      expect_close("o", o.values(), ref.o, dtype == DType::f32 ? 1e-6 : 1e-2);
      expect_close("state", state.values(), ref.ht, 1e-6);
    }
}

// Tokens [t0, t1) of every [B, T, ...] input, as a problem of its own.
Inputs slice_tokens(const Inputs& in, int64_t t0, int64_t t1) {
  auto slice = [&](const Buffer& b) {
    if (!b.defined()) return b;
    std::vector<int64_t> shape = b.shape();
    const int64_t T = shape[1], row = b.numel() / (shape[0] * T);
    const std::vector<double> x = b.values();
    std::vector<double> y;
    for (int64_t batch = 0; batch < shape[0]; ++batch)
      y.insert(y.end(), x.begin() + (batch * T + t0) * row, x.begin() + (batch * T + t1) * row);
    shape[1] = t1 - t0;
    Buffer out(b.dtype(), shape);
    out.set_values(y);
    return out;
  };
  Inputs out = in;
  out.q = slice(in.q), out.k = slice(in.k), out.v = slice(in.v), out.g = slice(in.g), out.d_o = slice(in.d_o);
  return out;
}

std::vector<double> tokens_of(const std::vector<double>& x, int64_t B, int64_t T, int64_t t0, int64_t t1) {
  const int64_t row = int64_t(x.size()) / (B * T);
  std::vector<double> y;
  for (int64_t b = 0; b < B; ++b) y.insert(y.end(), x.begin() + (b * T + t0) * row, x.begin() + (b * T + t1) * row);
  return y;
}

// Two calls chained through the state equal one call over the concatenation,
// forward (ht of the first call as h0 of the second) and backward (dh0 of the
// second call as dht of the first).
TEST(GlaCpuChaining, TwoCallsEqualOneCall) {
  for (GlaAlgorithm algorithm : {kChunked, kRecurrent})
    for (Gate gate : {Gate::vector, Gate::scalar}) {
      SCOPED_TRACE(::testing::Message() << (algorithm == kChunked ? "chunked" : "recurrent") << " gate "
                                        << int(gate));
      Case whole;
      whole.B = 2, whole.T = 170, whole.H = 2, whole.K = 32, whole.V = 16, whole.gate = gate, whole.seed = 50;
      const int64_t split = 93;  // not a chunk boundary
      const Inputs in = make_inputs(whole);
      const Outputs one = run_forward(whole, in, algorithm);
      const Grads one_grads = run_backward(whole, in, algorithm);

      Case first = whole, second = whole;
      first.T = split, second.T = whole.T - split;
      Inputs in1 = slice_tokens(in, 0, split), in2 = slice_tokens(in, split, whole.T);
      const Outputs out1 = run_forward(first, in1, algorithm);
      in2.h0 = Buffer(DType::f32, in.h0.shape());
      in2.h0.set_values(out1.ht);
      const Outputs out2 = run_forward(second, in2, algorithm);
      const Grads grads2 = run_backward(second, in2, algorithm);
      in1.dht = Buffer(DType::f32, in.dht.shape());
      in1.dht.set_values(grads2.dh0);
      const Grads grads1 = run_backward(first, in1, algorithm);

      const double tol = 1e-5;  // ht passes through f32 between the two calls
      expect_close("o first", out1.o, tokens_of(one.o, whole.B, whole.T, 0, split), tol);
      expect_close("o second", out2.o, tokens_of(one.o, whole.B, whole.T, split, whole.T), tol);
      expect_close("ht", out2.ht, one.ht, tol);
      expect_close("dh0", grads1.dh0, one_grads.dh0, tol);
      const std::pair<const std::vector<double>*, const std::vector<double>*> pairs[] = {
          {&grads1.dq, &grads2.dq}, {&grads1.dk, &grads2.dk}, {&grads1.dv, &grads2.dv}, {&grads1.dg, &grads2.dg}};
      const std::vector<double>* whole_grads[] = {&one_grads.dq, &one_grads.dk, &one_grads.dv, &one_grads.dg};
      const char* names[] = {"dq", "dk", "dv", "dg"};
      for (int i = 0; i < 4; ++i) {
        expect_close(std::string(names[i]) + " first", *pairs[i].first,
                     tokens_of(*whole_grads[i], whole.B, whole.T, 0, split), tol);
        expect_close(std::string(names[i]) + " second", *pairs[i].second,
                     tokens_of(*whole_grads[i], whole.B, whole.T, split, whole.T), tol);
      }
    }
}


// ---- edge values ------------------------------------------------------------------

// Gates anywhere in [−inf, 0]: −inf is a full reset, any magnitude is legal,
// and the chunked algorithm matches the fp64 recurrence within the usual
// tolerances (fp32 1e-5), forward and backward, dg and dh0 included.
void check_edge_gates(Case c, const std::vector<EdgeGates>& sets) {
  const std::string base = c.name;
  for (const EdgeGates& e : sets) {
    SCOPED_TRACE(e.name);
    c.name = base + "_" + e.name;
    check_chunked_against_reference(c, make_edge_inputs(c, e));
  }
}

Case edge_case(Gate gate, DType dtype) {
  Case c = make_case("edge", 2, 200, 2, 32, 16, gate);
  c.dtype = dtype;
  if (dtype == DType::f64) c.gate_dtype = c.dg_dtype = DType::f64;
  return c;
}

TEST(GlaCpuEdgeGates, VectorF32) { check_edge_gates(edge_case(Gate::vector, DType::f32), edge_gate_sets()); }
TEST(GlaCpuEdgeGates, ScalarF32) { check_edge_gates(edge_case(Gate::scalar, DType::f32), edge_gate_sets()); }
TEST(GlaCpuEdgeGates, VectorBf16) { check_edge_gates(edge_case(Gate::vector, DType::bf16), edge_gate_sets()); }

TEST(GlaCpuEdgeGates, F64) {
  std::vector<EdgeGates> sets = edge_gate_sets();
  std::vector<int64_t> alternating;
  for (int64_t t = 11; t < 190; t += 2) alternating.push_back(t);
  sets.push_back({"minus_1e20", {3, 64, 65}, -1e20, 1});
  sets.push_back({"minus_1e20_alternating", alternating, -1e20, 2});
  sets.push_back({"minus_1e3_alternating", alternating, -1e3, 1});  // below fp64's reset threshold
  check_edge_gates(edge_case(Gate::vector, DType::f64), sets);
  check_edge_gates(edge_case(Gate::scalar, DType::f64), sets);
}

TEST(GlaCpuEdgeGates, Varlen) {
  Case c = edge_case(Gate::vector, DType::f32);
  c.B = 1, c.cu_seqlens = {0, 50, 130, 130, 200};
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<int64_t> alternating;
  for (int64_t t = 1; t < 200; t += 2) alternating.push_back(t);
  check_edge_gates(c, {{"neg_inf_at_starts", {0, 50, 130}, -inf, 1},
                       {"neg_inf_at_ends", {49, 129, 199}, -inf, 2},
                       {"neg_inf_inside", {60, 64, 65}, -inf, 1},
                       {"minus_1e4_alternating", alternating, -1e4, 1}});
}

// A NaN or Inf in q, k or v at token t leaves every output before t as it was
// (finite, and bit for bit that of the clean inputs); outputs from t on may
// be anything. Tokens inside a sub-chunk, at sub-chunk and chunk starts.
TEST(GlaCpuCausality, NonFiniteInputsDoNotReachEarlierOutputs) {
  const double inf = std::numeric_limits<double>::infinity();
  for (GlaAlgorithm algorithm : {kChunked, kRecurrent})
    for (DType dtype : {DType::f32, DType::f64, DType::bf16})
      for (Gate gate : {Gate::vector, Gate::scalar, Gate::none}) {
        if (dtype != DType::f32 && gate != Gate::vector) continue;
        Case c = edge_case(gate, dtype);
        c.T = 130;
        const Inputs clean = make_inputs(c);
        for (const char* isa : InstructionSet::available()) {
          InstructionSet use(isa);
          const Outputs ref = run_forward(c, clean, algorithm);
          for (Buffer Inputs::*input : {&Inputs::q, &Inputs::k, &Inputs::v})
            for (double bad : {std::nan(""), inf})
              for (int64_t t : {5, 16, 63, 64, 100}) {
                SCOPED_TRACE(::testing::Message()
                             << (algorithm == kChunked ? "chunked " : "recurrent ") << isa << " "
                             << dtype_name(dtype) << " gate " << int(gate) << " input "
                             << (input == &Inputs::q ? "q" : input == &Inputs::k ? "k" : "v") << " value " << bad
                             << " t " << t);
                Inputs in = clean;
                in.*input = (clean.*input).to(Device{});  // a copy
                set_token(in.*input, t, bad);
                const Outputs out = run_forward(c, in, algorithm);
                const std::vector<double> before = tokens_before(out.o, c.B, c.T, t);
                ASSERT_TRUE(all_finite(before));
                ASSERT_EQ(before, tokens_before(ref.o, c.B, c.T, t));
              }
        }
      }
}

}  // namespace
}  // namespace flashgla::testing::gla_test
