// CUDA side of FLA 0.6's options (core/gla_options_backend.h): the g_gamma gate and
// its gradient, and the linear-attention normaliser. Deliberately plain kernels
// (one block per (sequence, head) pair for the normaliser, tokens in tiles of 32
// with a shared-memory reduction per token): they move o once more than the GLA
// kernels do, which is small next to the chunked op, and are easy to check
// against the CPU version line by line.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/gla_options_backend.h"
#include "cuda/common/host.cuh"
#include "cuda/gla/host/gla_host.cuh"

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

__device__ __forceinline__ int64_t at4(const Any& t, int64_t a, int64_t b, int64_t c, int64_t d) {
  return a * t.stride[0] + b * t.stride[1] + c * t.stride[2] + d * t.stride[3];
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

// ---- the normaliser ---------------------------------------------------------------

constexpr int kThreads = 128;  // 4 warps
constexpr int kTile = 32;      // tokens per tile: each warp reduces 8 of them
constexpr float kNormalizeEps = 1e-10f;  // added to scale · q·z, as FLA does

struct NormalizeParams {
  Any o_raw, q, k, z_init, o, z_final;         // forward
  Any d_o, d_z_final, d_o_raw, dq, dk, d_z_init;  // backward
  Sequences seqs;  // seqs.total_len: T
  int64_t heads = 0, K = 0, V = 0;
  float scale = 1.f;
  bool reverse = false;
  float* d_den = nullptr;  // backward scratch: [B*T*H], indexed by (packed row, head)
};

// Step i of the sequence in processing order -> its row.
__device__ __forceinline__ int64_t row_of(const SeqSpan& s, int64_t i, bool reverse) {
  return s.begin + (reverse ? s.len - 1 - i : i);
}

// Sums part[j][0..kThreads) for the tile's tokens j: warp w takes tokens w, w+4, ...; out[j] gets the sum.
__device__ void reduce_tile(float (*part)[kThreads], float* out) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int j = warp; j < kTile; j += kThreads / 32) {
    float x = 0.f;
    for (int m = lane; m < kThreads; m += 32) x += part[j][m];
    for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
    if (lane == 0) out[j] = x;
  }
}

// z (the running key sum) from z_init, or zero.
__device__ __forceinline__ void load_z_init(const NormalizeParams& p, int64_t n, int64_t h, float* z) {
  for (int64_t d = threadIdx.x; d < p.K; d += kThreads) z[d] = p.z_init.data ? load(p.z_init, at3(p.z_init, n, h, d)) : 0.f;
}

// This thread's share (its columns of z) of q_t · z_t for the tile's tokens, z_t including k_t, into acc;
// kAdvance: z moves on to the end of the tile (the backward advances it later, with dq).
template <bool kAdvance>
__device__ __forceinline__ void tile_qz_partials(const NormalizeParams& p, const SeqSpan& s, int64_t b, int64_t h,
                                                 int64_t i0, int tokens, float* z, float (&acc)[kTile]) {
#pragma unroll
  for (int j = 0; j < kTile; ++j) acc[j] = 0.f;
  for (int64_t d = threadIdx.x; d < p.K; d += kThreads) {
    float zz = z[d];
#pragma unroll
    for (int j = 0; j < kTile; ++j)
      if (j < tokens) {
        const int64_t t = row_of(s, i0 + j, p.reverse);
        zz += load(p.k, at4(p.k, b, t, h, d));
        acc[j] += load(p.q, at4(p.q, b, t, h, d)) * zz;
      }
    if (kAdvance) z[d] = zz;
  }
}

// z lives in dynamic shared memory (K floats); thread c owns columns c, c + kThreads, ...
__global__ void normalize_forward_kernel(NormalizeParams p) {
  extern __shared__ float z[];
  __shared__ float part[kTile][kThreads];
  __shared__ float den[kTile];
  const int64_t n = blockIdx.x / p.heads, h = blockIdx.x % p.heads;
  const SeqSpan s = sequence_span(p.seqs, n);
  const int64_t b = s.batch;
  load_z_init(p, n, h, z);
  for (int64_t i0 = 0; i0 < s.len; i0 += kTile) {
    const int tokens = int(s.len - i0 < kTile ? s.len - i0 : kTile);
    float acc[kTile];
    tile_qz_partials<true>(p, s, b, h, i0, tokens, z, acc);
#pragma unroll
    for (int j = 0; j < kTile; ++j) part[j][threadIdx.x] = acc[j];
    __syncthreads();
    reduce_tile(part, den);
    __syncthreads();
    for (int64_t idx = threadIdx.x; idx < int64_t(tokens) * p.V; idx += kThreads) {
      const int j = int(idx / p.V);
      const int64_t e = idx % p.V, t = row_of(s, i0 + j, p.reverse);
      const float denominator = p.scale * den[j] + kNormalizeEps;
      store(p.o, at4(p.o, b, t, h, e), load(p.o_raw, at4(p.o_raw, b, t, h, e)) / denominator);
    }
    __syncthreads();  // part and den are reused by the next tile
  }
  if (p.z_final.data)
    for (int64_t d = threadIdx.x; d < p.K; d += kThreads) store(p.z_final, at3(p.z_final, n, h, d), z[d]);
}

// Pass 1 (processing order): den_t, d_den_t = -(d o_t · o_raw_t) / den_t², d o_raw_t = d o_t / den_t and
// dq_t = d_den_t · scale · z_t. Pass 2 (the other way): dk_t = d z_final + Σ_{u from t on} d_den_u · scale · q_u,
// and what is left at the start is d z_init.
__global__ void normalize_backward_kernel(NormalizeParams p) {
  extern __shared__ float z[];
  __shared__ float part[kTile][kThreads];
  __shared__ float part_do[kTile][kThreads];
  __shared__ float qz[kTile], dot[kTile];
  const int64_t n = blockIdx.x / p.heads, h = blockIdx.x % p.heads;
  const SeqSpan s = sequence_span(p.seqs, n);
  const int64_t b = s.batch;
  auto scratch = [&](int64_t t) { return (b * p.seqs.total_len + t) * p.heads + h; };
  load_z_init(p, n, h, z);
  for (int64_t i0 = 0; i0 < s.len; i0 += kTile) {
    const int tokens = int(s.len - i0 < kTile ? s.len - i0 : kTile);
    float acc[kTile];
    tile_qz_partials<false>(p, s, b, h, i0, tokens, z, acc);
#pragma unroll
    for (int j = 0; j < kTile; ++j) part[j][threadIdx.x] = acc[j], acc[j] = 0.f;
    for (int64_t e = threadIdx.x; e < p.V; e += kThreads) {
#pragma unroll
      for (int j = 0; j < kTile; ++j)
        if (j < tokens) {
          const int64_t t = row_of(s, i0 + j, p.reverse);
          acc[j] += load(p.d_o, at4(p.d_o, b, t, h, e)) * load(p.o_raw, at4(p.o_raw, b, t, h, e));
        }
    }
#pragma unroll
    for (int j = 0; j < kTile; ++j) part_do[j][threadIdx.x] = acc[j];
    __syncthreads();
    reduce_tile(part, qz);
    reduce_tile(part_do, dot);
    __syncthreads();
    for (int64_t idx = threadIdx.x; idx < int64_t(tokens) * p.V; idx += kThreads) {
      const int j = int(idx / p.V);
      const int64_t e = idx % p.V, t = row_of(s, i0 + j, p.reverse);
      const float denominator = p.scale * qz[j] + kNormalizeEps;
      store(p.d_o_raw, at4(p.d_o_raw, b, t, h, e), load(p.d_o, at4(p.d_o, b, t, h, e)) / denominator);
    }
    if (threadIdx.x < tokens) {
      const int j = threadIdx.x;
      const float denominator = p.scale * qz[j] + kNormalizeEps;
      p.d_den[scratch(row_of(s, i0 + j, p.reverse))] = -dot[j] / (denominator * denominator);
    }
    for (int64_t d = threadIdx.x; d < p.K; d += kThreads) {
      float zz = z[d];
      for (int j = 0; j < tokens; ++j) {
        const int64_t t = row_of(s, i0 + j, p.reverse);
        const float denominator = p.scale * qz[j] + kNormalizeEps;
        zz += load(p.k, at4(p.k, b, t, h, d));
        store(p.dq, at4(p.dq, b, t, h, d), -dot[j] / (denominator * denominator) * p.scale * zz);
      }
      z[d] = zz;
    }
    __syncthreads();  // part, qz, dot are reused by the next tile; d_den is read below
  }
  for (int64_t d = threadIdx.x; d < p.K; d += kThreads) {
    float acc = p.d_z_final.data ? load(p.d_z_final, at3(p.d_z_final, n, h, d)) : 0.f;
    for (int64_t i = s.len - 1; i >= 0; --i) {
      const int64_t t = row_of(s, i, p.reverse);
      acc += p.d_den[scratch(t)] * p.scale * load(p.q, at4(p.q, b, t, h, d));
      store(p.dk, at4(p.dk, b, t, h, d), acc);
    }
    if (p.d_z_init.data) store(p.d_z_init, at3(p.d_z_init, n, h, d), acc);
  }
}

NormalizeParams params_of(const TensorView& o_raw, const TensorView& q, const TensorView& k, const TensorView& z_init,
                          const TensorView& cu_seqlens, bool reverse, const GlaProblem& p) {
  NormalizeParams c;
  c.o_raw = any_of(o_raw), c.q = any_of(q), c.k = any_of(k), c.z_init = any_of(z_init);
  c.seqs = sequences_of(cu_seqlens, p.seq_len);
  c.heads = p.heads, c.K = p.key_dim, c.V = p.value_dim;
  c.scale = float(p.scale), c.reverse = reverse;
  return c;
}

void require_dtype(const TensorView& t, const char* name) {
  FLASHGLA_REQUIRE(!t.defined() || t.dtype != DType::f64, ErrorKind::unsupported, name,
                   "the CUDA backend takes float32, bfloat16 or float16, got float64 (use the CPU backend)");
}

size_t z_bytes(const GlaProblem& p) { return size_t(p.key_dim) * sizeof(float); }

void set_shared(const void* kernel, size_t bytes) {
  // The static part (tiles) is at most 32 KB; the dynamic z (K floats) may take the rest.
  if (bytes > 16 * 1024)
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)),
               "cudaFuncSetAttribute (normaliser)");
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

void gla_normalize_forward(const GlaNormalizeArgs& a, const GlaProblem& p) {
  require_dtype(a.q, "q"), require_dtype(a.z_init, "z_init");
  DeviceGuard guard(a.q.device.index);
  NormalizeParams c = params_of(a.o_raw, a.q, a.k, a.z_init, a.cu_seqlens, a.reverse, p);
  c.o = any_of(a.o), c.z_final = any_of(a.z_final);
  const int64_t blocks = p.num_seqs * p.heads;
  if (blocks == 0) return;
  set_shared(reinterpret_cast<const void*>(normalize_forward_kernel), z_bytes(p));
  normalize_forward_kernel<<<unsigned(blocks), kThreads, z_bytes(p), static_cast<cudaStream_t>(a.stream)>>>(c);
  check_cuda(cudaGetLastError(), "normalize_forward_kernel launch");
}

size_t gla_normalize_backward_workspace_bytes(const GlaNormalizeBackwardArgs&, const GlaProblem& p) {
  return size_t(p.batch * p.seq_len * p.heads) * sizeof(float);
}

void gla_normalize_backward(const GlaNormalizeBackwardArgs& a, const GlaProblem& p) {
  require_dtype(a.q, "q"), require_dtype(a.z_init, "z_init"), require_dtype(a.d_z_final, "d_z_final");
  DeviceGuard guard(a.q.device.index);
  const cudaStream_t stream = static_cast<cudaStream_t>(a.stream);
  NormalizeParams c = params_of(a.o_raw, a.q, a.k, a.z_init, a.cu_seqlens, a.reverse, p);
  c.d_o = any_of(a.d_o), c.d_z_final = any_of(a.d_z_final), c.d_o_raw = any_of(a.d_o_raw);
  c.dq = any_of(a.dq), c.dk = any_of(a.dk), c.d_z_init = any_of(a.d_z_init);
  const int64_t blocks = p.num_seqs * p.heads;
  if (blocks == 0) return;
  Scratch scratch(a.workspace, a.workspace_bytes, a.allocate_workspace, gla_normalize_backward_workspace_bytes(a, p),
                  stream, "gla_normalize_backward_workspace_bytes", "workspace", alignof(float));
  c.d_den = scratch.floats();
  set_shared(reinterpret_cast<const void*>(normalize_backward_kernel), z_bytes(p));
  normalize_backward_kernel<<<unsigned(blocks), kThreads, z_bytes(p), stream>>>(c);
  check_cuda(cudaGetLastError(), "normalize_backward_kernel launch");
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
