// Entry points of the per-segment state summaries (flashgla/gla.h): check
// every argument, resolve the problem sizes, dispatch by device.
#include <cmath>
#include <string>

#include "api/dispatch.h"
#include "api/gate_scratch.h"
#include "api/gla_checks.h"
#include "flashgla/gla.h"

namespace flashgla {
namespace {

// The inputs both ops share: a key-side tensor `a` [B,T,H,K] (k or q), a
// value-side tensor `b` [B,T,H,V] (v or d_o) of the same dtype, the gate and
// the boundaries. Messages name the arguments as the caller knows them.
GlaProblem check_segment_inputs(const TensorView& a, const char* a_name, const TensorView& b, const char* b_name,
                                const TensorView& g, const TensorView& g_gamma, const TensorView& cu_seqlens,
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
  if (g_gamma.defined()) {
    check::shape(g_gamma, "g_gamma", {p.heads}, "[H] (one log decay per head)");
    check::floating(g_gamma, "g_gamma");
    check::device(g_gamma, "g_gamma", dev, a_name);
    FLASHGLA_REQUIRE(p.gate != GateKind::vector, ErrorKind::value, "g_gamma",
                     "adds to a scalar gate g [B, T, H] or stands alone, got a per-key gate g " + g.shape_str());
    p.gate = GateKind::scalar;  // g + g_gamma (see run_with_gamma)
  }
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
  GlaProblem p = check_segment_inputs(a.k, "k", a.v, "v", a.g, a.g_gamma, a.cu_seqlens, a.cu_seqlens_host);
  check_states_out(a.states, "states", p, a.k, "k");
  check::shape(a.log_decay, "log_decay", {p.num_seqs, p.heads, p.key_dim}, "[N, H, K]", /*is_output=*/true);
  summary_dtype(a.log_decay, "log_decay", a.k.dtype);
  check::device(a.log_decay, "log_decay", a.k.device, "k");
  return p;
}

GlaProblem check_state_grads(const GlaSegmentStateGradsArgs& a) {
  GlaProblem p = check_segment_inputs(a.q, "q", a.d_o, "d_o", a.g, a.g_gamma, a.cu_seqlens, a.cu_seqlens_host);
  check_states_out(a.d_states, "d_states", p, a.q, "q");
  p.scale = a.scale.value_or(1.0 / std::sqrt(double(p.key_dim)));
  FLASHGLA_REQUIRE(std::isfinite(p.scale), ErrorKind::value, "scale", "must be finite, got " + std::to_string(p.scale));
  return p;
}

// g_gamma: the CUDA segment kernels add an fp32 g_gamma[h] where they read the scalar gate, as the chunked
// kernels do (api::gamma_in_kernels). Elsewhere (the CPU, g_gamma in another dtype) g + g_gamma (or g_gamma
// broadcast) is staged as an fp32 [B,T,H] gate by gla_gamma_gate, as gla_forward stages it. Both give the
// summaries the local chunked op's gate bit for bit. The staged buffer comes from the head of the caller's
// workspace (CUDA), else from allocate_workspace or a stream-ordered allocation (CUDA), else the heap (CPU).
template <class Args>
Args with_gate(Args a, char* gate, const GlaProblem& p, const Device& dev) {
  a.g = api::gate_view(gate, p, dev), a.g_gamma = {};
  return a;
}

template <class Args, class Run>
void run_with_gamma(const Args& a, const GlaProblem& p, const Device& dev, Run run) {
  if (!a.g_gamma.defined() || api::gamma_in_kernels(dev, a.g_gamma)) return run(a);
  Args b = a;
  api::GateScratch scratch(dev, api::gate_bytes(p), a.stream, b.workspace, b.workspace_bytes, a.allocate_workspace);
  b = with_gate(b, scratch.bytes(), p, dev);
  const GammaGateArgs gamma{a.g, a.g_gamma, b.g, a.stream};
  FLASHGLA_DISPATCH_AS(dev, "g_gamma", gla_gamma_gate, gamma);
  run(b);
}

// A stand-in address for workspace size queries (never dereferenced).
char* const kStandIn = reinterpret_cast<char*>(api::kScratchAlign);

template <class Args, class Query>
size_t bytes_with_gamma(const Args& a, const GlaProblem& p, const Device& dev, Query query) {
  if (!a.g_gamma.defined() || api::gamma_in_kernels(dev, a.g_gamma)) return query(a);
  const size_t op = query(with_gate(a, kStandIn, p, dev));
  return kCudaBackend && dev.type == DeviceType::cuda ? api::gate_bytes(p) + op : 0;
}

}  // namespace

void gla_segment_states(const GlaSegmentStatesArgs& args) {
  const GlaProblem p = check_states(args);
  const Device dev = args.k.device;
  run_with_gamma(args, p, dev,
                 [&](const GlaSegmentStatesArgs& a) { FLASHGLA_DISPATCH_AS(dev, "k", gla_segment_states, a, p); });
}

size_t gla_segment_states_workspace_bytes(const GlaSegmentStatesArgs& args) {
  const GlaProblem p = check_states(args);
  const Device dev = args.k.device;
  return bytes_with_gamma(args, p, dev, [&](const GlaSegmentStatesArgs& a) {
    return FLASHGLA_WORKSPACE_BYTES(dev, gla_segment_states_workspace_bytes, a, p);
  });
}

void gla_segment_state_grads(const GlaSegmentStateGradsArgs& args) {
  const GlaProblem p = check_state_grads(args);
  const Device dev = args.q.device;
  run_with_gamma(args, p, dev,
                 [&](const GlaSegmentStateGradsArgs& a) { FLASHGLA_DISPATCH(dev, gla_segment_state_grads, a, p); });
}

size_t gla_segment_state_grads_workspace_bytes(const GlaSegmentStateGradsArgs& args) {
  const GlaProblem p = check_state_grads(args);
  const Device dev = args.q.device;
  return bytes_with_gamma(args, p, dev, [&](const GlaSegmentStateGradsArgs& a) {
    return FLASHGLA_WORKSPACE_BYTES(dev, gla_segment_state_grads_workspace_bytes, a, p);
  });
}

}  // namespace flashgla
