// The fp64 reference for softmax attention: for each query, the scores against
// every visible key, a two-pass softmax, and the gradients written out
// directly from their definitions. Slow and exact; everything else is checked
// against it, and it is checked by finite differences.
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/attention/attention_common.h"
#include "cpu/common/parallel.h"

namespace flashgla::cpu {
namespace {

double dot(const double* a, const double* b, int64_t n) {
  double sum = 0;
  for (int64_t d = 0; d < n; ++d) sum += a[d] * b[d];
  return sum;
}

// Softmax probabilities of query row q_row over keys [0, visible) into p;
// returns the lse (−inf when no key is visible).
double softmax_row(const double* q_row, const std::vector<double>& k, int64_t visible, int64_t D, double scale,
                   std::vector<double>& p) {
  if (visible == 0) return -std::numeric_limits<double>::infinity();
  double max_score = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < visible; ++j) {
    p[j] = scale * dot(q_row, &k[j * D], D);
    max_score = std::max(max_score, p[j]);
  }
  double sum = 0;
  for (int64_t j = 0; j < visible; ++j) sum += (p[j] = std::exp(p[j] - max_score));
  for (int64_t j = 0; j < visible; ++j) p[j] /= sum;
  return max_score + std::log(sum);
}

}  // namespace

void naive_attention_forward(const AttentionForwardArgs& args, const AttentionProblem& p) {
  const int64_t D = p.head_dim, Dv = p.value_dim;
  parallel_for(p.num_seqs * p.q_heads, [&](int64_t item) {
    const int64_t n = item / p.q_heads, h = item % p.q_heads;
    const AttentionSeq s = attention_sequence(p, args.cu_seqlens_q, args.cu_seqlens_k, n);
    std::vector<double> q(s.q.len * D), k(s.k.len * D), v(s.k.len * Dv), o(s.q.len * Dv, 0.0), probs(s.k.len);
    gather_rows(args.q, s.q, h, q.data());
    gather_rows(args.k, s.k, kv_head_of(p, h), k.data());
    gather_rows(args.v, s.k, kv_head_of(p, h), v.data());
    for (int64_t i = 0; i < s.q.len; ++i) {
      const int64_t visible = visible_keys(p, s, i);
      const double lse = softmax_row(&q[i * D], k, visible, D, p.scale, probs);
      for (int64_t j = 0; j < visible; ++j)
        for (int64_t e = 0; e < Dv; ++e) o[i * Dv + e] += probs[j] * v[j * Dv + e];
      store_element<float>(args.lse, lse_offset(args.lse, s.q, h, i), float(lse));
    }
    scatter_rows(args.o, s.q, h, o.data());
  });
}

// One work item per (sequence, KV head) owns that head's dk and dv, which sum
// over the query heads sharing it.
void naive_attention_backward(const AttentionBackwardArgs& args, const AttentionProblem& p) {
  const int64_t D = p.head_dim, Dv = p.value_dim, group = p.q_heads / p.kv_heads;
  parallel_for(p.num_seqs * p.kv_heads, [&](int64_t item) {
    const int64_t n = item / p.kv_heads, kv_head = item % p.kv_heads;
    const AttentionSeq s = attention_sequence(p, args.cu_seqlens_q, args.cu_seqlens_k, n);
    std::vector<double> k(s.k.len * D), v(s.k.len * Dv), dk(s.k.len * D, 0.0), dv(s.k.len * Dv, 0.0);
    gather_rows(args.k, s.k, kv_head, k.data());
    gather_rows(args.v, s.k, kv_head, v.data());
    std::vector<double> q(s.q.len * D), d_o(s.q.len * Dv), dq(s.q.len * D), probs(s.k.len), dprobs(s.k.len);
    for (int64_t h = kv_head * group; h < (kv_head + 1) * group; ++h) {
      gather_rows(args.q, s.q, h, q.data());
      gather_rows(args.d_o, s.q, h, d_o.data());
      std::fill(dq.begin(), dq.end(), 0.0);
      for (int64_t i = 0; i < s.q.len; ++i) {
        const int64_t visible = visible_keys(p, s, i);
        softmax_row(&q[i * D], k, visible, D, p.scale, probs);
        // dP_ij = dO_i · v_j, and dS = P ⊙ (dP − Σ_j P_ij dP_ij) is the softmax's Jacobian applied to dP.
        double row_dot = 0;
        for (int64_t j = 0; j < visible; ++j) row_dot += probs[j] * (dprobs[j] = dot(&d_o[i * Dv], &v[j * Dv], Dv));
        for (int64_t j = 0; j < visible; ++j) {
          const double ds = probs[j] * (dprobs[j] - row_dot);
          for (int64_t d = 0; d < D; ++d) {
            dq[i * D + d] += p.scale * ds * k[j * D + d];
            dk[j * D + d] += p.scale * ds * q[i * D + d];
          }
          for (int64_t e = 0; e < Dv; ++e) dv[j * Dv + e] += probs[j] * d_o[i * Dv + e];
        }
      }
      scatter_rows(args.dq, s.q, h, dq.data());
    }
    scatter_rows(args.dk, s.k, kv_head, dk.data());
    scatter_rows(args.dv, s.k, kv_head, dv.data());
  });
}

}  // namespace flashgla::cpu
