// Warp-level building blocks of the portable (sm_80+) attention kernels:
// XOR-swizzled shared-memory tiles, their A and B fragments and the warp's
// product over them. The instructions underneath (cp.async, ldmatrix, the
// m16n8k16 mma: fragment layouts there) are cuda/common/copy.cuh and mma.cuh.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "cuda/common/copy.cuh"
#include "cuda/common/dtype.cuh"
#include "cuda/common/mma.cuh"

namespace flashgla::cuda::attn {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// ---- shared-memory tiles --------------------------------------------------
// A tile of 2-byte elements, COLS per row (a multiple of 64, i.e. 128 bytes).
// Each row is cut into 16-byte chunks; chunk c of row r is stored at chunk
// c ^ (r % 8) of its 128-byte group, so the 8 rows an ldmatrix reads (and the
// 8 chunks a warp's cp.async writes) fall in 8 different bank groups.
template <int COLS>
struct Swizzled {
  static_assert(COLS % 64 == 0, "rows must be whole 128-byte groups");
  // Element offset of (row, col); col may be any column.
  __device__ __forceinline__ static int offset(int row, int col) {
    return row * COLS + ((((col >> 3) ^ row) & 7) | ((col >> 3) & ~7)) * 8 + (col & 7);
  }
};

// ---- fragments ---------------------------------------------------------------
// The 16x16 A fragment at (m0, k0) of A[m][k]. TRANS: the tile stores A
// transposed, as X[k][m] (e.g. P^T read from a P[query][key] tile).
template <bool TRANS, int COLS>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], uint32_t tile, int m0, int k0, int lane) {
  if constexpr (!TRANS) {
    ldmatrix_x4(a, tile + 2 * Swizzled<COLS>::offset(m0 + (lane & 15), k0 + (lane >> 4) * 8));
  } else {
    ldmatrix_x4_trans(a, tile + 2 * Swizzled<COLS>::offset(k0 + (lane & 7) + (lane >> 4) * 8,
                                                            m0 + ((lane >> 3) & 1) * 8));
  }
}

// The B fragments of two 8-column blocks n0..n0+15 at k0: {b0, b1} of the
// first, {b0, b1} of the second. The tile stores B[k][n] transposed as Y[n][k]
// (e.g. K for S = Q K^T), or TRANS: as B itself, Y[k][n] (e.g. V for P V).
template <bool TRANS, int COLS>
__device__ __forceinline__ void load_b(uint32_t (&b)[4], uint32_t tile, int n0, int k0, int lane) {
  if constexpr (!TRANS) {
    ldmatrix_x4(b, tile + 2 * Swizzled<COLS>::offset(n0 + (lane >> 4) * 8 + (lane & 7), k0 + ((lane >> 3) & 1) * 8));
  } else {
    ldmatrix_x4_trans(b, tile + 2 * Swizzled<COLS>::offset(k0 + (lane & 7) + ((lane >> 3) & 1) * 8,
                                                            n0 + (lane >> 4) * 8));
  }
}

// Two floats rounded to one register of two T (the lower column first).
template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  uint32_t r;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    r = *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    r = *reinterpret_cast<uint32_t*>(&v);
  }
  return r;
}

// to_float / from_float: cuda/common/dtype.cuh (the kernels here take bf16 and fp16 only).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// acc[MT][NB] += A (rows m0.., MT m16 tiles) x B (cols n0.., NB n8 blocks),
// contracting over K (a multiple of 16), both operands in shared memory.
template <class T, int MT, int NB, int K, bool A_TRANS, int A_COLS, bool B_TRANS, int B_COLS>
__device__ __forceinline__ void warp_gemm(float (&acc)[MT][NB][4], uint32_t a_tile, int m0, uint32_t b_tile, int n0,
                                          int lane) {
  static_assert(NB % 2 == 0 && K % 16 == 0, "B fragments come in pairs of n8 blocks");
#pragma unroll
  for (int ks = 0; ks < K / 16; ++ks) {
    uint32_t a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) load_a<A_TRANS, A_COLS>(a[mt], a_tile, m0 + mt * 16, ks * 16, lane);
#pragma unroll
    for (int nb = 0; nb < NB; nb += 2) {
      uint32_t b[4];
      load_b<B_TRANS, B_COLS>(b, b_tile, n0 + nb * 8, ks * 16, lane);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma16816<T>(acc[mt][nb], a[mt], b[0], b[1]);
        mma16816<T>(acc[mt][nb + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

template <int MT, int NB>
__device__ __forceinline__ void zero(float (&acc)[MT][NB][4]) {
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < NB; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[i][j][r] = 0.f;
}

}  // namespace flashgla::cuda::attn
