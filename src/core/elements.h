// One element of a host-readable tensor of any dtype, read or written as T:
// the CPU backend's gathers and the API's checks of index tensors
// (cu_seqlens, cache_seqlens, block_table) go through these.
#pragma once

#include <cstdint>

#include "core/half.h"
#include "flashgla/tensor.h"

namespace flashgla {

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

}  // namespace flashgla
