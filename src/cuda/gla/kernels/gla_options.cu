// CUDA side of FLA 0.6's g_gamma option (core/gla_options_backend.h): the gate and
// its gradient's reduction; deliberately plain kernels. The linear-attention
// normaliser is in gla_normalize.cu.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/gla_options_backend.h"
#include "cuda/common/host.cuh"

namespace flashgla::cuda {
namespace {

// A strided tensor of any float dtype, as the kernels read it.
struct Any {
  void* data = nullptr;
  DType dtype = DType::f32;
  int64_t stride[4] = {0, 0, 0, 0};
};

Any any_of(const TensorView& t) {
  Any a;
  if (!t.defined()) return a;
  a.data = t.data, a.dtype = t.dtype;
  for (int d = 0; d < t.ndim; ++d) a.stride[d] = t.stride[d];
  return a;
}

__device__ __forceinline__ float load(const Any& t, int64_t offset) {
  switch (t.dtype) {
    case DType::f32: return static_cast<const float*>(t.data)[offset];
    case DType::bf16: return __bfloat162float(static_cast<const __nv_bfloat16*>(t.data)[offset]);
    case DType::f16: return __half2float(static_cast<const __half*>(t.data)[offset]);
    default: return float(static_cast<const double*>(t.data)[offset]);
  }
}

__device__ __forceinline__ void store(const Any& t, int64_t offset, float x) {
  switch (t.dtype) {
    case DType::f32: static_cast<float*>(t.data)[offset] = x; break;
    case DType::bf16: static_cast<__nv_bfloat16*>(t.data)[offset] = __float2bfloat16_rn(x); break;
    case DType::f16: static_cast<__half*>(t.data)[offset] = __float2half_rn(x); break;
    default: static_cast<double*>(t.data)[offset] = double(x); break;
  }
}

__device__ __forceinline__ int64_t at3(const Any& t, int64_t a, int64_t b, int64_t c) {
  return a * t.stride[0] + b * t.stride[1] + c * t.stride[2];
}

// ---- g_gamma ------------------------------------------------------------------

__global__ void gamma_gate_kernel(Any g, Any g_gamma, float* gate, int64_t T, int64_t H, int64_t total) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t h = i % H, t = i / H % T, b = i / (H * T);
    float x = load(g_gamma, h * g_gamma.stride[0]);
    if (g.data) x += load(g, at3(g, b, t, h));
    gate[i] = x;  // the gate is a dense [B,T,H] buffer
  }
}

constexpr int kReduceThreads = 256;

// One block per head: d_g_gamma[h] = Σ over every (b, t) of d_gate, in a fixed order (deterministic).
__global__ void gamma_grad_kernel(const float* d_gate, Any dg, Any d_g_gamma, int64_t T, int64_t H, int64_t rows) {
  __shared__ float partial[kReduceThreads];
  const int64_t h = blockIdx.x;
  float sum = 0.f;
  for (int64_t r = threadIdx.x; r < rows; r += kReduceThreads) {
    const float x = d_gate[r * H + h];
    if (dg.data) store(dg, at3(dg, r / T, r % T, h), x);
    sum += x;
  }
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int width = kReduceThreads / 2; width > 0; width /= 2) {
    if (threadIdx.x < width) partial[threadIdx.x] += partial[threadIdx.x + width];
    __syncthreads();
  }
  if (threadIdx.x == 0 && d_g_gamma.data) store(d_g_gamma, h * d_g_gamma.stride[0], partial[0]);
}

void require_dtype(const TensorView& t, const char* name) {
  FLASHGLA_REQUIRE(!t.defined() || t.dtype != DType::f64, ErrorKind::unsupported, name,
                   "the CUDA backend takes float32, bfloat16 or float16, got float64 (use the CPU backend)");
}

}  // namespace

void gla_gamma_gate(const GammaGateArgs& a) {
  require_dtype(a.g, "g"), require_dtype(a.g_gamma, "g_gamma");
  DeviceGuard guard(a.gate.device.index);
  const int64_t T = a.gate.shape[1], H = a.gate.shape[2], total = a.gate.shape[0] * T * H;
  if (total == 0) return;
  const int blocks = int(total / 256 + 1 < 4096 ? total / 256 + 1 : 4096);
  gamma_gate_kernel<<<blocks, 256, 0, static_cast<cudaStream_t>(a.stream)>>>(any_of(a.g), any_of(a.g_gamma),
                                                                            static_cast<float*>(a.gate.data), T, H,
                                                                            total);
  check_cuda(cudaGetLastError(), "gamma_gate_kernel launch");
}

void gla_gamma_grad(const GammaGradArgs& a) {
  require_dtype(a.dg, "dg"), require_dtype(a.d_g_gamma, "d_g_gamma");
  DeviceGuard guard(a.d_gate.device.index);
  const int64_t T = a.d_gate.shape[1], H = a.d_gate.shape[2], rows = a.d_gate.shape[0] * T;
  if (H == 0) return;
  gamma_grad_kernel<<<int(H), kReduceThreads, 0, static_cast<cudaStream_t>(a.stream)>>>(
      static_cast<const float*>(a.d_gate.data), any_of(a.dg), any_of(a.d_g_gamma), T, H, rows);
  check_cuda(cudaGetLastError(), "gamma_grad_kernel launch");
}

void* scratch_allocate(int index, size_t bytes, void* stream) {
  DeviceGuard guard(index);
  void* data = nullptr;
  check_cuda(cudaMallocAsync(&data, bytes, static_cast<cudaStream_t>(stream)), "cudaMallocAsync (g_gamma gate)");
  return data;
}

void scratch_free(int index, void* data, void* stream) {
  DeviceGuard guard(index);
  cudaFreeAsync(data, static_cast<cudaStream_t>(stream));
}

}  // namespace flashgla::cuda
