// CUDA GLA backward (chunked and recurrent) against the CPU fp64 recurrent
// reference on the same rounded inputs: every gradient (dq, dk, dv, dg, dh0),
// every gate kind and gate range, fp32/bf16/fp16, varlen with empty and
// length-1 sequences, strided tensors, state gradients chained across calls,
// long sequences with strongly decaying gates, caller workspace and streams.
// Outputs are poisoned (NaN) before every call. Skipped without a GPU.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include "flashgla/flashgla.h"
#include "gla_cuda_test_util.h"

#ifdef FLASHGLA_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace flashgla::testing::gla_test {
namespace {

double tolerance(DType dtype) { return dtype == DType::f32 ? 1e-5 : 1e-2; }

std::string describe(const Case& c) {
  std::string s = describe_shape_and_gate(c) + " dg:" + dtype_name(c.dg_dtype);
  s += c.h0 ? " h0" : "";
  s += c.dht ? " dht" : "";
  s += c.row_padding ? " strided" : "";
  s += c.cu_seqlens.empty() ? "" : " varlen";
  return s;
}

struct Call {
  GlaAlgorithm algorithm = kChunked;
  bool reverse = false;
  void* stream = nullptr;
  bool caller_workspace = false;
  const Buffer* cu_seqlens_host = nullptr;
};

// One backward call on the inputs' device; dh0 is always asked for. `c`'s
// dtype fields name the output dtypes (f64 for the reference).
Grads backward(const Case& c, const Inputs& in, const Call& call) {
  const Device device = in.q.device();
  Buffer dq = poisoned_on(device, c.dtype, {c.B, c.T, c.H, c.K}, c.row_padding);
  Buffer dk = poisoned_on(device, c.dtype, {c.B, c.T, c.H, c.K}, c.row_padding);
  Buffer dv = poisoned_on(device, c.dtype, {c.B, c.T, c.H, c.V}, c.row_padding);
  Buffer dg;
  if (in.g.defined()) dg = poisoned_on(device, c.dg_dtype, in.g.shape(), c.row_padding);
  Buffer dh0 = poisoned_on(device, DType::f32, {c.num_seqs(), c.H, c.K, c.V}, c.row_padding);
  GlaBackwardArgs a;
  a.q = in.q.view(), a.k = in.k.view(), a.v = in.v.view(), a.g = in.g.view();
  a.initial_state = in.h0.view(), a.cu_seqlens = in.cu_seqlens.view();
  if (call.cu_seqlens_host) a.cu_seqlens_host = call.cu_seqlens_host->view();
  a.algorithm = call.algorithm, a.reverse = call.reverse;
  a.d_o = in.d_o.view(), a.d_final_state = in.dht.view();
  a.dq = dq.view(), a.dk = dk.view(), a.dv = dv.view(), a.dg = dg.view(), a.d_initial_state = dh0.view();
  a.stream = call.stream;
  a.tuning = test_gla_tuning();
  Buffer workspace;
  if (call.caller_workspace) workspace = give_workspace(a, gla_backward_workspace_bytes(a), device);
  gla_backward(a);
  synchronize(device);
  return {dq.values(), dk.values(), dv.values(), dg.values(), dh0.values()};
}

// The fp64 recurrent reference on the CPU, same values.
Grads reference(const Case& c, const Inputs& in, bool reverse) {
  Case r = f64_case(c);
  r.row_padding = 0;
  Call call;
  call.algorithm = kRecurrent;
  call.reverse = reverse;
  return backward(r, as_f64(in), call);
}

void expect_grads_close(const Grads& out, const Grads& ref, double tol) {
  expect_close("dq", out.dq, ref.dq, tol);
  expect_close("dk", out.dk, ref.dk, tol);
  expect_close("dv", out.dv, ref.dv, tol);
  expect_close("dg", out.dg, ref.dg, tol);
  expect_close("dh0", out.dh0, ref.dh0, tol);
}

// The backend paths forced by the environment or a scoped setting, for the error lines.
std::string forced_paths() {
  std::string out;
  for (const char* name : {"FLASHGLA_GLA_BWD_DIAG", "FLASHGLA_GLA_BWD_SCAN_SPLIT", "FLASHGLA_GLA_BWD_OVERLAP",
                           "FLASHGLA_GLA_BWD_LAYOUT", "FLASHGLA_GLA_BWD_SCAN_PAIR",
                           "FLASHGLA_GLA_BWD_SCAN_PIPELINE"}) {
    if (const char* value = switch_value(name)) out += std::string(" ") + (name + 17) + "=" + value;
  }
  return out;
}

void check_against_reference(const Case& c, const Call& call, const Inputs& in) {
  const std::string name = describe(c) + (call.algorithm == kChunked ? " chunked" : " recurrent") +
                           (call.reverse ? " reverse" : "") + forced_paths();
  SCOPED_TRACE(name);
  const Grads ref = reference(c, in, call.reverse);
  const Grads out = backward(c, to_device(c, in, gpu()), call);
  expect_grads_close(out, ref, tolerance(c.dtype));
  auto error = [](const std::vector<double>& x, const std::vector<double>& r) {
    return x.empty() ? 0.0 : rel_rms_error(x, r);
  };
  std::printf("[ errors   ] %-90s dq %.2e dk %.2e dv %.2e dg %.2e dh0 %.2e\n", name.c_str(), error(out.dq, ref.dq),
              error(out.dk, ref.dk), error(out.dv, ref.dv), error(out.dg, ref.dg), error(out.dh0, ref.dh0));
}

void check_against_reference(const Case& c, const Call& call) { check_against_reference(c, call, make_inputs(c)); }

// A grid that visits every T, head-dim pair and dtype, rotating gate kind,
// gate range, gate / dg dtypes, h0 / dht and strides through the cases.
std::vector<Case> grid(bool large) {
  struct Dims {
    int64_t K, V;
  };
  const std::vector<int64_t> lengths = large ? std::vector<int64_t>{1, 15, 63, 64, 65, 200, 1000}
                                             : std::vector<int64_t>{1, 15, 64, 65, 200};
  const std::vector<Dims> dims = {{16, 16}, {32, 64}, {64, 32}, {100, 100}, {128, 128}, {64, 64}};
  const DType dtypes[] = {DType::f32, DType::bf16, DType::f16};
  std::vector<Case> cases;
  int i = 0;
  for (DType dtype : dtypes)
    for (int64_t T : lengths)
      for (const Dims& d : dims) {
        Case c;
        c.B = T <= 200 ? 2 : 1, c.T = T, c.H = 2, c.K = d.K, c.V = d.V;
        c.dtype = dtype;
        c.gate = Gate(i % 3);
        c.gate_values = GateValues(i / 3 % 3);
        c.gate_dtype = i % 2 ? dtype : DType::f32;
        c.dg_dtype = i / 2 % 2 ? c.gate_dtype : DType::f32;
        // Gates of −20 per step give gradients near e^-20: below what fp16 can hold.
        if (c.gate_values == GateValues::very_negative && c.dg_dtype == DType::f16) c.dg_dtype = DType::f32;
        c.h0 = i % 4 != 1, c.dht = i % 4 != 2;
        c.row_padding = i % 5 == 0 ? 3 : 0;
        c.seed = 1000 + i;
        cases.push_back(c);
        ++i;
      }
  return cases;
}

TEST(CudaGlaBackward, ChunkedMatchesReference) {
  SKIP_WITHOUT_GPU();
  for (const Case& c : grid(true)) check_against_reference(c, Call{});
}

// By default A's pairs inside a sub-chunk go through the products where its
// gates span little, else element by element (gla_bwd_chunk.cu); each path
// forced on every kind of input (FLASHGLA_GLA_BWD_DIAG=factored: the default,
// =elementwise: never through the products).
TEST(CudaGlaBackward, ChunkedFactoredSubChunksMatchReference) {
  SKIP_WITHOUT_GPU();
  const ScopedSetting factored("FLASHGLA_GLA_BWD_DIAG", "factored");
  for (const Case& c : grid(false)) check_against_reference(c, Call{});
}

TEST(CudaGlaBackward, ChunkedElementwiseSubChunksMatchReference) {
  SKIP_WITHOUT_GPU();
  const ScopedSetting elementwise("FLASHGLA_GLA_BWD_DIAG", "elementwise");
  for (const Case& c : grid(false)) check_against_reference(c, Call{});
}

// Both paths in one call (=factored, the default): sub-chunks 1, 4, 7, ...
// have gates of about −20 per step in the first 32 key columns (element by
// element in key tile 0, through the products in key tile 1), the others
// typical gates.
TEST(CudaGlaBackward, ChunkedMixedSubChunkPaths) {
  SKIP_WITHOUT_GPU();
  const ScopedSetting factored("FLASHGLA_GLA_BWD_DIAG", "factored");
  int i = 0;
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    Case c;
    c.B = 2, c.T = 200, c.H = 2, c.K = 128, c.V = 64, c.dtype = dtype, c.gate_dtype = DType::f32;
    c.seed = 2200 + i++;
    Inputs in = make_inputs(c);
    std::vector<double> g = in.g.values();
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t t = 0; t < c.T; ++t)
        for (int64_t h = 0; h < c.H; ++h)
          for (int64_t k = 0; k < 32; ++k)
            if (t / 16 % 3 == 1) g[size_t(((b * c.T + t) * c.H + h) * c.K + k)] = -20.0;
    in.g.set_values(g);
    check_against_reference(c, Call{}, in);
  }
}

// The small grid with the switch `name` set to each of `values`, the state scans
// unsplit and split in pieces of 3 chunks.
void check_grid_with_scan_splits(const char* name, std::initializer_list<const char*> values) {
  for (const char* value : values) {
    const ScopedSetting setting(name, value);
    for (const char* chunks_per_split : {"0", "3"}) {
      const ScopedSetting split("FLASHGLA_GLA_BWD_SCAN_SPLIT", chunks_per_split);
      for (const Case& c : grid(false)) check_against_reference(c, Call{});
    }
  }
}

// By default bf16 inputs in whole aligned rows run the chunk kernel's plain
// instantiation (the grid's other cases, fp16 or odd sizes, the general one);
// FLASHGLA_GLA_BWD_LAYOUT=general forces the general one everywhere.
TEST(CudaGlaBackward, ChunkedGeneralLayoutMatchesReference) {
  SKIP_WITHOUT_GPU();
  const ScopedSetting general("FLASHGLA_GLA_BWD_LAYOUT", "general");
  for (const Case& c : grid(false)) check_against_reference(c, Call{});
}

// On sm_90 the chunk kernel overlaps the state scans (programmatic dependent
// launch) by default when they are not split; FLASHGLA_GLA_BWD_OVERLAP=0 turns
// that off, =1 also overlaps the fold of split scans.
TEST(CudaGlaBackward, ChunkedOverlapOnAndOffMatchReference) {
  SKIP_WITHOUT_GPU();
  check_grid_with_scan_splits("FLASHGLA_GLA_BWD_OVERLAP", {"0", "1"});
}

// FLASHGLA_GLA_BWD_SCAN_SPLIT=N: the state scans split every sequence into
// pieces of N chunks, folded afterwards (gla_bwd_states.cu); by default only
// when few (sequence, head, tile) blocks would run, e.g. T = 1000 here.
TEST(CudaGlaBackward, ChunkedSplitScansMatchReference) {
  SKIP_WITHOUT_GPU();
  for (const char* chunks_per_split : {"1", "3"}) {
    const ScopedSetting split("FLASHGLA_GLA_BWD_SCAN_SPLIT", chunks_per_split);
    SCOPED_TRACE(std::string("chunks per split ") + chunks_per_split);
    for (const Case& c : grid(false)) check_against_reference(c, Call{});
  }
}

// By default a state-scan block covers two value tiles where V / 64 is even;
// FLASHGLA_GLA_BWD_SCAN_PAIR=0 gives each 64x64 tile its own block. Both, also
// with the scans split.
TEST(CudaGlaBackward, ChunkedScanPairsOnAndOffMatchReference) {
  SKIP_WITHOUT_GPU();
  check_grid_with_scan_splits("FLASHGLA_GLA_BWD_SCAN_PAIR", {"0", "1"});
}

TEST(CudaGlaBackward, ChunkedLargeHeadDims) {
  SKIP_WITHOUT_GPU();
  int i = 0;
  for (DType dtype : {DType::f32, DType::bf16, DType::f16})
    for (int64_t T : {65, 200}) {
      Case c;
      c.B = 1, c.T = T, c.H = 2, c.K = 256, c.V = 512, c.dtype = dtype;
      c.gate = i % 2 ? Gate::scalar : Gate::vector;
      c.seed = 2000 + i++;
      check_against_reference(c, Call{});
    }
}

TEST(CudaGlaBackward, ChunkedHeadDimsUpTo512) {
  SKIP_WITHOUT_GPU();
  int i = 0;
  for (DType dtype : {DType::f32, DType::bf16})
    for (int64_t K : {20, 48, 512}) {
      Case c;
      c.B = 1, c.T = 130, c.H = 1, c.K = K, c.V = K == 512 ? 40 : 512, c.dtype = dtype;
      c.seed = 2100 + i++;
      check_against_reference(c, Call{});
    }
}

TEST(CudaGlaBackward, RecurrentMatchesReference) {
  SKIP_WITHOUT_GPU();
  int i = 0;
  for (const Case& c : grid(false)) {
    if (i++ % 2) continue;  // half the grid: the recurrent kernels have no sub-chunk paths to cover
    Call call;
    call.algorithm = kRecurrent;
    call.reverse = i % 4 == 1;
    check_against_reference(c, call);
  }
}

// dg through h0 and dht with strongly decaying gates: tiny gradients that a
// closed form must not compute as a difference of large terms.
TEST(CudaGlaBackward, RecurrentVeryNegativeGatesWithStates) {
  SKIP_WITHOUT_GPU();
  int i = 0;
  for (DType dtype : {DType::f32, DType::bf16})
    for (Gate gate : {Gate::vector, Gate::scalar})
      for (bool reverse : {false, true}) {
        Case c;
        c.B = 2, c.T = 70, c.H = 2, c.K = 40, c.V = 36, c.dtype = dtype, c.gate = gate;
        c.gate_values = GateValues::very_negative, c.seed = 2300 + i++;
        Call call;
        call.algorithm = kRecurrent, call.reverse = reverse;
        check_against_reference(c, call);
      }
}

TEST(CudaGlaBackward, RecurrentLargeHeadDims) {
  SKIP_WITHOUT_GPU();
  for (bool reverse : {false, true}) {
    Case c;
    c.B = 1, c.T = 65, c.H = 2, c.K = 256, c.V = 512, c.dtype = DType::bf16, c.seed = 2200 + reverse;
    Call call;
    call.algorithm = kRecurrent, call.reverse = reverse;
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

TEST(CudaGlaBackward, VarlenMatchesReference) {
  SKIP_WITHOUT_GPU();
  int i = 0;
  for (DType dtype : {DType::f32, DType::bf16})
    for (Gate gate : {Gate::vector, Gate::scalar})
      for (GlaAlgorithm algorithm : {kChunked, kRecurrent}) {
        Call call;
        call.algorithm = algorithm;
        call.reverse = algorithm == kRecurrent && i % 2;
        check_against_reference(varlen_case(dtype, gate, 3000 + i++), call);
      }
}

// Varlen with the state scans split (FLASHGLA_GLA_BWD_SCAN_SPLIT=N, pieces counted from T where the lengths are
// only on the device): every sequence is cut at the same places, so the short and the empty ones end in empty
// pieces, which the fold must pass through (dht reaching the last real piece, dh0 of an empty sequence). fp16
// too (its scaled dS).
TEST(CudaGlaBackward, VarlenSplitScansMatchReference) {
  SKIP_WITHOUT_GPU();
  int i = 0;
  for (const char* chunks_per_split : {"1", "2", "3"}) {
    const ScopedSetting split("FLASHGLA_GLA_BWD_SCAN_SPLIT", chunks_per_split);
    SCOPED_TRACE(std::string("chunks per split ") + chunks_per_split);
    for (DType dtype : {DType::f32, DType::bf16, DType::f16})
      for (Gate gate : {Gate::vector, Gate::scalar, Gate::none}) {
        Case c = varlen_case(dtype, gate, 3100 + i);
        if (i % 2) c.K = c.V = 128;  // the paired and pipelined scans
        c.h0 = i % 3 != 1, c.dht = i % 3 != 2;
        ++i;
        check_against_reference(c, Call{});
      }
  }
}

// Varlen with the boundaries only on the device and a sequence long enough for the planner to split the state
// scans: it reads the boundaries back and plans as with a host copy, so the two calls agree bit for bit (and the
// unsplit scans, forced, do not: the check can tell the plans apart by dk, which the split dh scan feeds).
TEST(CudaGlaBackward, VarlenDeviceBoundariesAreReadBackForTheSplit) {
  SKIP_WITHOUT_GPU();
  int i = 0;
  for (DType dtype : {DType::bf16, DType::f32}) {
    Case c;
    c.cu_seqlens = {0, 3, 3 + 65536 + 11, 3 + 65536 + 11 + 200};  // past kReadBackTokens (gla_host.cuh)
    c.B = 1, c.T = c.cu_seqlens.back(), c.H = 1, c.K = 64, c.V = 64, c.dtype = dtype, c.gate = Gate::vector;
    c.seed = 3200 + i++;
    SCOPED_TRACE(describe(c));
    const Inputs host_inputs = make_inputs(c);
    const Inputs in = to_device(c, host_inputs, gpu());
    const Buffer host = host_inputs.cu_seqlens;
    Call with_host;
    with_host.cu_seqlens_host = &host;
    const Grads device_only = backward(c, in, Call{});
    const Grads given = backward(c, in, with_host);
    expect_grads_close(device_only, reference(c, host_inputs, false), tolerance(dtype));
    EXPECT_EQ(device_only.dq, given.dq);
    EXPECT_EQ(device_only.dk, given.dk);
    EXPECT_EQ(device_only.dv, given.dv);
    EXPECT_EQ(device_only.dg, given.dg);
    EXPECT_EQ(device_only.dh0, given.dh0);
    const ScopedSetting unsplit("FLASHGLA_GLA_BWD_SCAN_SPLIT", "0");
    EXPECT_NE(backward(c, in, with_host).dk, given.dk);
  }
}

// The paired state scans with x, y and the gate copied one chunk ahead (the
// default for bf16 rows, K and V multiples of 64, V / 64 even), without
// (FLASHGLA_GLA_BWD_SCAN_PIPELINE=0) and with (=lean, the default): every gate kind and range, sequences of 1 to
// 16 chunks (both buffers, odd and even counts), unsplit and split in pieces of
// 3 chunks, fixed length and varlen.
TEST(CudaGlaBackward, ChunkedScanPipelineOnAndOffMatchReference) {
  SKIP_WITHOUT_GPU();
  struct Dims {
    int64_t K, V;
  };
  for (const char* pipeline : {"0", "lean"}) {
    const ScopedSetting pipeline_mode("FLASHGLA_GLA_BWD_SCAN_PIPELINE", pipeline);
    int i = 0;
    for (const char* chunks_per_split : {"0", "3"}) {
      const ScopedSetting split("FLASHGLA_GLA_BWD_SCAN_SPLIT", chunks_per_split);
      for (int64_t T : {1, 64, 65, 200, 1000})
        for (const Dims& d : {Dims{128, 128}, Dims{64, 256}, Dims{256, 128}}) {
          Case c;
          c.B = T <= 200 ? 2 : 1, c.T = T, c.H = 2, c.K = d.K, c.V = d.V, c.dtype = DType::bf16;
          c.gate = Gate(i % 3);
          c.gate_values = GateValues(i / 3 % 3);
          c.gate_dtype = c.dg_dtype = DType::bf16;
          c.h0 = i % 4 != 1, c.dht = i % 4 != 2;
          c.seed = 9000 + i++;
          check_against_reference(c, Call{});
        }
    }
    for (Gate gate : {Gate::vector, Gate::scalar, Gate::none}) {
      Case c = varlen_case(DType::bf16, gate, 9100 + i++);
      c.K = c.V = 128, c.gate_dtype = c.dg_dtype = DType::bf16;
      check_against_reference(c, Call{});
    }
  }
}

// The plain instantiation on every kind of input it takes: bf16 in whole rows
// (K, V multiples of 64), a vector gate and its dg in bf16 or fp32, any gate
// kind and range, fixed length and varlen, with and without h0 / dht.
TEST(CudaGlaBackward, ChunkedPlainLayoutMatchesReference) {
  SKIP_WITHOUT_GPU();
  struct Dims {
    int64_t K, V;
  };
  int i = 0;
  for (int64_t T : {1, 63, 64, 65, 200, 1000})
    for (const Dims& d : {Dims{64, 64}, Dims{128, 128}, Dims{64, 192}, Dims{256, 128}}) {
      Case c;
      c.B = T <= 200 ? 2 : 1, c.T = T, c.H = 2, c.K = d.K, c.V = d.V, c.dtype = DType::bf16;
      c.gate = Gate(i % 3);
      c.gate_values = GateValues(i / 3 % 3);
      c.gate_dtype = c.dg_dtype = DType::bf16;  // dg takes f32 or g's dtype; the plain kernel bf16
      c.h0 = i % 4 != 1, c.dht = i % 4 != 2;
      c.seed = 5000 + i++;
      check_against_reference(c, Call{});
    }
  for (Gate gate : {Gate::vector, Gate::scalar, Gate::none}) {
    Case c = varlen_case(DType::bf16, gate, 5100 + i++);
    c.V = 64, c.gate_dtype = c.dg_dtype = DType::bf16;
    check_against_reference(c, Call{});
  }
  // A scalar gate in fp32 (FLA's simple GLA gate, and the g_gamma gate): the plain kernel's fp32 loader and its
  // Γ kept over the key tiles; with V = 128, the pipelined scans' asynchronous copies of the gate.
  for (int64_t T : {1, 65, 1000})
    for (GateValues values : {GateValues(0), GateValues(1), GateValues(2)})
      for (int64_t V : {64, 128}) {
        Case c;
        c.B = T <= 200 ? 2 : 1, c.T = T, c.H = 2, c.K = 128, c.V = V, c.dtype = DType::bf16;
        c.gate = Gate::scalar, c.gate_values = values, c.gate_dtype = c.dg_dtype = DType::f32;
        c.h0 = c.dht = T > 1, c.seed = 5200 + i++;
        check_against_reference(c, Call{});
      }
  for (int64_t V : {48, 128}) {  // 48: the general kernel
    Case c = varlen_case(DType::bf16, Gate::scalar, 5300 + i++);
    c.V = V, c.gate_dtype = c.dg_dtype = DType::f32;
    check_against_reference(c, Call{});
  }
  // A vector gate in fp32 rows (copied raw like bf16's) with its dg in fp32, and a bf16 gate with an fp32 dg:
  // the plain kernel's fp32 gate copies and dg stores, beside the pipelined scans' register loads of the gate.
  for (int64_t T : {1, 65, 1000})
    for (GateValues values : {GateValues(0), GateValues(1), GateValues(2)})
      for (DType gate_dtype : {DType::f32, DType::bf16}) {
        Case v;
        v.B = T <= 200 ? 2 : 1, v.T = T, v.H = 2, v.K = 128, v.V = 128, v.dtype = DType::bf16;
        v.gate = Gate::vector, v.gate_values = values, v.gate_dtype = gate_dtype, v.dg_dtype = DType::f32;
        v.h0 = v.dht = T > 1, v.seed = 5400 + i++;
        check_against_reference(v, Call{});
      }
  Case v = varlen_case(DType::bf16, Gate::vector, 5500 + i++);
  v.K = v.V = 128, v.gate_dtype = v.dg_dtype = DType::f32;
  check_against_reference(v, Call{});
}

TEST(CudaGlaBackward, StridedInputsWithAlignedRows) {
  SKIP_WITHOUT_GPU();  // padding 8 keeps 16-byte rows: the vectorized loads on strided tensors
  Case c;
  c.B = 2, c.T = 130, c.H = 3, c.K = 64, c.V = 64, c.dtype = DType::bf16, c.row_padding = 8, c.seed = 3100;
  check_against_reference(c, Call{});
  c.dtype = DType::f32, c.seed = 3101;
  check_against_reference(c, Call{});
}

// Cuts every [B, T, ...] input at token `cut` along T.
std::pair<Inputs, Inputs> split(const Case& c, const Inputs& in, int64_t cut) {
  auto part = [&](const Buffer& b, int64_t t0, int64_t t1) {
    if (!b.defined()) return Buffer();
    std::vector<int64_t> shape = b.shape();
    const int64_t inner = b.numel() / (shape[0] * shape[1]);
    const std::vector<double> all = b.values();
    std::vector<double> values;
    for (int64_t bi = 0; bi < shape[0]; ++bi)
      values.insert(values.end(), all.begin() + (bi * shape[1] + t0) * inner, all.begin() + (bi * shape[1] + t1) * inner);
    shape[1] = t1 - t0;
    Buffer out(b.dtype(), shape);
    out.set_values(values);
    return out;
  };
  Inputs a, b;
  a.q = part(in.q, 0, cut), a.k = part(in.k, 0, cut), a.v = part(in.v, 0, cut), a.d_o = part(in.d_o, 0, cut);
  a.g = part(in.g, 0, cut);
  b.q = part(in.q, cut, c.T), b.k = part(in.k, cut, c.T), b.v = part(in.v, cut, c.T), b.d_o = part(in.d_o, cut, c.T);
  b.g = part(in.g, cut, c.T);
  return {a, b};
}

// Gradients of one call over [A; B] equal those of a call over B (h0 = the
// state after A) followed by a call over A (dht = B's dh0).
TEST(CudaGlaBackward, StateGradientsChainAcrossCalls) {
  SKIP_WITHOUT_GPU();
  int i = 0;
  for (DType dtype : {DType::f32, DType::bf16})
    for (int64_t cut : {128, 130}) {
      Case c;
      c.B = 2, c.T = 200, c.H = 2, c.K = 32, c.V = 48, c.dtype = dtype, c.seed = 4000 + i++;
      SCOPED_TRACE(describe(c) + " cut at " + std::to_string(cut));
      const Inputs in = make_inputs(c);
      const Grads whole = backward(c, to_device(c, in, gpu()), Call{});

      auto [first, second] = split(c, in, cut);
      Case c1 = c, c2 = c;
      c1.T = cut, c2.T = c.T - cut;
      first.h0 = in.h0;
      Case f = f64_case(c1);
      f.final_state = true;
      const Outputs after_first = run_forward(f, as_f64(first), kRecurrent);
      second.h0 = Buffer(DType::f32, {c.B, c.H, c.K, c.V});
      second.h0.set_values(after_first.ht);
      second.dht = in.dht;
      const Grads g2 = backward(c2, to_device(c2, second, gpu()), Call{});
      first.dht = Buffer(DType::f32, {c.B, c.H, c.K, c.V});
      first.dht.set_values(g2.dh0);
      const Grads g1 = backward(c1, to_device(c1, first, gpu()), Call{});

      // Concatenate along T per batch row.
      auto join = [&](const std::vector<double>& x1, const std::vector<double>& x2, int64_t inner) {
        std::vector<double> out;
        for (int64_t bi = 0; bi < c.B; ++bi) {
          out.insert(out.end(), x1.begin() + bi * c1.T * inner, x1.begin() + (bi + 1) * c1.T * inner);
          out.insert(out.end(), x2.begin() + bi * c2.T * inner, x2.begin() + (bi + 1) * c2.T * inner);
        }
        return out;
      };
      const double tol = tolerance(dtype);
      expect_close("dq", join(g1.dq, g2.dq, c.H * c.K), whole.dq, tol);
      expect_close("dk", join(g1.dk, g2.dk, c.H * c.K), whole.dk, tol);
      expect_close("dv", join(g1.dv, g2.dv, c.H * c.V), whole.dv, tol);
      expect_close("dg", join(g1.dg, g2.dg, c.H * c.K), whole.dg, tol);
      expect_close("dh0", g1.dh0, whole.dh0, tol);
    }
}

TEST(CudaGlaBackward, LongSequenceVeryNegativeGatesStayFinite) {
  SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::bf16, DType::f32})
    for (GlaAlgorithm algorithm : {kChunked, kRecurrent}) {
      if (dtype == DType::f32 && algorithm == kRecurrent) continue;
      Case c;
      c.B = 1, c.T = 65536, c.H = 2, c.K = 64, c.V = 64, c.dtype = dtype;
      c.gate_values = GateValues::very_negative, c.seed = 5000;
      SCOPED_TRACE(describe(c) + (algorithm == kChunked ? " chunked" : " recurrent"));
      Call call;
      call.algorithm = algorithm;
      const Grads out = backward(c, to_device(c, make_inputs(c), gpu()), call);
      EXPECT_TRUE(all_finite(out.dq));
      EXPECT_TRUE(all_finite(out.dk));
      EXPECT_TRUE(all_finite(out.dv));
      EXPECT_TRUE(all_finite(out.dg));
      EXPECT_TRUE(all_finite(out.dh0));
    }
}

#ifdef FLASHGLA_WITH_CUDA
TEST(CudaGlaBackward, CallerWorkspaceAndStream) {
  SKIP_WITHOUT_GPU();
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  int i = 0;
  for (GlaAlgorithm algorithm : {kChunked, kRecurrent}) {
    Case c;
    c.B = 2, c.T = 100, c.H = 2, c.K = 48, c.V = 40, c.dtype = DType::bf16, c.seed = 6000 + i++;
    SCOPED_TRACE(describe(c) + (algorithm == kChunked ? " chunked" : " recurrent"));
    const Inputs in = make_inputs(c);
    const Inputs on_gpu = to_device(c, in, gpu());
    Call call;
    call.algorithm = algorithm, call.stream = stream, call.caller_workspace = true;
    expect_grads_close(backward(c, on_gpu, call), reference(c, in, false), tolerance(c.dtype));
  }
  ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}
#endif

TEST(CudaGlaBackward, TooSmallWorkspaceIsAnError) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.T = 100, c.dtype = DType::bf16;
  const Inputs in = to_device(c, make_inputs(c), gpu());
  Buffer dq(c.dtype, {c.B, c.T, c.H, c.K}, gpu()), dk(c.dtype, {c.B, c.T, c.H, c.K}, gpu());
  Buffer dv(c.dtype, {c.B, c.T, c.H, c.V}, gpu()), dg(DType::f32, in.g.shape(), gpu());
  GlaBackwardArgs a;
  a.q = in.q.view(), a.k = in.k.view(), a.v = in.v.view(), a.g = in.g.view(), a.d_o = in.d_o.view();
  a.dq = dq.view(), a.dk = dk.view(), a.dv = dv.view(), a.dg = dg.view();
  const size_t bytes = gla_backward_workspace_bytes(a);
  ASSERT_GT(bytes, 0u);
  Buffer small(DType::f32, {int64_t(bytes / 8)}, gpu());
  a.workspace = small.view().data, a.workspace_bytes = bytes / 2;
  EXPECT_THROW(gla_backward(a), Error);
}

// The backward's tuning switches name themselves when their value is unknown.
TEST(CudaGlaBackward, UnknownTuningSwitchValueIsAnError) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.T = 100, c.K = 64, c.V = 128, c.dtype = DType::bf16, c.seed = 1160;  // V / 64 even: the scans' switches are read
  const Inputs in = to_device(c, make_inputs(c), gpu());
  struct Setting {
    const char *name, *value;
  };
  for (const Setting& bad : {Setting{"FLASHGLA_GLA_BWD_DIAG", "exact"}, Setting{"FLASHGLA_GLA_BWD_LAYOUT", "plain"},
                             Setting{"FLASHGLA_GLA_BWD_SCAN_PAIR", "no"}, Setting{"FLASHGLA_GLA_BWD_SCAN_PIPELINE", "1"},
                             Setting{"FLASHGLA_GLA_BWD_SCAN_SPLIT", "-1"}})
    expect_unknown_switch_error(bad.name, bad.value, [&] { backward(c, in, Call{}); });
}

// cu_seqlens on the device is not checked on the host: bad values are clamped
// to [0, T] and never send an access out of bounds (compute-sanitizer's
// memcheck runs this one).
TEST(CudaGlaBackward, SanitizerBadCuSeqlensStayInBounds) {
  SKIP_WITHOUT_GPU();
  for (GlaAlgorithm algorithm : {kChunked, kRecurrent}) {
    Case c = varlen_case(DType::bf16, Gate::vector, 7000);
    Inputs in = to_device(c, make_inputs(c), gpu());
    Buffer bad(DType::i64, {6});
    bad.set_values({0, 500, 3, -7, 100000, 329});
    in.cu_seqlens = bad.to(gpu());
    Call call;
    call.algorithm = algorithm;
    EXPECT_NO_THROW(backward(c, in, call));
  }
}

// Small cases of every path, for compute-sanitizer (memcheck, racecheck).
TEST(CudaGlaBackward, SanitizerSmallCases) {
  SKIP_WITHOUT_GPU();
  int i = 0;
  for (DType dtype : {DType::f32, DType::bf16, DType::f16})
    for (GlaAlgorithm algorithm : {kChunked, kRecurrent}) {
      Case c;
      c.B = 1, c.T = 70, c.H = 1, c.K = 80, c.V = 72, c.dtype = dtype;
      c.gate = Gate(i % 3), c.seed = 8000 + i++;
      Call call;
      call.algorithm = algorithm;
      check_against_reference(c, call);
      check_against_reference(varlen_case(dtype, Gate::scalar, 8100 + i), call);
      if (algorithm == kChunked) {  // the state scans split into pieces of one chunk
        const ScopedSetting split("FLASHGLA_GLA_BWD_SCAN_SPLIT", "1");
        check_against_reference(c, call);
      }
      if (algorithm == kChunked) {  // the chunk kernel overlapping the split scans' fold, and bf16 rows of K, V = 64
        const ScopedSetting overlap("FLASHGLA_GLA_BWD_OVERLAP", "1");
        const ScopedSetting split("FLASHGLA_GLA_BWD_SCAN_SPLIT", "1");
        Case plain = c;
        plain.K = plain.V = 64, plain.gate_dtype = plain.dg_dtype = dtype;
        check_against_reference(plain, call);
      }
      if (algorithm == kChunked && dtype == DType::bf16)  // the pipelined paired scans, unsplit and in pieces of 3
        for (const char* pipeline : {"lean"}) {
          const ScopedSetting pipeline_mode("FLASHGLA_GLA_BWD_SCAN_PIPELINE", pipeline);
          Case pipelined = c;
          pipelined.T = 200, pipelined.K = pipelined.V = 128, pipelined.gate = Gate::vector;
          pipelined.gate_dtype = pipelined.dg_dtype = dtype;
          check_against_reference(pipelined, call);
          const ScopedSetting split("FLASHGLA_GLA_BWD_SCAN_SPLIT", "3");
          check_against_reference(pipelined, call);
        }
    }
}


// ---- gates anywhere in [−inf, 0] (GlaCpuEdgeGates of test_gla_cpu.cpp on the GPU) ----

Case edge_case(DType dtype, Gate gate, int64_t K, int64_t V, uint64_t seed) {
  Case c;
  c.B = 2, c.T = 200, c.H = 2, c.K = K, c.V = V, c.gate = gate, c.dtype = dtype, c.seed = seed;
  if (dtype != DType::f32) c.gate_dtype = c.dg_dtype = dtype;  // bf16 gate and dg: the plain layout
  return c;
}

void check_edge_gates(const Case& c, const Call& call, const std::vector<EdgeGates>& sets) {
  for (const EdgeGates& e : sets) {
    SCOPED_TRACE(e.name);
    check_against_reference(c, call, make_edge_inputs(c, e));
  }
}

// −inf once, over a chunk, at chunk boundaries and t = 0; −1e3 … −1e30, alternating.
TEST(CudaGlaBackward, EdgeGatesChunked) {
  SKIP_WITHOUT_GPU();
  struct Shape {
    DType dtype;
    int64_t K, V;
  };
  int i = 0;
  for (const Shape& s : {Shape{DType::bf16, 64, 64}, Shape{DType::bf16, 128, 128}, Shape{DType::f32, 64, 64},
                         Shape{DType::f32, 100, 48}, Shape{DType::bf16, 256, 64}})
    for (Gate gate : {Gate::vector, Gate::scalar})
      check_edge_gates(edge_case(s.dtype, gate, s.K, s.V, 9000 + i++), Call{}, edge_gate_sets());
}

TEST(CudaGlaBackward, EdgeGatesRecurrent) {
  SKIP_WITHOUT_GPU();
  Call call;
  call.algorithm = kRecurrent;
  for (DType dtype : {DType::f32, DType::bf16})
    check_edge_gates(edge_case(dtype, Gate::vector, 64, 64, 9100 + int(dtype)), call, edge_gate_sets());
}

// Every backward switch once, on the sets that broke the old code.
TEST(CudaGlaBackward, EdgeGatesEveryPath) {
  SKIP_WITHOUT_GPU();
  std::vector<EdgeGates> sets;
  for (const EdgeGates& e : edge_gate_sets())
    if (e.name == "neg_inf_half_columns" || e.name == "neg_inf_chunk_boundaries" || e.name == "minus_1e4_alternating" ||
        e.name == "minus_1e30")
      sets.push_back(e);
  struct Setting {
    const char *name, *value;
  };
  const Setting settings[] = {{"FLASHGLA_GLA_BWD_DIAG", "factored"},     {"FLASHGLA_GLA_BWD_DIAG", "elementwise"},
                              {"FLASHGLA_GLA_BWD_LAYOUT", "general"},     {"FLASHGLA_GLA_BWD_SCAN_SPLIT", "1"},
                              {"FLASHGLA_GLA_BWD_OVERLAP", "1"},          {"FLASHGLA_GLA_BWD_SCAN_PIPELINE", "0"},
                              {"FLASHGLA_GLA_BWD_SCAN_PIPELINE", "lean"}, {"FLASHGLA_GLA_BWD_SCAN_PAIR", "0"}};
  for (const Setting& st : settings)
    for (DType dtype : {DType::bf16, DType::f32}) {
      const ScopedSetting setting(st.name, st.value);
      check_edge_gates(edge_case(dtype, Gate::vector, 128, 128, 9200 + int(dtype)), Call{}, sets);
    }
}

TEST(CudaGlaBackward, EdgeGatesVarlen) {
  SKIP_WITHOUT_GPU();
  const double inf = std::numeric_limits<double>::infinity();
  for (DType dtype : {DType::bf16, DType::f32})
    for (GlaAlgorithm algorithm : {kChunked, kRecurrent}) {
      Case c = edge_case(dtype, Gate::vector, 64, 64, 9300 + int(dtype));
      c.B = 1, c.cu_seqlens = {0, 50, 130, 130, 200};
      Call call;
      call.algorithm = algorithm;
      check_edge_gates(c, call,
                       {{"neg_inf_at_starts", {0, 50, 130}, -inf, 1}, {"neg_inf_inside", {60, 64, 65}, -inf, 2}});
    }
}

// Small cases for compute-sanitizer.
TEST(CudaGlaBackward, SanitizerEdgeGates) {
  SKIP_WITHOUT_GPU();
  const double inf = std::numeric_limits<double>::infinity();
  for (DType dtype : {DType::bf16, DType::f32}) {
    Case c = edge_case(dtype, Gate::vector, 64, 64, 9400 + int(dtype));
    c.B = 1, c.T = 130;
    check_edge_gates(c, Call{}, {{"neg_inf_chunk_boundaries", {15, 16, 63, 64, 127, 128}, -inf, 3}});
  }
}

}  // namespace
}  // namespace flashgla::testing::gla_test
