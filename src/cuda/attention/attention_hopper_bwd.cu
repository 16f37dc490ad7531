// The Hopper (sm_90a) attention backward, in the spirit of FlashAttention-3:
// TMA loads by a producer warp, wgmma, dK and dV accumulated in registers.
//
// Three launches: the portable preprocess (dsum = rowsum(dO ⊙ O), lse in the
// log2 domain), the main kernel below, and the portable dQ conversion
// (dq = scale · dq_accum).
//
// Main kernel: one CTA per (128-key tile, KV head, batch row or sequence), two
// warpgroups of 64 keys each. K and V are loaded once; Q, dO (TMA), lse2 and
// dsum (plain loads) of each 64-query tile of every query head of the group
// stream through three stages. Per query tile, each warpgroup computes, with
// its 64 keys as the M side (the transposed problem, so dK and dV stay in
// the accumulator layout):
//   S^T = K Q^T, dP^T = V dO^T          wgmma, both operands in shared memory
//   P^T = exp2(S^T·c − lse2), dS^T = P^T ⊙ (dP^T − dsum)   in registers
//   dV += P^T dO, dK += dS^T Q           wgmma, P^T and dS^T from registers
//   dS^T -> shared memory; dQ = dS K     wgmma, both operands MN-major
//   dQ -> shared memory, added into dq_accum by TMA reductions (deterministic:
//         in turns, attention_dq_turns.cuh; a query tile that runs past the
//         sequence's end adds through fp32 atomics instead).
// dQ of a 64-query tile is 64 x D: at D = 128 warpgroup w computes columns
// 64w..64w+63; at D = 64 the warpgroups take turns (tile parity).
//
// No producer warp: at D = 128 a thread needs ~230 registers (dK, dV: 128;
// S^T, dP^T: 64), CUDA 13.0's ptxas caps a 288-thread CTA at 168, and 256
// threads may use 255. (setmaxnreg 24/240 with a producer warpgroup did not
// raise the forward's consumers above 168: bench/notes_attention.md.) Thread 0
// issues the TMA loads of tile it + 2 once both warpgroups passed tile it's
// barrier (so the stage's previous tile, it − 1, is fully read), and threads
// 0-127 load its lse2 and dsum, stored to shared memory after tile it's dQ.
//
// Used for bf16/fp16, D in {64, 128}, q, k, v and dO that TMA can address;
// the portable backward runs everything else.
#include <cstring>

#include "cuda/attention/attention_dq_turns.cuh"
#include "cuda/attention/attention_kernels.cuh"
#include "cuda/attention/attention_tma.cuh"
#include "cuda/common/barriers.cuh"
#include "cuda/common/tma.cuh"
#include "cuda/common/wgmma.cuh"

namespace flashgla::cuda::attn {

template <int D>
struct HopperBackwardConfig {
  static constexpr int kBlockN = 128;  // keys per CTA: two warpgroups of 64
  static constexpr int kBlockM = 64;   // queries per step
  static constexpr int kStages = 3;  // tile it + 2 loads while tile it runs
  static constexpr int kThreads = 256;
  static constexpr int kKVBytes = kBlockN * D * 2;        // K or V
  static constexpr int kQBytes = kBlockM * D * 2;         // Q or dO, one stage
  static constexpr int kDsBytes = kBlockN * kBlockM * 2;  // dS^T [keys][queries], one buffer
  static constexpr int kRowBytes = kBlockM * 4;           // lse2 or dsum, one stage
  static constexpr int kDqBytes = kBlockM * 64 * 4;       // a warpgroup's staged dQ block: 64 queries x 64 fp32
  // 1024 bytes of slack to align the tiles; K, V; Q, dO stages; two dS^T
  // buffers; two staged dQ blocks; lse2 and dsum stages; barriers.
  static constexpr int kSmemBytes = 1024 + 2 * kKVBytes + 2 * kStages * kQBytes + 2 * kDsBytes + 2 * kDqBytes +
                                    2 * kStages * kRowBytes + 64;
};

// The leader that issued a query tile's TMA reductions (its only bulk group still running) passes the turn once
// they have completed; the proxy fence orders their writes before the release.
__device__ __forceinline__ void pass_dq_turn_after_reductions(int* counter) {
  sm90::bulk_wait<0>();
  sm90::fence_proxy_async_global();
  pass_dq_turn(counter);
}

// kInTurns: the deterministic backward (p.dq_turns set), a kernel of its own so that its turn bookkeeping costs
// the default kernel no registers.
template <class T, int D, bool kInTurns>
__global__ void __launch_bounds__(HopperBackwardConfig<D>::kThreads, 1)
    attention_backward_hopper_kernel(const __grid_constant__ CUtensorMap map_q,
                                     const __grid_constant__ CUtensorMap map_k,
                                     const __grid_constant__ CUtensorMap map_v,
                                     const __grid_constant__ CUtensorMap map_do,
                                     const __grid_constant__ CUtensorMap map_dq, const bool bulk_dq,
                                     const AttentionParams p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace sm90;
  using Cfg = HopperBackwardConfig<D>;
  constexpr int BN = Cfg::kBlockN, BM = Cfg::kBlockM, kStages = Cfg::kStages, DB = D / 8;
  constexpr int kSwizzleRow = 128;  // one swizzle block row: 64 elements
  constexpr int kRowLoaders = 2 * BM;  // threads that load a tile's lse2 (first BM) and dsum

  extern __shared__ unsigned char smem[];
  const uint32_t smem_base = smem_address(smem);
  const uint32_t aligned = (smem_base + 1023) & ~1023u;
  const uint32_t sK = aligned;                        // [D/64][BN][64]
  const uint32_t sV = sK + Cfg::kKVBytes;             // [D/64][BN][64]
  const uint32_t sQ = sV + Cfg::kKVBytes;             // [stage][D/64][BM][64]
  const uint32_t sdO = sQ + kStages * Cfg::kQBytes;   // [stage][D/64][BM][64]
  const uint32_t sdS = sdO + kStages * Cfg::kQBytes;  // [buffer][BN][64]
  const uint32_t sDq = sdS + 2 * Cfg::kDsBytes;       // [warpgroup][2 boxes][BM][32] fp32, 128-byte swizzle
  const uint32_t sRows = sDq + 2 * Cfg::kDqBytes;     // [stage][lse2, dsum][BM] fp32
  const uint32_t barriers = sRows + 2 * kStages * Cfg::kRowBytes;
  float* const rows_ptr = reinterpret_cast<float*>(smem + (sRows - smem_base));
  const uint32_t kv_full = barriers;
  auto full = [&](int st) { return barriers + 8 * (1 + st); };

  Work w;
  // Key tiles last first when the dq additions take turns (attention_dq_turns.cuh).
  if (!decode_work(p, BN, false, p.kv_heads, kInTurns, w)) return;
  const Seq& s = w.seq;
  const int64_t k0 = w.tile * BN;
  const int64_t diag = s.k_len - s.q_len;  // causal: query i sees keys j <= i + diag

  // Query tiles that see a key of this tile (causal: queries i >= k0 − diag),
  // for every query head of the group (head outer, tile inner).
  const int num_q_tiles = int((s.q_len + BM - 1) / BM);
  const int64_t first_query = p.causal ? max(int64_t(0), k0 - diag) : 0;
  const int first_q_tile = first_query < s.q_len ? int(first_query / BM) : num_q_tiles;
  const int tiles_per_head = num_q_tiles - first_q_tile;
  const int iterations = tiles_per_head * int(p.group);
  const int64_t first_head = w.head * p.group;
  const int64_t row_start = (s.batch * p.q_heads + first_head) * p.q_len + s.q_begin;  // in [B, Hq, Tq]
  auto tile_head = [&](int it) { return it / tiles_per_head; };
  auto tile_q0 = [&](int it) { return (first_q_tile + it % tiles_per_head) * BM; };

  const int tid = threadIdx.x, lane = tid & 31;
  if (tid == 0) {
    mbar_init(kv_full, 1);
    for (int st = 0; st < kStages; ++st) mbar_init(full(st), 1 + kRowLoaders);  // thread 0's TMA bytes + row loaders
    mbar_init_fence();
  }
  __syncthreads();

  // Tile j's loads into stage j % kStages: Q and dO by TMA (thread 0), and
  // the value of row `tid` of lse2 (tid < BM) or dsum (BM <= tid < 2 BM),
  // returned for store_row (rows past the end: lse2 = +inf, so P = 0).
  const int batch = int(s.batch);
  auto issue_tile = [&](int j) {
    const int st = j % kStages, hg = tile_head(j), q0 = tile_q0(j);
    if (tid == 0) {
      mbar_arrive_expect_tx(full(st), 2 * Cfg::kQBytes);
      const int head = int(first_head + hg), token = int(s.q_begin + q0);
      for (int db = 0; db < D / 64; ++db) {
        tma_load_4d(sQ + st * Cfg::kQBytes + db * BM * kSwizzleRow, &map_q, full(st), db * 64, head, token, batch);
        tma_load_4d(sdO + st * Cfg::kQBytes + db * BM * kSwizzleRow, &map_do, full(st), db * 64, head, token, batch);
      }
    }
    float value = 0.f;
    if (tid < kRowLoaders) {
      const int r = tid % BM, row = q0 + r;
      const int64_t idx = row_start + hg * p.q_len + row;
      if (tid < BM) value = row < s.q_len ? p.lse_log2[idx] : INFINITY;
      else value = row < s.q_len ? p.dsum[idx] : 0.f;
    }
    return value;
  };
  auto store_row = [&](int j, float value) {
    if (tid < kRowLoaders) {
      rows_ptr[(j % kStages) * 2 * BM + tid] = value;
      mbar_arrive(full(j % kStages));
    }
  };
  if (iterations > 0) {
    if (tid == 0) {
      mbar_arrive_expect_tx(kv_full, 2 * Cfg::kKVBytes);
      const int key = int(s.k_begin + k0), kv = int(w.head);
      for (int db = 0; db < D / 64; ++db) {
        tma_load_4d(sK + db * BN * kSwizzleRow, &map_k, kv_full, db * 64, kv, key, batch);
        tma_load_4d(sV + db * BN * kSwizzleRow, &map_v, kv_full, db * 64, kv, key, batch);
      }
    }
    for (int j = 0; j + 1 < kStages && j < iterations; ++j) store_row(j, issue_tile(j));
  }

  const int wg = tid / 128, warp_in_wg = (tid / 32) % 4;
  // Accumulator rows of this thread: M index warp_in_wg·16 + lane/4 + 8h.
  const int m_row = warp_in_wg * 16 + (lane >> 2);
  const int key_row = wg * 64 + m_row;  // key of the CTA's tile, + 8h
  const int col = (lane & 3) * 2;       // accumulator column within an n8 block, + e
  // Keys of this tile that exist, clamped to [0, BN].
  const int keys_valid = int(min(int64_t(BN), s.k_len - k0));

  // Deterministic: the warpgroup's leader passes a query tile's turn once its reduction has completed: in the next
  // step where key tile t − 1, next in the order, reaches each query tile at least two steps after this tile does
  // (causally, when it starts on an earlier query tile; key tile 0 passes to no one), else at once.
  const int64_t prev_first_query = p.causal ? max(int64_t(0), k0 - BN - diag) : 0;
  const bool defer_pass = w.tile == 0 || prev_first_query / BM + 2 <= first_query / BM;
  bool pass_pending = false;  // the leader passes the previous step's turn at this step
  const int block = D == 128 ? wg : 0;  // the 64 columns of dq this warpgroup computes
  auto turn_of_step = [&](int it) {
    return dq_turn(p, s, first_head + tile_head(it), tile_q0(it) / BM, BM, D / 64, block);
  };

  float dk[D / 2], dv[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dk[i] = 0.f, dv[i] = 0.f;
  if (iterations > 0) mbar_wait(kv_full, 0);

  for (int it = 0; it < iterations; ++it) {
    const int st = it % kStages, hg = tile_head(it), q0 = tile_q0(it);
    const uint32_t q_tile = sQ + st * Cfg::kQBytes, do_tile = sdO + st * Cfg::kQBytes;
    mbar_wait(full(st), (it / kStages) & 1);

    // S^T = K Q^T and dP^T = V dO^T over D in k16 steps (32 bytes along a
    // 128-byte row): this warpgroup's 64 keys (rows of K or V) against the
    // tile's queries (rows of Q or dO), one commit group each.
    float sc[32], dp[32];
    auto keys_by_queries = [&](float(&acc)[32], uint32_t keys, uint32_t queries) {
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks) {
        const uint32_t a = keys + (ks / 4) * BN * kSwizzleRow + wg * 64 * kSwizzleRow + (ks % 4) * 32;
        const uint32_t b = queries + (ks / 4) * BM * kSwizzleRow + (ks % 4) * 32;
        if (ks == 0) wgmma_ss_n64_first<T>(acc, smem_desc(a, 16, 1024), smem_desc(b, 16, 1024));
        else wgmma_ss_n64<T>(acc, smem_desc(a, 16, 1024), smem_desc(b, 16, 1024), 1);
      }
      wgmma_commit();
    };
    wgmma_fence();
    keys_by_queries(sc, sK, q_tile);
    keys_by_queries(dp, sV, do_tile);
    // Deterministic: the leader passes the previous step's deferred turn here at D = 128, and at D = 64 after the
    // step's barrier, where the warpgroup that passes has no dQ product to issue (each place measured the faster
    // for its D: bench/notes_attention.md).
    auto pass_pending_turn = [&] {
      if (kInTurns && pass_pending) {
        pass_dq_turn_after_reductions(turn_of_step(it - 1));
        pass_pending = false;
      }
    };
    if (D == 128) pass_pending_turn();
    // Deterministic, D = 64: the leader reads this step's turn now, under the products, so that the reduction
    // rarely waits for the read's round trip. (At D = 128 the read's wait here delays the warp's softmax more than
    // it saves.)
    int turn_seen = 0;
    if (kInTurns && D == 64 && tid % 128 == 0 && (it & 1) == wg) turn_seen = read_dq_turn(turn_of_step(it));

    // P^T: element (key, query) = sc[nb·4 + 2h + e] with key = key_row + 8h,
    // query = nb·8 + col + e of the tile.
    wgmma_wait<1>();
    fence_registers(sc);
    const float* lse2 = rows_ptr + st * 2 * BM;
    const float* dsum = lse2 + BM;
    // Masks, as the first visible query column of each row half: a key past
    // the end sees none; causally, key k sees queries q with k <= q + diag.
    const bool masked = keys_valid < BN || (p.causal && q0 + diag < k0 + BN - 1);
    int first_col[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int key = key_row + 8 * h;
      const int64_t causal_first = p.causal ? k0 + key - diag - q0 : 0;
      first_col[h] = key >= keys_valid ? BM : int(max(int64_t(0), min(int64_t(BM), causal_first)));
    }
    // The probabilities, masked only where a tile needs it: the test is a
    // branch around two loops, not a predicate in one (which every tile would
    // execute).
    auto probabilities = [&](auto with_mask) {
#pragma unroll
      for (int nb = 0; nb < 8; ++nb) {
        const float2 l = *reinterpret_cast<const float2*>(lse2 + nb * 8 + col);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float& p0 = sc[nb * 4 + 2 * h];
          float& p1 = sc[nb * 4 + 2 * h + 1];
          p0 = fast_exp2(fmaf(p0, p.scale_log2, -l.x));
          p1 = fast_exp2(fmaf(p1, p.scale_log2, -l.y));
          if constexpr (decltype(with_mask)::value) {
            if (nb * 8 + col < first_col[h]) p0 = 0.f;
            if (nb * 8 + col + 1 < first_col[h]) p1 = 0.f;
          }
        }
      }
    };
    if (masked) probabilities(std::true_type{});
    else probabilities(std::false_type{});
    // dS^T = P^T ⊙ (dP^T − dsum), in place of dP^T.
    wgmma_wait<0>();
    fence_registers(dp);
#pragma unroll
    for (int nb = 0; nb < 8; ++nb) {
      const float2 ds = *reinterpret_cast<const float2*>(dsum + nb * 8 + col);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        dp[nb * 4 + 2 * h] = sc[nb * 4 + 2 * h] * (dp[nb * 4 + 2 * h] - ds.x);
        dp[nb * 4 + 2 * h + 1] = sc[nb * 4 + 2 * h + 1] * (dp[nb * 4 + 2 * h + 1] - ds.y);
      }
    }
    // As A fragments (contraction over the tile's queries): the accumulator
    // layout of two adjacent n8 blocks is the A layout of one k16 step.
    uint32_t pa[BM / 16][4], dsa[BM / 16][4];
#pragma unroll
    for (int kk = 0; kk < BM / 16; ++kk)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        pa[kk][j] = pack2<T>(sc[8 * kk + 2 * j], sc[8 * kk + 2 * j + 1]);
        dsa[kk][j] = pack2<T>(dp[8 * kk + 2 * j], dp[8 * kk + 2 * j + 1]);
      }

    // dV += P^T dO, dK += dS^T Q (B: the query rows of the tile, MN-major).
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BM / 16; ++kk)
      wgmma_rs_tn<T, D>(dv, pa[kk], smem_desc(do_tile + kk * 16 * kSwizzleRow, BM * kSwizzleRow, 1024));
#pragma unroll
    for (int kk = 0; kk < BM / 16; ++kk)
      wgmma_rs_tn<T, D>(dk, dsa[kk], smem_desc(q_tile + kk * 16 * kSwizzleRow, BM * kSwizzleRow, 1024));
    wgmma_commit();

    // dS^T into shared memory buffer it % 2, [key][query] in the 128-byte
    // swizzle (16-byte chunk c of row r at c ^ (r % 8)). dsa[kk][j] holds
    // n8 block 2kk + j/2, row half j % 2.
    const uint32_t ds_tile = sdS + (it & 1) * Cfg::kDsBytes;
#pragma unroll
    for (int kk = 0; kk < BM / 16; ++kk)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int r = key_row + 8 * (j & 1), c = (2 * kk + (j >> 1)) * 8 + col;
        const uint32_t at = ds_tile + r * kSwizzleRow + ((((c >> 3) ^ r) & 7) << 4) + (c & 7) * 2;
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(at), "r"(dsa[kk][j]) : "memory");
      }
    fence_proxy_async_shared();
    // Both warpgroups' dS^T are written; the buffer written now was last read
    // by the dQ of tile it − 2, which finished before its warpgroup came here
    // at tile it − 1.
    named_barrier_sync<3>(Cfg::kThreads);
    if (D == 64) pass_pending_turn();  // before the leader's next loads, which the release's fence would wait for
    // Every thread is past tile it − 1, so its stage takes tile it + kStages − 1.
    const int next = it + kStages - 1;
    const float next_row = next < iterations ? issue_tile(next) : 0.f;

    // dQ[64 x 64] = dS K over the 128 keys: A = dS^T tile (MN-major), B = K
    // columns 64·block.. (MN-major).
    const bool dq_mine = D == 128 || (it & 1) == wg;
    float dq[32];
    if (dq_mine) {
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        const uint64_t a = smem_desc(ds_tile + kk * 16 * kSwizzleRow, BN * kSwizzleRow, 1024);
        const uint64_t b = smem_desc(sK + block * BN * kSwizzleRow + kk * 16 * kSwizzleRow, BN * kSwizzleRow, 1024);
        if (kk == 0) wgmma_ss_n64_tt_first<T>(dq, a, b);
        else wgmma_ss_n64_tt<T>(dq, a, b, 1);
      }
      wgmma_commit();
    }
    wgmma_wait<0>();
    fence_registers(dv);
    fence_registers(dk);
    fence_registers(pa);
    fence_registers(dsa);
    if (next < iterations) store_row(next, next_row);
    if (dq_mine) {
      fence_registers(dq);
      auto warpgroup_sync = [&] { wg == 0 ? named_barrier_sync<4>(128) : named_barrier_sync<5>(128); };
      int* turn = kInTurns ? turn_of_step(it) : nullptr;
      // In turns, a tile that runs past the sequence's end adds through atomics: the TMA box would add zeros into
      // the next sequence's rows, out of their turn.
      if (bulk_dq && (turn == nullptr || q0 + BM <= s.q_len)) {
        // Staged in shared memory and added by one TMA reduction per 32 columns, so that no thread waits for
        // its atomics to read their registers. Rows past the sequence's end add zeros (they may be the next
        // sequence's rows).
        const uint32_t staged = sDq + wg * Cfg::kDqBytes;
        if (tid % 128 == 0) bulk_wait_read<0>();  // the last reduction from this buffer has read it
        warpgroup_sync();
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int q = m_row + 8 * h;
          const bool valid = q0 + q < s.q_len;
#pragma unroll
          for (int nb = 0; nb < 8; ++nb) {
            const int c = (nb % 4) * 8 + col;  // column within the 32-column box nb / 4
            const uint32_t at = staged + (nb / 4) * (BM * 128) + q * 128 + ((((c >> 2) ^ q) & 7) << 4) + (c & 3) * 4;
            asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(at), "f"(valid ? dq[nb * 4 + 2 * h] : 0.f),
                         "f"(valid ? dq[nb * 4 + 2 * h + 1] : 0.f)
                         : "memory");
          }
        }
        fence_proxy_async_shared();
        warpgroup_sync();
        if (tid % 128 == 0) {
          if (turn) {
            const int need = dq_turn_of(p, s, q0 / BM, BM, BN, w.tile);
            if (turn_seen < need) wait_for_dq_turn(turn, need);
            fence_proxy_async_global();  // the reduction reads the sum the earlier key tiles' reductions left
          }
          const int row = int(row_start + hg * p.q_len + q0);
          tma_reduce_add_2d(&map_dq, staged, block * 64, row);
          tma_reduce_add_2d(&map_dq, staged + BM * 128, block * 64 + 32, row);
          bulk_commit();
          if (turn && defer_pass) pass_pending = true;
          else if (turn) pass_dq_turn_after_reductions(turn);
        }
      } else {
        // Atomics; in turns, the warpgroup adds its column block when the later key tiles have added theirs.
        if (turn) {
          if (tid % 128 == 0) wait_for_dq_turn(turn, dq_turn_of(p, s, q0 / BM, BM, BN, w.tile));
          warpgroup_sync();
        }
        float* accum = p.dq_accum + (row_start + hg * p.q_len + q0) * D + block * 64;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int q = m_row + 8 * h;
          if (q0 + q >= s.q_len) continue;
#pragma unroll
          for (int nb = 0; nb < 8; ++nb)
            atomicAdd(reinterpret_cast<float2*>(accum + int64_t(q) * D + nb * 8 + col),
                      make_float2(dq[nb * 4 + 2 * h], dq[nb * 4 + 2 * h + 1]));
        }
        if (turn) {
          warpgroup_sync();
          if (tid % 128 == 0) pass_dq_turn(turn);
        }
      }
    }
  }
  if (kInTurns && pass_pending) pass_dq_turn_after_reductions(turn_of_step(iterations - 1));
  if (tid % 128 == 0) bulk_wait<0>();  // the reductions are done before the CTA's shared memory goes

  // dK = scale · dS^T Q, dV = P^T dO for the keys of this tile.
  const int64_t dk_base = s.batch * p.dk.batch + (s.k_begin + k0) * p.dk.token + w.head * p.dk.head;
  const int64_t dv_base = s.batch * p.dv.batch + (s.k_begin + k0) * p.dv.token + w.head * p.dv.head;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = key_row + 8 * h;
    if (row >= keys_valid) continue;
#pragma unroll
    for (int db = 0; db < DB; ++db) {
      const int c = db * 8 + col;
      store_pair<T>(p.dk, dk_base + row * p.dk.token + c * p.dk.dim, dk[db * 4 + 2 * h] * p.scale,
                    dk[db * 4 + 2 * h + 1] * p.scale);
      store_pair<T>(p.dv, dv_base + row * p.dv.token + c * p.dv.dim, dv[db * 4 + 2 * h], dv[db * 4 + 2 * h + 1]);
    }
  }
#endif
}

// Launches the Hopper backward (all three steps); returns nullptr, or (having
// launched nothing) why this device, build or tensors do not allow it.
template <class T, int D>
const char* run_attention_backward_hopper(AttentionParams p, cudaStream_t stream) {
  using Cfg = HopperBackwardConfig<D>;
  static_assert(Cfg::kSmemBytes <= 227 * 1024, "shared memory");
  auto kernel =
      p.dq_turns ? attention_backward_hopper_kernel<T, D, true> : attention_backward_hopper_kernel<T, D, false>;
  int device = 0, major = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), "cudaDeviceGetAttribute");
  if (major != 9) return "the device is not compute capability 9.x";
  // The sm_90a machine code must be what this device runs (an sm_80-only or a
  // plain sm_90 build has no Hopper kernel bodies: the portable kernel runs).
  if (!loaded_code().sm90a) return "this build has no sm_90a machine code";
  if (!p.q.vec16 || !p.k.vec16 || !p.v.vec16 || !p.d_o.vec16)
    return "q, k, v and d_o need unit stride along D and 16-byte aligned pointers and strides (TMA)";
  constexpr int64_t kIntMax = 0x7fffffff;
  if (p.q_len > kIntMax || p.k_len > kIntMax || p.batch > kIntMax || p.q_heads > kIntMax)
    return "a length, batch or head count exceeds the 32-bit TMA coordinates";
  if (p.q_len == 0 || p.k_len == 0) return "no queries or no keys (no tensor map for an empty tensor)";
  if (tensor_map_encoder() == nullptr) return "the driver offers no cuTensorMapEncodeTiled";
  CUtensorMap map_q, map_k, map_v, map_do, map_dq;
  if (!make_tensor_map<T>(map_q, p.q, p.batch, p.q_len, p.q_heads, D, Cfg::kBlockM) ||
      !make_tensor_map<T>(map_do, p.d_o, p.batch, p.q_len, p.q_heads, D, Cfg::kBlockM) ||
      !make_tensor_map<T>(map_k, p.k, p.batch, p.k_len, p.kv_heads, D, Cfg::kBlockN) ||
      !make_tensor_map<T>(map_v, p.v, p.batch, p.k_len, p.kv_heads, D, Cfg::kBlockN))
    return "cuTensorMapEncodeTiled rejected a tensor";
  // The dq additions go through TMA reductions where the accumulator's rows have 32-bit coordinates; otherwise
  // through atomics.
  const int64_t rows = p.batch * p.q_heads * p.q_len;
  const bool bulk_dq = rows <= kIntMax && make_dq_accum_map(map_dq, p.dq_accum, rows, D);
  if (!bulk_dq) std::memset(&map_dq, 0, sizeof(map_dq));
  attention_backward_preprocess_kernel<T, D><<<unsigned((rows * 32 + 255) / 256), 256, 0, stream>>>(p);
  check_cuda(cudaGetLastError(), "attention backward preprocess kernel launch");
  const int64_t blocks = plan_grid(p, Cfg::kBlockN, false, p.kv_heads);
  p.dq_turn_slots = tile_slots_of(p.q_len, Cfg::kBlockM, p.varlen, p.num_seqs);
  if (blocks > 0) {
    prepare_smem(kernel, Cfg::kSmemBytes);
    kernel<<<unsigned(blocks), Cfg::kThreads, Cfg::kSmemBytes, stream>>>(map_q, map_k, map_v, map_do, map_dq, bulk_dq,
                                                                         p);
    check_cuda(cudaGetLastError(), "attention backward (Hopper) kernel launch");
  }
  const int64_t pairs = rows * (D / 2);
  const int64_t grid = std::min<int64_t>((pairs + 255) / 256, 65536);
  attention_backward_dq_kernel<T, D><<<unsigned(grid), 256, 0, stream>>>(p);
  check_cuda(cudaGetLastError(), "attention backward dq kernel launch");
  return nullptr;
}

template const char* run_attention_backward_hopper<__nv_bfloat16, 64>(AttentionParams, cudaStream_t);
template const char* run_attention_backward_hopper<__half, 64>(AttentionParams, cudaStream_t);
template const char* run_attention_backward_hopper<__nv_bfloat16, 128>(AttentionParams, cudaStream_t);
template const char* run_attention_backward_hopper<__half, 128>(AttentionParams, cudaStream_t);

}  // namespace flashgla::cuda::attn
