// Moving strided tensors of any float dtype into contiguous per-(sequence, head)
// buffers of the accumulation type, and back. Every CPU kernel works on such
// buffers, so strides and dtypes are handled here and nowhere else.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/elements.h"   // load_element, store_element
#include "core/problem.h"
#include "core/sequences.h"  // SeqRange, sequence
#include "flashgla/tensor.h"

namespace flashgla::cpu {

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
