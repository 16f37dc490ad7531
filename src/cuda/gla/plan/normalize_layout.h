// How the CUDA linear-attention normaliser (kernels/gla_normalize.cu) cuts its work, in plain C++ so
// that the CPU tests check the arithmetic (tests/test_gla_normalize_layout.cpp).
//
// Each sequence is cut into chunks of kChunk steps in processing order (step i is token i, or token
// len-1-i with reverse), and a chunk never crosses a sequence. One block per (chunk slot, head);
// inside it, `teams` teams of `lanes` threads (lanes a power of two up to a warp, so a team sums
// over its lanes with shuffles) each walk steps_per_team consecutive steps; a lane owns the key
// column vectors lane, lane + lanes, ... (vectors of vec_k columns: 16-byte loads where the rows
// allow).
#pragma once

#include <cstdint>

#include "flashgla/tensor.h"

#ifdef __CUDACC__
#define FLASHGLA_NORM_HD __host__ __device__
#else
#define FLASHGLA_NORM_HD
#endif

namespace flashgla::cuda::norm {

constexpr int kChunk = 64;        // steps per chunk
constexpr float kEps = 1e-10f;    // added to scale · q·z, as FLA does
constexpr int kMaxThreads = 256;  // per block
// teams · K floats of shared memory per team array (the forward has one, the backward two): at most
// 24 KB each while K allows more than one team.
constexpr int64_t kTeamFloats = 6144;

FLASHGLA_NORM_HD inline int64_t chunks_of(int64_t len) { return len > 0 ? (len + kChunk - 1) / kChunk : 0; }

// Chunk slots. Fixed-length batch: sequence n's chunks are slots n·chunks_per_seq + c. With cu_seqlens,
// sequence n's first slot is floor(begin / kChunk) + n: disjoint for sequences in order, all below
// floor(T / kChunk) + N, with no prefix sum over the lengths.
struct ChunkSlots {
  bool varlen = false;
  int64_t chunks_per_seq = 0;  // fixed-length only
  int64_t num_seqs = 0;
  int64_t count = 0;           // slots in all (the grid's x extent)
};

inline ChunkSlots chunk_slots(int64_t batch, int64_t seq_len, int64_t num_seqs, bool varlen) {
  ChunkSlots s;
  s.varlen = varlen, s.num_seqs = num_seqs;
  if (varlen) {
    s.count = num_seqs > 0 && seq_len > 0 ? seq_len / kChunk + num_seqs : 0;
  } else {
    s.chunks_per_seq = chunks_of(seq_len);
    s.count = batch * s.chunks_per_seq;
  }
  return s;
}

FLASHGLA_NORM_HD inline int64_t first_slot(const ChunkSlots& s, int64_t n, int64_t begin) {
  return s.varlen ? begin / kChunk + n : n * s.chunks_per_seq;
}

// The sequence n and chunk c of `slot`; false for a slot no chunk uses. `boundary(i)` is cu_seqlens[i]
// clamped into [0, T] (varlen only); a sequence's length is its end minus its begin, 0 if negative.
template <class Boundary>
FLASHGLA_NORM_HD bool locate_slot(const ChunkSlots& s, int64_t slot, const Boundary& boundary, int64_t& n,
                                  int64_t& chunk) {
  if (!s.varlen) {
    if (s.chunks_per_seq == 0) return false;
    n = slot / s.chunks_per_seq, chunk = slot % s.chunks_per_seq;
    return n < s.num_seqs;
  }
  if (s.num_seqs <= 0) return false;
  int64_t lo = 0, hi = s.num_seqs - 1;  // the last sequence whose first slot is <= slot
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (boundary(mid) / kChunk + mid <= slot) lo = mid;
    else hi = mid - 1;
  }
  n = lo;
  const int64_t begin = boundary(lo), end = boundary(lo + 1);
  chunk = slot - first_slot(s, lo, begin);
  return chunk >= 0 && chunk < chunks_of(end > begin ? end - begin : 0);
}

// Step `step` of a sequence of `len` tokens starting at `begin` -> its token (row).
FLASHGLA_NORM_HD inline int64_t step_row(int64_t begin, int64_t len, int64_t step, bool reverse) {
  return begin + (reverse ? len - 1 - step : step);
}

struct TeamShape {
  int vectors = 0;         // key column vectors: ceil(K / vec_k)
  int lanes = 0;           // threads per team: a power of two, at most 32
  int teams = 0;           // a power of two dividing kChunk
  int steps_per_team = 0;  // kChunk / teams
  int threads = 0;         // lanes · teams: whole warps
  size_t team_array_bytes = 0;  // one [teams][K] fp32 array in shared memory
};

inline int64_t pow2_at_least(int64_t x) {
  int64_t p = 1;
  while (p < x) p *= 2;
  return p;
}

inline int64_t pow2_at_most(int64_t x) {
  int64_t p = 1;
  while (p * 2 <= x) p *= 2;
  return p;
}

inline TeamShape team_shape(int64_t key_dim, int vec_k) {
  TeamShape t;
  t.vectors = int((key_dim + vec_k - 1) / vec_k);
  t.lanes = int(pow2_at_least(t.vectors) < 32 ? pow2_at_least(t.vectors) : 32);
  int64_t teams = kMaxThreads / t.lanes;
  if (teams > kChunk) teams = kChunk;
  const int64_t by_shared = pow2_at_most(kTeamFloats / key_dim > 1 ? kTeamFloats / key_dim : 1);
  if (teams > by_shared) teams = by_shared;
  // A warp of one team at least: a team sums with shuffles over the whole warp.
  while (t.lanes * teams < 32) teams *= 2;
  t.teams = int(teams);
  t.steps_per_team = kChunk / t.teams;
  t.threads = t.lanes * t.teams;
  t.team_array_bytes = size_t(t.teams) * size_t(key_dim) * sizeof(float);
  return t;
}

// Whether a [B, T, H, D] tensor can be read as vectors of `vec` elements of `element_bytes` each
// (16 bytes in all): unit stride on D, D and the strides of the other dimensions (those longer than
// one) multiples of vec, an aligned base.
inline bool vector_rows(const TensorView& t, int vec, int element_bytes) {
  if (vec == 1) return true;
  if ((t.shape[3] > 1 && t.stride[3] != 1) || t.shape[3] % vec != 0) return false;
  for (int d = 0; d < 3; ++d)
    if (t.shape[d] > 1 && t.stride[d] % vec != 0) return false;
  return reinterpret_cast<uintptr_t>(t.data) % size_t(vec * element_bytes) == 0;
}

// Workspace, in floats: the forward's per-chunk key sums [slots, H, K]; the backward's key sums, the
// per-chunk sums of d_den·scale·q [slots, H, K] and d_den [slots, H, kChunk].
inline size_t forward_workspace_floats(const ChunkSlots& s, int64_t heads, int64_t key_dim) {
  return size_t(s.count) * size_t(heads) * size_t(key_dim);
}
inline size_t backward_workspace_floats(const ChunkSlots& s, int64_t heads, int64_t key_dim) {
  return 2 * forward_workspace_floats(s, heads, key_dim) + size_t(s.count) * size_t(heads) * kChunk;
}

}  // namespace flashgla::cuda::norm
