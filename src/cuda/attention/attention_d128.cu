// The portable attention kernels for head dim 128 (bf16 and fp16).
#include "cuda/attention/attention_kernels.cuh"

namespace flashgla::cuda::attn {
template void run_attention_forward<__nv_bfloat16, 128>(AttentionParams, cudaStream_t);
template void run_attention_forward<__half, 128>(AttentionParams, cudaStream_t);
template void run_attention_backward<__nv_bfloat16, 128>(AttentionParams, cudaStream_t);
template void run_attention_backward<__half, 128>(AttentionParams, cudaStream_t);
}  // namespace flashgla::cuda::attn
