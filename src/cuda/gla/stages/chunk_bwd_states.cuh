// The stage of the chunked GLA backward's state scans (state_scan_kernel, gla_bwd_states.cu): one step of the
// state recurrence on a warp's piece of a 64×64 state tile, shared by the scan that recomputes the forward's
// chunk-boundary states (docs/algorithm.md step 2, chunk_fwd_h) and the scan of their gradients (step 6,
// chunk_bwd_dh): the two are one recurrence with other operands, and the kernel runs either in the same code
// (blockIdx.z picks the scan). As in stages/chunk_fwd.cuh, the kernel owns the accumulators and passes them by
// reference, so that its generated code stays the same (scripts/ptx_same.sh).
#pragma once

#include "cuda/gla/device/gate_tile.cuh"
#include "cuda/gla/device/tiles.cuh"
#include "cuda/gla/device/warp_mma.cuh"

namespace flashgla::cuda::gla {
namespace {

// h ← diag(exp γ) h + x̂ᵀ y on this warp's key rows row0.. (16) and 32 value columns of the tile, acc: the warp's
// accumulators. Forward scan (chunk_fwd_h): h = S, x̂ = k ⊙ exp(γ − Γ), y = v; backward scan (chunk_bwd_dh):
// h = dS, x̂ = scale q ⊙ exp Γ, y = dO. sG: the chunk's gate cumsum Γ (log2, rows of kLdF), x_hat: x̂ from key
// column row0 on (rows of LD), y: the warp's first value column of y (rows of LD). decay_since_start: the split's
// decay (log2) of the thread's two key rows, advanced by γ. fp16 backward (kScaledDStates, gate_tile.cuh): the
// step takes Γ_0 out of the decay and x̂ and multiplies it back in after the product, and records it in
// next_first for the state's store and the decays the kernel records; first: the kernel's scratch for Γ_0, zero.
template <class T, class GT, int LD>
__device__ __forceinline__ void chunk_fwd_h_or_bwd_dh(float (&acc)[4][4], float (&decay_since_start)[2],
                                                      float (&next_first)[2], float (&first)[2], const GT* sG,
                                                      const T* x_hat, const T* y, int row0, bool backward) {
  constexpr bool kScaled = kScaledDStates<T>;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const GT chunk_decay = sG[(kChunk - 1) * kLdF + row0 + acc_row(2 * half)];
    decay_since_start[half] += float(chunk_decay);
    if constexpr (kScaled) {
      if (backward) first[half] = sG[row0 + acc_row(2 * half)];
    }
    const float decay = kScaled ? exp2_of(chunk_decay - first[half]) : exp2_of(chunk_decay);
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
      acc[nt][2 * half] *= decay;
      acc[nt][2 * half + 1] *= decay;
    }
  }
  // acc += x̂^T y: the product's rows are x̂'s columns (key rows of the state).
  warp_gemm<4, true, false>(acc, x_hat, LD, y, LD, kChunk);
  if constexpr (kScaled) {
    if (backward) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const float factor = exp2_of(first[half]);
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          acc[nt][2 * half] *= factor;
          acc[nt][2 * half + 1] *= factor;
        }
        next_first[half] = first[half];
      }
    }
  }
}

}  // namespace
}  // namespace flashgla::cuda::gla
