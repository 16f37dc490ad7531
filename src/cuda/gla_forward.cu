// PLACEHOLDER: replaced by the CUDA GLA forward, recurrent and decode kernels.
#include "core/backend.h"
#include "cuda/common.cuh"

namespace flashgla::cuda {
void gla_forward(const GlaForwardArgs&, const GlaProblem&) { check::fail(ErrorKind::unsupported, "", "CUDA GLA forward: not implemented yet"); }
void gla_decode(const GlaDecodeArgs&, const GlaProblem&) { check::fail(ErrorKind::unsupported, "", "CUDA GLA decode: not implemented yet"); }
size_t gla_forward_workspace_bytes(const GlaForwardArgs&, const GlaProblem&) { return 0; }
}  // namespace flashgla::cuda
