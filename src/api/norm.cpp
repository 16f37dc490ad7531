// Gated RMSNorm and log-sigmoid gate entry points: check every argument, dispatch.
#include <cmath>
#include <string>

#include "api/dispatch.h"
#include "flashgla/norm.h"

namespace flashgla {
namespace {


// A CUDA tensor in a build without CUDA is reported against `x`, the
// argument every other one is compared with.
// The CUDA kernels compute in fp32 only, so they take no fp64.
void check_backend(const TensorView& x) {
#ifndef FLASHGLA_WITH_CUDA
  FLASHGLA_REQUIRE(x.device.type == DeviceType::cpu, ErrorKind::unsupported, "x",
          "tensors are on " + x.device.str() + " but this flashgla was built without CUDA");
#endif
  FLASHGLA_REQUIRE(x.device.type == DeviceType::cpu || x.dtype != DType::f64, ErrorKind::unsupported, "x",
          "float64 is supported on the CPU only");
}

// Exactly the shape of `like` (any number of dimensions), on `dev`.
void check_same_shape(const TensorView& t, const char* name, const TensorView& like, const Device& dev,
                      bool is_output) {
  check::tensor(t, name, like.ndim, "[..., D] (the shape of x)", is_output);
  for (int d = 0; d < like.ndim; ++d)
    FLASHGLA_REQUIRE(t.shape[d] == like.shape[d], ErrorKind::value, name,
            "expected the shape of x " + like.shape_str() + ", got " + t.shape_str());
  check::device(t, name, dev, "x");
}

void check_input_x(const TensorView& x) {
  FLASHGLA_REQUIRE(x.defined(), ErrorKind::value, "x", "is required: expected a tensor of 1 to 4 dimensions");
  FLASHGLA_REQUIRE(x.ndim >= 1 && x.ndim <= kMaxDims, ErrorKind::value, "x",
          "expected 1 to 4 dimensions, got shape " + x.shape_str());
  check::tensor(x, "x", x.ndim, "[..., D]");
  check::floating(x, "x");
}

void check_activation(GateActivation activation) {
  FLASHGLA_REQUIRE(activation == GateActivation::swish || activation == GateActivation::sigmoid, ErrorKind::value,
          "activation", "expected swish or sigmoid");
}

// x, weight, gate, eps: common to the norm's forward and backward.
RowsProblem check_norm_inputs(const TensorView& x, const TensorView& weight, const TensorView& gate,
                              GateActivation activation, double eps) {
  check_input_x(x);
  RowsProblem p;
  p.dim = x.shape[x.ndim - 1];
  FLASHGLA_REQUIRE(p.dim >= 1, ErrorKind::value, "x", "the normalized (last) dimension must be at least 1, got shape " +
                                                 x.shape_str());
  p.rows = x.numel() / p.dim;
  const Device dev = x.device;
  check_backend(x);
  if (weight.defined()) {
    check::shape(weight, "weight", {p.dim}, "[D]");
    check::floating(weight, "weight");
    check::device(weight, "weight", dev, "x");
  }
  if (gate.defined()) {
    check_same_shape(gate, "gate", x, dev, false);
    check::dtype(gate, "gate", x.dtype);
  }
  check_activation(activation);
  FLASHGLA_REQUIRE(std::isfinite(eps) && eps >= 0, ErrorKind::value, "eps", "must be finite and ≥ 0, got " + std::to_string(eps));
  return p;
}

RowsProblem check_norm_forward(const RmsNormForwardArgs& a) {
  const RowsProblem p = check_norm_inputs(a.x, a.weight, a.gate, a.activation, a.eps);
  check_same_shape(a.y, "y", a.x, a.x.device, true);
  check::dtype(a.y, "y", a.x.dtype);
  return p;
}

RowsProblem check_norm_backward(const RmsNormBackwardArgs& a) {
  const RowsProblem p = check_norm_inputs(a.x, a.weight, a.gate, a.activation, a.eps);
  const Device dev = a.x.device;
  check_same_shape(a.dy, "dy", a.x, dev, false);
  check::dtype(a.dy, "dy", a.x.dtype);
  check_same_shape(a.dx, "dx", a.x, dev, true);
  check::dtype(a.dx, "dx", a.x.dtype);
  if (a.gate.defined()) {
    FLASHGLA_REQUIRE(a.dgate.defined(), ErrorKind::value, "dgate",
            "is required when gate is given: expected the shape of gate " + a.gate.shape_str());
    check_same_shape(a.dgate, "dgate", a.x, dev, true);
    check::dtype(a.dgate, "dgate", a.gate.dtype);
  } else {
    FLASHGLA_REQUIRE(!a.dgate.defined(), ErrorKind::value, "dgate", "given without gate: there is no gate to differentiate");
  }
  if (a.dweight.defined()) {
    FLASHGLA_REQUIRE(a.weight.defined(), ErrorKind::value, "dweight", "given without weight: there is no weight to differentiate");
    check::shape(a.dweight, "dweight", {p.dim}, "[D]", true);
    FLASHGLA_REQUIRE(a.dweight.dtype == DType::f32 || a.dweight.dtype == a.weight.dtype, ErrorKind::type, "dweight",
            std::string("expected dtype float32 or that of weight (") + dtype_name(a.weight.dtype) + "), got " +
                dtype_name(a.dweight.dtype));
    check::device(a.dweight, "dweight", dev, "x");
  }
  return p;
}

void check_gate_params(double normalizer, const std::optional<double>& clamp_min) {
  FLASHGLA_REQUIRE(std::isfinite(normalizer) && normalizer > 0, ErrorKind::value, "normalizer",
          "must be finite and > 0, got " + std::to_string(normalizer));
  if (clamp_min)
    FLASHGLA_REQUIRE(std::isfinite(*clamp_min), ErrorKind::value, "clamp_min", "must be finite, got " + std::to_string(*clamp_min));
}

}  // namespace

void rms_norm_forward(const RmsNormForwardArgs& a) {
  const RowsProblem p = check_norm_forward(a);
  if (p.rows == 0) return;
  FLASHGLA_DISPATCH(a.x.device, rms_norm_forward, a, p);
}

void rms_norm_backward(const RmsNormBackwardArgs& a) {
  const RowsProblem p = check_norm_backward(a);
  // With no rows there is nothing to normalize, but dweight (a sum over no rows) is still written: zeros.
  if (p.rows == 0 && !a.dweight.defined()) return;
  FLASHGLA_DISPATCH(a.x.device, rms_norm_backward, a, p);
}

size_t rms_norm_backward_workspace_bytes(const RmsNormBackwardArgs& a) {
  return FLASHGLA_WORKSPACE_BYTES(a.x.device, rms_norm_backward_workspace_bytes, a, check_norm_backward(a));
}

void logsigmoid_gate_forward(const LogSigmoidGateForwardArgs& a) {
  check_input_x(a.x);
  check_backend(a.x);
  check_gate_params(a.normalizer, a.clamp_min);
  check_same_shape(a.g, "g", a.x, a.x.device, true);
  FLASHGLA_REQUIRE(a.g.dtype == a.x.dtype || a.g.dtype == DType::f32, ErrorKind::type, "g",
          std::string("expected dtype float32 or that of x (") + dtype_name(a.x.dtype) + "), got " +
              dtype_name(a.g.dtype));
  if (a.x.numel() == 0) return;
  FLASHGLA_DISPATCH(a.x.device, logsigmoid_gate_forward, a);
}

void logsigmoid_gate_backward(const LogSigmoidGateBackwardArgs& a) {
  check_input_x(a.x);
  check_backend(a.x);
  check_gate_params(a.normalizer, a.clamp_min);
  check_same_shape(a.dg, "dg", a.x, a.x.device, false);
  check::floating(a.dg, "dg");
  check_same_shape(a.dx, "dx", a.x, a.x.device, true);
  check::dtype(a.dx, "dx", a.x.dtype);
  if (a.x.numel() == 0) return;
  FLASHGLA_DISPATCH(a.x.device, logsigmoid_gate_backward, a);
}

}  // namespace flashgla
