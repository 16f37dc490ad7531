// A sequence's query and key ranges as every CUDA attention kernel reads them
// (the portable, generic and Hopper kernels): fixed-length rows, or the
// boundaries of cu_seqlens_q / cu_seqlens_k.
#pragma once

#include <cstdint>

#include "cuda/attention/attention_params.cuh"

namespace flashgla::cuda::attn {

// One sequence's queries [q_begin, q_begin + q_len) and keys (token indices in
// its batch row).
struct Seq {
  int64_t batch, q_begin, q_len, k_begin, k_len;
};

// cu_seqlens values come from the caller's device memory unchecked: clamp them
// into [0, total] so a bad value can never address outside the tensors.
__device__ __forceinline__ int64_t boundary(const void* cu, int64_t stride, bool is64, int64_t i, int64_t total) {
  const int64_t v = is64 ? static_cast<const int64_t*>(cu)[i * stride] : static_cast<const int32_t*>(cu)[i * stride];
  return v < 0 ? 0 : (v > total ? total : v);
}

__device__ __forceinline__ Seq sequence(const AttentionParams& p, int64_t n) {
  if (!p.varlen) return {n, 0, p.q_len, 0, p.k_len};
  const int64_t qb = boundary(p.cu_q, p.cu_q_stride, p.cu_q_64, n, p.q_len);
  const int64_t qe = boundary(p.cu_q, p.cu_q_stride, p.cu_q_64, n + 1, p.q_len);
  const int64_t kb = boundary(p.cu_k, p.cu_k_stride, p.cu_k_64, n, p.k_len);
  const int64_t ke = boundary(p.cu_k, p.cu_k_stride, p.cu_k_64, n + 1, p.k_len);
  return {0, qb, qe > qb ? qe - qb : 0, kb, ke > kb ? ke - kb : 0};
}

}  // namespace flashgla::cuda::attn
