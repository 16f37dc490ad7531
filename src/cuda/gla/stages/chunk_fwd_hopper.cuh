// The state pass (docs/algorithm.md step 2, chunk_fwd_h) of the Hopper path's state kernel (hopper_ws_kernel,
// gla_fwd_hopper_ws.cuh) on its wgmma accumulators: consumer warpgroup wg holds MT tiles of 64 key rows of the
// state H [KP × 64 value columns], tile mt = key rows 64·(wg·MT + mt) ... In two parts around the kernel's wgmma
// fence, which its output's wgmmas share with the update (and the commit group): chunk_fwd_h_decay before it,
// chunk_fwd_h_accumulate after it. As in stages/chunk_fwd.cuh, the kernel owns the accumulators and passes them by
// reference, so that its generated code stays the same (scripts/ptx_same.sh).
#pragma once

#include <cstdint>

#include "cuda/common/wgmma.cuh"
#include "cuda/gla/kernels/gla_fwd_hopper.cuh"

namespace flashgla::cuda::gla::hopper {

// H ← diag(exp γ^C) H: decay [KP] = exp γ^C of the chunk (in its stage). The thread's accumulator element e is key
// row 16·wwarp + lane/4 (+8 for e%4 ≥ 2) of each tile.
template <int MT>
__device__ __forceinline__ void chunk_fwd_h_decay(float (&H)[MT][32], const float* decay, int wg, int wwarp,
                                                  int lane) {
  // The kernel's acc_row and key_of, spelled the same way (the compiler shares the arithmetic with the kernel's).
  auto acc_row = [&](int e) { return 16 * wwarp + (lane >> 2) + 8 * ((e >> 1) & 1); };
  auto key_of = [&](int mt, int e) { return 64 * (wg * MT + mt) + acc_row(e); };
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    const float d0 = decay[key_of(mt, 0)], d1 = decay[key_of(mt, 2)];
#pragma unroll
    for (int e = 0; e < 32; ++e) H[mt][e] *= (e >> 1) & 1 ? d1 : d0;
  }
}

// H += K̃ᵀ V over the chunk's 64 tokens (wgmma m64n64k16, 4 steps of 16 tokens per tile), K̃ᵀ = (k ⊙ exp(γ^C − Γ))ᵀ
// from the slot image and V from the stage at shared address st (layout L: WsLayout). Issues the wgmmas only: the
// kernel fences, commits and waits.
template <class E, class L, int MT>
__device__ __forceinline__ void chunk_fwd_h_accumulate(float (&H)[MT][32], uint32_t st, int wg) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int ts = 0; ts < 4; ++ts)
      wgmma_64x64<E>(H[mt], sm90::smem_desc(st + L::slot.kt() + (wg * MT + mt) * 64 * 128 + ts * 32, 16, 1024),
                     sm90::smem_desc(st + L::v + ts * 16 * 128, C * 128, 1024));
}

}  // namespace flashgla::cuda::gla::hopper
