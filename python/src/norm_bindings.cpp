// flashgla._C: the fused norm and gate steps of the GLA layer (flashgla/norm.h),
// for the PyTorch ops in python/flashgla/ops_norm.py. Tensors cross as the
// tuples module.cpp reads (tensor_view_from_python); nothing here computes.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>

#include <cstdint>
#include <optional>

#include "bindings.h"
#include "flashgla/flashgla.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

flashgla::RmsNormBackwardArgs rms_norm_backward_args(nb::handle x, nb::handle weight, nb::handle gate,
                                                     flashgla::GateActivation activation, double eps, nb::handle dy,
                                                     nb::handle dx, nb::handle dgate, nb::handle dweight) {
  flashgla::RmsNormBackwardArgs a;
  a.x = tensor_view_from_python(x, "x");
  a.weight = tensor_view_from_python(weight, "weight");
  a.gate = tensor_view_from_python(gate, "gate");
  a.activation = activation;
  a.eps = eps;
  a.dy = tensor_view_from_python(dy, "dy");
  a.dx = tensor_view_from_python(dx, "dx");
  a.dgate = tensor_view_from_python(dgate, "dgate");
  a.dweight = tensor_view_from_python(dweight, "dweight");
  return a;
}

}  // namespace

void bind_norm(nb::module_& m) {
  nb::enum_<flashgla::GateActivation>(m, "GateActivation")
      .value("swish", flashgla::GateActivation::swish)
      .value("sigmoid", flashgla::GateActivation::sigmoid);

  m.def(
      "rms_norm_forward",
      [](nb::handle x, nb::handle weight, nb::handle gate, flashgla::GateActivation activation, double eps,
         nb::handle y, uintptr_t stream) {
        flashgla::RmsNormForwardArgs a;
        a.x = tensor_view_from_python(x, "x");
        a.weight = tensor_view_from_python(weight, "weight");
        a.gate = tensor_view_from_python(gate, "gate");
        a.activation = activation;
        a.eps = eps;
        a.y = tensor_view_from_python(y, "y");
        a.stream = as_pointer(stream);
        nb::gil_scoped_release release;
        flashgla::rms_norm_forward(a);
      },
      "x"_a, "weight"_a.none(), "gate"_a.none(), "activation"_a, "eps"_a, "y"_a, "stream"_a = 0,
      "y = x · rsqrt(mean(x²) + eps) · weight · act(gate) over the last dimension.");

  m.def(
      "rms_norm_backward",
      [](nb::handle x, nb::handle weight, nb::handle gate, flashgla::GateActivation activation, double eps,
         nb::handle dy, nb::handle dx, nb::handle dgate, nb::handle dweight, uintptr_t stream, uintptr_t workspace,
         size_t workspace_bytes) {
        auto a = rms_norm_backward_args(x, weight, gate, activation, eps, dy, dx, dgate, dweight);
        set_execution(a, stream, workspace, workspace_bytes);
        nb::gil_scoped_release release;
        flashgla::rms_norm_backward(a);
      },
      "x"_a, "weight"_a.none(), "gate"_a.none(), "activation"_a, "eps"_a, "dy"_a, "dx"_a, "dgate"_a.none(),
      "dweight"_a.none(), "stream"_a = 0, "workspace"_a = 0, "workspace_bytes"_a = 0);

  m.def(
      "rms_norm_backward_workspace_bytes",
      [](nb::handle x, nb::handle weight, nb::handle gate, flashgla::GateActivation activation, double eps,
         nb::handle dy, nb::handle dx, nb::handle dgate, nb::handle dweight) {
        return flashgla::rms_norm_backward_workspace_bytes(
            rms_norm_backward_args(x, weight, gate, activation, eps, dy, dx, dgate, dweight));
      },
      "x"_a, "weight"_a.none(), "gate"_a.none(), "activation"_a, "eps"_a, "dy"_a, "dx"_a, "dgate"_a.none(),
      "dweight"_a.none());

  m.def(
      "logsigmoid_gate_forward",
      [](nb::handle x, double normalizer, std::optional<double> clamp_min, nb::handle g, uintptr_t stream) {
        flashgla::LogSigmoidGateForwardArgs a;
        a.x = tensor_view_from_python(x, "x");
        a.normalizer = normalizer;
        a.clamp_min = clamp_min;
        a.g = tensor_view_from_python(g, "g");
        a.stream = as_pointer(stream);
        nb::gil_scoped_release release;
        flashgla::logsigmoid_gate_forward(a);
      },
      "x"_a, "normalizer"_a, "clamp_min"_a.none(), "g"_a, "stream"_a = 0,
      "g = max(logsigmoid(x) / normalizer, clamp_min).");

  m.def(
      "logsigmoid_gate_backward",
      [](nb::handle x, double normalizer, std::optional<double> clamp_min, nb::handle dg, nb::handle dx,
         uintptr_t stream) {
        flashgla::LogSigmoidGateBackwardArgs a;
        a.x = tensor_view_from_python(x, "x");
        a.normalizer = normalizer;
        a.clamp_min = clamp_min;
        a.dg = tensor_view_from_python(dg, "dg");
        a.dx = tensor_view_from_python(dx, "dx");
        a.stream = as_pointer(stream);
        nb::gil_scoped_release release;
        flashgla::logsigmoid_gate_backward(a);
      },
      "x"_a, "normalizer"_a, "clamp_min"_a.none(), "dg"_a, "dx"_a, "stream"_a = 0);
}
