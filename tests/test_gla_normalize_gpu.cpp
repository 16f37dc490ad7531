// The CUDA normaliser (gla_normalize_forward / _backward, a parallel scan over 64-token chunks) against
// the CPU backend run in fp64 on the same (rounded) inputs: varlen with empty sequences, reverse, z_init
// and z_final, lengths off the chunk, one token, K and V off the 16-byte vectors, strided rows, the three
// dtypes, a long sequence, the caller's workspace and an in-place o. Skipped without a GPU.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "flashgla/flashgla.h"
#include "test_util.h"
#include "testing/buffer.h"

namespace flashgla {
namespace {

using testing::Buffer;
using testing::rel_rms_error;

struct Case {
  std::vector<int64_t> bounds;  // cu_seqlens; empty: a fixed-length batch of B sequences of T tokens
  int64_t B = 1, T = 0, H = 2, K = 64, V = 64;
  DType dtype = DType::bf16;
  bool reverse = false;
  bool z_init = true, d_z_final = true;
  int64_t padding = 0;             // extra elements after each row on the GPU: strided rows
  bool caller_workspace = false;   // the caller's workspace instead of a stream-ordered one
  bool in_place = false;           // o written over o_raw
  std::string name;
};

struct Inputs {
  Buffer q, k, o_raw, d_o, z0, dz, cu;
};

struct Outputs {
  std::vector<double> o, z, d_o_raw, dq, dk, dz0;
};

int64_t sequences(const Case& c) { return c.bounds.empty() ? c.B : int64_t(c.bounds.size()) - 1; }
int64_t tokens(const Case& c) { return c.bounds.empty() ? c.T : c.bounds.back(); }
int64_t batch(const Case& c) { return c.bounds.empty() ? c.B : 1; }

Inputs inputs(const Case& c, std::mt19937_64& rng) {
  const int64_t B = batch(c), T = tokens(c), N = sequences(c);
  Inputs in;
  // Positive q, k (a feature map), so that q·z stays away from 0.
  in.q = Buffer(c.dtype, {B, T, c.H, c.K}), in.k = Buffer(c.dtype, {B, T, c.H, c.K});
  in.q.fill_uniform(rng, 0.05, 1.0), in.k.fill_uniform(rng, 0.05, 1.0);
  in.o_raw = Buffer(c.dtype, {B, T, c.H, c.V}), in.d_o = Buffer(c.dtype, {B, T, c.H, c.V});
  in.o_raw.fill_uniform(rng, -1, 1), in.d_o.fill_uniform(rng, -1, 1);
  if (c.z_init) in.z0 = Buffer(DType::f32, {N, c.H, c.K}), in.z0.fill_uniform(rng, 0.0, 2.0);
  if (c.d_z_final) in.dz = Buffer(DType::f32, {N, c.H, c.K}), in.dz.fill_uniform(rng, -1, 1);
  if (!c.bounds.empty()) {
    in.cu = Buffer(DType::i32, {N + 1});
    in.cu.set_values(std::vector<double>(c.bounds.begin(), c.bounds.end()));
  }
  return in;
}

// One forward and backward on `dev` in `dt` (f64 on the CPU: the reference).
Outputs run(const Case& c, const Inputs& in, const Device& dev, DType dt) {
  const bool gpu = dev.type == DeviceType::cuda;
  const int64_t B = batch(c), T = tokens(c), N = sequences(c), pad = gpu ? c.padding : 0;
  const DType state = dt == DType::f64 ? DType::f64 : DType::f32;  // f64 states for f64 inputs only
  auto put = [&](const Buffer& b, int64_t padding) { return b.defined() ? b.cast(dt).to(dev, padding) : Buffer(); };
  Buffer q = put(in.q, pad), k = put(in.k, pad), o_raw = put(in.o_raw, pad), d_o = put(in.d_o, pad);
  Buffer z0 = in.z0.defined() ? in.z0.to(dev) : Buffer(), dz = in.dz.defined() ? in.dz.to(dev) : Buffer();
  Buffer cu = in.cu.defined() ? in.cu.to(dev) : Buffer();
  Buffer o = c.in_place && gpu ? put(in.o_raw, pad) : Buffer(dt, {B, T, c.H, c.V}, dev, pad);
  Buffer z(state, {N, c.H, c.K}, dev);
  if (!(c.in_place && gpu)) o.poison();
  z.poison();
  GlaNormalizeArgs a;
  a.o_raw = c.in_place && gpu ? o.view() : o_raw.view();
  a.q = q.view(), a.k = k.view(), a.z_init = z0.view();
  a.cu_seqlens = cu.view(), a.cu_seqlens_host = in.cu.view(), a.scale = 0.3, a.reverse = c.reverse;
  a.o = o.view(), a.z_final = z.view();
  Buffer forward_workspace;
  if (gpu && c.caller_workspace) {
    const size_t bytes = gla_normalize_forward_workspace_bytes(a);
    forward_workspace = Buffer(DType::f32, {int64_t(bytes / 4) + 1}, dev);
    a.workspace = forward_workspace.view().data, a.workspace_bytes = bytes;
  }
  gla_normalize_forward(a);

  Buffer d_o_raw(dt, {B, T, c.H, c.V}, dev, pad), dq(dt, {B, T, c.H, c.K}, dev, pad),
      dk(dt, {B, T, c.H, c.K}, dev, pad);
  Buffer dz0 = c.z_init ? Buffer(state, {N, c.H, c.K}, dev) : Buffer();
  d_o_raw.poison(), dq.poison(), dk.poison();
  if (dz0.defined()) dz0.poison();
  GlaNormalizeBackwardArgs b;
  b.o_raw = o_raw.view(), b.q = a.q, b.k = a.k, b.z_init = a.z_init, b.cu_seqlens = a.cu_seqlens;
  b.cu_seqlens_host = a.cu_seqlens_host, b.scale = a.scale, b.reverse = c.reverse;
  b.d_o = d_o.view(), b.d_z_final = dz.view();
  b.d_o_raw = d_o_raw.view(), b.dq = dq.view(), b.dk = dk.view(), b.d_z_init = dz0.view();
  Buffer backward_workspace;
  if (gpu && c.caller_workspace) {
    const size_t bytes = gla_normalize_backward_workspace_bytes(b);
    backward_workspace = Buffer(DType::f32, {int64_t(bytes / 4) + 1}, dev);
    b.workspace = backward_workspace.view().data, b.workspace_bytes = bytes;
  }
  gla_normalize_backward(b);
  testing::synchronize(dev);
  Outputs out{o.values(), z.values(), d_o_raw.values(), dq.values(), dk.values(), {}};
  if (dz0.defined()) out.dz0 = dz0.values();
  return out;
}

double tolerance(DType dt) { return dt == DType::f32 ? 2e-5 : dt == DType::f16 ? 2e-3 : 5e-3; }

void check(const Case& c) {
  SCOPED_TRACE(c.name);
  std::mt19937_64 rng(1234 + tokens(c));
  const Inputs in = inputs(c, rng);
  const Outputs ref = run(c, in, Device{}, DType::f64);
  const Outputs got = run(c, in, Device{DeviceType::cuda, 0}, c.dtype);
  const double tol = tolerance(c.dtype);
  EXPECT_LE(rel_rms_error(got.o, ref.o), tol) << "o";
  EXPECT_LE(rel_rms_error(got.d_o_raw, ref.d_o_raw), tol) << "d_o_raw";
  EXPECT_LE(rel_rms_error(got.dq, ref.dq), tol) << "dq";
  EXPECT_LE(rel_rms_error(got.dk, ref.dk), tol) << "dk";
  EXPECT_LE(rel_rms_error(got.z, ref.z), 1e-5) << "z_final (fp32 sums)";
  if (c.z_init) EXPECT_LE(rel_rms_error(got.dz0, ref.dz0), 1e-4) << "d_z_init (fp32 sums)";
}

const char* dtype_str(DType dt) { return dt == DType::f32 ? "f32" : dt == DType::f16 ? "f16" : "bf16"; }

TEST(GlaNormalizeGpu, VarlenEmptySequencesReverseAndStates) {
  if (!testing::has_cuda()) GTEST_SKIP() << "no GPU";
  for (DType dt : {DType::bf16, DType::f16, DType::f32})
    for (bool reverse : {false, true}) {
      Case c;
      // Empty first, middle and last sequences, one token, on and off the chunk, several chunks.
      c.bounds = {0, 0, 5, 5, 6, 70, 134, 333, 333};
      c.K = 128, c.V = 128, c.dtype = dt, c.reverse = reverse;
      c.name = std::string("varlen K128 V128 ") + dtype_str(dt) + (reverse ? " reverse" : "");
      check(c);
    }
}

TEST(GlaNormalizeGpu, FixedLengthOffTheChunkAndOneToken) {
  if (!testing::has_cuda()) GTEST_SKIP() << "no GPU";
  for (int64_t T : {1, 63, 65, 200})
    for (bool reverse : {false, true}) {
      Case c;
      c.B = 3, c.T = T, c.H = 3, c.K = 64, c.V = 32, c.reverse = reverse;
      c.z_init = T != 63, c.d_z_final = T != 65;  // also without either state
      c.name = "fixed T" + std::to_string(T) + (reverse ? " reverse" : "");
      check(c);
    }
}

// Every pairing of key and value row widths (16-byte vectors: 8 elements of 16 bits, 4 of fp32; or one
// element) in each dtype, as each kernel runs both widths: 16-bit K64 V20 and K36 V64 mix them, fp32
// K36 V10 and K10 V36.
TEST(GlaNormalizeGpu, KeyAndValueOffTheVectors) {
  if (!testing::has_cuda()) GTEST_SKIP() << "no GPU";
  struct Dims {
    int64_t K, V;
  };
  for (DType dt : {DType::bf16, DType::f16, DType::f32})
    for (Dims d : {Dims{36, 20}, Dims{64, 20}, Dims{36, 64}, Dims{36, 10}, Dims{10, 36}, Dims{7, 3}, Dims{256, 256},
                   Dims{1, 1}}) {
      Case c;
      c.bounds = {0, 17, 17, 150};
      c.K = d.K, c.V = d.V, c.dtype = dt, c.reverse = d.K == 36;
      c.name = std::string(dtype_str(dt)) + " K" + std::to_string(d.K) + " V" + std::to_string(d.V);
      check(c);
    }
}

TEST(GlaNormalizeGpu, StridedRows) {
  if (!testing::has_cuda()) GTEST_SKIP() << "no GPU";
  for (int64_t padding : {3, 8}) {  // rows not on 16 bytes (one element at a time), and on them
    Case c;
    c.B = 2, c.T = 130, c.K = 64, c.V = 64, c.padding = padding;
    c.name = "padding " + std::to_string(padding);
    check(c);
  }
}

TEST(GlaNormalizeGpu, LongSequence) {
  if (!testing::has_cuda()) GTEST_SKIP() << "no GPU";
  for (DType dt : {DType::bf16, DType::f32}) {
    Case c;
    c.bounds = {0, 20000, 20001};
    c.H = 2, c.K = 64, c.V = 64, c.dtype = dt, c.reverse = dt == DType::f32;
    c.name = std::string("T20000 ") + dtype_str(dt);
    check(c);
  }
}

TEST(GlaNormalizeGpu, CallerWorkspaceAndInPlace) {
  if (!testing::has_cuda()) GTEST_SKIP() << "no GPU";
  Case c;
  c.bounds = {0, 100, 100, 300};
  c.K = 128, c.V = 64, c.caller_workspace = true, c.in_place = true;
  c.name = "caller workspace, o over o_raw";
  check(c);
}

TEST(GlaNormalizeGpu, WorkspaceTooSmallIsAnError) {
  if (!testing::has_cuda()) GTEST_SKIP() << "no GPU";
  const Device gpu{DeviceType::cuda, 0};
  Buffer q(DType::bf16, {1, 100, 2, 64}, gpu), k(DType::bf16, {1, 100, 2, 64}, gpu);
  Buffer o_raw(DType::bf16, {1, 100, 2, 64}, gpu), o(DType::bf16, {1, 100, 2, 64}, gpu);
  GlaNormalizeArgs a;
  a.o_raw = o_raw.view(), a.q = q.view(), a.k = k.view(), a.o = o.view();
  const size_t bytes = gla_normalize_forward_workspace_bytes(a);
  EXPECT_GT(bytes, 0u);
  Buffer ws(DType::f32, {int64_t(bytes / 4)}, gpu);
  a.workspace = ws.view().data, a.workspace_bytes = bytes - 4;
  testing::expect_error([&] { gla_normalize_forward(a); }, ErrorKind::value, "workspace",
                        "gla_normalize_forward_workspace_bytes");
}

TEST(GlaNormalizeGpu, CpuNeedsNoWorkspace) {
  Buffer q(DType::f32, {1, 10, 2, 8}), k(DType::f32, {1, 10, 2, 8}), o_raw(DType::f32, {1, 10, 2, 4}),
      o(DType::f32, {1, 10, 2, 4});
  GlaNormalizeArgs a;
  a.o_raw = o_raw.view(), a.q = q.view(), a.k = k.view(), a.o = o.view();
  EXPECT_EQ(gla_normalize_forward_workspace_bytes(a), 0u);
  a.o = TensorView{};
  testing::expect_error([&] { gla_normalize_forward_workspace_bytes(a); }, ErrorKind::value, "o", "is required");
}

}  // namespace
}  // namespace flashgla
