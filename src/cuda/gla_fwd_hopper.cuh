// The chunked GLA forward's Hopper path (sm_90a): two kernels.
//
// 1. The chunk pass (hopper_prep2_kernel, gla_fwd_hopper_prep2.cuh; portable,
//    one CTA per (sequence, head, chunk of 64 tokens), all chunks in
//    parallel): every gate-dependent quantity of a chunk, computed once per
//    (token, head) instead of once per value tile, written to a workspace
//    slot in the exact shared-memory image the state kernel's wgmma reads
//    (bf16/fp16 tiles of [rows][64] elements, 128-byte swizzle):
//      K̃ᵀ [KP keys][64 tokens]  k_j ⊙ exp(γ^C − Γ_j)      (state update, A operand)
//      decay [KP] fp32           exp(γ^C)
//      Q̃  [64 tokens][KP keys]  q_i ⊙ exp(Γ_i)            (O = Q̃ H, A operand)
//      A  [64][64]               Σ_k q_ik k_jk exp(Γ_ik − Γ_jk), j ≤ i, else 0
//    with Γ the inclusive cumulative sum of g over the chunk (fp32) and every
//    exp of a non-positive argument. A is accumulated in fp32 in 4×4 tiles:
//    below the diagonal every tile as products of q_i exp(Γ_i − Γ_r) and
//    k_j exp(Γ_r − Γ_j) with r the first row of its query block (16 rows for
//    the six off-diagonal 16×16 blocks, 4 rows inside the diagonal ones; both
//    factors ≤ 1, so gates of −20 per step underflow to 0 and never
//    overflow), the 4×4 tiles on the diagonal with exp(Γ_i − Γ_j) as products
//    of α_r = exp(Γ_r − Γ_{r−1}) ≤ 1.
// 2. The state kernel (hopper_chunk_kernel, sm_90a): one CTA per (sequence,
//    head, value tile of 64 columns, sequence split), walking its chunks in
//    order. One or two warpgroups; warpgroup w keeps its key rows of the state
//    H [KP × 64] as fp32 wgmma accumulators and, per chunk,
//      o_partial = Q̃[:, keys_w] · bf16(H[keys_w]) + A[:, tokens_w] · V[tokens_w]
//      H[keys_w] ← decay ⊙ H[keys_w] + K̃ᵀ[keys_w] · V
//    (wgmma m64n64k16, operands from shared memory); the two partial outputs
//    are summed through shared memory, each warpgroup storing half of the
//    columns. The next chunk's slot image (one bulk copy, an mbarrier) and V
//    tile (cp.async) load while this one computes. The sequence split and its
//    states pass work as in gla_fwd_chunk.cu.
//    The default state kernel is now its warp-specialized version,
//    hopper_ws_kernel (gla_fwd_hopper_ws.cuh: a producer warp, a ring of
//    stages, PDL after the chunk pass; same math and results bit for bit);
//    this one runs with FLASHGLA_GLA_HOPPER_WS=0.
// Measured (bench/results_gla_forward.md, run 13) at B4 T4096 H4 K256 V512:
// chunk pass 0.143 ms, state kernel 0.172 ms (this one) / 0.162 ms
// (hopper_ws_kernel), forward 0.326 / 0.309 ms.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/attention_wgmma.cuh"
#include "cuda/common.cuh"
#include "cuda/gla_device.cuh"
#include "cuda/gla_fwd.cuh"

namespace flashgla::cuda::gla::hopper {

constexpr int C = kChunk;
constexpr int kPrepThreads = 256;

// Byte offsets inside one workspace slot (one chunk of one head); every tile
// starts 1024-byte aligned, as the 128-byte swizzle needs.
struct Slot {
  int key_pad;
  __host__ __device__ constexpr int kt() const { return 0; }
  __host__ __device__ constexpr int decay() const { return key_pad * 128; }
  __host__ __device__ constexpr int q() const { return decay() + 1024; }
  __host__ __device__ constexpr int a() const { return q() + key_pad * 128; }
  __host__ __device__ constexpr int bytes() const { return a() + C * 128; }
};

// Element (row, col) of a [rows][64] tile of 2-byte elements in the 128-byte swizzle: byte offset.
__device__ __forceinline__ int swizzled(int row, int col) {
  return row * 128 + ((((col >> 3) ^ row) & 7) << 4) + (col & 7) * 2;
}

template <class E>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  E pair[2] = {from_float<E>(lo), from_float<E>(hi)};
  return *reinterpret_cast<const uint32_t*>(pair);
}
template <class E>
__device__ __forceinline__ uint4 pack8(const float (&x)[8]) {
  return make_uint4(pack2<E>(x[0], x[1]), pack2<E>(x[2], x[3]), pack2<E>(x[4], x[5]), pack2<E>(x[6], x[7]));
}

// The slot of chunk c of sequence n: fixed-length batches n · chunks + c; varlen
// n + begin / 64 + c, distinct for non-decreasing boundaries and below
// num_seqs + ceil(T / 64) for any.
__device__ __forceinline__ int64_t slot_index(const ChunkParams& p, const SeqRange& seq, int64_t n, int64_t c) {
  return p.seqs.cu_seqlens ? n + seq.begin / C + c : n * p.prep_chunks + c;
}

// Off-diagonal block b of A (query block I, key block J): (1,0) (2,0) (2,1) (3,0) (3,1) (3,2).
__device__ __forceinline__ void pair_of(int b, int& I, int& J) {
  I = b < 1 ? 1 : b < 3 ? 2 : 3;
  J = b - I * (I - 1) / 2;
}

// ---- sm_90a primitives not in attention_wgmma.cuh ----------------------------------------
__device__ __forceinline__ uint64_t desc_sw128(uint32_t addr, uint32_t leading_bytes, uint32_t stride_bytes) {
  return uint64_t((addr & 0x3ffff) >> 4) | (uint64_t(leading_bytes >> 4) << 16) |
         (uint64_t(stride_bytes >> 4) << 32) | (uint64_t(1) << 62);
}
// `bytes` (a multiple of 16) from global to shared memory in one bulk copy, completion counted on `bar`.
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
__device__ __forceinline__ void fence_accumulators(float (&r)[32]) {
#pragma unroll
  for (int i = 0; i < 32; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

// D[64 × 64] += A[64 × 16] B[16 × 64]: A K-major, B MN-major (rows = the contraction), both in shared memory.
template <class E>
__device__ void wgmma_64x64(float (&d)[32], uint64_t desc_a, uint64_t desc_b);

#define FLASHGLA_WGMMA_64X64(TYPE, PTX_TYPE)                                                                         \
  template <>                                                                                                        \
  __device__ __forceinline__ void wgmma_64x64<TYPE>(float (&d)[32], uint64_t desc_a, uint64_t desc_b) {            \
    asm volatile(                                                                                                    \
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"                                                                 \
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." PTX_TYPE "." PTX_TYPE                                         \
        " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "   \
        "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 1;\n}\n"                              \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),           \
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),     \
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),   \
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])    \
        : "l"(desc_a), "l"(desc_b));                                                                                 \
  }
FLASHGLA_WGMMA_64X64(__nv_bfloat16, "bf16")
FLASHGLA_WGMMA_64X64(__half, "f16")
#undef FLASHGLA_WGMMA_64X64

// ---- the state kernel ----------------------------------------------------------------------
template <int KP>
struct MainLayout {
  static constexpr int kWarpgroups = KP >= 128 ? 2 : 1;
  static constexpr int kThreads = 128 * kWarpgroups;
  static constexpr int kTiles = KP / 64 / kWarpgroups;  // m64 tiles of H per warpgroup
  static constexpr Slot slot{KP};
  static constexpr int v = slot.bytes();                // V [64 tokens][64 columns] after the slot image
  static constexpr int stage = v + C * 128;
  static constexpr int hs = 2 * stage;                  // bf16 H [KP][64] (B operand of Q̃ H)
  static constexpr int xchg = hs + KP * 128;            // [2][16][128] fp32 partial outputs
  static constexpr int barriers = xchg + (kWarpgroups == 2 ? 2 * 16 * 128 * 4 : 0);  // [2 stages] mbarriers
  static constexpr int bytes = barriers + 16;
  static constexpr int alloc = bytes + 1024;            // slack to align the base to 1024 bytes
};

template <class E, int KP>
__global__ void __launch_bounds__(MainLayout<KP>::kThreads, 1) hopper_chunk_kernel(const ChunkParams p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using L = MainLayout<KP>;
  constexpr int NWG = L::kWarpgroups, MT = L::kTiles, NT = L::kThreads;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - smem_address(smem_raw) % 1024) % 1024);
  const uint32_t sbase = smem_address(smem);
  const int tid = threadIdx.x, wg = tid / 128, wt = tid % 128, wwarp = wt / 32, lane = tid & 31;
  const int64_t nh = blockIdx.x;
  const int64_t n = nh / p.heads;
  const int h = int(nh % p.heads);
  const int K = p.key_dim, V = p.value_dim;
  const int v0 = blockIdx.y * 64;
  const int split = blockIdx.z;

  const SeqRange seq = sequence_range(p.seqs, n);
  const int64_t num_chunks = (seq.len + C - 1) / C;
  const int64_t last_split = num_chunks == 0 ? 0 : (num_chunks - 1) / p.chunks_per_split;
  if (split > last_split || (p.states_only && split == last_split)) return;
  const int64_t c_begin = split * p.chunks_per_split;
  const int64_t c_end = min(num_chunks, c_begin + p.chunks_per_split);
  auto row_offset = [&](const View& t, int64_t token) {
    return seq.batch * t.stride[0] + (seq.begin + token) * t.stride[1] + h * t.stride[2];
  };
  // Accumulator element e of a thread: row 16·warp + lane/4 (+8 for e%4 ≥ 2), column 8·(e/4) + 2·(lane%4) + e%2.
  auto acc_row = [&](int e) { return 16 * wwarp + (lane >> 2) + 8 * ((e >> 1) & 1); };
  auto acc_col = [&](int e) { return 8 * (e >> 2) + 2 * (lane & 3) + (e & 1); };
  auto key_of = [&](int mt, int e) { return 64 * (wg * MT + mt) + acc_row(e); };

  // ---- the state: h0 folded through the earlier splits (zero in the states pass) ----
  float H[MT][32];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int e = 0; e < 32; ++e) {
      const int key = key_of(mt, e), vg = v0 + acc_col(e);
      float s = 0.f;
      if (!p.states_only && key < K && vg < V) {
        if (p.h0.data)
          s = static_cast<const float*>(p.h0.data)[n * p.h0.stride[0] + h * p.h0.stride[1] + key * p.h0.stride[2] +
                                                    vg * p.h0.stride[3]];
        for (int prev = 0; prev < split; ++prev) {
          const int64_t slot = nh * (p.num_splits - 1) + prev;
          s = p.split_decay[slot * K + key] * s + p.split_states[(slot * K + key) * V + vg];
        }
      }
      H[mt][e] = s;
    }
  float split_decay_acc = 1.f;  // states pass: thread tid < KP, key tid

  auto store_state_bf16 = [&] {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int e = 0; e < 32; e += 2) {
        const int key = key_of(mt, e);
        *reinterpret_cast<uint32_t*>(smem + L::hs + swizzled(key, acc_col(e))) = pack2<E>(H[mt][e], H[mt][e + 1]);
      }
  };
  // The slot image of chunk c in one bulk copy (its K̃ᵀ and decay only in the states pass), V by cp.async.
  const uint32_t full_bar = sbase + L::barriers;  // + 8 · stage
  if (tid == 0) {
    attn::sm90::mbar_init(full_bar, 1);
    attn::sm90::mbar_init(full_bar + 8, 1);
    attn::sm90::mbar_init_fence();
  }
  __syncthreads();
  auto issue = [&](int64_t c, int stage) {
    unsigned char* dst = smem + stage * L::stage;
    if (tid == 0) {
      const unsigned char* src = p.prep + (slot_index(p, seq, n, c) * p.heads + h) * int64_t(L::slot.bytes());
      const uint32_t bytes = p.states_only ? L::slot.q() : L::slot.bytes();
      attn::sm90::mbar_arrive_expect_tx(full_bar + 8 * stage, bytes);
      bulk_copy(sbase + stage * L::stage, src, bytes, full_bar + 8 * stage);
    }
    const int rows_valid = int(min(int64_t(C), seq.len - c * C));
    for (int i = tid; i < C * 8; i += NT) {
      const int r = i >> 3, col = v0 + 8 * (i & 7);
      const int bytes = r < rows_valid ? min(16, max(0, (V - col) * 2)) : 0;
      const E* from = bytes ? static_cast<const E*>(p.v.data) + row_offset(p.v, c * C + r) + col
                            : static_cast<const E*>(p.v.data);
      cp_async16(dst + L::v + swizzled(r, 8 * (i & 7)), from, bytes);
    }
  };

  if (!p.states_only) store_state_bf16();
  if (c_begin < c_end) issue(c_begin, 0);
  cp_async_commit();
  float* xchg = reinterpret_cast<float*>(smem + L::xchg);

  for (int64_t c = c_begin; c < c_end; ++c) {
    const int stage = int((c - c_begin) & 1);
    attn::sm90::mbar_wait(full_bar + 8 * stage, uint32_t((c - c_begin) >> 1) & 1u);
    cp_async_wait_all();
    fence_proxy_async();
    __syncthreads();  // B0: chunk c's slot and V in; the bf16 state written; the other stage free
    if (c + 1 < c_end) issue(c + 1, stage ^ 1);
    cp_async_commit();
    const uint32_t st = sbase + stage * L::stage;
    const float* decay = reinterpret_cast<const float*>(smem + stage * L::stage + L::slot.decay());
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const float d0 = decay[key_of(mt, 0)], d1 = decay[key_of(mt, 2)];
#pragma unroll
      for (int e = 0; e < 32; ++e) H[mt][e] *= (e >> 1) & 1 ? d1 : d0;
    }
    if (p.states_only && tid < KP) split_decay_acc *= decay[tid];

    float o[32];
#pragma unroll
    for (int e = 0; e < 32; ++e) o[e] = 0.f;
    // The accumulators' new values are defined before the first wgmma of the chunk (else ptxas serializes them).
    fence_accumulators(o);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) fence_accumulators(H[mt]);
    wg_fence();
    if (!p.states_only) {
      // O = Q̃ H over this warpgroup's keys, + A V over its share of the tokens.
      constexpr int KS = KP / 16 / NWG, TS = 4 / NWG;
#pragma unroll
      for (int j = 0; j < KS; ++j) {
        const int ks = wg * KS + j;
        wgmma_64x64<E>(o, desc_sw128(st + L::slot.q() + (ks / 4) * C * 128 + (ks % 4) * 32, 16, 1024),
                       desc_sw128(sbase + L::hs + ks * 16 * 128, KP * 128, 1024));
      }
#pragma unroll
      for (int j = 0; j < TS; ++j) {
        const int ts = wg * TS + j;
        wgmma_64x64<E>(o, desc_sw128(st + L::slot.a() + ts * 32, 16, 1024),
                       desc_sw128(st + L::v + ts * 16 * 128, C * 128, 1024));
      }
    }
    // H ← decay ⊙ H + K̃ᵀ V over this warpgroup's key tiles.
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int ts = 0; ts < 4; ++ts)
        wgmma_64x64<E>(H[mt], desc_sw128(st + L::slot.kt() + (wg * MT + mt) * 64 * 128 + ts * 32, 16, 1024),
                       desc_sw128(st + L::v + ts * 16 * 128, C * 128, 1024));
    wg_commit();
    wg_wait_all();
    fence_accumulators(o);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) fence_accumulators(H[mt]);
    if (p.states_only) continue;

    // The other warpgroup's half of the columns goes through shared memory.
    if constexpr (NWG == 2) {
      float* mine = xchg + wg * 16 * 128;
#pragma unroll
      for (int e = 0; e < 16; ++e) mine[e * 128 + wt] = wg == 0 ? o[e + 16] : o[e];
    }
    __syncthreads();  // B1: every product of this chunk done (the bf16 state is free); partial outputs visible
    store_state_bf16();
    fence_proxy_async();

    const int rows_valid = int(min(int64_t(C), seq.len - c * C));
    E* out = static_cast<E*>(p.o.data) + row_offset(p.o, c * C);
    const int e_begin = NWG == 2 ? 16 * wg : 0, e_end = NWG == 2 ? e_begin + 16 : 32;
    const float* theirs = xchg + (1 - wg) * 16 * 128;
#pragma unroll
    for (int e = 0; e < 32; e += 2) {
      if (e < e_begin || e >= e_end) continue;
      float lo = o[e], hi = o[e + 1];
      if constexpr (NWG == 2) lo += theirs[(e - e_begin) * 128 + wt], hi += theirs[(e + 1 - e_begin) * 128 + wt];
      const int r = acc_row(e), col = v0 + acc_col(e);
      if (r >= rows_valid || col >= V) continue;
      E* at = out + r * p.o.stride[1] + col;
      if (col + 1 < V) *reinterpret_cast<uint32_t*>(at) = pack2<E>(p.scale * lo, p.scale * hi);
      else at[0] = from_float<E>(p.scale * lo);
    }
  }

  // ---- the state: this split's piece (states pass) or the final state ----
  if (p.states_only) {
    const int64_t slot = nh * (p.num_splits - 1) + split;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int e = 0; e < 32; ++e) {
        const int key = key_of(mt, e), vg = v0 + acc_col(e);
        if (key < K && vg < V) p.split_states[(slot * K + key) * V + vg] = H[mt][e];
      }
    if (blockIdx.y == 0 && tid < K) p.split_decay[slot * K + tid] = split_decay_acc;
  } else if (split == last_split && p.ht.data) {
    float* ht = static_cast<float*>(p.ht.data);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int e = 0; e < 32; ++e) {
        const int key = key_of(mt, e), vg = v0 + acc_col(e);
        if (key < K && vg < V)
          ht[n * p.ht.stride[0] + h * p.ht.stride[1] + key * p.ht.stride[2] + vg * p.ht.stride[3]] = H[mt][e];
      }
  }
#endif
}

}  // namespace flashgla::cuda::gla::hopper
