// The Hopper path's state kernel, warp-specialized (sm_90a): the math, slot
// image and sequence-split protocol of gla_fwd_hopper.cuh (item 2 there), with
// the loads taken off the consumers' path (it replaced a first state kernel
// in which every warp loaded, computed and stored).
//
// * A producer warpgroup (one working warp, registers given back through
//   setmaxnreg) fills a ring of kStages stages: the slot image of a chunk by
//   bulk copy, V's tile by cp.async (the warp's 32 lanes, completion
//   signalled on the same mbarrier with cp.async.mbarrier.arrive.noinc). A
//   stage is refilled as soon as the consumers' wgmmas of its chunk have
//   completed (an "empty" mbarrier every consumer thread arrives on), not
//   after the output of that chunk has been stored.
// * No clusters: a variant in clusters of 2 or 4 value tiles multicasting the
//   slot image measured slower at every shape and was retired (its history:
//   bench/notes_gla_fwd.md).
// * The two consumer warpgroups hold the state in
//   wgmma accumulators as before; per chunk: wait "full", decay, wgmmas,
//   release the stage, exchange the partial outputs, store o and the bf16
//   state. Two named barriers among the consumers per chunk (the exchange
//   buffer written / read), no CTA-wide barrier.
// * The states pass is its own instantiation (STATES): no runtime branch
//   between wgmma.fence and the wgmmas (ptxas would otherwise inject
//   warpgroup.arrive).
// * Launched as a programmatic dependent of the chunk pass (griddepcontrol):
//   the CTA sets up its barriers while the chunk pass finishes, then waits for
//   it before the first read of a slot or of the split states.
#pragma once

#include <type_traits>

#include "cuda/common/copy.cuh"
#include "cuda/gla/kernels/gla_fwd_hopper.cuh"
#include "cuda/gla/device/elements.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/gla/device/split_chunks.cuh"
#include "cuda/gla/device/warp_mma.cuh"
#include "cuda/gla/stages/chunk_fwd_hopper.cuh"

namespace flashgla::cuda::gla::hopper {

template <int KP>
struct WsLayout {
  static_assert(KP == 128 || KP == 256, "the key pads of hopper_key_pad");
  static constexpr int kWarpgroups = 2;                   // consumer warpgroups
  static constexpr int kConsumers = 128 * kWarpgroups;
  static constexpr int kThreads = kConsumers + 128;      // + the producer warpgroup
  static constexpr int kTiles = KP / 64 / kWarpgroups;   // m64 tiles of H per consumer warpgroup
  static constexpr int kStages = KP == 256 ? 2 : 3;     // what fits in 227 KB next to the state and the exchange
  static constexpr Slot slot{KP};
  static constexpr int v = slot.bytes();                  // V [64 tokens][64 columns] after the slot image
  static constexpr int stage = v + C * 128;
  static constexpr int hs = kStages * stage;              // bf16 H [KP][64] (B operand of Q̃ H)
  static constexpr int xchg = hs + KP * 128;              // [2][16][128] fp32 partial outputs
  static constexpr int barriers = xchg + 2 * 16 * 128 * 4;  // full, empty [kStages]
  static constexpr int bytes = barriers + 16 * kStages;
  static constexpr int alloc = bytes + 1024;              // slack to align the base to 1024 bytes
};

// The mbarrier counts one arrival when this thread's earlier cp.async copies have landed.
__device__ __forceinline__ void cp_async_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

// ---- NaN/Inf causality: the rare chunks whose v holds a NaN or an Inf ----
// O += A V multiplies the zeros of A above the diagonal by the later rows of v; 0 · NaN and 0 · Inf are NaN, so
// a NaN or Inf in v at token t would reach the outputs before t of its chunk. The consumers probe their
// accumulators for non-finite values after the wgmmas (32 FFMAs and a vote per chunk); only a warp that finds
// one and whose warpgroup's tokens of v hold a NaN or Inf recomputes its rows on CUDA cores, A V with j ≤ i
// selected (never multiplied by a zero).

// Whether x holds a NaN or an Inf: x · 0 is NaN exactly for those (the zero opaque, so that nothing folds it).
__device__ __forceinline__ bool any_nonfinite32(const float (&x)[32]) {
  float zero = 0.f;
  asm("" : "+f"(zero));
  float probe[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int e = 0; e < 32; ++e) probe[e & 3] = fmaf(x[e], zero, probe[e & 3]);
  const float sum = (probe[0] + probe[1]) + (probe[2] + probe[3]);
  return sum != sum;
}

// Whether rows [row0, row0 + rows) of a [64][64] tile of 2-byte elements (128-byte rows; the swizzle only moves
// 16-byte pieces inside a row) hold a NaN or an Inf: a vote of the warp, the same in every warp.
template <class E>
__device__ __forceinline__ bool rows_nonfinite(const unsigned char* tile, int row0, int rows, int lane) {
  bool bad = false;
#pragma unroll 1
  for (int piece = lane; piece < rows * 8; piece += 32)
    bad |= any_nonfinite8<E>(*reinterpret_cast<const uint4*>(tile + row0 * 128 + piece * 16));
  return __any_sync(0xffffffffu, bad);
}

template <class E>
__device__ __forceinline__ float2 widen2(uint32_t w) {
  if constexpr (std::is_same_v<E, __nv_bfloat16>) return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w));
  else return __half22float2(*reinterpret_cast<const __half2*>(&w));
}

// This warp's 16 rows (row0..) of a warpgroup's partial output, o = Q̃[:, keys] · bf16(H[keys]) + Σ_{j ≤ i} A_ij V_j
// over the warpgroup's keys and tokens: what its wgmmas compute, from the same operands in shared memory (the stage
// of the chunk, the state they read), with the terms j > i left out instead of multiplied by A's zeros. In the
// accumulator layout: element e is row row0 + lane/4 (+8 for e%4 ≥ 2), column 8·(e/4) + 2·(lane%4) + e%2.
template <class E, int KP, int NWG>
__device__ __forceinline__ void chunk_output_rowwise(float (&o)[32], const unsigned char* stage, const unsigned char* hs,
                                                     int wg, int row0, int lane) {
  constexpr Slot slot{KP};
  constexpr int kV = slot.bytes();  // V's tile follows the slot image in a stage (WsLayout::v)
  const int t4 = lane & 3, r0 = row0 + (lane >> 2), r1 = r0 + 8;
#pragma unroll
  for (int e = 0; e < 32; ++e) o[e] = 0.f;
  // Q̃ H: key by key, the thread's two rows of Q̃ times its 16 columns of the state (8 column pairs).
  constexpr int kKeys = KP / NWG;
#pragma unroll 1
  for (int key = wg * kKeys; key < (wg + 1) * kKeys; ++key) {
    const unsigned char* q_tile = stage + slot.q() + (key / 64) * C * 128;
    const float q0 = to_float(*reinterpret_cast<const E*>(q_tile + swizzled(r0, key % 64)));
    const float q1 = to_float(*reinterpret_cast<const E*>(q_tile + swizzled(r1, key % 64)));
#pragma unroll
    for (int cp = 0; cp < 8; ++cp) {
      const float2 h = widen2<E>(*reinterpret_cast<const uint32_t*>(hs + swizzled(key, 8 * cp + 2 * t4)));
      o[4 * cp] = fmaf(q0, h.x, o[4 * cp]), o[4 * cp + 1] = fmaf(q0, h.y, o[4 * cp + 1]);
      o[4 * cp + 2] = fmaf(q1, h.x, o[4 * cp + 2]), o[4 * cp + 3] = fmaf(q1, h.y, o[4 * cp + 3]);
    }
  }
  // A V: token by token over the warpgroup's tokens, each row only from the tokens at or before it.
  constexpr int kTokens = C / NWG;
#pragma unroll 1
  for (int j = wg * kTokens; j < (wg + 1) * kTokens; ++j) {
    const bool take0 = j <= r0, take1 = j <= r1;
    const float a0 = take0 ? to_float(*reinterpret_cast<const E*>(stage + slot.a() + swizzled(r0, j))) : 0.f;
    const float a1 = take1 ? to_float(*reinterpret_cast<const E*>(stage + slot.a() + swizzled(r1, j))) : 0.f;
#pragma unroll
    for (int cp = 0; cp < 8; ++cp) {
      const float2 v = widen2<E>(*reinterpret_cast<const uint32_t*>(stage + kV + swizzled(j, 8 * cp + 2 * t4)));
      if (take0) o[4 * cp] = fmaf(a0, v.x, o[4 * cp]), o[4 * cp + 1] = fmaf(a0, v.y, o[4 * cp + 1]);
      if (take1) o[4 * cp + 2] = fmaf(a1, v.x, o[4 * cp + 2]), o[4 * cp + 3] = fmaf(a1, v.y, o[4 * cp + 3]);
    }
  }
}

template <class E, int KP, bool STATES>
__global__ void __launch_bounds__(WsLayout<KP>::kThreads, 1) hopper_ws_kernel(const ChunkParams p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using L = WsLayout<KP>;
  constexpr int NWG = L::kWarpgroups, MT = L::kTiles, S = L::kStages;
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

  const SplitChunks chunks = split_chunks(p, n);
  if (chunks.idle(split, STATES)) return;
  const SeqSpan seq = chunks.seq;
  const int64_t last_split = chunks.last_split, c_begin = chunks.begin(p, split), c_end = chunks.end(p, split);
  auto row_offset = [&](const View& t, int64_t token) { return token_offset(t, seq, h, token); };
  // full: the slot image (expect_tx by this CTA's producer) and V (32 cp.async lanes); empty: every consumer
  // thread of this CTA.
  const uint32_t full_bar = sbase + L::barriers, empty_bar = full_bar + 8 * S;
  if (tid == 0) {
    for (int s = 0; s < S; ++s) {
      sm90::mbar_init(full_bar + 8 * s, 33);
      sm90::mbar_init(empty_bar + 8 * s, L::kConsumers);
    }
    sm90::mbar_init_fence();
  }
  __syncthreads();
  wait_for_previous_grid();  // the chunk pass's slots (and the states pass's split states) are complete

  if (wg == NWG) {
    // ---- producer ----
    sm90::set_max_registers_dec<56>();
    if (wwarp != 0) return;
    auto slot_of = [&](int64_t c) {
      return p.prep + (slot_index(p, seq, n, c) * p.heads + h) * int64_t(L::slot.bytes());
    };
    const uint32_t slot_bytes = STATES ? L::slot.q() : L::slot.bytes();
    for (int64_t c = c_begin; c < c_end; ++c) {
      const int i = int(c - c_begin), s = i % S;
      if (i >= S) {
        const uint32_t parity = uint32_t(i / S - 1) & 1u;
        sm90::mbar_wait(empty_bar + 8 * s, parity);
      }
      const uint32_t dst = sbase + s * L::stage;
      if (lane == 0) {
        sm90::mbar_arrive_expect_tx(full_bar + 8 * s, slot_bytes);
        bulk_copy(dst, slot_of(c), slot_bytes, full_bar + 8 * s);
      }
      const int rows_valid = int(min(int64_t(C), seq.len - c * C));
#pragma unroll 4
      for (int j = lane; j < C * 8; j += 32) {
        const int r = j >> 3, col = v0 + 8 * (j & 7);
        const int bytes = r < rows_valid ? min(16, max(0, (V - col) * 2)) : 0;
        const E* from = bytes ? static_cast<const E*>(p.v.data) + row_offset(p.v, c * C + r) + col
                              : static_cast<const E*>(p.v.data);
        cp_async16_unordered(smem + s * L::stage + L::v + swizzled(r, 8 * (j & 7)), from, bytes);
      }
      cp_async_arrive(full_bar + 8 * s);
    }
    cp_async_wait_committed();  // no copy of this thread outlives it
    return;
  }

  // ---- consumers ----
  sm90::set_max_registers_inc<224>();
  constexpr int NC = L::kConsumers;
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
      H[mt][e] = !STATES && key < K && vg < V ? split_start_state(p, n, h, nh, split, key, vg, K, V) : 0.f;
    }
  float split_decay_acc = 1.f;  // states pass: thread tid < KP, key tid

  // Each warpgroup writes (and its wgmmas read) only its own key rows of the bf16 state.
  auto store_state_bf16 = [&] {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int e = 0; e < 32; e += 2) {
        const int key = key_of(mt, e);
        *reinterpret_cast<uint32_t*>(smem + L::hs + swizzled(key, acc_col(e))) = pack2<E>(H[mt][e], H[mt][e + 1]);
      }
  };
  if constexpr (!STATES) {
    store_state_bf16();
    sm90::fence_proxy_async_shared();
    sm90::named_barrier_sync<1>(NC);
  }
  float* xchg = reinterpret_cast<float*>(smem + L::xchg);

  for (int64_t c = c_begin; c < c_end; ++c) {
    const int i = int(c - c_begin), s = i % S;
    sm90::mbar_wait(full_bar + 8 * s, uint32_t(i / S) & 1u);
    const uint32_t st = sbase + s * L::stage;
    const float* decay = reinterpret_cast<const float*>(smem + s * L::stage + L::slot.decay());
    chunk_fwd_h_decay(H, decay, wg, wwarp, lane);
    if (STATES && tid < KP) split_decay_acc *= decay[tid];

    float o[32];
#pragma unroll
    for (int e = 0; e < 32; ++e) o[e] = 0.f;
    // The accumulators' new values are defined before the first wgmma of the chunk (else ptxas serializes them).
    if constexpr (!STATES) sm90::fence_registers(o);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) sm90::fence_registers(H[mt]);
    sm90::wgmma_fence();
    if constexpr (!STATES) {
      // O = Q̃ H over this warpgroup's keys, + A V over its share of the tokens.
      constexpr int KS = KP / 16 / NWG, TS = 4 / NWG;
#pragma unroll
      for (int j = 0; j < KS; ++j) {
        const int ks = wg * KS + j;
        wgmma_64x64<E>(o, sm90::smem_desc(st + L::slot.q() + (ks / 4) * C * 128 + (ks % 4) * 32, 16, 1024),
                       sm90::smem_desc(sbase + L::hs + ks * 16 * 128, KP * 128, 1024));
      }
#pragma unroll
      for (int j = 0; j < TS; ++j) {
        const int ts = wg * TS + j;
        wgmma_64x64<E>(o, sm90::smem_desc(st + L::slot.a() + ts * 32, 16, 1024),
                       sm90::smem_desc(st + L::v + ts * 16 * 128, C * 128, 1024));
      }
    }
    // H ← decay ⊙ H + K̃ᵀ V over this warpgroup's key tiles (the decay above).
    chunk_fwd_h_accumulate<E, L>(H, st, wg);
    sm90::wgmma_commit();
    sm90::wgmma_wait<0>();
    if constexpr (!STATES) sm90::fence_registers(o);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) sm90::fence_registers(H[mt]);
    if constexpr (!STATES) {
      // NaN/Inf causality (see chunk_output_rowwise): a non-finite value in this warp's rows of o is either what it
      // should be (a NaN state from an earlier chunk, a NaN or Inf of q or k in this one) or one of v met A's zeros
      // above the diagonal; in the latter case the warp's rows are recomputed with j ≤ i selected.
      const bool suspect = __any_sync(0xffffffffu, any_nonfinite32(o));
      if (suspect) {
        const unsigned char* stage = smem + s * L::stage;
        if (rows_nonfinite<E>(stage + L::v, wg * (C / NWG), C / NWG, lane))
          chunk_output_rowwise<E, KP, NWG>(o, stage, smem + L::hs, wg, 16 * wwarp, lane);
      }
    }
    // This thread's reads of the stage (decay, its warpgroup's wgmmas, a recompute) are done: the producer may
    // refill it.
    sm90::mbar_arrive(empty_bar + 8 * s);
    if constexpr (STATES) continue;

    // The other warpgroup's half of the columns goes through shared memory.
    sm90::named_barrier_sync<2>(NC);  // both warpgroups have read the previous chunk's exchange
    float* mine = xchg + wg * 16 * 128;
#pragma unroll
    for (int e = 0; e < 16; ++e) mine[e * 128 + wt] = wg == 0 ? o[e + 16] : o[e];
    store_state_bf16();
    sm90::fence_proxy_async_shared();
    sm90::named_barrier_sync<1>(NC);  // partial outputs visible; this warpgroup's bf16 state written

    const int rows_valid = int(min(int64_t(C), seq.len - c * C));
    E* out = static_cast<E*>(p.o.data) + row_offset(p.o, c * C);
    const int e_begin = 16 * wg, e_end = e_begin + 16;
    const float* theirs = xchg + (1 - wg) * 16 * 128;
#pragma unroll
    for (int e = 0; e < 32; e += 2) {
      if (e < e_begin || e >= e_end) continue;
      float lo = o[e], hi = o[e + 1];
      lo += theirs[(e - e_begin) * 128 + wt], hi += theirs[(e + 1 - e_begin) * 128 + wt];
      const int r = acc_row(e), col = v0 + acc_col(e);
      if (r >= rows_valid || col >= V) continue;
      E* at = out + r * p.o.stride[1] + col;
      if (col + 1 < V) *reinterpret_cast<uint32_t*>(at) = pack2<E>(p.scale * lo, p.scale * hi);
      else at[0] = from_float<E>(p.scale * lo);
    }
  }

  // ---- the state: this split's piece (states pass) or the final state ----
  if constexpr (STATES) {
    const int64_t slot = nh * (p.num_splits - 1) + split;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int e = 0; e < 32; ++e) {
        const int key = key_of(mt, e), vg = v0 + acc_col(e);
        if (key < K && vg < V) p.split_states[(slot * K + key) * V + vg] = H[mt][e];
      }
    if (blockIdx.y == 0 && tid < K) p.split_decay[slot * K + tid] = split_decay_acc;
  } else {
    if (split == last_split && p.ht.data) {
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
  }
#endif
}

}  // namespace flashgla::cuda::gla::hopper
