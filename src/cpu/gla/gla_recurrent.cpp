// The fp64 recurrent reference: the ground truth the chunked algorithm and the
// CUDA kernels are tested against. Written for clarity, token by token.
//
//   S_t = diag(exp g_t) S_{t-1} + k_t^T v_t,   o_t = q_t S_t   (q scaled)
//
// Backward, with dS the gradient of the state after the current token:
//   dS   += q_t^T do_t
//   dq_t  = do_t S_t^T,  dk_t = dS v_t,  dv_t = dS^T k_t,
//   dg_t  = exp(g_t) ⊙ rowsum(dS ⊙ S_{t-1}),
//   dS    = diag(exp g_t) dS             (now the gradient of S_{t-1})
#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/common/parallel.h"
#include "cpu/gla/gla_io.h"
#include "cpu/gla/gla_kernels.h"
#include "flashgla/gla.h"

namespace flashgla::cpu::gla {
namespace {

// The token processed at step p.
int64_t token_at(int64_t p, int64_t len, bool reverse) { return reverse ? len - 1 - p : p; }

// state <- diag(exp g) state + k^T v for one token.
void step(const HeadInputs<double>& in, int64_t t, double* state) {
  const int64_t K = in.K, V = in.V;
  for (int64_t i = 0; i < K; ++i) {
    const double decay = std::exp(in.g[t * K + i]), key = in.k[t * K + i];
    double* row = state + i * V;
    for (int64_t j = 0; j < V; ++j) row[j] = decay * row[j] + key * in.v[t * V + j];
  }
}

}  // namespace

void recurrent_forward(const HeadInputs<double>& in, bool reverse, double* state, double* o) {
  const int64_t K = in.K, V = in.V;
  for (int64_t p = 0; p < in.len; ++p) {
    const int64_t t = token_at(p, in.len, reverse);
    double* out = o + t * V;
    std::fill(out, out + V, 0.0);
    for (int64_t i = 0; i < K; ++i) {  // one row of the state: update it, then read it out
      const double decay = std::exp(in.g[t * K + i]), key = in.k[t * K + i], query = in.q[t * K + i];
      double* row = state + i * V;
      for (int64_t j = 0; j < V; ++j) {
        row[j] = decay * row[j] + key * in.v[t * V + j];
        out[j] += query * row[j];
      }
    }
  }
}

void recurrent_backward(const HeadInputs<double>& in, bool reverse, const double* h0, const double* d_o,
                        double* d_state, double* dq, double* dk, double* dv, double* dg) {
  const int64_t K = in.K, V = in.V, KV = K * V, len = in.len;
  // The backward walk needs every state S_{t-1}, S_t in reverse order. Keep a
  // checkpoint every `segment` steps and recompute the states of one segment
  // at a time: O(sqrt(len)) states in memory instead of len.
  const int64_t segment = std::max<int64_t>(1, int64_t(std::ceil(std::sqrt(double(len)))));
  const int64_t num_segments = (len + segment - 1) / segment;
  std::vector<double> checkpoints(size_t(num_segments * KV));  // state before each segment's first step
  std::vector<double> state(h0, h0 + KV);
  for (int64_t p = 0; p < len; ++p) {
    if (p % segment == 0) std::copy(state.begin(), state.end(), checkpoints.begin() + (p / segment) * KV);
    step(in, token_at(p, len, reverse), state.data());
  }

  std::vector<double> states(size_t(segment * KV));  // states[s]: after step begin + s
  for (int64_t seg = num_segments - 1; seg >= 0; --seg) {
    const int64_t begin = seg * segment, end = std::min(len, begin + segment);
    const double* before = checkpoints.data() + seg * KV;
    for (int64_t p = begin; p < end; ++p) {
      double* s = states.data() + (p - begin) * KV;
      std::copy(before, before + KV, s);
      step(in, token_at(p, len, reverse), s);
      before = s;
    }
    for (int64_t p = end - 1; p >= begin; --p) {
      const int64_t t = token_at(p, len, reverse);
      const double* s_t = states.data() + (p - begin) * KV;
      const double* s_prev = p == begin ? checkpoints.data() + seg * KV : s_t - KV;
      const double* q = in.q + t * K;
      const double* k = in.k + t * K;
      const double* v = in.v + t * V;
      const double* g = in.g + t * K;
      const double* dout = d_o + t * V;
      for (int64_t i = 0; i < K; ++i) {
        double* ds = d_state + i * V;
        double dq_i = 0, dk_i = 0, dg_i = 0;
        for (int64_t j = 0; j < V; ++j) {
          dq_i += dout[j] * s_t[i * V + j];
          ds[j] += q[i] * dout[j];
          dk_i += ds[j] * v[j];
          dg_i += ds[j] * s_prev[i * V + j];
        }
        dq[t * K + i] = dq_i;
        dk[t * K + i] = dk_i;
        const double decay = std::exp(g[i]);
        dg[t * K + i] = decay * dg_i;
      }
      for (int64_t j = 0; j < V; ++j) {
        double dv_j = 0;
        for (int64_t i = 0; i < K; ++i) dv_j += d_state[i * V + j] * k[i];
        dv[t * V + j] = dv_j;
      }
      for (int64_t i = 0; i < K; ++i) {
        const double decay = std::exp(g[i]);
        for (int64_t j = 0; j < V; ++j) d_state[i * V + j] *= decay;
      }
    }
  }
}

// vLLM's state pools (ssm_state_indices; see flashgla/gla.h): the reference
// recurrence with its start state read from a pool row and its states written
// back to pool rows (or to the per-token final_state), token by token.
void recurrent_forward_pooled(const GlaForwardArgs& a, const GlaProblem& p) {
  const int64_t H = p.heads, K = p.key_dim, V = p.value_dim;
  const TensorView& idx = a.ssm_state_indices;
  const TensorView& pool = a.initial_state;
  const bool per_token = idx.ndim == 2;
  const int64_t cols = per_token ? idx.shape[1] : 1;
  auto row = [&](int64_t n, int64_t t) {
    return int64_t(static_cast<const int32_t*>(idx.data)[n * idx.stride[0] + (per_token ? t * idx.stride[1] : 0)]);
  };
  auto first_token = [&](int64_t n) {  // the column of the start row: after the accepted draft tokens
    if (!a.num_accepted_tokens.defined()) return int64_t(0);
    const TensorView& acc = a.num_accepted_tokens;
    return int64_t(static_cast<const int32_t*>(acc.data)[n * acc.stride[0]]) - 1;
  };
  auto run = [&](int64_t item) {
    const int64_t n = item / H, head = item % H;
    const SeqRange s = sequence(p, a.cu_seqlens, n);
    std::vector<double> o(size_t(s.len * V), 0.0);
    const int64_t first = first_token(n);
    const int64_t start = first >= 0 && first < cols ? row(n, first) : -1;
    if (start < 0) {  // padded slot: zero outputs, no pool row touched
      scatter_head_rows(a.o, s, head, o.data());
      return;
    }
    std::vector<double> q(size_t(s.len * K)), k(size_t(s.len * K)), v(size_t(s.len * V)), g(size_t(s.len * K));
    gather_head_rows(a.q, s, head, q.data());
    for (double& x : q) x *= p.scale;
    gather_head_rows(a.k, s, head, k.data());
    gather_head_rows(a.v, s, head, v.data());
    gather_head_gate(a.g, p.gate, s, head, K, g.data());
    std::vector<double> state(size_t(K * V));
    gather_state(pool, start, head, K, V, state.data());
    for (int64_t t = 0; t < s.len; ++t) {
      const HeadInputs<double> token{1, K, V, q.data() + t * K, k.data() + t * K, v.data() + t * V,
                                     g.data() + t * K, p.gate};
      recurrent_forward(token, false, state.data(), o.data() + t * V);
      if (a.inplace_final_state && per_token && t < cols && row(n, t) >= 0)
        scatter_state(pool, row(n, t), head, K, V, state.data());
      if (!a.inplace_final_state)  // the state after this token at its row of the packed batch
        scatter_state(a.final_state, s.batch * p.seq_len + s.begin + t, head, K, V, state.data());
    }
    if (a.inplace_final_state && !per_token && s.len > 0) scatter_state(pool, start, head, K, V, state.data());
    scatter_head_rows(a.o, s, head, o.data());
  };
  // Pool rows are distinct across sequences and heads own disjoint slices: items are independent.
  const int64_t items = p.num_seqs * H;
  if (p.batch * p.seq_len * K * V < (int64_t(1) << 18)) {
    for (int64_t i = 0; i < items; ++i) run(i);
  } else {
    parallel_for(items, run);
  }
}

}  // namespace flashgla::cpu::gla
