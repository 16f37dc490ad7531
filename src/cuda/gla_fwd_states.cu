// The split's states pass as its own kernel (gla_fwd_states.cuh): host side
// (occupancy for the planner, launch of the states and fold kernels) and the
// bf16/fp16 instantiations.
#include "cuda/gla_fwd_states.cuh"

namespace flashgla::cuda::gla {
namespace {

template <class E, class G, int KP, int BV, Gate GK>
void launch_states_kind(const ChunkParams& p, dim3 grid, cudaStream_t stream) {
  constexpr int bytes = states::StatesLayout<E, G, KP, BV, GK>::bytes;
  const auto kernel = states::split_states_kernel<E, G, KP, BV, GK>;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
             "cudaFuncSetAttribute (GLA split states kernel)");
  kernel<<<grid, states::kThreads, bytes, stream>>>(p);
  check_cuda(cudaGetLastError(), "GLA split states kernel launch");
}

// Calls f with the layout of the kernel p needs (as a type tag) and the kernel launcher.
template <class E, int KP, int BV, class F>
void by_gate(const ChunkParams& p, F&& f) {
  switch (p.gate) {
    case Gate::vector:
      if (p.g.dtype == Elem::f32) return f(states::StatesLayout<E, float, KP, BV, Gate::vector>{},
                                           launch_states_kind<E, float, KP, BV, Gate::vector>);
      return f(states::StatesLayout<E, E, KP, BV, Gate::vector>{}, launch_states_kind<E, E, KP, BV, Gate::vector>);
    case Gate::scalar:
      return f(states::StatesLayout<E, E, KP, BV, Gate::scalar>{}, launch_states_kind<E, E, KP, BV, Gate::scalar>);
    case Gate::none:
      return f(states::StatesLayout<E, E, KP, BV, Gate::none>{}, launch_states_kind<E, E, KP, BV, Gate::none>);
  }
}

template <class E, class F>
void by_dims(const ChunkParams& p, F&& f) {
  const bool wide_keys = p.key_dim > 64, wide_values = p.value_dim > 64;
  if (wide_keys && wide_values) return by_gate<E, 128, 128>(p, f);
  if (wide_keys) return by_gate<E, 128, 64>(p, f);
  if (wide_values) return by_gate<E, 64, 128>(p, f);
  return by_gate<E, 64, 64>(p, f);
}

template <class F>
void by_kernel(const ChunkParams& p, F&& f) {
  if (p.q.dtype == Elem::bf16) return by_dims<__nv_bfloat16>(p, f);
  if (p.q.dtype == Elem::f16) return by_dims<__half>(p, f);
}

}  // namespace

int split_states_blocks_per_sm(const ChunkParams& p) {
  int bytes = 0;
  by_kernel(p, [&](auto layout, auto) { bytes = decltype(layout)::bytes; });
  int device = 0, per_sm = 0, per_block = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device),
             "cudaDeviceGetAttribute");
  check_cuda(cudaDeviceGetAttribute(&per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
             "cudaDeviceGetAttribute");
  if (bytes == 0 || bytes > per_block) return 0;
  // 1 KB per block is reserved by the runtime; the kernel's register bound allows 2 blocks.
  return std::max(1, std::min(2, per_sm / (bytes + 1024)));
}

void launch_split_states(const ChunkParams& p, int num_seqs, cudaStream_t stream) {
  const int64_t nh = int64_t(num_seqs) * p.heads, slots = nh * (p.num_splits - 1);
  if (slots == 0 || p.state_pieces < 1) return;
  const int tile = fast_value_tile(p.value_dim);
  const int value_tiles = (p.value_dim + tile - 1) / tile;
  const dim3 grid(unsigned(nh), unsigned(value_tiles * fast_key_parts(p.key_dim)),
                  unsigned((p.num_splits - 1) * p.state_pieces));
  by_kernel(p, [&](auto, auto launch) { launch(p, grid, stream); });
  if (p.state_pieces == 1) return;  // the kernel wrote the split slots
  constexpr int kFoldThreads = 256;
  const int64_t elements = int64_t(p.key_dim) * p.value_dim;
  const dim3 fold_grid(unsigned(slots), unsigned((elements + kFoldThreads - 1) / kFoldThreads));
  states::fold_pieces_kernel<<<fold_grid, kFoldThreads, 0, stream>>>(p);
  check_cuda(cudaGetLastError(), "GLA split states: fold kernel launch");
}

}  // namespace flashgla::cuda::gla
