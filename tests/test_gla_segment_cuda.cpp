// CUDA per-segment summaries (gla_segment_states, gla_segment_state_grads)
// against the fp64 definitions (gla_segment_test_util.h) on the same rounded
// inputs: dtypes, K and V up to 256 and odd sizes, every gate, long segments
// with few heads (several pieces and the fold), varlen with empty and
// one-token segments, −inf gates, strides, the caller's workspace, and the
// forward's final state. Skipped without a GPU.
#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "gla_cuda_test_util.h"
#include "gla_segment_test_util.h"
#include "test_util.h"

namespace flashgla::testing::gla_test {
namespace {

using Force = GlaTuning::Force;

Case gpu_case(const std::string& name, int64_t B, int64_t T, int64_t H, int64_t K, int64_t V, Gate gate, DType dtype) {
  Case c;
  c.name = name, c.B = B, c.T = T, c.H = H, c.K = K, c.V = V, c.gate = gate;
  c.dtype = dtype, c.gate_dtype = DType::f32;
  c.h0 = c.dht = false;
  c.seed = std::hash<std::string>{}(name);
  return c;
}

// As the forward's GPU tests: fp32 accumulation (the GPU's exp is the fast approximate one); bf16/fp16
// inputs go through the tensor cores with the gated keys (or queries) rounded to the input dtype.
double tolerance(DType dtype) { return dtype == DType::f32 ? 2e-5 : 5e-3; }

void check_on_gpu(const Case& c, const Inputs& cpu_in, const SegmentCall& call = {}) {
  const Inputs in = to_device(c, cpu_in, gpu());
  const SegmentStates out = run_segment_states(c, in, call);
  const SegmentStates ref = segment_states_reference(c, cpu_in);
  expect_close("states", out.states, ref.states, tolerance(c.dtype));
  expect_log_decay_close(out.log_decay, ref.log_decay, 1e-5);
  const double scale = call.scale.value_or(1.0 / std::sqrt(double(c.K)));
  expect_close("d_states", run_segment_state_grads(c, in, call), segment_state_grads_reference(c, cpu_in, scale),
               tolerance(c.dtype));
}

// bf16/fp16 inputs run the forward's split states kernel by default (states: walking backwards; gradients:
// forwards) and the generic tile kernel with tuning.segment_split_kernel off; fp32 always the generic one.
TEST(GlaSegmentCuda, MatchesDefinitionDtypesDimsGates) {
  SKIP_WITHOUT_GPU();
  const int64_t dims[][2] = {{64, 64}, {128, 128}, {256, 256}, {128, 64}, {64, 256}, {100, 72}};
  for (bool generic : {false, true}) {
    const ScopedTuning kernel([=](GlaTuning& t) { t.segment_split_kernel = generic ? Force::off : Force::library; });
    for (DType dtype : {DType::bf16, DType::f32, DType::f16})
      for (const auto& kv : dims)
        for (Gate gate : {Gate::vector, Gate::scalar, Gate::none}) {
          if (dtype == DType::f16 && kv[0] != kv[1]) continue;  // f16 on the square shapes only: same code path
          if (dtype == DType::f32 && generic) continue;          // fp32 runs the generic kernel anyway
          Case c = gpu_case(std::string(dtype_name(dtype)) + " K" + std::to_string(kv[0]) + " V" +
                                std::to_string(kv[1]) + " gate" + std::to_string(int(gate)) + (generic ? " generic" : ""),
                            2, 333, 2, kv[0], kv[1], gate, dtype);
          if (dtype == DType::bf16 && gate == Gate::vector && kv[0] == 128) c.gate_dtype = DType::bf16;
          SCOPED_TRACE(c.name);
          check_on_gpu(c, make_inputs(c));
        }
  }
}

// One or two heads over long segments: several pieces per segment and their fold, chosen by the library
// (with and without the host copy of cu_seqlens) or forced.
TEST(GlaSegmentCuda, LongSegmentsFewHeadsVarlen) {
  SKIP_WITHOUT_GPU();
  for (bool generic : {false, true})
  for (Gate gate : {Gate::vector, Gate::scalar})
    for (bool host_copy : {false, true}) {
      const ScopedTuning kernel([=](GlaTuning& t) { t.segment_split_kernel = generic ? Force::off : Force::library; });
      Case c = gpu_case("long" + std::to_string(int(gate)) + (host_copy ? " host " : " ") + (generic ? "generic" : ""),
                        1, 8131, 1, 128, 128, gate, DType::bf16);
      c.cu_seqlens = {0, 0, 1, 5001, 5131, 5131, 8131};
      c.gate_values = GateValues::near_zero;  // long memory: every piece matters
      SCOPED_TRACE(c.name);
      const Inputs in = make_inputs(c);
      SegmentCall call;
      call.cu_seqlens_host = host_copy ? &in.cu_seqlens : nullptr;
      check_on_gpu(c, in, call);
    }
  Case c = gpu_case("long fixed", 2, 20000, 1, 64, 64, Gate::vector, DType::bf16);
  c.gate_values = GateValues::near_zero;
  check_on_gpu(c, make_inputs(c));
}

TEST(GlaSegmentCuda, ForcedPiecesAndCallerWorkspace) {
  SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::f32, DType::bf16})
  for (int64_t pieces : {1, 3, 7}) {
    const ScopedTuning forced([=](GlaTuning& t) { t.segment_pieces = pieces; });
    Case c = gpu_case("pieces" + std::to_string(pieces) + " " + dtype_name(dtype), 1, 700, 2, 64, 128, Gate::vector,
                      dtype);
    c.cu_seqlens = {0, 33, 33, 34, 700};
    c.gate_values = GateValues::near_zero;
    SCOPED_TRACE(c.name);
    SegmentCall call;
    call.caller_workspace = true;
    call.scale = 0.4;
    check_on_gpu(c, make_inputs(c), call);
  }
}

TEST(GlaSegmentCuda, StridedVeryNegativeAndMinusInfinityGates) {
  SKIP_WITHOUT_GPU();
  Case c = gpu_case("strided", 2, 200, 2, 64, 64, Gate::vector, DType::bf16);
  c.row_padding = 8;
  check_on_gpu(c, make_inputs(c));
  c = gpu_case("minus20", 2, 200, 2, 128, 64, Gate::scalar, DType::f32);
  c.gate_values = GateValues::very_negative;
  check_on_gpu(c, make_inputs(c));

  const ScopedTuning pieces([](GlaTuning& t) { t.segment_pieces = 2; });
  c = gpu_case("minusinf", 1, 900, 2, 64, 64, Gate::vector, DType::bf16);
  c.cu_seqlens = {0, 300, 900};
  Inputs in = make_inputs(c);
  std::vector<double> g = in.g.values();
  for (int64_t t : {100, 700})  // inside the first segment, and in the second segment's first piece
    for (int64_t i = 0; i < c.H * c.K; i += 2) g[size_t(t * c.H * c.K + i)] = -std::numeric_limits<double>::infinity();
  in.g.set_values(g);
  check_on_gpu(c, in);
}

// The op's states equal the CUDA forward's final state from a zero start.
TEST(GlaSegmentCuda, EqualsForwardFinalState) {
  SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::bf16, DType::f32}) {
    Case c = gpu_case(std::string("cross ") + dtype_name(dtype), 1, 3000, 2, 128, 128, Gate::vector, dtype);
    c.cu_seqlens = {0, 1000, 1001, 3000};
    c.final_state = true;
    SCOPED_TRACE(c.name);
    const Inputs in = to_device(c, make_inputs(c), gpu());
    ForwardCall call;
    const Outputs forward = run_forward(c, in, call);
    expect_close("states vs final_state", run_segment_states(c, in).states, forward.ht, tolerance(dtype));
  }
}

// Small cases for compute-sanitizer (scripts/gpu_check.sh): both kernels, forced pieces and the fold,
// partial tiles, an empty and a one-token segment.
TEST(GlaSegmentCuda, SanitizerSmallCases) {
  SKIP_WITHOUT_GPU();
  for (bool generic : {false, true})
    for (int64_t pieces : {0, 3}) {  // 0: the library's count
      const ScopedTuning forced([=](GlaTuning& t) {
        t.segment_split_kernel = generic ? Force::off : Force::library;
        t.segment_pieces = pieces;
      });
      Case c = gpu_case(std::string("sanitizer ") + (generic ? "generic " : "") + std::to_string(pieces), 1, 200, 1,
                        72, 40, Gate::vector, DType::bf16);
      c.cu_seqlens = {0, 0, 1, 200};
      SCOPED_TRACE(c.name);
      check_on_gpu(c, make_inputs(c));
    }
}

// g_gamma read in the kernels (added where they read the scalar gate) gives what the fp32 gate g + g_gamma
// staged by hand gives, bit for bit, with the op's own scratch and the caller's workspace.
TEST(GlaSegmentCuda, GGammaEqualsStagedGate) {
  SKIP_WITHOUT_GPU();
  for (Gate gate : {Gate::scalar, Gate::none})
    for (DType dtype : {DType::bf16, DType::f32}) {
      const Case c = gpu_case(std::string("gamma") + dtype_name(dtype) + std::to_string(int(gate)), 2, 700, 3, 64,
                              64, gate, dtype);
      SCOPED_TRACE(c.name);
      const Inputs in = to_device(c, make_inputs(c), gpu());
      expect_gamma_equals_staged_gate(c, in, random_g_gamma(c.H, DType::f32, gpu(), c.seed));
    }
  Case c = gpu_case("gamma varlen", 1, 300, 2, 64, 64, Gate::scalar, DType::bf16);
  c.cu_seqlens = {0, 100, 100, 300};
  const Inputs in = to_device(c, make_inputs(c), gpu());
  expect_gamma_equals_staged_gate(c, in, random_g_gamma(c.H, DType::f32, gpu(), 5));
  const Buffer on_host(DType::f32, {c.H});
  SegmentCall elsewhere;
  elsewhere.g_gamma = &on_host;
  expect_error([&] { run_segment_states(c, in, elsewhere); }, ErrorKind::value, "g_gamma", "expected device");
  expect_error([&] { run_segment_state_grads(c, in, elsewhere); }, ErrorKind::value, "g_gamma", "expected device");
}

TEST(GlaSegmentCuda, BadArguments) {
  SKIP_WITHOUT_GPU();
  Case c = gpu_case("f64", 1, 10, 1, 64, 64, Gate::vector, DType::f64);
  c.gate_dtype = DType::f64;
  const Inputs in = to_device(c, make_inputs(c), gpu());
  expect_error([&] { run_segment_states(c, in); }, ErrorKind::unsupported, "k", "float64");
  expect_error([&] { run_segment_state_grads(c, in); }, ErrorKind::unsupported, "q", "float64");
  // A workspace smaller than the query asks for.
  Case b = gpu_case("workspace", 1, 1000, 1, 64, 64, Gate::vector, DType::bf16);
  const Inputs bin = to_device(b, make_inputs(b), gpu());
  Buffer states(DType::f32, {1, 1, 64, 64}, gpu()), log_decay(DType::f32, {1, 1, 64}, gpu());
  Buffer small(DType::f32, {4}, gpu());
  GlaSegmentStatesArgs a;
  a.k = bin.k.view(), a.v = bin.v.view(), a.g = bin.g.view(), a.states = states.view(), a.log_decay = log_decay.view();
  a.tuning.segment_pieces = 4;
  ASSERT_GT(gla_segment_states_workspace_bytes(a), size_t(16));
  a.workspace = small.view().data, a.workspace_bytes = 16;
  expect_error([&] { gla_segment_states(a); }, ErrorKind::value, "workspace", "gla_segment_states_workspace_bytes");
}

}  // namespace
}  // namespace flashgla::testing::gla_test
