// Shared pieces of the CPU softmax-attention backend: which tokens form a
// sequence, which keys a query sees, where a query's lse lives, and the two
// algorithms (the fp64 naive reference and the tiled FlashAttention).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "core/problem.h"
#include "cpu/common/io.h"
#include "flashgla/attention.h"

namespace flashgla::cpu {

// The query and key tokens of one sequence (they differ in length and, with
// varlen, in where they start).
struct AttentionSeq {
  SeqRange q, k;
};

inline AttentionSeq attention_sequence(const AttentionProblem& p, const TensorView& cu_q, const TensorView& cu_k,
                                       int64_t n) {
  if (!p.varlen) return {{n, 0, p.q_len}, {n, 0, p.k_len}};
  auto range = [n](const TensorView& cu) {
    const int64_t begin = load_element<int64_t>(cu, n * cu.stride[0]);
    const int64_t end = load_element<int64_t>(cu, (n + 1) * cu.stride[0]);
    return SeqRange{0, begin, end - begin};
  };
  return {range(cu_q), range(cu_k)};
}

// Query i (sequence-local) sees keys [0, visible_keys): all of them, or with
// the causal mask aligned to the bottom right those with j ≤ i + Tk − Tq.
inline int64_t visible_keys(const AttentionProblem& p, const AttentionSeq& s, int64_t i) {
  if (!p.causal) return s.k.len;
  return std::clamp<int64_t>(i + s.k.len - s.q.len + 1, 0, s.k.len);
}

// Grouped KV heads: consecutive query heads share one KV head.
inline int64_t kv_head_of(const AttentionProblem& p, int64_t q_head) { return q_head / (p.q_heads / p.kv_heads); }

// Element offset of lse[batch, head, begin + i] for a [B, Hq, Tq] view.
inline int64_t lse_offset(const TensorView& lse, const SeqRange& q, int64_t head, int64_t i) {
  return q.batch * lse.stride[0] + head * lse.stride[1] + (q.begin + i) * lse.stride[2];
}

// y += alpha · x over n elements (the compiler vectorises it).
template <class Acc>
inline void axpy(Acc alpha, const Acc* x, Acc* y, int64_t n) {
  for (int64_t d = 0; d < n; ++d) y[d] += alpha * x[d];
}

// Scores of one query x against `count` keys kept transposed ([dim][key],
// leading dimension ld), so that they are a sum of axpys, which the compiler
// vectorises; a dot product per key would need reassociation to vectorise.
template <class Acc>
inline void scores_against(const Acc* x, const Acc* keys_t, int64_t ld, int64_t dim, int64_t count, Acc* out) {
  std::fill(out, out + count, Acc(0));
  for (int64_t d = 0; d < dim; ++d) axpy(x[d], keys_t + d * ld, out, count);
}

// One query row's online-softmax step (FlashAttention) over a key tile of n raw
// scores q·k and its value rows v [n, Dv]: scales the scores, shrinks what was
// summed so far by exp(old max − new max) — on the row's first tile the old max
// is −inf and the factor is 0 — and adds the tile's exp(score − max) · v.
template <class Acc>
inline void online_softmax_step(Acc* scores, int64_t n, Acc scale, const Acc* v, int64_t Dv, Acc& row_max,
                                Acc& row_sum, Acc* out) {
  Acc tile_max = -std::numeric_limits<Acc>::infinity();
  for (int64_t c = 0; c < n; ++c) {
    scores[c] *= scale;
    tile_max = std::max(tile_max, scores[c]);
  }
  const Acc new_max = std::max(row_max, tile_max);
  const Acc rescale = std::exp(row_max - new_max);
  row_sum *= rescale;
  for (int64_t e = 0; e < Dv; ++e) out[e] *= rescale;
  for (int64_t c = 0; c < n; ++c) {
    const Acc prob = std::exp(scores[c] - new_max);
    row_sum += prob;
    axpy(prob, &v[c * Dv], out, Dv);
  }
  row_max = new_max;
}

// The reference: every score of a query row at once, in fp64 whatever the dtype.
void naive_attention_forward(const AttentionForwardArgs& args, const AttentionProblem& p);
// Recomputes everything from q, k, v in fp64; the given o and lse are not read.
void naive_attention_backward(const AttentionBackwardArgs& args, const AttentionProblem& p);

// FlashAttention with accumulation type Acc (float, or double for f64 inputs).
template <class Acc>
void tiled_attention_forward(const AttentionForwardArgs& args, const AttentionProblem& p);
template <class Acc>
void tiled_attention_backward(const AttentionBackwardArgs& args, const AttentionProblem& p);

}  // namespace flashgla::cpu
