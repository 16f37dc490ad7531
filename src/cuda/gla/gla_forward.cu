// CUDA GLA forward (chunked and recurrent) and decode: turns checked arguments
// into kernel parameters, plans the sequence split of the chunked kernel and
// its workspace, and launches on args.stream on the tensors' device.
#include <algorithm>
#include <string>

#include "core/backend.h"
#include "cuda/common/host.cuh"
#include "cuda/gla/gla_fwd.cuh"
#include "cuda/gla/gla_host.cuh"

namespace flashgla::cuda {
namespace {

using gla::Elem;
using gla::Gate;
using gla::View;

Gate gate_of(GateKind kind) {
  return kind == GateKind::vector ? Gate::vector : kind == GateKind::scalar ? Gate::scalar : Gate::none;
}

gla::Sequences sequences_of(const TensorView& cu_seqlens, int64_t total_len) {
  gla::Sequences s;
  s.total_len = total_len;
  if (!cu_seqlens.defined()) return s;
  s.cu_seqlens = cu_seqlens.data;
  s.stride = cu_seqlens.stride[0];
  s.i64 = cu_seqlens.dtype == DType::i64;
  return s;
}

int multiprocessors() {
  int device = 0, count = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  return count;
}

// The chunked kernel's parameters and plan (sequence split, workspace size).
struct ChunkPlan {
  gla::ChunkParams params;
  int num_seqs = 0;
  size_t workspace_bytes = 0;
  size_t prep_offset = 0;        // Hopper path: where its slots start in the workspace (then aligned to 1024)
  int64_t prep_grid_chunks = 0;  // Hopper path: chunks of the longest sequence (or of T)
};

int64_t longest_sequence(const GlaForwardArgs& a, const GlaProblem& p) {
  if (!p.varlen) return p.seq_len;
  const TensorView& host = a.cu_seqlens_host.defined() ? a.cu_seqlens_host : a.cu_seqlens;
  if (host.device.type != DeviceType::cpu) return -1;  // unknown without reading device memory
  auto at = [&](int64_t i) {
    const int64_t offset = i * host.stride[0];
    return host.dtype == DType::i64 ? static_cast<const int64_t*>(host.data)[offset]
                                    : int64_t(static_cast<const int32_t*>(host.data)[offset]);
  };
  int64_t longest = 0;
  for (int64_t n = 0; n < p.num_seqs; ++n) longest = std::max(longest, at(n + 1) - at(n));
  return longest;
}

ChunkPlan plan_chunked(const GlaForwardArgs& a, const GlaProblem& p) {
  ChunkPlan plan;
  gla::ChunkParams& c = plan.params;
  c.q = view_of(a.q), c.k = view_of(a.k), c.v = view_of(a.v), c.g = view_of(a.g), c.o = view_of(a.o);
  c.h0 = view_of(a.initial_state), c.ht = view_of(a.final_state);
  c.seqs = sequences_of(a.cu_seqlens, p.seq_len);
  c.heads = int(p.heads), c.key_dim = int(p.key_dim), c.value_dim = int(p.value_dim);
  c.num_slices = int((p.key_dim + gla::kSlice - 1) / gla::kSlice);
  c.gate = gate_of(p.gate);
  c.scale = float(p.scale);
  c.smem = gla::chunk_layout(c.q.dtype, c.g.dtype, c.gate, c.key_dim);
  plan.num_seqs = int(p.num_seqs);

  int max_smem = 0, device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
             "cudaDeviceGetAttribute");
  // The fast path where it applies; FLASHGLA_GLA_FAST=0 turns it off (benchmarks of both, tests of the general
  // kernel).
  const bool fast_off = env_choice("FLASHGLA_GLA_FAST", {"0", "1"}) == "0";
  c.fast = gla::fast_chunk_supported(c) && !fast_off &&
           gla::fast_chunk_smem_bytes(c.key_dim, c.value_dim) <= max_smem;
  // The Hopper path on sm_90: by default where it measured faster than the fast path (bench/notes_gla_fwd.md,
  // "Moved from source comments"): 128 < K ≤ 256 (e.g. the GLA layer's K256 V512 heads), and K = 128 with V ≥ 256
  // (the 340M model's heads) when its 64-column value tiles fill at least half the SMs, i.e. without a sequence
  // split (on par where the split applies). FLASHGLA_GLA_HOPPER=1 wherever it applies, =0 never.
  const std::string hopper_choice = env_choice("FLASHGLA_GLA_HOPPER", {"0", "1"});
  const int64_t hopper_tiles = p.num_seqs * p.heads * ((p.value_dim + 63) / 64);
  const bool wide_values = c.key_dim == 128 && c.value_dim >= 256 && 2 * hopper_tiles > multiprocessors();
  const bool hopper_wanted = hopper_choice == "1" || (hopper_choice != "0" && (c.key_dim > 128 || wide_values));
  const int64_t chunks_of_t = (p.seq_len + gla::kChunk - 1) / gla::kChunk;
  if (hopper_wanted && gla::hopper_chunk_supported(c) && chunks_of_t <= 65535 && loaded_code().sm90a) {
    c.hopper = true, c.fast = false;
    c.prep_key_pad = gla::hopper_key_pad(c.key_dim);
    c.prep_chunks = chunks_of_t;
  }
  FLASHGLA_REQUIRE(c.fast || c.hopper || c.smem.bytes <= max_smem, ErrorKind::unsupported, "q",
                 "K = " + std::to_string(p.key_dim) + " needs " + std::to_string(c.smem.bytes) +
                     " bytes of shared memory in the CUDA chunked kernel, more than this device's " +
                     std::to_string(max_smem) + " (K ≤ 512 fits on sm_80 and sm_90)");

  // Split long sequences when (sequences × heads × value tiles) leaves SMs idle.
  // Without the lengths of a varlen batch on the host there is nothing to plan with: no split.
  const int64_t longest = longest_sequence(a, p);
  const int64_t max_chunks = longest < 0 ? (p.seq_len + gla::kChunk - 1) / gla::kChunk
                                         : (longest + gla::kChunk - 1) / gla::kChunk;
  const int64_t tile =
      c.hopper ? 64 : c.fast ? gla::fast_value_tile(c.value_dim) : gla::value_tile(c.q.dtype);
  const int64_t key_parts = c.fast ? gla::fast_key_parts(c.key_dim) : 1;
  const int64_t tiles = p.num_seqs * p.heads * ((p.value_dim + tile - 1) / tile) * key_parts;
  int64_t splits = 1;
  if (longest > 0 && tiles > 0) {
    constexpr int64_t kMinChunksPerSplit = 4;
    const int64_t slots =
        int64_t(multiprocessors()) * (c.fast || c.hopper ? 1 : gla::chunk_blocks_per_sm(c.q.dtype, c.smem));
    splits = std::max<int64_t>(1, std::min(slots / tiles, max_chunks / kMinChunksPerSplit));
    // FLASHGLA_GLA_SPLITS=<n> overrides the choice (for tuning and tests of the split path).
    splits = env_count("FLASHGLA_GLA_SPLITS", splits, 1);
    splits = std::min<int64_t>(splits, std::max<int64_t>(1, max_chunks));
  }
  c.chunks_per_split = std::max<int64_t>(1, (max_chunks + splits - 1) / splits);
  c.num_splits = int((std::max<int64_t>(1, max_chunks) + c.chunks_per_split - 1) / c.chunks_per_split);
  if (c.num_splits > 1)
    plan.workspace_bytes =
        size_t(p.num_seqs * p.heads * (c.num_splits - 1)) * size_t(p.key_dim) * size_t(p.value_dim + 1) * sizeof(float);
  // The split's states pass on the fast path: the states kernel (gla_fwd_states.cu; it measured faster at every
  // split shape); FLASHGLA_GLA_STATES=fast runs the fast kernel's own states pass (states_only) instead. Pieces
  // per split: enough for one CTA per SM (one piece per split beat 2–4 pieces at 2 CTAs per SM, whose smaller
  // states pass the larger fold outweighed); FLASHGLA_GLA_STATE_PIECES=<n> overrides,
  // FLASHGLA_GLA_STATE_STAGES=3 keeps two chunks in flight instead of one (both for tuning and tests; 3 stages
  // measured the same as 2). The measurements: bench/notes_gla_fwd.md, "Moved from source comments".
  const bool states_kernel = env_choice("FLASHGLA_GLA_STATES", {"fast", "split"}) != "fast";
  c.state_stages = env_choice("FLASHGLA_GLA_STATE_STAGES", {"2", "3"}) == "3" ? 3 : 2;
  if (c.fast && c.num_splits > 1 && states_kernel && gla::split_states_fit(c)) {
    const int64_t tiles_per_piece = tiles * (c.num_splits - 1);  // CTAs of one piece per split
    int64_t pieces = std::max<int64_t>(1, int64_t(multiprocessors()) / std::max<int64_t>(1, tiles_per_piece));
    pieces = env_count("FLASHGLA_GLA_STATE_PIECES", pieces, 1);
    pieces = std::min<int64_t>({pieces, c.chunks_per_split, 65535 / (c.num_splits - 1)});
    c.state_pieces = int(std::max<int64_t>(1, pieces));
    // Prefix slots (one read per state element in the output pass); FLASHGLA_GLA_STATE_PREFIX=0: per-split slots.
    c.split_prefix = env_choice("FLASHGLA_GLA_STATE_PREFIX", {"0", "1"}) != "0";
    if (c.state_pieces > 1 || c.split_prefix)
      plan.workspace_bytes += size_t(p.num_seqs * p.heads * (c.num_splits - 1) * c.state_pieces) *
                              size_t(p.key_dim) * size_t(p.value_dim + 1) * sizeof(float);
  }
  if (c.hopper) {
    plan.prep_offset = plan.workspace_bytes;
    plan.prep_grid_chunks = std::max<int64_t>(1, max_chunks);
    plan.workspace_bytes += gla::hopper_prep_bytes(c, p.num_seqs);
  }
  return plan;
}


// ---- state pools: dense copies of the states at the start of the workspace --------

size_t dense_state_bytes(const GlaProblem& p) {
  const size_t bytes = size_t(p.num_seqs * p.heads * p.key_dim * p.value_dim) * sizeof(float);
  return (bytes + 255) / 256 * 256;
}

size_t pooled_bytes(const GlaForwardArgs& a, const GlaProblem& p) {
  return (a.initial_state_indices.defined() ? dense_state_bytes(p) : 0) +
         (a.final_state_indices.defined() ? dense_state_bytes(p) : 0);
}

// `a` with dense [N,H,K,V] states at `base` in place of the pools (and the
// workspace after them); base may be a stand-in address for size queries.
GlaForwardArgs with_dense_states(const GlaForwardArgs& a, const GlaProblem& p, char* base) {
  GlaForwardArgs d = a;
  size_t offset = 0;
  auto dense = [&] {
    const TensorView t = TensorView::contiguous(base + offset, DType::f32,
                                                {p.num_seqs, p.heads, p.key_dim, p.value_dim}, a.q.device);
    offset += dense_state_bytes(p);
    return t;
  };
  if (a.initial_state_indices.defined()) d.initial_state = dense();
  if (a.final_state_indices.defined()) d.final_state = dense();
  d.initial_state_indices = {}, d.final_state_indices = {};
  if (a.workspace) {
    FLASHGLA_REQUIRE(a.workspace_bytes >= offset, ErrorKind::value, "workspace",
                     "needs at least " + std::to_string(offset) + " bytes (gla_forward_workspace_bytes), got " +
                         std::to_string(a.workspace_bytes));
    d.workspace = static_cast<char*>(a.workspace) + offset, d.workspace_bytes = a.workspace_bytes - offset;
  }
  return d;
}

gla::StateRowsCopy rows_copy(const TensorView& src, const TensorView& src_index, const TensorView& dst,
                             const TensorView& dst_index, const GlaProblem& p) {
  gla::StateRowsCopy c;
  c.src = view_of(src), c.dst = view_of(dst);
  c.src_rows = src.shape[0], c.dst_rows = dst.shape[0];
  if (src_index.defined())
    c.src_index = static_cast<const int32_t*>(src_index.data), c.src_index_stride = src_index.stride[0];
  if (dst_index.defined())
    c.dst_index = static_cast<const int32_t*>(dst_index.data), c.dst_index_stride = dst_index.stride[0];
  c.heads = int(p.heads), c.key_dim = int(p.key_dim), c.value_dim = int(p.value_dim);
  return c;
}

size_t dense_workspace_bytes(const GlaForwardArgs& args, const GlaProblem& problem) {
  if (args.algorithm != GlaAlgorithm::chunked || args.q.dtype == DType::f64) return 0;
  DeviceGuard guard(args.q.device.index);
  return plan_chunked(args, problem).workspace_bytes;
}

void forward_dense(const GlaForwardArgs& args, const GlaProblem& problem);

}  // namespace

size_t gla_forward_workspace_bytes(const GlaForwardArgs& args, const GlaProblem& problem) {
  const size_t pooled = pooled_bytes(args, problem);
  if (pooled == 0) return dense_workspace_bytes(args, problem);
  // A 256-aligned stand-in address: the plan looks at alignment only.
  return pooled + dense_workspace_bytes(with_dense_states(args, problem, reinterpret_cast<char*>(256)), problem);
}

void gla_forward(const GlaForwardArgs& args, const GlaProblem& problem) {
  const size_t pooled = pooled_bytes(args, problem);
  if (pooled == 0) return forward_dense(args, problem);
  // Gather the initial rows, run on dense states, scatter the final ones: one
  // pool may be both the initial and the final state.
  require_compute_dtype(args.q, "q");
  DeviceGuard guard(args.q.device.index);
  const auto stream = static_cast<cudaStream_t>(args.stream);
  Scratch dense(args.workspace, args.workspace_bytes, pooled, stream, "gla_forward_workspace_bytes");
  const GlaForwardArgs d = with_dense_states(args, problem, dense.bytes());
  if (args.initial_state_indices.defined())
    gla::launch_copy_state_rows(rows_copy(args.initial_state, args.initial_state_indices, d.initial_state, {}, problem),
                                int(problem.num_seqs), stream);
  forward_dense(d, problem);
  if (args.final_state_indices.defined())
    gla::launch_copy_state_rows(rows_copy(d.final_state, {}, args.final_state, args.final_state_indices, problem),
                                int(problem.num_seqs), stream);
}

namespace {

void forward_dense(const GlaForwardArgs& args, const GlaProblem& problem) {
  require_compute_dtype(args.q, "q");
  DeviceGuard guard(args.q.device.index);
  const auto stream = static_cast<cudaStream_t>(args.stream);

  if (args.algorithm == GlaAlgorithm::recurrent) {
    gla::RecurrentParams r;
    r.q = view_of(args.q), r.k = view_of(args.k), r.v = view_of(args.v), r.g = view_of(args.g);
    r.o = view_of(args.o), r.h0 = view_of(args.initial_state), r.ht = view_of(args.final_state);
    r.seqs = sequences_of(args.cu_seqlens, problem.seq_len);
    r.heads = int(problem.heads), r.key_dim = int(problem.key_dim), r.value_dim = int(problem.value_dim);
    r.gate = gate_of(problem.gate);
    r.scale = float(problem.scale);
    r.reverse = args.reverse;
    gla::launch_recurrent_forward(r, int(problem.num_seqs), stream);
    return;
  }

  ChunkPlan plan = plan_chunked(args, problem);
  gla::ChunkParams& c = plan.params;
  const auto launch = c.hopper ? gla::launch_hopper_chunk_forward
                     : c.fast   ? gla::launch_fast_chunk_forward
                                : gla::launch_chunk_forward;
  Scratch workspace(args.workspace, args.workspace_bytes, plan.workspace_bytes, stream, "gla_forward_workspace_bytes");
  if (c.hopper) {
    const auto start = reinterpret_cast<uintptr_t>(workspace.bytes() + plan.prep_offset);
    c.prep = reinterpret_cast<unsigned char*>((start + 1023) & ~uintptr_t(1023));
    gla::launch_hopper_prep(c, plan.num_seqs, plan.prep_grid_chunks, stream);
  }
  if (c.num_splits > 1) {
    c.split_states = workspace.floats();
    c.split_decay = c.split_states + size_t(problem.num_seqs * problem.heads * (c.num_splits - 1)) *
                                         size_t(problem.key_dim) * size_t(problem.value_dim);
    if (c.state_pieces > 0) {
      const size_t split_floats =
          size_t(problem.num_seqs * problem.heads * (c.num_splits - 1)) * size_t(problem.key_dim) *
          size_t(problem.value_dim + 1);
      const bool direct = c.state_pieces == 1 && !c.split_prefix;  // the states kernel writes the split slots
      c.piece_states = direct ? c.split_states : c.split_states + split_floats;
      c.piece_decay = direct ? c.split_decay
                             : c.piece_states + size_t(problem.num_seqs * problem.heads * (c.num_splits - 1) *
                                                       c.state_pieces) *
                                                    size_t(problem.key_dim) * size_t(problem.value_dim);
      gla::launch_split_states(c, plan.num_seqs, stream);
    } else {
      c.states_only = true;
      launch(c, plan.num_seqs, stream);
      c.states_only = false;
    }
  }
  launch(c, plan.num_seqs, stream);
}

}  // namespace

void gla_decode(const GlaDecodeArgs& args, const GlaProblem& problem) {
  require_compute_dtype(args.q, "q");
  DeviceGuard guard(args.q.device.index);
  gla::DecodeParams d;
  d.q = view_of(args.q), d.k = view_of(args.k), d.v = view_of(args.v), d.g = view_of(args.g);
  d.o = view_of(args.o), d.state = view_of(args.state), d.token_states = view_of(args.token_states);
  if (args.state_indices.defined()) {
    d.state_indices = static_cast<const int32_t*>(args.state_indices.data);
    d.index_stride = args.state_indices.stride[0];
  }
  d.state_rows = problem.state_rows;
  d.heads = int(problem.heads), d.key_dim = int(problem.key_dim), d.value_dim = int(problem.value_dim);
  d.tokens = int(problem.seq_len);
  d.gate = gate_of(problem.gate);
  d.scale = float(problem.scale);
  gla::launch_decode(d, int(problem.num_seqs), multiprocessors(), static_cast<cudaStream_t>(args.stream));
}

}  // namespace flashgla::cuda
