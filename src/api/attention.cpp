// Softmax attention entry points: check every argument, resolve sizes, dispatch.
#include <cmath>

#include "api/dispatch.h"
#include "flashgla/attention.h"

namespace flashgla {
namespace {


AttentionProblem check_inputs(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& cu_q,
                              const TensorView& cu_k, bool causal, const std::optional<double>& scale,
                              AttentionAlgorithm algorithm) {
  AttentionProblem p;
  check::tensor(q, "q", 4, "[B, Tq, Hq, D]");
  check::floating(q, "q");
  p.batch = q.shape[0], p.q_len = q.shape[1], p.q_heads = q.shape[2], p.head_dim = q.shape[3];
  FLASHGLA_REQUIRE(p.q_heads >= 1 && p.head_dim >= 1, ErrorKind::value, "q", "Hq and D must be at least 1, got shape " + q.shape_str());
  const Device dev = q.device;
  check::tensor(k, "k", 4, "[B, Tk, Hkv, D]");
  p.k_len = k.shape[1], p.kv_heads = k.shape[2];
  check::shape(k, "k", {p.batch, p.k_len, p.kv_heads, p.head_dim}, "[B, Tk, Hkv, D]");
  FLASHGLA_REQUIRE(p.kv_heads >= 1 && p.q_heads % p.kv_heads == 0, ErrorKind::value, "k",
          "the number of KV heads (" + std::to_string(p.kv_heads) + ") must divide the number of query heads (" +
              std::to_string(p.q_heads) + ")");
  check::dtype(k, "k", q.dtype);
  check::device(k, "k", dev, "q");
  check::tensor(v, "v", 4, "[B, Tk, Hkv, Dv]");
  p.value_dim = v.shape[3];
  check::shape(v, "v", {p.batch, p.k_len, p.kv_heads, p.value_dim}, "[B, Tk, Hkv, Dv]");
  FLASHGLA_REQUIRE(p.value_dim >= 1, ErrorKind::value, "v", "Dv must be at least 1, got shape " + v.shape_str());
  check::dtype(v, "v", q.dtype);
  check::device(v, "v", dev, "q");

  p.num_seqs = p.batch;
  FLASHGLA_REQUIRE(cu_q.defined() == cu_k.defined(), ErrorKind::value, cu_q.defined() ? "cu_seqlens_k" : "cu_seqlens_q",
          "cu_seqlens_q and cu_seqlens_k are given together or not at all");
  if (cu_q.defined()) {
    FLASHGLA_REQUIRE(p.batch == 1, ErrorKind::value, "cu_seqlens_q",
            "variable-length input packs all sequences into B == 1, got B = " + std::to_string(p.batch));
    p.num_seqs = check::cu_seqlens(cu_q, "cu_seqlens_q", dev, p.q_len);
    const int64_t n_k = check::cu_seqlens(cu_k, "cu_seqlens_k", dev, p.k_len);
    FLASHGLA_REQUIRE(n_k == p.num_seqs, ErrorKind::value, "cu_seqlens_k",
            "expected " + std::to_string(p.num_seqs + 1) + " boundaries like cu_seqlens_q, got " + std::to_string(n_k + 1));
    p.varlen = true;
  }
  p.causal = causal;
  p.scale = scale.value_or(1.0 / std::sqrt(double(p.head_dim)));
  FLASHGLA_REQUIRE(std::isfinite(p.scale), ErrorKind::value, "scale", "must be finite, got " + std::to_string(p.scale));
  FLASHGLA_REQUIRE(algorithm == AttentionAlgorithm::tiled || algorithm == AttentionAlgorithm::naive, ErrorKind::value,
          "algorithm", "expected tiled or naive");
  FLASHGLA_REQUIRE(algorithm == AttentionAlgorithm::tiled || dev.type == DeviceType::cpu, ErrorKind::unsupported, "algorithm",
          "the naive algorithm is the CPU reference; tensors are on " + dev.str());
  return p;
}

void check_out(const TensorView& t, const char* name, std::initializer_list<int64_t> shape, const char* dims,
               DType dtype, const Device& dev, bool is_output) {
  check::shape(t, name, shape, dims, is_output);
  check::dtype(t, name, dtype);
  check::device(t, name, dev, "q");
}

AttentionProblem check_forward(const AttentionForwardArgs& a) {
  const AttentionProblem p =
      check_inputs(a.q, a.k, a.v, a.cu_seqlens_q, a.cu_seqlens_k, a.causal, a.scale, a.algorithm);
  check_out(a.o, "o", {p.batch, p.q_len, p.q_heads, p.value_dim}, "[B, Tq, Hq, Dv]", a.q.dtype, a.q.device, true);
  check_out(a.lse, "lse", {p.batch, p.q_heads, p.q_len}, "[B, Hq, Tq]", DType::f32, a.q.device, true);
  return p;
}

AttentionProblem check_backward(const AttentionBackwardArgs& a) {
  const AttentionProblem p =
      check_inputs(a.q, a.k, a.v, a.cu_seqlens_q, a.cu_seqlens_k, a.causal, a.scale, a.algorithm);
  const Device dev = a.q.device;
  check_out(a.o, "o", {p.batch, p.q_len, p.q_heads, p.value_dim}, "[B, Tq, Hq, Dv]", a.q.dtype, dev, false);
  check_out(a.lse, "lse", {p.batch, p.q_heads, p.q_len}, "[B, Hq, Tq]", DType::f32, dev, false);
  check_out(a.d_o, "d_o", {p.batch, p.q_len, p.q_heads, p.value_dim}, "[B, Tq, Hq, Dv]", a.q.dtype, dev, false);
  check_out(a.dq, "dq", {p.batch, p.q_len, p.q_heads, p.head_dim}, "[B, Tq, Hq, D]", a.q.dtype, dev, true);
  check_out(a.dk, "dk", {p.batch, p.k_len, p.kv_heads, p.head_dim}, "[B, Tk, Hkv, D]", a.q.dtype, dev, true);
  check_out(a.dv, "dv", {p.batch, p.k_len, p.kv_heads, p.value_dim}, "[B, Tk, Hkv, Dv]", a.q.dtype, dev, true);
  return p;
}

}  // namespace

void attention_forward(const AttentionForwardArgs& a) {
  FLASHGLA_DISPATCH(a.q.device, attention_forward, a, check_forward(a));
}

void attention_backward(const AttentionBackwardArgs& a) {
  FLASHGLA_DISPATCH(a.q.device, attention_backward, a, check_backward(a));
}

size_t attention_forward_workspace_bytes(const AttentionForwardArgs& a) {
  return FLASHGLA_WORKSPACE_BYTES(a.q.device, attention_forward_workspace_bytes, a, check_forward(a));
}

size_t attention_backward_workspace_bytes(const AttentionBackwardArgs& a) {
  return FLASHGLA_WORKSPACE_BYTES(a.q.device, attention_backward_workspace_bytes, a, check_backward(a));
}

}  // namespace flashgla
