// The stages of the chunked GLA backward's chunk kernel (gla_bwd_chunk.cu; docs/algorithm.md steps 7-11, with
// 3-4 recomputed), named like their CPU twins in src/cpu/gla/stages.h (and FLA's): phase A chunk_bwd_dA
// (dA = scale (dO V^T) ⊙ M) and chunk_fwd_intra (the forward's intra-chunk A, recomputed); phase B chunk_bwd_dv
// (dv = A^T dO + k̂ dS); phase C, per key tile, chunk_bwd_dqk_inter (dq, dk through the states), chunk_bwd_dqk
// (dq, dk inside the chunk, from the products' accumulators and the diagonal blocks) and chunk_bwd_dg. The
// products between sub-chunks of phase C stay written out in the kernel (as a stage its addresses fold
// differently). Every stage runs on the whole block (8 warps, warp (s, hc): sub-chunk s, column half hc) with
// the kernel's tiles in shared memory; the kernel composes them, loads the tiles of phase C and stores its
// outputs.
//
// The kernel's generated code is the same as before the stages were named (scripts/ptx_same.sh), which takes
// four rules: the kernel owns the stages' register arrays and aggregates (accumulators, per-lane rows, gate
// tiles) and passes them by reference (those of an inlined function are placed ahead of the kernel's own and
// change the order in which the compiler allocates the kernel's registers); a stage derives its shared-memory
// pointers from `smem` itself, the way the kernel did (passed in, the compiler folds the constant offsets
// differently); a value the kernel computes once for several phases (gamma, col) is passed, not recomputed;
// and a stage whose loops run over the other sub-chunks takes the sub-chunk from the thread index (chunk_bwd_dg),
// so that the compiler bounds it. Also here: the shared-memory layout (ChunkSmem) and the helpers the stages
// share.
#pragma once

#include "cuda/gla/device/elements.cuh"
#include "cuda/gla/device/chunk_slots.cuh"
#include "cuda/gla/device/gate_tile.cuh"
#include "cuda/gla/device/tiles.cuh"
#include "cuda/gla/device/warp_mma.cuh"
#include "cuda/gla/device/gla_bwd.cuh"

namespace flashgla::cuda::gla {
namespace {

constexpr int kSubs = kChunk / kSub;  // 4 sub-chunks per chunk

// Phase A's key stage (rows of 64 columns) for A, between sub-chunks and, where
// the gates allow (a "factored" sub-chunk, see mark_wide_subchunks), inside
// one: sub-chunk I takes keys of rows j < 16 (I + 1), k_j exp(Γ_{16I} − Γ_j),
// from key_stage_row(I).
__host__ __device__ constexpr int key_stage_row(int I) { return kSub * I * (I + 1) / 2; }
constexpr int kStageRows = key_stage_row(kSubs);  // 160
// Key stage row -> its sub-chunk I and key row j.
__device__ __forceinline__ int key_stage_sub(int row) {
  return row < key_stage_row(1) ? 0 : (row < key_stage_row(2) ? 1 : (row < key_stage_row(3) ? 2 : 3));
}
__device__ __forceinline__ int key_stage_key(int row) { return row - key_stage_row(key_stage_sub(row)); }

// Phase C's stages hold only the rows its products read (dq and dk take no
// pairs inside a sub-chunk): sub-chunk I's keys j < 16 I, k_j exp(Γ_{16I} − Γ_j),
// from between_key_row(I); sub-chunk J's queries i >= 16 (J + 1),
// q_i exp(Γ_i − Γ_{16J+15}), from between_query_row(J); 96 rows each.
__host__ __device__ constexpr int between_key_row(int I) { return kSub * I * (I - 1) / 2; }
__host__ __device__ constexpr int between_query_row(int J) { return kSub * J * (2 * kSubs - 1 - J) / 2; }
constexpr int kBetweenRows = between_key_row(kSubs);  // 96
static_assert(between_query_row(kSubs - 1) == kBetweenRows, "both stages hold every pair between sub-chunks");
__device__ __forceinline__ int between_key_sub(int row) {
  return row < between_key_row(2) ? 1 : (row < between_key_row(3) ? 2 : 3);
}
__device__ __forceinline__ int between_query_sub(int row) {
  return row < between_query_row(1) ? 0 : (row < between_query_row(2) ? 1 : 2);
}
__device__ __forceinline__ int between_key_key(int row) { return row - between_key_row(between_key_sub(row)); }
// The reference rows of the stages: bf16 and fp32 scale sub-chunk I's keys against its first row 16 I and
// sub-chunk J's queries against J's last row; fp16 against the nearest row of the other side (16 I − 1, the
// last key before I; 16 (J + 1), the first query after J), so that the nearest pair's operand weight is 1 and
// the others' are below it: against the far row, that pair's weight is exp g of one step, which a gate of −20
// takes below fp16's range (6e-8), and with it dg's share of the pairs next to a sub-chunk boundary.
template <class T>
__device__ __forceinline__ int between_key_ref(int I) { return kScaledDStates<T> ? kSub * I - 1 : kSub * I; }
template <class T>
__device__ __forceinline__ int between_query_ref(int J) { return kScaledDStates<T> ? kSub * (J + 1) : kSub * J + kSub - 1; }
__device__ __forceinline__ int between_query_query(int row) {
  const int J = between_query_sub(row);
  return kSub * (J + 1) + row - between_query_row(J);
}

// For A (phase A), pairs inside a sub-chunk may go through the products as
// well when its 16 rows of Γ span at most p.diag_factor_limit (log2 units) in
// every key column of the tile: the operands are then scaled against a row of
// the sub-chunk by factors within 2^±limit, which bf16 and fp32 hold. Else
// (gates of −20 per step, say) those pairs are summed element by element, each
// with its own exponent. On by default (kDiagFactorLimit); dq and dk keep the
// element-wise sums: factoring them too raised dg's error 3-4x, past 1e-2
// (bench/notes_gla_bwd.md), while A feeds only dv. Threads 64 s.. cover
// sub-chunk s; each warp writes whether any of its columns is too wide into
// flags[warp] (read after a barrier).
template <class GT>
__device__ __forceinline__ void mark_wide_subchunks(const GT* sG, int* flags, float limit) {
  static_assert(kBwdChunkThreads == kSubs * kTile, "one thread per (sub-chunk, column)");
  const int s = threadIdx.x / kTile, c = threadIdx.x % kTile;
  GT lo = sG[kSub * s * kLdF + c], hi = lo;
#pragma unroll
  for (int i = 1; i < kSub; ++i) {
    const GT x = sG[(kSub * s + i) * kLdF + c];
    lo = x < lo ? x : lo;
    hi = x > hi ? x : hi;
  }
  const bool wide = !(hi - lo <= GT(limit));  // NaN or inf: wide
  const bool any_wide = __any_sync(0xffffffffu, wide);
  if ((threadIdx.x & 31) == 0) flags[threadIdx.x / 32] = any_wide;
}

// Shared memory. R is a work area whose layout changes with the phase:
//   phase A: dO, V tiles (rows 0-127); then key stage (rows 0-159) and q̂ (160-223);
//            then the factored part of A's diagonal blocks in fp32;
//            A goes to the q tile's buffer and stays there through phase B;
//   phase B: kValueGroup dO tiles, k̂, kValueGroup dS tiles; then dv in fp32;
//   phase C: key and query stages (rows 0-191);
//            then dO, V, S, dS tiles (rows 0-255);
//            then dq', dk^{(S)}, dk^{(A)'} in fp32 (three 64 x kLdF arrays).
template <class T, class GT>
struct ChunkSmem {
  static constexpr size_t tile = size_t(kTile) * kLd<T> * sizeof(T);
  static constexpr size_t tile_f = size_t(kTile) * kLdF * sizeof(float);
  static constexpr int kDiagLd = kSub + 1;
  static constexpr size_t q = 0;                               // q tile of the current key tile
  static constexpr size_t k = q + tile;                        // k tile
  static constexpr size_t dA = k + tile;                       // dA, compute type (mma operand)
  static constexpr size_t dA_diag = dA + tile;                 // dA's diagonal blocks in fp32, [64][kDiagLd]
  static constexpr size_t gates = dA_diag + size_t(kChunk) * kDiagLd * sizeof(float);  // Γ of the key tile
  static constexpr size_t r = gates + size_t(kTile) * kLdF * sizeof(GT);
  // Phase B holds 2 kValueGroup + 1 tiles: two value tiles at a time where that fits.
  static constexpr int kValueGroup = sizeof(T) == 2 ? 2 : 1;
  static constexpr size_t r_tiles = 2 * kValueGroup + 1 > 4 ? 2 * kValueGroup + 1 : 4;
  static constexpr size_t r_bytes = r_tiles * tile > 3 * tile_f ? r_tiles * tile : 3 * tile_f;
  static_assert(size_t(2 * kBetweenRows) * kLd<T> * sizeof(T) <= r_bytes, "phase C: both stages in R");
  static_assert(size_t(kStageRows + kChunk) * kLd<T> * sizeof(T) + size_t(kChunk) * kDiagLd * sizeof(float) <= r_bytes,
                "phase A: key stage, q̂ and the diagonal blocks' element-wise sums in R");
  static_assert(kValueGroup * tile_f <= r_bytes, "phase B stages dv (fp32) in R");
  static_assert(size_t(kTile) * kLdF * sizeof(GT) >= size_t(kTileElems) * sizeof(float),
                "the gates' buffer holds a raw bf16 or fp32 gate tile (start_gate_tile)");
  static_assert(gates % 16 == 0, "cp.async into the gates' buffer");
  static constexpr size_t totals = r + r_bytes;                // dg: per sub-chunk sums, 2 x [4][64]
  static constexpr size_t state_term = totals + 2 * kSubs * kTile * sizeof(float);  // [64]
  static constexpr size_t row_sums = state_term + kTile * sizeof(float);           // [64], scalar gate
  static constexpr size_t wide = row_sums + kTile * sizeof(float);                 // [8] warps' flags
  // fp16: E of the key tile's columns (the scaled dS, gate_tile.cuh: kScaledDStates), [64]
  static constexpr size_t next_gates = wide + 8 * sizeof(int);
  static constexpr size_t bytes = next_gates + (kScaledDStates<T> ? kTile * sizeof(float) : 0);
};

// fp16: E (log2) of this chunk's stored dS for key columns c0.. into sNext (threads < 64): the gate of the next
// chunk's first token, 0 after the sequence's last chunk. Read after the caller's next barrier.
__device__ __forceinline__ void store_next_gates(const BwdParams& p, float* sNext, int64_t b, int64_t t0, int64_t h,
                                                 int c0, bool has_next) {
  if (threadIdx.x < kTile)
    sNext[threadIdx.x] = has_next ? gate_at<float>(p, b, t0 + kChunk, h, c0 + int(threadIdx.x)) : 0.f;
}

// The rows of the diagonal block whose A entries warp half hc computes: an
// interleaving that gives both halves 68 of the 136 pairs j <= i.
__device__ __forceinline__ int diagonal_row(int hc, int m) {
  return 4 * (m >> 1) + (hc == 0 ? ((m & 1) ? 3 : 0) : ((m & 1) ? 2 : 1));
}

// The gate tile of key columns c0.. as Γ in sG, in two steps around the
// caller's cp_async_commit_and_wait_all(): with kPlain and a vector gate (bf16
// rows; kF32Rows: bf16 or fp32 rows), its rows are copied asynchronously into
// sG itself, with the other tiles, then read back and summed; else loaded into registers
// (load_gate_tile). Waiting on the register loads of the gate was the largest
// single stall of the general kernel in a profile, and in the plain kernel the
// copies are faster at every shape measured (bench/notes_gla_bwd.md); they cost
// one more barrier. sG must be free (no reader left) when start_gate_tile is called.
template <class Raw>
__device__ __forceinline__ void copy_raw_gate_rows(const BwdParams& p, void* sG, int64_t b, int64_t t0, int rows,
                                                   int64_t h, int c0) {
  constexpr int kPerPiece = 16 / sizeof(Raw), kPieces = kTile / kPerPiece;  // 16-byte pieces per row
  const Raw* src = static_cast<const Raw*>(p.g.data) + offset4(p.g, b, t0, h, c0);
  Raw* raw = static_cast<Raw*>(sG);
  for_each_item<kBwdChunkThreads, kTile * kPieces>([&](int idx) {
    const int r = idx / kPieces, c = idx % kPieces * kPerPiece;  // rows past `rows`: zero, a flat Γ
    cp_async16_ordered(raw + r * kTile + c, r < rows ? src + (r * int(p.g.stride[1]) + c) : src, r < rows ? 16 : 0);
  });
}

// This thread's rows of the raw gate tile copy_raw_gate_rows left in sG, in log2 units.
template <class Raw, class GT>
__device__ __forceinline__ void read_raw_gate_rows(const void* sG, GateTile<GT, kBwdChunkThreads>& gate) {
  using Tile = GateTile<GT, kBwdChunkThreads>;
  const int c = threadIdx.x % kTile, first = (threadIdx.x / kTile) * Tile::kRows;
  const Raw* raw = static_cast<const Raw*>(sG);
#pragma unroll
  for (int i = 0; i < Tile::kRows; ++i) gate.x[i] = gate_value<GT>(raw[(first + i) * kTile + c]);
}

//
// A scalar gate (or none) gives every key tile the same Γ, and the plain kernel's K is whole tiles, so no tile
// has columns past K: the plain kernel builds that Γ once per chunk, at its first gate tile (`first`), and
// keeps it in sG; the later calls only wait for the other tiles (bench/notes_gla_bwd.md: the register loads of
// every tile's scalar gate made the kernel slower than with a vector gate).
template <bool kPlain>
__device__ __forceinline__ bool gate_tile_kept(const BwdParams& p, bool first) {
  return kPlain && p.gate != GateKind::vector && !first;
}

template <class GT, bool kPlain, bool kF32Rows = false>
__device__ __forceinline__ GateTile<GT, kBwdChunkThreads> start_gate_tile(const BwdParams& p, GT* sG, int64_t b,
                                                                          int64_t t0, int rows, int64_t h, int c0,
                                                                          bool first) {
  if (gate_tile_kept<kPlain>(p, first)) return {};
  if (kPlain && p.gate == GateKind::vector) {
    if (!kF32Rows || p.g.dtype == Elem::bf16) copy_raw_gate_rows<bf16>(p, sG, b, t0, rows, h, c0);
    else copy_raw_gate_rows<float>(p, sG, b, t0, rows, h, c0);
    return {};
  }
  return load_gate_tile<GT, kBwdChunkThreads, kPlain>(p, b, t0, rows, h, c0);
}

template <class GT, bool kPlain, bool kF32Rows = false>
__device__ __forceinline__ void finish_gate_tile(const BwdParams& p, GT* sG, GateTile<GT, kBwdChunkThreads>& gate,
                                                 bool first) {
  if (gate_tile_kept<kPlain>(p, first)) {
    __syncthreads();  // every thread's copies of the other tiles have landed
    return;
  }
  if (kPlain && p.gate == GateKind::vector) {
    __syncthreads();  // every thread's copies have landed
    if (!kF32Rows || p.g.dtype == Elem::bf16) read_raw_gate_rows<bf16>(sG, gate);
    else read_raw_gate_rows<float>(sG, gate);
  }
  store_gate_cumsum<GT, kBwdChunkThreads>(sG, gate);  // its first barrier ends the reads above
}

// Phase A, dA = scale (dO V^T) ⊙ M over the value tiles, into sdA (compute type, zero on and above the diagonal:
// the products take pairs j < i only) and the diagonal blocks into sdAd (fp32, with the diagonal).
// Warp (s, hc) computes the 16x16 blocks (s, J) for J = hc, hc + 2 with J <= s.
template <class T, class GT, bool kPlain>
__device__ __forceinline__ void chunk_bwd_dA(const BwdParams& p, int64_t b, int64_t t0, int rows, int h, int s, int hc,
                                             int V, float scale, float (&acc)[2][2][4]) {
  using Smem = ChunkSmem<T, GT>;
  constexpr int LD = kLd<T>;
  constexpr int LDD = Smem::kDiagLd;
  extern __shared__ __align__(16) unsigned char smem[];
  T* sdA = reinterpret_cast<T*>(smem + Smem::dA);
  float* sdAd = reinterpret_cast<float*>(smem + Smem::dA_diag);
  T* R = reinterpret_cast<T*>(smem + Smem::r);
  zero(acc[0]);
  zero(acc[1]);
  T* sDO = R;
  T* sV = R + kTile * LD;
  for (int vt = 0; vt < p.value_tiles; ++vt) {
    load_tile_async<T, kBwdChunkThreads, kPlain>(sDO, p.d_o, b, t0, rows, h, vt * kTile, V);
    load_tile_async<T, kBwdChunkThreads, kPlain>(sV, p.v, b, t0, rows, h, vt * kTile, V);
    cp_async_commit_and_wait_all();
    __syncthreads();
#pragma unroll
    for (int jj = 0; jj < 2; ++jj) {
      const int J = hc + 2 * jj;
      if (J <= s) warp_gemm<2, false, true>(acc[jj], sDO + kSub * s * LD, LD, sV + kSub * J * LD, LD, kTile);
    }
    __syncthreads();
  }
#pragma unroll
  for (int jj = 0; jj < 2; ++jj) {
    const int J = hc + 2 * jj;
    if (J > s) continue;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = kSub * s + acc_row(e), j = kSub * J + acc_col(nt, e);
        const float x = j <= i ? scale * acc[jj][nt][e] : 0.f;
        sdA[i * LD + j] = from_float<T>(j == i ? 0.f : x);  // the products take pairs j < i only
        if (J == s) sdAd[i * LDD + j - kSub * s] = x;
      }
  }
}

// Phase A, the forward's intra-chunk A recomputed (scaled) into sA, over the key tiles (docs/algorithm.md
// steps 3-4).
// Off-diagonal blocks (s, J), J = hc, hc + 2 < s, on the products; the diagonal block (s, s) too for key tiles
// where sub-chunk s is factored, else element by element, rows diagonal_row(hc, 0..7).
template <class T, class GT, bool kPlain, bool kF32Rows = false>
__device__ __forceinline__ void chunk_fwd_intra(const BwdParams& p, int64_t b, int64_t t0, int rows, int h, int s,
                                                int hc, int lane, int K, float scale, float (&acc)[2][2][4],
                                                float (&k_reg)[kSub], GT (&g_reg)[kSub], float (&part)[kSub]) {
  using Smem = ChunkSmem<T, GT>;
  constexpr int LD = kLd<T>;
  constexpr int LDF = kLdF;
  constexpr int LDD = Smem::kDiagLd;
  extern __shared__ __align__(16) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem + Smem::q);
  T* sK = reinterpret_cast<T*>(smem + Smem::k);
  GT* sG = reinterpret_cast<GT*>(smem + Smem::gates);
  T* R = reinterpret_cast<T*>(smem + Smem::r);
  T* sA = sQ;  // A, from here through chunk_bwd_dv (q is reloaded in phase C)
  int* sWide = reinterpret_cast<int*>(smem + Smem::wide);
  zero(acc[0]);
  zero(acc[1]);
  T* sKStage = R;                       // key_stage rows
  T* sQHat = R + kStageRows * LD;       // row i: q_i exp(Γ_i − Γ_{16 s(i)})
  // The element-wise part of the diagonal blocks, [64][LDD] fp32 after q̂,
  // each entry summed by the one lane that holds it (rows diagonal_row,
  // column j): in shared memory rather than registers so that the loop over
  // those rows keeps one body (8 unrolled bodies were a fifth of the code).
  float* sDiagElem = reinterpret_cast<float*>(sQHat + kChunk * LD);
  const int diag_col = transpose_reduce_index<kSub>();  // the column whose sums this lane holds
  if ((lane & 1) == 0) {
#pragma unroll 1
    for (int m = 0; m < 8; ++m) sDiagElem[(kSub * s + diagonal_row(hc, m)) * LDD + diag_col] = 0.f;
  }
  for (int kt = 0; kt < p.key_tiles; ++kt) {
    auto gate = start_gate_tile<GT, kPlain, kF32Rows>(p, sG, b, t0, rows, h, kt * kTile, kt == 0);
    load_tile_async<T, kBwdChunkThreads, kPlain>(sQ, p.q, b, t0, rows, h, kt * kTile, K);
    load_tile_async<T, kBwdChunkThreads, kPlain>(sK, p.k, b, t0, rows, h, kt * kTile, K);
    cp_async_commit_and_wait_all();
    finish_gate_tile<GT, kPlain, kF32Rows>(p, sG, gate, kt == 0);
    mark_wide_subchunks(sG, sWide, p.diag_factor_limit);
    map_rows<T, kBwdChunkThreads, kStageRows, kPlain>(sKStage, sK, key_stage_key, [&](int row, int col, float x) {
      return x * exp2_of(sG[kSub * key_stage_sub(row) * LDF + col] - sG[key_stage_key(row) * LDF + col]);
    });
    map_rows<T, kBwdChunkThreads, kChunk, kPlain>(sQHat, sQ, [](int r) { return r; }, [&](int i, int col, float x) {
      return x * exp2_of(sG[i * LDF + col] - sG[(i / kSub) * kSub * LDF + col]);
    });
    __syncthreads();
    const bool factored = !(sWide[2 * s] | sWide[2 * s + 1]);
#pragma unroll
    for (int jj = 0; jj < 2; ++jj) {
      const int J = hc + 2 * jj;
      if (J < s || (J == s && factored))
        warp_gemm<2, false, true>(acc[jj], sQHat + kSub * s * LD, LD,
                                  sKStage + (key_stage_row(s) + kSub * J) * LD, LD, kTile);
    }
    // Diagonal block: lanes over columns (two each, one at a time), then a sum over the warp.
#pragma unroll 1
    for (int half = 0; half < (factored ? 0 : 2); ++half) {
      const int c = lane + 32 * half;
#pragma unroll
      for (int j = 0; j < kSub; ++j) {
        k_reg[j] = to_float(sK[(kSub * s + j) * LD + c]);
        g_reg[j] = sG[(kSub * s + j) * LDF + c];
      }
#pragma unroll 1
      for (int m = 0; m < 8; ++m) {
        const int i = diagonal_row(hc, m);
        const float qi = to_float(sQ[(kSub * s + i) * LD + c]);
        const GT gi = sG[(kSub * s + i) * LDF + c];
#pragma unroll
        for (int j = 0; j < kSub; ++j) part[j] = j <= i ? qi * k_reg[j] * exp2_of(gi - g_reg[j]) : 0.f;
        const float sum = transpose_reduce<kSub>(part);
        if ((lane & 1) == 0) sDiagElem[(kSub * s + i) * LDD + diag_col] += sum;
      }
    }
    __syncthreads();
  }
  // A (scaled) into sA: off-diagonal blocks; the diagonal block (zero above
  // the diagonal) sums its product part (via fp32 in R, free now) and its
  // element-wise part.
  float* sDiagProduct = reinterpret_cast<float*>(R);  // [64][LDD]
#pragma unroll
  for (int jj = 0; jj < 2; ++jj) {
    const int J = hc + 2 * jj;
    if (J > s) continue;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = kSub * s + acc_row(e), j = kSub * J + acc_col(nt, e);
        if (J < s) sA[i * LD + j] = from_float<T>(scale * acc[jj][nt][e]);
        else sDiagProduct[i * LDD + j - kSub * s] = acc[jj][nt][e];
      }
  }
  __syncthreads();
  if ((lane & 1) == 0) {
    const int j = diag_col;
#pragma unroll
    for (int m = 0; m < 8; ++m) {
      const int i = diagonal_row(hc, m);
      const float a = sDiagElem[(kSub * s + i) * LDD + j] + sDiagProduct[(kSub * s + i) * LDD + j];
      sA[(kSub * s + i) * LD + kSub * s + j] = from_float<T>(j <= i ? scale * a : 0.f);
    }
  }
}

// Phase B, dv = A^T dO + k̂ dS with k̂ = k ⊙ exp(γ − Γ), stored. Warp (s, hc): rows of sub-chunk s, value columns
// 32 hc.. of each value tile; kGroup value tiles at a time, so that k̂ is built once per group.
template <class T, class GT, bool kPlain, bool kF32Rows = false>
__device__ __forceinline__ void chunk_bwd_dv(const BwdParams& p, const GT* gamma, int64_t b, int64_t t0, int64_t slot,
                                             int rows, int h, int s, int hc, int K, int V,
                                             float (&acc)[ChunkSmem<T, GT>::kValueGroup][4][4],
                                             GateTile<GT, kBwdChunkThreads>& gate, bool has_next) {
  using Smem = ChunkSmem<T, GT>;
  constexpr int LD = kLd<T>;
  constexpr int LDF = kLdF;
  extern __shared__ __align__(16) unsigned char smem[];
  GT* sG = reinterpret_cast<GT*>(smem + Smem::gates);
  T* R = reinterpret_cast<T*>(smem + Smem::r);
  T* sA = reinterpret_cast<T*>(smem + Smem::q);  // A (chunk_fwd_intra)
  constexpr int kGroup = Smem::kValueGroup;
  T* sDO = R;                          // kGroup tiles
  T* sKHat = R + kGroup * kTile * LD;
  T* sDS = sKHat + kTile * LD;         // kGroup tiles
  for (int vt0 = 0; vt0 < p.value_tiles; vt0 += kGroup) {
    const int group = p.value_tiles - vt0 < kGroup ? p.value_tiles - vt0 : kGroup;
    for (int j = 0; j < group; ++j)
      load_tile_async<T, kBwdChunkThreads, kPlain>(sDO + j * kTile * LD, p.d_o, b, t0, rows, h, (vt0 + j) * kTile, V);
    cp_async_commit_and_wait_all();
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kGroup; ++j) {
      zero(acc[j]);
      // A^T dO: rows j of sub-chunk s take rows i >= 16 s (A is zero above the diagonal).
      if (j < group) {
        warp_gemm<4, true, false>(acc[j], sA + kSub * s * LD + kSub * s, LD,
                                  sDO + j * kTile * LD + kSub * s * LD + 32 * hc, LD, kChunk - kSub * s);
        if (p.intra.data) scale_all(acc[j], p.scale);  // the forward's A is unscaled
      }
    }
    for (int kt = 0; kt < p.key_tiles; ++kt) {
      gate = start_gate_tile<GT, kPlain, kF32Rows>(p, sG, b, t0, rows, h, kt * kTile, false);
      if constexpr (kScaledDStates<T>)
        store_next_gates(p, reinterpret_cast<float*>(smem + Smem::next_gates), b, t0, h, kt * kTile, has_next);
      const bool k_plain = kPlain || plain_tile<T>(p.k, b, t0, h, kt * kTile, K);  // else loaded scaled, below
      if (k_plain) load_tile_async<T, kBwdChunkThreads, kPlain>(sKHat, p.k, b, t0, rows, h, kt * kTile, K);
      for (int j = 0; j < group; ++j)
        copy_tile_in<T, kBwdChunkThreads>(sDS + j * kTile * LD,
                                       static_cast<const T*>(p.dstates) + state_tile_index(p, slot, h, kt, vt0 + j));
      cp_async_commit_and_wait_all();
      finish_gate_tile<GT, kPlain, kF32Rows>(p, sG, gate, false);
      const float* sNext = reinterpret_cast<const float*>(smem + Smem::next_gates);
      auto k_hat = [=](int r, int col, float x) {  // k ⊙ exp(γ − Γ), times exp E for fp16's scaled dS
        if constexpr (kScaledDStates<T>) return x * exp2_of(gamma[col] + sNext[col] - sG[r * LDF + col]);
        else return x * exp2_of(gamma[col] - sG[r * LDF + col]);
      };
      if (k_plain) transform_tile<T, kBwdChunkThreads, kPlain>(sKHat, k_hat);
      else load_tile<T, kBwdChunkThreads>(sKHat, p.k, b, t0, rows, h, kt * kTile, K, k_hat);
      __syncthreads();
#pragma unroll
      for (int j = 0; j < kGroup; ++j)
        if (j < group)
          warp_gemm<4, false, false>(acc[j], sKHat + kSub * s * LD, LD, sDS + j * kTile * LD + 32 * hc, LD, kTile);
      __syncthreads();
    }
    // dv through shared memory (R is free now), stored whole rows at a time.
    float* sDV = reinterpret_cast<float*>(R);  // kGroup fp32 tiles
#pragma unroll
    for (int j = 0; j < kGroup; ++j)
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 4; e += 2)
          store_pair(sDV + j * kTile * LDF + (kSub * s + acc_row(e)) * LDF + 32 * hc + acc_col(nt, e), acc[j][nt][e],
                     acc[j][nt][e + 1]);
    __syncthreads();
    for (int j = 0; j < group; ++j)
      store_tile<kBwdChunkThreads, kPlain>(p.dv, b, t0, rows, h, (vt0 + j) * kTile, V, sDV + j * kTile * LDF);
    __syncthreads();  // R is read by the stores above
  }
}

// Two adjacent gates (an 8- or 16-byte aligned pair) in one shared-memory load.
template <class GT>
struct GatePair {
  GT x, y;
};
template <class GT>
__device__ __forceinline__ GatePair<GT> gate_pair(const GT* at) {
  using Vec = std::conditional_t<std::is_same_v<GT, double>, double2, float2>;
  const Vec v = *reinterpret_cast<const Vec*>(at);
  return {v.x, v.y};
}

// ---- phase C: dq, dk, dg of one key tile (kt) -------------------------------------------------------------

// Through the states (the inter-chunk shares): dq ∝ dO S^T, dk^{(S)} ∝ V dS^T, over the value tiles, and
// rowsum(S ⊙ dS) to sStateTerm (dg's state term).
template <class T, class GT, bool kPlain>
__device__ __forceinline__ void chunk_bwd_dqk_inter(const BwdParams& p, int64_t b, int64_t t0, int64_t slot, int rows,
                                                    int h, int s, int hc, int kt, int V, float (&acc_q)[4][4],
                                                    float (&acc_k)[4][4]) {
  using Smem = ChunkSmem<T, GT>;
  constexpr int LD = kLd<T>;
  extern __shared__ __align__(16) unsigned char smem[];
  T* R = reinterpret_cast<T*>(smem + Smem::r);
  float* sStateTerm = reinterpret_cast<float*>(smem + Smem::state_term);
  zero(acc_q);
  zero(acc_k);
  {
    T* sDO = R;
    T* sV = R + kTile * LD;
    T* sS = R + 2 * kTile * LD;
    T* sDS = R + 3 * kTile * LD;
    float state_term = 0.f;
    for (int vt = 0; vt < p.value_tiles; ++vt) {
      __syncthreads();  // the stages (first tile) or the previous tiles are no longer read
      load_tile_async<T, kBwdChunkThreads, kPlain>(sDO, p.d_o, b, t0, rows, h, vt * kTile, V);
      load_tile_async<T, kBwdChunkThreads, kPlain>(sV, p.v, b, t0, rows, h, vt * kTile, V);
      copy_tile_in<T, kBwdChunkThreads>(sS, static_cast<const T*>(p.states) + state_tile_index(p, slot, h, kt, vt));
      copy_tile_in<T, kBwdChunkThreads>(sDS, static_cast<const T*>(p.dstates) + state_tile_index(p, slot, h, kt, vt));
      cp_async_commit_and_wait_all();
      __syncthreads();
      warp_gemm<4, false, true>(acc_q, sDO + kSub * s * LD, LD, sS + 32 * hc * LD, LD, kTile);
      warp_gemm<4, false, true>(acc_k, sV + kSub * s * LD, LD, sDS + 32 * hc * LD, LD, kTile);
      {  // four threads per key row, 16 value columns each
        const int key = threadIdx.x / 4, part = threadIdx.x % 4;
#pragma unroll
        for (int c = 0; c < 16; c += 2) {
          const T* x_at = sS + key * LD + 16 * part + c;
          const T* y_at = sDS + key * LD + 16 * part + c;
          // (pairs in one load in the plain kernel; the others spill with them)
          float2 x, y;
          if constexpr (kPlain) x = load2(x_at), y = load2(y_at);
          else x = {to_float(x_at[0]), to_float(x_at[1])}, y = {to_float(y_at[0]), to_float(y_at[1])};
          state_term += x.x * y.x;
          state_term += x.y * y.y;
        }
      }
    }
    state_term += __shfl_xor_sync(0xffffffffu, state_term, 1);
    state_term += __shfl_xor_sync(0xffffffffu, state_term, 2);
    if (threadIdx.x % 4 == 0) sStateTerm[threadIdx.x / 4] = state_term;
  }
}

// dq and dk of the key tile into fp32 tiles in R (sDQ, sDKA; dk^{(S)} in sDKS), from the products' accumulators
// (scaled, gated) and the diagonal blocks element by element; this sub-chunk's part of dg into within_sub and
// its sums into sTotA / sTotB. k_reg .. g_reg: per-lane rows of the kernel (see the top of this file).
template <class T, class GT>
__device__ __forceinline__ void chunk_bwd_dqk(const GT* gamma, int s, int hc, int col, float scale,
                                              float (&acc_q)[4][4], float (&acc_qa)[4][4], float (&acc_k)[4][4],
                                              float (&acc_ka)[4][4], float (&within_sub)[kSub],
                                              float (&k_reg)[kSub], float (&q_reg)[kSub], float (&dq_d)[kSub],
                                              float (&dk_d)[kSub], GT (&g_reg)[kSub]) {
  using Smem = ChunkSmem<T, GT>;
  constexpr int LD = kLd<T>;
  constexpr int LDF = kLdF;
  constexpr int LDD = Smem::kDiagLd;
  extern __shared__ __align__(16) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem + Smem::q);
  T* sK = reinterpret_cast<T*>(smem + Smem::k);
  float* sdAd = reinterpret_cast<float*>(smem + Smem::dA_diag);
  GT* sG = reinterpret_cast<GT*>(smem + Smem::gates);
  T* R = reinterpret_cast<T*>(smem + Smem::r);
  float* sTotA = reinterpret_cast<float*>(smem + Smem::totals);
  float* sTotB = sTotA + kSubs * kTile;
  float* sDQ = reinterpret_cast<float*>(R);  // dq without the diagonal block
  float* sDKS = sDQ + kTile * LDF;           // dk^{(S)}
  float* sDKA = sDKS + kTile * LDF;          // dk^{(A)} without the diagonal block
  // The stages' reference rows (between_key_ref, between_query_ref; sub-chunks 0 and 3 have none of one kind,
  // their accumulators hold 0); fp16: dS scaled by exp(−E). Two adjacent columns at a time (e, e + 1).
  const float* sNext = reinterpret_cast<const float*>(smem + Smem::next_gates);
  const int key_ref = s > 0 ? between_key_ref<T>(s) : 0;
  const int query_ref = s < kSubs - 1 ? between_query_ref<T>(s) : kChunk - 1;
#pragma unroll
  for (int nt = 0; nt < 4; ++nt)
#pragma unroll
    for (int e = 0; e < 4; e += 2) {
      const int i = kSub * s + acc_row(e), c = 32 * hc + acc_col(nt, e);  // c even
      const GatePair<GT> g = gate_pair(sG + i * LDF + c), gk = gate_pair(sG + key_ref * LDF + c),
                         gq = gate_pair(sG + query_ref * LDF + c), end = gate_pair(gamma + c);
      float2 next = {0.f, 0.f};
      if constexpr (kScaledDStates<T>) next = *reinterpret_cast<const float2*>(sNext + c);
      auto dks = [&](GT gamma_c, float next_c, GT g_i) {
        if constexpr (kScaledDStates<T>) return exp2_of(gamma_c + next_c - g_i);
        else return exp2_of(gamma_c - g_i);
      };
      store_pair(sDQ + i * LDF + c, scale * acc_q[nt][e] * exp2_of(g.x) + acc_qa[nt][e] * exp2_of(g.x - gk.x),
                 scale * acc_q[nt][e + 1] * exp2_of(g.y) + acc_qa[nt][e + 1] * exp2_of(g.y - gk.y));
      store_pair(sDKS + i * LDF + c, acc_k[nt][e] * dks(end.x, next.x, g.x),
                 acc_k[nt][e + 1] * dks(end.y, next.y, g.y));
      store_pair(sDKA + i * LDF + c, acc_ka[nt][e] * exp2_of(gq.x - g.x), acc_ka[nt][e + 1] * exp2_of(gq.y - g.y));
    }
  __syncwarp();

  // Inside the sub-chunk, element by element (lanes over columns), then the
  // outputs and this sub-chunk's part of dg: within_sub[i] = Σ_{i'>=i} a + Σ_{i'<i} b.
  {
#pragma unroll
    for (int i = 0; i < kSub; ++i) {
      k_reg[i] = to_float(sK[(kSub * s + i) * LD + col]);
      q_reg[i] = to_float(sQ[(kSub * s + i) * LD + col]);
      g_reg[i] = sG[(kSub * s + i) * LDF + col];
      dq_d[i] = dk_d[i] = 0.f;
    }
#pragma unroll
    for (int i = 1; i < kSub; ++i)
#pragma unroll
      for (int j = 0; j < i; ++j) {
        const float w = sdAd[(kSub * s + i) * LDD + j] * exp2_of(g_reg[i] - g_reg[j]);
        dq_d[i] += w * k_reg[j];
        dk_d[j] += w * q_reg[i];
      }
    // dq and dk replace dq' and dk^{(A)'} in shared memory (this thread's
    // elements) and are stored below, whole rows at a time.
    // a_i = q_i ⊙ dq'_i − k_i ⊙ dk^{(A)'}_i goes to dq_d[i], b_i = k_i ⊙ dk^{(S)}_i to dk_d[i].
#pragma unroll
    for (int i = 0; i < kSub; ++i) {
      const int row = kSub * s + i;
      const float dA_ii = sdAd[row * LDD + i];
      const float dq_x = sDQ[row * LDF + col] + dq_d[i];   // dq without the diagonal term
      const float dka_x = sDKA[row * LDF + col] + dk_d[i];  // dk^{(A)} without it
      const float dks = sDKS[row * LDF + col];
      sDQ[row * LDF + col] = dq_x + dA_ii * k_reg[i];
      sDKA[row * LDF + col] = dka_x + dks + dA_ii * q_reg[i];
      dq_d[i] = q_reg[i] * dq_x - k_reg[i] * dka_x;
      dk_d[i] = k_reg[i] * dks;
    }
    float suffix = 0.f, prefix = 0.f;
#pragma unroll
    for (int i = kSub - 1; i >= 0; --i) {
      suffix += dq_d[i];
      within_sub[i] = suffix;
    }
#pragma unroll
    for (int i = 0; i < kSub; ++i) {
      within_sub[i] += prefix;
      prefix += dk_d[i];
    }
    sTotA[s * kTile + col] = suffix;
    sTotB[s * kTile + col] = prefix;
  }
}

// dg of the key tile: within_sub plus the carry from the other sub-chunks and the state term, to sDKS (a vector
// gate's is stored by the kernel, a scalar gate's summed over the keys by chunk_bwd_dg_row_sums).
template <class T, class GT>
__device__ __forceinline__ void chunk_bwd_dg(const BwdParams& p, const GT* gamma, int kt, int col, int K,
                                             const float (&within_sub)[kSub]) {
  // The sub-chunk from the thread index here, as in the kernel, not passed: the compiler then bounds it (the
  // loops over the other sub-chunks).
  const int s = threadIdx.x / 32 / 2;
  using Smem = ChunkSmem<T, GT>;
  constexpr int LDF = kLdF;
  extern __shared__ __align__(16) unsigned char smem[];
  T* R = reinterpret_cast<T*>(smem + Smem::r);
  float* sDQ = reinterpret_cast<float*>(R);
  float* sDKS = sDQ + kTile * LDF;  // dk^{(S)} (chunk_bwd_dqk), then dg
  float* sTotA = reinterpret_cast<float*>(smem + Smem::totals);
  float* sTotB = sTotA + kSubs * kTile;
  float* sStateTerm = reinterpret_cast<float*>(smem + Smem::state_term);
  if (p.gate != GateKind::none) {
    float carry;
    if constexpr (kScaledDStates<T>)  // fp16: dS scaled by exp(−E)
      carry = exp2_of(gamma[col] + reinterpret_cast<const float*>(smem + Smem::next_gates)[col]) * sStateTerm[col];
    else
      carry = exp2_of(gamma[col]) * sStateTerm[col];
    for (int t = s + 1; t < kSubs; ++t) carry += sTotA[t * kTile + col];
    for (int t = 0; t < s; ++t) carry += sTotB[t * kTile + col];
    const int key = kt * kTile + col;
#pragma unroll
    for (int i = 0; i < kSub; ++i) {
      const int row = kSub * s + i;
      const float dg = within_sub[i] + carry;
      if (p.gate == GateKind::vector) sDKS[row * LDF + col] = dg;  // this thread's element; stored by the kernel
      else sDKS[row * LDF + col] = key < K ? dg : 0.f;              // summed by chunk_bwd_dg_row_sums
    }
  }
}

// A scalar gate's dg: the key tile's dg (sDKS, after chunk_bwd_dg and a barrier) summed over its columns into
// sRowSums, four threads per row, each over 16 columns, then over the four in a fixed order: deterministic, and
// without the shuffles and shared-memory atomics of a sum per row and warp (bench/notes_gla_bwd.md).
template <class T, class GT>
__device__ __forceinline__ void chunk_bwd_dg_row_sums() {
  static_assert(kBwdChunkThreads == 4 * kTile, "four threads per row");
  using Smem = ChunkSmem<T, GT>;
  constexpr int LDF = kLdF;
  extern __shared__ __align__(16) unsigned char smem[];
  const float* sDG = reinterpret_cast<const float*>(smem + Smem::r) + kTile * LDF;  // sDKS of chunk_bwd_dg
  float* sRowSums = reinterpret_cast<float*>(smem + Smem::row_sums);
  const int row = threadIdx.x / 4, part = threadIdx.x % 4;
  float sum = 0.f;
#pragma unroll
  for (int c = 0; c < kTile / 4; ++c) sum += sDG[row * LDF + part * (kTile / 4) + c];
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);
  sum += __shfl_xor_sync(0xffffffffu, sum, 2);
  if (part == 0) sRowSums[row] += sum;
}

}  // namespace
}  // namespace flashgla::cuda::gla
