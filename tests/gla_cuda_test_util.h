// Shared by the CUDA GLA forward and backward tests (test_gla_cuda.cpp,
// test_gla_cuda_split.cpp, test_gla_backward_cuda.cpp): the GPU, moving a
// case's inputs onto it, poisoned outputs, a caller-owned workspace, a case's
// description, and one forward call and its
// reference. The cases and the CPU reference are in gla_test_util.h.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "flashgla/flashgla.h"
#include "gla_test_util.h"
#include "tuning_test_util.h"

namespace flashgla::testing::gla_test {

constexpr GlaAlgorithm kChunked = GlaAlgorithm::chunked;
constexpr GlaAlgorithm kRecurrent = GlaAlgorithm::recurrent;

#define SKIP_WITHOUT_GPU() \
  if (!flashgla::cuda_available()) GTEST_SKIP() << "no GPU"

inline Device gpu() { return Device{DeviceType::cuda, 0}; }

// dtype, shape and gate of a case; each test file adds the fields it varies.
inline std::string describe_shape_and_gate(const Case& c) {
  std::string s = std::string(dtype_name(c.dtype)) + " B" + std::to_string(c.B) + " T" + std::to_string(c.T) + " H" +
                  std::to_string(c.H) + " K" + std::to_string(c.K) + " V" + std::to_string(c.V);
  s += c.gate == Gate::none ? " no-gate" : c.gate == Gate::scalar ? " scalar-gate" : " vector-gate";
  s += c.gate_values == GateValues::typical ? "" : c.gate_values == GateValues::near_zero ? " near-0" : " near-20";
  s += std::string(" g:") + dtype_name(c.gate_dtype);
  return s;
}

// A forward case: dtype, shape, gate, states, strides, varlen.
inline std::string describe_forward_case(const Case& c) {
  std::string s = describe_shape_and_gate(c);
  s += c.h0 ? " h0" : "";
  s += c.final_state ? " ht" : "";
  s += c.row_padding ? " strided+" + std::to_string(c.row_padding) : "";
  s += c.cu_seqlens.empty() ? "" : " varlen";
  return s;
}

// With the tuning switch `name` set to the unknown `value`, `call` must throw a flashgla::Error naming the
// switch (a typo must not silently run the default path); the caller's setting is restored afterwards.
template <class F>
void expect_unknown_switch_error(const char* name, const char* value, F&& call) {
  const ScopedSetting setting(name, value);
  try {
    call();
    ADD_FAILURE() << name << "=" << value << ": expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), name) << e.what();
  }
}

inline Buffer on(const Buffer& b, Device device, int64_t padding) {
  return b.defined() ? b.to(device, padding) : Buffer();
}

// Every input of the case on `device`, rows padded as the case says (the
// forward tests leave d_o and dht unused).
inline Inputs to_device(const Case& c, const Inputs& in, Device device) {
  Inputs out;
  out.q = on(in.q, device, c.row_padding), out.k = on(in.k, device, c.row_padding);
  out.v = on(in.v, device, c.row_padding), out.d_o = on(in.d_o, device, c.row_padding);
  out.g = on(in.g, device, c.row_padding);
  out.h0 = on(in.h0, device, c.row_padding), out.dht = on(in.dht, device, c.row_padding);
  out.cu_seqlens = on(in.cu_seqlens, device, 0);
  return out;
}

inline Buffer poisoned_on(Device device, DType dtype, std::vector<int64_t> shape, int64_t padding) {
  Buffer b(dtype, std::move(shape), device, padding);
  b.poison();
  return b;
}

// Gives `a` a workspace of `bytes` on `device` (none when 0); the returned
// Buffer owns it and must outlive the call.
template <class Args>
Buffer give_workspace(Args& a, size_t bytes, Device device) {
  Buffer workspace;
  if (bytes > 0) {
    workspace = Buffer(DType::f32, {int64_t((bytes + 3) / 4)}, device);
    a.workspace = workspace.view().data;
    a.workspace_bytes = bytes;
  }
  return workspace;
}


// How a forward test calls the library (test_gla_cuda.cpp, test_gla_cuda_split.cpp).
struct ForwardCall {
  GlaAlgorithm algorithm = kChunked;
  bool reverse = false;
  void* stream = nullptr;
  bool caller_workspace = false;
  const Buffer* cu_seqlens_host = nullptr;
};

// One forward call on the inputs' device, outputs poisoned first; `c`'s dtype names the output dtype (f64 for
// the reference).
inline Outputs run_forward(const Case& c, const Inputs& in, const ForwardCall& call) {
  const Device device = in.q.device();
  Buffer o = poisoned_on(device, c.dtype, {c.B, c.T, c.H, c.V}, c.row_padding);
  Buffer ht;
  if (c.final_state) ht = poisoned_on(device, DType::f32, {c.num_seqs(), c.H, c.K, c.V}, c.row_padding);
  GlaForwardArgs a;
  a.q = in.q.view(), a.k = in.k.view(), a.v = in.v.view(), a.g = in.g.view();
  a.initial_state = in.h0.view(), a.cu_seqlens = in.cu_seqlens.view();
  if (call.cu_seqlens_host) a.cu_seqlens_host = call.cu_seqlens_host->view();
  a.algorithm = call.algorithm, a.reverse = call.reverse;
  a.o = o.view(), a.final_state = ht.view();
  a.stream = call.stream;
  a.tuning = test_gla_tuning();
  Buffer workspace;
  if (call.caller_workspace) workspace = give_workspace(a, gla_forward_workspace_bytes(a), device);
  gla_forward(a);
  synchronize(device);
  return {o.values(), ht.values()};
}

// The forward's fp64 recurrent reference on the CPU, same values.
inline Outputs forward_reference(const Case& c, const Inputs& in, bool reverse = false) {
  Case r = f64_case(c);
  r.row_padding = 0;
  ForwardCall call;
  call.algorithm = kRecurrent;
  call.reverse = reverse;
  return run_forward(r, as_f64(in), call);
}

}  // namespace flashgla::testing::gla_test
