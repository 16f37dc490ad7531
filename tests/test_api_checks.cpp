// Bad input: every argument check raises flashgla::Error naming the argument.
// These run the checks only; each case starts from valid arguments and breaks one thing.
#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <string>
#include <vector>

#include "flashgla/flashgla.h"
#include "test_util.h"
#include "testing/buffer.h"

using namespace flashgla;
using flashgla::testing::Buffer;
using flashgla::testing::expect_error;

namespace {

// Valid GLA tensors for B=2, T=8, H=3, K=4, V=5.
struct GlaTensors {
  int64_t B = 2, T = 8, H = 3, K = 4, V = 5;
  Buffer q{DType::f32, {B, T, H, K}}, k{DType::f32, {B, T, H, K}}, v{DType::f32, {B, T, H, V}};
  Buffer g{DType::f32, {B, T, H, K}}, h0{DType::f32, {B, H, K, V}};
  Buffer o{DType::f32, {B, T, H, V}}, ht{DType::f32, {B, H, K, V}};

  GlaForwardArgs forward() const {
    GlaForwardArgs a;
    a.q = q.view(), a.k = k.view(), a.v = v.view(), a.g = g.view(), a.initial_state = h0.view();
    a.o = o.view(), a.final_state = ht.view();
    return a;
  }
};

// The forward's checks only (the workspace query checks and returns without computing).
void check_forward(const GlaForwardArgs& a) { gla_forward_workspace_bytes(a); }

TEST(ApiChecks, ValidGlaArgumentsPass) {
  GlaTensors t;
  EXPECT_NO_THROW(check_forward(t.forward()));
  auto a = t.forward();
  a.g = {};  // linear attention
  EXPECT_NO_THROW(check_forward(a));
}

TEST(ApiChecks, GlaShapes) {
  GlaTensors t;
  Buffer q3(DType::f32, {2, 8, 3});
  auto a = t.forward();
  a.q = q3.view();
  expect_error([&] { check_forward(a); }, ErrorKind::value, "q", "[B, T, H, K]");

  Buffer k_bad(DType::f32, {2, 8, 3, 6});
  a = t.forward();
  a.k = k_bad.view();
  expect_error([&] { check_forward(a); }, ErrorKind::value, "k", "got [2, 8, 3, 6]");

  Buffer v_bad(DType::f32, {2, 7, 3, 5});
  a = t.forward();
  a.v = v_bad.view();
  expect_error([&] { check_forward(a); }, ErrorKind::value, "v", "[B, T, H, V]");

  Buffer g_bad(DType::f32, {2, 8, 3, 5});
  a = t.forward();
  a.g = g_bad.view();
  expect_error([&] { check_forward(a); }, ErrorKind::value, "g", "[B, T, H, K]");

  Buffer g_2d(DType::f32, {2, 8});
  a = t.forward();
  a.g = g_2d.view();
  expect_error([&] { check_forward(a); }, ErrorKind::value, "g", "scalar gate");

  Buffer h0_bad(DType::f32, {2, 3, 5, 4});  // K and V swapped
  a = t.forward();
  a.initial_state = h0_bad.view();
  expect_error([&] { check_forward(a); }, ErrorKind::value, "initial_state", "[N, H, K, V]");

  Buffer o_bad(DType::f32, {2, 8, 3, 4});
  a = t.forward();
  a.o = o_bad.view();
  expect_error([&] { check_forward(a); }, ErrorKind::value, "o", "[B, T, H, V]");

  a = t.forward();
  a.o = {};
  expect_error([&] { check_forward(a); }, ErrorKind::value, "o", "is required");

  Buffer ht_bad(DType::f32, {1, 3, 4, 5});
  a = t.forward();
  a.final_state = ht_bad.view();
  expect_error([&] { check_forward(a); }, ErrorKind::value, "final_state", "[N, H, K, V]");
}

TEST(ApiChecks, GlaDtypes) {
  GlaTensors t;
  Buffer k16(DType::bf16, {2, 8, 3, 4});
  auto a = t.forward();
  a.k = k16.view();
  expect_error([&] { check_forward(a); }, ErrorKind::type, "k", "expected dtype float32, got bfloat16");

  Buffer qi(DType::i32, {2, 8, 3, 4});
  a = t.forward();
  a.q = qi.view();
  expect_error([&] { check_forward(a); }, ErrorKind::type, "q", "float dtype");

  Buffer h0_16(DType::f16, {2, 3, 4, 5});
  a = t.forward();
  a.initial_state = h0_16.view();
  expect_error([&] { check_forward(a); }, ErrorKind::type, "initial_state", "float32");

  Buffer o16(DType::f16, {2, 8, 3, 5});
  a = t.forward();
  a.o = o16.view();
  expect_error([&] { check_forward(a); }, ErrorKind::type, "o", "float32");

  // The gate may have its own float dtype.
  Buffer g16(DType::bf16, {2, 8, 3, 4});
  a = t.forward();
  a.g = g16.view();
  EXPECT_NO_THROW(check_forward(a));
}

TEST(ApiChecks, GlaDevices) {
  GlaTensors t;
  TensorView on_gpu = t.v.view();
  on_gpu.device = {DeviceType::cuda, 0};
  auto a = t.forward();
  a.v = on_gpu;
  expect_error([&] { check_forward(a); }, ErrorKind::value, "v", "expected device cpu");

  TensorView h0_gpu = t.h0.view();
  h0_gpu.device = {DeviceType::cuda, 1};
  a = t.forward();
  a.initial_state = h0_gpu;
  expect_error([&] { check_forward(a); }, ErrorKind::value, "initial_state", "got cuda:1");
}

TEST(ApiChecks, GlaStrides) {
  GlaTensors t;
  TensorView neg = t.q.view();
  neg.stride[1] = -neg.stride[1];
  auto a = t.forward();
  a.q = neg;
  expect_error([&] { check_forward(a); }, ErrorKind::value, "q", "negative strides");

  // Inputs may broadcast (stride 0); outputs may not overlap.
  TensorView broadcast_k = t.k.view();
  broadcast_k.stride[0] = 0;
  a = t.forward();
  a.k = broadcast_k;
  EXPECT_NO_THROW(check_forward(a));

  TensorView overlapping_o = t.o.view();
  overlapping_o.stride[1] = 1;  // rows of consecutive tokens overlap
  a = t.forward();
  a.o = overlapping_o;
  expect_error([&] { check_forward(a); }, ErrorKind::value, "o", "overlap");

  // A padded (non-contiguous) output is fine.
  Buffer o_padded(DType::f32, {2, 8, 3, 5}, {}, 3);
  a = t.forward();
  a.o = o_padded.view();
  EXPECT_NO_THROW(check_forward(a));

  TensorView null_q = t.q.view();
  null_q.data = nullptr;
  a = t.forward();
  a.q = null_q;
  expect_error([&] { check_forward(a); }, ErrorKind::value, "q", "null");
}

// Varlen: B = 1, T = 10 tokens in sequences given by cu_seqlens.
struct VarlenTensors {
  Buffer q{DType::f32, {1, 10, 2, 4}}, k{DType::f32, {1, 10, 2, 4}}, v{DType::f32, {1, 10, 2, 4}};
  Buffer o{DType::f32, {1, 10, 2, 4}};
  Buffer cu{DType::i32, {4}};
  VarlenTensors() { cu.set_values({0, 3, 3, 10}); }
  GlaForwardArgs forward() const {
    GlaForwardArgs a;
    a.q = q.view(), a.k = k.view(), a.v = v.view(), a.o = o.view(), a.cu_seqlens = cu.view();
    return a;
  }
};

TEST(ApiChecks, CuSeqlens) {
  VarlenTensors t;
  EXPECT_NO_THROW(check_forward(t.forward()));

  auto with_values = [&](std::vector<double> values, DType dtype = DType::i32) {
    Buffer cu(dtype, {int64_t(values.size())});
    cu.set_values(values);
    auto a = t.forward();
    a.cu_seqlens = cu.view();
    check_forward(a);
  };
  EXPECT_NO_THROW(with_values({0, 10}, DType::i64));
  expect_error([&] { with_values({1, 3, 10}); }, ErrorKind::value, "cu_seqlens", "start at 0");
  expect_error([&] { with_values({0, 5, 3, 10}); }, ErrorKind::value, "cu_seqlens", "non-decreasing");
  expect_error([&] { with_values({0, 3, 9}); }, ErrorKind::value, "cu_seqlens", "end at the total number of tokens 10");
  expect_error([&] { with_values({0}); }, ErrorKind::value, "cu_seqlens", "at least 2");
  expect_error([&] { with_values({0, 4.0, 10}, DType::f32); }, ErrorKind::type, "cu_seqlens", "int32 or int64");

  // B must be 1 with cu_seqlens.
  GlaTensors batched;
  Buffer cu(DType::i64, {3});
  cu.set_values({0, 4, 8});
  auto a = batched.forward();
  a.initial_state = {}, a.final_state = {};
  a.cu_seqlens = cu.view();
  expect_error([&] { check_forward(a); }, ErrorKind::value, "cu_seqlens", "B == 1");

  // The initial state has one entry per sequence (N = 3 here).
  Buffer h0(DType::f32, {1, 2, 4, 4});
  a = t.forward();
  a.initial_state = h0.view();
  expect_error([&] { check_forward(a); }, ErrorKind::value, "initial_state", "[3, 2, 4, 4]");

  // A host copy must agree with the device tensor's length and be valid itself.
  Buffer host(DType::i64, {3});
  host.set_values({0, 3, 10});
  a = t.forward();
  a.cu_seqlens_host = host.view();
  expect_error([&] { check_forward(a); }, ErrorKind::value, "cu_seqlens_host", "shape");
  a = t.forward();
  a.cu_seqlens = {};
  a.cu_seqlens_host = host.view();
  expect_error([&] { check_forward(a); }, ErrorKind::value, "cu_seqlens_host", "without cu_seqlens");
}

// Issue 14: a host copy that contradicts cu_seqlens, both on the CPU, is an error (both valid on their
// own: the same length, 0 first, non-decreasing, T last). Random interior boundaries, so the index named
// is not a fixed one.
TEST(ApiChecks, CuSeqlensHostContradictsCuSeqlens) {
  VarlenTensors t;  // cu_seqlens = {0, 3, 3, 10}, int32
  std::mt19937_64 rng(std::random_device{}());
  const int64_t first = std::uniform_int_distribution<int64_t>(4, 10)(rng);  // differs from 3
  const int64_t second = std::uniform_int_distribution<int64_t>(first, 10)(rng);
  Buffer host(DType::i64, {4});
  host.set_values({0, double(first), double(second), 10});
  auto a = t.forward();
  a.cu_seqlens_host = host.view();
  expect_error([&] { check_forward(a); }, ErrorKind::value, "cu_seqlens_host",
               "differs at index 1: " + std::to_string(first) + " vs 3");
  // An exact copy (another dtype is fine) passes.
  Buffer copy(DType::i64, {4});
  copy.set_values({0, 3, 3, 10});
  a.cu_seqlens_host = copy.view();
  EXPECT_NO_THROW(check_forward(a));
}

// Issue 14: inputs without their batch dimension ([T, H, K], as some other libraries take) get a message
// that names q and says the batch dimension is missing, whatever the gate looks like.
TEST(ApiChecks, BatchDimensionMissing) {
  Buffer q(DType::f32, {8, 3, 4}), k(DType::f32, {8, 3, 4}), v(DType::f32, {8, 3, 5}), g(DType::f32, {8, 3, 4});
  Buffer o(DType::f32, {8, 3, 5});
  GlaForwardArgs a;
  a.q = q.view(), a.k = k.view(), a.v = v.view(), a.g = g.view(), a.o = o.view();
  expect_error([&] { check_forward(a); }, ErrorKind::value, "q", "batch dimension B missing");
}

TEST(ApiChecks, GlaOptions) {
  GlaTensors t;
  auto a = t.forward();
  a.reverse = true;
  expect_error([&] { check_forward(a); }, ErrorKind::value, "reverse", "recurrent");
  a.algorithm = GlaAlgorithm::recurrent;
  EXPECT_NO_THROW(check_forward(a));
  a = t.forward();
  a.scale = std::nan("");
  expect_error([&] { check_forward(a); }, ErrorKind::value, "scale", "finite");
}

TEST(ApiChecks, GlaBackward) {
  GlaTensors t;
  Buffer d_o(DType::f32, {2, 8, 3, 5}), dq(DType::f32, {2, 8, 3, 4}), dk(DType::f32, {2, 8, 3, 4});
  Buffer dv(DType::f32, {2, 8, 3, 5}), dg(DType::f32, {2, 8, 3, 4}), dh0(DType::f32, {2, 3, 4, 5});
  auto valid = [&] {
    GlaBackwardArgs a;
    a.q = t.q.view(), a.k = t.k.view(), a.v = t.v.view(), a.g = t.g.view(), a.initial_state = t.h0.view();
    a.d_o = d_o.view(), a.d_final_state = t.ht.view();
    a.dq = dq.view(), a.dk = dk.view(), a.dv = dv.view(), a.dg = dg.view(), a.d_initial_state = dh0.view();
    return a;
  };
  auto check = [](const GlaBackwardArgs& a) { gla_backward_workspace_bytes(a); };
  EXPECT_NO_THROW(check(valid()));

  auto a = valid();
  a.dg = {};
  expect_error([&] { check(a); }, ErrorKind::value, "dg", "required when g is given");
  a = valid();
  a.g = {};
  expect_error([&] { check(a); }, ErrorKind::value, "dg", "without g");
  Buffer dg16(DType::f16, {2, 8, 3, 4});
  a = valid();
  a.dg = dg16.view();
  expect_error([&] { check(a); }, ErrorKind::type, "dg", "float32 or that of g");
  a = valid();
  a.d_o = dq.view();
  expect_error([&] { check(a); }, ErrorKind::value, "d_o", "[B, T, H, V]");
  Buffer dht_bad(DType::f32, {2, 3, 4, 4});
  a = valid();
  a.d_final_state = dht_bad.view();
  expect_error([&] { check(a); }, ErrorKind::value, "d_final_state", "[N, H, K, V]");
  a = valid();
  a.dv = dq.view();
  expect_error([&] { check(a); }, ErrorKind::value, "dv", "[B, T, H, V]");
}

TEST(ApiChecks, Decode) {
  Buffer q(DType::f32, {4, 2, 8}), k(DType::f32, {4, 2, 8}), v(DType::f32, {4, 2, 6}), g(DType::f32, {4, 2});
  Buffer state(DType::f32, {4, 2, 8, 6}), o(DType::f32, {4, 2, 6});
  auto valid = [&] {
    GlaDecodeArgs a;
    a.q = q.view(), a.k = k.view(), a.v = v.view(), a.g = g.view(), a.state = state.view(), a.o = o.view();
    return a;
  };
  // gla_decode runs the CPU backend after its checks; only invalid calls are made here.
  auto a = valid();
  a.state = {};
  expect_error([&] { gla_decode(a); }, ErrorKind::value, "state", "is required");
  Buffer state16(DType::bf16, {4, 2, 8, 6});
  a = valid();
  a.state = state16.view();
  expect_error([&] { gla_decode(a); }, ErrorKind::type, "state", "float32");
  Buffer q4(DType::f32, {4, 1, 2, 8});
  a = valid();
  a.q = q4.view();  // a token dimension on q only
  expect_error([&] { gla_decode(a); }, ErrorKind::value, "k", "[N, T, H, K]");
  Buffer q2(DType::f32, {4, 16});
  a = valid();
  a.q = q2.view();
  expect_error([&] { gla_decode(a); }, ErrorKind::value, "q", "[N, H, K]");
  Buffer g_bad(DType::f32, {4, 3});
  a = valid();
  a.g = g_bad.view();
  expect_error([&] { gla_decode(a); }, ErrorKind::value, "g", "[N, H]");
  a = valid();
  a.o = v.view();
  a.v = o.view();
  a.o.stride[0] = 0;
  expect_error([&] { gla_decode(a); }, ErrorKind::value, "o", "overlap");
}

// One-token calls: the messages give the caller's [N, H, ...] shapes, not the internal [N, 1, H, ...] ones.
TEST(ApiChecks, DecodeOneTokenShapesInCallersLayout) {
  const int64_t N = 3, H = 2, K = 16, V = 6;
  Buffer q(DType::f32, {N, H, K}), k(DType::f32, {N, H, K}), v(DType::f32, {N, H, V}), g(DType::f32, {N, H, K});
  Buffer state(DType::f32, {N, H, K, V}), o(DType::f32, {N, H, V});
  auto valid = [&] {
    GlaDecodeArgs a;
    a.q = q.view(), a.k = k.view(), a.v = v.view(), a.g = g.view(), a.state = state.view(), a.o = o.view();
    return a;
  };
  Buffer g17(DType::f32, {N, H, 17});
  auto a = valid();
  a.g = g17.view();
  expect_error([&] { gla_decode(a); }, ErrorKind::value, "g", "expected shape [N, H, K] = [3, 2, 16], got [3, 2, 17]");
  Buffer g_scalar(DType::f32, {N, 4});
  a = valid();
  a.g = g_scalar.view();
  expect_error([&] { gla_decode(a); }, ErrorKind::value, "g", "expected shape [N, H] = [3, 2], got [3, 4]");
  Buffer k8(DType::f32, {N, H, 8});
  a = valid();
  a.k = k8.view();
  expect_error([&] { gla_decode(a); }, ErrorKind::value, "k", "expected shape [N, H, K] = [3, 2, 16], got [3, 2, 8]");
  Buffer v_bad(DType::f32, {N, 1, V});
  a = valid();
  a.v = v_bad.view();
  expect_error([&] { gla_decode(a); }, ErrorKind::value, "v", "expected shape [N, H, V] = [3, 2, 6], got [3, 1, 6]");
  Buffer o_bad(DType::f32, {N, H, 5});
  a = valid();
  a.o = o_bad.view();
  expect_error([&] { gla_decode(a); }, ErrorKind::value, "o", "expected shape [N, H, V] = [3, 2, 6], got [3, 2, 5]");
}

TEST(ApiChecks, DecodeTokensAndPool) {
  const int64_t N = 3, T = 2, H = 2, K = 8, V = 6, P = 5;
  Buffer q(DType::f32, {N, T, H, K}), k(DType::f32, {N, T, H, K}), v(DType::f32, {N, T, H, V});
  Buffer pool(DType::f32, {P, H, K, V}), o(DType::f32, {N, T, H, V}), states(DType::f32, {N * T, H, K, V});
  Buffer idx(DType::i32, {N});
  auto set = [&](std::vector<int32_t> rows) {
    for (int64_t i = 0; i < N; ++i) static_cast<int32_t*>(idx.view().data)[i] = rows[size_t(i)];
  };
  set({4, -1, 0});
  auto valid = [&] {
    GlaDecodeArgs a;
    a.q = q.view(), a.k = k.view(), a.v = v.view(), a.state = pool.view(), a.o = o.view();
    a.state_indices = idx.view(), a.token_states = states.view();
    return a;
  };
  auto a = valid();
  Buffer q17(DType::f32, {N, 17, H, K});
  a.q = q17.view();
  expect_error([&] { gla_decode(a); }, ErrorKind::value, "q", "1 to 16 tokens");
  Buffer idx64(DType::i64, {N});
  a = valid();
  a.state_indices = idx64.view();
  expect_error([&] { gla_decode(a); }, ErrorKind::type, "state_indices", "int32");
  Buffer idx_long(DType::i32, {N + 1});
  a = valid();
  a.state_indices = idx_long.view();
  expect_error([&] { gla_decode(a); }, ErrorKind::value, "state_indices", "[N]");
  a = valid();
  a.state_indices = {};  // then the state must have N rows
  expect_error([&] { gla_decode(a); }, ErrorKind::value, "state", "[N, H, K, V]");
  set({4, 5, 0});
  expect_error([&] { gla_decode(valid()); }, ErrorKind::value, "state_indices", "< P = 5");
  set({2, -1, 2});
  expect_error([&] { gla_decode(valid()); }, ErrorKind::value, "state_indices", "distinct");
  set({2, -1, -7});  // several padded slots are fine; only the shape of token_states is wrong here
  Buffer states_bad(DType::f32, {N, H, K, V});
  a = valid();
  a.token_states = states_bad.view();
  expect_error([&] { gla_decode(a); }, ErrorKind::value, "token_states", "[N*T, H, K, V]");
}

// Attention: B=2, Tq=6, Tk=7, Hq=4, Hkv=2, D=8, Dv=5.
struct AttentionTensors {
  Buffer q{DType::f32, {2, 6, 4, 8}}, k{DType::f32, {2, 7, 2, 8}}, v{DType::f32, {2, 7, 2, 5}};
  Buffer o{DType::f32, {2, 6, 4, 5}}, lse{DType::f32, {2, 4, 6}};
  AttentionForwardArgs forward() const {
    AttentionForwardArgs a;
    a.q = q.view(), a.k = k.view(), a.v = v.view(), a.o = o.view(), a.lse = lse.view();
    return a;
  }
};

void check_attention(const AttentionForwardArgs& a) { attention_forward_workspace_bytes(a); }

TEST(ApiChecks, Attention) {
  AttentionTensors t;
  EXPECT_NO_THROW(check_attention(t.forward()));

  Buffer k3(DType::f32, {2, 7, 3, 8});
  auto a = t.forward();
  a.k = k3.view();
  expect_error([&] { check_attention(a); }, ErrorKind::value, "k", "must divide");
  Buffer k_bad(DType::f32, {2, 7, 2, 9});
  a = t.forward();
  a.k = k_bad.view();
  expect_error([&] { check_attention(a); }, ErrorKind::value, "k", "[B, Tk, Hkv, D]");
  Buffer lse_bad(DType::f32, {2, 6, 4});
  a = t.forward();
  a.lse = lse_bad.view();
  expect_error([&] { check_attention(a); }, ErrorKind::value, "lse", "[B, Hq, Tq]");
  Buffer lse16(DType::bf16, {2, 4, 6});
  a = t.forward();
  a.lse = lse16.view();
  expect_error([&] { check_attention(a); }, ErrorKind::type, "lse", "float32");
  Buffer cu(DType::i32, {2});
  cu.set_values({0, 6});
  a = t.forward();
  a.cu_seqlens_q = cu.view();
  expect_error([&] { check_attention(a); }, ErrorKind::value, "cu_seqlens_k", "together");
  a.cu_seqlens_k = cu.view();
  expect_error([&] { check_attention(a); }, ErrorKind::value, "cu_seqlens_q", "B == 1");

  TensorView q_gpu = t.q.view();
  q_gpu.device = {DeviceType::cuda, 0};
  TensorView k_gpu = t.k.view(), v_gpu = t.v.view(), o_gpu = t.o.view(), lse_gpu = t.lse.view();
  k_gpu.device = v_gpu.device = o_gpu.device = lse_gpu.device = q_gpu.device;
  a = t.forward();
  a.q = q_gpu, a.k = k_gpu, a.v = v_gpu, a.o = o_gpu, a.lse = lse_gpu;
  a.algorithm = AttentionAlgorithm::naive;
  expect_error([&] { check_attention(a); }, ErrorKind::unsupported, "algorithm", "CPU reference");
}

TEST(ApiChecks, AttentionBackward) {
  AttentionTensors t;
  Buffer d_o(DType::f32, {2, 6, 4, 5}), dq(DType::f32, {2, 6, 4, 8}), dk(DType::f32, {2, 7, 2, 8});
  Buffer dv(DType::f32, {2, 7, 2, 5});
  AttentionBackwardArgs a;
  a.q = t.q.view(), a.k = t.k.view(), a.v = t.v.view(), a.o = t.o.view(), a.lse = t.lse.view();
  a.d_o = d_o.view(), a.dq = dq.view(), a.dk = dk.view(), a.dv = dv.view();
  EXPECT_NO_THROW(attention_backward_workspace_bytes(a));
  a.dk = dq.view();
  expect_error([&] { attention_backward_workspace_bytes(a); }, ErrorKind::value, "dk", "[B, Tk, Hkv, D]");
  a.dk = dk.view();
  a.lse = {};
  expect_error([&] { attention_backward_workspace_bytes(a); }, ErrorKind::value, "lse", "is required");
}

#ifndef FLASHGLA_WITH_CUDA
TEST(ApiChecks, CudaTensorsWithoutCudaBuild) {
  GlaTensors t;
  auto a = t.forward();
  for (TensorView* view : {&a.q, &a.k, &a.v, &a.g, &a.initial_state, &a.o, &a.final_state})
    view->device = {DeviceType::cuda, 0};
  expect_error([&] { gla_forward(a); }, ErrorKind::unsupported, "q", "built without CUDA");
}
#endif

}  // namespace
