// The GLA CUDA planner (plan.h): the decisions of the chunked forward, the backward and the segment
// summaries, as pure functions. Measurements behind the rules: bench/notes_gla_fwd.md, bench/notes_gla_bwd.md
// and bench/results_gla_*.md.
#include "cuda/gla/plan/plan.h"

#include <algorithm>
#include <string>

#include "core/errors.h"

namespace flashgla::cuda::gla {

// ---- forward ------------------------------------------------------------------------

bool fast_chunk_supported(const FwdProblem& p) {
  const bool half_inputs = p.input == Elem::bf16 || p.input == Elem::f16;
  const bool gate_dtype_ok = p.gate_dtype == p.input || p.gate_dtype == Elem::f32;
  const bool gate_ok = p.gate != Gate::vector || (gate_dtype_ok && p.g_rows16);
  // K ≤ 128: wider keys take the Hopper path on sm_90a (it measured faster; bench/notes_gla_fwd.md), else the
  // general kernel.
  return half_inputs && gate_ok && p.key_dim >= 1 && p.key_dim <= 128 && p.value_dim >= 1 && p.q_rows16 &&
         p.k_rows16 && p.v_rows16 && p.o_rows16;
}

namespace {
bool fast_chunk_fits(const FwdProblem& p, const DeviceProps& device) {
  return fast_chunk_supported(p) && fast_chunk_smem_bytes(p.key_dim, p.value_dim) <= device.max_smem_per_block;
}
bool hopper_chunk_fits(const FwdProblem& p, const DeviceProps& device) {
  return hopper_chunk_supported(p) && device.sm90a && (p.seq_len + kChunk - 1) / kChunk <= 65535;
}
}  // namespace

bool saves_intra(const FwdProblem& p, const DeviceProps& device) {
  FwdProblem rows = p;
  rows.o_rows16 = true;
  return p.gate == Gate::vector && (fast_chunk_fits(rows, device) || hopper_chunk_fits(rows, device));
}

bool hopper_chunk_supported(const FwdProblem& p) {
  const bool half_inputs = p.input == Elem::bf16 || p.input == Elem::f16;
  return half_inputs && p.key_dim >= 1 && p.key_dim <= 256 && p.value_dim >= 1 && p.v_rows16 && p.o_rows16;
}

size_t hopper_prep_bytes(const FwdProblem& p) {
  const int64_t chunks = (p.seq_len + kChunk - 1) / kChunk;
  const int64_t slots = p.varlen ? p.num_seqs + chunks + 1 : p.num_seqs * chunks;
  return size_t(slots) * size_t(p.heads) * size_t(hopper::Slot{hopper_key_pad(p.key_dim)}.bytes()) + 1024;
}

namespace {

// The sequences a split plan counts: a fixed-length batch's, and for varlen as many sequences of the longest's
// length as the tokens make, rounded to the nearest (at least 1 and at most the batch's count; none where the
// longest is empty), so that one long sequence among short ones splits as if alone: its pieces are the step's
// critical path, and the short sequences fill the SMs its pieces leave. (Rounded up, 1M tokens with 32 × 2048
// counted as 2 and got half the pieces: fwd+bwd 1.37-1.61× the sequence alone, 1.01-1.16× as if alone; H200,
// bench/results_long_sequence.md.) The forward's splits and the backward's scan pieces both count so.
int64_t counted_sequences(bool varlen, int64_t num_seqs, int64_t total_chunks, int64_t longest_chunks) {
  if (!varlen) return num_seqs;
  if (longest_chunks <= 0) return 0;
  const int64_t nearest = (total_chunks + longest_chunks / 2) / longest_chunks;
  return std::min(num_seqs, std::max<int64_t>(1, nearest));
}

}  // namespace

FwdPlan plan_forward(const FwdProblem& p, const DeviceProps& device, const GlaTuning& tuning) {
  FwdPlan plan;
  plan.num_slices = (p.key_dim + kSlice - 1) / kSlice;
  plan.smem = chunk_layout(p.input, p.gate_dtype, p.gate, p.key_dim);
  plan.hopper_pdl = tuning.hopper_pdl;
  const int sms = device.multiprocessors;

  // The fast path where it applies and fits (tuning.fast = false: benchmarks of both, tests of the general
  // kernel).
  bool fast = fast_chunk_fits(p, device) && (tuning.fast || p.intra);
  // The Hopper path on sm_90a: by default where it measured faster than the fast path: 128 < K ≤ 256 (e.g. the
  // GLA layer's K256 V512 heads), and K = 128 with V ≥ 256 (the 340M model's heads) when its 64-column value
  // tiles fill at least half the SMs, i.e. without a sequence split (on par where the split applies).
  // tuning.hopper: on wherever it applies, off never. With intra (saves_intra): the library's choice between
  // the two kernels that write it, whatever the tuning.
  const int64_t hopper_tiles = p.num_seqs * p.heads * ((p.value_dim + 63) / 64);
  const bool wide_values = p.key_dim == 128 && p.value_dim >= 256 && 2 * hopper_tiles > sms;
  const bool library_hopper = p.key_dim > 128 || wide_values;
  const bool hopper_wanted = p.intra ? library_hopper || !fast
                                     : tuning.hopper == GlaTuning::Force::on ||
                                           (tuning.hopper != GlaTuning::Force::off && library_hopper);
  const int64_t chunks_of_t = (p.seq_len + kChunk - 1) / kChunk;
  bool hopper = false;
  if (hopper_wanted && hopper_chunk_fits(p, device)) {
    hopper = true, fast = false;
    plan.prep_key_pad = hopper_key_pad(p.key_dim);
    plan.prep_chunks = chunks_of_t;
  }
  plan.kernel = hopper ? FwdKernel::hopper : fast ? FwdKernel::fast : FwdKernel::general;
  FLASHGLA_REQUIRE(fast || hopper || plan.smem.bytes <= device.max_smem_per_block, ErrorKind::unsupported, "q",
                   "K = " + std::to_string(p.key_dim) + " needs " + std::to_string(plan.smem.bytes) +
                       " bytes of shared memory in the CUDA chunked kernel, more than this device's " +
                       std::to_string(device.max_smem_per_block) + " (K ≤ 512 fits on sm_80 and sm_90)");

  // Split long sequences when (sequences × heads × value tiles) leaves SMs idle, the sequences counted as
  // counted_sequences says. Without the lengths of a varlen batch on the host there is nothing to plan with: no
  // split.
  const int64_t longest = p.longest;
  const int64_t max_chunks = longest < 0 ? (p.seq_len + kChunk - 1) / kChunk : (longest + kChunk - 1) / kChunk;
  const int64_t tile = hopper ? 64 : fast ? fast_value_tile(p.value_dim) : value_tile(p.input);
  const int64_t tiles = counted_sequences(p.varlen, p.num_seqs, chunks_of_t, max_chunks) * p.heads *
                        ((p.value_dim + tile - 1) / tile);
  int64_t splits = 1;
  if (longest > 0 && tiles > 0) {
    constexpr int64_t kMinChunksPerSplit = 4;
    const int64_t slots =
        int64_t(sms) * (fast || hopper ? 1 : device.general_blocks_per_sm(p.input, plan.smem.bytes));
    splits = std::max<int64_t>(1, std::min(slots / tiles, max_chunks / kMinChunksPerSplit));
    if (tuning.splits > 0) splits = tuning.splits;  // for tuning and tests of the split path
    // The Hopper path splits with key pad 256 only: with K ≤ 128 it is the default only where its value tiles
    // leave no split (wide_values above), so it keeps no states pass for that pad.
    if (hopper && plan.prep_key_pad == 128) splits = 1;
    splits = std::min<int64_t>(splits, std::max<int64_t>(1, max_chunks));
  }
  plan.chunks_per_split = std::max<int64_t>(1, (max_chunks + splits - 1) / splits);
  plan.num_splits = int((std::max<int64_t>(1, max_chunks) + plan.chunks_per_split - 1) / plan.chunks_per_split);
  const size_t nh_splits = size_t(p.num_seqs * p.heads * (plan.num_splits - 1));
  if (plan.num_splits > 1) {
    plan.split_states_floats = nh_splits * size_t(p.key_dim) * size_t(p.value_dim);
    plan.split_floats = nh_splits * size_t(p.key_dim) * size_t(p.value_dim + 1);
    plan.workspace_bytes = plan.split_floats * sizeof(float);
    plan.states = StatesPass::in_kernel;
  }
  // The split's states pass on the fast path: the states kernel (gla_fwd_states.cu; it measured faster at every
  // split shape than the fast kernel's own states pass, since retired; the general and Hopper kernels keep
  // theirs). Its shared memory is less than the fast kernel's for every tile shape (tests/test_gla_plan.cpp),
  // so it fits wherever the fast path does. Pieces per split: enough for one CTA per SM (one piece per
  // split beat 2–4 pieces at 2 CTAs per SM, whose smaller states pass the larger fold outweighed); one more
  // where that leaves SMs idle and the pieces stay long (kLongPieceChunks each), since each CTA walks its piece
  // chunk by chunk (B1 T1M H16 on an H200: 112 CTAs of 2048 chunks; 2 pieces, 224 CTAs at up to 2 per SM,
  // forward 22.8 -> 21.6 ms, bench/results_long_sequence.md). tuning.state_pieces overrides. The fold writes
  // prefix slots (one read per state element in the output pass).
  if (fast && plan.num_splits > 1) {
    plan.states = StatesPass::states_kernel;
    constexpr int64_t kLongPieceChunks = 128;
    const int64_t tiles_per_piece = std::max<int64_t>(1, tiles * (plan.num_splits - 1));  // CTAs of one piece
    int64_t pieces = std::max<int64_t>(1, int64_t(sms) / tiles_per_piece);
    if (pieces * tiles_per_piece < sms && plan.chunks_per_split / (pieces + 1) >= kLongPieceChunks &&
        (pieces + 1) * tiles_per_piece <= kStatesBlocksPerSm * int64_t(sms))
      ++pieces;
    if (tuning.state_pieces > 0) pieces = tuning.state_pieces;
    pieces = std::min<int64_t>({pieces, plan.chunks_per_split, 65535 / (plan.num_splits - 1)});
    plan.state_pieces = int(std::max<int64_t>(1, pieces));
    plan.piece_states_floats = nh_splits * size_t(plan.state_pieces) * size_t(p.key_dim) * size_t(p.value_dim);
    plan.workspace_bytes += nh_splits * size_t(plan.state_pieces) * size_t(p.key_dim) * size_t(p.value_dim + 1) *
                            sizeof(float);
  }
  if (hopper) {
    plan.prep_offset = plan.workspace_bytes;
    plan.prep_grid_chunks = std::max<int64_t>(1, max_chunks);
    plan.workspace_bytes += hopper_prep_bytes(p);
  }
  return plan;
}

// ---- backward -------------------------------------------------------------------------

namespace {

int64_t num_slots(const BwdProblem& pr) {
  const int64_t C = kChunk;
  return pr.varlen ? pr.seq_len / C + pr.num_seqs + 1 : pr.batch * ((pr.seq_len + C - 1) / C);
}

// Two pipelined scan blocks (105 KB each) per SM, as the launch bounds assume:
// Hopper (228 KB per SM) yes, an A100 (164 KB) no.
bool two_pipelined_scans_per_sm(const DeviceProps& device) {
  constexpr size_t kReservedPerBlock = 1024;  // shared memory the system keeps per block (sm_80 and later)
  return size_t(device.smem_per_sm) >= 2 * (StateScanSmemBytes<2, 4, 2, 2>::bytes + kReservedPerBlock);
}

// Whether the state scans run paired (two value tiles per block: V / 64 even)
// and pipelined (x, y and a vector gate copied a chunk ahead, which needs every
// tile in whole bf16 rows, no converting fallback).
bool paired_scans(const BwdProblem& pr, const GlaTuning& tuning) {
  const int64_t value_tiles = (pr.value_dim + kTile - 1) / kTile;
  return tuning.bwd_scan_pairs && value_tiles % 2 == 0;
}

bool pipelined_scans(const BwdProblem& pr, const DeviceProps& device, const GlaTuning& tuning) {
  return pr.chunked && paired_scans(pr, tuning) && tuning.bwd_scan_pipeline && pr.q_bf16_rows && pr.k_bf16_rows &&
         pr.v_bf16_rows && pr.do_bf16_rows && (pr.gate != Gate::vector || pr.g_bf16_rows) &&
         two_pipelined_scans_per_sm(device);
}

// The plain chunk kernel: bf16, every tile of q, k, v, dO, dq, dk and dv whole aligned bf16 rows; a vector gate
// and its dg in whole aligned bf16 rows, or (plain_f32_dg) dg in fp32 rows and g in bf16 or fp32 rows; a scalar
// gate in bf16 or fp32 (FLA's simple GLA gate is usually fp32; only those two loaders are compiled there).
// tuning.bwd_general_layout: the general kernel wherever bf16.
BwdChunkKernel chunk_kernel(const BwdProblem& pr, const GlaTuning& tuning) {
  if (pr.compute == Elem::f32) return BwdChunkKernel::f32;
  if (pr.compute == Elem::f16) return BwdChunkKernel::f16;
  const bool rows = pr.q_bf16_rows && pr.k_bf16_rows && pr.v_bf16_rows && pr.do_bf16_rows && pr.dq_bf16_rows &&
                    pr.dk_bf16_rows && pr.dv_bf16_rows;
  const bool gate =
      pr.gate == Gate::none ||
      (pr.gate == Gate::scalar && (pr.gate_dtype == Elem::bf16 || pr.gate_dtype == Elem::f32)) ||
      (pr.gate == Gate::vector && pr.g_bf16_rows && pr.dg_bf16_rows) ||
      (pr.gate == Gate::vector && (pr.g_bf16_rows || pr.g_f32_rows) && pr.dg_f32_rows);
  if (!rows || !gate || tuning.bwd_general_layout) return BwdChunkKernel::general;
  return pr.gate == Gate::vector && pr.dg_f32_rows ? BwdChunkKernel::plain_f32_dg : BwdChunkKernel::plain;
}

// Sequence split of the state scans (gla_bwd_states.cu): chunks per piece, 0
// for none. The inputs are split when the blocks of both scans fill at most
// half of the GPU's resident slots, into as many pieces as fit in one wave, of
// at least kMinScanChunksPerPiece chunks (each piece costs a fold step).
// Pipelined scans only where they fill at most a quarter of the slots: at half
// of the slots the unsplit pipelined scans measured faster than the split ones
// with their fold (bench/notes_gla_bwd.md). tuning.bwd_scan_split forces it.
// Varlen: every sequence is cut into pieces of the same length, its pieces past
// its end empty (identities in the fold). Pieces are sized from the longest
// sequence, the blocks counted by counted_sequences; with the lengths only on
// the device there is no split unless the tuning forces one (T then bounds the
// longest).
constexpr int64_t kMinScanChunksPerPiece = 8;

// Chunks of the longest sequence, as the scans' pieces are counted: T for varlen without the lengths.
int64_t longest_chunks(const BwdProblem& pr) {
  const int64_t longest = pr.varlen && pr.longest >= 0 ? pr.longest : pr.seq_len;
  return (longest + kChunk - 1) / kChunk;
}

int64_t scan_chunks_per_split(const BwdProblem& pr, const DeviceProps& device, const GlaTuning& tuning) {
  if (!pr.chunked || pr.num_seqs * pr.heads == 0) return 0;
  const int64_t chunks = longest_chunks(pr);
  const int64_t tiles = ((pr.key_dim + kTile - 1) / kTile) * ((pr.value_dim + kTile - 1) / kTile);
  int64_t per_split = 0;
  if (tuning.bwd_scan_split >= 0) {
    per_split = tuning.bwd_scan_split;
  } else {
    if (pr.varlen && pr.longest < 0) return 0;
    const int blocks_per_sm = pr.compute == Elem::f32 ? kScanBlocksPerSmOf<4> : kScanBlocksPerSmOf<2>;
    const int64_t resident = int64_t(device.multiprocessors) * blocks_per_sm;
    const int64_t seqs = counted_sequences(pr.varlen, pr.num_seqs, (pr.seq_len + kChunk - 1) / kChunk, chunks);
    if (seqs == 0) return 0;
    const int64_t blocks = 2 * seqs * pr.heads * tiles;
    const int64_t min_slots_per_block = pipelined_scans(pr, device, tuning) ? 4 : 2;
    const int64_t splits = std::min(resident / blocks, chunks / kMinScanChunksPerPiece);
    if (resident / blocks >= min_slots_per_block && splits >= 2) per_split = (chunks + splits - 1) / splits;
  }
  if (per_split <= 0 || per_split >= chunks) return 0;
  const int64_t max_splits = 65535 / tiles;  // pieces x tiles is the scan's grid.y
  if ((chunks + per_split - 1) / per_split > max_splits) per_split = (chunks + max_splits - 1) / max_splits;
  return per_split;
}

// The folded normaliser's dz after each chunk (the gradient of the key sum z) needs the later chunks. In the chain,
// chunk c's block waits for chunk c + 1's carry, dz before c + 1, and hands on its own (gla_bwd_chunk_scalar.cu);
// the blocks run chunk-major, the last chunks first, so a carry is ready when the next block asks for it as long
// as the blocks in flight hold at most two chunks of each (sequence, head): with fewer pairs the hand-overs would
// queue inside a wave, and the passes after the kernel cost less. Fixed-length sequences only (the block order).
bool norm_chain(const BwdProblem& pr, const DeviceProps& device, const GlaTuning& tuning) {
  if (!pr.normalize || pr.varlen || pr.seq_len == 0 || tuning.bwd_norm_chain == GlaTuning::Force::off) return false;
  if (tuning.bwd_norm_chain == GlaTuning::Force::on) return true;
  const int64_t resident =
      int64_t(device.multiprocessors) * bwd_scalar_chunk_blocks_per_sm(pr.key_dim, pr.value_dim);
  return 2 * pr.num_seqs * pr.heads >= resident;
}

}  // namespace

BwdPlan plan_backward(const BwdProblem& pr, const DeviceProps& device, const GlaTuning& tuning) {
  BwdPlan plan;
  if (pr.chunked) {
    const int64_t tiles = ((pr.key_dim + kTile - 1) / kTile) * ((pr.value_dim + kTile - 1) / kTile);
    const size_t elem = pr.compute == Elem::f32 ? 4 : 2;  // fp16 states as FLA's (gla_bwd.cuh, Compute)
    plan.states = plan.dstates = size_t(num_slots(pr) * pr.heads * tiles) * kTileElems * elem;
    plan.chunks_per_split = scan_chunks_per_split(pr, device, tuning);
    if (plan.chunks_per_split > 0 || pr.phased) {
      const int64_t chunks = longest_chunks(pr);
      const int64_t key_tiles = (pr.key_dim + kTile - 1) / kTile;
      if (plan.chunks_per_split > 0) plan.scan_splits = (chunks + plan.chunks_per_split - 1) / plan.chunks_per_split;
      plan.split_summaries =
          size_t(2 * pr.num_seqs * pr.heads * plan.scan_splits * tiles) * kSummaryFloats * sizeof(float);
      plan.chunk_decays = size_t(2 * num_slots(pr) * pr.heads * key_tiles * kTile) * sizeof(float);
    }
    if (pr.gamma_grad) plan.gamma_chunk_sums = size_t(num_slots(pr) * pr.heads) * sizeof(float);
  } else {
    plan.dq_acc = plan.dk_acc = plan.dg_suffix_terms = plan.dg_prefix_terms =
        size_t(pr.batch * pr.seq_len * pr.heads * pr.key_dim) * sizeof(float);
    plan.dg_final = size_t(pr.num_seqs * pr.heads * pr.key_dim) * sizeof(float);
  }
  // A's pairs inside a sub-chunk go through the products where the gates allow (see mark_wide_subchunks in
  // gla_bwd_chunk.cu); bwd_diag_elementwise sums them element by element everywhere.
  plan.diag_factor_limit = tuning.bwd_diag_elementwise ? -1.f
                           : pr.compute == Elem::f16   ? kDiagFactorLimitF16
                                                       : kDiagFactorLimit;
  plan.chunk_kernel = chunk_kernel(pr, tuning);
  if (plan.chunk_kernel == BwdChunkKernel::plain && pr.gate != Gate::vector &&
      bwd_scalar_chunk_shape(pr.key_dim, pr.value_dim) &&
      bwd_scalar_chunk_smem_bytes(pr.key_dim, pr.value_dim, pr.normalize) <= device.max_smem_per_block)
    plan.chunk_kernel = BwdChunkKernel::scalar;
  // The pipelined scans are the variant with fewer instructions per step ("lean"); the first pipelined variant
  // was never faster and is retired (bench/notes_gla_bwd.md).
  plan.scans = pipelined_scans(pr, device, tuning) ? BwdScanKernel::pipelined
               : paired_scans(pr, tuning)          ? BwdScanKernel::paired
                                                   : BwdScanKernel::one_tile;
  plan.num_slots = num_slots(pr);
  if (pr.chunked && pr.normalize) {  // each chunk's key gradient, or with the chain its carry and flag
    plan.norm_chain = plan.chunk_kernel == BwdChunkKernel::scalar && norm_chain(pr, device, tuning);
    plan.norm_key_grads = size_t(plan.num_slots * pr.heads * pr.key_dim) * (plan.norm_chain ? 8 : sizeof(float));
  }
  // On sm_90+ the chunk kernel starts as the scans' blocks retire, when it follows the scans themselves (not
  // a fold; faster: bench/notes_gla_bwd.md). Only where the loaded code has griddepcontrol (compiled for sm_90
  // or newer), without which the chunk kernel would not wait for the scans. tuning.bwd_overlap: off, or on
  // after a fold too.
  const GlaTuning::Force overlap = tuning.bwd_overlap;
  plan.overlap = device.sm90 && (overlap == GlaTuning::Force::library ? plan.scan_splits == 1
                                                                      : overlap == GlaTuning::Force::on);
  return plan;
}

// ---- segment summaries ------------------------------------------------------------------

SegmentPlan plan_segment(const SegmentProblem& p, const DeviceProps& device, const GlaTuning& tuning) {
  SegmentPlan plan;
  const int64_t pairs = p.num_seqs * p.heads;
  const int64_t sms = device.multiprocessors;
  // The generic tile kernel (gla_segment.cu): chunks of 32 tokens, 64×64 tiles. Pieces: enough CTAs for about
  // eight per SM, each piece at least 16 chunks (512 tokens, so that the fold stays cheap) of the longest segment.
  {
    constexpr int64_t kRows = kSegmentRows, kTile = kSegmentTile, kMinPieceChunks = kSegmentMinPieceChunks;
    const int64_t tiles = ((p.key_dim + kTile - 1) / kTile) * ((p.value_dim + kTile - 1) / kTile);
    const int64_t chunks = (p.longest + kRows - 1) / kRows;
    const int64_t ctas = std::max<int64_t>(1, pairs * tiles);
    int64_t pieces = std::min<int64_t>((8 * sms + ctas - 1) / ctas, std::max<int64_t>(1, chunks / kMinPieceChunks));
    if (tuning.segment_pieces > 0) pieces = tuning.segment_pieces;
    pieces = std::max<int64_t>(1, std::min<int64_t>({pieces, std::max<int64_t>(1, chunks), 65535}));
    plan.pieces = int(pieces);
    plan.piece_chunks = std::max<int64_t>(1, (chunks + pieces - 1) / pieces);
    if (pieces > 1)
      plan.workspace_bytes = size_t(pairs * pieces) * size_t(int64_t(p.key_dim) * p.value_dim + p.key_dim) * 4;
  }
  // The forward's split states kernel for bf16/fp16 inputs with K ≤ 256 and 16-byte rows, where it fits
  // (tuning.segment_split_kernel = off: the generic kernel).
  const bool half = p.input == Elem::bf16 || p.input == Elem::f16;
  const bool gate_ok =
      p.gate != Gate::vector || ((p.gate_dtype == p.input || p.gate_dtype == Elem::f32) && p.g_rows16);
  if (tuning.segment_split_kernel == GlaTuning::Force::off || !half || !gate_ok || !p.x_rows16 || !p.y_rows16 ||
      p.key_dim > 256)
    return plan;
  const int64_t chunks = (p.longest + kChunk - 1) / kChunk;
  const int states_bytes = split_states_smem_bytes(p.input, p.gate_dtype, p.gate, p.key_dim, p.value_dim);
  if (!(states_bytes > 0 && states_bytes <= device.max_smem_per_block)) return plan;
  // Pieces: about two CTAs per SM (the kernel's occupancy), each at least 8 chunks of the longest segment.
  const int value_tile = fast_value_tile(p.value_dim);
  const int64_t tiles = int64_t((p.value_dim + value_tile - 1) / value_tile) * fast_key_parts(p.key_dim);
  const int64_t ctas = std::max<int64_t>(1, pairs * tiles);
  int64_t pieces = std::min<int64_t>((2 * sms + ctas - 1) / ctas, std::max<int64_t>(1, chunks / 8));
  if (tuning.segment_pieces > 0) pieces = tuning.segment_pieces;
  pieces = std::max<int64_t>(1, std::min<int64_t>({pieces, std::max<int64_t>(1, chunks), 65535}));
  plan.use_split = true;
  plan.split_chunks = std::max<int64_t>(1, chunks);
  plan.pieces = int(pieces);
  // piece_states, piece_decay (the kernel's exp Σ g, unused here), piece_log_decay.
  plan.workspace_bytes = size_t(pairs * pieces) * size_t(int64_t(p.key_dim) * p.value_dim + 2 * p.key_dim) * 4;
  return plan;
}

}  // namespace flashgla::cuda::gla
