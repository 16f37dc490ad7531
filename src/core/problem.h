// The sizes of a call, resolved once by argument checking and handed to a backend.
#pragma once

#include <cstdint>

namespace flashgla {

enum class GateKind { none, scalar, vector };

struct GlaProblem {
  int64_t batch = 0;      // B (1 with cu_seqlens)
  int64_t seq_len = 0;    // T (total tokens with cu_seqlens)
  int64_t heads = 0;      // H
  int64_t key_dim = 0;    // K
  int64_t value_dim = 0;  // V
  int64_t num_seqs = 0;   // N: B, or len(cu_seqlens) - 1
  GateKind gate = GateKind::none;
  double scale = 1.0;     // resolved (K^-1/2 unless given)
  bool varlen = false;
  int64_t state_rows = 0; // decode: rows of the state (the pool size P with state_indices, else N)
};

// Sizes of attention over a KV cache (flashgla/attention.h, AttentionKvCacheArgs).
struct KvCacheProblem {
  int64_t batch = 0, q_len = 0;          // B, Tq
  int64_t q_heads = 0, kv_heads = 0;     // Hq, Hkv
  int64_t head_dim = 0, value_dim = 0;   // D, Dv
  bool paged = false;
  int64_t num_blocks = 0, block_size = 0, max_blocks = 0;  // paged: cache rows are blocks
  int64_t capacity = 0;                  // keys a sequence can hold: Tmax or max_blocks · block_size
  int64_t max_seqlen_k = 0;              // host-side bound on the keys a sequence attends
  bool append = false;                   // new k, v given
  double scale = 1.0;
  bool causal = true;
};

struct AttentionProblem {
  int64_t batch = 0;
  int64_t q_len = 0, k_len = 0;         // Tq, Tk (totals with cu_seqlens)
  int64_t q_heads = 0, kv_heads = 0;    // Hq, Hkv
  int64_t head_dim = 0, value_dim = 0;  // D, Dv
  int64_t num_seqs = 0;
  double scale = 1.0;
  bool causal = true;
  bool varlen = false;
};

}  // namespace flashgla
