// Chunked GLA forward, fused with the state kept on chip (the non-materialized
// FlashLinearAttention form of the GLA paper; the steps of docs/algorithm.md).
//
// One CTA per (sequence, head, value tile of 64 columns (32 for fp32),
// sequence split). It walks its chunks of C = 64 tokens in order and keeps the
// state tile S[k][v] (fp32) in shared memory. K is walked in slices of 32 key
// columns; for each chunk and slice:
//   * q, k, g [64 × 32] arrive by cp.async (16-byte pieces, double-buffered:
//     the next slice loads while this one computes), v [64 × tile] once a chunk;
//   * the gate factors come from α = exp(g) by products, never by exp of a
//     difference: exp(Γ_r) = Π_{s≤r} α_s, exp(γ^C − Γ_r) = Π_{s>r} α_s, and
//     the secondary sub-chunk references likewise, so no factor exceeds 1 and
//     gates of −20 per step underflow to 0 instead of overflowing;
//   * O += (Q ⊙ exp Γ) S (tensor cores);
//   * intra-chunk A over secondary 16-token sub-chunks: the 6 off-diagonal
//     16×16 blocks on tensor cores with the first row of the query sub-chunk as
//     reference point (docs/algorithm.md step 3); the 4 diagonal blocks in fp32
//     on CUDA cores, exp(Γ_r − Γ_c) built row by row as a running product of α;
//   * S ← diag(exp γ^C) S + (K ⊙ exp(γ^C − Γ))^T V (tensor cores).
// After the last slice, O += (A ⊙ M) V and o is written. Each warp owns 8
// value columns of O and of the state, so it reads and then updates its own
// state columns without a barrier between the two.
//
// Products use mma.sync (sm_80+) with fp32 accumulation: bf16/fp16 operands
// for bf16/fp16 inputs, 3xTF32 for fp32 inputs (fp32 accuracy, no silent TF32).
//
// Occupancy: when (sequences × heads × value tiles) cannot fill the GPU, each
// sequence is split into pieces of `chunks_per_split` chunks. A first pass of
// this kernel (states_only) computes each piece's state from a zero start and
// its total decay Π exp(g), written to the workspace; the output pass then
// starts piece s from h0 folded through the states and decays of pieces
// 0..s−1 (a short scan in its prologue) and computes its outputs.
#include "cuda/common/host.cuh"
#include "cuda/gla/device/elements.cuh"
#include "cuda/gla/device/split_chunks.cuh"
#include "cuda/gla/device/tiles.cuh"
#include "cuda/gla/device/warp_mma.cuh"
#include "cuda/gla/device/gla_fwd.cuh"
#include "cuda/gla/stages/chunk_fwd.cuh"

namespace flashgla::cuda::gla {
namespace {

constexpr int NT = kChunkThreads;

template <class E>
__global__ void __launch_bounds__(NT, 2) chunk_forward_kernel(const ChunkParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  using M = Mma<E>;
  using Tile = stages::ChunkTile<E>;  // tile shape and pitches (stages/chunk_fwd.cuh)
  constexpr int C = Tile::C, KS = Tile::KS, BV = Tile::BV, CG = Tile::CG, RW = Tile::RW;
  constexpr int MT_O = Tile::MT_O, kPairs = Tile::kPairs, kDiagRows = Tile::kDiagRows;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g4 = lane >> 2, t4 = lane & 3;  // mma fragment coordinates
  const int64_t nh = blockIdx.x;
  const int64_t n = nh / p.heads;
  const int h = int(nh % p.heads);
  const int v0 = blockIdx.y * BV;
  const int split = blockIdx.z;
  const int K = p.key_dim, V = p.value_dim;
  const int Kp = p.num_slices * KS;
  const ChunkLayout& L = p.smem;
  const int sp = L.state_pitch;  // floats per key row of S
  const int gsize = elem_size(p.g.dtype);

  const SplitChunks chunks = split_chunks(p, n);
  if (chunks.idle(split, p.states_only)) return;
  const SeqSpan seq = chunks.seq;
  const int64_t last_split = chunks.last_split, c_begin = chunks.begin(p, split), c_end = chunks.end(p, split);
  auto row_offset = [&](const View& t, int64_t token) { return token_offset(t, seq, h, token); };

  float* S = reinterpret_cast<float*>(smem + L.state);  // S[k][v], pitch sp
  E* raw_v = reinterpret_cast<E*>(smem + L.raw_v);
  float* alpha_s = reinterpret_cast<float*>(smem + L.alpha);
  E* Qg = reinterpret_cast<E*>(smem + L.qg);      // [64][PS]  q ⊙ exp Γ
  E* Qoff = reinterpret_cast<E*>(smem + L.qoff);  // [48][PS]  q_i ⊙ exp(Γ_i − γ_i^first), sub-chunks 1..3
  E* Koff = reinterpret_cast<E*>(smem + L.koff);  // [6 pairs][16][PS]  k_j ⊙ exp(γ_i^first − Γ_j)
  E* KdT = reinterpret_cast<E*>(smem + L.kdt);    // [32][PC]  (k ⊙ exp(γ^C − Γ))^T
  E* VT = reinterpret_cast<E*>(smem + L.vt);      // [64][PC]  v^T
  E* Amat = Qg;  // [64][PC] intra-chunk A, written after the last slice's products (aliases Qg..Koff)
  float* totals = reinterpret_cast<float*>(smem + L.totals);  // [3][8 row groups][32]
  float* decay_s = reinterpret_cast<float*>(smem + L.decay);  // [32] exp(γ^C) of this slice
  float* split_decay_s = reinterpret_cast<float*>(smem + L.split_decay);  // [Kp] states pass
  float* scalar_alpha = reinterpret_cast<float*>(smem + L.scalar_alpha);  // [64] scalar gate
  auto raw_q = [&](int stage) { return reinterpret_cast<E*>(smem + L.raw[stage]); };
  auto raw_k = [&](int stage) { return raw_q(stage) + C * KS; };
  auto raw_g = [&](int stage) { return reinterpret_cast<const unsigned char*>(raw_q(stage) + 2 * C * KS); };

  // ---- initial state: h0 folded through the earlier splits (zero in the states pass) ----
  for (int i = tid; i < Kp * BV; i += NT) {
    const int kk = i / BV, vv = i - kk * BV, vg = v0 + vv;
    S[kk * sp + vv] = !p.states_only && kk < K && vg < V ? split_start_state(p, n, h, nh, split, kk, vg, K, V) : 0.f;
  }
  if (p.states_only)
    for (int i = tid; i < Kp; i += NT) split_decay_s[i] = 1.f;

  // ---- loads: q, k, g of one slice (tiles 0-2) and v of one chunk (tile 3), as asked by `tiles` ----
  // One copy loop serves every tile (a runtime loop keeps the kernel's code small).
  auto issue = [&](int64_t c, int slice, int stage, unsigned tiles) {
    const int rows_valid = int(min(int64_t(C), seq.len - c * C));
#pragma unroll 1
    for (int t = 0; t < 4; ++t) {
      if (!(tiles >> t & 1u)) continue;
      const View& view = t == 0 ? p.q : t == 1 ? p.k : t == 2 ? p.g : p.v;
      const int esize = t == 2 ? gsize : int(sizeof(E));
      void* dst = t == 0 ? static_cast<void*>(raw_q(stage)) : t == 1 ? static_cast<void*>(raw_k(stage))
                : t == 2 ? const_cast<unsigned char*>(raw_g(stage)) : static_cast<void*>(raw_v);
      load_tile_unpadded(view.data, view.rows16, view.stride[3], esize, row_offset(view, c * C), view.stride[1], C, rows_valid,
                t == 3 ? v0 : slice * KS, t == 3 ? V : K, t == 3 ? BV : KS, dst, tid, NT);
    }
  };
  const unsigned slice_tiles = (p.states_only ? 0u : 1u) | 2u | (p.gate == Gate::vector ? 4u : 0u);
  constexpr unsigned kValueTileLoad = 8u;
  // The scalar gate of a chunk travels in registers of the first 64 threads, one chunk ahead.
  float scalar_g_next = 0.f;
  auto fetch_scalar_gate = [&](int64_t c) {
    if (p.gate == Gate::scalar && tid < C) {
      const int64_t t = c * C + tid;
      scalar_g_next = t < seq.len ? scalar_gate(p.g, row_offset(p.g, t), p.g_gamma, h) : 0.f;
    }
  };

  if (c_begin < c_end) {
    issue(c_begin, 0, 0, slice_tiles | kValueTileLoad);
    fetch_scalar_gate(c_begin);
  }
  cp_async_commit_unordered();

  float o_acc[MT_O][4] = {};              // O: rows 16 * (MT_O * part + mt), columns 8 * cg ..
  float a_off[2][4] = {};                 // warps 0..5: one off-diagonal 16×16 block of A
  float diag[kDiagRows] = {};             // partial sums of the diagonal blocks
  const int cg = warp % CG, part = warp / CG;
  // Off-diagonal pair handled by warp w < 6: (i, j) = (1,0) (2,0) (2,1) (3,0) (3,1) (3,2).
  const int pair_i = warp < 1 ? 1 : warp < 3 ? 2 : 3;
  const int pair_j = warp - pair_i * (pair_i - 1) / 2;
  // Diagonal blocks: warp pair 2b, 2b+1 takes block b; each thread two columns
  // (p8 and 15 − p8: 17 rows together) and 4 of the slice's 32 keys.
  const int dblk = warp >> 1, p8 = ((warp & 1) << 2) | (lane >> 3), kq = lane & 7;
  int stage = 0;

  for (int64_t c = c_begin; c < c_end; ++c) {
    const int rows_valid = int(min(int64_t(C), seq.len - c * C));
    if (p.gate == Gate::scalar && tid < C) scalar_alpha[tid] = __expf(scalar_g_next);
    if (c + 1 < c_end) fetch_scalar_gate(c + 1);
    // Whether this chunk's v holds a NaN or Inf: then O += A V takes its diagonal blocks on CUDA cores (below).
    bool v_nonfinite = false;

    for (int slice = 0; slice < p.num_slices; ++slice) {
      cp_async_wait_committed();
      __syncthreads();  // this slice's tiles are in; the other stage and the operands are free
      {
        int64_t next_c = c;
        int next_slice = slice + 1;
        if (next_slice == p.num_slices) next_slice = 0, ++next_c;
        if (next_c < c_end) issue(next_c, next_slice, stage ^ 1, slice_tiles);
        cp_async_commit_unordered();
      }
      const E* rq = raw_q(stage);
      const E* rk = raw_k(stage);

      // ---- gate factors (step 1) and the gated operands: warp = group of 8 rows, lane = key column ----
      {
        // The stages' register arrays live here, in the kernel: arrays local to an inlined function change the
        // order in which the compiler allocates the kernel's registers (stages/chunk_fwd.cuh).
        float a[8], fwd[8], bwd[8], total[8], before, after, kv[8], kd[8], vv[8];
        stages::GateFactors f{a, fwd, bwd, total, before, after, kv, kd};
        stages::chunk_local_cumsum<E>(p, raw_g(stage), scalar_alpha, alpha_s, totals, decay_s, split_decay_s, slice,
                                      warp, lane, f);
        stages::chunk_fwd_operands<E>(p, rq, rk, totals, KdT, Qg, Qoff, Koff, warp, lane, f);
        if (slice == 0) stages::transpose_values<E>(raw_v, VT, 8 * warp, lane, v_nonfinite, vv);
      }
      if (slice == 0) v_nonfinite = __syncthreads_or(v_nonfinite);  // operands ready; raw v consumed
      else __syncthreads();
      if (slice == 0 && c + 1 < c_end) issue(c + 1, 0, 0, kValueTileLoad);
      cp_async_commit_unordered();

      if (!p.states_only) {
        // ---- O += (Q ⊙ exp Γ) S over this slice's keys ----
        {
          typename M::B bf;
          typename M::A af;
          stages::chunk_fwd_o_state<E>(S, sp, Qg, slice, cg, part, lane, o_acc, bf, af);
        }
        // ---- off-diagonal sub-chunk blocks of A (step 3) ----
        if (warp < kPairs) {
          typename M::A af;
          typename M::B bf;
          stages::chunk_fwd_intra_offdiag<E>(Qoff, Koff, warp, pair_i, lane, a_off, af, bf);
        }
        // ---- diagonal blocks: A_rc += Σ_k q_rk k_ck Π_{c<s≤r} α_sk, in fp32 (step 4) ----
        stages::chunk_fwd_intra_diag<E>(rq, rk, alpha_s, warp, lane, diag);
      }
      // ---- S ← diag(exp γ^C) S + (K ⊙ exp(γ^C − Γ))^T V on this slice's keys, this warp's columns (step 2) ----
      if constexpr (RW > 1) __syncthreads();  // the column group's other warp has read these keys too
      __syncwarp();
      stages::chunk_fwd_h<E>(S, sp, decay_s, KdT, VT, slice, cg, part, g4, t4, lane);
      stage ^= 1;
    }

    if (p.states_only) continue;

    // ---- assemble A over the slice operands, once every warp is done with them ----
    stages::chunk_fwd_intra_store<E>(Amat, tid, warp, dblk, p8, kq, pair_i, pair_j, g4, t4, diag, a_off);

    // ---- O += (A ⊙ M) V: row block m needs the sub-chunks 0..m (step 5) ----
    stages::chunk_fwd_o_intra<E>(Amat, VT, v_nonfinite, cg, part, g4, t4, lane, o_acc);

    // ---- o = scale · O, staged in the α area (free since the barrier above) for whole-row stores ----
    stages::chunk_fwd_o_store<E>(p, reinterpret_cast<E*>(smem + L.alpha), seq, h, c, rows_valid, v0, V, tid, cg, part,
                                 g4, t4, o_acc);
  }

  // ---- the state: this split's piece (states pass) or the final state ----
  __syncthreads();
  if (p.states_only) {
    const int64_t slot = nh * (p.num_splits - 1) + split;
    for (int i = tid; i < K * BV; i += NT) {
      const int kk = i / BV, vv = i - kk * BV;
      if (v0 + vv < V) p.split_states[(slot * K + kk) * V + v0 + vv] = S[kk * sp + vv];
    }
    if (blockIdx.y == 0)
      for (int i = tid; i < K; i += NT) p.split_decay[slot * K + i] = split_decay_s[i];
  } else if (split == last_split && p.ht.data) {
    float* ht = static_cast<float*>(p.ht.data);
    for (int i = tid; i < K * BV; i += NT) {
      const int kk = i / BV, vv = i - kk * BV;
      if (v0 + vv < V)
        ht[n * p.ht.stride[0] + h * p.ht.stride[1] + kk * p.ht.stride[2] + (v0 + vv) * p.ht.stride[3]] =
            S[kk * sp + vv];
    }
  }
}

template <class E>
void set_smem_limit(int bytes) {
  check_cuda(cudaFuncSetAttribute(chunk_forward_kernel<E>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
             "cudaFuncSetAttribute (GLA chunk kernel)");
}

template <class E>
int blocks_per_sm(int bytes) {
  set_smem_limit<E>(bytes);
  int blocks = 0;
  check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, chunk_forward_kernel<E>, NT, bytes),
             "cudaOccupancyMaxActiveBlocksPerMultiprocessor (GLA chunk kernel)");
  return blocks;
}

template <class E>
void launch(const ChunkParams& p, dim3 grid, cudaStream_t stream) {
  set_smem_limit<E>(p.smem.bytes);
  chunk_forward_kernel<E><<<grid, NT, p.smem.bytes, stream>>>(p);
  check_cuda(cudaGetLastError(), "GLA chunk kernel launch");
}

}  // namespace

int chunk_blocks_per_sm(Elem input, int smem_bytes) {
  switch (input) {
    case Elem::f32: return blocks_per_sm<float>(smem_bytes);
    case Elem::bf16: return blocks_per_sm<__nv_bfloat16>(smem_bytes);
    case Elem::f16: return blocks_per_sm<__half>(smem_bytes);
    default: return 0;
  }
}

void launch_chunk_forward(const ChunkParams& p, int num_seqs, cudaStream_t stream) {
  const int splits = p.states_only ? p.num_splits - 1 : p.num_splits;
  const int tile = value_tile(p.q.dtype);
  const dim3 grid(unsigned(int64_t(num_seqs) * p.heads), unsigned((p.value_dim + tile - 1) / tile), unsigned(splits));
  if (grid.x == 0 || grid.z == 0) return;
  switch (p.q.dtype) {
    case Elem::f32: return launch<float>(p, grid, stream);
    case Elem::bf16: return launch<__nv_bfloat16>(p, grid, stream);
    case Elem::f16: return launch<__half>(p, grid, stream);
    default: return;
  }
}

}  // namespace flashgla::cuda::gla
