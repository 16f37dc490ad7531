// The tensors of every op the command runs: random inputs (the one place they
// are made), NaN-poisoned outputs, and the argument structs that tie them to
// the library's calls. Shared by check and bench.
#pragma once

#include <random>

#include "cli/options.h"
#include "flashgla/flashgla.h"
#include "testing/buffer.h"

namespace flashgla::cli {

using testing::Buffer;

// Inputs of GLA forward and backward. Absent buffers are left out of the call.
struct GlaInputs {
  Buffer q, k, v;             // [B,T,H,K], [B,T,H,K], [B,T,H,V]
  Buffer g;                   // [B,T,H,K] (vector), [B,T,H] (scalar) or absent
  Buffer h0, dht;             // [N,H,K,V] f32, with --h0 only
  Buffer d_o;                 // [B,T,H,V], the gradient fed to the backward
  Buffer cu_seqlens;          // [N+1] i32 on the device, with --varlen only
  Buffer cu_seqlens_host;     // the same on the CPU

  // The same values on `device`, the float tensors cast to `dtype` (states stay f32).
  GlaInputs to(Device device, DType dtype) const;
};

// q, k, v, do ~ N(0,1); g = logsigmoid(N(0,1))/16; h0, dht ~ N(0,1); all
// rounded to `dtype` on the CPU.
GlaInputs make_gla_inputs(const Shape& shape, Gate gate, bool initial_state, DType dtype, std::mt19937_64& rng);

struct GlaOutputs {
  Buffer o, ht;
};
struct GlaGrads {
  Buffer dq, dk, dv, dg, dh0;  // dg absent without a gate; dh0 always asked for
};

GlaOutputs make_gla_outputs(const GlaInputs& in);  // poisoned with NaN
GlaGrads make_gla_grads(const GlaInputs& in);      // poisoned with NaN
GlaForwardArgs gla_forward_args(const GlaInputs& in, const GlaOutputs& out, GlaAlgorithm algorithm,
                                const Tuning& tuning);
GlaBackwardArgs gla_backward_args(const GlaInputs& in, const GlaGrads& out, GlaAlgorithm algorithm,
                                  const Tuning& tuning);

// Token t of a [N,T,...] tensor as a strided [N,...] view (absent stays absent).
TensorView token_view(const Buffer& x, int64_t t);

// Inputs of attention. q [B,T,H,K], k [B,T,Hkv,K], v [B,T,Hkv,V], do [B,T,H,V];
// queries and keys share T and the cu_seqlens.
struct AttentionInputs {
  Buffer q, k, v, d_o;
  Buffer cu_seqlens;  // [N+1] i32, with --varlen only

  AttentionInputs to(Device device, DType dtype) const;
};

AttentionInputs make_attention_inputs(const Shape& shape, DType dtype, std::mt19937_64& rng);

struct AttentionOutputs {
  Buffer o, lse;
};
struct AttentionGrads {
  Buffer dq, dk, dv;
};

AttentionOutputs make_attention_outputs(const AttentionInputs& in);  // poisoned
AttentionGrads make_attention_grads(const AttentionInputs& in);      // poisoned
AttentionForwardArgs attention_forward_args(const AttentionInputs& in, const AttentionOutputs& out, bool causal,
                                            AttentionAlgorithm algorithm, const Tuning& tuning);
// `fwd` is the forward's o and lse the backward reads.
AttentionBackwardArgs attention_backward_args(const AttentionInputs& in, const AttentionOutputs& fwd,
                                              const AttentionGrads& out, bool causal, AttentionAlgorithm algorithm,
                                              const Tuning& tuning);

// Device scratch of the size the library asks for (none on the CPU), attached
// to `args`; keep the returned buffer alive while `args` is used.
Buffer attach_workspace(GlaForwardArgs& args);
Buffer attach_workspace(GlaBackwardArgs& args);
Buffer attach_workspace(AttentionForwardArgs& args);
Buffer attach_workspace(AttentionBackwardArgs& args);

}  // namespace flashgla::cli
