// The Hopper (sm_90a) attention forward, in the spirit of FlashAttention-3:
// TMA loads, wgmma, warp specialization.
//
// One CTA per (128-query tile, query head, batch row or sequence): two
// consumer warpgroups (warps 0-7) and one producer warp (warp 8). The
// producer's first lane loads Q once and K, V tile by tile with TMA into two
// shared-memory stages each, waiting on an "empty" mbarrier before reusing a
// stage. Each consumer warpgroup owns 64 query rows: S = Q K^T (wgmma, both
// operands in shared memory), masking and the online softmax in registers
// (log2 domain), then O += P V (wgmma, P straight from the S registers).
// The two warpgroups take turns issuing their MMAs (ping-pong), so one's
// softmax overlaps the other's MMAs. The key tiles go last to first, so the
// masked ones (the causal diagonal, a partial last tile) come first and the
// loop over the others has no mask code.
//
// A 288-thread CTA gets 168 registers a thread, enough for this schedule
// (P V awaited before S is issued at D = 128). A producer warpgroup with
// setmaxnreg 24/240 measured no faster, and did not give the consumers more
// than 168 (bench/notes_attention.md).
//
// Used for bf16/fp16, D in {64, 128}, tensors TMA can address (unit stride
// along D, 16-byte aligned pointer and strides); the portable kernel runs
// everything else.
//
// A second variant (kOverlap, below) drops the producer warp to get the
// registers for overlapping each warpgroup's softmax with its own P V, with
// 176-key tiles at D = 128: the default for Tk >= 8K (attention.cu).
#include "cuda/attention/attention_kernels.cuh"
#include "cuda/attention/attention_tma.cuh"
#include "cuda/common/barriers.cuh"
#include "cuda/common/tma.cuh"
#include "cuda/common/wgmma.cuh"

namespace flashgla::cuda::attn {

// kOverlap: the variant without a producer warp (256 threads may use 255
// registers, where ptxas caps the 288-thread kernel at 168): thread 128
// issues the loads, and each warpgroup overlaps its softmax of tile j with
// its own P V of tile j − 1, over key tiles of kBlockN = 176 at D = 128 (fewer
// tiles, so fewer barrier handshakes per key). K and V take two stages (three
// would not fit in shared memory).
template <int D, bool kOverlap = false, int BlockN = 128>
struct HopperForwardConfig {
  static_assert(!kOverlap || (D == 128 && BlockN == 176), "the overlap variant runs 176-key tiles at D = 128");
  static constexpr int kBlockM = 128;  // two consumer warpgroups of 64 rows
  static constexpr int kBlockN = BlockN;
  static constexpr int kStages = 2;
  static constexpr int kConsumerThreads = 256;
  static constexpr int kThreads = kOverlap ? kConsumerThreads : kConsumerThreads + 32;
  static constexpr int kQBytes = kBlockM * D * 2;
  static constexpr int kKVBytes = kBlockN * D * 2;
  static constexpr int kConsumerWarps = 8;
  // 1024 bytes of slack to align the tiles, then Q, K and V stages, barriers.
  static constexpr int kSmemBytes = 1024 + kQBytes + 2 * kStages * kKVBytes + 128;
};

template <class T, int D, bool kOverlap, int BlockN>
__global__ void __launch_bounds__(HopperForwardConfig<D, kOverlap, BlockN>::kThreads, 1)
    attention_forward_hopper_kernel(const __grid_constant__ CUtensorMap map_q, const __grid_constant__ CUtensorMap map_k,
                                    const __grid_constant__ CUtensorMap map_v, const AttentionParams p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace sm90;
  using Cfg = HopperForwardConfig<D, kOverlap, BlockN>;
  constexpr int BM = Cfg::kBlockM, BN = Cfg::kBlockN, NB = BN / 8, DB = D / 8, kStages = Cfg::kStages;
  constexpr int kRowBytes = 128;  // one swizzle block row: 64 elements

  extern __shared__ unsigned char smem[];
  const uint32_t sQ = (smem_address(smem) + 1023) & ~1023u;  // [D/64][BM][64]
  const uint32_t sK = sQ + Cfg::kQBytes;                       // [stage][D/64][BN][64]
  const uint32_t sV = sK + kStages * Cfg::kKVBytes;            // [stage][D/64][BN][64]
  const uint32_t barriers = sV + kStages * Cfg::kKVBytes;
  const uint32_t q_full = barriers;
  auto k_full = [&](int s) { return barriers + 8 * (1 + s); };
  auto v_full = [&](int s) { return barriers + 8 * (1 + kStages + s); };
  auto k_empty = [&](int s) { return barriers + 8 * (1 + 2 * kStages + s); };
  auto v_empty = [&](int s) { return barriers + 8 * (1 + 3 * kStages + s); };

  Work w;
  if (!decode_work(p, BM, true, p.q_heads, true, w)) return;
  const Seq& s = w.seq;
  const int64_t q0 = w.tile * BM;
  const int64_t diag = s.k_len - s.q_len;  // causal: query i sees keys j <= i + diag
  const int64_t kv_head = w.head / p.group;
  int64_t key_end = s.k_len, unmasked_end = s.k_len;
  if (p.causal) {
    key_end = min(key_end, q0 + BM + diag);
    unmasked_end = min(unmasked_end, q0 + diag + 1);
  }
  const int num_key_tiles = key_end > 0 ? int((key_end + BN - 1) / BN) : 0;
  const int first_masked_tile = unmasked_end > 0 ? int(unmasked_end / BN) : 0;

  // Step j visits key tile num_key_tiles − 1 − j: the masked tiles (the
  // last ones) come first, so the loops over masked and unmasked tiles are
  // separate and the unmasked loop carries no mask code (or its registers).
  auto key_tile = [&](int j) { return num_key_tiles - 1 - j; };
  const int masked_steps = num_key_tiles - min(first_masked_tile, num_key_tiles);

  const int tid = threadIdx.x;
  if (tid == 0) {
    mbar_init(q_full, 1);
    for (int st = 0; st < kStages; ++st) {
      mbar_init(k_full(st), 1);
      mbar_init(v_full(st), 1);
      mbar_init(k_empty(st), Cfg::kConsumerWarps);
      mbar_init(v_empty(st), Cfg::kConsumerWarps);
    }
    mbar_init_fence();
  }
  __syncthreads();

  // Loads of Q, and of K or V of key tile j into stage j % kStages once the
  // consumers released the stage (tile j − kStages); issued by one thread.
  const int batch = int(s.batch), kv = int(kv_head);
  auto load_q = [&] {
    mbar_arrive_expect_tx(q_full, Cfg::kQBytes);
    for (int db = 0; db < D / 64; ++db)
      tma_load_4d(sQ + db * BM * kRowBytes, &map_q, q_full, db * 64, int(w.head), int(s.q_begin + q0), batch);
  };
  auto load_k = [&](int j) {
    const int st = j % kStages;
    mbar_wait(k_empty(st), ((j / kStages) & 1) ^ 1);  // a fresh barrier passes parity 1 at once
    mbar_arrive_expect_tx(k_full(st), Cfg::kKVBytes);
    for (int db = 0; db < D / 64; ++db)
      tma_load_4d(sK + st * Cfg::kKVBytes + db * BN * kRowBytes, &map_k, k_full(st), db * 64, kv,
                  int(s.k_begin + int64_t(key_tile(j)) * BN), batch);
  };
  auto load_v = [&](int j) {
    const int st = j % kStages;
    mbar_wait(v_empty(st), ((j / kStages) & 1) ^ 1);
    mbar_arrive_expect_tx(v_full(st), Cfg::kKVBytes);
    for (int db = 0; db < D / 64; ++db)
      tma_load_4d(sV + st * Cfg::kKVBytes + db * BN * kRowBytes, &map_v, v_full(st), db * 64, kv,
                  int(s.k_begin + int64_t(key_tile(j)) * BN), batch);
  };

  // kOverlap: warpgroup 1's first thread loads.
  const bool loader = kOverlap && tid == 128;
  if (!kOverlap && tid >= Cfg::kConsumerThreads) {
    // Producer warp: its first lane loads everything.
    if (tid == Cfg::kConsumerThreads && num_key_tiles > 0) {
      load_q();
      for (int j = 0; j < num_key_tiles; ++j) load_k(j), load_v(j);
    }
  } else {
    const int wg = tid / 128;  // consumer 0 or 1: tile rows wg * 64 ..
    const int lane = tid & 31;
    const int row_base = wg * 64 + ((tid / 32) % 4) * 16 + (lane >> 2);  // rows row_base and row_base + 8

    float o[D / 2], sc[NB * 4];  // sc: written by the first k16 step of each S
#pragma unroll
    for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};

    // The tiles of K_j and V_j have landed.
    auto wait_k = [&](int j) { mbar_wait(k_full(j % kStages), (j / kStages) & 1); };
    auto wait_v = [&](int j) { mbar_wait(v_full(j % kStages), (j / kStages) & 1); };
    // S = Q K_j^T over D in k16 steps (32 bytes along a 128-byte row), issued, not awaited.
    auto issue_scores = [&](int j) {
      const int st = j % kStages;
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks) {
        const uint32_t a = sQ + (ks / 4) * BM * kRowBytes + wg * 64 * kRowBytes + (ks % 4) * 32;
        const uint32_t b = sK + st * Cfg::kKVBytes + (ks / 4) * BN * kRowBytes + (ks % 4) * 32;
        if (ks == 0) wgmma_ss_first<T, BN>(sc, smem_desc(a, 16, 1024), smem_desc(b, 16, 1024));
        else wgmma_ss<T, BN>(sc, smem_desc(a, 16, 1024), smem_desc(b, 16, 1024), 1);
      }
      wgmma_commit();
    };
    // O += P V_j over the tile's keys in k16 steps (16 rows of V each), issued, not awaited.
    auto issue_pv = [&](int j, const uint32_t(&pa)[BN / 16][4]) {
      const int st = j % kStages;
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        const uint32_t b = sV + st * Cfg::kKVBytes + kk * 16 * kRowBytes;
        wgmma_rs_tn<T, D>(o, pa[kk], smem_desc(b, BN * kRowBytes, 1024));
      }
      wgmma_commit();
    };
    auto release = [&](uint32_t bar) {
      if (lane == 0) mbar_arrive(bar);
    };
    // Scores of tile j in sc -> unnormalized probabilities in sc (log2
    // domain, masked), running max and sum updated; returns whether some row
    // of the warp has a new maximum, with alpha[h] = exp2(old max − new max).
    // Only tiles from first_masked_tile on are masked (`masked`, a type, so
    // that the others carry no mask code: a runtime test here is compiled
    // into predicated compares and selects that every tile executes).
    // With a positive scale (`scale_late`), the maximum of the raw scores
    // gives the scaled one, and the scale folds into exp2's argument (one
    // FFMA per score instead of FMUL + FADD).
    auto softmax = [&](auto scale_late, auto masked, int j, float(&alpha)[2]) {
      constexpr bool kScaleLate = decltype(scale_late)::value;
      const int64_t k0 = int64_t(key_tile(j)) * BN;
      if constexpr (!kScaleLate) {
#pragma unroll
        for (int i = 0; i < NB * 4; ++i) sc[i] *= p.scale_log2;
      }
      if constexpr (decltype(masked)::value) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int64_t row = q0 + row_base + h * 8;
          const int64_t end = p.causal ? min(s.k_len, row + diag + 1) : s.k_len;
          const int visible = int(max(int64_t(0), min(int64_t(BN), end - k0)));
#pragma unroll
          for (int nb = 0; nb < NB; ++nb)
#pragma unroll
            for (int e = 0; e < 2; ++e)
              if (nb * 8 + (lane & 3) * 2 + e >= visible) sc[nb * 4 + 2 * h + e] = -INFINITY;
        }
      }
      bool moved = false;
      // The four threads of a quad share a row.
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float tile_max = -INFINITY;
#pragma unroll
        for (int nb = 0; nb < NB; ++nb) tile_max = fmaxf(tile_max, fmaxf(sc[nb * 4 + 2 * h], sc[nb * 4 + 2 * h + 1]));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
        if constexpr (kScaleLate) tile_max *= p.scale_log2;
        const float m_old = row_max[h], m_new = fmaxf(m_old, tile_max);
        const float m_use = m_new == -INFINITY ? 0.f : m_new;  // a row with no key yet: all p = 0
        alpha[h] = m_new == m_old ? 1.f : fast_exp2(m_old - m_use);
        moved |= m_new != m_old;
        row_max[h] = m_new;
        float sum = row_sum[h] * alpha[h];
#pragma unroll
        for (int nb = 0; nb < NB; ++nb) {
          float p0, p1;
          if constexpr (kScaleLate) {
            p0 = fast_exp2(fmaf(sc[nb * 4 + 2 * h], p.scale_log2, -m_use));
            p1 = fast_exp2(fmaf(sc[nb * 4 + 2 * h + 1], p.scale_log2, -m_use));
          } else {
            p0 = fast_exp2(sc[nb * 4 + 2 * h] - m_use), p1 = fast_exp2(sc[nb * 4 + 2 * h + 1] - m_use);
          }
          sc[nb * 4 + 2 * h] = p0, sc[nb * 4 + 2 * h + 1] = p1;
          sum += p0 + p1;
        }
        row_sum[h] = sum;
      }
      return __any_sync(0xffffffffu, moved);
    };
    auto rescale_o = [&](const float(&alpha)[2]) {
#pragma unroll
      for (int db = 0; db < DB; ++db)
#pragma unroll
        for (int h = 0; h < 2; ++h) o[db * 4 + 2 * h] *= alpha[h], o[db * 4 + 2 * h + 1] *= alpha[h];
    };
    // P as the A fragments of P V: the accumulator layout of two adjacent n8
    // blocks is the A layout of one k16 step.
    auto pack_p = [&](uint32_t(&pa)[BN / 16][4]) {
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        pa[kk][0] = pack2<T>(sc[8 * kk + 0], sc[8 * kk + 1]);
        pa[kk][1] = pack2<T>(sc[8 * kk + 2], sc[8 * kk + 3]);
        pa[kk][2] = pack2<T>(sc[8 * kk + 4], sc[8 * kk + 5]);
        pa[kk][3] = pack2<T>(sc[8 * kk + 6], sc[8 * kk + 7]);
      }
    };

    // Ping-pong: the warpgroups take turns issuing their MMAs (named barrier
    // 1 + wg opens warpgroup wg's turn), so one's softmax runs while the
    // other's MMAs do. Warpgroup 0 goes first.
    auto my_turn = [&] {
      if (wg == 0) named_barrier_sync<1>(Cfg::kConsumerThreads);
      else named_barrier_sync<2>(Cfg::kConsumerThreads);
    };
    auto their_turn = [&] {
      if (wg == 0) named_barrier_arrive<2>(Cfg::kConsumerThreads);
      else named_barrier_arrive<1>(Cfg::kConsumerThreads);
    };
    uint32_t pa[BN / 16][4];
    float alpha[2];
    const bool positive_scale = p.scale_log2 > 0.f;
    if (num_key_tiles > 0) {
      if constexpr (kOverlap) {
        if (loader) {
          load_q();
          for (int j = 0; j < kStages && j < num_key_tiles; ++j) load_k(j);
          for (int j = 0; j + 1 < kStages && j < num_key_tiles; ++j) load_v(j);
        }
      }
      mbar_wait(q_full, 0);
      if (wg == 1) their_turn();
    }
    if constexpr (!kOverlap) {
      // Per tile j: O += P_{j-1} V_{j-1}, S = Q K_j^T, softmax, O rescaled, P_j packed.
      auto tile = [&](auto masked, int j) {
        my_turn();
        if (j > 0) {
          wait_v(j - 1);
          wgmma_fence();
          issue_pv(j - 1, pa);
          wgmma_wait<0>();
          fence_registers(o);
          fence_registers(pa);
          release(v_empty((j - 1) % kStages));
        }
        wait_k(j);
        wgmma_fence();
        issue_scores(j);
        // Warpgroup 1 opened warpgroup 0's first turn, so it skips its last hand-over.
        if (wg == 0 || j + 1 < num_key_tiles) their_turn();
        wgmma_wait<0>();
        fence_registers(sc);
        release(k_empty(j % kStages));
        const bool moved =
            positive_scale ? softmax(std::true_type{}, masked, j, alpha) : softmax(std::false_type{}, masked, j, alpha);
        if (moved && j > 0) rescale_o(alpha);
        pack_p(pa);
      };
      for (int j = 0; j < masked_steps; ++j) tile(std::true_type{}, j);
      for (int j = masked_steps; j < num_key_tiles; ++j) tile(std::false_type{}, j);
    } else {
      // Per tile j: S = Q K_j^T issued, O rescaled by tile j − 1's alpha while
      // S runs, O += P_{j-1} V_{j-1} issued, the softmax of tile j while P V
      // runs, then P_j packed. No divergent code (the loader, the releases,
      // the mbarrier waits) may run while a wgmma is in flight: ptxas would
      // serialize every wgmma (C7520). So tile 0 is peeled, the rescale is
      // unconditional (alpha is 1 where a row's maximum held), and the stages
      // are released, and refilled, at the end of each tile. The loader runs
      // half a tile behind warpgroup 0, so the stages it refills (K of tile j,
      // V of tile j − 1) are free by then; K runs kStages tiles ahead, V
      // kStages − 1 (it is used one tile later).
      auto finish_tile = [&](int j) {
        release(k_empty(j % kStages));
        if (j > 0) release(v_empty((j - 1) % kStages));
        if (loader) {
          if (j + kStages < num_key_tiles) load_k(j + kStages);
          if (j + kStages - 1 < num_key_tiles) load_v(j + kStages - 1);  // j = 0: a fresh stage
        }
      };
      if (num_key_tiles > 0) {
        my_turn();
        wait_k(0);
        wgmma_fence();
        issue_scores(0);
        if (wg == 0 || num_key_tiles > 1) their_turn();
        wgmma_wait<0>();
        fence_registers(sc);
        // Step 0 takes the masked path whether or not it needs it: one tile's worth.
        positive_scale ? softmax(std::true_type{}, std::true_type{}, 0, alpha)
                       : softmax(std::false_type{}, std::true_type{}, 0, alpha);
        pack_p(pa);
        finish_tile(0);
      }
      auto tile = [&](auto masked, int j) {
        my_turn();
        wait_k(j);
        wait_v(j - 1);
        wgmma_fence();
        issue_scores(j);
        rescale_o(alpha);
        wgmma_fence();
        issue_pv(j - 1, pa);
        if (wg == 0 || j + 1 < num_key_tiles) their_turn();
        wgmma_wait<1>();  // S done, P V may still run
        fence_registers(sc);
        positive_scale ? softmax(std::true_type{}, masked, j, alpha) : softmax(std::false_type{}, masked, j, alpha);
        wgmma_wait<0>();
        fence_registers(o);
        fence_registers(pa);
        pack_p(pa);
        finish_tile(j);
      };
      for (int j = 1; j < masked_steps; ++j) tile(std::true_type{}, j);
      for (int j = max(1, masked_steps); j < num_key_tiles; ++j) tile(std::false_type{}, j);
      if (num_key_tiles > 0) rescale_o(alpha);
    }
    if (num_key_tiles > 0) {
      wait_v(num_key_tiles - 1);
      wgmma_fence();
      issue_pv(num_key_tiles - 1, pa);
      wgmma_wait<0>();
      fence_registers(o);
      fence_registers(pa);
      release(v_empty((num_key_tiles - 1) % kStages));
    }

    // o = O / l (0 for a row that saw no key), lse = ln(l) + max.
    const int64_t o_base = s.batch * p.o.batch + s.q_begin * p.o.token + w.head * p.o.head;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float l = row_sum[h];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const float inv = l > 0.f ? 1.f / l : 0.f;
      const int64_t row = q0 + row_base + h * 8;
      if (row >= s.q_len) continue;
#pragma unroll
      for (int db = 0; db < DB; ++db) {
        const int col = db * 8 + (lane & 3) * 2;
        store_pair<T>(p.o, o_base + row * p.o.token + col * p.o.dim, o[db * 4 + 2 * h] * inv,
                      o[db * 4 + 2 * h + 1] * inv);
      }
      if ((lane & 3) == 0)
        p.lse[s.batch * p.lse_batch + w.head * p.lse_head + (s.q_begin + row) * p.lse_token] =
            l > 0.f ? (row_max[h] + __log2f(l)) * kLn2 : -INFINITY;
    }
  }
#endif
}

// Launches the Hopper forward; returns nullptr, or (having launched nothing)
// why this device, build or tensors do not allow it.
template <class T, int D, bool kOverlap, int BlockN = 128>
const char* launch_forward_hopper(AttentionParams p, cudaStream_t stream) {
  using Cfg = HopperForwardConfig<D, kOverlap, BlockN>;
  static_assert(Cfg::kSmemBytes <= 227 * 1024, "shared memory");
  auto kernel = attention_forward_hopper_kernel<T, D, kOverlap, BlockN>;
  int device = 0, major = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), "cudaDeviceGetAttribute");
  if (major != 9) return "the device is not compute capability 9.x";
  // The sm_90a machine code must be what this device runs (an sm_80-only or a
  // plain sm_90 build has no Hopper kernel bodies: the portable kernel runs).
  if (!loaded_code().sm90a) return "this build has no sm_90a machine code";
  if (!p.q.vec16 || !p.k.vec16 || !p.v.vec16)
    return "q, k and v need unit stride along D and 16-byte aligned pointers and strides (TMA)";
  constexpr int64_t kIntMax = 0x7fffffff;
  if (p.q_len > kIntMax || p.k_len > kIntMax || p.batch > kIntMax || p.q_heads > kIntMax)
    return "a length, batch or head count exceeds the 32-bit TMA coordinates";
  if (tensor_map_encoder() == nullptr) return "the driver offers no cuTensorMapEncodeTiled";
  CUtensorMap map_q, map_k, map_v;
  if (!make_tensor_map<T>(map_q, p.q, p.batch, p.q_len, p.q_heads, D, Cfg::kBlockM) ||
      !make_tensor_map<T>(map_k, p.k, p.batch, p.k_len, p.kv_heads, D, Cfg::kBlockN) ||
      !make_tensor_map<T>(map_v, p.v, p.batch, p.k_len, p.kv_heads, D, Cfg::kBlockN))
    return "cuTensorMapEncodeTiled rejected a tensor";

  const int64_t blocks = plan_grid(p, Cfg::kBlockM, true, p.q_heads);
  if (blocks == 0) return nullptr;
  prepare_smem(kernel, Cfg::kSmemBytes);
  kernel<<<unsigned(blocks), Cfg::kThreads, Cfg::kSmemBytes, stream>>>(map_q, map_k, map_v, p);
  check_cuda(cudaGetLastError(), "attention forward (Hopper) kernel launch");
  return nullptr;
}

template <class T, int D>
const char* run_attention_forward_hopper(AttentionParams p, cudaStream_t stream, HopperForwardVariant variant) {
  switch (variant) {
    case HopperForwardVariant::ping_pong: return launch_forward_hopper<T, D, false>(p, stream);
    case HopperForwardVariant::overlap_wide:
      // Written for D = 128; D = 64 runs the ping-pong kernel (its tiles are cheap already).
      if constexpr (D == 128) return launch_forward_hopper<T, D, true, 176>(p, stream);
      else return launch_forward_hopper<T, D, false>(p, stream);
  }
  return "unknown Hopper forward variant";
}

#define FLASHGLA_HOPPER_FORWARD(T, D) \
  template const char* run_attention_forward_hopper<T, D>(AttentionParams, cudaStream_t, HopperForwardVariant);
FLASHGLA_HOPPER_FORWARD(__nv_bfloat16, 64)
FLASHGLA_HOPPER_FORWARD(__half, 64)
FLASHGLA_HOPPER_FORWARD(__nv_bfloat16, 128)
FLASHGLA_HOPPER_FORWARD(__half, 128)
#undef FLASHGLA_HOPPER_FORWARD

}  // namespace flashgla::cuda::attn
