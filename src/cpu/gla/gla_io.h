// io.h's gather_rows/scatter_rows with the dtype switch taken out of the
// element loop: one switch per element cost as much as the chunked kernel
// itself on long sequences. Same contract: x is a [B, T, H, D] tensor of a
// float dtype, the buffer holds the rows of one (sequence, head) pair (or of
// a range of its tokens: s.begin and s.len say which).
#pragma once

#include <cstdint>

#include "core/half.h"
#include "cpu/common/io.h"

namespace flashgla::cpu::gla {

namespace detail {
// fn(offset of element [batch, begin + i, head, d], i * D + d) for every element.
template <class Fn>
void for_each_row_element(const TensorView& x, const SeqRange& s, int64_t head, Fn fn) {
  const int64_t D = x.shape[3];
  const int64_t base = s.batch * x.stride[0] + s.begin * x.stride[1] + head * x.stride[2];
  for (int64_t i = 0; i < s.len; ++i) {
    const int64_t row = base + i * x.stride[1];
    for (int64_t d = 0; d < D; ++d) fn(row + d * x.stride[3], i * D + d);
  }
}
}  // namespace detail

template <class T>
void gather_head_rows(const TensorView& x, const SeqRange& s, int64_t head, T* dst) {
  using detail::for_each_row_element;
  switch (x.dtype) {
    case DType::f64: {
      const double* p = static_cast<const double*>(x.data);
      return for_each_row_element(x, s, head, [&](int64_t from, int64_t to) { dst[to] = T(p[from]); });
    }
    case DType::f32: {
      const float* p = static_cast<const float*>(x.data);
      return for_each_row_element(x, s, head, [&](int64_t from, int64_t to) { dst[to] = T(p[from]); });
    }
    case DType::bf16: {
      const uint16_t* p = static_cast<const uint16_t*>(x.data);
      return for_each_row_element(x, s, head, [&](int64_t from, int64_t to) { dst[to] = T(bf16_to_float(p[from])); });
    }
    case DType::f16: {
      const uint16_t* p = static_cast<const uint16_t*>(x.data);
      return for_each_row_element(x, s, head, [&](int64_t from, int64_t to) { dst[to] = T(f16_to_float(p[from])); });
    }
    default: return gather_rows(x, s, head, dst);
  }
}

template <class T>
void scatter_head_rows(const TensorView& x, const SeqRange& s, int64_t head, const T* src) {
  using detail::for_each_row_element;
  switch (x.dtype) {
    case DType::f64: {
      double* p = static_cast<double*>(x.data);
      return for_each_row_element(x, s, head, [&](int64_t to, int64_t from) { p[to] = double(src[from]); });
    }
    case DType::f32: {
      float* p = static_cast<float*>(x.data);
      return for_each_row_element(x, s, head, [&](int64_t to, int64_t from) { p[to] = float(src[from]); });
    }
    case DType::bf16: {
      uint16_t* p = static_cast<uint16_t*>(x.data);
      return for_each_row_element(x, s, head,
                                  [&](int64_t to, int64_t from) { p[to] = float_to_bf16(float(src[from])); });
    }
    case DType::f16: {
      uint16_t* p = static_cast<uint16_t*>(x.data);
      return for_each_row_element(x, s, head,
                                  [&](int64_t to, int64_t from) { p[to] = float_to_f16(float(src[from])); });
    }
    default: return scatter_rows(x, s, head, src);
  }
}

// io.h's gather_gate / scatter_gate_grad with the vector gate through the above.
template <class T>
void gather_head_gate(const TensorView& g, GateKind kind, const SeqRange& s, int64_t head, int64_t K, T* dst) {
  if (kind == GateKind::vector) return gather_head_rows(g, s, head, dst);
  gather_gate(g, kind, s, head, K, dst);
}

template <class T>
void scatter_head_gate_grad(const TensorView& dg, GateKind kind, const SeqRange& s, int64_t head, int64_t K,
                            const T* src) {
  if (kind == GateKind::vector) return scatter_head_rows(dg, s, head, src);
  scatter_gate_grad(dg, kind, s, head, K, src);
}

}  // namespace flashgla::cpu::gla
