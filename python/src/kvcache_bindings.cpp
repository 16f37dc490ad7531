// flashgla._C: attention over a KV cache (attention_with_kvcache in
// flashgla/attention.h), for the PyTorch op in python/flashgla/attention.py.
// Tensors cross as the tuples module.cpp reads; nothing here computes.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>

#include <cstdint>
#include <optional>

#include "bindings.h"
#include "flashgla/flashgla.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

flashgla::AttentionKvCacheArgs kvcache_args(nb::handle q, nb::handle k_cache, nb::handle v_cache,
                                            nb::handle cache_seqlens, nb::handle block_table, nb::handle k,
                                            nb::handle v, bool causal, std::optional<double> scale,
                                            std::optional<int64_t> max_seqlen_k, int num_splits, nb::handle o,
                                            nb::handle lse) {
  flashgla::AttentionKvCacheArgs a;
  a.q = tensor_view_from_python(q, "q");
  a.k_cache = tensor_view_from_python(k_cache, "k_cache");
  a.v_cache = tensor_view_from_python(v_cache, "v_cache");
  a.cache_seqlens = tensor_view_from_python(cache_seqlens, "cache_seqlens");
  a.block_table = tensor_view_from_python(block_table, "block_table");
  a.k = tensor_view_from_python(k, "k");
  a.v = tensor_view_from_python(v, "v");
  a.causal = causal;
  a.scale = scale;
  a.max_seqlen_k = max_seqlen_k;
  a.num_splits = num_splits;
  a.o = tensor_view_from_python(o, "o");
  a.lse = tensor_view_from_python(lse, "lse");
  return a;
}

}  // namespace

void bind_kvcache(nb::module_& m) {
  m.def(
      "attention_with_kvcache",
      [](nb::handle q, nb::handle k_cache, nb::handle v_cache, nb::handle cache_seqlens, nb::handle block_table,
         nb::handle k, nb::handle v, bool causal, std::optional<double> scale, std::optional<int64_t> max_seqlen_k,
         int num_splits, nb::handle o, nb::handle lse, uintptr_t stream, uintptr_t workspace, size_t workspace_bytes) {
        auto a = kvcache_args(q, k_cache, v_cache, cache_seqlens, block_table, k, v, causal, scale, max_seqlen_k,
                              num_splits, o, lse);
        set_execution(a, stream, workspace, workspace_bytes);
        nb::gil_scoped_release release;
        flashgla::attention_with_kvcache(a);
      },
      "q"_a, "k_cache"_a, "v_cache"_a, "cache_seqlens"_a, "block_table"_a.none(), "k"_a.none(), "v"_a.none(),
      "causal"_a, "scale"_a.none(), "max_seqlen_k"_a.none(), "num_splits"_a, "o"_a, "lse"_a.none(), "stream"_a = 0,
      "workspace"_a = 0, "workspace_bytes"_a = 0);

  m.def(
      "attention_with_kvcache_workspace_bytes",
      [](nb::handle q, nb::handle k_cache, nb::handle v_cache, nb::handle cache_seqlens, nb::handle block_table,
         nb::handle k, nb::handle v, bool causal, std::optional<double> scale, std::optional<int64_t> max_seqlen_k,
         int num_splits, nb::handle o, nb::handle lse) {
        return flashgla::attention_with_kvcache_workspace_bytes(kvcache_args(
            q, k_cache, v_cache, cache_seqlens, block_table, k, v, causal, scale, max_seqlen_k, num_splits, o, lse));
      },
      "q"_a, "k_cache"_a, "v_cache"_a, "cache_seqlens"_a, "block_table"_a.none(), "k"_a.none(), "v"_a.none(),
      "causal"_a, "scale"_a.none(), "max_seqlen_k"_a.none(), "num_splits"_a, "o"_a, "lse"_a.none());
}
