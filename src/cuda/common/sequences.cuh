// Sequence boundaries as every CUDA kernel reads them (GLA forward and backward, the
// normaliser, attention): a fixed-length batch, or the boundaries of a cu_seqlens array
// on the device. cu_seqlens values come from the caller's memory unchecked, so each one
// is clamped into [0, total]: a bad value can never address outside the tensors.
#pragma once

#include <cstdint>

namespace flashgla::cuda {

// cu_seqlens on the device (null: a fixed-length batch), i32 or i64, with a stride.
struct Sequences {
  const void* cu_seqlens = nullptr;
  int64_t stride = 1;
  bool i64 = false;
  int64_t total_len = 0;  // T: tokens per batch row; every boundary is clamped to [0, T]
};

// One sequence: tokens [begin, begin + len) of batch row `batch`.
struct SeqSpan {
  int64_t batch;
  int64_t begin;
  int64_t len;
};

// Boundary i of a cu_seqlens array, clamped into [0, total].
__device__ __forceinline__ int64_t boundary(const void* cu, int64_t stride, bool is64, int64_t i, int64_t total) {
  const int64_t v = is64 ? static_cast<const int64_t*>(cu)[i * stride] : static_cast<const int32_t*>(cu)[i * stride];
  return v < 0 ? 0 : (v > total ? total : v);
}
__device__ __forceinline__ int64_t boundary(const Sequences& s, int64_t i) {
  return boundary(s.cu_seqlens, s.stride, s.i64, i, s.total_len);
}

// Sequence n: row n of a fixed-length batch, or [cu[n], cu[n+1]) of row 0 (an end before
// its begin reads as an empty sequence).
__device__ __forceinline__ SeqSpan sequence_span(const Sequences& s, int64_t n) {
  if (!s.cu_seqlens) return {n, 0, s.total_len};
  const int64_t begin = boundary(s, n);
  const int64_t end = boundary(s, n + 1);
  return {0, begin, end > begin ? end - begin : 0};
}

}  // namespace flashgla::cuda
