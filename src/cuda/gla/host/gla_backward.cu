// CUDA GLA backward: checks what this backend supports, asks the planner (plan.h)
// for the choices and the scratch layout and launches the kernels of gla_bwd_states.cu + gla_bwd_chunk.cu (chunked) or
// gla_bwd_recurrent.cu (recurrent). See gla_bwd.cuh for the algorithm.
#include <algorithm>
#include <string>

#include "core/backend.h"
#include "core/gla_options_backend.h"
#include "cuda/common/host.cuh"
#include "cuda/gla/device/gla_bwd.cuh"
#include "cuda/gla/host/gla_host.cuh"
#include "cuda/gla/plan/normalize_layout.h"
#include "cuda/gla/plan/plan.h"

namespace flashgla::cuda {
namespace {

using gla::Compute;
using gla::BwdParams;

Compute compute_type(const GlaBackwardArgs& a) {
  switch (a.q.dtype) {
    case DType::f32: return Compute::f32;
    case DType::bf16: return Compute::bf16;
    case DType::f16: return Compute::f16;
    default:
      check::fail(ErrorKind::unsupported, "q",
                  std::string("the CUDA GLA backward takes float32, bfloat16 or float16, got ") +
                      dtype_name(a.q.dtype));
  }
}

// The planner's view of the call (plan.h).
gla::BwdProblem bwd_problem(const GlaBackwardArgs& a, const GlaProblem& pr) {
  using gla::bf16_rows;
  gla::BwdProblem b;
  b.chunked = a.algorithm == GlaAlgorithm::chunked;
  const Compute c = compute_type(a);
  b.compute = c == Compute::f32 ? gla::Elem::f32 : (c == Compute::f16 ? gla::Elem::f16 : gla::Elem::bf16);
  b.varlen = pr.varlen;
  b.batch = pr.batch, b.seq_len = pr.seq_len, b.num_seqs = pr.num_seqs;
  b.heads = int(pr.heads), b.key_dim = int(pr.key_dim), b.value_dim = int(pr.value_dim);
  b.gate = pr.gate;
  gla::View gate, gamma;
  gamma_gate(a.g, a.g_gamma, gate, gamma);
  b.gate_dtype = gate.dtype;
  b.gamma_grad = a.d_g_gamma.defined();
  const int K = int(pr.key_dim), V = int(pr.value_dim);
  const bool vector_gate = pr.gate == GateKind::vector;
  b.q_bf16_rows = bf16_rows(view_of(a.q), K), b.k_bf16_rows = bf16_rows(view_of(a.k), K);
  b.v_bf16_rows = bf16_rows(view_of(a.v), V), b.do_bf16_rows = bf16_rows(view_of(a.d_o), V);
  b.g_bf16_rows = vector_gate && bf16_rows(view_of(a.g), K);
  b.dq_bf16_rows = bf16_rows(view_of(a.dq), K), b.dk_bf16_rows = bf16_rows(view_of(a.dk), K);
  b.dv_bf16_rows = bf16_rows(view_of(a.dv), V);
  b.dg_bf16_rows = vector_gate && bf16_rows(view_of(a.dg), K);
  b.g_f32_rows = vector_gate && f32_rows(view_of(a.g), K);
  b.dg_f32_rows = vector_gate && f32_rows(view_of(a.dg), K);
  b.normalize = a.norm_den.defined();
  b.phased = a.phase != GlaPhase::whole;
  if (pr.varlen) {
    const gla::DeviceProps& device = device_props(a.q.device.index);
    b.longest = planning_longest(pr, a.cu_seqlens, a.cu_seqlens_host, static_cast<cudaStream_t>(a.stream),
                                 [&](int64_t longest) {
                                   gla::BwdProblem bound = b;
                                   bound.longest = longest;
                                   return gla::plan_backward(bound, device, a.tuning).chunks_per_split > 0;
                                 });
  }
  return b;
}

gla::BwdPlan plan(const GlaBackwardArgs& a, const GlaProblem& pr) {
  return gla::plan_backward(bwd_problem(a, pr), device_props(a.q.device.index), a.tuning);
}

void check_supported(const GlaBackwardArgs& a, const GlaProblem& pr) {
  compute_type(a);
  FLASHGLA_REQUIRE(pr.heads <= 65535, ErrorKind::unsupported, "q", "the CUDA GLA backward takes at most 65535 heads");
  FLASHGLA_REQUIRE(pr.num_seqs * pr.heads < (int64_t(1) << 31), ErrorKind::unsupported, "q",
                 "too many sequences x heads for one launch");
  if (a.algorithm == GlaAlgorithm::recurrent)
    FLASHGLA_REQUIRE(pr.key_dim <= gla::kRecurrentMaxThreads, ErrorKind::unsupported, "q",
                   "the CUDA recurrent GLA backward takes K <= 512, got K = " + std::to_string(pr.key_dim));
}

// The state scans' fold (gla_bwd_states.cu) takes dht after the scans, with or without a split.
bool phases_apply(const GlaBackwardArgs& a) {
  return a.algorithm == GlaAlgorithm::chunked && !a.reverse && !a.norm_den.defined();
}

}  // namespace

bool gla_backward_phases_apply(const GlaBackwardArgs& a, const GlaProblem& pr) {
  if (a.algorithm != GlaAlgorithm::chunked || a.q.dtype == DType::f64) return false;
  check_supported(a, pr);
  return phases_apply(a);
}

size_t gla_backward_workspace_bytes(const GlaBackwardArgs& a, const GlaProblem& pr) {
  check_supported(a, pr);
  DeviceGuard guard(a.q.device.index);  // the plan may read device-only boundaries back (planning_longest)
  return plan(a, pr).total();
}

void gla_backward(const GlaBackwardArgs& a, const GlaProblem& pr) {
  check_supported(a, pr);
  DeviceGuard guard(a.q.device.index);
  const cudaStream_t stream = static_cast<cudaStream_t>(a.stream);
  if (pr.num_seqs == 0) return;

  BwdParams p;
  p.q = view_of(a.q), p.k = view_of(a.k), p.v = view_of(a.v), p.d_o = view_of(a.d_o);
  gamma_gate(a.g, a.g_gamma, p.g, p.g_gamma);  // chunked only (the API materialises g + g_gamma for recurrent)
  p.h0 = view_of(a.initial_state), p.dht = view_of(a.d_final_state);
  p.dq = view_of(a.dq), p.dk = view_of(a.dk), p.dv = view_of(a.dv), p.dg = view_of(a.dg);
  p.dh0 = view_of(a.d_initial_state);
  p.gate = pr.gate;
  p.seqs = sequences_of(a.cu_seqlens, pr.seq_len);  // varlen exactly when cu_seqlens is given
  p.num_seqs = pr.num_seqs;
  p.heads = int(pr.heads), p.key_dim = int(pr.key_dim), p.value_dim = int(pr.value_dim);
  p.key_tiles = int((pr.key_dim + gla::kTile - 1) / gla::kTile);
  p.value_tiles = int((pr.value_dim + gla::kTile - 1) / gla::kTile);
  p.scale = float(pr.scale);
  p.reverse = a.reverse;
  p.chunks_per_seq = (pr.seq_len + gla::kChunk - 1) / gla::kChunk;
  if (a.algorithm == GlaAlgorithm::chunked) {  // before any scratch is asked for
    const int device_smem = device_props(a.q.device.index).max_smem_per_block;
    FLASHGLA_REQUIRE(size_t(device_smem) >= gla::bwd_chunk_smem_bytes(compute_type(a)), ErrorKind::unsupported,
                     "q", "this GPU has too little shared memory per block for the chunked GLA backward in " +
                              std::string(dtype_name(a.q.dtype)));
  }
  const gla::BwdPlan sizes = plan(a, pr);  // the choices below and the scratch layout (plan.cpp says why)
  // The forward's A: src/api/gla.cpp keeps it only where gla_backward_reads_intra (chunked, bf16 or fp16, a vector
  // gate: the chunk kernels that read it).
  p.intra = view_of(a.intra);
  p.diag_factor_limit = sizes.diag_factor_limit;
  p.num_slots = sizes.num_slots;
  bool overlap = sizes.overlap;
  if (a.phase != GlaPhase::whole) {  // checked in src/api/gla.cpp: phases_apply, a workspace given
    p.phased = true;
    if (a.phase == GlaPhase::summary) {  // from a zero dht: dh0 is the summary (the split's fold, else the scan)
      p.dht = {}, p.dh0 = {};
      (sizes.scan_splits > 1 ? p.summary : p.dh0) = view_of(a.summary);
    }
    p.dht_in_fold = a.phase == GlaPhase::output && a.d_final_state.defined();  // else the scan's zero start stands
    // The chunk kernel overlaps the kernel before it: the scans' fold, or none to wait for.
    if (a.phase == GlaPhase::output && sizes.scan_splits == 1 && !p.dht_in_fold) overlap = false;
  }

  Scratch scratch(a.workspace, a.workspace_bytes, a.allocate_workspace, sizes.total(), stream,
                  "gla_backward_workspace_bytes", "workspace", gla::BwdPlan::kAlign);
  char* cursor = scratch.bytes();
  auto take = [&](size_t bytes) {
    char* at = cursor;
    cursor += gla::BwdPlan::aligned(bytes);
    return at;
  };

  if (a.algorithm == GlaAlgorithm::chunked) {
    const Compute c = compute_type(a);
    p.states = take(sizes.states);
    p.dstates = take(sizes.dstates);
    p.scan_splits = sizes.scan_splits;
    p.chunks_per_split = sizes.chunks_per_split;
    p.split_summaries = reinterpret_cast<float*>(take(sizes.split_summaries));
    p.chunk_decays = reinterpret_cast<float*>(take(sizes.chunk_decays));
    if (a.d_g_gamma.defined()) {  // the plan sized it (gamma_grad)
      p.gamma_chunk_sums = reinterpret_cast<float*>(take(sizes.gamma_chunk_sums));
      check_cuda(cudaMemsetAsync(p.gamma_chunk_sums, 0, sizes.gamma_chunk_sums, stream),
                 "cudaMemsetAsync (g_gamma's chunk sums)");
    }
    if (a.norm_den.defined()) {  // the folded normaliser (checked in src/api/gla.cpp)
      FLASHGLA_REQUIRE(sizes.chunk_kernel == gla::BwdChunkKernel::scalar, ErrorKind::unsupported, "norm_den",
                       "the folded normaliser needs the scalar chunk kernel (bf16 rows, K and V of 64 or 128): "
                       "pass the residuals only where gla_normalize_residual_slots is > 0");
      FLASHGLA_REQUIRE(gla::bf16_rows(view_of(a.norm_o), int(pr.value_dim)), ErrorKind::value, "norm_o",
                       "expected whole 16-byte aligned bf16 rows (the forward's o as it came out)");
      const int64_t slots = norm::chunk_slots(pr.batch, pr.seq_len, pr.num_seqs, pr.varlen).count;
      FLASHGLA_REQUIRE(a.norm_chunk_z.shape[0] == slots, ErrorKind::value, "norm_chunk_z",
                       "expected [S, H, K] with S = " + std::to_string(slots) + " (the forward's), got " +
                           a.norm_chunk_z.shape_str());
      p.norm_o = view_of(a.norm_o), p.norm_den = view_of(a.norm_den);
      p.norm_chunk_z = static_cast<const float*>(a.norm_chunk_z.data);
      p.d_z_final = view_of(a.d_z_final), p.d_z_init = view_of(a.d_z_init);
      if (sizes.norm_chain) {
        p.norm_carries = reinterpret_cast<unsigned long long*>(take(sizes.norm_key_grads));
        check_cuda(cudaMemsetAsync(p.norm_carries, 0, sizes.norm_key_grads, stream),
                   "cudaMemsetAsync (the normaliser's carries)");
      } else {
        p.norm_key_grads = reinterpret_cast<float*>(take(sizes.norm_key_grads));  // every chunk's slot written
      }
    }
    gla::launch_bwd_state_scan(p, c, sizes.scans, a.phase, stream);  // also writes dh0
    if (a.phase == GlaPhase::summary) return;
    if (p.num_slots > 0 && pr.seq_len > 0) gla::launch_bwd_chunk(p, sizes.chunk_kernel, overlap, stream);
    if (a.norm_den.defined() && !p.norm_carries) gla::launch_bwd_norm_keys(p, stream);
    if (a.d_g_gamma.defined()) {  // d_g_gamma[h]: the chunk sums added over the slots, in a fixed order
      const TensorView sums =
          TensorView::contiguous(p.gamma_chunk_sums, DType::f32, {1, p.num_slots, pr.heads}, a.q.device);
      gla_gamma_grad(GammaGradArgs{sums, TensorView{}, a.d_g_gamma, a.stream});
    }
  } else {
    p.dq_acc = reinterpret_cast<float*>(take(sizes.dq_acc));
    p.dk_acc = reinterpret_cast<float*>(take(sizes.dk_acc));
    p.dg_suffix_terms = reinterpret_cast<float*>(take(sizes.dg_suffix_terms));
    p.dg_prefix_terms = reinterpret_cast<float*>(take(sizes.dg_prefix_terms));
    p.dg_final = reinterpret_cast<float*>(take(sizes.dg_final));
    check_cuda(cudaMemsetAsync(scratch.bytes(), 0, sizes.total(), stream), "cudaMemsetAsync (GLA backward scratch)");
    gla::launch_bwd_recurrent(p, stream);
  }
}

}  // namespace flashgla::cuda
