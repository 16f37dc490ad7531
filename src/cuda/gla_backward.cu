// PLACEHOLDER: replaced by the CUDA GLA backward kernels.
#include "core/backend.h"
#include "cuda/common.cuh"

namespace flashgla::cuda {
void gla_backward(const GlaBackwardArgs&, const GlaProblem&) { check::fail(ErrorKind::unsupported, "", "CUDA GLA backward: not implemented yet"); }
size_t gla_backward_workspace_bytes(const GlaBackwardArgs&, const GlaProblem&) { return 0; }
}  // namespace flashgla::cuda
