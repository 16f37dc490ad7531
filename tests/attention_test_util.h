// Helpers for the CUDA softmax-attention tests: a problem description, random
// inputs, forward + backward through the public API with every output
// poisoned (NaN) beforehand, and the lse comparison.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <ostream>
#include <random>
#include <utility>
#include <vector>

#include "flashgla/attention.h"
#include "testing/buffer.h"
#include "tuning_test_util.h"

namespace flashgla::testing::attention_test {

inline const Device kCuda{DeviceType::cuda, 0};

// A problem; with varlen, B == 1 and Tq, Tk are the totals.
struct Case {
  int64_t batch = 2, q_len = 64, k_len = 64, q_heads = 2, kv_heads = 2, head_dim = 64, value_dim = 64;
  bool causal = true;
  DType dtype = DType::bf16;
  std::vector<int64_t> seqlens_q, seqlens_k;
  std::optional<double> scale;
  int64_t row_padding = 0;  // > 0: every tensor on the GPU, inputs and outputs, is a strided slice
  bool deterministic = false;                                // AttentionBackwardArgs::deterministic
  std::optional<AttentionTuning::Kernel> backward_kernel;    // else the environment's (tuning_test_util.h)

  Case lens(int64_t tq, int64_t tk) const { Case c = *this; c.q_len = tq, c.k_len = tk; return c; }
  Case heads(int64_t hq, int64_t hkv) const { Case c = *this; c.q_heads = hq, c.kv_heads = hkv; return c; }
  Case dim(int64_t d) const { return dims(d, d); }
  Case dims(int64_t d, int64_t dv) const { Case c = *this; c.head_dim = d, c.value_dim = dv; return c; }
  Case masked(bool is_causal) const { Case c = *this; c.causal = is_causal; return c; }
  Case with_batch(int64_t b) const { Case c = *this; c.batch = b; return c; }
  Case with_dtype(DType d) const { Case c = *this; c.dtype = d; return c; }
  Case fp16() const { return with_dtype(DType::f16); }
  Case with_scale(double s) const { Case c = *this; c.scale = s; return c; }
  Case padded(int64_t p) const { Case c = *this; c.row_padding = p; return c; }
  Case in_turns() const { Case c = *this; c.deterministic = true; return c; }
  Case backward_on(AttentionTuning::Kernel k) const { Case c = *this; c.backward_kernel = k; return c; }
  Case varlen(std::vector<int64_t> lq, std::vector<int64_t> lk) const {
    Case c = *this;
    c.batch = 1, c.q_len = 0, c.k_len = 0;
    for (int64_t l : lq) c.q_len += l;
    for (int64_t l : lk) c.k_len += l;
    c.seqlens_q = std::move(lq), c.seqlens_k = std::move(lk);
    return c;
  }
};

inline void PrintTo(const Case& c, std::ostream* os) {
  *os << dtype_name(c.dtype) << " B=" << c.batch << " Tq=" << c.q_len << " Tk=" << c.k_len << " Hq=" << c.q_heads
      << " Hkv=" << c.kv_heads << " D=" << c.head_dim;
  if (c.value_dim != c.head_dim) *os << " Dv=" << c.value_dim;
  *os << (c.causal ? " causal" : " full");
  if (!c.seqlens_q.empty()) {
    *os << " varlen q/k:";
    for (size_t n = 0; n < c.seqlens_q.size(); ++n) *os << " " << c.seqlens_q[n] << "/" << c.seqlens_k[n];
  }
  if (c.scale) *os << " scale=" << *c.scale;
  if (c.row_padding > 0) *os << " padding=" << c.row_padding;
  if (c.deterministic) *os << " deterministic";
  if (c.backward_kernel)
    *os << (*c.backward_kernel == AttentionTuning::Kernel::hopper ? " hopper-bwd" : " portable-bwd");
}

// cu_seqlens [N+1] (int32) from the lengths; absent for fixed-length cases.
inline Buffer boundaries(const std::vector<int64_t>& seqlens, Device device) {
  if (seqlens.empty()) return {};
  std::vector<double> cumsum{0};
  for (int64_t len : seqlens) cumsum.push_back(cumsum.back() + double(len));
  Buffer b(DType::i32, {int64_t(cumsum.size())});
  b.set_values(cumsum);
  return b.to(device);
}

struct Tensors {
  Buffer q, k, v, d_o, cu_q, cu_k;
};

// Fresh N(0, 1) inputs in the case's dtype, on the CPU.
inline Tensors make_inputs(const Case& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto random = [&](std::vector<int64_t> shape) {
    Buffer b(c.dtype, std::move(shape));
    b.fill_normal(rng);
    return b;
  };
  Tensors t;
  t.q = random({c.batch, c.q_len, c.q_heads, c.head_dim});
  t.k = random({c.batch, c.k_len, c.kv_heads, c.head_dim});
  t.v = random({c.batch, c.k_len, c.kv_heads, c.value_dim});
  t.d_o = random({c.batch, c.q_len, c.q_heads, c.value_dim});
  t.cu_q = boundaries(c.seqlens_q, {});
  t.cu_k = boundaries(c.seqlens_k, {});
  return t;
}

inline Tensors to_device(const Tensors& t, int64_t padding) {
  return {t.q.to(kCuda, padding), t.k.to(kCuda, padding), t.v.to(kCuda, padding), t.d_o.to(kCuda, padding),
          t.cu_q.to(kCuda), t.cu_k.to(kCuda)};
}

// The same values in fp64 (the reference's inputs).
inline Tensors as_f64(const Tensors& t) {
  return {t.q.cast(DType::f64), t.k.cast(DType::f64), t.v.cast(DType::f64), t.d_o.cast(DType::f64), t.cu_q, t.cu_k};
}

inline Buffer poisoned(DType dtype, std::vector<int64_t> shape, Device device, int64_t padding) {
  Buffer b(dtype, std::move(shape), device, padding);
  b.poison();
  return b;
}

struct Results {
  Buffer o, lse, dq, dk, dv;
};

// Forward, then backward from the forward's own o and lse.
inline Results run(const Case& c, const Tensors& in, Device device, AttentionAlgorithm algorithm, int64_t padding) {
  Results r;
  const DType out_dtype = in.q.dtype();
  r.o = poisoned(out_dtype, {c.batch, c.q_len, c.q_heads, c.value_dim}, device, padding);
  r.lse = poisoned(DType::f32, {c.batch, c.q_heads, c.q_len}, device, 0);
  AttentionForwardArgs f;
  f.q = in.q.view(), f.k = in.k.view(), f.v = in.v.view();
  f.cu_seqlens_q = in.cu_q.view(), f.cu_seqlens_k = in.cu_k.view();
  f.causal = c.causal, f.scale = c.scale, f.algorithm = algorithm;
  f.o = r.o.view(), f.lse = r.lse.view();
  f.tuning = test_attention_tuning();
  attention_forward(f);

  r.dq = poisoned(out_dtype, {c.batch, c.q_len, c.q_heads, c.head_dim}, device, padding);
  r.dk = poisoned(out_dtype, {c.batch, c.k_len, c.kv_heads, c.head_dim}, device, padding);
  r.dv = poisoned(out_dtype, {c.batch, c.k_len, c.kv_heads, c.value_dim}, device, padding);
  AttentionBackwardArgs b;
  b.q = f.q, b.k = f.k, b.v = f.v, b.cu_seqlens_q = f.cu_seqlens_q, b.cu_seqlens_k = f.cu_seqlens_k;
  b.causal = c.causal, b.scale = c.scale, b.algorithm = algorithm;
  b.o = r.o.view(), b.lse = r.lse.view(), b.d_o = in.d_o.view();
  b.dq = r.dq.view(), b.dk = r.dk.view(), b.dv = r.dv.view();
  b.deterministic = c.deterministic;
  b.tuning = test_attention_backward_tuning();
  if (c.backward_kernel) b.tuning.kernel = *c.backward_kernel;
  attention_backward(b);
  synchronize(device);
  return r;
}

// lse: −inf exactly where the reference has −inf (rows that see no key), and
// a small relative error elsewhere; NaN for any mismatch or non-finite value.
inline double lse_error(const std::vector<double>& out, const std::vector<double>& ref) {
  std::vector<double> a, b;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isinf(ref[i])) {
      if (out[i] != ref[i]) return std::nan("");
      continue;
    }
    a.push_back(out[i]), b.push_back(ref[i]);
  }
  return b.empty() ? 0.0 : rel_rms_error(a, b);
}

}  // namespace flashgla::testing::attention_test
