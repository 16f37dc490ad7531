// The chunk kernel of the chunked GLA backward for a scalar gate or none (chunk_simple_gla, chunk_linear_attn):
// bf16 inputs and outputs in whole aligned rows, K and V of 64 or 128 (BwdChunkKernel::scalar, plan.cpp). The
// general chunk kernel (gla_bwd_chunk.cu) serves the rest.
//
// With one decay per token the chunk's pair terms are whole products: with D_ij = exp(Γ_i − Γ_j) for j ≤ i
// (device/decay_tables.cuh), w_j = exp(γ − Γ_j), γ = Γ_63, S the state before the chunk and dS the gradient of
// the state after it (the state scans, gla_bwd_states.cu):
//   phase 1:  P = Q Kᵀ, dP = dO Vᵀ (one 16×16 block on or below the diagonal per warp);
//             A = scale P ⊙ D, dA = scale dP ⊙ D (bf16, zero above the diagonal)
//   phase 2:  dv = diag(w) K dS + Aᵀ dO
//             dq = scale diag(exp Γ) dO Sᵀ + dA K
//             dk = diag(w) V dSᵀ + dAᵀ Q
//   phase 3 (a scalar gate): dg_t = Σ_{i ≥ t} r_i + Σ_{j < t} k_j·dk_j^(S) + exp γ ⟨S, dS⟩, with
//             r_i = Σ_{j < i} M_ij − Σ_{j > i} M_ji + q_i·dq_i^(S), M = dA ⊙ P (the pairs' share; the diagonal
//             never enters) and dq^(S), dk^(S) the state terms above. Every sum in a fixed order.
// One block of 16 warps per (chunk, head), every tile of the chunk in shared memory; warp w takes rows
// 16·(w % 4) and a quarter of the columns in phase 2.
//
// NORM, the folded normaliser (no gate; chunk_linear_attn(normalize=True)): o_t = scale O_t / den_t with
// den_t = scale q_t·z_t + 1e-10 and z_t = z (at the chunk's start) + Σ_{s ≤ t} k_s. With dO the normalised
// output's gradient, r_t = 1/den_t and d den_t = −r_t (dO_t · o_t) (from the forward's o and den):
//   the op's gradients take r_t dO (the backward scan's q rows carry r_t too): A = scale diag(r) P ⊙ D;
//   den's terms are linear attention with a column of ones in v and d den as its output gradient:
//   dA += scale d den_t on and below the diagonal (dq's and dk's in-chunk terms through the products),
//   dq += scale d den_t z, and dk += dz after the chunk, which needs the later chunks. Either the kernel writes
//   u = Σ_t scale d den_t q_t per chunk and launch_bwd_norm_keys adds the suffix sums to dk, or (the chain,
//   BwdPlan::norm_chain) the blocks run chunk-major, the last chunks first, and each waits for the next chunk's
//   carry (dz before that chunk, polled while its tiles load), hands on its own carry dz + u in phase 1 and
//   adds dz to dk as it stores dk. Either way dz is summed in the same order, from d_z_final back.
#include "cuda/common/flags.cuh"
#include "cuda/common/host.cuh"
#include "cuda/gla/device/chunk_slots.cuh"
#include "cuda/gla/device/decay_tables.cuh"
#include "cuda/gla/device/elements.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/gla/device/tiles.cuh"
#include "cuda/gla/device/warp_mma.cuh"
#include "cuda/gla/device/gla_bwd.cuh"

namespace flashgla::cuda::gla {
namespace {

// The shared memory: BwdScalarChunkLayout (cuda/gla/plan/layouts.h, where the planner checks that it fits).
constexpr int kWarps = BwdScalarChunkLayout<64, 64>::warps, kThreads = 32 * kWarps;

// Σ over the warp's columns of x[row][col] · acc for its two rows per lane (g4, g4 + 8), summed over the quad.
template <int NT>
__device__ __forceinline__ void row_dots(const bf16* x, int pitch, const float (&acc)[NT][4], int row0, int col0,
                                         int lane, float& lo, float& hi) {
  const int g4 = lane >> 2, t4 = lane & 3;
  lo = hi = 0.f;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const bf16* r0 = x + (row0 + g4) * pitch + col0 + 8 * nt + 2 * t4;
    const bf16* r1 = r0 + 8 * pitch;
    lo = fmaf(to_float(r0[0]), acc[nt][0], fmaf(to_float(r0[1]), acc[nt][1], lo));
    hi = fmaf(to_float(r1[0]), acc[nt][2], fmaf(to_float(r1[1]), acc[nt][3], hi));
  }
  lo += __shfl_xor_sync(0xffffffffu, lo, 1), hi += __shfl_xor_sync(0xffffffffu, hi, 1);
  lo += __shfl_xor_sync(0xffffffffu, lo, 2), hi += __shfl_xor_sync(0xffffffffu, hi, 2);
}

// Blocks per SM (cuda/gla/plan/layouts.h): at K = V = 64 two, so the registers are capped at 64.
template <int KP, int VP>
inline constexpr int kChunkBlocksPerSm = bwd_scalar_chunk_blocks_per_sm(KP, VP);

// The chain's block order (BwdPlan::norm_chain; fixed-length sequences): chunk-major, the last chunks first, so
// that chunk c + 1 of a (sequence, head) is dispatched a whole round of (sequence, head) pairs before chunk c.
__device__ __forceinline__ void chain_block(const BwdParams& p, BwdSeq& seq, int64_t& chunk, int& h) {
  const int64_t block = blockIdx.x + int64_t(gridDim.x) * blockIdx.y, pairs = p.num_seqs * p.heads;
  const int64_t pair = block % pairs;
  chunk = p.chunks_per_seq - 1 - block / pairs;
  h = int(pair % p.heads);
  seq = sequence(p, pair / p.heads);
}

// The folded normaliser's key sum, by the KP threads (key `key` each) of warps 8, 9, 12 and 13, which have no
// block in phase 1 (norm_key_warp). The chain's dz after the chunk is the next chunk's carry, polled while the
// tiles load (the next chunk's block started about a round of (sequence, head) pairs earlier), or d_z_final.
template <int KP>
__device__ __forceinline__ int norm_key_warp(int warp) {
  const int key_warp = warp == 8 ? 0 : warp == 9 ? 1 : warp == 12 ? 2 : warp == 13 ? 3 : -1;
  return key_warp < KP / 32 ? key_warp : -1;
}
template <int KP>
__device__ __forceinline__ float chain_dz_after(const BwdParams& p, const BwdSeq& seq, int64_t chunk, int64_t slot,
                                                int h, int key) {
  if (chunk + 1 < num_chunks(seq.len)) return wait_for_float(p.norm_carries + ((slot + 1) * p.heads + h) * KP + key);
  return p.d_z_final.data  // sequence n is batch row n here (fixed length)
             ? static_cast<const float*>(p.d_z_final.data)[offset3(p.d_z_final, seq.batch, h, key)]
             : 0.f;
}
// In phase 1: the chunk's key gradient u = Σ_t scale d den_t q_t (the rows in order). Without the chain u goes
// to norm_key_grads for launch_bwd_norm_keys. In the chain dz goes to dz_s for dk (after phase 1's barrier), and
// the carry dz + u to the next block (or, from the first chunk, to d_z_init), with the passes' roundings
// (unfused), so that dz is bit for bit theirs.
template <int KP>
__device__ __forceinline__ void norm_key_sum(const BwdParams& p, const BwdSeq& seq, int64_t chunk, int64_t slot,
                                             int h, int key, const bf16* q_s, const float* d_den_s, float dz,
                                             float* dz_s) {
  constexpr int PK = BwdScalarChunkLayout<KP, 64>::PK;
  float sum = 0.f;
#pragma unroll 16
  for (int t = 0; t < kChunk; ++t) sum = fmaf(d_den_s[t], to_float(q_s[t * PK + key]), sum);
  const float u = __fmul_rn(p.scale, sum);
  const int64_t at = (slot * p.heads + h) * KP + key;
  if (!p.norm_carries) {
    p.norm_key_grads[at] = u;
    return;
  }
  dz_s[key] = dz;
  const float carry = __fadd_rn(dz, u);
  if (chunk > 0) publish_float(p.norm_carries + at, carry);
  else if (p.d_z_init.data) static_cast<float*>(p.d_z_init.data)[offset3(p.d_z_init, seq.batch, h, key)] = carry;
}

template <int KP, int VP, Gate GK, bool NORM>
__global__ void __launch_bounds__(kThreads, kChunkBlocksPerSm<KP, VP>) scalar_chunk_kernel(const BwdParams p) {
  static_assert(GK == Gate::scalar || GK == Gate::none, "a scalar gate or none");
  static_assert(!NORM || GK == Gate::none, "the normaliser comes without a gate");
  using L = BwdScalarChunkLayout<KP, VP>;
  constexpr int PK = L::PK, PV = L::PV, PA = L::PA;
  constexpr int NTK = KP / 32, NTV = VP / 32;  // 8-column tiles of a warp's quarter of the keys / values
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* q_s = reinterpret_cast<bf16*>(smem + L::q);
  bf16* k_s = reinterpret_cast<bf16*>(smem + L::k);
  bf16* v_s = reinterpret_cast<bf16*>(smem + L::v);
  bf16* do_s = reinterpret_cast<bf16*>(smem + L::d_o);
  bf16* s_s = reinterpret_cast<bf16*>(smem + L::s);
  bf16* ds_s = reinterpret_cast<bf16*>(smem + L::ds);
  bf16* a_s = reinterpret_cast<bf16*>(smem + L::a);
  bf16* da_s = reinterpret_cast<bf16*>(smem + L::da);
  float2* log_decay = reinterpret_cast<float2*>(smem + L::log_decay);
  float2* weights = reinterpret_cast<float2*>(smem + L::weights);
  float* m_rows = reinterpret_cast<float*>(smem + L::m_rows);
  float* m_cols = reinterpret_cast<float*>(smem + L::m_cols);
  float* qd_s = reinterpret_cast<float*>(smem + L::qd);
  float* kd_s = reinterpret_cast<float*>(smem + L::kd);
  float* state_term_s = reinterpret_cast<float*>(smem + L::state_term);
  bf16* o_s = reinterpret_cast<bf16*>(smem + L::o);                    // NORM: the normalised o
  float* inv_den_s = reinterpret_cast<float*>(smem + L::norm_rows);    // NORM: 1/den_t
  float* d_den_s = inv_den_s + kChunk;                                 // NORM: d den_t
  float* z_s = reinterpret_cast<float*>(smem + L::norm_z);             // NORM: z at the chunk's start
  float* dz_s = m_cols;  // NORM, the chain: dz after the chunk [KP] (m_cols: a scalar gate's)

  BwdSeq seq;
  int64_t chunk;
  int h = blockIdx.y;
  const bool chain = NORM && p.norm_carries;
  if (chain) chain_block(p, seq, chunk, h);
  else if (!locate_chunk(p, blockIdx.x, seq, chunk)) return;
  const int64_t t0 = chunk * kChunk, slot = seq.slot0 + chunk;
  const int rows = int(min(int64_t(kChunk), seq.len - t0));
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g4 = lane >> 2, t4 = lane & 3;
  const float scale = p.scale;

  load_rows<KP, kThreads>(q_s, PK, p.q, seq, h, t0, rows, 0, KP, tid);
  load_rows<KP, kThreads>(k_s, PK, p.k, seq, h, t0, rows, 0, KP, tid);
  load_rows<VP, kThreads>(v_s, PV, p.v, seq, h, t0, rows, 0, VP, tid);
  load_rows<VP, kThreads>(do_s, PV, p.d_o, seq, h, t0, rows, 0, VP, tid);
  if constexpr (NORM) load_rows<VP, kThreads>(o_s, PV, p.norm_o, seq, h, t0, rows, 0, VP, tid);
  cp_async_commit_unordered();
  if constexpr (NORM) {
    if (tid < kChunk)
      inv_den_s[tid] =
          tid < rows ? 1.f / static_cast<const float*>(p.norm_den.data)[token_offset(p.norm_den, seq, h, t0 + tid)]
                     : 0.f;
    if (tid < KP) z_s[tid] = p.norm_chunk_z[(slot * p.heads + h) * KP + tid];
  }
  if constexpr (GK == Gate::scalar) {
    if (warp == kWarps - 1) {
      float g[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int r = 2 * lane + i;
        g[i] = r < rows ? scalar_gate(p.g, token_offset(p.g, seq, h, t0 + r), p.g_gamma, h) : 0.f;
      }
      write_decay_tables(g, lane, log_decay, weights);
    }
  }
  // The states come from the scans (a programmatic dependent launch may start this block before they end).
  wait_for_previous_grid();
  for (int kt = 0; kt < KP / kTile; ++kt)
    for (int vt = 0; vt < VP / kTile; ++vt) {
      const bf16* s_tile = static_cast<const bf16*>(p.states) + state_tile_index(p, slot, h, kt, vt);
      const bf16* ds_tile = static_cast<const bf16*>(p.dstates) + state_tile_index(p, slot, h, kt, vt);
      for (int idx = tid; idx < kTile * kTile / 8; idx += kThreads) {
        const int r = idx / 8, c = (idx % 8) * 8;
        const int at = (kTile * kt + r) * PV + kTile * vt + c;
        cp_async16_unordered(s_s + at, s_tile + r * kTile + c, 16);
        cp_async16_unordered(ds_s + at, ds_tile + r * kTile + c, 16);
      }
    }
  cp_async_commit_unordered();
  const int key_warp = NORM ? norm_key_warp<KP>(warp) : -1;
  const float chain_dz = chain && key_warp >= 0 ? chain_dz_after<KP>(p, seq, chunk, slot, h, 32 * key_warp + lane) : 0.f;
  asm volatile("cp.async.wait_group 1;\n" ::: "memory");  // q, k, v, dO in; the states may still be coming
  __syncthreads();
  if constexpr (NORM) {  // d den_t = −r_t (dO_t · o_t): warp w rows 4w.., eight lanes per row
    const int r = 4 * warp + (lane >> 3), col0 = (lane & 7) * (VP / 8);
    float x = 0.f;
#pragma unroll
    for (int j = 0; j < VP / 8; j += 8) {  // 16-byte reads, the columns in order
      float a[8], b[8];
      load8(do_s + r * PV + col0 + j, a);
      load8(o_s + r * PV + col0 + j, b);
#pragma unroll
      for (int i = 0; i < 8; ++i) x = fmaf(a[i], b[i], x);
    }
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    x += __shfl_xor_sync(0xffffffffu, x, 2);
    x += __shfl_xor_sync(0xffffffffu, x, 4);
    if ((lane & 7) == 0) d_den_s[r] = -x * inv_den_s[r];
    __syncthreads();
  }

  // ---- phase 1: A and dA, block (mo, nb) of 16×16 on or below the diagonal; M's row and column sums ----
  {
    const int mo = warp & 3, nb = warp >> 2;
    if (nb <= mo) {
      float pa[2][4] = {}, dp[2][4] = {};
      warp_gemm<2, false, true>(pa, q_s + 16 * mo * PK, PK, k_s + 16 * nb * PK, PK, KP);
      warp_gemm<2, false, true>(dp, do_s + 16 * mo * PV, PV, v_s + 16 * nb * PV, PV, VP);
      float row_m[2] = {0.f, 0.f}, col_m[2][2] = {};
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = 16 * mo + g4 + 8 * (e >> 1), j = 16 * nb + 8 * nt + 2 * t4 + (e & 1);
          float d = j <= i ? 1.f : 0.f;
          if constexpr (GK == Gate::scalar) d = j <= i ? decay_between(log_decay[i], log_decay[j]) : 0.f;
          float a = scale * pa[nt][e] * d, da = scale * dp[nt][e] * d;
          if constexpr (NORM) a *= inv_den_s[i], da = (da * inv_den_s[i] + scale * d_den_s[i] * d);
          if constexpr (GK == Gate::scalar) {
            const float m = j < i ? da * pa[nt][e] : 0.f;
            row_m[e >> 1] += m, col_m[nt][e & 1] += m;
          }
          pa[nt][e] = a, dp[nt][e] = da;
        }
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int i = 16 * mo + g4 + 8 * half, j = 16 * nb + 8 * nt + 2 * t4;
          store_pair(a_s + i * PA + j, pa[nt][2 * half], pa[nt][2 * half + 1]);
          store_pair(da_s + i * PA + j, dp[nt][2 * half], dp[nt][2 * half + 1]);
        }
      if constexpr (GK == Gate::scalar) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          float x = row_m[half];
          x += __shfl_xor_sync(0xffffffffu, x, 1);
          x += __shfl_xor_sync(0xffffffffu, x, 2);
          if (t4 == 0) m_rows[nb * kChunk + 16 * mo + g4 + 8 * half] = x;
        }
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            float x = col_m[nt][c];
            x += __shfl_xor_sync(0xffffffffu, x, 4);
            x += __shfl_xor_sync(0xffffffffu, x, 8);
            x += __shfl_xor_sync(0xffffffffu, x, 16);
            if (g4 == 0) m_cols[mo * kChunk + 16 * nb + 8 * nt + 2 * t4 + c] = x;
          }
      }
    } else if (key_warp >= 0) {
      norm_key_sum<KP>(p, seq, chunk, slot, h, 32 * key_warp + lane, q_s, d_den_s, chain_dz, dz_s);
    }
  }
  cp_async_wait_committed();
  __syncthreads();  // A, dA and the states in

  // ---- phase 2: warp (mo, cg): rows 16·mo, column quarter cg ----
  const int mo = warp & 3, cg = warp >> 2;
  const int i0 = 16 * mo;  // this row block's first token: the products over later tokens start here
  auto scale_rows = [](auto& acc, const float (&f)[2]) {
    for (auto& tile : acc) tile[0] *= f[0], tile[1] *= f[0], tile[2] *= f[1], tile[3] *= f[1];
  };
  float w[2] = {1.f, 1.f}, start_decay[2] = {1.f, 1.f};  // w and exp Γ of the lane's two rows
  if constexpr (GK == Gate::scalar)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float2 wt = weights[i0 + g4 + 8 * half];
      start_decay[half] = wt.x, w[half] = wt.y;
    }
  const float unscaled[2] = {1.f, 1.f};
  const int64_t base_row = seq.begin + t0;
  {  // dv = diag(w) K dS + Aᵀ dO
    const int c0 = cg * (VP / 4);
    float acc[NTV][4] = {};
    warp_gemm<NTV, false, false>(acc, k_s + i0 * PK, PK, ds_s + c0, PV, KP);
    scale_rows(acc, w);
    warp_gemm<NTV, true, false>(acc, a_s + i0 * PA + i0, PA, do_s + i0 * PV + c0, PV, kChunk - i0);
    bf16* rows_out = static_cast<bf16*>(p.dv.data) + offset4(p.dv, seq.batch, base_row, h, 0);
    store_fragment_rows<bf16, NTV>(rows_out, p.dv.stride[1], acc, unscaled, i0, c0, VP, rows, lane);
  }
  const int c0 = cg * (KP / 4);
  {  // dq = scale diag(exp Γ) dO Sᵀ + dA K
    float acc[NTK][4] = {};
    warp_gemm<NTK, false, true>(acc, do_s + i0 * PV, PV, s_s + c0 * PV, PV, VP);
    float f[2] = {scale * start_decay[0], scale * start_decay[1]};
    if constexpr (NORM) f[0] = scale * inv_den_s[i0 + g4], f[1] = scale * inv_den_s[i0 + g4 + 8];
    scale_rows(acc, f);
    if constexpr (GK == Gate::scalar) {
      float lo, hi;
      row_dots<NTK>(q_s, PK, acc, i0, c0, lane, lo, hi);
      if (t4 == 0) qd_s[cg * kChunk + i0 + g4] = lo, qd_s[cg * kChunk + i0 + g4 + 8] = hi;
    }
    warp_gemm<NTK, false, false>(acc, da_s + i0 * PA, PA, k_s + c0, PK, i0 + 16);
    if constexpr (NORM) {  // + scale d den_t z
      const float dd[2] = {scale * d_den_s[i0 + g4], scale * d_den_s[i0 + g4 + 8]};
#pragma unroll
      for (int nt = 0; nt < NTK; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[nt][e] = fmaf(dd[e >> 1], z_s[c0 + 8 * nt + 2 * t4 + (e & 1)], acc[nt][e]);
    }
    bf16* rows_out = static_cast<bf16*>(p.dq.data) + offset4(p.dq, seq.batch, base_row, h, 0);
    store_fragment_rows<bf16, NTK>(rows_out, p.dq.stride[1], acc, unscaled, i0, c0, KP, rows, lane);
  }
  {  // dk = diag(w) V dSᵀ + dAᵀ Q
    float acc[NTK][4] = {};
    warp_gemm<NTK, false, true>(acc, v_s + i0 * PV, PV, ds_s + c0 * PV, PV, VP);
    scale_rows(acc, w);
    if constexpr (GK == Gate::scalar) {
      float lo, hi;
      row_dots<NTK>(k_s, PK, acc, i0, c0, lane, lo, hi);
      if (t4 == 0) kd_s[cg * kChunk + i0 + g4] = lo, kd_s[cg * kChunk + i0 + g4 + 8] = hi;
    }
    warp_gemm<NTK, true, false>(acc, da_s + i0 * PA + i0, PA, q_s + i0 * PK + c0, PK, kChunk - i0);
    if (chain)  // + dz after the chunk (norm_key_sum)
#pragma unroll
      for (int nt = 0; nt < NTK; ++nt)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const float dz = dz_s[c0 + 8 * nt + 2 * t4 + c];
          acc[nt][c] += dz, acc[nt][2 + c] += dz;
        }
    bf16* rows_out = static_cast<bf16*>(p.dk.data) + offset4(p.dk, seq.batch, base_row, h, 0);
    store_fragment_rows<bf16, NTK>(rows_out, p.dk.stride[1], acc, unscaled, i0, c0, KP, rows, lane);
  }
  if constexpr (GK == Gate::none) return;

  // ⟨S, dS⟩: each warp a run of state rows, in a fixed order.
  {
    float x = 0.f;
    for (int idx = tid; idx < KP * VP / 2; idx += kThreads) {
      const int r = idx / (VP / 2), c = 2 * (idx % (VP / 2));
      x = fmaf(to_float(s_s[r * PV + c]), to_float(ds_s[r * PV + c]), x);
      x = fmaf(to_float(s_s[r * PV + c + 1]), to_float(ds_s[r * PV + c + 1]), x);
    }
#pragma unroll
    for (int offset = 16; offset >= 1; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
    if (lane == 0) state_term_s[warp] = x;
  }
  __syncthreads();

  // ---- phase 3: dg, one warp, rows 2·lane and 2·lane + 1 ----
  if (warp != 0) return;
  float r[2], kd[2];
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const int i = 2 * lane + e, block = i / 16;
    float x = 0.f;
#pragma unroll
    for (int nb = 0; nb < 4; ++nb)
      if (nb <= block) x += m_rows[nb * kChunk + i];
#pragma unroll
    for (int m = 0; m < 4; ++m)
      if (m >= block) x -= m_cols[m * kChunk + i];
    float kx = 0.f;
#pragma unroll
    for (int g = 0; g < 4; ++g) x += qd_s[g * kChunk + i], kx += kd_s[g * kChunk + i];
    r[e] = x, kd[e] = kx;
  }
  float state_term = 0.f;
#pragma unroll
  for (int i = 0; i < kWarps; ++i) state_term += state_term_s[i];
  state_term *= weights[kChunk - 1].x;  // exp γ
  // Suffix sums of r (this lane's pair, then the later lanes') and prefix sums of kd (the earlier rows').
  float suffix = r[0] + r[1], prefix = kd[0] + kd[1];
#pragma unroll
  for (int offset = 1; offset < 32; offset <<= 1) {
    const float s = __shfl_down_sync(0xffffffffu, suffix, offset), q = __shfl_up_sync(0xffffffffu, prefix, offset);
    if (lane + offset < 32) suffix += s;
    if (lane >= offset) prefix += q;
  }
  float later = __shfl_down_sync(0xffffffffu, suffix, 1), earlier = __shfl_up_sync(0xffffffffu, prefix, 1);
  if (lane == 31) later = 0.f;
  if (lane == 0) earlier = 0.f;
  const float dg[2] = {later + r[1] + r[0] + earlier + state_term, later + r[1] + earlier + kd[0] + state_term};
  float sum = 0.f;
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const int i = 2 * lane + e;
    if (i >= rows) continue;
    if (p.dg.data) store_as(p.dg.data, offset4(p.dg, seq.batch, base_row + i, h, 0), p.dg.dtype, dg[e]);
    sum += dg[e];
  }
  if (p.gamma_chunk_sums) {
#pragma unroll
    for (int offset = 16; offset >= 1; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (lane == 0) p.gamma_chunk_sums[blockIdx.x * gridDim.y + blockIdx.y] = sum;
  }
}

template <int KP, int VP, Gate GK, bool NORM = false>
void launch_typed(const BwdParams& p, bool overlap_scans, cudaStream_t stream) {
  constexpr int smem = bwd_scalar_chunk_smem_bytes_of<KP, VP>(NORM);
  auto kernel = scalar_chunk_kernel<KP, VP, GK, NORM>;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
             "cudaFuncSetAttribute (GLA backward scalar chunk kernel)");
  if constexpr (kChunkBlocksPerSm<KP, VP> > 1)
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                    cudaSharedmemCarveoutMaxShared),
               "cudaFuncSetAttribute (GLA backward scalar chunk kernel carveout)");
  launch_after_previous(kernel, dim3(unsigned(p.num_slots), unsigned(p.heads)), dim3(kThreads), smem, stream,
                        overlap_scans, p, "GLA backward scalar chunk kernel launch");
}

template <int KP, int VP>
void launch_gate(const BwdParams& p, bool overlap_scans, cudaStream_t stream) {
  if (p.gate == GateKind::scalar) return launch_typed<KP, VP, Gate::scalar>(p, overlap_scans, stream);
  if (p.norm_den.data) return launch_typed<KP, VP, Gate::none, true>(p, overlap_scans, stream);
  return launch_typed<KP, VP, Gate::none>(p, overlap_scans, stream);
}

// The folded normaliser's dz, one block of K threads per (sequence, head): walks the sequence's chunks from the
// last, replacing each chunk's key gradient with dz after the chunk (d_z_final plus the later chunks' gradients,
// summed in a fixed order), and writes d_z_init (dz before the first chunk).
constexpr int kSuffixBatch = 8;  // chunks whose loads are in flight together
__global__ void norm_key_suffix_kernel(const BwdParams p) {
  const int64_t n = blockIdx.x;
  const int h = blockIdx.y, key = threadIdx.x;
  const BwdSeq seq = sequence(p, n);
  const int64_t chunks = num_chunks(seq.len);
  float dz = p.d_z_final.data ? static_cast<const float*>(p.d_z_final.data)[offset3(p.d_z_final, n, h, key)] : 0.f;
  auto at = [&](int64_t c) { return p.norm_key_grads + ((seq.slot0 + c) * p.heads + h) * p.key_dim + key; };
  for (int64_t last = chunks - 1; last >= 0; last -= kSuffixBatch) {
    float u[kSuffixBatch];
#pragma unroll
    for (int j = 0; j < kSuffixBatch; ++j) u[j] = last - j >= 0 ? *at(last - j) : 0.f;
#pragma unroll
    for (int j = 0; j < kSuffixBatch; ++j)
      if (last - j >= 0) *at(last - j) = dz, dz += u[j];
  }
  if (p.d_z_init.data) static_cast<float*>(p.d_z_init.data)[offset3(p.d_z_init, n, h, key)] = dz;
}

// dk += dz after the chunk, on every row of the chunk (whole aligned bf16 rows, as the scalar chunk kernel's):
// one block per (slot, head), eight columns per thread and step. dk is rounded to bf16 twice on this path (the
// chunk kernel's store, then this sum), as the normaliser's own backward rounded dk and its share before adding.
constexpr int kAddThreads = 256;
__global__ void __launch_bounds__(kAddThreads) norm_key_add_kernel(const BwdParams p) {
  BwdSeq seq;
  int64_t chunk;
  if (!locate_chunk(p, blockIdx.x, seq, chunk)) return;
  const int h = blockIdx.y;
  const int64_t t0 = chunk * kChunk;
  const int rows = int(min(int64_t(kChunk), seq.len - t0));
  const int pieces = p.key_dim / 8;
  const float* dz = p.norm_key_grads + (int64_t(blockIdx.x) * p.heads + h) * p.key_dim;
  for (int idx = threadIdx.x; idx < rows * pieces; idx += kAddThreads) {
    const int r = idx / pieces, col = 8 * (idx % pieces);
    uint4* at = reinterpret_cast<uint4*>(static_cast<bf16*>(p.dk.data) +
                                         offset4(p.dk, seq.batch, seq.begin + t0 + r, h, col));
    uint4 x = *at;
    uint32_t* w = &x.x;
#pragma unroll
    for (int j = 0; j < 4; ++j)
      w[j] = pack_bf16(widen<bf16>(w[j] & 0xffffu) + dz[col + 2 * j], widen<bf16>(w[j] >> 16) + dz[col + 2 * j + 1]);
    *at = x;
  }
}

}  // namespace

void launch_bwd_norm_keys(const BwdParams& p, cudaStream_t stream) {
  if (p.num_seqs == 0) return;
  norm_key_suffix_kernel<<<dim3(unsigned(p.num_seqs), unsigned(p.heads)), dim3(unsigned(p.key_dim)), 0, stream>>>(p);
  check_cuda(cudaGetLastError(), "GLA backward normaliser key suffix launch");
  if (p.num_slots == 0) return;
  norm_key_add_kernel<<<dim3(unsigned(p.num_slots), unsigned(p.heads)), dim3(kAddThreads), 0, stream>>>(p);
  check_cuda(cudaGetLastError(), "GLA backward normaliser key gradient launch");
}

void launch_bwd_scalar_chunk(const BwdParams& p, bool overlap_scans, cudaStream_t stream) {
  const bool wide_keys = p.key_dim > 64, wide_values = p.value_dim > 64;
  if (wide_keys && wide_values) return launch_gate<128, 128>(p, overlap_scans, stream);
  if (wide_keys) return launch_gate<128, 64>(p, overlap_scans, stream);
  if (wide_values) return launch_gate<64, 128>(p, overlap_scans, stream);
  return launch_gate<64, 64>(p, overlap_scans, stream);
}

}  // namespace flashgla::cuda::gla
