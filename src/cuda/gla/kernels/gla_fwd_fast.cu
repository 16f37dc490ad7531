// Chunked GLA forward, fast path: host side (support, tiles, launch) and the
// bf16 kernels; the kernel itself is in gla_fwd_fast.cuh, its fp16
// instantiations in gla_fwd_fast_f16.cu.
#include "cuda/gla/kernels/gla_fwd_fast.cuh"

namespace flashgla::cuda::gla {

extern template void launch_fast_typed<__half>(const ChunkParams&, dim3, cudaStream_t);
template void launch_fast_typed<__nv_bfloat16>(const ChunkParams&, dim3, cudaStream_t);

void launch_fast_chunk_forward(const ChunkParams& p, int num_seqs, cudaStream_t stream) {
  const int splits = p.states_only ? p.num_splits - 1 : p.num_splits;
  const int tile = fast_value_tile(p.value_dim);
  const int value_tiles = (p.value_dim + tile - 1) / tile;
  const dim3 grid(unsigned(int64_t(num_seqs) * p.heads), unsigned(value_tiles), unsigned(splits));
  if (grid.x == 0 || grid.z == 0) return;
  if (p.q.dtype == Elem::bf16) return launch_fast_typed<__nv_bfloat16>(p, grid, stream);
  if (p.q.dtype == Elem::f16) return launch_fast_typed<__half>(p, grid, stream);
}

}  // namespace flashgla::cuda::gla
