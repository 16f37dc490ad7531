// CUDA GLA backward: checks what this backend supports, plans the scratch and
// launches the kernels of gla_bwd_states.cu + gla_bwd_chunk.cu (chunked) or
// gla_bwd_recurrent.cu (recurrent). See gla_bwd.cuh for the algorithm.
#include <algorithm>
#include <string>

#include "core/backend.h"
#include "cuda/common/host.cuh"
#include "cuda/gla/gla_bwd.cuh"

namespace flashgla::cuda {
namespace {

using gla_bwd::Compute;
using gla_bwd::Params;

constexpr size_t kAlign = 256;
size_t aligned(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

Compute compute_type(const GlaBackwardArgs& a) {
  switch (a.q.dtype) {
    case DType::f32: return Compute::f32;
    case DType::bf16:
    case DType::f16: return Compute::bf16;
    default:
      check::fail(ErrorKind::unsupported, "q",
                  std::string("the CUDA GLA backward takes float32, bfloat16 or float16, got ") +
                      dtype_name(a.q.dtype));
  }
}

int64_t num_slots(const GlaProblem& pr) {
  const int64_t C = gla_bwd::kChunk;
  return pr.varlen ? pr.seq_len / C + pr.num_seqs + 1 : pr.batch * ((pr.seq_len + C - 1) / C);
}

gla_bwd::Tensor tensor(const TensorView& t) {
  gla_bwd::Tensor out;
  if (!t.defined()) return out;
  out.data = t.data;
  out.dtype = t.dtype;
  for (int d = 0; d < t.ndim; ++d) out.stride[d] = t.stride[d];
  return out;
}

// Two pipelined scan blocks (105 KB each) per SM, as the launch bounds assume:
// Hopper (228 KB per SM) yes, an A100 (164 KB) no.
bool two_pipelined_scans_per_sm(int device) {
  int per_sm = 0;
  check_cuda(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device),
             "cudaDeviceGetAttribute");
  constexpr size_t kReservedPerBlock = 1024;  // shared memory the system keeps per block (sm_80 and later)
  return size_t(per_sm) >= 2 * (gla_bwd::state_scan_pipelined_smem_bytes() + kReservedPerBlock);
}

// FLASHGLA_GLA_BWD_SCAN_PIPELINE: 0 no pipeline, 1 the first pipelined variant, lean (the default) the other.
constexpr std::initializer_list<const char*> kPipelineChoices = {"0", "1", "lean"};

// Whether the state scans run paired (two value tiles per block: V / 64 even;
// FLASHGLA_GLA_BWD_SCAN_PAIR=0 turns pairs off) and pipelined (x, y and a
// vector gate copied a chunk ahead, which needs every tile in whole bf16 rows,
// no converting fallback; FLASHGLA_GLA_BWD_SCAN_PIPELINE=0 turns it off).
bool paired_scans(const GlaProblem& pr) {
  const int64_t value_tiles = (pr.value_dim + gla_bwd::kTile - 1) / gla_bwd::kTile;
  return env_choice("FLASHGLA_GLA_BWD_SCAN_PAIR", {"0", "1"}) != "0" && value_tiles % 2 == 0;
}

bool pipelined_scans(const GlaBackwardArgs& a, const GlaProblem& pr) {
  using gla_bwd::bf16_rows;
  const int K = int(pr.key_dim), V = int(pr.value_dim);
  return a.algorithm == GlaAlgorithm::chunked && paired_scans(pr) &&
         env_choice("FLASHGLA_GLA_BWD_SCAN_PIPELINE", kPipelineChoices) != "0" && bf16_rows(tensor(a.q), K) &&
         bf16_rows(tensor(a.k), K) && bf16_rows(tensor(a.v), V) && bf16_rows(tensor(a.d_o), V) &&
         (pr.gate != GateKind::vector || bf16_rows(tensor(a.g), K)) && two_pipelined_scans_per_sm(a.q.device.index);
}

// Sequence split of the state scans (gla_bwd_states.cu): chunks per piece, 0
// for none. Fixed-length inputs are split when the blocks of both scans fill
// at most half of the GPU's resident slots, into as many pieces as fit in one
// wave, of at least kMinChunksPerSplit chunks (each piece costs a fold step).
// Pipelined scans only where they fill at most a quarter of the slots: at half
// of the slots the unsplit pipelined scans beat the split scans plus their fold
// (bench/notes_gla_bwd.md, "Moved from source comments").
// FLASHGLA_GLA_BWD_SCAN_SPLIT=0 turns the split off; =N forces pieces of N chunks.
constexpr int64_t kMinChunksPerSplit = 8;

int64_t scan_chunks_per_split(const GlaBackwardArgs& a, const GlaProblem& pr) {
  if (a.algorithm != GlaAlgorithm::chunked || pr.varlen || pr.num_seqs * pr.heads == 0) return 0;
  const int64_t chunks = (pr.seq_len + gla_bwd::kChunk - 1) / gla_bwd::kChunk;
  const int64_t tiles = ((pr.key_dim + gla_bwd::kTile - 1) / gla_bwd::kTile) *
                        ((pr.value_dim + gla_bwd::kTile - 1) / gla_bwd::kTile);
  int64_t per_split = 0;
  // FLASHGLA_GLA_BWD_SCAN_SPLIT=<chunks per piece> forces the split (0: none).
  if (const int64_t forced = env_count("FLASHGLA_GLA_BWD_SCAN_SPLIT", -1, 0); forced >= 0) {
    per_split = forced;
  } else {
    int sms = 0;
    check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, a.q.device.index),
               "cudaDeviceGetAttribute");
    const int64_t resident = int64_t(sms) * gla_bwd::state_scan_blocks_per_sm(compute_type(a));
    const int64_t blocks = 2 * pr.num_seqs * pr.heads * tiles;
    const int64_t min_slots_per_block = pipelined_scans(a, pr) ? 4 : 2;
    const int64_t splits = std::min(resident / blocks, chunks / kMinChunksPerSplit);
    if (resident / blocks >= min_slots_per_block && splits >= 2) per_split = (chunks + splits - 1) / splits;
  }
  if (per_split <= 0 || per_split >= chunks) return 0;
  const int64_t max_splits = 65535 / tiles;  // pieces x tiles is the scan's grid.y
  if ((chunks + per_split - 1) / per_split > max_splits) per_split = (chunks + max_splits - 1) / max_splits;
  return per_split;
}

// Scratch sizes, in the order they are laid out.
struct Plan {
  size_t states = 0, dstates = 0;                  // chunked
  int64_t chunks_per_split = 0, scan_splits = 1;   // chunked, sequence split of the scans
  size_t split_summaries = 0, chunk_decays = 0;
  size_t dq_acc = 0, dk_acc = 0, dg_suffix_terms = 0, dg_prefix_terms = 0, dg_final = 0;  // recurrent
  size_t total() const {
    return aligned(states) + aligned(dstates) + aligned(split_summaries) + aligned(chunk_decays) + aligned(dq_acc) +
           aligned(dk_acc) + aligned(dg_suffix_terms) + aligned(dg_prefix_terms) + aligned(dg_final);
  }
};

Plan plan(const GlaBackwardArgs& a, const GlaProblem& pr) {
  Plan plan;
  if (a.algorithm == GlaAlgorithm::chunked) {
    const int64_t tiles = ((pr.key_dim + gla_bwd::kTile - 1) / gla_bwd::kTile) *
                          ((pr.value_dim + gla_bwd::kTile - 1) / gla_bwd::kTile);
    const size_t elem = compute_type(a) == Compute::f32 ? 4 : 2;
    plan.states = plan.dstates = size_t(num_slots(pr) * pr.heads * tiles) * gla_bwd::kTileElems * elem;
    plan.chunks_per_split = scan_chunks_per_split(a, pr);
    if (plan.chunks_per_split > 0) {
      const int64_t chunks = (pr.seq_len + gla_bwd::kChunk - 1) / gla_bwd::kChunk;
      const int64_t key_tiles = (pr.key_dim + gla_bwd::kTile - 1) / gla_bwd::kTile;
      plan.scan_splits = (chunks + plan.chunks_per_split - 1) / plan.chunks_per_split;
      plan.split_summaries =
          size_t(2 * pr.num_seqs * pr.heads * plan.scan_splits * tiles) * gla_bwd::kSummaryFloats * sizeof(float);
      plan.chunk_decays = size_t(2 * num_slots(pr) * pr.heads * key_tiles * gla_bwd::kTile) * sizeof(float);
    }
  } else {
    plan.dq_acc = plan.dk_acc = plan.dg_suffix_terms = plan.dg_prefix_terms =
        size_t(pr.batch * pr.seq_len * pr.heads * pr.key_dim) * sizeof(float);
    plan.dg_final = size_t(pr.num_seqs * pr.heads * pr.key_dim) * sizeof(float);
  }
  return plan;
}


void check_supported(const GlaBackwardArgs& a, const GlaProblem& pr) {
  compute_type(a);
  FLASHGLA_REQUIRE(pr.heads <= 65535, ErrorKind::unsupported, "q", "the CUDA GLA backward takes at most 65535 heads");
  FLASHGLA_REQUIRE(pr.num_seqs * pr.heads < (int64_t(1) << 31), ErrorKind::unsupported, "q",
                 "too many sequences x heads for one launch");
  if (a.algorithm == GlaAlgorithm::recurrent)
    FLASHGLA_REQUIRE(pr.key_dim <= gla_bwd::kRecurrentMaxThreads, ErrorKind::unsupported, "q",
                   "the CUDA recurrent GLA backward takes K <= 512, got K = " + std::to_string(pr.key_dim));
}

}  // namespace

size_t gla_backward_workspace_bytes(const GlaBackwardArgs& a, const GlaProblem& pr) {
  check_supported(a, pr);
  return plan(a, pr).total();
}

void gla_backward(const GlaBackwardArgs& a, const GlaProblem& pr) {
  check_supported(a, pr);
  DeviceGuard guard(a.q.device.index);
  const cudaStream_t stream = static_cast<cudaStream_t>(a.stream);
  if (pr.num_seqs == 0) return;

  Params p;
  p.q = tensor(a.q), p.k = tensor(a.k), p.v = tensor(a.v), p.g = tensor(a.g), p.d_o = tensor(a.d_o);
  p.h0 = tensor(a.initial_state), p.dht = tensor(a.d_final_state);
  p.dq = tensor(a.dq), p.dk = tensor(a.dk), p.dv = tensor(a.dv), p.dg = tensor(a.dg);
  p.dh0 = tensor(a.d_initial_state);
  p.gate = pr.gate;
  if (pr.varlen) {
    p.cu_seqlens = a.cu_seqlens.data;
    p.cu_seqlens_i64 = a.cu_seqlens.dtype == DType::i64;
    p.cu_seqlens_stride = a.cu_seqlens.stride[0];
  }
  p.batch = pr.batch, p.seq_len = pr.seq_len, p.num_seqs = pr.num_seqs;
  p.heads = int(pr.heads), p.key_dim = int(pr.key_dim), p.value_dim = int(pr.value_dim);
  p.key_tiles = int((pr.key_dim + gla_bwd::kTile - 1) / gla_bwd::kTile);
  p.value_tiles = int((pr.value_dim + gla_bwd::kTile - 1) / gla_bwd::kTile);
  p.scale = float(pr.scale);
  p.reverse = a.reverse;
  p.chunks_per_seq = (pr.seq_len + gla_bwd::kChunk - 1) / gla_bwd::kChunk;
  // A's pairs inside a sub-chunk go through the products where the gates
  // allow (see mark_wide_subchunks in gla_bwd_chunk.cu);
  // FLASHGLA_GLA_BWD_DIAG=elementwise sums them element by element everywhere.
  p.diag_factor_limit = env_choice("FLASHGLA_GLA_BWD_DIAG", {"factored", "elementwise"}) == "elementwise"
                            ? -1.f
                            : gla_bwd::kDiagFactorLimit;
  // FLASHGLA_GLA_BWD_LAYOUT=general: the chunk kernel's general instantiation
  // even for plain bf16 rows.
  p.general_layout = env_choice("FLASHGLA_GLA_BWD_LAYOUT", {"general"}) == "general";
  // FLASHGLA_GLA_BWD_GATE=registers: that one loads a vector gate into registers (=async: the default copies).
  p.gate_in_registers = env_choice("FLASHGLA_GLA_BWD_GATE", {"async", "registers"}) == "registers";
  p.scan_pairs = paired_scans(pr);
  // The pipelined scans' variant with fewer instructions per step (2, "lean")
  // is the default: same tests, never slower where measured (bench/notes_gla_bwd.md);
  // FLASHGLA_GLA_BWD_SCAN_PIPELINE=1 selects the first variant.
  p.scan_pipeline = !pipelined_scans(a, pr)                                                 ? 0
                    : env_choice("FLASHGLA_GLA_BWD_SCAN_PIPELINE", kPipelineChoices) == "1" ? 1
                                                                                            : 2;
  p.num_slots = num_slots(pr);

  const Plan sizes = plan(a, pr);
  Scratch scratch(a.workspace, a.workspace_bytes, sizes.total(), stream, "gla_backward_workspace_bytes", "workspace",
                  kAlign);
  char* cursor = scratch.bytes();
  auto take = [&](size_t bytes) {
    char* at = cursor;
    cursor += aligned(bytes);
    return at;
  };

  if (a.algorithm == GlaAlgorithm::chunked) {
    const Compute c = compute_type(a);
    int device_smem = 0;
    check_cuda(cudaDeviceGetAttribute(&device_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, a.q.device.index),
               "cudaDeviceGetAttribute");
    FLASHGLA_REQUIRE(size_t(device_smem) >= gla_bwd::chunk_smem_bytes(c), ErrorKind::unsupported, "q",
                   "this GPU has too little shared memory per block for the chunked GLA backward in " +
                       std::string(dtype_name(a.q.dtype)));
    p.states = take(sizes.states);
    p.dstates = take(sizes.dstates);
    p.scan_splits = sizes.scan_splits;
    p.chunks_per_split = sizes.chunks_per_split;
    p.split_summaries = reinterpret_cast<float*>(take(sizes.split_summaries));
    p.chunk_decays = reinterpret_cast<float*>(take(sizes.chunk_decays));
    gla_bwd::launch_state_scan(p, c, stream);  // also writes dh0
    // On sm_90+ the chunk kernel starts as the scans' blocks retire, when it
    // follows the scans themselves (not a fold; faster: bench/notes_gla_bwd.md). Only
    // where the loaded code has griddepcontrol (compiled for sm_90 or newer),
    // without which the chunk kernel would not wait for the scans.
    // FLASHGLA_GLA_BWD_OVERLAP=0 turns that off, =1 on after a fold too.
    const std::string overlap_mode = env_choice("FLASHGLA_GLA_BWD_OVERLAP", {"0", "1"});
    const bool overlap = loaded_code().sm90 && (overlap_mode.empty() ? p.scan_splits == 1 : overlap_mode == "1");
    if (p.num_slots > 0 && pr.seq_len > 0) gla_bwd::launch_chunk(p, c, overlap, stream);
  } else {
    p.dq_acc = reinterpret_cast<float*>(take(sizes.dq_acc));
    p.dk_acc = reinterpret_cast<float*>(take(sizes.dk_acc));
    p.dg_suffix_terms = reinterpret_cast<float*>(take(sizes.dg_suffix_terms));
    p.dg_prefix_terms = reinterpret_cast<float*>(take(sizes.dg_prefix_terms));
    p.dg_final = reinterpret_cast<float*>(take(sizes.dg_final));
    check_cuda(cudaMemsetAsync(scratch.bytes(), 0, sizes.total(), stream), "cudaMemsetAsync (GLA backward scratch)");
    gla_bwd::launch_recurrent(p, stream);
  }
}

}  // namespace flashgla::cuda
