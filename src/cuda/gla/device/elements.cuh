// Element access of GLA tensors: one element of any dtype as float or double (load_as / store_as), four and
// eight at a time (load4 / load8 / store8), 16-bit pairs packed and widened, and the [B,T,H,D] offsets of a View.
// Scalar conversions to_float / from_float: cuda/common/dtype.cuh.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "cuda/common/dtype.cuh"
#include "cuda/gla/device/types.cuh"

namespace flashgla::cuda::gla {

using bf16 = __nv_bfloat16;

// ---- elements ------------------------------------------------------------------
// The element at index i of an array of any readable dtype, as R (float or double).
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

// Two consecutive elements (4- or 8-byte aligned) as a float2.
__device__ __forceinline__ float2 load2(const float* p) { return *reinterpret_cast<const float2*>(p); }
__device__ __forceinline__ float2 load2(const __nv_bfloat16* p) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
}
__device__ __forceinline__ float2 load2(const __half* p) {
  return __half22float2(*reinterpret_cast<const __half2*>(p));
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

// 16-bit floats held in the low bits of a word, widened to fp32.
template <class In>
__device__ __forceinline__ float widen(uint32_t bits) {
  if constexpr (std::is_same_v<In, bf16>) return __uint_as_float(bits << 16);
  else return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
}

// Eight consecutive elements at a 16-byte aligned address, as fp32.
__device__ __forceinline__ void load8(const float* at, float (&x)[8]) {
  const float4 a = reinterpret_cast<const float4*>(at)[0], b = reinterpret_cast<const float4*>(at)[1];
  x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
}
__device__ __forceinline__ void load8(const bf16* at, float (&x)[8]) {
  const uint4 u = *reinterpret_cast<const uint4*>(at);
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) x[2 * j] = __uint_as_float(w[j] << 16), x[2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
}
__device__ __forceinline__ void load8(const __half* at, float (&x)[8]) {
  const uint4 u = *reinterpret_cast<const uint4*>(at);
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) x[2 * j] = widen<__half>(w[j] & 0xffffu), x[2 * j + 1] = widen<__half>(w[j] >> 16);
}

// Two floats rounded to bf16, packed into one word (lo in the low half).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  return uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(lo))) |
         (uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(hi))) << 16);
}

__device__ __forceinline__ uint32_t pack_f16(float lo, float hi) {
  return uint32_t(__half_as_ushort(__float2half_rn(lo))) | (uint32_t(__half_as_ushort(__float2half_rn(hi))) << 16);
}

// Two floats rounded to E (bf16 or fp16), packed into one word (lo in the low half).
template <class E>
__device__ __forceinline__ uint32_t pack_pair(float lo, float hi) {
  static_assert(std::is_same_v<E, bf16> || std::is_same_v<E, __half>, "a 16-bit float");
  if constexpr (std::is_same_v<E, bf16>) return pack_bf16(lo, hi);
  else return pack_f16(lo, hi);
}

// Two neighbouring elements of a row in shared memory, in one store.
__device__ __forceinline__ void store_pair(float* at, float a, float b) { *reinterpret_cast<float2*>(at) = {a, b}; }
__device__ __forceinline__ void store_pair(bf16* at, float a, float b) { *reinterpret_cast<uint32_t*>(at) = pack_bf16(a, b); }
__device__ __forceinline__ void store_pair(__half* at, float a, float b) { *reinterpret_cast<uint32_t*>(at) = pack_f16(a, b); }

// The element offset of [n, h, d] in an [N,H,D] view (a per-sequence, per-head vector: z, a decay).
__device__ __forceinline__ int64_t offset3(const View& t, int64_t n, int64_t h, int64_t d) {
  return n * t.stride[0] + h * t.stride[1] + d * t.stride[2];
}

// The element offset of [b, s, h, d] in a [B,T,H,D] view.
__device__ __forceinline__ int64_t offset4(const View& t, int64_t b, int64_t s, int64_t h, int64_t d) {
  return b * t.stride[0] + s * t.stride[1] + h * t.stride[2] + d * t.stride[3];
}

// A scalar gate at g's element `offset`: the head's constant log decay g_gamma[h] (FLA's simple GLA; fp32,
// absent: 0) plus g, summed in fp32 where the kernels read the gate (no [B,T,H] copy of the sum). g_gamma
// alone arrives as g itself, broadcast over the tokens (gamma_gate in cuda/gla/host/gla_host.cuh).
// GAMMA = false: a kernel instantiated for an absent g_gamma, which reads g alone.
__device__ __forceinline__ float head_decay(const View& g_gamma, int h) {
  return g_gamma.data ? static_cast<const float*>(g_gamma.data)[h * g_gamma.stride[0]] : 0.f;
}
template <bool GAMMA = true>
__device__ __forceinline__ float scalar_gate(const View& g, int64_t offset, const View& g_gamma, int h) {
  if constexpr (!GAMMA) return load_as<float>(g.data, offset, g.dtype);
  return head_decay(g_gamma, h) + load_as<float>(g.data, offset, g.dtype);
}

// The element offset of token `token` of sequence `seq`, head h, in a [B,T,H,*] view (its first column).
__device__ __forceinline__ int64_t token_offset(const View& t, const SeqSpan& seq, int h, int64_t token) {
  return seq.batch * t.stride[0] + (seq.begin + token) * t.stride[1] + h * t.stride[2];
}

}  // namespace flashgla::cuda::gla
