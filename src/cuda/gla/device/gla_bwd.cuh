// The CUDA GLA backward: the parameter block every backward kernel reads and
// the launchers of the kernels. gla_backward.cu checks, plans and fills these;
// gla_bwd_states.cu, gla_bwd_chunk.cu and gla_bwd_recurrent.cu define them.
//
// Chunked backward (chunks of C = 64 tokens, 16-token sub-chunks), per head:
//   1. gla_bwd_states.cu: two sequential scans over the chunks of a sequence,
//      one block per 64x64 tile of the state: the forward state S before each
//      chunk, and the backward state dS (gradient of the state after each
//      chunk, seeded by dht). Both are written to scratch, O(T/C K V) per head.
//      The backward scan also yields dh0 (dS before the first chunk).
//      When (sequences x heads x tiles) cannot fill the GPU, each sequence is
//      split into pieces of `chunks_per_split` chunks scanned at once from a
//      zero state (the true start state for the first piece in scan order);
//      a fold kernel then adds each piece's missing start state, decayed, to
//      its stored states (and writes dh0). Fixed-length inputs only.
//   2. gla_bwd_chunk.cu: one block per (chunk, head) computes dA, the
//      intra-chunk A (recomputed), dv, dq, dk and dg of that chunk.
// Recurrent backward: one pass forward (states, dq), one pass backward (dS,
// dk, dv); dg from the closed form without a stored state (see gla_bwd_recurrent.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/gla_chunk.h"
#include "core/problem.h"
#include "flashgla/gla.h"
#include "cuda/gla/plan/plan.h"
#include "cuda/gla/device/types.cuh"

namespace flashgla::cuda::gla {

using flashgla::kChunk;            // C: tokens per chunk (core/gla_chunk.h)
inline constexpr int kSub = 16;    // tokens per secondary sub-chunk
// kTile (key / value columns per tile), kTileElems, kSummaryFloats and kDiagFactorLimit (the default
// diag_factor_limit): cuda/gla/plan/layouts.h.

inline constexpr int kBwdStateThreads = 256;  // gla_bwd_states.cu: 8 warps, 16 state rows x 32 columns each
inline constexpr int kBwdChunkThreads = 256;  // gla_bwd_chunk.cu: 8 warps, two per sub-chunk
inline constexpr int kRecurrentCols = 32;  // gla_bwd_recurrent.cu: state columns per block
inline constexpr int kRecurrentBatch = 8;  // tokens staged in shared memory at a time
inline constexpr int kRecurrentMaxThreads = 512;  // one thread per key row: K <= 512

struct BwdParams {
  View q, k, v, g, d_o;  // [B,T,H,K|V]; g [B,T,H,K] or [B,T,H] (g_gamma alone: gamma_gate)
  View g_gamma;          // [H] fp32: a scalar gate's constant log decay per head, added to g (absent: none)
  View h0, dht;          // f32 [N,H,K,V]
  View dq, dk, dv, dg;   // outputs; dg absent without a gate
  View dh0;              // f32 [N,H,K,V]
  GateKind gate = GateKind::none;

  Sequences seqs;        // fixed length, or cu_seqlens; total_len: T (tokens per batch row)
  int64_t num_seqs = 0;  // N
  int heads = 0, key_dim = 0, value_dim = 0;
  int key_tiles = 0, value_tiles = 0;  // ceil(K / 64), ceil(V / 64)
  float scale = 1.f;
  bool reverse = false;  // recurrent only
  // Chunked: the widest span (log2 units) of the gate cumsum inside a 16-token
  // sub-chunk for which its pairs go through the tensor-core products for A
  // (see mark_wide_subchunks in gla_bwd_chunk.cu); below 0: never.
  float diag_factor_limit = -1.f;
  // Chunked: the forward's A (GlaBackwardArgs::intra, unscaled, [B,T,H,64] of the compute type): the chunk kernel
  // copies it instead of recomputing it (its phase A). Absent: recomputed.
  View intra;

  // Chunked: chunk slot of chunk c of sequence n (see sequence() in
  // device/chunk_slots.cuh); the scratch states hold one 64x64 tile per
  // (slot, head, key tile, value tile), of the compute type (fp32, bf16 or fp16).
  int64_t chunks_per_seq = 0;  // fixed length: ceil(T / 64)
  int64_t num_slots = 0;
  void* states = nullptr;   // S before each chunk
  void* dstates = nullptr;  // dS after each chunk
  // Sequence split of the state scans (gla_bwd_states.cu): 1 split = none.
  int64_t scan_splits = 1;
  int64_t chunks_per_split = 0;     // chunks of each piece (the last may have fewer)
  float* split_summaries = nullptr; // [scan][N][H][split][tile]: a piece's last state (64x64) and its total decay (64)
  float* chunk_decays = nullptr;    // [scan][slot][H][64 key_tiles]: decay (log2) from the piece's start to each stored state
  // GlaPhase (flashgla/gla.h): the scans record each stored state's decay and their summaries even without a
  // split (phased). A summary call scans from a zero dht; with a split its fold writes only `summary` (f32
  // [N,H,K,V], dh0 for that zero dht; without one the scan writes it as dh0). An output call's fold carries dht
  // into the backward scan's first piece as well (the whole sequence without a split), which started from zero.
  bool phased = false;
  View summary;
  bool dht_in_fold = false;
  // With g_gamma's gradient asked for: per (slot, head), the sum over the chunk's tokens of the scalar gate's
  // gradient (zeroed first: padding slots stay 0); d_g_gamma[h] is their sum over slots.
  float* gamma_chunk_sums = nullptr;  // [num_slots][H]
  // The folded normaliser (GlaBackwardArgs::norm_o; no gate, the scalar chunk kernel): d_o is the normalised
  // output's gradient, so the backward scan weights q's rows by 1/den_t as well; the chunk kernel adds the
  // normaliser's terms and its per-chunk key gradient Σ_t scale d den_t q_t to norm_key_grads, which
  // launch_bwd_norm_keys turns into dz after each chunk (added to dk there) and d_z_init. With norm_carries
  // instead (BwdPlan::norm_chain) the chunk kernel hands dz from chunk to chunk itself: each chunk's carry, dz
  // before the chunk, with its flag (cuda/common/flags.cuh, publish_float).
  View norm_o, norm_den;                 // [B,T,H,V] (dtype of q), f32 [B,T,H]
  const float* norm_chunk_z = nullptr;   // [slot][H][K]: z at each chunk's start (the forward's)
  float* norm_key_grads = nullptr;       // [num_slots][H][K] scratch
  unsigned long long* norm_carries = nullptr;  // [num_slots][H][K] scratch, zeroed before the scans
  View d_z_final, d_z_init;              // f32 [N,H,K], both optional

  // Recurrent: fp32 accumulators [B*T, H, K] (zeroed) and one [N, H, K] term;
  // see gla_bwd_recurrent.cu for the three parts of dg.
  float* dq_acc = nullptr;
  float* dk_acc = nullptr;
  float* dg_suffix_terms = nullptr;  // summed over this token and the later ones
  float* dg_prefix_terms = nullptr;  // summed over the earlier tokens
  float* dg_final = nullptr;         // added to every token
};

// Compute types: fp32 inputs run in fp32 (SIMT products, fp64 gate cumsums);
// bf16 and fp16 inputs run with tensor-core operands of their own type and fp32
// accumulation, as FLA does: fp16 rounded to bf16 would cost 3 bits (FLA's fp16
// gradients are checked to 1e-3 relative, bf16 operands give ~3e-3).
// fp16 keeps the scratch states in fp16 too, as FLA keeps h in k's dtype: the
// same bytes as bf16, and the state is an operand of the chunk kernel's products
// either way. A state entry beyond fp16's range (65504; an ungated state grows
// with T) is stored as inf, and the gradients that read it are not finite, as
// FLA's are (CudaGlaBackwardF16.StateBeyondRangeGivesNonFiniteDq); bf16 reaches 3e38.
// (A scale per key row, as the gates' one of dS, would have to come from the
// state's values, and a row's value tiles are scanned by different blocks.)
enum class Compute { f32, bf16, f16 };

// Whether every tile of t (D columns) is whole aligned 16-byte rows of bf16 (f32_rows: of fp32),
// with the rows of a chunk within 2^31 elements (32-bit offsets inside it).
bool bf16_rows(const View& t, int D);
bool f32_rows(const View& t, int D);
size_t bwd_chunk_smem_bytes(Compute c);
// The launchers run the instantiation the plan (plan.h) chose.
// phase: whole (the scans, then the fold of a split), summary (the scans and p.summary), output (the fold).
void launch_bwd_state_scan(const BwdParams& p, Compute c, BwdScanKernel scans, GlaPhase phase, cudaStream_t stream);
// overlap_scans (sm_90+): a programmatic dependent launch; the chunk kernel's
// blocks start as the state scans' blocks retire, compute dA and A, and wait
// for the scans (griddepcontrol.wait) before they read a state or write.
void launch_bwd_chunk(const BwdParams& p, BwdChunkKernel kernel, bool overlap_scans, cudaStream_t stream);
// BwdChunkKernel::scalar (gla_bwd_chunk_scalar.cu): a scalar gate or none, bf16 rows, K and V of 64 or 128.
void launch_bwd_scalar_chunk(const BwdParams& p, bool overlap_scans, cudaStream_t stream);
// After the chunk kernel, with the folded normaliser: norm_key_grads' suffix sums over each sequence's chunks
// (from d_z_final) added to dk, and d_z_init (gla_bwd_chunk_scalar.cu).
void launch_bwd_norm_keys(const BwdParams& p, cudaStream_t stream);
void launch_bwd_recurrent(const BwdParams& p, cudaStream_t stream);

}  // namespace flashgla::cuda::gla
