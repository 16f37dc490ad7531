// The mma.sync stages of the fast chunked forward (gla_fwd_fast.cuh) and of the sequence split's states kernel
// (gla_fwd_states.cuh, which the segment summaries of gla_segment.cu run too), named like their CPU twins in
// src/cpu/gla/stages.h and the general kernel's (stages/chunk_fwd.cuh), and who calls them:
//   chunk_fwd_h_accumulate  step 2's S += K̂ᵀ V, one or two key tiles per warp: the fast kernels (in chunk_fwd_h,
//                           one) and the states kernel (two);
//   chunk_fwd_h             step 2, S ← diag(exp γ^C) S + K̂ᵀ V: the vector-gate fast kernel;
//   chunk_fwd_o_state       step 5's O = (Q ⊙ exp Γ) S: the fast kernels;
//   chunk_fwd_o_intra       step 5's O += (A ⊙ M) V: the fast kernels;
//   store_state_tile, store_final_state  the bf16 state and ht from the fragments: the fast kernels (o: the
//                           device toolkit's store_fragment_rows);
//   store_intra_rows        the chunk's A for the backward (GlaForwardArgs::intra): the vector-gate fast kernel.
// The fast kernels' other phases (gate factors and operands, the blocks of A) are written out in them
// (gla_fwd_fast.cuh: a vector gate; gla_fwd_fast_scalar.cuh: a scalar gate or none). Also here: the constants,
// fragment helpers and shared-memory symbol the kernels and their stages share. As in stages/chunk_fwd.cuh the
// kernel owns the register arrays and the mma fragments and passes them by reference, so that its generated code
// stays the same (scripts/ptx_same.sh).
#pragma once

#include "cuda/gla/device/elements.cuh"
#include "cuda/gla/device/warp_mma.cuh"
#include "cuda/gla/device/gla_fwd.cuh"

namespace flashgla::cuda::gla {
namespace {

// The dynamic shared memory of the fast and states kernels and of these stages: one symbol, so that the compiler
// sees a stage's tiles and the kernel's as the same memory.
extern __shared__ __align__(16) unsigned char smem[];

constexpr int C = kChunk;
constexpr int NW = 16, NT = NW * 32;
constexpr int kTriangle = kFastTriangle;  // entries of an 8×8 lower triangle with its diagonal
constexpr int kScatter = 48;   // kTriangle padded for a 4-level reduce-scatter

// FastLayout<KP, BV>: the byte offsets of the shared-memory regions (cuda/gla/plan/layouts.h).

// ldmatrix: the ordered flavour of cuda/common/mma.cuh (ldmatrix_x4_ordered, ldmatrix_x4_trans_ordered,
// ldmatrix_x2_ordered).

// Fragment loads (lane-dependent addresses, see the mma.sync m16n8k16 layouts).
// A operand [16 rows][16] from a row-major tile.
template <class E>
__device__ __forceinline__ typename Mma<E>::A frag_a(const E* tile, int pitch, int lane) {
  typename Mma<E>::A f;
  ldmatrix_x4_ordered(f.x, tile + (lane & 15) * pitch + (lane >> 4) * 8);
  return f;
}
// A operand [16 rows m][16 k] from a tile stored k-major (tile[k][m]).
template <class E>
__device__ __forceinline__ typename Mma<E>::A frag_a_t(const E* tile, int pitch, int lane) {
  typename Mma<E>::A f;
  ldmatrix_x4_trans_ordered(f.x, tile + ((lane & 7) + ((lane >> 4) << 3)) * pitch + ((lane >> 3) & 1) * 8);
  return f;
}
// B operand [16 k][8 n] from a tile stored n-major (tile[n][k]).
template <class E>
__device__ __forceinline__ typename Mma<E>::B frag_b(const E* tile, int pitch, int lane) {
  typename Mma<E>::B f;
  ldmatrix_x2_ordered(f.x, tile + (lane & 7) * pitch + ((lane >> 3) & 1) * 8);
  return f;
}
// Two B operands [16 k][8 n], columns 0–7 and 8–15 of a tile stored k-major (tile[k][n]).
template <class E>
__device__ __forceinline__ void frag_b2_t(typename Mma<E>::B& b0, typename Mma<E>::B& b1, const E* tile, int pitch,
                                          int lane) {
  uint32_t r[4];
  ldmatrix_x4_trans_ordered(r, tile + (lane & 15) * pitch + (lane >> 4) * 8);
  b0.x[0] = r[0], b0.x[1] = r[1], b1.x[0] = r[2], b1.x[1] = r[3];
}

template <class E>
__device__ __forceinline__ void store2(E* p, float lo, float hi) {
  *reinterpret_cast<uint32_t*>(p) = Mma<E>::pack(lo, hi);
}

// N = 1 or 2 consecutive elements as floats (4-byte aligned for 2), and back.
template <class E, int N>
__device__ __forceinline__ void load_keys(const E* p, float (&x)[N]) {
  if constexpr (std::is_same_v<E, float>) {
    if constexpr (N == 2) {
      const float2 w = *reinterpret_cast<const float2*>(p);
      x[0] = w.x, x[1] = w.y;
    } else {
      x[0] = p[0];
    }
  } else if constexpr (N == 2) {
    const uint32_t w = *reinterpret_cast<const uint32_t*>(p);
    E pair[2];
    *reinterpret_cast<uint32_t*>(pair) = w;
    x[0] = to_float(pair[0]), x[1] = to_float(pair[1]);
  } else {
    x[0] = to_float(p[0]);
  }
}
template <class E, int N>
__device__ __forceinline__ void store_keys(E* p, const float (&x)[N]) {
  if constexpr (N == 2) store2(p, x[0], x[1]);
  else p[0] = from_float<E>(x[0]);
}

// O's diagonal block row by row up to the diagonal (the rare chunks whose v holds a NaN or Inf): the sums of
// this lane's fragment elements. Out of line: inlined, it made ptxas spill in the 128×128 kernels.
template <class E, int NO, int PA, int PV>
struct DiagSums {
  float x[NO][4];
};
template <class E, int NO, int PA, int PV>
__device__ __noinline__ DiagSums<E, NO, PA, PV> diagonal_rowwise(const E* a_rows, const E* v_rows, int lane) {
  const int g4 = lane >> 2, t4 = lane & 3;
  DiagSums<E, NO, PA, PV> s;
#pragma unroll
  for (int nt = 0; nt < NO; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = g4 + 8 * (e >> 1);
      const E* a_row = a_rows + r * PA;
      const E* v_col = v_rows + 8 * nt + 2 * t4 + (e & 1);
      float sum = 0.f;
#pragma unroll 1
      for (int b = 0; b <= r; ++b) sum = fmaf(to_float(a_row[b]), to_float(v_col[b * PV]), sum);
      s.x[nt][e] = sum;
    }
  return s;
}

// No hook on the fragments of Kᵀ: K̂ is in shared memory as it is multiplied.
struct NoHook {
  template <class A>
  __device__ __forceinline__ void operator()(A&, int, int) const {}
};

// Where a kernel keeps K̂ and V of its chunks for chunk_fwd_h_accumulate: byte offsets k, v of the two tiles
// in shared memory, their row pitches P, PV (elements), and how buffer b (a chunk in flight while another is
// computed) is found: stage > 0, the states kernel's, whose buffers are stages of `stage` bytes each holding both
// tiles; stage == 0, the fast kernel's, whose K̂ and V regions hold their buffers C·P and C·PV elements apart.
template <int KP, int BV>
struct FastStateTiles {
  using L = FastLayout<KP, BV>;
  static constexpr int P = L::P, PV = L::PV;
  static constexpr int k = L::k, v = L::v, stage = 0;
};

// The accumulate half of docs/algorithm.md step 2 on mma accumulators: S[t] += K̂ᵀ V over a chunk's C rows, for
// TILES (1 or 2) 16-key tiles of the state, t = 0 .. TILES − 1 (K̂ columns 16·(kt + t) ..), and NS 8-column tiles
// from ns0 (V columns 8·ns0 ..), with K̂ and V in buffer b of the kernel's Tiles (FastStateTiles). a, b0, b1:
// fragments of the kernel. The pointers are formed here, from `smem`, as the kernel forms them (see the top of
// this file). The fast kernel runs it after the decay step (chunk_fwd_h, one key tile), the states kernel
// (gla_fwd_states.cuh, two) on keys already scaled to the end of its piece. visit(a, ks, lane) sees each loaded
// fragment of Kᵀ (tokens 16·ks ..) of the first tile: the scalar-gate kernel (gla_fwd_fast_scalar.cuh) scales it
// by its tokens' decay to the chunk's end (k stays unscaled in shared memory) or adds it to the normaliser's key
// sums.
template <class E, class Tiles, int TILES, int NS, class Buffer, class KeyFragmentHook = NoHook>
__device__ __forceinline__ void chunk_fwd_h_accumulate(float (&S)[TILES][NS][4], Buffer b, int kt, int ns0, int lane,
                                                       typename Mma<E>::A (&a)[TILES], typename Mma<E>::B& b0,
                                                       typename Mma<E>::B& b1,
                                                       const KeyFragmentHook& visit = NoHook{}) {
  static_assert(TILES == 1 || TILES == 2, "one or two key tiles per warp");
  using M = Mma<E>;
  constexpr int P = Tiles::P, PV = Tiles::PV;
  const E* k_s;
  const E* v_s;
  if constexpr (Tiles::stage > 0) {
    k_s = reinterpret_cast<const E*>(smem + b * Tiles::stage + Tiles::k);
    v_s = reinterpret_cast<const E*>(smem + b * Tiles::stage + Tiles::v);
  } else {
    k_s = reinterpret_cast<const E*>(smem + Tiles::k) + b * C * P;
    v_s = reinterpret_cast<const E*>(smem + Tiles::v) + b * C * PV;
  }
  // The second tile under `if constexpr` rather than loops over t: a loop of one trip changes the order of the
  // fast kernel's address arithmetic.
#pragma unroll
  for (int ks = 0; ks < C / 16; ++ks) {
    a[0] = frag_a_t(k_s + 16 * ks * P + 16 * kt, P, lane);
    visit(a[0], ks, lane);
    if constexpr (TILES == 2) a[1] = frag_a_t(k_s + 16 * ks * P + 16 * kt + 16, P, lane);
#pragma unroll
    for (int np = 0; np < NS / 2; ++np) {
      frag_b2_t<E>(b0, b1, v_s + 16 * ks * PV + 8 * (ns0 + 2 * np), PV, lane);
      M::mma(S[0][2 * np], a[0], b0);
      M::mma(S[0][2 * np + 1], a[0], b1);
      if constexpr (TILES == 2) {
        M::mma(S[1][2 * np], a[1], b0);
        M::mma(S[1][2 * np + 1], a[1], b1);
      }
    }
  }
}

// docs/algorithm.md step 2 on this warp's state tile (key tile kt, value column tiles ns0..) of chunk c:
// S ← diag(exp γ^C) S + (K ⊙ exp(γ^C − Γ))^T V, with k ⊙ exp(γ^C − Γ) and v of the chunk in shared memory:
// the decay, then chunk_fwd_h_accumulate with one key tile. af, b0, b1: fragments of the kernel. The
// shared-memory pointers and the warp's tile come from `smem`, c and the thread index here, as in the kernel
// (passed in, the kernel's code changes).
template <class E, int KP, int BV>
__device__ __forceinline__ void chunk_fwd_h(float (&S)[(BV / 8) * (KP / 16) / NW][4], int64_t c,
                                            typename Mma<E>::A& af, typename Mma<E>::B& b0, typename Mma<E>::B& b1) {
  using L = FastLayout<KP, BV>;
  constexpr int KT = KP / 16;                // key tiles of the state
  constexpr int NS = (BV / 8) * KT / NW;     // state column tiles (8 wide) per warp
  const float* decay_s = reinterpret_cast<float*>(smem + L::decay);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g4 = lane >> 2;
  const int kt = warp % KT, ns0 = (warp / KT) * NS;
  const float d0 = decay_s[16 * kt + g4], d1 = decay_s[16 * kt + g4 + 8];
#pragma unroll
  for (int nt = 0; nt < NS; ++nt) S[nt][0] *= d0, S[nt][1] *= d0, S[nt][2] *= d1, S[nt][3] *= d1;
  // This warp's one key tile: S and af as the stage's S[1][NS] and a[1] (the same registers).
  chunk_fwd_h_accumulate<E, FastStateTiles<KP, BV>>(reinterpret_cast<float (&)[1][NS][4]>(S), c & 1, kt, ns0,
                                                    lane, reinterpret_cast<typename Mma<E>::A (&)[1]>(af), b0, b1);
}

// Step 5, the output's share from the state: O = (Q ⊙ exp Γ) S for chunk c (warp: rows 16·mo, NO value column
// tiles from no0), with q ⊙ exp Γ and the bf16 copy of S in shared memory. af, b0, b1: fragments of the kernel;
// pointers from `smem` and c as for chunk_fwd_h; mo and no0 passed (the kernel uses them again afterwards).
template <class E, int KP, int BV>
__device__ __forceinline__ void chunk_fwd_o_state(float (&o)[(BV / 8) / 4][4], int64_t c, int mo, int no0,
                                                  typename Mma<E>::A& af, typename Mma<E>::B& b0,
                                                  typename Mma<E>::B& b1) {
  using L = FastLayout<KP, BV>;
  using M = Mma<E>;
  constexpr int P = L::P, PV = L::PV;
  constexpr int KT = KP / 16;                // key tiles of the state
  constexpr int NO = (BV / 8) / 4;           // output column tiles per warp
  E* q_buf = reinterpret_cast<E*>(smem + L::q);
  E* s_s = reinterpret_cast<E*>(smem + L::s);
  E* q_s = q_buf + (c & 1) * C * P;  // q ⊙ exp Γ
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int ks = 0; ks < KT; ++ks) {
    af = frag_a(q_s + 16 * mo * P + 16 * ks, P, lane);
#pragma unroll
    for (int np = 0; np < NO / 2; ++np) {
      frag_b2_t<E>(b0, b1, s_s + 16 * ks * PV + 8 * (no0 + 2 * np), PV, lane);
      M::mma(o[2 * np], af, b0);
      M::mma(o[2 * np + 1], af, b1);
    }
  }
}

// Step 5's share from within the chunk, O += (A ⊙ M) V, for the warp's rows 16·mo (column blocks 0 .. mo of A)
// and NO value column tiles from no0, with A's blocks on and below the diagonal in a_s (C rows, pitch PA) and
// the chunk's v in v_s (pitch PV). ROW_SUMS (the normaliser): row_sums += A times a column of ones, the row sums
// of the same 16-bit A that O's product reads (in every column of the fragment: rows g4 in [0], g4 + 8 in [2]).
template <class E, int NO, int PA, int PV, bool ROW_SUMS = false>
__device__ __forceinline__ void chunk_fwd_o_intra(float (&o)[NO][4], const E* a_s, const E* v_s, int mo, int no0,
                                                  int lane, float (*row_sums)[4] = nullptr) {
  using M = Mma<E>;
  for (int ks = 0; ks <= mo; ++ks) {
    typename M::A af;
    if constexpr (ROW_SUMS) {  // before the NaN vote: the ones carry no NaN, so the diagonal block is an mma too
      af = frag_a(a_s + 16 * mo * PA + 16 * ks, PA, lane);
      typename M::B ones;
      ones.x[0] = ones.x[1] = M::pack(1.f, 1.f);
      M::mma(*row_sums, af, ones);
    }
    // The diagonal block's product multiplies the zeros above the diagonal of A by later rows of v: a NaN or
    // Inf there would reach earlier outputs. Where this warp's rows and columns of v hold one (a warp vote on
    // one or two 16-byte loads per lane), row by row up to the diagonal instead.
    bool bad = false;
    if (ks == mo) {
      int piece = lane;
      asm volatile("" : "+r"(piece));  // addresses made here, not held through the chunk loop
#pragma unroll
      for (int i = 0; i < NO / 2; ++i, piece += 32)
        bad |= any_nonfinite8<E>(
            *reinterpret_cast<const uint4*>(v_s + (16 * mo + piece / NO) * PV + 8 * (no0 + piece % NO)));
    }
    if (ks == mo && __any_sync(0xffffffffu, bad)) {
      const auto sums =
          diagonal_rowwise<E, NO, PA, PV>(a_s + 16 * mo * PA + 16 * mo, v_s + 16 * mo * PV + 8 * no0, lane);
#pragma unroll
      for (int nt = 0; nt < NO; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[nt][e] += sums.x[nt][e];
      break;
    }
    if constexpr (!ROW_SUMS) af = frag_a(a_s + 16 * mo * PA + 16 * ks, PA, lane);
#pragma unroll
    for (int np = 0; np < NO / 2; ++np) {
      typename M::B b0, b1;
      frag_b2_t<E>(b0, b1, v_s + 16 * ks * PV + 8 * (no0 + 2 * np), PV, lane);
      M::mma(o[2 * np], af, b0);
      M::mma(o[2 * np + 1], af, b1);
    }
  }
}

// The bf16 copy of the state that O = Q S reads: this warp's fp32 tile (key tile kt, NS column tiles from ns0)
// into s_s (pitch PV).
template <class E, int NS, int PV>
__device__ __forceinline__ void store_state_tile(E* s_s, const float (&S)[NS][4], int kt, int ns0, int lane) {
  const int g4 = lane >> 2, t4 = lane & 3;
#pragma unroll
  for (int nt = 0; nt < NS; ++nt) {
    E* at = s_s + (16 * kt + g4) * PV + 8 * (ns0 + nt) + 2 * t4;
    store2(at, S[nt][0], S[nt][1]);
    store2(at + 8 * PV, S[nt][2], S[nt][3]);
  }
}

// The final state ht[n, h] from this warp's fp32 tile (keys below K, value columns v0 + … below V).
template <int NS>
__device__ __forceinline__ void store_final_state(const ChunkParams& p, const float (&S)[NS][4], int64_t n, int h,
                                                  int kt, int ns0, int v0, int lane) {
  const int g4 = lane >> 2, t4 = lane & 3;
  float* ht = static_cast<float*>(p.ht.data);
#pragma unroll
  for (int nt = 0; nt < NS; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = 16 * kt + g4 + (e >> 1) * 8, vg = v0 + 8 * (ns0 + nt) + 2 * t4 + (e & 1);
      if (key < p.key_dim && vg < p.value_dim)
        ht[n * p.ht.stride[0] + h * p.ht.stride[1] + key * p.ht.stride[2] + vg * p.ht.stride[3]] = S[nt][e];
    }
}

// The chunk's A (a_s: unscaled, zero above the diagonal, pitch PA) to p.intra, rows [0, rows_valid) of the chunk
// starting at `token`: one 16-byte piece per thread (64 rows of 128 bytes).
template <class E, int PA>
__device__ __forceinline__ void store_intra_rows(const ChunkParams& p, const SeqSpan& seq, int h, int64_t token,
                                                 int rows_valid, const E* a_s, int tid) {
  constexpr int kPieces = C * int(sizeof(E)) / 16;  // per row
  static_assert(NT == C * kPieces, "one piece per thread");
  int piece = tid, head = h;
  asm volatile("" : "+r"(piece), "+r"(head));  // addresses made here, not held through the chunk loop
  const int row = piece / kPieces, col = piece % kPieces * (16 / int(sizeof(E)));
  if (row >= rows_valid) return;
  E* dst = static_cast<E*>(p.intra.data) + token_offset(p.intra, seq, head, token + row) + col;
  *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(a_s + row * PA + col);
}

}  // namespace
}  // namespace flashgla::cuda::gla
