// flashgla._C: the per-segment state summaries (gla_segment_states,
// gla_segment_state_grads in flashgla/gla.h), for the PyTorch ops in
// python/flashgla/gla.py. Tensors cross as the tuples module.cpp reads
// (tensor_view_from_python); nothing here computes.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>

#include <cstdint>
#include <optional>

#include "bindings.h"
#include "flashgla/flashgla.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

flashgla::GlaSegmentStatesArgs states_args(nb::handle k, nb::handle v, nb::handle g, nb::handle cu_seqlens,
                                           nb::handle cu_seqlens_host, nb::handle states, nb::handle log_decay) {
  flashgla::GlaSegmentStatesArgs a;
  a.k = tensor_view_from_python(k, "k");
  a.v = tensor_view_from_python(v, "v");
  a.g = tensor_view_from_python(g, "g");
  a.cu_seqlens = tensor_view_from_python(cu_seqlens, "cu_seqlens");
  a.cu_seqlens_host = tensor_view_from_python(cu_seqlens_host, "cu_seqlens_host");
  a.states = tensor_view_from_python(states, "states");
  a.log_decay = tensor_view_from_python(log_decay, "log_decay");
  return a;
}

flashgla::GlaSegmentStateGradsArgs grads_args(nb::handle q, nb::handle d_o, nb::handle g, std::optional<double> scale,
                                              nb::handle cu_seqlens, nb::handle cu_seqlens_host,
                                              nb::handle d_states) {
  flashgla::GlaSegmentStateGradsArgs a;
  a.q = tensor_view_from_python(q, "q");
  a.d_o = tensor_view_from_python(d_o, "d_o");
  a.g = tensor_view_from_python(g, "g");
  a.scale = scale;
  a.cu_seqlens = tensor_view_from_python(cu_seqlens, "cu_seqlens");
  a.cu_seqlens_host = tensor_view_from_python(cu_seqlens_host, "cu_seqlens_host");
  a.d_states = tensor_view_from_python(d_states, "d_states");
  return a;
}

}  // namespace

void bind_segment(nb::module_& m) {
  m.def(
      "gla_segment_states",
      [](nb::handle k, nb::handle v, nb::handle g, nb::handle cu_seqlens, nb::handle cu_seqlens_host,
         nb::handle states, nb::handle log_decay, uintptr_t stream, uintptr_t workspace, size_t workspace_bytes) {
        auto a = states_args(k, v, g, cu_seqlens, cu_seqlens_host, states, log_decay);
        set_execution(a, stream, workspace, workspace_bytes);
        nb::gil_scoped_release release;  // the CPU backend can take a while
        flashgla::gla_segment_states(a);
      },
      "k"_a, "v"_a, "g"_a.none(), "cu_seqlens"_a.none(), "cu_seqlens_host"_a.none(), "states"_a, "log_decay"_a,
      "stream"_a = 0, "workspace"_a = 0, "workspace_bytes"_a = 0);

  m.def(
      "gla_segment_states_workspace_bytes",
      [](nb::handle k, nb::handle v, nb::handle g, nb::handle cu_seqlens, nb::handle cu_seqlens_host,
         nb::handle states, nb::handle log_decay) {
        return flashgla::gla_segment_states_workspace_bytes(
            states_args(k, v, g, cu_seqlens, cu_seqlens_host, states, log_decay));
      },
      "k"_a, "v"_a, "g"_a.none(), "cu_seqlens"_a.none(), "cu_seqlens_host"_a.none(), "states"_a, "log_decay"_a);

  m.def(
      "gla_segment_state_grads",
      [](nb::handle q, nb::handle d_o, nb::handle g, std::optional<double> scale, nb::handle cu_seqlens,
         nb::handle cu_seqlens_host, nb::handle d_states, uintptr_t stream, uintptr_t workspace,
         size_t workspace_bytes) {
        auto a = grads_args(q, d_o, g, scale, cu_seqlens, cu_seqlens_host, d_states);
        set_execution(a, stream, workspace, workspace_bytes);
        nb::gil_scoped_release release;
        flashgla::gla_segment_state_grads(a);
      },
      "q"_a, "d_o"_a, "g"_a.none(), "scale"_a.none(), "cu_seqlens"_a.none(), "cu_seqlens_host"_a.none(),
      "d_states"_a, "stream"_a = 0, "workspace"_a = 0, "workspace_bytes"_a = 0);

  m.def(
      "gla_segment_state_grads_workspace_bytes",
      [](nb::handle q, nb::handle d_o, nb::handle g, std::optional<double> scale, nb::handle cu_seqlens,
         nb::handle cu_seqlens_host, nb::handle d_states) {
        return flashgla::gla_segment_state_grads_workspace_bytes(
            grads_args(q, d_o, g, scale, cu_seqlens, cu_seqlens_host, d_states));
      },
      "q"_a, "d_o"_a, "g"_a.none(), "scale"_a.none(), "cu_seqlens"_a.none(), "cu_seqlens_host"_a.none(),
      "d_states"_a);
}
