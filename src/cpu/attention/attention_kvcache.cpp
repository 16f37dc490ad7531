// Attention over a KV cache on the CPU: new keys and values are written into
// the cache first (each sequence's rows are its own, so sequences run in
// parallel), then each (sequence, query head, query tile) walks its keys tile
// by tile with the online softmax, as the tiled FlashAttention of
// attention_tiled.cpp, translating key indices through the block table of a
// paged cache. Arguments arrive checked, cache_seqlens and block_table included.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/backend.h"
#include "cpu/attention/attention_common.h"
#include "cpu/common/io.h"
#include "cpu/common/parallel.h"

namespace flashgla::cpu {
namespace {

constexpr int64_t kQueryTile = 32;
constexpr int64_t kKeyTile = 64;

// Where key j of sequence b lives: the element offset of [row, head 0, d 0].
struct CacheRows {
  const AttentionKvCacheArgs& a;
  const KvCacheProblem& p;
  int64_t offset(const TensorView& cache, int64_t b, int64_t j) const {
    if (!p.paged) return b * cache.stride[0] + j * cache.stride[1];
    const int64_t block =
        load_element<int64_t>(a.block_table, b * a.block_table.stride[0] + (j / p.block_size) * a.block_table.stride[1]);
    return block * cache.stride[0] + (j % p.block_size) * cache.stride[1];
  }
};

int64_t cached(const AttentionKvCacheArgs& a, int64_t b) {
  return load_element<int64_t>(a.cache_seqlens, b * a.cache_seqlens.stride[0]);
}

// Copies element by element (dtypes are equal, so this is exact).
void append_sequence(const AttentionKvCacheArgs& a, const KvCacheProblem& p, const CacheRows& rows, int64_t b) {
  const int64_t start = cached(a, b);
  for (int64_t i = 0; i < p.q_len; ++i)
    for (int64_t h = 0; h < p.kv_heads; ++h) {
      const int64_t kc = rows.offset(a.k_cache, b, start + i) + h * a.k_cache.stride[2];
      const int64_t vc = rows.offset(a.v_cache, b, start + i) + h * a.v_cache.stride[2];
      const int64_t kn = b * a.k.stride[0] + i * a.k.stride[1] + h * a.k.stride[2];
      const int64_t vn = b * a.v.stride[0] + i * a.v.stride[1] + h * a.v.stride[2];
      for (int64_t d = 0; d < p.head_dim; ++d)
        store_element<double>(a.k_cache, kc + d * a.k_cache.stride[3], load_element<double>(a.k, kn + d * a.k.stride[3]));
      for (int64_t d = 0; d < p.value_dim; ++d)
        store_element<double>(a.v_cache, vc + d * a.v_cache.stride[3], load_element<double>(a.v, vn + d * a.v.stride[3]));
    }
}

struct Tile {
  int64_t b, head, i0, rows;
};

template <class Acc>
void forward_tile(const AttentionKvCacheArgs& a, const KvCacheProblem& p, const CacheRows& cache_rows, const Tile& t) {
  const int64_t D = p.head_dim, Dv = p.value_dim, rows = t.rows;
  const int64_t L = cached(a, t.b) + (p.append ? p.q_len : 0);
  const int64_t kv_head = t.head / (p.q_heads / p.kv_heads);
  constexpr Acc kNegInf = -std::numeric_limits<Acc>::infinity();
  // Query i sees keys [0, visible(i)).
  auto visible = [&](int64_t i) {
    return p.causal ? std::clamp<int64_t>(i + L - p.q_len + 1, 0, L) : L;
  };
  std::vector<Acc> q(rows * D), k_t(D * kKeyTile), v(kKeyTile * Dv), scores(kKeyTile);
  std::vector<Acc> row_max(rows, kNegInf), row_sum(rows, Acc(0)), acc(rows * Dv, Acc(0));
  gather_rows(a.q, SeqRange{t.b, t.i0, rows}, t.head, q.data());

  const int64_t keys_seen = visible(t.i0 + rows - 1);
  for (int64_t j0 = 0; j0 < keys_seen; j0 += kKeyTile) {
    const int64_t cols = std::min(kKeyTile, keys_seen - j0);
    // Keys transposed ([d][key]) so a query's scores are a sum of vectorisable axpys.
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t ko = cache_rows.offset(a.k_cache, t.b, j0 + c) + kv_head * a.k_cache.stride[2];
      const int64_t vo = cache_rows.offset(a.v_cache, t.b, j0 + c) + kv_head * a.v_cache.stride[2];
      for (int64_t d = 0; d < D; ++d) k_t[d * kKeyTile + c] = load_element<Acc>(a.k_cache, ko + d * a.k_cache.stride[3]);
      for (int64_t e = 0; e < Dv; ++e) v[c * Dv + e] = load_element<Acc>(a.v_cache, vo + e * a.v_cache.stride[3]);
    }
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t seen = std::clamp<int64_t>(visible(t.i0 + r) - j0, 0, cols);
      if (seen == 0) continue;
      scores_against(&q[r * D], k_t.data(), kKeyTile, D, seen, scores.data());
      online_softmax_step(scores.data(), seen, Acc(p.scale), v.data(), Dv, row_max[r], row_sum[r], &acc[r * Dv]);
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    const bool saw_keys = row_sum[r] > 0;
    const Acc inv_sum = saw_keys ? Acc(1) / row_sum[r] : Acc(0);
    for (int64_t e = 0; e < Dv; ++e) acc[r * Dv + e] *= inv_sum;
    if (a.lse.defined()) {
      const double lse = saw_keys ? double(row_max[r]) + std::log(double(row_sum[r])) : double(kNegInf);
      store_element<float>(a.lse, t.b * a.lse.stride[0] + t.head * a.lse.stride[1] + (t.i0 + r) * a.lse.stride[2],
                           float(lse));
    }
  }
  scatter_rows(a.o, SeqRange{t.b, t.i0, rows}, t.head, acc.data());
}

template <class Acc>
void run(const AttentionKvCacheArgs& a, const KvCacheProblem& p) {
  const CacheRows rows{a, p};
  // A paged cache may map two sequences to one block (shared prefixes); appends
  // then race, as in FlashAttention, so they run one sequence after another.
  if (p.append) {
    if (p.paged) {
      for (int64_t b = 0; b < p.batch; ++b) append_sequence(a, p, rows, b);
    } else {
      parallel_for(p.batch, [&](int64_t b) { append_sequence(a, p, rows, b); });
    }
  }
  std::vector<Tile> tiles;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.q_heads; ++h)
      for (int64_t i0 = 0; i0 < p.q_len; i0 += kQueryTile) tiles.push_back({b, h, i0, std::min(kQueryTile, p.q_len - i0)});
  parallel_for(int64_t(tiles.size()), [&](int64_t i) { forward_tile<Acc>(a, p, rows, tiles[i]); });
}

}  // namespace

void attention_with_kvcache(const AttentionKvCacheArgs& args, const KvCacheProblem& problem) {
  if (args.q.dtype == DType::f64) return run<double>(args, problem);
  run<float>(args, problem);
}

}  // namespace flashgla::cpu
