// Tiles between global and shared memory, two families:
// * load_tile_unpadded / store_tile_unpadded / load_rows: any rows x cols, row-major in shared memory with
//   the pitch the caller gives (the forward kernels; unordered cp.async).
// * load_tile / load_tile_async / store_tile / copy_tile_in / copy_tile_out: 64-wide tiles with padded rows
//   (kLd) and fp32, bf16 or fp16 compute types (the backward kernels; ordered cp.async).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "cuda/common/copy.cuh"
#include "cuda/common/dtype.cuh"
#include "cuda/gla/device/elements.cuh"
#include "cuda/gla/device/types.cuh"

namespace flashgla::cuda::gla {

// ---- copies into shared memory ----------------------------------------------------
// The forward kernels use the unordered cp.async flavour (cuda/common/copy.cuh):
// cp_async16_unordered, cp_async_commit_unordered, cp_async_wait_committed.

// Copies a tile of `rows` × `cols` elements (element size `esize`) into shared
// memory, row-major and unpadded: tile[r][c] = src[base + r * row_stride +
// (col0 + c) * col_stride] for r < rows_valid and col0 + c < width, zero
// elsewhere. With `rows16` (col_stride 1, 16-byte aligned rows) the rows travel
// as 16-byte cp.async pieces (complete with cp_async_wait_committed); otherwise
// element by element.
__device__ __forceinline__ void load_tile_unpadded(const void* data, bool rows16, int64_t col_stride, int esize, int64_t base,
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
// The reverse of load_tile_unpadded, synchronous: dst[base + r * row_stride + (col0 + c) *
// col_stride] = tile[r][c] (row pitch `pitch` bytes) for r < rows_valid and
// col0 + c < width; 16-byte pieces with `rows16`.
__device__ __forceinline__ void store_tile_unpadded(void* data, bool rows16, int64_t col_stride, int esize, int64_t base,
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

__device__ __forceinline__ void load_tile_unpadded(const View& view, int esize, int64_t base, int64_t row_stride, int rows,
                                          int rows_valid, int col0, int width, int cols, void* tile, int tid,
                                          int threads) {
  load_tile_unpadded(view.data, view.rows16, view.stride[3], esize, base, row_stride, rows, rows_valid, col0, width, cols, tile,
            tid, threads);
}

// ---- 64-wide padded tiles ------------------------------------------------------------
// Row strides (elements) of 64-wide tiles: 16 bytes of padding per row keep
// ldmatrix and column walks free of bank conflicts.
// (kLdOf and kLdF: cuda/gla/plan/layouts.h, where the planner sizes the state scans' shared memory.)
template <class T>
inline constexpr int kLd = kLdOf<int(sizeof(T))>;

struct Identity {
  __device__ float operator()(int, int, float x) const { return x; }
};

// f(idx) for idx = threadIdx.x, threadIdx.x + kThreads, ... < kCount, for a
// block of kThreads threads. Where kThreads divides kCount the loop has a fixed
// trip count: no remainder code and no bound test per step (the compiler does
// not know threadIdx.x < kThreads), which was most of each 2-step tile copy's
// ~130 SASS instructions. kUnrolled: unroll fully, else keep one body.
template <int kThreads, int kCount, bool kUnrolled = true, class F>
__device__ __forceinline__ void for_each_item(F f) {
  if constexpr (kCount % kThreads != 0) {
    for (int idx = threadIdx.x; idx < kCount; idx += kThreads) f(idx);
  } else if constexpr (kUnrolled) {
#pragma unroll
    for (int i = 0; i < kCount / kThreads; ++i) f(int(threadIdx.x) + i * kThreads);
  } else {
#pragma unroll 1
    for (int i = 0; i < kCount / kThreads; ++i) f(int(threadIdx.x) + i * kThreads);
  }
}

// s[r][c] = f(r, c, x[b, t0 + r, h, c0 + c]) for r < rows, c0 + c < D; zero
// (f must keep zero at zero) elsewhere. 16-byte loads where the layout allows:
// fp32 tiles from f32 inputs, 16-bit tiles from bf16 or fp16 inputs. Inlined
// (a call gave the chunk kernel a 952-byte stack frame and spills that miss L1),
// with the element-wise fallback loop not unrolled: unrolled at every call
// site it made up a third of the chunk kernel's code (instruction-cache misses).
template <class T, class In, int kThreads, class F>
__device__ __forceinline__ void load_tile_typed(T* s, const In* src, int64_t row_stride, int64_t col_stride, int rows,
                                                int cols, F f) {
  static_assert(sizeof(T) == sizeof(In), "fp32 <- f32, bf16 / fp16 <- bf16 / fp16");
  constexpr int kVec = 16 / sizeof(In);
  constexpr int kPerRow = kTile / kVec;
  const bool vector = col_stride == 1 && cols == kTile && row_stride % kVec == 0 &&
                      (reinterpret_cast<uintptr_t>(src) & 15) == 0;
  if (vector) {
    for (int idx = threadIdx.x; idx < kTile * kPerRow; idx += kThreads) {
      const int r = idx / kPerRow, c = (idx % kPerRow) * kVec;
      T* dst = s + r * kLd<T> + c;
      if constexpr (sizeof(In) == 4) {
        float4 x = r < rows ? *reinterpret_cast<const float4*>(src + r * row_stride + c) : make_float4(0.f, 0.f, 0.f, 0.f);
        x.x = f(r, c, x.x), x.y = f(r, c + 1, x.y), x.z = f(r, c + 2, x.z), x.w = f(r, c + 3, x.w);
        *reinterpret_cast<float4*>(dst) = x;
      } else {
        const uint4 raw = r < rows ? *reinterpret_cast<const uint4*>(src + r * row_stride + c) : make_uint4(0, 0, 0, 0);
        uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
        for (int i = 0; i < 4; ++i)
          w[i] = pack_pair<T>(f(r, c + 2 * i, widen<In>(w[i] & 0xffffu)), f(r, c + 2 * i + 1, widen<In>(w[i] >> 16)));
        *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
      }
    }
  } else {
#pragma unroll 1
    for (int idx = threadIdx.x; idx < kTileElems; idx += kThreads) {
      const int r = idx / kTile, c = idx % kTile;
      const float x = (r < rows && c < cols) ? to_float(src[r * row_stride + c * col_stride]) : 0.f;
      s[r * kLd<T> + c] = from_float<T>(f(r, c, x));
    }
  }
}

// A 64x64 tile of a [B,T,H,D] tensor: tokens t0.. (rows valid), columns c0..
// fp32 tiles read f32 inputs; bf16 and fp16 tiles read bf16 or fp16 inputs.
template <class T, int kThreads, class F = Identity>
__device__ __forceinline__ void load_tile(T* s, const View& x, int64_t b, int64_t t0, int rows, int64_t h, int c0,
                                          int D, F f = F()) {
  const int cols = D - c0 < kTile ? D - c0 : kTile;
  const int64_t base = offset4(x, b, t0, h, c0);
  if constexpr (std::is_same_v<T, float>) {
    load_tile_typed<T, float, kThreads>(s, static_cast<const float*>(x.data) + base, x.stride[1], x.stride[3], rows,
                                        cols, f);
  } else if (x.dtype == Elem::bf16) {
    load_tile_typed<T, bf16, kThreads>(s, static_cast<const bf16*>(x.data) + base, x.stride[1], x.stride[3], rows,
                                       cols, f);
  } else {
    load_tile_typed<T, __half, kThreads>(s, static_cast<const __half*>(x.data) + base, x.stride[1], x.stride[3], rows,
                                         cols, f);
  }
}

// dst[r][c] = f(r, c, src[src_row(r)][c]) in fp32 for rows r < nrows of 64
// columns in shared memory (dst == src allowed); 16 bytes (8 bf16 / fp16 or 4 fp32
// elements of one row) per step of a thread.
// kOneBody: a loop of one body (smallest code; for kernels with registers to
// spare: the general chunk kernel spills more with it), else unrolled by 2.
template <class T, int kThreads, int kRows, bool kOneBody = false, class RowOf, class F>
__device__ __forceinline__ void map_rows(T* dst, const T* src, RowOf src_row, F f) {
  constexpr int kVec = 16 / sizeof(T), kPerRow = kTile / kVec;
  auto body = [&](int idx) {
    const int r = idx / kPerRow, c = (idx % kPerRow) * kVec;
    const T* from = src + src_row(r) * kLd<T> + c;
    T* to = dst + r * kLd<T> + c;
    if constexpr (sizeof(T) == 4) {
      float4 x = *reinterpret_cast<const float4*>(from);
      x.x = f(r, c, x.x), x.y = f(r, c + 1, x.y), x.z = f(r, c + 2, x.z), x.w = f(r, c + 3, x.w);
      *reinterpret_cast<float4*>(to) = x;
    } else {
      const uint4 raw = *reinterpret_cast<const uint4*>(from);
      uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
      for (int i = 0; i < 4; ++i)
        w[i] = pack_pair<T>(f(r, c + 2 * i, widen<T>(w[i] & 0xffffu)), f(r, c + 2 * i + 1, widen<T>(w[i] >> 16)));
      *reinterpret_cast<uint4*>(to) = make_uint4(w[0], w[1], w[2], w[3]);
    }
  };
  if constexpr (kOneBody) {
    for_each_item<kThreads, kRows * kPerRow, false>(body);
  } else {
#pragma unroll 2
    for (int idx = threadIdx.x; idx < kRows * kPerRow; idx += kThreads) body(idx);
  }
}

// s[r][c] = f(r, c, s[r][c]) in fp32 over a 64x64 tile of shared memory.
template <class T, int kThreads, bool kOneBody = false, class F>
__device__ __forceinline__ void transform_tile(T* s, F f) {
  map_rows<T, kThreads, kTile, kOneBody>(s, s, [](int r) { return r; }, f);
}

// ---- asynchronous copies (cp.async, the ordered flavour of cuda/common/copy.cuh): the data is in
// shared memory after cp_async_commit_and_wait_all() in the issuing thread and a barrier of the block.

// load_tile without a transform: a plain asynchronous copy when the tile is
// whole 16-byte rows of the compute type, else the converting load.
// Whether the tile at (b, t0, h, c0) is whole 16-byte rows of the compute type.
template <class T>
__device__ __forceinline__ bool plain_tile(const View& x, int64_t b, int64_t t0, int64_t h, int c0, int D) {
  constexpr int kVec = 16 / sizeof(T);
  const Elem own = std::is_same_v<T, float> ? Elem::f32 : (std::is_same_v<T, __half> ? Elem::f16 : Elem::bf16);
  const bool same_type = x.dtype == own;
  const T* src = static_cast<const T*>(x.data) + offset4(x, b, t0, h, c0);
  return same_type && x.stride[3] == 1 && D - c0 >= kTile && x.stride[1] % kVec == 0 &&
         (reinterpret_cast<uintptr_t>(src) & 15) == 0;
}

// kKnownPlain: the caller knows the tile is plain (no check, no fallback code).
template <class T, int kThreads, bool kKnownPlain = false>
__device__ __forceinline__ void load_tile_async(T* s, const View& x, int64_t b, int64_t t0, int rows, int64_t h,
                                                int c0, int D) {
  constexpr int kVec = 16 / sizeof(T), kPerRow = kTile / kVec;
  const T* src = static_cast<const T*>(x.data) + offset4(x, b, t0, h, c0);
  const int64_t row_stride = x.stride[1];
  if (kKnownPlain || plain_tile<T>(x, b, t0, h, c0, D)) {
    for_each_item<kThreads, kTile * kPerRow>([&](int idx) {
      const int r = idx / kPerRow, c = (idx % kPerRow) * kVec;
      // kKnownPlain: the host checked that a chunk's rows span < 2^31 elements (32-bit offsets)
      const int64_t at = kKnownPlain ? int64_t(r * int(row_stride) + c) : r * row_stride + c;
      cp_async16_ordered(s + r * kLd<T> + c, r < rows ? src + at : src, r < rows ? 16 : 0);
    });
  } else if constexpr (!kKnownPlain) {
    load_tile<T, kThreads>(s, x, b, t0, rows, h, c0, D);
  }
}

// store_tile one element at a time (any dtype and strides).
template <int kThreads>
__device__ __forceinline__ void store_tile_elements(const View& x, int64_t base, int rows, int cols, const float* s) {
#pragma unroll 1
  for (int idx = threadIdx.x; idx < kTileElems; idx += kThreads) {
    const int r = idx / kTile, c = idx % kTile;
    if (r < rows && c < cols) store_as(x.data, base + r * x.stride[1] + c * x.stride[3], x.dtype, s[r * kLdF + c]);
  }
}

// Rows of a 64x64 fp32 tile of shared memory (row stride kLdF) to a bf16 or
// fp16 output in whole aligned 16-byte rows, rows r < rows.
// kOffsets32: a chunk's rows span < 2^31 elements (checked by the caller's host).
template <int kThreads, bool kOffsets32 = false>
__device__ __forceinline__ void store_rows_16bit(const View& x, int64_t base, int64_t row_stride, int rows, bool bf,
                                                 const float* s) {
  for_each_item<kThreads, kTile * 8>([&](int idx) {
    const int r = idx / 8, c = (idx % 8) * 8;
    if (r >= rows) return;
    const float4 lo = *reinterpret_cast<const float4*>(s + r * kLdF + c);
    const float4 hi = *reinterpret_cast<const float4*>(s + r * kLdF + c + 4);
    const uint4 out = bf ? make_uint4(pack_bf16(lo.x, lo.y), pack_bf16(lo.z, lo.w), pack_bf16(hi.x, hi.y),
                                      pack_bf16(hi.z, hi.w))
                         : make_uint4(pack_f16(lo.x, lo.y), pack_f16(lo.z, lo.w), pack_f16(hi.x, hi.y),
                                      pack_f16(hi.z, hi.w));
    const int64_t at = kOffsets32 ? int64_t(r * int(row_stride) + c) : r * row_stride + c;
    *reinterpret_cast<uint4*>(static_cast<unsigned short*>(x.data) + base + at) = out;
  });
}

// Rows 0..rows-1 of a 64x64 fp32 tile (row stride kLdF) into whole aligned fp32 rows of x from element base.
template <int kThreads>
__device__ __forceinline__ void store_rows_f32(const View& x, int64_t base, int64_t row_stride, int rows,
                                               const float* s) {
  for (int idx = threadIdx.x; idx < kTile * 16; idx += kThreads) {
    const int r = idx / 16, c = (idx % 16) * 4;
    if (r < rows)
      *reinterpret_cast<float4*>(static_cast<float*>(x.data) + base + r * row_stride + c) =
          *reinterpret_cast<const float4*>(s + r * kLdF + c);
  }
}

// x[b, t0 + r, h, c0 + c] = s[r][c] for r < rows, c0 + c < D, from a 64x64
// fp32 tile of shared memory (row stride kLdF): 16-byte stores where whole
// aligned rows of a bf16, fp16 or f32 output allow, else element by element.
// kKnownBf16Rows: the caller knows the output is bf16 in whole aligned 16-byte
// rows (only that path is compiled).
template <int kThreads, bool kKnownBf16Rows = false, bool kKnownF32Rows = false>
__device__ __forceinline__ void store_tile(const View& x, int64_t b, int64_t t0, int rows, int64_t h, int c0, int D,
                                           const float* s) {
  const int64_t base = offset4(x, b, t0, h, c0), row_stride = x.stride[1];
  if constexpr (kKnownBf16Rows) {
    store_rows_16bit<kThreads, true>(x, base, row_stride, rows, true, s);
  } else if constexpr (kKnownF32Rows) {
    store_rows_f32<kThreads>(x, base, row_stride, rows, s);
  } else {
    const int cols = D - c0 < kTile ? D - c0 : kTile;
    const bool half = x.dtype == Elem::bf16 || x.dtype == Elem::f16;
    const int vec = half ? 8 : 4;  // elements per 16 bytes
    const char* first = static_cast<const char*>(x.data) + base * (half ? 2 : 4);
    const bool vector = (half || x.dtype == Elem::f32) && x.stride[3] == 1 && cols == kTile &&
                        row_stride % vec == 0 && (reinterpret_cast<uintptr_t>(first) & 15) == 0;
    if (vector && half) {
      store_rows_16bit<kThreads>(x, base, row_stride, rows, x.dtype == Elem::bf16, s);
    } else if (vector) {
      store_rows_f32<kThreads>(x, base, row_stride, rows, s);
    } else {
      store_tile_elements<kThreads>(x, base, rows, cols, s);
    }
  }
}

// Row t of a tile (64 columns from c0, clipped to D) into L2, for a load that
// comes later; each 128-byte line the row touches.
__device__ __forceinline__ void prefetch_row_l2(const View& x, int64_t b, int64_t t, int64_t h, int c0, int D) {
  const int esize = elem_size(x.dtype);
  const int cols = D - c0 < kTile ? D - c0 : kTile;
  const char* first = static_cast<const char*>(x.data) + offset4(x, b, t, h, c0) * esize;
  const int64_t span = (cols - 1) * x.stride[3] * esize + esize;  // bytes from the first to past the last element
  for (int64_t at = 0; at < span; at += 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(first + at));
}

// Scratch state tiles: contiguous 64x64 in global memory <-> padded rows in shared memory.
template <class T, int kThreads>
__device__ __forceinline__ void copy_tile_in(T* s, const T* g) {
  constexpr int kVec = 16 / sizeof(T), kPerRow = kTile / kVec;
  for_each_item<kThreads, kTile * kPerRow>([&](int idx) {
    const int r = idx / kPerRow, c = (idx % kPerRow) * kVec;
    cp_async16_ordered(s + r * kLd<T> + c, g + r * kTile + c, 16);
  });
}

template <class T, int kThreads>
__device__ __forceinline__ void copy_tile_out(T* g, const T* s) {
  constexpr int kVec = 16 / sizeof(T), kPerRow = kTile / kVec;
  for_each_item<kThreads, kTile * kPerRow>([&](int idx) {
    const int r = idx / kPerRow, c = (idx % kPerRow) * kVec;
    *reinterpret_cast<uint4*>(g + r * kTile + c) = *reinterpret_cast<const uint4*>(s + r * kLd<T> + c);
  });
}

}  // namespace flashgla::cuda::gla
