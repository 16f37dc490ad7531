// The deterministic attention backward: the order in which key tiles add their share of dq.
//
// Every CTA of the backward owns one key tile of a (sequence, KV head) and adds dS K, its share of each query
// tile's dq, into the fp32 dq_accum. fp32 addition is not associative, so with atomics alone the rounding of dq
// depends on the order in which the CTAs arrive, and reruns differ in the last bits. With p.dq_turns set, each
// (query tile, 64-column block of dq) has a turn counter, and the key tiles add in a fixed order: the last key
// tile that sees a query of the tile first, then the one before it, down to key tile 0. Key tile t waits until
// the counter shows that every later key tile has added, adds, then passes the turn on.
//
// The Hopper backward adds a full query tile's share through a TMA reduction (attention_hopper_bwd.cu): the turn
// passes once the reduction has completed, behind a proxy fence, and the next key tile fences again after taking
// the turn. Where the next key tile reaches the query tile at least two steps later (causally), the pass waits for
// the next step, so that no warp stalls on the reduction's round trip.
//
// The backward hands out the key tiles last first (decode_work's reverse), so a CTA waits only on CTAs that were
// dispatched before it, and which wait only on earlier ones still: the wait always ends. Causally, the later key
// tiles also have the fewer query tiles, so they run ahead and the waits are short.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/attention/attention_params.cuh"
#include "cuda/attention/attention_sequences.cuh"
#include "cuda/common/flags.cuh"

namespace flashgla::cuda::attn {

// The counter of query tile m (queries m·bm ..) of query head `head` in sequence s, column block `block` of
// `blocks`.
__device__ __forceinline__ int* dq_turn(const AttentionParams& p, const Seq& s, int64_t head, int64_t m, int bm,
                                        int blocks, int block) {
  const int64_t slot = p.varlen ? s.index + s.q_begin / bm + m : m;
  return p.dq_turns + ((s.batch * p.q_heads + head) * p.dq_turn_slots + slot) * blocks + block;
}

// How many key tiles add to query tile m before key tile t: those after t that see a query of the tile (all
// key tiles without causal; causally, those up to the one holding the last query's last visible key).
__device__ __forceinline__ int dq_turn_of(const AttentionParams& p, const Seq& s, int64_t m, int bm, int bn,
                                          int64_t t) {
  int64_t last = (s.k_len + bn - 1) / bn - 1;
  if (p.causal) {
    const int64_t last_query = min((m + 1) * bm, s.q_len) - 1;
    last = min(last, (last_query + s.k_len - s.q_len) / bn);  // ≥ t: key tile t sees a query of the tile
  }
  return int(last - t);
}

// How many key tiles have added so far (acquire: their additions are visible after it).
__device__ __forceinline__ int read_dq_turn(const int* counter) { return load_acquire(counter); }

// One thread waits until `turn` key tiles have added (acquire: their additions are visible after it).
__device__ __forceinline__ void wait_for_dq_turn(const int* counter, int turn) { wait_until_at_least(counter, turn); }

// One thread passes the turn on once every thread of its group has added and the group met at a barrier
// (cuda/common/flags.cuh).
__device__ __forceinline__ void pass_dq_turn(int* counter) { release_add(counter, 1); }

}  // namespace flashgla::cuda::attn
