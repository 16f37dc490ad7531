// The chunked GLA algorithm of FlashLinearAttention (docs/algorithm.md) on one
// (sequence, head) pair or a range of its chunks, accumulating in T (float for f32/bf16/f16 inputs,
// double for f64). Chunks of C = 64 tokens, split into 16-wide sub-chunks.
//
// Per chunk, with Γ the within-chunk cumsum of g and γ its last row:
//   O   = (Q ⊙ exp Γ) S_prev + (A ⊙ M) V,     A_ab = Σ_d Q_ad K_bd exp(Γ_ad − Γ_bd)
//   S   = diag(exp γ) S_prev + (K ⊙ exp(γ − Γ))^T V
// Every exponent is ≤ 0 (g ≤ 0, Γ non-increasing), so nothing overflows: the
// off-diagonal sub-blocks of A go through a reference row of the cumsum
// (docs/algorithm.md step 3), the diagonal ones use exp(Γ_a − Γ_b) with b ≤ a
// directly.
// Cost per head: O(T·C·K + T·K·V); the matrix products are matmul_acc calls.
//
// Resets. A gate at or below −reset_gate<T>() (−88 in fp32, −709 in fp64,
// −inf included) makes the weight exp(Γ_a − Γ_b) of every pair b < r ≤ a
// across it underflow to 0 in T anyway. Summing such a gate into Γ would
// give −inf − −inf = NaN, or a Γ so large that the differences of the pairs
// that do matter lose their digits. So a chunk holding one is cut into
// segments per column: the cumsum restarts at 0 on every reset row (seg
// counts the resets so far), and every exponent between two rows of
// different segments is set to −inf before the exp, giving an exact 0 (a
// select, so nothing ever meets the large values). Chunks without a reset
// run the plain code: bit for bit the same, for one compare per gate.
//
// The steps are named in stages.h (the same names as the CUDA stages). This header is compiled once per
// instruction set (gla_chunk.cpp for the baseline, gla_chunk_avx2.cpp for AVX2 + FMA), so
// everything in it has internal linkage: the two copies must never be merged by the linker.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "cpu/gla/stages.h"

namespace flashgla::cpu::gla {
namespace {

template <class T>
void chunked_forward_impl(const HeadInputs<T>& in, T* state, T* o) {
  const int64_t V = in.V;
  Chunk<T> c(in);
  for (int64_t begin = 0; begin < in.len; begin += kChunk) {
    c.chunk_local_cumsum(begin, std::min(kChunk, in.len - begin));
    chunk_fwd_o(c, state, o + begin * V);
    c.chunk_fwd_h(state);
  }
}

// The state after the tokens of `in` (docs/algorithm.md steps 1-2 only): the same steps, in the same order,
// as the state carried through chunked_forward_impl and recomputed by chunked_backward_impl.
template <class T>
void chunked_states_impl(const HeadInputs<T>& in, T* state) {
  Chunk<T> c(in);
  for (int64_t begin = 0; begin < in.len; begin += kChunk) {
    c.chunk_local_cumsum(begin, std::min(kChunk, in.len - begin));
    c.chunk_fwd_h(state);
  }
}

// The backward (docs/algorithm.md steps 6-11), per chunk from the last to the
// first, carrying dS (the gradient of the state after the chunk):
//   dA  = (dO V^T) ⊙ M
//   dV  = (A ⊙ M)^T dO + (K ⊙ exp(γ − Γ)) dS
//   dQ  = (dO S_prev^T) ⊙ exp Γ                 + intra-chunk share of dA
//   dK  = (V dS^T) ⊙ exp(γ − Γ)                 + intra-chunk share of dA
//   dg  = reverse cumsum within the chunk of (Q ⊙ dQ − K ⊙ dK)
//         + exp γ ⊙ rowsum(S_prev ⊙ dS) + Σ_r K_r ⊙ dK_r|from S   (the state term, on every row)
//   dS_prev = diag(exp γ) dS + (Q ⊙ exp Γ)^T dO
// dg is computed in an algebraically equal form that leaves out terms which
// cancel exactly: the self terms of dA's diagonal (q_a dA_aa k_a appears in
// both Q ⊙ dQ and K ⊙ dK), and the inter-chunk part of K ⊙ dK of rows r ≥ s,
// which the state term adds back (so row s keeps Σ_{r<s} K_r ⊙ dK_r|from S).
// Those terms are O(1) while dg is O(exp g): with gates at −20 per step the
// literal form loses every digit of dg to cancellation.
template <class T>
void chunked_backward_impl(const HeadInputs<T>& in, const T* h0, const T* d_o, T* d_state, T* dq, T* dk, T* dv,
                           T* dg, T* states) {
  const int64_t K = in.K, V = in.V, KV = K * V;
  const int64_t num_chunks = (in.len + kChunk - 1) / kChunk;
  Chunk<T> c(in);

  // Recompute the state before every chunk: states[n] from states[n - 1], as the forward carried it.
  if (num_chunks > 0) std::copy(h0, h0 + KV, states);
  for (int64_t n = 0; n + 1 < num_chunks; ++n) {
    std::copy(states + n * KV, states + (n + 1) * KV, states + (n + 1) * KV);
    c.chunk_local_cumsum(n * kChunk, kChunk);
    c.chunk_fwd_h(states + (n + 1) * KV);
  }

  BwdChunk<T> b(c);
  for (int64_t n = num_chunks - 1; n >= 0; --n) {
    const int64_t begin = n * kChunk;
    c.chunk_local_cumsum(begin, std::min(kChunk, in.len - begin));
    b.start(states + n * KV, d_o, dq, dk, dv, dg);
    b.chunk_bwd_dA();
    b.chunk_bwd_dqk_intra();
    b.chunk_bwd_dv(d_state);
    b.chunk_bwd_dqk_inter(d_state);
    b.chunk_bwd_dg(d_state);
    b.chunk_bwd_dh(d_state);
  }
}

}  // namespace
}  // namespace flashgla::cpu::gla
