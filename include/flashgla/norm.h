// The memory-bound steps of a GLA layer, fused: the gated RMSNorm applied to
// each head's output, and the gate pre-processing. Forward and backward.
//
// Gated RMSNorm over the last dimension D of x [..., D] (1 to 4 dimensions;
// per head when x is [B, T, H, V]):
//     y = x · rsqrt(mean(x²) + eps) · weight · act(gate)
// with act(r) = r·sigmoid(r) (swish) or sigmoid(r); weight and gate optional
// (without both it is a plain RMSNorm).
//
// Log-sigmoid gate (the forget gate of GLA in log space):
//     g = max(logsigmoid(x) / normalizer, clamp_min)      (clamp optional)
//
// Strides are honoured. Compute is fp32 (fp64 for fp64 inputs, CPU only);
// outputs are in the input's dtype unless said otherwise. Outputs are
// allocated by the caller; nothing here allocates device memory except a
// backward called without its workspace (see RmsNormBackwardArgs).
#pragma once

#include <cstddef>
#include <optional>

#include "flashgla/tensor.h"

namespace flashgla {

enum class GateActivation {
  swish,    // r · sigmoid(r)  (SiLU)
  sigmoid,  // sigmoid(r)
};

struct RmsNormForwardArgs {
  TensorView x;       // [..., D] f64/f32/bf16/f16 (f64 on the CPU only)
  TensorView weight;  // optional: [D], any float dtype
  TensorView gate;    // optional: shape and dtype of x (the output gate r)
  GateActivation activation = GateActivation::swish;  // applied to gate
  double eps = 1e-6;  // finite, ≥ 0

  TensorView y;       // out: shape and dtype of x
  void* stream = nullptr;  // cudaStream_t for CUDA tensors (nullptr: the default stream)
};

struct RmsNormBackwardArgs {
  TensorView x, weight, gate;  // as in the forward
  GateActivation activation = GateActivation::swish;
  double eps = 1e-6;
  TensorView dy;       // shape and dtype of x: gradient of y

  TensorView dx;       // out: shape and dtype of x
  TensorView dgate;    // out, required iff gate is given: shape and dtype of gate
  TensorView dweight;  // optional out (only with weight): [D], f32 or weight's dtype, summed over rows

  void* stream = nullptr;
  // Device scratch of at least rms_norm_backward_workspace_bytes(args) bytes,
  // for the fp32 per-block partial sums of dweight. Left null, the CUDA
  // backend takes it stream-ordered (cudaMallocAsync), which CUDA graphs can capture.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  WorkspaceAllocator allocate_workspace;  // see WorkspaceAllocator
};

void rms_norm_forward(const RmsNormForwardArgs& args);
void rms_norm_backward(const RmsNormBackwardArgs& args);
size_t rms_norm_backward_workspace_bytes(const RmsNormBackwardArgs& args);  // checks args; 0 on the CPU

struct LogSigmoidGateForwardArgs {
  TensorView x;                     // any shape (≤ 4 dims), f64/f32/bf16/f16
  double normalizer = 16.0;         // finite, > 0
  std::optional<double> clamp_min;  // finite when given
  TensorView g;                     // out: shape of x, dtype of x or f32
  void* stream = nullptr;
};

struct LogSigmoidGateBackwardArgs {
  TensorView x;  // as in the forward
  double normalizer = 16.0;
  std::optional<double> clamp_min;
  TensorView dg;  // shape of x, any float dtype: gradient of g
  TensorView dx;  // out: shape and dtype of x (0 where the clamp was active)
  void* stream = nullptr;
};

void logsigmoid_gate_forward(const LogSigmoidGateForwardArgs& args);
void logsigmoid_gate_backward(const LogSigmoidGateBackwardArgs& args);

}  // namespace flashgla
