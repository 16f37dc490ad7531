// CPU gated RMSNorm and log-sigmoid gate, forward and backward.
//
// Rows (all dimensions but the last) are spread over threads in blocks whose
// count depends on the input's size only, so dweight, summed per block and
// then over blocks in order, is the same whatever the thread count.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/backend.h"
#include "core/half.h"
#include "cpu/common/parallel.h"

namespace flashgla::cpu {
namespace {

// Offset of the first element of row `row`, rows enumerating the leading
// dimensions in row-major order.
int64_t row_offset(const TensorView& t, int64_t row) {
  int64_t offset = 0;
  for (int d = t.ndim - 2; d >= 0; --d) {
    offset += (row % t.shape[d]) * t.stride[d];
    row /= t.shape[d];
  }
  return offset;
}

template <class Storage, class Acc, class Convert>
void load_strided(const void* data, int64_t base, int64_t step, int64_t n, Acc* dst, Convert convert) {
  const Storage* src = static_cast<const Storage*>(data) + base;
  for (int64_t i = 0; i < n; ++i) dst[i] = Acc(convert(src[i * step]));
}

template <class Storage, class Acc, class Convert>
void store_strided(void* data, int64_t base, int64_t step, int64_t n, const Acc* src, Convert convert) {
  Storage* dst = static_cast<Storage*>(data) + base;
  for (int64_t i = 0; i < n; ++i) dst[i * step] = convert(src[i]);
}

// Row `row` of a float tensor (its last dimension) into dst, converted to Acc.
template <class Acc>
void load_row(const TensorView& t, int64_t row, Acc* dst) {
  const int64_t base = row_offset(t, row), step = t.stride[t.ndim - 1], n = t.shape[t.ndim - 1];
  switch (t.dtype) {
    case DType::f64: return load_strided<double>(t.data, base, step, n, dst, [](double v) { return v; });
    case DType::f32: return load_strided<float>(t.data, base, step, n, dst, [](float v) { return v; });
    case DType::bf16: return load_strided<uint16_t>(t.data, base, step, n, dst, bf16_to_float);
    case DType::f16: return load_strided<uint16_t>(t.data, base, step, n, dst, f16_to_float);
    default: return;  // integer dtypes never reach here (checked)
  }
}

template <class Acc>
void store_row(const TensorView& t, int64_t row, const Acc* src) {
  const int64_t base = row_offset(t, row), step = t.stride[t.ndim - 1], n = t.shape[t.ndim - 1];
  switch (t.dtype) {
    case DType::f64: return store_strided<double>(t.data, base, step, n, src, [](Acc v) { return double(v); });
    case DType::f32: return store_strided<float>(t.data, base, step, n, src, [](Acc v) { return float(v); });
    case DType::bf16: return store_strided<uint16_t>(t.data, base, step, n, src, [](Acc v) { return float_to_bf16(float(v)); });
    case DType::f16: return store_strided<uint16_t>(t.data, base, step, n, src, [](Acc v) { return float_to_f16(float(v)); });
    default: return;
  }
}

// Rows [begin, end) of block `block` when `rows` rows of `dim` elements are cut
// into blocks of about kElementsPerBlock elements (small inputs stay on one
// thread: starting threads would cost more than the work).
struct RowBlocks {
  int64_t count = 0, size = 0, rows = 0;
  RowBlocks(int64_t rows_, int64_t dim) : rows(rows_) {
    constexpr int64_t kMaxBlocks = 256, kElementsPerBlock = 1 << 15;
    const int64_t by_size = (rows * std::max<int64_t>(dim, 1) + kElementsPerBlock - 1) / kElementsPerBlock;
    count = std::clamp<int64_t>(std::min(by_size, rows), 1, kMaxBlocks);
    size = (rows + count - 1) / count;
  }
  int64_t begin(int64_t block) const { return std::min(rows, block * size); }
  int64_t end(int64_t block) const { return std::min(rows, (block + 1) * size); }
};

template <class Acc>
Acc sigmoid(Acc r) {
  return Acc(1) / (Acc(1) + std::exp(-r));
}

template <class Acc>
Acc activate(GateActivation activation, Acc r) {
  return activation == GateActivation::swish ? r * sigmoid(r) : sigmoid(r);
}

template <class Acc>
Acc activate_grad(GateActivation activation, Acc r) {
  const Acc s = sigmoid(r);
  return activation == GateActivation::swish ? s * (Acc(1) + r * (Acc(1) - s)) : s * (Acc(1) - s);
}

// The weight as a dense [D] vector of Acc (ones when absent).
template <class Acc>
std::vector<Acc> dense_weight(const TensorView& weight, int64_t dim) {
  std::vector<Acc> w(dim, Acc(1));
  if (weight.defined()) load_row(weight, 0, w.data());
  return w;
}

template <class Acc>
Acc inverse_rms(const Acc* x, int64_t dim, double eps) {
  Acc sum_squares = 0;
  for (int64_t j = 0; j < dim; ++j) sum_squares += x[j] * x[j];
  return Acc(1) / std::sqrt(sum_squares / Acc(dim) + Acc(eps));
}

template <class Acc>
void norm_forward(const RmsNormForwardArgs& a, const RowsProblem& p) {
  const int64_t D = p.dim;
  const std::vector<Acc> w = dense_weight<Acc>(a.weight, D);
  const RowBlocks blocks(p.rows, D);
  parallel_for(blocks.count, [&](int64_t block) {
    std::vector<Acc> x(D), r(D), y(D);
    for (int64_t row = blocks.begin(block); row < blocks.end(block); ++row) {
      load_row(a.x, row, x.data());
      if (a.gate.defined()) load_row(a.gate, row, r.data());
      const Acc rstd = inverse_rms(x.data(), D, a.eps);
      for (int64_t j = 0; j < D; ++j) {
        y[j] = x[j] * rstd * w[j];
        if (a.gate.defined()) y[j] *= activate(a.activation, r[j]);
      }
      store_row(a.y, row, y.data());
    }
  });
}

template <class Acc>
void norm_backward(const RmsNormBackwardArgs& a, const RowsProblem& p) {
  const int64_t D = p.dim;
  const bool gated = a.gate.defined(), want_dweight = a.dweight.defined();
  const std::vector<Acc> w = dense_weight<Acc>(a.weight, D);
  const RowBlocks blocks(p.rows, D);
  std::vector<Acc> dweight_partials(want_dweight ? blocks.count * D : 0, Acc(0));
  parallel_for(blocks.count, [&](int64_t block) {
    std::vector<Acc> x(D), r(D), dy(D), dx(D), dr(D), dnormed(D);
    Acc* dweight_partial = want_dweight ? dweight_partials.data() + block * D : nullptr;
    for (int64_t row = blocks.begin(block); row < blocks.end(block); ++row) {
      load_row(a.x, row, x.data());
      load_row(a.dy, row, dy.data());
      if (gated) load_row(a.gate, row, r.data());
      const Acc rstd = inverse_rms(x.data(), D, a.eps);
      // y = x̂ · w · act(r) with x̂ = x · rstd. dnormed = ∂L/∂(x̂ · w).
      Acc dot = 0;  // Σ_j ∂L/∂x̂_j · x̂_j
      for (int64_t j = 0; j < D; ++j) {
        const Acc xhat = x[j] * rstd;
        dnormed[j] = gated ? dy[j] * activate(a.activation, r[j]) : dy[j];
        if (gated) dr[j] = dy[j] * xhat * w[j] * activate_grad(a.activation, r[j]);
        if (dweight_partial) dweight_partial[j] += dnormed[j] * xhat;
        dot += dnormed[j] * w[j] * xhat;
      }
      const Acc mean_dot = dot / Acc(D);
      for (int64_t j = 0; j < D; ++j) dx[j] = rstd * (dnormed[j] * w[j] - x[j] * rstd * mean_dot);
      store_row(a.dx, row, dx.data());
      if (gated) store_row(a.dgate, row, dr.data());
    }
  });
  if (want_dweight) {
    std::vector<Acc> dweight(D, Acc(0));
    for (int64_t block = 0; block < blocks.count; ++block)
      for (int64_t j = 0; j < D; ++j) dweight[j] += dweight_partials[block * D + j];
    store_row(a.dweight, 0, dweight.data());
  }
}

template <class Acc>
Acc logsigmoid(Acc x) {
  return std::min(x, Acc(0)) - std::log1p(std::exp(-std::abs(x)));
}

// Row buffers of one thread.
template <class Acc>
struct RowScratch {
  std::vector<Acc> x, dg, out;
  explicit RowScratch(int64_t dim) : x(dim), dg(dim), out(dim) {}
};

// Runs fn(scratch, row) for every row of x's last dimension, in parallel.
template <class Acc, class Fn>
void for_each_row(const TensorView& x, Fn fn) {
  const int64_t dim = x.shape[x.ndim - 1];
  const RowBlocks blocks(dim == 0 ? 0 : x.numel() / dim, dim);
  parallel_for(blocks.count, [&](int64_t block) {
    RowScratch<Acc> scratch(dim);
    for (int64_t row = blocks.begin(block); row < blocks.end(block); ++row) fn(scratch, row);
  });
}

template <class Acc>
void gate_forward(const LogSigmoidGateForwardArgs& a) {
  const Acc inv_normalizer = Acc(1.0 / a.normalizer);
  for_each_row<Acc>(a.x, [&](RowScratch<Acc>& s, int64_t row) {
    load_row(a.x, row, s.x.data());
    for (size_t j = 0; j < s.x.size(); ++j) {
      s.out[j] = logsigmoid(s.x[j]) * inv_normalizer;
      if (a.clamp_min) s.out[j] = std::max(s.out[j], Acc(*a.clamp_min));
    }
    store_row(a.g, row, s.out.data());
  });
}

template <class Acc>
void gate_backward(const LogSigmoidGateBackwardArgs& a) {
  const Acc inv_normalizer = Acc(1.0 / a.normalizer);
  for_each_row<Acc>(a.x, [&](RowScratch<Acc>& s, int64_t row) {
    load_row(a.x, row, s.x.data());
    load_row(a.dg, row, s.dg.data());
    for (size_t j = 0; j < s.x.size(); ++j) {
      // d logsigmoid(x)/dx = sigmoid(−x); the clamp passes the gradient where g ≥ clamp_min (as torch.clamp).
      const bool clamped = a.clamp_min && logsigmoid(s.x[j]) * inv_normalizer < Acc(*a.clamp_min);
      s.out[j] = clamped ? Acc(0) : s.dg[j] * sigmoid(-s.x[j]) * inv_normalizer;
    }
    store_row(a.dx, row, s.out.data());
  });
}

}  // namespace

void rms_norm_forward(const RmsNormForwardArgs& a, const RowsProblem& p) {
  if (a.x.dtype == DType::f64) return norm_forward<double>(a, p);
  norm_forward<float>(a, p);
}

void rms_norm_backward(const RmsNormBackwardArgs& a, const RowsProblem& p) {
  if (a.x.dtype == DType::f64) return norm_backward<double>(a, p);
  norm_backward<float>(a, p);
}

void logsigmoid_gate_forward(const LogSigmoidGateForwardArgs& a) {
  if (a.x.dtype == DType::f64) return gate_forward<double>(a);
  gate_forward<float>(a);
}

void logsigmoid_gate_backward(const LogSigmoidGateBackwardArgs& a) {
  if (a.x.dtype == DType::f64) return gate_backward<double>(a);
  gate_backward<float>(a);
}

}  // namespace flashgla::cpu
