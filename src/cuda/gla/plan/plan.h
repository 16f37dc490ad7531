// The GLA CUDA planner: what the host code of the chunked forward (gla_forward.cu, the Hopper path's
// launches), the backward (gla_backward.cu) and the segment summaries (gla_segment.cu) decide before a launch —
// which kernel, the sequence split, pieces, launch options and the workspace layout — as pure functions of the
// problem, the device's properties and the call's tuning
// (flashgla/tuning.h). Plain C++ (built without CUDA too), so that the
// decisions are unit-tested on the CPU (tests/test_gla_plan.cpp); the CUDA files fill the inputs (the device
// queried once per device, see device_props in cuda/gla/host/gla_host.cuh) and follow the plan.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "cuda/gla/plan/layouts.h"
#include "flashgla/tuning.h"

namespace flashgla::cuda::gla {

// ---- device -------------------------------------------------------------------------
struct DeviceProps {
  int multiprocessors = 0;
  int max_smem_per_block = 0;  // opt-in maximum of dynamic shared memory per block, bytes
  int smem_per_sm = 0;         // shared memory per multiprocessor, bytes
  // Which machine code of this build the device runs (see LoadedCode in cuda/common/host.cuh): griddepcontrol
  // and bf16 reductions (sm90), wgmma and the Hopper kernels (sm90a).
  bool sm90 = false, sm90a = false;
  // Resident CTAs per SM of the general chunk kernel for an input dtype and its dynamic shared memory: an
  // occupancy query (it depends on the compiled kernel's registers); asked only where the plan needs it.
  std::function<int(Elem input, int smem_bytes)> general_blocks_per_sm;
};

// ---- forward (chunked) --------------------------------------------------------------
struct FwdProblem {
  Elem input = Elem::bf16, gate_dtype = Elem::bf16;
  Gate gate = Gate::vector;
  int heads = 0, key_dim = 0, value_dim = 0;
  int64_t num_seqs = 0;
  int64_t seq_len = 0;   // T (of the packed batch when varlen)
  bool varlen = false;
  int64_t longest = 0;   // tokens of the longest sequence; −1: unknown (varlen lengths only on the device)
  // The kernels' 16-byte row copies apply (see view_of in gla_host.cuh).
  bool q_rows16 = false, k_rows16 = false, v_rows16 = false, g_rows16 = false, o_rows16 = false;
  // GlaForwardArgs::intra is given: the fast kernel or the Hopper path, whatever the tuning (see saves_intra).
  bool intra = false;
};

enum class FwdKernel : int8_t { general, fast, hopper };
// How the states of the earlier splits are made: none (one split), the split states kernel
// (gla_fwd_states.cu: the fast path, prefix slots), or the output kernel's own states pass (states_only) first
// (the general and Hopper kernels).
enum class StatesPass : int8_t { none, states_kernel, in_kernel };

struct FwdPlan {
  FwdKernel kernel = FwdKernel::general;
  ChunkLayout smem;                   // the general kernel's layout; filled whichever kernel runs (the
                                      // shared-memory check and the general kernel's occupancy read it)
  int num_slices = 0;                 // ceil(K / kSlice)
  int num_splits = 1;
  int64_t chunks_per_split = 1;
  StatesPass states = StatesPass::none;
  int state_pieces = 0;               // states kernel: pieces per split (0: not that kernel)
  int prep_key_pad = 0;               // Hopper: K padded to 64, 128 or 256
  int64_t prep_chunks = 0;            // Hopper: ceil(T / 64)
  int64_t prep_grid_chunks = 0;       // Hopper: chunks of the longest sequence (or of T)
  bool hopper_pdl = true;             // Hopper: the state kernel as a programmatic dependent launch
  // Workspace, in this order: the split slots (states then decays, floats), the pieces (states kernel,
  // floats), the Hopper slots (aligned to 1024 bytes at run time: the size includes the slack).
  size_t split_states_floats = 0;     // N·H·(splits−1)·K·V: split_decay starts here
  size_t split_floats = 0;            // N·H·(splits−1)·K·(V+1)
  size_t piece_states_floats = 0;     // N·H·(splits−1)·pieces·K·V: piece_decay starts here (after piece_states)
  size_t prep_offset = 0;             // bytes
  size_t workspace_bytes = 0;
};

FwdPlan plan_forward(const FwdProblem& problem, const DeviceProps& device, const GlaTuning& tuning);

// The fast path's and the Hopper path's input conditions (dtypes, K, aligned rows).
bool fast_chunk_supported(const FwdProblem& p);
// Whether a forward with GlaForwardArgs::intra writes it (and the backward reads it): a vector gate where the fast
// kernel or the Hopper path can run, the two that write it; the forward then takes one of them whatever the
// tuning. A function of q, k, v, g and the device only (o's rows are not asked: the forward requires them), so
// that the backward, asking with the forward's tensors, gets the forward's answer.
bool saves_intra(const FwdProblem& p, const DeviceProps& device);
bool hopper_chunk_supported(const FwdProblem& p);
// Workspace bytes of the Hopper chunk pass's slots (with 1024 bytes of alignment slack).
size_t hopper_prep_bytes(const FwdProblem& p);

// ---- backward -------------------------------------------------------------------------
struct BwdProblem {
  bool chunked = true;        // else recurrent
  Elem compute = Elem::bf16;  // the products' operand type (gla_bwd.cuh, Compute): the inputs' f32, bf16 or f16
  bool varlen = false;
  int64_t batch = 0, seq_len = 0, num_seqs = 0;
  int64_t longest = -1;  // varlen: tokens of the longest sequence where the host knows them, else −1
  int heads = 0, key_dim = 0, value_dim = 0;
  Gate gate = Gate::vector;
  Elem gate_dtype = Elem::bf16;  // of g (any gate kind)
  bool gamma_grad = false;      // d_g_gamma is asked for (chunked): per-chunk sums of the scalar gate's gradient
  bool normalize = false;       // the folded normaliser (GlaBackwardArgs::norm_o): the scalar chunk kernel's tiles
  bool phased = false;          // GlaPhase: the scans' decays and summaries are kept even without a split
  // Every tile of the tensor is whole aligned bf16 rows (bf16_rows in gla_bwd_chunk.cu): the inputs q, k, v,
  // d_o, a vector gate g, and the outputs dq, dk, dv and a vector gate's dg.
  bool q_bf16_rows = false, k_bf16_rows = false, v_bf16_rows = false, do_bf16_rows = false, g_bf16_rows = false;
  bool dq_bf16_rows = false, dk_bf16_rows = false, dv_bf16_rows = false, dg_bf16_rows = false;
  // A vector gate g and its dg in whole aligned fp32 rows (f32_rows): the plain chunk kernel copies and stores those
  // too.
  bool g_f32_rows = false, dg_f32_rows = false;
};

// The state scans' instantiation (gla_bwd_states.cu): one 64x64 state tile per block, two value tiles per
// block (V / 64 even), or paired and pipelined (bf16 rows, two such blocks per SM).
enum class BwdScanKernel : int8_t { one_tile, paired, pipelined };
// The chunk kernel's instantiation (gla_bwd_chunk.cu): fp32, the general bf16 one, the plain one (bf16,
// every tile of the inputs and outputs whole aligned rows: no converting or element-wise fallbacks), or the
// general one with fp16 operands (fp16 inputs).
// plain_f32_dg: the plain one for a vector gate whose dg is in fp32 rows (g in bf16 or fp32 rows).
// scalar: a kernel of its own for a scalar gate or none (gla_bwd_chunk_scalar.cu) where the plain one would
// run, K and V of 64 or 128, and its shared memory fits.
enum class BwdChunkKernel : int8_t { f32, general, plain, f16, plain_f32_dg, scalar };

// diag_factor_limit with fp16 operands: the factored key operand k_j 2^(Γ_16I − Γ_j) stays finite in fp16
// (65504) for |k| < 4094, and q̂ = q 2^(Γ_i − Γ_16I) in fp16's normal range for |q| >= 2^-10 (kDiagFactorLimit's
// 2^±64 needs bf16's range).
inline constexpr float kDiagFactorLimitF16 = 4.f;

struct BwdPlan {
  BwdScanKernel scans = BwdScanKernel::one_tile;
  BwdChunkKernel chunk_kernel = BwdChunkKernel::general;
  int64_t chunks_per_split = 0, scan_splits = 1;
  float diag_factor_limit = -1.f;
  bool overlap = false;              // the chunk kernel as a programmatic dependent of the scans
  // The folded normaliser's key-sum gradient handed from chunk to chunk inside the scalar chunk kernel (the
  // chain, gla_bwd_chunk_scalar.cu), rather than by two passes after it.
  bool norm_chain = false;
  int64_t num_slots = 0;
  // Scratch sizes, laid out in this order, each aligned to kAlign bytes.
  size_t states = 0, dstates = 0, split_summaries = 0, chunk_decays = 0;
  size_t gamma_chunk_sums = 0, norm_key_grads = 0;  // norm_key_grads: a float per key, with the chain 8 bytes
  size_t dq_acc = 0, dk_acc = 0, dg_suffix_terms = 0, dg_prefix_terms = 0, dg_final = 0;
  static constexpr size_t kAlign = 256;
  static size_t aligned(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }
  size_t total() const {
    return aligned(states) + aligned(dstates) + aligned(split_summaries) + aligned(chunk_decays) +
           aligned(gamma_chunk_sums) + aligned(norm_key_grads) + aligned(dq_acc) + aligned(dk_acc) + aligned(dg_suffix_terms) +
           aligned(dg_prefix_terms) + aligned(dg_final);
  }
};

BwdPlan plan_backward(const BwdProblem& problem, const DeviceProps& device, const GlaTuning& tuning);

// ---- segment summaries -----------------------------------------------------------------
struct SegmentProblem {
  Elem input = Elem::bf16, gate_dtype = Elem::bf16;
  Gate gate = Gate::vector;
  int heads = 0, key_dim = 0, value_dim = 0;
  int64_t num_seqs = 0;
  int64_t longest = 0;  // tokens of the longest segment (T where unknown)
  bool x_rows16 = false, y_rows16 = false, g_rows16 = false;
};

struct SegmentPlan {
  bool use_split = false;      // the forward's split states kernel, then the fold; else the generic tile kernel
  int pieces = 1;              // pieces per segment (the fold's count either way)
  int64_t piece_chunks = 1;    // generic kernel: chunks (of 32 tokens) per piece
  int64_t split_chunks = 1;    // split kernel: chunks (of 64 tokens) of its one split per segment
  size_t workspace_bytes = 0;
};

SegmentPlan plan_segment(const SegmentProblem& problem, const DeviceProps& device, const GlaTuning& tuning);

}  // namespace flashgla::cuda::gla
