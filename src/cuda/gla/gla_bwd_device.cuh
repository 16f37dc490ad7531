// Device helpers of the GLA backward kernels: element conversion, sequence
// boundaries, tile copies into shared memory, the chunk-local gate cumsum, and
// warp-level products with the mma.sync accumulator layout (tensor cores for
// bf16, plain fp32 FMAs for fp32 so that fp32 inputs keep fp32 accuracy).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "cuda/common/copy.cuh"
#include "cuda/common/dtype.cuh"
#include "cuda/common/mma.cuh"
#include "cuda/gla/gla_bwd.cuh"

namespace flashgla::cuda::gla {

using bf16 = __nv_bfloat16;

// ---- elements ------------------------------------------------------------------
template <class R>
__device__ __forceinline__ R load_as(const void* base, int64_t i, Elem dtype) {
  switch (dtype) {
    case Elem::f64: return R(static_cast<const double*>(base)[i]);
    case Elem::f32: return R(static_cast<const float*>(base)[i]);
    case Elem::bf16: return R(__bfloat162float(static_cast<const bf16*>(base)[i]));
    case Elem::f16: return R(__half2float(static_cast<const __half*>(base)[i]));
    default: return R(0);
  }
}

__device__ __forceinline__ void store_as(void* base, int64_t i, Elem dtype, float x) {
  switch (dtype) {
    case Elem::f64: static_cast<double*>(base)[i] = x; break;
    case Elem::f32: static_cast<float*>(base)[i] = x; break;
    case Elem::bf16: static_cast<bf16*>(base)[i] = __float2bfloat16_rn(x); break;
    case Elem::f16: static_cast<__half*>(base)[i] = __float2half_rn(x); break;
    default: break;
  }
}

// to_float, from_float: cuda/common/dtype.cuh (the tiles hold the compute type, float or bf16).

// exp2 of a difference of gate cumsums (log2 units); fp64 cumsums keep the
// difference exact before it is rounded to fp32. One hardware instruction
// (relative error ~2^-22); results below 2^-126 flush to zero, far under
// anything they are added to.
__device__ __forceinline__ float exp2_of(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float exp2_of(double x) { return exp2_of(float(x)); }

__device__ __forceinline__ int64_t offset4(const View& t, int64_t b, int64_t s, int64_t h, int64_t d) {
  return b * t.stride[0] + s * t.stride[1] + h * t.stride[2] + d * t.stride[3];
}

// Programmatic dependent launch (sm_90+): a kernel lets the next one start
// (launch_dependents), and that one waits for it to finish and its writes to
// be visible (wait) before it reads them. Both return at once when the launch
// was an ordinary one.
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void wait_for_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// ---- sequences -----------------------------------------------------------------
// A sequence (cuda::sequence_span: boundaries clamped to [0, T], so that a bad
// cu_seqlens never sends an access out of bounds) and the chunk slot of its
// first chunk.
struct BwdSeq : SeqSpan {
  int64_t slot0;
};

// Chunk slots: with cu_seqlens, sequence n's chunks start at floor(begin / C) + n,
// which keeps the sequences' slots disjoint and below floor(T / C) + N + 1
// without a prefix sum over the lengths.
__device__ __forceinline__ BwdSeq sequence(const BwdParams& p, int64_t n) {
  if (!p.seqs.cu_seqlens) return {sequence_span(p.seqs, n), n * p.chunks_per_seq};
  const SeqSpan s = sequence_span(p.seqs, n);
  return {s, s.begin / kChunk + n};
}

__device__ __forceinline__ int64_t num_chunks(int64_t len) { return (len + kChunk - 1) / kChunk; }

// The sequence and chunk of a chunk slot; false for an unused slot.
__device__ __forceinline__ bool locate_chunk(const BwdParams& p, int64_t slot, BwdSeq& seq, int64_t& chunk) {
  if (!p.seqs.cu_seqlens) {
    seq = sequence(p, slot / p.chunks_per_seq);
    chunk = slot % p.chunks_per_seq;
    return true;
  }
  int64_t lo = 0, hi = p.num_seqs - 1;  // the last sequence whose first slot is <= slot
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (boundary(p.seqs, mid) / kChunk + mid <= slot) lo = mid;
    else hi = mid - 1;
  }
  seq = sequence(p, lo);
  chunk = slot - seq.slot0;
  return chunk >= 0 && chunk < num_chunks(seq.len);
}

// ---- shared-memory tiles ---------------------------------------------------------
// Row strides (elements) of 64-wide tiles: 16 bytes of padding per row keep
// ldmatrix and column walks free of bank conflicts.
// (kLdOf and kLdF: cuda/gla/layouts.h, where the planner sizes the state scans' shared memory.)
template <class T>
inline constexpr int kLd = kLdOf<int(sizeof(T))>;

struct Identity {
  __device__ float operator()(int, int, float x) const { return x; }
};

// 16-bit floats held in the low bits of a word, widened to fp32.
template <class In>
__device__ __forceinline__ float widen(uint32_t bits) {
  if constexpr (std::is_same_v<In, bf16>) return __uint_as_float(bits << 16);
  else return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
}

// Two floats rounded to bf16, packed into one word (lo in the low half).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  return uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(lo))) |
         (uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(hi))) << 16);
}

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
// fp32 tiles from f32 inputs, bf16 tiles from bf16 or fp16 inputs. Inlined
// (a call gave the chunk kernel a 952-byte stack frame and spills that miss L1),
// with the element-wise fallback loop not unrolled: unrolled at every call
// site it made up a third of the chunk kernel's code (instruction-cache misses).
template <class T, class In, int kThreads, class F>
__device__ __forceinline__ void load_tile_typed(T* s, const In* src, int64_t row_stride, int64_t col_stride, int rows,
                                                int cols, F f) {
  static_assert(sizeof(T) == sizeof(In), "fp32 <- f32, bf16 <- bf16 / fp16");
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
          w[i] = pack_bf16(f(r, c + 2 * i, widen<In>(w[i] & 0xffffu)), f(r, c + 2 * i + 1, widen<In>(w[i] >> 16)));
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
// fp32 tiles read f32 inputs; bf16 tiles read bf16 or fp16 inputs.
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
// columns in shared memory (dst == src allowed); 16 bytes (8 bf16 or 4 fp32
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
        w[i] = pack_bf16(f(r, c + 2 * i, widen<bf16>(w[i] & 0xffffu)), f(r, c + 2 * i + 1, widen<bf16>(w[i] >> 16)));
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

// Two neighbouring elements of a row in shared memory, in one store.
__device__ __forceinline__ void store_pair(float* at, float a, float b) { *reinterpret_cast<float2*>(at) = {a, b}; }
__device__ __forceinline__ void store_pair(bf16* at, float a, float b) { *reinterpret_cast<uint32_t*>(at) = pack_bf16(a, b); }

// ---- asynchronous copies (cp.async, the ordered flavour of cuda/common/copy.cuh): the data is in
// shared memory after cp_async_commit_and_wait_all() in the issuing thread and a barrier of the block.

// load_tile without a transform: a plain asynchronous copy when the tile is
// whole 16-byte rows of the compute type, else the converting load.
// Whether the tile at (b, t0, h, c0) is whole 16-byte rows of the compute type.
template <class T>
__device__ __forceinline__ bool plain_tile(const View& x, int64_t b, int64_t t0, int64_t h, int c0, int D) {
  constexpr int kVec = 16 / sizeof(T);
  const bool same_type = std::is_same_v<T, float> ? x.dtype == Elem::f32 : x.dtype == Elem::bf16;
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

__device__ __forceinline__ uint32_t pack_f16(float lo, float hi) {
  return uint32_t(__half_as_ushort(__float2half_rn(lo))) | (uint32_t(__half_as_ushort(__float2half_rn(hi))) << 16);
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

// x[b, t0 + r, h, c0 + c] = s[r][c] for r < rows, c0 + c < D, from a 64x64
// fp32 tile of shared memory (row stride kLdF): 16-byte stores where whole
// aligned rows of a bf16, fp16 or f32 output allow, else element by element.
// kKnownBf16Rows: the caller knows the output is bf16 in whole aligned 16-byte
// rows (only that path is compiled).
template <int kThreads, bool kKnownBf16Rows = false>
__device__ __forceinline__ void store_tile(const View& x, int64_t b, int64_t t0, int rows, int64_t h, int c0, int D,
                                           const float* s) {
  const int64_t base = offset4(x, b, t0, h, c0), row_stride = x.stride[1];
  if constexpr (kKnownBf16Rows) {
    store_rows_16bit<kThreads, true>(x, base, row_stride, rows, true, s);
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
      for (int idx = threadIdx.x; idx < kTile * 16; idx += kThreads) {
        const int r = idx / 16, c = (idx % 16) * 4;
        if (r < rows)
          *reinterpret_cast<float4*>(static_cast<float*>(x.data) + base + r * row_stride + c) =
              *reinterpret_cast<const float4*>(s + r * kLdF + c);
      }
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

__device__ __forceinline__ int64_t state_tile_index(const BwdParams& p, int64_t slot, int64_t h, int kt, int vt) {
  return (((slot * p.heads + h) * p.key_tiles + kt) * p.value_tiles + vt) * int64_t(kTileElems);
}

// The gate of a 64 x 64 tile (tokens t0.., key columns c0..) in log2 units,
// held in registers: thread t owns column t % 64 and rows kRows (t / 64).. of
// it. Rows past `rows` and columns past K hold a zero gate. Loading is split
// from the cumsum so that the loads fly together with the block's other loads.
template <class GT, int kThreads>
struct GateTile {
  static constexpr int kParts = kThreads / kTile;
  static constexpr int kRows = kTile / kParts;
  GT x[kRows];
};

// The gate in log2 units, clamped at −127 (a gate of −88 and below, −inf
// included): every weight across such a gate is below 2^-126 and exp2_of
// flushes it to 0, exactly what the gate gives, while Γ stays finite (no
// −inf − −inf) and small enough for the differences of the other pairs. A
// compare per element; gates above the clamp keep their bits.
constexpr double kGateFloorLog2 = -127.0;
template <class GT, class In>
__device__ __forceinline__ GT gate_value(In x) {
  GT y;
  if constexpr (std::is_same_v<In, double>) y = GT(x) * GT(1.4426950408889634);
  else y = GT(to_float(x)) * GT(1.4426950408889634);
  return y > GT(kGateFloorLog2) ? y : GT(kGateFloorLog2);
}

template <class GT, class In, int R>
__device__ __forceinline__ void load_gate_rows(GT (&x)[R], const In* src, int64_t row_stride, int valid_rows) {
#pragma unroll
  for (int i = 0; i < R; ++i) x[i] = i < valid_rows ? gate_value<GT>(src[i * row_stride]) : GT(0);
}

// kBf16Only: the caller knows the gate is bf16 (only that loader is compiled).
template <class GT, int kThreads, bool kBf16Only = false>
__device__ __forceinline__ GateTile<GT, kThreads> load_gate_tile(const BwdParams& p, int64_t b, int64_t t0, int rows,
                                                                 int64_t h, int c0) {
  using Tile = GateTile<GT, kThreads>;
  Tile g;
  const int c = threadIdx.x % kTile, first = (threadIdx.x / kTile) * Tile::kRows;
  const int valid = (p.gate != GateKind::none && c0 + c < p.key_dim) ? rows - first : 0;
  if (valid <= 0) {
#pragma unroll
    for (int i = 0; i < Tile::kRows; ++i) g.x[i] = GT(0);
    return g;
  }
  const int64_t off = offset4(p.g, b, t0 + first, h, p.gate == GateKind::vector ? c0 + c : 0);
  const int64_t rs = p.g.stride[1];
  if constexpr (kBf16Only) {
    load_gate_rows(g.x, static_cast<const bf16*>(p.g.data) + off, rs, valid);
    return g;
  }
  switch (p.g.dtype) {
    case Elem::f64: load_gate_rows(g.x, static_cast<const double*>(p.g.data) + off, rs, valid); break;
    case Elem::f32: load_gate_rows(g.x, static_cast<const float*>(p.g.data) + off, rs, valid); break;
    case Elem::bf16: load_gate_rows(g.x, static_cast<const bf16*>(p.g.data) + off, rs, valid); break;
    default: load_gate_rows(g.x, static_cast<const __half*>(p.g.data) + off, rs, valid); break;
  }
  return g;
}

// sG[r][c] = Γ, the chunk-local cumsum of the gate tile over rows 0..r. Flat
// past the last valid row, so γ (the chunk's total) is always row 63.
// Barriers of the whole block before and after.
template <class GT, int kThreads>
__device__ __forceinline__ void store_gate_cumsum(GT* sG, GateTile<GT, kThreads>& g) {
  using Tile = GateTile<GT, kThreads>;
  const int c = threadIdx.x % kTile, part = threadIdx.x / kTile, first = part * Tile::kRows;
#pragma unroll
  for (int i = 1; i < Tile::kRows; ++i) g.x[i] += g.x[i - 1];
  __syncthreads();  // earlier readers of sG are done
#pragma unroll
  for (int i = 0; i < Tile::kRows; ++i) sG[(first + i) * kLdF + c] = g.x[i];
  if constexpr (Tile::kParts > 1) {
    __syncthreads();
    GT carry = GT(0);  // the totals of the row blocks above
    for (int q = 0; q < part; ++q) carry += sG[((q + 1) * Tile::kRows - 1) * kLdF + c];
    __syncthreads();
    if (part > 0) {
#pragma unroll
      for (int i = 0; i < Tile::kRows; ++i) sG[(first + i) * kLdF + c] = g.x[i] + carry;
    }
  }
  __syncthreads();
}

// ---- warp products -----------------------------------------------------------------
// acc[NT][4] is a 16 x 8·NT tile in the mma.sync m16n8 accumulator layout:
// acc[nt][e] is row (lane / 4) + 8 (e / 2), column 8 nt + 2 (lane % 4) + e % 2.
__device__ __forceinline__ int acc_row(int e) { return (threadIdx.x & 31) / 4 + 8 * (e >> 1); }
__device__ __forceinline__ int acc_col(int nt, int e) { return 8 * nt + 2 * (threadIdx.x & 3) + (e & 1); }

// ldmatrix_x4_ordered, ldmatrix_x4_trans_ordered and mma16816_volatile: cuda/common/mma.cuh.

// acc += A · B for A of 16 x kdim and B of kdim x 8·NT, both in shared memory.
// A is stored row-major (a[m * lda + k]) or, with kATrans, as its transpose
// (a[k * lda + m]); B is stored as b[n * ldb + k] (kBKMajor) or b[k * ldb + n].
// kdim is a multiple of 16; pointers and strides keep 16-byte rows.
template <int NT, bool kATrans, bool kBKMajor>
__device__ __forceinline__ void warp_gemm(float (&acc)[NT][4], const bf16* a, int lda, const bf16* b, int ldb,
                                          int kdim) {
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
      mma16816_volatile<bf16>(acc[2 * np], af, bfr[0], bfr[1]);
      mma16816_volatile<bf16>(acc[2 * np + 1], af, bfr[2], bfr[3]);
    }
  }
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
