// Hopper (sm_90) TMA: tensor-map tile loads into shared memory (completion
// counted on an mbarrier, barriers.cuh) and the proxy fence between ordinary
// shared-memory writes and async-proxy reads. Every function compiles for any
// target but may only run on sm_90 or newer.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace flashgla::cuda::sm90 {

// ---- TMA ------------------------------------------------------------------------------
// A box of a 4-D tensor map at coordinates (c0 innermost .. c3) into shared
// memory; completion is counted on `bar` in bytes.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1, int c2,
                                            int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void tma_prefetch_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// Orders this thread's ordinary shared-memory writes before later reads by
// the async proxy (wgmma operands written by threads, not by TMA).
__device__ __forceinline__ void fence_proxy_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

}  // namespace flashgla::cuda::sm90
