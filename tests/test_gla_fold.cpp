// gla_fold_states (flashgla/gla_fold.h): the fold of context parallelism's
// per-rank state summaries, against an fp64 loop over ranks, on the CPU and
// (when present) a CUDA device.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "flashgla/gla_fold.h"
#include "test_util.h"
#include "testing/buffer.h"

namespace flashgla {
namespace {

using testing::Buffer;

// h ← exp(a_j) h + S_j over j in order (descending when reverse), from h = 0, in fp64.
std::vector<double> fold_reference(const std::vector<double>& s, const std::vector<double>& a, int64_t M, int64_t K,
                                   int64_t V, int64_t begin, int64_t end, bool reverse) {
  std::vector<double> h(size_t(M * K * V), 0.0);
  for (int64_t step = 0; step < end - begin; ++step) {
    const int64_t j = reverse ? end - 1 - step : begin + step;
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = 0; k < K; ++k) {
        const double decay = std::exp(a[size_t((j * M + m) * K + k)]);
        for (int64_t v = 0; v < V; ++v) {
          double& x = h[size_t((m * K + k) * V + v)];
          x = (step == 0 ? 0.0 : decay * x) + s[size_t(((j * M + m) * K + k) * V + v)];
        }
      }
  }
  return h;
}

struct FoldCase {
  int64_t P, M, K, V, begin, end;
  bool reverse;
};

void check_fold(Device device, DType dtype, const FoldCase& c, bool with_neg_inf, int64_t padding) {
  std::mt19937_64 rng(1234 + c.P * 7 + c.begin * 3 + c.end + (c.reverse ? 100 : 0));
  Buffer states_host(dtype, {c.P, c.M, c.K, c.V});
  Buffer decay_host(dtype, {c.P, c.M, c.K});
  states_host.fill_normal(rng);
  decay_host.fill_uniform(rng, -3.0, 0.0);
  std::vector<double> a = decay_host.values();
  if (with_neg_inf) {  // a full reset on one rank, for some keys
    for (int64_t m = 0; m < c.M; ++m)
      for (int64_t k = 0; k < c.K; k += 2) a[size_t((((c.begin + c.end) / 2) * c.M + m) * c.K + k)] = -INFINITY;
    decay_host.set_values(a);
  }
  Buffer states = states_host.to(device, padding), decay = decay_host.to(device, padding);
  Buffer out(dtype, {c.M, c.K, c.V}, device, padding);
  out.poison();
  GlaFoldStatesArgs args;
  args.states = states.view();
  args.log_decay = decay.view();
  args.begin = c.begin;
  args.end = c.end;
  args.reverse = c.reverse;
  args.out = out.view();
  gla_fold_states(args);
  testing::synchronize(device);
  const auto ref = fold_reference(states_host.values(), a, c.M, c.K, c.V, c.begin, c.end, c.reverse);
  const auto got = out.values();
  if (c.begin == c.end) {
    for (double x : got) ASSERT_EQ(x, 0.0);
    return;
  }
  const double tolerance = dtype == DType::f64 ? 1e-14 : 1e-6;
  EXPECT_LE(testing::rel_rms_error(got, ref), tolerance)
      << "P=" << c.P << " begin=" << c.begin << " end=" << c.end << " reverse=" << c.reverse;
}

const FoldCase kCases[] = {
    {4, 3, 8, 5, 0, 3, false}, {4, 3, 8, 5, 1, 4, true}, {8, 2, 16, 16, 2, 7, false},
    {8, 2, 16, 16, 0, 8, true}, {3, 1, 4, 4, 1, 2, false}, {3, 1, 4, 4, 2, 2, true},
};

TEST(GlaFold, CpuMatchesReference) {
  for (DType dtype : {DType::f64, DType::f32})
    for (const FoldCase& c : kCases) {
      check_fold(Device{}, dtype, c, false, 0);
      check_fold(Device{}, dtype, c, true, 0);
      check_fold(Device{}, dtype, c, false, 3);  // strided (padded rows)
    }
}

TEST(GlaFold, CudaMatchesReference) {
  if (!testing::has_cuda()) GTEST_SKIP() << "no CUDA device";
  const Device device{DeviceType::cuda, 0};
  for (const FoldCase& c : kCases) {
    check_fold(device, DType::f32, c, false, 0);
    check_fold(device, DType::f32, c, true, 0);
    check_fold(device, DType::f32, c, false, 3);
  }
  // The shape of a real fold: 4 ranks, 16 heads, 128 × 128 states.
  check_fold(device, DType::f32, {4, 16, 128, 128, 0, 3, false}, true, 0);
}

// h starts from `initial` and the result is added to what `out` holds: the two uses of the
// backward (a rank's own end-state gradient carried to its start; the folded gradient added to it).
void check_initial_and_accumulate(Device device, DType dtype) {
  const int64_t P = 4, M = 3, K = 8, V = 6;
  std::mt19937_64 rng(99);
  Buffer s_host(dtype, {P, M, K, V}), a_host(dtype, {P, M, K}), init_host(dtype, {M, K, V}), out0_host(dtype, {M, K, V});
  s_host.fill_normal(rng);
  a_host.fill_uniform(rng, -2.0, 0.0);
  init_host.fill_normal(rng);
  out0_host.fill_normal(rng);
  for (bool reverse : {false, true}) {
    Buffer s = s_host.to(device), a = a_host.to(device), init = init_host.to(device, 2), out = out0_host.to(device, 1);
    GlaFoldStatesArgs args;
    args.states = s.view();
    args.log_decay = a.view();
    args.begin = 1;
    args.end = 4;
    args.reverse = reverse;
    args.initial = init.view();
    args.accumulate = true;
    args.out = out.view();
    gla_fold_states(args);
    testing::synchronize(device);
    // Reference: h = initial, then h ← exp(a_j) h + S_j in order, plus the old out.
    const auto sv = s_host.values(), av = a_host.values(), iv = init_host.values(), ov = out0_host.values();
    std::vector<double> ref(ov.size());
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = 0; k < K; ++k)
        for (int64_t v = 0; v < V; ++v) {
          double h = iv[size_t((m * K + k) * V + v)];
          for (int64_t step = 0; step < 3; ++step) {
            const int64_t j = reverse ? 3 - step : 1 + step;
            h = std::exp(av[size_t((j * M + m) * K + k)]) * h + sv[size_t(((j * M + m) * K + k) * V + v)];
          }
          ref[size_t((m * K + k) * V + v)] = ov[size_t((m * K + k) * V + v)] + h;
        }
    EXPECT_LE(testing::rel_rms_error(out.values(), ref), dtype == DType::f64 ? 1e-14 : 1e-6) << "reverse=" << reverse;
  }
}

TEST(GlaFold, CpuInitialAndAccumulate) {
  check_initial_and_accumulate(Device{}, DType::f64);
  check_initial_and_accumulate(Device{}, DType::f32);
}

TEST(GlaFold, CudaInitialAndAccumulate) {
  if (!testing::has_cuda()) GTEST_SKIP() << "no CUDA device";
  check_initial_and_accumulate(Device{DeviceType::cuda, 0}, DType::f32);
}

TEST(GlaFold, BadInput) {
  using testing::expect_error;
  Buffer s(DType::f32, {4, 2, 8, 8}), a(DType::f32, {4, 2, 8}), o(DType::f32, {2, 8, 8});
  s.fill(1.0);
  a.fill(0.0);
  auto call = [&](const TensorView& states, const TensorView& decay, const TensorView& out, int64_t begin,
                  int64_t end) {
    GlaFoldStatesArgs args;
    args.states = states;
    args.log_decay = decay;
    args.out = out;
    args.begin = begin;
    args.end = end;
    gla_fold_states(args);
  };
  expect_error([&] { call(s.view(), a.view(), o.view(), 0, 5); }, ErrorKind::value, "begin", "end <= P = 4");
  expect_error([&] { call(s.view(), a.view(), o.view(), 3, 2); }, ErrorKind::value, "begin");
  expect_error([&] { call(TensorView{}, a.view(), o.view(), 0, 1); }, ErrorKind::value, "states");
  Buffer bad_a(DType::f32, {4, 2, 7});
  expect_error([&] { call(s.view(), bad_a.view(), o.view(), 0, 1); }, ErrorKind::value, "log_decay");
  Buffer bad_o(DType::f32, {2, 8, 9});
  expect_error([&] { call(s.view(), a.view(), bad_o.view(), 0, 1); }, ErrorKind::value, "out");
  Buffer half_s(DType::bf16, {4, 2, 8, 8});
  expect_error([&] { call(half_s.view(), a.view(), o.view(), 0, 1); }, ErrorKind::type, "states");
  Buffer bad_init(DType::f32, {2, 8, 7});
  expect_error(
      [&] {
        GlaFoldStatesArgs args;
        args.states = s.view();
        args.log_decay = a.view();
        args.out = o.view();
        args.initial = bad_init.view();
        args.end = 1;
        gla_fold_states(args);
      },
      ErrorKind::value, "initial");
  Buffer f64_o(DType::f64, {2, 8, 8});
  expect_error([&] { call(s.view(), a.view(), f64_o.view(), 0, 1); }, ErrorKind::type, "out");
}

}  // namespace
}  // namespace flashgla
