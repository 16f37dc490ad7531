// The gate of a 64 x 64 tile in log2 units: loaded into registers, summed into its chunk-local cumsum in
// shared memory, and exp2_of for the weights between two cumsums.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "cuda/common/dtype.cuh"
#include "cuda/gla/device/elements.cuh"
#include "cuda/gla/device/gla_bwd.cuh"

namespace flashgla::cuda::gla {

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

// decay: g_gamma[h] of a scalar gate (0 for the other kinds), added as scalar_gate (elements.cuh) adds it.
template <class GT, class In, int R>
__device__ __forceinline__ void load_gate_rows(GT (&x)[R], const In* src, int64_t row_stride, int valid_rows,
                                               float decay) {
#pragma unroll
  for (int i = 0; i < R; ++i) {
    if constexpr (std::is_same_v<In, double>) x[i] = i < valid_rows ? gate_value<GT>(double(decay) + src[i * row_stride]) : GT(0);
    else x[i] = i < valid_rows ? gate_value<GT>(decay + to_float(src[i * row_stride])) : GT(0);
  }
}

// kPlainGate: the caller knows the gate is bf16, or a scalar gate in fp32 (the plain chunk kernel's gates,
// plan.cpp: only those loaders are compiled).
template <class GT, int kThreads, bool kPlainGate = false>
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
  const float decay = p.gate == GateKind::scalar ? head_decay(p.g_gamma, int(h)) : 0.f;
  const int64_t off = offset4(p.g, b, t0 + first, h, p.gate == GateKind::vector ? c0 + c : 0);
  const int64_t rs = p.g.stride[1];
  if constexpr (kPlainGate) {
    if (p.g.dtype == Elem::f32) load_gate_rows(g.x, static_cast<const float*>(p.g.data) + off, rs, valid, decay);
    else load_gate_rows(g.x, static_cast<const bf16*>(p.g.data) + off, rs, valid, decay);
    return g;
  }
  switch (p.g.dtype) {
    case Elem::f64: load_gate_rows(g.x, static_cast<const double*>(p.g.data) + off, rs, valid, decay); break;
    case Elem::f32: load_gate_rows(g.x, static_cast<const float*>(p.g.data) + off, rs, valid, decay); break;
    case Elem::bf16: load_gate_rows(g.x, static_cast<const bf16*>(p.g.data) + off, rs, valid, decay); break;
    default: load_gate_rows(g.x, static_cast<const __half*>(p.g.data) + off, rs, valid, decay); break;
  }
  return g;
}

// The gate of token t (absolute), key `key`, in log2 units, as load_gate_tile reads it: 0 without a gate and
// for keys past K.
template <class GT>
__device__ __forceinline__ GT gate_at(const BwdParams& p, int64_t b, int64_t t, int64_t h, int key) {
  if (p.gate == GateKind::none || key >= p.key_dim) return GT(0);
  const float decay = p.gate == GateKind::scalar ? head_decay(p.g_gamma, int(h)) : 0.f;
  const int64_t off = offset4(p.g, b, t, h, p.gate == GateKind::vector ? key : 0);
  if (p.g.dtype == Elem::f64) return gate_value<GT>(double(decay) + static_cast<const double*>(p.g.data)[off]);
  return gate_value<GT>(decay + load_as<float>(p.g.data, off, p.g.dtype));
}

// fp16 operands (gla_bwd.cuh, Compute::f16) keep the backward state dS of the scratch scaled: the tile of slot
// c holds dS_c exp2(−E_c) per key row, E_c = Γ_0 of chunk c + 1 (the gate of its first token, log2; 0 for a
// sequence's last chunk), since every term of dS_c carries exp2(E_c): gates of −20 per step leave dS_c near
// e^-20, below fp16's 6e-8, while dS_c exp2(−E_c) is of the inputs' size. The readers multiply by exp2(E_c)
// in fp32. bf16 (3e38) and fp32 store dS_c itself.
template <class T>
inline constexpr bool kScaledDStates = std::is_same_v<T, __half>;

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

}  // namespace flashgla::cuda::gla
