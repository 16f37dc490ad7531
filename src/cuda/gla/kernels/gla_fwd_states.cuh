// The sequence split's states pass as its own kernel (the fast path's K ≤ 256,
// bf16/fp16 inputs): each split's end state from a zero start, with no query
// side. The fast kernel's output pass then starts each split from them.
//
// A piece of chunks [c0, c1) of one (sequence, head) ends in the state
//   S = Σ_t (k_t ⊙ exp(G_t))ᵀ v_t,   G_t = Σ_{s > t, s in the piece} g_s,
// one matrix product over the piece's tokens with k rescaled by the gate's sum
// after each token. Walking the chunks backwards makes G_t a running sum (the
// chunks already seen, plus the suffix sum inside the chunk), so the state
// needs no decay step: S += K̂_cᵀ V_c on mma accumulators (chunk_fwd_h_accumulate,
// stages/chunk_fwd_fast.cuh), two barriers per
// chunk, k, v, g of the next chunk in flight (cp.async, kStateStages buffers). The
// exponent is a sum of (log-decay) gates, never a difference: gates of −20 per
// step underflow to 0 and never overflow, as in the output pass.
//
// Pieces: a split may be cut into `state_pieces` pieces run by separate CTAs
// (more CTAs than (sequence, head, tile, split) alone give). Each writes its
// state and total decay exp(Σ g) to a piece slot; fold_pieces_kernel combines
// them in order (S ← decay_p ⊙ S + S_p) into the prefix slots the output pass
// reads: slot s − 1 = the state at the start of split s from a zero state at the
// sequence start, so that the output pass reads one slot instead of folding s
// of them.
//
// The segment summaries (gla_segment.cu) run this kernel alone with one split
// per sequence (whole_segments: every split, each piece's log decay too); for
// their gradients with k, v holding q, d_o, walking the chunks forwards with
// inclusive prefix sums of g (walk_forward) and the result scaled.
//
// CTA: 8 warps; (sequence, head) × (value tile of BV, key part of KP) × (split,
// piece). Warp w holds two 16-key tiles of the state and a share of its columns
// as fp32 mma fragments. The gate phase: thread = (key pair, row quarter of 16
// rows).
#pragma once

#include "cuda/gla/kernels/gla_fwd_fast.cuh"
#include "cuda/gla/device/elements.cuh"
#include "cuda/gla/device/split_chunks.cuh"
#include "cuda/gla/device/tiles.cuh"
#include "cuda/gla/device/warp_mma.cuh"

namespace flashgla::cuda::gla {
namespace states {

constexpr int kWarps = 8, kThreads = kWarps * 32;
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Shared memory of the kernel: StatesLayoutBytes in cuda/gla/plan/layouts.h (sizes of E and G), so that the
// planner computes the same bytes.
template <class E, class G, int KP, int BV, Gate GK>
using StatesLayout = StatesLayoutBytes<int(sizeof(E)), int(sizeof(G)), KP, BV, GK>;

// Where the kernel keeps K̂ and V for chunk_fwd_h_accumulate (stages/chunk_fwd_fast.cuh): one stage per chunk.
template <class E, class G, int KP, int BV, Gate GK>
struct StatesTiles {
  using L = StatesLayout<E, G, KP, BV, GK>;
  static constexpr int P = L::P, PV = L::PV;
  static constexpr int k = L::k, v = L::v, stage = L::stage;
};

template <class E, class G, int KP, int BV, Gate GK>
__global__ void __launch_bounds__(kThreads, kStatesBlocksPerSm) split_states_kernel(const ChunkParams p) {
  using L = StatesLayout<E, G, KP, BV, GK>;
  constexpr int STAGES = kStateStages;
  using M = Mma<E>;
  constexpr int P = L::P, PV = L::PV, PG = L::PG;
  // Warp w holds key tiles 2·(w % KWG) and 2·(w % KWG) + 1 of the state and NS of its 8-column tiles: a warp
  // reads a third fewer operand bytes from shared memory than with one key tile and all columns.
  constexpr int KT = KP / 16;                   // key tiles of the state
  constexpr int KWG = KT / 2, VWG = kWarps / KWG;
  constexpr int NS = (BV / 8) / VWG;            // 8-column tiles of the state per warp
  constexpr int kPairs = KP / 2;                // key pairs in the gate phase
  constexpr int kQuarterRows = C / 4;
  static_assert(KT % 2 == 0 && kWarps % KWG == 0 && (BV / 8) % VWG == 0 && NS % 2 == 0, "tile split");
  static_assert(kPairs * 4 <= kThreads && kPairs % 8 == 0, "gate phase roles");
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g4 = lane >> 2, t4 = lane & 3;
  const int64_t nh = blockIdx.x;
  const int64_t n = nh / p.heads;
  const int h = int(nh % p.heads);
  const int K = p.key_dim, V = p.value_dim;
  const int value_tiles = (V + BV - 1) / BV;
  const int v0 = (blockIdx.y % value_tiles) * BV;
  const int k0 = int(blockIdx.y / value_tiles) * KP;  // this CTA's key part
  const int kn = min(KP, K - k0);
  const int pieces = p.state_pieces;
  const int split = blockIdx.z / pieces, piece = blockIdx.z % pieces;

  const SplitChunks chunks = split_chunks(p, n);
  const SeqSpan seq = chunks.seq;
  // No later split reads the last one's state; the segment summaries (p.whole_segments) want every split's,
  // an empty segment's included (zero), and a summary call (p.summary) the last split's too.
  const bool last_of_summary = !p.whole_segments && p.summary.data && split == chunks.last_split;
  if (split >= chunks.last_split && !p.whole_segments && !last_of_summary) return;
  const int64_t split_begin = chunks.begin(p, split), split_end = chunks.end(p, split);
  const int64_t piece_len = (p.chunks_per_split + pieces - 1) / pieces;
  const int64_t c_begin = min(split_end, split_begin + piece * piece_len);
  const int64_t c_end = min(split_end, c_begin + piece_len);
  const int count = int(c_end - c_begin);  // chunks of this piece, walked from c_end − 1 down
  auto row_offset = [&](const View& t, int64_t token) { return token_offset(t, seq, h, token); };

  auto stage_k = [&](int s) { return reinterpret_cast<E*>(smem + s * L::stage + L::k); };
  auto stage_v = [&](int s) { return reinterpret_cast<E*>(smem + s * L::stage + L::v); };
  auto stage_g = [&](int s) { return reinterpret_cast<G*>(smem + s * L::stage + L::g); };
  float* scalar_gate_s = reinterpret_cast<float*>(smem + L::scalar_gate);

  // Chunk number i of the walk (chunk c_end − 1 − i) into stage i % STAGES.
  // p.walk_forward (the segment gradients): chunks first to last, each row's weight the inclusive
  // prefix sum exp Σ_{u ≤ t} g_u instead of the suffix sum exp Σ_{u > t} g_u.
  const bool forward = p.walk_forward;
  auto chunk_of = [&](int i) { return forward ? c_begin + i : c_end - 1 - i; };
  auto issue = [&](int i) {
    const int64_t c = chunk_of(i);
    const int s = i % STAGES;
    const int rows_valid = int(min(int64_t(C), seq.len - c * C));
    // 16-byte cp.async pieces; rows past the sequence and columns past the dims read as zero.
    load_rows<KP, kThreads>(stage_k(s), P, p.k, seq, h, c * C, rows_valid, k0, K, tid);
    load_rows<BV, kThreads>(stage_v(s), PV, p.v, seq, h, c * C, rows_valid, v0, V, tid);
    if constexpr (GK == Gate::vector) load_rows<KP, kThreads>(stage_g(s), PG, p.g, seq, h, c * C, rows_valid, k0, K, tid);
  };
  float scalar_g_next = 0.f;  // the scalar gate of the next chunk, in registers of the first 64 threads
  auto fetch_scalar_gate = [&](int i) {
    if (GK == Gate::scalar && tid < C) {
      const int64_t t = chunk_of(i) * C + tid;
      scalar_g_next = t < seq.len ? scalar_gate(p.g, row_offset(p.g, t), p.g_gamma, h) : 0.f;
    }
  };

  const int kg = warp % KWG, ns0 = (warp / KWG) * NS;
  float S[2][NS][4];
#pragma unroll
  for (int t = 0; t < 2; ++t)
#pragma unroll
    for (int nt = 0; nt < NS; ++nt) S[t][nt][0] = S[t][nt][1] = S[t][nt][2] = S[t][nt][3] = 0.f;

  // Gate phase roles: key pair `pair` (keys 2·pair, 2·pair + 1 of the part), rows 16·quarter .. +15 of the
  // chunk, walked from row 15 − rot down (cyclically): at each step the 4 quarters of a warp are at rows 2 apart
  // mod 8, in distinct banks.
  const int quarter = lane & 3, pair = warp * 8 + (lane >> 2), rot = 2 * quarter;
  const bool gate_thread = pair < kPairs;  // warp-uniform (kPairs is a multiple of 8)
  float carry[2] = {0.f, 0.f};  // Σ g over the chunks already walked (those after the current one)

#pragma unroll
  for (int i = 0; i < STAGES - 1; ++i) {
    if (i < count) issue(i);
    cp_async_commit_unordered();
  }
  if (count > 0) fetch_scalar_gate(0);

  for (int i = 0; i < count; ++i) {
    const int s = i % STAGES;
    if (GK == Gate::scalar && tid < C) scalar_gate_s[tid] = scalar_g_next;
    if (i + 1 < count) fetch_scalar_gate(i + 1);
    if (i + STAGES - 1 < count) issue(i + STAGES - 1);  // into the stage chunk i − 1 has finished with
    cp_async_commit_unordered();
    asm volatile("cp.async.wait_group %0;\n" ::"n"(STAGES - 1) : "memory");
    __syncthreads();  // chunk i's tiles (and scalar gate) are in

    E* k_s = stage_k(s);
    if constexpr (GK != Gate::none) {
      // K̂ = k ⊙ exp(G) in place: G = carry + (later quarters of this chunk) + (later rows of this quarter).
      if (gate_thread) {
        // The gate is read twice (quarter sums, then the walk) rather than held: the state takes 64 registers.
        // Step j is row (15 − rot − j) mod 16 of the quarter: first rows 15 − rot .. 0, then the top rows
        // 15 .. 16 − rot, whose sum `top` is everything after the first part within the quarter.
        const int r0 = quarter * kQuarterRows;
        // Walking forward, step j is row (rot + j) mod 16: rows rot .. 15, then 0 .. rot − 1 (the same banks).
        auto row_at = [&](int j) {
          return r0 + ((forward ? rot + j : kQuarterRows - 1 - rot - j) & (kQuarterRows - 1));
        };
        auto gate_at = [&](int r) {
          if constexpr (GK == Gate::vector) {
            float pairx[2];
            load_keys<G, 2>(stage_g(s) + r * PG + 2 * pair, pairx);
            return make_float2(pairx[0], pairx[1]);
          } else {
            const float a = scalar_gate_s[r];
            return make_float2(a, a);
          }
        };
        float2 total = make_float2(0.f, 0.f), top = make_float2(0.f, 0.f);
#pragma unroll
        for (int j = 0; j < kQuarterRows; ++j) {
          const float2 x = gate_at(row_at(j));
          total.x += x.x, total.y += x.y;
          if (j >= kQuarterRows - rot) top.x += x.x, top.y += x.y;
        }
        float2 after = make_float2(0.f, 0.f), chunk = make_float2(0.f, 0.f);
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int from = (lane & ~3) | q;
          const float tx = __shfl_sync(0xffffffffu, total.x, from), ty = __shfl_sync(0xffffffffu, total.y, from);
          chunk.x += tx, chunk.y += ty;
          if (forward ? q < quarter : q > quarter) after.x += tx, after.y += ty;  // forward: the earlier quarters
        }
        // exp(carry + after + run) as one FFMA and one MUFU.EX2 (ftz: what underflows is 0, as it should be).
        const float2 base2 = make_float2((carry[0] + after.x) * kLog2e, (carry[1] + after.y) * kLog2e);
        float2 run = top;  // Σ g over this quarter's rows after the current one; 0 again at the top part
#pragma unroll
        for (int j = 0; j < kQuarterRows; ++j) {
          const int r = row_at(j);
          if (j + rot == kQuarterRows) run = make_float2(0.f, 0.f);
          float kv[2];
          E* at = k_s + r * P + 2 * pair;
          load_keys<E, 2>(at, kv);
          const float2 x = gate_at(r);
          run.x += forward ? x.x : 0.f, run.y += forward ? x.y : 0.f;  // forward: the row's own gate included
          const float out[2] = {kv[0] * exp2_ftz(fmaf(run.x, kLog2e, base2.x)),
                                kv[1] * exp2_ftz(fmaf(run.y, kLog2e, base2.y))};
          store_keys<E, 2>(at, out);
          run.x += forward ? 0.f : x.x, run.y += forward ? 0.f : x.y;
        }
        carry[0] += chunk.x, carry[1] += chunk.y;
      }
      __syncthreads();  // K̂ complete
    }

    // S += K̂ᵀ V (this warp: key tiles 2·kg, 2·kg + 1; columns 8·ns0 ..).
    {
      typename M::A a[2];
      typename M::B b0, b1;
      chunk_fwd_h_accumulate<E, StatesTiles<E, G, KP, BV, GK>>(S, s, 2 * kg, ns0, lane, a, b0, b1);
    }
    __syncthreads();  // every warp done with stage s before it is refilled
  }
  cp_async_wait_committed();

  // The piece's state and total decay (the split's when there is one piece).
  const int64_t slot = (nh * (p.num_splits - 1) + split) * pieces + piece;
  const int64_t last_slot = nh * pieces + piece;  // last_of_summary: a slot of its own (slot may be another's)
  float* states_out = last_of_summary ? p.last_piece_states + last_slot * K * V : p.piece_states + slot * K * V;
#pragma unroll
  for (int t = 0; t < 2; ++t)
#pragma unroll
    for (int nt = 0; nt < NS; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int lkey = 16 * (2 * kg + t) + g4 + (e >> 1) * 8, vg = v0 + 8 * (ns0 + nt) + 2 * t4 + (e & 1);
        if (lkey < kn && vg < V) states_out[int64_t(k0 + lkey) * V + vg] = p.summary_scale * S[t][nt][e];
      }
  if (blockIdx.y % value_tiles == 0 && gate_thread && quarter == 0)
#pragma unroll
    for (int e = 0; e < 2; ++e)
      if (2 * pair + e < kn) {
        if (last_of_summary) {
          p.last_piece_log_decay[last_slot * K + k0 + 2 * pair + e] = carry[e];
          continue;
        }
        p.piece_decay[slot * K + k0 + 2 * pair + e] = __expf(carry[e]);
        if (p.piece_log_decay) p.piece_log_decay[slot * K + k0 + 2 * pair + e] = carry[e];
      }
}

// The prefix slots from the piece slots, per (sequence, head) over its splits in order: slot j holds the state
// and decay at the end of split j from the sequence start, folded piece by piece (S ← decay_p ⊙ S + S_p,
// D ← decay_p ⊙ D). A summary call folds the last split's pieces on into p.summary.
// Block (sequence × head, key), threads over the value columns.
__global__ void fold_pieces_kernel(const ChunkParams p) {
  const int64_t nh = blockIdx.x, n = nh / p.heads;
  const int h = int(nh % p.heads);
  const int64_t last_split = split_chunks(p, n).last_split;  // slots written
  const int K = p.key_dim, V = p.value_dim, key = blockIdx.y, pieces = p.state_pieces;
  const View& summary = p.summary;
  auto summary_at = [&](int col) {
    return static_cast<float*>(summary.data) + n * summary.stride[0] + h * summary.stride[1] +
           key * summary.stride[2] + col * summary.stride[3];
  };
  for (int v = threadIdx.x; v < V; v += blockDim.x) {
    float state = 0.f;
    for (int64_t j = 0; j < last_split; ++j) {
      const int64_t slot = nh * (p.num_splits - 1) + j;
#pragma unroll 4
      for (int piece = 0; piece < pieces; ++piece) {
        const int64_t from = slot * pieces + piece;
        state = p.piece_decay[from * K + key] * state + p.piece_states[(from * K + key) * V + v];
      }
      p.split_states[(slot * K + key) * V + v] = state;
    }
    if (summary.data) {
      for (int piece = 0; piece < pieces; ++piece) {
        const int64_t from = nh * pieces + piece;
        state = __expf(p.last_piece_log_decay[from * K + key]) * state + p.last_piece_states[(from * K + key) * V + v];
      }
      *summary_at(v) = state;
    }
  }
  if (threadIdx.x == 0) {
    float decay = 1.f, log_decay = 0.f;
    for (int64_t j = 0; j < last_split; ++j) {
      const int64_t slot = nh * (p.num_splits - 1) + j;
      for (int piece = 0; piece < pieces; ++piece) {
        decay *= p.piece_decay[(slot * pieces + piece) * K + key];
        if (summary.data) log_decay += p.piece_log_decay[(slot * pieces + piece) * K + key];
      }
      p.split_decay[slot * K + key] = decay;
    }
    if (summary.data) {
      for (int piece = 0; piece < pieces; ++piece) log_decay += p.last_piece_log_decay[(nh * pieces + piece) * K + key];
      *summary_at(V) = log_decay;
    }
  }
}

}  // namespace states
}  // namespace flashgla::cuda::gla
