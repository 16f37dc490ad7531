// Element conversions between the storage dtypes (fp32, bf16, fp16) and the
// fp32 the kernels compute in, shared by the GLA forward and norm kernels.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace flashgla::cuda {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

// Rounds to nearest even.
template <class E>
__device__ __forceinline__ E from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }

}  // namespace flashgla::cuda
