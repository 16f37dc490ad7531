// flashgla._C: the fused norm and gate steps of the GLA layer (flashgla/norm.h),
// for the ops in python/flashgla/ops/norm.py.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>

#include "bindings.h"
#include "flashgla/flashgla.h"

namespace flashgla_python {

using namespace nb::literals;
using namespace flashgla;

void bind_norm(nb::module_& m) {
  nb::enum_<GateActivation>(m, "GateActivation")
      .value("swish", GateActivation::swish)
      .value("sigmoid", GateActivation::sigmoid);

  nb::class_<RmsNormForwardArgs> forward(m, "RmsNormForwardArgs", "flashgla::RmsNormForwardArgs (flashgla/norm.h).");
  forward.def(nb::init<>())
      .def_rw("activation", &RmsNormForwardArgs::activation)
      .def_rw("eps", &RmsNormForwardArgs::eps);
  tensor_fields<RmsNormForwardArgs>(forward, {{"x", &RmsNormForwardArgs::x},
                                              {"weight", &RmsNormForwardArgs::weight},
                                              {"gate", &RmsNormForwardArgs::gate},
                                              {"y", &RmsNormForwardArgs::y}});
  stream_field(forward);
  m.def(
      "rms_norm_forward", [](const RmsNormForwardArgs& a) { run_without_gil(&flashgla::rms_norm_forward, a); },
      "args"_a, "y = x · rsqrt(mean(x²) + eps) · weight · act(gate) over the last dimension.");

  nb::class_<RmsNormBackwardArgs> backward(m, "RmsNormBackwardArgs",
                                           "flashgla::RmsNormBackwardArgs (flashgla/norm.h).");
  backward.def(nb::init<>())
      .def_rw("activation", &RmsNormBackwardArgs::activation)
      .def_rw("eps", &RmsNormBackwardArgs::eps);
  tensor_fields<RmsNormBackwardArgs>(backward, {{"x", &RmsNormBackwardArgs::x},
                                                {"weight", &RmsNormBackwardArgs::weight},
                                                {"gate", &RmsNormBackwardArgs::gate},
                                                {"dy", &RmsNormBackwardArgs::dy},
                                                {"dx", &RmsNormBackwardArgs::dx},
                                                {"dgate", &RmsNormBackwardArgs::dgate},
                                                {"dweight", &RmsNormBackwardArgs::dweight}});
  stream_field(backward);
  m.def(
      "rms_norm_backward",
      [](const RmsNormBackwardArgs& a, nb::handle allocate_workspace) {
        run_with_workspace(&flashgla::rms_norm_backward, a, allocate_workspace);
      },
      "args"_a, "allocate_workspace"_a.none() = nb::none());

  nb::class_<LogSigmoidGateForwardArgs> gate(m, "LogSigmoidGateForwardArgs",
                                             "flashgla::LogSigmoidGateForwardArgs (flashgla/norm.h).");
  gate.def(nb::init<>())
      .def_rw("normalizer", &LogSigmoidGateForwardArgs::normalizer)
      .def_rw("clamp_min", &LogSigmoidGateForwardArgs::clamp_min);
  tensor_fields<LogSigmoidGateForwardArgs>(gate, {{"x", &LogSigmoidGateForwardArgs::x},
                                                  {"g", &LogSigmoidGateForwardArgs::g}});
  stream_field(gate);
  m.def(
      "logsigmoid_gate_forward",
      [](const LogSigmoidGateForwardArgs& a) { run_without_gil(&flashgla::logsigmoid_gate_forward, a); }, "args"_a,
      "g = max(logsigmoid(x) / normalizer, clamp_min).");

  nb::class_<LogSigmoidGateBackwardArgs> gate_backward(m, "LogSigmoidGateBackwardArgs",
                                                       "flashgla::LogSigmoidGateBackwardArgs (flashgla/norm.h).");
  gate_backward.def(nb::init<>())
      .def_rw("normalizer", &LogSigmoidGateBackwardArgs::normalizer)
      .def_rw("clamp_min", &LogSigmoidGateBackwardArgs::clamp_min);
  tensor_fields<LogSigmoidGateBackwardArgs>(gate_backward, {{"x", &LogSigmoidGateBackwardArgs::x},
                                                            {"dg", &LogSigmoidGateBackwardArgs::dg},
                                                            {"dx", &LogSigmoidGateBackwardArgs::dx}});
  stream_field(gate_backward);
  m.def(
      "logsigmoid_gate_backward",
      [](const LogSigmoidGateBackwardArgs& a) { run_without_gil(&flashgla::logsigmoid_gate_backward, a); },
      "args"_a);
}

}  // namespace flashgla_python
