// flashgla._C: softmax attention (flashgla/attention.h) for the ops in
// python/flashgla/ops/attention.py and ops/kvcache.py.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>

#include "bindings.h"
#include "flashgla/flashgla.h"

namespace flashgla_python {

using namespace nb::literals;
using namespace flashgla;

namespace {

// The inputs AttentionForwardArgs and AttentionBackwardArgs share.
template <class Args>
nb::class_<Args> attention_args_class(nb::module_& m, const char* name, const char* doc) {
  nb::class_<Args> cls(m, name, doc);
  cls.def(nb::init<>())
      .def_rw("causal", &Args::causal)
      .def_rw("scale", &Args::scale)
      .def_rw("algorithm", &Args::algorithm);
  tensor_fields<Args>(cls, {{"q", &Args::q},
                            {"k", &Args::k},
                            {"v", &Args::v},
                            {"cu_seqlens_q", &Args::cu_seqlens_q},
                            {"cu_seqlens_k", &Args::cu_seqlens_k},
                            {"o", &Args::o},
                            {"lse", &Args::lse}});
  stream_field(cls);
  return cls;
}

}  // namespace

void bind_attention(nb::module_& m) {
  nb::enum_<AttentionAlgorithm>(m, "AttentionAlgorithm")
      .value("tiled", AttentionAlgorithm::tiled)
      .value("naive", AttentionAlgorithm::naive);

  attention_args_class<AttentionForwardArgs>(m, "AttentionForwardArgs",
                                             "flashgla::AttentionForwardArgs (flashgla/attention.h).");
  m.def(
      "attention_forward",
      [](const AttentionForwardArgs& a, nb::handle allocate_workspace) {
        run_with_workspace(&flashgla::attention_forward, with_tuning(a, &attention_tuning_from_env),
                           allocate_workspace);
      },
      "args"_a, "allocate_workspace"_a.none() = nb::none(),
      "allocate_workspace: bytes -> (buffer, data_ptr), or None on the CPU (see WorkspaceAllocator).");

  auto backward = attention_args_class<AttentionBackwardArgs>(
      m, "AttentionBackwardArgs", "flashgla::AttentionBackwardArgs (flashgla/attention.h).");
  backward.def_rw("deterministic", &AttentionBackwardArgs::deterministic);
  tensor_fields<AttentionBackwardArgs>(backward, {{"d_o", &AttentionBackwardArgs::d_o},
                                                  {"dq", &AttentionBackwardArgs::dq},
                                                  {"dk", &AttentionBackwardArgs::dk},
                                                  {"dv", &AttentionBackwardArgs::dv}});
  m.def(
      "attention_backward",
      [](const AttentionBackwardArgs& a, nb::handle allocate_workspace) {
        run_with_workspace(&flashgla::attention_backward,
                           with_tuning(a, &attention_backward_tuning_from_env), allocate_workspace);
      },
      "args"_a, "allocate_workspace"_a.none() = nb::none());

  nb::class_<AttentionKvCacheArgs> kvcache(m, "AttentionKvCacheArgs",
                                           "flashgla::AttentionKvCacheArgs (flashgla/attention.h).");
  kvcache.def(nb::init<>())
      .def_rw("causal", &AttentionKvCacheArgs::causal)
      .def_rw("scale", &AttentionKvCacheArgs::scale)
      .def_rw("max_seqlen_k", &AttentionKvCacheArgs::max_seqlen_k)
      .def_rw("num_splits", &AttentionKvCacheArgs::num_splits);
  tensor_fields<AttentionKvCacheArgs>(kvcache, {{"q", &AttentionKvCacheArgs::q},
                                                {"k_cache", &AttentionKvCacheArgs::k_cache},
                                                {"v_cache", &AttentionKvCacheArgs::v_cache},
                                                {"cache_seqlens", &AttentionKvCacheArgs::cache_seqlens},
                                                {"block_table", &AttentionKvCacheArgs::block_table},
                                                {"k", &AttentionKvCacheArgs::k},
                                                {"v", &AttentionKvCacheArgs::v},
                                                {"o", &AttentionKvCacheArgs::o},
                                                {"lse", &AttentionKvCacheArgs::lse}});
  stream_field(kvcache);
  m.def(
      "attention_with_kvcache",
      [](const AttentionKvCacheArgs& a, nb::handle allocate_workspace) {
        run_with_workspace(&flashgla::attention_with_kvcache, a, allocate_workspace);
      },
      "args"_a, "allocate_workspace"_a.none() = nb::none());
}

}  // namespace flashgla_python
