// What a backend implements for FLA 0.6's options on top of the GLA kernels:
// the per-head decay g_gamma (gate materialisation and its gradient's reduction,
// for the CPU and the recurrent kernels: the CUDA chunked kernels read g_gamma
// where they read the gate) and the linear-attention normaliser (flashgla/gla_normalize.h). Arguments
// arrive checked.
#pragma once

#include "core/problem.h"
#include "flashgla/gla.h"
#include "flashgla/gla_normalize.h"
#include "flashgla/tensor.h"

namespace flashgla {

// The normaliser of a gla_forward call with normalize: o in place (o_raw is o).
inline GlaNormalizeArgs normalize_args_of(const GlaForwardArgs& a) {
  GlaNormalizeArgs n;
  n.o_raw = a.o, n.q = a.q, n.k = a.k, n.z_init = a.z_init;
  n.cu_seqlens = a.cu_seqlens, n.cu_seqlens_host = a.cu_seqlens_host;
  n.scale = a.scale, n.reverse = a.reverse;
  n.o = a.o, n.z_final = a.z_final;
  n.stream = a.stream, n.allocate_workspace = a.allocate_workspace;
  return n;
}

// gate[b,t,h] = g[b,t,h] + g_gamma[h] (g_gamma alone without g), in fp32.
struct GammaGateArgs {
  TensorView g;        // optional: [B,T,H] any float dtype
  TensorView g_gamma;  // [H] any float dtype
  TensorView gate;     // out: [B,T,H] f32
  void* stream = nullptr;
};

// From the gradient of that fp32 gate: dg = d_gate (in dg's dtype) and
// d_g_gamma[h] = Σ_{b,t} d_gate[b,t,h] (accumulated in fp64 on the CPU, fp32 on CUDA).
// The CUDA chunked backward passes its per-chunk sums as d_gate [1, slots, H].
struct GammaGradArgs {
  TensorView d_gate;     // [B,T,H] f32
  TensorView dg;         // optional out: [B,T,H] any float dtype
  TensorView d_g_gamma;  // optional out: [H] any float dtype
  void* stream = nullptr;
};

}  // namespace flashgla

namespace flashgla::cpu {
void gla_gamma_gate(const GammaGateArgs& args);
void gla_gamma_grad(const GammaGradArgs& args);
void gla_normalize_forward(const GlaNormalizeArgs& args, const GlaProblem& problem);
void gla_normalize_backward(const GlaNormalizeBackwardArgs& args, const GlaProblem& problem);
}  // namespace flashgla::cpu

#ifdef FLASHGLA_WITH_CUDA
namespace flashgla::cuda {
void gla_gamma_gate(const GammaGateArgs& args);
void gla_gamma_grad(const GammaGradArgs& args);
void gla_normalize_forward(const GlaNormalizeArgs& args, const GlaProblem& problem);
void gla_normalize_backward(const GlaNormalizeBackwardArgs& args, const GlaProblem& problem);
size_t gla_normalize_forward_workspace_bytes(const GlaNormalizeArgs& args, const GlaProblem& problem);
size_t gla_normalize_backward_workspace_bytes(const GlaNormalizeBackwardArgs& args, const GlaProblem& problem);
// The forward up to the division: z at the start of every chunk into z_starts (gla_normalize_forward_workspace_bytes
// of it) and z_final; o is not written. For the GLA fast kernel with a sequence split, which divides as it stores
// o (ChunkParams::norm_z).
void gla_normalize_key_prefix(const GlaNormalizeArgs& args, const GlaProblem& problem, float* z_starts);
// Stream-ordered device scratch on device `index` for the API layer (the g_gamma gate when the
// caller gave no workspace); freed on the same stream.
void* scratch_allocate(int index, size_t bytes, void* stream);
void scratch_free(int index, void* data, void* stream);
}  // namespace flashgla::cuda
#endif
