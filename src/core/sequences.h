// Sequence boundaries on the host: the tokens of sequence n of a checked
// problem, fixed-length or from cu_seqlens.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/elements.h"
#include "core/problem.h"
#include "flashgla/tensor.h"

namespace flashgla {

// A sequence: batch row `batch`, tokens [begin, begin + len).
struct SeqRange {
  int64_t batch = 0;
  int64_t begin = 0;
  int64_t len = 0;
};

// The n-th sequence of a checked problem (cu_seqlens, when given, is on the CPU).
inline SeqRange sequence(const GlaProblem& p, const TensorView& cu_seqlens, int64_t n) {
  if (!p.varlen) return {n, 0, p.seq_len};
  int64_t b = load_element<int64_t>(cu_seqlens, n * cu_seqlens.stride[0]);
  int64_t e = load_element<int64_t>(cu_seqlens, (n + 1) * cu_seqlens.stride[0]);
  return {0, b, e - b};
}

// The longest of a varlen problem's sequences from boundaries on the CPU, as the CUDA kernels read them: each
// boundary clamped into [0, T] (cuda/common/sequences.cuh). For checked boundaries the clamp changes nothing;
// boundaries read back from the device (the CUDA planner's) are unchecked.
inline int64_t longest_of_boundaries(const GlaProblem& p, const TensorView& host_cu_seqlens) {
  int64_t longest = 0;
  for (int64_t n = 0; n < p.num_seqs; ++n) {
    const SeqRange s = sequence(p, host_cu_seqlens, n);
    const int64_t begin = std::clamp<int64_t>(s.begin, 0, p.seq_len);
    longest = std::max(longest, std::clamp<int64_t>(s.begin + s.len, 0, p.seq_len) - begin);
  }
  return longest;
}

// The longest sequence of a checked problem as the host can know it: the fixed length, else from
// cu_seqlens_host or a cu_seqlens on the CPU; -1 where the boundaries are only in device memory.
inline int64_t longest_sequence(const GlaProblem& p, const TensorView& cu_seqlens, const TensorView& cu_seqlens_host) {
  if (!p.varlen) return p.seq_len;
  const TensorView& host = cu_seqlens_host.defined() ? cu_seqlens_host : cu_seqlens;
  if (host.device.type != DeviceType::cpu) return -1;
  return longest_of_boundaries(p, host);
}

}  // namespace flashgla
