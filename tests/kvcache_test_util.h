// Shared by the CPU and CUDA tests of attention_with_kvcache: a case, random
// inputs (cache, lengths, block table, new keys), the call through the public
// API with o and lse poisoned (NaN), and the fp64 reference: the new keys
// appended on the host, each sequence's keys gathered into a plain [1, L, Hkv, D]
// tensor and attended by the CPU's naive fp64 attention.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <optional>
#include <ostream>
#include <random>
#include <vector>

#include "flashgla/attention.h"
#include "testing/buffer.h"

namespace flashgla::testing::kvcache_test {

struct Case {
  int64_t batch = 2, q_len = 1, q_heads = 4, kv_heads = 2, head_dim = 32, value_dim = 32;
  int64_t capacity = 96;       // Tmax, or max_blocks · block_size when paged
  int64_t block_size = 0;      // > 0: a paged cache
  int64_t spare_blocks = 3;    // paged: blocks no sequence owns
  std::vector<int64_t> seqlens;  // cached keys per sequence (before the append); empty: random
  bool append = false, causal = true;
  DType dtype = DType::f32;
  int num_splits = 0;
  std::optional<int64_t> max_seqlen_k;
  std::optional<double> scale;
  int64_t cache_padding = 0;  // elements after each cache row (D) on the device: strided caches

  Case with(DType d) const { Case c = *this; c.dtype = d; return c; }
  Case lens(std::vector<int64_t> l) const { Case c = *this; c.seqlens = std::move(l); c.batch = int64_t(c.seqlens.size()); return c; }
  Case queries(int64_t tq) const { Case c = *this; c.q_len = tq; return c; }
  Case heads(int64_t hq, int64_t hkv) const { Case c = *this; c.q_heads = hq, c.kv_heads = hkv; return c; }
  Case dims(int64_t d, int64_t dv) const { Case c = *this; c.head_dim = d, c.value_dim = dv; return c; }
  Case cap(int64_t t) const { Case c = *this; c.capacity = t; return c; }
  Case paged(int64_t bs) const { Case c = *this; c.block_size = bs; return c; }
  Case appending() const { Case c = *this; c.append = true; return c; }
  Case full() const { Case c = *this; c.causal = false; return c; }
  Case splits(int n) const { Case c = *this; c.num_splits = n; return c; }
  Case padded(int64_t n) const { Case c = *this; c.cache_padding = n; return c; }
  Case scaled(double s) const { Case c = *this; c.scale = s; return c; }
};

inline void PrintTo(const Case& c, std::ostream* os) {
  *os << dtype_name(c.dtype) << " B=" << c.batch << " Tq=" << c.q_len << " Hq=" << c.q_heads << " Hkv=" << c.kv_heads
      << " D=" << c.head_dim << " Dv=" << c.value_dim << " cap=" << c.capacity;
  if (c.block_size) *os << " paged bs=" << c.block_size;
  if (c.append) *os << " append";
  *os << (c.causal ? " causal" : " full");
  if (c.num_splits) *os << " splits=" << c.num_splits;
  if (c.cache_padding) *os << " cache padding=" << c.cache_padding;
  if (c.scale) *os << " scale=" << *c.scale;
  if (!c.seqlens.empty()) {
    *os << " lens:";
    for (int64_t l : c.seqlens) *os << " " << l;
  }
}

struct Inputs {
  Buffer q, k_cache, v_cache, cache_seqlens, block_table, k, v;
  std::vector<int64_t> lens;                 // cached keys per sequence
  std::vector<std::vector<int64_t>> blocks;  // paged: block of each key block of each sequence
};

inline Inputs make_inputs(const Case& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Inputs in;
  const int64_t added = c.append ? c.q_len : 0;
  in.lens = c.seqlens;
  for (int64_t b = int64_t(in.lens.size()); b < c.batch; ++b)
    in.lens.push_back(std::uniform_int_distribution<int64_t>(0, c.capacity - added)(rng));
  auto random = [&](std::vector<int64_t> shape) {
    Buffer t(c.dtype, std::move(shape));
    t.fill_normal(rng);
    return t;
  };
  in.q = random({c.batch, c.q_len, c.q_heads, c.head_dim});
  if (c.block_size > 0) {
    const int64_t max_blocks = c.capacity / c.block_size;
    const int64_t num_blocks = c.batch * max_blocks + c.spare_blocks;
    in.k_cache = random({num_blocks, c.block_size, c.kv_heads, c.head_dim});
    in.v_cache = random({num_blocks, c.block_size, c.kv_heads, c.value_dim});
    std::vector<int64_t> order(num_blocks);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<double> table;
    in.blocks.assign(c.batch, {});
    for (int64_t b = 0; b < c.batch; ++b) {
      const int64_t used = (in.lens[b] + added + c.block_size - 1) / c.block_size;
      for (int64_t i = 0; i < max_blocks; ++i) {
        const int64_t block = order[b * max_blocks + i];
        // Entries past a sequence's keys are never read: make them invalid.
        table.push_back(i < used ? double(block) : (i % 2 ? -7.0 : double(num_blocks + 11)));
        in.blocks[b].push_back(block);
      }
    }
    in.block_table = Buffer(DType::i32, {c.batch, max_blocks});
    in.block_table.set_values(table);
  } else {
    in.k_cache = random({c.batch, c.capacity, c.kv_heads, c.head_dim});
    in.v_cache = random({c.batch, c.capacity, c.kv_heads, c.value_dim});
  }
  in.cache_seqlens = Buffer(DType::i32, {c.batch});
  in.cache_seqlens.set_values(std::vector<double>(in.lens.begin(), in.lens.end()));
  if (c.append) {
    in.k = random({c.batch, c.q_len, c.kv_heads, c.head_dim});
    in.v = random({c.batch, c.q_len, c.kv_heads, c.value_dim});
  }
  return in;
}

inline Inputs to_device(const Inputs& in, Device dev, int64_t cache_padding = 0) {
  Inputs out = in;
  for (Buffer* t : {&out.q, &out.cache_seqlens, &out.block_table, &out.k, &out.v})
    if (t->defined()) *t = t->to(dev);
  out.k_cache = in.k_cache.to(dev, cache_padding);
  out.v_cache = in.v_cache.to(dev, cache_padding);
  return out;
}

inline AttentionKvCacheArgs make_args(const Case& c, const Inputs& in, const Buffer& o, const Buffer& lse) {
  AttentionKvCacheArgs a;
  a.q = in.q.view();
  a.k_cache = in.k_cache.view();
  a.v_cache = in.v_cache.view();
  a.cache_seqlens = in.cache_seqlens.view();
  a.block_table = in.block_table.view();
  a.k = in.k.view();
  a.v = in.v.view();
  a.causal = c.causal;
  a.scale = c.scale;
  a.num_splits = c.num_splits;
  a.max_seqlen_k = c.max_seqlen_k;
  a.o = o.view();
  a.lse = lse.view();
  return a;
}

struct Expected {
  std::vector<double> o, lse, k_cache, v_cache;
};

// Row offset (in elements of a logical-order values() vector) of key j, head 0, of sequence b.
inline int64_t row_of(const Case& c, const Inputs& in, int64_t b, int64_t j, int64_t dim) {
  if (c.block_size == 0) return ((b * c.capacity + j) * c.kv_heads) * dim;
  return ((in.blocks[b][j / c.block_size] * c.block_size + j % c.block_size) * c.kv_heads) * dim;
}

inline Expected reference(const Case& c, const Inputs& in) {
  Expected e;
  e.k_cache = in.k_cache.values();
  e.v_cache = in.v_cache.values();
  const int64_t D = c.head_dim, Dv = c.value_dim, Hkv = c.kv_heads, Tq = c.q_len;
  if (c.append) {
    const std::vector<double> k = in.k.values(), v = in.v.values();
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t i = 0; i < Tq; ++i) {
        std::copy_n(&k[((b * Tq + i) * Hkv) * D], Hkv * D, &e.k_cache[row_of(c, in, b, in.lens[b] + i, D)]);
        std::copy_n(&v[((b * Tq + i) * Hkv) * Dv], Hkv * Dv, &e.v_cache[row_of(c, in, b, in.lens[b] + i, Dv)]);
      }
  }
  const std::vector<double> q = in.q.values();
  e.o.assign(c.batch * Tq * c.q_heads * Dv, 0.0);
  e.lse.assign(c.batch * c.q_heads * Tq, -std::numeric_limits<double>::infinity());
  for (int64_t b = 0; b < c.batch; ++b) {
    const int64_t L = in.lens[b] + (c.append ? Tq : 0);
    if (L == 0) continue;  // nothing to attend: o = 0, lse = −inf
    std::vector<double> keys, values;
    for (int64_t j = 0; j < L; ++j) {
      const int64_t rk = row_of(c, in, b, j, D), rv = row_of(c, in, b, j, Dv);
      keys.insert(keys.end(), &e.k_cache[rk], &e.k_cache[rk] + Hkv * D);
      values.insert(values.end(), &e.v_cache[rv], &e.v_cache[rv] + Hkv * Dv);
    }
    Buffer qb(DType::f64, {1, Tq, c.q_heads, D}), kb(DType::f64, {1, L, Hkv, D}), vb(DType::f64, {1, L, Hkv, Dv});
    qb.set_values(std::vector<double>(&q[b * Tq * c.q_heads * D], &q[(b + 1) * Tq * c.q_heads * D]));
    kb.set_values(keys);
    vb.set_values(values);
    Buffer ob(DType::f64, {1, Tq, c.q_heads, Dv}), lb(DType::f32, {1, c.q_heads, Tq});
    AttentionForwardArgs f;
    f.q = qb.view(), f.k = kb.view(), f.v = vb.view(), f.causal = c.causal, f.scale = c.scale;
    f.algorithm = AttentionAlgorithm::naive;
    f.o = ob.view(), f.lse = lb.view();
    attention_forward(f);
    const std::vector<double> ov = ob.values(), lv = lb.values();
    std::copy(ov.begin(), ov.end(), &e.o[b * Tq * c.q_heads * Dv]);
    std::copy(lv.begin(), lv.end(), &e.lse[b * c.q_heads * Tq]);
  }
  return e;
}

// CUDA computes exp with the fast intrinsic (a few ulp), hence its looser fp32 bound.
inline double tolerance(DType d, Device dev) {
  switch (d) {
    case DType::f64: return 1e-12;
    case DType::f32: return dev.type == DeviceType::cuda ? 2e-5 : 2e-6;
    case DType::f16: return 2e-3;
    default: return 1e-2;
  }
}

// Runs the case on `dev` and checks o, lse and the cache (appended rows, all else untouched).
inline void check_case(const Case& c, Device dev, uint64_t seed) {
  const Inputs host = make_inputs(c, seed);
  const Expected e = reference(c, host);
  Inputs in = to_device(host, dev, c.cache_padding);
  Buffer o(c.dtype, {c.batch, c.q_len, c.q_heads, c.value_dim}, dev), lse(DType::f32, {c.batch, c.q_heads, c.q_len}, dev);
  o.poison();
  lse.poison();
  AttentionKvCacheArgs a = make_args(c, in, o, lse);
  const size_t bytes = attention_with_kvcache_workspace_bytes(a);
  Buffer ws;
  if (bytes > 0) {
    ws = Buffer(DType::f32, {int64_t((bytes + 3) / 4)}, dev);
    a.workspace = ws.view().data, a.workspace_bytes = bytes;
  }
  attention_with_kvcache(a);
  synchronize(dev);
  EXPECT_LE(rel_rms_error(o.values(), e.o), tolerance(c.dtype, dev));
  const std::vector<double> lv = lse.values();
  for (size_t i = 0; i < lv.size(); ++i) {
    if (std::isinf(e.lse[i])) {
      ASSERT_TRUE(std::isinf(lv[i]) && lv[i] < 0) << "lse[" << i << "] = " << lv[i] << ", expected -inf";
    } else {
      ASSERT_NEAR(lv[i], e.lse[i], 1e-5 + 1e-4 * std::abs(e.lse[i]) + (c.dtype == DType::bf16 ? 2e-2 : 0.0))
          << "lse[" << i << "]";
    }
  }
  EXPECT_EQ(in.k_cache.values(), e.k_cache) << "k_cache after the call";
  EXPECT_EQ(in.v_cache.values(), e.v_cache) << "v_cache after the call";
}

}  // namespace flashgla::testing::kvcache_test
