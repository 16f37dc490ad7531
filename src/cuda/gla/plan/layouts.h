// Sizes the GLA CUDA kernels are built around (element types, tiles, shared-memory layouts), in plain
// C++: the kernels (.cu/.cuh) and the planner (plan.cpp, compiled in every build and unit-tested on the
// CPU) read the same definitions, so a plan made without a GPU uses the byte counts the kernels use.
#pragma once

#include <cstdint>

#include "core/gla_chunk.h"
#include "core/problem.h"

#ifdef __CUDACC__
#define FLASHGLA_HOST_DEVICE __host__ __device__
#else
#define FLASHGLA_HOST_DEVICE
#endif

namespace flashgla::cuda::gla {

// Element types a kernel can read. q, k, v (and o) share one of f32/bf16/f16;
// the gate may be any of the four.
enum class Elem : int8_t { f32, bf16, f16, f64 };

FLASHGLA_HOST_DEVICE inline int elem_size(Elem e) { return e == Elem::f64 ? 8 : e == Elem::f32 ? 4 : 2; }

// The gate kind of forward and backward alike: flashgla::GateKind (core/problem.h), as the argument checks
// resolve it.
using Gate = flashgla::GateKind;

// A Gate kept in one byte: the forward's parameter blocks (gla_fwd.cuh, gla_segment.cu) hold their gate so,
// which keeps their layout, and so the kernels' parameter offsets and loads, as they were before the forward
// and backward shared one gate type. It reads and assigns as a Gate.
struct GateByte {
  int8_t value = 0;
  GateByte() = default;
  FLASHGLA_HOST_DEVICE constexpr GateByte(Gate g) : value(static_cast<int8_t>(g)) {}
  FLASHGLA_HOST_DEVICE constexpr operator Gate() const { return static_cast<Gate>(value); }
};
static_assert(sizeof(GateByte) == 1 && alignof(GateByte) == 1, "one byte, as the forward's parameter blocks lay it out");

using flashgla::kChunk;                  // C: tokens per chunk (core/gla_chunk.h)
inline constexpr int kSlice = 32;        // key columns processed per step (K is looped in slices)
// Value columns per CTA: 64 for bf16/fp16; 32 for fp32, whose larger tiles
// would not leave room for the state of K = 512 in shared memory.
FLASHGLA_HOST_DEVICE constexpr int value_tile(Elem input) { return input == Elem::f32 ? 32 : 64; }

// ---- the general chunk kernel (gla_fwd_chunk.cu) ---------------------------------
inline constexpr int kChunkOffPairs = 6;                // off-diagonal sub-chunk blocks (i, j), i > j, of 4 sub-chunks
inline constexpr int kChunkAlphaPitch = kSlice + 4;     // floats per row of α

// Byte offsets of the chunk kernel's shared-memory regions (see gla_fwd_chunk.cu).
struct ChunkLayout {
  int state = 0, raw[2] = {0, 0}, raw_v = 0, alpha = 0, qg = 0, qoff = 0, koff = 0, kdt = 0, vt = 0;
  int totals = 0, decay = 0, split_decay = 0, scalar_alpha = 0;
  int bytes = 0;
  int state_pitch = 0;  // floats per row of the transposed state S^T[v][k]
};

inline ChunkLayout chunk_layout(Elem input, Elem gate, Gate gate_kind, int key_dim) {
  constexpr int C = kChunk, KS = kSlice;
  const int esize = elem_size(input);
  const int BV = value_tile(input);
  const int padding = esize == 2 ? 8 : 4;
  const int slice_pitch = KS + padding, chunk_pitch = C + padding;
  const int key_pad = (key_dim + KS - 1) / KS * KS;
  ChunkLayout L;
  int offset = 0;
  auto take = [&](int bytes) {
    const int at = offset;
    offset += (bytes + 15) / 16 * 16;
    return at;
  };
  // Key rows of S: the pitch keeps the fragment reads of O += Q S free of bank conflicts.
  L.state_pitch = BV + (esize == 2 ? 4 : 8);
  L.state = take(key_pad * L.state_pitch * 4);
  const int stage = 2 * C * KS * esize + (gate_kind == Gate::vector ? C * KS * elem_size(gate) : 0);
  L.raw[0] = take(stage);
  L.raw[1] = take(stage);
  L.raw_v = take(C * BV * esize);
  L.alpha = take(C * kChunkAlphaPitch * 4);
  L.qg = take(C * slice_pitch * esize);
  L.qoff = take(48 * slice_pitch * esize);
  L.koff = take(kChunkOffPairs * 16 * slice_pitch * esize);
  L.kdt = take(KS * chunk_pitch * esize);
  L.vt = take(BV * chunk_pitch * esize);
  L.totals = take(3 * 8 * KS * 4);
  L.decay = take(KS * 4);
  L.split_decay = take(key_pad * 4);
  L.scalar_alpha = take(C * 4);
  L.bytes = offset;
  // A (64 × chunk_pitch) is stored over the contiguous Qg, Qoff, Koff area.
  static_assert(64 * (64 + 8) * 2 <= (64 + 48 + 96) * (32 + 8) * 2, "A must fit over the slice operands");
  static_assert(64 * (64 + 4) * 4 <= (64 + 48 + 96) * (32 + 4) * 4, "A must fit over the slice operands");
  // The output tile is staged over α: 64 × (tile + padding) elements.
  static_assert(64 * (64 + 8) * 2 <= C * kChunkAlphaPitch * 4 && 64 * (32 + 4) * 4 <= C * kChunkAlphaPitch * 4,
                "the output tile must fit over alpha");
  return L;
}

// ---- the fast path (gla_fwd_fast.cuh) -------------------------------------------
// One CTA per SM; K ≤ 128; value tiles of fast_value_tile(V) columns. The states kernel (gla_fwd_states.cuh)
// shares the tiles and also takes 128 < K ≤ 256 for the segment summaries: fast_key_parts(K) key parts of up
// to 128 keys, each its own CTA.
inline int fast_value_tile(int value_dim) { return value_dim > 64 ? 128 : 64; }
inline int fast_key_parts(int key_dim) { return key_dim > 128 ? (key_dim + 127) / 128 : 1; }

inline constexpr int kFastTriangle = 36;  // entries of an 8×8 lower triangle with its diagonal

// Byte offsets of the fast kernel's shared-memory regions; tiles of 64 rows use a pitch of
// 8 extra elements so that ldmatrix rows fall in distinct banks.
template <int KP, int BV>
struct FastLayout {
  static constexpr int C = kChunk;
  static constexpr int P = KP + 8, PV = BV + 8, PA = C + 8;
  // The regions every fast kernel uses come first (the scalar-gate kernel's tables then sit at qo, and its
  // shared memory ends there: gla_fwd_fast_scalar.cuh).
  static constexpr int q = 0;                         // two buffers [64][P]: q, then q ⊙ exp Γ in place
  static constexpr int k = q + 2 * C * P * 2;         // two buffers [64][P]: k, then k ⊙ exp(γ^C − Γ) in place
  static constexpr int v = k + 2 * C * P * 2;         // two buffers [64][PV]
  static constexpr int s = v + 2 * C * PV * 2;        // bf16 state [KP][PV]
  static constexpr int a = s + KP * PV * 2;           // A [64][PA]
  static constexpr int qo = a + C * PA * 2;           // 96 rows: query side of the off-diagonal blocks
  static constexpr int ko = qo + 96 * P * 2;          // 96 rows: key side
  static constexpr int g = ko + 96 * P * 2;           // vector gate, [64][KP]
  static constexpr int totals = g + C * KP * 2;       // [8 groups][KP] float2: (Π of the group's α without its
                                                      // first row, α of its first row)
  static constexpr int diag = totals + 8 * KP * 8;    // [2 key halves][8 groups][36] partial triangles
  static constexpr int decay = diag + 2 * 8 * kFastTriangle * 4;  // [KP] exp(γ^C)
  static constexpr int bytes = decay + KP * 4;
};

inline int fast_chunk_smem_bytes(int key_dim, int value_dim) {
  const bool wide_keys = key_dim > 64, wide_values = value_dim > 64;
  if (wide_keys && wide_values) return FastLayout<128, 128>::bytes;
  if (wide_keys) return FastLayout<128, 64>::bytes;
  if (wide_values) return FastLayout<64, 128>::bytes;
  return FastLayout<64, 64>::bytes;
}

// ---- the split states kernel (gla_fwd_states.cuh) --------------------------------
// Shared memory of one stage: k (then K̂ in place), v and the vector gate, each row padded by 16 bytes (rows
// 8 apart share banks, no others: ldmatrix and the gate phase without bank conflicts); then the scalar gate of
// the current chunk. ES, GS: bytes of an input and of a gate element.
inline constexpr int kStateStages = 2;  // chunks of k, v, g in shared memory: one in flight while one is computed
inline constexpr int kStatesBlocksPerSm = 2;  // the kernel's launch bounds; the planner fills SMs up to them
template <int ES, int GS, int KP, int BV, Gate GK>
struct StatesLayoutBytes {
  static constexpr int C = kChunk;
  static constexpr int P = KP + 8, PV = BV + 8, PG = KP + 16 / GS;
  static constexpr int k = 0;
  static constexpr int v = k + C * P * ES;
  static constexpr int g = v + C * PV * ES;
  static constexpr int stage = g + (GK == Gate::vector ? C * PG * GS : 0);
  static constexpr int scalar_gate = kStateStages * stage;  // [64] floats
  static constexpr int bytes = scalar_gate + C * 4;
};

// Shared memory of the states kernel that bf16/fp16 inputs with this gate (kind and dtype) and K, V select
// (the same choice as its launcher, gla_fwd_states.cu); 0 where none applies.
template <int KP, int BV>
int split_states_smem_bytes_of(Elem gate_dtype, Gate gate) {
  switch (gate) {
    case Gate::vector:
      return gate_dtype == Elem::f32 ? StatesLayoutBytes<2, 4, KP, BV, Gate::vector>::bytes
                                     : StatesLayoutBytes<2, 2, KP, BV, Gate::vector>::bytes;
    case Gate::scalar: return StatesLayoutBytes<2, 2, KP, BV, Gate::scalar>::bytes;
    case Gate::none: return StatesLayoutBytes<2, 2, KP, BV, Gate::none>::bytes;
  }
  return 0;
}
inline int split_states_smem_bytes(Elem input, Elem gate_dtype, Gate gate, int key_dim, int value_dim) {
  if (input != Elem::bf16 && input != Elem::f16) return 0;
  const bool wide_keys = key_dim > 64, wide_values = value_dim > 64;
  if (wide_keys && wide_values) return split_states_smem_bytes_of<128, 128>(gate_dtype, gate);
  if (wide_keys) return split_states_smem_bytes_of<128, 64>(gate_dtype, gate);
  if (wide_values) return split_states_smem_bytes_of<64, 128>(gate_dtype, gate);
  return split_states_smem_bytes_of<64, 64>(gate_dtype, gate);
}

// ---- the Hopper path (gla_fwd_hopper.cuh) ----------------------------------------
// Two key pads, 128 and 256 (K ≤ 64 takes the Hopper path only when tuning forces it: padded to 128).
inline int hopper_key_pad(int key_dim) { return key_dim <= 128 ? 128 : 256; }

namespace hopper {
// Byte offsets inside one workspace slot of the chunk pass (one chunk of one head); every tile
// starts 1024-byte aligned, as the 128-byte swizzle needs.
struct Slot {
  int key_pad;
  FLASHGLA_HOST_DEVICE constexpr int kt() const { return 0; }
  FLASHGLA_HOST_DEVICE constexpr int decay() const { return key_pad * 128; }
  FLASHGLA_HOST_DEVICE constexpr int q() const { return decay() + 1024; }
  FLASHGLA_HOST_DEVICE constexpr int a() const { return q() + key_pad * 128; }
  FLASHGLA_HOST_DEVICE constexpr int bytes() const { return a() + kChunk * 128; }
};
}  // namespace hopper

// ---- the segment summaries' generic tile kernel (gla_segment.cu) -------------------
inline constexpr int kSegmentRows = 32;            // tokens per chunk
inline constexpr int kSegmentTile = 64;            // keys and values per CTA
inline constexpr int kSegmentMinPieceChunks = 16;  // a piece covers at least 512 tokens, so the fold stays cheap

// ---- the chunked backward's state scans (gla_bwd_states.cu) ----------------------
inline constexpr int kTile = 64;   // key / value columns per tile
inline constexpr int kTileElems = kTile * kTile;
inline constexpr int kSummaryFloats = kTileElems + kTile;  // one scan piece's summary: state tile and decay
// Default diag_factor_limit: operands scaled by factors within 2^±64, which
// bf16 and fp32 hold.
inline constexpr float kDiagFactorLimit = 64.f;
// Row pitch (elements) of a 64x64 work tile of TS-byte elements, and of the fp32/fp64 ones.
template <int TS>
inline constexpr int kLdOf = TS == 2 ? kTile + 8 : kTile + 4;
inline constexpr int kLdF = kTile + 4;  // fp32 and fp64 work tiles

// Shared memory of the state scans, TS/GTS: bytes of a tile element and of a gate element. kPair: the block
// covers two value tiles (see state_scan_kernel). kStages: 2 with the pipelined scan (x, y and the raw gate of
// the next chunk copied while this one computes), else 1 (the gate goes through registers).
template <int TS, int GTS, int kPair, int kStages = 1>
struct StateScanSmemBytes {
  static constexpr size_t tile = size_t(kTile) * kLdOf<TS> * TS;
  static constexpr size_t x = 0;                                  // x̂: scaled keys or queries, [token][key column]
  static constexpr size_t y = x + kStages * tile;                 // values or output gradients, [token][value column]
  static constexpr size_t stage = y + kStages * kPair * tile;     // the state tiles on their way to the scratch
  static constexpr size_t gates = stage + kPair * tile;           // Γ, [token][key column]
  // pipelined: a vector gate's bf16 rows, unpadded, or a scalar fp32 gate's 64 rows
  static constexpr size_t raw_gates = gates + size_t(kTile) * kLdF * GTS;
  static constexpr size_t bytes = raw_gates + (kStages > 1 ? size_t(kStages) * kTileElems * 2 : 0);
};

// ---- the backward's chunk kernel for a scalar gate or none (gla_bwd_chunk_scalar.cu) ----
// Every tile of one chunk in bf16, K and V (KP, VP) of 64 or 128, rows padded by 16 bytes.
template <int KP, int VP>
struct BwdScalarChunkLayout {
  static constexpr int warps = 16;
  static constexpr int C = kChunk;
  static constexpr int PK = KP + 8, PV = VP + 8, PA = C + 8;  // row pitches (elements)
  static constexpr int q = 0;                                 // [64][PK]
  static constexpr int k = q + C * PK * 2;                    // [64][PK]
  static constexpr int v = k + C * PK * 2;                    // [64][PV]
  static constexpr int d_o = v + C * PV * 2;                  // [64][PV]
  static constexpr int s = d_o + C * PV * 2;                  // S [KP][PV]
  static constexpr int ds = s + KP * PV * 2;                  // dS [KP][PV]
  static constexpr int a = ds + KP * PV * 2;                  // A [64][PA]
  static constexpr int da = a + C * PA * 2;                   // dA [64][PA]
  static constexpr int log_decay = da + C * PA * 2;           // [64] float2 (device/decay_tables.cuh)
  static constexpr int weights = log_decay + C * 8;           // [64] float2
  static constexpr int m_rows = weights + C * 8;              // [4 column blocks][64] Σ_j M_ij
  static constexpr int m_cols = m_rows + 4 * C * 4;           // [4 row blocks][64] Σ_i M_ij
  static constexpr int qd = m_cols + 4 * C * 4;               // [4 column groups][64] q_i·dq_i^(S)
  static constexpr int kd = qd + 4 * C * 4;                   // [4 column groups][64] k_j·dk_j^(S)
  static constexpr int state_term = kd + 4 * C * 4;           // [warps] ⟨S, dS⟩
  static constexpr int bytes = state_term + warps * 4;
  // The folded normaliser (chunk_linear_attn(normalize=True)) adds the forward's normalised o, 1/den_t and
  // d den_t per row, and z at the chunk's start.
  static constexpr int o = (bytes + 15) / 16 * 16;        // [64][PV]
  static constexpr int norm_rows = o + C * PV * 2;        // [2][64] float: 1/den_t, then d den_t
  static constexpr int norm_z = norm_rows + 2 * C * 4;    // [KP] float
  static constexpr int norm_bytes = norm_z + KP * 4;
};

// Whether the scalar chunk kernel takes K × V, and its shared memory there (norm: with the folded normaliser).
inline bool bwd_scalar_chunk_shape(int key_dim, int value_dim) {
  return (key_dim == 64 || key_dim == 128) && (value_dim == 64 || value_dim == 128);
}
// Resident blocks per SM (its launch bounds): two at K = V = 64, where two blocks' tiles fit in shared memory (each
// block's loads and barriers then hide behind the other's work), one at the wider shapes.
constexpr int bwd_scalar_chunk_blocks_per_sm(int key_dim, int value_dim) {
  return key_dim <= 64 && value_dim <= 64 ? 2 : 1;
}
template <int KP, int VP>
constexpr int bwd_scalar_chunk_smem_bytes_of(bool norm) {
  return norm ? BwdScalarChunkLayout<KP, VP>::norm_bytes : BwdScalarChunkLayout<KP, VP>::bytes;
}
inline int bwd_scalar_chunk_smem_bytes(int key_dim, int value_dim, bool norm = false) {
  const bool wide_keys = key_dim > 64, wide_values = value_dim > 64;
  if (wide_keys && wide_values) return bwd_scalar_chunk_smem_bytes_of<128, 128>(norm);
  if (wide_keys) return bwd_scalar_chunk_smem_bytes_of<128, 64>(norm);
  if (wide_values) return bwd_scalar_chunk_smem_bytes_of<64, 128>(norm);
  return bwd_scalar_chunk_smem_bytes_of<64, 64>(norm);
}

// Resident state-scan blocks per SM of one tile (the launch bounds): TS-byte compute elements.
template <int TS>
inline constexpr int kScanBlocksPerSmOf = TS == 2 ? 4 : 2;

}  // namespace flashgla::cuda::gla
