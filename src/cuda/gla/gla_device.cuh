// Device-side helpers of the GLA forward kernels (sequences: cuda/common/sequences.cuh): element conversion,
// tile copies into shared memory (cp.async or element by element),
// and warp-level tensor-core products (mma.sync) with fp32 accumulation.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "cuda/common/copy.cuh"
#include "cuda/common/dtype.cuh"
#include "cuda/common/mma.cuh"
#include "cuda/gla/gla_fwd.cuh"

namespace flashgla::cuda::gla {

// ---- elements (to_float / from_float: cuda/common/dtype.cuh) -----------------------------------

// The element at `index` of an array of any readable dtype, as a float.
__device__ __forceinline__ float load_float(const void* base, int64_t index, Elem dtype) {
  switch (dtype) {
    case Elem::f32: return static_cast<const float*>(base)[index];
    case Elem::bf16: return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[index]);
    case Elem::f16: return __half2float(static_cast<const __half*>(base)[index]);
    case Elem::f64: return float(static_cast<const double*>(base)[index]);
  }
  return 0.f;
}

// Whether any of the 8 bf16/fp16 elements of w is a NaN or an Inf (all exponent bits set).
template <class E>
__device__ __forceinline__ bool any_nonfinite8(uint4 w) {
  constexpr uint32_t m = std::is_same_v<E, __half> ? 0x7C007C00u : 0x7F807F80u;
  constexpr uint32_t lo = m & 0xFFFFu, hi = m & 0xFFFF0000u;
  const uint32_t x[4] = {w.x, w.y, w.z, w.w};
  bool bad = false;
#pragma unroll
  for (int i = 0; i < 4; ++i) bad |= (x[i] & lo) == lo || (x[i] & hi) == hi;
  return bad;
}

// Four consecutive elements (8- or 16-byte aligned) as a float4.
__device__ __forceinline__ float4 load4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ float4 load4(const __nv_bfloat16* p) {
  const uint2 raw = *reinterpret_cast<const uint2*>(p);
  const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
  const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
  return make_float4(lo.x, lo.y, hi.x, hi.y);
}
__device__ __forceinline__ float4 load4(const __half* p) {
  const uint2 raw = *reinterpret_cast<const uint2*>(p);
  const float2 lo = __half22float2(*reinterpret_cast<const __half2*>(&raw.x));
  const float2 hi = __half22float2(*reinterpret_cast<const __half2*>(&raw.y));
  return make_float4(lo.x, lo.y, hi.x, hi.y);
}

// Stores x[0..7] as 8 consecutive elements at a 16-byte aligned address.
__device__ __forceinline__ void store8(float* p, const float (&x)[8]) {
  reinterpret_cast<float4*>(p)[0] = make_float4(x[0], x[1], x[2], x[3]);
  reinterpret_cast<float4*>(p)[1] = make_float4(x[4], x[5], x[6], x[7]);
}
template <class E>
__device__ __forceinline__ void store8(E* p, const float (&x)[8]) {
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    E pair[2] = {from_float<E>(x[2 * i]), from_float<E>(x[2 * i + 1])};
    w[i] = *reinterpret_cast<const uint32_t*>(pair);
  }
  *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
}

// ---- sequences and the sequence split ------------------------------------------------

// The element offset of token `token` of sequence `seq`, head h, in a [B,T,H,*] view (its first column).
__device__ __forceinline__ int64_t token_offset(const View& t, const SeqSpan& seq, int h, int64_t token) {
  return seq.batch * t.stride[0] + (seq.begin + token) * t.stride[1] + h * t.stride[2];
}

// Sequence n cut into splits of p.chunks_per_split chunks (the sequence split of ChunkParams): split s covers
// chunks [begin(p, s), end(p, s)); last_split is the last one with chunks (0 for an empty sequence).
struct SplitChunks {
  SeqSpan seq;
  int64_t num_chunks, last_split;
  // Whether split s has nothing to do: no chunks, or the last split in a states pass (no later split reads it).
  __device__ __forceinline__ bool idle(int64_t split, bool states_pass) const {
    return split > last_split || (states_pass && split == last_split);
  }
  __device__ __forceinline__ int64_t begin(const ChunkParams& p, int64_t split) const {
    return split * p.chunks_per_split;
  }
  __device__ __forceinline__ int64_t end(const ChunkParams& p, int64_t split) const {
    return min(num_chunks, begin(p, split) + p.chunks_per_split);
  }
};
__device__ __forceinline__ SplitChunks split_chunks(const ChunkParams& p, int64_t n) {
  SplitChunks s;
  s.seq = sequence_span(p.seqs, n);
  s.num_chunks = (s.seq.len + kChunk - 1) / kChunk;
  s.last_split = s.num_chunks == 0 ? 0 : (s.num_chunks - 1) / p.chunks_per_split;
  return s;
}

// The state at the start of split `split` of sequence n, head h (nh = n · heads + h), at key `key` and value
// column vg: h0's element (0 without h0) folded through the earlier splits' states and decays, the slots of an
// in-kernel states pass (ChunkParams::states_only).
__device__ __forceinline__ float split_start_state(const ChunkParams& p, int64_t n, int h, int64_t nh, int split,
                                                   int key, int vg, int K, int V) {
  float s = 0.f;
  if (p.h0.data)
    s = static_cast<const float*>(p.h0.data)[n * p.h0.stride[0] + h * p.h0.stride[1] + key * p.h0.stride[2] +
                                              vg * p.h0.stride[3]];
  for (int prev = 0; prev < split; ++prev) {
    const int64_t slot = nh * (p.num_splits - 1) + prev;
    s = p.split_decay[slot * K + key] * s + p.split_states[(slot * K + key) * V + vg];
  }
  return s;
}

// ---- copies into shared memory ----------------------------------------------------
// The forward kernels use the unordered cp.async flavour (cuda/common/copy.cuh):
// cp_async16_unordered, cp_async_commit_unordered, cp_async_wait_committed.

// Copies a tile of `rows` × `cols` elements (element size `esize`) into shared
// memory, row-major and unpadded: tile[r][c] = src[base + r * row_stride +
// (col0 + c) * col_stride] for r < rows_valid and col0 + c < width, zero
// elsewhere. With `rows16` (col_stride 1, 16-byte aligned rows) the rows travel
// as 16-byte cp.async pieces (complete with cp_async_wait_committed); otherwise
// element by element.
__device__ __forceinline__ void copy_tile(const void* data, bool rows16, int64_t col_stride, int esize, int64_t base,
                                          int64_t row_stride, int rows, int rows_valid, int col0, int width, int cols,
                                          void* tile, int tid, int threads) {
  char* dst = static_cast<char*>(tile);
  const char* src = static_cast<const char*>(data);
  if (rows16) {
    const int pieces = cols * esize / 16;
#pragma unroll 1
    for (int i = tid; i < rows * pieces; i += threads) {
      const int r = i / pieces, piece = i - r * pieces;
      const int col = col0 + piece * (16 / esize);
      const int bytes = r < rows_valid ? min(16, max(0, (width - col) * esize)) : 0;
      const char* from = bytes ? src + (base + r * row_stride + col) * esize : src;
      cp_async16_unordered(dst + (r * cols) * esize + piece * 16, from, bytes);
    }
    return;
  }
  // 16 bits at a time: one code path for every element size.
  const int units = esize / 2;
#pragma unroll 1
  for (int i = tid; i < rows * cols * units; i += threads) {
    const int e = i / units, r = e / cols, c = e - r * cols;
    const bool valid = r < rows_valid && col0 + c < width;
    const int64_t at = (base + r * row_stride + int64_t(col0 + c) * col_stride) * esize;
    reinterpret_cast<uint16_t*>(dst)[i] = valid ? reinterpret_cast<const uint16_t*>(src + at)[i - e * units] : 0;
  }
}
// The reverse of copy_tile, synchronous: dst[base + r * row_stride + (col0 + c) *
// col_stride] = tile[r][c] (row pitch `pitch` bytes) for r < rows_valid and
// col0 + c < width; 16-byte pieces with `rows16`.
__device__ __forceinline__ void store_tile(void* data, bool rows16, int64_t col_stride, int esize, int64_t base,
                                           int64_t row_stride, int rows, int rows_valid, int col0, int width, int cols,
                                           const void* tile, int pitch, int tid, int threads) {
  char* dst = static_cast<char*>(data);
  const char* src = static_cast<const char*>(tile);
  const int per_piece = rows16 ? 16 / esize : 1;  // elements per piece
  const int pieces = cols / per_piece;
#pragma unroll 1
  for (int i = tid; i < rows * pieces; i += threads) {
    const int r = i / pieces, piece = i - r * pieces;
    const int col = col0 + piece * per_piece;
    if (r >= rows_valid || col >= width) continue;
    const char* from = src + r * pitch + piece * per_piece * esize;
    char* to = dst + (base + r * row_stride + col * col_stride) * esize;
    if (rows16 && col + per_piece <= width) {
      *reinterpret_cast<uint4*>(to) = *reinterpret_cast<const uint4*>(from);
    } else {
      for (int e = 0; e < min(per_piece, width - col); ++e)
        for (int u = 0; u < esize / 2; ++u)
          reinterpret_cast<uint16_t*>(to + e * col_stride * esize)[u] = reinterpret_cast<const uint16_t*>(from + e * esize)[u];
    }
  }
}

// One chunk's rows (tokens token .. token + C − 1 of sequence `seq`, head h) of COLS columns of t, from column
// col0, into shared memory with a row pitch of `pitch` elements, as 16-byte cp.async pieces (rows16): rows from
// rows_valid on and columns from `width` on read as zero. Thread tid of THREADS always takes piece
// tid % pieces of rows tid / pieces + i · THREADS / pieces.
template <int COLS, int THREADS, class T>
__device__ __forceinline__ void load_rows(T* dst, int pitch, const View& t, const SeqSpan& seq, int h, int64_t token,
                                          int rows_valid, int col0, int width, int tid) {
  constexpr int per_piece = 16 / int(sizeof(T));
  constexpr int pieces = COLS / per_piece, rows_per_pass = THREADS / pieces;
  static_assert(rows_per_pass <= kChunk && kChunk % rows_per_pass == 0, "whole passes");
  const int row = tid / pieces, col = col0 + (tid % pieces) * per_piece;
  const int bytes = min(16, max(0, (width - col) * int(sizeof(T))));
  const T* src = static_cast<const T*>(t.data) + token_offset(t, seq, h, token + row) + col;
  T* to = dst + row * pitch + (tid % pieces) * per_piece;
#pragma unroll
  for (int i = 0; i < kChunk / rows_per_pass; ++i) {
    const bool valid = row + i * rows_per_pass < rows_valid && bytes > 0;
    cp_async16_unordered(to + i * rows_per_pass * pitch, valid ? src + i * rows_per_pass * t.stride[1] : t.data,
                         valid ? bytes : 0);
  }
}

__device__ __forceinline__ void copy_tile(const View& view, int esize, int64_t base, int64_t row_stride, int rows,
                                          int rows_valid, int col0, int width, int cols, void* tile, int tid,
                                          int threads) {
  copy_tile(view.data, view.rows16, view.stride[3], esize, base, row_stride, rows, rows_valid, col0, width, cols, tile,
            tid, threads);
}

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

}  // namespace flashgla::cuda::gla
