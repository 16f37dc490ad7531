// The generic CUDA softmax attention (attention_generic.cu): float32, bfloat16
// and float16, any head dims D and Dv from 1 to kGenericMaxDim (D != Dv
// allowed), any strides. Simple per-row kernels with fp32 arithmetic; they run
// every case the fast kernels (attention_kernels.cuh) do not take.
#pragma once

#include <cuda_runtime.h>

#include "cuda/attention/attention_params.cuh"
#include "flashgla/tensor.h"

namespace flashgla::cuda::attn {

inline constexpr int kGenericMaxDim = 512;

// The kernels read from `p` the tensors (elements of `dtype`; vec16/vec4 are
// not used), lse, cu_seqlens, sizes, causal and scale_log2; the forward writes
// o and lse.
void run_attention_generic_forward(const AttentionParams& p, DType dtype, int head_dim, int value_dim,
                                   cudaStream_t stream);

// Writes dq, dk and dv from q, k, v, o, d_o and the forward's lse. p.dsum must
// point at [B, Hq, Tq] floats of scratch (no other scratch is used).
void run_attention_generic_backward(const AttentionParams& p, DType dtype, int head_dim, int value_dim,
                                    cudaStream_t stream);

}  // namespace flashgla::cuda::attn
