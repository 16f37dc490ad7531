// Moving strided tensors of any float dtype into contiguous per-(sequence, head)
// buffers of the accumulation type, and back. Every CPU kernel works on such
// buffers, so strides and dtypes are handled here and nowhere else.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/half.h"
#include "core/problem.h"
#include "flashgla/tensor.h"

namespace flashgla::cpu {

template <class T>
inline T load_element(const TensorView& t, int64_t offset) {
  const char* base = static_cast<const char*>(t.data);
  switch (t.dtype) {
    case DType::f64: return T(reinterpret_cast<const double*>(base)[offset]);
    case DType::f32: return T(reinterpret_cast<const float*>(base)[offset]);
    case DType::bf16: return T(bf16_to_float(reinterpret_cast<const uint16_t*>(base)[offset]));
    case DType::f16: return T(f16_to_float(reinterpret_cast<const uint16_t*>(base)[offset]));
    case DType::i32: return T(reinterpret_cast<const int32_t*>(base)[offset]);
    case DType::i64: return T(reinterpret_cast<const int64_t*>(base)[offset]);
  }
  return T(0);
}

template <class T>
inline void store_element(const TensorView& t, int64_t offset, T value) {
  char* base = static_cast<char*>(t.data);
  switch (t.dtype) {
    case DType::f64: reinterpret_cast<double*>(base)[offset] = double(value); break;
    case DType::f32: reinterpret_cast<float*>(base)[offset] = float(value); break;
    case DType::bf16: reinterpret_cast<uint16_t*>(base)[offset] = float_to_bf16(float(value)); break;
    case DType::f16: reinterpret_cast<uint16_t*>(base)[offset] = float_to_f16(float(value)); break;
    case DType::i32: reinterpret_cast<int32_t*>(base)[offset] = int32_t(value); break;
    case DType::i64: reinterpret_cast<int64_t*>(base)[offset] = int64_t(value); break;
  }
}

// A sequence: batch row `batch`, tokens [begin, begin + len).
struct SeqRange {
  int64_t batch = 0;
  int64_t begin = 0;
  int64_t len = 0;
};

// The n-th sequence of a checked problem (cu_seqlens, when given, is on the CPU).
inline SeqRange sequence(const GlaProblem& p, const TensorView& cu_seqlens, int64_t n) {
  if (!p.varlen) return {n, 0, p.seq_len};
  int64_t b = load_element<int64_t>(cu_seqlens, n * cu_seqlens.stride[0]);
  int64_t e = load_element<int64_t>(cu_seqlens, (n + 1) * cu_seqlens.stride[0]);
  return {0, b, e - b};
}

// x[batch, begin + i, head, d] -> dst[i * D + d] for a [B,T,H,D] tensor.
template <class T>
void gather_rows(const TensorView& x, const SeqRange& s, int64_t head, T* dst) {
  const int64_t D = x.shape[3];
  const int64_t base = s.batch * x.stride[0] + s.begin * x.stride[1] + head * x.stride[2];
  for (int64_t i = 0; i < s.len; ++i)
    for (int64_t d = 0; d < D; ++d) dst[i * D + d] = load_element<T>(x, base + i * x.stride[1] + d * x.stride[3]);
}

template <class T>
void scatter_rows(const TensorView& x, const SeqRange& s, int64_t head, const T* src) {
  const int64_t D = x.shape[3];
  const int64_t base = s.batch * x.stride[0] + s.begin * x.stride[1] + head * x.stride[2];
  for (int64_t i = 0; i < s.len; ++i)
    for (int64_t d = 0; d < D; ++d) store_element<T>(x, base + i * x.stride[1] + d * x.stride[3], src[i * D + d]);
}

// The gate as a dense [len, K] buffer whatever its kind: zeros when absent,
// the scalar broadcast over K for simple GLA.
template <class T>
void gather_gate(const TensorView& g, GateKind kind, const SeqRange& s, int64_t head, int64_t K, T* dst) {
  if (kind == GateKind::vector) return gather_rows(g, s, head, dst);
  for (int64_t i = 0; i < s.len; ++i) {
    T value = kind == GateKind::none
                  ? T(0)
                  : load_element<T>(g, s.batch * g.stride[0] + (s.begin + i) * g.stride[1] + head * g.stride[2]);
    std::fill(dst + i * K, dst + (i + 1) * K, value);
  }
}

// Writes the gradient of a dense [len, K] gate back to g's shape: a scalar
// gate's gradient is the sum over K. Nothing to write when there is no gate.
template <class T>
void scatter_gate_grad(const TensorView& dg, GateKind kind, const SeqRange& s, int64_t head, int64_t K, const T* src) {
  if (kind == GateKind::vector) return scatter_rows(dg, s, head, src);
  if (kind == GateKind::none) return;
  for (int64_t i = 0; i < s.len; ++i) {
    T sum = 0;
    for (int64_t d = 0; d < K; ++d) sum += src[i * K + d];
    store_element<T>(dg, s.batch * dg.stride[0] + (s.begin + i) * dg.stride[1] + head * dg.stride[2], sum);
  }
}

// state[n, head, :, :] -> dst[K * V] (zeros when the state is absent).
template <class T>
void gather_state(const TensorView& state, int64_t n, int64_t head, int64_t K, int64_t V, T* dst) {
  if (!state.defined()) return std::fill(dst, dst + K * V, T(0));
  const int64_t base = n * state.stride[0] + head * state.stride[1];
  for (int64_t i = 0; i < K; ++i)
    for (int64_t j = 0; j < V; ++j) dst[i * V + j] = load_element<T>(state, base + i * state.stride[2] + j * state.stride[3]);
}

template <class T>
void scatter_state(const TensorView& state, int64_t n, int64_t head, int64_t K, int64_t V, const T* src) {
  if (!state.defined()) return;
  const int64_t base = n * state.stride[0] + head * state.stride[1];
  for (int64_t i = 0; i < K; ++i)
    for (int64_t j = 0; j < V; ++j) store_element<T>(state, base + i * state.stride[2] + j * state.stride[3], src[i * V + j]);
}

}  // namespace flashgla::cpu
