// The normaliser of linear attention (FLA 0.6's chunk_linear_attn(normalize=True)):
// per sequence and head, with the running key sum z (from z_init, or zero),
//     z_t = z_init + Σ_{s≤t} k_s          (reverse: Σ_{s≥t})
//     o_t = o_raw_t / (scale · q_t·z_t + 1e-10)
// where o_raw is the unnormalised output of gla_forward without a gate (same
// q, k, scale). z_final is z after the last token (after the first with
// reverse; z_init for an empty sequence), the state a next call continues from.
// Sums accumulate in fp32 on CUDA and in fp64 on the CPU (the reference). CUDA runs
// it as a parallel scan over chunks of 64 tokens, with fp32 workspace for the chunk
// sums (the *_workspace_bytes functions; 0 on the CPU).
//
// The backward gives the normaliser's part of dq and dk (add gla_backward's,
// called with d_o_raw as its d_o), the gradient of o_raw and of z_init.
#pragma once

#include <optional>

#include "flashgla/tensor.h"

namespace flashgla {

struct GlaNormalizeArgs {
  TensorView o_raw;            // [B,T,H,V] f64/f32/bf16/f16
  TensorView q, k;             // [B,T,H,K], dtype of o_raw
  TensorView z_init;           // optional: [N,H,K], any float dtype
  TensorView cu_seqlens;       // optional: as in GlaForwardArgs
  TensorView cu_seqlens_host;  // optional: as in GlaForwardArgs
  std::optional<double> scale;  // default K^-1/2
  bool reverse = false;

  TensorView o;                // out: [B,T,H,V], dtype of q (may be o_raw itself)
  TensorView z_final;          // optional out: [N,H,K] f32 (or f64 for f64 inputs)

  void* stream = nullptr;      // cudaStream_t for CUDA tensors
  void* workspace = nullptr;   // at least gla_normalize_forward_workspace_bytes(args); left null,
  size_t workspace_bytes = 0;  // it comes from allocate_workspace, else stream-ordered
  WorkspaceAllocator allocate_workspace;  // used when workspace is null (flashgla/tensor.h)
};

struct GlaNormalizeBackwardArgs {
  TensorView o_raw, q, k, z_init, cu_seqlens, cu_seqlens_host;  // as in the forward
  std::optional<double> scale;
  bool reverse = false;
  // o_raw holds the normalised output o instead (gla_forward with normalize writes no o_raw): the pass
  // recovers o_raw = o · den from the den it recomputes.
  bool o_raw_is_output = false;
  TensorView d_o;              // [B,T,H,V], dtype of q: gradient of o
  TensorView d_z_final;        // optional: [N,H,K] any float dtype, gradient of z_final

  TensorView d_o_raw;          // out: [B,T,H,V], dtype of q
  TensorView dq, dk;           // out: [B,T,H,K], dtype of q: the normaliser's part of the gradients
  TensorView d_z_init;         // optional out: [N,H,K] f32 (or f64 for f64 inputs)

  void* stream = nullptr;
  void* workspace = nullptr;   // at least gla_normalize_backward_workspace_bytes(args); left null,
  size_t workspace_bytes = 0;  // it comes from allocate_workspace, else stream-ordered
  WorkspaceAllocator allocate_workspace;  // used when workspace is null (flashgla/tensor.h)
};

void gla_normalize_forward(const GlaNormalizeArgs& args);
size_t gla_normalize_forward_workspace_bytes(const GlaNormalizeArgs& args);  // checks args; 0 on the CPU
void gla_normalize_backward(const GlaNormalizeBackwardArgs& args);
size_t gla_normalize_backward_workspace_bytes(const GlaNormalizeBackwardArgs& args);  // checks args; 0 on the CPU

}  // namespace flashgla
