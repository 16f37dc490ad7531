// CUDA softmax attention (FlashAttention): checks what this backend runs,
// builds the kernels' parameters and dispatches on dtype and head dim. The
// portable (sm_80+) kernels are in attention_kernels.cuh, instantiated in
// attention_d*.cu, for bf16/fp16 with D == Dv in {64, 128, 256}; every other
// case (fp32, any D and Dv up to 512) runs the generic kernels of
// attention_generic.cu. The Hopper forward (attention_hopper.cu) and backward
// (attention_hopper_bwd.cu) take bf16/fp16 at D in {64, 128} where they can run;
// the call's AttentionTuning overrides that choice.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "core/backend.h"
#include "cuda/attention/attention_generic.cuh"
#include "cuda/attention/attention_params.cuh"
#include "cuda/common/host.cuh"

namespace flashgla::cuda {
namespace {

using attn::AttentionParams;
using attn::Strided;

void check_supported(const TensorView& q, const AttentionProblem& p) {
  if (q.dtype == DType::f64)
    check::fail(ErrorKind::unsupported, "q",
                "CUDA attention runs float32, bfloat16 and float16, got float64; for float64 use the CPU backend "
                "(tensors on the CPU)");
  if (p.head_dim > attn::kGenericMaxDim)
    check::fail(ErrorKind::unsupported, "q",
                "CUDA attention runs head dims up to " + std::to_string(attn::kGenericMaxDim) + ", got D = " +
                    std::to_string(p.head_dim) + "; the CPU backend runs any head dim");
  if (p.value_dim > attn::kGenericMaxDim)
    check::fail(ErrorKind::unsupported, "v",
                "CUDA attention runs value head dims up to " + std::to_string(attn::kGenericMaxDim) + ", got Dv = " +
                    std::to_string(p.value_dim) + "; the CPU backend runs any head dim");
}

// Whether the fast kernels take the call; the generic ones take the rest.
bool fast_kernels_apply(DType dtype, const AttentionProblem& p) {
  return (dtype == DType::bf16 || dtype == DType::f16) && p.value_dim == p.head_dim &&
         (p.head_dim == 64 || p.head_dim == 128 || p.head_dim == 256);
}

// Whether a [B, T, H, D] view moves in `bytes`-wide pieces along D: unit
// stride along D, and the pointer and every other stride (of a dimension
// longer than 1) multiples of that width.
bool moves_in(const TensorView& t, int64_t bytes) {
  const int64_t elems = bytes / int64_t(dtype_size(t.dtype));
  if (t.stride[3] != 1 && t.shape[3] > 1) return false;
  if (reinterpret_cast<uintptr_t>(t.data) % uintptr_t(bytes) != 0) return false;
  for (int d = 0; d < 3; ++d)
    if (t.shape[d] > 1 && t.stride[d] % elems != 0) return false;
  return true;
}

Strided strided(const TensorView& t) {
  Strided s;
  s.data = t.data;
  s.batch = t.stride[0], s.token = t.stride[1], s.head = t.stride[2], s.dim = t.stride[3];
  s.vec16 = moves_in(t, 16);
  s.vec4 = moves_in(t, 4);
  return s;
}

AttentionParams make_params(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                            const TensorView& lse, const TensorView& cu_q, const TensorView& cu_k,
                            const AttentionProblem& problem) {
  AttentionParams p;
  p.q = strided(q), p.k = strided(k), p.v = strided(v), p.o = strided(o);
  p.lse = static_cast<float*>(lse.data);
  p.lse_batch = lse.stride[0], p.lse_head = lse.stride[1], p.lse_token = lse.stride[2];
  p.varlen = problem.varlen;
  if (p.varlen) {
    p.cu_q = cu_q.data, p.cu_q_stride = cu_q.stride[0], p.cu_q_64 = cu_q.dtype == DType::i64;
    p.cu_k = cu_k.data, p.cu_k_stride = cu_k.stride[0], p.cu_k_64 = cu_k.dtype == DType::i64;
  }
  p.batch = problem.batch, p.q_len = problem.q_len, p.k_len = problem.k_len;
  p.q_heads = problem.q_heads, p.kv_heads = problem.kv_heads, p.group = problem.q_heads / problem.kv_heads;
  p.num_seqs = problem.num_seqs;
  p.causal = problem.causal;
  p.scale = float(problem.scale);
  p.scale_log2 = float(problem.scale * 1.4426950408889634);
  return p;
}

// The Hopper kernels are the library's choice where they can run: they beat the
// portable ones at every shape measured (bench/notes_attention.md, "Moved from
// source comments"). AttentionTuning::Kernel::portable keeps the portable
// kernels; hopper requires the Hopper ones wherever the tensors allow them (an
// error where the device or build cannot, so a test run with it cannot pass on
// the portable kernel by accident).
using Kernel = AttentionTuning::Kernel;

// The Hopper forward's variant: the ping-pong kernel, except 176-key tiles at
// D = 128 and Tk >= 8K, the one region where they were faster
// (bench/notes_attention.md). Fixed-length batches only: with cu_seqlens the
// host does not know the sequences' lengths (varlen was not timed).
constexpr int64_t kWideKeyTilesFromKeys = 8192;
attn::HopperForwardVariant hopper_variant(const AttentionProblem& problem) {
  const bool long_keys = !problem.varlen && problem.k_len >= kWideKeyTilesFromKeys;
  return problem.head_dim == 128 && long_keys ? attn::HopperForwardVariant::overlap_wide
                                              : attn::HopperForwardVariant::ping_pong;
}

// Calls fn(T{}, std::integral_constant<int, D>{}) for the dtype and head dim.
template <class Fn>
void dispatch(DType dtype, int64_t head_dim, Fn&& fn) {
  auto by_dim = [&](auto type) {
    if (head_dim == 64) fn(type, std::integral_constant<int, 64>{});
    else if (head_dim == 128) fn(type, std::integral_constant<int, 128>{});
    else fn(type, std::integral_constant<int, 256>{});
  };
  if (dtype == DType::bf16) by_dim(__nv_bfloat16{});
  else by_dim(__half{});
}

// Backward scratch, each piece 256-byte aligned: dq_accum [B, Hq, Tq, D] fp32, the deterministic backward's dq
// turn counters (int32, zeroed with dq_accum), lse_log2 and dsum [B, Hq, Tq] fp32. The generic kernels use dsum
// alone.
struct BackwardScratch {
  size_t rows = 0, dq_bytes = 0, turn_bytes = 0, row_bytes = 0;
  BackwardScratch(const AttentionProblem& p, bool fast, bool deterministic) {
    rows = size_t(p.batch * p.q_heads * p.q_len);
    dq_bytes = fast ? align(rows * size_t(p.head_dim) * sizeof(float)) : 0;
    turn_bytes = fast && deterministic ? align(turn_count(p) * sizeof(int)) : 0;
    row_bytes = align(rows * sizeof(float));
  }
  size_t total() const { return dq_bytes + turn_bytes + 2 * row_bytes; }
  static size_t align(size_t n) { return (n + 255) / 256 * 256; }
  // One counter per (batch row, query head, query tile slot, 64-column block): enough for the shortest query
  // tiles (32 rows) and the most column blocks any backward kernel uses.
  static size_t turn_count(const AttentionProblem& p) {
    const int64_t slots = attn::tile_slots_of(p.q_len, 32, p.varlen, p.num_seqs);
    return size_t((p.varlen ? 1 : p.batch) * p.q_heads * slots * std::max<int64_t>(1, p.head_dim / 64));
  }
};

}  // namespace

void attention_forward(const AttentionForwardArgs& args, const AttentionProblem& problem) {
  check_supported(args.q, problem);
  DeviceGuard guard(args.q.device.index);
  const AttentionParams p =
      make_params(args.q, args.k, args.v, args.o, args.lse, args.cu_seqlens_q, args.cu_seqlens_k, problem);
  const auto stream = static_cast<cudaStream_t>(args.stream);
  if (!fast_kernels_apply(args.q.dtype, problem)) {
    attn::run_attention_generic_forward(p, args.q.dtype, int(problem.head_dim), int(problem.value_dim), stream);
    return;
  }
  const bool hopper_required = args.tuning.kernel == Kernel::hopper;
  const bool try_hopper = args.tuning.kernel != Kernel::portable;
  const attn::HopperForwardVariant variant = hopper_variant(problem);
  dispatch(args.q.dtype, problem.head_dim, [&](auto type, auto dim) {
    using T = decltype(type);
    constexpr int D = decltype(dim)::value;
    if constexpr (D <= 128) {
      // Without queries or keys TMA has nothing to load (and no tensor map to
      // encode): the portable kernel writes what there is (zeros).
      if (try_hopper && p.q_len > 0 && p.k_len > 0) {
        const char* refused = attn::run_attention_forward_hopper<T, D>(p, stream, variant);
        if (refused == nullptr) return;
        const bool tensors_fit = p.q.vec16 && p.k.vec16 && p.v.vec16;
        if (hopper_required && tensors_fit)
          check::fail(ErrorKind::unsupported, "tuning",
                      std::string("asks for the Hopper forward, which cannot run here: ") + refused);
      }
    }
    attn::run_attention_forward<T, D>(p, stream);
  });
}

void attention_backward(const AttentionBackwardArgs& args, const AttentionProblem& problem) {
  check_supported(args.q, problem);
  DeviceGuard guard(args.q.device.index);
  AttentionParams p =
      make_params(args.q, args.k, args.v, args.o, args.lse, args.cu_seqlens_q, args.cu_seqlens_k, problem);
  p.d_o = strided(args.d_o), p.dq = strided(args.dq), p.dk = strided(args.dk), p.dv = strided(args.dv);
  const auto stream = static_cast<cudaStream_t>(args.stream);

  const bool fast = fast_kernels_apply(args.q.dtype, problem);
  const BackwardScratch scratch(problem, fast, args.deterministic);
  const Scratch workspace(args.workspace, args.workspace_bytes, args.allocate_workspace, scratch.total(), stream,
                          "attention_backward_workspace_bytes");
  char* base = workspace.bytes();
  p.dq_accum = reinterpret_cast<float*>(base);
  p.dq_turns = scratch.turn_bytes > 0 ? reinterpret_cast<int*>(base + scratch.dq_bytes) : nullptr;
  p.lse_log2 = reinterpret_cast<float*>(base + scratch.dq_bytes + scratch.turn_bytes);
  p.dsum = reinterpret_cast<float*>(base + scratch.dq_bytes + scratch.turn_bytes + scratch.row_bytes);
  if (!fast) {
    attn::run_attention_generic_backward(p, args.q.dtype, int(problem.head_dim), int(problem.value_dim), stream);
  } else {
    const size_t zeroed = scratch.dq_bytes + scratch.turn_bytes;
    if (zeroed > 0)
      check_cuda(cudaMemsetAsync(p.dq_accum, 0, zeroed, stream), "cudaMemsetAsync (dq accumulator, turns)");
    const bool hopper_required = args.tuning.kernel == Kernel::hopper;
    const bool try_hopper = args.tuning.kernel != Kernel::portable;
    dispatch(args.q.dtype, problem.head_dim, [&](auto type, auto dim) {
      using T = decltype(type);
      constexpr int D = decltype(dim)::value;
      if constexpr (D <= 128) {
        if (try_hopper && p.q_len > 0 && p.k_len > 0) {
          const char* refused = attn::run_attention_backward_hopper<T, D>(p, stream);
          if (refused == nullptr) return;
          const bool tensors_fit = p.q.vec16 && p.k.vec16 && p.v.vec16 && p.d_o.vec16;
          if (hopper_required && tensors_fit)
            check::fail(ErrorKind::unsupported, "tuning",
                        std::string("asks for the Hopper backward, which cannot run here: ") + refused);
        }
      }
      attn::run_attention_backward<T, D>(p, stream);
    });
  }
}

size_t attention_forward_workspace_bytes(const AttentionForwardArgs& args, const AttentionProblem& problem) {
  check_supported(args.q, problem);
  return 0;
}

size_t attention_backward_workspace_bytes(const AttentionBackwardArgs& args, const AttentionProblem& problem) {
  check_supported(args.q, problem);
  return BackwardScratch(problem, fast_kernels_apply(args.q.dtype, problem), args.deterministic).total();
}

}  // namespace flashgla::cuda
