// CUDA softmax attention against the CPU fp64 naive reference: o, lse, dq, dk
// and dv over head dims, lengths around the tile sizes, causal and full masks,
// Tq != Tk, grouped KV heads, varlen (with empty and length-1 sequences),
// fully masked rows, strided (aligned and unaligned) tensors, custom scales,
// fp16, the deterministic backward, caller-provided workspace, and bad input. Outputs are poisoned (NaN)
// before every call, so an element never written fails. The forward checked
// is the one the library picks; on an H100, run the binary once with
// FLASHGLA_ATTENTION_KERNEL=portable and once with =hopper to check both
// forwards (with =hopper, a call whose tensors TMA can address fails instead
// of falling back, so the sm_90a kernel really ran); FLASHGLA_ATTENTION_BACKWARD
// does the same for the backward (tests/tuning_test_util.h puts them into the
// calls' AttentionTuning). Lengths straddle the kernels' tiles (64 and
// 128 rows).
// Cases the fast kernels do not take (fp32, other head dims, D != Dv) are in
// test_attention_generic_cuda.cpp.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "attention_test_util.h"
#include "flashgla/attention.h"
#include "flashgla/error.h"
#include "flashgla/flashgla.h"
#include "testing/buffer.h"

namespace {

using namespace flashgla;
using namespace flashgla::testing::attention_test;
using flashgla::testing::Buffer;
using flashgla::testing::rel_rms_error;

// Error bounds, two to five times the largest errors the portable kernels
// showed on an H100 (2026-11-20): bf16 rounds P, dS and the outputs to 8
// significant bits, fp16 to 11.
struct Tolerance {
  double o, lse, grad;
};
Tolerance tolerance(DType dtype) {
  return dtype == DType::bf16 ? Tolerance{5e-3, 1e-5, 8e-3} : Tolerance{1e-3, 1e-5, 1.5e-3};
}

void check_case(const Case& c, uint64_t seed = 1) {
  const Tensors host = make_inputs(c, seed);
  const Results ref = run(c, as_f64(host), {}, AttentionAlgorithm::naive, 0);
  const Results gpu = run(c, to_device(host, c.row_padding), kCuda, AttentionAlgorithm::tiled, c.row_padding);

  const double e_o = rel_rms_error(gpu.o.values(), ref.o.values());
  const double e_lse = lse_error(gpu.lse.values(), ref.lse.values());
  const double e_dq = rel_rms_error(gpu.dq.values(), ref.dq.values());
  const double e_dk = rel_rms_error(gpu.dk.values(), ref.dk.values());
  const double e_dv = rel_rms_error(gpu.dv.values(), ref.dv.values());
  std::printf("  errors: o %.2e lse %.2e dq %.2e dk %.2e dv %.2e\n", e_o, e_lse, e_dq, e_dk, e_dv);
  const Tolerance tol = tolerance(c.dtype);
  EXPECT_LE(e_o, tol.o) << "o";
  EXPECT_LE(e_lse, tol.lse) << "lse";
  EXPECT_LE(e_dq, tol.grad) << "dq";
  EXPECT_LE(e_dk, tol.grad) << "dk";
  EXPECT_LE(e_dv, tol.grad) << "dv";
}

class AttentionCuda : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no GPU";
  }
};

TEST_P(AttentionCuda, MatchesFp64Reference) { check_case(GetParam()); }

std::vector<Case> lengths_and_dims() {
  std::vector<Case> cases;
  for (int64_t d : {64, 128, 256})
    for (int64_t t : {1, 63, 64, 65, 127, 128, 129, 200, 257, 1000})
      for (bool causal : {true, false}) cases.push_back(Case().dim(d).lens(t, t).masked(causal));
  return cases;
}
INSTANTIATE_TEST_SUITE_P(Lengths, AttentionCuda, ::testing::ValuesIn(lengths_and_dims()));

std::vector<Case> unequal_lengths() {
  std::vector<Case> cases;
  for (int64_t d : {64, 128, 256})
    for (auto [tq, tk] : std::vector<std::pair<int64_t, int64_t>>{{65, 200}, {200, 65}, {130, 400}, {400, 130}, {1, 1000}, {1000, 1}, {130, 0}})
      for (bool causal : {true, false}) cases.push_back(Case().dim(d).lens(tq, tk).masked(causal));
  return cases;
}
// Causal with Tq > Tk leaves the first Tq − Tk rows without a key (o = 0, lse = −inf, dq = 0).
INSTANTIATE_TEST_SUITE_P(UnequalLengths, AttentionCuda, ::testing::ValuesIn(unequal_lengths()));

// Tk >= 8K at d = 128: the default forward there is the 176-key-tile variant
// (attention.cu, hopper_variant); a few queries keep the fp64
// reference cheap.
std::vector<Case> long_keys() {
  std::vector<Case> cases;
  for (bool causal : {true, false}) cases.push_back(Case().dim(128).lens(200, 8300).heads(2, 1).masked(causal));
  return cases;
}
INSTANTIATE_TEST_SUITE_P(LongKeys, AttentionCuda, ::testing::ValuesIn(long_keys()));

std::vector<Case> grouped_heads() {
  std::vector<Case> cases;
  for (int64_t d : {64, 128})
    for (int64_t hkv : {1, 2, 8})
      for (bool causal : {true, false}) cases.push_back(Case().dim(d).heads(8, hkv).lens(200, 200).masked(causal));
  cases.push_back(Case().dim(256).heads(8, 2).lens(130, 70).masked(true));
  return cases;
}
INSTANTIATE_TEST_SUITE_P(GroupedHeads, AttentionCuda, ::testing::ValuesIn(grouped_heads()));

std::vector<Case> varlen() {
  std::vector<Case> cases;
  for (int64_t d : {64, 128, 256})
    for (bool causal : {true, false}) {
      // An empty sequence, a length-1 one, Tq > Tk (fully masked rows when causal) and Tq < Tk.
      cases.push_back(Case().dim(d).heads(4, 2).masked(causal).varlen({70, 0, 1, 200, 129, 3}, {70, 5, 1, 64, 300, 0}));
      cases.push_back(Case().dim(d).heads(2, 1).masked(causal).varlen({1, 64, 127}, {1, 64, 127}));
      cases.push_back(Case().dim(d).heads(4, 1).masked(causal).varlen({300, 129, 128, 1}, {300, 129, 128, 1}));
    }
  return cases;
}
INSTANTIATE_TEST_SUITE_P(Varlen, AttentionCuda, ::testing::ValuesIn(varlen()));

std::vector<Case> strided_and_more() {
  std::vector<Case> cases;
  for (int64_t d : {64, 128, 256}) {
    cases.push_back(Case().dim(d).lens(100, 150).padded(8));  // 16-byte aligned rows: the cp.async path
    cases.push_back(Case().dim(d).lens(100, 150).padded(3));  // unaligned rows: element loads and stores
    cases.push_back(Case().dim(d).lens(150, 100).masked(false).padded(3).varlen({50, 0, 100}, {30, 70, 0}));
    cases.push_back(Case().dim(d).lens(200, 200).fp16());
    cases.push_back(Case().dim(d).lens(90, 90).fp16().masked(false).heads(4, 1));
  }
  cases.push_back(Case().dim(128).lens(300, 300).with_scale(0.37));
  cases.push_back(Case().dim(64).lens(100, 120).masked(false).with_scale(-0.2));
  cases.push_back(Case().dim(128).lens(2048, 2048).with_batch(1).heads(2, 1));
  // Many key tiles for every query tile: each K/V stage's mbarriers go through several phases.
  for (int64_t d : {64, 128}) cases.push_back(Case().dim(d).lens(1500, 1500).with_batch(1).heads(2, 1).masked(false));
  return cases;
}
INSTANTIATE_TEST_SUITE_P(StridesDtypesScales, AttentionCuda, ::testing::ValuesIn(strided_and_more()));

// The deterministic backward (dq added in turns) on both fast kernels: the same accuracy. Tq ≠ Tk (the causal
// diagonal off the tile grid), grouped heads, varlen with empty and short sequences, unaligned rows (portable).
std::vector<Case> deterministic() {
  std::vector<Case> cases;
  for (auto kernel : {AttentionTuning::Kernel::portable, AttentionTuning::Kernel::hopper})
    for (int64_t d : {64, 128})
      for (bool causal : {true, false}) {
        const Case c = Case().dim(d).masked(causal).in_turns().backward_on(kernel);
        cases.push_back(c.lens(333, 700).heads(4, 2));
        cases.push_back(c.lens(700, 333).heads(8, 1).fp16());
        cases.push_back(c.heads(4, 2).varlen({70, 0, 1, 200, 129, 3}, {70, 5, 1, 64, 300, 0}));
        cases.push_back(c.heads(2, 1).varlen({300, 129, 128, 1}, {300, 129, 128, 1}));
      }
  cases.push_back(Case().dim(128).lens(100, 150).padded(3).in_turns());  // element loads: the portable kernel
  cases.push_back(Case().dim(256).lens(130, 300).heads(4, 2).in_turns());
  return cases;
}
INSTANTIATE_TEST_SUITE_P(Deterministic, AttentionCuda, ::testing::ValuesIn(deterministic()));

class AttentionCudaApi : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no GPU";
  }
};

// The forward has no atomics: two runs give the same bits (a race would not).
TEST_F(AttentionCudaApi, ForwardIsDeterministic) {
  for (int64_t d : {64, 128}) {
    const Case c = Case().dim(d).lens(777, 900).heads(4, 2);
    const Tensors in = to_device(make_inputs(c, 7), 0);
    const Results a = run(c, in, kCuda, AttentionAlgorithm::tiled, 0);
    const Results b = run(c, in, kCuda, AttentionAlgorithm::tiled, 0);
    EXPECT_EQ(a.o.values(), b.o.values());
    EXPECT_EQ(a.lse.values(), b.lse.values());
  }
}

// deterministic: five backward runs give the same bits, on both fast kernels, at shapes where many key tiles
// add into every dq element (16 at Tk = 2048). The runs without the flag are counted, not judged: their atomics
// may or may not land in another order.
TEST_F(AttentionCudaApi, DeterministicBackwardRepeatsBitForBit) {
  for (auto kernel : {AttentionTuning::Kernel::portable, AttentionTuning::Kernel::hopper})
    for (int64_t d : {64, 128})
      for (bool causal : {false, true}) {
        const Case base = Case().dim(d).lens(2048, 2048).heads(8, 2).masked(causal).backward_on(kernel);
        const Case c = base.in_turns();
        SCOPED_TRACE(::testing::PrintToString(c));
        const Tensors in = to_device(make_inputs(c, 11), 0);
        const Results first = run(c, in, kCuda, AttentionAlgorithm::tiled, 0);
        for (int rerun = 0; rerun < 4; ++rerun) {
          const Results again = run(c, in, kCuda, AttentionAlgorithm::tiled, 0);
          ASSERT_EQ(again.dq.values(), first.dq.values()) << "rerun " << rerun;
          ASSERT_EQ(again.dk.values(), first.dk.values()) << "rerun " << rerun;
          ASSERT_EQ(again.dv.values(), first.dv.values()) << "rerun " << rerun;
        }
        const std::vector<double> free_order = run(base, in, kCuda, AttentionAlgorithm::tiled, 0).dq.values();
        size_t differ = 0;
        const std::vector<double> turns = first.dq.values();
        for (size_t i = 0; i < turns.size(); ++i) differ += turns[i] != free_order[i];
        std::printf("  without the flag: %zu of %zu dq elements differ from the deterministic run\n", differ,
                    turns.size());
        EXPECT_LE(rel_rms_error(free_order, turns), 1e-2);
      }
}

TEST_F(AttentionCudaApi, CallerWorkspaceAndAllocatorGiveTheSameGradients) {
  const Case c = Case().dim(64).lens(300, 300).heads(4, 2);
  const Tensors in = to_device(make_inputs(c, 3), 0);
  const Results own = run(c, in, kCuda, AttentionAlgorithm::tiled, 0);

  AttentionBackwardArgs b;
  b.q = in.q.view(), b.k = in.k.view(), b.v = in.v.view(), b.causal = c.causal;
  b.o = own.o.view(), b.lse = own.lse.view(), b.d_o = in.d_o.view();
  Buffer dq = poisoned(c.dtype, in.q.shape(), kCuda, 0), dk = poisoned(c.dtype, in.k.shape(), kCuda, 0),
         dv = poisoned(c.dtype, in.v.shape(), kCuda, 0);
  b.dq = dq.view(), b.dk = dk.view(), b.dv = dv.view();
  b.tuning = flashgla::testing::test_attention_backward_tuning();
  const size_t bytes = attention_backward_workspace_bytes(b);
  ASSERT_GT(bytes, 0u);
  Buffer scratch(DType::f32, {int64_t((bytes + 3) / 4)}, kCuda);
  scratch.poison();  // the backward must initialize what it accumulates into
  b.workspace = scratch.view().data, b.workspace_bytes = bytes;
  attention_backward(b);
  flashgla::testing::synchronize(kCuda);
  EXPECT_LE(rel_rms_error(dq.values(), own.dq.values()), 1e-2);
  EXPECT_EQ(dk.values(), own.dk.values());  // dk, dv have no atomics
  EXPECT_EQ(dv.values(), own.dv.values());

  // Left without a workspace, the backward asks the caller's allocator once, for that many bytes.
  for (Buffer* out : {&dq, &dk, &dv}) out->poison();
  b.workspace = nullptr, b.workspace_bytes = 0;
  std::vector<size_t> asked;
  b.allocate_workspace = [&](size_t n) {
    asked.push_back(n);
    scratch = Buffer(DType::f32, {int64_t((n + 3) / 4)}, kCuda);
    scratch.poison();
    return scratch.view().data;
  };
  attention_backward(b);
  flashgla::testing::synchronize(kCuda);
  ASSERT_EQ(asked.size(), 1u);
  EXPECT_EQ(asked[0], bytes);
  EXPECT_LE(rel_rms_error(dq.values(), own.dq.values()), 1e-2);
  EXPECT_EQ(dk.values(), own.dk.values());
  EXPECT_EQ(dv.values(), own.dv.values());

  b.allocate_workspace = nullptr;
  b.workspace = scratch.view().data, b.workspace_bytes = bytes - 4;
  try {
    attention_backward(b);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "workspace");
  }
}

// Boundaries on the device are not validated by the API: nonsense values must
// still stay inside the tensors (compute-sanitizer memcheck watches this).
TEST_F(AttentionCudaApi, BadDeviceBoundariesStayInBounds) {
  const Case c = Case().dim(64).varlen({40, 40, 40}, {40, 40, 40});
  Tensors in = to_device(make_inputs(c, 5), 0);
  Buffer bad(DType::i32, {4});
  bad.set_values({-5, 100, 30, 1000000});
  in.cu_q = bad.to(kCuda), in.cu_k = bad.to(kCuda);
  EXPECT_NO_THROW(run(c, in, kCuda, AttentionAlgorithm::tiled, 0));
  EXPECT_NO_THROW(flashgla::testing::synchronize(kCuda));  // no fault left behind on the device
}

}  // namespace
