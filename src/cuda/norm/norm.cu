// CUDA gated RMSNorm and log-sigmoid gate, forward and backward.
//
// The norm gives each row to one warp (rows are all dimensions but the last):
// the warp sums x² (and in the backward Σ ∂L/∂x̂ · x̂) with shuffles and
// writes the row, 16-byte vectors at a time where the layout allows. dweight
// is summed without atomics: each warp accumulates its rows' terms for the
// columns its lanes own in a private fp32 row (shared memory, or the workspace
// for very long rows), each block adds its warps' rows into one fp32 partial
// row in the workspace, and a second kernel adds the partial rows in order.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <initializer_list>
#include <string>

#include "core/backend.h"
#include "cuda/common/host.cuh"
#include "cuda/common/dtype.cuh"

namespace flashgla::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kNormWarps = 4;                     // warps (rows in flight) per block
constexpr size_t kMaxSharedAccumulators = 100 << 10;  // beyond this, dweight accumulators live in the workspace

// ---- element access (to_float / from_float: cuda/common/dtype.cuh) ---------------------------

// Tensors whose dtype is not a template argument (weight, dweight, dg, g): a
// switch that is uniform across the grid.
__device__ __forceinline__ float load_any(const void* data, DType dtype, int64_t offset) {
  switch (dtype) {
    case DType::bf16: return __bfloat162float(static_cast<const __nv_bfloat16*>(data)[offset]);
    case DType::f16: return __half2float(static_cast<const __half*>(data)[offset]);
    case DType::f64: return float(static_cast<const double*>(data)[offset]);
    default: return static_cast<const float*>(data)[offset];
  }
}

__device__ __forceinline__ void store_any(void* data, DType dtype, int64_t offset, float value) {
  switch (dtype) {
    case DType::bf16: static_cast<__nv_bfloat16*>(data)[offset] = __float2bfloat16_rn(value); break;
    case DType::f16: static_cast<__half*>(data)[offset] = __float2half_rn(value); break;
    case DType::f64: static_cast<double*>(data)[offset] = value; break;
    default: static_cast<float*>(data)[offset] = value; break;
  }
}

// Where the rows of a [..., D] tensor start: the leading dimensions' sizes and
// strides (innermost last), merged where they nest (a contiguous tensor has
// one), and the step between a row's elements.
struct RowLayout {
  int leading = 0;
  int64_t size[kMaxDims - 1] = {1, 1, 1};
  int64_t stride[kMaxDims - 1] = {0, 0, 0};
  int64_t step = 1;

  // 64-bit division is slow on the GPU: none for one leading dimension (row < size[0]).
  __device__ __forceinline__ int64_t offset(int64_t row) const {
    int64_t offset = 0;
    for (int d = leading - 1; d > 0; --d) {
      offset += (row % size[d]) * stride[d];
      row /= size[d];
    }
    return offset + row * stride[0];
  }
};

RowLayout row_layout(const TensorView& t) {
  RowLayout l;
  for (int d = 0; d + 1 < t.ndim; ++d) {
    if (t.shape[d] == 1) continue;  // no effect on the offset
    if (l.leading > 0 && l.stride[l.leading - 1] == t.shape[d] * t.stride[d]) {
      l.size[l.leading - 1] *= t.shape[d];  // nests in the previous dimension: merge
      l.stride[l.leading - 1] = t.stride[d];
    } else {
      l.size[l.leading] = t.shape[d], l.stride[l.leading] = t.stride[d];
      ++l.leading;
    }
  }
  if (l.leading == 0) l.leading = 1, l.size[0] = 1, l.stride[0] = 0;  // one row
  l.step = t.stride[t.ndim - 1];
  return l;
}

// VEC consecutive elements of one row, as floats.
template <class T, int VEC>
struct alignas(sizeof(T) * VEC) Packet {
  T v[VEC];
};

template <class T, int VEC>
__device__ __forceinline__ void load_packet(const T* row, int64_t j, int64_t step, float (&out)[VEC]) {
  if constexpr (VEC == 1) {
    out[0] = to_float(row[j * step]);
  } else {
    const Packet<T, VEC> p = *reinterpret_cast<const Packet<T, VEC>*>(row + j);
#pragma unroll
    for (int i = 0; i < VEC; ++i) out[i] = to_float(p.v[i]);
  }
}

template <class T, int VEC>
__device__ __forceinline__ void store_packet(T* row, int64_t j, int64_t step, const float (&in)[VEC]) {
  if constexpr (VEC == 1) {
    row[j * step] = from_float<T>(in[0]);
  } else {
    Packet<T, VEC> p;
#pragma unroll
    for (int i = 0; i < VEC; ++i) p.v[i] = from_float<T>(in[i]);
    *reinterpret_cast<Packet<T, VEC>*>(row + j) = p;
  }
}

// acc[j .. j+VEC) += add, as 16-byte shared/global accesses where VEC allows (fewer bank conflicts).
template <int VEC>
__device__ __forceinline__ void accumulate(float* acc, int64_t j, const float (&add)[VEC]) {
  if constexpr (VEC % 4 == 0) {
#pragma unroll
    for (int q = 0; q < VEC / 4; ++q) {
      float4* slot = reinterpret_cast<float4*>(acc + j) + q;
      float4 v = *slot;
      v.x += add[4 * q], v.y += add[4 * q + 1], v.z += add[4 * q + 2], v.w += add[4 * q + 3];
      *slot = v;
    }
  } else {
#pragma unroll
    for (int i = 0; i < VEC; ++i) acc[j + i] += add[i];
  }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ float sigmoid(float r) { return 1.f / (1.f + __expf(-r)); }

__device__ __forceinline__ float activate(GateActivation act, float r) {
  return act == GateActivation::swish ? r * sigmoid(r) : sigmoid(r);
}

__device__ __forceinline__ float activate_grad(GateActivation act, float r) {
  const float s = sigmoid(r);
  return act == GateActivation::swish ? s * (1.f + r * (1.f - s)) : s * (1.f - s);
}

// ---- gated RMSNorm -----------------------------------------------------------------

struct NormParams {
  const void* x = nullptr;
  const void* gate = nullptr;    // null: no gate
  const void* weight = nullptr;  // null: weight 1
  const void* dy = nullptr;
  void* y = nullptr;   // forward output
  void* dx = nullptr;  // backward outputs
  void* dgate = nullptr;
  RowLayout x_rows, gate_rows, y_rows, dy_rows, dx_rows, dgate_rows;
  DType weight_dtype = DType::f32;
  int64_t weight_step = 1;
  int64_t rows = 0, dim = 0;
  float eps = 0;
  GateActivation activation = GateActivation::swish;
  float* accumulators = nullptr;  // backward: per-warp dweight rows in the workspace (null: in shared memory)
  float* partials = nullptr;      // backward: one dweight row per block (null: no dweight)
};

__device__ __forceinline__ float weight_at(const NormParams& p, int64_t j) {
  return p.weight ? load_any(p.weight, p.weight_dtype, j * p.weight_step) : 1.f;
}

template <class T, int VEC>
__device__ float row_inverse_rms(const T* x, const NormParams& p, int lane) {
  float sum_squares = 0;
#pragma unroll 4
  for (int64_t j = int64_t(lane) * VEC; j < p.dim; j += kWarp * VEC) {
    float v[VEC];
    load_packet<T, VEC>(x, j, p.x_rows.step, v);
#pragma unroll
    for (int i = 0; i < VEC; ++i) sum_squares += v[i] * v[i];
  }
  return rsqrtf(warp_sum(sum_squares) / float(p.dim) + p.eps);
}

template <class T, int VEC>
__global__ void __launch_bounds__(kNormWarps * kWarp) rms_norm_forward_kernel(const NormParams p) {
  const int lane = threadIdx.x % kWarp;
  const int64_t warps_in_grid = int64_t(gridDim.x) * kNormWarps;
  for (int64_t row = int64_t(blockIdx.x) * kNormWarps + threadIdx.x / kWarp; row < p.rows; row += warps_in_grid) {
    const T* x = static_cast<const T*>(p.x) + p.x_rows.offset(row);
    const T* r = p.gate ? static_cast<const T*>(p.gate) + p.gate_rows.offset(row) : nullptr;
    T* y = static_cast<T*>(p.y) + p.y_rows.offset(row);
    const float rstd = row_inverse_rms<T, VEC>(x, p, lane);
#pragma unroll 4
    for (int64_t j = int64_t(lane) * VEC; j < p.dim; j += kWarp * VEC) {
      float v[VEC], gate[VEC];
      load_packet<T, VEC>(x, j, p.x_rows.step, v);
      if (r) load_packet<T, VEC>(r, j, p.gate_rows.step, gate);
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        v[i] *= rstd * weight_at(p, j + i);
        if (r) v[i] *= activate(p.activation, gate[i]);
      }
      store_packet<T, VEC>(y, j, p.y_rows.step, v);
    }
  }
}

// y = x̂ · w · act(r), x̂ = x · rstd. With ∂L/∂x̂ = dy · act(r) · w:
//   dx = rstd · (∂L/∂x̂ − x̂ · mean(∂L/∂x̂ · x̂)),  dr = dy · x̂ · w · act'(r),  dw = Σ_rows dy · act(r) · x̂.
template <class T, int VEC>
__global__ void __launch_bounds__(kNormWarps * kWarp) rms_norm_backward_kernel(const NormParams p) {
  extern __shared__ float4 shared_storage[];  // float4: 16-byte aligned for accumulate()
  float* shared_accumulators = reinterpret_cast<float*>(shared_storage);
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const bool want_dweight = p.partials != nullptr;
  // Each lane reads and writes only the columns it owns, so no synchronisation until the rows are done.
  float* dweight_acc = p.accumulators ? p.accumulators + (int64_t(blockIdx.x) * kNormWarps + warp) * p.dim
                                      : shared_accumulators + int64_t(warp) * p.dim;
  if (want_dweight)
    for (int64_t j = int64_t(lane) * VEC; j < p.dim; j += kWarp * VEC)
#pragma unroll
      for (int i = 0; i < VEC; ++i) dweight_acc[j + i] = 0.f;

  const int64_t warps_in_grid = int64_t(gridDim.x) * kNormWarps;
  for (int64_t row = int64_t(blockIdx.x) * kNormWarps + warp; row < p.rows; row += warps_in_grid) {
    const T* x = static_cast<const T*>(p.x) + p.x_rows.offset(row);
    const T* r = p.gate ? static_cast<const T*>(p.gate) + p.gate_rows.offset(row) : nullptr;
    const T* dy = static_cast<const T*>(p.dy) + p.dy_rows.offset(row);
    // One pass for both row sums: Σ x² (for rstd) and Σ ∂L/∂x̂ · x / rstd (for the mean below).
    float sum_squares = 0, dot = 0;
#pragma unroll 4
    for (int64_t j = int64_t(lane) * VEC; j < p.dim; j += kWarp * VEC) {
      float xv[VEC], gv[VEC], dyv[VEC];
      load_packet<T, VEC>(x, j, p.x_rows.step, xv);
      load_packet<T, VEC>(dy, j, p.dy_rows.step, dyv);
      if (r) load_packet<T, VEC>(r, j, p.gate_rows.step, gv);
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        sum_squares += xv[i] * xv[i];
        dot += dyv[i] * (r ? activate(p.activation, gv[i]) : 1.f) * weight_at(p, j + i) * xv[i];
      }
    }
    const float rstd = rsqrtf(warp_sum(sum_squares) / float(p.dim) + p.eps);
    const float mean_dot = warp_sum(dot) * rstd / float(p.dim);  // mean of ∂L/∂x̂ · x̂

    T* dx = static_cast<T*>(p.dx) + p.dx_rows.offset(row);
    T* dr = r ? static_cast<T*>(p.dgate) + p.dgate_rows.offset(row) : nullptr;
#pragma unroll 4
    for (int64_t j = int64_t(lane) * VEC; j < p.dim; j += kWarp * VEC) {
      float xv[VEC], gv[VEC], dyv[VEC], dxv[VEC], drv[VEC], dwv[VEC];
      load_packet<T, VEC>(x, j, p.x_rows.step, xv);
      load_packet<T, VEC>(dy, j, p.dy_rows.step, dyv);
      if (r) load_packet<T, VEC>(r, j, p.gate_rows.step, gv);
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        const float w = weight_at(p, j + i), xhat = xv[i] * rstd;
        const float dnormed = r ? dyv[i] * activate(p.activation, gv[i]) : dyv[i];  // ∂L/∂(x̂ · w)
        if (r) drv[i] = dyv[i] * xhat * w * activate_grad(p.activation, gv[i]);
        dwv[i] = dnormed * xhat;
        dxv[i] = rstd * (dnormed * w - xhat * mean_dot);
      }
      store_packet<T, VEC>(dx, j, p.dx_rows.step, dxv);
      if (r) store_packet<T, VEC>(dr, j, p.dgate_rows.step, drv);
      if (want_dweight) accumulate<VEC>(dweight_acc, j, dwv);
    }
  }
  if (!want_dweight) return;
  __syncthreads();  // the block's accumulators (shared or global) are complete and visible
  const float* block_acc = p.accumulators ? p.accumulators + int64_t(blockIdx.x) * kNormWarps * p.dim : shared_accumulators;
  for (int64_t j = threadIdx.x; j < p.dim; j += blockDim.x) {
    float sum = 0;
    for (int w = 0; w < kNormWarps; ++w) sum += block_acc[w * p.dim + j];
    p.partials[int64_t(blockIdx.x) * p.dim + j] = sum;
  }
}

// dweight[j] = Σ_b partials[b][j]. A block sums kReduceColumns columns: thread (x, y) adds rows
// y, y + kReduceRowGroups, ... of column x, then thread (x, 0) adds the groups in order, so the
// result does not depend on scheduling.
constexpr int kReduceColumns = 32, kReduceRowGroups = 32;

__global__ void __launch_bounds__(kReduceColumns * kReduceRowGroups)
    reduce_partials_kernel(const float* partials, int64_t blocks, int64_t dim, void* dweight, DType dweight_dtype,
                           int64_t dweight_step) {
  __shared__ float group_sums[kReduceRowGroups][kReduceColumns + 1];
  const int64_t j = int64_t(blockIdx.x) * kReduceColumns + threadIdx.x;
  float sum = 0;
  if (j < dim) {
#pragma unroll 4
    for (int64_t b = threadIdx.y; b < blocks; b += kReduceRowGroups) sum += partials[b * dim + j];
  }
  group_sums[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y != 0 || j >= dim) return;
  float total = 0;
  for (int g = 0; g < kReduceRowGroups; ++g) total += group_sums[g][threadIdx.x];
  store_any(dweight, dweight_dtype, j * dweight_step, total);
}

// ---- launch planning -----------------------------------------------------------------

int multiprocessor_count(int device) {
  int count = 0;
  check_cuda(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  return count;
}

// The widest vector every row of every tensor allows: unit step, 16-byte
// aligned starts, and a row length that is a multiple of it.
int vector_width(DType dtype, int64_t dim, std::initializer_list<const TensorView*> tensors) {
  const int widest = int(16 / dtype_size(dtype));
  if (dim % widest != 0) return 1;
  for (const TensorView* t : tensors) {
    if (!t->defined()) continue;
    if (t->stride[t->ndim - 1] != 1 || reinterpret_cast<uintptr_t>(t->data) % 16 != 0) return 1;
    for (int d = 0; d + 1 < t->ndim; ++d)
      if (t->shape[d] > 1 && t->stride[d] % widest != 0) return 1;
  }
  return widest;
}

struct BackwardPlan {
  int blocks = 0;
  size_t shared_bytes = 0;       // per block, for the warps' dweight accumulators
  size_t accumulator_bytes = 0;  // in the workspace, when they do not fit in shared memory
  size_t partial_bytes = 0;
  size_t workspace_bytes() const { return accumulator_bytes + partial_bytes; }
};

BackwardPlan plan_backward(const RmsNormBackwardArgs& a, const RowsProblem& p) {
  BackwardPlan plan;
  const int64_t warp_rows_bytes = int64_t(kNormWarps) * p.dim * int64_t(sizeof(float));
  const bool dweight = a.dweight.defined();
  const bool in_shared = warp_rows_bytes <= int64_t(kMaxSharedAccumulators);
  // Enough warps to keep each SM's memory pipes busy (32 warps), fewer when the shared accumulators limit residency.
  int blocks_per_sm = 8;
  if (dweight && in_shared) blocks_per_sm = int(std::clamp<int64_t>((200 << 10) / warp_rows_bytes, 1, 8));
  const int64_t needed = std::max<int64_t>(1, (p.rows + kNormWarps - 1) / kNormWarps);
  plan.blocks = int(std::min<int64_t>(needed, int64_t(multiprocessor_count(a.x.device.index)) * blocks_per_sm));
  if (dweight) {
    if (in_shared)
      plan.shared_bytes = size_t(warp_rows_bytes);
    else
      plan.accumulator_bytes = size_t(plan.blocks) * size_t(warp_rows_bytes);
    plan.partial_bytes = size_t(plan.blocks) * size_t(p.dim) * sizeof(float);
  }
  return plan;
}

template <class T, int VEC>
void launch_backward(const NormParams& params, const BackwardPlan& plan, cudaStream_t stream) {
  auto kernel = rms_norm_backward_kernel<T, VEC>;
  if (plan.shared_bytes > (48 << 10))
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(plan.shared_bytes)),
               "cudaFuncSetAttribute (RMSNorm backward)");
  kernel<<<plan.blocks, kNormWarps * kWarp, plan.shared_bytes, stream>>>(params);
}

template <class T>
void dispatch_backward(int vec, const NormParams& params, const BackwardPlan& plan, cudaStream_t stream) {
  constexpr int kWide = int(16 / sizeof(T));
  if (vec == kWide) return launch_backward<T, kWide>(params, plan, stream);
  launch_backward<T, 1>(params, plan, stream);
}

template <class T>
void dispatch_forward(int vec, const NormParams& params, int blocks, cudaStream_t stream) {
  constexpr int kWide = int(16 / sizeof(T));
  if (vec == kWide) return void(rms_norm_forward_kernel<T, kWide><<<blocks, kNormWarps * kWarp, 0, stream>>>(params));
  rms_norm_forward_kernel<T, 1><<<blocks, kNormWarps * kWarp, 0, stream>>>(params);
}

NormParams norm_params(const TensorView& x, const TensorView& weight, const TensorView& gate, GateActivation act,
                       double eps, const RowsProblem& p) {
  NormParams params;
  params.x = x.data;
  params.x_rows = row_layout(x);
  if (gate.defined()) params.gate = gate.data, params.gate_rows = row_layout(gate);
  if (weight.defined())
    params.weight = weight.data, params.weight_dtype = weight.dtype, params.weight_step = weight.stride[0];
  params.rows = p.rows, params.dim = p.dim;
  params.eps = float(eps);
  params.activation = act;
  return params;
}

// ---- log-sigmoid gate ------------------------------------------------------------------

// Element offsets of a ≤ 4-D tensor from the logical (row-major) index.
struct ElementLayout {
  int ndim = 0;
  int64_t size[kMaxDims] = {1, 1, 1, 1};
  int64_t stride[kMaxDims] = {0, 0, 0, 0};
  bool contiguous = false;

  __device__ __forceinline__ int64_t offset(int64_t i) const {
    if (contiguous) return i;
    int64_t offset = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      offset += (i % size[d]) * stride[d];
      i /= size[d];
    }
    return offset;
  }
};

ElementLayout element_layout(const TensorView& t) {
  ElementLayout l;
  l.ndim = t.ndim;
  for (int d = 0; d < t.ndim; ++d) l.size[d] = t.shape[d], l.stride[d] = t.stride[d];
  l.contiguous = t.is_contiguous();
  return l;
}

struct GateParams {
  const void* x = nullptr;
  const void* dg = nullptr;  // backward
  void* out = nullptr;       // g (forward) or dx (backward)
  ElementLayout x_layout, dg_layout, out_layout;
  DType dg_dtype = DType::f32, out_dtype = DType::f32;
  int64_t count = 0;
  float inv_normalizer = 1;
  bool clamp = false;
  float clamp_min = 0;
};

__device__ __forceinline__ float logsigmoid(float x) { return fminf(x, 0.f) - log1pf(__expf(-fabsf(x))); }

template <class T>
__global__ void logsigmoid_gate_forward_kernel(const GateParams p) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < p.count; i += int64_t(gridDim.x) * blockDim.x) {
    float g = logsigmoid(to_float(static_cast<const T*>(p.x)[p.x_layout.offset(i)])) * p.inv_normalizer;
    if (p.clamp) g = fmaxf(g, p.clamp_min);
    store_any(p.out, p.out_dtype, p.out_layout.offset(i), g);
  }
}

template <class T>
__global__ void logsigmoid_gate_backward_kernel(const GateParams p) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < p.count; i += int64_t(gridDim.x) * blockDim.x) {
    const float x = to_float(static_cast<const T*>(p.x)[p.x_layout.offset(i)]);
    // d logsigmoid(x)/dx = sigmoid(−x); the clamp passes the gradient where g ≥ clamp_min (as torch.clamp).
    const bool clamped = p.clamp && logsigmoid(x) * p.inv_normalizer < p.clamp_min;
    const float dx = clamped ? 0.f : load_any(p.dg, p.dg_dtype, p.dg_layout.offset(i)) * sigmoid(-x) * p.inv_normalizer;
    static_cast<T*>(p.out)[p.out_layout.offset(i)] = from_float<T>(dx);
  }
}

GateParams gate_params(const TensorView& x, double normalizer, const std::optional<double>& clamp_min,
                       const TensorView& out) {
  GateParams p;
  p.x = x.data, p.x_layout = element_layout(x);
  p.out = out.data, p.out_layout = element_layout(out), p.out_dtype = out.dtype;
  p.count = x.numel();
  p.inv_normalizer = float(1.0 / normalizer);
  p.clamp = clamp_min.has_value();
  p.clamp_min = float(clamp_min.value_or(0.0));
  return p;
}

int elementwise_blocks(int64_t count, int device) {
  constexpr int kThreads = 256;
  return int(std::min<int64_t>((count + kThreads - 1) / kThreads, int64_t(multiprocessor_count(device)) * 16));
}

template <class T>
void launch_gate(bool backward, const GateParams& params, int blocks, cudaStream_t stream) {
  if (backward)
    logsigmoid_gate_backward_kernel<T><<<blocks, 256, 0, stream>>>(params);
  else
    logsigmoid_gate_forward_kernel<T><<<blocks, 256, 0, stream>>>(params);
}

void launch_gate(DType dtype, bool backward, const GateParams& params, int device, cudaStream_t stream) {
  const int blocks = elementwise_blocks(params.count, device);
  switch (dtype) {
    case DType::f32: launch_gate<float>(backward, params, blocks, stream); break;
    case DType::bf16: launch_gate<__nv_bfloat16>(backward, params, blocks, stream); break;
    case DType::f16: launch_gate<__half>(backward, params, blocks, stream); break;
    default: check::fail(ErrorKind::unsupported, "x", std::string("CUDA: unsupported dtype ") + dtype_name(dtype));
  }
  check_cuda(cudaGetLastError(), "log-sigmoid gate launch");
}

}  // namespace

void rms_norm_forward(const RmsNormForwardArgs& a, const RowsProblem& p) {
  DeviceGuard guard(a.x.device.index);
  const cudaStream_t stream = static_cast<cudaStream_t>(a.stream);
  NormParams params = norm_params(a.x, a.weight, a.gate, a.activation, a.eps, p);
  params.y = a.y.data, params.y_rows = row_layout(a.y);
  const int vec = vector_width(a.x.dtype, p.dim, {&a.x, &a.gate, &a.y});
  const int blocks =
      int(std::min<int64_t>((p.rows + kNormWarps - 1) / kNormWarps, int64_t(multiprocessor_count(a.x.device.index)) * 16));
  switch (a.x.dtype) {
    case DType::f32: dispatch_forward<float>(vec, params, blocks, stream); break;
    case DType::bf16: dispatch_forward<__nv_bfloat16>(vec, params, blocks, stream); break;
    case DType::f16: dispatch_forward<__half>(vec, params, blocks, stream); break;
    default: check::fail(ErrorKind::unsupported, "x", std::string("CUDA: unsupported dtype ") + dtype_name(a.x.dtype));
  }
  check_cuda(cudaGetLastError(), "RMSNorm forward launch");
}

size_t rms_norm_backward_workspace_bytes(const RmsNormBackwardArgs& a, const RowsProblem& p) {
  DeviceGuard guard(a.x.device.index);
  return plan_backward(a, p).workspace_bytes();
}

void rms_norm_backward(const RmsNormBackwardArgs& a, const RowsProblem& p) {
  DeviceGuard guard(a.x.device.index);
  const cudaStream_t stream = static_cast<cudaStream_t>(a.stream);
  const BackwardPlan plan = plan_backward(a, p);
  Scratch workspace(a.workspace, a.workspace_bytes, a.allocate_workspace, plan.workspace_bytes(), stream,
                    "rms_norm_backward_workspace_bytes", "workspace_bytes");

  NormParams params = norm_params(a.x, a.weight, a.gate, a.activation, a.eps, p);
  params.dy = a.dy.data, params.dy_rows = row_layout(a.dy);
  params.dx = a.dx.data, params.dx_rows = row_layout(a.dx);
  if (a.gate.defined()) params.dgate = a.dgate.data, params.dgate_rows = row_layout(a.dgate);
  if (a.dweight.defined()) {
    params.partials = reinterpret_cast<float*>(workspace.bytes());
    if (plan.accumulator_bytes) params.accumulators = reinterpret_cast<float*>(workspace.bytes() + plan.partial_bytes);
  }
  if (p.rows > 0) {
    const int vec = vector_width(a.x.dtype, p.dim, {&a.x, &a.gate, &a.dy, &a.dx, &a.dgate});
    switch (a.x.dtype) {
      case DType::f32: dispatch_backward<float>(vec, params, plan, stream); break;
      case DType::bf16: dispatch_backward<__nv_bfloat16>(vec, params, plan, stream); break;
      case DType::f16: dispatch_backward<__half>(vec, params, plan, stream); break;
      default: check::fail(ErrorKind::unsupported, "x", std::string("CUDA: unsupported dtype ") + dtype_name(a.x.dtype));
    }
    check_cuda(cudaGetLastError(), "RMSNorm backward launch");
  }
  if (a.dweight.defined()) {
    // With no rows there are no partial rows: the sum is 0.
    const int64_t partial_rows = p.rows > 0 ? plan.blocks : 0;
    const dim3 threads(kReduceColumns, kReduceRowGroups);
    reduce_partials_kernel<<<ceil_div(p.dim, kReduceColumns), threads, 0, stream>>>(
        params.partials, partial_rows, p.dim, a.dweight.data, a.dweight.dtype, a.dweight.stride[0]);
    check_cuda(cudaGetLastError(), "RMSNorm dweight reduction launch");
  }
}

void logsigmoid_gate_forward(const LogSigmoidGateForwardArgs& a) {
  DeviceGuard guard(a.x.device.index);
  const GateParams params = gate_params(a.x, a.normalizer, a.clamp_min, a.g);
  launch_gate(a.x.dtype, /*backward=*/false, params, a.x.device.index, static_cast<cudaStream_t>(a.stream));
}

void logsigmoid_gate_backward(const LogSigmoidGateBackwardArgs& a) {
  DeviceGuard guard(a.x.device.index);
  GateParams params = gate_params(a.x, a.normalizer, a.clamp_min, a.dx);
  params.dg = a.dg.data, params.dg_layout = element_layout(a.dg), params.dg_dtype = a.dg.dtype;
  launch_gate(a.x.dtype, /*backward=*/true, params, a.x.device.index, static_cast<cudaStream_t>(a.stream));
}

}  // namespace flashgla::cuda
