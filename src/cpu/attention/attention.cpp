// CPU softmax attention: picks the algorithm, and for the tiled one the
// accumulation type (fp64 for f64 inputs, fp32 otherwise).
#include "core/backend.h"
#include "cpu/attention/attention_common.h"

namespace flashgla::cpu {

void attention_forward(const AttentionForwardArgs& args, const AttentionProblem& problem) {
  if (args.algorithm == AttentionAlgorithm::naive) return naive_attention_forward(args, problem);
  if (args.q.dtype == DType::f64) return tiled_attention_forward<double>(args, problem);
  tiled_attention_forward<float>(args, problem);
}

void attention_backward(const AttentionBackwardArgs& args, const AttentionProblem& problem) {
  if (args.algorithm == AttentionAlgorithm::naive) return naive_attention_backward(args, problem);
  if (args.q.dtype == DType::f64) return tiled_attention_backward<double>(args, problem);
  tiled_attention_backward<float>(args, problem);
}

}  // namespace flashgla::cpu
