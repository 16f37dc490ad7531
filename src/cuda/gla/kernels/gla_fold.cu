// CUDA fold of context-parallel state summaries (flashgla/gla_fold.h): one
// thread per state element (m, k, v), walking the P ranks in order. The data
// is P small states (a few MiB at most), read once: a plain elementwise kernel.
#include <cuda_runtime.h>

#include "core/gla_fold_backend.h"
#include "cuda/common/host.cuh"

namespace flashgla::cuda {
namespace {

struct FoldParams {
  const float* states;
  const float* log_decay;
  float* out;
  const float* initial;  // null when absent
  bool accumulate;
  int64_t M, K, V;
  int64_t s_stride[4], d_stride[3], o_stride[3], i_stride[3];
  int64_t begin, end;
  bool reverse;
};

__global__ void fold_kernel(FoldParams p) {
  const int64_t index = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (index >= p.M * p.K * p.V) return;
  const int64_t v = index % p.V, k = (index / p.V) % p.K, m = index / (p.V * p.K);
  float h = p.initial ? p.initial[m * p.i_stride[0] + k * p.i_stride[1] + v * p.i_stride[2]] : 0.f;
  for (int64_t step = 0; step < p.end - p.begin; ++step) {
    const int64_t j = p.reverse ? p.end - 1 - step : p.begin + step;
    const float s = p.states[j * p.s_stride[0] + m * p.s_stride[1] + k * p.s_stride[2] + v * p.s_stride[3]];
    // expf(−inf) = 0: a reset clears what came before (h is finite), with no NaN.
    const float a = p.log_decay[j * p.d_stride[0] + m * p.d_stride[1] + k * p.d_stride[2]];
    h = fmaf(expf(a), h, s);
  }
  float* out = p.out + m * p.o_stride[0] + k * p.o_stride[1] + v * p.o_stride[2];
  *out = p.accumulate ? *out + h : h;
}

}  // namespace

void gla_fold_states(const GlaFoldStatesArgs& a) {
  DeviceGuard guard(a.states.device.index);
  FoldParams p;
  p.states = static_cast<const float*>(a.states.data);
  p.log_decay = static_cast<const float*>(a.log_decay.data);
  p.out = static_cast<float*>(a.out.data);
  p.M = a.states.shape[1];
  p.K = a.states.shape[2];
  p.V = a.states.shape[3];
  for (int d = 0; d < 4; ++d) p.s_stride[d] = a.states.stride[d];
  for (int d = 0; d < 3; ++d) p.d_stride[d] = a.log_decay.stride[d], p.o_stride[d] = a.out.stride[d];
  p.initial = a.initial.defined() ? static_cast<const float*>(a.initial.data) : nullptr;
  for (int d = 0; d < 3; ++d) p.i_stride[d] = a.initial.defined() ? a.initial.stride[d] : 0;
  p.accumulate = a.accumulate;
  p.begin = a.begin;
  p.end = a.end;
  p.reverse = a.reverse;
  const int64_t n = p.M * p.K * p.V;
  constexpr int kThreads = 256;
  fold_kernel<<<ceil_div(n, kThreads), kThreads, 0, static_cast<cudaStream_t>(a.stream)>>>(p);
  check_cuda(cudaGetLastError(), "gla_fold_states kernel launch");
}

}  // namespace flashgla::cuda
