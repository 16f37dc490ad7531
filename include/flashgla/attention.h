// Softmax attention computed tile by tile with the online softmax
// (FlashAttention), forward and backward.
//
// q [B,Tq,Hq,D], k [B,Tk,Hkv,D], v [B,Tk,Hkv,Dv]; Hkv divides Hq (grouped
// KV heads: query head h reads KV head h / (Hq/Hkv)). Causal masking is
// aligned to the bottom right as in FlashAttention ≥ 2.1: query i sees keys
// j ≤ i + Tk − Tq; a query that sees no key gets o = 0 and lse = −inf.
// Varlen: B == 1 with cu_seqlens_q and cu_seqlens_k of length N+1.
#pragma once

#include <optional>

#include "flashgla/tensor.h"

namespace flashgla {

enum class AttentionAlgorithm {
  tiled,  // FlashAttention: online softmax over key tiles
  naive,  // CPU only: full score matrix in fp64 (the reference)
};

struct AttentionForwardArgs {
  TensorView q, k, v;                    // f64/f32/bf16/f16, one dtype
  TensorView cu_seqlens_q, cu_seqlens_k; // optional, both or neither: [N+1] i32/i64
  bool causal = true;
  std::optional<double> scale;           // default D^-1/2
  AttentionAlgorithm algorithm = AttentionAlgorithm::tiled;

  TensorView o;    // out: [B,Tq,Hq,Dv], dtype of q
  TensorView lse;  // out: [B,Hq,Tq] f32, natural-log sum of exp(scale·q·k) per query
  void* stream = nullptr;
  void* workspace = nullptr;  // as in GlaForwardArgs (flashgla/gla.h)
  size_t workspace_bytes = 0;
};

struct AttentionBackwardArgs {
  TensorView q, k, v, cu_seqlens_q, cu_seqlens_k;
  bool causal = true;
  std::optional<double> scale;
  AttentionAlgorithm algorithm = AttentionAlgorithm::tiled;
  TensorView o;    // the forward's output
  TensorView lse;  // the forward's lse
  TensorView d_o;  // [B,Tq,Hq,Dv], dtype of q

  TensorView dq, dk, dv;  // out: shapes and dtype of q, k, v
  void* stream = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

void attention_forward(const AttentionForwardArgs& args);
void attention_backward(const AttentionBackwardArgs& args);
size_t attention_forward_workspace_bytes(const AttentionForwardArgs& args);  // checks args; 0 on the CPU
size_t attention_backward_workspace_bytes(const AttentionBackwardArgs& args);

}  // namespace flashgla
