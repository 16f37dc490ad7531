// Entry points of the per-segment state summaries (flashgla/gla.h): check
// every argument, resolve the problem sizes, dispatch by device.
#include <cmath>
#include <string>

#include "api/gla_checks.h"
#include "api/dispatch.h"
#include "flashgla/gla.h"

namespace flashgla {
namespace {

// The inputs both ops share: a key-side tensor `a` [B,T,H,K] (k or q), a
// value-side tensor `b` [B,T,H,V] (v or d_o) of the same dtype, the gate and
// the boundaries. Messages name the arguments as the caller knows them.
GlaProblem check_segment_inputs(const TensorView& a, const char* a_name, const TensorView& b, const char* b_name,
                                const TensorView& g, const TensorView& cu_seqlens,
                                const TensorView& cu_seqlens_host) {
  GlaProblem p;
  check::tensor(a, a_name, 4, "[B, T, H, K]");
  check::floating(a, a_name);
  p.batch = a.shape[0], p.seq_len = a.shape[1], p.heads = a.shape[2], p.key_dim = a.shape[3];
  FLASHGLA_REQUIRE(p.key_dim >= 1 && p.heads >= 1, ErrorKind::value, a_name,
                   "H and K must be at least 1, got shape " + a.shape_str());
  const Device dev = a.device;
  check::tensor(b, b_name, 4, "[B, T, H, V]");
  p.value_dim = b.shape[3];
  check::shape(b, b_name, {p.batch, p.seq_len, p.heads, p.value_dim}, "[B, T, H, V]");
  FLASHGLA_REQUIRE(p.value_dim >= 1, ErrorKind::value, b_name, "V must be at least 1, got shape " + b.shape_str());
  check::dtype(b, b_name, a.dtype);
  check::device(b, b_name, dev, a_name);

  check::gla_gate_and_sequences(p, g, cu_seqlens, cu_seqlens_host, dev, a_name);
  return p;
}

// Summaries are f32, or f64 for f64 inputs (so that an fp64 computation keeps
// fp64 accuracy through them).
void summary_dtype(const TensorView& s, const char* name, DType input) {
  FLASHGLA_REQUIRE(s.dtype == DType::f32 || (s.dtype == DType::f64 && input == DType::f64), ErrorKind::type, name,
                   std::string("expected dtype float32") + (input == DType::f64 ? " or float64" : "") + ", got " +
                       dtype_name(s.dtype));
}

void check_states_out(const TensorView& s, const char* name, const GlaProblem& p, const TensorView& reference,
                      const char* reference_name) {
  check::shape(s, name, {p.num_seqs, p.heads, p.key_dim, p.value_dim}, "[N, H, K, V]", /*is_output=*/true);
  summary_dtype(s, name, reference.dtype);
  check::device(s, name, reference.device, reference_name);
}

GlaProblem check_states(const GlaSegmentStatesArgs& a) {
  GlaProblem p = check_segment_inputs(a.k, "k", a.v, "v", a.g, a.cu_seqlens, a.cu_seqlens_host);
  check_states_out(a.states, "states", p, a.k, "k");
  check::shape(a.log_decay, "log_decay", {p.num_seqs, p.heads, p.key_dim}, "[N, H, K]", /*is_output=*/true);
  summary_dtype(a.log_decay, "log_decay", a.k.dtype);
  check::device(a.log_decay, "log_decay", a.k.device, "k");
  return p;
}

GlaProblem check_state_grads(const GlaSegmentStateGradsArgs& a) {
  GlaProblem p = check_segment_inputs(a.q, "q", a.d_o, "d_o", a.g, a.cu_seqlens, a.cu_seqlens_host);
  check_states_out(a.d_states, "d_states", p, a.q, "q");
  p.scale = a.scale.value_or(1.0 / std::sqrt(double(p.key_dim)));
  FLASHGLA_REQUIRE(std::isfinite(p.scale), ErrorKind::value, "scale", "must be finite, got " + std::to_string(p.scale));
  return p;
}

}  // namespace

void gla_segment_states(const GlaSegmentStatesArgs& a) {
  FLASHGLA_DISPATCH_AS(a.k.device, "k", gla_segment_states, a, check_states(a));
}

size_t gla_segment_states_workspace_bytes(const GlaSegmentStatesArgs& a) {
  return FLASHGLA_WORKSPACE_BYTES(a.k.device, gla_segment_states_workspace_bytes, a, check_states(a));
}

void gla_segment_state_grads(const GlaSegmentStateGradsArgs& a) {
  FLASHGLA_DISPATCH(a.q.device, gla_segment_state_grads, a, check_state_grads(a));
}

size_t gla_segment_state_grads_workspace_bytes(const GlaSegmentStateGradsArgs& a) {
  return FLASHGLA_WORKSPACE_BYTES(a.q.device, gla_segment_state_grads_workspace_bytes, a, check_state_grads(a));
}

}  // namespace flashgla
