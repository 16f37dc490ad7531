// Chunked GLA forward, fast path: host side (support, tiles, launch) and the
// bf16 kernels; the kernel itself is in gla_fwd_fast.cuh, its fp16
// instantiations in gla_fwd_fast_f16.cu.
#include "cuda/gla/gla_fwd_fast.cuh"

namespace flashgla::cuda::gla {

extern template void launch_fast_typed<__half>(const ChunkParams&, int, dim3, bool, cudaStream_t);
template void launch_fast_typed<__nv_bfloat16>(const ChunkParams&, int, dim3, bool, cudaStream_t);

int fast_value_tile(int value_dim) { return value_dim > 64 ? 128 : 64; }

int fast_key_parts(int key_dim) { return key_dim > 128 ? (key_dim + 127) / 128 : 1; }

int fast_chunk_smem_bytes(int key_dim, int value_dim) {
  const bool wide_keys = key_dim > 64, wide_values = value_dim > 64;
  if (wide_keys && wide_values) return FastLayout<128, 128>::bytes;
  if (wide_keys) return FastLayout<128, 64>::bytes;
  if (wide_values) return FastLayout<64, 128>::bytes;
  return FastLayout<64, 64>::bytes;
}

bool fast_chunk_supported(const ChunkParams& p) {
  const bool half_inputs = p.q.dtype == Elem::bf16 || p.q.dtype == Elem::f16;
  const bool gate_dtype_ok = p.g.dtype == p.q.dtype || p.g.dtype == Elem::f32;
  const bool gate_ok = p.gate != Gate::vector || (gate_dtype_ok && p.g.rows16);
  return half_inputs && gate_ok && p.key_dim >= 1 && p.key_dim <= 256 && p.value_dim >= 1 &&
         p.q.rows16 && p.k.rows16 && p.v.rows16 && p.o.rows16;
}

void launch_fast_chunk_forward(const ChunkParams& p, int num_seqs, cudaStream_t stream) {
  const int splits = p.states_only ? p.num_splits - 1 : p.num_splits;
  const int tile = fast_value_tile(p.value_dim);
  const int value_tiles = (p.value_dim + tile - 1) / tile;
  const dim3 grid(unsigned(int64_t(num_seqs) * p.heads), unsigned(value_tiles * fast_key_parts(p.key_dim)),
                  unsigned(splits));
  if (grid.x == 0 || grid.z == 0) return;
  const bool add_output = !p.states_only && fast_key_parts(p.key_dim) > 1;
  if (p.q.dtype == Elem::bf16) return launch_fast_typed<__nv_bfloat16>(p, num_seqs, grid, add_output, stream);
  if (p.q.dtype == Elem::f16) return launch_fast_typed<__half>(p, num_seqs, grid, add_output, stream);
}

}  // namespace flashgla::cuda::gla
