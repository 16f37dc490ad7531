// CPU backend of the per-segment state summaries (gla_segment_states,
// gla_segment_state_grads): per (segment, head), chunks of 64 tokens, each a
// rank-64 update of the [K, V] state through matmul_acc; fp32 accumulation
// (fp64 for f64 inputs). Pairs are independent and run in parallel.
//
// The gate only ever enters as a sum, never a difference of prefix sums:
// within a chunk the weights exp Σ_{u>t} g_u (states) and exp Σ_{u≤t} g_u
// (gradients) come from running sums, so a −inf gate gives weight 0 instead of
// exp(−inf − −inf) = NaN, and very negative gates lose no precision.
#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "core/backend.h"
#include "core/gla_chunk.h"
#include "cpu/gla/gla_io.h"
#include "cpu/gla/gla_math.h"
#include "cpu/common/io.h"
#include "cpu/common/parallel.h"

namespace flashgla::cpu {
namespace {

constexpr int64_t kChunk = flashgla::kChunk;  // C (core/gla_chunk.h), 64-bit like the indices it enters
constexpr int64_t kParallelWork = int64_t(1) << 18;  // below this many multiply-adds threads cost more

void for_each_pair(const GlaProblem& p, const std::function<void(int64_t)>& fn) {
  const int64_t count = p.num_seqs * p.heads;
  const int64_t tokens = std::max<int64_t>(1, p.seq_len * p.batch / std::max<int64_t>(1, p.num_seqs));
  if (count * tokens * p.key_dim * p.value_dim < kParallelWork) {
    for (int64_t i = 0; i < count; ++i) fn(i);
  } else {
    parallel_for(count, fn);
  }
}

// S(L) and a(L) of one (segment, head): k [len, K], v [len, V], g [len, K]
// dense (zeros without a gate). state [K, V] out; log_decay [K] out (in fp64).
template <class T>
void segment_state(int64_t len, int64_t K, int64_t V, const T* k, const T* v, const T* g, bool gated, T* state,
                   double* log_decay) {
  std::fill(state, state + K * V, T(0));
  std::fill(log_decay, log_decay + K, 0.0);
  std::vector<T> weighted(size_t(kChunk * K)), suffix(static_cast<size_t>(K));
  for (int64_t begin = 0; begin < len; begin += kChunk) {
    const int64_t n = std::min(kChunk, len - begin);
    const T* kc = k + begin * K;
    if (gated) {
      // suffix = Σ over the chunk's rows after r; after the loop, the chunk's total γ.
      std::fill(suffix.begin(), suffix.end(), T(0));
      for (int64_t r = n - 1; r >= 0; --r) {
        const T* gr = g + (begin + r) * K;
        for (int64_t d = 0; d < K; ++d) {
          weighted[size_t(r * K + d)] = kc[r * K + d] * std::exp(suffix[size_t(d)]);
          suffix[size_t(d)] += gr[d];
          log_decay[d] += double(gr[d]);
        }
      }
      for (int64_t d = 0; d < K; ++d) {
        const T decay = std::exp(suffix[size_t(d)]);
        for (int64_t j = 0; j < V; ++j) state[d * V + j] *= decay;
      }
    } else {
      std::copy(kc, kc + n * K, weighted.begin());
    }
    gla::matmul_acc(K, V, n, weighted.data(), 1, K, v + begin * V, V, state, V);
  }
}

// B(L) of one (segment, head), q already scaled: chunks from the last to the
// first, d = diag(exp γ) d + (Q ⊙ exp Γ)ᵀ dO with Γ the inclusive prefix sum
// within the chunk (gla_backward's recurrence for dS with dht = 0).
template <class T>
void segment_state_grad(int64_t len, int64_t K, int64_t V, const T* q, const T* d_o, const T* g, bool gated,
                        T* d_state) {
  std::fill(d_state, d_state + K * V, T(0));
  std::vector<T> weighted(size_t(kChunk * K)), prefix(static_cast<size_t>(K));
  const int64_t num_chunks = (len + kChunk - 1) / kChunk;
  for (int64_t c = num_chunks - 1; c >= 0; --c) {
    const int64_t begin = c * kChunk, n = std::min(kChunk, len - begin);
    const T* qc = q + begin * K;
    if (gated) {
      std::fill(prefix.begin(), prefix.end(), T(0));
      for (int64_t r = 0; r < n; ++r) {
        const T* gr = g + (begin + r) * K;
        for (int64_t d = 0; d < K; ++d) {
          prefix[size_t(d)] += gr[d];
          weighted[size_t(r * K + d)] = qc[r * K + d] * std::exp(prefix[size_t(d)]);
        }
      }
      for (int64_t d = 0; d < K; ++d) {
        const T decay = std::exp(prefix[size_t(d)]);
        for (int64_t j = 0; j < V; ++j) d_state[d * V + j] *= decay;
      }
    } else {
      std::copy(qc, qc + n * K, weighted.begin());
    }
    gla::matmul_acc(K, V, n, weighted.data(), 1, K, d_o + begin * V, V, d_state, V);
  }
}

template <class T>
void states_each_pair(const GlaSegmentStatesArgs& a, const GlaProblem& p) {
  const int64_t H = p.heads, K = p.key_dim, V = p.value_dim;
  for_each_pair(p, [&](int64_t item) {
    const int64_t n = item / H, head = item % H;
    const SeqRange s = sequence(p, a.cu_seqlens, n);
    std::vector<T> k(size_t(s.len * K)), v(size_t(s.len * V)), g(size_t(s.len * K)), state(size_t(K * V));
    gla::gather_head_rows(a.k, s, head, k.data());
    gla::gather_head_rows(a.v, s, head, v.data());
    gla::gather_head_gate(a.g, p.gate, s, head, K, g.data());
    std::vector<double> log_decay(static_cast<size_t>(K));
    segment_state(s.len, K, V, k.data(), v.data(), g.data(), p.gate != GateKind::none, state.data(),
                  log_decay.data());
    scatter_state(a.states, n, head, K, V, state.data());
    const int64_t base = n * a.log_decay.stride[0] + head * a.log_decay.stride[1];
    for (int64_t d = 0; d < K; ++d) store_element(a.log_decay, base + d * a.log_decay.stride[2], log_decay[size_t(d)]);
  });
}

template <class T>
void state_grads_each_pair(const GlaSegmentStateGradsArgs& a, const GlaProblem& p) {
  const int64_t H = p.heads, K = p.key_dim, V = p.value_dim;
  for_each_pair(p, [&](int64_t item) {
    const int64_t n = item / H, head = item % H;
    const SeqRange s = sequence(p, a.cu_seqlens, n);
    std::vector<T> q(size_t(s.len * K)), d_o(size_t(s.len * V)), g(size_t(s.len * K)), d_state(size_t(K * V));
    gla::gather_head_rows(a.q, s, head, q.data());
    for (T& x : q) x *= T(p.scale);  // as gla_backward, so that both round alike
    gla::gather_head_rows(a.d_o, s, head, d_o.data());
    gla::gather_head_gate(a.g, p.gate, s, head, K, g.data());
    segment_state_grad(s.len, K, V, q.data(), d_o.data(), g.data(), p.gate != GateKind::none, d_state.data());
    scatter_state(a.d_states, n, head, K, V, d_state.data());
  });
}

}  // namespace

void gla_segment_states(const GlaSegmentStatesArgs& a, const GlaProblem& p) {
  if (a.k.dtype == DType::f64) return states_each_pair<double>(a, p);
  states_each_pair<float>(a, p);
}

void gla_segment_state_grads(const GlaSegmentStateGradsArgs& a, const GlaProblem& p) {
  if (a.q.dtype == DType::f64) return state_grads_each_pair<double>(a, p);
  state_grads_each_pair<float>(a, p);
}

}  // namespace flashgla::cpu
