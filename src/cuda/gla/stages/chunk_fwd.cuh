// The stages of the general chunked forward (gla_fwd_chunk.cu): the steps of docs/algorithm.md as device functions
// named like their CPU twins in src/cpu/gla/stages.h (and FLA's): chunk_local_cumsum (step 1, here in product
// form, with chunk_fwd_operands building the gated operands from it), chunk_fwd_h (step 2, the state update),
// chunk_fwd_intra_offdiag / chunk_fwd_intra_diag / chunk_fwd_intra_store (steps 3-4, the intra-chunk scores over
// 16-token sub-chunks) and chunk_fwd_o_state / chunk_fwd_o_intra / chunk_fwd_o_store (step 5, the output). Every
// stage runs on the whole CTA with the kernel's tiles in shared memory; the kernel (chunk_forward_kernel)
// composes them and owns the loads and the barriers between stages.
//
// The kernel's generated code is the same as before the stages were named (scripts/ptx_same.sh). Two rules keep
// it so: the kernel owns the register arrays and aggregates the stages share or that several stages would
// each declare (GateFactors, the mma fragments of chunk_fwd_o_state and chunk_fwd_intra_offdiag) and passes
// them by reference (those of an inlined function are placed ahead of the kernel's own and change the order in
// which the compiler allocates the kernel's registers); and a stage receives what the kernel derives from the
// thread index in a form the compiler can bound (chunk_fwd_intra_diag takes warp and lane).
#pragma once

#include "cuda/gla/device/elements.cuh"
#include "cuda/gla/device/tiles.cuh"
#include "cuda/gla/device/warp_mma.cuh"
#include "cuda/gla/device/gla_fwd.cuh"

namespace flashgla::cuda::gla::stages {

// The general kernel's tile shape for element type E.
template <class E>
struct ChunkTile {
  static constexpr int C = kChunk, KS = kSlice, NT = kChunkThreads;
  static constexpr int kPairs = kChunkOffPairs;  // off-diagonal sub-chunk blocks (i, j), i > j, of 4 sub-chunks
  static constexpr int kDiagRows = 17;  // rows of the diagonal blocks each thread sums (two columns, 17 rows)
  static constexpr int kAlphaPitch = kChunkAlphaPitch;  // floats per row of α (shared-memory layout: layouts.h)
  // Row pitches (elements) of the operand tiles: padded so that fragment loads of a warp hit distinct banks.
  static constexpr int pad = sizeof(E) == 2 ? 8 : 4;
  static constexpr int PS = KS + pad;  // rows of one slice (32 keys)
  static constexpr int PC = C + pad;   // rows of one chunk (64 tokens)
  static constexpr int BV = sizeof(E) == 4 ? value_tile(Elem::f32) : value_tile(Elem::bf16);  // value columns
  static constexpr int CG = BV / 8;    // groups of 8 value columns: warp w owns group w % CG ...
  static constexpr int RW = 8 / CG;    // ... shared by RW warps (1 for bf16/fp16, 2 for fp32)
  static constexpr int MT_O = 4 / RW;  // 16-row tiles of O per warp
  static constexpr int MT_S = 2 / RW;  // 16-key tiles of the slice's state update per warp
};

// The gate factors of one group of 8 rows (warp) and one key column (lane) of a slice: references to register
// arrays of the kernel (see the top of this file), filled by chunk_local_cumsum and read by chunk_fwd_operands.
struct GateFactors {
  float (&a)[8];            // α = exp g of the group's rows
  float (&fwd)[8];          // within the group: forward products without the first row, ...
  float (&bwd)[8];          // ... backward products after each row
  float (&total)[8];        // each group's product
  float &before, &after;    // products over the groups before / after this one
  float (&kv)[8];           // scratch of chunk_fwd_operands: k of the group's rows
  float (&kd)[8];           // ... and k ⊙ exp(γ^C − Γ)
};

// docs/algorithm.md step 1, in product form: the gate factors of this slice from α = exp(g), never by exp of a
// difference (no factor exceeds 1); α to alpha_s (for the diagonal blocks), the groups' products to
// `totals`, exp(γ^C) to decay_s. Contains a barrier (the groups' products are exchanged).
template <class E>
__device__ __forceinline__ void chunk_local_cumsum(const ChunkParams& p, const unsigned char* graw,
                                                   const float* scalar_alpha, float* alpha_s, float* totals,
                                                   float* decay_s, float* split_decay_s, int slice, int rg,
                                                   int lane, GateFactors& f) {
  constexpr int KS = ChunkTile<E>::KS, kAlphaPitch = ChunkTile<E>::kAlphaPitch;
  const int r0 = 8 * rg;
  if (p.gate == Gate::vector) {
#pragma unroll
    for (int j = 0; j < 8; ++j) f.a[j] = __expf(load_as<float>(graw, (r0 + j) * KS + lane, p.g.dtype));
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) f.a[j] = p.gate == Gate::scalar ? scalar_alpha[r0 + j] : 1.f;
  }
  if (!p.states_only)
#pragma unroll
    for (int j = 0; j < 8; ++j) alpha_s[(r0 + j) * kAlphaPitch + lane] = f.a[j];
  // Within the group: forward products without the first row, backward products after each row.
  f.fwd[0] = 1.f;
#pragma unroll
  for (int j = 1; j < 8; ++j) f.fwd[j] = f.fwd[j - 1] * f.a[j];
  f.bwd[7] = 1.f;
#pragma unroll
  for (int j = 6; j >= 0; --j) f.bwd[j] = f.bwd[j + 1] * f.a[j + 1];
  totals[(0 * 8 + rg) * KS + lane] = f.a[0] * f.fwd[7];  // the group's product
  totals[(1 * 8 + rg) * KS + lane] = f.fwd[7];           // ... without its first row
  totals[(2 * 8 + rg) * KS + lane] = f.a[0];             // its first row
  __syncthreads();
#pragma unroll
  for (int j = 0; j < 8; ++j) f.total[j] = totals[j * KS + lane];
  f.before = 1.f, f.after = 1.f;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    if (j < rg) f.before *= f.total[j];
    if (j > rg) f.after *= f.total[j];
  }
  if (rg == 0) {
    const float chunk_decay = f.total[0] * f.after;
    decay_s[lane] = chunk_decay;
    if (p.states_only) split_decay_s[slice * KS + lane] *= chunk_decay;
  }
}

// The gated operands of the slice's products, from the gate factors: (k ⊙ exp(γ^C − Γ))^T for chunk_fwd_h,
// q ⊙ exp Γ for the output's share from the state, and the sub-chunk operands of the off-diagonal blocks of A
// (q_i ⊙ exp(Γ_i − γ_i^first), k_j ⊙ exp(γ_i^first − Γ_j); docs/algorithm.md step 3).
template <class E>
__device__ __forceinline__ void chunk_fwd_operands(const ChunkParams& p, const E* rq, const E* rk,
                                                   const float* totals, E* KdT, E* Qg, E* Qoff, E* Koff, int rg,
                                                   int lane, const GateFactors& f) {
  using T = ChunkTile<E>;
  constexpr int KS = T::KS, PS = T::PS, PC = T::PC;
  const int r0 = 8 * rg, sub = rg >> 1;
  float (&kv)[8] = f.kv;
  float (&kd)[8] = f.kd;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    kv[j] = to_float(rk[(r0 + j) * KS + lane]);
    kd[j] = kv[j] * f.bwd[j] * f.after;  // k ⊙ exp(γ^C − Γ_r)
  }
  store8(KdT + lane * PC + r0, kd);
  if (!p.states_only) {
    // exp(Γ_r − γ_first) of this sub-chunk: the group before (odd groups) contributes its product without its first row.
    const float lead = (rg & 1) ? totals[(1 * 8 + rg - 1) * KS + lane] : 1.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float qv = to_float(rq[(r0 + j) * KS + lane]);
      const float inclusive = f.a[0] * f.fwd[j];  // Π over this group's rows up to r
      Qg[(r0 + j) * PS + lane] = from_float<E>(qv * f.before * inclusive);
      if (sub > 0) Qoff[(r0 + j - 16) * PS + lane] = from_float<E>(qv * ((rg & 1) ? lead * inclusive : f.fwd[j]));
    }
#pragma unroll
    for (int target = 1; target < 4; ++target) {
      if (target <= sub) continue;
      // exp(γ_target^first − Γ_r) = (Π after r in this group) (Π of the groups in between) α(first row of target)
      float mid = totals[(2 * 8 + 2 * target) * KS + lane];
#pragma unroll
      for (int j = 0; j < 8; ++j)
        if (j > rg && j < 2 * target) mid *= f.total[j];
      E* dst = Koff + ((target * (target - 1) / 2 + sub) * 16 + r0 - 16 * sub) * PS + lane;
#pragma unroll
      for (int j = 0; j < 8; ++j) dst[j * PS] = from_float<E>(kv[j] * f.bwd[j] * mid);
    }
  }
}

// v of the chunk transposed (v^T, for chunk_fwd_h and chunk_fwd_o_intra); v_nonfinite set where this thread saw
// a NaN or Inf. vv: a register array of the kernel (scratch).
template <class E>
__device__ __forceinline__ void transpose_values(const E* raw_v, E* VT, int r0, int lane, bool& v_nonfinite,
                                                 float (&vv)[8]) {
  using T = ChunkTile<E>;
  constexpr int BV = T::BV, PC = T::PC;
#pragma unroll
  for (int half = 0; half < BV / 32; ++half) {
    const int col = lane + 32 * half;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      vv[j] = to_float(raw_v[(r0 + j) * BV + col]);
      v_nonfinite |= (__float_as_uint(vv[j]) & 0x7F800000u) == 0x7F800000u;
    }
    store8(VT + col * PC + r0, vv);
  }
}

// Step 5, the output's share from the state: O += (Q ⊙ exp Γ) S over this slice's keys (warp: row tiles of
// `part`, value columns of group cg). bf, af: fragments of the kernel (see the top of this file).
template <class E>
__device__ __forceinline__ void chunk_fwd_o_state(const float* S, int sp, const E* Qg, int slice, int cg, int part,
                                                  int lane, float (&o_acc)[ChunkTile<E>::MT_O][4],
                                                  typename Mma<E>::B& bf, typename Mma<E>::A& af) {
  using T = ChunkTile<E>;
  using M = Mma<E>;
  constexpr int KS = T::KS, PS = T::PS, MT_O = T::MT_O;
#pragma unroll
  for (int ks = 0; ks < KS / 16; ++ks) {
    bf = M::load_b_rows(S + (slice * KS + 16 * ks) * sp + 8 * cg, sp, lane);
#pragma unroll
    for (int mt = 0; mt < MT_O; ++mt) {
      af = M::load_a(Qg + 16 * (MT_O * part + mt) * PS + 16 * ks, PS, lane);
      M::mma(o_acc[mt], af, bf);
    }
  }
}

// docs/algorithm.md step 3: this slice's share of one off-diagonal 16×16 block (pair_i, j) of A, on tensor cores (warps
// 0..5, one block each). af, bf: fragments of the kernel.
template <class E>
__device__ __forceinline__ void chunk_fwd_intra_offdiag(const E* Qoff, const E* Koff, int warp, int pair_i, int lane,
                                                        float (&a_off)[2][4], typename Mma<E>::A& af,
                                                        typename Mma<E>::B& bf) {
  using T = ChunkTile<E>;
  using M = Mma<E>;
  constexpr int KS = T::KS, PS = T::PS;
#pragma unroll
  for (int ks = 0; ks < KS / 16; ++ks) {
    af = M::load_a(Qoff + (pair_i - 1) * 16 * PS + 16 * ks, PS, lane);
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      bf = M::load_b(Koff + (warp * 16 + 8 * nt) * PS + 16 * ks, PS, lane);
      M::mma(a_off[nt], af, bf);
    }
  }
}

// docs/algorithm.md step 4: this slice's share of the diagonal blocks, A_rc += Σ_k q_rk k_ck Π_{c<s≤r} α_sk in fp32
// (block dblk; each thread two columns, p8 and 15 − p8, and 4 keys kq of the slice).
template <class E>
__device__ __forceinline__ void chunk_fwd_intra_diag(const E* rq, const E* rk, const float* alpha_s, int warp, int lane,
                                                     float (&diag)[ChunkTile<E>::kDiagRows]) {
  using T = ChunkTile<E>;
  constexpr int KS = T::KS, kAlphaPitch = T::kAlphaPitch, kDiagRows = T::kDiagRows;
  // Computed here from the warp and the lane (in [0, 32)), not passed: the compiler then knows p8 < 16.
  const int dblk = warp >> 1, p8 = ((warp & 1) << 2) | ((lane & 31) >> 3), kq = lane & 7;
  const E* qrow = rq + 16 * dblk * KS + 4 * kq;
  const E* krow = rk + 16 * dblk * KS + 4 * kq;
  const float* arow = alpha_s + 16 * dblk * kAlphaPitch + 4 * kq;
  const int second_from = 16 - p8;  // rows of column p8 first, then of column 15 − p8
  const float4 k2 = load4(krow + (15 - p8) * KS);
  float4 d = load4(krow + p8 * KS);
  // Branch-free: at the switch to the second column d restarts from its key.
#pragma unroll
  for (int j = 0; j < kDiagRows; ++j) {
    const bool restart = j == second_from;
    const int r = j >= second_from ? j - 1 : p8 + j;
    if (j > 0) {
      const float4 al = load4(arow + r * kAlphaPitch);
      d.x = restart ? k2.x : d.x * al.x;
      d.y = restart ? k2.y : d.y * al.y;
      d.z = restart ? k2.z : d.z * al.z;
      d.w = restart ? k2.w : d.w * al.w;
    }
    const float4 qv = load4(qrow + r * KS);
    diag[j] = fmaf(qv.x, d.x, fmaf(qv.y, d.y, fmaf(qv.z, d.z, fmaf(qv.w, d.w, diag[j]))));
  }
}

// docs/algorithm.md step 2 on this slice's keys and this warp's columns: S ← diag(exp γ^C) S + (K ⊙ exp(γ^C − Γ))^T V.
template <class E>
__device__ __forceinline__ void chunk_fwd_h(float* S, int sp, const float* decay_s, const E* KdT, const E* VT,
                                            int slice, int cg, int part, int g4, int t4, int lane) {
  using T = ChunkTile<E>;
  using M = Mma<E>;
  constexpr int C = T::C, KS = T::KS, PC = T::PC, MT_S = T::MT_S;
#pragma unroll
  for (int mt = 0; mt < MT_S; ++mt) {
    const int key = 16 * (MT_S * part + mt) + g4;  // rows key and key + 8 of the fragment
    float* s0 = S + (slice * KS + key) * sp + 8 * cg + 2 * t4;
    float* s1 = s0 + 8 * sp;
    const float d0 = decay_s[key], d1 = decay_s[key + 8];
    float acc[4] = {s0[0] * d0, s0[1] * d0, s1[0] * d1, s1[1] * d1};
#pragma unroll
    for (int ks = 0; ks < C / 16; ++ks) {
      const auto af = M::load_a(KdT + 16 * (MT_S * part + mt) * PC + 16 * ks, PC, lane);
      const auto bf = M::load_b(VT + 8 * cg * PC + 16 * ks, PC, lane);
      M::mma(acc, af, bf);
    }
    *reinterpret_cast<float2*>(s0) = make_float2(acc[0], acc[1]);
    *reinterpret_cast<float2*>(s1) = make_float2(acc[2], acc[3]);
  }
}

// A of the chunk into Amat (E, causal mask applied), from the diagonal partial sums (reduced over the 8
// key groups of a warp) and the off-diagonal blocks; resets both accumulators. Contains barriers: before
// (the slice operands that Amat aliases are free) and after (A is complete).
template <class E>
__device__ __forceinline__ void chunk_fwd_intra_store(E* Amat, int tid, int warp, int dblk, int p8, int kq,
                                                      int pair_i, int pair_j, int g4, int t4,
                                                      float (&diag)[ChunkTile<E>::kDiagRows], float (&a_off)[2][4]) {
  using T = ChunkTile<E>;
  constexpr int PC = T::PC, NT = T::NT, kDiagRows = T::kDiagRows, kPairs = T::kPairs;
#pragma unroll
  for (int j = 0; j < kDiagRows; ++j) {
    diag[j] += __shfl_xor_sync(0xffffffffu, diag[j], 1);
    diag[j] += __shfl_xor_sync(0xffffffffu, diag[j], 2);
    diag[j] += __shfl_xor_sync(0xffffffffu, diag[j], 4);
  }
  __syncthreads();
  if (kq == 0) {
    E* block = Amat + 16 * dblk * PC + 16 * dblk;
#pragma unroll
    for (int j = 0; j < kDiagRows; ++j) {
      const bool second = j >= 16 - p8;
      block[(second ? j - 1 : p8 + j) * PC + (second ? 15 - p8 : p8)] = from_float<E>(diag[j]);
    }
  }
#pragma unroll
  for (int j = 0; j < kDiagRows; ++j) diag[j] = 0.f;
  for (int i = tid; i < 4 * 256; i += NT) {  // causal mask: zero above the diagonal of the diagonal blocks
    const int b = i >> 8, r = (i >> 4) & 15, col = i & 15;
    if (col > r) Amat[(16 * b + r) * PC + 16 * b + col] = from_float<E>(0.f);
  }
  if (warp < kPairs) {
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      E* at = Amat + (16 * pair_i + g4) * PC + 16 * pair_j + 8 * nt + 2 * t4;
      at[0] = from_float<E>(a_off[nt][0]);
      at[1] = from_float<E>(a_off[nt][1]);
      at[8 * PC] = from_float<E>(a_off[nt][2]);
      at[8 * PC + 1] = from_float<E>(a_off[nt][3]);
#pragma unroll
      for (int e = 0; e < 4; ++e) a_off[nt][e] = 0.f;
    }
  }
  __syncthreads();
}

// The output's intra-chunk share: O += (A ⊙ M) V, row block m up to its sub-chunk m. Where the chunk's v holds
// a NaN or Inf the diagonal block goes row by row up to the diagonal (see the CPU's chunk_fwd_o_intra).
template <class E>
__device__ __forceinline__ void chunk_fwd_o_intra(const E* Amat, const E* VT, bool v_nonfinite, int cg, int part,
                                                  int g4, int t4, int lane, float (&o_acc)[ChunkTile<E>::MT_O][4]) {
  using T = ChunkTile<E>;
  using M = Mma<E>;
  constexpr int PC = T::PC, MT_O = T::MT_O;
#pragma unroll
  for (int mt = 0; mt < MT_O; ++mt) {
    const int m = MT_O * part + mt;
    for (int ks = 0; ks <= m; ++ks) {
      if (ks == m && v_nonfinite) {
        // The diagonal block's product would multiply the zeros above the diagonal of A by later rows of v: a
        // NaN or Inf there would reach earlier outputs. Row by row up to the diagonal instead (rare chunks).
        const E* a_rows = Amat + 16 * m * PC + 16 * m;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = g4 + 8 * (e >> 1), col = 8 * cg + 2 * t4 + (e & 1);
          float sum = 0.f;
          for (int b = 0; b <= r; ++b)
            sum = fmaf(to_float(a_rows[r * PC + b]), to_float(VT[col * PC + 16 * m + b]), sum);
          o_acc[mt][e] += sum;
        }
        break;
      }
      const auto af = M::load_a(Amat + 16 * m * PC + 16 * ks, PC, lane);
      const auto bf = M::load_b(VT + 8 * cg * PC + 16 * ks, PC, lane);
      M::mma(o_acc[mt], af, bf);
    }
  }
}

// o = scale · O of the chunk, staged in `otile` (pitch OP elements) for whole-row stores; resets O.
template <class E>
__device__ __forceinline__ void chunk_fwd_o_store(const ChunkParams& p, E* otile, const SeqSpan& seq, int h,
                                                  int64_t c, int rows_valid, int v0, int V, int tid, int cg, int part, int g4, int t4,
                                                  float (&o_acc)[ChunkTile<E>::MT_O][4]) {
  using T = ChunkTile<E>;
  constexpr int C = T::C, NT = T::NT, BV = T::BV, MT_O = T::MT_O;
  constexpr int OP = BV + T::pad;  // pitch (elements) of the staged tile
#pragma unroll
  for (int mt = 0; mt < MT_O; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      E* at = otile + (16 * (MT_O * part + mt) + g4 + 8 * half) * OP + 8 * cg + 2 * t4;
      at[0] = from_float<E>(p.scale * o_acc[mt][2 * half]);
      at[1] = from_float<E>(p.scale * o_acc[mt][2 * half + 1]);
      o_acc[mt][2 * half] = o_acc[mt][2 * half + 1] = 0.f;
    }
  }
  __syncthreads();
  store_tile_unpadded(p.o.data, p.o.rows16, p.o.stride[3], sizeof(E),
             seq.batch * p.o.stride[0] + (seq.begin + c * C) * p.o.stride[1] + h * p.o.stride[2], p.o.stride[1], C,
             rows_valid, v0, V, BV, otile, OP * sizeof(E), tid, NT);
}

}  // namespace flashgla::cuda::gla::stages
