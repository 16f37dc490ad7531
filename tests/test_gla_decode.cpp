// GLA decode with a state pool (state_indices) and several tokens per call
// (speculative decoding), with the per-token states kept:
// - CPU: one call against T dense one-token calls on the gathered pool rows,
//   bit for bit (o, the pool, token_states); rows no index names are
//   untouched, padded slots give zero outputs and token states and touch no row.
// - CUDA: the same calls against the CPU in fp64 (relative RMS error), the
//   pool semantics exactly, an out-of-range row skipped, and the pool decode
//   captured in a CUDA graph and replayed. Small sizes, so the
//   CudaGlaDecode.* tests also run under compute-sanitizer. Skipped without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "flashgla/flashgla.h"
#include "gla_cuda_test_util.h"
#include "test_util.h"

#ifdef FLASHGLA_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace flashgla::testing::gla_test {
namespace {

struct PoolCase {
  int64_t N = 4, T = 3, H = 2, K = 32, V = 24, P = 7;
  std::vector<int32_t> rows = {4, -1, 0, 6};  // N pool rows; empty: a dense [N,H,K,V] state
  bool token_dim = true;                      // false: T == 1 and [N,H,*] tensors
  bool token_states = true;
  DType dtype = DType::f32;
  Gate gate = Gate::vector;
  int64_t padding = 0;  // > 0: strided tensors
  uint64_t seed = 1;

  bool pool() const { return !rows.empty(); }
  int64_t state_rows() const { return pool() ? P : N; }
  std::vector<int64_t> dims(int64_t d) const {  // [N,T,H,d] or [N,H,d]
    return token_dim ? std::vector<int64_t>{N, T, H, d} : std::vector<int64_t>{N, H, d};
  }
  std::vector<int64_t> gate_dims() const {
    std::vector<int64_t> s = dims(K);
    if (gate == Gate::scalar) s.pop_back();
    return s;
  }
  std::string describe() const {
    return std::string(dtype_name(dtype)) + " N" + std::to_string(N) + " T" + std::to_string(T) + " H" +
           std::to_string(H) + " K" + std::to_string(K) + " V" + std::to_string(V) +
           (gate == Gate::none ? " no-gate" : gate == Gate::scalar ? " scalar-gate" : " vector-gate") +
           (pool() ? " pool" : " dense") + (token_dim ? "" : " no-token-dim") + (padding ? " strided" : "");
  }
};

struct PoolInputs {
  Buffer q, k, v, g, state, rows;  // on the CPU; q, k, v, g in the case's dtype
};

PoolInputs make_pool_inputs(const PoolCase& c) {
  std::mt19937_64 rng(c.seed);
  PoolInputs in;
  in.q = Buffer(c.dtype, c.dims(c.K)), in.k = Buffer(c.dtype, c.dims(c.K)), in.v = Buffer(c.dtype, c.dims(c.V));
  in.q.fill_normal(rng), in.k.fill_normal(rng), in.v.fill_normal(rng);
  if (c.gate != Gate::none) {
    in.g = Buffer(c.dtype, c.gate_dims());
    std::vector<double> values(size_t(in.g.numel()));
    std::normal_distribution<double> normal;
    for (double& x : values) x = logsigmoid(normal(rng));
    in.g.set_values(values);
  }
  in.state = Buffer(DType::f32, {c.state_rows(), c.H, c.K, c.V});
  in.state.fill_normal(rng);
  if (c.pool()) {
    in.rows = Buffer(DType::i32, {c.N});
    in.rows.set_values(std::vector<double>(c.rows.begin(), c.rows.end()));
  }
  return in;
}

struct PoolOutputs {
  std::vector<double> o, state, token_states;
};

// One gla_decode call on `device` with q, k, v (and o) in `dtype`; o and
// token_states start as NaN.
PoolOutputs run_pool_decode(const PoolCase& c, const PoolInputs& in, Device device, DType dtype,
                            void* stream = nullptr) {
  const Buffer q = in.q.cast(dtype).to(device, c.padding), k = in.k.cast(dtype).to(device, c.padding);
  const Buffer v = in.v.cast(dtype).to(device, c.padding);
  const Buffer g = in.g.defined() ? in.g.cast(dtype).to(device, c.padding) : Buffer();
  const Buffer rows = in.rows.defined() ? in.rows.to(device) : Buffer();
  Buffer state = in.state.to(device, c.padding);
  Buffer o = poisoned_on(device, dtype, c.dims(c.V), c.padding);
  Buffer token_states;
  if (c.token_states) token_states = poisoned_on(device, DType::f32, {c.N * c.T, c.H, c.K, c.V}, c.padding);
  GlaDecodeArgs a;
  a.q = q.view(), a.k = k.view(), a.v = v.view(), a.g = g.view(), a.state = state.view(), a.o = o.view();
  a.state_indices = rows.view(), a.token_states = token_states.view(), a.stream = stream;
  gla_decode(a);
  synchronize(device);
  return {o.values(), state.values(), token_states.values()};
}

// Element d of token t of sequence n in a [N,T,H,D] (or [N,H,D]) value vector.
std::vector<double> token_slice(const std::vector<double>& x, const PoolCase& c, int64_t t) {
  if (!c.token_dim) return x;
  const int64_t row = int64_t(x.size()) / (c.N * c.T);
  std::vector<double> y;
  for (int64_t n = 0; n < c.N; ++n) y.insert(y.end(), x.begin() + (n * c.T + t) * row, x.begin() + (n * c.T + t + 1) * row);
  return y;
}

// The reference of a pool call: T dense one-token calls (no indices) on the
// gathered rows, in the case's dtype on the CPU, scattered back into the pool.
// Padded slots: zero outputs and token states.
PoolOutputs dense_steps(const PoolCase& c, const PoolInputs& in) {
  const int64_t slice = c.H * c.K * c.V, row_o = c.H * c.V;
  const std::vector<double> pool = in.state.values();
  auto row_of = [&](int64_t n) { return c.pool() ? int64_t(c.rows[size_t(n)]) : n; };
  std::vector<double> dense(size_t(c.N * slice), 0.0);
  for (int64_t n = 0; n < c.N; ++n)
    if (row_of(n) >= 0) std::copy_n(pool.begin() + row_of(n) * slice, slice, dense.begin() + n * slice);
  Buffer state(DType::f32, {c.N, c.H, c.K, c.V});
  state.set_values(dense);
  PoolOutputs ref;
  ref.o.assign(size_t(c.N * c.T * row_o), 0.0);
  ref.token_states.assign(c.token_states ? size_t(c.N * c.T * slice) : 0, 0.0);
  for (int64_t t = 0; t < c.T; ++t) {
    auto token = [&](const Buffer& b, std::vector<int64_t> shape) {
      Buffer out(b.dtype(), shape);
      out.set_values(token_slice(b.values(), c, t));
      return out;
    };
    const Buffer q = token(in.q, {c.N, c.H, c.K}), k = token(in.k, {c.N, c.H, c.K}), v = token(in.v, {c.N, c.H, c.V});
    Buffer g;
    if (in.g.defined()) g = c.gate == Gate::vector ? token(in.g, {c.N, c.H, c.K}) : token(in.g, {c.N, c.H});
    Buffer o(c.dtype, {c.N, c.H, c.V});
    GlaDecodeArgs a;
    a.q = q.view(), a.k = k.view(), a.v = v.view(), a.g = g.view(), a.state = state.view(), a.o = o.view();
    gla_decode(a);
    const std::vector<double> ot = o.values(), st = state.values();
    for (int64_t n = 0; n < c.N; ++n) {
      if (row_of(n) < 0) continue;
      std::copy_n(ot.begin() + n * row_o, row_o, ref.o.begin() + (n * c.T + t) * row_o);
      if (c.token_states) std::copy_n(st.begin() + n * slice, slice, ref.token_states.begin() + (n * c.T + t) * slice);
    }
  }
  ref.state = pool;
  const std::vector<double> last = state.values();
  for (int64_t n = 0; n < c.N; ++n)
    if (row_of(n) >= 0) std::copy_n(last.begin() + n * slice, slice, ref.state.begin() + row_of(n) * slice);
  return ref;
}

// Bit for bit, NaN matching NaN.
void expect_identical(const std::string& what, const std::vector<double>& out, const std::vector<double>& ref) {
  ASSERT_EQ(out.size(), ref.size()) << what;
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < out.size(); ++i)
    if (!(out[i] == ref[i] || (std::isnan(out[i]) && std::isnan(ref[i])))) first = bad++ ? first : i;
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " elements differ, the first at " << first << " (" << out[first]
                     << " vs " << ref[first] << ")";
}

// The parts of a pool call's result that hold exactly on every device: pool
// rows no index names keep their values, padded slots have zero outputs and
// zero token states.
void expect_pool_semantics(const PoolCase& c, const PoolInputs& in, const PoolOutputs& out) {
  if (!c.pool()) return;
  const int64_t slice = c.H * c.K * c.V, row_o = c.H * c.V;
  const std::vector<double> before = in.state.values();
  std::vector<bool> named(size_t(c.P), false);
  for (int32_t r : c.rows)
    if (r >= 0 && r < c.P) named[size_t(r)] = true;
  for (int64_t r = 0; r < c.P; ++r)
    if (!named[size_t(r)])
      for (int64_t i = 0; i < slice; ++i)
        ASSERT_EQ(out.state[size_t(r * slice + i)], before[size_t(r * slice + i)]) << "pool row " << r << " changed";
  for (int64_t n = 0; n < c.N; ++n) {
    if (c.rows[size_t(n)] >= 0 && c.rows[size_t(n)] < c.P) continue;
    for (int64_t i = 0; i < c.T * row_o; ++i)
      ASSERT_EQ(out.o[size_t(n * c.T * row_o + i)], 0.0) << "padded slot " << n << ": output not zero";
    if (c.token_states)
      for (int64_t i = 0; i < c.T * slice; ++i)
        ASSERT_EQ(out.token_states[size_t(n * c.T * slice + i)], 0.0) << "padded slot " << n << ": token state not zero";
  }
}

std::vector<PoolCase> cpu_cases() {
  std::vector<PoolCase> cases;
  int i = 0;
  for (Gate gate : {Gate::vector, Gate::scalar, Gate::none})
    for (DType dtype : {DType::f32, DType::bf16})
      for (int64_t T : {1, 3, 16}) {
        PoolCase c;
        c.gate = gate, c.dtype = dtype, c.T = T, c.seed = 300 + i;
        c.token_dim = !(T == 1 && i % 2 == 0);
        c.padding = i % 3 == 1 ? 2 : 0;
        if (i % 4 == 3) c.rows.clear();  // a dense state with several tokens
        c.token_states = i % 5 != 4;
        cases.push_back(c);
        ++i;
      }
  return cases;
}

TEST(GlaCpuDecodePool, MatchesDenseOneTokenCalls) {
  for (const PoolCase& c : cpu_cases()) {
    SCOPED_TRACE(c.describe());
    const PoolInputs in = make_pool_inputs(c);
    const PoolOutputs out = run_pool_decode(c, in, Device{}, c.dtype);
    const PoolOutputs ref = dense_steps(c, in);
    expect_identical("o", out.o, ref.o);
    expect_identical("state", out.state, ref.state);
    expect_identical("token_states", out.token_states, ref.token_states);
    expect_pool_semantics(c, in, out);
  }
}

// Several tokens in one call agree with the fp64 recurrence over the same
// tokens (the chunked forward's reference), started from the gathered rows.
TEST(GlaCpuDecodePool, MatchesRecurrentForward) {
  PoolCase c;
  c.T = 9, c.rows = {5, 1, 3}, c.N = 3, c.token_states = false, c.seed = 77;
  const PoolInputs in = make_pool_inputs(c);
  const PoolOutputs out = run_pool_decode(c, in, Device{}, c.dtype);
  Case f;
  f.B = c.N, f.T = c.T, f.H = c.H, f.K = c.K, f.V = c.V;
  Inputs fin;
  fin.q = in.q, fin.k = in.k, fin.v = in.v, fin.g = in.g;
  const int64_t slice = c.H * c.K * c.V;
  std::vector<double> pool = in.state.values(), h0;
  for (int32_t r : c.rows) h0.insert(h0.end(), pool.begin() + r * slice, pool.begin() + (r + 1) * slice);
  fin.h0 = Buffer(DType::f32, {c.N, c.H, c.K, c.V});
  fin.h0.set_values(h0);
  const Outputs ref = run_forward(f, fin, GlaAlgorithm::recurrent);
  expect_close("o", out.o, ref.o, 1e-6);
  std::vector<double> final_rows;
  for (int32_t r : c.rows) final_rows.insert(final_rows.end(), out.state.begin() + r * slice, out.state.begin() + (r + 1) * slice);
  expect_close("state", final_rows, ref.ht, 1e-6);
}

// A verifier that accepts tokens 0..a rolls back by copying token state a into
// the pool row: the same state as decoding only those tokens.
TEST(GlaCpuDecodePool, TokenStatesRollBack) {
  PoolCase c;
  c.T = 5, c.seed = 91;
  const PoolInputs in = make_pool_inputs(c);
  const PoolOutputs all = run_pool_decode(c, in, Device{}, c.dtype);
  const int64_t accepted = 2, slice = c.H * c.K * c.V;
  PoolCase prefix = c;
  prefix.T = accepted + 1, prefix.token_states = false;
  PoolInputs pin = in;
  auto first_tokens = [&](const Buffer& b) {
    if (!b.defined()) return b;
    std::vector<int64_t> shape = b.shape();
    const int64_t row = b.numel() / (c.N * c.T);
    const std::vector<double> x = b.values();
    std::vector<double> y;
    for (int64_t n = 0; n < c.N; ++n) y.insert(y.end(), x.begin() + n * c.T * row, x.begin() + (n * c.T + prefix.T) * row);
    shape[1] = prefix.T;
    Buffer out(b.dtype(), shape);
    out.set_values(y);
    return out;
  };
  pin.q = first_tokens(in.q), pin.k = first_tokens(in.k), pin.v = first_tokens(in.v), pin.g = first_tokens(in.g);
  const PoolOutputs part = run_pool_decode(prefix, pin, Device{}, c.dtype);
  for (int64_t n = 0; n < c.N; ++n) {
    const int32_t r = c.rows[size_t(n)];
    if (r < 0) continue;
    const std::vector<double> kept(all.token_states.begin() + (n * c.T + accepted) * slice,
                                   all.token_states.begin() + (n * c.T + accepted + 1) * slice);
    const std::vector<double> want(part.state.begin() + r * slice, part.state.begin() + (r + 1) * slice);
    expect_identical("rolled-back state of sequence " + std::to_string(n), kept, want);
  }
}

// ---- prefill into a pool (gla_forward with initial/final_state_indices) ------------------

struct PrefillResult {
  std::vector<double> o, pool;
};

// A chunked (or recurrent) forward of N = 3 sequences whose initial and final
// states are rows of one pool: sequence 0 reads row 4 and writes row 1,
// sequence 1 starts from zeros and writes row 5, sequence 2 reads row 1 and
// writes row 4 (a swap: every row is read before any is written), and the
// reference: a dense forward on the gathered rows, scattered by hand.
PrefillResult prefill_pool(const Case& c, const Inputs& in, const Buffer& pool0, Device device, DType dtype,
                           bool reference, GlaAlgorithm algorithm) {
  const std::vector<int32_t> first = {4, -1, 1}, last = {1, 5, 4};
  const int64_t slice = c.H * c.K * c.V;
  const Buffer q = in.q.cast(dtype).to(device), k = in.k.cast(dtype).to(device), v = in.v.cast(dtype).to(device);
  const Buffer g = in.g.cast(dtype == DType::f64 ? DType::f64 : in.g.dtype()).to(device);
  Buffer o = poisoned_on(device, dtype, {c.B, c.T, c.H, c.V}, 0);
  GlaForwardArgs a;
  a.q = q.view(), a.k = k.view(), a.v = v.view(), a.g = g.view(), a.o = o.view(), a.algorithm = algorithm;
  if (reference) {
    const std::vector<double> rows = pool0.values();
    std::vector<double> h0(size_t(c.B * slice), 0.0);
    for (int64_t n = 0; n < c.B; ++n)
      if (first[size_t(n)] >= 0) std::copy_n(rows.begin() + first[size_t(n)] * slice, slice, h0.begin() + n * slice);
    Buffer h0_dense(DType::f32, {c.B, c.H, c.K, c.V});
    h0_dense.set_values(h0);
    const Buffer h0_on = h0_dense.to(device);
    Buffer ht = poisoned_on(device, DType::f32, {c.B, c.H, c.K, c.V}, 0);
    a.initial_state = h0_on.view(), a.final_state = ht.view();
    gla_forward(a);
    synchronize(device);
    std::vector<double> pool = rows;
    const std::vector<double> final_states = ht.values();
    for (int64_t n = 0; n < c.B; ++n)
      std::copy_n(final_states.begin() + n * slice, slice, pool.begin() + last[size_t(n)] * slice);
    return {o.values(), pool};
  }
  Buffer pool = pool0.to(device, 2);  // strided rows
  Buffer first_rows(DType::i32, {c.B}), last_rows(DType::i32, {c.B});
  first_rows.set_values(std::vector<double>(first.begin(), first.end()));
  last_rows.set_values(std::vector<double>(last.begin(), last.end()));
  const Buffer first_on = first_rows.to(device), last_on = last_rows.to(device);
  a.initial_state = pool.view(), a.final_state = pool.view();
  a.initial_state_indices = first_on.view(), a.final_state_indices = last_on.view();
  gla_forward(a);
  synchronize(device);
  return {o.values(), pool.values()};
}

Case prefill_case(DType dtype, uint64_t seed) {
  Case c;
  c.B = 3, c.T = 70, c.H = 2, c.K = 32, c.V = 24, c.dtype = dtype, c.seed = seed;
  return c;
}

Buffer random_pool(const Case& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Buffer pool(DType::f32, {6, c.H, c.K, c.V});
  pool.fill_normal(rng);
  return pool;
}

TEST(GlaCpuPrefillPool, MatchesDenseForward) {
  for (GlaAlgorithm algorithm : {GlaAlgorithm::chunked, GlaAlgorithm::recurrent}) {
    const Case c = prefill_case(DType::f32, 500 + int(algorithm));
    const Inputs in = make_inputs(c);
    const Buffer pool = random_pool(c, 501);
    const PrefillResult out = prefill_pool(c, in, pool, Device{}, c.dtype, false, algorithm);
    const PrefillResult ref = prefill_pool(c, in, pool, Device{}, c.dtype, true, algorithm);
    expect_identical("o", out.o, ref.o);
    expect_identical("pool (rows 0, 2, 3 untouched)", out.pool, ref.pool);
  }
}

TEST(GlaCpuPrefillPool, BadRows) {
  const Case c = prefill_case(DType::f32, 510);
  const Inputs in = make_inputs(c);
  Buffer pool = random_pool(c, 511), o(DType::f32, {c.B, c.T, c.H, c.V});
  Buffer rows(DType::i32, {c.B}), rows64(DType::i64, {c.B});
  GlaForwardArgs a;
  a.q = in.q.view(), a.k = in.k.view(), a.v = in.v.view(), a.g = in.g.view(), a.o = o.view();
  a.final_state = pool.view(), a.final_state_indices = rows.view();
  rows.set_values({0, 3, 0});
  expect_error([&] { gla_forward(a); }, ErrorKind::value, "final_state_indices", "distinct");
  rows.set_values({0, 6, 1});
  expect_error([&] { gla_forward(a); }, ErrorKind::value, "final_state_indices", "< P = 6");
  a.final_state_indices = rows64.view();
  expect_error([&] { gla_forward(a); }, ErrorKind::type, "final_state_indices", "int32");
  a.final_state_indices = {};
  expect_error([&] { gla_forward(a); }, ErrorKind::value, "final_state", "[N, H, K, V]");
  rows.set_values({0, 0, -1});  // initial rows may repeat
  a.final_state = {};
  a.initial_state = pool.view(), a.initial_state_indices = rows.view();
  EXPECT_NO_THROW(gla_forward(a));
  a.initial_state = {};
  expect_error([&] { gla_forward(a); }, ErrorKind::value, "initial_state", "initial_state_indices");
}

// ---- CUDA ----------------------------------------------------------------------------

double tolerance(DType dtype) { return dtype == DType::f32 ? 1e-5 : 5e-3; }

void check_cuda_case(const PoolCase& c) {
  SCOPED_TRACE(c.describe());
  const PoolInputs in = make_pool_inputs(c);
  const PoolOutputs out = run_pool_decode(c, in, gpu(), c.dtype);
  const PoolOutputs ref = run_pool_decode(c, in, Device{}, DType::f64);
  expect_close("o", out.o, ref.o, tolerance(c.dtype));
  expect_close("state", out.state, ref.state, 1e-5);
  if (c.token_states) expect_close("token_states", out.token_states, ref.token_states, 1e-5);
  expect_pool_semantics(c, in, out);
}

TEST(CudaGlaDecode, PoolAndTokensMatchCpu) {
  SKIP_WITHOUT_GPU();
  int i = 0;
  for (DType dtype : {DType::f32, DType::bf16, DType::f16})
    for (Gate gate : {Gate::vector, Gate::scalar, Gate::none})
      for (int64_t T : {1, 4, 16}) {
        PoolCase c;
        c.dtype = dtype, c.gate = gate, c.T = T, c.seed = 2000 + i;
        c.K = i % 2 ? 128 : 100, c.V = i % 2 ? 128 : 36;  // odd shapes: the element-wise path
        c.token_dim = !(T == 1 && i % 2 == 0);
        c.padding = i % 3 == 0 ? 4 : 0;
        c.token_states = i % 4 != 3;
        if (i % 5 == 4) c.rows.clear();
        check_cuda_case(c);
        ++i;
      }
}

// The launch shapes: wide keys (several row blocks: the slice streams through
// memory once per token), many sequences (64-column slices), one sequence.
TEST(CudaGlaDecode, PoolLaunchShapes) {
  SKIP_WITHOUT_GPU();
  PoolCase wide;
  wide.K = 520, wide.V = 20, wide.T = 3, wide.H = 1, wide.seed = 2100;
  check_cuda_case(wide);
  wide.T = 1, wide.K = 2100, wide.seed = 2101;
  check_cuda_case(wide);
  PoolCase many;
  many.N = 40, many.H = 8, many.K = many.V = 128, many.T = 2, many.P = 48, many.dtype = DType::bf16, many.seed = 2102;
  many.rows.clear();
  for (int n = 0; n < many.N; ++n) many.rows.push_back(n % 7 == 3 ? -1 : int32_t(47 - n));
  check_cuda_case(many);
  PoolCase one;
  one.N = 1, one.H = 16, one.K = one.V = 128, one.T = 1, one.P = 3, one.rows = {2}, one.token_dim = false;
  one.dtype = DType::bf16, one.seed = 2103;
  check_cuda_case(one);
}

// Rows ≥ P are not checked on the host for CUDA tensors (no sync); the kernel
// treats them as padded slots and never touches memory there.
TEST(CudaGlaDecode, PoolOutOfRangeRowIsSkipped) {
  SKIP_WITHOUT_GPU();
  PoolCase c;
  c.rows = {2, 7, -3, 1000000}, c.P = 7, c.seed = 2200, c.dtype = DType::bf16;
  check_cuda_case(PoolCase{});  // a valid call first
  const PoolInputs in = make_pool_inputs(c);
  const PoolOutputs out = run_pool_decode(c, in, gpu(), c.dtype);
  expect_pool_semantics(c, in, out);
  EXPECT_TRUE(all_finite(std::vector<double>(out.o.begin(), out.o.begin() + c.T * c.H * c.V)));
}

TEST(CudaGlaDecode, PrefillIntoPool) {
  SKIP_WITHOUT_GPU();
  int i = 0;
  for (GlaAlgorithm algorithm : {GlaAlgorithm::chunked, GlaAlgorithm::recurrent})
    for (DType dtype : {DType::f32, DType::bf16}) {
      const Case c = prefill_case(dtype, 2400 + i++);
      SCOPED_TRACE(std::string(dtype_name(dtype)) + (algorithm == GlaAlgorithm::chunked ? " chunked" : " recurrent"));
      const Inputs in = make_inputs(c);
      const Buffer pool = random_pool(c, 2450 + i);
      const PrefillResult out = prefill_pool(c, in, pool, gpu(), dtype, false, algorithm);
      const PrefillResult ref = prefill_pool(c, in, pool, Device{}, DType::f64, true, GlaAlgorithm::recurrent);
      expect_close("o", out.o, ref.o, tolerance(dtype));
      expect_close("pool", out.pool, ref.pool, tolerance(dtype));  // as the forward tests hold final states
      const int64_t slice = c.H * c.K * c.V;
      const std::vector<double> before = pool.values();
      for (int64_t r : {0, 2, 3})
        for (int64_t e = 0; e < slice; ++e)
          ASSERT_EQ(out.pool[size_t(r * slice + e)], before[size_t(r * slice + e)]) << "pool row " << r << " changed";
    }
}

#ifdef FLASHGLA_WITH_CUDA
// The pool decode captured once in a CUDA graph and replayed twice: indices and
// inputs are read on the device at replay time, so two replays are two steps.
TEST(CudaGlaDecode, PoolCapturedInGraph) {
  SKIP_WITHOUT_GPU();
  PoolCase c;
  c.T = 2, c.K = c.V = 64, c.dtype = DType::bf16, c.seed = 2300;
  const PoolInputs in = make_pool_inputs(c);
  const Buffer q = in.q.to(gpu()), k = in.k.to(gpu()), v = in.v.to(gpu()), g = in.g.to(gpu());
  const Buffer rows = in.rows.to(gpu());
  Buffer state = in.state.to(gpu());
  Buffer o = poisoned_on(gpu(), c.dtype, c.dims(c.V), 0);
  Buffer token_states = poisoned_on(gpu(), DType::f32, {c.N * c.T, c.H, c.K, c.V}, 0);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  GlaDecodeArgs a;
  a.q = q.view(), a.k = k.view(), a.v = v.view(), a.g = g.view(), a.state = state.view(), a.o = o.view();
  a.state_indices = rows.view(), a.token_states = token_states.view(), a.stream = stream;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  gla_decode(a);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int replay = 0; replay < 2; ++replay) ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);

  PoolInputs step = in;  // the reference: two CPU calls in fp64, the second from the first's pool
  const PoolOutputs first = run_pool_decode(c, step, Device{}, DType::f64);
  step.state = Buffer(DType::f32, {c.P, c.H, c.K, c.V});
  step.state.set_values(first.state);
  const PoolOutputs second = run_pool_decode(c, step, Device{}, DType::f64);
  const PoolOutputs out{o.values(), state.values(), token_states.values()};
  expect_close("o (second replay)", out.o, second.o, tolerance(c.dtype));
  expect_close("state (two replays)", out.state, second.state, 1e-5);
  expect_pool_semantics(c, in, out);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}
#endif

}  // namespace
}  // namespace flashgla::testing::gla_test
