// CPU fold of context-parallel state summaries (flashgla/gla_fold.h): each
// (m, k) row of the state is independent; the ranks are walked in order.
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/gla_fold_backend.h"
#include "cpu/common/parallel.h"

namespace flashgla::cpu {
namespace {

template <class T>
void fold(const GlaFoldStatesArgs& a) {
  const TensorView &s = a.states, &d = a.log_decay, &o = a.out;
  const int64_t M = s.shape[1], K = s.shape[2], V = s.shape[3];
  const T* sp = static_cast<const T*>(s.data);
  const T* dp = static_cast<const T*>(d.data);
  T* op = static_cast<T*>(o.data);
  const T* ip = static_cast<const T*>(a.initial.data);
  auto row = [&](int64_t item) {
    const int64_t m = item / K, k = item % K;
    std::vector<T> h(size_t(V), T(0));
    if (a.initial.defined())
      for (int64_t v = 0; v < V; ++v)
        h[size_t(v)] = ip[m * a.initial.stride[0] + k * a.initial.stride[1] + v * a.initial.stride[2]];
    for (int64_t step = 0; step < a.end - a.begin; ++step) {
      const int64_t j = a.reverse ? a.end - 1 - step : a.begin + step;
      // exp(−inf) = 0: a reset clears what came before (h is finite), with no NaN.
      const T decay = std::exp(dp[j * d.stride[0] + m * d.stride[1] + k * d.stride[2]]);
      const T* in = sp + j * s.stride[0] + m * s.stride[1] + k * s.stride[2];
      for (int64_t v = 0; v < V; ++v) h[size_t(v)] = decay * h[size_t(v)] + in[v * s.stride[3]];
    }
    T* out = op + m * o.stride[0] + k * o.stride[1];
    for (int64_t v = 0; v < V; ++v) out[v * o.stride[2]] = (a.accumulate ? out[v * o.stride[2]] : T(0)) + h[size_t(v)];
  };
  const int64_t rows = M * K;
  // The work is P·M·K·V multiply-adds: threads only pay off for many ranks and large states.
  if (rows * V * (a.end - a.begin) < (int64_t(1) << 20)) {
    for (int64_t i = 0; i < rows; ++i) row(i);
  } else {
    parallel_for(rows, row);
  }
}

}  // namespace

void gla_fold_states(const GlaFoldStatesArgs& a) {
  if (a.states.dtype == DType::f64) {
    fold<double>(a);
  } else {
    fold<float>(a);
  }
}

}  // namespace flashgla::cpu
