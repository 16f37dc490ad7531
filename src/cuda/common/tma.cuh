// Hopper (sm_90) TMA: tensor-map tile loads into shared memory (completion
// counted on an mbarrier, barriers.cuh), reductions of shared tiles into
// global memory, and the proxy fence between ordinary shared-memory writes
// and async-proxy reads. Every function compiles for any
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

// Adds a box of shared memory into a 2-D tensor map's global tensor at (c0
// innermost, c1), element-wise (fp32 add), as an operation of this thread's
// bulk group; the map's swizzle applies to the shared box. Boxes outside the
// tensor are skipped.
__device__ __forceinline__ void tma_reduce_add_2d(const CUtensorMap* map, uint32_t src, int c0, int c1) {
  asm volatile("cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(c0), "r"(c1), "r"(src)
               : "memory");
}
// Closes this thread's bulk group; then waits until at most N of its groups
// are still reading shared memory (bulk_wait_read), or still running.
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
template <int N>
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

// Orders this thread's ordinary shared-memory writes before later reads by
// the async proxy (wgmma operands written by threads, not by TMA).
__device__ __forceinline__ void fence_proxy_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// The same between this thread's ordinary global-memory accesses and the async
// proxy's (a TMA reduction's result read or released through a flag).
__device__ __forceinline__ void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;\n" ::: "memory"); }

}  // namespace flashgla::cuda::sm90
