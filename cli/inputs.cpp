#include "cli/inputs.h"

#include <cmath>

namespace flashgla::cli {
namespace {

double log_sigmoid(double x) { return x >= 0 ? -std::log1p(std::exp(-x)) : x - std::log1p(std::exp(x)); }

Buffer normal(DType dtype, std::vector<int64_t> shape, std::mt19937_64& rng) {
  Buffer b(dtype, std::move(shape));
  b.fill_normal(rng);
  return b;
}

// A typical GLA gate: log-space, ≤ 0, mostly close to 0 (slow decay).
Buffer gate(DType dtype, std::vector<int64_t> shape, std::mt19937_64& rng) {
  Buffer b(dtype, std::move(shape));
  std::normal_distribution<double> normal01;
  std::vector<double> values(size_t(b.numel()));
  for (double& x : values) x = log_sigmoid(normal01(rng)) / 16;
  b.set_values(values);
  return b;
}

Buffer boundaries(const std::vector<int64_t>& cu_seqlens) {
  Buffer b(DType::i32, {int64_t(cu_seqlens.size())});
  b.set_values(std::vector<double>(cu_seqlens.begin(), cu_seqlens.end()));
  return b;
}

// A copy on `device` in `dtype`; absent stays absent.
Buffer convert(const Buffer& b, Device device, DType dtype) {
  if (!b.defined()) return {};
  return (b.dtype() == dtype ? b : b.cast(dtype)).to(device);
}
Buffer to_device(const Buffer& b, Device device) { return b.defined() ? b.to(device) : Buffer{}; }

Buffer poisoned(DType dtype, std::vector<int64_t> shape, Device device) {
  Buffer b(dtype, std::move(shape), device);
  b.poison();
  return b;
}

Buffer poisoned_like(const Buffer& like, DType dtype) {
  return like.defined() ? poisoned(dtype, like.shape(), like.device()) : Buffer{};
}
Buffer poisoned_like(const Buffer& like) { return poisoned_like(like, like.dtype()); }

int64_t num_seqs(const GlaInputs& in) {
  return in.cu_seqlens.defined() ? in.cu_seqlens.numel() - 1 : in.q.shape()[0];
}

template <class Args>
Buffer attach(Args& args, size_t bytes) {
  if (bytes == 0) return {};
  Buffer workspace(DType::f64, {int64_t((bytes + 7) / 8)}, args.q.device);
  args.workspace = workspace.view().data;
  args.workspace_bytes = bytes;
  return workspace;
}

}  // namespace

GlaInputs GlaInputs::to(Device device, DType dtype) const {
  GlaInputs out;
  out.q = convert(q, device, dtype);
  out.k = convert(k, device, dtype);
  out.v = convert(v, device, dtype);
  out.g = convert(g, device, dtype);
  out.d_o = convert(d_o, device, dtype);
  out.h0 = to_device(h0, device);
  out.dht = to_device(dht, device);
  out.cu_seqlens = to_device(cu_seqlens, device);
  out.cu_seqlens_host = cu_seqlens_host;
  return out;
}

GlaInputs make_gla_inputs(const Shape& s, Gate gate_kind, bool initial_state, DType dtype, std::mt19937_64& rng) {
  const int64_t B = s.batch, T = s.seq_len, H = s.heads, K = s.key_dim, V = s.value_dim, N = s.num_seqs();
  GlaInputs in;
  in.q = normal(dtype, {B, T, H, K}, rng);
  in.k = normal(dtype, {B, T, H, K}, rng);
  in.v = normal(dtype, {B, T, H, V}, rng);
  if (gate_kind == Gate::vector) in.g = gate(dtype, {B, T, H, K}, rng);
  if (gate_kind == Gate::scalar) in.g = gate(dtype, {B, T, H}, rng);
  in.d_o = normal(dtype, {B, T, H, V}, rng);
  if (initial_state) {
    in.h0 = normal(DType::f32, {N, H, K, V}, rng);
    in.dht = normal(DType::f32, {N, H, K, V}, rng);
  }
  if (s.varlen()) in.cu_seqlens = in.cu_seqlens_host = boundaries(s.cu_seqlens);
  return in;
}

GlaOutputs make_gla_outputs(const GlaInputs& in) {
  const auto& q = in.q.shape();
  const int64_t V = in.v.shape()[3];
  return {poisoned(in.q.dtype(), {q[0], q[1], q[2], V}, in.q.device()),
          poisoned(DType::f32, {num_seqs(in), q[2], q[3], V}, in.q.device())};
}

GlaGrads make_gla_grads(const GlaInputs& in) {
  const auto& q = in.q.shape();
  // dg in f32, or f64 when g is: its precision must not limit the check.
  const DType dg_dtype = in.g.defined() && in.g.dtype() == DType::f64 ? DType::f64 : DType::f32;
  return {poisoned_like(in.q), poisoned_like(in.k), poisoned_like(in.v), poisoned_like(in.g, dg_dtype),
          poisoned(DType::f32, {num_seqs(in), q[2], q[3], in.v.shape()[3]}, in.q.device())};
}

GlaForwardArgs gla_forward_args(const GlaInputs& in, const GlaOutputs& out, GlaAlgorithm algorithm,
                                const Tuning& tuning) {
  GlaForwardArgs a;
  a.tuning = tuning.gla;
  a.q = in.q.view(), a.k = in.k.view(), a.v = in.v.view(), a.g = in.g.view();
  a.initial_state = in.h0.view();
  a.cu_seqlens = in.cu_seqlens.view();
  if (in.q.device().type == DeviceType::cuda) a.cu_seqlens_host = in.cu_seqlens_host.view();
  a.algorithm = algorithm;
  a.o = out.o.view();
  a.final_state = out.ht.view();
  return a;
}

GlaBackwardArgs gla_backward_args(const GlaInputs& in, const GlaGrads& out, GlaAlgorithm algorithm,
                                  const Tuning& tuning) {
  GlaBackwardArgs a;
  a.tuning = tuning.gla;
  a.q = in.q.view(), a.k = in.k.view(), a.v = in.v.view(), a.g = in.g.view();
  a.initial_state = in.h0.view();
  a.cu_seqlens = in.cu_seqlens.view();
  if (in.q.device().type == DeviceType::cuda) a.cu_seqlens_host = in.cu_seqlens_host.view();
  a.algorithm = algorithm;
  a.d_o = in.d_o.view();
  a.d_final_state = in.dht.view();
  a.dq = out.dq.view(), a.dk = out.dk.view(), a.dv = out.dv.view(), a.dg = out.dg.view();
  a.d_initial_state = out.dh0.view();
  return a;
}

TensorView token_view(const Buffer& x, int64_t t) {
  if (!x.defined()) return {};
  const TensorView& full = x.view();
  TensorView v = full;
  v.ndim = full.ndim - 1;
  v.data = static_cast<char*>(full.data) + t * full.stride[1] * int64_t(dtype_size(full.dtype));
  for (int d = 1; d < full.ndim; ++d) {  // drop dimension 1
    v.shape[d] = d + 1 < full.ndim ? full.shape[d + 1] : 0;
    v.stride[d] = d + 1 < full.ndim ? full.stride[d + 1] : 0;
  }
  return v;
}

AttentionInputs AttentionInputs::to(Device device, DType dtype) const {
  return {convert(q, device, dtype), convert(k, device, dtype), convert(v, device, dtype), convert(d_o, device, dtype),
          to_device(cu_seqlens, device)};
}

AttentionInputs make_attention_inputs(const Shape& s, DType dtype, std::mt19937_64& rng) {
  const int64_t B = s.batch, T = s.seq_len;
  AttentionInputs in;
  in.q = normal(dtype, {B, T, s.heads, s.key_dim}, rng);
  in.k = normal(dtype, {B, T, s.kv_heads, s.key_dim}, rng);
  in.v = normal(dtype, {B, T, s.kv_heads, s.value_dim}, rng);
  in.d_o = normal(dtype, {B, T, s.heads, s.value_dim}, rng);
  if (s.varlen()) in.cu_seqlens = boundaries(s.cu_seqlens);
  return in;
}

AttentionOutputs make_attention_outputs(const AttentionInputs& in) {
  const auto& q = in.q.shape();
  return {poisoned(in.q.dtype(), {q[0], q[1], q[2], in.v.shape()[3]}, in.q.device()),
          poisoned(DType::f32, {q[0], q[2], q[1]}, in.q.device())};
}

AttentionGrads make_attention_grads(const AttentionInputs& in) {
  return {poisoned_like(in.q), poisoned_like(in.k), poisoned_like(in.v)};
}

AttentionForwardArgs attention_forward_args(const AttentionInputs& in, const AttentionOutputs& out, bool causal,
                                            AttentionAlgorithm algorithm, const Tuning& tuning) {
  AttentionForwardArgs a;
  a.tuning = tuning.attention_forward;
  a.q = in.q.view(), a.k = in.k.view(), a.v = in.v.view();
  a.cu_seqlens_q = a.cu_seqlens_k = in.cu_seqlens.view();
  a.causal = causal;
  a.algorithm = algorithm;
  a.o = out.o.view();
  a.lse = out.lse.view();
  return a;
}

AttentionBackwardArgs attention_backward_args(const AttentionInputs& in, const AttentionOutputs& fwd,
                                              const AttentionGrads& out, bool causal, AttentionAlgorithm algorithm,
                                              const Tuning& tuning) {
  AttentionBackwardArgs a;
  a.tuning = tuning.attention_backward;
  a.q = in.q.view(), a.k = in.k.view(), a.v = in.v.view();
  a.cu_seqlens_q = a.cu_seqlens_k = in.cu_seqlens.view();
  a.causal = causal;
  a.algorithm = algorithm;
  a.o = fwd.o.view();
  a.lse = fwd.lse.view();
  a.d_o = in.d_o.view();
  a.dq = out.dq.view(), a.dk = out.dk.view(), a.dv = out.dv.view();
  return a;
}

Buffer attach_workspace(GlaForwardArgs& a) { return attach(a, gla_forward_workspace_bytes(a)); }
Buffer attach_workspace(GlaBackwardArgs& a) { return attach(a, gla_backward_workspace_bytes(a)); }
Buffer attach_workspace(AttentionForwardArgs& a) { return attach(a, attention_forward_workspace_bytes(a)); }
Buffer attach_workspace(AttentionBackwardArgs& a) { return attach(a, attention_backward_workspace_bytes(a)); }

}  // namespace flashgla::cli
