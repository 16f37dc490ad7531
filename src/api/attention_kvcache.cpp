// attention_with_kvcache: check every argument, resolve sizes, dispatch.
#include <cmath>
#include <string>

#include "api/dispatch.h"
#include "core/elements.h"
#include "flashgla/attention.h"

namespace flashgla {
namespace {

std::string str(int64_t x) { return std::to_string(x); }

KvCacheProblem check_kvcache(const AttentionKvCacheArgs& a) {
  KvCacheProblem p;
  check::tensor(a.q, "q", 4, "[B, Tq, Hq, D]");
  check::floating(a.q, "q");
  p.batch = a.q.shape[0], p.q_len = a.q.shape[1], p.q_heads = a.q.shape[2], p.head_dim = a.q.shape[3];
  FLASHGLA_REQUIRE(p.batch >= 1 && p.q_len >= 1 && p.q_heads >= 1 && p.head_dim >= 1, ErrorKind::value, "q",
                   "B, Tq, Hq and D must be at least 1, got shape " + a.q.shape_str());
  const Device dev = a.q.device;
  const DType dt = a.q.dtype;

  p.paged = a.block_table.defined();
  const bool writes = a.k.defined() || a.v.defined();
  check::tensor(a.k_cache, "k_cache", 4, p.paged ? "[num_blocks, block_size, Hkv, D]" : "[B, Tmax, Hkv, D]", writes);
  p.kv_heads = a.k_cache.shape[2];
  FLASHGLA_REQUIRE(p.kv_heads >= 1 && p.q_heads % p.kv_heads == 0, ErrorKind::value, "k_cache",
                   "the number of KV heads (" + str(p.kv_heads) + ") must divide the number of query heads (" +
                       str(p.q_heads) + ")");
  FLASHGLA_REQUIRE(a.k_cache.shape[3] == p.head_dim, ErrorKind::value, "k_cache",
                   "the last dimension must be D = " + str(p.head_dim) + " (that of q), got shape " +
                       a.k_cache.shape_str());
  check::dtype(a.k_cache, "k_cache", dt);
  check::device(a.k_cache, "k_cache", dev, "q");
  check::tensor(a.v_cache, "v_cache", 4, p.paged ? "[num_blocks, block_size, Hkv, Dv]" : "[B, Tmax, Hkv, Dv]", writes);
  p.value_dim = a.v_cache.shape[3];
  FLASHGLA_REQUIRE(p.value_dim >= 1, ErrorKind::value, "v_cache", "Dv must be at least 1, got shape " + a.v_cache.shape_str());
  const int64_t rows0 = a.k_cache.shape[0], rows1 = a.k_cache.shape[1];
  check::shape(a.v_cache, "v_cache", {rows0, rows1, p.kv_heads, p.value_dim},
               p.paged ? "[num_blocks, block_size, Hkv, Dv]" : "[B, Tmax, Hkv, Dv]", writes);
  check::dtype(a.v_cache, "v_cache", dt);
  check::device(a.v_cache, "v_cache", dev, "q");

  if (p.paged) {
    check::tensor(a.block_table, "block_table", 2, "[B, max_blocks]");
    check::dtype(a.block_table, "block_table", DType::i32);
    check::device(a.block_table, "block_table", dev, "q");
    p.num_blocks = rows0, p.block_size = rows1, p.max_blocks = a.block_table.shape[1];
    FLASHGLA_REQUIRE(a.block_table.shape[0] == p.batch, ErrorKind::value, "block_table",
                     "expected [B, max_blocks] with B = " + str(p.batch) + " (that of q), got shape " +
                         a.block_table.shape_str());
    FLASHGLA_REQUIRE(p.num_blocks >= 1 && p.block_size >= 1 && p.max_blocks >= 1, ErrorKind::value, "k_cache",
                     "a paged cache needs num_blocks, block_size and max_blocks ≥ 1, got k_cache " +
                         a.k_cache.shape_str() + " and block_table " + a.block_table.shape_str());
    p.capacity = p.max_blocks * p.block_size;
  } else {
    FLASHGLA_REQUIRE(rows0 == p.batch, ErrorKind::value, "k_cache",
                     "expected [B, Tmax, Hkv, D] with B = " + str(p.batch) + " (that of q), got shape " +
                         a.k_cache.shape_str() + " (a paged cache needs block_table)");
    p.capacity = rows1;
  }

  check::shape(a.cache_seqlens, "cache_seqlens", {p.batch}, "[B]");
  check::dtype(a.cache_seqlens, "cache_seqlens", DType::i32);
  check::device(a.cache_seqlens, "cache_seqlens", dev, "q");

  FLASHGLA_REQUIRE(a.k.defined() == a.v.defined(), ErrorKind::value, a.k.defined() ? "v" : "k",
                   "new keys k and values v are given together or not at all");
  p.append = a.k.defined();
  if (p.append) {
    check::shape(a.k, "k", {p.batch, p.q_len, p.kv_heads, p.head_dim}, "[B, Tq, Hkv, D]");
    check::dtype(a.k, "k", dt);
    check::device(a.k, "k", dev, "q");
    check::shape(a.v, "v", {p.batch, p.q_len, p.kv_heads, p.value_dim}, "[B, Tq, Hkv, Dv]");
    check::dtype(a.v, "v", dt);
    check::device(a.v, "v", dev, "q");
    FLASHGLA_REQUIRE(p.q_len <= p.capacity, ErrorKind::value, "k",
                     "Tq = " + str(p.q_len) + " new keys do not fit a cache of capacity " + str(p.capacity));
  }

  p.max_seqlen_k = a.max_seqlen_k.value_or(p.capacity);
  FLASHGLA_REQUIRE(p.max_seqlen_k >= 0 && p.max_seqlen_k <= p.capacity, ErrorKind::value, "max_seqlen_k",
                   "must be in [0, " + str(p.capacity) + "] (the cache capacity), got " + str(p.max_seqlen_k));
  FLASHGLA_REQUIRE(a.num_splits >= 0, ErrorKind::value, "num_splits", "must be ≥ 0 (0: automatic), got " + str(a.num_splits));
  p.causal = a.causal;
  p.scale = a.scale.value_or(1.0 / std::sqrt(double(p.head_dim)));
  FLASHGLA_REQUIRE(std::isfinite(p.scale), ErrorKind::value, "scale", "must be finite, got " + std::to_string(p.scale));

  check::shape(a.o, "o", {p.batch, p.q_len, p.q_heads, p.value_dim}, "[B, Tq, Hq, Dv]", true);
  check::dtype(a.o, "o", dt);
  check::device(a.o, "o", dev, "q");
  if (a.lse.defined()) {
    check::shape(a.lse, "lse", {p.batch, p.q_heads, p.q_len}, "[B, Hq, Tq]", true);
    check::dtype(a.lse, "lse", DType::f32);
    check::device(a.lse, "lse", dev, "q");
  }

  // The values are readable here only on the CPU; CUDA clamps them on the device instead.
  if (dev.type == DeviceType::cpu) {
    const int64_t added = p.append ? p.q_len : 0;
    for (int64_t b = 0; b < p.batch; ++b) {
      const int64_t len = load_element<int64_t>(a.cache_seqlens, b * a.cache_seqlens.stride[0]);
      FLASHGLA_REQUIRE(len >= 0 && len + added <= p.capacity, ErrorKind::value, "cache_seqlens",
                       "cache_seqlens[" + str(b) + "] = " + str(len) + (p.append ? " plus Tq = " + str(added) : "") +
                           " must be in [0, " + str(p.capacity) + "] (the cache capacity)");
      if (!p.paged) continue;
      const int64_t used = (len + added + p.block_size - 1) / p.block_size;
      for (int64_t i = 0; i < used; ++i) {
        const int64_t block =
            load_element<int64_t>(a.block_table, b * a.block_table.stride[0] + i * a.block_table.stride[1]);
        FLASHGLA_REQUIRE(block >= 0 && block < p.num_blocks, ErrorKind::value, "block_table",
                         "block_table[" + str(b) + ", " + str(i) + "] = " + str(block) + " must be in [0, " +
                             str(p.num_blocks) + ") (num_blocks of k_cache)");
      }
    }
  }
  return p;
}

}  // namespace

void attention_with_kvcache(const AttentionKvCacheArgs& a) {
  FLASHGLA_DISPATCH(a.q.device, attention_with_kvcache, a, check_kvcache(a));
}

size_t attention_with_kvcache_workspace_bytes(const AttentionKvCacheArgs& a) {
  return FLASHGLA_WORKSPACE_BYTES(a.q.device, attention_with_kvcache_workspace_bytes, a, check_kvcache(a));
}

}  // namespace flashgla
