// The split's states pass as its own kernel (gla_fwd_states.cuh): host side
// (whether it fits, launch of the states and fold kernels) and the bf16/fp16
// instantiations.
#include "cuda/gla/kernels/gla_fwd_states.cuh"

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

template <class E, int KP, int BV, class F>
void by_gate(const ChunkParams& p, F&& f) {
  using states::StatesLayout;
  switch (p.gate) {
    case Gate::vector:
      if (p.g.dtype == Elem::f32) return f(StatesLayout<E, float, KP, BV, Gate::vector>{},
                                           launch_states_kind<E, float, KP, BV, Gate::vector>);
      return f(StatesLayout<E, E, KP, BV, Gate::vector>{}, launch_states_kind<E, E, KP, BV, Gate::vector>);
    case Gate::scalar:
      return f(StatesLayout<E, E, KP, BV, Gate::scalar>{}, launch_states_kind<E, E, KP, BV, Gate::scalar>);
    case Gate::none:
      return f(StatesLayout<E, E, KP, BV, Gate::none>{}, launch_states_kind<E, E, KP, BV, Gate::none>);
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

// Calls f(layout tag, launcher) for the kernel that p's dtype, dims and gate select (the same choice as
// split_states_smem_bytes in layouts.h, which the planner reads).
template <class F>
void by_kernel(const ChunkParams& p, F&& f) {
  if (p.q.dtype == Elem::bf16) return by_dims<__nv_bfloat16>(p, f);
  if (p.q.dtype == Elem::f16) return by_dims<__half>(p, f);
}

}  // namespace

void launch_split_states(const ChunkParams& p, int num_seqs, cudaStream_t stream) {
  const int64_t nh = int64_t(num_seqs) * p.heads, slots = nh * (p.num_splits - 1);
  if (slots == 0 || p.state_pieces < 1) return;
  const int tile = fast_value_tile(p.value_dim);
  const int value_tiles = (p.value_dim + tile - 1) / tile;
  const int walked = p.num_splits - 1 + (p.summary.data ? 1 : 0);  // a summary call walks the last split too
  const dim3 grid(unsigned(nh), unsigned(value_tiles * fast_key_parts(p.key_dim)), unsigned(walked * p.state_pieces));
  by_kernel(p, [&](auto, auto launch) { launch(p, grid, stream); });
  const int threads = std::min(256, (p.value_dim + 31) / 32 * 32);
  states::fold_pieces_kernel<<<dim3(unsigned(nh), unsigned(p.key_dim)), threads, 0, stream>>>(p);
  check_cuda(cudaGetLastError(), "GLA split states: fold kernel launch");
}

void launch_segment_states(const ChunkParams& p, int num_seqs, cudaStream_t stream) {
  const int64_t nh = int64_t(num_seqs) * p.heads;
  if (nh == 0 || p.state_pieces < 1) return;
  const int tile = fast_value_tile(p.value_dim);
  const int value_tiles = (p.value_dim + tile - 1) / tile;
  const dim3 grid(unsigned(nh), unsigned(value_tiles * fast_key_parts(p.key_dim)), unsigned(p.state_pieces));
  by_kernel(p, [&](auto, auto launch) { launch(p, grid, stream); });
}

}  // namespace flashgla::cuda::gla
