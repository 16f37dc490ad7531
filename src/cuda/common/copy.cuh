// Asynchronous global -> shared copies (cp.async, sm_80+), for the attention
// and GLA kernels.
//
// Two flavours of the same instructions live side by side because kernels
// were tuned with each; which one a kernel uses is part of that kernel:
// - *_ordered: the asm carries a "memory" clobber, so the compiler keeps the
//   thread's other memory accesses in program order around it;
// - *_unordered: no clobber; the compiler may move other memory accesses
//   across it, and the kernel orders them with barriers.
// Two ways to wait, too: cp_async_wait_committed() (cp.async.wait_group 0)
// waits for the groups committed so far; cp_async_commit_and_wait_all()
// (cp.async.wait_all) also commits the copies issued since the last commit
// and waits for them.
#pragma once

#include <cstdint>

namespace flashgla::cuda {

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes from global to shared memory; only the first `src_bytes` (0 or 16
// for most callers) are read, the rest of the 16 is zero-filled (src must
// still be a mapped address).
__device__ __forceinline__ void cp_async16_ordered(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async16_ordered(void* dst, const void* src, int src_bytes) {
  cp_async16_ordered(smem_address(dst), src, src_bytes);
}
__device__ __forceinline__ void cp_async16_unordered(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(dst)), "l"(src), "r"(src_bytes));
}

// 4 bytes (one fp32), `src_bytes` 0 or 4 as above; through L1 (.ca: .cg copies only 16).
__device__ __forceinline__ void cp_async4_ordered(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_address(dst)), "l"(src), "r"(src_bytes)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit_ordered() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_commit_unordered() { asm volatile("cp.async.commit_group;\n" ::); }

__device__ __forceinline__ void cp_async_wait_committed() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_commit_and_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

}  // namespace flashgla::cuda
