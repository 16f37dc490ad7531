// FLA 0.6's options through the C++ API: the normaliser (gla_normalize_forward /
// _backward) against an fp64 loop, state_v_first and g_gamma against the same op
// with a transposed state and a materialised gate; on the CPU and (when present)
// a CUDA device; and their argument errors.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "flashgla/flashgla.h"
#include "test_util.h"
#include "testing/buffer.h"

namespace flashgla {
namespace {

using testing::Buffer;
using testing::expect_error;
using testing::rel_rms_error;

std::vector<Device> devices() {
  std::vector<Device> out{Device{}};
  if (testing::has_cuda()) out.push_back(Device{DeviceType::cuda, 0});
  return out;
}

DType dtype_on(const Device& d) { return d.type == DeviceType::cpu ? DType::f32 : DType::bf16; }
double tolerance_on(const Device& d) { return d.type == DeviceType::cpu ? 3e-5 : 2e-2; }

Buffer random(std::mt19937_64& rng, DType dtype, std::vector<int64_t> shape, double lo, double hi) {
  Buffer b(dtype, std::move(shape));
  b.fill_uniform(rng, lo, hi);
  return b;
}

Buffer output(DType dtype, std::vector<int64_t> shape, const Device& device) {
  Buffer b(dtype, std::move(shape), device);
  b.poison();
  return b;
}

// ---- the normaliser ---------------------------------------------------------

struct NormRef {
  std::vector<double> o, z, d_o_raw, dq, dk, dz0;
};

// From the definition, in fp64: z_t = z0 + Σ k up to t (from t on with reverse), o_t = o_raw_t / (s q_t·z_t + 1e-10);
// the gradients by differentiating those lines by hand, token by token.
NormRef normalize_reference(const std::vector<double>& o_raw, const std::vector<double>& q, const std::vector<double>& k,
                            const std::vector<double>& z0, const std::vector<double>& d_o, const std::vector<double>& dz,
                            const std::vector<int64_t>& bounds, int64_t H, int64_t K, int64_t V, double s, bool reverse) {
  const int64_t T = bounds.back(), N = int64_t(bounds.size()) - 1;
  NormRef r;
  r.o.assign(size_t(T * H * V), 0), r.d_o_raw = r.o, r.dq.assign(size_t(T * H * K), 0), r.dk = r.dq;
  r.z.assign(size_t(N * H * K), 0), r.dz0 = r.z;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t len = bounds[size_t(n + 1)] - bounds[size_t(n)];
      auto row = [&](int64_t i) { return bounds[size_t(n)] + (reverse ? len - 1 - i : i); };
      std::vector<double> z(static_cast<size_t>(K), 0.0), dden(static_cast<size_t>(len), 0.0);
      for (int64_t d = 0; d < K; ++d) z[size_t(d)] = z0[size_t((n * H + h) * K + d)];
      for (int64_t i = 0; i < len; ++i) {
        const int64_t t = row(i);
        double qz = 0, dot = 0;
        for (int64_t d = 0; d < K; ++d) {
          z[size_t(d)] += k[size_t((t * H + h) * K + d)];
          qz += q[size_t((t * H + h) * K + d)] * z[size_t(d)];
        }
        const double den = s * qz + 1e-10;
        for (int64_t e = 0; e < V; ++e) {
          const size_t at = size_t((t * H + h) * V + e);
          r.o[at] = o_raw[at] / den;
          r.d_o_raw[at] = d_o[at] / den;
          dot += d_o[at] * o_raw[at];
        }
        dden[size_t(i)] = -dot / (den * den);
        for (int64_t d = 0; d < K; ++d) r.dq[size_t((t * H + h) * K + d)] = dden[size_t(i)] * s * z[size_t(d)];
      }
      for (int64_t d = 0; d < K; ++d) {
        r.z[size_t((n * H + h) * K + d)] = z[size_t(d)];
        double acc = dz[size_t((n * H + h) * K + d)];
        for (int64_t i = len - 1; i >= 0; --i) {
          const int64_t t = row(i);
          acc += dden[size_t(i)] * s * q[size_t((t * H + h) * K + d)];
          r.dk[size_t((t * H + h) * K + d)] = acc;
        }
        r.dz0[size_t((n * H + h) * K + d)] = acc;
      }
    }
  return r;
}

TEST(GlaApiOptions, NormalizerAgainstFp64) {
  const int64_t H = 2, K = 40, V = 12;
  const std::vector<int64_t> bounds{0, 5, 5, 6, 77};  // an empty and a one-token sequence, one over two tiles
  const int64_t T = bounds.back(), N = int64_t(bounds.size()) - 1;
  for (const Device& dev : devices())
    for (bool reverse : {false, true}) {
      std::mt19937_64 rng(77 + reverse);
      const DType dt = dtype_on(dev);
      // Positive q, k (a feature map), so that q·z stays away from 0.
      Buffer q = random(rng, dt, {1, T, H, K}, 0.05, 1.0), k = random(rng, dt, {1, T, H, K}, 0.05, 1.0);
      Buffer o_raw = random(rng, dt, {1, T, H, V}, -1, 1), d_o = random(rng, dt, {1, T, H, V}, -1, 1);
      Buffer z0 = random(rng, DType::f32, {N, H, K}, 0.0, 2.0), dz = random(rng, DType::f32, {N, H, K}, -1, 1);
      Buffer cu(DType::i32, {N + 1});
      cu.set_values(std::vector<double>(bounds.begin(), bounds.end()));
      const NormRef ref = normalize_reference(o_raw.values(), q.values(), k.values(), z0.values(), d_o.values(),
                                              dz.values(), bounds, H, K, V, 0.3, reverse);
      Buffer dq_ = q.to(dev), dk_ = k.to(dev), do_ = o_raw.to(dev, 3), dd_o = d_o.to(dev), dz0_ = z0.to(dev),
             ddz = dz.to(dev), dcu = cu.to(dev);
      Buffer o = output(dt, {1, T, H, V}, dev), z = output(DType::f32, {N, H, K}, dev);
      GlaNormalizeArgs a;
      a.o_raw = do_.view(), a.q = dq_.view(), a.k = dk_.view(), a.z_init = dz0_.view();
      a.cu_seqlens = dcu.view(), a.cu_seqlens_host = cu.view(), a.scale = 0.3, a.reverse = reverse;
      a.o = o.view(), a.z_final = z.view();
      gla_normalize_forward(a);
      Buffer d_o_raw = output(dt, {1, T, H, V}, dev), dq = output(dt, {1, T, H, K}, dev),
             dk = output(dt, {1, T, H, K}, dev), dz0 = output(DType::f32, {N, H, K}, dev);
      GlaNormalizeBackwardArgs b;
      b.o_raw = a.o_raw, b.q = a.q, b.k = a.k, b.z_init = a.z_init, b.cu_seqlens = a.cu_seqlens;
      b.cu_seqlens_host = a.cu_seqlens_host, b.scale = a.scale, b.reverse = reverse;
      b.d_o = dd_o.view(), b.d_z_final = ddz.view();
      b.d_o_raw = d_o_raw.view(), b.dq = dq.view(), b.dk = dk.view(), b.d_z_init = dz0.view();
      gla_normalize_backward(b);
      testing::synchronize(dev);
      const double tol = tolerance_on(dev);
      const std::string where = dev.str() + (reverse ? " reverse" : "");
      EXPECT_LE(rel_rms_error(o.values(), ref.o), tol) << "o " << where;
      EXPECT_LE(rel_rms_error(z.values(), ref.z), 3e-5) << "z_final " << where;
      EXPECT_LE(rel_rms_error(d_o_raw.values(), ref.d_o_raw), tol) << "d_o_raw " << where;
      EXPECT_LE(rel_rms_error(dq.values(), ref.dq), tol) << "dq " << where;
      EXPECT_LE(rel_rms_error(dk.values(), ref.dk), tol) << "dk " << where;
      EXPECT_LE(rel_rms_error(dz0.values(), ref.dz0), 1e-4) << "d_z_init " << where;
    }
}

// ---- state_v_first and g_gamma ----------------------------------------------

struct GlaInputs {
  Buffer q, k, v, g, g_gamma, h0, d_o, dht;
};

// [N,H,K,V] values <-> [N,H,V,K] values.
std::vector<double> swap_kv(const std::vector<double>& x, int64_t NH, int64_t A, int64_t B) {
  std::vector<double> out(x.size());
  for (int64_t m = 0; m < NH; ++m)
    for (int64_t a = 0; a < A; ++a)
      for (int64_t b = 0; b < B; ++b) out[size_t((m * B + b) * A + a)] = x[size_t((m * A + a) * B + b)];
  return out;
}

struct Results {
  std::vector<double> o, ht, dq, dk, dv, dg, dh0, d_gamma;
};

// One forward and backward; with v_first the states go in and come back [N,H,V,K]. gate: the g buffer (or none);
// gamma: the g_gamma buffer (or none).
Results run(const Device& dev, GlaAlgorithm algorithm, const Buffer& q, const Buffer& k, const Buffer& v,
            const Buffer& gate, const Buffer& gamma, const Buffer& h0, const Buffer& d_o, const Buffer& dht,
            bool v_first) {
  const int64_t N = h0.shape()[0], H = h0.shape()[1];
  const DType dt = q.dtype();
  const std::vector<int64_t> state{N, H, h0.shape()[2], h0.shape()[3]};
  Buffer dq_ = q.to(dev), dk_ = k.to(dev), dv_ = v.to(dev), dg_ = gate.defined() ? gate.to(dev) : Buffer();
  Buffer dgm = gamma.defined() ? gamma.to(dev) : Buffer(), dh0_ = h0.to(dev), ddo = d_o.to(dev), ddht = dht.to(dev);
  Buffer o = output(dt, v.shape(), dev), ht = output(DType::f32, state, dev);
  GlaForwardArgs a;
  a.q = dq_.view(), a.k = dk_.view(), a.v = dv_.view(), a.g = dg_.view(), a.g_gamma = dgm.view();
  a.initial_state = dh0_.view(), a.algorithm = algorithm, a.state_v_first = v_first;
  a.o = o.view(), a.final_state = ht.view();
  gla_forward(a);
  Buffer dq = output(dt, q.shape(), dev), dk = output(dt, k.shape(), dev), dv = output(dt, v.shape(), dev);
  Buffer dg = gate.defined() ? output(DType::f32, gate.shape(), dev) : Buffer();
  Buffer dh0 = output(DType::f32, state, dev);
  Buffer d_gamma = gamma.defined() ? output(DType::f32, gamma.shape(), dev) : Buffer();
  GlaBackwardArgs b;
  b.q = a.q, b.k = a.k, b.v = a.v, b.g = a.g, b.g_gamma = a.g_gamma, b.initial_state = a.initial_state;
  b.algorithm = algorithm, b.state_v_first = v_first, b.d_o = ddo.view(), b.d_final_state = ddht.view();
  b.dq = dq.view(), b.dk = dk.view(), b.dv = dv.view(), b.dg = dg.view(), b.d_initial_state = dh0.view();
  b.d_g_gamma = d_gamma.view();
  if (dev.type == DeviceType::cuda) {  // once with the caller's workspace (the gate scratch at its head)
    Buffer ws(DType::f32, {int64_t(gla_backward_workspace_bytes(b) / 4 + 1)}, dev);
    b.workspace = ws.view().data, b.workspace_bytes = gla_backward_workspace_bytes(b);
    gla_backward(b);
    testing::synchronize(dev);
  } else {
    gla_backward(b);
  }
  Results r{o.values(), ht.values(), dq.values(), dk.values(), dv.values(), {}, dh0.values(), {}};
  if (gate.defined()) r.dg = dg.values();
  if (gamma.defined()) r.d_gamma = d_gamma.values();
  return r;
}

void expect_near(const std::vector<double>& out, const std::vector<double>& ref, double tol, const std::string& what) {
  EXPECT_LE(rel_rms_error(out, ref), tol) << what;
}

TEST(GlaApiOptions, StateVFirstAndGGamma) {
  const int64_t B = 2, T = 70, H = 3, K = 16, V = 24;
  for (const Device& dev : devices())
    for (GlaAlgorithm algorithm : {GlaAlgorithm::chunked, GlaAlgorithm::recurrent}) {
      std::mt19937_64 rng(5 + int(algorithm));
      const DType dt = dtype_on(dev);
      const std::string where = dev.str() + (algorithm == GlaAlgorithm::chunked ? " chunked" : " recurrent");
      // The same op on the same values: equal on the CPU; on a GPU another kernel may take a strided state.
      const double same = dev.type == DeviceType::cpu ? 1e-6 : 1e-2;
      Buffer q = random(rng, dt, {B, T, H, K}, -1, 1), k = random(rng, dt, {B, T, H, K}, -1, 1);
      Buffer v = random(rng, dt, {B, T, H, V}, -1, 1), d_o = random(rng, dt, {B, T, H, V}, -1, 1);
      Buffer g = random(rng, DType::f32, {B, T, H}, -0.5, 0.0), gamma = random(rng, DType::f32, {H}, -0.3, -0.01);
      Buffer h0 = random(rng, DType::f32, {B, H, K, V}, -1, 1), dht = random(rng, DType::f32, {B, H, K, V}, -1, 1);

      // state_v_first: the [K, V] results, transposed.
      const Results kv = run(dev, algorithm, q, k, v, g, Buffer(), h0, d_o, dht, false);
      Buffer h0_vk(DType::f32, {B, H, V, K}), dht_vk(DType::f32, {B, H, V, K});
      h0_vk.set_values(swap_kv(h0.values(), B * H, K, V)), dht_vk.set_values(swap_kv(dht.values(), B * H, K, V));
      const Results vk = run(dev, algorithm, q, k, v, g, Buffer(), h0_vk, d_o, dht_vk, true);
      expect_near(vk.o, kv.o, same, "state_v_first o " + where);
      expect_near(swap_kv(vk.ht, B * H, V, K), kv.ht, same, "state_v_first ht " + where);
      expect_near(swap_kv(vk.dh0, B * H, V, K), kv.dh0, same, "state_v_first dh0 " + where);
      expect_near(vk.dq, kv.dq, same, "state_v_first dq " + where);

      // g_gamma: the same as the gate g + g_gamma (or g_gamma broadcast), d_g_gamma the sum of its gradient.
      for (bool with_g : {true, false}) {
        std::vector<double> sum = g.values(), gm = gamma.values();
        for (size_t i = 0; i < sum.size(); ++i) sum[i] = (with_g ? sum[i] : 0.0) + gm[i % size_t(H)];
        Buffer materialised(DType::f32, {B, T, H});
        materialised.set_values(sum);
        const Results ref = run(dev, algorithm, q, k, v, materialised, Buffer(), h0, d_o, dht, false);
        const Results got = run(dev, algorithm, q, k, v, with_g ? g : Buffer(), gamma, h0, d_o, dht, false);
        const std::string what = std::string(with_g ? " g + g_gamma " : " g_gamma alone ") + where;
        expect_near(got.o, ref.o, same, "o" + what);
        expect_near(got.ht, ref.ht, same, "ht" + what);
        expect_near(got.dk, ref.dk, same, "dk" + what);
        expect_near(got.dh0, ref.dh0, same, "dh0" + what);
        if (with_g) expect_near(got.dg, ref.dg, same, "dg" + what);
        std::vector<double> d_gamma(size_t(H), 0.0);
        for (size_t i = 0; i < ref.dg.size(); ++i) d_gamma[i % size_t(H)] += ref.dg[i];
        expect_near(got.d_gamma, d_gamma, 1e-5, "d_g_gamma" + what);  // an fp32 output
      }
    }
}

// On CUDA the chunked kernels add g_gamma where they read the gate and sum its gradient per chunk: the same
// kernels as with the materialised fp32 gate, so the same numbers (d_g_gamma up to the order of its sum), at
// shapes that take every chunked forward (fast, Hopper in bf16 and fp16, general) and backward (plain, general) kernel
// (tests/python/test_fla_api.py covers varlen against the fp64 recurrence).
TEST(GlaApiOptions, GGammaInTheCudaKernels) {
  if (!testing::has_cuda()) GTEST_SKIP() << "needs a CUDA device";
  const Device dev{DeviceType::cuda, 0};
  struct Shape {
    int64_t B, T, H, K, V;
    DType dtype;
  };
  const Shape shapes[] = {{2, 300, 2, 128, 128, DType::bf16}, {1, 1000, 3, 64, 64, DType::bf16},
                          {2, 130, 2, 192, 64, DType::bf16},  {2, 77, 2, 40, 24, DType::bf16},
                          {2, 150, 2, 64, 64, DType::f16},    {1, 90, 2, 32, 16, DType::f32},
                          {2, 130, 2, 192, 64, DType::f16}};
  int seed = 40;
  for (const Shape& s : shapes)
    for (bool with_g : {true, false}) {
      std::mt19937_64 rng(seed++);
      const std::vector<int64_t> qk{s.B, s.T, s.H, s.K}, vo{s.B, s.T, s.H, s.V}, state{s.B, s.H, s.K, s.V};
      Buffer q = random(rng, s.dtype, qk, -1, 1), k = random(rng, s.dtype, qk, -1, 1);
      Buffer v = random(rng, s.dtype, vo, -1, 1), d_o = random(rng, s.dtype, vo, -1, 1);
      Buffer g = random(rng, DType::f32, {s.B, s.T, s.H}, -0.5, 0.0), gamma = random(rng, DType::f32, {s.H}, -0.3, -0.01);
      Buffer h0 = random(rng, DType::f32, state, -1, 1), dht = random(rng, DType::f32, state, -1, 1);
      std::vector<double> sum = g.values(), gm = gamma.values();
      for (size_t i = 0; i < sum.size(); ++i)
        sum[i] = double(float(gm[i % size_t(s.H)]) + float(with_g ? sum[i] : 0.0));  // fp32, as the kernels add
      Buffer materialised(DType::f32, {s.B, s.T, s.H});
      materialised.set_values(sum);
      const Results ref = run(dev, GlaAlgorithm::chunked, q, k, v, materialised, Buffer(), h0, d_o, dht, false);
      const Results got =
          run(dev, GlaAlgorithm::chunked, q, k, v, with_g ? g : Buffer(), gamma, h0, d_o, dht, false);
      const std::string what = std::string(with_g ? " g + g_gamma" : " g_gamma alone") + " B" + std::to_string(s.B) +
                               " T" + std::to_string(s.T) + " K" + std::to_string(s.K) + " V" + std::to_string(s.V) +
                               " " + dtype_name(s.dtype);
      for (auto [out, ref_out, name] : {std::tuple{&got.o, &ref.o, "o"}, {&got.ht, &ref.ht, "ht"},
                                        {&got.dq, &ref.dq, "dq"}, {&got.dk, &ref.dk, "dk"}, {&got.dv, &ref.dv, "dv"},
                                        {&got.dh0, &ref.dh0, "dh0"}})
        expect_near(*out, *ref_out, 1e-6, name + what);
      if (with_g) expect_near(got.dg, ref.dg, 1e-6, "dg" + what);
      std::vector<double> d_gamma(size_t(s.H), 0.0);
      for (size_t i = 0; i < ref.dg.size(); ++i) d_gamma[i % size_t(s.H)] += ref.dg[i];
      expect_near(got.d_gamma, d_gamma, 1e-5, "d_g_gamma" + what);
    }
}

TEST(GlaApiOptions, Errors) {
  Buffer q(DType::f32, {1, 4, 2, 8}), k(DType::f32, {1, 4, 2, 8}), v(DType::f32, {1, 4, 2, 6});
  Buffer g4(DType::f32, {1, 4, 2, 8}), gamma(DType::f32, {2}), gamma3(DType::f32, {3}), o(DType::f32, {1, 4, 2, 6});
  Buffer h0(DType::f32, {1, 2, 8, 6});
  for (Buffer* b : {&q, &k, &v, &g4, &gamma, &gamma3, &h0}) b->fill(-0.1);
  GlaForwardArgs a;
  a.q = q.view(), a.k = k.view(), a.v = v.view(), a.o = o.view();
  a.g_gamma = gamma3.view();
  expect_error([&] { gla_forward(a); }, ErrorKind::value, "g_gamma", "[H]");
  a.g_gamma = gamma.view(), a.g = g4.view();
  expect_error([&] { gla_forward(a); }, ErrorKind::value, "g_gamma", "scalar gate");
  a.g = {}, a.g_gamma = {}, a.initial_state = h0.view(), a.state_v_first = true;
  expect_error([&] { gla_forward(a); }, ErrorKind::value, "initial_state", "[N, H, V, K]");
  GlaBackwardArgs b;
  b.q = q.view(), b.k = k.view(), b.v = v.view(), b.d_o = o.view(), b.dq = q.view(), b.dk = k.view(), b.dv = v.view();
  b.d_g_gamma = gamma.view();
  expect_error([&] { gla_backward(b); }, ErrorKind::value, "d_g_gamma", "without g_gamma");
  GlaNormalizeArgs n;
  Buffer z(DType::f32, {1, 2, 7});
  n.o_raw = o.view(), n.q = q.view(), n.k = k.view(), n.o = o.view(), n.z_init = z.view();
  expect_error([&] { gla_normalize_forward(n); }, ErrorKind::value, "z_init", "[N, H, K]");
}

}  // namespace
}  // namespace flashgla
