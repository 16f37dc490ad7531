// Step 2 of the chunked GLA backward: everything of one chunk of 64 tokens.
//
// One block per (chunk, head); 8 warps, warp w serves sub-chunk s = w / 2 (16
// tokens) and half hc = w % 2 of the 64 columns of a tile. With Γ the
// chunk-local gate cumsum, γ its last row, S the state before the chunk and dS
// the gradient of the state after it (both from gla_bwd_states.cu):
//
//   dA = scale (dO V^T) ⊙ M                                  (phase A, over value tiles)
//   A  = scale Σ_k q_ik k_jk exp(Γ_ik − Γ_jk), j <= i        (phase A, over key tiles)
//   dv = A^T dO + (K ⊙ exp(γ − Γ)) dS                        (phase B)
//   dq = scale (dO S^T) ⊙ exp Γ + Σ_j dA_ij k_j exp(Γ_i − Γ_j)          (phase C)
//   dk = (V dS^T) ⊙ exp(γ − Γ) + Σ_i dA_ij q_i exp(Γ_i − Γ_j)
//
// The sums over token pairs use secondary 16-token sub-chunks: a pair of
// different sub-chunks goes through a (tensor-core) product of operands scaled
// against a reference row between the two (the first row of the later
// sub-chunk for A and dq, the last row of the earlier one for dk), so every
// exponent is <= 0; a pair inside one sub-chunk is summed element by element
// in fp32 with its own exponent (for A, only where the sub-chunk's gates span
// too much for the products: see mark_wide_subchunks).
//
// dg, chunk-local (seed 002, step 7), written so that nothing cancels: the
// diagonal terms i = j contribute equally to q ⊙ dq and k ⊙ dk and are left
// out, and the state term's Σ_r k_r ⊙ dk_r^{(S)} is split at t. For row t:
//   dg_t = Σ_{s>=t} (q_s ⊙ dq'_s − k_s ⊙ dk^{(A)'}_s) + Σ_{s<t} k_s ⊙ dk^{(S)}_s
//          + exp(γ) ⊙ rowsum(S ⊙ dS)
// with ' = without the diagonal term, dk^{(A)} the intra-chunk part of dk and
// dk^{(S)} the part through dS. Every term then carries the decay of the gates
// it differentiates, so gates of −20 per step give tiny, accurate dg.
#include "cuda/common/host.cuh"
#include "cuda/gla/gla_bwd_device.cuh"

namespace flashgla::cuda::gla_bwd {
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
  static_assert(kChunkThreads == kSubs * kTile, "one thread per (sub-chunk, column)");
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
  static_assert(size_t(kTile) * kLdF * sizeof(GT) >= size_t(kTileElems) * sizeof(bf16),
                "the gates' buffer holds a raw bf16 gate tile (start_gate_tile)");
  static_assert(gates % 16 == 0, "cp.async into the gates' buffer");
  static constexpr size_t totals = r + r_bytes;                // dg: per sub-chunk sums, 2 x [4][64]
  static constexpr size_t state_term = totals + 2 * kSubs * kTile * sizeof(float);  // [64]
  static constexpr size_t row_sums = state_term + kTile * sizeof(float);           // [64], scalar gate
  static constexpr size_t wide = row_sums + kTile * sizeof(float);                 // [8] warps' flags
  static constexpr size_t bytes = wide + 8 * sizeof(int);
};

// The rows of the diagonal block whose A entries warp half hc computes: an
// interleaving that gives both halves 68 of the 136 pairs j <= i.
__device__ __forceinline__ int diagonal_row(int hc, int m) {
  return 4 * (m >> 1) + (hc == 0 ? ((m & 1) ? 3 : 0) : ((m & 1) ? 2 : 1));
}

// The gate tile of key columns c0.. as Γ in sG, in two steps around the
// caller's cp_async_commit_and_wait_all(): with kPlain and a vector gate (bf16 rows, as
// its dg), its rows are copied asynchronously into sG itself, with the other
// tiles, then read back and summed; else (or with p.gate_in_registers) loaded
// into registers (load_gate_tile). Waiting on the register loads of the gate
// was the largest single stall of the general kernel in a profile
// (bench/notes_gla_bwd.md); the copies cost one more barrier.
// sG must be free (no reader left) when start_gate_tile is called.
template <class GT, bool kPlain>
__device__ __forceinline__ GateTile<GT, kChunkThreads> start_gate_tile(const Params& p, GT* sG, int64_t b, int64_t t0,
                                                                       int rows, int64_t h, int c0) {
  if (kPlain && p.gate == GateKind::vector && !p.gate_in_registers) {
    constexpr int kPieces = kTile * sizeof(bf16) / 16;  // 16-byte pieces per row
    const bf16* src = static_cast<const bf16*>(p.g.data) + offset4(p.g, b, t0, h, c0);
    bf16* raw = reinterpret_cast<bf16*>(sG);
    for_each_item<kChunkThreads, kTile * kPieces>([&](int idx) {
      const int r = idx / kPieces, c = idx % kPieces * 8;  // rows past `rows`: zero, a flat Γ
      cp_async16_ordered(raw + r * kTile + c, r < rows ? src + (r * int(p.g.stride[1]) + c) : src, r < rows ? 16 : 0);
    });
    return {};
  }
  return load_gate_tile<GT, kChunkThreads, kPlain>(p, b, t0, rows, h, c0);
}

template <class GT, bool kPlain>
__device__ __forceinline__ void finish_gate_tile(const Params& p, GT* sG, GateTile<GT, kChunkThreads>& gate) {
  if (kPlain && p.gate == GateKind::vector && !p.gate_in_registers) {
    __syncthreads();  // every thread's copies have landed
    using Tile = GateTile<GT, kChunkThreads>;
    const int c = threadIdx.x % kTile, first = (threadIdx.x / kTile) * Tile::kRows;
    const bf16* raw = reinterpret_cast<const bf16*>(sG);
#pragma unroll
    for (int i = 0; i < Tile::kRows; ++i) gate.x[i] = gate_value<GT>(raw[(first + i) * kTile + c]);
  }
  store_gate_cumsum<GT, kChunkThreads>(sG, gate);  // its first barrier ends the reads above
}

// kPlain (bf16 only): every tile of q, k, v, dO and of the outputs is whole
// aligned 16-byte rows of bf16 (see plain_layout), so the kernel holds only the
// asynchronous copies and vector stores, none of the converting or
// element-wise fallbacks: half the code, fewer instruction-cache misses (a
// large share of the general kernel's stalls in a profile: bench/notes_gla_bwd.md).
template <class T, class GT, bool kPlain>
__global__ void __launch_bounds__(kChunkThreads, 2) chunk_kernel(const Params p) {
  using Smem = ChunkSmem<T, GT>;
  constexpr int LD = kLd<T>;
  constexpr int LDF = kLdF;
  extern __shared__ __align__(16) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem + Smem::q);
  T* sK = reinterpret_cast<T*>(smem + Smem::k);
  T* sdA = reinterpret_cast<T*>(smem + Smem::dA);
  float* sdAd = reinterpret_cast<float*>(smem + Smem::dA_diag);
  constexpr int LDD = Smem::kDiagLd;
  GT* sG = reinterpret_cast<GT*>(smem + Smem::gates);
  T* R = reinterpret_cast<T*>(smem + Smem::r);
  T* sA = sQ;  // A, from the end of phase A through phase B (q is reloaded in phase C)
  float* sTotA = reinterpret_cast<float*>(smem + Smem::totals);
  float* sTotB = sTotA + kSubs * kTile;
  float* sStateTerm = reinterpret_cast<float*>(smem + Smem::state_term);
  float* sRowSums = reinterpret_cast<float*>(smem + Smem::row_sums);
  int* sWide = reinterpret_cast<int*>(smem + Smem::wide);

  Seq seq;
  int64_t chunk;
  if (!locate_chunk(p, blockIdx.x, seq, chunk)) return;
  const int h = blockIdx.y;
  const int64_t b = seq.batch, t0 = seq.begin + chunk * kChunk, slot = seq.slot0 + chunk;
  const int rows = int(seq.len - chunk * kChunk < kChunk ? seq.len - chunk * kChunk : kChunk);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int s = warp / 2, hc = warp % 2;  // sub-chunk, column half
  const int K = p.key_dim, V = p.value_dim;
  const float scale = p.scale;
  const GT* gamma = sG + (kChunk - 1) * LDF;  // γ: the last row of Γ

  // ---- phase A: dA --------------------------------------------------------------
  // Warp (s, hc) computes the 16x16 blocks (s, J) for J = hc, hc + 2 with J <= s.
  {
    float acc[2][2][4];
    zero(acc[0]);
    zero(acc[1]);
    T* sDO = R;
    T* sV = R + kTile * LD;
    for (int vt = 0; vt < p.value_tiles; ++vt) {
      load_tile_async<T, kChunkThreads, kPlain>(sDO, p.d_o, b, t0, rows, h, vt * kTile, V);
      load_tile_async<T, kChunkThreads, kPlain>(sV, p.v, b, t0, rows, h, vt * kTile, V);
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

  // ---- phase A: A ---------------------------------------------------------------
  // Off-diagonal blocks (s, J), J = hc, hc + 2 < s, on the products; the
  // diagonal block (s, s) too for key tiles where sub-chunk s is factored,
  // else element by element, rows diagonal_row(hc, 0..7).
  {
    float acc[2][2][4];
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
      auto gate = start_gate_tile<GT, kPlain>(p, sG, b, t0, rows, h, kt * kTile);
      load_tile_async<T, kChunkThreads, kPlain>(sQ, p.q, b, t0, rows, h, kt * kTile, K);
      load_tile_async<T, kChunkThreads, kPlain>(sK, p.k, b, t0, rows, h, kt * kTile, K);
      cp_async_commit_and_wait_all();
      finish_gate_tile<GT, kPlain>(p, sG, gate);
      mark_wide_subchunks(sG, sWide, p.diag_factor_limit);
      map_rows<T, kChunkThreads, kStageRows, kPlain>(sKStage, sK, key_stage_key, [&](int row, int col, float x) {
        return x * exp2_of(sG[kSub * key_stage_sub(row) * LDF + col] - sG[key_stage_key(row) * LDF + col]);
      });
      map_rows<T, kChunkThreads, kChunk, kPlain>(sQHat, sQ, [](int r) { return r; }, [&](int i, int col, float x) {
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
        float k_reg[kSub];
        GT g_reg[kSub];
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
          float part[kSub];
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
  __syncthreads();

  // Everything below reads the scans' states or writes outputs.
  wait_for_previous_grid();

  // ---- phase B: dv ----------------------------------------------------------------
  // Warp (s, hc): rows of sub-chunk s, value columns 32 hc.. of each value tile;
  // kGroup value tiles at a time, so that k̂ = k ⊙ exp(γ − Γ) is built once per group.
  {
    constexpr int kGroup = Smem::kValueGroup;
    T* sDO = R;                          // kGroup tiles
    T* sKHat = R + kGroup * kTile * LD;
    T* sDS = sKHat + kTile * LD;         // kGroup tiles
    for (int vt0 = 0; vt0 < p.value_tiles; vt0 += kGroup) {
      const int group = p.value_tiles - vt0 < kGroup ? p.value_tiles - vt0 : kGroup;
      for (int j = 0; j < group; ++j)
        load_tile_async<T, kChunkThreads, kPlain>(sDO + j * kTile * LD, p.d_o, b, t0, rows, h, (vt0 + j) * kTile, V);
      cp_async_commit_and_wait_all();
      __syncthreads();
      float acc[kGroup][4][4];
#pragma unroll
      for (int j = 0; j < kGroup; ++j) {
        zero(acc[j]);
        // A^T dO: rows j of sub-chunk s take rows i >= 16 s (A is zero above the diagonal).
        if (j < group)
          warp_gemm<4, true, false>(acc[j], sA + kSub * s * LD + kSub * s, LD,
                                    sDO + j * kTile * LD + kSub * s * LD + 32 * hc, LD, kChunk - kSub * s);
      }
      for (int kt = 0; kt < p.key_tiles; ++kt) {
        auto gate = start_gate_tile<GT, kPlain>(p, sG, b, t0, rows, h, kt * kTile);
        const bool k_plain = kPlain || plain_tile<T>(p.k, b, t0, h, kt * kTile, K);  // else loaded scaled, below
        if (k_plain) load_tile_async<T, kChunkThreads, kPlain>(sKHat, p.k, b, t0, rows, h, kt * kTile, K);
        for (int j = 0; j < group; ++j)
          copy_tile_in<T, kChunkThreads>(sDS + j * kTile * LD,
                                         static_cast<const T*>(p.dstates) + state_tile_index(p, slot, h, kt, vt0 + j));
        cp_async_commit_and_wait_all();
        finish_gate_tile<GT, kPlain>(p, sG, gate);
        auto k_hat = [=](int r, int col, float x) { return x * exp2_of(gamma[col] - sG[r * LDF + col]); };
        if (k_plain) transform_tile<T, kChunkThreads, kPlain>(sKHat, k_hat);
        else load_tile<T, kChunkThreads>(sKHat, p.k, b, t0, rows, h, kt * kTile, K, k_hat);
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
        store_tile<kChunkThreads, kPlain>(p.dv, b, t0, rows, h, (vt0 + j) * kTile, V, sDV + j * kTile * LDF);
      __syncthreads();  // R is read by the stores above
    }
  }

  // ---- phase C: dq, dk, dg, one key tile at a time ------------------------------------
  if (threadIdx.x < kTile) sRowSums[threadIdx.x] = 0.f;
  for (int kt = 0; kt < p.key_tiles; ++kt) {
    const int col = 32 * hc + lane;  // this lane's column in the element-wise steps
    auto gate = start_gate_tile<GT, kPlain>(p, sG, b, t0, rows, h, kt * kTile);
    load_tile_async<T, kChunkThreads, kPlain>(sQ, p.q, b, t0, rows, h, kt * kTile, K);
    load_tile_async<T, kChunkThreads, kPlain>(sK, p.k, b, t0, rows, h, kt * kTile, K);
    cp_async_commit_and_wait_all();
    finish_gate_tile<GT, kPlain>(p, sG, gate);

    // Between sub-chunks, on the products (accumulators kept until the epilogue):
    //   dq_I += (dA_{I,<I} K̃) ⊙ exp(Γ_I − Γ_{16I}),  dk_J = (dA_{>J,J}^T Q̃) ⊙ exp(Γ_{16J+15} − Γ_J).
    float acc_qa[4][4], acc_ka[4][4];
    zero(acc_qa);
    zero(acc_ka);
    {
      T* sKStage = R;
      T* sQStage = R + kBetweenRows * LD;
      map_rows<T, kChunkThreads, kBetweenRows, kPlain>(sKStage, sK, between_key_key, [&](int row, int c, float x) {
        return x * exp2_of(sG[kSub * between_key_sub(row) * LDF + c] - sG[between_key_key(row) * LDF + c]);
      });
      map_rows<T, kChunkThreads, kBetweenRows, kPlain>(sQStage, sQ, between_query_query, [&](int row, int c, float x) {
        const int i = between_query_query(row), ref = kSub * between_query_sub(row) + kSub - 1;
        return x * exp2_of(sG[i * LDF + c] - sG[ref * LDF + c]);
      });
      __syncthreads();
      const int keys = kSub * s;         // dq: keys j < keys
      const int first = kSub * (s + 1);  // dk: queries i >= first
      if (keys > 0)
        warp_gemm<4, false, false>(acc_qa, sdA + kSub * s * LD, LD, sKStage + between_key_row(s) * LD + 32 * hc, LD,
                                   keys);
      if (first < kChunk)
        warp_gemm<4, true, false>(acc_ka, sdA + first * LD + kSub * s, LD,
                                  sQStage + between_query_row(s) * LD + 32 * hc, LD, kChunk - first);
    }

    // Through the states: dq ∝ dO S^T, dk^{(S)} ∝ V dS^T, and rowsum(S ⊙ dS).
    float acc_q[4][4], acc_k[4][4];
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
        load_tile_async<T, kChunkThreads, kPlain>(sDO, p.d_o, b, t0, rows, h, vt * kTile, V);
        load_tile_async<T, kChunkThreads, kPlain>(sV, p.v, b, t0, rows, h, vt * kTile, V);
        copy_tile_in<T, kChunkThreads>(sS, static_cast<const T*>(p.states) + state_tile_index(p, slot, h, kt, vt));
        copy_tile_in<T, kChunkThreads>(sDS, static_cast<const T*>(p.dstates) + state_tile_index(p, slot, h, kt, vt));
        cp_async_commit_and_wait_all();
        __syncthreads();
        warp_gemm<4, false, true>(acc_q, sDO + kSub * s * LD, LD, sS + 32 * hc * LD, LD, kTile);
        warp_gemm<4, false, true>(acc_k, sV + kSub * s * LD, LD, sDS + 32 * hc * LD, LD, kTile);
        {  // four threads per key row, 16 value columns each
          const int key = threadIdx.x / 4, part = threadIdx.x % 4;
#pragma unroll
          for (int c = 0; c < 16; ++c)
            state_term += to_float(sS[key * LD + 16 * part + c]) * to_float(sDS[key * LD + 16 * part + c]);
        }
      }
      state_term += __shfl_xor_sync(0xffffffffu, state_term, 1);
      state_term += __shfl_xor_sync(0xffffffffu, state_term, 2);
      if (threadIdx.x % 4 == 0) sStateTerm[threadIdx.x / 4] = state_term;
    }
    __syncthreads();  // R is free for the fp32 results

    // Epilogue of the products, scaled, into fp32 arrays that the element-wise
    // step reads with lanes over columns.
    float* sDQ = reinterpret_cast<float*>(R);  // dq without the diagonal block
    float* sDKS = sDQ + kTile * LDF;           // dk^{(S)}
    float* sDKA = sDKS + kTile * LDF;          // dk^{(A)} without the diagonal block
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = kSub * s + acc_row(e), c = 32 * hc + acc_col(nt, e);
        const GT g = sG[i * LDF + c];
        sDQ[i * LDF + c] = scale * acc_q[nt][e] * exp2_of(g) + acc_qa[nt][e] * exp2_of(g - sG[kSub * s * LDF + c]);
        sDKS[i * LDF + c] = acc_k[nt][e] * exp2_of(gamma[c] - g);
        sDKA[i * LDF + c] = acc_ka[nt][e] * exp2_of(sG[(kSub * s + kSub - 1) * LDF + c] - g);
      }
    __syncwarp();

    // Inside the sub-chunk, element by element (lanes over columns), then the
    // outputs and this sub-chunk's part of dg: within_sub[i] = Σ_{i'>=i} a + Σ_{i'<i} b.
    float within_sub[kSub];
    {
      float k_reg[kSub], q_reg[kSub], dq_d[kSub], dk_d[kSub];
      GT g_reg[kSub];
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
    __syncthreads();

    if (p.gate != GateKind::none) {
      float carry = exp2_of(gamma[col]) * sStateTerm[col];
      for (int t = s + 1; t < kSubs; ++t) carry += sTotA[t * kTile + col];
      for (int t = 0; t < s; ++t) carry += sTotB[t * kTile + col];
      const int key = kt * kTile + col;
#pragma unroll
      for (int i = 0; i < kSub; ++i) {
        const int row = kSub * s + i;
        const float dg = within_sub[i] + carry;
        if (p.gate == GateKind::vector) {
          sDKS[row * LDF + col] = dg;  // this thread's element; stored below
        } else {
          float sum = key < K ? dg : 0.f;
#pragma unroll
          for (int offset = 16; offset >= 1; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
          if (lane == 0) atomicAdd(&sRowSums[row], sum);
        }
      }
    }
    __syncthreads();
    store_tile<kChunkThreads, kPlain>(p.dq, b, t0, rows, h, kt * kTile, K, sDQ);
    store_tile<kChunkThreads, kPlain>(p.dk, b, t0, rows, h, kt * kTile, K, sDKA);
    if (p.gate == GateKind::vector) store_tile<kChunkThreads, kPlain>(p.dg, b, t0, rows, h, kt * kTile, K, sDKS);
    __syncthreads();  // R is read by the stores above
  }

  if (p.gate == GateKind::scalar && threadIdx.x < rows)
    store_as(p.dg.data, offset4(p.dg, b, t0 + threadIdx.x, h, 0), p.dg.dtype, sRowSums[threadIdx.x]);
}

// The layout of chunk_kernel<bf16, float, true>: q, k, v, dO, dq, dk, dv and a
// vector gate and its dg all in bf16 rows (dg in bf16 implies g in bf16); a
// scalar gate in bf16 (its loader is the only one compiled there).
bool plain_layout(const Params& p) {
  const int K = p.key_dim, V = p.value_dim;
  return bf16_rows(p.q, K) && bf16_rows(p.k, K) && bf16_rows(p.v, V) && bf16_rows(p.d_o, V) && bf16_rows(p.dq, K) &&
         bf16_rows(p.dk, K) && bf16_rows(p.dv, V) && (p.gate == GateKind::none || p.g.dtype == DType::bf16) &&
         (p.gate != GateKind::vector || (bf16_rows(p.g, K) && bf16_rows(p.dg, K)));
}

template <class T, class GT, bool kPlain>
void launch(const Params& p, bool overlap_scans, cudaStream_t stream) {
  const size_t smem = ChunkSmem<T, GT>::bytes;
  auto kernel = chunk_kernel<T, GT, kPlain>;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
             "cudaFuncSetAttribute (GLA backward chunk kernel)");
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(unsigned(p.num_slots), unsigned(p.heads));
  config.blockDim = dim3(kChunkThreads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute overlap;
  overlap.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  overlap.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &overlap;
  config.numAttrs = overlap_scans ? 1 : 0;
  check_cuda(cudaLaunchKernelEx(&config, kernel, p), "GLA backward chunk kernel launch");
}

}  // namespace

bool bf16_rows(const Tensor& t, int D) {
  constexpr int kVec = 8;
  return t.dtype == DType::bf16 && t.stride[3] == 1 && D % kTile == 0 && t.stride[0] % kVec == 0 &&
         t.stride[1] % kVec == 0 && t.stride[2] % kVec == 0 && reinterpret_cast<uintptr_t>(t.data) % 16 == 0 &&
         t.stride[1] < (int64_t(1) << 31) / kChunk;
}

size_t chunk_smem_bytes(Compute c) {
  return c == Compute::f32 ? ChunkSmem<float, double>::bytes : ChunkSmem<bf16, float>::bytes;
}

void launch_chunk(const Params& p, Compute c, bool overlap_scans, cudaStream_t stream) {
  if (c == Compute::f32) launch<float, double, false>(p, overlap_scans, stream);
  else if (p.general_layout || !plain_layout(p)) launch<bf16, float, false>(p, overlap_scans, stream);
  else launch<bf16, float, true>(p, overlap_scans, stream);
}

}  // namespace flashgla::cuda::gla_bwd
