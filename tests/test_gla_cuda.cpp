// CUDA GLA forward (chunked and recurrent) and decode against the CPU fp64
// recurrent reference on the same rounded inputs: o and the final state, every
// T of the grid, head dims 16..512 with K ≠ V, the three gate kinds, gates near
// 0 and near −20 per step, h0 / final state on and off, fp32/bf16/fp16 (and
// other gate dtypes), varlen with an empty and a length-1 sequence, strided
// tensors, the sequence-split path, caller workspace and streams, a long
// sequence, a tensor of more than 2^31 elements, and decode vs recurrent.
// Outputs are poisoned (NaN) before every call. Skipped without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "flashgla/flashgla.h"
#include "gla_cuda_test_util.h"

#ifdef FLASHGLA_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace flashgla::testing::gla_test {
namespace {

double tolerance(DType dtype) { return dtype == DType::f32 ? 1e-5 : 5e-3; }

void expect_outputs_close(const Outputs& out, const Outputs& ref, double tol) {
  expect_close("o", out.o, ref.o, tol);
  expect_close("final state", out.ht, ref.ht, tol);
}

void check_against_reference(const Case& c, ForwardCall call) {
  SCOPED_TRACE(describe_forward_case(c) + (call.algorithm == kChunked ? " chunked" : " recurrent") +
               (call.reverse ? " reverse" : "") + (call.caller_workspace ? " caller-workspace" : ""));
  const Inputs in = make_inputs(c);
  const Outputs ref = forward_reference(c, in, call.reverse);
  const Outputs out = run_forward(c, to_device(c, in, gpu()), call);
  expect_outputs_close(out, ref, tolerance(c.dtype));
}

// Every T and head-dim pair of the grid, rotating dtype, gate kind, gate range,
// gate dtype, h0 / final state and strides through the cases.
std::vector<Case> grid() {
  struct Dims {
    int64_t K, V;
  };
  const std::vector<int64_t> lengths = {1, 15, 63, 64, 65, 200, 1000};
  const std::vector<Dims> dims = {{16, 16}, {32, 64}, {64, 32}, {64, 64}, {100, 100}, {128, 128}, {48, 200}};
  const DType dtypes[] = {DType::f32, DType::bf16, DType::f16};
  std::vector<Case> cases;
  int i = 0;
  for (int64_t T : lengths)
    for (const Dims& d : dims) {
      Case c;
      c.B = T <= 200 ? 2 : 1, c.T = T, c.H = 2, c.K = d.K, c.V = d.V;
      c.dtype = dtypes[i % 3];
      c.gate = Gate(i / 3 % 3);
      c.gate_values = GateValues(i / 9 % 3);
      c.gate_dtype = i % 4 == 3 ? DType::f32 : c.dtype;
      c.h0 = i % 4 != 1, c.final_state = i % 4 != 2;
      c.row_padding = i % 5 == 0 ? 3 : 0;
      c.seed = 100 + i;
      cases.push_back(c);
      ++i;
    }
  return cases;
}

TEST(CudaGlaForward, ChunkedMatchesReference) {
  SKIP_WITHOUT_GPU();
  for (const Case& c : grid()) check_against_reference(c, ForwardCall{});
}

TEST(CudaGlaForward, RecurrentMatchesReference) {
  SKIP_WITHOUT_GPU();
  int i = 0;
  for (const Case& c : grid()) {
    ForwardCall call;
    call.algorithm = kRecurrent;
    call.reverse = i++ % 2 == 1;
    check_against_reference(c, call);
  }
}

// Every dtype on the same problems: gate kinds × gate ranges at two lengths.
TEST(CudaGlaForward, EveryDtypeGateKindAndRange) {
  SKIP_WITHOUT_GPU();
  int i = 0;
  for (DType dtype : {DType::f32, DType::bf16, DType::f16})
    for (Gate gate : {Gate::none, Gate::scalar, Gate::vector})
      for (GateValues values : {GateValues::typical, GateValues::near_zero, GateValues::very_negative}) {
        if (gate == Gate::none && values != GateValues::typical) continue;
        Case c;
        c.B = 2, c.T = i % 2 ? 300 : 130, c.H = 2, c.K = 64, c.V = 64, c.dtype = dtype, c.gate = gate;
        c.gate_values = values, c.seed = 300 + i++;
        check_against_reference(c, ForwardCall{});
      }
}

TEST(CudaGlaForward, LargeHeadDims) {
  SKIP_WITHOUT_GPU();
  struct Dims {
    int64_t K, V;
  };
  int i = 0;
  for (DType dtype : {DType::f32, DType::bf16, DType::f16})
    for (const Dims& d : {Dims{256, 512}, Dims{256, 256}, Dims{512, 64}, Dims{512, 512}, Dims{20, 512}}) {
      Case c;
      c.B = 1, c.T = i % 2 ? 200 : 65, c.H = 2, c.K = d.K, c.V = d.V, c.dtype = dtype;
      c.gate = i % 3 == 2 ? Gate::scalar : Gate::vector;
      c.seed = 400 + i++;
      check_against_reference(c, ForwardCall{});
      ForwardCall call;
      call.algorithm = kRecurrent, call.reverse = i % 2;
      check_against_reference(c, call);
    }
}

// Gates of another dtype than q, k, v.
TEST(CudaGlaForward, GateDtypes) {
  SKIP_WITHOUT_GPU();
  int i = 0;
  for (DType dtype : {DType::f32, DType::bf16, DType::f16})
    for (DType gate_dtype : {DType::f64, DType::f32, DType::bf16, DType::f16})
      for (Gate gate : {Gate::vector, Gate::scalar}) {
        Case c;
        c.B = 1, c.T = 100, c.H = 2, c.K = 40, c.V = 72, c.dtype = dtype, c.gate = gate, c.gate_dtype = gate_dtype;
        c.seed = 500 + i++;
        check_against_reference(c, ForwardCall{});
        ForwardCall call;
        call.algorithm = kRecurrent;
        check_against_reference(c, call);
      }
}

// Lengths 0, 1, 63, 65, 200 packed into one row.
Case varlen_case(DType dtype, Gate gate, uint64_t seed) {
  Case c;
  c.cu_seqlens = {0, 0, 1, 64, 129, 329};
  c.B = 1, c.T = 329, c.H = 2, c.K = 64, c.V = 48, c.dtype = dtype, c.gate = gate, c.seed = seed;
  return c;
}

TEST(CudaGlaForward, VarlenMatchesReference) {
  SKIP_WITHOUT_GPU();
  int i = 0;
  for (DType dtype : {DType::f32, DType::bf16, DType::f16})
    for (Gate gate : {Gate::vector, Gate::scalar, Gate::none})
      for (GlaAlgorithm algorithm : {kChunked, kRecurrent}) {
        const Case c = varlen_case(dtype, gate, 600 + i);
        const Buffer host = make_inputs(c).cu_seqlens;  // the same boundaries, on the CPU
        ForwardCall call;
        call.algorithm = algorithm;
        call.reverse = algorithm == kRecurrent && i % 2;
        call.cu_seqlens_host = i % 2 ? &host : nullptr;  // with the host copy the chunked kernel may split
        check_against_reference(c, call);
        ++i;
      }
}

TEST(CudaGlaForward, VarlenManyShortSequencesAndEmptyBatch) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.B = 1, c.H = 3, c.K = 32, c.V = 32, c.dtype = DType::bf16, c.seed = 650;
  c.cu_seqlens = {0};
  for (int n = 0; n < 40; ++n) c.cu_seqlens.push_back(c.cu_seqlens.back() + (n * 37) % 90);
  c.T = c.cu_seqlens.back();
  check_against_reference(c, ForwardCall{});
  ForwardCall recurrent;
  recurrent.algorithm = kRecurrent;
  check_against_reference(c, recurrent);

  Case empty;  // T = 0: o is empty, the final state is h0
  empty.B = 2, empty.T = 0, empty.dtype = DType::f32, empty.seed = 651;
  check_against_reference(empty, ForwardCall{});
  check_against_reference(empty, recurrent);
}

// Padding 3 breaks the 16-byte alignment of rows (element-wise loads); padding
// 8 keeps it (cp.async on strided tensors).
TEST(CudaGlaForward, StridedInputs) {
  SKIP_WITHOUT_GPU();
  int i = 0;
  for (DType dtype : {DType::f32, DType::bf16, DType::f16})
    for (int64_t padding : {3, 8}) {
      Case c;
      c.B = 2, c.T = 130, c.H = 3, c.K = 64, c.V = 96, c.dtype = dtype, c.row_padding = padding, c.seed = 700 + i;
      check_against_reference(c, ForwardCall{});
      ForwardCall call;
      call.algorithm = kRecurrent, call.reverse = i++ % 2;
      check_against_reference(c, call);
    }
}

// One sequence, one head: the chunked kernel splits the sequence (states pass,
// scan, output pass); forced split counts cover uneven pieces.
TEST(CudaGlaForward, SequenceSplit) {
  SKIP_WITHOUT_GPU();
  int i = 0;
  for (DType dtype : {DType::f32, DType::bf16})
    for (int64_t forced : {0, 3, 7}) {  // 0: the library's count
      const ScopedTuning splits([=](GlaTuning& t) { t.splits = forced; });
      Case c;
      c.B = 1, c.T = 1000 + 37 * i, c.H = 1, c.K = 96, c.V = 80, c.dtype = dtype, c.seed = 800 + i;
      c.gate = Gate(i % 3);
      ForwardCall call;
      call.caller_workspace = i % 2;
      check_against_reference(c, call);
      ++i;
    }
}

// The fast path (bf16/fp16, K ≤ 128 here, 16-byte rows): key widths below, at and
// between its two tile sizes, value widths over one and several tiles, every
// gate kind and range, h0 / final state, and the sequence split (forced piece
// counts and the host cu_seqlens of a varlen batch).
TEST(CudaGlaForward, FastPathShapes) {
  SKIP_WITHOUT_GPU();
  struct Dims {
    int64_t K, V;
  };
  int i = 0;
  for (const Dims& d : {Dims{128, 128}, Dims{64, 64}, Dims{128, 64}, Dims{64, 128}, Dims{16, 8}, Dims{96, 200},
                        Dims{120, 264}, Dims{128, 40}})
    for (GateValues values : {GateValues::typical, GateValues::near_zero, GateValues::very_negative}) {
      Case c;
      c.B = 2, c.T = i % 2 ? 333 : 192, c.H = 2, c.K = d.K, c.V = d.V;
      c.dtype = i % 3 == 2 ? DType::f16 : DType::bf16, c.gate_dtype = c.dtype;
      c.gate = i % 4 == 3 ? Gate::scalar : i % 8 == 5 ? Gate::none : Gate::vector;
      c.gate_values = values, c.h0 = i % 2 == 0, c.final_state = i % 3 != 1;
      c.row_padding = i % 5 == 4 ? 8 : 0;
      c.seed = 1500 + i++;
      check_against_reference(c, ForwardCall{});
    }
  for (int64_t forced : {2, 5}) {
    const ScopedTuning splits([=](GlaTuning& t) { t.splits = forced; });
    for (Gate gate : {Gate::vector, Gate::scalar}) {
      Case c;
      c.B = 1, c.T = 700 + 29 * i, c.H = 2, c.K = 128, c.V = 128, c.dtype = DType::bf16, c.gate_dtype = c.dtype;
      c.gate = gate, c.seed = 1550 + i++;
      ForwardCall call;
      call.caller_workspace = i % 2;
      check_against_reference(c, call);
    }
  }
  for (DType dtype : {DType::bf16, DType::f16}) {
    Case c = varlen_case(dtype, Gate::vector, 1560 + i++);
    c.K = 128, c.V = 64, c.gate_dtype = dtype;
    const Buffer host = make_inputs(c).cu_seqlens;
    ForwardCall call;
    call.cu_seqlens_host = &host;  // lets the host plan a split
    check_against_reference(c, call);
  }
}

// The fast path with an fp32 vector gate on bf16/fp16 inputs (as the GLA layer
// calls it): both tile sizes, partial tiles, every gate range, h0 / final state,
// strides, a forced split.
TEST(CudaGlaForward, FastPathFloatGate) {
  SKIP_WITHOUT_GPU();
  const ScopedTuning no_hopper(hopper_off);  // K = 128 with V = 256 may take the Hopper path on sm_90
  struct Dims {
    int64_t K, V;
  };
  int i = 0;
  for (const Dims& d : {Dims{128, 256}, Dims{64, 64}, Dims{96, 200}, Dims{16, 8}, Dims{120, 128}})
    for (GateValues values : {GateValues::typical, GateValues::near_zero, GateValues::very_negative}) {
      Case c;
      c.B = 2, c.T = i % 2 ? 333 : 192, c.H = 2, c.K = d.K, c.V = d.V;
      c.dtype = i % 3 == 2 ? DType::f16 : DType::bf16, c.gate_dtype = DType::f32, c.gate = Gate::vector;
      c.gate_values = values, c.h0 = i % 2 == 0, c.final_state = i % 3 != 1;
      c.row_padding = i % 5 == 4 ? 8 : 0;
      c.seed = 1700 + i++;
      check_against_reference(c, ForwardCall{});
    }
  const ScopedTuning splits([](GlaTuning& t) { t.splits = 3; });
  Case c;
  c.B = 1, c.T = 900, c.H = 2, c.K = 128, c.V = 128, c.dtype = DType::bf16, c.gate_dtype = DType::f32;
  c.gate = Gate::vector, c.gate_values = GateValues::very_negative, c.seed = 1750;
  check_against_reference(c, ForwardCall{});
}

// 128 < K ≤ 256 without the Hopper path (as on GPUs before sm_90): the general kernel, bf16/fp16 inputs, every
// gate kind and range, h0 / final state, strides, the sequence split and varlen.
TEST(CudaGlaForward, WideKeysWithoutHopper) {
  SKIP_WITHOUT_GPU();
  const ScopedTuning no_hopper(hopper_off);
  struct Dims {
    int64_t K, V;
  };
  int i = 0;
  for (const Dims& d : {Dims{256, 512}, Dims{200, 72}, Dims{136, 128}, Dims{256, 40}})
    for (GateValues values : {GateValues::typical, GateValues::very_negative}) {
      Case c;
      c.B = 2, c.T = i % 2 ? 333 : 192, c.H = 2, c.K = d.K, c.V = d.V;
      c.dtype = i % 3 == 2 ? DType::f16 : DType::bf16;
      c.gate = i % 4 == 3 ? Gate::scalar : i % 8 == 5 ? Gate::none : Gate::vector;
      c.gate_dtype = i % 2 ? DType::f32 : c.dtype;
      c.gate_values = values, c.h0 = i % 2 == 0, c.final_state = i % 3 != 1;
      c.row_padding = i % 5 == 4 ? 8 : 0;
      c.seed = 1800 + i++;
      check_against_reference(c, ForwardCall{});
    }
  for (Gate gate : {Gate::vector, Gate::scalar}) {
    const ScopedTuning splits([](GlaTuning& t) { t.splits = 4; });
    Case c;
    c.B = 1, c.T = 700 + 29 * i, c.H = 2, c.K = 256, c.V = 136, c.dtype = DType::bf16, c.gate_dtype = DType::f32;
    c.gate = gate, c.seed = 1850 + i++;
    ForwardCall call;
    call.caller_workspace = i % 2;
    check_against_reference(c, call);
  }
  Case c = varlen_case(DType::bf16, Gate::vector, 1860);
  c.K = 256, c.V = 64, c.gate_dtype = DType::f32;
  const Buffer host = make_inputs(c).cu_seqlens;
  ForwardCall call;
  call.cu_seqlens_host = &host;
  check_against_reference(c, call);
}

// The Hopper path (tuning.hopper on; on other GPUs the default path runs):
// both key pads (128, 256) with K at and below them, V over one and several
// 64-column tiles and partial ones, every gate kind, range and dtype, T below,
// at and over a chunk, h0 / final state, strides, forced splits (states pass; key pad 256 only)
// with the caller's workspace, varlen with and without host cu_seqlens.
TEST(CudaGlaForward, HopperPathShapes) {
  SKIP_WITHOUT_GPU();
  const ScopedTuning hopper(hopper_on);
  struct Dims {
    int64_t K, V;
  };
  const int64_t lengths[] = {192, 333, 1, 64, 65, 63};
  int i = 0;
  for (const Dims& d : {Dims{256, 512}, Dims{128, 128}, Dims{64, 64}, Dims{200, 72}, Dims{16, 8}, Dims{96, 200},
                        Dims{256, 40}, Dims{128, 64}})
    for (GateValues values : {GateValues::typical, GateValues::near_zero, GateValues::very_negative}) {
      Case c;
      c.B = 2, c.T = lengths[i % 6], c.H = 2, c.K = d.K, c.V = d.V;
      c.dtype = i % 3 == 2 ? DType::f16 : DType::bf16;
      c.gate = i % 4 == 3 ? Gate::scalar : i % 8 == 5 ? Gate::none : Gate::vector;
      c.gate_dtype = i % 2 ? DType::f32 : c.dtype;
      c.gate_values = values, c.h0 = i % 2 == 0, c.final_state = i % 3 != 1;
      c.row_padding = i % 5 == 4 ? 8 : 0;
      c.seed = 2100 + i++;
      check_against_reference(c, ForwardCall{});
    }
}

// Forced split counts (taken with key pad 256; key pad 128 runs unsplit), caller's workspace, varlen.
TEST(CudaGlaForward, HopperPathSplitsAndVarlen) {
  SKIP_WITHOUT_GPU();
  const ScopedTuning hopper(hopper_on);
  int i = 0;
  for (int64_t forced : {2, 5})
    for (int64_t K : {256, 128, 64}) {
      const ScopedTuning splits([=](GlaTuning& t) { t.splits = forced; });
      Case c;
      c.B = 1, c.T = 700 + 29 * i, c.H = 2, c.K = K, c.V = K == 256 ? 136 : 128, c.dtype = DType::bf16;
      c.gate_dtype = i % 2 ? DType::f32 : c.dtype;
      c.gate = i % 3 == 1 ? Gate::scalar : Gate::vector, c.h0 = true, c.final_state = true;
      c.gate_values = i % 3 == 2 ? GateValues::very_negative : GateValues::typical;
      c.seed = 2200 + i++;
      ForwardCall call;
      call.caller_workspace = i % 2;
      check_against_reference(c, call);
    }
  for (DType dtype : {DType::bf16, DType::f16})
    for (int64_t K : {256, 128}) {
      Case c = varlen_case(dtype, Gate::vector, 2250 + i++);
      c.K = K, c.V = 72, c.gate_dtype = DType::f32;
      const Buffer host = make_inputs(c).cu_seqlens;
      ForwardCall call;
      if (K == 256) call.cu_seqlens_host = &host;  // lets the host plan a split
      check_against_reference(c, call);
    }
}

// The default route of K = 128 with V >= 256 (the 340M model's heads): on sm_90a the Hopper path when the value
// tiles (sequences x heads x V / 64) fill at least half the SMs, else the fast path with its sequence split. Both
// sides of that threshold, tuning.hopper left to the library, bf16 and fp32 gates.
TEST(CudaGlaForward, WideValueHeadsOnTheDefaultRoute) {
  SKIP_WITHOUT_GPU();
  const ScopedTuning library_route(hopper_library);
  int i = 0;
  for (int64_t H : {20, 1})  // 2 x 20 x 4 = 160 value tiles (Hopper on an H100), 2 x 1 x 4 = 8 (fast path, split)
    for (DType gate_dtype : {DType::bf16, DType::f32}) {
      Case c;
      c.B = 2, c.T = H > 1 ? 150 : 900, c.H = H, c.K = 128, c.V = 256, c.dtype = DType::bf16;
      c.gate_dtype = gate_dtype, c.h0 = i % 2 == 0, c.final_state = true;
      c.seed = 2280 + i++;
      check_against_reference(c, ForwardCall{});
    }
}

// The state kernel without programmatic dependent launch (tuning.hopper_pdl off): both key pads, value
// tiles partial and whole, a forced split (the states pass with key pad 256), varlen.
TEST(CudaGlaForward, HopperPathStateKernelSwitches) {
  SKIP_WITHOUT_GPU();
  const ScopedTuning hopper(hopper_on);
  int i = 0;
  {
    const ScopedTuning no_pdl([](GlaTuning& t) { t.hopper_pdl = false; });
    for (int64_t K : {256, 128, 64}) {
      const ScopedTuning splits([](GlaTuning& t) { t.splits = 3; });
      Case c;
      c.B = 2, c.T = 400 + 37 * i, c.H = 2, c.K = K, c.V = K == 256 ? 256 : K == 128 ? 200 : 72;
      c.dtype = i % 4 == 3 ? DType::f16 : DType::bf16;
      c.gate_dtype = i % 2 ? DType::f32 : c.dtype;
      c.gate = Gate::vector, c.h0 = true, c.final_state = true;
      c.gate_values = i % 3 == 2 ? GateValues::very_negative : GateValues::typical;
      c.seed = 2400 + i++;
      check_against_reference(c, ForwardCall{});
    }
    Case c = varlen_case(DType::f16, Gate::vector, 2450 + i++);
    c.K = 256, c.V = 128;
    check_against_reference(c, ForwardCall{});
  }
}

// The general kernel on bf16/fp16 inputs, which the fast path takes otherwise.
TEST(CudaGlaForward, GeneralKernelOnHalfInputs) {
  SKIP_WITHOUT_GPU();
  const ScopedTuning general([](GlaTuning& t) { t.fast = false; });
  int i = 0;
  for (const Case& base : grid()) {
    if (base.dtype == DType::f32 || i++ % 2) continue;
    check_against_reference(base, ForwardCall{});
  }
}

TEST(CudaGlaForward, LongSequence) {
  SKIP_WITHOUT_GPU();
  int i = 0;
  for (GlaAlgorithm algorithm : {kChunked, kRecurrent})
    for (GateValues values : {GateValues::typical, GateValues::very_negative}) {
      Case c;
      c.B = 1, c.T = 65536, c.H = 2, c.K = 64, c.V = 64, c.dtype = DType::bf16, c.gate_values = values;
      c.seed = 900 + i++;
      ForwardCall call;
      call.algorithm = algorithm;
      check_against_reference(c, call);
    }
}

#ifdef FLASHGLA_WITH_CUDA
TEST(CudaGlaForward, CallerWorkspaceAndStream) {
  SKIP_WITHOUT_GPU();
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  int i = 0;
  for (GlaAlgorithm algorithm : {kChunked, kRecurrent}) {
    Case c;
    c.B = 1, c.T = 2000, c.H = 2, c.K = 48, c.V = 40, c.dtype = DType::bf16, c.seed = 1000 + i++;
    ForwardCall call;
    call.algorithm = algorithm, call.stream = stream, call.caller_workspace = true;
    check_against_reference(c, call);
  }
  ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

// B·T·H·K above 2^31 elements (64-bit offsets). The inputs are constants set
// with cudaMemset (q = k = v = c, g = −d), so o has a closed form:
// o_t = scale · K · c · c² (1 − a^{t+1}) / (1 − a) with a = exp(−d) in every
// column. o starts as NaN; the last tokens and heads are checked.
TEST(CudaGlaForward, MoreThan2To31Elements) {
  SKIP_WITHOUT_GPU();
  const int64_t T = (int64_t(1) << 21) + 64, H = 16, K = 64, V = 64;
  const size_t bytes = size_t(T * H * K) * 2;  // bf16
  size_t free_bytes = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
  if (free_bytes < 3 * bytes + (size_t(1) << 30)) GTEST_SKIP() << "needs " << 3 * bytes / 1e9 << " GB of GPU memory";
  void* q = nullptr;
  void* g = nullptr;
  void* o = nullptr;
  ASSERT_EQ(cudaMalloc(&q, bytes), cudaSuccess);  // q, k and v share one buffer (read only)
  ASSERT_EQ(cudaMalloc(&g, bytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&o, bytes), cudaSuccess);
  ASSERT_EQ(cudaMemset(q, 0x3c, bytes), cudaSuccess);  // bf16 0x3c3c = 0.011474609375
  ASSERT_EQ(cudaMemset(g, 0xbc, bytes), cudaSuccess);  // bf16 0xbcbc = −0.02294921875
  const double c = 0.011474609375, d = 0.02294921875, a = std::exp(-d), scale = 1.0 / 8;
  for (GlaAlgorithm algorithm : {kChunked, kRecurrent}) {
    SCOPED_TRACE(algorithm == kChunked ? "chunked" : "recurrent");
    ASSERT_EQ(cudaMemset(o, 0xff, bytes), cudaSuccess);  // NaN
    GlaForwardArgs args;
    args.q = TensorView::contiguous(q, DType::bf16, {1, T, H, K}, gpu());
    args.k = args.q, args.v = args.q;
    args.g = TensorView::contiguous(g, DType::bf16, {1, T, H, K}, gpu());
    args.o = TensorView::contiguous(o, DType::bf16, {1, T, H, V}, gpu());
    args.algorithm = algorithm;
    ASSERT_NO_THROW(gla_forward(args));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    for (int64_t t : {T - 1, T - 2, T - 65, T / 2 + 3}) {
      const double expected = scale * K * c * c * c * (1 - std::pow(a, double(t + 1))) / (1 - a);
      for (int64_t h : {H - 1, int64_t(0)}) {
        uint16_t raw[V];
        ASSERT_EQ(cudaMemcpy(raw, static_cast<char*>(o) + ((t * H + h) * V) * 2, sizeof raw, cudaMemcpyDeviceToHost),
                  cudaSuccess);
        for (int64_t j : {int64_t(0), V - 1}) {
          const uint32_t bits = uint32_t(raw[j]) << 16;
          float value;
          std::memcpy(&value, &bits, 4);
          EXPECT_NEAR(value, expected, 2e-2 * expected) << "t=" << t << " h=" << h << " column " << j;
        }
      }
    }
  }
  cudaFree(q), cudaFree(g), cudaFree(o);
}
#endif

TEST(CudaGlaForward, TooSmallWorkspaceAndFloat64AreErrors) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.B = 1, c.H = 1, c.T = 2000, c.dtype = DType::bf16, c.seed = 1100;
  const Inputs in = to_device(c, make_inputs(c), gpu());
  Buffer o(c.dtype, {c.B, c.T, c.H, c.V}, gpu());
  GlaForwardArgs a;
  a.q = in.q.view(), a.k = in.k.view(), a.v = in.v.view(), a.g = in.g.view(), a.o = o.view();
  const size_t bytes = gla_forward_workspace_bytes(a);
  ASSERT_GT(bytes, 0u);  // one head cannot fill the GPU: the sequence is split
  Buffer small(DType::f32, {int64_t(bytes / 8)}, gpu());
  a.workspace = small.view().data, a.workspace_bytes = bytes / 2;
  EXPECT_THROW(gla_forward(a), Error);

  Case f64 = f64_case(c);
  const Inputs in64 = to_device(f64, as_f64(make_inputs(c)), gpu());
  Buffer o64(DType::f64, {c.B, c.T, c.H, c.V}, gpu());
  GlaForwardArgs b;
  b.q = in64.q.view(), b.k = in64.k.view(), b.v = in64.v.view(), b.o = o64.view();
  EXPECT_THROW(gla_forward(b), Error);
}

// Left without a workspace, the forward asks the caller's allocator once, after planning, for what
// gla_forward_workspace_bytes reports; the split in the args' tuning is the one planned for.
TEST(CudaGlaForward, WorkspaceAllocatorIsAskedOnce) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.B = 1, c.H = 1, c.T = 2000, c.dtype = DType::bf16, c.seed = 1120;
  c.h0 = false;  // the call below passes no initial state, so neither may the reference
  const Inputs host = make_inputs(c);
  const Inputs in = to_device(c, host, gpu());
  const Outputs ref = forward_reference(c, host);
  for (int64_t splits : {0, 3}) {
    SCOPED_TRACE("splits " + std::to_string(splits));
    Buffer o = poisoned_on(gpu(), c.dtype, {c.B, c.T, c.H, c.V}, 0);
    GlaForwardArgs a;
    a.q = in.q.view(), a.k = in.k.view(), a.v = in.v.view(), a.g = in.g.view(), a.o = o.view();
    a.tuning.hopper = GlaTuning::Force::off;
    a.tuning.splits = splits;
    const size_t bytes = gla_forward_workspace_bytes(a);
    ASSERT_GT(bytes, 0u);  // one head cannot fill the GPU: the sequence is split
    std::vector<size_t> asked;
    Buffer scratch;
    a.allocate_workspace = [&](size_t n) {
      asked.push_back(n);
      scratch = Buffer(DType::f32, {int64_t((n + 3) / 4)}, gpu());
      return scratch.view().data;
    };
    gla_forward(a);
    synchronize(gpu());
    ASSERT_EQ(asked.size(), 1u);
    EXPECT_EQ(asked[0], bytes);
    expect_close("o", o.values(), ref.o, tolerance(c.dtype));

    // An allocator that gives no memory is an error naming it, before anything is launched.
    a.allocate_workspace = [](size_t) -> void* { return nullptr; };
    try {
      gla_forward(a);
      FAIL() << "expected an error";
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "allocate_workspace");
    }
  }
}

// ---- decode -----------------------------------------------------------------------

struct DecodeCase {
  int64_t N = 3, H = 2, K = 64, V = 64;
  DType dtype = DType::bf16;
  Gate gate = Gate::vector;
  int64_t padding = 0;
  uint64_t seed = 1;
};

// One decode step on `device`: returns o and the updated state.
Outputs decode(const DecodeCase& d, const Buffer& q, const Buffer& k, const Buffer& v, const Buffer& g,
               const Buffer& state0, Device device, DType out_dtype) {
  const int64_t padding = device.type == DeviceType::cpu ? 0 : d.padding;
  Buffer state = state0.to(device, padding);
  Buffer o = poisoned_on(device, out_dtype, {d.N, d.H, d.V}, padding);
  const Buffer qd = q.cast(out_dtype).to(device, padding), kd = k.cast(out_dtype).to(device, padding);
  const Buffer vd = v.cast(out_dtype).to(device, padding);
  const Buffer gd = g.defined() ? g.cast(out_dtype == DType::f64 ? DType::f64 : g.dtype()).to(device, padding) : Buffer();
  GlaDecodeArgs a;
  a.q = qd.view(), a.k = kd.view(), a.v = vd.view(), a.g = gd.view(), a.state = state.view(), a.o = o.view();
  gla_decode(a);
  synchronize(device);
  return {o.values(), state.values()};
}

TEST(CudaGlaDecode, MatchesCpuDecodeAndRecurrent) {
  SKIP_WITHOUT_GPU();
  int i = 0;
  for (DType dtype : {DType::f32, DType::bf16, DType::f16})
    for (Gate gate : {Gate::vector, Gate::scalar, Gate::none}) {
      DecodeCase d;
      d.dtype = dtype, d.gate = gate, d.seed = 1200 + i;
      d.K = i % 2 ? 128 : 100, d.V = i % 2 ? 128 : 36, d.N = 3 + i % 3, d.padding = i % 3 == 0 ? 4 : 0;
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " K" + std::to_string(d.K) + " V" + std::to_string(d.V) +
                   (gate == Gate::none ? " no-gate" : gate == Gate::scalar ? " scalar-gate" : " vector-gate") +
                   (d.padding ? " strided" : ""));
      ++i;
      std::mt19937_64 rng(d.seed);
      Buffer q(dtype, {d.N, d.H, d.K}), k(dtype, {d.N, d.H, d.K}), v(dtype, {d.N, d.H, d.V});
      q.fill_normal(rng), k.fill_normal(rng), v.fill_normal(rng);
      Buffer g;
      if (gate != Gate::none) {
        g = gate == Gate::vector ? Buffer(dtype, {d.N, d.H, d.K}) : Buffer(dtype, {d.N, d.H});
        std::vector<double> values(size_t(g.numel()));
        std::normal_distribution<double> normal;
        for (double& x : values) x = logsigmoid(normal(rng));
        g.set_values(values);
      }
      Buffer state(DType::f32, {d.N, d.H, d.K, d.V});
      state.fill_normal(rng);

      const Outputs ref = decode(d, q, k, v, g, state, Device{}, DType::f64);
      const Outputs out = decode(d, q, k, v, g, state, gpu(), dtype);
      expect_close("o", out.o, ref.o, tolerance(dtype));
      expect_close("state", out.ht, ref.ht, 1e-5);

      // The same step through the recurrent kernel (T = 1, h0 = state).
      Case c;
      c.B = d.N, c.T = 1, c.H = d.H, c.K = d.K, c.V = d.V, c.dtype = dtype, c.gate_dtype = dtype;
      c.gate = gate;
      Inputs in;
      auto with_token_dim = [](const Buffer& b, std::vector<int64_t> shape) {
        if (!b.defined()) return Buffer();
        Buffer out(b.dtype(), shape);
        out.set_values(b.values());
        return out;
      };
      in.q = with_token_dim(q, {d.N, 1, d.H, d.K}), in.k = with_token_dim(k, {d.N, 1, d.H, d.K});
      in.v = with_token_dim(v, {d.N, 1, d.H, d.V});
      in.g = gate == Gate::vector ? with_token_dim(g, {d.N, 1, d.H, d.K})
                                  : gate == Gate::scalar ? with_token_dim(g, {d.N, 1, d.H}) : Buffer();
      in.h0 = state;
      ForwardCall recurrent;
      recurrent.algorithm = kRecurrent;
      const Outputs step = run_forward(c, to_device(c, in, gpu()), recurrent);
      expect_close("o vs recurrent", out.o, step.o, tolerance(dtype));
      expect_close("state vs recurrent", out.ht, step.ht, 1e-6);
    }
}

// ---- small cases of every path, for compute-sanitizer (memcheck, racecheck) ----

// cu_seqlens on the device is not checked on the host: bad values are clamped
// to [0, T] and never send an access out of bounds.
TEST(CudaGlaForward, SanitizerBadCuSeqlensStayInBounds) {
  SKIP_WITHOUT_GPU();
  for (GlaAlgorithm algorithm : {kChunked, kRecurrent}) {
    Case c = varlen_case(DType::bf16, Gate::vector, 1300);
    Inputs in = to_device(c, make_inputs(c), gpu());
    Buffer bad(DType::i64, {6});
    bad.set_values({0, 500, 3, -7, 100000, 329});
    in.cu_seqlens = bad.to(gpu());
    ForwardCall call;
    call.algorithm = algorithm;
    EXPECT_NO_THROW(run_forward(c, in, call));
  }
}

TEST(CudaGlaForward, SanitizerSmallCases) {
  SKIP_WITHOUT_GPU();
  int i = 0;
  for (DType dtype : {DType::f32, DType::bf16})
    for (GlaAlgorithm algorithm : {kChunked, kRecurrent}) {
      Case c;
      c.B = 1, c.T = 150, c.H = 1, c.K = 80, c.V = 72, c.dtype = dtype, c.row_padding = i % 2 ? 8 : 3;
      c.gate = Gate(i % 3), c.seed = 1400 + i++;
      ForwardCall call;
      call.algorithm = algorithm;
      check_against_reference(c, call);
      check_against_reference(varlen_case(dtype, Gate::scalar, 1410 + i), call);
    }
}

// The fast path's small cases (memcheck and racecheck): one tile size each,
// a partial last chunk, a split, a scalar gate, an fp32 gate.
TEST(CudaGlaForward, SanitizerFastPath) {
  SKIP_WITHOUT_GPU();
  const ScopedTuning no_hopper(hopper_off);
  const ScopedTuning splits([](GlaTuning& t) { t.splits = 2; });
  int i = 0;
  for (int64_t K : {64, 128}) {
    Case c;
    c.B = 1, c.T = 150, c.H = 1, c.K = K, c.V = K == 64 ? 136 : 48, c.dtype = DType::bf16, c.gate_dtype = c.dtype;
    c.gate = i % 2 ? Gate::scalar : Gate::vector, c.seed = 1600 + i++;
    check_against_reference(c, ForwardCall{});
  }
  // K = V = 64, where the scalar-gate kernel runs two blocks per SM in less shared memory; a scalar gate and none.
  for (Gate gate : {Gate::scalar, Gate::none}) {
    Case c;
    c.B = 2, c.T = 150, c.H = 1, c.K = 64, c.V = 64, c.dtype = DType::bf16, c.gate_dtype = c.dtype;
    c.gate = gate, c.h0 = true, c.final_state = true, c.seed = 1600 + i++;
    check_against_reference(c, ForwardCall{});
  }
  // An fp32 gate (in the operand area), with a split.
  for (int64_t K : {128, 64}) {
    Case c;
    c.B = 1, c.T = 150, c.H = 1, c.K = K, c.V = 72, c.dtype = DType::bf16, c.gate_dtype = DType::f32;
    c.gate = Gate::vector, c.h0 = true, c.final_state = true, c.seed = 1600 + i++;
    check_against_reference(c, ForwardCall{});
  }
}

// The Hopper path's small cases (memcheck and racecheck): both key pads, a
// partial last chunk, a split (key pad 256), varlen.
TEST(CudaGlaForward, SanitizerHopperPath) {
  SKIP_WITHOUT_GPU();
  const ScopedTuning hopper(hopper_on);
  int i = 0;
  for (int64_t K : {64, 256}) {
    Case c;
    c.B = 1, c.T = 150, c.H = 1, c.K = K, c.V = 72, c.dtype = DType::bf16, c.gate_dtype = DType::f32;
    c.gate = i % 2 ? Gate::scalar : Gate::vector, c.h0 = true, c.final_state = true, c.seed = 2300 + i++;
    const ScopedTuning splits([](GlaTuning& t) { t.splits = 2; });
    check_against_reference(c, ForwardCall{});
  }
  check_against_reference(varlen_case(DType::bf16, Gate::vector, 2310), ForwardCall{});
}

}  // namespace
}  // namespace flashgla::testing::gla_test
