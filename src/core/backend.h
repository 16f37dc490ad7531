// What a backend implements. Arguments arrive checked: shapes, dtypes, devices,
// strides and (on the CPU) cu_seqlens are valid, and `problem` holds the sizes.
#pragma once

#include "core/problem.h"
#include "flashgla/attention.h"
#include "flashgla/gla.h"

namespace flashgla::cpu {
void gla_forward(const GlaForwardArgs& args, const GlaProblem& problem);
void gla_backward(const GlaBackwardArgs& args, const GlaProblem& problem);
void gla_decode(const GlaDecodeArgs& args, const GlaProblem& problem);  // args with a token dimension; seq_len = T
void gla_segment_states(const GlaSegmentStatesArgs& args, const GlaProblem& problem);
void gla_segment_state_grads(const GlaSegmentStateGradsArgs& args, const GlaProblem& problem);
void attention_forward(const AttentionForwardArgs& args, const AttentionProblem& problem);
void attention_backward(const AttentionBackwardArgs& args, const AttentionProblem& problem);
void attention_with_kvcache(const AttentionKvCacheArgs& args, const KvCacheProblem& problem);
}  // namespace flashgla::cpu

#ifdef FLASHGLA_WITH_CUDA
namespace flashgla::cuda {
int device_count();
void gla_forward(const GlaForwardArgs& args, const GlaProblem& problem);
void gla_backward(const GlaBackwardArgs& args, const GlaProblem& problem);
void gla_decode(const GlaDecodeArgs& args, const GlaProblem& problem);
void gla_segment_states(const GlaSegmentStatesArgs& args, const GlaProblem& problem);
void gla_segment_state_grads(const GlaSegmentStateGradsArgs& args, const GlaProblem& problem);
size_t gla_segment_states_workspace_bytes(const GlaSegmentStatesArgs& args, const GlaProblem& problem);
size_t gla_segment_state_grads_workspace_bytes(const GlaSegmentStateGradsArgs& args, const GlaProblem& problem);
void attention_forward(const AttentionForwardArgs& args, const AttentionProblem& problem);
void attention_backward(const AttentionBackwardArgs& args, const AttentionProblem& problem);
// Scratch each call needs (see GlaForwardArgs::workspace); 0 when none.
size_t gla_forward_workspace_bytes(const GlaForwardArgs& args, const GlaProblem& problem);
size_t gla_backward_workspace_bytes(const GlaBackwardArgs& args, const GlaProblem& problem);
bool gla_forward_phases_apply(const GlaForwardArgs& args, const GlaProblem& problem);  // flashgla/gla.h
bool gla_backward_phases_apply(const GlaBackwardArgs& args, const GlaProblem& problem);
int64_t gla_normalize_residual_slots(const GlaForwardArgs& args, const GlaProblem& problem);  // flashgla/gla.h
// GlaForwardArgs::intra: whether the forward writes it, and whether the backward reads it (the forward's answer
// for the same tensors, see plan.h's saves_intra).
bool gla_forward_saves_intra(const GlaForwardArgs& args, const GlaProblem& problem);  // flashgla/gla.h
bool gla_backward_reads_intra(const GlaBackwardArgs& args, const GlaProblem& problem);
size_t attention_forward_workspace_bytes(const AttentionForwardArgs& args, const AttentionProblem& problem);
size_t attention_backward_workspace_bytes(const AttentionBackwardArgs& args, const AttentionProblem& problem);
void attention_with_kvcache(const AttentionKvCacheArgs& args, const KvCacheProblem& problem);
size_t attention_with_kvcache_workspace_bytes(const AttentionKvCacheArgs& args, const KvCacheProblem& problem);
}  // namespace flashgla::cuda
#endif

// ---- Fused norm and gate steps of the GLA layer (flashgla/norm.h) -------------
#include "flashgla/norm.h"

namespace flashgla {
// x viewed as rows × dim: dim is the last dimension, rows the product of the others.
struct RowsProblem {
  int64_t rows = 0;
  int64_t dim = 0;
};
}  // namespace flashgla

namespace flashgla::cpu {
void rms_norm_forward(const RmsNormForwardArgs& args, const RowsProblem& problem);
void rms_norm_backward(const RmsNormBackwardArgs& args, const RowsProblem& problem);
void logsigmoid_gate_forward(const LogSigmoidGateForwardArgs& args);
void logsigmoid_gate_backward(const LogSigmoidGateBackwardArgs& args);
}  // namespace flashgla::cpu

#ifdef FLASHGLA_WITH_CUDA
namespace flashgla::cuda {
void rms_norm_forward(const RmsNormForwardArgs& args, const RowsProblem& problem);
void rms_norm_backward(const RmsNormBackwardArgs& args, const RowsProblem& problem);
size_t rms_norm_backward_workspace_bytes(const RmsNormBackwardArgs& args, const RowsProblem& problem);
void logsigmoid_gate_forward(const LogSigmoidGateForwardArgs& args);
void logsigmoid_gate_backward(const LogSigmoidGateBackwardArgs& args);
}  // namespace flashgla::cuda
#endif
