// Host-side translation of checked API tensors into the GLA kernels' views and sequences,
// shared by the forward and backward (host/), the segment summaries and the normaliser
// (kernels/gla_segment.cu, gla_options.cu), and the device properties the planner (plan.h) reads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/sequences.h"
#include "cuda/common/host.cuh"
#include "cuda/gla/device/gla_fwd.cuh"
#include "cuda/gla/plan/plan.h"

namespace flashgla::cuda {

inline gla::Elem elem_of(DType dtype) {
  switch (dtype) {
    case DType::f32: return gla::Elem::f32;
    case DType::bf16: return gla::Elem::bf16;
    case DType::f16: return gla::Elem::f16;
    case DType::f64: return gla::Elem::f64;
    default: check::fail(ErrorKind::type, "", "not a floating dtype");
  }
}

// rows16 says the kernels' 16-byte row copies apply: unit last stride, a
// 16-byte aligned base and 16-byte multiples for every other stride in use.
inline gla::View view_of(const TensorView& t) {
  gla::View v;
  if (!t.defined()) return v;
  v.data = t.data;
  v.dtype = elem_of(t.dtype);
  const int last = t.ndim - 1;
  for (int d = 0; d < t.ndim; ++d) v.stride[d] = t.stride[d];
  const int64_t esize = gla::elem_size(v.dtype);
  const bool unit = t.shape[last] <= 1 || t.stride[last] == 1;
  bool rows16 = unit && reinterpret_cast<uintptr_t>(t.data) % 16 == 0;
  for (int d = 0; d < last; ++d)
    if (t.shape[d] > 1) rows16 = rows16 && t.stride[d] * esize % 16 == 0;
  v.rows16 = rows16;
  if (unit) v.stride[last] = 1;  // the kernels' fast paths assume it
  return v;
}

// The kernels' gate and g_gamma (fp32 [H], the API's rule): g_gamma alone is the gate itself, one decay per
// head broadcast over [B, T] (strides 0); with g it is added where the kernels read g (scalar_gate in
// device/elements.cuh).
inline void gamma_gate(const TensorView& g, const TensorView& g_gamma, gla::View& gate, gla::View& gamma) {
  gate = view_of(g), gamma = view_of(g_gamma);
  if (g.defined() || !g_gamma.defined()) return;
  gate = gamma;
  gate.stride[0] = gate.stride[1] = gate.stride[3] = 0, gate.stride[2] = g_gamma.stride[0];
  gate.rows16 = false;
  gamma = {};
}

// The kernels' sequences: cu_seqlens on the device (undefined: a fixed-length batch), every boundary clamped
// to [0, total_len] (cuda/common/sequences.cuh).
inline Sequences sequences_of(const TensorView& cu_seqlens, int64_t total_len) {
  Sequences s;
  s.total_len = total_len;
  if (!cu_seqlens.defined()) return s;
  s.cu_seqlens = cu_seqlens.data;
  s.stride = cu_seqlens.stride[0];
  s.i64 = cu_seqlens.dtype == DType::i64;
  return s;
}

inline void require_compute_dtype(const TensorView& x, const char* name) {
  FLASHGLA_REQUIRE(x.dtype == DType::f32 || x.dtype == DType::bf16 || x.dtype == DType::f16, ErrorKind::unsupported,
                   name, std::string("the CUDA backend takes float32, bfloat16 or float16 inputs, got ") +
                             dtype_name(x.dtype) + " (use the CPU backend for float64)");
}

// The longest sequence for the planner (core/sequences.h: -1 where the boundaries are only in device memory).
// Such boundaries are read back where a sequence split could pay: a long batch (kReadBackTokens) whose plan would
// split a sequence as long as the whole batch (`splits(T)`; T bounds the longest). The read-back is one copy of
// the N + 1 offsets, which waits for `stream` (so the host stops running ahead: a short batch is not worth it).
// Never while the stream is captured into a CUDA graph: the plan then has no split.
inline constexpr int64_t kReadBackTokens = 65536;

template <class SplitsAt>
int64_t planning_longest(const GlaProblem& p, const TensorView& cu_seqlens, const TensorView& cu_seqlens_host,
                         cudaStream_t stream, SplitsAt&& splits) {
  const int64_t known = longest_sequence(p, cu_seqlens, cu_seqlens_host);
  if (known >= 0 || p.num_seqs < 1 || p.seq_len < kReadBackTokens || !splits(p.seq_len)) return known;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  check_cuda(cudaStreamIsCapturing(stream, &capture), "cudaStreamIsCapturing (reading cu_seqlens back)");
  if (capture != cudaStreamCaptureStatusNone) return known;
  const size_t elem = cu_seqlens.dtype == DType::i64 ? 8 : 4;
  std::vector<unsigned char> bytes(size_t(p.num_seqs + 1) * elem);
  check_cuda(cudaMemcpy2DAsync(bytes.data(), elem, cu_seqlens.data, size_t(cu_seqlens.stride[0]) * elem, elem,
                               size_t(p.num_seqs + 1), cudaMemcpyDeviceToHost, stream),
             "cudaMemcpy2DAsync (reading cu_seqlens back)");
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize (reading cu_seqlens back)");
  return longest_of_boundaries(p, TensorView::contiguous(bytes.data(), cu_seqlens.dtype, {p.num_seqs + 1}, Device{}));
}

// The planner's view of device `index` (multiprocessors, shared memory, the loaded code), queried once per
// device and process (gla_device_props.cu).
const gla::DeviceProps& device_props(int index);

}  // namespace flashgla::cuda
