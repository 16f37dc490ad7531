// Flags between the blocks of one grid (sm_70 or newer). A group of threads writes, meets at a barrier, and one
// of them releases the flag; a waiting thread acquires it, and its group reads after a barrier of its own. The
// barriers order the other threads' accesses before the release and after the acquire, so no thread but the one
// at the flag needs a fence (CUTLASS's semaphores do the same). A single float travels with its flag instead.
//
// A block may wait only on blocks dispatched before it (the grids that use these hand out their work in that
// order), which never wait on later ones, so every wait ends.
#pragma once

#include <cstdint>

namespace flashgla::cuda {

__device__ __forceinline__ int load_acquire(const int* flag) {
  int value;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(value) : "l"(flag) : "memory");
  return value;
}

// One thread waits until *flag ≥ value. A wait that never ends (a bug, never valid input) traps after about 15 s
// instead of hanging the device.
__device__ __forceinline__ void wait_until_at_least(const int* flag, int value) {
  for (uint32_t spins = 0;; ++spins) {
    if (load_acquire(flag) >= value) return;
    if (spins > (1u << 27)) __trap();
    __nanosleep(100);
  }
}

__device__ __forceinline__ void release_add(int* flag, int value) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(flag), "r"(value) : "memory");
}

// A float handed to another block with its flag in the same 64-bit word (zeroed beforehand): the word is written
// and read whole, so the reader needs no fence and the writer no barrier.
__device__ __forceinline__ void publish_float(unsigned long long* word, float value) {
  const unsigned long long packed = (1ull << 32) | __float_as_uint(value);
  asm volatile("st.relaxed.gpu.global.b64 [%0], %1;\n" ::"l"(word), "l"(packed) : "memory");
}

// Waits until the word is published and returns its float (traps as wait_until_at_least does).
__device__ __forceinline__ float wait_for_float(const unsigned long long* word) {
  for (uint32_t spins = 0;; ++spins) {
    unsigned long long packed;
    asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];\n" : "=l"(packed) : "l"(word) : "memory");
    if (packed >> 32) return __uint_as_float(static_cast<uint32_t>(packed));
    if (spins > (1u << 27)) __trap();
    __nanosleep(100);
  }
}

}  // namespace flashgla::cuda
