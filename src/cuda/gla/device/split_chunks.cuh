// The forward's sequence split (ChunkParams::chunks_per_split): which chunks a split covers and the state
// it starts from.
#pragma once

#include <cstdint>

#include "cuda/gla/device/elements.cuh"
#include "cuda/gla/device/gla_fwd.cuh"

namespace flashgla::cuda::gla {

// Sequence n cut into splits of p.chunks_per_split chunks (the sequence split of ChunkParams): split s covers
// chunks [begin(p, s), end(p, s)); last_split is the last one with chunks (0 for an empty sequence).
struct SplitChunks {
  SeqSpan seq;
  int64_t num_chunks, last_split;
  // Whether split s has nothing to do: no chunks, or the last split in a states pass (no later split reads it).
  __device__ __forceinline__ bool idle(int64_t split, bool states_pass) const {
    return split > last_split || (states_pass && split == last_split);
  }
  __device__ __forceinline__ int64_t begin(const ChunkParams& p, int64_t split) const {
    return split * p.chunks_per_split;
  }
  __device__ __forceinline__ int64_t end(const ChunkParams& p, int64_t split) const {
    return min(num_chunks, begin(p, split) + p.chunks_per_split);
  }
};
__device__ __forceinline__ SplitChunks split_chunks(const ChunkParams& p, int64_t n) {
  SplitChunks s;
  s.seq = sequence_span(p.seqs, n);
  s.num_chunks = (s.seq.len + kChunk - 1) / kChunk;
  s.last_split = s.num_chunks == 0 ? 0 : (s.num_chunks - 1) / p.chunks_per_split;
  return s;
}

// The state at the start of split `split` of sequence n, head h (nh = n · heads + h), at key `key` and value
// column vg: h0's element (0 without h0) folded through the earlier splits' states and decays, the slots of an
// in-kernel states pass (ChunkParams::states_only).
__device__ __forceinline__ float split_start_state(const ChunkParams& p, int64_t n, int h, int64_t nh, int split,
                                                   int key, int vg, int K, int V) {
  float s = 0.f;
  if (p.h0.data)
    s = static_cast<const float*>(p.h0.data)[n * p.h0.stride[0] + h * p.h0.stride[1] + key * p.h0.stride[2] +
                                              vg * p.h0.stride[3]];
  for (int prev = 0; prev < split; ++prev) {
    const int64_t slot = nh * (p.num_splits - 1) + prev;
    s = p.split_decay[slot * K + key] * s + p.split_states[(slot * K + key) * V + vg];
  }
  return s;
}

}  // namespace flashgla::cuda::gla
