// Chunked GLA forward, Hopper path: host side (support, workspace, launches) and
// the bf16/fp16 instantiations of the kernels in gla_fwd_hopper_prep2.cuh and gla_fwd_hopper_ws.cuh.

#include "cuda/gla/kernels/gla_fwd_hopper.cuh"
#include "cuda/gla/kernels/gla_fwd_hopper_prep2.cuh"
#include "cuda/gla/kernels/gla_fwd_hopper_ws.cuh"

namespace flashgla::cuda::gla {

using hopper::Slot;
using hopper::WsLayout;

namespace {

template <class E, bool GAMMA>
void launch_prep_typed(const ChunkParams& p, dim3 grid, cudaStream_t stream) {
  constexpr int bytes = hopper::prep2_smem_bytes();
  auto kernel = hopper::hopper_prep2_kernel<E, GAMMA>;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
             "cudaFuncSetAttribute (GLA Hopper chunk pass)");
  kernel<<<grid, hopper::kPrepThreads, bytes, stream>>>(p);
  check_cuda(cudaGetLastError(), "GLA Hopper chunk pass launch");
}

// The warp-specialized state kernel (gla_fwd_hopper_ws.cuh), a programmatic dependent of the kernel before
// it in the stream (the chunk pass, or the states pass) when `pdl` (the plan's; FLASHGLA_GLA_HOPPER_PDL=0
// turns it off).
template <class E, int KP, bool STATES>
void launch_ws_kernel(const ChunkParams& p, dim3 grid, bool pdl, cudaStream_t stream) {
  using L = WsLayout<KP>;
  auto kernel = hopper::hopper_ws_kernel<E, KP, STATES>;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, L::alloc),
             "cudaFuncSetAttribute (GLA Hopper state kernel)");
  launch_after_previous(kernel, grid, dim3(L::kThreads), L::alloc, stream, pdl, p, "GLA Hopper state kernel launch");
}

// Key pad 128 runs unsplit (plan.cpp), so only key pad 256 has a states pass.
template <class E>
void launch_main_dims(const ChunkParams& p, dim3 grid, bool pdl, cudaStream_t stream) {
  if (p.prep_key_pad == 128) return launch_ws_kernel<E, 128, false>(p, grid, pdl, stream);
  if (p.states_only) return launch_ws_kernel<E, 256, true>(p, grid, pdl, stream);
  return launch_ws_kernel<E, 256, false>(p, grid, pdl, stream);
}

}  // namespace

void launch_hopper_prep(const ChunkParams& p, int num_seqs, int64_t max_chunks, cudaStream_t stream) {
  const dim3 grid(unsigned(int64_t(num_seqs) * p.heads), unsigned(max_chunks));
  if (grid.x == 0 || grid.y == 0) return;
  const bool gamma = p.g_gamma.data != nullptr;
  if (p.q.dtype == Elem::bf16)
    return gamma ? launch_prep_typed<__nv_bfloat16, true>(p, grid, stream)
                 : launch_prep_typed<__nv_bfloat16, false>(p, grid, stream);
  return gamma ? launch_prep_typed<__half, true>(p, grid, stream) : launch_prep_typed<__half, false>(p, grid, stream);
}

void launch_hopper_chunk_forward(const ChunkParams& p, int num_seqs, bool pdl, cudaStream_t stream) {
  const int splits = p.states_only ? p.num_splits - 1 : p.num_splits;
  const dim3 grid(unsigned(int64_t(num_seqs) * p.heads), unsigned((p.value_dim + 63) / 64), unsigned(splits));
  if (grid.x == 0 || grid.z == 0) return;
  if (p.q.dtype == Elem::bf16) return launch_main_dims<__nv_bfloat16>(p, grid, pdl, stream);
  return launch_main_dims<__half>(p, grid, pdl, stream);
}

}  // namespace flashgla::cuda::gla
