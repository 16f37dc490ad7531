// The backward's chunk slots (BwdParams): a sequence and its first slot, the sequence and chunk of a slot,
// and where a slot's state tile lives in the scratch.
#pragma once

#include <cstdint>

#include "cuda/gla/device/gla_bwd.cuh"

namespace flashgla::cuda::gla {

// ---- sequences -----------------------------------------------------------------
// A sequence (cuda::sequence_span: boundaries clamped to [0, T], so that a bad
// cu_seqlens never sends an access out of bounds) and the chunk slot of its
// first chunk.
struct BwdSeq : SeqSpan {
  int64_t slot0;
};

// Chunk slots: with cu_seqlens, sequence n's chunks start at floor(begin / C) + n,
// which keeps the sequences' slots disjoint and below floor(T / C) + N + 1
// without a prefix sum over the lengths.
__device__ __forceinline__ BwdSeq sequence(const BwdParams& p, int64_t n) {
  if (!p.seqs.cu_seqlens) return {sequence_span(p.seqs, n), n * p.chunks_per_seq};
  const SeqSpan s = sequence_span(p.seqs, n);
  return {s, s.begin / kChunk + n};
}

__device__ __forceinline__ int64_t num_chunks(int64_t len) { return (len + kChunk - 1) / kChunk; }

// The sequence and chunk of a chunk slot; false for an unused slot.
__device__ __forceinline__ bool locate_chunk(const BwdParams& p, int64_t slot, BwdSeq& seq, int64_t& chunk) {
  if (!p.seqs.cu_seqlens) {
    seq = sequence(p, slot / p.chunks_per_seq);
    chunk = slot % p.chunks_per_seq;
    return true;
  }
  int64_t lo = 0, hi = p.num_seqs - 1;  // the last sequence whose first slot is <= slot
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (boundary(p.seqs, mid) / kChunk + mid <= slot) lo = mid;
    else hi = mid - 1;
  }
  seq = sequence(p, lo);
  chunk = slot - seq.slot0;
  return chunk >= 0 && chunk < num_chunks(seq.len);
}

__device__ __forceinline__ int64_t state_tile_index(const BwdParams& p, int64_t slot, int64_t h, int kt, int vt) {
  return (((slot * p.heads + h) * p.key_tiles + kt) * p.value_tiles + vt) * int64_t(kTileElems);
}

}  // namespace flashgla::cuda::gla
