// GLA entry points: check every argument, resolve the problem sizes, dispatch.
#include <algorithm>
#include <utility>
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "api/dispatch.h"
#include "api/gla_checks.h"
#include "api/gate_scratch.h"
#include "core/gla_options_backend.h"
#include "flashgla/gla.h"

namespace flashgla {
namespace {

using api::GateScratch, api::gate_bytes, api::gate_view, api::kScratchAlign;

// States are fp32; with fp64 inputs (CPU only) they may be fp64 too, so that a
// state handed from one call to the next (context parallelism) loses nothing.
void check_state_dtype(const TensorView& s, const char* name, const TensorView& q) {
  if (q.dtype == DType::f64 && s.dtype == DType::f64) return;
  FLASHGLA_REQUIRE(s.dtype == DType::f32, ErrorKind::type, name,
                   std::string("expected dtype float32") + (q.dtype == DType::f64 ? " or float64" : "") + ", got " +
                       dtype_name(s.dtype));
}


// The states' layout: [K, V] per head, or [V, K] with state_v_first.
const char* state_dims(bool pool, bool v_first) {
  if (pool) return v_first ? "[P, H, V, K] (state_v_first)" : "[P, H, K, V]";
  return v_first ? "[N, H, V, K] (state_v_first)" : "[N, H, K, V]";
}

// Common to forward and backward: q, k, v, g, g_gamma, h0, cu_seqlens, scale, algorithm.
GlaProblem check_inputs(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g,
                        const TensorView& h0, const TensorView& cu_seqlens, const TensorView& cu_seqlens_host,
                        const std::optional<double>& scale, GlaAlgorithm algorithm, bool reverse,
                        const TensorView& g_gamma, bool v_first, bool h0_pool = false) {
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

  check::gla_gate_and_sequences(p, g, cu_seqlens, cu_seqlens_host, dev, "q");
  if (g_gamma.defined()) {
    check::shape(g_gamma, "g_gamma", {p.heads}, "[H] (one log decay per head)");
    check::floating(g_gamma, "g_gamma");
    check::device(g_gamma, "g_gamma", dev, "q");
    FLASHGLA_REQUIRE(p.gate != GateKind::vector, ErrorKind::value, "g_gamma",
                     "adds to a scalar gate g [B, T, H] (chunk_simple_gla) or stands alone, got a per-key gate g " +
                         g.shape_str());
    p.gate = GateKind::scalar;  // g + g_gamma (see gamma_in_kernels)
  }

  if (h0.defined()) {
    if (h0_pool) check::tensor(h0, "initial_state", 4, state_dims(true, v_first));
    check::shape(h0, "initial_state",
                 {h0_pool ? h0.shape[0] : p.num_seqs, p.heads, v_first ? p.value_dim : p.key_dim,
                  v_first ? p.key_dim : p.value_dim},
                 state_dims(h0_pool, v_first));
    // Pools are fp32 (the pool copies move floats); dense states may be fp64 with fp64 inputs.
    if (h0_pool) check::dtype(h0, "initial_state", DType::f32);
    else check_state_dtype(h0, "initial_state", q);
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

void check_state_output(const TensorView& s, const char* name, const GlaProblem& p, const Device& dev,
                        const TensorView& q, bool v_first, bool pool = false) {
  if (!s.defined()) return;
  if (pool) check::tensor(s, name, 4, state_dims(true, v_first), /*is_output=*/true);
  check::shape(s, name,
               {pool ? s.shape[0] : p.num_seqs, p.heads, v_first ? p.value_dim : p.key_dim,
                v_first ? p.key_dim : p.value_dim},
               state_dims(pool, v_first), /*is_output=*/true);
  if (pool) check::dtype(s, name, DType::f32);
  else check_state_dtype(s, name, q);
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

// Pool rows: readable on the host only for CPU tensors; there every index must
// be < P and, where `distinct`, the non-negative ones distinct (two sequences
// writing one row would race).
void check_rows(const TensorView& idx, const char* name, int64_t num_seqs, int64_t pool, bool distinct,
                const Device& dev) {
  check::shape(idx, name, {num_seqs}, "[N]");
  check::dtype(idx, name, DType::i32);
  check::device(idx, name, dev, "q");
  if (dev.type != DeviceType::cpu) return;
  std::vector<bool> used(size_t(pool), false);
  for (int64_t i = 0; i < num_seqs; ++i) {
    const int32_t row = static_cast<const int32_t*>(idx.data)[i * idx.stride[0]];
    if (row < 0) continue;
    FLASHGLA_REQUIRE(row < pool, ErrorKind::value, name,
                     "expected rows of the state pool (< P = " + std::to_string(pool) + ") or negative (padded), got " +
                         std::to_string(row) + " at position " + std::to_string(i));
    FLASHGLA_REQUIRE(!distinct || !used[size_t(row)], ErrorKind::value, name,
                     "expected distinct rows, got " + std::to_string(row) + " twice");
    used[size_t(row)] = true;
  }
}

// vLLM's state-pool arguments (ssm_state_indices, num_accepted_tokens, inplace_final_state); see gla.h.
void check_ssm_pool(const GlaForwardArgs& a, const GlaProblem& p) {
  const TensorView& idx = a.ssm_state_indices;
  const Device dev = a.q.device;
  const int64_t N = p.num_seqs;
  FLASHGLA_REQUIRE(a.algorithm == GlaAlgorithm::recurrent, ErrorKind::value, "ssm_state_indices",
                   "needs the recurrent algorithm (fused_recurrent_gla / fused_recurrent_simple_gla)");
  FLASHGLA_REQUIRE(!a.reverse, ErrorKind::value, "reverse",
                   "is not supported with ssm_state_indices (pool states run forward in time)");
  FLASHGLA_REQUIRE(!a.initial_state_indices.defined() && !a.final_state_indices.defined(), ErrorKind::value,
                   "ssm_state_indices", "given with initial_state_indices / final_state_indices: pass one kind of pool rows");
  FLASHGLA_REQUIRE(a.initial_state.defined(), ErrorKind::value, "initial_state",
                   "is required with ssm_state_indices: the state pool [P, H, K, V] they index");
  FLASHGLA_REQUIRE(idx.defined() && (idx.ndim == 1 || idx.ndim == 2), ErrorKind::value, "ssm_state_indices",
                   "expected [N] or [N, T_max] (pool rows per sequence, or per sequence and token), got shape " +
                       idx.shape_str());
  const bool per_token = idx.ndim == 2;
  if (per_token) {
    check::shape(idx, "ssm_state_indices", {N, idx.shape[1]}, "[N, T_max]");
    FLASHGLA_REQUIRE(idx.shape[1] >= 1, ErrorKind::value, "ssm_state_indices",
                     "expected T_max >= 1 columns, got shape " + idx.shape_str());
  } else {
    check::shape(idx, "ssm_state_indices", {N}, "[N]");
  }
  check::dtype(idx, "ssm_state_indices", DType::i32);
  check::device(idx, "ssm_state_indices", dev, "q");
  const TensorView& accepted = a.num_accepted_tokens;
  if (accepted.defined()) {
    FLASHGLA_REQUIRE(per_token, ErrorKind::value, "num_accepted_tokens",
                     "needs ssm_state_indices [N, T_max] (a pool row per draft token), got ssm_state_indices " +
                         idx.shape_str());
    check::shape(accepted, "num_accepted_tokens", {N}, "[N]");
    check::dtype(accepted, "num_accepted_tokens", DType::i32);
    check::device(accepted, "num_accepted_tokens", dev, "q");
  }
  const bool v_first = a.state_v_first;
  const char* token_dims = v_first ? "[B*T, H, V, K] (the state after every token; state_v_first)"
                                   : "[B*T, H, K, V] (the state after every token)";
  if (a.inplace_final_state) {
    FLASHGLA_REQUIRE(!a.final_state.defined(), ErrorKind::value, "final_state",
                     "must be left empty with inplace_final_state: the states go back into initial_state (the pool)");
  } else if (a.final_state.defined()) {
    check::shape(a.final_state, "final_state",
                 {p.batch * p.seq_len, p.heads, v_first ? p.value_dim : p.key_dim, v_first ? p.key_dim : p.value_dim},
                 token_dims, /*is_output=*/true);
    check::dtype(a.final_state, "final_state", DType::f32);
    check::device(a.final_state, "final_state", dev, "q");
  }
  if (dev.type != DeviceType::cpu) return;  // device indices are not read back (no sync)
  const int64_t pool = a.initial_state.shape[0], cols = per_token ? idx.shape[1] : 1;
  const int64_t col_stride = per_token ? idx.stride[1] : 0;
  const auto* rows = static_cast<const int32_t*>(idx.data);
  for (int64_t n = 0; accepted.defined() && n < N; ++n) {
    const int32_t count = static_cast<const int32_t*>(accepted.data)[n * accepted.stride[0]];
    FLASHGLA_REQUIRE(count >= 1 && count <= cols, ErrorKind::value, "num_accepted_tokens",
                     "expected 1 to T_max = " + std::to_string(cols) + " accepted tokens per sequence, got " +
                         std::to_string(count) + " at position " + std::to_string(n));
  }
  std::vector<bool> used(size_t(pool), false);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t t = 0; t < cols; ++t) {
      const int32_t row = rows[n * idx.stride[0] + t * col_stride];
      if (row < 0) continue;
      const std::string at = per_token ? "[" + std::to_string(n) + ", " + std::to_string(t) + "]"
                                       : "[" + std::to_string(n) + "]";
      FLASHGLA_REQUIRE(row < pool, ErrorKind::value, "ssm_state_indices",
                       "expected rows of the state pool initial_state (< P = " + std::to_string(pool) +
                           ") or -1 (padded slot), got " + std::to_string(row) + " at " + at);
      FLASHGLA_REQUIRE(!used[size_t(row)], ErrorKind::value, "ssm_state_indices",
                       "expected distinct pool rows within one call, got row " + std::to_string(row) +
                           " twice (again at " + at + ")");
      used[size_t(row)] = true;
    }
}

// The folded normaliser's residuals (GlaForwardArgs::norm_den, norm_chunk_z): contiguous f32.
void check_norm_den(const TensorView& t, const GlaProblem& p, const Device& dev, bool is_output) {
  check::shape(t, "norm_den", {p.batch, p.seq_len, p.heads}, "[B, T, H]", is_output);
  check::dtype(t, "norm_den", DType::f32);
  check::device(t, "norm_den", dev, "q");
  FLASHGLA_REQUIRE(t.is_contiguous(), ErrorKind::value, "norm_den", "expected a contiguous tensor");
}

// S (its chunk slots) is gla_normalize_residual_slots's answer, checked where the call runs.
void check_norm_chunk_z(const TensorView& t, const GlaProblem& p, const Device& dev, bool is_output) {
  check::tensor(t, "norm_chunk_z", 3, "[S, H, K]", is_output);
  check::shape(t, "norm_chunk_z", {t.shape[0], p.heads, p.key_dim}, "[S, H, K] (S: gla_normalize_residual_slots)",
               is_output);
  check::dtype(t, "norm_chunk_z", DType::f32);
  check::device(t, "norm_chunk_z", dev, "q");
  FLASHGLA_REQUIRE(t.is_contiguous(), ErrorKind::value, "norm_chunk_z", "expected a contiguous tensor");
}

void check_key_sum(const TensorView& t, const char* name, const GlaProblem& p, const Device& dev, bool is_output) {
  check::shape(t, name, {p.num_seqs, p.heads, p.key_dim}, "[N, H, K]", is_output);
  check::dtype(t, name, DType::f32);
  check::device(t, name, dev, "q");
}

// GlaForwardArgs::intra / GlaBackwardArgs::intra: [B, T, H, 64] of q's dtype, contiguous (the kernels move whole
// 128-byte rows).
void check_intra(const TensorView& t, const GlaProblem& p, const TensorView& q, bool is_output) {
  check::shape(t, "intra", {p.batch, p.seq_len, p.heads, int64_t(kIntraColumns)}, "[B, T, H, 64]", is_output);
  check::dtype(t, "intra", q.dtype);
  check::device(t, "intra", q.device, "q");
  FLASHGLA_REQUIRE(t.is_contiguous(), ErrorKind::value, "intra", "expected a contiguous tensor");
}

GlaProblem check_forward(const GlaForwardArgs& a) {
  const bool ssm_pool = a.ssm_state_indices.defined();
  const bool h0_pool = a.initial_state_indices.defined() || ssm_pool, ht_pool = a.final_state_indices.defined();
  const GlaProblem p = check_inputs(a.q, a.k, a.v, a.g, a.initial_state, a.cu_seqlens, a.cu_seqlens_host, a.scale,
                                    a.algorithm, a.reverse, a.g_gamma, a.state_v_first, h0_pool);
  check_like(a.o, "o", a.v, "[B, T, H, V]", a.q.dtype, a.q.device, true);
  if (a.normalize) {
    FLASHGLA_REQUIRE(!a.g.defined() && !a.g_gamma.defined(), ErrorKind::value, a.g.defined() ? "g" : "g_gamma",
                     "normalize takes no gate (the normaliser of plain linear attention)");
    FLASHGLA_REQUIRE(!h0_pool && !ht_pool, ErrorKind::value, "normalize",
                     "takes dense states, not state pools (the running key sum has no pool)");
    gla_normalize_forward_workspace_bytes(normalize_args_of(a));  // checks z_init and z_final
    if (a.norm_den.defined()) check_norm_den(a.norm_den, p, a.q.device, true);
    if (a.norm_chunk_z.defined()) check_norm_chunk_z(a.norm_chunk_z, p, a.q.device, true);
  } else {
    FLASHGLA_REQUIRE(!a.z_init.defined(), ErrorKind::value, "z_init", "is the normaliser's: only with normalize");
    FLASHGLA_REQUIRE(!a.z_final.defined(), ErrorKind::value, "z_final", "is the normaliser's: only with normalize");
    FLASHGLA_REQUIRE(!a.norm_den.defined(), ErrorKind::value, "norm_den", "is the normaliser's: only with normalize");
  }
  FLASHGLA_REQUIRE(a.norm_den.defined() == a.norm_chunk_z.defined(), ErrorKind::value,
                   a.norm_den.defined() ? "norm_chunk_z" : "norm_den",
                   "norm_den and norm_chunk_z come together (the folded normaliser's residuals)");
  if (a.intra.defined()) check_intra(a.intra, p, a.q, /*is_output=*/true);
  if (ssm_pool) {
    check_ssm_pool(a, p);
    return p;
  }
  FLASHGLA_REQUIRE(!a.num_accepted_tokens.defined(), ErrorKind::value, "num_accepted_tokens",
                   "needs ssm_state_indices [N, T_max] (the pool rows it picks from)");
  FLASHGLA_REQUIRE(!a.inplace_final_state, ErrorKind::value, "inplace_final_state",
                   "needs ssm_state_indices (the pool rows the states go back to)");
  check_state_output(a.final_state, "final_state", p, a.q.device, a.q, a.state_v_first, ht_pool);
  if (h0_pool) {
    FLASHGLA_REQUIRE(a.initial_state.defined(), ErrorKind::value, "initial_state",
                     "is required with initial_state_indices: the pool [P, H, K, V] they index");
    check_rows(a.initial_state_indices, "initial_state_indices", p.num_seqs, a.initial_state.shape[0], false,
               a.q.device);
  }
  if (ht_pool) {
    FLASHGLA_REQUIRE(a.final_state.defined(), ErrorKind::value, "final_state",
                     "is required with final_state_indices: the pool [P, H, K, V] they index");
    check_rows(a.final_state_indices, "final_state_indices", p.num_seqs, a.final_state.shape[0], true, a.q.device);
  }
  return p;
}

GlaProblem check_backward(const GlaBackwardArgs& a) {
  const GlaProblem p = check_inputs(a.q, a.k, a.v, a.g, a.initial_state, a.cu_seqlens, a.cu_seqlens_host, a.scale,
                                    a.algorithm, a.reverse, a.g_gamma, a.state_v_first);
  const Device dev = a.q.device;
  const bool v_first = a.state_v_first;
  check_like(a.d_o, "d_o", a.v, "[B, T, H, V]", a.q.dtype, dev, false);
  if (a.d_final_state.defined()) {
    check::shape(a.d_final_state, "d_final_state",
                 {p.num_seqs, p.heads, v_first ? p.value_dim : p.key_dim, v_first ? p.key_dim : p.value_dim},
                 state_dims(false, v_first));
    check_state_dtype(a.d_final_state, "d_final_state", a.q);
    check::device(a.d_final_state, "d_final_state", dev, "q");
  }
  check_like(a.dq, "dq", a.q, "[B, T, H, K]", a.q.dtype, dev, true);
  check_like(a.dk, "dk", a.k, "[B, T, H, K]", a.q.dtype, dev, true);
  check_like(a.dv, "dv", a.v, "[B, T, H, V]", a.q.dtype, dev, true);
  if (a.intra.defined()) check_intra(a.intra, p, a.q, /*is_output=*/false);
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
  check_state_output(a.d_initial_state, "d_initial_state", p, dev, a.q, v_first);
  if (a.d_g_gamma.defined()) {
    FLASHGLA_REQUIRE(a.g_gamma.defined(), ErrorKind::value, "d_g_gamma", "given without g_gamma");
    check::shape(a.d_g_gamma, "d_g_gamma", {p.heads}, "[H]", /*is_output=*/true);
    FLASHGLA_REQUIRE(a.d_g_gamma.dtype == DType::f32 || a.d_g_gamma.dtype == a.g_gamma.dtype, ErrorKind::type,
                     "d_g_gamma",
                     std::string("expected dtype float32 or that of g_gamma (") + dtype_name(a.g_gamma.dtype) +
                         "), got " + dtype_name(a.d_g_gamma.dtype));
    check::device(a.d_g_gamma, "d_g_gamma", dev, "q");
  }
  if (a.norm_den.defined()) {  // the folded normaliser (GlaBackwardArgs::norm_o)
    FLASHGLA_REQUIRE(!a.g.defined() && !a.g_gamma.defined(), ErrorKind::value, a.g.defined() ? "g" : "g_gamma",
                     "the folded normaliser takes no gate");
    FLASHGLA_REQUIRE(a.algorithm == GlaAlgorithm::chunked, ErrorKind::value, "algorithm",
                     "the folded normaliser (norm_den) is the chunked algorithm's");
    check_like(a.norm_o, "norm_o", a.v, "[B, T, H, V]", a.q.dtype, dev, false);
    check_norm_den(a.norm_den, p, dev, false);
    check_norm_chunk_z(a.norm_chunk_z, p, dev, false);
    if (a.d_z_final.defined()) check_key_sum(a.d_z_final, "d_z_final", p, dev, false);
    if (a.d_z_init.defined()) check_key_sum(a.d_z_init, "d_z_init", p, dev, true);
    FLASHGLA_REQUIRE(dev.type == DeviceType::cuda, ErrorKind::unsupported, "norm_den",
                     "the folded normaliser runs on CUDA only (gla_normalize_residual_slots is 0 on the CPU)");
  } else {
    const char* stray = a.norm_o.defined() ? "norm_o" : a.norm_chunk_z.defined() ? "norm_chunk_z"
                        : a.d_z_final.defined() ? "d_z_final" : a.d_z_init.defined() ? "d_z_init" : nullptr;
    FLASHGLA_REQUIRE(stray == nullptr, ErrorKind::value, stray ? stray : "",
                     "belongs to the folded normaliser: only with norm_den");
  }
  return p;
}

// ---- FLA 0.6's options, composed on top of the kernels ------------------------

// state_v_first: a [N,H,V,K] state is the [N,H,K,V] state with the last two
// dimensions' strides swapped; the kernels read and write states through their
// strides, so the layout costs nothing but scattered state accesses.
TensorView kv_view(TensorView t) {
  if (!t.defined()) return t;
  std::swap(t.shape[2], t.shape[3]);
  std::swap(t.stride[2], t.stride[3]);
  return t;
}

GlaForwardArgs with_kv_states(GlaForwardArgs a) {
  if (!a.state_v_first) return a;
  a.initial_state = kv_view(a.initial_state), a.final_state = kv_view(a.final_state);
  a.state_v_first = false;
  return a;
}

GlaBackwardArgs with_kv_states(GlaBackwardArgs a) {
  if (!a.state_v_first) return a;
  a.initial_state = kv_view(a.initial_state), a.d_final_state = kv_view(a.d_final_state);
  a.d_initial_state = kv_view(a.d_initial_state);
  a.state_v_first = false;
  return a;
}

// g_gamma: the CUDA chunked kernels add an fp32 g_gamma[h] where they read the
// scalar gate, and sum its gradient per chunk (gla_backward.cu). Elsewhere (the
// CPU reference, the recurrent kernels, g_gamma in another dtype) g + g_gamma (or g_gamma broadcast) is
// materialised as an fp32 [B,T,H] gate, and in the backward the gradient of
// that gate gives dg (a copy) and d_g_gamma (its sum over tokens). The buffers
// come from the head of the caller's workspace (CUDA), else from a
// stream-ordered allocation (CUDA) or the heap (CPU).
bool gamma_in_kernels(const TensorView& q, const TensorView& g_gamma, GlaAlgorithm algorithm) {
  return algorithm == GlaAlgorithm::chunked && api::gamma_in_kernels(q.device, g_gamma);
}

// A stand-in address for workspace size queries (never dereferenced).
char* const kStandIn = reinterpret_cast<char*>(kScratchAlign);

GlaForwardArgs with_gate(GlaForwardArgs a, char* gate, const GlaProblem& p) {
  a.g = gate_view(gate, p, a.q.device), a.g_gamma = {};
  return a;
}

// gla_normalize_residual_slots for checked args with dense [N,H,K,V] states (with_kv_states).
int64_t residual_slots(const GlaForwardArgs& a, const GlaProblem& p) {
  if (!a.normalize || a.algorithm != GlaAlgorithm::chunked || a.reverse) return 0;
#ifdef FLASHGLA_WITH_CUDA
  if (a.q.device.type == DeviceType::cuda) return cuda::gla_normalize_residual_slots(a, p);
#endif
  (void)p;
  return 0;
}

GlaBackwardArgs with_gate(GlaBackwardArgs a, char* gate, const GlaProblem& p) {
  a.g = gate_view(gate, p, a.q.device), a.dg = gate_view(gate + gate_bytes(p), p, a.q.device);
  a.g_gamma = {}, a.d_g_gamma = {};
  return a;
}

// GlaPhase (flashgla/gla.h): the CUDA backend's answer where the API's own conditions hold (g_gamma in the
// kernels: no staged gate, whose scratch would sit in front of the op's).
template <class Args>
bool phases_apply(const Args& a, const GlaProblem& p) {
  if (a.q.device.type != DeviceType::cuda || (a.g_gamma.defined() && !gamma_in_kernels(a.q, a.g_gamma, a.algorithm)))
    return false;
#ifdef FLASHGLA_WITH_CUDA
  if constexpr (std::is_same_v<Args, GlaForwardArgs>) return cuda::gla_forward_phases_apply(a, p);
  else return cuda::gla_backward_phases_apply(a, p);
#else
  (void)p;
  return false;
#endif
}

// GlaForwardArgs::intra (flashgla/gla.h): the CUDA backend's answer, for a forward's or a backward's args.
template <class Args>
bool intra_applies(const Args& a, const GlaProblem& p) {
  if (a.q.device.type != DeviceType::cuda) return false;
#ifdef FLASHGLA_WITH_CUDA
  if constexpr (std::is_same_v<Args, GlaForwardArgs>) return cuda::gla_forward_saves_intra(a, p);
  else return cuda::gla_backward_reads_intra(a, p);
#else
  (void)p;
  return false;
#endif
}

// summary_columns: V + 1 (the forward's summary [N, H, K, V+1]) or V (the backward's [N, H, K, V]).
template <class Args>
void check_phase(const Args& a, bool applies, const GlaProblem& p, int64_t summary_columns, const char* query) {
  if (a.phase == GlaPhase::whole) {
    FLASHGLA_REQUIRE(!a.summary.defined(), ErrorKind::value, "summary", "is the output of phase = summary only");
    return;
  }
  if (a.phase == GlaPhase::summary) {  // (an output call does not read it)
    FLASHGLA_REQUIRE(a.summary.defined(), ErrorKind::value, "summary", "is required with phase = summary");
    check::shape(a.summary, "summary", {p.num_seqs, p.heads, p.key_dim, summary_columns},
                 summary_columns > p.value_dim ? "[N, H, K, V + 1]" : "[N, H, K, V]", /*is_output=*/true);
    check::dtype(a.summary, "summary", DType::f32);
    check::device(a.summary, "summary", a.q.device, "q");
  }
  FLASHGLA_REQUIRE(applies, ErrorKind::unsupported, "phase",
                   std::string("a summary or output call needs arguments that ") + query +
                       " accepts (flashgla/gla.h, GlaPhase)");
  FLASHGLA_REQUIRE(a.workspace != nullptr, ErrorKind::value, "workspace",
                   "the summary and output calls share the workspace given (allocate_workspace is not used)");
}

}  // namespace

void gla_forward(const GlaForwardArgs& args) {
  const GlaProblem p = check_forward(args);
  GlaForwardArgs a = with_kv_states(args);
  const Device dev = a.q.device;
  if (a.phase != GlaPhase::whole || a.summary.defined())
    check_phase(a, a.phase != GlaPhase::whole && phases_apply(a, p), p, p.value_dim + 1,
                "gla_forward_phases_apply");
  FLASHGLA_REQUIRE(!a.intra.defined() || intra_applies(a, p), ErrorKind::unsupported, "intra",
                   "is written only where gla_forward_saves_intra is true (CUDA, chunked, bf16 or fp16 q, k, v and a "
                   "vector gate in 16-byte aligned rows, K <= 128, or K <= 256 on sm_90; no pools, no normalize, "
                   "not a summary call)");
  if (a.norm_den.defined()) {
    const int64_t slots = residual_slots(a, p);
    FLASHGLA_REQUIRE(slots > 0, ErrorKind::value, "norm_den",
                     "the folded normaliser's residuals are filled only where gla_normalize_residual_slots is > 0 "
                     "(CUDA, bf16, K and V of 64 or 128, the chunked fast kernel)");
    FLASHGLA_REQUIRE(a.norm_chunk_z.shape[0] == slots, ErrorKind::value, "norm_chunk_z",
                     "expected [S, H, K] with S = gla_normalize_residual_slots = " + std::to_string(slots) +
                         ", got " + a.norm_chunk_z.shape_str());
  }
  if (a.normalize && dev.type == DeviceType::cpu) {  // the op, then the normaliser on o (CUDA: in its backend)
    GlaForwardArgs op = a;
    op.normalize = false, op.z_init = {}, op.z_final = {};
    cpu::gla_forward(op, p);
    return cpu::gla_normalize_forward(normalize_args_of(a), p);
  }
  if (!a.g_gamma.defined() || gamma_in_kernels(a.q, a.g_gamma, a.algorithm))
    return FLASHGLA_DISPATCH(dev, gla_forward, a, p);
  GateScratch scratch(dev, gate_bytes(p), a.stream, a.workspace, a.workspace_bytes, a.allocate_workspace);
  const GlaForwardArgs b = with_gate(a, scratch.bytes(), p);
  const GammaGateArgs gamma{a.g, a.g_gamma, b.g, a.stream};
  FLASHGLA_DISPATCH(dev, gla_gamma_gate, gamma);
  FLASHGLA_DISPATCH(dev, gla_forward, b, p);
}

void gla_backward(const GlaBackwardArgs& args) {
  const GlaProblem p = check_backward(args);
  GlaBackwardArgs a = with_kv_states(args);
  const Device dev = a.q.device;
  if (a.intra.defined() && !intra_applies(a, p)) a.intra = {};  // the forward did not write it: recomputed
  if (a.phase != GlaPhase::whole || a.summary.defined())
    check_phase(a, a.phase != GlaPhase::whole && phases_apply(a, p), p, p.value_dim,
                "gla_backward_phases_apply");
  if (!a.g_gamma.defined() || gamma_in_kernels(a.q, a.g_gamma, a.algorithm))
    return FLASHGLA_DISPATCH(dev, gla_backward, a, p);
  GateScratch scratch(dev, 2 * gate_bytes(p), a.stream, a.workspace, a.workspace_bytes, a.allocate_workspace);
  const GlaBackwardArgs b = with_gate(a, scratch.bytes(), p);
  const GammaGateArgs gamma{a.g, a.g_gamma, b.g, a.stream};
  FLASHGLA_DISPATCH(dev, gla_gamma_gate, gamma);
  FLASHGLA_DISPATCH(dev, gla_backward, b, p);
  const GammaGradArgs grad{b.dg, a.dg, a.d_g_gamma, a.stream};
  FLASHGLA_DISPATCH(dev, gla_gamma_grad, grad);
}

bool gla_forward_phases_apply(const GlaForwardArgs& args) {
  const GlaProblem p = check_forward(args);
  return phases_apply(with_kv_states(args), p);
}

bool gla_backward_phases_apply(const GlaBackwardArgs& args) {
  const GlaProblem p = check_backward(args);
  return phases_apply(with_kv_states(args), p);
}

bool gla_forward_saves_intra(const GlaForwardArgs& args) {
  const GlaProblem p = check_forward(args);
  return intra_applies(with_kv_states(args), p);
}

int64_t gla_normalize_residual_slots(const GlaForwardArgs& args) {
  const GlaProblem p = check_forward(args);
  return residual_slots(with_kv_states(args), p);
}

// With a materialised g_gamma gate the op's scratch follows the gate's (see GateScratch).
size_t gla_forward_workspace_bytes(const GlaForwardArgs& args) {
  const GlaProblem p = check_forward(args);
  const GlaForwardArgs a = with_kv_states(args);
  const Device dev = a.q.device;
  if (!a.g_gamma.defined() || gamma_in_kernels(a.q, a.g_gamma, a.algorithm))
    return FLASHGLA_WORKSPACE_BYTES(dev, gla_forward_workspace_bytes, a, p);
  const size_t op = FLASHGLA_WORKSPACE_BYTES(dev, gla_forward_workspace_bytes, with_gate(a, kStandIn, p), p);
  return kCudaBackend && dev.type == DeviceType::cuda ? gate_bytes(p) + op : 0;
}

size_t gla_backward_workspace_bytes(const GlaBackwardArgs& args) {
  const GlaProblem p = check_backward(args);
  const GlaBackwardArgs a = with_kv_states(args);
  const Device dev = a.q.device;
  if (!a.g_gamma.defined() || gamma_in_kernels(a.q, a.g_gamma, a.algorithm))
    return FLASHGLA_WORKSPACE_BYTES(dev, gla_backward_workspace_bytes, a, p);
  const size_t op = FLASHGLA_WORKSPACE_BYTES(dev, gla_backward_workspace_bytes, with_gate(a, kStandIn, p), p);
  return kCudaBackend && dev.type == DeviceType::cuda ? 2 * gate_bytes(p) + op : 0;
}

namespace {

// [N, ...] -> [N, 1, ...]: one token, as a view with a token dimension of 1.
TensorView with_token_dim(TensorView t) {
  if (!t.defined()) return t;
  for (int d = t.ndim; d > 1; --d) t.shape[d] = t.shape[d - 1], t.stride[d] = t.stride[d - 1];
  t.shape[1] = 1;
  t.stride[1] = t.stride[0];
  ++t.ndim;
  return t;
}

}  // namespace

void gla_decode(const GlaDecodeArgs& args) {
  FLASHGLA_REQUIRE(args.q.defined(), ErrorKind::value, "q", "is required: [N, H, K] or [N, T, H, K]");
  const bool tokens = args.q.ndim == 4;  // with a token dimension
  const char* dims_k = tokens ? "[N, T, H, K]" : "[N, H, K]";
  const char* dims_v = tokens ? "[N, T, H, V]" : "[N, H, V]";
  const Device dev = args.q.device;
  check::tensor(args.q, "q", tokens ? 4 : 3, tokens ? "[N, T, H, K] (or [N, H, K])" : "[N, H, K] (or [N, T, H, K])");
  check::floating(args.q, "q");
  // Checked in the caller's layout, then every tensor gets a token dimension.
  GlaDecodeArgs a = args;
  if (!tokens) {
    for (const TensorView* t : {&args.k, &args.v, &args.o})
      FLASHGLA_REQUIRE(!t->defined() || t->ndim == 3, ErrorKind::value,
                       t == &args.k ? "k" : t == &args.v ? "v" : "o",
                       std::string("expected ") + (t == &args.k ? dims_k : dims_v) + " like q, got shape " +
                           t->shape_str());
    FLASHGLA_REQUIRE(!a.g.defined() || a.g.ndim == 2 || a.g.ndim == 3, ErrorKind::value, "g",
                     "expected [N, H, K] (vector gate) or [N, H] (scalar gate), got shape " + a.g.shape_str());
    a.q = with_token_dim(a.q), a.k = with_token_dim(a.k), a.v = with_token_dim(a.v), a.o = with_token_dim(a.o);
    a.g = with_token_dim(a.g);
  }
  GlaProblem p;
  p.batch = p.num_seqs = a.q.shape[0], p.seq_len = a.q.shape[1], p.heads = a.q.shape[2], p.key_dim = a.q.shape[3];
  FLASHGLA_REQUIRE(p.key_dim >= 1 && p.heads >= 1, ErrorKind::value, "q",
                   "H and K must be at least 1, got shape " + args.q.shape_str());
  FLASHGLA_REQUIRE(p.seq_len >= 1 && p.seq_len <= kMaxDecodeTokens, ErrorKind::value, "q",
                   "expected 1 to " + std::to_string(kMaxDecodeTokens) + " tokens per sequence, got T = " +
                       std::to_string(p.seq_len) + " (use gla_forward for longer inputs)");
  const int64_t N = p.num_seqs, T = p.seq_len, H = p.heads, K = p.key_dim;
  // Shapes are named in the caller's layout: a one-token call sees [N, H, K], not the internal [N, 1, H, K].
  if (tokens) check::shape(a.k, "k", {N, T, H, K}, dims_k);
  else check::shape(args.k, "k", {N, H, K}, dims_k);
  check::dtype(a.k, "k", a.q.dtype);
  check::device(a.k, "k", dev, "q");
  check::tensor(a.v, "v", 4, dims_v);
  p.value_dim = a.v.shape[3];
  const int64_t V = p.value_dim;
  if (tokens) check::shape(a.v, "v", {N, T, H, V}, dims_v);
  else check::shape(args.v, "v", {N, H, V}, dims_v);
  FLASHGLA_REQUIRE(V >= 1, ErrorKind::value, "v", "V must be at least 1, got shape " + args.v.shape_str());
  check::dtype(a.v, "v", a.q.dtype);
  check::device(a.v, "v", dev, "q");
  if (a.g.defined()) {
    FLASHGLA_REQUIRE(a.g.ndim == 3 || a.g.ndim == 4, ErrorKind::value, "g",
                     std::string("expected ") + (tokens ? "[N, T, H, K] (vector gate) or [N, T, H]" :
                                                          "[N, H, K] (vector gate) or [N, H]") +
                         " (scalar gate), got shape " + args.g.shape_str());
    if (a.g.ndim == 4) {
      if (tokens) check::shape(a.g, "g", {N, T, H, K}, dims_k);
      else check::shape(args.g, "g", {N, H, K}, dims_k);
      p.gate = GateKind::vector;
    } else {
      if (tokens) check::shape(a.g, "g", {N, T, H}, "[N, T, H]");
      else check::shape(args.g, "g", {N, H}, "[N, H]");
      p.gate = GateKind::scalar;
    }
    check::floating(a.g, "g");
    check::device(a.g, "g", dev, "q");
  }
  check::tensor(a.state, "state", 4, a.state_indices.defined() ? "[P, H, K, V]" : "[N, H, K, V]", /*is_output=*/true);
  p.state_rows = a.state_indices.defined() ? a.state.shape[0] : N;
  check::shape(a.state, "state", {p.state_rows, H, K, V}, a.state_indices.defined() ? "[P, H, K, V]" : "[N, H, K, V]",
               /*is_output=*/true);
  check::dtype(a.state, "state", DType::f32);
  check::device(a.state, "state", dev, "q");
  if (a.state_indices.defined()) check_rows(a.state_indices, "state_indices", N, p.state_rows, true, dev);
  if (tokens) check::shape(a.o, "o", {N, T, H, V}, dims_v, /*is_output=*/true);
  else check::shape(args.o, "o", {N, H, V}, dims_v, /*is_output=*/true);
  check::dtype(a.o, "o", a.q.dtype);
  check::device(a.o, "o", dev, "q");
  if (a.token_states.defined()) {
    check::shape(a.token_states, "token_states", {N * T, H, K, V}, "[N*T, H, K, V]", /*is_output=*/true);
    check::dtype(a.token_states, "token_states", DType::f32);
    check::device(a.token_states, "token_states", dev, "q");
  }
  p.scale = a.scale.value_or(1.0 / std::sqrt(double(K)));
  FLASHGLA_REQUIRE(std::isfinite(p.scale), ErrorKind::value, "scale", "must be finite, got " + std::to_string(p.scale));
  FLASHGLA_DISPATCH(dev, gla_decode, a, p);
}

}  // namespace flashgla
