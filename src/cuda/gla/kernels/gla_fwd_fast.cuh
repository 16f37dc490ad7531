// The kernels of the chunked GLA forward's fast path: bf16/fp16 inputs, K ≤ 128
// (the Hopper path takes 128 < K ≤ 256 on sm_90a; the general kernel in
// gla_fwd_chunk.cu serves everything else). This file: the vector gate's kernel
// and the launch of both; a scalar gate or none: gla_fwd_fast_scalar.cuh.
//
// One CTA of 16 warps per (sequence, head, value tile of 64 or 128 columns,
// sequence split), one CTA per SM. It walks its chunks of
// C = 64 tokens in order, with the whole key width (padded to
// KP = 64 or 128) in every phase: four barriers per chunk instead of three per
// 32-key slice.
//   * State: S [KP × BV] fp32 lives in registers as mma accumulator fragments
//     (warp w owns key tile w % (KP/16) and a run of value columns); a bf16
//     copy in shared memory feeds (Q ⊙ exp Γ) S.
//   * Gate factors: only products of α = exp(g) ≤ 1 (groups of 8 rows, their
//     totals exchanged through shared memory), as in gla_fwd_chunk.cu, so
//     gates of −20 per step underflow to 0 and never overflow.
//   * Intra-chunk A, built once per chunk: the 8×8 lower triangles on the
//     diagonal in fp32 on CUDA cores (each lane accumulates its keys for the
//     36 entries of its row group in registers, then a reduce-scatter over
//     the warp's lanes); every other block below the diagonal on tensor
//     cores, each with a reference row between its rows and columns:
//       rows 16–31 × cols 0–15 and rows 48–63 × cols 32–47 (reference: the
//       first row of the row block), rows 32–63 × cols 0–31 (row 32), and the
//       8×8 blocks rows 8–15 × cols 0–7 of each 16-row block (its row 8).
//   * Loads (cp.async, 16-byte pieces, rows16): q, k, v of the next chunk
//     a whole chunk ahead (double buffers; Qg and Kd are built over q and k in
//     place), g of the next chunk once this chunk's operands are built. An fp32
//     vector gate (twice the bytes of its own region) goes to the off-diagonal
//     operand area instead, issued once the tensor-core phase is done with it.
// Per chunk: [wait, B0] (q k v prefetch) P1: α, group totals, diagonal triangles [B1]
// P2: operands Qg, Kd, the off-diagonal operands [B2] (g prefetch)
// M: off-diagonal A, O = Qg S, S ← diag(decay) S + Kd^T V [B3]
// bf16 S, O += A V, o stored.
// The sequence split and its states pass work as in gla_fwd_chunk.cu; with
// split_prefix (the states kernel of gla_fwd_states.cuh) the start state of
// split s is one slot (h0 decayed + the state from a zero start), not a fold
// over the s earlier splits.
#pragma once

#include <algorithm>
#include <type_traits>

#include "cuda/common/host.cuh"
#include "cuda/gla/device/elements.cuh"
#include "cuda/gla/device/split_chunks.cuh"
#include "cuda/gla/device/tiles.cuh"
#include "cuda/gla/device/warp_mma.cuh"

#include "cuda/gla/device/gla_fwd.cuh"
#include "cuda/gla/kernels/gla_fwd_fast_scalar.cuh"
#include "cuda/gla/stages/chunk_fwd_fast.cuh"

namespace flashgla::cuda::gla {
namespace {

// A vector gate (a scalar gate or none: gla_fwd_fast_scalar.cuh). G: the gate's element type (E, or float with
// bf16/fp16 inputs).
template <class E, class G, int KP, int BV>
__global__ void __launch_bounds__(NT, 1) fast_chunk_kernel(const ChunkParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  using L = FastLayout<KP, BV>;
  // A gate wider than E lives in the off-diagonal operand area (qo, ko), free from B3 to B1.
  constexpr bool kGateInOperands = sizeof(G) > sizeof(E);
  static_assert(!kGateInOperands || C * KP * sizeof(G) <= L::s - L::qo, "fp32 gate fits the operand area");
  using M = Mma<E>;
  constexpr int P = L::P, PV = L::PV, PA = L::PA;
  constexpr int KT = KP / 16;                // key tiles of the state
  constexpr int NS = (BV / 8) * KT / NW;     // state column tiles (8 wide) per warp
  constexpr int NO = (BV / 8) / 4;           // output column tiles per warp
  constexpr int KPL = KP / 64;               // keys per lane in P1/P2
  static_assert(NS % 2 == 0 && NO % 2 == 0 && KPL >= 1, "tile split");
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g4 = lane >> 2, t4 = lane & 3;
  const int64_t nh = blockIdx.x;
  const int64_t n = nh / p.heads;
  const int h = int(nh % p.heads);
  const int K = p.key_dim, V = p.value_dim;
  const int v0 = int(blockIdx.y) * BV;
  const int split = blockIdx.z;

  const SplitChunks chunks = split_chunks(p, n);
  if (chunks.idle(split, p.states_only)) return;
  const SeqSpan seq = chunks.seq;
  const int64_t last_split = chunks.last_split, c_begin = chunks.begin(p, split), c_end = chunks.end(p, split);
  auto row_offset = [&](const View& t, int64_t token) { return token_offset(t, seq, h, token); };

  E* q_buf = reinterpret_cast<E*>(smem + L::q);
  E* k_buf = reinterpret_cast<E*>(smem + L::k);
  G* g_s = reinterpret_cast<G*>(smem + (kGateInOperands ? L::qo : L::g));
  E* v_buf = reinterpret_cast<E*>(smem + L::v);
  E* qo_s = reinterpret_cast<E*>(smem + L::qo);
  E* ko_s = reinterpret_cast<E*>(smem + L::ko);
  E* s_s = reinterpret_cast<E*>(smem + L::s);
  E* a_s = reinterpret_cast<E*>(smem + L::a);
  float2* totals_s = reinterpret_cast<float2*>(smem + L::totals);
  float* diag_s = reinterpret_cast<float*>(smem + L::diag);
  float* decay_s = reinterpret_cast<float*>(smem + L::decay);

  // ---- loads of one chunk: 16-byte cp.async pieces, zero outside the sequence / the dims (load_rows) ----
  // q, k, v go to the buffers of chunk c's parity (issued a chunk ahead); g has one buffer (issued after P2).
  auto issue_qkv = [&](int64_t c) {
    const int rows_valid = int(min(int64_t(C), seq.len - c * C));
    if (!p.states_only) load_rows<KP, NT>(q_buf + (c & 1) * C * P, P, p.q, seq, h, c * C, rows_valid, 0, K, tid);
    load_rows<KP, NT>(k_buf + (c & 1) * C * P, P, p.k, seq, h, c * C, rows_valid, 0, K, tid);
    load_rows<BV, NT>(v_buf + (c & 1) * C * PV, PV, p.v, seq, h, c * C, rows_valid, v0, V, tid);
  };
  auto issue_g = [&](int64_t c) {
    load_rows<KP, NT>(g_s, KP, p.g, seq, h, c * C, int(min(int64_t(C), seq.len - c * C)), 0, K, tid);
  };

  // ---- the state: h0 folded through the earlier splits (zero in the states pass) ----
  const int kt = warp % KT, ns0 = (warp / KT) * NS;
  float S[NS][4];
#pragma unroll
  for (int nt = 0; nt < NS; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = 16 * kt + g4 + (e >> 1) * 8, vg = v0 + 8 * (ns0 + nt) + 2 * t4 + (e & 1);
      float s = 0.f;
      if (!p.states_only && key < K && vg < V) {
        if (p.h0.data)
          s = static_cast<const float*>(p.h0.data)[n * p.h0.stride[0] + h * p.h0.stride[1] + key * p.h0.stride[2] +
                                                    vg * p.h0.stride[3]];
        if (!p.split_prefix)
          for (int prev = 0; prev < split; ++prev) {
            const int64_t slot = nh * (p.num_splits - 1) + prev;
            s = p.split_decay[slot * K + key] * s + p.split_states[(slot * K + key) * V + vg];
          }
      }
      S[nt][e] = s;
    }
  // split_prefix: one slot per split, straight-line loads (all elements' loads in flight together; the loop
  // above runs once per element, one memory latency after another).
  if (p.split_prefix && split > 0 && !p.states_only) {
    const int64_t slot = nh * (p.num_splits - 1) + split - 1;
#pragma unroll
    for (int nt = 0; nt < NS; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = 16 * kt + g4 + (e >> 1) * 8, vg = v0 + 8 * (ns0 + nt) + 2 * t4 + (e & 1);
        if (key < K && vg < V)
          S[nt][e] = p.split_decay[slot * K + key] * S[nt][e] + p.split_states[(slot * K + key) * V + vg];
      }
  }
  if (!p.states_only) store_state_tile<E, NS, PV>(s_s, S, kt, ns0, lane);
  // Entries above the diagonal of the 16×16 diagonal blocks of A are never written: zero once.
  for (int i = tid; i < C * PA; i += NT) a_s[i] = from_float<E>(0.f);

  if (c_begin < c_end) {
    issue_qkv(c_begin);
    issue_g(c_begin);
  }
  cp_async_commit_unordered();

  // P1/P2 roles: warp = (row group gr of 8 rows, key half kh), lane = KPL keys.
  const int gr = warp & 7, kh = warp >> 3, r0 = 8 * gr, sub = gr >> 1;
  const bool odd = gr & 1;
  const int key0 = kh * (KP / 2) + lane * KPL;
  float split_decay_acc[KPL];
#pragma unroll
  for (int e = 0; e < KPL; ++e) split_decay_acc[e] = 1.f;
  // α of this thread's 8 rows and KPL keys.
  auto alphas = [&](float (&a)[KPL][8]) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      float x[KPL];
      load_keys(g_s + (r0 + j) * KP + key0, x);
#pragma unroll
      for (int e = 0; e < KPL; ++e) a[e][j] = __expf(x[e]);
    }
  };

  for (int64_t c = c_begin; c < c_end; ++c) {
    const int rows_valid = int(min(int64_t(C), seq.len - c * C));
    const E* v_s = v_buf + (c & 1) * C * PV;
    E* q_s = q_buf + (c & 1) * C * P;  // q, then q ⊙ exp Γ
    E* k_s = k_buf + (c & 1) * C * P;  // k, then k ⊙ exp(γ^C − Γ)
    cp_async_wait_committed();
    __syncthreads();  // B0: this chunk's tiles are in; the previous chunk's products are done
    if (c + 1 < c_end) issue_qkv(c + 1);  // into the buffers the previous chunk has finished with
    cp_async_commit_unordered();

    // ---- P1: group totals of α; the diagonal 8×8 triangles of A (fp32, this lane's keys) ----
    float alpha[KPL][8];  // this thread's α (its 8 rows, its keys), kept for P2
    alphas(alpha);
    {
      float acc[kScatter];
#pragma unroll
      for (int i = 0; i < kScatter; ++i) acc[i] = 0.f;
#pragma unroll
      for (int e = 0; e < KPL; ++e) {
        const int key = key0 + e;
        const float (&a)[8] = alpha[e];
        float without_first = 1.f;
#pragma unroll
        for (int j = 1; j < 8; ++j) without_first *= a[j];
        totals_s[gr * KP + key] = make_float2(without_first, a[0]);
        if (!p.states_only) {
          float qv[8], kv[8];
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            qv[j] = to_float(q_s[(r0 + j) * P + key]);
            kv[j] = to_float(k_s[(r0 + j) * P + key]);
          }
          // A_rc += q_r k_c Π_{c<s≤r} α_s, the product built row by row.
#pragma unroll
          for (int col = 0; col < 8; ++col) {
            float d = kv[col];
#pragma unroll
            for (int r = col; r < 8; ++r) {
              if (r > col) d *= a[r];
              acc[r * (r + 1) / 2 + col] = fmaf(qv[r], d, acc[r * (r + 1) / 2 + col]);
            }
          }
        }
      }
      if (!p.states_only) {
        // Reduce-scatter over the 32 lanes: after 4 halvings each lane pair holds 3 sums.
#pragma unroll
        for (int level = 0; level < 4; ++level) {
          const int offset = 16 >> level, half = (kScatter / 2) >> level;
          const bool upper = lane & offset;
#pragma unroll
          for (int j = 0; j < kScatter / 2; ++j) {
            if (j >= half) continue;
            const float send = upper ? acc[j] : acc[j + half];
            const float keep = upper ? acc[j + half] : acc[j];
            acc[j] = keep + __shfl_xor_sync(0xffffffffu, send, offset);
          }
        }
#pragma unroll
        for (int j = 0; j < 3; ++j) acc[j] += __shfl_xor_sync(0xffffffffu, acc[j], 1);
        if (!(lane & 1)) {
          const int base = 24 * ((lane >> 4) & 1) + 12 * ((lane >> 3) & 1) + 6 * ((lane >> 2) & 1) + 3 * ((lane >> 1) & 1);
#pragma unroll
          for (int j = 0; j < 3; ++j)
            if (base + j < kTriangle) diag_s[(kh * 8 + gr) * kTriangle + base + j] = acc[j];
        }
      }
    }
    __syncthreads();  // B1: totals and triangles visible

    // ---- P2: operands of this chunk (Qg and Kd over q and k in place: each thread its own elements) ----
    if (!p.states_only && tid < 8 * kTriangle) {
      const int grp = tid / kTriangle, idx = tid - grp * kTriangle;
      int r = 0;
      while ((r + 1) * (r + 2) / 2 <= idx) ++r;
      const int col = idx - r * (r + 1) / 2;
      a_s[(8 * grp + r) * PA + 8 * grp + col] =
          from_float<E>(diag_s[grp * kTriangle + idx] + diag_s[(8 + grp) * kTriangle + idx]);
    }
    {
      // The off-diagonal operand rows (used in M) come in three pairs of which every group writes exactly one,
      // so each thread stores three rows per row j through fixed slots instead of six warp-uniform branches:
      //   slot 0: sub odd: qo row (sub == 1 ? 0 : 16) + 8·odd + j,  else ko row (sub == 0 ? 0 : 16) + 8·odd + j
      //   slot 1: gr ≥ 4:  qo row r0 + j,                          else ko row 32 + r0 + j
      //   slot 2: odd:     qo row 64 + 8·sub + j,                  else ko row 64 + 8·sub + j
      // (ko follows qo: its rows count from 96). The empty asm keeps the compiler from hoisting the slots out
      // of the chunk loop, which would hold 6 more registers through M and spill (the key offset too in the
      // 128×128 kernels without a gate: ptxas -v shows spills otherwise, and with it in the smaller ones).
      constexpr int kSlots = 3;
      int group = gr;
      const int first_key = key0;
      asm volatile("" : "+r"(group));
      const bool slot_query[kSlots] = {((group >> 1) & 1) != 0, group >= 4, (group & 1) != 0};
      const int slot_row[kSlots] = {16 * (group >> 2) + 8 * (group & 1), 8 * group + (group >= 4 ? 0 : 32),
                                    64 + 4 * (group & ~1)};
      int slot_offset[kSlots];  // elements from qo_s
#pragma unroll
      for (int s = 0; s < kSlots; ++s) slot_offset[s] = (slot_row[s] + (slot_query[s] ? 0 : 96)) * P + first_key;
      // Products over other groups (tot: a group's Π α = first · without_first), per key.
      float q_scale[KPL];             // Qg row j = q ⊙ fwd_j ⊙ q_scale
      float after[KPL];               // Kd row j = k ⊙ bwd_j ⊙ after
      float slot_scale[kSlots][KPL];  // slot s's row j = (q ⊙ fwd_j or k ⊙ bwd_j) ⊙ slot_scale[s]
      float bwd[KPL][8];              // Π over this group's rows after j
#pragma unroll
      for (int e = 0; e < KPL; ++e) {
        const int key = first_key + e;
        auto tot = [&](int i) { const float2 t = totals_s[i * KP + key]; return t.x * t.y; };
        float before = 1.f, k2_mid = 1.f;
        after[e] = 1.f;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          if (i < gr) before *= tot(i);
          if (i > gr) after[e] *= tot(i);
          if (i > gr && i < 4) k2_mid *= tot(i);
        }
        q_scale[e] = before * alpha[e][0];
        float q2_lead = gr > 5 ? tot(5) : 1.f;
        if (gr > 6) q2_lead *= tot(6);
        q2_lead *= gr > 4 ? totals_s[4 * KP + key].x : 1.f;
        const float k1_mid = !odd ? tot(gr + 1) : 1.f;
        // Slot factors (query side: applied to q ⊙ fwd_j; key side: to k ⊙ bwd_j).
        slot_scale[0][e] = sub & 1 ? (odd ? totals_s[(gr - 1) * KP + key].x * alpha[e][0] : 1.f)
                                   : k1_mid * totals_s[(2 * sub + 2) * KP + key].y;
        slot_scale[1][e] = gr >= 4 ? (gr == 4 ? 1.f : q2_lead * alpha[e][0]) : k2_mid * totals_s[4 * KP + key].y;
        slot_scale[2][e] = odd ? 1.f : totals_s[(gr + 1) * KP + key].y;
        if (gr == 0) {
          const float chunk_decay = tot(0) * after[e];
          decay_s[key] = chunk_decay;
          if (p.states_only) split_decay_acc[e] *= chunk_decay;
        }
        bwd[e][7] = 1.f;
#pragma unroll
        for (int j = 6; j >= 0; --j) bwd[e][j] = bwd[e][j + 1] * alpha[e][j + 1];
      }
      float fwd[KPL];  // Π over this group's rows 1..j
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int r = r0 + j;
        float kv[KPL], qv[KPL], out[KPL];
        load_keys(k_s + r * P + key0, kv);
#pragma unroll
        for (int e = 0; e < KPL; ++e) {
          fwd[e] = j == 0 ? 1.f : fwd[e] * alpha[e][j];
          kv[e] *= bwd[e][j];  // k ⊙ Π after j in this group
          out[e] = kv[e] * after[e];
        }
        store_keys(k_s + r * P + key0, out);
        if (p.states_only) continue;
        load_keys(q_s + r * P + key0, qv);
#pragma unroll
        for (int e = 0; e < KPL; ++e) qv[e] *= fwd[e], out[e] = qv[e] * q_scale[e];
        store_keys(q_s + r * P + key0, out);
#pragma unroll
        for (int s = 0; s < kSlots; ++s) {
#pragma unroll
          for (int e = 0; e < KPL; ++e) out[e] = (slot_query[s] ? qv[e] : kv[e]) * slot_scale[s][e];
          store_keys(qo_s + slot_offset[s] + j * P, out);
        }
      }
    }
    __syncthreads();  // B2: operands ready; g free
    if (!kGateInOperands && c + 1 < c_end) issue_g(c + 1);
    cp_async_commit_unordered();

    // ---- M: off-diagonal blocks of A (one 16×8 product per warp) ----
    if (!p.states_only) {
      int qo_row, ko_row, dst_row, dst_col;
      if (warp < 2) qo_row = 0, ko_row = 8 * warp, dst_row = 16, dst_col = 8 * warp;
      else if (warp < 4) qo_row = 16, ko_row = 16 + 8 * (warp - 2), dst_row = 48, dst_col = 32 + 8 * (warp - 2);
      else if (warp < 12) {
        const int u = warp - 4;
        qo_row = 32 + 16 * (u >> 2), ko_row = 32 + 8 * (u & 3), dst_row = 32 + 16 * (u >> 2), dst_col = 8 * (u & 3);
      } else {
        const int u = warp - 12, blk = 2 * (u >> 1) + (u & 1);  // 16-row block whose rows 8–15 × cols 0–7 this is
        qo_row = 64 + 16 * (u >> 1), ko_row = 64 + 8 * blk, dst_row = 16 * blk + 8 - 8 * (u & 1), dst_col = 16 * blk;
      }
      float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int ks = 0; ks < KT; ++ks)
        M::mma(acc, frag_a(qo_s + qo_row * P + 16 * ks, P, lane), frag_b(ko_s + ko_row * P + 16 * ks, P, lane));
      // The 8×8 blocks use one half of the fragment: rows 0–7 (u even) or 8–15 (u odd).
      const bool lower_only = warp >= 12 && (warp & 1), upper_only = warp >= 12 && !(warp & 1);
      E* at = a_s + (dst_row + g4) * PA + dst_col + 2 * t4;
      if (!lower_only) store2(at, acc[0], acc[1]);
      if (!upper_only) store2(at + 8 * PA, acc[2], acc[3]);
    }

    // ---- M: O = (Q ⊙ exp Γ) S (warp: rows 16·mo, NO column tiles) ----
    const int mo = warp & 3, no0 = (warp >> 2) * NO;
    float o[NO][4];
#pragma unroll
    for (int nt = 0; nt < NO; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.f;
    if (!p.states_only) {
      typename M::A af;
      typename M::B b0, b1;
      chunk_fwd_o_state<E, KP, BV>(o, c, mo, no0, af, b0, b1);
    }

    // ---- M: S ← diag(exp γ^C) S + (K ⊙ exp(γ^C − Γ))^T V ----
    {
      typename M::A af;
      typename M::B b0, b1;
      chunk_fwd_h<E, KP, BV>(S, c, af, b0, b1);
    }
    __syncthreads();  // B3: A complete; every warp done reading the bf16 state and the operand area
    if constexpr (kGateInOperands) {
      if (c + 1 < c_end) issue_g(c + 1);
      cp_async_commit_unordered();
    }

    if (p.states_only) continue;
    store_state_tile<E, NS, PV>(s_s, S, kt, ns0, lane);

    chunk_fwd_o_intra<E, NO, PA, PV>(o, a_s, v_s, mo, no0, lane);

    // ---- o = scale · O ----
    const float o_scale[2] = {p.scale, p.scale};
    store_fragment_rows<E, NO>(static_cast<E*>(p.o.data) + row_offset(p.o, c * C), p.o.stride[1], o, o_scale,
                               16 * mo, v0 + 8 * no0, V, rows_valid, lane);
    // (after o: fewer registers live; a_s stays until the next chunk's B1)
    if (p.intra.data && v0 == 0) store_intra_rows<E, PA>(p, seq, h, c * C, rows_valid, a_s, tid);
  }

  // ---- the state: this split's piece (states pass) or the final state ----
  if (p.states_only) {
    const int64_t slot = nh * (p.num_splits - 1) + split;
#pragma unroll
    for (int nt = 0; nt < NS; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = 16 * kt + g4 + (e >> 1) * 8, vg = v0 + 8 * (ns0 + nt) + 2 * t4 + (e & 1);
        if (key < K && vg < V) p.split_states[(slot * K + key) * V + vg] = S[nt][e];
      }
    if (v0 == 0 && gr == 0)
#pragma unroll
      for (int e = 0; e < KPL; ++e)
        if (key0 + e < K) p.split_decay[slot * K + key0 + e] = split_decay_acc[e];
  } else if (split == last_split && p.ht.data) {
    store_final_state<NS>(p, S, n, h, kt, ns0, v0, lane);
  }
}

// One of the fast kernels, with the fast path's shared memory (FastLayout; the scalar-gate kernel's ends at its
// tables) and, where two blocks share an SM, the carveout that lets their shared memory in.
template <int KP, int BV>
void launch_fast_kernel(void (*kernel)(ChunkParams), const ChunkParams& p, dim3 grid, cudaStream_t stream,
                        int bytes = FastLayout<KP, BV>::bytes, int blocks_per_sm = 1) {
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
             "cudaFuncSetAttribute (GLA fast chunk kernel)");
  if (blocks_per_sm > 1)
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                    cudaSharedmemCarveoutMaxShared),
               "cudaFuncSetAttribute (GLA fast chunk kernel carveout)");
  kernel<<<grid, NT, bytes, stream>>>(p);
  check_cuda(cudaGetLastError(), "GLA fast chunk kernel launch");
}
template <class E, int KP, int BV, Gate GK, bool NORM>
void launch_fast_scalar_kernel(const ChunkParams& p, dim3 grid, cudaStream_t stream) {
  launch_fast_kernel<KP, BV>(fast_scalar_chunk_kernel<E, KP, BV, GK, NORM>, p, grid, stream,
                             ScalarTables<KP, BV>::end, kFastScalarBlocksPerSm<KP, BV>);
}

template <class E, int KP, int BV>
void launch(const ChunkParams& p, dim3 grid, cudaStream_t stream) {
  // The scalar-gate kernel reads a split's start state from one slot (split_prefix) and has no states pass.
  const bool scalar_kernel_applies = !p.states_only && (p.num_splits == 1 || p.split_prefix);
  if (p.gate != Gate::vector && !scalar_kernel_applies)
    check::fail(ErrorKind::runtime, "q", "internal: the fast scalar-gate kernel needs the split prefix slots");
  switch (p.gate) {
    case Gate::vector:
      if (p.g.dtype == Elem::f32)
        return launch_fast_kernel<KP, BV>(fast_chunk_kernel<E, float, KP, BV>, p, grid, stream);
      return launch_fast_kernel<KP, BV>(fast_chunk_kernel<E, E, KP, BV>, p, grid, stream);
    case Gate::scalar:
      return launch_fast_scalar_kernel<E, KP, BV, Gate::scalar, false>(p, grid, stream);
    case Gate::none:
      if (p.normalize) return launch_fast_scalar_kernel<E, KP, BV, Gate::none, true>(p, grid, stream);
      return launch_fast_scalar_kernel<E, KP, BV, Gate::none, false>(p, grid, stream);
  }
}

}  // namespace

// The fast path for one input type: the tile shape from K and V. Instantiated in gla_fwd_fast.cu (bf16) and
// gla_fwd_fast_f16.cu (fp16), which compile in parallel.
template <class E>
void launch_fast_typed(const ChunkParams& p, dim3 grid, cudaStream_t stream) {
  const bool wide_keys = p.key_dim > 64, wide_values = p.value_dim > 64;
  if (wide_keys && wide_values) return launch<E, 128, 128>(p, grid, stream);
  if (wide_keys) return launch<E, 128, 64>(p, grid, stream);
  if (wide_values) return launch<E, 64, 128>(p, grid, stream);
  return launch<E, 64, 64>(p, grid, stream);
}

}  // namespace flashgla::cuda::gla
