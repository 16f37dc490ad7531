// The CUDA GLA forward, recurrent and decode kernels: their parameter structs
// and launchers. gla_forward.cu checks, plans and fills these; one .cu file per
// kernel (gla_fwd_chunk.cu, gla_fwd_fast.cu, gla_fwd_recurrent.cu,
// gla_fwd_decode.cu) defines it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/gla/device/types.cuh"
#include "cuda/gla/plan/normalize_layout.h"

namespace flashgla::cuda::gla {

// ---- chunked forward -----------------------------------------------------------
// Elem, Gate, kChunk, kSlice, value_tile and ChunkLayout: cuda/gla/plan/layouts.h; the decisions: cuda/gla/plan/plan.h.
inline constexpr int kChunkThreads = 256;

struct ChunkParams {
  View q, k, v, g, o;           // [B,T,H,*]; g [B,T,H] for a scalar gate (g_gamma alone: gamma_gate)
  View g_gamma;                 // [H] fp32: a scalar gate's constant log decay per head, added to g (absent: none)
  View h0, ht;                  // [N,H,K,V] f32
  Sequences seqs;
  int heads = 0, key_dim = 0, value_dim = 0, num_slices = 0;
  GateByte gate = Gate::none;
  float scale = 1.f;
  // Sequence split (see gla_fwd_chunk.cu): split s of a sequence covers chunks
  // [s * chunks_per_split, (s + 1) * chunks_per_split).
  int num_splits = 1;
  int64_t chunks_per_split = 1;
  float* split_states = nullptr;  // [N][H][num_splits-1][K][V]: each split's state from a zero start
  float* split_decay = nullptr;   // [N][H][num_splits-1][K]: each split's total decay exp(sum g)
  // The general and Hopper kernels' own states pass (the first launch): each split's state from a zero start
  // and its decay to split_states/split_decay, no output; the output pass folds slots 0 .. s − 1.
  bool states_only = false;
  // The fast path's states pass, its own kernel (gla_fwd_states.cu), when > 0: each split cut into this many
  // pieces, written to piece_states/piece_decay and folded into prefix slots: slot s − 1 holds the state at
  // the start of split s from a zero state at the sequence start and the decay since then (the fast kernel
  // reads one slot).
  int state_pieces = 0;
  // Set with state_pieces > 0. The vector gate's fast kernel still has a branch for per-split slots and its own
  // states pass (states_only) that the planner never takes: removing them made ptxas spill in its 128-key kernels
  // (bench/notes_gla_fwd.md, issue 22). The scalar gate's fast kernel takes split_prefix only.
  bool split_prefix = false;
  float* piece_states = nullptr;  // [N][H][num_splits-1][state_pieces][K][V]
  float* piece_decay = nullptr;   // [N][H][num_splits-1][state_pieces][K]
  // The segment summaries (gla_segment.cu) run the states kernel alone, with num_splits = 2 and one split
  // per sequence: every split's pieces are written (not only those a later split reads), and each piece's
  // total log decay Σ g to piece_log_decay (exact where exp(Σ g) underflows; −inf stays −inf).
  bool whole_segments = false;
  float* piece_log_decay = nullptr;  // [N][H][state_pieces][K] when set
  // GlaPhase::summary (gla_forward.cu): the states kernel walks each sequence's last split too, into the
  // last_piece slots, and the fold writes summary [N,H,K,V+1] f32: each sequence's end state from a zero start
  // and its summed log gate (column V), from the pieces' log decays (piece_log_decay set).
  View summary;
  float* last_piece_states = nullptr;     // [N][H][state_pieces][K][V]
  float* last_piece_log_decay = nullptr;  // [N][H][state_pieces][K]
  // The segment gradients: k, v hold q, d_o; the chunks are walked first to last with the weights
  // exp Σ_{u ≤ t} g_u, and the pieces' summaries are multiplied by summary_scale (the attention scale).
  bool walk_forward = false;
  float summary_scale = 1.f;
  // The Hopper path (gla_fwd_hopper.cu): a chunk pass writes one slot per (chunk, head) to `prep`, the state
  // kernel reads them.
  unsigned char* prep = nullptr;  // 1024-byte aligned
  int prep_key_pad = 0;           // K padded to 64, 128 or 256
  int64_t prep_chunks = 0;        // ceil(T / 64): slots per sequence of a fixed-length batch
  // The fast kernel without a gate, normalize: chunk_linear_attn(normalize=True) folded in; the kernel divides o_t
  // by scale · q_t·z_t + 1e-10, with z_t the running key sum. It carries z from z_init ([N,H,K], any float dtype;
  // absent: zeros) and writes z_final ([N,H,K] f32) if set; with a sequence split, from norm_z instead: the
  // running sum at the start of every chunk (gla_normalize_key_prefix in gla_normalize.cu, which writes z_final),
  // in the normaliser's slots (plan/normalize_layout.h).
  bool normalize = false;
  View z_init, z_final;
  const float* norm_z = nullptr;  // [slots, H, K]
  norm::ChunkSlots norm_slots;
  // The residuals of the backward's folded normaliser (GlaForwardArgs::norm_den, norm_chunk_z), written if set:
  // den_t per token ([B,T,H]) and z at each chunk's start ([slots, H, K], norm_slots).
  View norm_den;                 // f32 [B,T,H]
  float* norm_chunk_z = nullptr;
  // GlaForwardArgs::intra: the fast vector-gate kernel (from its value-tile-0 CTAs) and the Hopper chunk pass write
  // each chunk's A (unscaled, zero above the diagonal) to it, [B,T,H,64] of the input dtype, for the backward.
  View intra;
  ChunkLayout smem;
};

// The general kernel (gla_fwd_chunk.cu): resident CTAs per SM with `smem_bytes` of its shared memory (an
// occupancy query: the planner's DeviceProps::general_blocks_per_sm).
int chunk_blocks_per_sm(Elem input, int smem_bytes);
void launch_chunk_forward(const ChunkParams& p, int num_seqs, cudaStream_t stream);

// The fast path (gla_fwd_fast.cu): bf16/fp16 inputs (a vector gate of the same
// dtype or fp32, or a scalar gate, or none), K ≤ 128, every row 16-byte aligned
// (plan.h: fast_chunk_supported). One CTA per SM; value tiles of fast_value_tile(V)
// columns.
void launch_fast_chunk_forward(const ChunkParams& p, int num_seqs, cudaStream_t stream);

// The states pass of the split as its own kernel (gla_fwd_states.cu), for what the fast path takes:
// p.state_pieces > 0, piece_states/piece_decay set (see ChunkParams); its shared memory (layouts.h:
// split_states_smem_bytes) is less than the fast kernel's, so it fits wherever the fast path does.
void launch_split_states(const ChunkParams& p, int num_seqs, cudaStream_t stream);
// The states kernel alone for the segment summaries (p.whole_segments, num_splits = 2): pieces of each
// sequence to piece_states, piece_decay and piece_log_decay; the caller folds them.
void launch_segment_states(const ChunkParams& p, int num_seqs, cudaStream_t stream);

// The Hopper path (gla_fwd_hopper.cu): bf16/fp16 q, k, v, any gate, K ≤ 256,
// v and o rows 16-byte aligned; sm_90a only (plan.h: hopper_chunk_supported). Value tiles of 64 columns.
// The chunk pass (grid: sequences × heads × `max_chunks`), then nothing else: call
// launch_hopper_chunk_forward for the states pass and the output pass (`pdl`: the state kernel as a
// programmatic dependent of the kernel before it in the stream).
void launch_hopper_prep(const ChunkParams& p, int num_seqs, int64_t max_chunks, cudaStream_t stream);
void launch_hopper_chunk_forward(const ChunkParams& p, int num_seqs, bool pdl, cudaStream_t stream);

// ---- recurrent forward ---------------------------------------------------------
struct RecurrentParams {
  View q, k, v, g, o, h0, ht;
  Sequences seqs;
  int heads = 0, key_dim = 0, value_dim = 0;
  GateByte gate = Gate::none;
  float scale = 1.f;
  bool reverse = false;
  // vLLM's state pools (GlaForwardArgs::ssm_state_indices): h0 is the pool [P,H,K,V], written in place
  // (inplace), else ht is [B*T,H,K,V], the state after every token. Null pool_rows: no pool.
  const int32_t* pool_rows = nullptr;  // [N] (pool_cols 0) or [N, pool_cols]
  const int32_t* accepted = nullptr;   // num_accepted_tokens [N] (null: the start row is column 0)
  int64_t pool_row_stride = 1, pool_col_stride = 0, accepted_stride = 1;
  int64_t pool_size = 0;               // P: a start row outside [0, P) is a padded slot, a write row is skipped
  int pool_cols = 0;
  bool inplace = false;
  // Launch shape (chosen by the launcher).
  int key_groups = 1;   // threads sharing one value column, 16 keys each (a power of two ≤ 32)
  int columns = 1;      // value columns per CTA
  int steps = 1;        // tokens staged in shared memory at a time
  int key_pad = 16;     // 16 * key_groups
};

void launch_recurrent_forward(RecurrentParams p, int num_seqs, cudaStream_t stream);

// ---- decode --------------------------------------------------------------------
struct DecodeParams {
  View q, k, v, g, o;   // [N,T,H,*] (or [1,total,H,*] with cu_seqlens in seqs); g [N,T,H] for a scalar gate
  View state;           // [P,H,K,V] f32 (P = N without indices)
  View token_states;    // optional out: [N*T,H,K,V] (or [total,H,K,V]) f32, the state after each token
  Sequences seqs;       // sequence n: row n of T tokens, or cu_seqlens' [cu[n], cu[n+1]) of row 0
  const int32_t* state_indices = nullptr;  // [N] pool rows (null: row n), or [N, pool_cols]; < 0 or ≥ P: padded
  int64_t index_stride = 1;
  int64_t state_rows = 0;                  // P
  bool write_back = true;                  // the state after the last token back into the start row
  bool zero_padded_token_states = true;    // a padded slot's token_states: zeros, or (false) left as they are
  // vLLM's per-token pool rows (ssm_state_indices [N, T_max], pool_cols = T_max): sequence n starts from
  // column a_n − 1 (a_n = accepted[n], or 1; out of range: padded), and with pool_token_rows the state after
  // token t < pool_cols goes to the row of column t (a row < 0 or ≥ P is not written).
  int pool_cols = 0;
  int64_t pool_col_stride = 0;
  const int32_t* accepted = nullptr;
  int64_t accepted_stride = 1;
  bool pool_token_rows = false;
  int heads = 0, key_dim = 0, value_dim = 0;
  int tokens = 1;                          // tokens per sequence (with cu_seqlens: a bound, for the launch shape)
  GateByte gate = Gate::none;
  float scale = 1.f;
};

// The most keys the decode kernel holds in registers (its narrowest slice, 16 columns per CTA); beyond them a
// slice streams through its start row, which then must take the final state (DecodeParams::write_back).
inline constexpr int kDecodeResidentKeys = 512;

// multiprocessors: of the device, to size the grid.
void launch_decode(const DecodeParams& p, int num_seqs, int multiprocessors, cudaStream_t stream);

// dst[dst row of n, h] = src[src row of n, h] for every sequence n and head h of
// [*,H,K,V] f32 states; a rows array maps n to a pool row (null: row n). A
// source row outside [0, src_rows) gives zeros, a destination row outside
// [0, dst_rows) is not written (prefill into and from state pools).
struct StateRowsCopy {
  View src, dst;
  const int32_t* src_index = nullptr;
  const int32_t* dst_index = nullptr;
  int64_t src_index_stride = 1, dst_index_stride = 1;
  int64_t src_rows = 0, dst_rows = 0;
  int heads = 0, key_dim = 0, value_dim = 0;
};

void launch_copy_state_rows(const StateRowsCopy& c, int num_seqs, cudaStream_t stream);

}  // namespace flashgla::cuda::gla
