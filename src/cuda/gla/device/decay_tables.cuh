// A scalar gate's decays inside one chunk of 64 tokens, as tables in shared memory (the fast forward's and the
// backward's chunk kernels for a scalar gate: gla_fwd_fast_scalar.cuh, gla_bwd_chunk_scalar.cu).
//
// Γ_i = Σ_{s ≤ i} g_s is an fp32 prefix sum over the chunk, except that a step whose exp(g) is 0 in fp32 (−inf,
// or below about −87) is a cut: it is counted apart, and a decay across a cut is 0. So −inf gates give exact
// zeros and −inf − (−inf) never occurs; the price of log sums is cancellation of at most 64 terms (relative
// error ≤ |Γ|·6e-8 in a decay), below the rounding of bf16 operands.
//   log_decay[i] = (Γ_i, cuts up to i);
//   weights[i]   = (exp Γ_i: the decay from the chunk's start through row i,
//                   w_i = exp(Γ_63 − Γ_i): from row i to the chunk's end).
#pragma once

#include <cuda_runtime.h>

namespace flashgla::cuda::gla {

// One warp writes a chunk's tables; lane l holds the gates of rows 2l and 2l + 1 (0 past the sequence).
__device__ __forceinline__ void write_decay_tables(const float (&g)[2], int lane, float2* log_decay, float2* weights) {
  float x[2], cut[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const bool is_cut = __expf(g[i]) == 0.f;
    x[i] = is_cut ? 0.f : g[i], cut[i] = is_cut ? 1.f : 0.f;
  }
  float sum = x[0] + x[1], cuts = cut[0] + cut[1];
#pragma unroll
  for (int offset = 1; offset < 32; offset <<= 1) {
    const float s = __shfl_up_sync(0xffffffffu, sum, offset), k = __shfl_up_sync(0xffffffffu, cuts, offset);
    if (lane >= offset) sum += s, cuts += k;
  }
  float before = __shfl_up_sync(0xffffffffu, sum, 1), cuts_before = __shfl_up_sync(0xffffffffu, cuts, 1);
  if (lane == 0) before = 0.f, cuts_before = 0.f;
  const float f0 = before + x[0], f1 = f0 + x[1], n0 = cuts_before + cut[0], n1 = n0 + cut[1];
  const float f_end = __shfl_sync(0xffffffffu, f1, 31), n_end = __shfl_sync(0xffffffffu, n1, 31);
  log_decay[2 * lane] = make_float2(f0, n0), log_decay[2 * lane + 1] = make_float2(f1, n1);
  weights[2 * lane] = make_float2(n0 == 0.f ? __expf(f0) : 0.f, n0 == n_end ? __expf(f_end - f0) : 0.f);
  weights[2 * lane + 1] = make_float2(n1 == 0.f ? __expf(f1) : 0.f, n1 == n_end ? __expf(f_end - f1) : 0.f);
}

// The decay from column j's token to row i's (j ≤ i), exp(Γ_i − Γ_j), from their log_decay entries.
__device__ __forceinline__ float decay_between(float2 row, float2 col) {
  return row.y == col.y ? __expf(row.x - col.x) : 0.f;
}

}  // namespace flashgla::cuda::gla
