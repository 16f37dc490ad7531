// The GPU twins of the CPU edge-value tests (test_gla_cpu.cpp, GlaCpuEdgeGates
// and GlaCpuCausality): gates anywhere in [−inf, 0] (−inf a full reset, any
// magnitude legal) against the fp64 recurrence, and a NaN or Inf in q, k or v
// at token t leaving every output before t as it was, on every CUDA forward
// path (forced through the FLASHGLA_GLA_* switches) and the decode step. The
// backward's twins are in test_gla_backward_cuda.cpp (CudaGlaBackward.EdgeGates*).
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gla_cuda_test_util.h"

namespace flashgla::testing::gla_test {
namespace {

double tolerance(DType dtype) { return dtype == DType::f32 ? 1e-5 : 5e-3; }

// A forward path: the dtype and shape that select it, and the tuning that forces it.
struct Path {
  std::string name;
  DType dtype = DType::bf16;
  int64_t K = 64, V = 64, B = 2, T = 200;
  std::function<void(GlaTuning&)> tuning = [](GlaTuning&) {};
  GlaAlgorithm algorithm = kChunked;
};

std::vector<Path> forward_paths() {
  const auto no_hopper = hopper_off;
  const auto hopper = hopper_on;
  const auto library = [](GlaTuning&) {};
  std::vector<Path> paths = {
      {"fast_bf16_K64", DType::bf16, 64, 64, 2, 200, no_hopper},
      {"fast_bf16_K128_V128", DType::bf16, 128, 128, 2, 200, no_hopper},
      {"fast_f16_K64_V100", DType::f16, 64, 100, 2, 200, no_hopper},
      {"general_bf16_K256_without_hopper", DType::bf16, 256, 64, 2, 200, no_hopper},
      {"general_f32_K64", DType::f32, 64, 64, 2, 200, library},
      {"general_f32_K128_V100", DType::f32, 128, 100, 2, 200, library},
      {"general_bf16_K64", DType::bf16, 64, 64, 2, 200, [](GlaTuning& t) { t.fast = false; }},
      {"hopper_bf16_K256", DType::bf16, 256, 64, 2, 200, hopper},
      {"hopper_bf16_K128_V256", DType::bf16, 128, 256, 2, 200, hopper},
      // K ≤ 64 padded to key pad 128, fp16, a partial value tile.
      {"hopper_f16_K64_V72", DType::f16, 64, 72, 2, 200, hopper},
      // Long sequences, few heads: the sequence split, with the split states kernel (the fast path's), the
      // general kernel's own states pass and the Hopper path's.
      {"split_states_kernel_bf16", DType::bf16, 64, 64, 1, 1000, [](GlaTuning& t) { t.splits = 4; }},
      {"split_states_kernel_bf16_K128", DType::bf16, 128, 64, 1, 1000, [](GlaTuning& t) { t.splits = 4; }},
      {"split_general_f32", DType::f32, 64, 64, 1, 1000, [](GlaTuning& t) { t.splits = 4; }},
      {"split_hopper_bf16_K256", DType::bf16, 256, 64, 1, 1000,
       [](GlaTuning& t) { t.hopper = GlaTuning::Force::on, t.splits = 3; }},
      {"recurrent_f32", DType::f32, 64, 64, 2, 200, library, kRecurrent},
      {"recurrent_bf16_K128", DType::bf16, 128, 128, 2, 200, library, kRecurrent},
  };
  return paths;
}

Case path_case(const Path& p, Gate gate) {
  Case c;
  c.B = p.B, c.T = p.T, c.H = 2, c.K = p.K, c.V = p.V, c.gate = gate;
  c.dtype = p.dtype, c.gate_dtype = p.dtype == DType::f16 ? DType::f32 : p.dtype;
  c.seed = std::hash<std::string>{}(p.name) + int(gate);
  return c;
}

void check_edge_gates(const Path& path, Gate gate, const std::vector<EdgeGates>& sets) {
  const ScopedTuning forced(path.tuning);
  const Case c = path_case(path, gate);
  ForwardCall call;
  call.algorithm = path.algorithm;
  for (const EdgeGates& e : sets) {
    SCOPED_TRACE(path.name + " " + describe_forward_case(c) + " " + e.name);
    const Inputs in = make_edge_inputs(c, e);
    const Outputs ref = forward_reference(c, in);
    ASSERT_TRUE(all_finite(ref.o) && all_finite(ref.ht));
    const Outputs out = run_forward(c, to_device(c, in, gpu()), call);
    expect_close("o", out.o, ref.o, tolerance(c.dtype));
    expect_close("final state", out.ht, ref.ht, tolerance(c.dtype));
  }
}

TEST(CudaGlaEdges, GatesAnywhereInMinusInfToZeroVector) {
  SKIP_WITHOUT_GPU();
  for (const Path& path : forward_paths()) check_edge_gates(path, Gate::vector, edge_gate_sets());
}

TEST(CudaGlaEdges, GatesAnywhereInMinusInfToZeroScalar) {
  SKIP_WITHOUT_GPU();
  for (const Path& path : forward_paths()) check_edge_gates(path, Gate::scalar, edge_gate_sets());
}

TEST(CudaGlaEdges, GatesAnywhereInMinusInfToZeroVarlen) {
  SKIP_WITHOUT_GPU();
  const double inf = std::numeric_limits<double>::infinity();
  for (const Path& path : forward_paths()) {
    const ScopedTuning forced(path.tuning);
    Case c = path_case(path, Gate::vector);
    c.B = 1, c.T = 200, c.cu_seqlens = {0, 50, 130, 130, 200};
    ForwardCall call;
    call.algorithm = path.algorithm;
    for (const EdgeGates& e : std::vector<EdgeGates>{{"neg_inf_at_starts", {0, 50, 130}, -inf, 1},
                                                     {"neg_inf_inside", {60, 64, 65}, -inf, 2}}) {
      SCOPED_TRACE(path.name + " varlen " + e.name);
      const Inputs in = make_edge_inputs(c, e);
      const Outputs ref = forward_reference(c, in);
      const Outputs out = run_forward(c, to_device(c, in, gpu()), call);
      expect_close("o", out.o, ref.o, tolerance(c.dtype));
      expect_close("final state", out.ht, ref.ht, tolerance(c.dtype));
    }
  }
}

// A NaN or Inf in q, k or v at token t: every output before t finite and equal
// (within the dtype's rounding: a chunk with a non-finite v takes another
// summation order) to that of the clean inputs.
void check_causality(const Path& path, Gate gate, const std::vector<int64_t>& tokens) {
  const ScopedTuning forced(path.tuning);
  const Case c = path_case(path, gate);
  ForwardCall call;
  call.algorithm = path.algorithm;
  const Inputs clean = make_inputs(c);
  const Outputs ref = run_forward(c, to_device(c, clean, gpu()), call);
  const double inf = std::numeric_limits<double>::infinity();
  for (Buffer Inputs::*input : {&Inputs::q, &Inputs::k, &Inputs::v})
    for (double bad : {std::nan(""), inf, -inf})
      for (int64_t t : tokens) {
        SCOPED_TRACE(::testing::Message() << path.name << " " << describe_forward_case(c) << " input "
                                          << (input == &Inputs::q ? "q" : input == &Inputs::k ? "k" : "v")
                                          << " value " << bad << " t " << t);
        Inputs in = clean;
        in.*input = (clean.*input).to(Device{});  // a copy
        set_token(in.*input, t, bad);
        const Outputs out = run_forward(c, to_device(c, in, gpu()), call);
        const std::vector<double> before = tokens_before(out.o, c.B, c.T, t);
        ASSERT_TRUE(all_finite(before));
        expect_close("o before t", before, tokens_before(ref.o, c.B, c.T, t), tolerance(c.dtype));
      }
}

TEST(CudaGlaEdges, NonFiniteInputsDoNotReachEarlierOutputs) {
  SKIP_WITHOUT_GPU();
  for (const Path& path : forward_paths())
    for (Gate gate : {Gate::vector, Gate::none}) check_causality(path, gate, {5, 16, 40, 63, 64, 100, 150});
}

// A [N, H, D] view of token t of a [B, T, H, D] (or [N, H] of a [B, T, H]) tensor.
TensorView token_view(const TensorView& x, int64_t t) {
  TensorView v = x;
  v.data = static_cast<char*>(x.data) + t * x.stride[1] * int64_t(dtype_size(x.dtype));
  v.ndim = x.ndim - 1;
  v.shape[0] = x.shape[0], v.stride[0] = x.stride[0];
  for (int d = 1; d < v.ndim; ++d) v.shape[d] = x.shape[d + 1], v.stride[d] = x.stride[d + 1];
  return v;
}

// The decode step, token by token on the GPU, through gates of −inf and −1e30.
TEST(CudaGlaEdges, DecodeThroughMinusInfGates) {
  SKIP_WITHOUT_GPU();
  const double inf = std::numeric_limits<double>::infinity();
  for (DType dtype : {DType::f32, DType::bf16})
    for (Gate gate : {Gate::vector, Gate::scalar}) {
      Case c;
      c.B = 3, c.T = 12, c.H = 2, c.K = 64, c.V = 64, c.gate = gate, c.dtype = dtype, c.gate_dtype = dtype;
      c.seed = 77 + int(gate);
      SCOPED_TRACE(describe_forward_case(c));
      Inputs in = make_inputs(c);
      set_token(in.g, 0, -inf), set_token(in.g, 4, -1e30), set_token(in.g, 7, -inf, 2), set_token(in.g, 8, -1e4);
      const Outputs ref = forward_reference(c, in);
      const Inputs dev = to_device(c, in, gpu());
      Buffer state = in.h0.to(gpu());  // updated in place
      Buffer o = poisoned_on(gpu(), dtype, {c.B, c.T, c.H, c.V}, 0);
      for (int64_t t = 0; t < c.T; ++t) {
        GlaDecodeArgs a;
        a.q = token_view(dev.q.view(), t), a.k = token_view(dev.k.view(), t), a.v = token_view(dev.v.view(), t);
        a.g = token_view(dev.g.view(), t);
        a.state = state.view();
        a.o = token_view(o.view(), t);
        gla_decode(a);
      }
      synchronize(gpu());
      expect_close("o", o.values(), ref.o, tolerance(dtype));
      expect_close("state", state.values(), ref.ht, 1e-5);
    }
}

// Small cases of the above for compute-sanitizer (its time limit covers the
// whole filter): −inf around chunk boundaries and a NaN in v, on one path of
// each kernel.
TEST(CudaGlaEdges, SanitizerEdgeValues) {
  SKIP_WITHOUT_GPU();
  std::vector<EdgeGates> sets;
  for (const EdgeGates& e : edge_gate_sets())
    if (e.name == "neg_inf_chunk_boundaries") sets.push_back(e);
  for (Path path : forward_paths()) {
    if (path.name != "fast_bf16_K128_V128" && path.name != "general_f32_K64" && path.name != "hopper_bf16_K256" &&
        path.name != "split_states_kernel_bf16" && path.name != "recurrent_f32")
      continue;
    path.B = 1, path.T = std::min<int64_t>(path.T, 200);
    check_edge_gates(path, Gate::vector, sets);
    {
      const ScopedTuning forced(path.tuning);
      const Case c = path_case(path, Gate::vector);
      Inputs in = make_inputs(c);
      set_token(in.v, 40, std::nan(""));
      ForwardCall call;
      call.algorithm = path.algorithm;
      const Outputs out = run_forward(c, to_device(c, in, gpu()), call);
      EXPECT_TRUE(all_finite(tokens_before(out.o, c.B, c.T, 40))) << path.name;
    }
  }
}

}  // namespace
}  // namespace flashgla::testing::gla_test
