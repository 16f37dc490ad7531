// Gated linear attention (GLA): forward, backward and single-step decode.
//
// Per sequence and head, with log-space gate g_t (g_t = log α_t ≤ 0):
//     S_t = diag(exp g_t) S_{t-1} + k_t^T v_t,   S_0 = initial_state or 0
//     o_t = scale · q_t S_t
// The gate is a per-key vector g [B,T,H,K] (GLA), a scalar per head and step
// g [B,T,H] (simple GLA), or absent (plain linear attention).
//
// Layout is [B, T, H, D]; strides are honoured. Variable-length batches pack
// N sequences into B = 1 and give their boundaries in cu_seqlens [N+1].
// States are fp32 [N, H, K, V] (N = B without cu_seqlens), or [N, H, V, K]
// with state_v_first (FLA 0.6's name). Outputs are allocated by the caller;
// nothing here allocates device memory.
//
// g_gamma [H] (FLA 0.6's chunk_simple_gla, RetNet style) is a constant log
// decay per head added to every step's scalar gate: the gate of step t is
// g[b,t,h] + g_gamma[h] (just g_gamma[h] without g). It takes a scalar
// gate (or none); the sum passes through fp32 scratch [B,T,H] of the workspace.
#pragma once

#include <optional>

#include "flashgla/tensor.h"
#include "flashgla/tuning.h"

namespace flashgla {

enum class GlaAlgorithm {
  chunked,    // FlashLinearAttention: chunks of 64, secondary 16-wide sub-chunks
  recurrent,  // token by token; on the CPU it accumulates in fp64 (the reference)
};

// One chunked call in two (context parallelism, flashgla.distributed; docs/context_parallel.md): first what
// does not depend on the state entering (forward) or the gradient leaving (backward) the sequences, with each
// sequence's summary from it; then, once the caller has the state or gradient from the other ranks, the rest.
// Only where gla_forward_phases_apply / gla_backward_phases_apply say so (CUDA, chunked): the summary then comes
// out of the op's own passes (the forward's split states pass, the backward's state scans), not a pass of its own.
enum class GlaPhase {
  whole,    // the op in one call
  summary,  // the split pass alone, and each sequence's summary; the workspace keeps what the output call reads
  output,   // the rest, after a summary call with the same arguments and the same workspace
};

struct GlaForwardArgs {
  TensorView q;              // [B,T,H,K] f64/f32/bf16/f16
  TensorView k;              // [B,T,H,K] same dtype as q
  TensorView v;              // [B,T,H,V] same dtype as q
  TensorView g;              // optional: [B,T,H,K] or [B,T,H], any float dtype
  TensorView initial_state;  // optional: [N,H,K,V] f32
  TensorView cu_seqlens;     // optional: [N+1] i32/i64, 0 = c0 ≤ c1 ≤ … ≤ cN = T; needs B == 1
  TensorView cu_seqlens_host;  // optional: a CPU copy of a CUDA cu_seqlens, so it can be checked
                               // and planned for without reading device memory
  std::optional<double> scale;  // default K^-1/2
  GlaAlgorithm algorithm = GlaAlgorithm::chunked;
  bool reverse = false;      // recurrent only: run each sequence from its last token to its first
  TensorView g_gamma;        // optional: [H], any float dtype; with a scalar g [B,T,H] or without g
  bool state_v_first = false;  // initial_state / final_state (and pools) are [N,H,V,K]

  TensorView o;              // out: [B,T,H,V], dtype of q
  TensorView final_state;    // optional out: [N,H,K,V] f32

  // The linear-attention normaliser in the same call (FLA's chunk_linear_attn(normalize=True); no gate): o is
  // the normalised output of flashgla/gla_normalize.h, o_t / (scale · q_t·z_t + 1e-10) with z_t the running key
  // sum from z_init (reverse: from the sequence's end). The CUDA chunked fast kernel divides by it as it stores
  // o; elsewhere the normaliser runs after the op, on o in place.
  bool normalize = false;
  TensorView z_init;         // optional with normalize: [N,H,K], any float dtype
  TensorView z_final;        // optional out with normalize: [N,H,K] f32 (f64 for f64 inputs)
  // Optional outs with normalize, for gla_backward's folded normaliser, where gla_normalize_residual_slots(args)
  // is S > 0: the denominators [B,T,H] f32 and z at each chunk's start [S,H,K] f32 (contiguous).
  TensorView norm_den;
  TensorView norm_chunk_z;

  // State pools (prefill into a serving stack's pool; forward only). With
  // initial_state_indices (i32 [N]), initial_state is a pool [P,H,K,V] and
  // sequence n starts from row initial_state_indices[n] (negative: zeros); with
  // final_state_indices (i32 [N]), final_state is a pool [P',H,K,V] and sequence
  // n's final state goes to row final_state_indices[n] (negative: not written).
  // Both may name one pool. Rows are checked (< P, final rows distinct) for CPU
  // tensors only; on CUDA a row ≥ P counts as negative and duplicate final rows
  // are undefined. The states pass through dense copies in the workspace.
  TensorView initial_state_indices;
  TensorView final_state_indices;

  // Serving state pools under vLLM's names (FLA's fused_recurrent_kda_fwd): the recurrent
  // algorithm, forward in time, reads and writes pool rows directly (no dense copies).
  // ssm_state_indices (i32 [N] or [N, T_max]) makes initial_state a pool [P,H,K,V]. Sequence n
  // starts from row ssm_state_indices[n] ([N]) or ssm_state_indices[n, a_n - 1] ([N, T_max]),
  // with a_n = num_accepted_tokens[n] (i32 [N], 1 ≤ a_n ≤ T_max; needs [N, T_max]) or 1 without
  // it. A negative start row is a padded slot: zero outputs, no pool row read or written.
  // inplace_final_state: states go back into the pool initial_state (final_state stays empty):
  // with [N] the final state to the start row (not for an empty sequence); with [N, T_max] the
  // state after token t < T_max to row ssm_state_indices[n, t] (negative: not written). Without
  // it, final_state (optional, f32 [B*T, H, K, V]) gets the state after every token at the
  // token's row of the packed batch (b*T + t, or c_n + t with cu_seqlens); a padded slot's rows
  // are not written. Rows are checked (< P, non-negative ones distinct, a_n in range) for CPU
  // tensors only; on CUDA a start row ≥ P or an a_n out of range counts as padded and a write
  // row ≥ P is not written; duplicates are undefined there. On CUDA a fixed-length batch of up to
  // kMaxDecodeTokens tokens, or [N, T_max] rows with T_max ≤ kMaxDecodeTokens (vLLM's decode and
  // speculative steps), runs gla_decode's kernel on the pool rows.
  TensorView ssm_state_indices;
  TensorView num_accepted_tokens;
  bool inplace_final_state = false;

  void* stream = nullptr;    // cudaStream_t for CUDA tensors (nullptr: the default stream)
  // Device scratch of at least gla_*_workspace_bytes(args) bytes. Left null, a
  // CUDA backend that needs scratch asks allocate_workspace for it, else takes it
  // stream-ordered (cudaMallocAsync), which CUDA graphs can capture.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  WorkspaceAllocator allocate_workspace;  // used when workspace is null (flashgla/tensor.h)
  GlaTuning tuning;          // the library's choices unless a field is set (flashgla/tuning.h)

  // GlaPhase::summary: the states pass over every split of every sequence; `summary` (out, f32 [N,H,K,V+1])
  // gets each sequence's end state from a zero start (columns 0..V-1) and its summed log gate (column V), as
  // gla_segment_states gives them; o and final_state are not written, initial_state is not read.
  // GlaPhase::output: the output pass from the split states the summary call left in the workspace, with any
  // initial_state; bitwise the whole call's o and final_state (summary is not read). Both calls take the
  // workspace given (gla_forward_workspace_bytes(args) bytes, with args.phase set), never allocate_workspace.
  GlaPhase phase = GlaPhase::whole;
  TensorView summary;

  // Optional out: [B,T,H,64] of q's dtype, contiguous: the intra-chunk scores A of each chunk of 64 tokens
  // (row t: A[t, s] = Σ_k q_tk k_sk exp(Γ_tk − Γ_sk) for the tokens s ≤ t of t's chunk, column s − the chunk's
  // first token; zero for s > t; without the scale), for gla_backward to read instead of recomputing them.
  // Only where gla_forward_saves_intra(args) (else an error): the forward then takes the kernel that writes it.
  TensorView intra;
};

struct GlaBackwardArgs {
  TensorView q, k, v, g, initial_state, cu_seqlens, cu_seqlens_host;  // as in the forward
  std::optional<double> scale;
  GlaAlgorithm algorithm = GlaAlgorithm::chunked;
  bool reverse = false;
  TensorView g_gamma;        // as in the forward
  bool state_v_first = false;  // initial_state, d_final_state and d_initial_state are [N,H,V,K]
  TensorView d_o;            // [B,T,H,V], dtype of q: gradient of o
  TensorView d_final_state;  // optional: [N,H,K,V] f32, gradient of the final state (dht)

  TensorView dq, dk, dv;     // out: shapes and dtype of q, k, v
  TensorView dg;             // out, required iff g is given: shape of g, f32 or g's dtype
  TensorView d_initial_state;  // optional out: [N,H,K,V] f32 (dh0), also without initial_state
  TensorView d_g_gamma;      // optional out (only with g_gamma): [H] f32 or g_gamma's dtype, the sum over
                             // every token of the gate's gradient

  // The linear-attention normaliser folded in (chunk_linear_attn(normalize=True), CUDA, where the forward's
  // gla_normalize_residual_slots was S > 0): d_o is the gradient of the normalised output norm_o; norm_den and
  // norm_chunk_z are the forward's (GlaForwardArgs), and dq, dk get the normaliser's terms too.
  TensorView norm_o;         // [B,T,H,V], dtype of q
  TensorView norm_den;       // [B,T,H] f32, contiguous
  TensorView norm_chunk_z;   // [S,H,K] f32, contiguous
  TensorView d_z_final;      // optional: [N,H,K] f32, the gradient of z_final
  TensorView d_z_init;       // optional out: [N,H,K] f32, the gradient of z_init

  void* stream = nullptr;
  void* workspace = nullptr;  // as in GlaForwardArgs
  size_t workspace_bytes = 0;
  WorkspaceAllocator allocate_workspace;  // used when workspace is null (flashgla/tensor.h)
  GlaTuning tuning;

  // GlaPhase::summary: the state scans, with the backward scan from a zero gradient at each sequence's end;
  // `summary` (out, f32 [N,H,K,V]) gets each sequence's entering-state gradient for that zero gradient, as
  // gla_segment_state_grads gives it; d_final_state is not read, the gradients not written.
  // GlaPhase::output: the scans' fold, which adds d_final_state (any) decayed to every stored gradient state,
  // and the chunk kernel: the whole call's gradients up to rounding (the stored states take d_final_state in
  // the fold, not in the scan). Both calls take the workspace given, as in GlaForwardArgs.
  GlaPhase phase = GlaPhase::whole;
  TensorView summary;

  // Optional: the forward's intra (GlaForwardArgs::intra), the same shape. Read where gla_forward_saves_intra
  // says the forward with these q, k, v, g wrote it, else not read (A is recomputed). The caller keeps it with the
  // tensors it came from: the scores of other inputs give wrong gradients.
  TensorView intra;
};

// Most tokens one gla_decode call takes per sequence (speculative decoding).
inline constexpr int kMaxDecodeTokens = 16;

// T ≤ kMaxDecodeTokens tokens per sequence, applied in order; the state is read
// and updated in place. q, k, v, g, o either have no token dimension (one token:
// q [N,H,K]) or one after N (q [N,T,H,K], g [N,T,H,K] or [N,T,H]).
//
// State pool: with state_indices (i32 [N], on the device of q), `state` is a
// pool [P,H,K,V] and sequence i reads and updates row state_indices[i]; a
// negative index is a padded slot (its outputs and token states are zeros, no
// pool row is read or written). Indices must be < P and the non-negative ones distinct: checked for
// CPU tensors; on CUDA they are not read back (no sync) and a row ≥ P is
// treated like a padded slot, never accessed; duplicates are undefined there.
// Without state_indices, state is [N,H,K,V].
//
// token_states (optional out, f32 [N*T,H,K,V], row n*T + t) receives the state
// of sequence n after its token t, so that a verifier accepting tokens 0..t can
// copy row n*T + t back into the pool.
struct GlaDecodeArgs {
  TensorView q;              // [N,H,K] or [N,T,H,K]
  TensorView k;              // shape and dtype of q
  TensorView v;              // [N,H,V] or [N,T,H,V], dtype of q
  TensorView g;              // optional: [N,H,K] / [N,H], or [N,T,H,K] / [N,T,H]; any float dtype
  TensorView state;          // in/out: [N,H,K,V] f32, or the pool [P,H,K,V] with state_indices
  TensorView state_indices;  // optional: i32 [N], pool rows (negative: padded slot)
  std::optional<double> scale;
  TensorView o;              // out: shape of v, dtype of q
  TensorView token_states;   // optional out: f32 [N*T,H,K,V]
  void* stream = nullptr;
};

// Per-segment summaries for context parallelism (each sequence of the batch is
// a segment L; see docs/context_parallel.md). With a zero start state, per head:
//     states[n]    = S(L) = Σ_{t∈L} (k_t ⊙ exp Σ_{u∈L,u>t} g_u)ᵀ v_t   (the end state)
//     log_decay[n] = a(L) = Σ_{t∈L} g_t                                 (0 without a gate)
// so that the end state from any h0 is diag(exp a) h0 + S. An empty segment
// gives S = 0, a = 0. −inf gates give −inf in log_decay, never NaN. Reads k,
// v and g only: no output pass, no full forward.
struct GlaSegmentStatesArgs {
  TensorView k;                // [B,T,H,K] f64/f32/bf16/f16
  TensorView v;                // [B,T,H,V] same dtype as k
  TensorView g;                // optional: [B,T,H,K] or [B,T,H], any float dtype
  TensorView g_gamma;          // optional: [H] any float dtype, as in GlaForwardArgs: the gate is
                               // g + g_gamma (g [B,T,H] or absent), staged in fp32
  TensorView cu_seqlens;       // optional: as in GlaForwardArgs (N segments)
  TensorView cu_seqlens_host;  // optional: as in GlaForwardArgs

  TensorView states;           // out: [N,H,K,V] f32 (or f64 for f64 inputs)
  TensorView log_decay;        // out: [N,H,K] f32 (or f64 for f64 inputs); a scalar gate's sum
                               // is repeated over K

  void* stream = nullptr;      // as in GlaForwardArgs
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  WorkspaceAllocator allocate_workspace;  // used when workspace is null (flashgla/tensor.h)
  GlaTuning tuning;
};

// The mirror for the backward: the gradient of each segment's entering state
// when the gradient at its end is zero,
//     d_states[n] = B(L) = scale · Σ_{t∈L} (q_t ⊙ exp Σ_{u∈L,u≤t} g_u)ᵀ do_t,
// the d_initial_state gla_backward gives for d_final_state = 0, and then
// dh0 = diag(exp a) dht + B for any dht. Reads q, d_o and g only.
struct GlaSegmentStateGradsArgs {
  TensorView q;                // [B,T,H,K] f64/f32/bf16/f16
  TensorView d_o;              // [B,T,H,V] same dtype as q
  TensorView g;                // optional: [B,T,H,K] or [B,T,H], any float dtype
  TensorView g_gamma;          // optional: [H], as in GlaSegmentStatesArgs
  TensorView cu_seqlens, cu_seqlens_host;  // optional: as in GlaForwardArgs
  std::optional<double> scale;  // default K^-1/2

  TensorView d_states;         // out: [N,H,K,V] f32 (or f64 for f64 inputs)

  void* stream = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  WorkspaceAllocator allocate_workspace;  // used when workspace is null (flashgla/tensor.h)
  GlaTuning tuning;
};

void gla_forward(const GlaForwardArgs& args);
size_t gla_forward_workspace_bytes(const GlaForwardArgs& args);  // checks args; 0 on the CPU
void gla_backward(const GlaBackwardArgs& args);
size_t gla_backward_workspace_bytes(const GlaBackwardArgs& args);
// Whether args may run as a summary call and an output call (GlaPhase; args.phase is not read): CUDA, the
// chunked algorithm, forward in time, no normaliser or state pools, g_gamma in fp32; for the forward, a plan
// that splits the sequences with its states kernel. Checks args.
bool gla_forward_phases_apply(const GlaForwardArgs& args);
bool gla_backward_phases_apply(const GlaBackwardArgs& args);
// With normalize: S > 0, the chunk slots of norm_chunk_z, where the chunked forward fills norm_den and
// norm_chunk_z for args and gla_backward folds the normaliser in with them (CUDA: the fast forward kernel and
// the scalar backward chunk kernel, bf16 with K and V of 64 or 128); else 0 (the normaliser's own backward,
// flashgla/gla_normalize.h, then gla_backward). Checks args.
int64_t gla_normalize_residual_slots(const GlaForwardArgs& args);
// Whether a forward with these arguments writes GlaForwardArgs::intra (and its backward reads it): CUDA, chunked,
// bf16 or fp16 q, k, v with a vector gate, every row 16-byte aligned, K ≤ 128, or K ≤ 256 on sm_90; no state
// pools, no normalize, not a summary call. A function of the tensors' dtypes, shapes, strides and device.
bool gla_forward_saves_intra(const GlaForwardArgs& args);
inline constexpr int kIntraColumns = 64;  // the chunk length: intra's last dimension
void gla_decode(const GlaDecodeArgs& args);
void gla_segment_states(const GlaSegmentStatesArgs& args);
size_t gla_segment_states_workspace_bytes(const GlaSegmentStatesArgs& args);  // checks args; 0 on the CPU
void gla_segment_state_grads(const GlaSegmentStateGradsArgs& args);
size_t gla_segment_state_grads_workspace_bytes(const GlaSegmentStateGradsArgs& args);

}  // namespace flashgla
