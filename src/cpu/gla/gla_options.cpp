// CPU side of FLA 0.6's options (core/gla_options_backend.h): the g_gamma gate and
// its gradient, and the linear-attention normaliser, forward and backward.
// Everything accumulates in fp64: these are also the references the CUDA
// versions are tested against.
#include <algorithm>
#include <functional>
#include <cstdint>
#include <vector>

#include "core/gla_options_backend.h"
#include "cpu/common/io.h"
#include "cpu/common/parallel.h"

namespace flashgla::cpu {
namespace {

int64_t offset3(const TensorView& t, int64_t a, int64_t b, int64_t c) {
  return a * t.stride[0] + b * t.stride[1] + c * t.stride[2];
}

int64_t offset4(const TensorView& t, int64_t a, int64_t b, int64_t c, int64_t d) {
  return a * t.stride[0] + b * t.stride[1] + c * t.stride[2] + d * t.stride[3];
}

// FLA adds this to the denominator q·z (not to its magnitude): a denominator of
// -1e-10 still divides by zero, as in FLA.
constexpr double kNormalizeEps = 1e-10;

// One (sequence, head) pair's tokens in processing order: i-th step -> row of the packed batch.
struct Steps {
  SeqRange s;
  bool reverse;
  int64_t row(int64_t i) const { return s.begin + (reverse ? s.len - 1 - i : i); }
};

void for_each_pair(const GlaProblem& p, const std::function<void(int64_t, int64_t)>& fn) {
  const int64_t pairs = p.num_seqs * p.heads;
  auto item = [&](int64_t i) { fn(i / p.heads, i % p.heads); };
  if (pairs * p.seq_len / std::max<int64_t>(1, p.num_seqs) * (p.key_dim + p.value_dim) < (int64_t(1) << 16)) {
    for (int64_t i = 0; i < pairs; ++i) item(i);
  } else {
    parallel_for(pairs, item);
  }
}

}  // namespace

void gla_gamma_gate(const GammaGateArgs& a) {
  const int64_t B = a.gate.shape[0], T = a.gate.shape[1], H = a.gate.shape[2];
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h) {
        double x = load_element<double>(a.g_gamma, h * a.g_gamma.stride[0]);
        if (a.g.defined()) x += load_element<double>(a.g, offset3(a.g, b, t, h));
        store_element<double>(a.gate, offset3(a.gate, b, t, h), x);
      }
}

void gla_gamma_grad(const GammaGradArgs& a) {
  const int64_t B = a.d_gate.shape[0], T = a.d_gate.shape[1], H = a.d_gate.shape[2];
  std::vector<double> sum(size_t(H), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h) {
        const double x = load_element<double>(a.d_gate, offset3(a.d_gate, b, t, h));
        if (a.dg.defined()) store_element<double>(a.dg, offset3(a.dg, b, t, h), x);
        sum[size_t(h)] += x;
      }
  if (a.d_g_gamma.defined())
    for (int64_t h = 0; h < H; ++h) store_element<double>(a.d_g_gamma, h * a.d_g_gamma.stride[0], sum[size_t(h)]);
}

void gla_normalize_forward(const GlaNormalizeArgs& a, const GlaProblem& p) {
  const int64_t K = p.key_dim, V = p.value_dim;
  for_each_pair(p, [&](int64_t n, int64_t h) {
    const Steps steps{sequence(p, a.cu_seqlens, n), a.reverse};
    const int64_t b = steps.s.batch;
    std::vector<double> z(size_t(K), 0.0);
    if (a.z_init.defined())
      for (int64_t d = 0; d < K; ++d) z[size_t(d)] = load_element<double>(a.z_init, offset3(a.z_init, n, h, d));
    for (int64_t i = 0; i < steps.s.len; ++i) {
      const int64_t t = steps.row(i);
      double qz = 0;
      for (int64_t d = 0; d < K; ++d) {
        z[size_t(d)] += load_element<double>(a.k, offset4(a.k, b, t, h, d));
        qz += load_element<double>(a.q, offset4(a.q, b, t, h, d)) * z[size_t(d)];
      }
      const double den = p.scale * qz + kNormalizeEps;
      for (int64_t e = 0; e < V; ++e)
        store_element<double>(a.o, offset4(a.o, b, t, h, e), load_element<double>(a.o_raw, offset4(a.o_raw, b, t, h, e)) / den);
    }
    if (a.z_final.defined())
      for (int64_t d = 0; d < K; ++d) store_element<double>(a.z_final, offset3(a.z_final, n, h, d), z[size_t(d)]);
  });
}

void gla_normalize_backward(const GlaNormalizeBackwardArgs& a, const GlaProblem& p) {
  const int64_t K = p.key_dim, V = p.value_dim;
  const double scale = p.scale;
  for_each_pair(p, [&](int64_t n, int64_t h) {
    const Steps steps{sequence(p, a.cu_seqlens, n), a.reverse};
    const int64_t b = steps.s.batch, len = steps.s.len;
    std::vector<double> z(size_t(K), 0.0), acc(size_t(K), 0.0), d_den(static_cast<size_t>(len), 0.0);
    if (a.z_init.defined())
      for (int64_t d = 0; d < K; ++d) z[size_t(d)] = load_element<double>(a.z_init, offset3(a.z_init, n, h, d));
    // In processing order: the denominator, d o_raw = d o / den, and dq = d_den · scale · z_t with
    // d_den = -(d o · o_raw) / den² (o_raw_is_output: o_raw holds o = o_raw / den).
    for (int64_t i = 0; i < len; ++i) {
      const int64_t t = steps.row(i);
      double qz = 0;
      for (int64_t d = 0; d < K; ++d) {
        z[size_t(d)] += load_element<double>(a.k, offset4(a.k, b, t, h, d));
        qz += load_element<double>(a.q, offset4(a.q, b, t, h, d)) * z[size_t(d)];
      }
      const double den = scale * qz + kNormalizeEps;
      double dot = 0;
      for (int64_t e = 0; e < V; ++e) {
        const double g = load_element<double>(a.d_o, offset4(a.d_o, b, t, h, e));
        dot += g * load_element<double>(a.o_raw, offset4(a.o_raw, b, t, h, e));
        store_element<double>(a.d_o_raw, offset4(a.d_o_raw, b, t, h, e), g / den);
      }
      d_den[size_t(i)] = a.o_raw_is_output ? -dot / den : -dot / (den * den);  // d o · o_raw = den · d o · o
      for (int64_t d = 0; d < K; ++d)
        store_element<double>(a.dq, offset4(a.dq, b, t, h, d), d_den[size_t(i)] * scale * z[size_t(d)]);
    }
    // z_t holds k_s for every s up to t in processing order, so dk_s sums dz_t = d_den_t · scale · q_t
    // over t from s on, plus the final state's gradient; what is left at the start is z_init's.
    if (a.d_z_final.defined())
      for (int64_t d = 0; d < K; ++d) acc[size_t(d)] = load_element<double>(a.d_z_final, offset3(a.d_z_final, n, h, d));
    for (int64_t i = len - 1; i >= 0; --i) {
      const int64_t t = steps.row(i);
      for (int64_t d = 0; d < K; ++d) {
        acc[size_t(d)] += d_den[size_t(i)] * scale * load_element<double>(a.q, offset4(a.q, b, t, h, d));
        store_element<double>(a.dk, offset4(a.dk, b, t, h, d), acc[size_t(d)]);
      }
    }
    if (a.d_z_init.defined())
      for (int64_t d = 0; d < K; ++d) store_element<double>(a.d_z_init, offset3(a.d_z_init, n, h, d), acc[size_t(d)]);
  });
}

}  // namespace flashgla::cpu
