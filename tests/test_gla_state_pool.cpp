// GLA forward with vLLM's state pools (GlaForwardArgs::ssm_state_indices,
// num_accepted_tokens, inplace_final_state; the recurrent algorithm):
// - CPU: [N] rows in place against the pooled prefill (initial_state_indices /
//   final_state_indices) of the same rows, bit for bit; the checks the Python
//   ops never reach (algorithm, final_state with inplace_final_state).
// - CUDA: the same calls as the CPU in fp64 ([N] and [N, T_max] rows, accepted
//   counts, in place or per-token states, state_v_first, varlen, padded slots);
//   rows no token names keep their values exactly, padded slots give zeros, and
//   rows or counts out of range are skipped. Small sizes, so the
//   CudaGlaStatePool.* tests also run under compute-sanitizer. Skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "flashgla/flashgla.h"
#include "gla_cuda_test_util.h"
#include "test_util.h"

namespace flashgla::testing::gla_test {
namespace {

struct PoolCall {
  std::vector<int32_t> rows;      // [N] or [N, cols]
  int64_t cols = 0;               // 0: rows is [N]
  std::vector<int32_t> accepted;  // num_accepted_tokens (empty: none)
  int64_t P = 12;
  bool inplace = true;
  bool v_first = false;
};

struct PoolResult {
  std::vector<double> o, pool, token_states;
};

Buffer random_pool(const Case& c, const PoolCall& call, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Buffer pool(DType::f32, call.v_first ? std::vector<int64_t>{call.P, c.H, c.V, c.K}
                                       : std::vector<int64_t>{call.P, c.H, c.K, c.V});
  pool.fill_normal(rng);
  return pool;
}

Buffer i32(const std::vector<int32_t>& values, std::vector<int64_t> shape, Device device) {
  Buffer b(DType::i32, std::move(shape));
  b.set_values(std::vector<double>(values.begin(), values.end()));
  return b.to(device);
}

// One pool call on `device` with q, k, v (and o) in `dtype`; the per-token states start as zeros.
PoolResult run_pool(const Case& c, const Inputs& in, const Buffer& pool0, const PoolCall& call, Device device,
                    DType dtype) {
  const int64_t N = c.num_seqs();
  const Buffer q = in.q.cast(dtype).to(device, c.row_padding), k = in.k.cast(dtype).to(device, c.row_padding);
  const Buffer v = in.v.cast(dtype).to(device, c.row_padding);
  const Buffer g = on(in.g, device, c.row_padding);  // in its own dtype (f64 in the reference's inputs)
  const Buffer cu = on(in.cu_seqlens, device, 0);
  Buffer pool = pool0.to(device);
  const Buffer rows = i32(call.rows, call.cols ? std::vector<int64_t>{N, call.cols} : std::vector<int64_t>{N}, device);
  const Buffer accepted = call.accepted.empty() ? Buffer() : i32(call.accepted, {N}, device);
  Buffer o = poisoned_on(device, dtype, {c.B, c.T, c.H, c.V}, c.row_padding);
  Buffer states;
  if (!call.inplace) {
    states = Buffer(DType::f32, call.v_first ? std::vector<int64_t>{c.B * c.T, c.H, c.V, c.K}
                                             : std::vector<int64_t>{c.B * c.T, c.H, c.K, c.V}, device);
    states.fill(0.0);
  }
  GlaForwardArgs a;
  a.q = q.view(), a.k = k.view(), a.v = v.view(), a.g = g.view(), a.cu_seqlens = cu.view(), a.o = o.view();
  a.algorithm = GlaAlgorithm::recurrent, a.state_v_first = call.v_first;
  a.initial_state = pool.view(), a.final_state = states.view();
  a.ssm_state_indices = rows.view(), a.num_accepted_tokens = accepted.view(), a.inplace_final_state = call.inplace;
  gla_forward(a);
  synchronize(device);
  return {o.values(), pool.values(), states.values()};
}

// Bit for bit.
void expect_identical(const std::string& what, const std::vector<double>& out, const std::vector<double>& ref) {
  ASSERT_EQ(out.size(), ref.size()) << what;
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < out.size(); ++i)
    if (out[i] != ref[i]) first = bad++ ? first : i;
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " elements differ, the first at " << first;
}

// What holds exactly on every device: rows no (valid) token of a sequence names keep their values,
// padded slots (an invalid start row) have zero outputs.
void expect_pool_semantics(const Case& c, const PoolCall& call, const std::vector<double>& before,
                           const PoolResult& out) {
  const int64_t N = c.num_seqs(), slice = c.H * c.K * c.V, width = call.cols ? call.cols : 1;
  std::vector<int64_t> begin(static_cast<size_t>(N), 0), len(static_cast<size_t>(N), 0);
  for (int64_t n = 0; n < N; ++n) {
    begin[size_t(n)] = c.cu_seqlens.empty() ? n * c.T : c.cu_seqlens[size_t(n)];
    len[size_t(n)] = c.cu_seqlens.empty() ? c.T : c.cu_seqlens[size_t(n) + 1] - c.cu_seqlens[size_t(n)];
  }
  auto start_row = [&](int64_t n) -> int64_t {
    const int64_t first = call.accepted.empty() ? 0 : call.accepted[size_t(n)] - 1;
    if (first < 0 || first >= width) return -1;
    const int64_t row = call.rows[size_t(n * width + first)];
    return row < call.P ? row : -1;
  };
  std::vector<bool> written(size_t(call.P), false);
  for (int64_t n = 0; n < N && call.inplace; ++n) {
    if (start_row(n) < 0 || len[size_t(n)] == 0) continue;
    for (int64_t t = 0; t < (call.cols ? std::min(len[size_t(n)], call.cols) : 1); ++t) {
      const int64_t row = call.rows[size_t(n * width + t)];
      if (row >= 0 && row < call.P) written[size_t(row)] = true;
    }
  }
  for (int64_t r = 0; r < call.P; ++r)
    if (!written[size_t(r)])
      for (int64_t i = 0; i < slice; ++i)
        ASSERT_EQ(out.pool[size_t(r * slice + i)], before[size_t(r * slice + i)]) << "pool row " << r << " changed";
  const int64_t row_o = c.H * c.V;
  for (int64_t n = 0; n < N; ++n)
    if (start_row(n) < 0)
      for (int64_t i = 0; i < len[size_t(n)] * row_o; ++i)
        ASSERT_EQ(out.o[size_t(begin[size_t(n)] * row_o + i)], 0.0) << "padded slot " << n << ": output not zero";
}

Case pool_case(Gate gate, DType dtype, std::vector<int64_t> cu_seqlens, uint64_t seed) {
  Case c;
  c.gate = gate, c.dtype = dtype, c.seed = seed, c.H = 2, c.K = 32, c.V = 24, c.h0 = false, c.dht = false;
  if (cu_seqlens.empty()) {
    c.B = 3, c.T = 4;
  } else {
    c.B = 1, c.T = cu_seqlens.back(), c.cu_seqlens = std::move(cu_seqlens);
  }
  return c;
}

// ---- CPU ----------------------------------------------------------------------------------------------

TEST(GlaCpuStatePool, RowsMatchThePooledPrefill) {
  int i = 0;
  for (Gate gate : {Gate::vector, Gate::scalar, Gate::none})
    for (bool varlen : {false, true}) {
      Case c = pool_case(gate, DType::f32, varlen ? std::vector<int64_t>{0, 3, 3, 8} : std::vector<int64_t>{},
                         700 + i++);
      c.row_padding = varlen ? 2 : 0;
      SCOPED_TRACE(describe_shape_and_gate(c));
      const Inputs in = make_inputs(c);
      PoolCall call;
      call.rows = {5, 0, 9};
      const Buffer pool0 = random_pool(c, call, 750 + i);
      const PoolResult out = run_pool(c, in, pool0, call, Device{}, c.dtype);
      // The reference: the same rows through the gathering prefill path.
      Buffer pool = pool0.to(Device{}), o(c.dtype, {c.B, c.T, c.H, c.V});
      const Buffer rows = i32(call.rows, {c.num_seqs()}, Device{});
      GlaForwardArgs a;
      a.q = in.q.view(), a.k = in.k.view(), a.v = in.v.view(), a.g = in.g.view(), a.cu_seqlens = in.cu_seqlens.view();
      a.algorithm = GlaAlgorithm::recurrent, a.o = o.view();
      a.initial_state = pool.view(), a.final_state = pool.view();
      a.initial_state_indices = rows.view(), a.final_state_indices = rows.view();
      gla_forward(a);
      expect_identical("o", out.o, o.values());
      expect_identical("pool", out.pool, pool.values());
    }
}

TEST(GlaCpuStatePool, ChecksTheCall) {
  const Case c = pool_case(Gate::vector, DType::f32, {}, 790);
  const Inputs in = make_inputs(c);
  PoolCall call;
  call.rows = {0, 1, 2};
  const Buffer pool = random_pool(c, call, 791);
  Buffer o(c.dtype, {c.B, c.T, c.H, c.V}), ht(DType::f32, {c.B * c.T, c.H, c.K, c.V});
  const Buffer rows = i32(call.rows, {3}, Device{});
  GlaForwardArgs a;
  a.q = in.q.view(), a.k = in.k.view(), a.v = in.v.view(), a.g = in.g.view(), a.o = o.view();
  a.initial_state = pool.view(), a.ssm_state_indices = rows.view(), a.inplace_final_state = true;
  expect_error([&] { gla_forward(a); }, ErrorKind::value, "ssm_state_indices", "recurrent");
  a.algorithm = GlaAlgorithm::recurrent;
  a.final_state = ht.view();
  expect_error([&] { gla_forward(a); }, ErrorKind::value, "final_state", "inplace_final_state");
  a.inplace_final_state = false;
  EXPECT_NO_THROW(gla_forward(a));  // the state after every token
  const Buffer one_row_more(DType::f32, {c.B * c.T + 1, c.H, c.K, c.V});
  a.final_state = one_row_more.view();
  expect_error([&] { gla_forward(a); }, ErrorKind::value, "final_state", "[B*T, H, K, V]");
  a.final_state = {}, a.initial_state_indices = rows.view();
  expect_error([&] { gla_forward(a); }, ErrorKind::value, "ssm_state_indices", "initial_state_indices");
  a.initial_state_indices = {}, a.initial_state = {};
  expect_error([&] { gla_forward(a); }, ErrorKind::value, "initial_state", "pool");
}

// ---- CUDA ---------------------------------------------------------------------------------------------

double tolerance(DType dtype) { return dtype == DType::f32 ? 1e-5 : 5e-3; }

void check_cuda_call(const Case& c, const PoolCall& call, uint64_t seed) {
  SCOPED_TRACE(describe_shape_and_gate(c) + (call.cols ? " [N, T_max]" : " [N]") +
               (call.accepted.empty() ? "" : " accepted") + (call.inplace ? " inplace" : " token states") +
               (call.v_first ? " v_first" : ""));
  const Inputs in = make_inputs(c);
  const Buffer pool0 = random_pool(c, call, seed);
  const PoolResult out = run_pool(c, in, pool0, call, gpu(), c.dtype);
  const PoolResult ref = run_pool(c, as_f64(in), pool0, call, Device{}, DType::f64);
  expect_close("o", out.o, ref.o, tolerance(c.dtype));
  expect_close("pool", out.pool, ref.pool, 1e-5);
  if (!call.inplace) expect_close("token states", out.token_states, ref.token_states, 1e-5);
  expect_pool_semantics(c, call, pool0.values(), out);
}

TEST(CudaGlaStatePool, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  int i = 0;
  for (DType dtype : {DType::f32, DType::bf16})
    for (Gate gate : {Gate::vector, Gate::scalar, Gate::none}) {
      const uint64_t seed = 3000 + 10 * i++;
      // [N] rows: one decode token (T = 1) or a prefill into the pool, a padded slot.
      Case fixed = pool_case(gate, dtype, {}, seed);
      PoolCall rows_n;
      rows_n.rows = {4, -1, 1};
      check_cuda_call(fixed, rows_n, seed + 1);
      fixed.T = 1;
      check_cuda_call(fixed, rows_n, seed + 2);
      // [N, T_max] rows with accepted counts (speculative decoding), varlen, a padded slot.
      const Case draft = pool_case(gate, dtype, {0, 3, 4, 8, 10}, seed + 3);
      PoolCall spec;
      spec.rows = {0, 5, 9, -1, 3, 1, -1, -1, 7, 8, 2, 10, -1, -1, -1, -1}, spec.cols = 4;
      spec.accepted = {2, 1, 4, 1};
      check_cuda_call(draft, spec, seed + 4);
      spec.inplace = false;
      check_cuda_call(draft, spec, seed + 5);
      spec.inplace = true, spec.v_first = true;
      check_cuda_call(draft, spec, seed + 6);
    }
}

// Several CTAs per head (V > one CTA's columns) and a wide K.
TEST(CudaGlaStatePool, LaunchShapes) {
  SKIP_WITHOUT_GPU();
  Case c = pool_case(Gate::vector, DType::bf16, {0, 5, 6, 9}, 3100);
  c.K = 100, c.V = 200;
  PoolCall call;
  call.rows = {3, 0, 5, 7, 1, -1}, call.cols = 2, call.accepted = {1, 2, 1};
  check_cuda_call(c, call, 3101);
  call.rows = {6, 2, 4}, call.cols = 0, call.accepted.clear();
  check_cuda_call(c, call, 3102);
}

// Rows and counts are not read back on the host for CUDA tensors: a start row ≥ P or a count out of
// range makes a padded slot, a write row ≥ P is skipped, and no memory outside the pool is touched.
TEST(CudaGlaStatePool, OutOfRangeIsSkipped) {
  SKIP_WITHOUT_GPU();
  const Case c = pool_case(Gate::scalar, DType::f32, {0, 2, 4, 6, 8, 10}, 3200);
  PoolCall call;
  call.P = 6;
  call.rows = {0, 1000, 2, 3, 100, 4, 5, -7, 1, -1}, call.cols = 2;
  // Sequence 0 writes row 1000 (skipped); 2 starts from row 100 (padded); 3 and 4 count out of range.
  call.accepted = {1, 2, 1, 0, 9};
  const Inputs in = make_inputs(c);
  const Buffer pool0 = random_pool(c, call, 3201);
  const PoolResult out = run_pool(c, in, pool0, call, gpu(), c.dtype);
  expect_pool_semantics(c, call, pool0.values(), out);
  EXPECT_TRUE(all_finite(out.o));
}

}  // namespace
}  // namespace flashgla::testing::gla_test
