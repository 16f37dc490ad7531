// The state scans of the chunked GLA backward (docs/algorithm.md steps 2 and 6):
// the chunk-boundary states, recomputed, and their gradients.
//
// One block per (sequence, head, 64x64 tile of the K x V state) walks the
// sequence's chunks in order and keeps its tile in registers (warp w owns key
// rows 16 (w % 4).. and value columns 32 (w / 4)..; 8 warps, so that the
// element-wise work of each step is spread thin; paired scans, for an even
// V / 64: 16 warps and two value tiles per block). blockIdx.z picks the scan:
//   z = 0, forward:  stores S before chunk c, then
//                    S <- diag(exp γ) S + (K ⊙ exp(γ − Γ))^T V
//   z = 1, backward: from dS = dht, stores dS after chunk c (last chunk first), then
//                    dS <- diag(exp γ) dS + scale (Q ⊙ exp Γ)^T dO
//                    and writes dh0 = dS before the first chunk.
// Γ is the chunk-local gate cumsum and γ its last row: every exponent is <= 0.
// fp16 (kScaledDStates, gate_tile.cuh): the backward scan takes Γ_0 (its first
// row) out of the operand, dS <- exp Γ_0 (diag(exp(γ − Γ_0)) dS + scale
// (Q ⊙ exp(Γ − Γ_0))^T dO), so that the nearest row's weight is 1, not e^g_0
// (below fp16's range for gates of −20), and stores dS exp(−E) (the decays it
// records for the fold too).
//
// Sequence split (p.scan_splits > 1): blockIdx.y also picks a piece of
// p.chunks_per_split chunks. The piece that comes first in its scan's order
// starts from h0 / dht, the others from zero; each piece records, for every
// state it stores, the decay (log2, per key row) accumulated since its start,
// and at its end its last state and total decay (the summary). fold_kernel
// then walks the summaries of the earlier pieces in scan order to get each
// piece's true start state X and adds diag(exp2 D) X to the piece's stored
// states; the backward scan's fold also yields dh0. Exact in real arithmetic:
// the scan is linear in its start state.
#include "cuda/common/host.cuh"
#include "cuda/gla/device/elements.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/gla/device/chunk_slots.cuh"
#include "cuda/gla/device/gate_tile.cuh"
#include "cuda/gla/device/tiles.cuh"
#include "cuda/gla/device/warp_mma.cuh"
#include "cuda/gla/device/gla_bwd.cuh"
#include "cuda/gla/stages/chunk_bwd_states.cuh"

namespace flashgla::cuda::gla {
namespace {

// The shared-memory layout (cuda/gla/plan/layouts.h, StateScanSmemBytes: the planner reads the same bytes).
// kPair: the block covers two value tiles (see state_scan_kernel). kStages: 2 with the pipelined scan (x, y
// and the raw gate of the next chunk copied while this one computes), else 1 (the gate goes through registers).
template <class T, class GT, int kPair, int kStages = 1>
using StateScanSmem = StateScanSmemBytes<int(sizeof(T)), int(sizeof(GT)), kPair, kStages>;

template <class T>
inline constexpr int kScanBlocksPerSm = kScanBlocksPerSmOf<int(sizeof(T))>;

__device__ __forceinline__ void store8(float* at, const float (&x)[8]) {
  reinterpret_cast<float4*>(at)[0] = {x[0], x[1], x[2], x[3]};
  reinterpret_cast<float4*>(at)[1] = {x[4], x[5], x[6], x[7]};
}
__device__ __forceinline__ void store8(bf16* at, const float (&x)[8]) {
  *reinterpret_cast<uint4*>(at) = {pack_bf16(x[0], x[1]), pack_bf16(x[2], x[3]), pack_bf16(x[4], x[5]),
                                   pack_bf16(x[6], x[7])};
}
__device__ __forceinline__ void store8(__half* at, const float (&x)[8]) {
  *reinterpret_cast<uint4*>(at) = {pack_f16(x[0], x[1]), pack_f16(x[2], x[3]), pack_f16(x[4], x[5]),
                                   pack_f16(x[6], x[7])};
}

// kPair = 2 (an even number of value tiles): one block of 16 warps covers two
// value tiles of a key tile, warps 8.. the second, so that x, the gate and its
// cumsum are loaded and transformed once for both; same registers per thread
// and threads per SM as two blocks of one tile.
// kPipeline = 2 (bf16, kPair = 2, whole bf16 rows: BwdScanKernel::pipelined):
// two buffers of x, y and the gate's raw rows (a vector gate's bf16, a scalar
// gate's fp32; other gates go through registers); chunk i + 1's copies are
// issued at the top of step i and waited on at its end, so that they fly while
// step i computes (else each step waits on its loads right after issuing them),
// with per-thread copy pointers and a 16-byte x̂ transform. (kPipeline = 1, a
// first pipelined variant with more instructions per step, was never faster
// and is retired: bench/notes_gla_bwd.md.)
template <class T, class GT, int kPair, int kPipeline>
__global__ void __launch_bounds__(kBwdStateThreads * kPair, kScanBlocksPerSm<T> / kPair)
    state_scan_kernel(const BwdParams p) {
  static_assert(kPipeline == 0 || kPipeline == 2, "no pipeline, or the lean one");
  constexpr bool kPipelined = kPipeline > 0, kLean = kPipeline == 2;
  constexpr int kStages = kPipelined ? 2 : 1;
  using Smem = StateScanSmem<T, GT, kPair, kStages>;
  constexpr int LD = kLd<T>;
  constexpr int kThreads = kBwdStateThreads * kPair;
  constexpr int kTileLd = kTile * LD;  // elements from one value tile's y or stage to the next
  extern __shared__ __align__(16) unsigned char smem[];
  T* const sX0 = reinterpret_cast<T*>(smem + Smem::x);
  T* const sY0 = reinterpret_cast<T*>(smem + Smem::y);
  T* sStage = reinterpret_cast<T*>(smem + Smem::stage);
  GT* sG = reinterpret_cast<GT*>(smem + Smem::gates);
  bf16* const sRawGates = reinterpret_cast<bf16*>(smem + Smem::raw_gates);
  float* const sRawScalars = reinterpret_cast<float*>(smem + Smem::raw_gates);  // a scalar fp32 gate's 64 rows

  allow_dependent_launch();  // the chunk kernel's blocks may take the slots that retiring blocks free
  const bool backward = blockIdx.z == 1;
  const int64_t n = blockIdx.x / p.heads;
  const int h = int(blockIdx.x % p.heads);
  const int tiles = p.key_tiles * p.value_tiles;
  const int groups = tiles / kPair;  // blocks per (sequence, head, piece)
  const int group = int(blockIdx.y) % groups, split = int(blockIdx.y) / groups;
  const int kt = group / (p.value_tiles / kPair), vt0 = group % (p.value_tiles / kPair) * kPair;
  const int warp = threadIdx.x / 32;
  const int pair = warp / 8;  // this warp's value tile: vt0 + pair
  const int vt = vt0 + pair, tile = kt * p.value_tiles + vt;
  const int row0 = 16 * (warp % 4), col0 = 32 * (warp / 4 % 2);  // this warp's piece of its tile
  const BwdSeq seq = sequence(p, n);
  // This block's chunks: [first, first + chunks), all of them without a split.
  const bool splitting = p.scan_splits > 1;
  const int64_t first = splitting ? split * p.chunks_per_split : 0;
  int64_t chunks = num_chunks(seq.len) - first;
  if (splitting && chunks > p.chunks_per_split) chunks = p.chunks_per_split;
  if (chunks < 0) chunks = 0;
  // The piece that comes first in this scan's order starts from h0 / dht.
  const bool true_start = !splitting || split == (backward ? p.scan_splits - 1 : 0);

  // The state tile: accumulator rows are key rows row0.., columns value columns col0..
  float acc[4][4];
  const View init = true_start ? (backward ? p.dht : p.h0) : View{};
  // Split: decay (log2) of this thread's two key rows since the piece's start.
  float decay_since_start[2] = {0.f, 0.f};
  const bool records = splitting || p.phased;  // each stored state's decay, and the piece's summary
  const bool writes_decays = records && vt == 0 && col0 == 0 && threadIdx.x % 4 == 0;
  // fp16 backward scan: E (log2) of the state the next step stores, for this thread's two key rows: Γ_0 of the
  // chunk after it, or 0 after the sequence's last chunk (gate_tile.cuh, kScaledDStates).
  float next_first[2] = {0.f, 0.f};
#pragma unroll
  for (int nt = 0; nt < 4; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = kt * kTile + row0 + acc_row(e), value = vt * kTile + col0 + acc_col(nt, e);
      acc[nt][e] = (init.data && key < p.key_dim && value < p.value_dim)
                       ? static_cast<const float*>(init.data)[offset4(init, n, h, key, value)]
                       : 0.f;
    }

  const View& xs = backward ? p.q : p.k;
  const View& ys = backward ? p.d_o : p.v;
  T* scratch = static_cast<T*>(backward ? p.dstates : p.states);
  auto chunk_at = [&](int64_t i) { return first + (backward ? chunks - 1 - i : i); };  // step i's chunk
  auto rows_of = [&](int64_t c) { return int(seq.len - c * kChunk < kChunk ? seq.len - c * kChunk : kChunk); };
  constexpr bool kScaled = kScaledDStates<T>;
  if constexpr (kScaled) {
    if (backward && chunks > 0 && chunk_at(0) + 1 < num_chunks(seq.len)) {  // a piece after the sequence's last
#pragma unroll
      for (int half = 0; half < 2; ++half)
        next_first[half] = gate_at<float>(p, seq.batch, seq.begin + (chunk_at(0) + 1) * kChunk, h,
                                          kt * kTile + row0 + acc_row(2 * half));
    }
  }

  // Lean: thread t copies the 16-byte piece of row t / 8, columns t % 8 * 8..
  // of each tile (x, the two y tiles, a vector gate's bf16 rows), from
  // pointers kept at the sequence's first token: a step adds its chunk's row
  // offset (offset4 per copy and step was a sixth of a step's instructions).
  static_assert(!kPipelined || (kPair == 2 && kThreads == kTile * 8), "one piece of each tile per thread");
  const int piece_row = threadIdx.x / 8, piece_col = threadIdx.x % 8 * 8;
  const T* x_at = nullptr;
  const T* y_at[kPair] = {};
  const bf16* g_at = nullptr;
  const float* scalar_at = nullptr;  // a scalar fp32 gate (FLA's simple GLA): thread t < 64 copies row t
  const char* prefetch_at = nullptr;  // row threadIdx.x % 64 of tile threadIdx.x / 64 (x, y0, g, y1)
  int64_t prefetch_stride = 0;        // bytes per token
  if constexpr (kLean) {
    x_at = static_cast<const T*>(xs.data) + offset4(xs, seq.batch, seq.begin, h, kt * kTile + piece_col);
#pragma unroll
    for (int j = 0; j < kPair; ++j)
      y_at[j] = static_cast<const T*>(ys.data) + offset4(ys, seq.batch, seq.begin, h, (vt0 + j) * kTile + piece_col);
    if (p.gate == GateKind::vector)
      g_at = static_cast<const bf16*>(p.g.data) + offset4(p.g, seq.batch, seq.begin, h, kt * kTile + piece_col);
    if (p.gate == GateKind::scalar && p.g.dtype == Elem::f32)
      scalar_at = static_cast<const float*>(p.g.data) + offset4(p.g, seq.batch, seq.begin, h, 0);
    const int which = threadIdx.x / kTile;
    const View& pf = which == 2 ? p.g : (which == 0 ? xs : ys);
    const int pf_col = which == 0 || which == 2 ? kt * kTile : (vt0 + (which == 3)) * kTile;
    if (which < 4 && (which != 2 || p.gate == GateKind::vector)) {
      prefetch_at = static_cast<const char*>(pf.data) +
                    offset4(pf, seq.batch, seq.begin + threadIdx.x % kTile, h, pf_col) * int64_t(sizeof(bf16));
      prefetch_stride = pf.stride[1] * int64_t(sizeof(bf16));
    }
  }
  // Step i's tiles into buffer `buf`; rows past the sequence's end are
  // zero-filled (a zero gate: a flat Γ).
  auto issue_copies = [&](int64_t i, int buf) {
    if constexpr (kLean) {
      const int64_t token = chunk_at(i) * kChunk;  // of the chunk's first row, in the sequence
      const bool valid = piece_row < rows_of(chunk_at(i));
      const int at = piece_row * LD + piece_col;
      auto copy = [&](auto* dst, const auto* first, int64_t row_stride) {
        const auto* src = first + token * row_stride;  // the chunk's first row, always in the sequence
        cp_async16_ordered(dst, valid ? src + piece_row * int(row_stride) : src, valid ? 16 : 0);
      };
      copy(sX0 + buf * kTileLd + at, x_at, xs.stride[1]);
#pragma unroll
      for (int j = 0; j < kPair; ++j) copy(sY0 + (buf * kPair + j) * kTileLd + at, y_at[j], ys.stride[1]);
      if (g_at) copy(sRawGates + buf * kTileElems + piece_row * kTile + piece_col, g_at, p.g.stride[1]);
      if (scalar_at && threadIdx.x < kTile) {
        const float* src = scalar_at + token * p.g.stride[1];
        const bool row_valid = int(threadIdx.x) < rows_of(chunk_at(i));
        cp_async4_ordered(sRawScalars + buf * (kTileElems / 2) + threadIdx.x,
                          row_valid ? src + threadIdx.x * p.g.stride[1] : src, row_valid ? 4 : 0);
      }
    }
  };
  if constexpr (kPipelined) {
    if (chunks > 0) issue_copies(0, 0);
    cp_async_commit_and_wait_all();
    __syncthreads();
  }
  // The folded normaliser (backward scan): d o_raw = d o / den_t, so q's rows carry 1/den_t as well. Thread
  // t < 64 fetches den of row t a step ahead; the step writes 1/den (0 past the sequence) to row_scale.
  __shared__ float row_scale[kChunk];
  const bool scaled_rows = backward && p.norm_den.data != nullptr;
  float next_den = 0.f;
  auto fetch_den = [&](int64_t i) {
    if (!scaled_rows || threadIdx.x >= kChunk || i >= chunks) return;
    const int64_t c = chunk_at(i);
    if (int(threadIdx.x) < rows_of(c))
      next_den = static_cast<const float*>(p.norm_den.data)[token_offset(p.norm_den, seq, h, c * kChunk + threadIdx.x)];
  };
  fetch_den(0);

  for (int64_t i = 0; i < chunks; ++i) {
    const int64_t c = chunk_at(i);
    const int64_t t0 = seq.begin + c * kChunk;
    const int rows = rows_of(c);
    const int buf = kPipelined ? int(i & 1) : 0;
    T* const sX = sX0 + buf * kTileLd;
    T* const sY = sY0 + buf * kPair * kTileLd;

    // The state at this chunk's boundary goes to the scratch (via shared memory,
    // for whole-row stores).
    if constexpr (kScaled) {
      float unscale[2] = {1.f, 1.f};
      if (backward) unscale[0] = exp2_of(-next_first[0]), unscale[1] = exp2_of(-next_first[1]);
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 4; e += 2)
          store_pair(sStage + pair * kTileLd + (row0 + acc_row(e)) * LD + col0 + acc_col(nt, e),
                     acc[nt][e] * unscale[e / 2], acc[nt][e + 1] * unscale[e / 2]);
    } else {
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 4; e += 2)
          store_pair(sStage + pair * kTileLd + (row0 + acc_row(e)) * LD + col0 + acc_col(nt, e), acc[nt][e],
                     acc[nt][e + 1]);
    }
    // x is scaled by the gates below: copied now when plain, else loaded with
    // the scaling (one rounding to the compute type, e.g. for fp16 inputs).
    bool x_plain = true;
    GateTile<GT, kThreads> gate;
    if constexpr (kPipelined) {
      // This step's tiles landed at the end of the last step; the next step's
      // go into the other buffer, which the last step's product has finished with.
      if (i + 1 < chunks) issue_copies(i + 1, buf ^ 1);
      if (p.gate == GateKind::vector) {
        const int col = threadIdx.x % kTile, first_row = (threadIdx.x / kTile) * GateTile<GT, kThreads>::kRows;
        const bf16* raw = sRawGates + buf * kTileElems;
#pragma unroll
        for (int r = 0; r < GateTile<GT, kThreads>::kRows; ++r)
          gate.x[r] = gate_value<GT>(raw[(first_row + r) * kTile + col]);
      } else if (scalar_at) {  // as load_gate_tile reads it, from the copied rows
        const int first_row = (threadIdx.x / kTile) * GateTile<GT, kThreads>::kRows;
        load_gate_rows(gate.x, sRawScalars + buf * (kTileElems / 2) + first_row, 1, rows - first_row,
                       head_decay(p.g_gamma, h));
      } else {
        gate = load_gate_tile<GT, kThreads>(p, seq.batch, t0, rows, h, kt * kTile);
      }
    } else {
      // The gate, x and y loads are all in flight at once.
      gate = load_gate_tile<GT, kThreads>(p, seq.batch, t0, rows, h, kt * kTile);
      x_plain = plain_tile<T>(xs, seq.batch, t0, h, kt * kTile, p.key_dim);
      if (x_plain) load_tile_async<T, kThreads>(sX, xs, seq.batch, t0, rows, h, kt * kTile, p.key_dim);
#pragma unroll
      for (int j = 0; j < kPair; ++j)
        load_tile_async<T, kThreads>(sY + j * kTileLd, ys, seq.batch, t0, rows, h, (vt0 + j) * kTile, p.value_dim);
      cp_async_commit_and_wait_all();
    }
    if (scaled_rows && threadIdx.x < kChunk) {
      row_scale[threadIdx.x] = int(threadIdx.x) < rows ? 1.f / next_den : 0.f;
      fetch_den(i + 1);
    }
    store_gate_cumsum<GT, kThreads>(sG, gate);  // its barriers order sStage, sX, sY and row_scale too
#pragma unroll
    for (int j = 0; j < kPair; ++j)
      copy_tile_out<T, kThreads>(scratch + state_tile_index(p, seq.slot0 + c, h, kt, vt0 + j), sStage + j * kTileLd);
    if (writes_decays)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int key = kt * kTile + row0 + acc_row(2 * half);
        p.chunk_decays[((int64_t(blockIdx.z) * p.num_slots + seq.slot0 + c) * p.heads + h) * (p.key_tiles * kTile) +
                       key] = kScaled ? decay_since_start[half] - next_first[half] : decay_since_start[half];
      }

    const float scale = p.scale;
    auto q_hat = [=](int r, int col, float x) {  // scale q ⊙ exp Γ (fp16: exp(Γ − Γ_0)), rows / den_t if scaled
      const float factor = scaled_rows ? scale * row_scale[r] : scale;
      if constexpr (kScaled) return factor * x * exp2_of(sG[r * kLdF + col] - sG[col]);
      else return factor * x * exp2_of(sG[r * kLdF + col]);
    };
    auto k_hat = [=](int r, int col, float x) {  // k ⊙ exp(γ − Γ)
      return x * exp2_of(sG[(kChunk - 1) * kLdF + col] - sG[r * kLdF + col]);
    };
    if constexpr (kLean) {
      // This thread's piece of x̂, its 8 exponents read 16 bytes at a time:
      // (scale x) exp2 Γ backward, x exp2(γ − Γ) forward, as q_hat / k_hat.
      T* at = sX + piece_row * LD + piece_col;
      float e[8];
      load8(sG + piece_row * kLdF + piece_col, e);
      if (!backward) {
        float last[8];
        load8(sG + (kChunk - 1) * kLdF + piece_col, last);
#pragma unroll
        for (int j = 0; j < 8; ++j) e[j] = last[j] - e[j];
      }
      const float factor = backward ? (scaled_rows ? scale * row_scale[piece_row] : scale) : 1.f;
      float x[8];
      load8(at, x);
#pragma unroll
      for (int j = 0; j < 8; ++j) x[j] = factor * x[j] * exp2_of(e[j]);
      store8(at, x);
    } else {
      if (x_plain && backward) transform_tile<T, kThreads>(sX, q_hat);
      if (x_plain && !backward) transform_tile<T, kThreads>(sX, k_hat);
      if constexpr (!kPipelined) {
        if (!x_plain && backward) load_tile<T, kThreads>(sX, xs, seq.batch, t0, rows, h, kt * kTile, p.key_dim, q_hat);
        if (!x_plain && !backward) load_tile<T, kThreads>(sX, xs, seq.batch, t0, rows, h, kt * kTile, p.key_dim, k_hat);
      }
    }
    __syncthreads();

    // Rows of x, y and the gate of a later step into L2 while this step
    // computes (the next step's; pipelined, the one after it, since the next
    // step's tiles are already on their way to shared memory).
    constexpr int kAhead = kPipelined ? 2 : 1;
    if (kLean && i + kAhead < chunks) {
      const int64_t later = backward ? c - kAhead : c + kAhead;
      if (prefetch_at && int(threadIdx.x % kTile) < rows_of(later))
        asm volatile("prefetch.global.L2 [%0];" ::"l"(prefetch_at + later * kChunk * prefetch_stride));
    } else if (i + kAhead < chunks) {
      const int64_t later = backward ? c - kAhead : c + kAhead;
      const int later_rows = rows_of(later);
      const int r = threadIdx.x % kTile, which = threadIdx.x / kTile;
      const int64_t t = seq.begin + later * kChunk + r;
      if (r < later_rows) {
        if (which == 0) prefetch_row_l2(xs, seq.batch, t, h, kt * kTile, p.key_dim);
        if (which == 1) prefetch_row_l2(ys, seq.batch, t, h, vt0 * kTile, p.value_dim);
        if (which == 2 && p.gate == GateKind::vector) prefetch_row_l2(p.g, seq.batch, t, h, kt * kTile, p.key_dim);
        if (kPair == 2 && which == 3) prefetch_row_l2(ys, seq.batch, t, h, (vt0 + 1) * kTile, p.value_dim);
      }
    }

    // Step 2 (forward scan) or 6 (backward scan): h ← diag(exp γ) h + x̂ᵀ y.
    float first[2] = {0.f, 0.f};  // fp16 backward: Γ_0 of this thread's key rows, out of x̂ and the decay
    chunk_fwd_h_or_bwd_dh<T, GT, LD>(acc, decay_since_start, next_first, first, sG, sX + row0,
                                     sY + pair * kTileLd + col0, row0, backward);
    if constexpr (kPipelined) cp_async_commit_and_wait_all();  // the next step's tiles, issued at the top of this one
    __syncthreads();
  }

  if (records) {  // the piece's summary: its last state and total decay
    float* summary = p.split_summaries +
                     ((((int64_t(blockIdx.z) * p.num_seqs + n) * p.heads + h) * p.scan_splits + split) * tiles + tile) *
                         int64_t(kSummaryFloats);
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int e = 0; e < 4; e += 2)
        store_pair(summary + (row0 + acc_row(e)) * kTile + col0 + acc_col(nt, e), acc[nt][e], acc[nt][e + 1]);
    if (col0 == 0 && threadIdx.x % 4 == 0)
      for (int half = 0; half < 2; ++half) summary[kTileElems + row0 + acc_row(2 * half)] = decay_since_start[half];
  }

  if (backward && p.dh0.data && !splitting) {
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = kt * kTile + row0 + acc_row(e), value = vt * kTile + col0 + acc_col(nt, e);
        if (key < p.key_dim && value < p.value_dim)
          static_cast<float*>(p.dh0.data)[offset4(p.dh0, n, h, key, value)] = acc[nt][e];
      }
  }
}

// The fold of a split scan: one block per (sequence, head, tile, piece after
// the first in scan order; with p.dht_in_fold the backward scan's first piece
// too, the only one without a split); blockIdx.z picks the scan as above. Thread t owns 8 columns of rows
// t / 8 and t / 8 + 32 of the tile. A summary call (p.summary) launches the
// backward scan's last piece only (blockIdx.z = 0) and writes its dh0 there.
template <class T>
__global__ void __launch_bounds__(kBwdStateThreads) fold_kernel(const BwdParams p) {
  allow_dependent_launch();
  constexpr int kRowStep = kBwdStateThreads / 8;
  const bool summary_only = p.summary.data != nullptr;
  const int scan = summary_only ? 1 : int(blockIdx.z);
  const bool backward = scan == 1;
  const int64_t n = blockIdx.x / p.heads;
  const int h = int(blockIdx.x % p.heads);
  const int tiles = p.key_tiles * p.value_tiles;
  const bool from_dht = backward && p.dht_in_fold;  // the first piece's start, dht, is folded here
  const int tile = int(blockIdx.y) % tiles;
  const int order = summary_only ? int(p.scan_splits) - 1 : int(blockIdx.y) / tiles + (from_dht ? 0 : 1);
  if (order >= p.scan_splits) return;  // the forward scan's blocks of a grid sized for from_dht
  const int kt = tile / p.value_tiles, vt = tile % p.value_tiles;
  const int row = threadIdx.x / 8, col = threadIdx.x % 8 * 8;
  auto piece = [&](int place) { return backward ? int(p.scan_splits) - 1 - place : place; };
  auto summary = [&](int split) {
    return p.split_summaries +
           ((((int64_t(scan) * p.num_seqs + n) * p.heads + h) * p.scan_splits + split) * tiles + tile) *
               int64_t(kSummaryFloats);
  };

  // This piece's true start state: the earlier pieces' summaries folded in scan order (from dht).
  float x[2][8] = {};
  if (from_dht && p.dht.data)
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      const int key = kt * kTile + row + m * kRowStep;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int value = vt * kTile + col + j;
        if (key < p.key_dim && value < p.value_dim)
          x[m][j] = static_cast<const float*>(p.dht.data)[offset4(p.dht, n, h, key, value)];
      }
    }
  for (int place = 0; place < order; ++place) {
    const float* s = summary(piece(place));
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      const int r = row + m * kRowStep;
      const float decay = exp2_of(s[kTileElems + r]);
      float last[8];
      load8(s + r * kTile + col, last);
#pragma unroll
      for (int j = 0; j < 8; ++j) x[m][j] = decay * x[m][j] + last[j];
    }
  }

  // The backward scan's last piece in scan order: dh0 = diag(exp2 D) x + its last state, into `out`.
  auto write_entering_gradient = [&](const View& out) {
    const float* s = summary(0);
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      const int r = row + m * kRowStep, key = kt * kTile + r;
      const float decay = exp2_of(s[kTileElems + r]);
      float last[8];
      load8(s + r * kTile + col, last);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int value = vt * kTile + col + j;
        if (key < p.key_dim && value < p.value_dim)
          static_cast<float*>(out.data)[offset4(out, n, h, key, value)] = decay * x[m][j] + last[j];
      }
    }
  };
  if (summary_only) return write_entering_gradient(p.summary);  // dh0 for a zero dht

  // Its stored states: += diag(exp2 D) x, D the decay from the piece's start.
  const int split = piece(order);
  const BwdSeq seq = sequence(p, n);
  const int64_t first = split * p.chunks_per_split;
  int64_t chunks = num_chunks(seq.len) - first;
  if (p.scan_splits > 1 && chunks > p.chunks_per_split) chunks = p.chunks_per_split;
  T* scratch = static_cast<T*>(backward ? p.dstates : p.states);
  for (int64_t c = first; c < first + chunks; ++c) {
    T* state = scratch + state_tile_index(p, seq.slot0 + c, h, kt, vt);
    const float* decays = p.chunk_decays +
                          ((int64_t(scan) * p.num_slots + seq.slot0 + c) * p.heads + h) * (p.key_tiles * kTile) +
                          kt * kTile;
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      const int r = row + m * kRowStep;
      const float decay = exp2_of(decays[r]);
      float s[8];
      load8(state + r * kTile + col, s);
#pragma unroll
      for (int j = 0; j < 8; ++j) s[j] += decay * x[m][j];
      store8(state + r * kTile + col, s);
    }
  }

  if (backward && split == 0 && p.dh0.data) write_entering_gradient(p.dh0);
}

template <class T, class GT, int kPair, int kPipeline = 0>
void launch_scan(const BwdParams& p, cudaStream_t stream) {
  const size_t smem = StateScanSmem<T, GT, kPair, (kPipeline > 0 ? 2 : 1)>::bytes;
  auto kernel = state_scan_kernel<T, GT, kPair, kPipeline>;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
             "cudaFuncSetAttribute (GLA backward state scan)");
  const unsigned groups = unsigned(p.key_tiles * p.value_tiles / kPair);
  const dim3 grid(unsigned(p.num_seqs * p.heads), groups * unsigned(p.scan_splits), 2);
  kernel<<<grid, kBwdStateThreads * kPair, smem, stream>>>(p);
  check_cuda(cudaGetLastError(), "GLA backward state scan launch");
}

template <class T, class GT>
void launch(const BwdParams& p, BwdScanKernel scans, GlaPhase phase, cudaStream_t stream) {
  if (phase != GlaPhase::output) {
    if (scans == BwdScanKernel::one_tile) launch_scan<T, GT, 1>(p, stream);
    else if (std::is_same_v<T, bf16> && scans == BwdScanKernel::pipelined) launch_scan<bf16, float, 2, 2>(p, stream);
    else launch_scan<T, GT, 2>(p, stream);  // paired (fp32: the planner pipelines bf16 rows only)
  }
  const unsigned tiles = unsigned(p.key_tiles * p.value_tiles);
  // Without a split: no fold, but in an output call with dht (its first and only piece; a summary call's scan
  // wrote dh0).
  if (phase == GlaPhase::summary ? p.scan_splits > 1 : p.scan_splits > 1 || p.dht_in_fold) {
    const unsigned places = unsigned(p.scan_splits - (p.dht_in_fold ? 0 : 1));  // pieces folded per scan
    const dim3 fold_grid = phase == GlaPhase::summary ? dim3(unsigned(p.num_seqs * p.heads), tiles, 1)
                                                      : dim3(unsigned(p.num_seqs * p.heads), tiles * places, 2);
    fold_kernel<T><<<fold_grid, kBwdStateThreads, 0, stream>>>(p);
    check_cuda(cudaGetLastError(), "GLA backward state scan fold launch");
  }
}

}  // namespace

void launch_bwd_state_scan(const BwdParams& p, Compute c, BwdScanKernel scans, GlaPhase phase, cudaStream_t stream) {
  if (c == Compute::f32) launch<float, double>(p, scans, phase, stream);
  else if (c == Compute::f16) launch<__half, float>(p, scans, phase, stream);  // one_tile or paired (plan.cpp)
  else launch<bf16, float>(p, scans, phase, stream);
}

}  // namespace flashgla::cuda::gla
