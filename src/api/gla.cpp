// GLA entry points: check every argument, resolve the problem sizes, dispatch.
#include <cmath>

#include "api/dispatch.h"
#include "flashgla/gla.h"

namespace flashgla {
namespace {

// States are fp32; with fp64 inputs (CPU only) they may be fp64 too, so that a
// state handed from one call to the next (context parallelism) loses nothing.
void check_state_dtype(const TensorView& s, const char* name, const TensorView& q) {
  if (q.dtype == DType::f64 && s.dtype == DType::f64) return;
  FLASHGLA_REQUIRE(s.dtype == DType::f32, ErrorKind::type, name,
                   std::string("expected dtype float32") + (q.dtype == DType::f64 ? " or float64" : "") + ", got " +
                       dtype_name(s.dtype));
}


// Common to forward and backward: q, k, v, g, h0, cu_seqlens, scale, algorithm.
GlaProblem check_inputs(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g,
                        const TensorView& h0, const TensorView& cu_seqlens, const TensorView& cu_seqlens_host,
                        const std::optional<double>& scale, GlaAlgorithm algorithm, bool reverse) {
  GlaProblem p;
  check::tensor(q, "q", 4, "[B, T, H, K]");
  check::floating(q, "q");
  p.batch = q.shape[0], p.seq_len = q.shape[1], p.heads = q.shape[2], p.key_dim = q.shape[3];
  FLASHGLA_REQUIRE(p.key_dim >= 1 && p.heads >= 1, ErrorKind::value, "q", "H and K must be at least 1, got shape " + q.shape_str());
  const Device dev = q.device;

  check::shape(k, "k", {p.batch, p.seq_len, p.heads, p.key_dim}, "[B, T, H, K]");
  check::dtype(k, "k", q.dtype);
  check::device(k, "k", dev, "q");
  check::tensor(v, "v", 4, "[B, T, H, V]");
  p.value_dim = v.shape[3];
  check::shape(v, "v", {p.batch, p.seq_len, p.heads, p.value_dim}, "[B, T, H, V]");
  FLASHGLA_REQUIRE(p.value_dim >= 1, ErrorKind::value, "v", "V must be at least 1, got shape " + v.shape_str());
  check::dtype(v, "v", q.dtype);
  check::device(v, "v", dev, "q");

  if (g.defined()) {
    FLASHGLA_REQUIRE(g.ndim == 3 || g.ndim == 4, ErrorKind::value, "g",
            "expected [B, T, H, K] (vector gate) or [B, T, H] (scalar gate), got shape " + g.shape_str());
    if (g.ndim == 4) {
      check::shape(g, "g", {p.batch, p.seq_len, p.heads, p.key_dim}, "[B, T, H, K]");
      p.gate = GateKind::vector;
    } else {
      check::shape(g, "g", {p.batch, p.seq_len, p.heads}, "[B, T, H]");
      p.gate = GateKind::scalar;
    }
    check::floating(g, "g");
    check::device(g, "g", dev, "q");
  }

  p.num_seqs = p.batch;
  if (cu_seqlens.defined()) {
    FLASHGLA_REQUIRE(p.batch == 1, ErrorKind::value, "cu_seqlens",
            "variable-length input packs all sequences into B == 1, got B = " + std::to_string(p.batch));
    p.num_seqs = check::cu_seqlens(cu_seqlens, "cu_seqlens", dev, p.seq_len, cu_seqlens_host);
    p.varlen = true;
  } else {
    FLASHGLA_REQUIRE(!cu_seqlens_host.defined(), ErrorKind::value, "cu_seqlens_host", "given without cu_seqlens");
  }

  if (h0.defined()) {
    check::shape(h0, "initial_state", {p.num_seqs, p.heads, p.key_dim, p.value_dim}, "[N, H, K, V]");
    check_state_dtype(h0, "initial_state", q);
    check::device(h0, "initial_state", dev, "q");
  }

  p.scale = scale.value_or(1.0 / std::sqrt(double(p.key_dim)));
  FLASHGLA_REQUIRE(std::isfinite(p.scale), ErrorKind::value, "scale", "must be finite, got " + std::to_string(p.scale));
  FLASHGLA_REQUIRE(algorithm == GlaAlgorithm::chunked || algorithm == GlaAlgorithm::recurrent, ErrorKind::value, "algorithm",
          "expected chunked or recurrent");
  FLASHGLA_REQUIRE(!reverse || algorithm == GlaAlgorithm::recurrent, ErrorKind::value, "reverse",
          "is supported by the recurrent algorithm only");
  return p;
}

void check_state_output(const TensorView& s, const char* name, const GlaProblem& p, const Device& dev, const TensorView& q) {
  if (!s.defined()) return;
  check::shape(s, name, {p.num_seqs, p.heads, p.key_dim, p.value_dim}, "[N, H, K, V]", /*is_output=*/true);
  check_state_dtype(s, name, q);
  check::device(s, name, dev, "q");
}

void check_like(const TensorView& t, const char* name, const TensorView& like, const char* dims, DType dtype,
                const Device& dev, bool is_output) {
  check::tensor(t, name, like.ndim, dims, is_output);
  for (int d = 0; d < like.ndim; ++d)
    FLASHGLA_REQUIRE(t.shape[d] == like.shape[d], ErrorKind::value, name,
            std::string("expected shape ") + dims + " = " + like.shape_str() + ", got " + t.shape_str());
  check::dtype(t, name, dtype);
  check::device(t, name, dev, "q");
}

GlaProblem check_forward(const GlaForwardArgs& a) {
  const GlaProblem p = check_inputs(a.q, a.k, a.v, a.g, a.initial_state, a.cu_seqlens, a.cu_seqlens_host, a.scale,
                                    a.algorithm, a.reverse);
  check_like(a.o, "o", a.v, "[B, T, H, V]", a.q.dtype, a.q.device, true);
  check_state_output(a.final_state, "final_state", p, a.q.device, a.q);
  return p;
}

GlaProblem check_backward(const GlaBackwardArgs& a) {
  const GlaProblem p = check_inputs(a.q, a.k, a.v, a.g, a.initial_state, a.cu_seqlens, a.cu_seqlens_host, a.scale,
                                    a.algorithm, a.reverse);
  const Device dev = a.q.device;
  check_like(a.d_o, "d_o", a.v, "[B, T, H, V]", a.q.dtype, dev, false);
  if (a.d_final_state.defined()) {
    check::shape(a.d_final_state, "d_final_state", {p.num_seqs, p.heads, p.key_dim, p.value_dim}, "[N, H, K, V]");
    check_state_dtype(a.d_final_state, "d_final_state", a.q);
    check::device(a.d_final_state, "d_final_state", dev, "q");
  }
  check_like(a.dq, "dq", a.q, "[B, T, H, K]", a.q.dtype, dev, true);
  check_like(a.dk, "dk", a.k, "[B, T, H, K]", a.q.dtype, dev, true);
  check_like(a.dv, "dv", a.v, "[B, T, H, V]", a.q.dtype, dev, true);
  if (a.g.defined()) {
    FLASHGLA_REQUIRE(a.dg.defined(), ErrorKind::value, "dg", "is required when g is given: expected the shape of g " +
                                                        a.g.shape_str());
    const char* dims = a.g.ndim == 4 ? "[B, T, H, K]" : "[B, T, H]";
    FLASHGLA_REQUIRE(a.dg.dtype == DType::f32 || a.dg.dtype == a.g.dtype, ErrorKind::type, "dg",
            std::string("expected dtype float32 or that of g (") + dtype_name(a.g.dtype) + "), got " +
                dtype_name(a.dg.dtype));
    check_like(a.dg, "dg", a.g, dims, a.dg.dtype, dev, true);
  } else {
    FLASHGLA_REQUIRE(!a.dg.defined(), ErrorKind::value, "dg", "given without g: there is no gate to differentiate");
  }
  check_state_output(a.d_initial_state, "d_initial_state", p, dev, a.q);
  return p;
}

}  // namespace

void gla_forward(const GlaForwardArgs& a) { FLASHGLA_DISPATCH(a.q.device, gla_forward, a, check_forward(a)); }

void gla_backward(const GlaBackwardArgs& a) { FLASHGLA_DISPATCH(a.q.device, gla_backward, a, check_backward(a)); }

size_t gla_forward_workspace_bytes(const GlaForwardArgs& a) {
  [[maybe_unused]] const GlaProblem p = check_forward(a);
#ifdef FLASHGLA_WITH_CUDA
  if (a.q.device.type == DeviceType::cuda) return cuda::gla_forward_workspace_bytes(a, p);
#endif
  return 0;
}

size_t gla_backward_workspace_bytes(const GlaBackwardArgs& a) {
  [[maybe_unused]] const GlaProblem p = check_backward(a);
#ifdef FLASHGLA_WITH_CUDA
  if (a.q.device.type == DeviceType::cuda) return cuda::gla_backward_workspace_bytes(a, p);
#endif
  return 0;
}

void gla_decode(const GlaDecodeArgs& a) {
  GlaProblem p;
  check::tensor(a.q, "q", 3, "[N, H, K]");
  check::floating(a.q, "q");
  p.batch = p.num_seqs = a.q.shape[0], p.seq_len = 1, p.heads = a.q.shape[1], p.key_dim = a.q.shape[2];
  FLASHGLA_REQUIRE(p.key_dim >= 1 && p.heads >= 1, ErrorKind::value, "q", "H and K must be at least 1, got shape " + a.q.shape_str());
  const Device dev = a.q.device;
  check::shape(a.k, "k", {p.batch, p.heads, p.key_dim}, "[N, H, K]");
  check::dtype(a.k, "k", a.q.dtype);
  check::device(a.k, "k", dev, "q");
  check::tensor(a.v, "v", 3, "[N, H, V]");
  p.value_dim = a.v.shape[2];
  check::shape(a.v, "v", {p.batch, p.heads, p.value_dim}, "[N, H, V]");
  FLASHGLA_REQUIRE(p.value_dim >= 1, ErrorKind::value, "v", "V must be at least 1, got shape " + a.v.shape_str());
  check::dtype(a.v, "v", a.q.dtype);
  check::device(a.v, "v", dev, "q");
  if (a.g.defined()) {
    FLASHGLA_REQUIRE(a.g.ndim == 2 || a.g.ndim == 3, ErrorKind::value, "g",
            "expected [N, H, K] (vector gate) or [N, H] (scalar gate), got shape " + a.g.shape_str());
    if (a.g.ndim == 3) {
      check::shape(a.g, "g", {p.batch, p.heads, p.key_dim}, "[N, H, K]");
      p.gate = GateKind::vector;
    } else {
      check::shape(a.g, "g", {p.batch, p.heads}, "[N, H]");
      p.gate = GateKind::scalar;
    }
    check::floating(a.g, "g");
    check::device(a.g, "g", dev, "q");
  }
  check::shape(a.state, "state", {p.batch, p.heads, p.key_dim, p.value_dim}, "[N, H, K, V]", /*is_output=*/true);
  check::dtype(a.state, "state", DType::f32);
  check::device(a.state, "state", dev, "q");
  check::shape(a.o, "o", {p.batch, p.heads, p.value_dim}, "[N, H, V]", /*is_output=*/true);
  check::dtype(a.o, "o", a.q.dtype);
  check::device(a.o, "o", dev, "q");
  p.scale = a.scale.value_or(1.0 / std::sqrt(double(p.key_dim)));
  FLASHGLA_REQUIRE(std::isfinite(p.scale), ErrorKind::value, "scale", "must be finite, got " + std::to_string(p.scale));
  FLASHGLA_DISPATCH(dev, gla_decode, a, p);
}

}  // namespace flashgla
