// The steps of docs/algorithm.md on the CPU, named like their CUDA twins (src/cuda/gla/stages/) and FLA's:
//   chunk_local_cumsum    step 1: Γ, exp Γ, exp(γ − Γ) of a chunk (Chunk::chunk_local_cumsum)
//   chunk_fwd_h           step 2: S = diag(exp γ) S + (K ⊙ exp(γ − Γ))^T V (Chunk::chunk_fwd_h)
//   chunk_fwd_intra       steps 3-4: the intra-chunk scores A over 16-token sub-chunks, off-diagonal blocks
//                         through a reference row (chunk_fwd_intra_offdiag), diagonal blocks elementwise
//                         (chunk_fwd_intra_diag)
//   chunk_fwd_o           step 5: O = (Q ⊙ exp Γ) S_prev (chunk_fwd_o_state) + (A ⊙ M) V (chunk_fwd_o_intra)
//   chunk_bwd_dA, chunk_bwd_dqk_intra, chunk_bwd_dv, chunk_bwd_dqk_inter, chunk_bwd_dg, chunk_bwd_dh
//                         steps 7, 9, 8, 10, 11, 6: the backward of one chunk (BwdChunk), see
//                         chunked_backward_impl
// gla_chunk_impl.h composes them into the chunked forward and backward of one (sequence, head) pair.
//
// Like gla_chunk_impl.h, this header is compiled once per instruction set, so everything in it has internal
// linkage.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/gla_chunk.h"
#include "cpu/gla/gla_kernels.h"
#include "cpu/gla/gla_math.h"

namespace flashgla::cpu::gla {
namespace {

constexpr int64_t kChunk = flashgla::kChunk;  // C (core/gla_chunk.h), 64-bit like the indices it enters
constexpr int64_t kSub = 16;

// exp(−reset_gate) is below the smallest normal number of T (exp_array's
// float version flushes there): see "Resets" in gla_chunk_impl.h.
template <class T>
constexpr T reset_gate();
template <>
constexpr float reset_gate<float>() { return 88.0f; }
template <>
constexpr double reset_gate<double>() { return 709.0; }

// Buffers for one chunk, allocated once per kernel call (one range of a (sequence, head) pair).
template <class T>
struct Chunk {
  explicit Chunk(const HeadInputs<T>& in)
      : in(in),
        K(in.K),
        V(in.V),
        G(size_t(kChunk * K)),
        exp_G(size_t(kChunk * K)),
        exp_to_end(size_t(kChunk * K)),
        A(size_t(kChunk * kChunk)),
        q_ref(size_t(kSub * K)),
        k_ref(size_t(kChunk * K)),
        k_ref_t(size_t(K * kChunk)),
        row_exp(size_t(kSub * K)),
        work(size_t(kChunk * std::max(K, V))),
        seg(size_t(kChunk * K)) {}

  const HeadInputs<T>& in;
  const int64_t K, V;
  int64_t begin = 0, len = 0;  // tokens [begin, begin + len) of the sequence

  std::vector<T> G;           // [C, K] Γ: cumsum of g within the chunk
  std::vector<T> exp_G;       // [C, K] exp(Γ)
  std::vector<T> exp_to_end;  // [C, K] exp(γ − Γ), γ = Γ[len - 1]
  std::vector<T> A;           // [C, C] intra-chunk scores, zero above the diagonal
  std::vector<T> q_ref;       // [kSub, K] scratch: exp(Γ_a − ref), then q scaled by it
  std::vector<T> k_ref;       // [C, K] scratch: k_b scaled by exp(ref − Γ_b)
  std::vector<T> k_ref_t;     // [K, C] its transpose
  std::vector<T> row_exp;     // [kSub, K] exp(Γ_a − Γ_b) for the pairs of one row of a diagonal block
  std::vector<T> work;        // [C, max(K, V)] scratch for products
  bool has_reset = false;     // some gate of this chunk ≤ −reset_gate<T>()
  std::vector<int32_t> seg;   // [C, K] with has_reset: the resets in rows ≤ r of column d

  const T* q() const { return in.q + begin * K; }
  const T* k() const { return in.k + begin * K; }
  const T* v() const { return in.v + begin * V; }
  const T* gamma() const { return G.data() + (len - 1) * K; }          // γ
  const T* exp_gamma() const { return exp_G.data() + (len - 1) * K; }  // exp γ

  // x = exp(x) for `rows` rows of K gate differences. Without a gate they are
  // all 0; with a scalar gate each row holds one value K times.
  void exp_rows(T* x, int64_t rows) const {
    if (in.gate == GateKind::vector) return exp_array(x, x, rows * K);
    for (int64_t r = 0; r < rows; ++r) {
      T value = 1;
      if (in.gate == GateKind::scalar) exp_array(x + r * K, &value, 1);
      std::fill(x + r * K, x + (r + 1) * K, value);
    }
  }

  // docs/algorithm.md step 1 (FLA: chunk_local_cumsum): Γ, exp Γ and exp(γ − Γ) for tokens [begin, begin + len).
  void chunk_local_cumsum(int64_t chunk_begin, int64_t chunk_len) {
    begin = chunk_begin, len = chunk_len;
    const T* g = in.g + begin * K;
    has_reset = false;
    if (in.gate != GateKind::none) {
      int resets = 0;  // an int sum vectorizes where a bool || does not
      for (int64_t r = 0; r < len * K; ++r) resets += g[r] <= -reset_gate<T>();
      has_reset = resets != 0;
    }
    if (!has_reset) {
      for (int64_t d = 0; d < K; ++d) G[d] = g[d];
      for (int64_t r = 1; r < len; ++r)
        for (int64_t d = 0; d < K; ++d) G[r * K + d] = G[(r - 1) * K + d] + g[r * K + d];
    } else {
      for (int64_t r = 0; r < len; ++r)
        for (int64_t d = 0; d < K; ++d) {
          const bool reset = g[r * K + d] <= -reset_gate<T>();
          const int32_t before = r > 0 ? seg[(r - 1) * K + d] : 0;
          const T sum = r > 0 ? G[(r - 1) * K + d] : T(0);
          seg[r * K + d] = before + reset;
          G[r * K + d] = reset ? T(0) : sum + g[r * K + d];
        }
    }
    std::copy(G.begin(), G.begin() + len * K, exp_G.begin());
    cut(exp_G.data(), 0, len, -1);
    exp_rows(exp_G.data(), len);
    const T* last = gamma();
    for (int64_t r = 0; r < len; ++r)
      for (int64_t d = 0; d < K; ++d) exp_to_end[r * K + d] = last[d] - G[r * K + d];
    cut(exp_to_end.data(), 0, len, len - 1);
    exp_rows(exp_to_end.data(), len);
  }

  // With has_reset: x[(r − r0) * K + d] = −inf for the rows r in [r0, r1)
  // whose segment in column d differs from that of row `other` (−1: the
  // state before the chunk, segment 0), so that their exp is exactly 0.
  void cut(T* x, int64_t r0, int64_t r1, int64_t other) const {
    if (!has_reset) return;
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t d = 0; d < K; ++d) {
        const int32_t s = other < 0 ? 0 : seg[other * K + d];
        if (seg[r * K + d] != s) x[(r - r0) * K + d] = -std::numeric_limits<T>::infinity();
      }
  }

  // Sub-chunk i holds rows [i * kSub, min((i + 1) * kSub, len)).
  int64_t num_sub() const { return (len + kSub - 1) / kSub; }
  int64_t sub_end(int64_t i) const { return std::min(len, (i + 1) * kSub); }

  // For the off-diagonal blocks of row block i (rows [a0, a1), columns [0, a0)),
  // with reference ref = Γ[a0]: q_ref = exp(Γ_a − ref) for a in the block and
  // k_ref = k_b ⊙ exp(ref − Γ_b) for b < a0 (k_ref_t its transpose).
  // Both exponents are ≤ 0, and their product is exp(Γ_a − Γ_b).
  void reference_row_block(int64_t i) {
    const int64_t a0 = i * kSub, a1 = sub_end(i);
    const T* ref = G.data() + a0 * K;
    for (int64_t a = a0; a < a1; ++a)
      for (int64_t d = 0; d < K; ++d) q_ref[(a - a0) * K + d] = G[a * K + d] - ref[d];
    cut(q_ref.data(), a0, a1, a0);
    exp_rows(q_ref.data(), a1 - a0);
    for (int64_t b = 0; b < a0; ++b)
      for (int64_t d = 0; d < K; ++d) k_ref[b * K + d] = ref[d] - G[b * K + d];
    cut(k_ref.data(), 0, a0, a0);
    exp_rows(k_ref.data(), a0);
    const T* kk = k();
    for (int64_t b = 0; b < a0; ++b)
      for (int64_t d = 0; d < K; ++d) k_ref[b * K + d] *= kk[b * K + d];
    transpose(a0, K, k_ref.data(), K, k_ref_t.data(), kChunk);
  }

  // docs/algorithm.md step 3: A[a0:a1, 0:a0] = (q ⊙ q_ref) k_ref^T, after reference_row_block(i).
  // Leaves q_ref scaled by q.
  void chunk_fwd_intra_offdiag(int64_t i) {
    const int64_t a0 = i * kSub, a1 = sub_end(i);
    const T* qq = q();
    for (int64_t a = a0; a < a1; ++a)
      for (int64_t d = 0; d < K; ++d) q_ref[(a - a0) * K + d] *= qq[a * K + d];
    matmul_acc(a1 - a0, a0, K, q_ref.data(), K, 1, k_ref_t.data(), kChunk, A.data() + a0 * kChunk, kChunk);
  }

  // docs/algorithm.md step 4: the diagonal blocks of A, elementwise: A_ab = Σ_d q_ad k_bd exp(Γ_ad − Γ_bd)
  // for b ≤ a in one sub-chunk. With dA given, also adds the diagonal blocks'
  // share of the gradients, dq_a += dA_ab k_b ⊙ e and dk_b += dA_ab q_a ⊙ e,
  // except for the pairs b == a, which chunk_bwd_dg adds after dg.
  void chunk_fwd_intra_diag(const T* dA = nullptr, T* dq = nullptr, T* dk = nullptr) {
    const T* qq = q();
    const T* kk = k();
    for (int64_t i = 0; i < num_sub(); ++i) {
      const int64_t a0 = i * kSub, a1 = sub_end(i);
      for (int64_t a = a0; a < a1; ++a) {
        const int64_t pairs = a - a0 + 1;  // b in [a0, a]
        for (int64_t b = a0; b <= a; ++b)
          for (int64_t d = 0; d < K; ++d) row_exp[(b - a0) * K + d] = G[a * K + d] - G[b * K + d];
        cut(row_exp.data(), a0, a + 1, a);
        exp_rows(row_exp.data(), pairs);
        for (int64_t b = a0; b <= a; ++b) {
          const T* e = row_exp.data() + (b - a0) * K;
          A[a * kChunk + b] = dot3(qq + a * K, kk + b * K, e, K);
          if (!dA || b == a) continue;
          const T dab = dA[a * kChunk + b];
          for (int64_t d = 0; d < K; ++d) {
            dq[a * K + d] += dab * kk[b * K + d] * e[d];
            dk[b * K + d] += dab * qq[a * K + d] * e[d];
          }
        }
      }
    }
  }

  // docs/algorithm.md steps 3-4 (FLA: chunk_gla_fwd_intra): A with zeros above the diagonal.
  void chunk_fwd_intra() {
    std::fill(A.begin(), A.end(), T(0));
    for (int64_t i = 1; i < num_sub(); ++i) {
      reference_row_block(i);
      chunk_fwd_intra_offdiag(i);
    }
    chunk_fwd_intra_diag();
  }

  // docs/algorithm.md step 2 (FLA: chunk_fwd_h): S = diag(exp γ) S + (K ⊙ exp(γ − Γ))^T V.
  void chunk_fwd_h(T* S) {
    const T* eg = exp_gamma();
    for (int64_t d = 0; d < K; ++d)
      for (int64_t j = 0; j < V; ++j) S[d * V + j] *= eg[d];
    T* k_to_end = work.data();
    const T* kk = k();
    for (int64_t r = 0; r < len * K; ++r) k_to_end[r] = kk[r] * exp_to_end[r];
    matmul_acc(K, V, len, k_to_end, 1, K, v(), V, S, V);
  }
};

// No NaN or Inf among x[0, n) (integer tests on the exponent bits: they vectorize).
template <class T>
bool all_finite(const T* x, int64_t n) {
  using U = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
  constexpr U kExponent = sizeof(T) == 4 ? U(0x7F800000u) : U(0x7FF0000000000000ull);
  U bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    U u;
    std::memcpy(&u, x + i, sizeof u);
    bad |= U((u & kExponent) == kExponent);
  }
  return bad == 0;
}


// Step 5, the output's share from the state: out = (Q ⊙ exp Γ) S_prev (out zeroed first).
template <class T>
void chunk_fwd_o_state(Chunk<T>& c, const T* state, T* out) {
  const int64_t K = c.K, V = c.V, len = c.len;
  std::fill(out, out + len * V, T(0));
  // Inter-chunk: (Q ⊙ exp Γ) S_prev.
  T* q_decayed = c.work.data();
  const T* q = c.q();
  for (int64_t r = 0; r < len * K; ++r) q_decayed[r] = q[r] * c.exp_G[r];
  matmul_acc(len, V, K, q_decayed, K, 1, state, V, out, V);
}

// Step 5, the intra-chunk share: out += (A ⊙ M) V, each row block up to its diagonal, after chunk_fwd_intra.
// Where the block's rows of v hold a NaN or Inf, the diagonal block goes row by row up to the diagonal and no
// further: a product 0 · v_b with b > a would carry it into an earlier output (the same sums in the same order).
template <class T>
void chunk_fwd_o_intra(Chunk<T>& c, T* out) {
  const int64_t V = c.V;
  for (int64_t i = 0; i < c.num_sub(); ++i) {
    const int64_t a0 = i * kSub, a1 = c.sub_end(i);
    if (all_finite(c.v() + a0 * V, (a1 - a0) * V)) {
      matmul_acc(a1 - a0, V, a1, c.A.data() + a0 * kChunk, kChunk, 1, c.v(), V, out + a0 * V, V);
      continue;
    }
    matmul_acc(a1 - a0, V, a0, c.A.data() + a0 * kChunk, kChunk, 1, c.v(), V, out + a0 * V, V);
    for (int64_t a = a0; a < a1; ++a)
      matmul_acc(1, V, a - a0 + 1, c.A.data() + a * kChunk + a0, kChunk, 1, c.v() + a0 * V, V, out + a * V, V);
  }
}

// Step 5 (FLA: chunk_gla_fwd_o): the chunk's output from the state before it and its own scores.
template <class T>
void chunk_fwd_o(Chunk<T>& c, const T* state, T* out) {
  chunk_fwd_o_state(c, state, out);
  c.chunk_fwd_intra();
  chunk_fwd_o_intra(c, out);
}

// The backward of one chunk (docs/algorithm.md steps 6-11; see chunked_backward_impl for the formulas), in the order
// chunked_backward_impl runs them: after c.chunk_local_cumsum and start, chunk_bwd_dA, chunk_bwd_dqk_intra,
// chunk_bwd_dv, chunk_bwd_dqk_inter, chunk_bwd_dg, chunk_bwd_dh. d_state: dS, the gradient of the state after
// the chunk (chunk_bwd_dh turns it into that of the state before). Buffers allocated once per kernel call.
template <class T>
struct BwdChunk {
  explicit BwdChunk(Chunk<T>& c)
      : c(c),
        K(c.K),
        V(c.V),
        dA(size_t(kChunk * kChunk)),
        v_t(size_t(V * kChunk)),
        state_t(size_t(V * K)),
        dk_from_state(size_t(kChunk * K)),
        q_decayed(size_t(kChunk * K)),
        dgamma(static_cast<size_t>(K)),
        block(size_t(kSub * K)) {}

  Chunk<T>& c;
  const int64_t K, V;
  std::vector<T> dA;
  std::vector<T> v_t;            // V^T of the chunk
  std::vector<T> state_t;        // a state transposed: [V, K]
  std::vector<T> dk_from_state;
  std::vector<T> q_decayed;
  std::vector<T> dgamma;
  std::vector<T> block;          // one sub-chunk's product

  // The chunk's rows (set by start, after c.chunk_local_cumsum).
  int64_t len = 0, nsub = 0;
  const T *S_prev = nullptr, *q = nullptr, *k = nullptr, *v = nullptr, *dO = nullptr;
  T *dQ = nullptr, *dK = nullptr, *dV = nullptr, *dG = nullptr;

  void start(const T* state_before, const T* d_o, T* dq, T* dk, T* dv, T* dg) {
    const int64_t begin = c.begin;
    len = c.len, nsub = c.num_sub();
    S_prev = state_before;
    q = c.q();
    k = c.k();
    v = c.v();
    dO = d_o + begin * V;
    dQ = dq + begin * K;
    dK = dk + begin * K;
    dV = dv + begin * V;
    dG = dg + begin * K;
  }

  void chunk_bwd_dA() {
    // dA = (dO V^T) ⊙ M, row block by row block up to the diagonal.
    transpose(len, V, v, V, v_t.data(), kChunk);
    std::fill(dA.begin(), dA.end(), T(0));
    for (int64_t i = 0; i < nsub; ++i) {
      const int64_t a0 = i * kSub, a1 = c.sub_end(i);
      matmul_acc(a1 - a0, a1, V, dO + a0 * V, V, 1, v_t.data(), kChunk, dA.data() + a0 * kChunk, kChunk);
      for (int64_t a = a0; a < a1; ++a)
        for (int64_t b = a + 1; b < a1; ++b) dA[a * kChunk + b] = 0;
    }
  }

  // The intra-chunk shares of dQ and dK (dQ and dK start here), and A (for chunk_bwd_dv).
  void chunk_bwd_dqk_intra() {
    std::fill(dQ, dQ + len * K, T(0));
    std::fill(dK, dK + len * K, T(0));
    std::fill(c.A.begin(), c.A.end(), T(0));
    for (int64_t i = 1; i < nsub; ++i) {
      // Row block i against the earlier columns: reference Γ[a0].
      const int64_t a0 = i * kSub, a1 = c.sub_end(i);
      c.reference_row_block(i);
      std::fill(block.begin(), block.end(), T(0));
      matmul_acc(a1 - a0, K, a0, dA.data() + a0 * kChunk, kChunk, 1, c.k_ref.data(), K, block.data(), K);
      for (int64_t r = 0; r < (a1 - a0) * K; ++r) dQ[a0 * K + r] += block[r] * c.q_ref[r];
      c.chunk_fwd_intra_offdiag(i);
    }
    c.chunk_fwd_intra_diag(dA.data(), dQ, dK);
    for (int64_t j = 0; j + 1 < nsub; ++j) {
      // Column block j against the later rows: reference Γ[b1 − 1], its last row.
      const int64_t b0 = j * kSub, b1 = c.sub_end(j);
      const T* ref = c.G.data() + (b1 - 1) * K;
      T* q_ref = c.work.data();  // [len − b1, K]: q_a ⊙ exp(Γ_a − ref)
      for (int64_t a = b1; a < len; ++a)
        for (int64_t d = 0; d < K; ++d) q_ref[(a - b1) * K + d] = c.G[a * K + d] - ref[d];
      c.cut(q_ref, b1, len, b1 - 1);
      c.exp_rows(q_ref, len - b1);
      for (int64_t r = 0; r < (len - b1) * K; ++r) q_ref[r] *= q[b1 * K + r];
      std::fill(block.begin(), block.end(), T(0));
      matmul_acc(b1 - b0, K, len - b1, dA.data() + b1 * kChunk + b0, 1, kChunk, q_ref, K, block.data(), K);
      T* scale_back = c.row_exp.data();  // exp(ref − Γ_b) for b in the block
      for (int64_t b = b0; b < b1; ++b)
        for (int64_t d = 0; d < K; ++d) scale_back[(b - b0) * K + d] = ref[d] - c.G[b * K + d];
      c.cut(scale_back, b0, b1, b1 - 1);
      c.exp_rows(scale_back, b1 - b0);
      for (int64_t r = 0; r < (b1 - b0) * K; ++r) dK[b0 * K + r] += block[r] * scale_back[r];
    }
  }

  void chunk_bwd_dv(const T* d_state) {
    // dV = (A ⊙ M)^T dO + (K ⊙ exp(γ − Γ)) dS; column block j needs rows a ≥ b0.
    std::fill(dV, dV + len * V, T(0));
    for (int64_t j = 0; j < nsub; ++j) {
      const int64_t b0 = j * kSub, b1 = c.sub_end(j);
      matmul_acc(b1 - b0, V, len - b0, c.A.data() + b0 * kChunk + b0, 1, kChunk, dO + b0 * V, V, dV + b0 * V, V);
    }
    T* k_to_end = c.work.data();
    for (int64_t r = 0; r < len * K; ++r) k_to_end[r] = k[r] * c.exp_to_end[r];
    matmul_acc(len, V, K, k_to_end, K, 1, d_state, V, dV, V);
  }

  // The inter-chunk dQ (added) and dK (to dk_from_state, added to dK by chunk_bwd_dg).
  void chunk_bwd_dqk_inter(const T* d_state) {
    // Inter-chunk dQ: (dO S_prev^T) ⊙ exp Γ.
    transpose(K, V, S_prev, V, state_t.data(), K);
    T* dq_inter = c.work.data();
    std::fill(dq_inter, dq_inter + len * K, T(0));
    matmul_acc(len, K, V, dO, V, 1, state_t.data(), K, dq_inter, K);
    for (int64_t r = 0; r < len * K; ++r) dQ[r] += dq_inter[r] * c.exp_G[r];

    // Inter-chunk dK: (V dS^T) ⊙ exp(γ − Γ).
    transpose(K, V, d_state, V, state_t.data(), K);
    std::fill(dk_from_state.begin(), dk_from_state.begin() + len * K, T(0));
    matmul_acc(len, K, V, v, V, 1, state_t.data(), K, dk_from_state.data(), K);
    for (int64_t r = 0; r < len * K; ++r) dk_from_state[r] *= c.exp_to_end[r];
  }

  // dg, then the terms of dQ and dK it leaves out.
  void chunk_bwd_dg(const T* d_state) {
    const T* eg = c.exp_gamma();
    // dg, from dQ and dK without their self terms and dK without its inter-chunk
    // part (both are added after). exp γ ⊙ rowsum(S_prev ⊙ dS) is how γ moves the state.
    for (int64_t d = 0; d < K; ++d) {
      T sum = 0;
      for (int64_t j = 0; j < V; ++j) sum += S_prev[d * V + j] * d_state[d * V + j];
      dgamma[d] = eg[d] * sum;
    }
    for (int64_t r = len - 1; r >= 0; --r)
      for (int64_t d = 0; d < K; ++d) {
        const T here = q[r * K + d] * dQ[r * K + d] - k[r * K + d] * dK[r * K + d];
        const T later = r + 1 < len ? dG[(r + 1) * K + d] : dgamma[d];
        dG[r * K + d] = later + here;
      }
    std::fill(dgamma.begin(), dgamma.end(), T(0));  // now the running sum over earlier rows
    for (int64_t r = 0; r < len; ++r)
      for (int64_t d = 0; d < K; ++d) {
        dG[r * K + d] += dgamma[d];
        dgamma[d] += k[r * K + d] * dk_from_state[r * K + d];
      }

    // The terms left out of dg: the inter-chunk dK and the self terms (a == b).
    for (int64_t r = 0; r < len * K; ++r) dK[r] += dk_from_state[r];
    for (int64_t a = 0; a < len; ++a) {
      const T daa = dA[a * kChunk + a];
      for (int64_t d = 0; d < K; ++d) {
        dQ[a * K + d] += daa * k[a * K + d];
        dK[a * K + d] += daa * q[a * K + d];
      }
    }
  }

  void chunk_bwd_dh(T* d_state) {
    const T* eg = c.exp_gamma();
    // dS_prev = diag(exp γ) dS + (Q ⊙ exp Γ)^T dO.
    for (int64_t d = 0; d < K; ++d)
      for (int64_t j = 0; j < V; ++j) d_state[d * V + j] *= eg[d];
    for (int64_t r = 0; r < len * K; ++r) q_decayed[r] = q[r] * c.exp_G[r];
    matmul_acc(K, V, len, q_decayed.data(), 1, K, dO, V, d_state, V);
  }
};

}  // namespace
}  // namespace flashgla::cpu::gla
