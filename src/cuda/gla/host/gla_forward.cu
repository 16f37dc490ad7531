// CUDA GLA forward (chunked and recurrent) and decode: turns checked arguments
// into kernel parameters, asks the planner (plan.h) for the chunked kernel's
// choices and workspace, and launches on args.stream on the tensors' device.
#include <algorithm>
#include <string>

#include "core/backend.h"
#include "core/gla_options_backend.h"
#include "core/sequences.h"
#include "cuda/common/host.cuh"
#include "cuda/gla/device/gla_bwd.cuh"
#include "cuda/gla/device/gla_fwd.cuh"
#include "cuda/gla/host/gla_host.cuh"
#include "cuda/gla/plan/layouts.h"

namespace flashgla::cuda {
namespace {

using gla::Elem;
using gla::View;

// The chunked kernel's parameters and plan (plan.h: kernel, sequence split, states pass, workspace).
struct ChunkPlan {
  gla::ChunkParams params;
  gla::FwdPlan plan;
  int num_seqs = 0;
};

// The planner's view of a chunked forward over these tensors (plan.h), but for the sequences' lengths and intra.
gla::FwdProblem forward_problem(const gla::View& q, const gla::View& k, const gla::View& v, const gla::View& g,
                                const gla::View& o, const GlaProblem& p) {
  gla::FwdProblem fp;
  fp.input = q.dtype, fp.gate_dtype = g.dtype, fp.gate = p.gate;
  fp.heads = int(p.heads), fp.key_dim = int(p.key_dim), fp.value_dim = int(p.value_dim);
  fp.num_seqs = p.num_seqs, fp.seq_len = p.seq_len;
  fp.q_rows16 = q.rows16, fp.k_rows16 = k.rows16, fp.v_rows16 = v.rows16, fp.g_rows16 = g.rows16;
  fp.o_rows16 = o.rows16;
  return fp;
}

// On the tensors' device (the caller's guard).
ChunkPlan plan_chunked(const GlaForwardArgs& a, const GlaProblem& p) {
  ChunkPlan out;
  gla::ChunkParams& c = out.params;
  c.q = view_of(a.q), c.k = view_of(a.k), c.v = view_of(a.v), c.o = view_of(a.o);
  gamma_gate(a.g, a.g_gamma, c.g, c.g_gamma);
  c.h0 = view_of(a.initial_state), c.ht = view_of(a.final_state);
  c.seqs = sequences_of(a.cu_seqlens, p.seq_len);
  c.heads = int(p.heads), c.key_dim = int(p.key_dim), c.value_dim = int(p.value_dim);
  c.gate = p.gate;
  c.scale = float(p.scale);
  out.num_seqs = int(p.num_seqs);

  gla::FwdProblem fp = forward_problem(c.q, c.k, c.v, c.g, c.o, p);
  fp.varlen = c.seqs.cu_seqlens != nullptr;
  fp.intra = a.intra.defined();
  const gla::DeviceProps& device = device_props(a.q.device.index);
  fp.longest = planning_longest(p, a.cu_seqlens, a.cu_seqlens_host, static_cast<cudaStream_t>(a.stream),
                                [&](int64_t longest) {  // -1: unknown, no split
                                  gla::FwdProblem bound = fp;
                                  bound.longest = longest;
                                  return gla::plan_forward(bound, device, a.tuning).num_splits > 1;
                                });
  out.plan = gla::plan_forward(fp, device, a.tuning);
  const gla::FwdPlan& plan = out.plan;

  c.num_slices = plan.num_slices;
  c.smem = plan.smem;
  c.prep_key_pad = plan.prep_key_pad;
  c.prep_chunks = plan.prep_chunks;
  c.num_splits = plan.num_splits;
  c.chunks_per_split = plan.chunks_per_split;
  c.state_pieces = plan.state_pieces;
  c.split_prefix = plan.states == gla::StatesPass::states_kernel;
  return out;
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

// With normalize, the normaliser's chunk sums follow the op's workspace (256-aligned).
size_t normalizer_offset(size_t op_bytes) { return (op_bytes + 255) / 256 * 256; }
size_t with_normalizer(size_t op_bytes, const GlaForwardArgs& args, size_t normalizer_bytes) {
  return args.normalize ? normalizer_offset(op_bytes) + normalizer_bytes : op_bytes;
}

// GlaPhase (flashgla/gla.h): a summary call's slots after the plan's workspace (256-aligned): the log decay of
// every piece, then the last split's pieces (states, log decays), which no whole call walks.
struct PhaseSlots {
  size_t offset = 0, piece_log_decay = 0, last_piece_states = 0, last_piece_log_decay = 0;  // offsets, floats
  size_t bytes = 0;  // the workspace with them
};
PhaseSlots phase_slots(const gla::FwdPlan& plan, const GlaProblem& p) {
  PhaseSlots s;
  s.offset = (plan.workspace_bytes + 255) / 256 * 256;
  const size_t nh = size_t(p.num_seqs * p.heads), pieces = size_t(plan.state_pieces), K = size_t(p.key_dim);
  s.last_piece_states = nh * size_t(plan.num_splits - 1) * pieces * K;
  s.last_piece_log_decay = s.last_piece_states + nh * pieces * K * size_t(p.value_dim);
  s.bytes = s.offset + (s.last_piece_log_decay + nh * pieces * K) * sizeof(float);
  return s;
}

// The phases apply where the fast kernel's states pass is its own kernel (plan.h's states_kernel), whose grid
// can take the last split's pieces too.
bool phases_apply(const gla::FwdPlan& plan) {
  return plan.kernel == gla::FwdKernel::fast && plan.states == gla::StatesPass::states_kernel &&
         int64_t(plan.num_splits) * plan.state_pieces <= 65535;
}

size_t dense_workspace_bytes(const GlaForwardArgs& args, const GlaProblem& problem) {
  size_t op = 0;
  if (args.algorithm == GlaAlgorithm::chunked && args.q.dtype != DType::f64) {
    DeviceGuard guard(args.q.device.index);
    const gla::FwdPlan plan = plan_chunked(args, problem).plan;
    op = args.phase != GlaPhase::whole && phases_apply(plan) ? phase_slots(plan, problem).bytes : plan.workspace_bytes;
  }
  return with_normalizer(op, args,
                         args.normalize ? gla_normalize_forward_workspace_bytes(normalize_args_of(args), problem) : 0);
}

void forward_dense(const GlaForwardArgs& args, const GlaProblem& problem);
void place_split_slots(gla::ChunkParams& c, const gla::FwdPlan& plan, char* workspace);
void launch_chunked(gla::ChunkParams& c, const gla::FwdPlan& plan, Scratch& workspace, int num_seqs,
                    cudaStream_t stream);

}  // namespace

bool gla_forward_phases_apply(const GlaForwardArgs& args, const GlaProblem& problem) {
  if (args.algorithm != GlaAlgorithm::chunked || args.reverse || args.normalize || pooled_bytes(args, problem) != 0 ||
      args.ssm_state_indices.defined() || (args.q.dtype != DType::bf16 && args.q.dtype != DType::f16))
    return false;
  DeviceGuard guard(args.q.device.index);  // the plan may read device-only boundaries back (planning_longest)
  return phases_apply(plan_chunked(args, problem).plan);
}

size_t gla_forward_workspace_bytes(const GlaForwardArgs& args, const GlaProblem& problem) {
  const size_t pooled = pooled_bytes(args, problem);
  if (pooled == 0) return dense_workspace_bytes(args, problem);
  // A 256-aligned stand-in address: the plan looks at alignment only.
  return pooled + dense_workspace_bytes(with_dense_states(args, problem, reinterpret_cast<char*>(256)), problem);
}

// The backward folds the normaliser in with the scalar chunk kernel (bf16 rows, K and V of 64 or 128, its
// shared memory with the normaliser's tiles), from residuals the fast forward kernel writes.
int64_t gla_normalize_residual_slots(const GlaForwardArgs& args, const GlaProblem& problem) {
  const int K = int(problem.key_dim), V = int(problem.value_dim);
  if (args.q.dtype != DType::bf16 || problem.gate != GateKind::none || pooled_bytes(args, problem) != 0 ||
      !gla::bwd_scalar_chunk_shape(K, V) || args.tuning.bwd_general_layout)  // (the general kernel everywhere)
    return 0;
  if (gla::bwd_scalar_chunk_smem_bytes(K, V, true) > device_props(args.q.device.index).max_smem_per_block) return 0;
  if (!gla::bf16_rows(view_of(args.q), K) || !gla::bf16_rows(view_of(args.k), K) ||
      !gla::bf16_rows(view_of(args.v), V))
    return 0;
  DeviceGuard guard(args.q.device.index);  // the plan may read device-only boundaries back (planning_longest)
  if (plan_chunked(args, problem).plan.kernel != gla::FwdKernel::fast) return 0;
  return norm::chunk_slots(problem.batch, problem.seq_len, problem.num_seqs, args.cu_seqlens.defined()).count;
}

namespace {

// saves_intra (plan.h) for the inputs a forward and its backward share.
template <class Args>
bool saves_intra(const Args& a, const GlaProblem& p) {
  if (a.algorithm != GlaAlgorithm::chunked || a.reverse || p.gate != GateKind::vector || a.g_gamma.defined() ||
      (a.q.dtype != DType::bf16 && a.q.dtype != DType::f16))
    return false;
  const gla::FwdProblem fp = forward_problem(view_of(a.q), view_of(a.k), view_of(a.v), view_of(a.g), {}, p);
  return gla::saves_intra(fp, device_props(a.q.device.index));  // (o's rows are not asked)
}

}  // namespace

bool gla_forward_saves_intra(const GlaForwardArgs& args, const GlaProblem& problem) {
  return !args.normalize && args.phase != GlaPhase::summary && pooled_bytes(args, problem) == 0 &&
         !args.ssm_state_indices.defined() && saves_intra(args, problem);
}

bool gla_backward_reads_intra(const GlaBackwardArgs& args, const GlaProblem& problem) {
  return !args.norm_den.defined() && saves_intra(args, problem);
}

void gla_forward(const GlaForwardArgs& args, const GlaProblem& problem) {
  const size_t pooled = pooled_bytes(args, problem);
  if (pooled == 0) return forward_dense(args, problem);
  // Gather the initial rows, run on dense states, scatter the final ones: one
  // pool may be both the initial and the final state.
  require_compute_dtype(args.q, "q");
  DeviceGuard guard(args.q.device.index);
  const auto stream = static_cast<cudaStream_t>(args.stream);
  Scratch dense(args.workspace, args.workspace_bytes, args.allocate_workspace, pooled, stream,
                "gla_forward_workspace_bytes");
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

// The decode kernel's parameters for [N, T, H, *] inputs and f32 states [P, H, K, V] updated in place
// (state_indices: a pool row per sequence, or none: row n), every sequence of T tokens.
gla::DecodeParams decode_params(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g,
                                const TensorView& o, const TensorView& state, const TensorView& state_indices,
                                const GlaProblem& problem) {
  gla::DecodeParams d;
  d.q = view_of(q), d.k = view_of(k), d.v = view_of(v), d.g = view_of(g), d.o = view_of(o);
  d.state = view_of(state);
  if (state_indices.defined()) {
    d.state_indices = static_cast<const int32_t*>(state_indices.data);
    d.index_stride = state_indices.stride[0];
  }
  d.state_rows = state.shape[0];
  d.heads = int(problem.heads), d.key_dim = int(problem.key_dim), d.value_dim = int(problem.value_dim);
  d.tokens = int(problem.seq_len);
  d.seqs.total_len = problem.seq_len;
  d.gate = problem.gate;
  d.scale = float(problem.scale);
  return d;
}

// vLLM's steps on a state pool through the decode kernel, a pass over the pool rows at the state's bandwidth,
// in place of the recurrent kernel (bench/results_decode.md: 2x faster at N ≥ 64): a fixed-length batch of up
// to kMaxDecodeTokens tokens, or sequences of up to T_max ≤ kMaxDecodeTokens draft tokens each with a row per
// token (ssm_state_indices [N, T_max]; longer ones still run right, token by token, only slower). The same
// recurrence token by token, and the same padded slots (zero outputs, no pool row touched).
bool pool_decode(const GlaForwardArgs& a, const GlaProblem& p) {
  if (!a.ssm_state_indices.defined() || a.reverse || a.normalize || p.key_dim > gla::kDecodeResidentKeys)
    return false;
  const bool per_token = a.ssm_state_indices.ndim == 2;
  const int64_t tokens = per_token && a.cu_seqlens.defined() ? a.ssm_state_indices.shape[1] : p.seq_len;
  return (per_token || !a.cu_seqlens.defined()) && tokens >= 1 && tokens <= kMaxDecodeTokens;
}

void launch_pool_decode(const GlaForwardArgs& a, const GlaProblem& p, cudaStream_t stream) {
  const TensorView& rows = a.ssm_state_indices;
  gla::DecodeParams d = decode_params(a.q, a.k, a.v, a.g, a.o, a.initial_state, rows, p);
  d.seqs = sequences_of(a.cu_seqlens, p.seq_len);
  d.write_back = a.inplace_final_state && rows.ndim == 1;
  if (!a.inplace_final_state) d.token_states = view_of(a.final_state);  // the state after every token, if asked
  d.zero_padded_token_states = false;  // (GlaForwardArgs: a padded slot's rows are not written)
  if (rows.ndim == 2) {
    d.pool_cols = int(rows.shape[1]), d.pool_col_stride = rows.stride[1];
    d.pool_token_rows = a.inplace_final_state;
    if (a.num_accepted_tokens.defined()) {
      d.accepted = static_cast<const int32_t*>(a.num_accepted_tokens.data);
      d.accepted_stride = a.num_accepted_tokens.stride[0];
    }
    if (a.cu_seqlens.defined()) d.tokens = d.pool_cols;
  }
  gla::launch_decode(d, int(p.num_seqs), device_props(a.q.device.index).multiprocessors, stream);
}

void forward_dense(const GlaForwardArgs& args, const GlaProblem& problem) {
  require_compute_dtype(args.q, "q");
  DeviceGuard guard(args.q.device.index);
  const auto stream = static_cast<cudaStream_t>(args.stream);

  if (args.algorithm == GlaAlgorithm::recurrent && pool_decode(args, problem))
    return launch_pool_decode(args, problem, stream);
  if (args.algorithm == GlaAlgorithm::recurrent) {
    gla::RecurrentParams r;
    r.q = view_of(args.q), r.k = view_of(args.k), r.v = view_of(args.v), r.g = view_of(args.g);
    r.o = view_of(args.o), r.h0 = view_of(args.initial_state), r.ht = view_of(args.final_state);
    r.seqs = sequences_of(args.cu_seqlens, problem.seq_len);
    r.heads = int(problem.heads), r.key_dim = int(problem.key_dim), r.value_dim = int(problem.value_dim);
    r.gate = problem.gate;
    r.scale = float(problem.scale);
    r.reverse = args.reverse;
    if (args.ssm_state_indices.defined()) {  // vLLM's state pools (checked in src/api/gla.cpp)
      const TensorView& idx = args.ssm_state_indices;
      r.pool_rows = static_cast<const int32_t*>(idx.data);
      r.pool_row_stride = idx.stride[0];
      if (idx.ndim == 2) r.pool_cols = int(idx.shape[1]), r.pool_col_stride = idx.stride[1];
      if (args.num_accepted_tokens.defined()) {
        r.accepted = static_cast<const int32_t*>(args.num_accepted_tokens.data);
        r.accepted_stride = args.num_accepted_tokens.stride[0];
      }
      r.pool_size = args.initial_state.shape[0];
      r.inplace = args.inplace_final_state;
    }
    gla::launch_recurrent_forward(r, int(problem.num_seqs), stream);
    if (args.normalize) {
      GlaNormalizeArgs n = normalize_args_of(args);
      n.workspace = args.workspace, n.workspace_bytes = args.workspace_bytes;
      gla_normalize_forward(n, problem);
    }
    return;
  }

  ChunkPlan planned = plan_chunked(args, problem);
  gla::ChunkParams& c = planned.params;
  const gla::FwdPlan& plan = planned.plan;
  const int num_seqs = planned.num_seqs;
  if (args.intra.defined()) {  // checked in src/api/gla.cpp: gla_forward_saves_intra
    FLASHGLA_REQUIRE(plan.kernel != gla::FwdKernel::general, ErrorKind::unsupported, "o",
                     "with intra, o must be whole 16-byte aligned rows (the kernels that write intra need them)");
    c.intra = view_of(args.intra);
  }
  if (args.phase != GlaPhase::whole) {  // checked in src/api/gla.cpp: phases_apply(plan), a workspace given
    FLASHGLA_REQUIRE(phases_apply(plan), ErrorKind::unsupported, "phase",
                     "this call's plan has no separate states pass (gla_forward_phases_apply)");
    const PhaseSlots slots = phase_slots(plan, problem);
    Scratch workspace(args.workspace, args.workspace_bytes, {}, slots.bytes, stream, "gla_forward_workspace_bytes");
    place_split_slots(c, plan, workspace.bytes());
    if (args.phase == GlaPhase::output) return gla::launch_fast_chunk_forward(c, num_seqs, stream);
    float* extra = reinterpret_cast<float*>(workspace.bytes() + slots.offset);
    c.piece_log_decay = extra + slots.piece_log_decay;
    c.last_piece_states = extra + slots.last_piece_states;
    c.last_piece_log_decay = extra + slots.last_piece_log_decay;
    c.summary = view_of(args.summary);
    return gla::launch_split_states(c, num_seqs, stream);
  }
  // normalize: the fast kernel divides by the normaliser, carrying z itself (with a sequence split, from the
  // normaliser's key pass: z at each chunk's start); the other kernels store o, which the normaliser then
  // divides in place.
  GlaNormalizeArgs normalizer = normalize_args_of(args);
  const size_t normalizer_bytes = args.normalize ? gla_normalize_forward_workspace_bytes(normalizer, problem) : 0;
  Scratch workspace(args.workspace, args.workspace_bytes, args.allocate_workspace,
                    with_normalizer(plan.workspace_bytes, args, normalizer_bytes), stream,
                    "gla_forward_workspace_bytes");
  if (args.normalize) {
    normalizer.workspace = workspace.bytes() + normalizer_offset(plan.workspace_bytes);
    normalizer.workspace_bytes = normalizer_bytes;
  }
  const bool fold_normalizer = args.normalize && plan.kernel == gla::FwdKernel::fast;
  if (fold_normalizer) {
    c.normalize = true;
    c.norm_slots = norm::chunk_slots(problem.batch, problem.seq_len, problem.num_seqs, args.cu_seqlens.defined());
    if (plan.num_splits > 1) {
      float* z_starts = static_cast<float*>(normalizer.workspace);
      gla_normalize_key_prefix(normalizer, problem, z_starts);
      c.norm_z = z_starts;
    } else {
      c.z_init = view_of(args.z_init), c.z_final = view_of(args.z_final);
    }
    c.norm_den = view_of(args.norm_den);  // set only where gla_normalize_residual_slots > 0 (src/api/gla.cpp)
    c.norm_chunk_z = static_cast<float*>(args.norm_chunk_z.data);
  }
  launch_chunked(c, plan, workspace, num_seqs, stream);
  if (args.normalize && !fold_normalizer) gla_normalize_forward(normalizer, problem);
}

// The split slots at the start of the workspace, in plan.h's order.
void place_split_slots(gla::ChunkParams& c, const gla::FwdPlan& plan, char* workspace) {
  if (plan.states != gla::StatesPass::none) {  // num_splits > 1: the states of the earlier splits first
    c.split_states = reinterpret_cast<float*>(workspace);
    c.split_decay = c.split_states + plan.split_states_floats;
  }
  if (plan.states == gla::StatesPass::states_kernel) {
    c.piece_states = c.split_states + plan.split_floats;
    c.piece_decay = c.piece_states + plan.piece_states_floats;
  }
}

void launch_chunked(gla::ChunkParams& c, const gla::FwdPlan& plan, Scratch& workspace, int num_seqs,
                    cudaStream_t stream) {
  place_split_slots(c, plan, workspace.bytes());
  // Each kernel's launches in order: the Hopper chunk pass, the states pass (the states kernel, or the output
  // kernel's own with states_only), the output pass.
  switch (plan.kernel) {
    case gla::FwdKernel::general:
      if (plan.states == gla::StatesPass::in_kernel) {
        c.states_only = true;
        gla::launch_chunk_forward(c, num_seqs, stream);
        c.states_only = false;
      }
      return gla::launch_chunk_forward(c, num_seqs, stream);
    case gla::FwdKernel::fast:
      if (plan.states == gla::StatesPass::states_kernel) gla::launch_split_states(c, num_seqs, stream);
      return gla::launch_fast_chunk_forward(c, num_seqs, stream);
    case gla::FwdKernel::hopper: {
      const auto start = reinterpret_cast<uintptr_t>(workspace.bytes() + plan.prep_offset);
      c.prep = reinterpret_cast<unsigned char*>((start + 1023) & ~uintptr_t(1023));
      gla::launch_hopper_prep(c, num_seqs, plan.prep_grid_chunks, stream);
      if (plan.states == gla::StatesPass::in_kernel) {
        c.states_only = true;
        gla::launch_hopper_chunk_forward(c, num_seqs, plan.hopper_pdl, stream);
        c.states_only = false;
      }
      return gla::launch_hopper_chunk_forward(c, num_seqs, plan.hopper_pdl, stream);
    }
  }
}

}  // namespace

void gla_decode(const GlaDecodeArgs& args, const GlaProblem& problem) {
  require_compute_dtype(args.q, "q");
  DeviceGuard guard(args.q.device.index);
  gla::DecodeParams d =
      decode_params(args.q, args.k, args.v, args.g, args.o, args.state, args.state_indices, problem);
  d.token_states = view_of(args.token_states);
  gla::launch_decode(d, int(problem.num_seqs), device_props(args.q.device.index).multiprocessors,
                     static_cast<cudaStream_t>(args.stream));
}

}  // namespace flashgla::cuda
