// Chunked GLA forward, fused with the state kept on chip (the non-materialized
// FlashLinearAttention form of the GLA paper, seed 003; the steps of seed 002).
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
//     reference point (seed 002 step 3); the 4 diagonal blocks in fp32 on CUDA
//     cores, exp(Γ_r − Γ_c) built row by row as a running product of α;
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
#include "cuda/gla/gla_device.cuh"

namespace flashgla::cuda::gla {
namespace {

constexpr int C = kChunk, KS = kSlice, NT = kChunkThreads;
constexpr int kPairs = kChunkOffPairs;  // off-diagonal sub-chunk blocks (i, j), i > j, of 4 sub-chunks
constexpr int kDiagRows = 17;  // rows of the diagonal blocks each thread sums (two columns, 17 rows)

// Row pitches (elements) of the operand tiles: padded so that fragment loads
// of a warp hit distinct banks.
template <class E>
constexpr int pad() { return sizeof(E) == 2 ? 8 : 4; }
template <class E>
constexpr int tile_of() { return sizeof(E) == 4 ? value_tile(Elem::f32) : value_tile(Elem::bf16); }
constexpr int kAlphaPitch = kChunkAlphaPitch;  // floats per row of α (shared-memory layout: layouts.h)

template <class E>
__global__ void __launch_bounds__(NT, 2) chunk_forward_kernel(const ChunkParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  using M = Mma<E>;
  constexpr int PS = KS + pad<E>();  // rows of one slice (32 keys)
  constexpr int PC = C + pad<E>();   // rows of one chunk (64 tokens)
  constexpr int BV = tile_of<E>();   // value columns
  constexpr int CG = BV / 8;         // groups of 8 value columns: warp w owns group w % CG ...
  constexpr int RW = 8 / CG;         // ... shared by RW warps (1 for bf16/fp16, 2 for fp32)
  constexpr int MT_O = 4 / RW;       // 16-row tiles of O per warp
  constexpr int MT_S = 2 / RW;       // 16-key tiles of the slice's state update per warp
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

  const SeqRange seq = sequence_range(p.seqs, n);
  const int64_t num_chunks = (seq.len + C - 1) / C;
  const int64_t last_split = num_chunks == 0 ? 0 : (num_chunks - 1) / p.chunks_per_split;
  if (split > last_split || (p.states_only && split == last_split)) return;
  const int64_t c_begin = split * p.chunks_per_split;
  const int64_t c_end = min(num_chunks, c_begin + p.chunks_per_split);
  auto row_offset = [&](const View& t, int64_t token) {
    return seq.batch * t.stride[0] + (seq.begin + token) * t.stride[1] + h * t.stride[2];
  };

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
    float s = 0.f;
    if (!p.states_only && kk < K && vg < V) {
      if (p.h0.data)
        s = static_cast<const float*>(p.h0.data)[n * p.h0.stride[0] + h * p.h0.stride[1] + kk * p.h0.stride[2] +
                                                  vg * p.h0.stride[3]];
      for (int prev = 0; prev < split; ++prev) {
        const int64_t slot = nh * (p.num_splits - 1) + prev;
        s = p.split_decay[slot * K + kk] * s + p.split_states[(slot * K + kk) * V + vg];
      }
    }
    S[kk * sp + vv] = s;
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
      copy_tile(view.data, view.rows16, view.stride[3], esize, row_offset(view, c * C), view.stride[1], C, rows_valid,
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
      scalar_g_next = t < seq.len ? load_float(p.g.data, row_offset(p.g, t), p.g.dtype) : 0.f;
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

      // ---- gate factors and operands: warp = group of 8 rows, lane = key column ----
      {
        const int rg = warp, r0 = 8 * rg, sub = rg >> 1;
        float a[8];
        if (p.gate == Gate::vector) {
          const unsigned char* graw = raw_g(stage);
#pragma unroll
          for (int j = 0; j < 8; ++j) a[j] = __expf(load_float(graw, (r0 + j) * KS + lane, p.g.dtype));
        } else {
#pragma unroll
          for (int j = 0; j < 8; ++j) a[j] = p.gate == Gate::scalar ? scalar_alpha[r0 + j] : 1.f;
        }
        if (!p.states_only)
#pragma unroll
          for (int j = 0; j < 8; ++j) alpha_s[(r0 + j) * kAlphaPitch + lane] = a[j];
        // Within the group: forward products without the first row, backward products after each row.
        float fwd[8], bwd[8];
        fwd[0] = 1.f;
#pragma unroll
        for (int j = 1; j < 8; ++j) fwd[j] = fwd[j - 1] * a[j];
        bwd[7] = 1.f;
#pragma unroll
        for (int j = 6; j >= 0; --j) bwd[j] = bwd[j + 1] * a[j + 1];
        totals[(0 * 8 + rg) * KS + lane] = a[0] * fwd[7];  // the group's product
        totals[(1 * 8 + rg) * KS + lane] = fwd[7];         // ... without its first row
        totals[(2 * 8 + rg) * KS + lane] = a[0];           // its first row
        __syncthreads();
        float total[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) total[j] = totals[j * KS + lane];
        float before = 1.f, after = 1.f;  // products over the groups before / after this one
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          if (j < rg) before *= total[j];
          if (j > rg) after *= total[j];
        }
        if (rg == 0) {
          const float chunk_decay = total[0] * after;
          decay_s[lane] = chunk_decay;
          if (p.states_only) split_decay_s[slice * KS + lane] *= chunk_decay;
        }
        float kv[8], kd[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          kv[j] = to_float(rk[(r0 + j) * KS + lane]);
          kd[j] = kv[j] * bwd[j] * after;  // k ⊙ exp(γ^C − Γ_r)
        }
        store8(KdT + lane * PC + r0, kd);
        if (!p.states_only) {
          // exp(Γ_r − γ_first) of this sub-chunk: the group before (odd groups) contributes its product without its first row.
          const float lead = (rg & 1) ? totals[(1 * 8 + rg - 1) * KS + lane] : 1.f;
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            const float qv = to_float(rq[(r0 + j) * KS + lane]);
            const float inclusive = a[0] * fwd[j];  // Π over this group's rows up to r
            Qg[(r0 + j) * PS + lane] = from_float<E>(qv * before * inclusive);
            if (sub > 0) Qoff[(r0 + j - 16) * PS + lane] = from_float<E>(qv * ((rg & 1) ? lead * inclusive : fwd[j]));
          }
#pragma unroll
          for (int target = 1; target < 4; ++target) {
            if (target <= sub) continue;
            // exp(γ_target^first − Γ_r) = (Π after r in this group) (Π of the groups in between) α(first row of target)
            float mid = totals[(2 * 8 + 2 * target) * KS + lane];
#pragma unroll
            for (int j = 0; j < 8; ++j)
              if (j > rg && j < 2 * target) mid *= total[j];
            E* dst = Koff + ((target * (target - 1) / 2 + sub) * 16 + r0 - 16 * sub) * PS + lane;
#pragma unroll
            for (int j = 0; j < 8; ++j) dst[j * PS] = from_float<E>(kv[j] * bwd[j] * mid);
          }
        }
        if (slice == 0) {
#pragma unroll
          for (int half = 0; half < BV / 32; ++half) {
            const int col = lane + 32 * half;
            float vv[8];
#pragma unroll
            for (int j = 0; j < 8; ++j) {
              vv[j] = to_float(raw_v[(r0 + j) * BV + col]);
              v_nonfinite |= (__float_as_uint(vv[j]) & 0x7F800000u) == 0x7F800000u;
            }
            store8(VT + col * PC + r0, vv);
          }
        }
      }
      if (slice == 0) v_nonfinite = __syncthreads_or(v_nonfinite);  // operands ready; raw v consumed
      else __syncthreads();
      if (slice == 0 && c + 1 < c_end) issue(c + 1, 0, 0, kValueTileLoad);
      cp_async_commit_unordered();

      if (!p.states_only) {
        // ---- O += (Q ⊙ exp Γ) S over this slice's keys ----
#pragma unroll
        for (int ks = 0; ks < KS / 16; ++ks) {
          const auto bf = M::load_b_rows(S + (slice * KS + 16 * ks) * sp + 8 * cg, sp, lane);
#pragma unroll
          for (int mt = 0; mt < MT_O; ++mt) {
            const auto af = M::load_a(Qg + 16 * (MT_O * part + mt) * PS + 16 * ks, PS, lane);
            M::mma(o_acc[mt], af, bf);
          }
        }
        // ---- off-diagonal sub-chunk blocks of A ----
        if (warp < kPairs) {
#pragma unroll
          for (int ks = 0; ks < KS / 16; ++ks) {
            const auto af = M::load_a(Qoff + (pair_i - 1) * 16 * PS + 16 * ks, PS, lane);
#pragma unroll
            for (int nt = 0; nt < 2; ++nt) {
              const auto bf = M::load_b(Koff + (warp * 16 + 8 * nt) * PS + 16 * ks, PS, lane);
              M::mma(a_off[nt], af, bf);
            }
          }
        }
        // ---- diagonal blocks: A_rc += Σ_k q_rk k_ck Π_{c<s≤r} α_sk, in fp32 ----
        {
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
      }
      // ---- S ← diag(exp γ^C) S + (K ⊙ exp(γ^C − Γ))^T V on this slice's keys, this warp's columns ----
      if constexpr (RW > 1) __syncthreads();  // the column group's other warp has read these keys too
      __syncwarp();
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
      stage ^= 1;
    }

    if (p.states_only) continue;

    // ---- assemble A over the slice operands, once every warp is done with them ----
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

    // ---- O += (A ⊙ M) V: row block m needs the sub-chunks 0..m ----
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

    // ---- o = scale · O, staged in the α area (free since the barrier above) for whole-row stores ----
    E* otile = reinterpret_cast<E*>(smem + L.alpha);
    constexpr int OP = BV + pad<E>();  // pitch (elements) of the staged tile
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
    store_tile(p.o.data, p.o.rows16, p.o.stride[3], sizeof(E), row_offset(p.o, c * C), p.o.stride[1], C, rows_valid,
               v0, V, BV, otile, OP * sizeof(E), tid, NT);
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
