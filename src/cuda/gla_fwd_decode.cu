// GLA decode: one token per sequence, the fp32 state [N,H,K,V] updated in place:
//     S ← diag(exp g) S + k^T v,   o = scale · q S.
// Memory-bound: every state element is read and written once. One CTA per
// (sequence, head, 64 value columns); thread (row group, 4 columns) streams
// every 16th row of the state as 16-byte vectors, 8 rows in flight at a time,
// and the 16 row groups' partial q·S are summed through shared memory.
#include "cuda/common.cuh"
#include "cuda/gla_device.cuh"

namespace flashgla::cuda::gla {
namespace {

constexpr int kColumns = 64;                  // value columns per CTA
constexpr int kVectors = kColumns / 4;        // float4 per state row and CTA
constexpr int kRowGroups = 16;
constexpr int kThreads = kVectors * kRowGroups;
constexpr int kInFlight = 8;                  // rows each thread loads before it computes

template <class E>
__global__ void __launch_bounds__(kThreads) decode_kernel(const DecodeParams p) {
  extern __shared__ __align__(16) float shared[];  // q, k, α [K]; partial sums [16][64]
  const int K = p.key_dim, V = p.value_dim;
  float* qs = shared;
  float* ks = qs + K;
  float* as = ks + K;
  float* partial = as + K;
  const int tid = threadIdx.x, group = tid / kVectors, vec = tid % kVectors;
  const int64_t nh = blockIdx.x;
  const int64_t n = nh / p.heads;
  const int h = int(nh % p.heads);
  const int col = blockIdx.y * kColumns + 4 * vec;

  const int64_t head_q = n * p.q.stride[0] + h * p.q.stride[1];
  const int64_t head_k = n * p.k.stride[0] + h * p.k.stride[1];
  for (int i = tid; i < K; i += kThreads) {
    qs[i] = load_float(p.q.data, head_q + i * p.q.stride[2], p.q.dtype);
    ks[i] = load_float(p.k.data, head_k + i * p.k.stride[2], p.k.dtype);
    float g = 0.f;
    if (p.gate == Gate::vector) g = load_float(p.g.data, n * p.g.stride[0] + h * p.g.stride[1] + i * p.g.stride[2], p.g.dtype);
    if (p.gate == Gate::scalar) g = load_float(p.g.data, n * p.g.stride[0] + h * p.g.stride[1], p.g.dtype);
    as[i] = p.gate == Gate::none ? 1.f : __expf(g);
  }
  float v[4];
#pragma unroll
  for (int j = 0; j < 4; ++j)
    v[j] = col + j < V ? load_float(p.v.data, n * p.v.stride[0] + h * p.v.stride[1] + (col + j) * p.v.stride[2], p.v.dtype)
                       : 0.f;
  __syncthreads();

  float* state = static_cast<float*>(p.state.data) + n * p.state.stride[0] + h * p.state.stride[1];
  const int64_t row_stride = p.state.stride[2], col_stride = p.state.stride[3];
  const bool vector = p.state.rows16 && col + 3 < V;  // the 4 columns form one aligned float4
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  for (int k0 = group; k0 < K; k0 += kRowGroups * kInFlight) {
    float4 x[kInFlight];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      const int k = k0 + u * kRowGroups;
      if (k >= K) continue;
      const float* row = state + k * row_stride;
      if (vector) {
        x[u] = *reinterpret_cast<const float4*>(row + col);
      } else {
        float e[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) e[j] = col + j < V ? row[(col + j) * col_stride] : 0.f;
        x[u] = make_float4(e[0], e[1], e[2], e[3]);
      }
    }
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      const int k = k0 + u * kRowGroups;
      if (k >= K) continue;
      const float a = as[k], kk = ks[k], q = qs[k];
      float4 s = x[u];
      s.x = fmaf(a, s.x, kk * v[0]);
      s.y = fmaf(a, s.y, kk * v[1]);
      s.z = fmaf(a, s.z, kk * v[2]);
      s.w = fmaf(a, s.w, kk * v[3]);
      acc[0] += q * s.x, acc[1] += q * s.y, acc[2] += q * s.z, acc[3] += q * s.w;
      float* row = state + k * row_stride;
      if (vector) {
        *reinterpret_cast<float4*>(row + col) = s;
      } else {
        const float e[4] = {s.x, s.y, s.z, s.w};
#pragma unroll
        for (int j = 0; j < 4; ++j)
          if (col + j < V) row[(col + j) * col_stride] = e[j];
      }
    }
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) partial[group * kColumns + 4 * vec + j] = acc[j];
  __syncthreads();
  if (tid < kColumns) {
    const int c = blockIdx.y * kColumns + tid;
    float sum = 0.f;
#pragma unroll
    for (int g = 0; g < kRowGroups; ++g) sum += partial[g * kColumns + tid];
    if (c < V) static_cast<E*>(p.o.data)[n * p.o.stride[0] + h * p.o.stride[1] + c * p.o.stride[2]] = from_float<E>(p.scale * sum);
  }
}

template <class E>
void launch(const DecodeParams& p, dim3 grid, int smem, cudaStream_t stream) {
  check_cuda(cudaFuncSetAttribute(decode_kernel<E>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
             "cudaFuncSetAttribute (GLA decode kernel)");
  decode_kernel<E><<<grid, kThreads, smem, stream>>>(p);
  check_cuda(cudaGetLastError(), "GLA decode kernel launch");
}

}  // namespace

void launch_decode(const DecodeParams& p, int num_seqs, cudaStream_t stream) {
  const dim3 grid(unsigned(int64_t(num_seqs) * p.heads), unsigned((p.value_dim + kColumns - 1) / kColumns));
  if (grid.x == 0) return;
  const int smem = int((3 * int64_t(p.key_dim) + kRowGroups * kColumns) * sizeof(float));
  switch (p.q.dtype) {
    case Elem::f32: return launch<float>(p, grid, smem, stream);
    case Elem::bf16: return launch<__nv_bfloat16>(p, grid, smem, stream);
    case Elem::f16: return launch<__half>(p, grid, smem, stream);
    default: return;
  }
}

}  // namespace flashgla::cuda::gla
