// Shared by the CPU and CUDA tests of the per-segment summaries
// (gla_segment_states, gla_segment_state_grads): calls on the inputs' device
// with outputs poisoned first, and the fp64 references from the definitions
//   S(L) = Σ_t (k_t ⊙ exp Σ_{u>t} g_u)ᵀ v_t,  a(L) = Σ_t g_t,
//   B(L) = scale · Σ_t (q_t ⊙ exp Σ_{u≤t} g_u)ᵀ do_t,
// each as one running sum of gates (never a difference), so −inf gates are exact.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "flashgla/flashgla.h"
#include "gla_test_util.h"
#include "tuning_test_util.h"

namespace flashgla::testing::gla_test {

struct SegmentStates {
  std::vector<double> states, log_decay;
};

// How a test calls the ops.
struct SegmentCall {
  DType summary_dtype = DType::f32;  // states, log_decay, d_states
  void* stream = nullptr;
  bool caller_workspace = false;
  const Buffer* cu_seqlens_host = nullptr;
  std::optional<double> scale;
  const Buffer* g_gamma = nullptr;  // [H]: the gate is g + g_gamma
};

template <class Args>
Buffer segment_workspace(Args& a, size_t bytes, Device device) {
  Buffer workspace;
  if (bytes > 0) {
    workspace = Buffer(DType::f32, {int64_t((bytes + 3) / 4)}, device);
    a.workspace = workspace.view().data;
    a.workspace_bytes = bytes;
  }
  return workspace;
}

inline Buffer poisoned_summary(Device device, DType dtype, std::vector<int64_t> shape, int64_t padding) {
  Buffer b(dtype, std::move(shape), device, padding);
  b.poison();
  return b;
}

inline SegmentStates run_segment_states(const Case& c, const Inputs& in, const SegmentCall& call = {}) {
  const Device device = in.k.device();
  Buffer states = poisoned_summary(device, call.summary_dtype, {c.num_seqs(), c.H, c.K, c.V}, c.row_padding);
  Buffer log_decay = poisoned_summary(device, call.summary_dtype, {c.num_seqs(), c.H, c.K}, c.row_padding);
  GlaSegmentStatesArgs a;
  a.k = in.k.view(), a.v = in.v.view(), a.g = in.g.view(), a.cu_seqlens = in.cu_seqlens.view();
  if (call.g_gamma) a.g_gamma = call.g_gamma->view();
  if (call.cu_seqlens_host) a.cu_seqlens_host = call.cu_seqlens_host->view();
  a.states = states.view(), a.log_decay = log_decay.view();
  a.stream = call.stream;
  a.tuning = test_gla_tuning();
  Buffer workspace;
  if (call.caller_workspace) workspace = segment_workspace(a, gla_segment_states_workspace_bytes(a), device);
  gla_segment_states(a);
  synchronize(device);
  return {states.values(), log_decay.values()};
}

inline std::vector<double> run_segment_state_grads(const Case& c, const Inputs& in, const SegmentCall& call = {}) {
  const Device device = in.q.device();
  Buffer d_states = poisoned_summary(device, call.summary_dtype, {c.num_seqs(), c.H, c.K, c.V}, c.row_padding);
  GlaSegmentStateGradsArgs a;
  a.q = in.q.view(), a.d_o = in.d_o.view(), a.g = in.g.view(), a.cu_seqlens = in.cu_seqlens.view();
  if (call.g_gamma) a.g_gamma = call.g_gamma->view();
  if (call.cu_seqlens_host) a.cu_seqlens_host = call.cu_seqlens_host->view();
  a.scale = call.scale;
  a.d_states = d_states.view();
  a.stream = call.stream;
  a.tuning = test_gla_tuning();
  Buffer workspace;
  if (call.caller_workspace) workspace = segment_workspace(a, gla_segment_state_grads_workspace_bytes(a), device);
  gla_segment_state_grads(a);
  synchronize(device);
  return d_states.values();
}

// [begin, end) tokens of segment n and its batch row.
inline void segment_bounds(const Case& c, int64_t n, int64_t& batch, int64_t& begin, int64_t& end) {
  if (c.cu_seqlens.empty()) {
    batch = n, begin = 0, end = c.T;
  } else {
    batch = 0, begin = c.cu_seqlens[size_t(n)], end = c.cu_seqlens[size_t(n) + 1];
  }
}

// The fp64 references, from the inputs' values (any device, any dtype: read as doubles).
inline SegmentStates segment_states_reference(const Case& c, const Inputs& in) {
  const std::vector<double> k = in.k.values(), v = in.v.values();
  const std::vector<double> g = in.g.defined() ? in.g.values() : std::vector<double>();
  const int64_t N = c.num_seqs(), H = c.H, K = c.K, V = c.V, T = c.T;
  SegmentStates ref;
  ref.states.assign(size_t(N * H * K * V), 0.0);
  ref.log_decay.assign(size_t(N * H * K), 0.0);
  auto gate = [&](int64_t b, int64_t t, int64_t h, int64_t d) {
    if (c.gate == Gate::none) return 0.0;
    if (c.gate == Gate::scalar) return g[size_t((b * T + t) * H + h)];
    return g[size_t(((b * T + t) * H + h) * K + d)];
  };
  for (int64_t n = 0; n < N; ++n)
    for (int64_t h = 0; h < H; ++h) {
      int64_t b, begin, end;
      segment_bounds(c, n, b, begin, end);
      double* S = ref.states.data() + (n * H + h) * K * V;
      for (int64_t d = 0; d < K; ++d) {
        double after = 0;  // Σ g_u over u > t
        for (int64_t t = end - 1; t >= begin; --t) {
          const double w = k[size_t(((b * T + t) * H + h) * K + d)] * std::exp(after);
          for (int64_t j = 0; j < V; ++j) S[d * V + j] += w * v[size_t(((b * T + t) * H + h) * V + j)];
          after += gate(b, t, h, d);
        }
        ref.log_decay[size_t((n * H + h) * K + d)] = after;
      }
    }
  return ref;
}

inline std::vector<double> segment_state_grads_reference(const Case& c, const Inputs& in, double scale) {
  const std::vector<double> q = in.q.values(), d_o = in.d_o.values();
  const std::vector<double> g = in.g.defined() ? in.g.values() : std::vector<double>();
  const int64_t N = c.num_seqs(), H = c.H, K = c.K, V = c.V, T = c.T;
  std::vector<double> ref(size_t(N * H * K * V), 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t h = 0; h < H; ++h) {
      int64_t b, begin, end;
      segment_bounds(c, n, b, begin, end);
      double* B = ref.data() + (n * H + h) * K * V;
      for (int64_t d = 0; d < K; ++d) {
        double upto = 0;  // Σ g_u over u ≤ t
        for (int64_t t = begin; t < end; ++t) {
          if (c.gate == Gate::scalar) upto += g[size_t((b * T + t) * H + h)];
          if (c.gate == Gate::vector) upto += g[size_t(((b * T + t) * H + h) * K + d)];
          const double w = scale * q[size_t(((b * T + t) * H + h) * K + d)] * std::exp(upto);
          for (int64_t j = 0; j < V; ++j) B[d * V + j] += w * d_o[size_t(((b * T + t) * H + h) * V + j)];
        }
      }
    }
  return ref;
}

// log_decay may hold −inf: those elements must match exactly, the finite ones
// within `tolerance` (relative RMS over them). NaN fails.
inline void expect_log_decay_close(const std::vector<double>& out, const std::vector<double>& ref, double tolerance) {
  ASSERT_EQ(out.size(), ref.size());
  std::vector<double> finite_out, finite_ref;
  for (size_t i = 0; i < out.size(); ++i) {
    ASSERT_FALSE(std::isnan(out[i])) << "log_decay[" << i << "] is NaN (reference " << ref[i] << ")";
    if (std::isinf(ref[i])) {
      EXPECT_EQ(out[i], ref[i]) << "log_decay[" << i << "]";
    } else {
      finite_out.push_back(out[i]), finite_ref.push_back(ref[i]);
    }
  }
  if (finite_ref.empty()) return;
  bool all_zero = true;
  for (double x : finite_ref) all_zero = all_zero && x == 0;
  if (all_zero) {  // no gate, or only empty segments: exactly zero
    for (double x : finite_out) EXPECT_EQ(x, 0.0);
    return;
  }
  expect_close("log_decay", finite_out, finite_ref, tolerance);
}

// With g_gamma [H] (g scalar or absent) the ops must equal the same call on the gate staged by hand as
// gla_forward stages it: fp32 of the fp64 sum g + g_gamma, [B, T, H], as a scalar gate. Bit for bit.
inline void expect_gamma_equals_staged_gate(const Case& c, const Inputs& in, const Buffer& g_gamma) {
  ASSERT_NE(c.gate, Gate::vector);
  const std::vector<double> gamma = g_gamma.values();
  const std::vector<double> g = in.g.defined() ? in.g.values() : std::vector<double>();
  std::vector<double> staged(size_t(c.B * c.T * c.H));
  for (size_t i = 0; i < staged.size(); ++i)
    staged[i] = double(float((g.empty() ? 0.0 : g[i]) + gamma[i % size_t(c.H)]));
  Buffer gate(DType::f32, {c.B, c.T, c.H});
  gate.set_values(staged);
  Inputs by_hand = in;
  by_hand.g = gate.to(in.k.device());
  Case scalar = c;
  scalar.gate = Gate::scalar;
  for (bool caller_workspace : {false, true}) {
    SCOPED_TRACE(caller_workspace ? "caller's workspace" : "op's own scratch");
    SegmentCall with_gamma;
    with_gamma.g_gamma = &g_gamma, with_gamma.caller_workspace = caller_workspace;
    SegmentCall plain;
    plain.caller_workspace = caller_workspace;
    const SegmentStates out = run_segment_states(c, in, with_gamma), ref = run_segment_states(scalar, by_hand, plain);
    EXPECT_EQ(out.states, ref.states);
    EXPECT_EQ(out.log_decay, ref.log_decay);
    EXPECT_EQ(run_segment_state_grads(c, in, with_gamma), run_segment_state_grads(scalar, by_hand, plain));
  }
}

inline Buffer random_g_gamma(int64_t H, DType dtype, Device device, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Buffer b(dtype, {H});
  b.fill_uniform(rng, -0.2, -0.01);
  return b.to(device);
}

}  // namespace flashgla::testing::gla_test
