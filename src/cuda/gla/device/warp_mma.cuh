// Warp-level products with fp32 accumulation in the mma.sync layout: Mma<E> (forward: bf16/fp16 tensor
// cores, fp32 as 3xTF32) and warp_gemm (backward: bf16 or fp16 tensor cores from ldmatrix, fp32 as FMAs), plus
// the warp reductions of the backward.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "cuda/common/dtype.cuh"
#include "cuda/common/mma.cuh"
#include "cuda/gla/device/elements.cuh"

namespace flashgla::cuda::gla {

// ---- tensor-core products ------------------------------------------------------------
// Mma<E> multiplies one 16×16 A tile by one 16×8 B tile into a 16×8 fp32
// accumulator (mma.sync m16n8k16 layout: lane = 4 * g + t holds rows g and
// g + 8, columns 2t and 2t + 1). A is read row-major (A[m][k] at a[m * lda + k]);
// B is read as B^T, i.e. B[k][n] at b[n * ldb + k]: both keep the reduction
// index contiguous (load_b_rows reads an fp32 B row-major instead). Operands
// may come from E or from fp32 shared memory.
//
// E = bf16/fp16: one mma.sync with the operands rounded to E.
// E = float: 3xTF32 (x = big + small, big·big + big·small + small·big), which
// keeps fp32 accuracy without the silent TF32 rounding of a plain tf32 product.
template <class E>
struct Mma;

template <class E>
struct Mma16 {  // bf16 or fp16
  struct A { uint32_t x[4]; };
  struct B { uint32_t x[2]; };

  __device__ __forceinline__ static uint32_t pack(float lo, float hi) {
    E pair[2] = {from_float<E>(lo), from_float<E>(hi)};
    return *reinterpret_cast<const uint32_t*>(pair);
  }
  __device__ __forceinline__ static uint32_t word(const E* p) { return *reinterpret_cast<const uint32_t*>(p); }
  __device__ __forceinline__ static uint32_t word(const float* p) {
    const float2 f = *reinterpret_cast<const float2*>(p);
    return pack(f.x, f.y);
  }

  template <class S>
  __device__ __forceinline__ static A load_a(const S* a, int lda, int lane) {
    const int g = lane >> 2, t = lane & 3;
    A r;
    r.x[0] = word(a + g * lda + 2 * t);
    r.x[1] = word(a + (g + 8) * lda + 2 * t);
    r.x[2] = word(a + g * lda + 2 * t + 8);
    r.x[3] = word(a + (g + 8) * lda + 2 * t + 8);
    return r;
  }
  template <class S>
  __device__ __forceinline__ static B load_b(const S* b, int ldb, int lane) {
    const int g = lane >> 2, t = lane & 3;
    B r;
    r.x[0] = word(b + g * ldb + 2 * t);
    r.x[1] = word(b + g * ldb + 2 * t + 8);
    return r;
  }
  // B[k][n] at b[k * ldb + n] (row-major, e.g. the fp32 state S[k][v]).
  __device__ __forceinline__ static B load_b_rows(const float* b, int ldb, int lane) {
    const int g = lane >> 2, t = lane & 3;
    B r;
    r.x[0] = pack(b[2 * t * ldb + g], b[(2 * t + 1) * ldb + g]);
    r.x[1] = pack(b[(2 * t + 8) * ldb + g], b[(2 * t + 9) * ldb + g]);
    return r;
  }
  __device__ __forceinline__ static void mma(float (&c)[4], const A& a, const B& b);
};

template <>
__device__ __forceinline__ void Mma16<__nv_bfloat16>::mma(float (&c)[4], const A& a, const B& b) {
  mma16816_volatile<__nv_bfloat16>(c, a.x, b.x[0], b.x[1]);
}
template <>
__device__ __forceinline__ void Mma16<__half>::mma(float (&c)[4], const A& a, const B& b) {
  mma16816_volatile<__half>(c, a.x, b.x[0], b.x[1]);
}

template <>
struct Mma<__nv_bfloat16> : Mma16<__nv_bfloat16> {};
template <>
struct Mma<__half> : Mma16<__half> {};

template <>
struct Mma<float> {
  struct A { uint32_t big[2][4], small[2][4]; };  // [k half][register]
  struct B { uint32_t big[2][2], small[2][2]; };

  __device__ __forceinline__ static void split(float x, uint32_t& big, uint32_t& small) {
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(big) : "f"(x));
    const float rest = x - __uint_as_float(big);
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(small) : "f"(rest));
  }
  __device__ __forceinline__ static A load_a(const float* a, int lda, int lane) {
    const int g = lane >> 2, t = lane & 3;
    A r;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float* p = a + 8 * h + t;
      split(p[g * lda], r.big[h][0], r.small[h][0]);
      split(p[(g + 8) * lda], r.big[h][1], r.small[h][1]);
      split(p[g * lda + 4], r.big[h][2], r.small[h][2]);
      split(p[(g + 8) * lda + 4], r.big[h][3], r.small[h][3]);
    }
    return r;
  }
  __device__ __forceinline__ static B load_b(const float* b, int ldb, int lane) {
    const int g = lane >> 2, t = lane & 3;
    B r;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float* p = b + g * ldb + 8 * h + t;
      split(p[0], r.big[h][0], r.small[h][0]);
      split(p[4], r.big[h][1], r.small[h][1]);
    }
    return r;
  }
  __device__ __forceinline__ static B load_b_rows(const float* b, int ldb, int lane) {
    const int g = lane >> 2, t = lane & 3;
    B r;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      split(b[(8 * h + t) * ldb + g], r.big[h][0], r.small[h][0]);
      split(b[(8 * h + t + 4) * ldb + g], r.big[h][1], r.small[h][1]);
    }
    return r;
  }
  __device__ __forceinline__ static void tf32(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
  __device__ __forceinline__ static void mma(float (&c)[4], const A& a, const B& b) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      tf32(c, a.small[h], b.big[h]);
      tf32(c, a.big[h], b.small[h]);
      tf32(c, a.big[h], b.big[h]);
    }
  }
};

// ---- warp products -----------------------------------------------------------------
// acc[NT][4] is a 16 x 8·NT tile in the mma.sync m16n8 accumulator layout:
// acc[nt][e] is row (lane / 4) + 8 (e / 2), column 8 nt + 2 (lane % 4) + e % 2.
__device__ __forceinline__ int acc_row(int e) { return (threadIdx.x & 31) / 4 + 8 * (e >> 1); }
__device__ __forceinline__ int acc_col(int nt, int e) { return 8 * nt + 2 * (threadIdx.x & 3) + (e & 1); }

// A warp's 16 × 8·NT fp32 accumulator tile to 16-bit rows in memory, straight from the fragments (two elements per
// store): tile row r (row0 + acc_row) at out + r·row_stride, column col0 + acc_col, times row_scale[half] for the
// lane's rows g + 8·half. Rows from rows_valid on and columns from cols on are not stored.
template <class E, int NT>
__device__ __forceinline__ void store_fragment_rows(E* out, int64_t row_stride, const float (&acc)[NT][4],
                                                    const float (&row_scale)[2], int row0, int col0, int cols,
                                                    int rows_valid, int lane) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int col = col0 + 8 * nt + 2 * t;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = row0 + g + 8 * half;
      if (r >= rows_valid || col >= cols) continue;
      E* at = out + r * row_stride + col;
      const float lo = row_scale[half] * acc[nt][2 * half], hi = row_scale[half] * acc[nt][2 * half + 1];
      if (col + 1 < cols) store_pair(at, lo, hi);
      else at[0] = from_float<E>(lo);
    }
  }
}

// ldmatrix_x4_ordered, ldmatrix_x4_trans_ordered and mma16816_volatile: cuda/common/mma.cuh.

// acc += A · B for A of 16 x kdim and B of kdim x 8·NT, both in shared memory.
// A is stored row-major (a[m * lda + k]) or, with kATrans, as its transpose
// (a[k * lda + m]); B is stored as b[n * ldb + k] (kBKMajor) or b[k * ldb + n].
// kdim is a multiple of 16; pointers and strides keep 16-byte rows.
// E: the operands' 16-bit type (bf16 or fp16; one mma.sync m16n8k16 each, fp32 accumulation).
template <int NT, bool kATrans, bool kBKMajor, class E>
__device__ __forceinline__ void warp_gemm16(float (&acc)[NT][4], const E* a, int lda, const E* b, int ldb, int kdim) {
  static_assert(NT % 2 == 0, "n tiles come in pairs");
  const int lane = threadIdx.x & 31, quad = lane >> 3, r = lane & 7;
  for (int k0 = 0; k0 < kdim; k0 += 16) {
    uint32_t af[4];
    if (kATrans) ldmatrix_x4_trans_ordered(af, a + (k0 + r + 8 * (quad >> 1)) * lda + 8 * (quad & 1));
    else ldmatrix_x4_ordered(af, a + (r + 8 * (quad & 1)) * lda + k0 + 8 * (quad >> 1));
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      uint32_t bfr[4];
      if (kBKMajor) ldmatrix_x4_ordered(bfr, b + (16 * np + r + 8 * (quad >> 1)) * ldb + k0 + 8 * (quad & 1));
      else ldmatrix_x4_trans_ordered(bfr, b + (k0 + r + 8 * (quad & 1)) * ldb + 16 * np + 8 * (quad >> 1));
      mma16816_volatile<E>(acc[2 * np], af, bfr[0], bfr[1]);
      mma16816_volatile<E>(acc[2 * np + 1], af, bfr[2], bfr[3]);
    }
  }
}
template <int NT, bool kATrans, bool kBKMajor>
__device__ __forceinline__ void warp_gemm(float (&acc)[NT][4], const bf16* a, int lda, const bf16* b, int ldb,
                                          int kdim) {
  warp_gemm16<NT, kATrans, kBKMajor>(acc, a, lda, b, ldb, kdim);
}
template <int NT, bool kATrans, bool kBKMajor>
__device__ __forceinline__ void warp_gemm(float (&acc)[NT][4], const __half* a, int lda, const __half* b, int ldb,
                                          int kdim) {
  warp_gemm16<NT, kATrans, kBKMajor>(acc, a, lda, b, ldb, kdim);
}

// The same product in fp32 FMAs, same accumulator layout.
template <int NT, bool kATrans, bool kBKMajor>
__device__ __forceinline__ void warp_gemm(float (&acc)[NT][4], const float* a, int lda, const float* b, int ldb,
                                          int kdim) {
  const int lane = threadIdx.x & 31, row = lane >> 2, col = 2 * (lane & 3);
  for (int k = 0; k < kdim; ++k) {
    const float a0 = kATrans ? a[k * lda + row] : a[row * lda + k];
    const float a1 = kATrans ? a[k * lda + row + 8] : a[(row + 8) * lda + k];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int n = 8 * nt + col;
      const float b0 = kBKMajor ? b[n * ldb + k] : b[k * ldb + n];
      const float b1 = kBKMajor ? b[(n + 1) * ldb + k] : b[k * ldb + n + 1];
      acc[nt][0] = fmaf(a0, b0, acc[nt][0]);
      acc[nt][1] = fmaf(a0, b1, acc[nt][1]);
      acc[nt][2] = fmaf(a1, b0, acc[nt][2]);
      acc[nt][3] = fmaf(a1, b1, acc[nt][3]);
    }
  }
}

template <int NT>
__device__ __forceinline__ void zero(float (&acc)[NT][4]) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[nt][e] = 0.f;
}

template <int NT>
__device__ __forceinline__ void scale_all(float (&acc)[NT][4], float factor) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[nt][e] *= factor;
}

// Sums each of v[0..N-1] over the 32 lanes of a warp in N - 1 shuffles (plus
// one for N = 16), leaving one total per lane: each step swaps half of the
// values with the lane across one lane bit, so the lane keeps the element
// whose index is spelled by its own bits (see transpose_reduce_index).
template <int kHalf, int N>
__device__ __forceinline__ void transpose_reduce_step(float (&v)[N], int lane) {
  constexpr int kOffset = kHalf * 32 / N;  // the lane bit across which this step swaps
  const bool upper = lane & kOffset;
#pragma unroll
  for (int i = 0; i < kHalf; ++i) {
    const float send = upper ? v[i] : v[i + kHalf];
    const float keep = upper ? v[i + kHalf] : v[i];
    v[i] = keep + __shfl_xor_sync(0xffffffffu, send, kOffset);
  }
  if constexpr (kHalf > 1) transpose_reduce_step<kHalf / 2>(v, lane);
}

template <int N>
__device__ __forceinline__ float transpose_reduce(float (&v)[N]) {
  static_assert(N == 16 || N == 32, "16 or 32 values");
  const int lane = threadIdx.x & 31;
  transpose_reduce_step<N / 2>(v, lane);
  float total = v[0];
  if (N == 16) total += __shfl_xor_sync(0xffffffffu, total, 1);
  return total;
}

// The element whose total transpose_reduce<N> leaves in this lane.
template <int N>
__device__ __forceinline__ int transpose_reduce_index() {
  const int lane = threadIdx.x & 31;
  return N == 32 ? lane : lane >> 1;
}

}  // namespace flashgla::cuda::gla
