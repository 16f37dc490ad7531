// Folding the per-rank state summaries of context-parallel GLA (see
// flashgla.distributed in Python and docs/context_parallel.md).
//
// A sequence split over ranks j = 0..P-1 of a group: rank j summarises its run
// of tokens by the end state from a zero start S_j and the summed log gate a_j
// (per key). The state entering the run after ranks begin..end-1 is the
// recurrence
//     h ← diag(exp a_j) h + S_j      for j = begin, ..., end-1, from h = 0
// (reverse = false: the forward's entering state). The backward's mirror runs
// the same step from the last rank down,
//     d ← diag(exp a_j) d + B_j      for j = end-1, ..., begin, from d = 0
// (reverse = true), B_j being each run's entering-state gradient. With
// `initial`, h (or d) starts from it instead of 0; with `accumulate`, the
// result is added to `out` instead of replacing it. The
// recurrence is evaluated step by step, never as differences of prefix sums of
// a, so a gate of −inf (a full reset) gives exact zeros and never NaN.
#pragma once

#include <cstdint>

#include "flashgla/tensor.h"

namespace flashgla {

struct GlaFoldStatesArgs {
  TensorView states;     // [P, M, K, V] f32 (f64 allowed on the CPU): S_j (or B_j); M = rows × heads
  TensorView log_decay;  // [P, M, K], dtype of states: a_j (≤ 0 or −inf)
  int64_t begin = 0;     // 0 ≤ begin ≤ end ≤ P: the ranks folded
  int64_t end = 0;
  bool reverse = false;  // false: j ascending (forward); true: j descending (backward)
  TensorView initial;    // optional: [M, K, V], dtype of states: the start of the recurrence (0 when absent)
  bool accumulate = false;  // out += result (out must then hold finite values)

  TensorView out;        // out: [M, K, V], dtype of states (initial, or zeros, when begin == end)
  void* stream = nullptr;  // cudaStream_t for CUDA tensors
};

// Checks every argument (flashgla::Error naming it), then folds. Any strides
// (a slice of a packed [P, M, K, V+1] all-gather buffer is fine); no workspace,
// no host synchronisation.
void gla_fold_states(const GlaFoldStatesArgs& args);

}  // namespace flashgla
