// CPU per-segment summaries (gla_segment_states, gla_segment_state_grads)
// against their fp64 definitions, against the forward's final state and the
// backward's d_initial_state, composition with a start state, and argument
// checks.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "gla_segment_test_util.h"
#include "test_util.h"

namespace flashgla::testing::gla_test {
namespace {

Case segment_case(const std::string& name, int64_t B, int64_t T, int64_t H, int64_t K, int64_t V, Gate gate,
                  DType dtype) {
  Case c;
  c.name = name, c.B = B, c.T = T, c.H = H, c.K = K, c.V = V, c.gate = gate;
  c.dtype = dtype, c.gate_dtype = dtype == DType::f64 ? DType::f64 : DType::f32;
  c.h0 = c.dht = false;
  c.seed = std::hash<std::string>{}(name);
  return c;
}

// Tolerance of the summaries: f64 kept in f64; else fp32 accumulation and f32
// storage (bf16/f16 inputs are read exactly: the reference uses the same values).
double tolerance(DType input, DType summary) {
  if (summary == DType::f64) return 1e-10;
  if (input == DType::f64) return 1e-7;
  return input == DType::f32 ? 1e-5 : 1e-4;
}

void check_against_definition(const Case& c, const Inputs& in, DType summary = DType::f32) {
  SegmentCall call;
  call.summary_dtype = summary;
  const double tol = tolerance(c.dtype, summary);
  const SegmentStates out = run_segment_states(c, in, call);
  const SegmentStates ref = segment_states_reference(c, in);
  expect_close("states", out.states, ref.states, tol);
  expect_log_decay_close(out.log_decay, ref.log_decay, summary == DType::f64 ? 1e-14 : 1e-6);
  const std::vector<double> d_states = run_segment_state_grads(c, in, call);
  expect_close("d_states", d_states, segment_state_grads_reference(c, in, 1.0 / std::sqrt(double(c.K))), tol);
}

// gla_backward's d_initial_state with no initial state and no d_final_state.
std::vector<double> run_backward_dh0(Case c, const Inputs& in, GlaAlgorithm algorithm) {
  c.h0 = true;  // asks for dh0; `in` holds no h0, so the call has none
  return run_backward(c, in, algorithm).dh0;
}

TEST(GlaSegmentCpu, MatchesDefinitionEveryGateAndDtype) {
  for (Gate gate : {Gate::vector, Gate::scalar, Gate::none})
    for (DType dtype : {DType::f64, DType::f32, DType::bf16, DType::f16}) {
      const Case c = segment_case(std::string("grid") + dtype_name(dtype) + std::to_string(int(gate)), 2, 150, 2, 32,
                                  48, gate, dtype);
      SCOPED_TRACE(c.name);
      const Inputs in = make_inputs(c);
      check_against_definition(c, in);
      if (dtype == DType::f64) check_against_definition(c, in, DType::f64);
    }
}

TEST(GlaSegmentCpu, VarlenWithEmptyAndOneTokenSegments) {
  for (Gate gate : {Gate::vector, Gate::scalar, Gate::none})
    for (DType dtype : {DType::f64, DType::f32}) {
      Case c = segment_case(std::string("varlen") + dtype_name(dtype) + std::to_string(int(gate)), 1, 201, 3, 16, 24,
                            gate, dtype);
      c.cu_seqlens = {0, 0, 1, 70, 70, 199, 200, 201};
      SCOPED_TRACE(c.name);
      const Inputs in = make_inputs(c);
      check_against_definition(c, in, dtype);
      // Empty segments: S = 0, a = 0, B = 0 exactly.
      const SegmentStates out = run_segment_states(c, in);
      const std::vector<double> d_states = run_segment_state_grads(c, in);
      for (int64_t n : {0, 3})
        for (int64_t i = 0; i < c.H * c.K * c.V; ++i) {
          EXPECT_EQ(out.states[size_t(n * c.H * c.K * c.V + i)], 0.0);
          EXPECT_EQ(d_states[size_t(n * c.H * c.K * c.V + i)], 0.0);
        }
      for (int64_t i = 0; i < c.H * c.K; ++i) EXPECT_EQ(out.log_decay[size_t(3 * c.H * c.K + i)], 0.0);
    }
}

TEST(GlaSegmentCpu, StridedInputsAndOutputs) {
  Case c = segment_case("strided", 2, 70, 2, 8, 12, Gate::vector, DType::f32);
  c.row_padding = 3;
  check_against_definition(c, make_inputs(c));
}

TEST(GlaSegmentCpu, VeryNegativeGates) {
  for (Gate gate : {Gate::vector, Gate::scalar})
    for (DType dtype : {DType::f64, DType::f32}) {
      Case c = segment_case("minus20", 2, 130, 2, 16, 16, gate, dtype);
      c.gate_values = GateValues::very_negative;
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " gate " + std::to_string(int(gate)));
      check_against_definition(c, make_inputs(c), dtype == DType::f64 ? DType::f64 : DType::f32);
    }
}

// −inf gates (a hard reset) on some steps: the states forget exactly, log_decay is −inf, nothing is NaN.
TEST(GlaSegmentCpu, MinusInfinityGates) {
  for (Gate gate : {Gate::vector, Gate::scalar})
    for (DType dtype : {DType::f64, DType::f32}) {
      Case c = segment_case("minusinf", 1, 200, 2, 16, 8, gate, dtype);
      c.cu_seqlens = {0, 60, 61, 200};
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " gate " + std::to_string(int(gate)));
      Inputs in = make_inputs(c);
      std::vector<double> g = in.g.values();
      const double inf = std::numeric_limits<double>::infinity();
      // Tokens 10 (first segment, early), 60 (the one-token segment) and 150 (third segment, middle);
      // for the vector gate on every other key only.
      const int64_t per_token = c.H * (gate == Gate::vector ? c.K : 1);
      for (int64_t t : {10, 60, 150})
        for (int64_t i = 0; i < per_token; i += gate == Gate::vector ? 2 : 1) g[size_t(t * per_token + i)] = -inf;
      in.g.set_values(g);
      check_against_definition(c, in, dtype == DType::f64 ? DType::f64 : DType::f32);
      const SegmentStates out = run_segment_states(c, in);
      for (double x : out.states) ASSERT_TRUE(std::isfinite(x));
      int64_t minus_inf = 0;
      for (double x : out.log_decay) minus_inf += x == -inf;
      EXPECT_EQ(minus_inf, 3 * c.H * (gate == Gate::vector ? c.K / 2 : c.K));
      for (double x : run_segment_state_grads(c, in)) ASSERT_TRUE(std::isfinite(x));
    }
}

TEST(GlaSegmentCpu, CustomScale) {
  Case c = segment_case("scale", 1, 80, 2, 16, 16, Gate::vector, DType::f64);
  const Inputs in = make_inputs(c);
  SegmentCall call;
  call.summary_dtype = DType::f64;
  call.scale = 0.37;
  expect_close("d_states", run_segment_state_grads(c, in, call), segment_state_grads_reference(c, in, 0.37), 1e-10);
}

// S(L) is the forward's final state from a zero start, B(L) the backward's
// d_initial_state for d_final_state = 0: both algorithms, the op's dtype.
TEST(GlaSegmentCpu, EqualsForwardFinalStateAndBackwardDh0) {
  for (Gate gate : {Gate::vector, Gate::scalar, Gate::none})
    for (DType dtype : {DType::f64, DType::f32, DType::bf16}) {
      Case c = segment_case(std::string("cross") + dtype_name(dtype) + std::to_string(int(gate)), 1, 300, 2, 32, 16,
                            gate, dtype);
      c.cu_seqlens = {0, 100, 101, 101, 300};
      c.final_state = true;
      SCOPED_TRACE(c.name);
      const Inputs in = make_inputs(c);
      const SegmentStates out = run_segment_states(c, in);
      const std::vector<double> d_states = run_segment_state_grads(c, in);
      const double tol = dtype == DType::f64 ? 1e-7 : dtype == DType::f32 ? 1e-5 : 1e-4;
      for (GlaAlgorithm algorithm : {GlaAlgorithm::chunked, GlaAlgorithm::recurrent}) {
        expect_close("states vs final_state", out.states, run_forward(c, in, algorithm).ht, tol);
        expect_close("d_states vs d_initial_state", d_states, run_backward_dh0(c, in, algorithm), tol);
      }
    }
}

// The composition the context-parallel path relies on: from a start state h0,
// the forward's final state is diag(exp a) h0 + S, and with a gradient dht at
// the end the backward's dh0 is diag(exp a) dht + B.
TEST(GlaSegmentCpu, ComposesWithStartStateAndEndGradient) {
  for (Gate gate : {Gate::vector, Gate::scalar, Gate::none}) {
    Case c = segment_case("compose" + std::to_string(int(gate)), 1, 260, 2, 16, 24, gate, DType::f64);
    c.cu_seqlens = {0, 0, 130, 131, 260};
    c.h0 = c.dht = c.final_state = true;
    SCOPED_TRACE(c.name);
    const Inputs in = make_inputs(c);
    SegmentCall call;
    call.summary_dtype = DType::f64;
    const SegmentStates s = run_segment_states(c, in, call);
    const std::vector<double> b = run_segment_state_grads(c, in, call);
    const std::vector<double> h0 = in.h0.values(), dht = in.dht.values();
    std::vector<double> end(s.states.size()), dh0(b.size());
    for (size_t nh = 0; nh < size_t(c.num_seqs() * c.H); ++nh)
      for (size_t d = 0; d < size_t(c.K); ++d) {
        const double decay = std::exp(s.log_decay[nh * c.K + d]);
        for (size_t j = 0; j < size_t(c.V); ++j) {
          const size_t i = (nh * c.K + d) * c.V + j;
          end[i] = decay * h0[i] + s.states[i];
          dh0[i] = decay * dht[i] + b[i];
        }
      }
    expect_close("final_state", end, run_forward(c, in, GlaAlgorithm::recurrent).ht, 1e-7);  // ht is f32
    expect_close("d_initial_state", dh0, run_backward(c, in, GlaAlgorithm::recurrent).dh0, 1e-7);
  }
}

// ---- argument checks ----------------------------------------------------------

struct StatesFixture {
  Case c = segment_case("args", 1, 20, 2, 4, 6, Gate::vector, DType::f32);
  Inputs in = make_inputs(c);
  Buffer states{DType::f32, {1, 2, 4, 6}}, log_decay{DType::f32, {1, 2, 4}}, d_states{DType::f32, {1, 2, 4, 6}};
  GlaSegmentStatesArgs a() const {
    GlaSegmentStatesArgs x;
    x.k = in.k.view(), x.v = in.v.view(), x.g = in.g.view(), x.states = states.view(), x.log_decay = log_decay.view();
    return x;
  }
  GlaSegmentStateGradsArgs b() const {
    GlaSegmentStateGradsArgs x;
    x.q = in.q.view(), x.d_o = in.d_o.view(), x.g = in.g.view(), x.d_states = d_states.view();
    return x;
  }
};

TEST(GlaSegmentCpu, GGammaEqualsStagedGate) {
  for (Gate gate : {Gate::scalar, Gate::none})
    for (DType dtype : {DType::f64, DType::f32, DType::bf16})
      for (DType gamma_dtype : {DType::f32, DType::f64}) {
        Case c = segment_case(std::string("gamma") + dtype_name(dtype) + dtype_name(gamma_dtype) +
                                  std::to_string(int(gate)), 2, 150, 3, 16, 24, gate, dtype);
        SCOPED_TRACE(c.name);
        const Inputs in = make_inputs(c);
        expect_gamma_equals_staged_gate(c, in, random_g_gamma(c.H, gamma_dtype, Device{}, c.seed));
      }
  // varlen, with an empty segment
  Case c = segment_case("gamma varlen", 1, 90, 2, 8, 8, Gate::scalar, DType::f32);
  c.cu_seqlens = {0, 40, 40, 90};
  expect_gamma_equals_staged_gate(c, make_inputs(c), random_g_gamma(c.H, DType::f32, Device{}, 3));
}

TEST(GlaSegmentCpu, BadArguments) {
  const StatesFixture f;
  auto states = [&](auto tweak) {
    return [&f, tweak] {
      GlaSegmentStatesArgs a = f.a();
      tweak(a);
      gla_segment_states(a);
    };
  };
  auto grads = [&](auto tweak) {
    return [&f, tweak] {
      GlaSegmentStateGradsArgs a = f.b();
      tweak(a);
      gla_segment_state_grads(a);
    };
  };
  const Buffer wrong_v(DType::f32, {1, 20, 3, 6}), v16(DType::bf16, {1, 20, 2, 6}), g5(DType::f32, {1, 20, 2, 5});
  const Buffer s_f64(DType::f64, {1, 2, 4, 6}), s_short(DType::f32, {1, 2, 4, 5}), ld_wrong(DType::f32, {1, 2, 6});
  const Buffer cu(DType::i64, {3}), cu_f(DType::f32, {2});
  expect_error(states([](auto& a) { a.k = {}; }), ErrorKind::value, "k", "is required");
  expect_error(states([&](auto& a) { a.v = wrong_v.view(); }), ErrorKind::value, "v", "[B, T, H, V]");
  expect_error(states([&](auto& a) { a.v = v16.view(); }), ErrorKind::type, "v", "float32");
  expect_error(states([&](auto& a) { a.g = g5.view(); }), ErrorKind::value, "g", "[B, T, H, K]");
  expect_error(states([&](auto& a) { a.states = {}; }), ErrorKind::value, "states", "is required");
  expect_error(states([&](auto& a) { a.states = s_short.view(); }), ErrorKind::value, "states", "[N, H, K, V]");
  expect_error(states([&](auto& a) { a.states = s_f64.view(); }), ErrorKind::type, "states", "float32");
  expect_error(states([&](auto& a) { a.log_decay = {}; }), ErrorKind::value, "log_decay", "is required");
  expect_error(states([&](auto& a) { a.log_decay = ld_wrong.view(); }), ErrorKind::value, "log_decay", "[N, H, K]");
  expect_error(states([&](auto& a) { a.cu_seqlens = cu_f.view(); }), ErrorKind::type, "cu_seqlens", "int32");
  expect_error(states([&](auto& a) { a.cu_seqlens_host = cu.view(); }), ErrorKind::value, "cu_seqlens_host",
               "without cu_seqlens");
  expect_error(grads([](auto& a) { a.q = {}; }), ErrorKind::value, "q", "is required");
  expect_error(grads([&](auto& a) { a.d_o = v16.view(); }), ErrorKind::type, "d_o", "float32");
  expect_error(grads([&](auto& a) { a.d_states = {}; }), ErrorKind::value, "d_states", "is required");
  expect_error(grads([&](auto& a) { a.d_states = s_f64.view(); }), ErrorKind::type, "d_states", "float32");
  expect_error(grads([&](auto& a) { a.scale = std::nan(""); }), ErrorKind::value, "scale", "finite");
  const Buffer gamma_i32(DType::i32, {2}), gamma_3(DType::f32, {3}), gamma_2d(DType::f32, {1, 2}),
      gamma_ok(DType::f32, {2});
  expect_error(states([&](auto& a) { a.g_gamma = gamma_i32.view(); }), ErrorKind::type, "g_gamma", "float");
  expect_error(states([&](auto& a) { a.g_gamma = gamma_3.view(); }), ErrorKind::value, "g_gamma", "[H]");
  expect_error(grads([&](auto& a) { a.g_gamma = gamma_2d.view(); }), ErrorKind::value, "g_gamma", "[H]");
  expect_error(grads([&](auto& a) { a.g_gamma = gamma_i32.view(); }), ErrorKind::type, "g_gamma", "float");
  expect_error(states([&](auto& a) { a.g_gamma = gamma_ok.view(); }), ErrorKind::value, "g_gamma",
               "per-key gate");  // the fixture's gate is [B, T, H, K]
  GlaSegmentStatesArgs gamma_elsewhere = f.a();
  gamma_elsewhere.g_gamma = gamma_ok.view();
  gamma_elsewhere.g_gamma.device = Device{DeviceType::cuda, 0};
  expect_error([&] { gla_segment_states(gamma_elsewhere); }, ErrorKind::value, "g_gamma", "expected device cpu");
  // cu_seqlens values: checked on the CPU.
  Buffer bad_cu(DType::i64, {3});
  bad_cu.set_values({0, 12, 19});
  expect_error(states([&](auto& a) { a.cu_seqlens = bad_cu.view(); }), ErrorKind::value, "cu_seqlens",
               "total number of tokens 20");
  // A CUDA tensor in a CPU-only build (or mixed devices in a CUDA build) names the argument.
  GlaSegmentStatesArgs mixed = f.a();
  mixed.states.device = Device{DeviceType::cuda, 0};
  expect_error([&] { gla_segment_states(mixed); }, ErrorKind::value, "states", "expected device cpu");
}

}  // namespace
}  // namespace flashgla::testing::gla_test
