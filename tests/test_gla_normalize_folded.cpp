// gla_forward with normalize (the normaliser in the op's call; on CUDA the fast kernel divides as it stores o)
// and the normaliser's backward from the normalised output (o_raw_is_output). The GPU cases compare with the
// CPU backend in fp64 on the same rounded inputs, and with the unfolded CUDA path (the op, then the normaliser);
// the CPU cases check the backward's two forms against each other and the argument checks.
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
  bool h0 = true, z_init = true;
  std::string name;
};

int64_t sequences(const Case& c) { return c.bounds.empty() ? c.B : int64_t(c.bounds.size()) - 1; }
int64_t tokens(const Case& c) { return c.bounds.empty() ? c.T : c.bounds.back(); }
int64_t batch(const Case& c) { return c.bounds.empty() ? c.B : 1; }

struct Inputs {
  Buffer q, k, v, h0, z0, cu;
};

Inputs inputs(const Case& c, std::mt19937_64& rng) {
  const int64_t B = batch(c), T = tokens(c), N = sequences(c);
  Inputs in;
  // Positive q, k (a feature map), so that q·z stays away from 0.
  in.q = Buffer(c.dtype, {B, T, c.H, c.K}), in.k = Buffer(c.dtype, {B, T, c.H, c.K});
  in.v = Buffer(c.dtype, {B, T, c.H, c.V});
  in.q.fill_uniform(rng, 0.05, 1.0), in.k.fill_uniform(rng, 0.05, 1.0), in.v.fill_uniform(rng, -1, 1);
  if (c.h0) in.h0 = Buffer(DType::f32, {N, c.H, c.K, c.V}), in.h0.fill_uniform(rng, -0.5, 0.5);
  if (c.z_init) in.z0 = Buffer(DType::f32, {N, c.H, c.K}), in.z0.fill_uniform(rng, 0.0, 2.0);
  if (!c.bounds.empty()) {
    in.cu = Buffer(DType::i32, {N + 1});
    in.cu.set_values(std::vector<double>(c.bounds.begin(), c.bounds.end()));
  }
  return in;
}

struct Outputs {
  std::vector<double> o, state, z;
};

// gla_forward on `dev` in `dt`; folded: normalize in the call, else the op and then gla_normalize_forward.
Outputs forward(const Case& c, const Inputs& in, const Device& dev, DType dt, bool folded) {
  const int64_t B = batch(c), T = tokens(c), N = sequences(c);
  const DType state_dtype = dt == DType::f64 ? DType::f64 : DType::f32;
  auto put = [&](const Buffer& b) { return b.defined() ? b.cast(dt).to(dev) : Buffer(); };
  Buffer q = put(in.q), k = put(in.k), v = put(in.v);
  Buffer h0 = in.h0.defined() ? in.h0.to(dev) : Buffer(), z0 = in.z0.defined() ? in.z0.to(dev) : Buffer();
  Buffer cu = in.cu.defined() ? in.cu.to(dev) : Buffer();
  Buffer o(dt, {B, T, c.H, c.V}, dev), state(state_dtype, {N, c.H, c.K, c.V}, dev);
  Buffer z(state_dtype, {N, c.H, c.K}, dev);
  o.poison(), state.poison(), z.poison();
  GlaForwardArgs a;
  a.q = q.view(), a.k = k.view(), a.v = v.view(), a.initial_state = h0.view();
  a.cu_seqlens = cu.view(), a.cu_seqlens_host = in.cu.view(), a.scale = 0.3;
  a.o = o.view(), a.final_state = state.view();
  if (folded) {
    a.normalize = true, a.z_init = z0.view(), a.z_final = z.view();
    gla_forward(a);
  } else {
    gla_forward(a);
    GlaNormalizeArgs n;
    n.o_raw = o.view(), n.q = a.q, n.k = a.k, n.z_init = z0.view(), n.cu_seqlens = a.cu_seqlens;
    n.cu_seqlens_host = a.cu_seqlens_host, n.scale = a.scale, n.o = o.view(), n.z_final = z.view();
    gla_normalize_forward(n);
  }
  testing::synchronize(dev);
  return {o.values(), state.values(), z.values()};
}

void check_forward(const Case& c) {
  SCOPED_TRACE(c.name);
  std::mt19937_64 rng(4321 + tokens(c));
  const Inputs in = inputs(c, rng);
  const Outputs ref = forward(c, in, Device{}, DType::f64, true);
  const Device gpu{DeviceType::cuda, 0};
  const Outputs got = forward(c, in, gpu, c.dtype, true), unfolded = forward(c, in, gpu, c.dtype, false);
  const double tol = c.dtype == DType::f16 ? 3e-3 : 6e-3;
  EXPECT_LE(rel_rms_error(got.o, ref.o), tol) << "o";
  EXPECT_LE(rel_rms_error(got.o, unfolded.o), tol) << "o against the op, then the normaliser";
  EXPECT_LE(rel_rms_error(got.state, ref.state), tol) << "final_state";
  EXPECT_LE(rel_rms_error(got.z, ref.z), 1e-5) << "z_final (fp32 sums)";
}

const char* dtype_str(DType dt) { return dt == DType::f16 ? "f16" : "bf16"; }

// The fast kernel's shapes (K ≤ 128 in whole 16-byte rows): K and V of 64 and 128, V of 32 and 192 (value tiles
// of 64), lengths on and off the chunk, one token, varlen with empty sequences; K 100 and 256 go to the other
// kernels, whose o the normaliser divides afterwards.
TEST(GlaNormalizeFolded, ForwardMatchesCpuReference) {
  if (!testing::has_cuda()) GTEST_SKIP() << "no GPU";
  struct Dims {
    int64_t K, V;
  };
  int i = 0;
  for (DType dt : {DType::bf16, DType::f16})
    for (Dims d : {Dims{64, 64}, Dims{128, 128}, Dims{128, 64}, Dims{64, 128}, Dims{128, 32}, Dims{64, 192},
                   Dims{100, 64}, Dims{256, 128}})
      for (int64_t T : {1, 65, 200}) {
        Case c;
        c.B = 2, c.T = T, c.H = 3, c.K = d.K, c.V = d.V, c.dtype = dt;
        c.h0 = i % 3 != 1, c.z_init = i % 4 != 2, ++i;
        c.name = std::string(dtype_str(dt)) + " K" + std::to_string(d.K) + " V" + std::to_string(d.V) + " T" +
                 std::to_string(T);
        check_forward(c);
      }
  for (DType dt : {DType::bf16, DType::f16}) {
    Case c;
    c.bounds = {0, 0, 5, 5, 6, 70, 134, 333, 333};  // empty first, middle and last sequences
    c.K = 128, c.V = 128, c.dtype = dt;
    c.name = std::string("varlen ") + dtype_str(dt);
    check_forward(c);
  }
  Case c;
  c.bounds = {0, 3000, 3001, 9000};  // a sequence split over several CTAs
  c.H = 1, c.K = 64, c.V = 64;
  c.name = "varlen T9000";
  check_forward(c);
}

// The normaliser's backward from o (o_raw_is_output: o_raw = o · den recovered) against the one from o_raw, in
// fp64 on the CPU, varlen with an empty sequence and reverse; and on the GPU against the CPU.
struct Backward {
  std::vector<double> d_o_raw, dq, dk, dz0;
};

Backward normalize_backward(const Buffer& o_raw, const Buffer& q, const Buffer& k, const Buffer& z0,
                            const Buffer& cu, const Buffer& cu_host, const Buffer& d_o, const Buffer& dz, bool reverse,
                            bool from_output, const Device& dev, DType dt) {
  const int64_t N = z0.shape()[0];
  const DType state_dtype = dt == DType::f64 ? DType::f64 : DType::f32;
  Buffer d_o_raw(dt, o_raw.shape(), dev), dq(dt, q.shape(), dev), dk(dt, q.shape(), dev);
  Buffer dz0(state_dtype, {N, q.shape()[2], q.shape()[3]}, dev);
  d_o_raw.poison(), dq.poison(), dk.poison(), dz0.poison();
  GlaNormalizeBackwardArgs b;
  b.o_raw = o_raw.view(), b.q = q.view(), b.k = k.view(), b.z_init = z0.view(), b.cu_seqlens = cu.view();
  b.cu_seqlens_host = cu_host.view(), b.scale = 0.3, b.reverse = reverse, b.o_raw_is_output = from_output;
  b.d_o = d_o.view(), b.d_z_final = dz.view();
  b.d_o_raw = d_o_raw.view(), b.dq = dq.view(), b.dk = dk.view(), b.d_z_init = dz0.view();
  gla_normalize_backward(b);
  testing::synchronize(dev);
  return {d_o_raw.values(), dq.values(), dk.values(), dz0.values()};
}

void check_backward_from_output(DType dt, bool reverse, const Device& dev) {
  SCOPED_TRACE(std::string(dev.type == DeviceType::cuda ? "cuda " : "cpu ") + (reverse ? "reverse" : "forward"));
  std::mt19937_64 rng(99);
  const std::vector<double> bounds = {0, 70, 70, 200};
  const int64_t T = 200, H = 2, K = 64, V = 48, N = 3;
  Buffer q(DType::f64, {1, T, H, K}), k(DType::f64, {1, T, H, K}), o_raw(DType::f64, {1, T, H, V});
  Buffer d_o(DType::f64, {1, T, H, V}), z0(DType::f64, {N, H, K}), dz(DType::f64, {N, H, K}), cu(DType::i32, {N + 1});
  q.fill_uniform(rng, 0.05, 1.0), k.fill_uniform(rng, 0.05, 1.0), o_raw.fill_uniform(rng, -1, 1);
  d_o.fill_uniform(rng, -1, 1), z0.fill_uniform(rng, 0.0, 2.0), dz.fill_uniform(rng, -1, 1);
  cu.set_values(bounds);
  // o = o_raw / den from the CPU forward in fp64, then rounded to dt like every input.
  Buffer o(DType::f64, {1, T, H, V});
  GlaNormalizeArgs n;
  n.o_raw = o_raw.view(), n.q = q.view(), n.k = k.view(), n.z_init = z0.view(), n.cu_seqlens = cu.view();
  n.scale = 0.3, n.reverse = reverse, n.o = o.view();
  gla_normalize_forward(n);
  auto put = [&](const Buffer& b) { return b.cast(dt).to(dev); };
  const DType state = dt == DType::f64 ? DType::f64 : DType::f32;
  const Buffer cu_dev = cu.to(dev), z0_dev = z0.cast(state).to(dev), dz_dev = dz.cast(state).to(dev);
  const Backward ref = normalize_backward(o_raw, q, k, z0, cu, cu, d_o, dz, reverse, false, Device{}, DType::f64);
  const Backward got = normalize_backward(put(o), put(q), put(k), z0_dev, cu_dev, cu, put(d_o), dz_dev, reverse,
                                          true, dev, dt);
  const double tol = dt == DType::f64 ? 1e-12 : 5e-3;
  EXPECT_LE(rel_rms_error(got.d_o_raw, ref.d_o_raw), tol) << "d_o_raw";
  EXPECT_LE(rel_rms_error(got.dq, ref.dq), tol) << "dq";
  EXPECT_LE(rel_rms_error(got.dk, ref.dk), tol) << "dk";
  EXPECT_LE(rel_rms_error(got.dz0, ref.dz0), dt == DType::f64 ? 1e-12 : 1e-4) << "d_z_init";
}

TEST(GlaNormalizeFolded, BackwardFromTheOutputCpu) {
  for (bool reverse : {false, true}) check_backward_from_output(DType::f64, reverse, Device{});
}

TEST(GlaNormalizeFolded, BackwardFromTheOutputGpu) {
  if (!testing::has_cuda()) GTEST_SKIP() << "no GPU";
  for (DType dt : {DType::bf16, DType::f32})
    for (bool reverse : {false, true}) check_backward_from_output(dt, reverse, Device{DeviceType::cuda, 0});
}

// On the CPU the folded call is the op and then the normaliser, bit for bit.
TEST(GlaNormalizeFolded, CpuIsTheOpThenTheNormaliser) {
  Case c;
  c.bounds = {0, 0, 9, 100};
  c.K = 16, c.V = 8, c.dtype = DType::f32;
  std::mt19937_64 rng(7);
  const Inputs in = inputs(c, rng);
  const Outputs folded = forward(c, in, Device{}, DType::f32, true);
  const Outputs unfolded = forward(c, in, Device{}, DType::f32, false);
  EXPECT_EQ(folded.o, unfolded.o);
  EXPECT_EQ(folded.state, unfolded.state);
  EXPECT_EQ(folded.z, unfolded.z);
}

TEST(GlaNormalizeFolded, ArgumentsNameWhatIsWrong) {
  Buffer q(DType::f32, {1, 10, 2, 8}), k(DType::f32, {1, 10, 2, 8}), v(DType::f32, {1, 10, 2, 4}),
      o(DType::f32, {1, 10, 2, 4}), g(DType::f32, {1, 10, 2, 8});
  Buffer z(DType::f32, {1, 2, 8}), z_bad(DType::f32, {1, 2, 7});
  GlaForwardArgs a;
  a.q = q.view(), a.k = k.view(), a.v = v.view(), a.o = o.view(), a.normalize = true;
  a.g = g.view();
  testing::expect_error([&] { gla_forward(a); }, ErrorKind::value, "g", "normalize takes no gate");
  a.g = {}, a.z_final = z_bad.view();
  testing::expect_error([&] { gla_forward(a); }, ErrorKind::value, "z_final", "");
  a.z_final = {}, a.z_init = z_bad.view();
  testing::expect_error([&] { gla_forward(a); }, ErrorKind::value, "z_init", "");
  Buffer pool(DType::f32, {3, 2, 8, 4}), rows(DType::i32, {1});
  rows.set_values({2});
  a.z_init = {}, a.initial_state = pool.view(), a.initial_state_indices = rows.view();
  testing::expect_error([&] { gla_forward(a); }, ErrorKind::value, "normalize", "state pools");
  a.initial_state = {}, a.initial_state_indices = {};
  a.normalize = false, a.z_final = {}, a.z_init = z.view();
  testing::expect_error([&] { gla_forward(a); }, ErrorKind::value, "z_init", "only with normalize");
}

// The backward's folded normaliser (GlaBackwardArgs::norm_o) runs on CUDA only: on the CPU the residual query
// says 0, and residuals passed anyway are refused by name, as are stray or partial ones.
TEST(GlaNormalizeFolded, ResidualsOfTheFoldedBackward) {
  Buffer q(DType::f32, {1, 10, 2, 8}), k(DType::f32, {1, 10, 2, 8}), v(DType::f32, {1, 10, 2, 4}),
      o(DType::f32, {1, 10, 2, 4}), g(DType::f32, {1, 10, 2});
  Buffer den(DType::f32, {1, 10, 2}), chunk_z(DType::f32, {1, 2, 8}), den_bad(DType::f32, {1, 10, 3});
  GlaForwardArgs a;
  a.q = q.view(), a.k = k.view(), a.v = v.view(), a.o = o.view(), a.normalize = true;
  EXPECT_EQ(gla_normalize_residual_slots(a), 0);
  a.norm_den = den.view(), a.norm_chunk_z = chunk_z.view();
  testing::expect_error([&] { gla_forward(a); }, ErrorKind::value, "norm_den", "gla_normalize_residual_slots");
  a.norm_chunk_z = {};
  testing::expect_error([&] { gla_forward(a); }, ErrorKind::value, "norm_chunk_z", "come together");
  a.norm_den = den_bad.view(), a.norm_chunk_z = chunk_z.view();
  testing::expect_error([&] { gla_forward(a); }, ErrorKind::value, "norm_den", "[B, T, H]");
  TensorView strided = den.view();  // the same elements, T and H swapped in memory
  strided.stride[1] = 1, strided.stride[2] = 10;
  a.norm_den = strided;
  testing::expect_error([&] { gla_forward(a); }, ErrorKind::value, "norm_den", "contiguous");
  a.norm_den = den.view(), a.normalize = false;
  testing::expect_error([&] { gla_forward(a); }, ErrorKind::value, "norm_den", "only with normalize");

  Buffer d_o(DType::f32, {1, 10, 2, 4}), dq(DType::f32, {1, 10, 2, 8}), dk(DType::f32, {1, 10, 2, 8}),
      dv(DType::f32, {1, 10, 2, 4}), dg(DType::f32, {1, 10, 2});
  GlaBackwardArgs b;
  b.q = q.view(), b.k = k.view(), b.v = v.view(), b.d_o = d_o.view();
  b.dq = dq.view(), b.dk = dk.view(), b.dv = dv.view();
  b.norm_o = o.view();
  testing::expect_error([&] { gla_backward(b); }, ErrorKind::value, "norm_o", "only with norm_den");
  b.norm_den = den.view(), b.norm_chunk_z = chunk_z.view();
  testing::expect_error([&] { gla_backward(b); }, ErrorKind::unsupported, "norm_den", "CUDA only");
  b.g = g.view(), b.dg = dg.view();
  testing::expect_error([&] { gla_backward(b); }, ErrorKind::value, "g", "no gate");
  b.g = {}, b.dg = {}, b.reverse = true, b.algorithm = GlaAlgorithm::recurrent;
  testing::expect_error([&] { gla_backward(b); }, ErrorKind::value, "algorithm", "chunked");
}

}  // namespace
}  // namespace flashgla
