// Helpers for GLA tests: random problems, calls through the public API with
// outputs poisoned (NaN) beforehand, and results read back as doubles.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "flashgla/gla.h"
#include "testing/buffer.h"

namespace flashgla::testing::gla_test {

enum class Gate { none, scalar, vector };
enum class GateValues {
  typical,        // logsigmoid(x), x ~ N(0, 1): about -0.8 per step
  near_zero,      // logsigmoid(x) / 16, x ~ N(2, 1): about -0.01 per step
  very_negative,  // about -20 per step: the state forgets everything at once
};

struct Case {
  int64_t B = 1, T = 64, H = 2, K = 32, V = 32;
  std::vector<int64_t> cu_seqlens;  // empty: fixed length; else B == 1 and the boundaries
  Gate gate = Gate::vector;
  GateValues gate_values = GateValues::typical;
  DType dtype = DType::f32;       // q, k, v, o and their gradients
  DType gate_dtype = DType::f32;  // g
  DType dg_dtype = DType::f32;    // f32 or gate_dtype
  bool h0 = true, final_state = true, dht = true;
  int64_t row_padding = 0;  // > 0: every tensor is a strided slice
  uint64_t seed = 1;
  std::string name = "case";

  int64_t num_seqs() const { return cu_seqlens.empty() ? B : int64_t(cu_seqlens.size()) - 1; }
};

// GoogleTest prints a parameter with this (instead of its bytes).
inline void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

// All inputs of a forward and backward call, on the CPU.
struct Inputs {
  Buffer q, k, v, g, h0, cu_seqlens, d_o, dht;
};

inline double logsigmoid(double x) { return x >= 0 ? -std::log1p(std::exp(-x)) : x - std::log1p(std::exp(x)); }

inline Inputs make_inputs(const Case& c) {
  std::mt19937_64 rng(c.seed);
  const int64_t N = c.num_seqs();
  Inputs in;
  auto random = [&](DType dtype, std::vector<int64_t> shape, int64_t padding) {
    Buffer b(dtype, std::move(shape), Device{}, padding);
    b.fill_normal(rng);
    return b;
  };
  in.q = random(c.dtype, {c.B, c.T, c.H, c.K}, c.row_padding);
  in.k = random(c.dtype, {c.B, c.T, c.H, c.K}, c.row_padding);
  in.v = random(c.dtype, {c.B, c.T, c.H, c.V}, c.row_padding);
  in.d_o = random(c.dtype, {c.B, c.T, c.H, c.V}, c.row_padding);
  if (c.gate != Gate::none) {
    std::vector<int64_t> shape = {c.B, c.T, c.H};
    if (c.gate == Gate::vector) shape.push_back(c.K);
    in.g = Buffer(c.gate_dtype, shape, Device{}, c.row_padding);
    std::normal_distribution<double> normal(c.gate_values == GateValues::near_zero ? 2.0 : 0.0, 1.0);
    std::uniform_real_distribution<double> around_minus_20(-20.5, -19.5);
    std::vector<double> values(size_t(in.g.numel()));
    for (double& x : values) {
      switch (c.gate_values) {
        case GateValues::typical: x = logsigmoid(normal(rng)); break;
        case GateValues::near_zero: x = logsigmoid(normal(rng)) / 16; break;
        case GateValues::very_negative: x = around_minus_20(rng); break;
      }
    }
    in.g.set_values(values);
  }
  if (c.h0) in.h0 = random(DType::f32, {N, c.H, c.K, c.V}, c.row_padding);
  if (c.dht) in.dht = random(DType::f32, {N, c.H, c.K, c.V}, c.row_padding);
  if (!c.cu_seqlens.empty()) {
    in.cu_seqlens = Buffer(DType::i64, {N + 1});
    in.cu_seqlens.set_values(std::vector<double>(c.cu_seqlens.begin(), c.cu_seqlens.end()));
  }
  return in;
}

// The same values in f64 (exact for every input dtype): the reference's inputs.
inline Inputs as_f64(const Inputs& in) {
  Inputs out = in;
  out.q = in.q.cast(DType::f64);
  out.k = in.k.cast(DType::f64);
  out.v = in.v.cast(DType::f64);
  out.d_o = in.d_o.cast(DType::f64);
  if (in.g.defined()) out.g = in.g.cast(DType::f64);
  return out;
}

inline Case f64_case(Case c) {
  c.dtype = c.gate_dtype = c.dg_dtype = DType::f64;
  return c;
}

struct Outputs {
  std::vector<double> o, ht;
};

struct Grads {
  std::vector<double> dq, dk, dv, dg, dh0;
};

inline Buffer poisoned(DType dtype, std::vector<int64_t> shape, int64_t padding) {
  Buffer b(dtype, std::move(shape), Device{}, padding);
  b.poison();
  return b;
}

inline Outputs run_forward(const Case& c, const Inputs& in, GlaAlgorithm algorithm, bool reverse = false) {
  Buffer o = poisoned(c.dtype, {c.B, c.T, c.H, c.V}, c.row_padding);
  Buffer ht;
  if (c.final_state) ht = poisoned(DType::f32, {c.num_seqs(), c.H, c.K, c.V}, c.row_padding);
  GlaForwardArgs a;
  a.q = in.q.view(), a.k = in.k.view(), a.v = in.v.view(), a.g = in.g.view();
  a.initial_state = in.h0.view(), a.cu_seqlens = in.cu_seqlens.view();
  a.algorithm = algorithm, a.reverse = reverse;
  a.o = o.view(), a.final_state = ht.view();
  gla_forward(a);
  return {o.values(), ht.values()};
}

inline Grads run_backward(const Case& c, const Inputs& in, GlaAlgorithm algorithm, bool reverse = false) {
  Buffer dq = poisoned(c.dtype, {c.B, c.T, c.H, c.K}, c.row_padding);
  Buffer dk = poisoned(c.dtype, {c.B, c.T, c.H, c.K}, c.row_padding);
  Buffer dv = poisoned(c.dtype, {c.B, c.T, c.H, c.V}, c.row_padding);
  Buffer dg, dh0;
  if (in.g.defined()) dg = poisoned(c.dg_dtype, in.g.shape(), c.row_padding);
  if (c.h0) dh0 = poisoned(DType::f32, {c.num_seqs(), c.H, c.K, c.V}, c.row_padding);
  GlaBackwardArgs a;
  a.q = in.q.view(), a.k = in.k.view(), a.v = in.v.view(), a.g = in.g.view();
  a.initial_state = in.h0.view(), a.cu_seqlens = in.cu_seqlens.view();
  a.algorithm = algorithm, a.reverse = reverse;
  a.d_o = in.d_o.view(), a.d_final_state = in.dht.view();
  a.dq = dq.view(), a.dk = dk.view(), a.dv = dv.view(), a.dg = dg.view(), a.d_initial_state = dh0.view();
  gla_backward(a);
  return {dq.values(), dk.values(), dv.values(), dg.values(), dh0.values()};
}

// Relative RMS error within `tolerance`; NaN or Inf in `out` fails. Empty
// tensors (absent outputs, T == 0) pass when both sides are empty. With
// GLA_VERBOSE set, every error is printed (to see the margins).
inline void expect_close(const std::string& what, const std::vector<double>& out, const std::vector<double>& ref,
                         double tolerance) {
  ASSERT_EQ(out.size(), ref.size()) << what;
  if (out.empty()) return;
  const double error = rel_rms_error(out, ref);
  if (std::getenv("GLA_VERBOSE")) printf("    %-12s %.3g (tol %.3g)\n", what.c_str(), error, tolerance);
  EXPECT_LE(error, tolerance) << what << ": relative RMS error " << error << " (NaN: a NaN/Inf or an unwritten element)";
}

inline bool all_finite(const std::vector<double>& x) {
  for (double v : x)
    if (!std::isfinite(v)) return false;
  return true;
}

// ---- edge values: gates in [−inf, 0] of any size, non-finite q, k, v ----------

// x[b, t, ...] = value for every b and every `every`-th element of the token's
// row (over heads and features: every = 2 touches half the gate columns).
inline void set_token(Buffer& x, int64_t t, double value, int64_t every = 1) {
  std::vector<double> values = x.values();
  const int64_t B = x.shape()[0], T = x.shape()[1], row = x.numel() / (B * T);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < row; i += every) values[size_t((b * T + t) * row + i)] = value;
  x.set_values(values);
}

// A case whose gates are the usual random ones except on some tokens.
struct EdgeGates {
  std::string name;
  std::vector<int64_t> tokens;  // the tokens that get `value`
  double value = 0;
  int64_t every = 1;            // see set_token
};

inline Inputs make_edge_inputs(const Case& c, const EdgeGates& e) {
  Inputs in = make_inputs(c);
  for (int64_t t : e.tokens) set_token(in.g, t, e.value, e.every);
  return in;
}

// The sets of gate edits every backend is tested with (T ≥ 200): −inf once,
// over a whole chunk, around chunk boundaries and at t = 0; large finite
// gates once, alternating (every other token) and in a few columns only.
inline std::vector<EdgeGates> edge_gate_sets() {
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<int64_t> whole_chunk, alternating;
  for (int64_t t = 64; t < 128; ++t) whole_chunk.push_back(t);
  for (int64_t t = 11; t < 190; t += 2) alternating.push_back(t);
  return {
      {"neg_inf_once", {37}, -inf, 1},
      {"neg_inf_half_columns", {37, 100}, -inf, 2},
      {"neg_inf_whole_chunk", whole_chunk, -inf, 1},
      {"neg_inf_chunk_boundaries", {15, 16, 63, 64, 127, 128}, -inf, 3},
      {"neg_inf_t0", {0}, -inf, 1},
      {"minus_1e3", {20}, -1e3, 1},
      {"minus_1e4", {70}, -1e4, 1},
      {"minus_1e4_alternating", alternating, -1e4, 1},
      {"minus_1e4_alternating_half_columns", alternating, -1e4, 2},
      {"minus_1e8", {5, 130}, -1e8, 1},
      {"minus_1e30", {50}, -1e30, 1},
  };
}

// Outputs o[b, t', ...] for t' < t (every b) of a [B, T, H, V] output.
inline std::vector<double> tokens_before(const std::vector<double>& o, int64_t B, int64_t T, int64_t t) {
  const int64_t row = int64_t(o.size()) / (B * T);
  std::vector<double> y;
  for (int64_t b = 0; b < B; ++b) y.insert(y.end(), o.begin() + b * T * row, o.begin() + (b * T + t) * row);
  return y;
}

}  // namespace flashgla::testing::gla_test
