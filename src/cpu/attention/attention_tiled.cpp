// FlashAttention on the CPU (online softmax: docs/algorithm.md section 8): the
// forward walks key tiles keeping a running max and running sum per query and
// rescaling the partial output; the backward (FlashAttention-2) recomputes
// P = exp(S − lse) instead of storing it.
// Acc is the accumulation type: float for f32/bf16/f16, double for f64.
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/attention/attention_common.h"
#include "cpu/common/parallel.h"

namespace flashgla::cpu {
namespace {

constexpr int64_t kQueryTile = 64;
constexpr int64_t kKeyTile = 64;

template <class Acc>
Acc dot(const Acc* a, const Acc* b, int64_t n) {
  Acc sum = 0;
  for (int64_t d = 0; d < n; ++d) sum += a[d] * b[d];
  return sum;
}

// Keys are kept transposed ([dim][key], leading dimension ld): see scores_against.
template <class Acc>
void transpose(const Acc* rows, int64_t count, int64_t dim, int64_t ld, Acc* out) {
  for (int64_t c = 0; c < count; ++c)
    for (int64_t d = 0; d < dim; ++d) out[d * ld + c] = rows[c * dim + d];
}

// Rows [begin, begin + len) of a sequence's token range.
SeqRange sub_range(const SeqRange& s, int64_t begin, int64_t len) { return {s.batch, s.begin + begin, len}; }

// Keys [j0, j0 + cols) of a key tile that query i sees: the first `return` of them.
int64_t visible_in_tile(const AttentionProblem& p, const AttentionSeq& s, int64_t i, int64_t j0, int64_t cols) {
  return std::clamp<int64_t>(visible_keys(p, s, i) - j0, 0, cols);
}

// One query tile of one head: rows [i0, i0 + rows) of sequence s.
struct QueryTile {
  AttentionSeq seq;
  int64_t head = 0;
  int64_t i0 = 0, rows = 0;
};

template <class Acc>
void forward_tile(const AttentionForwardArgs& args, const AttentionProblem& p, const QueryTile& tile) {
  const int64_t D = p.head_dim, Dv = p.value_dim, rows = tile.rows;
  const AttentionSeq& s = tile.seq;
  constexpr Acc kNegInf = -std::numeric_limits<Acc>::infinity();
  std::vector<Acc> q(rows * D), k(kKeyTile * D), k_t(D * kKeyTile), v(kKeyTile * Dv), scores(kKeyTile);
  std::vector<Acc> row_max(rows, kNegInf), row_sum(rows, Acc(0)), acc(rows * Dv, Acc(0));
  gather_rows(args.q, sub_range(s.q, tile.i0, rows), tile.head, q.data());

  // The tile's last row sees the most keys; key tiles past them are skipped.
  const int64_t keys_seen = visible_keys(p, s, tile.i0 + rows - 1);
  const int64_t kv_head = kv_head_of(p, tile.head);
  for (int64_t j0 = 0; j0 < keys_seen; j0 += kKeyTile) {
    const int64_t cols = std::min(kKeyTile, keys_seen - j0);
    gather_rows(args.k, sub_range(s.k, j0, cols), kv_head, k.data());
    gather_rows(args.v, sub_range(s.k, j0, cols), kv_head, v.data());
    transpose(k.data(), cols, D, kKeyTile, k_t.data());
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t visible = visible_in_tile(p, s, tile.i0 + r, j0, cols);
      if (visible == 0) continue;
      scores_against(&q[r * D], k_t.data(), kKeyTile, D, visible, scores.data());
      online_softmax_step(scores.data(), visible, Acc(p.scale), v.data(), Dv, row_max[r], row_sum[r], &acc[r * Dv]);
    }
  }

  // Normalise once at the end; a row that saw no key keeps o = 0 and lse = −inf.
  for (int64_t r = 0; r < rows; ++r) {
    const bool saw_keys = row_sum[r] > 0;
    const Acc inv_sum = saw_keys ? Acc(1) / row_sum[r] : Acc(0);
    for (int64_t e = 0; e < Dv; ++e) acc[r * Dv + e] *= inv_sum;
    const double lse = saw_keys ? double(row_max[r]) + std::log(double(row_sum[r])) : double(kNegInf);
    store_element<float>(args.lse, lse_offset(args.lse, s.q, tile.head, tile.i0 + r), float(lse));
  }
  scatter_rows(args.o, sub_range(s.q, tile.i0, rows), tile.head, acc.data());
}

// Backward for one (sequence, KV head): this work item alone writes dk and dv
// of the KV head (summed over the query heads that share it) and dq of those
// query heads, so no two threads ever touch the same output element.
template <class Acc>
void backward_kv_head(const AttentionBackwardArgs& args, const AttentionProblem& p, const AttentionSeq& s,
                      int64_t kv_head) {
  const int64_t D = p.head_dim, Dv = p.value_dim, Tq = s.q.len, Tk = s.k.len;
  const int64_t group = p.q_heads / p.kv_heads;
  std::vector<Acc> k(Tk * D), v(Tk * Dv), k_t(D * Tk), v_t(Dv * Tk), dk(Tk * D, Acc(0)), dv(Tk * Dv, Acc(0));
  gather_rows(args.k, s.k, kv_head, k.data());
  gather_rows(args.v, s.k, kv_head, v.data());
  transpose(k.data(), Tk, D, Tk, k_t.data());
  transpose(v.data(), Tk, Dv, Tk, v_t.data());
  std::vector<Acc> q(Tq * D), d_o(Tq * Dv), o(Tq * Dv), dq(Tq * D), lse(Tq), row_dot(Tq);
  std::vector<Acc> scores(kKeyTile), dprobs(kKeyTile);
  for (int64_t h = kv_head * group; h < (kv_head + 1) * group; ++h) {
    gather_rows(args.q, s.q, h, q.data());
    gather_rows(args.d_o, s.q, h, d_o.data());
    gather_rows(args.o, s.q, h, o.data());
    // D_i = rowsum(dO ⊙ O) equals Σ_j P_ij dP_ij, the softmax Jacobian's correction.
    for (int64_t i = 0; i < Tq; ++i) {
      lse[i] = Acc(load_element<float>(args.lse, lse_offset(args.lse, s.q, h, i)));
      row_dot[i] = dot(&d_o[i * Dv], &o[i * Dv], Dv);
    }
    std::fill(dq.begin(), dq.end(), Acc(0));
    // FlashAttention-2 order: key tiles outside (their dk, dv stay hot), queries inside.
    for (int64_t j0 = 0; j0 < Tk; j0 += kKeyTile) {
      const int64_t cols = std::min(kKeyTile, Tk - j0);
      for (int64_t i = 0; i < Tq; ++i) {
        const int64_t visible = visible_in_tile(p, s, i, j0, cols);
        if (visible == 0) continue;  // a query that sees no key (lse = −inf) has no gradient
        scores_against(&q[i * D], &k_t[j0], Tk, D, visible, scores.data());
        scores_against(&d_o[i * Dv], &v_t[j0], Tk, Dv, visible, dprobs.data());
        for (int64_t c = 0; c < visible; ++c) {
          const int64_t j = j0 + c;
          const Acc prob = std::exp(Acc(p.scale) * scores[c] - lse[i]);
          const Acc dscore = Acc(p.scale) * prob * (dprobs[c] - row_dot[i]);
          axpy(prob, &d_o[i * Dv], &dv[j * Dv], Dv);
          axpy(dscore, &q[i * D], &dk[j * D], D);
          axpy(dscore, &k[j * D], &dq[i * D], D);
        }
      }
    }
    scatter_rows(args.dq, s.q, h, dq.data());
  }
  scatter_rows(args.dk, s.k, kv_head, dk.data());
  scatter_rows(args.dv, s.k, kv_head, dv.data());
}

}  // namespace

template <class Acc>
void tiled_attention_forward(const AttentionForwardArgs& args, const AttentionProblem& p) {
  // Work items: (sequence, query head, query tile); varlen sequences differ in tile count.
  std::vector<QueryTile> tiles;
  for (int64_t n = 0; n < p.num_seqs; ++n) {
    const AttentionSeq s = attention_sequence(p, args.cu_seqlens_q, args.cu_seqlens_k, n);
    for (int64_t h = 0; h < p.q_heads; ++h)
      for (int64_t i0 = 0; i0 < s.q.len; i0 += kQueryTile) tiles.push_back({s, h, i0, std::min(kQueryTile, s.q.len - i0)});
  }
  parallel_for(int64_t(tiles.size()), [&](int64_t t) { forward_tile<Acc>(args, p, tiles[t]); });
}

template <class Acc>
void tiled_attention_backward(const AttentionBackwardArgs& args, const AttentionProblem& p) {
  parallel_for(p.num_seqs * p.kv_heads, [&](int64_t item) {
    const int64_t n = item / p.kv_heads;
    backward_kv_head<Acc>(args, p, attention_sequence(p, args.cu_seqlens_q, args.cu_seqlens_k, n), item % p.kv_heads);
  });
}

template void tiled_attention_forward<float>(const AttentionForwardArgs&, const AttentionProblem&);
template void tiled_attention_forward<double>(const AttentionForwardArgs&, const AttentionProblem&);
template void tiled_attention_backward<float>(const AttentionBackwardArgs&, const AttentionProblem&);
template void tiled_attention_backward<double>(const AttentionBackwardArgs&, const AttentionProblem&);

}  // namespace flashgla::cpu
