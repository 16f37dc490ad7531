// CPU GLA backend entry points: for each (sequence, head) pair, gather the
// strided inputs into contiguous buffers of the accumulation type, run the
// recurrent reference (fp64) or the chunked algorithm (fp32, or fp64 for f64
// inputs), and scatter the results. Pairs are independent and run in parallel.
// The chunked algorithm goes through each pair one range of kRangeTokens
// tokens at a time (gla_kernels.h), so its scratch does not grow with T.
#include <algorithm>
#include <cmath>
#include <functional>
#include <stdexcept>
#include <vector>

#include "core/backend.h"
#include "cpu/gla/gla_io.h"
#include "cpu/gla/gla_kernels.h"
#include "cpu/common/io.h"
#include "cpu/common/parallel.h"

namespace flashgla::cpu {
namespace {

using gla::gather_head_gate;
using gla::gather_head_rows;
using gla::HeadInputs;
using gla::scatter_head_gate_grad;
using gla::scatter_head_rows;

// Below this much work (multiply-adds) threads cost more than they save.
constexpr int64_t kParallelWork = int64_t(1) << 18;

void for_each_head(int64_t count, int64_t work_per_item, const std::function<void(int64_t)>& fn) {
  if (count * work_per_item < kParallelWork) {
    for (int64_t i = 0; i < count; ++i) fn(i);
  } else {
    parallel_for(count, fn);
  }
}

// Contiguous copies of one (sequence, head) pair's inputs; q is scaled.
template <class T>
struct HeadBuffers {
  std::vector<T> q, k, v, g;
  HeadInputs<T> inputs;

  HeadBuffers(const TensorView& tq, const TensorView& tk, const TensorView& tv, const TensorView& tg,
              const GlaProblem& p, const SeqRange& s, int64_t head)
      : q(size_t(s.len * p.key_dim)),
        k(size_t(s.len * p.key_dim)),
        v(size_t(s.len * p.value_dim)),
        g(size_t(s.len * p.key_dim)) {
    gather_head_rows(tq, s, head, q.data());
    for (T& x : q) x *= T(p.scale);
    gather_head_rows(tk, s, head, k.data());
    gather_head_rows(tv, s, head, v.data());
    gather_head_gate(tg, p.gate, s, head, p.key_dim, g.data());
    inputs = {s.len, p.key_dim, p.value_dim, q.data(), k.data(), v.data(), g.data(), p.gate};
  }
};

int64_t work_per_head(const GlaProblem& p) {
  const int64_t tokens = p.seq_len * p.batch / std::max<int64_t>(1, p.num_seqs);
  return std::max<int64_t>(1, tokens) * p.key_dim * p.value_dim;
}

// ---- the chunked algorithm, range by range ------------------------------------

// Tokens [offset, offset + len) of sequence s.
SeqRange part_of(const SeqRange& s, int64_t offset, int64_t len) { return {s.batch, s.begin + offset, len}; }

// One pair's scratch: one block of chunked_scratch_elements, handed out in pieces.
template <class T>
class Scratch {
 public:
  Scratch(int64_t len, int64_t K, int64_t V, bool backward)
      : block_(size_t(gla::chunked_scratch_elements(len, K, V, backward))) {}
  T* take(int64_t elements) {
    T* piece = block_.data() + used_;
    used_ += size_t(elements);
    if (used_ > block_.size()) throw std::logic_error("CPU GLA: chunked_scratch_elements is too small");
    return piece;
  }

 private:
  std::vector<T> block_;
  size_t used_ = 0;
};

// The gathered inputs of one range (at most kRangeTokens tokens) of a pair; q is scaled.
template <class T>
struct RangeInputs {
  T *q, *k, *v, *g;
  RangeInputs(Scratch<T>& scratch, int64_t rows, int64_t K, int64_t V)
      : q(scratch.take(rows * K)), k(scratch.take(rows * K)), v(scratch.take(rows * V)), g(scratch.take(rows * K)) {}

  // with_q false: k, v and g only (what chunked_states reads).
  HeadInputs<T> gather(const TensorView& tq, const TensorView& tk, const TensorView& tv, const TensorView& tg,
                       const GlaProblem& p, const SeqRange& r, int64_t head, bool with_q = true) {
    if (with_q) {
      gather_head_rows(tq, r, head, q);
      for (int64_t i = 0; i < r.len * p.key_dim; ++i) q[i] *= T(p.scale);
    }
    gather_head_rows(tk, r, head, k);
    gather_head_rows(tv, r, head, v);
    gather_head_gate(tg, p.gate, r, head, p.key_dim, g);
    return {r.len, p.key_dim, p.value_dim, with_q ? q : nullptr, k, v, g, p.gate};
  }
};

int64_t num_ranges(int64_t len) { return (len + gla::kRangeTokens - 1) / gla::kRangeTokens; }

}  // namespace

namespace gla {

// Forward: the range's inputs and output, and the carried state. Backward: the range's inputs, d_o and
// four gradients, dS, one state per range (the first is h0) and the kernel's states before each chunk.
int64_t chunked_scratch_elements(int64_t len, int64_t K, int64_t V, bool backward) {
  const int64_t rows = std::min(len, kRangeTokens), KV = K * V;
  if (!backward) return rows * (3 * K + 2 * V) + KV;
  const int64_t chunks_per_range = (rows + kChunk - 1) / kChunk;
  return rows * (6 * K + 3 * V) + KV * (1 + num_ranges(len) + chunks_per_range);
}

}  // namespace gla

namespace {

template <class T>
void chunked_forward_each_head(const GlaForwardArgs& a, const GlaProblem& p) {
  const int64_t H = p.heads, K = p.key_dim, V = p.value_dim;
  for_each_head(p.num_seqs * H, work_per_head(p), [&](int64_t item) {
    const int64_t n = item / H, head = item % H;
    const SeqRange s = sequence(p, a.cu_seqlens, n);
    const int64_t rows = std::min(s.len, gla::kRangeTokens);
    Scratch<T> scratch(s.len, K, V, /*backward=*/false);
    RangeInputs<T> range(scratch, rows, K, V);
    T* const o = scratch.take(rows * V);
    T* const state = scratch.take(K * V);
    gather_state(a.initial_state, n, head, K, V, state);
    for (int64_t offset = 0; offset < s.len; offset += gla::kRangeTokens) {
      const SeqRange r = part_of(s, offset, std::min(gla::kRangeTokens, s.len - offset));
      gla::chunked_forward(range.gather(a.q, a.k, a.v, a.g, p, r, head), state, o);
      scatter_head_rows(a.o, r, head, o);
    }
    scatter_state(a.final_state, n, head, K, V, state);
  });
}

// The ranges from the last to the first, each from its state, which a first pass keeps.
template <class T>
void chunked_backward_each_head(const GlaBackwardArgs& a, const GlaProblem& p) {
  const int64_t H = p.heads, K = p.key_dim, V = p.value_dim, KV = K * V;
  for_each_head(p.num_seqs * H, 3 * work_per_head(p), [&](int64_t item) {
    const int64_t n = item / H, head = item % H;
    const SeqRange s = sequence(p, a.cu_seqlens, n);
    const int64_t rows = std::min(s.len, gla::kRangeTokens), ranges = num_ranges(s.len);
    Scratch<T> scratch(s.len, K, V, /*backward=*/true);
    RangeInputs<T> range(scratch, rows, K, V);
    T* const d_o = scratch.take(rows * V);
    T *const dq = scratch.take(rows * K), *const dk = scratch.take(rows * K), *const dv = scratch.take(rows * V),
             *const dg = scratch.take(rows * K);
    T* const d_state = scratch.take(KV);
    T* const range_states = scratch.take(ranges * KV);
    T* const chunk_states = scratch.take((rows + kChunk - 1) / kChunk * KV);
    auto range_at = [&](int64_t i) {
      return part_of(s, i * gla::kRangeTokens, std::min(gla::kRangeTokens, s.len - i * gla::kRangeTokens));
    };

    if (ranges > 0) gather_state(a.initial_state, n, head, K, V, range_states);
    for (int64_t i = 0; i + 1 < ranges; ++i) {
      std::copy(range_states + i * KV, range_states + (i + 1) * KV, range_states + (i + 1) * KV);
      gla::chunked_states(range.gather(a.q, a.k, a.v, a.g, p, range_at(i), head, /*with_q=*/false),
                          range_states + (i + 1) * KV);
    }
    gather_state(a.d_final_state, n, head, K, V, d_state);
    for (int64_t i = ranges - 1; i >= 0; --i) {
      const SeqRange r = range_at(i);
      const HeadInputs<T> in = range.gather(a.q, a.k, a.v, a.g, p, r, head);
      gather_head_rows(a.d_o, r, head, d_o);
      gla::chunked_backward(in, range_states + i * KV, d_o, d_state, dq, dk, dv, dg, chunk_states);
      for (int64_t j = 0; j < r.len * K; ++j) dq[j] *= T(p.scale);  // the kernel differentiates w.r.t. the scaled q
      scatter_head_rows(a.dq, r, head, dq);
      scatter_head_rows(a.dk, r, head, dk);
      scatter_head_rows(a.dv, r, head, dv);
      scatter_head_gate_grad(a.dg, p.gate, r, head, K, dg);
    }
    scatter_state(a.d_initial_state, n, head, K, V, d_state);
  });
}

// ---- the recurrent reference, whole sequences -----------------------------------

// kernel(inputs, state, o): state holds h0 in and the final state out.
template <class T, class Kernel>
void forward_each_head(const GlaForwardArgs& a, const GlaProblem& p, Kernel kernel) {
  const int64_t H = p.heads, K = p.key_dim, V = p.value_dim;
  for_each_head(p.num_seqs * H, work_per_head(p), [&](int64_t item) {
    const int64_t n = item / H, head = item % H;
    const SeqRange s = sequence(p, a.cu_seqlens, n);
    HeadBuffers<T> in(a.q, a.k, a.v, a.g, p, s, head);
    std::vector<T> state(size_t(K * V)), o(size_t(s.len * V));
    gather_state(a.initial_state, n, head, K, V, state.data());
    kernel(in.inputs, state.data(), o.data());
    scatter_head_rows(a.o, s, head, o.data());
    scatter_state(a.final_state, n, head, K, V, state.data());
  });
}

// kernel(inputs, h0, d_o, d_state, dq, dk, dv, dg): d_state holds dht in and dh0 out.
template <class T, class Kernel>
void backward_each_head(const GlaBackwardArgs& a, const GlaProblem& p, Kernel kernel) {
  const int64_t H = p.heads, K = p.key_dim, V = p.value_dim;
  for_each_head(p.num_seqs * H, 3 * work_per_head(p), [&](int64_t item) {
    const int64_t n = item / H, head = item % H;
    const SeqRange s = sequence(p, a.cu_seqlens, n);
    HeadBuffers<T> in(a.q, a.k, a.v, a.g, p, s, head);
    std::vector<T> h0(size_t(K * V)), d_state(size_t(K * V)), d_o(size_t(s.len * V));
    gather_state(a.initial_state, n, head, K, V, h0.data());
    gather_state(a.d_final_state, n, head, K, V, d_state.data());
    gather_head_rows(a.d_o, s, head, d_o.data());
    std::vector<T> dq(size_t(s.len * K)), dk(size_t(s.len * K)), dv(size_t(s.len * V)), dg(size_t(s.len * K));
    kernel(in.inputs, h0.data(), d_o.data(), d_state.data(), dq.data(), dk.data(), dv.data(), dg.data());
    for (T& x : dq) x *= T(p.scale);  // the kernels differentiate w.r.t. the scaled q
    scatter_head_rows(a.dq, s, head, dq.data());
    scatter_head_rows(a.dk, s, head, dk.data());
    scatter_head_rows(a.dv, s, head, dv.data());
    scatter_head_gate_grad(a.dg, p.gate, s, head, K, dg.data());
    scatter_state(a.d_initial_state, n, head, K, V, d_state.data());
  });
}

}  // namespace

// Pool rows (initial_state_indices / final_state_indices): dense [N,H,K,V]
// copies gathered before and scattered after the forward, so that one pool may
// be both the initial and the final state.
static bool forward_pooled(const GlaForwardArgs& a, const GlaProblem& p) {
  if (!a.initial_state_indices.defined() && !a.final_state_indices.defined()) return false;
  const int64_t N = p.num_seqs, H = p.heads, K = p.key_dim, V = p.value_dim;
  auto row = [](const TensorView& idx, int64_t n) {
    return int64_t(static_cast<const int32_t*>(idx.data)[n * idx.stride[0]]);
  };
  GlaForwardArgs dense = a;
  dense.initial_state_indices = {}, dense.final_state_indices = {};
  std::vector<float> h0, ht;
  if (a.initial_state_indices.defined()) {
    h0.assign(size_t(N * H * K * V), 0.f);
    dense.initial_state = TensorView::contiguous(h0.data(), DType::f32, {N, H, K, V});
    for (int64_t n = 0; n < N; ++n)
      if (row(a.initial_state_indices, n) >= 0)
        for (int64_t h = 0; h < H; ++h)
          gather_state(a.initial_state, row(a.initial_state_indices, n), h, K, V, h0.data() + (n * H + h) * K * V);
  }
  if (a.final_state_indices.defined()) {
    ht.assign(size_t(N * H * K * V), 0.f);
    dense.final_state = TensorView::contiguous(ht.data(), DType::f32, {N, H, K, V});
  }
  gla_forward(dense, p);
  if (a.final_state_indices.defined())
    for (int64_t n = 0; n < N; ++n)
      if (row(a.final_state_indices, n) >= 0)
        for (int64_t h = 0; h < H; ++h)
          scatter_state(a.final_state, row(a.final_state_indices, n), h, K, V, ht.data() + (n * H + h) * K * V);
  return true;
}

void gla_forward(const GlaForwardArgs& a, const GlaProblem& p) {
  if (a.ssm_state_indices.defined()) return gla::recurrent_forward_pooled(a, p);
  if (forward_pooled(a, p)) return;
  if (a.algorithm == GlaAlgorithm::recurrent) {
    forward_each_head<double>(a, p, [&](const HeadInputs<double>& in, double* state, double* o) {
      gla::recurrent_forward(in, a.reverse, state, o);
    });
  } else if (a.q.dtype == DType::f64) {
    chunked_forward_each_head<double>(a, p);
  } else {
    chunked_forward_each_head<float>(a, p);
  }
}

void gla_backward(const GlaBackwardArgs& a, const GlaProblem& p) {
  if (a.algorithm == GlaAlgorithm::recurrent) {
    backward_each_head<double>(a, p, [&](const HeadInputs<double>& in, auto... rest) {
      gla::recurrent_backward(in, a.reverse, rest...);
    });
  } else if (a.q.dtype == DType::f64) {
    chunked_backward_each_head<double>(a, p);
  } else {
    chunked_backward_each_head<float>(a, p);
  }
}

// T recurrent steps per (sequence, head), each in fp64 from the fp32 state. The API gave
// every tensor a token dimension and checked the pool rows.
void gla_decode(const GlaDecodeArgs& a, const GlaProblem& p) {
  const int64_t H = p.heads, K = p.key_dim, V = p.value_dim, T = p.seq_len;
  for_each_head(p.num_seqs * H, T * K * V, [&](int64_t item) {
    const int64_t n = item / H, head = item % H;
    auto at = [&](const TensorView& t, int64_t token, int64_t d) {  // element [n, token, head, d]
      return n * t.stride[0] + token * t.stride[1] + head * t.stride[2] + d * t.stride[3];
    };
    const int64_t row = a.state_indices.defined()
                            ? int64_t(static_cast<const int32_t*>(a.state_indices.data)[n * a.state_indices.stride[0]])
                            : n;
    if (row < 0) {  // padded slot: zero outputs and token states, no pool row touched
      const std::vector<double> zeros(size_t(K * V), 0.0);
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t j = 0; j < V; ++j) store_element(a.o, at(a.o, t, j), 0.0);
        scatter_state(a.token_states, n * T + t, head, K, V, zeros.data());
      }
      return;
    }
    std::vector<double> state(size_t(K * V)), value(static_cast<size_t>(V)), out(static_cast<size_t>(V));
    gather_state(a.state, row, head, K, V, state.data());
    for (int64_t t = 0; t < T; ++t) {
      std::fill(out.begin(), out.end(), 0.0);
      for (int64_t j = 0; j < V; ++j) value[size_t(j)] = load_element<double>(a.v, at(a.v, t, j));
      for (int64_t i = 0; i < K; ++i) {
        double gate = 0;
        if (p.gate == GateKind::vector) gate = load_element<double>(a.g, at(a.g, t, i));
        if (p.gate == GateKind::scalar)
          gate = load_element<double>(a.g, n * a.g.stride[0] + t * a.g.stride[1] + head * a.g.stride[2]);
        const double decay = std::exp(gate), key = load_element<double>(a.k, at(a.k, t, i));
        const double query = p.scale * load_element<double>(a.q, at(a.q, t, i));
        for (int64_t j = 0; j < V; ++j) {
          double& s = state[size_t(i * V + j)];
          s = decay * s + key * value[size_t(j)];
          out[size_t(j)] += query * s;
        }
      }
      for (int64_t j = 0; j < V; ++j) store_element(a.o, at(a.o, t, j), out[size_t(j)]);
      // The state is fp32 between tokens, as between calls: T tokens in one call
      // give bit for bit what T one-token calls give.
      for (double& s : state) s = double(float(s));
      scatter_state(a.token_states, n * T + t, head, K, V, state.data());
    }
    scatter_state(a.state, row, head, K, V, state.data());
  });
}

}  // namespace flashgla::cpu
