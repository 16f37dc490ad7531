// Gated RMSNorm and log-sigmoid gate (flashgla/norm.h), forward and backward,
// against an fp64 computation written out here; the fp64 backward itself is
// checked by finite differences of the fp64 forward. Then bad input, and the
// same checks on a GPU where there is one.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "flashgla/flashgla.h"
#include "test_util.h"
#include "testing/buffer.h"

namespace {

using namespace flashgla;
using flashgla::testing::Buffer;
using flashgla::testing::expect_error;
using flashgla::testing::rel_rms_error;

// ---- fp64 reference ---------------------------------------------------------------

template <class S>
S sigmoid(S r) { return S(1) / (S(1) + std::exp(-r)); }
template <class S>
S activate(GateActivation act, S r) { return act == GateActivation::swish ? r * sigmoid(r) : sigmoid(r); }
template <class S>
S activate_grad(GateActivation act, S r) {
  const S s = sigmoid(r);
  return act == GateActivation::swish ? s * (1 + r * (1 - s)) : s * (1 - s);
}

// x, r, dy: rows × dim in row-major order; w: [dim] or empty (ones); r empty: no gate.
struct NormInputs {
  int64_t rows = 0, dim = 0;
  std::vector<double> x, w, r;
  GateActivation act = GateActivation::swish;
  double eps = 1e-6;
  double weight(int64_t j) const { return w.empty() ? 1.0 : w[j]; }
};

// The definition computed in S: fp64 for the reference, fp32 for the naive
// same-precision computation the tolerances are measured against.
template <class S = double>
std::vector<double> reference_norm(const NormInputs& in) {
  std::vector<double> y(in.x.size());
  for (int64_t i = 0; i < in.rows; ++i) {
    S sum_squares = 0;
    for (int64_t j = 0; j < in.dim; ++j) sum_squares += S(in.x[i * in.dim + j]) * S(in.x[i * in.dim + j]);
    const S rstd = S(1) / std::sqrt(sum_squares / S(in.dim) + S(in.eps));
    for (int64_t j = 0; j < in.dim; ++j) {
      S value = S(in.x[i * in.dim + j]) * rstd * S(in.weight(j));
      if (!in.r.empty()) value *= activate(in.act, S(in.r[i * in.dim + j]));
      y[i * in.dim + j] = double(value);
    }
  }
  return y;
}

struct NormGrads {
  std::vector<double> dx, dr, dw;
};

template <class S = double>
NormGrads reference_norm_backward(const NormInputs& in, const std::vector<double>& dy) {
  NormGrads g;
  g.dx.assign(in.x.size(), 0);
  g.dr.assign(in.r.size(), 0);
  std::vector<S> dw(in.dim, S(0));
  for (int64_t i = 0; i < in.rows; ++i) {
    std::vector<S> x(in.x.begin() + i * in.dim, in.x.begin() + (i + 1) * in.dim);
    S sum_squares = 0;
    for (int64_t j = 0; j < in.dim; ++j) sum_squares += x[j] * x[j];
    const S rstd = S(1) / std::sqrt(sum_squares / S(in.dim) + S(in.eps));
    // ∂L/∂x̂_j = dy_j · act(r_j) · w_j;  dx = rstd · (∂L/∂x̂ − x̂ · mean(∂L/∂x̂ · x̂)).
    std::vector<S> dxhat(in.dim);
    S dot = 0;
    for (int64_t j = 0; j < in.dim; ++j) {
      const int64_t e = i * in.dim + j;
      const S gate = in.r.empty() ? S(1) : activate(in.act, S(in.r[e]));
      const S xhat = x[j] * rstd;
      dxhat[j] = S(dy[e]) * gate * S(in.weight(j));
      dot += dxhat[j] * xhat;
      dw[j] += S(dy[e]) * gate * xhat;
      if (!in.r.empty()) g.dr[e] = double(S(dy[e]) * xhat * S(in.weight(j)) * activate_grad(in.act, S(in.r[e])));
    }
    for (int64_t j = 0; j < in.dim; ++j) g.dx[i * in.dim + j] = double(rstd * (dxhat[j] - x[j] * rstd * dot / S(in.dim)));
  }
  g.dw.assign(dw.begin(), dw.end());
  return g;
}

double logsigmoid(double x) { return std::min(x, 0.0) - std::log1p(std::exp(-std::abs(x))); }

double reference_gate(double x, double normalizer, std::optional<double> clamp_min) {
  const double g = logsigmoid(x) / normalizer;
  return clamp_min ? std::max(g, *clamp_min) : g;
}

double reference_gate_grad(double x, double dg, double normalizer, std::optional<double> clamp_min) {
  if (clamp_min && logsigmoid(x) / normalizer < *clamp_min) return 0;
  return dg * sigmoid(-x) / normalizer;
}

// ---- tolerances --------------------------------------------------------------------

std::vector<double> rounded_to(DType dtype, const std::vector<double>& values) {
  Buffer rounded(dtype, {int64_t(values.size())});
  rounded.set_values(values);
  return rounded.values();
}

// No worse than twice the error of the naive computation at this precision
// (`naive`: computed in fp32, or the exact result where there is none;
// stored in `dtype`), and within a floor for fp64 and fp32.
double tolerance(DType dtype, const std::vector<double>& exact, const std::vector<double>& naive) {
  const double naive_error = rel_rms_error(rounded_to(dtype, naive), exact);
  switch (dtype) {
    case DType::f64: return 1e-12;
    case DType::f32: return std::max(2e-6, 2 * naive_error);
    default: return 2 * naive_error + 1e-7;
  }
}
double tolerance(DType dtype, const std::vector<double>& exact) { return tolerance(dtype, exact, exact); }

// ---- cases -------------------------------------------------------------------------

struct NormCase {
  std::vector<int64_t> shape;  // x's shape; the last dimension is normalized
  DType dtype = DType::f32;
  bool weight = true, gate = true;
  DType weight_dtype = DType::f32;
  GateActivation act = GateActivation::swish;
  int64_t row_padding = 0;  // > 0: every tensor but weight and dweight is a strided slice
  Device device{};

  std::string name() const {
    std::string s = "shape [";
    for (size_t d = 0; d < shape.size(); ++d) s += (d ? ", " : "") + std::to_string(shape[d]);
    s += std::string("] ") + dtype_name(dtype) + (weight ? std::string(" weight ") + dtype_name(weight_dtype) : "") +
         (gate ? (act == GateActivation::swish ? " swish gate" : " sigmoid gate") : "") +
         (row_padding ? " strided" : "") + " on " + device.str();
    return s;
  }
};

// Random inputs on the case's device (values rounded to their dtypes), outputs poisoned.
struct NormTensors {
  NormInputs in;
  Buffer x, w, r, dy, y, dx, dr, dw;
  std::vector<double> dy_values;

  NormTensors(const NormCase& c, std::mt19937_64& rng) {
    in.dim = c.shape.back();
    in.rows = 1;
    for (size_t d = 0; d + 1 < c.shape.size(); ++d) in.rows *= c.shape[d];
    in.act = c.act;
    in.eps = 1e-5;
    auto make = [&](DType dtype, const std::vector<int64_t>& shape, double mean, double stddev, int64_t padding) {
      Buffer host(dtype, shape);
      host.fill_normal(rng, mean, stddev);
      return host.to(c.device, padding);
    };
    auto poisoned = [&](DType dtype, const std::vector<int64_t>& shape, int64_t padding) {
      Buffer b = Buffer(dtype, shape).to(c.device, padding);
      b.poison();
      return b;
    };
    x = make(c.dtype, c.shape, 0.3, 1.5, c.row_padding);  // a mean, so rstd is not ≈ 1
    in.x = x.values();
    if (c.weight) {
      w = make(c.weight_dtype, {in.dim}, 1.0, 0.5, 0);
      in.w = w.values();
      dw = poisoned(DType::f32, {in.dim}, 0);
    }
    if (c.gate) {
      r = make(c.dtype, c.shape, 0.0, 2.0, c.row_padding);
      in.r = r.values();
      dr = poisoned(c.dtype, c.shape, c.row_padding);
    }
    dy = make(c.dtype, c.shape, 0.0, 1.0, c.row_padding);
    dy_values = dy.values();
    y = poisoned(c.dtype, c.shape, c.row_padding);
    dx = poisoned(c.dtype, c.shape, c.row_padding);
  }

  RmsNormForwardArgs forward() const {
    RmsNormForwardArgs a;
    a.x = x.view(), a.weight = w.view(), a.gate = r.view(), a.activation = in.act, a.eps = in.eps, a.y = y.view();
    return a;
  }
  RmsNormBackwardArgs backward() const {
    RmsNormBackwardArgs a;
    a.x = x.view(), a.weight = w.view(), a.gate = r.view(), a.activation = in.act, a.eps = in.eps;
    a.dy = dy.view(), a.dx = dx.view(), a.dgate = dr.view(), a.dweight = dw.view();
    return a;
  }
};

void check_norm(const NormCase& c, uint64_t seed) {
  SCOPED_TRACE(c.name());
  std::mt19937_64 rng(seed);
  NormTensors t(c, rng);

  rms_norm_forward(t.forward());
  flashgla::testing::synchronize(c.device);
  const std::vector<double> y_ref = reference_norm(t.in);
  EXPECT_LE(rel_rms_error(t.y.values(), y_ref), tolerance(c.dtype, y_ref, reference_norm<float>(t.in))) << "y";

  rms_norm_backward(t.backward());
  flashgla::testing::synchronize(c.device);
  const NormGrads ref = reference_norm_backward(t.in, t.dy_values);
  const NormGrads naive = reference_norm_backward<float>(t.in, t.dy_values);
  EXPECT_LE(rel_rms_error(t.dx.values(), ref.dx), tolerance(c.dtype, ref.dx, naive.dx)) << "dx";
  if (c.gate) EXPECT_LE(rel_rms_error(t.dr.values(), ref.dr), tolerance(c.dtype, ref.dr, naive.dr)) << "dgate";
  // dweight: summed over all rows, stored in fp32.
  if (c.weight) EXPECT_LE(rel_rms_error(t.dw.values(), ref.dw), tolerance(DType::f32, ref.dw, naive.dw)) << "dweight";
}

// ---- the fp64 reference against finite differences ---------------------------------

TEST(Norm, ReferenceBackwardMatchesFiniteDifferences) {
  std::mt19937_64 rng(7);
  std::normal_distribution<double> normal(0.0, 1.0);
  for (GateActivation act : {GateActivation::swish, GateActivation::sigmoid}) {
    NormInputs in;
    in.rows = 3, in.dim = 5, in.act = act, in.eps = 1e-3;
    for (int64_t e = 0; e < in.rows * in.dim; ++e) in.x.push_back(normal(rng) + 0.5), in.r.push_back(normal(rng));
    for (int64_t j = 0; j < in.dim; ++j) in.w.push_back(1 + 0.5 * normal(rng));
    std::vector<double> dy;
    for (int64_t e = 0; e < in.rows * in.dim; ++e) dy.push_back(normal(rng));
    auto loss = [&](const NormInputs& at) {
      const std::vector<double> y = reference_norm(at);
      double sum = 0;
      for (size_t e = 0; e < y.size(); ++e) sum += y[e] * dy[e];
      return sum;
    };
    const NormGrads g = reference_norm_backward(in, dy);
    const double h = 1e-6;
    auto numeric = [&](std::vector<double> NormInputs::*field, size_t e) {
      NormInputs plus = in, minus = in;
      (plus.*field)[e] += h, (minus.*field)[e] -= h;
      return (loss(plus) - loss(minus)) / (2 * h);
    };
    std::vector<double> dx, dr, dw;
    for (size_t e = 0; e < in.x.size(); ++e) dx.push_back(numeric(&NormInputs::x, e)), dr.push_back(numeric(&NormInputs::r, e));
    for (size_t j = 0; j < in.w.size(); ++j) dw.push_back(numeric(&NormInputs::w, j));
    EXPECT_LE(rel_rms_error(g.dx, dx), 1e-7);
    EXPECT_LE(rel_rms_error(g.dr, dr), 1e-7);
    EXPECT_LE(rel_rms_error(g.dw, dw), 1e-7);
  }
}

TEST(Norm, ReferenceGateGradMatchesFiniteDifferences) {
  const double h = 1e-6;
  for (double x : {-40.0, -3.0, -0.2, 0.0, 0.7, 5.0, 30.0}) {
    const double numeric = (reference_gate(x + h, 16, {}) - reference_gate(x - h, 16, {})) / (2 * h);
    EXPECT_NEAR(reference_gate_grad(x, 1.0, 16, {}), numeric, 1e-8 * (1 + std::abs(numeric))) << "x = " << x;
  }
}

// ---- CPU --------------------------------------------------------------------------

TEST(Norm, CpuMatchesReference) {
  uint64_t seed = 100;
  for (DType dtype : {DType::f64, DType::f32, DType::bf16, DType::f16}) {
    check_norm({{2, 63, 3, 64}, dtype}, seed++);                                     // per head, [B, T, H, V]
    check_norm({{2, 65, 2, 48}, dtype, true, true, dtype, GateActivation::sigmoid}, seed++);
    check_norm({{1000, 17}, dtype, false, true}, seed++);                             // no weight
    check_norm({{3, 5, 256}, dtype, true, false, DType::bf16}, seed++);               // plain RMSNorm
    check_norm({{2, 7, 4, 32}, dtype, true, true, DType::f32, GateActivation::swish, 5}, seed++);  // strided
  }
  check_norm({{1, 1, 1, 1}, DType::f32}, seed++);    // one element: y = x/sqrt(x² + eps)·w·act(r)
  check_norm({{4, 4096}, DType::bf16}, seed++);       // a hidden-size row
  check_norm({{1, 1}, DType::f32, true, false}, seed++);
}

// No rows: nothing to normalize, and dweight, a sum over no rows, is 0.
TEST(Norm, CpuEmptyRowsGiveZeroDweight) {
  Buffer x(DType::f32, {0, 3, 8}), w(DType::f32, {8}), dy(DType::f32, {0, 3, 8}), dx(DType::f32, {0, 3, 8});
  Buffer y(DType::f32, {0, 3, 8}), dw(DType::f32, {8});
  std::mt19937_64 rng(3);
  w.fill_normal(rng);
  dw.poison();
  RmsNormForwardArgs f;
  f.x = x.view(), f.weight = w.view(), f.y = y.view();
  EXPECT_NO_THROW(rms_norm_forward(f));
  RmsNormBackwardArgs b;
  b.x = x.view(), b.weight = w.view(), b.dy = dy.view(), b.dx = dx.view(), b.dweight = dw.view();
  rms_norm_backward(b);
  for (double v : dw.values()) EXPECT_EQ(v, 0.0);
}

// dweight is reduced in a fixed order: bit-identical whatever the thread count.
TEST(Norm, CpuDweightIndependentOfThreadCount) {
  std::mt19937_64 rng(11);
  NormTensors t({{700, 96}, DType::f32}, rng);
  const char* saved = std::getenv("FLASHGLA_NUM_THREADS");
  const std::string saved_value = saved ? saved : "";
  std::vector<std::vector<double>> results;
  for (const char* threads : {"1", "3"}) {
    setenv("FLASHGLA_NUM_THREADS", threads, 1);
    t.dw.poison();
    rms_norm_backward(t.backward());
    results.push_back(t.dw.values());
  }
  if (saved) setenv("FLASHGLA_NUM_THREADS", saved_value.c_str(), 1); else unsetenv("FLASHGLA_NUM_THREADS");
  EXPECT_EQ(results[0], results[1]);
}

// A last dimension with stride 2: a view of every other element of a wider tensor.
TEST(Norm, CpuStridedLastDimension) {
  const int64_t rows = 6, dim = 40;
  std::mt19937_64 rng(5);
  Buffer x_wide(DType::f32, {rows, 2 * dim}), r_wide(DType::f32, {rows, 2 * dim}), y_wide(DType::f32, {rows, 2 * dim});
  x_wide.fill_normal(rng, 0.2, 1.0), r_wide.fill_normal(rng), y_wide.poison();
  auto every_other = [&](const Buffer& b) {
    TensorView v = b.view();
    v.shape[1] = dim, v.stride[1] = 2;
    return v;
  };
  auto even = [&](const std::vector<double>& wide) {
    std::vector<double> out;
    for (size_t e = 0; e < wide.size(); e += 2) out.push_back(wide[e]);
    return out;
  };
  RmsNormForwardArgs a;
  a.x = every_other(x_wide), a.gate = every_other(r_wide), a.y = every_other(y_wide);
  rms_norm_forward(a);
  NormInputs in;
  in.rows = rows, in.dim = dim, in.eps = a.eps, in.x = even(x_wide.values()), in.r = even(r_wide.values());
  const std::vector<double> ref = reference_norm(in);
  EXPECT_LE(rel_rms_error(even(y_wide.values()), ref), 2e-6);
  const std::vector<double> wide = y_wide.values();
  for (size_t e = 1; e < wide.size(); e += 2) ASSERT_TRUE(std::isnan(wide[e])) << "wrote outside the view at " << e;
}

// Leading dimensions that do not nest (a transposed view): x is [5, 3, D] over a [3, 5, D] buffer.
void check_permuted_rows(Device device, DType dtype) {
  SCOPED_TRACE(std::string("permuted rows, ") + dtype_name(dtype) + " on " + device.str());
  const int64_t A = 3, B = 5, D = 48;
  std::mt19937_64 rng(21);
  Buffer x_host(dtype, {A, B, D}), r_host(dtype, {A, B, D});
  x_host.fill_normal(rng, 0.2, 1.0), r_host.fill_normal(rng);
  const Buffer x_storage = x_host.to(device), r_storage = r_host.to(device);
  Buffer y = Buffer(dtype, {B, A, D}).to(device);
  y.poison();
  auto transposed = [&](const Buffer& b) {
    TensorView v = b.view();
    std::swap(v.shape[0], v.shape[1]), std::swap(v.stride[0], v.stride[1]);
    return v;
  };
  auto logical = [&](const std::vector<double>& storage) {  // [A, B, D] storage -> [B, A, D] order
    std::vector<double> out;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t a = 0; a < A; ++a)
        for (int64_t d = 0; d < D; ++d) out.push_back(storage[(a * B + b) * D + d]);
    return out;
  };
  RmsNormForwardArgs args;
  args.x = transposed(x_storage), args.gate = transposed(r_storage), args.y = y.view();
  rms_norm_forward(args);
  flashgla::testing::synchronize(device);
  NormInputs in;
  in.rows = A * B, in.dim = D, in.eps = args.eps, in.x = logical(x_host.values()), in.r = logical(r_host.values());
  const std::vector<double> ref = reference_norm(in);
  EXPECT_LE(rel_rms_error(y.values(), ref), tolerance(dtype, ref, reference_norm<float>(in)));
}

TEST(Norm, CpuPermutedLeadingDimensions) {
  check_permuted_rows({}, DType::f32);
  check_permuted_rows({}, DType::bf16);
}

void check_gate(DType dtype, DType out_dtype, std::optional<double> clamp_min, Device device, int64_t padding,
                uint64_t seed) {
  SCOPED_TRACE(std::string(dtype_name(dtype)) + " -> " + dtype_name(out_dtype) +
               (clamp_min ? " clamp " + std::to_string(*clamp_min) : "") + " on " + device.str());
  std::mt19937_64 rng(seed);
  const std::vector<int64_t> shape = {2, 33, 3, 24};
  Buffer x_host(dtype, shape), dg_host(out_dtype, shape);
  x_host.fill_normal(rng, -1.0, 4.0);  // logsigmoid near 0 and very negative, clamp active and not
  std::vector<double> x_values = x_host.values();
  x_values[0] = -60, x_values[1] = 40, x_values[2] = 0;  // saturated ends
  x_host.set_values(x_values);
  x_values = x_host.values();
  dg_host.fill_normal(rng);
  const Buffer x = x_host.to(device, padding), dg = dg_host.to(device, padding);
  Buffer g = Buffer(out_dtype, shape).to(device, padding), dx = Buffer(dtype, shape).to(device, padding);
  g.poison(), dx.poison();
  const double normalizer = 16;

  LogSigmoidGateForwardArgs f;
  f.x = x.view(), f.normalizer = normalizer, f.clamp_min = clamp_min, f.g = g.view();
  logsigmoid_gate_forward(f);
  LogSigmoidGateBackwardArgs b;
  b.x = x.view(), b.normalizer = normalizer, b.clamp_min = clamp_min, b.dg = dg.view(), b.dx = dx.view();
  logsigmoid_gate_backward(b);
  flashgla::testing::synchronize(device);

  std::vector<double> g_ref, dx_ref;
  const std::vector<double> dg_values = dg_host.values();
  for (size_t e = 0; e < x_values.size(); ++e) {
    g_ref.push_back(reference_gate(x_values[e], normalizer, clamp_min));
    dx_ref.push_back(reference_gate_grad(x_values[e], dg_values[e], normalizer, clamp_min));
  }
  EXPECT_LE(rel_rms_error(g.values(), g_ref), tolerance(out_dtype, g_ref)) << "g";
  EXPECT_LE(rel_rms_error(dx.values(), dx_ref), tolerance(dtype, dx_ref)) << "dx";
  if (clamp_min) {
    const double floor = rounded_to(out_dtype, {*clamp_min})[0];
    for (double v : g.values()) ASSERT_GE(v, floor);
  }
}

TEST(Gate, CpuMatchesReference) {
  uint64_t seed = 200;
  for (DType dtype : {DType::f64, DType::f32, DType::bf16, DType::f16}) {
    check_gate(dtype, dtype, {}, {}, 0, seed++);
    check_gate(dtype, DType::f32, -0.2, {}, 3, seed++);
  }
}

// ---- bad input --------------------------------------------------------------------

TEST(Norm, BadInput) {
  std::mt19937_64 rng(1);
  const NormTensors t({{2, 3, 8}, DType::f32}, rng);
  auto forward = [&](const std::function<void(RmsNormForwardArgs&)>& edit) {
    RmsNormForwardArgs a = t.forward();
    edit(a);
    return [a] { rms_norm_forward(a); };
  };
  auto backward = [&](const std::function<void(RmsNormBackwardArgs&)>& edit) {
    RmsNormBackwardArgs a = t.backward();
    edit(a);
    return [a] { rms_norm_backward(a); };
  };
  EXPECT_NO_THROW(forward([](auto&) {})());
  EXPECT_NO_THROW(backward([](auto&) {})());

  expect_error(forward([](auto& a) { a.x = {}; }), ErrorKind::value, "x", "is required");
  const Buffer ints(DType::i32, {2, 3, 8}), w9(DType::f32, {9}), w_int(DType::i64, {8}), wide(DType::f32, {2, 3, 9});
  const Buffer gate_bf16(DType::bf16, {2, 3, 8}), dw_f16(DType::f16, {8}), empty_dim(DType::f32, {2, 0});
  expect_error(forward([&](auto& a) { a.x = ints.view(), a.y = ints.view(); }), ErrorKind::type, "x", "float");
  expect_error(forward([&](auto& a) { a.x = empty_dim.view(), a.y = empty_dim.view(); }), ErrorKind::value, "x",
               "at least 1");
  expect_error(forward([&](auto& a) { a.weight = w9.view(); }), ErrorKind::value, "weight", "[8]");
  expect_error(forward([&](auto& a) { a.weight = w_int.view(); }), ErrorKind::type, "weight");
  expect_error(forward([&](auto& a) { a.gate = wide.view(); }), ErrorKind::value, "gate", "[2, 3, 9]");
  expect_error(forward([&](auto& a) { a.gate = gate_bf16.view(); }), ErrorKind::type, "gate", "bfloat16");
  expect_error(forward([&](auto& a) { a.y = {}; }), ErrorKind::value, "y", "is required");
  expect_error(forward([&](auto& a) { a.y = gate_bf16.view(); }), ErrorKind::type, "y");
  expect_error(forward([&](auto& a) { a.y.stride[1] = 0; }), ErrorKind::value, "y", "overlap");
  expect_error(forward([&](auto& a) { a.x.stride[0] = -8; }), ErrorKind::value, "x", "negative");
  expect_error(forward([](auto& a) { a.eps = -1; }), ErrorKind::value, "eps");
  expect_error(forward([](auto& a) { a.eps = std::nan(""); }), ErrorKind::value, "eps");
  expect_error(forward([](auto& a) { a.activation = GateActivation(7); }), ErrorKind::value, "activation");
  expect_error(forward([](auto& a) { a.weight.device = {DeviceType::cuda, 0}; }), ErrorKind::value, "weight", "cpu");
  expect_error(forward([](auto& a) { a.x.data = nullptr; }), ErrorKind::value, "x", "null");

  expect_error(backward([](auto& a) { a.dy = {}; }), ErrorKind::value, "dy", "is required");
  expect_error(backward([&](auto& a) { a.dy = wide.view(); }), ErrorKind::value, "dy");
  expect_error(backward([&](auto& a) { a.dx = gate_bf16.view(); }), ErrorKind::type, "dx");
  expect_error(backward([](auto& a) { a.dgate = {}; }), ErrorKind::value, "dgate", "required when gate");
  expect_error(backward([](auto& a) { a.gate = {}; }), ErrorKind::value, "dgate", "without gate");
  expect_error(backward([](auto& a) { a.weight = {}; }), ErrorKind::value, "dweight", "without weight");
  expect_error(backward([&](auto& a) { a.dweight = dw_f16.view(); }), ErrorKind::type, "dweight", "float32");
  expect_error(backward([&](auto& a) { a.dweight = w9.view(); }), ErrorKind::value, "dweight");
  expect_error(backward([](auto& a) { a.dx.stride[2] = 0; }), ErrorKind::value, "dx", "overlap");
  RmsNormBackwardArgs no_dy = t.backward();
  no_dy.dy = {};
  expect_error([&] { rms_norm_backward_workspace_bytes(no_dy); }, ErrorKind::value, "dy", "is required");

#ifndef FLASHGLA_WITH_CUDA
  auto on_gpu = [](auto& a) {
    a.x.device = a.y.device = a.weight.device = a.gate.device = {DeviceType::cuda, 0};
  };
  expect_error(forward(on_gpu), ErrorKind::unsupported, "x", "without CUDA");
#endif
}

TEST(Gate, BadInput) {
  Buffer x(DType::bf16, {4, 6}), g(DType::bf16, {4, 6}), dx(DType::bf16, {4, 6}), g_f16(DType::f16, {4, 6});
  Buffer g_short(DType::bf16, {4, 5}), ints(DType::i32, {4, 6});
  std::mt19937_64 rng(2);
  x.fill_normal(rng);
  auto forward = [&](const std::function<void(LogSigmoidGateForwardArgs&)>& edit) {
    LogSigmoidGateForwardArgs a;
    a.x = x.view(), a.g = g.view();
    edit(a);
    return [a] { logsigmoid_gate_forward(a); };
  };
  auto backward = [&](const std::function<void(LogSigmoidGateBackwardArgs&)>& edit) {
    LogSigmoidGateBackwardArgs a;
    a.x = x.view(), a.dg = g.view(), a.dx = dx.view();
    edit(a);
    return [a] { logsigmoid_gate_backward(a); };
  };
  EXPECT_NO_THROW(forward([](auto&) {})());
  EXPECT_NO_THROW(backward([](auto&) {})());
  expect_error(forward([](auto& a) { a.normalizer = 0; }), ErrorKind::value, "normalizer");
  expect_error(forward([](auto& a) { a.normalizer = INFINITY; }), ErrorKind::value, "normalizer");
  expect_error(forward([](auto& a) { a.clamp_min = std::nan(""); }), ErrorKind::value, "clamp_min");
  expect_error(forward([&](auto& a) { a.g = g_f16.view(); }), ErrorKind::type, "g", "float16");
  expect_error(forward([&](auto& a) { a.g = g_short.view(); }), ErrorKind::value, "g", "[4, 5]");
  expect_error(forward([&](auto& a) { a.x = ints.view(); }), ErrorKind::type, "x");
  expect_error(forward([](auto& a) { a.g = {}; }), ErrorKind::value, "g", "is required");
  expect_error(backward([](auto& a) { a.dg = {}; }), ErrorKind::value, "dg", "is required");
  expect_error(backward([&](auto& a) { a.dg = ints.view(); }), ErrorKind::type, "dg");
  expect_error(backward([&](auto& a) { a.dx = g_f16.view(); }), ErrorKind::type, "dx");
  expect_error(backward([&](auto& a) { a.dx = g_short.view(); }), ErrorKind::value, "dx");
}

// ---- GPU --------------------------------------------------------------------------

TEST(NormGpu, MatchesReference) {
  if (!flashgla::testing::has_cuda()) GTEST_SKIP() << "no GPU";
  const Device gpu{DeviceType::cuda, 0};
  uint64_t seed = 300;
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    NormCase c{{2, 63, 3, 64}, dtype};
    c.device = gpu;
    check_norm(c, seed++);
    c = {{3, 33, 2, 40}, dtype, true, true, dtype, GateActivation::sigmoid, 3, gpu};  // strided, unaligned rows
    check_norm(c, seed++);
    c = {{1000, 17}, dtype, false, true, DType::f32, GateActivation::swish, 0, gpu};
    check_norm(c, seed++);
    c = {{2, 257, 1024}, dtype, true, false, DType::bf16, GateActivation::swish, 0, gpu};  // model RMSNorm
    check_norm(c, seed++);
    c = {{3, 30000}, dtype, true, true, DType::f32, GateActivation::swish, 0, gpu};  // accumulators in the workspace
    check_norm(c, seed++);
  }
}

TEST(NormGpu, PermutedLeadingDimensions) {
  if (!flashgla::testing::has_cuda()) GTEST_SKIP() << "no GPU";
  check_permuted_rows({DeviceType::cuda, 0}, DType::f32);
  check_permuted_rows({DeviceType::cuda, 0}, DType::bf16);
}

TEST(NormGpu, CallerWorkspaceAndEmptyRows) {
  if (!flashgla::testing::has_cuda()) GTEST_SKIP() << "no GPU";
  const Device gpu{DeviceType::cuda, 0};
  std::mt19937_64 rng(9);
  NormCase c{{4, 100, 128}, DType::bf16};
  c.device = gpu;
  NormTensors t(c, rng);
  RmsNormBackwardArgs a = t.backward();
  const size_t bytes = rms_norm_backward_workspace_bytes(a);
  EXPECT_GT(bytes, 0u);
  Buffer workspace = Buffer(DType::f32, {int64_t(bytes / 4 + 1)}).to(gpu);
  workspace.poison();  // the partial sums must be written before they are read
  a.workspace = workspace.view().data, a.workspace_bytes = bytes;
  rms_norm_backward(a);
  flashgla::testing::synchronize(gpu);
  const NormGrads ref = reference_norm_backward(t.in, t.dy_values);
  EXPECT_LE(rel_rms_error(t.dw.values(), ref.dw), 1e-5);
  a.workspace_bytes = bytes - 1;
  expect_error([&] { rms_norm_backward(a); }, ErrorKind::value, "workspace_bytes");

  Buffer x = Buffer(DType::f32, {0, 16}).to(gpu), dw = Buffer(DType::f32, {16}).to(gpu), w = Buffer(DType::f32, {16}).to(gpu);
  dw.poison();
  RmsNormBackwardArgs empty;
  empty.x = x.view(), empty.dy = x.view(), empty.dx = x.view(), empty.weight = w.view(), empty.dweight = dw.view();
  rms_norm_backward(empty);
  flashgla::testing::synchronize(gpu);
  for (double v : dw.values()) EXPECT_EQ(v, 0.0);
}

TEST(GateGpu, MatchesReference) {
  if (!flashgla::testing::has_cuda()) GTEST_SKIP() << "no GPU";
  const Device gpu{DeviceType::cuda, 0};
  uint64_t seed = 400;
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    check_gate(dtype, dtype, {}, gpu, 0, seed++);
    check_gate(dtype, DType::f32, -0.2, gpu, 3, seed++);
  }
}

}  // namespace
