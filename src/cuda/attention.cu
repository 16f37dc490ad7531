// PLACEHOLDER: replaced by the CUDA FlashAttention kernels.
#include "core/backend.h"
#include "cuda/common.cuh"

namespace flashgla::cuda {
void attention_forward(const AttentionForwardArgs&, const AttentionProblem&) { check::fail(ErrorKind::unsupported, "", "CUDA attention: not implemented yet"); }
void attention_backward(const AttentionBackwardArgs&, const AttentionProblem&) { check::fail(ErrorKind::unsupported, "", "CUDA attention: not implemented yet"); }
}  // namespace flashgla::cuda
