// Chunked GLA forward, Hopper path: host side (support, workspace, launches) and
// the bf16/fp16 instantiations of the kernels in gla_fwd_hopper_prep2.cuh and gla_fwd_hopper_ws.cuh.

#include "cuda/gla/gla_fwd_hopper.cuh"
#include "cuda/gla/gla_fwd_hopper_prep2.cuh"
#include "cuda/gla/gla_fwd_hopper_ws.cuh"

namespace flashgla::cuda::gla {

using hopper::Slot;
using hopper::WsLayout;

int hopper_key_pad(int key_dim) { return key_dim <= 64 ? 64 : key_dim <= 128 ? 128 : 256; }

bool hopper_chunk_supported(const ChunkParams& p) {
  const bool half_inputs = p.q.dtype == Elem::bf16 || p.q.dtype == Elem::f16;
  return half_inputs && p.key_dim >= 1 && p.key_dim <= 256 && p.value_dim >= 1 && p.v.rows16 && p.o.rows16;
}

size_t hopper_prep_bytes(const ChunkParams& p, int64_t num_seqs) {
  const int64_t chunks = (p.seqs.total_len + kChunk - 1) / kChunk;
  const int64_t slots = p.seqs.cu_seqlens ? num_seqs + chunks + 1 : num_seqs * chunks;
  return size_t(slots) * size_t(p.heads) * size_t(Slot{hopper_key_pad(p.key_dim)}.bytes()) + 1024;
}

namespace {

template <class E>
void launch_prep_typed(const ChunkParams& p, dim3 grid, cudaStream_t stream) {
  constexpr int bytes = hopper::prep2_smem_bytes();
  auto kernel = hopper::hopper_prep2_kernel<E>;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
             "cudaFuncSetAttribute (GLA Hopper chunk pass)");
  kernel<<<grid, hopper::kPrepThreads, bytes, stream>>>(p);
  check_cuda(cudaGetLastError(), "GLA Hopper chunk pass launch");
}

// The warp-specialized state kernel (gla_fwd_hopper_ws.cuh) in clusters of CS value tiles, a programmatic
// dependent of the kernel before it in the stream (the chunk pass, or the states pass) unless
// FLASHGLA_GLA_HOPPER_PDL=0.
template <class E, int KP, bool STATES, int CS>
void launch_ws_kernel(const ChunkParams& p, dim3 grid, cudaStream_t stream) {
  using L = WsLayout<KP>;
  auto kernel = hopper::hopper_ws_kernel<E, KP, STATES, CS>;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, L::alloc),
             "cudaFuncSetAttribute (GLA Hopper state kernel)");
  cudaLaunchAttribute attrs[2];
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = dim3(L::kThreads);
  config.dynamicSmemBytes = L::alloc;
  config.stream = stream;
  config.attrs = attrs;
  config.numAttrs = 0;
  if (CS > 1) {
    cudaLaunchAttribute& cluster = attrs[config.numAttrs++];
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = 1, cluster.val.clusterDim.y = CS, cluster.val.clusterDim.z = 1;
  }
  if (env_choice("FLASHGLA_GLA_HOPPER_PDL", {"0", "1"}) != "0") {
    cudaLaunchAttribute& overlap = attrs[config.numAttrs++];
    overlap.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    overlap.val.programmaticStreamSerializationAllowed = 1;
  }
  check_cuda(cudaLaunchKernelEx(&config, kernel, p), "GLA Hopper state kernel launch");
}

// CTAs per cluster of the output pass: 1 unless FLASHGLA_GLA_HOPPER_CLUSTER=2 or 4 (where it divides the value
// tiles). Clusters cut the L2 bytes of the slot images by CS but measured slower (bench/notes_gla_fwd.md), so
// they stay opt-in.
int cluster_size(dim3 grid) {
  const std::string forced = env_choice("FLASHGLA_GLA_HOPPER_CLUSTER", {"1", "2", "4"});
  const int cs = forced.empty() ? 1 : std::stoi(forced);
  return (cs == 2 || cs == 4) && grid.y % cs == 0 ? cs : 1;
}

template <class E, int KP>
void launch_state_kernel(const ChunkParams& p, dim3 grid, cudaStream_t stream) {
  if (p.states_only) return launch_ws_kernel<E, KP, true, 1>(p, grid, stream);
  switch (cluster_size(grid)) {
    case 4: return launch_ws_kernel<E, KP, false, 4>(p, grid, stream);
    case 2: return launch_ws_kernel<E, KP, false, 2>(p, grid, stream);
    default: return launch_ws_kernel<E, KP, false, 1>(p, grid, stream);
  }
}

template <class E>
void launch_main_dims(const ChunkParams& p, dim3 grid, cudaStream_t stream) {
  switch (p.prep_key_pad) {
    case 64: return launch_state_kernel<E, 64>(p, grid, stream);
    case 128: return launch_state_kernel<E, 128>(p, grid, stream);
    default: return launch_state_kernel<E, 256>(p, grid, stream);
  }
}

}  // namespace

void launch_hopper_prep(const ChunkParams& p, int num_seqs, int64_t max_chunks, cudaStream_t stream) {
  const dim3 grid(unsigned(int64_t(num_seqs) * p.heads), unsigned(max_chunks));
  if (grid.x == 0 || grid.y == 0) return;
  if (p.q.dtype == Elem::bf16) return launch_prep_typed<__nv_bfloat16>(p, grid, stream);
  return launch_prep_typed<__half>(p, grid, stream);
}

void launch_hopper_chunk_forward(const ChunkParams& p, int num_seqs, cudaStream_t stream) {
  const int splits = p.states_only ? p.num_splits - 1 : p.num_splits;
  const dim3 grid(unsigned(int64_t(num_seqs) * p.heads), unsigned((p.value_dim + 63) / 64), unsigned(splits));
  if (grid.x == 0 || grid.z == 0) return;
  if (p.q.dtype == Elem::bf16) return launch_main_dims<__nv_bfloat16>(p, grid, stream);
  return launch_main_dims<__half>(p, grid, stream);
}

}  // namespace flashgla::cuda::gla
