// The sequence split's states pass as its own kernel (the fast path's;
// src/cuda/gla/kernels/gla_fwd_states.cuh) against the CPU fp64 recurrent reference on the
// same rounded inputs: o and the final state, for what the fast path takes
// (bf16/fp16, K ≤ 128, any V, every gate kind, range and
// dtype), forced split and piece counts (one piece and several: the fold
// kernel; more pieces than chunks: empty pieces), h0 / final
// state, strides, varlen with host cu_seqlens (sequences shorter than a split)
// and a long sequence with the planner's own choice. Outputs are poisoned (NaN)
// before every call. Skipped without a GPU.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "flashgla/flashgla.h"
#include "gla_cuda_test_util.h"

namespace flashgla::testing::gla_test {
namespace {

constexpr double kTolerance = 5e-3;  // bf16/fp16 inputs

// The chunked forward on the GPU with the states kernel, `splits` and `pieces` forced (0: the planner's
// choice), against the fp64 recurrent reference.
void check(const Case& c, int64_t splits, int64_t pieces, bool caller_workspace = false, bool host_lengths = false) {
  auto count = [](int64_t n) { return n > 0 ? std::to_string(n) : std::string("auto"); };
  SCOPED_TRACE(describe_forward_case(c) + " splits=" + count(splits) + " pieces=" + count(pieces) +
               (caller_workspace ? " caller-workspace" : ""));
  const ScopedTuning forced([=](GlaTuning& t) { t.splits = splits, t.state_pieces = pieces; });
  const Inputs in = make_inputs(c);
  const Outputs ref = forward_reference(c, in);
  const Buffer host = in.cu_seqlens;  // the boundaries on the CPU: lets the planner split a varlen batch
  ForwardCall call;
  call.caller_workspace = caller_workspace;
  call.cu_seqlens_host = host_lengths ? &host : nullptr;
  const Outputs out = run_forward(c, to_device(c, in, gpu()), call);
  expect_close("o", out.o, ref.o, kTolerance);
  expect_close("final state", out.ht, ref.ht, kTolerance);
}

// Key and value widths of every states-kernel tile (64/128 × 64/128), partial tiles, several value tiles, every
// gate kind, range and dtype, h0 / final state, strides, split and piece counts. (Its key parts, K > 128, run
// for the segment summaries only: tests/test_gla_segment_cuda.cpp.)
TEST(CudaGlaSplit, StatesKernelShapes) {
  SKIP_WITHOUT_GPU();
  const ScopedTuning no_hopper(hopper_off);  // K = 128 with V ≥ 256 could take the Hopper path on sm_90
  struct Dims {
    int64_t K, V;
  };
  const int64_t splits[] = {2, 3, 5};
  const int64_t pieces[] = {0, 1, 2, 3, 7};
  int i = 0;
  for (const Dims& d : {Dims{128, 128}, Dims{64, 64}, Dims{128, 64}, Dims{64, 128}, Dims{16, 8}, Dims{96, 200},
                        Dims{120, 264}, Dims{128, 136}, Dims{72, 72}})
    for (GateValues values : {GateValues::typical, GateValues::near_zero, GateValues::very_negative}) {
      Case c;
      c.B = 2, c.T = 640 + 29 * i, c.H = 2, c.K = d.K, c.V = d.V;
      c.dtype = i % 3 == 2 ? DType::f16 : DType::bf16;
      c.gate = i % 4 == 3 ? Gate::scalar : i % 8 == 5 ? Gate::none : Gate::vector;
      c.gate_dtype = c.gate == Gate::vector && i % 2 ? DType::f32 : c.dtype;
      c.gate_values = values, c.h0 = i % 2 == 0, c.final_state = i % 3 != 1;
      c.row_padding = i % 5 == 4 ? 8 : 0;
      c.seed = 4000 + i;
      check(c, splits[i % 3], pieces[i % 5], i % 2 == 1, false);
      ++i;
    }
}

// Varlen with the boundaries on the host (the planner splits the longest sequence; the shorter ones have fewer
// splits or none), every gate kind; without them there is no split at all.
TEST(CudaGlaSplit, StatesKernelVarlen) {
  SKIP_WITHOUT_GPU();
  int i = 0;
  for (DType dtype : {DType::bf16, DType::f16})
    for (Gate gate : {Gate::vector, Gate::scalar, Gate::none}) {
      Case c;
      c.cu_seqlens = {0, 0, 1, 64, 700, 2000, 2300};
      c.B = 1, c.T = 2300, c.H = 2, c.K = 128, c.V = i % 2 ? 64 : 128, c.dtype = dtype, c.gate = gate;
      c.gate_dtype = gate == Gate::vector && i % 2 ? DType::f32 : dtype;
      c.seed = 4100 + i;
      check(c, 0, i % 3 == 0 ? 0 : i % 3 == 1 ? 1 : 4, i % 2 == 0, true);
      ++i;
    }
  Case c;
  c.cu_seqlens = {0, 0, 1, 64, 700, 2000};
  c.B = 1, c.T = 2000, c.H = 2, c.K = 64, c.V = 64, c.dtype = DType::bf16, c.gate_dtype = DType::bf16;
  c.seed = 4150;
  check(c, 0, 0, false, false);
}

// Varlen with the boundaries only on the device and a sequence long enough to split: the planner reads them back
// and plans as with a host copy, so the two calls agree bit for bit (and the unsplit forward, forced, does not:
// the check can tell the plans apart).
TEST(CudaGlaSplit, VarlenDeviceBoundariesAreReadBackForTheSplit) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.cu_seqlens = {0, 5, 5 + 65536 + 17, 5 + 65536 + 17 + 300};  // past kReadBackTokens (gla_host.cuh)
  c.B = 1, c.T = c.cu_seqlens.back(), c.H = 2, c.K = 128, c.V = 128, c.dtype = DType::bf16;
  c.gate_dtype = DType::bf16, c.seed = 4160;
  c.gate_values = GateValues::near_zero;  // decays near 1: the state carries across splits, so the plans differ
  SCOPED_TRACE(describe_forward_case(c));
  const Inputs host_inputs = make_inputs(c);
  const Inputs in = to_device(c, host_inputs, gpu());
  const Buffer host = host_inputs.cu_seqlens;
  ForwardCall with_host;
  with_host.cu_seqlens_host = &host;
  const Outputs device_only = run_forward(c, in, ForwardCall{});
  const Outputs given = run_forward(c, in, with_host);
  const Outputs ref = forward_reference(c, host_inputs);
  expect_close("o", device_only.o, ref.o, kTolerance);
  expect_close("final state", device_only.ht, ref.ht, kTolerance);
  EXPECT_EQ(device_only.o, given.o);
  EXPECT_EQ(device_only.ht, given.ht);
  const ScopedTuning unsplit([](GlaTuning& t) { t.splits = 1; });
  const Outputs whole = run_forward(c, in, with_host);
  EXPECT_TRUE(whole.o != given.o || whole.ht != given.ht);
}

// A long sequence with the planner's choice of splits and pieces (B1 H2: 2 tiles, so the split is deep).
TEST(CudaGlaSplit, StatesKernelLongSequence) {
  SKIP_WITHOUT_GPU();
  int i = 0;
  for (GateValues values : {GateValues::typical, GateValues::very_negative}) {
    Case c;
    c.B = 1, c.T = 16384 + 17, c.H = 2, c.K = 128, c.V = 128, c.dtype = DType::bf16, c.gate_dtype = DType::bf16;
    c.gate_values = values, c.seed = 4200 + i++;
    check(c, 0, 0, false, false);
  }
}

// Small cases for memcheck and racecheck: the split slots written directly (one piece), the fold (several),
// an empty piece, a scalar gate, an fp32 gate.
TEST(CudaGlaSplit, SanitizerStatesKernel) {
  SKIP_WITHOUT_GPU();
  const ScopedTuning no_hopper(hopper_off);
  struct Small {
    int64_t K, V;
    Gate gate;
    DType gate_dtype;
    int64_t pieces;
  };
  int i = 0;
  for (const Small& s : {Small{128, 72, Gate::vector, DType::bf16, 1}, Small{128, 128, Gate::vector, DType::bf16, 2},
                         Small{64, 136, Gate::scalar, DType::bf16, 3}, Small{128, 72, Gate::vector, DType::f32, 2}}) {
    Case c;
    c.B = 1, c.T = 400, c.H = 1, c.K = s.K, c.V = s.V, c.dtype = DType::bf16, c.gate = s.gate;
    c.gate_dtype = s.gate_dtype, c.seed = 4300 + i++;
    check(c, 2, s.pieces, false, false);
  }
}

}  // namespace
}  // namespace flashgla::testing::gla_test
