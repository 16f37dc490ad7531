// The fast chunked forward for a scalar gate (chunk_simple_gla, g and/or g_gamma) or none (chunk_linear_attn,
// with or without its normaliser): bf16/fp16 inputs, K ≤ 128, the fast path's grid, tiles and shared-memory
// layout (gla_fwd_fast.cuh, FastLayout).
//
// With one decay per token the intra-chunk block is (Q Kᵀ) ⊙ D, D_ij = exp(Γ_i − Γ_j) for j ≤ i: one
// tensor-core product and a scale of its fragments, with no gate factors in the operands. Per chunk, with two
// barriers (the vector-gate kernel has four):
//   [wait, B0]  q k v of the next chunk issued; the last warp scans the next chunk's gate into its decay tables.
//   M:          A = (Q Kᵀ) ⊙ D on and below the diagonal (20 blocks of 16×8, warp w: block w, and 16 + w);
//               O = Q S; S ← exp(Γ_C) S + (K ⊙ w)ᵀ V, w_j = exp(Γ_C − Γ_j) applied to the fragments of Kᵀ.
//   [B3]        bf16 S; O ← diag(exp Γ) O + A V; o stored.
// The decays come from the chunk's tables of Γ (device/decay_tables.cuh: prefix sums, −inf steps as cuts).
// NORM (no gate): o_t is divided by den_t = scale · q_t·z_t + 1e-10, z_t = z (at the chunk's start) +
// Σ_{s ≤ t} k_s of the chunk: q_t·z_t = q_t·z + the row sum of A, A's 16-bit copy (the one O's product reads)
// times a column of ones in chunk_fwd_o_intra, so that each row's weights sum to its den. z walks with
// the state, as one more accumulator tile of the warps of the last value columns (Kᵀ times a column of ones);
// Q z is one more output tile, with z in two 16-bit halves (hi + lo: 16 bits of z's mantissa). Where asked, den_t
// and z at each chunk's start are kept for the backward (ChunkParams::norm_den, norm_chunk_z).
#pragma once

#include "cuda/gla/device/decay_tables.cuh"
#include "cuda/gla/device/elements.cuh"
#include "cuda/gla/device/split_chunks.cuh"
#include "cuda/gla/device/tiles.cuh"
#include "cuda/gla/device/warp_mma.cuh"

#include "cuda/gla/device/gla_fwd.cuh"
#include "cuda/gla/stages/chunk_fwd_fast.cuh"

namespace flashgla::cuda::gla {
namespace {

// The scalar kernel's own tables, in FastLayout's off-diagonal operand area (qo, ko), which it does not use;
// its shared memory ends with them.
template <int KP, int BV>
struct ScalarTables {
  using L = FastLayout<KP, BV>;
  static constexpr int log_decay = L::qo;               // [2 buffers][C] float2: (Γ_i, cuts up to i)
  static constexpr int weights = log_decay + 2 * C * 8;  // [2][C] float2: (exp Γ_i, w_i = exp(Γ_C − Γ_i))
  static constexpr int z = weights + 2 * C * 8;          // NORM: [2 halves, hi and lo][KP] E: z at the chunk's start
  static constexpr int qz = z + 2 * KP * 4;              // NORM: [C] q_i·z
  static constexpr int end = qz + C * 4;
  static_assert(end <= L::g, "the tables fit the operand area");
};

// Blocks per SM: two at K = V = 64, where two blocks' shared memory fits (each block's loads and barriers then
// hide behind the other's work), so the registers are capped at 64; one at the wider shapes.
template <int KP, int BV>
inline constexpr int kFastScalarBlocksPerSm = KP == 64 && BV == 64 ? 2 : 1;

// One gate element's bits as loaded (an f64's two words; a 16-bit element in the low half), and as a float.
__device__ __forceinline__ uint2 load_bits(const View& g, int64_t offset) {
  switch (g.dtype) {
    case Elem::f64: return reinterpret_cast<const uint2*>(g.data)[offset];
    case Elem::f32: return make_uint2(reinterpret_cast<const uint32_t*>(g.data)[offset], 0u);
    default: return make_uint2(reinterpret_cast<const uint16_t*>(g.data)[offset], 0u);
  }
}
__device__ __forceinline__ float float_of_bits(uint2 bits, Elem dtype) {
  switch (dtype) {
    case Elem::f64: return float(__hiloint2double(int(bits.y), int(bits.x)));
    case Elem::f32: return __uint_as_float(bits.x);
    case Elem::bf16: return widen<bf16>(bits.x);
    default: return widen<__half>(bits.x);
  }
}

// A 16-bit pair scaled by (lo, hi), rounded back to E.
template <class E>
__device__ __forceinline__ uint32_t scale_pair(uint32_t pair, float lo, float hi) {
  return pack_pair<E>(widen<E>(pair & 0xffffu) * lo, widen<E>(pair >> 16) * hi);
}

// Hooks on each loaded fragment of Kᵀ (keys × tokens 16·ks ..) in chunk_fwd_h_accumulate.
// K̂ = K ⊙ w on the fly: the fragment times its tokens' w (weights table .y).
template <class E>
struct DecayToChunkEnd {
  const float2* weights;
  __device__ __forceinline__ void operator()(typename Mma<E>::A& a, int ks, int lane) const {
    const int t = 16 * ks + 2 * (lane & 3);
    const float w0 = weights[t].y, w1 = weights[t + 1].y, w8 = weights[t + 8].y, w9 = weights[t + 9].y;
    a.x[0] = scale_pair<E>(a.x[0], w0, w1), a.x[1] = scale_pair<E>(a.x[1], w0, w1);
    a.x[2] = scale_pair<E>(a.x[2], w8, w9), a.x[3] = scale_pair<E>(a.x[3], w8, w9);
  }
};

// NORM: z += Kᵀ 1, the fragment times a column of ones (column 0 of 8) into the accumulator tile z.
template <class E>
struct KeySums {
  float (&z)[4];
  bool active;  // the warp holds z (warp-uniform)
  __device__ __forceinline__ void operator()(const typename Mma<E>::A& a, int, int lane) const {
    if (!active) return;
    typename Mma<E>::B ones;
    ones.x[0] = ones.x[1] = (lane >> 2) == 0 ? Mma<E>::pack(1.f, 1.f) : 0u;
    Mma<E>::mma(z, a, ones);
  }
};

template <class E, int KP, int BV, Gate GK, bool NORM>
__global__ void __launch_bounds__(NT, (kFastScalarBlocksPerSm<KP, BV>))
    fast_scalar_chunk_kernel(const ChunkParams p) {
  static_assert(GK == Gate::scalar || GK == Gate::none, "a scalar gate or none");
  static_assert(!NORM || GK == Gate::none, "the normaliser comes without a gate");
  using L = FastLayout<KP, BV>;
  using T = ScalarTables<KP, BV>;
  using M = Mma<E>;
  constexpr int P = L::P, PV = L::PV, PA = L::PA;
  constexpr int KT = KP / 16;             // key tiles of the state
  constexpr int NS = (BV / 8) * KT / NW;  // state column tiles (8 wide) per warp
  constexpr int NO = (BV / 8) / 4;        // output column tiles per warp
  static_assert(NS % 2 == 0 && NO % 2 == 0, "tile split");
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g4 = lane >> 2, t4 = lane & 3;
  const int64_t nh = blockIdx.x;
  const int64_t n = nh / p.heads;
  const int h = int(nh % p.heads);
  const int K = p.key_dim, V = p.value_dim;
  const int v0 = int(blockIdx.y) * BV;
  const int split = blockIdx.z;

  const SplitChunks chunks = split_chunks(p, n);
  if (chunks.idle(split, false)) return;
  const SeqSpan seq = chunks.seq;
  const int64_t c_begin = chunks.begin(p, split), c_end = chunks.end(p, split);
  auto row_offset = [&](const View& t, int64_t token) { return token_offset(t, seq, h, token); };

  E* q_buf = reinterpret_cast<E*>(smem + L::q);
  E* k_buf = reinterpret_cast<E*>(smem + L::k);
  E* v_buf = reinterpret_cast<E*>(smem + L::v);
  E* s_s = reinterpret_cast<E*>(smem + L::s);
  E* a_s = reinterpret_cast<E*>(smem + L::a);
  float2* log_decay_s = reinterpret_cast<float2*>(smem + T::log_decay);
  float2* weights_s = reinterpret_cast<float2*>(smem + T::weights);
  E* z_s = reinterpret_cast<E*>(smem + T::z);
  float* qz_s = reinterpret_cast<float*>(smem + T::qz);

  auto issue_qkv = [&](int64_t c) {
    const int rows_valid = int(min(int64_t(C), seq.len - c * C));
    load_rows<KP, NT>(q_buf + (c & 1) * C * P, P, p.q, seq, h, c * C, rows_valid, 0, K, tid);
    load_rows<KP, NT>(k_buf + (c & 1) * C * P, P, p.k, seq, h, c * C, rows_valid, 0, K, tid);
    load_rows<BV, NT>(v_buf + (c & 1) * C * PV, PV, p.v, seq, h, c * C, rows_valid, v0, V, tid);
  };
  // The gate travels a chunk ahead in the last warp's registers (the warp without a second block of A), rows
  // 2·lane and 2·lane + 1, as loaded bits: converted where the tables are written, a chunk later (arithmetic on
  // them here would wait for the load).
  constexpr int kGateWarp = NW - 1;
  uint2 gate_bits[2] = {};
  const float head_gamma = GK == Gate::scalar ? head_decay(p.g_gamma, h) : 0.f;
  auto fetch_gates = [&](int64_t c) {
    if constexpr (GK == Gate::scalar) {
      if (warp != kGateWarp) return;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int64_t t = c * C + 2 * lane + i;
        if (t < seq.len) gate_bits[i] = load_bits(p.g, row_offset(p.g, t));
      }
    }
  };
  // The fetched chunk c's decay tables into buffer c & 1 (device/decay_tables.cuh); gates past the sequence are 0.
  auto write_tables = [&](int64_t c) {
    if constexpr (GK != Gate::scalar) return;
    if (warp != kGateWarp) return;
    float g[2];
#pragma unroll
    for (int i = 0; i < 2; ++i)
      g[i] = c * C + 2 * lane + i < seq.len ? head_gamma + float_of_bits(gate_bits[i], p.g.dtype) : 0.f;
    write_decay_tables(g, lane, log_decay_s + (c & 1) * C, weights_s + (c & 1) * C);
  };

  // ---- the state: h0, then the split's start (ChunkParams::split_prefix: one slot) ----
  const int kt = warp % KT, ns0 = (warp / KT) * NS;
  float S[NS][4];
#pragma unroll
  for (int nt = 0; nt < NS; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = 16 * kt + g4 + (e >> 1) * 8, vg = v0 + 8 * (ns0 + nt) + 2 * t4 + (e & 1);
      float s = 0.f;
      if (key < K && vg < V) {
        if (p.h0.data)
          s = static_cast<const float*>(p.h0.data)[n * p.h0.stride[0] + h * p.h0.stride[1] + key * p.h0.stride[2] +
                                                    vg * p.h0.stride[3]];
        if (split > 0) {
          const int64_t slot = nh * (p.num_splits - 1) + split - 1;
          s = p.split_decay[slot * K + key] * s + p.split_states[(slot * K + key) * V + vg];
        }
      }
      S[nt][e] = s;
    }
  // NORM: z of keys 16·kt + g4 (z[0]) and + 8 (z[2]) in lanes t4 = 0 of the last KT warps (those of the last
  // value columns; the first four have a second block of A, the next four Q z), 0 elsewhere; from z_init, or
  // from the key prefix pass's slot of the split's first chunk (ChunkParams::norm_z).
  float z[4] = {0.f, 0.f, 0.f, 0.f};
  const bool holds_z = NORM && warp >= NW - KT;
  if (holds_z && t4 == 0)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int key = 16 * kt + g4 + 8 * half;
      if (key >= K) continue;
      if (p.norm_z) {
        const int64_t slot = norm::first_slot(p.norm_slots, n, seq.begin) + c_begin;
        z[2 * half] = p.norm_z[(slot * p.heads + h) * K + key];
      } else if (p.z_init.data) {
        z[2 * half] = load_as<float>(p.z_init.data, offset3(p.z_init, n, h, key), p.z_init.dtype);
      }
    }
  auto store_state_bf16 = [&] {
    store_state_tile<E, NS, PV>(s_s, S, kt, ns0, lane);
    if (holds_z && t4 == 0)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const E hi = from_float<E>(z[2 * half]);
        z_s[16 * kt + g4 + 8 * half] = hi;
        z_s[KP + 16 * kt + g4 + 8 * half] = from_float<E>(z[2 * half] - to_float(hi));
      }
  };
  store_state_bf16();

  if (c_begin < c_end) {
    issue_qkv(c_begin);
    fetch_gates(c_begin);
  }
  cp_async_commit_unordered();
  write_tables(c_begin);
  if (c_begin + 1 < c_end) fetch_gates(c_begin + 1);

  // This warp's blocks of A: block u is rows 16·mo, columns 8·cb (cb ≤ 2·mo + 1), numbered row block by row
  // block (the first of row block mo is mo·(mo + 1)).
  auto a_block = [&](int u, const E* q_s, const E* k_s, const float2* log_decay) {
    const int mo = u < 2 ? 0 : u < 6 ? 1 : u < 12 ? 2 : 3, cb = u - mo * (mo + 1);
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int ks = 0; ks < KT; ++ks)
      M::mma(acc, frag_a(q_s + 16 * mo * P + 16 * ks, P, lane), frag_b(k_s + 8 * cb * P + 16 * ks, P, lane));
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = 16 * mo + g4 + 8 * (e >> 1), j = 8 * cb + 2 * t4 + (e & 1);
      if constexpr (GK == Gate::scalar) {
        acc[e] = j <= i ? acc[e] * decay_between(log_decay[i], log_decay[j]) : 0.f;
      } else {
        acc[e] = j <= i ? acc[e] : 0.f;
      }
    }
    E* at = a_s + (16 * mo + g4) * PA + 8 * cb + 2 * t4;
    store2(at, acc[0], acc[1]);
    store2(at + 8 * PA, acc[2], acc[3]);
  };

  for (int64_t c = c_begin; c < c_end; ++c) {
    const int b = int(c & 1);
    const int rows_valid = int(min(int64_t(C), seq.len - c * C));
    const E* q_s = q_buf + b * C * P;
    const E* k_s = k_buf + b * C * P;
    const E* v_s = v_buf + b * C * PV;
    const float2* weights = weights_s + b * C;
    cp_async_wait_committed();
    __syncthreads();  // B0: this chunk's tiles and tables are in; the previous chunk's products are done
    if (c + 1 < c_end) {
      issue_qkv(c + 1);  // into the buffers the previous chunk has finished with
      write_tables(c + 1);
      if (c + 2 < c_end) fetch_gates(c + 2);
    }
    cp_async_commit_unordered();

    if (NORM && p.norm_chunk_z && holds_z && t4 == 0 && blockIdx.y == 0) {  // z at this chunk's start
      const int64_t slot = norm::first_slot(p.norm_slots, n, seq.begin) + c;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int key = 16 * kt + g4 + 8 * half;
        if (key < K) p.norm_chunk_z[(slot * p.heads + h) * K + key] = z[2 * half];
      }
    }

    // ---- M: A = (Q Kᵀ) ⊙ D ----
    a_block(warp, q_s, k_s, log_decay_s + b * C);
    if (warp < 4) a_block(16 + warp, q_s, k_s, log_decay_s + b * C);
    if (NORM && warp >= 4 && warp < 8) {  // q_i·z for rows 16·(warp − 4) ..: Q times the columns (z hi, z lo, 0 ..)
      const int mo = warp - 4;
      float qz[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int ks = 0; ks < KT; ++ks) {
        typename M::B zb;
        const E* half = z_s + (g4 == 1 ? KP : 0) + 16 * ks + 2 * t4;
        zb.x[0] = g4 < 2 ? M::word(half) : 0u, zb.x[1] = g4 < 2 ? M::word(half + 8) : 0u;
        M::mma(qz, frag_a(q_s + 16 * mo * P + 16 * ks, P, lane), zb);
      }
      if (t4 == 0) qz_s[16 * mo + g4] = qz[0] + qz[1], qz_s[16 * mo + g4 + 8] = qz[2] + qz[3];
    }

    // ---- M: O = Q S (warp: rows 16·mo, NO column tiles) ----
    const int mo = warp & 3, no0 = (warp >> 2) * NO;
    float o[NO][4];
#pragma unroll
    for (int nt = 0; nt < NO; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.f;
    {
      typename M::A af;
      typename M::B b0, b1;
      chunk_fwd_o_state<E, KP, BV>(o, c, mo, no0, af, b0, b1);
    }

    // ---- M: S ← exp(Γ_C) S + (K ⊙ w)ᵀ V ----
    {
      if constexpr (GK == Gate::scalar) {
        const float decay = weights[C - 1].x;
#pragma unroll
        for (int nt = 0; nt < NS; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) S[nt][e] *= decay;
      }
      typename M::A af[1];
      typename M::B b0, b1;
      auto& tile = reinterpret_cast<float (&)[1][NS][4]>(S);
      if constexpr (GK == Gate::scalar)
        chunk_fwd_h_accumulate<E, FastStateTiles<KP, BV>>(tile, b, kt, ns0, lane, af, b0, b1,
                                                          DecayToChunkEnd<E>{weights});
      else if constexpr (NORM)
        chunk_fwd_h_accumulate<E, FastStateTiles<KP, BV>>(tile, b, kt, ns0, lane, af, b0, b1,
                                                          KeySums<E>{z, holds_z});
      else
        chunk_fwd_h_accumulate<E, FastStateTiles<KP, BV>>(tile, b, kt, ns0, lane, af, b0, b1);
    }
    __syncthreads();  // B3: A complete; every warp done reading the bf16 state

    store_state_bf16();
    if constexpr (GK == Gate::scalar) {  // O = diag(exp Γ) Q S
      const float d0 = weights[16 * mo + g4].x, d1 = weights[16 * mo + g4 + 8].x;
#pragma unroll
      for (int nt = 0; nt < NO; ++nt) o[nt][0] *= d0, o[nt][1] *= d0, o[nt][2] *= d1, o[nt][3] *= d1;
    }
    float row_sums[4] = {0.f, 0.f, 0.f, 0.f};
    chunk_fwd_o_intra<E, NO, PA, PV, NORM>(o, a_s, v_s, mo, no0, lane, &row_sums);

    float o_scale[2] = {p.scale, p.scale};
    if constexpr (NORM) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = 16 * mo + g4 + 8 * half;
        const float den = p.scale * (qz_s[r] + row_sums[2 * half]) + norm::kEps;
        o_scale[half] = p.scale / den;
        if (p.norm_den.data && blockIdx.y == 0 && no0 == 0 && t4 == 0 && r < rows_valid)
          static_cast<float*>(p.norm_den.data)[row_offset(p.norm_den, c * C + r)] = den;
      }
    }
    store_fragment_rows<E, NO>(static_cast<E*>(p.o.data) + row_offset(p.o, c * C), p.o.stride[1], o, o_scale,
                               16 * mo, v0 + 8 * no0, V, rows_valid, lane);
  }

  if (NORM && split == chunks.last_split && p.z_final.data && holds_z && t4 == 0)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int key = 16 * kt + g4 + 8 * half;
      if (key < K)
        static_cast<float*>(p.z_final.data)[offset3(p.z_final, n, h, key)] = z[2 * half];
    }
  if (split == chunks.last_split && p.ht.data) {
    store_final_state<NS>(p, S, n, h, kt, ns0, v0, lane);
  }
}

}  // namespace
}  // namespace flashgla::cuda::gla
