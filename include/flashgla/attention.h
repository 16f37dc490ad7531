// Softmax attention computed tile by tile with the online softmax
// (FlashAttention), forward and backward.
//
// q [B,Tq,Hq,D], k [B,Tk,Hkv,D], v [B,Tk,Hkv,Dv]; Hkv divides Hq (grouped
// KV heads: query head h reads KV head h / (Hq/Hkv)). Causal masking is
// aligned to the bottom right as in FlashAttention ≥ 2.1: query i sees keys
// j ≤ i + Tk − Tq; a query that sees no key gets o = 0 and lse = −inf.
// Varlen: B == 1 with cu_seqlens_q and cu_seqlens_k of length N+1.
#pragma once

#include <optional>

#include "flashgla/tensor.h"
#include "flashgla/tuning.h"

namespace flashgla {

enum class AttentionAlgorithm {
  tiled,  // FlashAttention: online softmax over key tiles
  naive,  // CPU only: full score matrix in fp64 (the reference)
};

struct AttentionForwardArgs {
  TensorView q, k, v;                    // f64/f32/bf16/f16, one dtype
  TensorView cu_seqlens_q, cu_seqlens_k; // optional, both or neither: [N+1] i32/i64
  bool causal = true;
  std::optional<double> scale;           // default D^-1/2
  AttentionAlgorithm algorithm = AttentionAlgorithm::tiled;

  TensorView o;    // out: [B,Tq,Hq,Dv], dtype of q
  TensorView lse;  // out: [B,Hq,Tq] f32, natural-log sum of exp(scale·q·k) per query
  void* stream = nullptr;
  void* workspace = nullptr;  // as in GlaForwardArgs (flashgla/gla.h)
  size_t workspace_bytes = 0;
  WorkspaceAllocator allocate_workspace;  // used when workspace is null (flashgla/tensor.h)
  AttentionTuning tuning;     // the library's kernel unless set (flashgla/tuning.h)
};

struct AttentionBackwardArgs {
  TensorView q, k, v, cu_seqlens_q, cu_seqlens_k;
  bool causal = true;
  std::optional<double> scale;
  AttentionAlgorithm algorithm = AttentionAlgorithm::tiled;
  TensorView o;    // the forward's output
  TensorView lse;  // the forward's lse
  TensorView d_o;  // [B,Tq,Hq,Dv], dtype of q

  TensorView dq, dk, dv;  // out: shapes and dtype of q, k, v
  // Bitwise the same dq on every run. The CPU and the CUDA kernels for fp32 and other head dims are deterministic
  // anyway; the CUDA bf16/fp16 kernels for D in {64, 128} otherwise add the key tiles' shares of dq in whatever
  // order they arrive (faster), and with this flag in a fixed order.
  bool deterministic = false;
  void* stream = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  WorkspaceAllocator allocate_workspace;  // used when workspace is null (flashgla/tensor.h)
  AttentionTuning tuning;
};

void attention_forward(const AttentionForwardArgs& args);
void attention_backward(const AttentionBackwardArgs& args);
size_t attention_forward_workspace_bytes(const AttentionForwardArgs& args);  // checks args; 0 on the CPU
size_t attention_backward_workspace_bytes(const AttentionBackwardArgs& args);

// Attention of new queries over a KV cache (decoding), FlashAttention's
// flash_attn_with_kvcache. Sequence b has L_b = cache_seqlens[b] cached keys,
// plus Tq when new k, v are given: those are first written into the cache at
// rows cache_seqlens[b] .. cache_seqlens[b] + Tq − 1 (in place) and then
// attended. Query i of sequence b sees keys j < L_b, and with causal those with
// j ≤ i + L_b − Tq (bottom-right aligned); a query that sees no key gets o = 0
// and lse = −inf.
//
// The cache is contiguous, k_cache [B, Tmax, Hkv, D], or paged, k_cache
// [num_blocks, block_size, Hkv, D] with block_table [B, max_blocks] i32: key j
// of sequence b is row j % block_size of block block_table[b, j / block_size].
// The capacity of a sequence is Tmax, or max_blocks · block_size.
//
// CUDA runs f32/bf16/f16 with D ∈ {64, 128} and Dv == D (else an unsupported
// error); the CPU any float dtype and sizes (fp32 accumulation, fp64 for f64).
//
// Bounds: on the CPU, cache_seqlens and block_table are read and checked
// (0 ≤ L_b ≤ capacity; the blocks holding a sequence's L_b keys in
// [0, num_blocks), entries past them are never read; errors name them). On CUDA
// they stay on the device and are never read back (graph-capturable): there L_b
// is clamped to [0, capacity], new keys past the capacity are dropped, and a
// key whose block index is outside [0, num_blocks) is neither read nor written
// (it is masked out) — garbage in gives wrong numbers, never an illegal access.
struct AttentionKvCacheArgs {
  TensorView q;                 // [B, Tq, Hq, D], f64/f32/bf16/f16
  TensorView k_cache, v_cache;  // [B, Tmax, Hkv, D] / [.., Dv], or paged [num_blocks, block_size, Hkv, D] / [.., Dv]
  TensorView cache_seqlens;     // [B] i32, keys already in the cache
  TensorView block_table;       // optional: [B, max_blocks] i32 (a paged cache)
  TensorView k, v;              // optional, both or neither: [B, Tq, Hkv, D] / [.., Dv], appended in place
  bool causal = true;
  std::optional<double> scale;  // default D^-1/2
  // A host-side bound on L_b (after the append) used to plan the CUDA split
  // over keys; default the capacity. Never read from the device.
  std::optional<int64_t> max_seqlen_k;
  int num_splits = 0;  // CUDA: key splits per (sequence, head); 0 picks one to fill the GPU

  TensorView o;    // out: [B, Tq, Hq, Dv], dtype of q
  TensorView lse;  // optional out: [B, Hq, Tq] f32
  void* stream = nullptr;
  void* workspace = nullptr;  // CUDA: attention_with_kvcache_workspace_bytes() of scratch
  size_t workspace_bytes = 0;
  WorkspaceAllocator allocate_workspace;  // used when workspace is null (flashgla/tensor.h)
};

void attention_with_kvcache(const AttentionKvCacheArgs& args);
size_t attention_with_kvcache_workspace_bytes(const AttentionKvCacheArgs& args);  // checks args; 0 on the CPU

}  // namespace flashgla
