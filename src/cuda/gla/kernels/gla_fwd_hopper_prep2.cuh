// The Hopper path's chunk pass: the slot (Q̃, K̃ᵀ, decay, A: gla_fwd_hopper.cuh) of one chunk and head. It
// replaced a first version that built the same slot from the same factors with about twice the instructions
// (timings: bench/notes_gla_fwd.md, "Chunk pass v2").
//
// Why (static SASS of the first version, bf16, sm_90a; bench/notes_gla_fwd.md, "Chunk pass v2"): there
// every __expf was 5 instructions (FMUL by log2 e, a denormal range test, two predicated FMULs, MUFU); the
// off-diagonal factor loop ~35 instructions per element (index arithmetic of the block pair); the tiles
// below the diagonal inside the diagonal blocks recomputed 8 exps per key and thread; and the A phase was
// unbalanced (3 warps of 1,024 FMAs each, 3 warps of ~1,500 instructions of exps). Here:
//   * g is scaled by log2 e as it is loaded, so every exp is one MUFU.EX2 (ex2.approx.ftz) of a difference;
//   * thread (key pair, row eighth) loads its two keys of q, k, g for the 8 rows of its eighth straight
//     into registers (a warp reads 32 key pairs of a row: 128 contiguous bytes of 2-byte elements), scans
//     g there (one barrier for the eighths' totals) and writes every factor of its rows with compile-time
//     indices: Q̃ and K̃ᵀ to the slot, the off-diagonal-block factors (query side: reference row 16I; key
//     side: the reference of every later block) and, with the same rule one level down, the factors of the
//     4×4 tiles below the diagonal inside its diagonal block (reference: first row of the 4-row group);
//   * the 4×4 diagonal tiles (α products) stay in its registers, summed over its keys and slices, and are
//     reduced over each warp's 32 key pairs once per CTA;
//   * A below the diagonal tiles is then 120 uniform 4×4 FMA tiles (96 in the off-diagonal blocks,
//     24 inside the diagonal ones), two threads per tile (alternate float4 key groups), 240 threads busy;
//     their sums go to an fp32 A tile in shared memory after each slice (each entry has one owner).
// Every factor is ≤ 1 (reference rows as above), so gates of −20 per step underflow to 0 and never
// overflow, and A is accumulated in fp32 and rounded once. Three barriers per 64-key slice (the first
// version had five).
#pragma once

#include <type_traits>

#include "cuda/gla/kernels/gla_fwd_hopper.cuh"
#include "cuda/gla/device/elements.cuh"
#include "cuda/common/launch.cuh"

namespace flashgla::cuda::gla::hopper {

namespace prep2 {
constexpr int kP = 68;  // floats per factor row (64 keys, float4 rows)
// Factor rows (fp32, one per (row, reference) and 64 keys of the slice):
constexpr int kQE = 0;    // [3 blocks I = 1..3][16]: q_i 2^(G_i − G_16I)
constexpr int kKI = 48;   // [6 block pairs (I, J)][16]: k_j 2^(G_16I − G_j), j in block J
constexpr int kQ4 = 144;  // [4 blocks][3 groups t = 1..3][4]: q_i 2^(G_i − G_r), r the group's first row
constexpr int kK4 = 192;  // [4 blocks][6 group pairs (t, u)][4]: k_j 2^(G_r(t) − G_j), j in group u
constexpr int kRows = 288;
constexpr int kJobs = 120;      // 4×4 tiles of A: 6 · 16 in the off-diagonal blocks, 4 · 6 inside the diagonal ones
constexpr int kPA = 65;         // floats per row of the fp32 A tile
constexpr int kScratch = 257;   // floats per row of the diagonal tiles' per-thread partial sums (20 rows)
constexpr int kDiag = 20;       // diagonal-tile entries per thread: 2 groups × 10 (j ≤ i)
constexpr int kAOffset = kRows * kP;                // fp32 A [64][kPA]
constexpr int kTotalsOffset = (kAOffset + C * kPA + 1) / 2 * 2;  // float2-aligned: [8][64] eighth totals, [16][64] group firsts
constexpr int kFloats = kTotalsOffset + (8 + 16) * 64;
static_assert(kDiag * kScratch <= kRows * kP, "the diagonal partial sums reuse the factor rows");
}  // namespace prep2

inline constexpr int prep2_smem_bytes() { return prep2::kFloats * 4; }

__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Keys key0 and key0 + 1 of rows 0..7 (row j at element at + j · stride[1]) of a 2-byte tensor as packed
// pairs, zero for rows ≥ rows and keys ≥ K: one 4-byte load per row where the rows allow it.
__device__ __forceinline__ void load_pairs(const View& t, int64_t at, int rows, int key0, int K, uint32_t (&x)[8]) {
  const uint16_t* base = static_cast<const uint16_t*>(t.data) + at;
  const bool vector = t.rows16 && key0 + 2 <= K;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    uint32_t w = 0;
    if (j < rows) {
      const uint16_t* row = base + j * t.stride[1];
      if (vector) {
        w = *reinterpret_cast<const uint32_t*>(row);
      } else {
        const uint32_t lo = key0 < K ? row[0] : 0u, hi = key0 + 1 < K ? row[t.stride[3]] : 0u;
        w = lo | hi << 16;
      }
    }
    x[j] = w;
  }
}
// The same for a vector gate of any dtype, kept as loaded so that a prefetch does not wait for it: returns
// true for packed 2-byte pairs in x[0..7], false for float bits (x[2j], x[2j + 1]; converted at once where
// the rows need element loads or the gate is f64).
__device__ __forceinline__ bool load_gate_pairs(const View& t, int64_t at, int rows, int key0, int K, uint32_t (&x)[16]) {
  const bool vector = t.rows16 && key0 + 2 <= K && t.dtype != Elem::f64;
  const bool packed = vector && t.dtype != Elem::f32;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int64_t row = at + j * t.stride[1];
    if (packed) {
      x[j] = j < rows ? *reinterpret_cast<const uint32_t*>(static_cast<const uint16_t*>(t.data) + row) : 0u;
      x[8 + j] = 0u;
    } else if (vector) {
      const float2 w = j < rows ? *reinterpret_cast<const float2*>(static_cast<const float*>(t.data) + row)
                                : make_float2(0.f, 0.f);
      x[2 * j] = __float_as_uint(w.x), x[2 * j + 1] = __float_as_uint(w.y);
    } else {
      x[2 * j] = __float_as_uint(j < rows && key0 < K ? load_as<float>(t.data, row, t.dtype) : 0.f);
      x[2 * j + 1] = __float_as_uint(j < rows && key0 + 1 < K ? load_as<float>(t.data, row + t.stride[3], t.dtype) : 0.f);
    }
  }
  return packed;
}

template <class E>
__device__ __forceinline__ float2 unpack2(uint32_t w) {
  if constexpr (std::is_same_v<E, __nv_bfloat16>) return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w));
  else return __half22float2(*reinterpret_cast<const __half2*>(&w));
}

// GAMMA: p.g_gamma is set (a scalar gate plus the head's constant decay). A kernel of its own because this one
// sits at its register limit: the sum in the scalar branch alone reschedules the whole kernel and made the
// vector gate's pass 5% slower (bench/notes_gla_fwd.md, "The Hopper chunk pass and g_gamma").
template <class E, bool GAMMA>
__global__ void __launch_bounds__(kPrepThreads, 2) hopper_prep2_kernel(const ChunkParams p) {
  using namespace prep2;
  // The state kernel (launched as a programmatic dependent) may start its set-up on SMs this grid leaves; it
  // waits for this grid to complete before it reads a slot.
  allow_dependent_launch();
  constexpr float kLog2e = 1.4426950408889634f;
  constexpr float kGateFloor = -88.f;  // see the cumsum below
  extern __shared__ __align__(16) float fsm[];
  float* fac = fsm;                      // factor rows [kRows][kP]; at the end the diagonal partial sums
  float* a_tile = fsm + kAOffset;        // fp32 A [64][kPA] (entries below the diagonal tiles and on them)
  float* totals = fsm + kTotalsOffset;   // [8 row eighths][64 keys]: Σ over the eighth's rows of g · log2 e
  float* firsts = totals + 8 * 64;       // [16 row groups][64 keys]: G of the group's first row before the earlier eighths' totals
  const int tid = threadIdx.x;
  const int64_t nh = blockIdx.x;
  const int64_t n = nh / p.heads;
  const int h = int(nh % p.heads);
  const int64_t c = blockIdx.y;
  const SeqSpan seq = sequence_span(p.seqs, n);
  if (c * C >= seq.len) return;
  const int rows_valid = int(min(int64_t(C), seq.len - c * C));
  const int K = p.key_dim, KP = p.prep_key_pad;
  const Slot L{KP};
  unsigned char* slot = p.prep + (slot_index(p, seq, n, c) * p.heads + h) * int64_t(L.bytes());
  auto row_offset = [&](const View& t, int64_t token) {
    return seq.batch * t.stride[0] + (seq.begin + token) * t.stride[1] + h * t.stride[2];
  };

  // Column role (warp-uniform rows): keys 2·pair, 2·pair + 1 of each slice, rows 8·eighth .. 8·eighth + 7,
  // i.e. half `hb` of the diagonal block qt (its 4-row groups 2·hb and 2·hb + 1).
  const int pair = tid & 31, eighth = tid >> 5, qt = eighth >> 1, hb = eighth & 1;
  const int eighth_rows = max(0, min(8, rows_valid - 8 * eighth));
  const int64_t token0 = c * C + 8 * eighth;

  // Tile role: 4×4 tile `job` of A (rows out_row.., columns out_col..) over the float4 key groups of
  // parity `half`; factor rows arow.. (query side) and brow.. (key side). In the off-diagonal blocks the
  // 16 tiles of a block are ordered so that a quarter warp reads 2 query and 2 key row groups, in distinct
  // banks at kP = 68 (a whole warp's 8 rows of a side: 2-way).
  const bool has_job = (tid >> 1) < kJobs;
  const int job = min(tid >> 1, kJobs - 1), half = tid & 1;
  int arow, brow, out_row, out_col;
  if (job < 96) {
    const int b = job >> 4, w = job & 15;
    const int rg = ((w >> 3) << 1) | ((w >> 1) & 1), cg = (((w >> 2) & 1) << 1) | (w & 1);
    int I, J;
    pair_of(b, I, J);
    arow = kQE + 16 * (I - 1) + 4 * rg, brow = kKI + 16 * b + 4 * cg;
    out_row = 16 * I + 4 * rg, out_col = 16 * J + 4 * cg;
  } else {
    const int t = job - 96, B = t / 6, tile_pair = t % 6;
    int ti, tj;
    pair_of(tile_pair, ti, tj);
    arow = kQ4 + 12 * B + 4 * (ti - 1), brow = kK4 + 24 * B + 4 * tile_pair;
    out_row = 16 * B + 4 * ti, out_col = 16 * B + 4 * tj;
  }

  float diag[kDiag];  // this thread's two 4×4 diagonal tiles, entries j ≤ i, summed over its keys and slices
#pragma unroll
  for (int e = 0; e < kDiag; ++e) diag[e] = 0.f;

  // g of a slice (as loaded) is prefetched while the previous slice computes its tiles; q and k (packed
  // pairs) load at the start of the slice, their latency covered by the scan and the first barrier.
  uint32_t gw[16];
  bool g_packed = false;
  auto load_gate = [&](int s) {
    const int key0 = 64 * s + 2 * pair, rows = key0 < K ? eighth_rows : 0;
    if (p.gate == Gate::vector) {
      g_packed = load_gate_pairs(p.g, row_offset(p.g, token0) + key0 * p.g.stride[3], rows, key0, K, gw);
    } else {
      g_packed = false;
#pragma unroll
      for (int j = 0; j < 8; ++j)  // a scalar gate applies to every key column
        gw[2 * j] = gw[2 * j + 1] = __float_as_uint(
            p.gate == Gate::scalar && j < eighth_rows ? scalar_gate<GAMMA>(p.g, row_offset(p.g, token0 + j), p.g_gamma, h) : 0.f);
    }
  };
  load_gate(0);

  for (int s = 0; s < KP / 64; ++s) {
    const int key0 = 64 * s + 2 * pair;
    uint32_t qw[8], kw[8];
    {
      const int rows = key0 < K ? eighth_rows : 0;
      load_pairs(p.q, row_offset(p.q, token0) + key0 * p.q.stride[3], rows, key0, K, qw);
      load_pairs(p.k, row_offset(p.k, token0) + key0 * p.k.stride[3], rows, key0, K, kw);
    }
    float G[8][2];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      if (g_packed) {
        const float2 f = p.g.dtype == Elem::bf16 ? __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&gw[j]))
                                                 : __half22float2(*reinterpret_cast<const __half2*>(&gw[j]));
        G[j][0] = f.x, G[j][1] = f.y;
      } else {
        G[j][0] = __uint_as_float(gw[2 * j]), G[j][1] = __uint_as_float(gw[2 * j + 1]);
      }
    }
    // ---- G = Γ · log2 e: inclusive sums over the eighth's rows, then the earlier eighths' totals ----
    // Gates are clamped at −88 first (−inf included): every weight across such a gate is below 2^-126, which
    // exp2_ftz flushes to 0, exactly what the gate gives, and Γ stays finite (no −inf − −inf, no −1e30 that
    // swallows the other gates of the chunk). Gates above −88 keep their bits.
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
      float run = 0.f;
#pragma unroll
      for (int j = 0; j < 8; ++j) G[j][kk] = run = fmaf(fmaxf(G[j][kk], kGateFloor), kLog2e, run);
    }
    *reinterpret_cast<float2*>(totals + eighth * 64 + 2 * pair) = make_float2(G[7][0], G[7][1]);
    *reinterpret_cast<float2*>(firsts + (2 * eighth) * 64 + 2 * pair) = make_float2(G[0][0], G[0][1]);
    *reinterpret_cast<float2*>(firsts + (2 * eighth + 1) * 64 + 2 * pair) = make_float2(G[4][0], G[4][1]);
    __syncthreads();  // B1
    // G of the first row of block I (block_ref[I]) and of group t of block qt (group_ref[t]), summed in the
    // order their own threads use (earlier eighths in order, then the local value); `last` = G of row 63.
    float before[2] = {0.f, 0.f}, last[2] = {0.f, 0.f}, block_ref[4][2], group_ref[4][2];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float2 total = *reinterpret_cast<const float2*>(totals + e * 64 + 2 * pair);
      const float2 first0 = *reinterpret_cast<const float2*>(firsts + (2 * e) * 64 + 2 * pair);
      const float2 first1 = *reinterpret_cast<const float2*>(firsts + (2 * e + 1) * 64 + 2 * pair);
      const float r0[2] = {first0.x + last[0], first0.y + last[1]}, r1[2] = {first1.x + last[0], first1.y + last[1]};
#pragma unroll
      for (int kk = 0; kk < 2; ++kk) {
        if (e % 2 == 0) block_ref[e / 2][kk] = r0[kk];
        if (e / 2 == qt) group_ref[2 * (e % 2)][kk] = r0[kk], group_ref[2 * (e % 2) + 1][kk] = r1[kk];
        if (e == eighth) before[kk] = last[kk];
      }
      last[0] += total.x, last[1] += total.y;
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) G[j][0] += before[0], G[j][1] += before[1];

    // ---- factors of this thread's rows and keys (float2 stores: a warp writes one 256-byte row) ----
    float* fpair = fac + 2 * pair;
    auto put = [&](int row, float lo, float hi) { *reinterpret_cast<float2*>(fpair + row * kP) = make_float2(lo, hi); };
    float qf[8][2], kf[8][2];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float2 a = unpack2<E>(qw[j]), b = unpack2<E>(kw[j]);
      qf[j][0] = a.x, qf[j][1] = a.y, kf[j][0] = b.x, kf[j][1] = b.y;
    }
    if (qt >= 1) {  // query side of the off-diagonal blocks (I = qt): reference row 16·qt (= group_ref[0])
#pragma unroll
      for (int j = 0; j < 8; ++j)
        put(kQE + 16 * (qt - 1) + 8 * hb + j, qf[j][0] * exp2_ftz(G[j][0] - group_ref[0][0]),
            qf[j][1] * exp2_ftz(G[j][1] - group_ref[0][1]));
    }
#pragma unroll
    for (int I = 1; I < 4; ++I) {  // key side of the blocks (I, J = qt): reference row 16·I
      if (I <= qt) continue;
      const int b = I * (I - 1) / 2 + qt;
#pragma unroll
      for (int j = 0; j < 8; ++j)
        put(kKI + 16 * b + 8 * hb + j, kf[j][0] * exp2_ftz(block_ref[I][0] - G[j][0]),
            kf[j][1] * exp2_ftz(block_ref[I][1] - G[j][1]));
    }
#pragma unroll
    for (int tt = 0; tt < 2; ++tt) {
      const int u = 2 * hb + tt;  // this thread's group of block qt
      if (u >= 1) {               // query side of the tiles (u, ·) inside the block: reference row 4·u
#pragma unroll
        for (int r = 0; r < 4; ++r)
          put(kQ4 + 12 * qt + 4 * (u - 1) + r, qf[4 * tt + r][0] * exp2_ftz(G[4 * tt + r][0] - G[4 * tt][0]),
              qf[4 * tt + r][1] * exp2_ftz(G[4 * tt + r][1] - G[4 * tt][1]));
      }
#pragma unroll
      for (int t = 1; t < 4; ++t) {  // key side of the tiles (t, u), t > u: reference row 4·t
        if (t <= u) continue;
        const int tile_pair = t * (t - 1) / 2 + u;
#pragma unroll
        for (int j = 0; j < 4; ++j)
          put(kK4 + 24 * qt + 4 * tile_pair + j, kf[4 * tt + j][0] * exp2_ftz(group_ref[t][0] - G[4 * tt + j][0]),
              kf[4 * tt + j][1] * exp2_ftz(group_ref[t][1] - G[4 * tt + j][1]));
      }
      // The diagonal tile of group u: 2^(G_i − G_j), j ≤ i, as products of α_r = 2^(G_r − G_{r−1}) ≤ 1.
#pragma unroll
      for (int kk = 0; kk < 2; ++kk) {
        const float a1 = exp2_ftz(G[4 * tt + 1][kk] - G[4 * tt][kk]), a2 = exp2_ftz(G[4 * tt + 2][kk] - G[4 * tt + 1][kk]),
                    a3 = exp2_ftz(G[4 * tt + 3][kk] - G[4 * tt + 2][kk]);
        const float a12 = a1 * a2, a23 = a2 * a3;
        const float decay[4][4] = {{1.f, 0.f, 0.f, 0.f}, {a1, 1.f, 0.f, 0.f}, {a12, a2, 1.f, 0.f}, {a12 * a3, a23, a3, 1.f}};
#pragma unroll
        for (int r = 0; r < 4; ++r)
#pragma unroll
          for (int j = 0; j <= r; ++j) {
            float& x = diag[10 * tt + r * (r + 1) / 2 + j];
            x = fmaf(qf[4 * tt + r][kk] * kf[4 * tt + j][kk], decay[r][j], x);
          }
      }
    }
    // Q̃ (a warp writes a row's 64 keys), K̃ᵀ (each key's 8 tokens: one 16-byte store), decay.
    unsigned char* q_tile = slot + L.q() + s * C * 128;
#pragma unroll
    for (int j = 0; j < 8; ++j)
      *reinterpret_cast<uint32_t*>(q_tile + swizzled(8 * eighth + j, 2 * pair)) =
          pack2<E>(qf[j][0] * exp2_ftz(G[j][0]), qf[j][1] * exp2_ftz(G[j][1]));
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
      float x[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) x[j] = kf[j][kk] * exp2_ftz(last[kk] - G[j][kk]);
      *reinterpret_cast<uint4*>(slot + L.kt() + swizzled(key0 + kk, 8 * eighth)) = pack8<E>(x);
    }
    if (eighth == 7)
      *reinterpret_cast<float2*>(slot + L.decay() + 4 * key0) = make_float2(exp2_ftz(G[7][0]), exp2_ftz(G[7][1]));
    __syncthreads();  // B2: factor rows written
    if (s + 1 < KP / 64) load_gate(s + 1);

    // ---- A below the diagonal tiles: this thread's 4×4 tile over its key groups ----
    float acc[16];
#pragma unroll
    for (int e = 0; e < 16; ++e) acc[e] = 0.f;
    if (has_job) {
      const float* qa = fac + arow * kP + 4 * half;
      const float* kb = fac + brow * kP + 4 * half;
#pragma unroll 2
      for (int kk = 0; kk < 64; kk += 8) {
        float4 a[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) a[r] = *reinterpret_cast<const float4*>(qa + r * kP + kk);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float4 b = *reinterpret_cast<const float4*>(kb + j * kP + kk);
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            float& x = acc[4 * r + j];
            x = fmaf(a[r].x, b.x, x);
            x = fmaf(a[r].y, b.y, x);
            x = fmaf(a[r].z, b.z, x);
            x = fmaf(a[r].w, b.w, x);
          }
        }
      }
    }
    // The two key halves: thread half 0 adds rows 0–1 of the tile, half 1 rows 2–3.
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float mine = half ? acc[8 + e] : acc[e];
      const float sum = mine + __shfl_xor_sync(0xffffffffu, half ? acc[e] : acc[8 + e], 1);
      if (has_job) {
        float& at = a_tile[(out_row + 2 * half + (e >> 2)) * kPA + out_col + (e & 3)];
        if (s == 0) at = sum;
        else at += sum;
      }
    }
    __syncthreads();  // B3: factor rows read
  }

  // ---- the diagonal tiles: sums over the 32 key pairs of each warp (partial sums in the free factor rows) ----
#pragma unroll
  for (int e = 0; e < kDiag; ++e) fac[e * kScratch + tid] = diag[e];
  __syncthreads();
  if (tid < 160) {
    const int group = tid / 10, idx = tid % 10, tt = group & 1;  // group 4·… rows 4·group..; its eighth group / 2
    const int r = idx < 1 ? 0 : idx < 3 ? 1 : idx < 6 ? 2 : 3, j = idx - r * (r + 1) / 2;
    const float* from = fac + (10 * tt + idx) * kScratch + 32 * (group >> 1);
    float part[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int cc = 0; cc < 32; cc += 4)
#pragma unroll
      for (int u = 0; u < 4; ++u) part[u] += from[cc + u];
    a_tile[(4 * group + r) * kPA + 4 * group + j] = (part[0] + part[1]) + (part[2] + part[3]);
  }
  __syncthreads();
  // ---- A into the slot: entries above the diagonal are zero (never written in a_tile) ----
  // A select, not a mask product: entry (i, j ≤ i) is made only of q_i, k_j and exps of differences of finite
  // (clamped) cumsums, so a NaN or Inf of q or k at token t reaches only row t or column t (rows from t on),
  // never an earlier row (what v does through A V is handled in the state kernel: chunk_output_rowwise).
  for (int piece = tid; piece < C * 8; piece += kPrepThreads) {
    const int r = piece >> 3, p8 = piece & 7;
    float x[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) x[e] = 8 * p8 + e <= r ? a_tile[r * kPA + 8 * p8 + e] : 0.f;
    const uint4 packed = pack8<E>(x);
    *reinterpret_cast<uint4*>(slot + L.a() + swizzled(r, 8 * p8)) = packed;
    if (p.intra.data && r < rows_valid)  // GlaForwardArgs::intra, for the backward
      *reinterpret_cast<uint4*>(static_cast<E*>(p.intra.data) + row_offset(p.intra, c * C + r) + 8 * p8) = packed;
  }
}

}  // namespace flashgla::cuda::gla::hopper
