// Shared pieces of the CPU softmax-attention backend: which tokens form a
// sequence, which keys a query sees, where a query's lse lives, and the two
// algorithms (the fp64 naive reference and the tiled FlashAttention).
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/problem.h"
#include "cpu/io.h"
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
