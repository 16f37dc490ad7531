// The portable (sm_80+) FlashAttention-2 kernels: forward, and the backward's
// three steps (preprocess, main, dq conversion). Included only by the
// attention_d*.cu files, which instantiate them per (dtype, head dim).
#pragma once

#include <cuda_runtime.h>

#include <cmath>

#include "cuda/attention/attention_dq_turns.cuh"
#include "cuda/attention/attention_mma.cuh"
#include "cuda/attention/attention_params.cuh"
#include "cuda/attention/attention_sequences.cuh"
#include "cuda/common/host.cuh"

namespace flashgla::cuda::attn {

// ---- work items -----------------------------------------------------------------

struct Work {
  Seq seq;
  int64_t tile;  // tile of the work axis within the sequence
  int64_t head;
};

// Maps blockIdx.x to a work item: blockIdx.x = slot + tile_slots · (head + heads · batch).
// With varlen, sequence n owns the slots from n + begin_n / tile_rows on; that
// start grows by at least ceil(len_n / tile_rows) from one sequence to the
// next, so N + ceil(total / tile_rows) slots cover every tile, and a binary
// search over the boundaries finds a slot's sequence. Returns false for a slot
// past its sequence's end. `reverse` hands out the slots last first (the
// causal forward's heaviest query tiles).
__device__ __forceinline__ bool decode_work(const AttentionParams& p, int tile_rows, bool by_query, int64_t heads,
                                            bool reverse, Work& w) {
  int64_t x = blockIdx.x;
  int64_t slot = x % p.tile_slots;
  x /= p.tile_slots;
  if (reverse) slot = p.tile_slots - 1 - slot;
  w.head = x % heads;
  if (!p.varlen) {
    w.seq = sequence(p, x / heads);
    w.tile = slot;
  } else {
    const void* cu = by_query ? p.cu_q : p.cu_k;
    const int64_t stride = by_query ? p.cu_q_stride : p.cu_k_stride;
    const bool is64 = by_query ? p.cu_q_64 : p.cu_k_64;
    const int64_t total = by_query ? p.q_len : p.k_len;
    auto start = [&](int64_t n) { return n + boundary(cu, stride, is64, n, total) / tile_rows; };
    int64_t lo = 0, hi = p.num_seqs - 1;
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) / 2;
      if (start(mid) <= slot) lo = mid;
      else hi = mid - 1;
    }
    const int64_t first = start(lo);
    if (slot < first) return false;
    w.seq = sequence(p, lo);
    w.tile = slot - first;
  }
  return w.tile * tile_rows < (by_query ? w.seq.q_len : w.seq.k_len);
}

// ---- global <-> shared ----------------------------------------------------------

// Rows [0, ROWS) x cols [0, COLS) of `t` starting at element offset `base`
// into a swizzled shared tile; rows at or past rows_valid become zeros. Fast
// path: 16-byte cp.async (wait with cp_async_wait_committed). Otherwise element
// loads with any stride, stored synchronously.
template <class T, int ROWS, int COLS, int NT>
__device__ __forceinline__ void load_tile(T* tile, const Strided& t, int64_t base, int64_t rows_valid, int tid) {
  constexpr int kChunksPerRow = COLS / 8;
  static_assert(NT % kChunksPerRow == 0 && ROWS % (NT / kChunksPerRow) == 0, "threads cover whole rows");
  constexpr int kRowStep = NT / kChunksPerRow;  // rows between one thread's chunks
  const int row0 = tid / kChunksPerRow, col = (tid % kChunksPerRow) * 8;
  const T* src = static_cast<const T*>(t.data) + base + row0 * t.token + col * t.dim;
  const int64_t src_step = kRowStep * t.token;
  if (t.vec16) {
#pragma unroll
    for (int i = 0; i < ROWS / kRowStep; ++i, src += src_step) {
      const int r = row0 + i * kRowStep;
      const bool valid = r < rows_valid;
      cp_async16_ordered(smem_address(tile + Swizzled<COLS>::offset(r, col)),
                         valid ? src : static_cast<const T*>(t.data), valid ? 16 : 0);
    }
  } else {
#pragma unroll 1
    for (int i = 0; i < ROWS / kRowStep; ++i, src += src_step) {
      const int r = row0 + i * kRowStep;
      const uint16_t* s16 = reinterpret_cast<const uint16_t*>(src);
      uint32_t w[4] = {0, 0, 0, 0};
      if (r < rows_valid) {
#pragma unroll
        for (int e = 0; e < 8; e += 2) w[e / 2] = uint32_t(s16[e * t.dim]) | (uint32_t(s16[(e + 1) * t.dim]) << 16);
      }
      *reinterpret_cast<uint4*>(tile + Swizzled<COLS>::offset(r, col)) = make_uint4(w[0], w[1], w[2], w[3]);
    }
  }
}

// Two adjacent columns of one row, rounded to T.
template <class T>
__device__ __forceinline__ void store_pair(const Strided& t, int64_t offset, float a, float b) {
  T* dst = static_cast<T*>(t.data) + offset;
  if (t.vec4) {
    *reinterpret_cast<uint32_t*>(dst) = pack2<T>(a, b);
  } else {
    dst[0] = from_float<T>(a);
    dst[t.dim] = from_float<T>(b);
  }
}

// ---- forward ----------------------------------------------------------------------

// One CTA per (query tile, query head, batch row or sequence); each warp owns
// MT · 16 query rows. Per key tile: S = Q K^T, online softmax in the log2
// domain, O = diag(alpha) O + P V. K and V have one buffer each: V's load
// overlaps S, the next K's load overlaps P V.
template <class T, int D>
__global__ void __launch_bounds__(ForwardConfig<D>::kWarps * 32, ForwardConfig<D>::kMinBlocks)
    attention_forward_kernel(const AttentionParams p) {
  using Cfg = ForwardConfig<D>;
  constexpr int BM = Cfg::kBlockM, BN = Cfg::kBlockN, NT = Cfg::kWarps * 32;
  constexpr int MT = BM / (16 * Cfg::kWarps), NB = BN / 8, DB = D / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem);
  T* sK = sQ + BM * D;
  T* sV = sK + BN * D;

  Work w;
  if (!decode_work(p, BM, true, p.q_heads, true, w)) return;
  const Seq& s = w.seq;
  const int tid = threadIdx.x, lane = tid & 31, warp_row = (tid >> 5) * MT * 16;
  const int64_t q0 = w.tile * BM;
  const int64_t diag = s.k_len - s.q_len;  // causal: query i sees keys j <= i + diag
  const int64_t kv_head = w.head / p.group;

  // Keys the tile needs, and the key tiles from which some (row, key) is masked.
  int64_t key_end = s.k_len, unmasked_end = s.k_len;
  if (p.causal) {
    key_end = min(key_end, q0 + BM + diag);
    unmasked_end = min(unmasked_end, q0 + diag + 1);
  }
  const int num_key_tiles = key_end > 0 ? int((key_end + BN - 1) / BN) : 0;
  const int first_masked_tile = unmasked_end > 0 ? int(unmasked_end / BN) : 0;

  const int64_t q_base = s.batch * p.q.batch + s.q_begin * p.q.token + w.head * p.q.head;
  const int64_t k_base = s.batch * p.k.batch + s.k_begin * p.k.token + kv_head * p.k.head;
  const int64_t v_base = s.batch * p.v.batch + s.k_begin * p.v.token + kv_head * p.v.head;
  const uint32_t sQa = smem_address(sQ), sKa = smem_address(sK), sVa = smem_address(sV);

  float o[MT][DB][4];
  zero(o);
  float row_max[MT][2], row_sum[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) row_max[mt][h] = -INFINITY, row_sum[mt][h] = 0.f;

  if (num_key_tiles > 0) {
    load_tile<T, BM, D, NT>(sQ, p.q, q_base + q0 * p.q.token, s.q_len - q0, tid);
    load_tile<T, BN, D, NT>(sK, p.k, k_base, s.k_len, tid);
    cp_async_commit_ordered();
  }
  for (int kt = 0; kt < num_key_tiles; ++kt) {
    const int64_t k0 = int64_t(kt) * BN;
    cp_async_wait_committed();
    __syncthreads();  // K[kt] landed; every warp is done with V[kt-1]
    load_tile<T, BN, D, NT>(sV, p.v, v_base + k0 * p.v.token, s.k_len - k0, tid);
    cp_async_commit_ordered();

    float sc[MT][NB][4];
    zero(sc);
    warp_gemm<T, MT, NB, D, false, D, false, D>(sc, sQa, warp_row, sKa, 0, lane);

#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nb = 0; nb < NB; ++nb)
#pragma unroll
        for (int r = 0; r < 4; ++r) sc[mt][nb][r] *= p.scale_log2;
    if (kt >= first_masked_tile) {
      // Row i sees the tile's keys [0, visible): those before k_len and, causally, j <= i + diag.
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int64_t row = q0 + warp_row + mt * 16 + (lane >> 2) + h * 8;
          const int64_t end = p.causal ? min(s.k_len, row + diag + 1) : s.k_len;
          const int visible = int(max(int64_t(0), min(int64_t(BN), end - k0)));
#pragma unroll
          for (int nb = 0; nb < NB; ++nb)
#pragma unroll
            for (int e = 0; e < 2; ++e)
              if (nb * 8 + (lane & 3) * 2 + e >= visible) sc[mt][nb][2 * h + e] = -INFINITY;
        }
    }

    // Online softmax: rows g and g + 8 of each m16 tile (h = 0, 1); the four
    // threads of a quad share a row.
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float tile_max = -INFINITY;
#pragma unroll
        for (int nb = 0; nb < NB; ++nb) tile_max = fmaxf(tile_max, fmaxf(sc[mt][nb][2 * h], sc[mt][nb][2 * h + 1]));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
        const float m_new = fmaxf(row_max[mt][h], tile_max);
        const float m_use = m_new == -INFINITY ? 0.f : m_new;  // a row with no key yet: all p = 0
        const float alpha = fast_exp2(row_max[mt][h] - m_use);
        row_max[mt][h] = m_new;
        float sum = row_sum[mt][h] * alpha;
#pragma unroll
        for (int db = 0; db < DB; ++db) o[mt][db][2 * h] *= alpha, o[mt][db][2 * h + 1] *= alpha;
#pragma unroll
        for (int nb = 0; nb < NB; ++nb) {
          const float p0 = fast_exp2(sc[mt][nb][2 * h] - m_use), p1 = fast_exp2(sc[mt][nb][2 * h + 1] - m_use);
          sc[mt][nb][2 * h] = p0, sc[mt][nb][2 * h + 1] = p1;
          sum += p0 + p1;
        }
        row_sum[mt][h] = sum;
      }

    // P as the A fragments of P V: the C layout of two adjacent n8 blocks is
    // the A layout of one k16 step.
    uint32_t pa[MT][BN / 16][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        pa[mt][kk][0] = pack2<T>(sc[mt][2 * kk][0], sc[mt][2 * kk][1]);
        pa[mt][kk][1] = pack2<T>(sc[mt][2 * kk][2], sc[mt][2 * kk][3]);
        pa[mt][kk][2] = pack2<T>(sc[mt][2 * kk + 1][0], sc[mt][2 * kk + 1][1]);
        pa[mt][kk][3] = pack2<T>(sc[mt][2 * kk + 1][2], sc[mt][2 * kk + 1][3]);
      }

    cp_async_wait_committed();
    __syncthreads();  // V[kt] landed; every warp is done with K[kt]
    if (kt + 1 < num_key_tiles) {
      load_tile<T, BN, D, NT>(sK, p.k, k_base + (k0 + BN) * p.k.token, s.k_len - k0 - BN, tid);
      cp_async_commit_ordered();
    }

    // O += P V
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk)
#pragma unroll
      for (int db = 0; db < DB; db += 2) {
        uint32_t b[4];
        load_b<true, D>(b, sVa, db * 8, kk * 16, lane);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma16816<T>(o[mt][db], pa[mt][kk], b[0], b[1]);
          mma16816<T>(o[mt][db + 1], pa[mt][kk], b[2], b[3]);
        }
      }
  }

  // o = O / l (0 for a row that saw no key), lse = ln(l) + max.
  const int64_t o_base = s.batch * p.o.batch + s.q_begin * p.o.token + w.head * p.o.head;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float l = row_sum[mt][h];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const float inv = l > 0.f ? 1.f / l : 0.f;
      const int64_t row = q0 + warp_row + mt * 16 + (lane >> 2) + h * 8;
      if (row >= s.q_len) continue;
#pragma unroll
      for (int db = 0; db < DB; ++db) {
        const int col = db * 8 + (lane & 3) * 2;
        store_pair<T>(p.o, o_base + row * p.o.token + col * p.o.dim, o[mt][db][2 * h] * inv,
                      o[mt][db][2 * h + 1] * inv);
      }
      if ((lane & 3) == 0)
        p.lse[s.batch * p.lse_batch + w.head * p.lse_head + (s.q_begin + row) * p.lse_token] =
            l > 0.f ? (row_max[mt][h] + __log2f(l)) * kLn2 : -INFINITY;
    }
}

// ---- backward -------------------------------------------------------------------

// Per query row of [B, Hq, Tq] (one warp each): dsum = rowsum(dO ⊙ O), and the
// lse in the log2 domain, +inf for a row that saw no key (so its P is 0).
template <class T, int D>
__global__ void attention_backward_preprocess_kernel(const AttentionParams p) {
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (row >= p.batch * p.q_heads * p.q_len) return;
  const int64_t token = row % p.q_len, head = (row / p.q_len) % p.q_heads, b = row / (p.q_len * p.q_heads);
  const T* d_o = static_cast<const T*>(p.d_o.data) + b * p.d_o.batch + token * p.d_o.token + head * p.d_o.head;
  const T* o = static_cast<const T*>(p.o.data) + b * p.o.batch + token * p.o.token + head * p.o.head;
  float sum = 0.f;
#pragma unroll
  for (int d = lane; d < D; d += 32) sum += to_float(d_o[d * p.d_o.dim]) * to_float(o[d * p.o.dim]);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  if (lane == 0) {
    const float lse = p.lse[b * p.lse_batch + head * p.lse_head + token * p.lse_token];
    p.dsum[row] = sum;
    p.lse_log2[row] = lse == -INFINITY ? INFINITY : lse * kLog2e;
  }
}

// dq = scale · dq_accum, from [B, Hq, Tq, D] fp32 to the strided output.
template <class T, int D>
__global__ void attention_backward_dq_kernel(const AttentionParams p) {
  const int64_t pairs = p.batch * p.q_heads * p.q_len * (D / 2);
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < pairs; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / (D / 2);
    const int col = int(i % (D / 2)) * 2;
    const int64_t token = row % p.q_len, head = (row / p.q_len) % p.q_heads, b = row / (p.q_len * p.q_heads);
    const float2 acc = *reinterpret_cast<const float2*>(p.dq_accum + row * D + col);
    store_pair<T>(p.dq, b * p.dq.batch + token * p.dq.token + head * p.dq.head + col * p.dq.dim, acc.x * p.scale,
                  acc.y * p.scale);
  }
}

// One CTA per (key tile, KV head, batch row or sequence): dK and dV of its keys
// stay in registers while it walks every query tile of every query head that
// shares the KV head. Per query tile:
//   S = Q K^T, dP = dO V^T            (warp grid kSdpWarpsM x rest)
//   P = exp2(S·c − lse2), dS = P ⊙ (dP − dsum)  -> shared memory
//   dV += P^T dO, dK += dS^T Q          (warp grid kDkvWarpsN x rest)
//   dQ += dS K  -> fp32 atomics         (warp grid kDqWarpsM x rest)
// The next query tile's Q, dO, lse2 and dsum load while these run.
template <class T, int D>
__global__ void __launch_bounds__(BackwardConfig<D>::kWarps * 32, 1)
    attention_backward_kernel(const AttentionParams p) {
  using Cfg = BackwardConfig<D>;
  constexpr int BN = Cfg::kBlockN, BM = Cfg::kBlockM, NW = Cfg::kWarps, NT = NW * 32;
  // Warp tiles: S/dP MT1 x NB1, dK/dV MT3 x NB3, dQ MT5 x NB5 (m16 tiles x n8 blocks).
  constexpr int MT1 = BM / (16 * Cfg::kSdpWarpsM), NB1 = BN / (8 * (NW / Cfg::kSdpWarpsM));
  constexpr int MT3 = BN / (16 * Cfg::kDkvWarpsN), NB3 = D / (8 * (NW / Cfg::kDkvWarpsN));
  constexpr int MT5 = BM / (16 * Cfg::kDqWarpsM), NB5 = D / (8 * (NW / Cfg::kDqWarpsM));
  extern __shared__ __align__(128) unsigned char smem[];
  T* sK = reinterpret_cast<T*>(smem);
  T* sV = sK + BN * D;
  T* sQ = sV + BN * D;       // [2][BM][D]
  T* sdO = sQ + 2 * BM * D;  // [2][BM][D]
  T* sP = sdO + 2 * BM * D;  // [BM][BN]
  T* sdS = sP + BM * BN;     // [BM][BN]
  float* sLse = reinterpret_cast<float*>(sdS + BM * BN);  // [2][BM]
  float* sDsum = sLse + 2 * BM;                            // [2][BM]

  Work w;
  // Key tiles last first when the dq additions take turns (attention_dq_turns.cuh).
  if (!decode_work(p, BN, false, p.kv_heads, p.dq_turns != nullptr, w)) return;
  const Seq& s = w.seq;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t k0 = w.tile * BN;
  const int64_t diag = s.k_len - s.q_len;
  const int64_t keys_valid = s.k_len - k0;

  // Query tiles that see a key of this tile (causal: queries i >= k0 − diag).
  const int num_q_tiles = int((s.q_len + BM - 1) / BM);
  const int64_t first_query = p.causal ? max(int64_t(0), k0 - diag) : 0;
  const int first_q_tile = first_query < s.q_len ? int(first_query / BM) : num_q_tiles;
  const int tiles_per_head = num_q_tiles - first_q_tile;
  const int iterations = tiles_per_head * int(p.group);

  const int64_t k_base = s.batch * p.k.batch + s.k_begin * p.k.token + w.head * p.k.head;
  const int64_t v_base = s.batch * p.v.batch + s.k_begin * p.v.token + w.head * p.v.head;
  const uint32_t sKa = smem_address(sK), sVa = smem_address(sV), sPa = smem_address(sP), sdSa = smem_address(sdS);

  // Query tile `it` walks the group's heads (outer) and their query tiles
  // (inner). Offsets of the group's first head at the sequence's first token:
  const int64_t first_head = w.head * p.group;
  const int64_t q_start = s.batch * p.q.batch + s.q_begin * p.q.token + first_head * p.q.head;
  const int64_t do_start = s.batch * p.d_o.batch + s.q_begin * p.d_o.token + first_head * p.d_o.head;
  const int64_t row_start = (s.batch * p.q_heads + first_head) * p.q_len + s.q_begin;  // in [B, Hq, Tq]
  auto tile_head = [&](int it) { return it / tiles_per_head; };
  auto tile_q0 = [&](int it) { return (first_q_tile + it % tiles_per_head) * BM; };

  // Loads query tile `it` into buffer it % 2.
  auto load_query_tile = [&](int it) {
    const int hg = tile_head(it), q0 = tile_q0(it), buf = it & 1;
    load_tile<T, BM, D, NT>(sQ + buf * BM * D, p.q, q_start + q0 * p.q.token + hg * p.q.head, s.q_len - q0, tid);
    load_tile<T, BM, D, NT>(sdO + buf * BM * D, p.d_o, do_start + q0 * p.d_o.token + hg * p.d_o.head,
                            s.q_len - q0, tid);
    if (tid < BM) {
      const int row = q0 + tid;
      const int64_t idx = row_start + hg * p.q_len + row;
      sLse[buf * BM + tid] = row < s.q_len ? p.lse_log2[idx] : INFINITY;
      sDsum[buf * BM + tid] = row < s.q_len ? p.dsum[idx] : 0.f;
    }
  };

  float dk[MT3][NB3][4], dv[MT3][NB3][4];
  zero(dk);
  zero(dv);
  if (iterations > 0) {
    load_tile<T, BN, D, NT>(sK, p.k, k_base + k0 * p.k.token, keys_valid, tid);
    load_tile<T, BN, D, NT>(sV, p.v, v_base + k0 * p.v.token, keys_valid, tid);
    load_query_tile(0);
    cp_async_commit_ordered();
  }
  const bool keys_partial = k0 + BN > s.k_len;
  for (int it = 0; it < iterations; ++it) {
    const int hg = tile_head(it), q0 = tile_q0(it), buf = it & 1;
    const uint32_t sQa = smem_address(sQ + buf * BM * D), sdOa = smem_address(sdO + buf * BM * D);
    cp_async_wait_committed();
    __syncthreads();  // tile `it` landed; every warp is done with tile it − 1
    if (it + 1 < iterations) {
      load_query_tile(it + 1);
      cp_async_commit_ordered();
    }

    {  // S, dP -> P, dS in shared memory
      constexpr int WM = Cfg::kSdpWarpsM;
      const int m0 = (warp % WM) * MT1 * 16, n0 = (warp / WM) * NB1 * 8;
      float sc[MT1][NB1][4], dp[MT1][NB1][4];
      zero(sc);
      zero(dp);
      warp_gemm<T, MT1, NB1, D, false, D, false, D>(sc, sQa, m0, sKa, n0, lane);
      warp_gemm<T, MT1, NB1, D, false, D, false, D>(dp, sdOa, m0, sVa, n0, lane);
      const bool masked = keys_partial || (p.causal && q0 + diag < k0 + BN - 1);
#pragma unroll
      for (int mt = 0; mt < MT1; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = m0 + mt * 16 + (lane >> 2) + h * 8;
          const float lse2 = sLse[buf * BM + row], dsum = sDsum[buf * BM + row];
          // The row sees the tile's keys [0, visible).
          int visible = BN;
          if (masked) {
            const int64_t end = p.causal ? min(s.k_len, q0 + row + diag + 1) : s.k_len;
            visible = int(max(int64_t(0), min(int64_t(BN), end - k0)));
          }
#pragma unroll
          for (int nb = 0; nb < NB1; ++nb) {
            const int col = n0 + nb * 8 + (lane & 3) * 2;
            float pr[2], ds[2];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              pr[e] = col + e < visible ? fast_exp2(sc[mt][nb][2 * h + e] * p.scale_log2 - lse2) : 0.f;
              ds[e] = pr[e] * (dp[mt][nb][2 * h + e] - dsum);
            }
            const int at = Swizzled<BN>::offset(row, col);
            *reinterpret_cast<uint32_t*>(sP + at) = pack2<T>(pr[0], pr[1]);
            *reinterpret_cast<uint32_t*>(sdS + at) = pack2<T>(ds[0], ds[1]);
          }
        }
    }
    __syncthreads();  // P and dS complete

    {  // dV += P^T dO, dK += dS^T Q
      constexpr int WN = Cfg::kDkvWarpsN;
      const int m0 = (warp % WN) * MT3 * 16, n0 = (warp / WN) * NB3 * 8;
      warp_gemm<T, MT3, NB3, BM, true, BN, true, D>(dv, sPa, m0, sdOa, n0, lane);
      warp_gemm<T, MT3, NB3, BM, true, BN, true, D>(dk, sdSa, m0, sQa, n0, lane);
    }

    {  // dQ += dS K
      constexpr int WM = Cfg::kDqWarpsM;
      const int m0 = (warp % WM) * MT5 * 16, n0 = (warp / WM) * NB5 * 8;
      float dq[MT5][NB5][4];
      zero(dq);
      warp_gemm<T, MT5, NB5, BN, false, BN, true, D>(dq, sdSa, m0, sKa, n0, lane);
      // Deterministic: the CTA adds when the later key tiles have added theirs.
      int* turn = p.dq_turns ? dq_turn(p, s, first_head + hg, q0 / BM, BM, 1, 0) : nullptr;
      if (turn) {
        if (tid == 0) wait_for_dq_turn(turn, dq_turn_of(p, s, q0 / BM, BM, BN, w.tile));
        __syncthreads();
      }
      float* accum = p.dq_accum + (row_start + hg * p.q_len + q0) * D;
#pragma unroll
      for (int mt = 0; mt < MT5; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = m0 + mt * 16 + (lane >> 2) + h * 8;
          if (q0 + row >= s.q_len) continue;
#pragma unroll
          for (int nb = 0; nb < NB5; ++nb) {
            float* dst = accum + int64_t(row) * D + n0 + nb * 8 + (lane & 3) * 2;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
            atomicAdd(reinterpret_cast<float2*>(dst), make_float2(dq[mt][nb][2 * h], dq[mt][nb][2 * h + 1]));
#else
            atomicAdd(dst, dq[mt][nb][2 * h]);
            atomicAdd(dst + 1, dq[mt][nb][2 * h + 1]);
#endif
          }
        }
      if (turn) {
        __syncthreads();
        if (tid == 0) pass_dq_turn(turn);
      }
    }
  }

  // dK = scale · dS^T Q, dV = P^T dO for the keys of this tile.
  constexpr int WN = Cfg::kDkvWarpsN;
  const int m0 = (warp % WN) * MT3 * 16, n0 = (warp / WN) * NB3 * 8;
  const int64_t dk_base = s.batch * p.dk.batch + (s.k_begin + k0) * p.dk.token + w.head * p.dk.head;
  const int64_t dv_base = s.batch * p.dv.batch + (s.k_begin + k0) * p.dv.token + w.head * p.dv.head;
#pragma unroll
  for (int mt = 0; mt < MT3; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = m0 + mt * 16 + (lane >> 2) + h * 8;
      if (row >= keys_valid) continue;
#pragma unroll
      for (int nb = 0; nb < NB3; ++nb) {
        const int col = n0 + nb * 8 + (lane & 3) * 2;
        store_pair<T>(p.dk, dk_base + row * p.dk.token + col * p.dk.dim, dk[mt][nb][2 * h] * p.scale,
                      dk[mt][nb][2 * h + 1] * p.scale);
        store_pair<T>(p.dv, dv_base + row * p.dv.token + col * p.dv.dim, dv[mt][nb][2 * h], dv[mt][nb][2 * h + 1]);
      }
    }
}

// ---- launchers -----------------------------------------------------------------------

template <class Kernel>
void prepare_smem(Kernel kernel, int bytes) {
  int device = 0, limit = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
             "cudaDeviceGetAttribute");
  if (bytes > limit)
    check::fail(ErrorKind::unsupported, "q",
                "this head dimension needs " + std::to_string(bytes) + " bytes of shared memory per block; the device "
                "offers " + std::to_string(limit));
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
             "cudaFuncSetAttribute");
}

// Sets p.tile_slots for tiles of `rows` along the queries or the keys, and
// returns the number of CTAs: tile slots x heads x batch rows.
inline int64_t plan_grid(AttentionParams& p, int rows, bool by_query, int64_t heads) {
  const int64_t len = by_query ? p.q_len : p.k_len;
  p.tile_slots = tile_slots_of(len, rows, p.varlen, p.num_seqs);
  const int64_t blocks = p.tile_slots * heads * (p.varlen ? 1 : p.batch);
  if (blocks > 0x7fffffff)
    check::fail(ErrorKind::unsupported, "q", "too many tiles for one launch (" + std::to_string(blocks) + ")");
  return blocks;
}

template <class T, int D>
void run_attention_forward(AttentionParams p, cudaStream_t stream) {
  using Cfg = ForwardConfig<D>;
  const int64_t blocks = plan_grid(p, Cfg::kBlockM, true, p.q_heads);
  if (blocks == 0) return;
  prepare_smem(attention_forward_kernel<T, D>, Cfg::kSmemBytes);
  attention_forward_kernel<T, D><<<unsigned(blocks), Cfg::kWarps * 32, Cfg::kSmemBytes, stream>>>(p);
  check_cuda(cudaGetLastError(), "attention forward kernel launch");
}

template <class T, int D>
void run_attention_backward(AttentionParams p, cudaStream_t stream) {
  using Cfg = BackwardConfig<D>;
  const int64_t rows = p.batch * p.q_heads * p.q_len;
  if (rows > 0) {
    const int64_t blocks = (rows * 32 + 255) / 256;
    attention_backward_preprocess_kernel<T, D><<<unsigned(blocks), 256, 0, stream>>>(p);
    check_cuda(cudaGetLastError(), "attention backward preprocess kernel launch");
  }
  const int64_t blocks = plan_grid(p, Cfg::kBlockN, false, p.kv_heads);
  p.dq_turn_slots = tile_slots_of(p.q_len, Cfg::kBlockM, p.varlen, p.num_seqs);
  if (blocks > 0) {
    prepare_smem(attention_backward_kernel<T, D>, Cfg::kSmemBytes);
    attention_backward_kernel<T, D><<<unsigned(blocks), Cfg::kWarps * 32, Cfg::kSmemBytes, stream>>>(p);
    check_cuda(cudaGetLastError(), "attention backward kernel launch");
  }
  if (rows > 0) {
    const int64_t pairs = rows * (D / 2);
    const int64_t grid = std::min<int64_t>((pairs + 255) / 256, 65536);
    attention_backward_dq_kernel<T, D><<<unsigned(grid), 256, 0, stream>>>(p);
    check_cuda(cudaGetLastError(), "attention backward dq kernel launch");
  }
}

}  // namespace flashgla::cuda::attn
