// The chunked GLA forward's Hopper path (sm_90a): two kernels.
//
// 1. The chunk pass (hopper_prep2_kernel, gla_fwd_hopper_prep2.cuh; portable,
//    one CTA per (sequence, head, chunk of 64 tokens), all chunks in
//    parallel): every gate-dependent quantity of a chunk, computed once per
//    (token, head) instead of once per value tile, written to a workspace
//    slot in the exact shared-memory image the state kernel's wgmma reads
//    (bf16/fp16 tiles of [rows][64] elements, 128-byte swizzle):
//      K̃ᵀ [KP keys][64 tokens]  k_j ⊙ exp(γ^C − Γ_j)      (state update, A operand)
//      decay [KP] fp32           exp(γ^C)
//      Q̃  [64 tokens][KP keys]  q_i ⊙ exp(Γ_i)            (O = Q̃ H, A operand)
//      A  [64][64]               Σ_k q_ik k_jk exp(Γ_ik − Γ_jk), j ≤ i, else 0
//    with Γ the inclusive cumulative sum of g over the chunk (fp32) and every
//    exp of a non-positive argument. A is accumulated in fp32 in 4×4 tiles:
//    below the diagonal every tile as products of q_i exp(Γ_i − Γ_r) and
//    k_j exp(Γ_r − Γ_j) with r the first row of its query block (16 rows for
//    the six off-diagonal 16×16 blocks, 4 rows inside the diagonal ones; both
//    factors ≤ 1, so gates of −20 per step underflow to 0 and never
//    overflow), the 4×4 tiles on the diagonal with exp(Γ_i − Γ_j) as products
//    of α_r = exp(Γ_r − Γ_{r−1}) ≤ 1.
// 2. The state kernel (hopper_ws_kernel, gla_fwd_hopper_ws.cuh, sm_90a): one
//    CTA per (sequence, head, value tile of 64 columns, sequence split),
//    walking its chunks in order, warp-specialized: a producer warp loads the
//    slot images and V tiles into a ring of stages; one or two consumer
//    warpgroups keep their key rows of the state H [KP × 64] as fp32 wgmma
//    accumulators and, per chunk,
//      o_partial = Q̃[:, keys_w] · bf16(H[keys_w]) + A[:, tokens_w] · V[tokens_w]
//      H[keys_w] ← decay ⊙ H[keys_w] + K̃ᵀ[keys_w] · V
//    (wgmma m64n64k16, operands from shared memory); the two partial outputs
//    are summed through shared memory. The sequence split and its states pass
//    work as in gla_fwd_chunk.cu. A V meets A's zeros above the diagonal with
//    later rows of v: the consumers probe o for NaN/Inf after the wgmmas, and
//    where a warpgroup's rows of v hold one (rare), its warps recompute their
//    rows on CUDA cores with j ≤ i selected (chunk_output_rowwise).
// Timings of both kernels, and of the first state kernel without warp
// specialization (removed once this one had passed every test: git history
// has it): bench/notes_gla_fwd.md, "Moved from source comments".
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/common/barriers.cuh"
#include "cuda/common/host.cuh"
#include "cuda/common/tma.cuh"
#include "cuda/common/wgmma.cuh"
#include "cuda/gla/device/elements.cuh"
#include "cuda/gla/device/gla_fwd.cuh"

namespace flashgla::cuda::gla::hopper {

constexpr int C = kChunk;
constexpr int kPrepThreads = 256;

// Slot: the byte offsets inside one workspace slot (one chunk of one head), in cuda/gla/plan/layouts.h (the
// planner sizes the workspace with it); every tile starts 1024-byte aligned, as the 128-byte swizzle needs.

// Element (row, col) of a [rows][64] tile of 2-byte elements in the 128-byte swizzle: byte offset.
__device__ __forceinline__ int swizzled(int row, int col) {
  return row * 128 + ((((col >> 3) ^ row) & 7) << 4) + (col & 7) * 2;
}

template <class E>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  E pair[2] = {from_float<E>(lo), from_float<E>(hi)};
  return *reinterpret_cast<const uint32_t*>(pair);
}
template <class E>
__device__ __forceinline__ uint4 pack8(const float (&x)[8]) {
  return make_uint4(pack2<E>(x[0], x[1]), pack2<E>(x[2], x[3]), pack2<E>(x[4], x[5]), pack2<E>(x[6], x[7]));
}

// The slot of chunk c of sequence n: fixed-length batches n · chunks + c; varlen
// n + begin / 64 + c, distinct for non-decreasing boundaries and below
// num_seqs + ceil(T / 64) for any.
__device__ __forceinline__ int64_t slot_index(const ChunkParams& p, const SeqSpan& seq, int64_t n, int64_t c) {
  return p.seqs.cu_seqlens ? n + seq.begin / C + c : n * p.prep_chunks + c;
}

// Off-diagonal block b of A (query block I, key block J): (1,0) (2,0) (2,1) (3,0) (3,1) (3,2).
__device__ __forceinline__ void pair_of(int b, int& I, int& J) {
  I = b < 1 ? 1 : b < 3 ? 2 : 3;
  J = b - I * (I - 1) / 2;
}

// ---- sm_90a primitives not in cuda/common (wgmma.cuh, barriers.cuh, tma.cuh) ---------------
// `bytes` (a multiple of 16) from global to shared memory in one bulk copy, completion counted on `bar`.
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

// D[64 × 64] += A[64 × 16] B[16 × 64]: A K-major, B MN-major (rows = the contraction), both in shared memory.
template <class E>
__device__ void wgmma_64x64(float (&d)[32], uint64_t desc_a, uint64_t desc_b);

#define FLASHGLA_WGMMA_64X64(TYPE, PTX_TYPE)                                                                         \
  template <>                                                                                                        \
  __device__ __forceinline__ void wgmma_64x64<TYPE>(float (&d)[32], uint64_t desc_a, uint64_t desc_b) {            \
    asm volatile(                                                                                                    \
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"                                                                 \
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." PTX_TYPE "." PTX_TYPE                                         \
        " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "   \
        "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 1;\n}\n"                              \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),           \
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),     \
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),   \
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])    \
        : "l"(desc_a), "l"(desc_b));                                                                                 \
  }
FLASHGLA_WGMMA_64X64(__nv_bfloat16, "bf16")
FLASHGLA_WGMMA_64X64(__half, "f16")
#undef FLASHGLA_WGMMA_64X64

}  // namespace flashgla::cuda::gla::hopper
