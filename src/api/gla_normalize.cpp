// The linear-attention normaliser (flashgla/gla_normalize.h): checks and dispatch.
#include <cmath>
#include <string>

#include "api/dispatch.h"
#include "api/gla_checks.h"
#include "core/gla_options_backend.h"
#include "flashgla/gla_normalize.h"

namespace flashgla {
namespace {

void check_float_state(const TensorView& t, const char* name, const GlaProblem& p, const Device& dev,
                       bool is_output, const TensorView& q) {
  if (!t.defined()) return;
  check::shape(t, name, {p.num_seqs, p.heads, p.key_dim}, "[N, H, K]", is_output);
  if (is_output) {
    const bool f64 = q.dtype == DType::f64 && t.dtype == DType::f64;
    FLASHGLA_REQUIRE(f64 || t.dtype == DType::f32, ErrorKind::type, name,
                     std::string("expected dtype float32") + (q.dtype == DType::f64 ? " or float64" : "") + ", got " +
                         dtype_name(t.dtype));
  } else {
    check::floating(t, name);
  }
  check::device(t, name, dev, "q");
}

void check_like_q(const TensorView& t, const char* name, const GlaProblem& p, int64_t last, const char* dims,
                  const TensorView& q, bool is_output) {
  check::shape(t, name, {p.batch, p.seq_len, p.heads, last}, dims, is_output);
  check::dtype(t, name, q.dtype);
  check::device(t, name, q.device, "q");
}

// o_raw, q, k, z_init, cu_seqlens, scale: common to forward and backward.
GlaProblem check_inputs(const TensorView& o_raw, const TensorView& q, const TensorView& k, const TensorView& z_init,
                        const TensorView& cu_seqlens, const TensorView& cu_seqlens_host,
                        const std::optional<double>& scale) {
  GlaProblem p;
  check::tensor(q, "q", 4, "[B, T, H, K]");
  check::floating(q, "q");
  p.batch = q.shape[0], p.seq_len = q.shape[1], p.heads = q.shape[2], p.key_dim = q.shape[3];
  FLASHGLA_REQUIRE(p.key_dim >= 1 && p.heads >= 1, ErrorKind::value, "q", "H and K must be at least 1, got shape " + q.shape_str());
  check_like_q(k, "k", p, p.key_dim, "[B, T, H, K]", q, false);
  check::tensor(o_raw, "o_raw", 4, "[B, T, H, V]");
  p.value_dim = o_raw.shape[3];
  FLASHGLA_REQUIRE(p.value_dim >= 1, ErrorKind::value, "o_raw", "V must be at least 1, got shape " + o_raw.shape_str());
  check_like_q(o_raw, "o_raw", p, p.value_dim, "[B, T, H, V]", q, false);
  check::gla_gate_and_sequences(p, TensorView{}, cu_seqlens, cu_seqlens_host, q.device, "q");
  check_float_state(z_init, "z_init", p, q.device, false, q);
  p.scale = scale.value_or(1.0 / std::sqrt(double(p.key_dim)));
  FLASHGLA_REQUIRE(std::isfinite(p.scale), ErrorKind::value, "scale", "must be finite, got " + std::to_string(p.scale));
  return p;
}

GlaProblem check_forward(const GlaNormalizeArgs& a) {
  const GlaProblem p = check_inputs(a.o_raw, a.q, a.k, a.z_init, a.cu_seqlens, a.cu_seqlens_host, a.scale);
  check_like_q(a.o, "o", p, p.value_dim, "[B, T, H, V]", a.q, true);
  check_float_state(a.z_final, "z_final", p, a.q.device, true, a.q);
  return p;
}

GlaProblem check_backward(const GlaNormalizeBackwardArgs& a) {
  const GlaProblem p = check_inputs(a.o_raw, a.q, a.k, a.z_init, a.cu_seqlens, a.cu_seqlens_host, a.scale);
  check_like_q(a.d_o, "d_o", p, p.value_dim, "[B, T, H, V]", a.q, false);
  check_float_state(a.d_z_final, "d_z_final", p, a.q.device, false, a.q);
  check_like_q(a.d_o_raw, "d_o_raw", p, p.value_dim, "[B, T, H, V]", a.q, true);
  check_like_q(a.dq, "dq", p, p.key_dim, "[B, T, H, K]", a.q, true);
  check_like_q(a.dk, "dk", p, p.key_dim, "[B, T, H, K]", a.q, true);
  check_float_state(a.d_z_init, "d_z_init", p, a.q.device, true, a.q);
  return p;
}

}  // namespace

void gla_normalize_forward(const GlaNormalizeArgs& a) {
  FLASHGLA_DISPATCH(a.q.device, gla_normalize_forward, a, check_forward(a));
}

void gla_normalize_backward(const GlaNormalizeBackwardArgs& a) {
  FLASHGLA_DISPATCH(a.q.device, gla_normalize_backward, a, check_backward(a));
}

size_t gla_normalize_forward_workspace_bytes(const GlaNormalizeArgs& a) {
  return FLASHGLA_WORKSPACE_BYTES(a.q.device, gla_normalize_forward_workspace_bytes, a, check_forward(a));
}

size_t gla_normalize_backward_workspace_bytes(const GlaNormalizeBackwardArgs& a) {
  return FLASHGLA_WORKSPACE_BYTES(a.q.device, gla_normalize_backward_workspace_bytes, a, check_backward(a));
}

}  // namespace flashgla
