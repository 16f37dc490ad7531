// PLACEHOLDER: replaced by the CUDA FlashAttention kernels.
#include "core/backend.h"
#include "cuda/common.cuh"

namespace flashgla::cuda {
void attention_forward(const AttentionForwardArgs&, const AttentionProblem&) { check::fail(ErrorKind::unsupported, "", "CUDA attention: not implemented yet"); }
void attention_backward(const AttentionBackwardArgs&, const AttentionProblem&) { check::fail(ErrorKind::unsupported, "", "CUDA attention: not implemented yet"); }
size_t attention_forward_workspace_bytes(const AttentionForwardArgs&, const AttentionProblem&) { return 0; }
size_t attention_backward_workspace_bytes(const AttentionBackwardArgs&, const AttentionProblem&) { return 0; }
}  // namespace flashgla::cuda
