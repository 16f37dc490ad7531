// The fast chunked GLA forward's fp16 kernels (gla_fwd_fast.cuh), compiled
// apart from the bf16 ones in gla_fwd_fast.cu to halve the longest compile.
#include "cuda/gla/kernels/gla_fwd_fast.cuh"

namespace flashgla::cuda::gla {

template void launch_fast_typed<__half>(const ChunkParams&, dim3, cudaStream_t);

}  // namespace flashgla::cuda::gla
