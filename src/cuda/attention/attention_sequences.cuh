// A sequence's query and key ranges as every CUDA attention kernel reads them
// (the portable, generic and Hopper kernels): fixed-length rows, or the
// boundaries of cu_seqlens_q / cu_seqlens_k.
#pragma once

#include <cstdint>

#include "cuda/attention/attention_params.cuh"
#include "cuda/common/sequences.cuh"

namespace flashgla::cuda::attn {

// One sequence's queries [q_begin, q_begin + q_len) and keys (token indices in
// its batch row); index: the sequence's number (its batch row, or its place in
// cu_seqlens).
struct Seq {
  int64_t batch, q_begin, q_len, k_begin, k_len, index;
};

using cuda::boundary;  // cuda/common/sequences.cuh: clamped into [0, total]

__device__ __forceinline__ Seq sequence(const AttentionParams& p, int64_t n) {
  if (!p.varlen) return {n, 0, p.q_len, 0, p.k_len, n};
  const int64_t qb = boundary(p.cu_q, p.cu_q_stride, p.cu_q_64, n, p.q_len);
  const int64_t qe = boundary(p.cu_q, p.cu_q_stride, p.cu_q_64, n + 1, p.q_len);
  const int64_t kb = boundary(p.cu_k, p.cu_k_stride, p.cu_k_64, n, p.k_len);
  const int64_t ke = boundary(p.cu_k, p.cu_k_stride, p.cu_k_64, n + 1, p.k_len);
  return {0, qb, qe > qb ? qe - qb : 0, kb, ke > kb ? ke - kb : 0, n};
}

}  // namespace flashgla::cuda::attn
