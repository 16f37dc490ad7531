// Attention over a KV cache on CUDA (decoding; flash-decoding's split over keys).
//
// 1. With new k, v: they are written into the cache at rows cache_seqlens[b] ..
//    (through the block table when paged), by an append kernel before the
//    general split kernel, or by the tensor-core split kernel itself.
// 2. The split kernel: one CTA per (key split, KV head × query-row chunk,
//    sequence). Its 16 query rows are the (query, head) pairs of the KV head's
//    group, so a key read from memory serves every query head sharing it. It
//    walks its split's keys (gathered through the block table), keeps the
//    online softmax in fp32 and writes either the final o and lse (one split)
//    or a partial (o, lse) to the workspace. bf16 / fp16 caches that allow
//    16-byte copies run the tensor-core kernel (mma_split_kernel: per-warp
//    cp.async pipelines, mma.m16n8k16); fp32 and other layouts the general one
//    (split_kernel). The split count comes from kvcache_plan.h.
// 3. With several splits, the combine kernel merges the partials by their lse.
//    It is launched to overlap the split kernel (programmatic dependent
//    launch) and waits for that grid's end before it reads the partials.
//
// Nothing is read back to the host (graph-capturable): the split plan comes
// from the host-side bound max_seqlen_k (default: the capacity). Lengths and
// block indices are only trusted after clamping: L_b is clamped to
// [0, capacity], appended keys past the capacity are dropped, and a key whose
// block index is outside [0, num_blocks) is neither read nor written.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <climits>
#include <string>
#include <type_traits>

#include "core/backend.h"
#include "cuda/common/host.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/attention/kvcache_plan.h"
#include "cuda/common/copy.cuh"
#include "cuda/common/dtype.cuh"
#include "cuda/common/mma.cuh"

namespace flashgla::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kRows = 16;  // query rows (query × head of a KV group) per CTA

template <class E>
constexpr int key_tile() {
  return sizeof(E) == 4 ? 32 : 64;  // keeps fp32 tiles within 48 KB of static shared memory
}

struct Params {
  const void* q;
  void* k_cache;
  void* v_cache;
  const int* cache_seqlens;
  const int* block_table;  // null: contiguous
  const void* k_new;
  const void* v_new;
  void* o;
  float* lse;          // may be null
  float* part_o;       // [splits][B·Hq·Tq][Dv], when splits > 1
  float* part_lse;     // [splits][B·Hq·Tq]
  int64_t q_stride[4], kc_stride[4], vc_stride[4], kn_stride[4], vn_stride[4], o_stride[4], lse_stride[3];
  int64_t table_stride[2];
  int batch, q_len, q_heads, kv_heads, group;
  int capacity, block_size, num_blocks;
  int splits, keys_per_split, row_chunks;
  int value_dim;
  float scale;
  bool causal, append, vec_k, vec_v, vec_q;
};

// Cached keys after the append, trusted only once clamped.
__device__ __forceinline__ int keys_of(const Params& p, int b) {
  const int cached = min(max(p.cache_seqlens[b], 0), p.capacity);
  return p.append ? min(cached + p.q_len, p.capacity) : cached;
}

// Element offset of key j's row (head 0, element 0) in a cache; −1 when its block is invalid.
__device__ __forceinline__ int64_t row_offset(const Params& p, const int64_t* stride, int b, int j) {
  if (p.block_table == nullptr) return b * stride[0] + int64_t(j) * stride[1];
  const int block = p.block_table[b * p.table_stride[0] + int64_t(j / p.block_size) * p.table_stride[1]];
  if (block < 0 || block >= p.num_blocks) return -1;
  return int64_t(block) * stride[0] + int64_t(j % p.block_size) * stride[1];
}

// Both caches' offsets of key j with one block-table read; both −1 when its block is invalid.
__device__ __forceinline__ void row_offsets(const Params& p, int b, int j, int64_t& k_off, int64_t& v_off) {
  if (p.block_table == nullptr) {
    k_off = b * p.kc_stride[0] + int64_t(j) * p.kc_stride[1];
    v_off = b * p.vc_stride[0] + int64_t(j) * p.vc_stride[1];
    return;
  }
  const int index = j / p.block_size, within = j - index * p.block_size;
  const int block = p.block_table[b * p.table_stride[0] + int64_t(index) * p.table_stride[1]];
  const bool ok = block >= 0 && block < p.num_blocks;
  k_off = ok ? int64_t(block) * p.kc_stride[0] + int64_t(within) * p.kc_stride[1] : -1;
  v_off = ok ? int64_t(block) * p.vc_stride[0] + int64_t(within) * p.vc_stride[1] : -1;
}

template <class E>
__global__ void append_kernel(Params p, int head_dim, int value_dim) {
  const int b = blockIdx.x / p.q_len, i = blockIdx.x % p.q_len, h = blockIdx.y;
  const int start = min(max(p.cache_seqlens[b], 0), p.capacity);
  const int j = start + i;
  if (j >= p.capacity) return;  // past the capacity: dropped
  const int64_t kr = row_offset(p, p.kc_stride, b, j), vr = row_offset(p, p.vc_stride, b, j);
  const E* kn = static_cast<const E*>(p.k_new) + b * p.kn_stride[0] + i * p.kn_stride[1] + h * p.kn_stride[2];
  const E* vn = static_cast<const E*>(p.v_new) + b * p.vn_stride[0] + i * p.vn_stride[1] + h * p.vn_stride[2];
  if (kr >= 0) {
    E* kc = static_cast<E*>(p.k_cache) + kr + h * p.kc_stride[2];
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) kc[d * p.kc_stride[3]] = kn[d * p.kn_stride[3]];
  }
  if (vr >= 0) {
    E* vc = static_cast<E*>(p.v_cache) + vr + h * p.vc_stride[2];
    for (int d = threadIdx.x; d < value_dim; d += blockDim.x) vc[d * p.vc_stride[3]] = vn[d * p.vn_stride[3]];
  }
}

// Loads `keys` rows of one head into shared memory [KT][ld]; rows at offset −1 (or past `keys`) become 0.
// The 16-byte path issues all of a thread's loads before its stores, so they are in flight together.
template <class E, int D, int KT>
__device__ __forceinline__ void load_tile(const E* cache, const int64_t* stride, const int64_t* rows, int keys, bool vec,
                                          E* tile, int ld) {
  constexpr int kVec = 16 / sizeof(E);
  constexpr int kChunks = KT * (D / kVec);
  static_assert(kChunks % kThreads == 0, "a tile is a whole number of 16-byte loads per thread");
  if (vec) {
    uint4 value[kChunks / kThreads];
#pragma unroll
    for (int it = 0; it < kChunks / kThreads; ++it) {
      const int idx = threadIdx.x + it * kThreads;
      const int c = idx / (D / kVec), part = idx % (D / kVec);
      value[it] = make_uint4(0, 0, 0, 0);
      if (c < keys && rows[c] >= 0) value[it] = *reinterpret_cast<const uint4*>(cache + rows[c] + part * kVec);
    }
#pragma unroll
    for (int it = 0; it < kChunks / kThreads; ++it) {
      const int idx = threadIdx.x + it * kThreads;
      const int c = idx / (D / kVec), part = idx % (D / kVec);
      *reinterpret_cast<uint4*>(tile + c * ld + part * kVec) = value[it];
    }
  } else {
    for (int idx = threadIdx.x; idx < KT * D; idx += kThreads) {
      const int c = idx / D, d = idx % D;
      tile[c * ld + d] = (c < keys && rows[c] >= 0) ? cache[rows[c] + d * stride[3]] : from_float<E>(0.f);
    }
  }
}

template <class E, int D>
__global__ void __launch_bounds__(kThreads) split_kernel(Params p) {
  constexpr int KT = key_tile<E>();
  constexpr int LD = D;  // warps read whole key rows: no padding needed against bank conflicts
  constexpr int kGroups = kThreads / D;           // row groups of the output accumulation
  constexpr int kAccRows = kRows / kGroups;       // rows each thread accumulates
  __shared__ __align__(16) E k_tile[KT * LD];
  __shared__ __align__(16) E v_tile[KT * D];
  __shared__ float q_s[kRows * D];
  __shared__ float p_s[kRows * KT];
  __shared__ float row_max[kRows], row_sum[kRows], row_scale[kRows];
  __shared__ int64_t k_rows[KT], v_rows[KT];
  allow_dependent_launch();  // the combine kernel's blocks may start; they wait for this grid's end

  const int split = blockIdx.x, b = blockIdx.z;
  const int kv_head = blockIdx.y / p.row_chunks, chunk = blockIdx.y % p.row_chunks;
  const int group_rows = p.q_len * p.group;  // rows of this KV head: r → query r / group, head r % group
  const int row0 = chunk * kRows;
  const int rows = min(kRows, group_rows - row0);
  const int L = keys_of(p, b);
  const int begin = split * p.keys_per_split;
  // The last split runs to L even past the plan: a max_seqlen_k that was too small costs balance, not keys.
  const int end = split + 1 == p.splits ? L : min(L, begin + p.keys_per_split);

  // Queries, scaled, in fp32; the last key any of the CTA's rows sees.
  const E* q = static_cast<const E*>(p.q);
  for (int idx = threadIdx.x; idx < kRows * D; idx += kThreads) {
    const int r = idx / D, d = idx % D;
    float value = 0.f;
    if (r < rows) {
      const int rr = row0 + r, i = rr / p.group, h = kv_head * p.group + rr % p.group;
      value = to_float(q[b * p.q_stride[0] + i * p.q_stride[1] + h * p.q_stride[2] + d * p.q_stride[3]]) * p.scale;
    }
    q_s[idx] = value;
  }
  if (threadIdx.x < kRows) row_max[threadIdx.x] = -INFINITY, row_sum[threadIdx.x] = 0.f;
  const int last_query = (row0 + rows - 1) / p.group;
  const int seen_end = p.causal ? min(end, max(0, last_query + L - p.q_len + 1)) : end;

  float acc[kAccRows];
#pragma unroll
  for (int k = 0; k < kAccRows; ++k) acc[k] = 0.f;
  const int col = threadIdx.x % D, row_group = threadIdx.x / D;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const E* kc = static_cast<const E*>(p.k_cache) + kv_head * p.kc_stride[2];
  const E* vc = static_cast<const E*>(p.v_cache) + kv_head * p.vc_stride[2];

  for (int j0 = begin; j0 < seen_end; j0 += KT) {
    const int keys = min(KT, seen_end - j0);
    __syncthreads();  // the previous tile is consumed (and the first: q_s and the row stats are written)
    if (threadIdx.x < KT) {
      const int c = threadIdx.x;
      k_rows[c] = c < keys ? row_offset(p, p.kc_stride, b, j0 + c) : -1;
      v_rows[c] = c < keys ? row_offset(p, p.vc_stride, b, j0 + c) : -1;
    }
    __syncthreads();
    load_tile<E, D, KT>(kc, p.kc_stride, k_rows, keys, p.vec_k, k_tile, LD);
    load_tile<E, D, KT>(vc, p.vc_stride, v_rows, keys, p.vec_v, v_tile, D);
    __syncthreads();

    // Scores: a warp per key, its lanes splitting D (one contiguous row read per key, no bank
    // conflicts), the key's elements reused for every row; shuffles sum the lanes' parts.
    for (int c = warp; c < KT; c += kThreads / 32) {
      constexpr int kPer = D / 32;
      float kf[kPer];
#pragma unroll
      for (int e = 0; e < kPer; ++e) kf[e] = to_float(k_tile[c * LD + lane * kPer + e]);
      const int j = j0 + c;
      const bool key_ok = c < keys && k_rows[c] >= 0;
      for (int r = 0; r < rows; ++r) {
        const float* qr = q_s + r * D + lane * kPer;
        float s = 0.f;
#pragma unroll
        for (int e = 0; e < kPer; ++e) s += qr[e] * kf[e];
#pragma unroll
        for (int off = 16; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
        if (lane == 0) {
          const int i = (row0 + r) / p.group;
          const bool visible = key_ok && (!p.causal || j <= i + L - p.q_len);
          p_s[r * KT + c] = visible ? s : -INFINITY;
        }
      }
    }
    __syncthreads();

    // Online softmax: one warp per row.
    for (int r = warp; r < rows; r += kThreads / 32) {
      float m = -INFINITY;
      for (int c = lane; c < KT; c += 32) m = fmaxf(m, p_s[r * KT + c]);
      for (int off = 16; off > 0; off /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
      const float old_max = row_max[r];
      const float new_max = fmaxf(old_max, m);
      // A row that has seen nothing yet (new_max = −inf) keeps p = 0 and its stats.
      const float base = new_max == -INFINITY ? 0.f : new_max;
      float sum = 0.f;
      for (int c = lane; c < KT; c += 32) {
        const float e = __expf(p_s[r * KT + c] - base);
        p_s[r * KT + c] = e;
        sum += e;
      }
      for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
      __syncwarp();
      if (lane == 0) {
        const float factor = old_max == -INFINITY ? 0.f : __expf(old_max - new_max);
        row_scale[r] = factor;
        row_sum[r] = row_sum[r] * factor + sum;
        row_max[r] = new_max;
      }
    }
    __syncthreads();

    // o[r][col] = o · scale + Σ_c p[r][c] v[c][col].
#pragma unroll
    for (int k = 0; k < kAccRows; ++k) {
      const int r = row_group + k * kGroups;
      if (r >= rows) break;
      float a = acc[k] * row_scale[r];
      const float* pr = p_s + r * KT;
      for (int c = 0; c < keys; ++c) a += pr[c] * to_float(v_tile[c * D + col]);
      acc[k] = a;
    }
  }
  __syncthreads();

#pragma unroll
  for (int k = 0; k < kAccRows; ++k) {
    const int r = row_group + k * kGroups;
    if (r >= rows) break;
    const int rr = row0 + r, i = rr / p.group, h = kv_head * p.group + rr % p.group;
    const float sum = row_sum[r];
    const float value = sum > 0.f ? acc[k] / sum : 0.f;
    const float lse = sum > 0.f ? row_max[r] + logf(sum) : -INFINITY;
    if (p.splits == 1) {
      E* o = static_cast<E*>(p.o);
      o[b * p.o_stride[0] + i * p.o_stride[1] + h * p.o_stride[2] + col * p.o_stride[3]] = from_float<E>(value);
      if (col == 0 && p.lse != nullptr)
        p.lse[b * p.lse_stride[0] + h * p.lse_stride[1] + i * p.lse_stride[2]] = lse;
    } else {
      const int64_t row = (int64_t(b) * p.q_heads + h) * p.q_len + i;
      const int64_t total = int64_t(p.batch) * p.q_heads * p.q_len;
      p.part_o[(split * total + row) * D + col] = value;
      if (col == 0) p.part_lse[split * total + row] = lse;
    }
  }
}

// ---- The tensor-core split kernel (bf16 / fp16 with 16-byte aligned caches) ----
//
// Decode reads every byte of K and V once and does two small products per key,
// so it is bound by memory if the SM keeps enough bytes in flight and spends few
// instructions per byte. Here each of the 4 warps walks its own chunks of 16
// keys (chunks warp, warp + 4, …; neighbouring keys in flight together) through
// a private ring of kStages shared-memory stages filled by cp.async, so loads
// for the next kStages − 1 chunks are in flight while one is computed and no
// barrier of the CTA sits in the loop. The 16 query rows of the CTA are the A
// operand of mma.m16n8k16: S = Q Kᵀ and O += P V cost 2·D/8 tensor-core
// instructions per chunk, whatever the group (rows that are padding cost
// nothing extra). Each warp keeps its own online softmax; the 4 warps' (m, l, o)
// are merged in shared memory at the end.
constexpr int kWarps = kThreads / 32;
constexpr int kChunk = 16;  // keys per warp step

template <int D>
struct MmaConfig {
  static constexpr int kStages = 3;
  static constexpr int kLd = D + 8;       // q's padded rows: ldmatrix's 8 row addresses fall in distinct banks
  static constexpr int kOutLd = D + 8;    // fp32 rows of the warps' merge, padded likewise
  // A stage's K and V rows are unpadded, their 16-byte pieces swizzled (stage_piece): a warp's copies then
  // fill whole 128-byte lines of shared memory, so the global reads stay whole lines too (padded rows split
  // them and read half again as many L2 sectors), and ldmatrix still finds its 8 rows in distinct banks.
  static constexpr int kStageElems = 2 * kChunk * D;  // K chunk, then V chunk
  static constexpr size_t kQBytes = size_t(kRows) * kLd * 2;
  static constexpr size_t kStageBytes = size_t(kWarps) * kStages * kStageElems * 2;
  // The warps' merge: o, m, l and the weights per warp and row, then each row's lse.
  static constexpr size_t kMergeBytes = (size_t(kWarps) * kRows * (kOutLd + 3) + kRows) * 4;
  static constexpr size_t kValidBytes = size_t(kWarps) * kStages * 4;
  static constexpr size_t kSmemBytes = kQBytes + (kStageBytes > kMergeBytes ? kStageBytes : kMergeBytes) + kValidBytes;
};

// Element offset of row `row`, 16-byte piece `piece` (of D / 8) in a stage's unpadded K or V chunk: the
// piece index is XORed with row % 8, so the 8 rows an ldmatrix reads at one piece lie in 8 distinct 16-byte
// bank groups.
template <int D>
__device__ __forceinline__ int stage_piece(int row, int piece) {
  static_assert(D % 64 == 0, "a row holds at least 8 pieces, so piece ^ (row % 8) stays in the row");
  return row * D + ((piece ^ (row & 7)) * 8);
}

// Four consecutive columns of an output row, `stride` elements apart, each times `scale`.
template <class E>
__device__ __forceinline__ void store_columns4(E* out, int64_t stride, float4 value, float scale = 1.f) {
  out[0] = from_float<E>(value.x * scale), out[stride] = from_float<E>(value.y * scale);
  out[2 * stride] = from_float<E>(value.z * scale), out[3 * stride] = from_float<E>(value.w * scale);
}

template <int N>
__device__ __forceinline__ void cp_async_wait_pending() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ float exp2_approx(float x) {  // ex2.approx: 2^−inf = 0
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

template <class E>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<E, __nv_bfloat16>) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

template <class E, int D>
__global__ void __launch_bounds__(kThreads) mma_split_kernel(Params p) {
  using Cfg = MmaConfig<D>;
  constexpr int LD = Cfg::kLd, S = Cfg::kStages;
  extern __shared__ __align__(16) unsigned char smem[];
  E* q_s = reinterpret_cast<E*>(smem);
  unsigned char* ring = smem + Cfg::kQBytes;
  E* stages = reinterpret_cast<E*>(ring);
  unsigned* valid_s = reinterpret_cast<unsigned*>(
      ring + (Cfg::kStageBytes > Cfg::kMergeBytes ? Cfg::kStageBytes : Cfg::kMergeBytes));
  allow_dependent_launch();  // the combine kernel's blocks may start; they wait for this grid's end

  const int split = blockIdx.x, b = blockIdx.z;
  const int kv_head = blockIdx.y / p.row_chunks, chunk = blockIdx.y % p.row_chunks;
  const int group_rows = p.q_len * p.group;  // rows of this KV head: r → query r / group, head r % group
  const int row0 = chunk * kRows;
  const int rows = min(kRows, group_rows - row0);
  const int L = keys_of(p, b);
  const int begin = split * p.keys_per_split;
  // The last split runs to L even past the plan: a max_seqlen_k that was too small costs balance, not keys.
  const int end = split + 1 == p.splits ? L : min(L, begin + p.keys_per_split);
  const int last_query = (row0 + rows - 1) / p.group;
  const int seen_end = p.causal ? min(end, max(0, last_query + L - p.q_len + 1)) : end;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;  // fragment row and column pair (mma.cuh)

  // The last key each of the lane's two rows (g, g + 8) may see.
  int limit[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int i = min(row0 + g + 8 * h, group_rows - 1) / p.group;
    limit[h] = p.causal ? i + L - p.q_len : INT_MAX;
  }

  const int n_chunks = seen_end > begin ? (seen_end - begin + kChunk - 1) / kChunk : 0;
  const int mine = n_chunks > warp ? (n_chunks - warp + kWarps - 1) / kWarps : 0;
  E* my_stages = stages + warp * S * Cfg::kStageElems;
  E* kc = static_cast<E*>(p.k_cache) + kv_head * p.kc_stride[2];
  E* vc = static_cast<E*>(p.v_cache) + kv_head * p.vc_stride[2];

  // Starts the copies of the warp's n-th chunk into `stage`: the lanes copy whole rows, 16 bytes each; keys
  // outside the split or in an invalid block are zero-filled and marked invalid. A contiguous cache's rows
  // are a fixed stride apart (a pointer per lane, advanced); a paged one's come from the block table (lane
  // l reads key l % 16's entry and the lanes share the offsets).
  constexpr int kParts = D / 8;              // 16-byte pieces of a row
  constexpr int kRowsPerPass = 32 / kParts;  // rows one instruction of the warp copies
  const int lane_row = lane / kParts, part = lane % kParts;
  const E* k_lane = kc + b * p.kc_stride[0] + int64_t(lane_row) * p.kc_stride[1] + part * 8;
  const E* v_lane = vc + b * p.vc_stride[0] + int64_t(lane_row) * p.vc_stride[1] + part * 8;
  const int64_t k_pass = kRowsPerPass * p.kc_stride[1], v_pass = kRowsPerPass * p.vc_stride[1];  // a pass's rows
  auto issue = [&](int n, int stage) {
    const int j0 = begin + (warp + n * kWarps) * kChunk;
    E* kt = my_stages + stage * Cfg::kStageElems;
    E* vt = kt + kChunk * D;
    if (p.block_table == nullptr) {
      const int count = min(max(seen_end - j0, 0), kChunk);
      if (lane == 0) valid_s[warp * S + stage] = (1u << count) - 1u;
      const E* kr = k_lane + int64_t(j0) * p.kc_stride[1];
      const E* vr = v_lane + int64_t(j0) * p.vc_stride[1];
      if (count == kChunk) {  // every row (all but a split's last chunk): no predicates, no selects
#pragma unroll
        for (int it = 0; it < kChunk / kRowsPerPass; ++it) {
          const int c = lane_row + it * kRowsPerPass;
          cp_async16_ordered(kt + stage_piece<D>(c, part), kr + it * k_pass, 16);
          cp_async16_ordered(vt + stage_piece<D>(c, part), vr + it * v_pass, 16);
        }
        return;
      }
#pragma unroll
      for (int it = 0; it < kChunk / kRowsPerPass; ++it) {
        const int c = lane_row + it * kRowsPerPass;
        const bool ok = c < count;
        cp_async16_ordered(kt + stage_piece<D>(c, part), ok ? kr : kc, ok ? 16 : 0);
        cp_async16_ordered(vt + stage_piece<D>(c, part), ok ? vr : vc, ok ? 16 : 0);
        kr += k_pass;
        vr += v_pass;
      }
      return;
    }
    const int j = j0 + lane % kChunk;
    int64_t koff = -1, voff = -1;
    if (j < seen_end) row_offsets(p, b, j, koff, voff);
    const unsigned valid = __ballot_sync(0xffffffffu, koff >= 0 && voff >= 0) & 0xffffu;
    if (lane == 0) valid_s[warp * S + stage] = valid;
#pragma unroll
    for (int it = 0; it < kChunk / kRowsPerPass; ++it) {
      const int c = lane_row + it * kRowsPerPass;
      const int64_t ko = __shfl_sync(0xffffffffu, koff, c), vo = __shfl_sync(0xffffffffu, voff, c);
      const bool ok = (valid >> c) & 1u;
      cp_async16_ordered(kt + stage_piece<D>(c, part), ok ? kc + ko + part * 8 : kc, ok ? 16 : 0);
      cp_async16_ordered(vt + stage_piece<D>(c, part), ok ? vc + vo + part * 8 : vc, ok ? 16 : 0);
    }
  };

  float o[D / 8][4];
#pragma unroll
  for (int nd = 0; nd < D / 8; ++nd) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};  // m in log2 units of the scaled scores
  const float scale_log2 = p.scale * 1.4426950408889634f;

  // New keys and values (append): the CTA writes those in its split's key range before reading it. Every
  // key below L lies in one split's range; the CTAs of other row chunks write the same values.
  if (p.append) {
    const int start = min(max(p.cache_seqlens[b], 0), p.capacity);
    const int lo = max(begin, start), hi = min(end, min(start + p.q_len, p.capacity));
    const E* kn = static_cast<const E*>(p.k_new) + b * p.kn_stride[0] + kv_head * p.kn_stride[2];
    const E* vn = static_cast<const E*>(p.v_new) + b * p.vn_stride[0] + kv_head * p.vn_stride[2];
    for (int idx = threadIdx.x; idx < (hi - lo) * D; idx += kThreads) {
      const int j = lo + idx / D, d = idx % D, i = j - start;
      int64_t koff, voff;
      row_offsets(p, b, j, koff, voff);
      if (koff < 0) continue;  // an invalid block: neither written nor read
      kc[koff + d] = kn[i * p.kn_stride[1] + d * p.kn_stride[3]];
      vc[voff + d] = vn[i * p.vn_stride[1] + d * p.vn_stride[3]];
    }
    __syncthreads();  // written before any thread's copies read them
  }

#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    if (s < mine) issue(s, s);
    cp_async_commit_ordered();  // a group per chunk, empty or not: the wait below counts them
  }
  // Queries as they are (the scale is applied to the fp32 scores; padding rows are 0), read while the
  // first chunks are on their way: 16 bytes at a time where q's layout allows.
  const E* q = static_cast<const E*>(p.q);
  if (p.vec_q) {
    for (int idx = threadIdx.x; idx < kRows * kParts; idx += kThreads) {
      const int r = idx / kParts, d = (idx % kParts) * 8;
      uint4 value = make_uint4(0, 0, 0, 0);
      if (r < rows) {
        const int rr = row0 + r, i = rr / p.group, h = kv_head * p.group + rr % p.group;
        value = *reinterpret_cast<const uint4*>(q + b * p.q_stride[0] + i * p.q_stride[1] + h * p.q_stride[2] + d);
      }
      *reinterpret_cast<uint4*>(q_s + r * LD + d) = value;
    }
  } else {
    for (int idx = threadIdx.x; idx < kRows * D; idx += kThreads) {
      const int r = idx / D, d = idx % D;
      E value = from_float<E>(0.f);
      if (r < rows) {
        const int rr = row0 + r, i = rr / p.group, h = kv_head * p.group + rr % p.group;
        value = q[b * p.q_stride[0] + i * p.q_stride[1] + h * p.q_stride[2] + d * p.q_stride[3]];
      }
      q_s[r * LD + d] = value;
    }
  }
  __syncthreads();
  uint32_t qf[D / 16][4];
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
    ldmatrix_x4_ordered(qf[kk], q_s + (lane % 8 + ((lane / 8) % 2) * 8) * LD + kk * 16 + (lane / 16) * 8);

  for (int n = 0; n < mine; ++n) {
    if (n + S - 1 < mine) issue(n + S - 1, (n + S - 1) % S);  // into the stage chunk n − 1 used
    cp_async_commit_ordered();
    cp_async_wait_pending<S - 1>();  // this lane's copies of chunk n have landed
    __syncwarp();                    // and every lane's
    const int stage = n % S;
    const E* kt = my_stages + stage * Cfg::kStageElems;
    const E* vt = kt + kChunk * D;
    const unsigned valid = valid_s[warp * S + stage];
    const int j0 = begin + (warp + n * kWarps) * kChunk;

    // S = Q Kᵀ: B fragments of keys 0-7 and 8-15 from one ldmatrix.x4 per 16 of D.
    float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t kf[4];
      ldmatrix_x4_ordered(kf, kt + stage_piece<D>((lane / 16) * 8 + lane % 8, kk * 2 + (lane / 8) % 2));
      mma16816<E>(s[0], qf[kk], kf[0], kf[1]);
      mma16816<E>(s[1], qf[kk], kf[2], kf[3]);
    }

    // Online softmax of rows g (h = 0) and g + 8 (h = 1); the row's max is shared by its quad. o and l are
    // rescaled only in a chunk that raises some row's max (factor 1 in the others): a running max grows
    // ever more rarely along a split, so most chunks of a long one skip the D / 2 multiplies per lane. (A
    // max allowed to lag the scores would skip more, but the largest p would no longer be exactly 1 in
    // bf16: ~5% more error.)
    float chunk_max[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      chunk_max[h] = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int key = nt * 8 + 2 * t + e;
          const bool visible = ((valid >> key) & 1u) && j0 + key <= limit[h];
          float& x = s[nt][2 * h + e];
          x = visible ? x * scale_log2 : -INFINITY;
          chunk_max[h] = fmaxf(chunk_max[h], x);
        }
      chunk_max[h] = fmaxf(chunk_max[h], __shfl_xor_sync(0xffffffffu, chunk_max[h], 1));
      chunk_max[h] = fmaxf(chunk_max[h], __shfl_xor_sync(0xffffffffu, chunk_max[h], 2));
    }
    // A row that has seen nothing yet (m = −inf) grows on its first visible key.
    if (__any_sync(0xffffffffu, chunk_max[0] > m[0] || chunk_max[1] > m[1])) {
      float factor[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float new_max = fmaxf(m[h], chunk_max[h]);
        factor[h] = m[h] == -INFINITY ? 0.f : exp2_approx(m[h] - new_max);
        m[h] = new_max;
        l[h] *= factor[h];
      }
#pragma unroll
      for (int nd = 0; nd < D / 8; ++nd) {
        o[nd][0] *= factor[0], o[nd][1] *= factor[0];
        o[nd][2] *= factor[1], o[nd][3] *= factor[1];
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float base = m[h] == -INFINITY ? 0.f : m[h];  // nothing seen yet: every p is 0
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = s[nt][2 * h + e];
          x = exp2_approx(x - base);
          sum += x;
        }
      l[h] += sum;  // this lane's columns; the quad's are summed at the end
    }

    // O += P V: P's accumulators are the A fragment as they lie (mma.cuh's layouts).
    const uint32_t pa[4] = {pack2<E>(s[0][0], s[0][1]), pack2<E>(s[0][2], s[0][3]), pack2<E>(s[1][0], s[1][1]),
                            pack2<E>(s[1][2], s[1][3])};
#pragma unroll
    for (int nd = 0; nd < D / 8; nd += 2) {
      uint32_t vf[4];
      ldmatrix_x4_trans_ordered(vf, vt + stage_piece<D>(((lane / 8) % 2) * 8 + lane % 8, nd + lane / 16));
      mma16816<E>(o[nd], pa, vf[0], vf[1]);
      mma16816<E>(o[nd + 1], pa, vf[2], vf[3]);
    }
    __syncwarp();  // every lane is done with this stage before it is refilled
  }
  cp_async_wait_committed();
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
  }

  // Merge the warps: each leaves (m, l, o) of its keys in shared memory (over the stages).
  __syncthreads();
  constexpr int OLD = Cfg::kOutLd;
  float* o_w = reinterpret_cast<float*>(ring);
  float* m_w = o_w + kWarps * kRows * OLD;
  float* l_w = m_w + kWarps * kRows;
#pragma unroll
  for (int nd = 0; nd < D / 8; ++nd) {
    *reinterpret_cast<float2*>(o_w + (warp * kRows + g) * OLD + nd * 8 + 2 * t) = make_float2(o[nd][0], o[nd][1]);
    *reinterpret_cast<float2*>(o_w + (warp * kRows + g + 8) * OLD + nd * 8 + 2 * t) = make_float2(o[nd][2], o[nd][3]);
  }
  if (t == 0) {
    m_w[warp * kRows + g] = m[0], m_w[warp * kRows + g + 8] = m[1];
    l_w[warp * kRows + g] = l[0], l_w[warp * kRows + g + 8] = l[1];
  }
  __syncthreads();
  // Each row's weights (warp w's share exp2(m_w − max) / Σ) and lse, once per row; then 4 columns per thread.
  float* weight_w = l_w + kWarps * kRows;
  float* lse_r = weight_w + kWarps * kRows;
  if (threadIdx.x < kRows) {
    const int r = threadIdx.x;
    float top = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) top = fmaxf(top, m_w[w * kRows + r]);
    float weight[kWarps], sum = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float mw = m_w[w * kRows + r];
      weight[w] = mw == -INFINITY ? 0.f : exp2_approx(mw - top);
      sum += weight[w] * l_w[w * kRows + r];
    }
#pragma unroll
    for (int w = 0; w < kWarps; ++w) weight_w[w * kRows + r] = sum > 0.f ? weight[w] / sum : 0.f;
    lse_r[r] = sum > 0.f ? (top + log2f(sum)) * 0.6931471805599453f : -INFINITY;
  }
  __syncthreads();
  const int64_t total = int64_t(p.batch) * p.q_heads * p.q_len;
  for (int idx = threadIdx.x; idx < rows * (D / 4); idx += kThreads) {
    const int r = idx / (D / 4), col = (idx % (D / 4)) * 4;
    float4 value = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float weight = weight_w[w * kRows + r];
      const float4 x = *reinterpret_cast<const float4*>(o_w + (w * kRows + r) * OLD + col);
      value.x += weight * x.x, value.y += weight * x.y, value.z += weight * x.z, value.w += weight * x.w;
    }
    const int rr = row0 + r, i = rr / p.group, h = kv_head * p.group + rr % p.group;
    if (p.splits == 1) {
      store_columns4(static_cast<E*>(p.o) + b * p.o_stride[0] + i * p.o_stride[1] + h * p.o_stride[2] +
                         col * p.o_stride[3],
                     p.o_stride[3], value);
      if (col == 0 && p.lse != nullptr) p.lse[b * p.lse_stride[0] + h * p.lse_stride[1] + i * p.lse_stride[2]] = lse_r[r];
    } else {
      const int64_t row = (int64_t(b) * p.q_heads + h) * p.q_len + i;
      float* part = p.part_o + (split * total + row) * D + col;
      part[0] = value.x, part[1] = value.y, part[2] = value.z, part[3] = value.w;
      if (col == 0) p.part_lse[split * total + row] = lse_r[r];
    }
  }
}

constexpr int kCombineThreads = 128;

// A CTA-wide reduction (every thread gets the result); `scratch` holds a float per warp.
template <bool kMax>
__device__ __forceinline__ float cta_reduce(float x, float* scratch) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) {
    const float y = __shfl_xor_sync(0xffffffffu, x, off);
    x = kMax ? fmaxf(x, y) : x + y;
  }
  __syncthreads();  // scratch is free (a previous reduction has been read)
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = x;
  __syncthreads();
  x = scratch[0];
  for (int w = 1; w < kCombineThreads / 32; ++w) x = kMax ? fmaxf(x, scratch[w]) : x + scratch[w];
  return x;
}

constexpr int kFewSplits = 16;
constexpr int kCombineRows = kCombineThreads / 32;  // rows per CTA of combine_rows_kernel: a warp each

// Whether combine_rows_kernel takes the merge: up to kFewSplits splits and 4 columns per lane.
bool merge_by_rows(const Params& p) { return p.splits <= kFewSplits && p.value_dim <= 128 && p.value_dim % 4 == 0; }

// Merges the splits' partials of one (sequence, head, query) per warp: weights exp(lse_s − lse). Each lane
// loads every split's lse and its 4 columns' partials at once and reduces them itself: one memory round trip,
// no barrier, and a CTA's index arithmetic shared by 4 rows. Grid: (⌈Hq · Tq / kCombineRows⌉, B).
template <class E>
__global__ void __launch_bounds__(kCombineThreads) combine_rows_kernel(Params p) {
  wait_for_previous_grid();  // launched while the split kernel runs: its partials are complete from here
  const int per_sequence = p.q_heads * p.q_len;
  const int r = blockIdx.x * kCombineRows + threadIdx.x / 32;
  if (r >= per_sequence) return;
  const int b = blockIdx.y, h = r / p.q_len, i = r % p.q_len;
  const int64_t total = int64_t(p.batch) * per_sequence, row = int64_t(b) * per_sequence + r;
  const int d = (threadIdx.x % 32) * 4;
  const bool mine = d < p.value_dim;
  float l[kFewSplits];
  float4 x[kFewSplits];
#pragma unroll
  for (int s = 0; s < kFewSplits; ++s) {
    l[s] = s < p.splits ? p.part_lse[s * total + row] : -INFINITY;
    x[s] = s < p.splits && mine ? *reinterpret_cast<const float4*>(p.part_o + (s * total + row) * p.value_dim + d)
                                : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  float m = -INFINITY;
#pragma unroll
  for (int s = 0; s < kFewSplits; ++s) m = fmaxf(m, l[s]);
  float denom = 0.f;
  float4 value = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int s = 0; s < kFewSplits; ++s) {
    const float weight = l[s] == -INFINITY ? 0.f : __expf(l[s] - m);
    denom += weight;
    value.x += weight * x[s].x, value.y += weight * x[s].y, value.z += weight * x[s].z, value.w += weight * x[s].w;
  }
  const float inv = denom > 0.f ? 1.f / denom : 0.f;
  if (mine)
    store_columns4(static_cast<E*>(p.o) + b * p.o_stride[0] + i * p.o_stride[1] + h * p.o_stride[2] + d * p.o_stride[3],
                   p.o_stride[3], value, inv);
  if (d == 0 && p.lse != nullptr)
    p.lse[b * p.lse_stride[0] + h * p.lse_stride[1] + i * p.lse_stride[2]] = denom > 0.f ? m + logf(denom) : -INFINITY;
}

// The general merge, a CTA per (sequence, head, query): the max and the denominator are reduced over the CTA,
// and each column's sum reads 8 splits' partials before using them, so their loads are in flight together
// rather than one split's latency after another.
template <class E>
__global__ void __launch_bounds__(kCombineThreads) combine_kernel(Params p) {
  __shared__ float scratch[kCombineThreads / 32];
  const int value_dim = p.value_dim;
  wait_for_previous_grid();  // launched while the split kernel runs: its partials are complete from here
  const int64_t row = blockIdx.x;
  const int64_t total = int64_t(p.batch) * p.q_heads * p.q_len;
  const int i = int(row % p.q_len), h = int((row / p.q_len) % p.q_heads), b = int(row / (int64_t(p.q_len) * p.q_heads));
  float m = -INFINITY;
  for (int s = threadIdx.x; s < p.splits; s += kCombineThreads) m = fmaxf(m, p.part_lse[s * total + row]);
  m = cta_reduce<true>(m, scratch);
  float denom = 0.f;
  for (int s = threadIdx.x; s < p.splits; s += kCombineThreads) {
    const float l = p.part_lse[s * total + row];
    denom += l == -INFINITY ? 0.f : __expf(l - m);
  }
  denom = cta_reduce<false>(denom, scratch);
  E* o = static_cast<E*>(p.o);
  for (int d = threadIdx.x; d < value_dim; d += kCombineThreads) {
    float value = 0.f;
    if (denom > 0.f) {
      constexpr int kBatch = 8;
      int s = 0;
      for (; s + kBatch <= p.splits; s += kBatch) {
        float l[kBatch], x[kBatch];
#pragma unroll
        for (int k = 0; k < kBatch; ++k) {
          l[k] = p.part_lse[(s + k) * total + row];
          x[k] = p.part_o[((s + k) * total + row) * value_dim + d];
        }
#pragma unroll
        for (int k = 0; k < kBatch; ++k)
          if (l[k] != -INFINITY) value += __expf(l[k] - m) * x[k];
      }
      for (; s < p.splits; ++s) {
        const float l = p.part_lse[s * total + row];
        if (l != -INFINITY) value += __expf(l - m) * p.part_o[(s * total + row) * value_dim + d];
      }
      value /= denom;
    }
    o[b * p.o_stride[0] + i * p.o_stride[1] + h * p.o_stride[2] + d * p.o_stride[3]] = from_float<E>(value);
  }
  if (threadIdx.x == 0 && p.lse != nullptr)
    p.lse[b * p.lse_stride[0] + h * p.lse_stride[1] + i * p.lse_stride[2]] = denom > 0.f ? m + logf(denom) : -INFINITY;
}

void check_supported(const AttentionKvCacheArgs& a, const KvCacheProblem& p) {
  if (a.q.dtype == DType::f64)
    check::fail(ErrorKind::unsupported, "q",
                "CUDA attention_with_kvcache runs float32, bfloat16 and float16, got float64; for float64 use the "
                "CPU backend (tensors on the CPU)");
  if (p.head_dim != 64 && p.head_dim != 128)
    check::fail(ErrorKind::unsupported, "q",
                "CUDA attention_with_kvcache runs head dims 64 and 128, got D = " + std::to_string(p.head_dim) +
                    "; the CPU backend runs any head dim");
  if (p.value_dim != p.head_dim)
    check::fail(ErrorKind::unsupported, "v_cache",
                "CUDA attention_with_kvcache needs Dv == D, got Dv = " + std::to_string(p.value_dim) + " and D = " +
                    std::to_string(p.head_dim) + "; the CPU backend runs any Dv");
  const int64_t limit = int64_t(1) << 30;
  if (p.capacity >= limit || p.q_len * p.q_heads >= limit)
    check::fail(ErrorKind::unsupported, "k_cache", "CUDA attention_with_kvcache takes sizes below 2^30");
  // Grid dimensions y and z: sequences, and KV heads × query-row chunks.
  if (p.batch > 65535 || p.kv_heads * ceil_div(p.q_len * (p.q_heads / p.kv_heads), kRows) > 65535)
    check::fail(ErrorKind::unsupported, "q", "CUDA attention_with_kvcache takes B ≤ 65535 and Hkv · ⌈Tq · Hq/Hkv / 16⌉ ≤ 65535");
}

int sm_count(int device) {
  int count = 0;
  check_cuda(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  return count;
}

// 16-byte loads need a unit stride along D and every other stride, and the pointer, 16-byte aligned.
bool vector_loads(const TensorView& t) {
  const int64_t elems = 16 / int64_t(dtype_size(t.dtype));
  if (t.stride[3] != 1 || reinterpret_cast<uintptr_t>(t.data) % 16 != 0) return false;
  for (int d = 0; d < 3; ++d)
    if (t.stride[d] % elems != 0) return false;
  return true;
}

// The tensor-core kernel takes bf16 and fp16 caches that allow 16-byte copies; fp32 and other layouts take
// the general kernel.
bool tensor_core_path(const AttentionKvCacheArgs& a) {
  return a.q.dtype != DType::f32 && vector_loads(a.k_cache) && vector_loads(a.v_cache);
}

// Lets the kernel use its shared memory (over the 48 KB default) on the current device; set before every
// launch, as the other kernels do, so nothing depends on an earlier call.
template <class E, int D>
void allow_mma_smem() {
  check_cuda(cudaFuncSetAttribute(mma_split_kernel<E, D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  int(MmaConfig<D>::kSmemBytes)),
             "cudaFuncSetAttribute (attention_with_kvcache)");
}

// Key splits per (sequence, KV head, row chunk) and keys per split (kvcache_plan.h), from the SMs (and for
// the general kernel its resident CTAs). Reads nothing from the device.
KvCachePlan plan_splits(const AttentionKvCacheArgs& a, const KvCacheProblem& p) {
  DeviceGuard guard(a.q.device.index);
  KvCachePlanInput in;
  in.units = p.batch * p.kv_heads * ceil_div(p.q_len * (p.q_heads / p.kv_heads), kRows);
  in.max_seqlen_k = p.max_seqlen_k;
  in.forced = a.num_splits;
  const int64_t sms = sm_count(a.q.device.index);
  if (tensor_core_path(a)) {
    // Splits of whole 64-key steps (4 warps × 16 keys); the plan's fixed cost keeps them from getting short.
    in.tile = kWarps * kChunk;
    in.min_keys = kWarps * kChunk;
    // One CTA per SM: a second CTA on an SM shares its issue rate rather than adding to it (measured: B1 L16K
    // in 8 splits, 128 CTAs, 40 µs; in 9, 144 CTAs, 50 µs), so the slots are the SMs though two fit.
    in.slots = sms;
    in.combine_keys = 192;  // the combine kernel: about 3 µs, a CTA's time for about 200 keys
  } else {
    in.tile = a.q.dtype == DType::f32 ? key_tile<float>() : key_tile<__nv_bfloat16>();
    in.min_keys = 128;
    in.slots = 4 * sms;  // about four resident per SM, limited by shared memory
  }
  return plan_kvcache(in);
}

template <class E>
void launch(const Params& prm, const KvCacheProblem& p, bool tensor_cores, bool overlap, cudaStream_t stream) {
  if (p.append && !tensor_cores) {  // the tensor-core kernel appends by itself
    append_kernel<E><<<dim3(unsigned(p.batch * p.q_len), unsigned(p.kv_heads)), 128, 0, stream>>>(
        prm, int(p.head_dim), int(p.value_dim));
    check_cuda(cudaGetLastError(), "attention_with_kvcache append kernel launch");
  }
  const dim3 grid(unsigned(prm.splits), unsigned(p.kv_heads * prm.row_chunks), unsigned(p.batch));
  if constexpr (!std::is_same_v<E, float>) {
    if (tensor_cores) {
      if (p.head_dim == 64) {
        allow_mma_smem<E, 64>();
        mma_split_kernel<E, 64><<<grid, kThreads, MmaConfig<64>::kSmemBytes, stream>>>(prm);
      } else {
        allow_mma_smem<E, 128>();
        mma_split_kernel<E, 128><<<grid, kThreads, MmaConfig<128>::kSmemBytes, stream>>>(prm);
      }
    }
  }
  if (!tensor_cores) {
    if (p.head_dim == 64)
      split_kernel<E, 64><<<grid, kThreads, 0, stream>>>(prm);
    else
      split_kernel<E, 128><<<grid, kThreads, 0, stream>>>(prm);
  }
  check_cuda(cudaGetLastError(), "attention_with_kvcache kernel launch");
  if (prm.splits > 1 && merge_by_rows(prm)) {
    const dim3 rows_grid(unsigned(ceil_div(p.q_heads * p.q_len, kCombineRows)), unsigned(p.batch));
    launch_after_previous(combine_rows_kernel<E>, rows_grid, dim3(kCombineThreads), 0, stream, overlap, prm,
                          "attention_with_kvcache combine kernel launch");
  } else if (prm.splits > 1) {
    launch_after_previous(combine_kernel<E>, dim3(unsigned(p.batch * p.q_heads * p.q_len)), dim3(kCombineThreads), 0,
                          stream, overlap, prm, "attention_with_kvcache combine kernel launch");
  }
}

// The splits' lse, then their partial outputs from a 16-byte boundary (the combine reads 4 columns at once).
int64_t partial_lse_floats(const KvCacheProblem& p, int splits) {
  return (int64_t(splits) * p.batch * p.q_heads * p.q_len + 3) / 4 * 4;
}

size_t workspace_for(const KvCacheProblem& p, int splits) {
  if (splits <= 1) return 0;
  const int64_t partial_floats = int64_t(splits) * p.batch * p.q_heads * p.q_len * p.value_dim;
  return size_t(partial_lse_floats(p, splits) + partial_floats) * sizeof(float);
}

void copy_strides(const TensorView& t, int64_t* out, int n) {
  for (int d = 0; d < n; ++d) out[d] = t.stride[d];
}

}  // namespace

size_t attention_with_kvcache_workspace_bytes(const AttentionKvCacheArgs& a, const KvCacheProblem& p) {
  check_supported(a, p);
  return workspace_for(p, plan_splits(a, p).splits);
}

void attention_with_kvcache(const AttentionKvCacheArgs& a, const KvCacheProblem& p) {
  check_supported(a, p);
  DeviceGuard guard(a.q.device.index);
  const auto stream = static_cast<cudaStream_t>(a.stream);
  Params prm{};
  prm.q = a.q.data, prm.k_cache = a.k_cache.data, prm.v_cache = a.v_cache.data;
  prm.cache_seqlens = static_cast<const int*>(a.cache_seqlens.data);
  prm.block_table = p.paged ? static_cast<const int*>(a.block_table.data) : nullptr;
  prm.k_new = p.append ? a.k.data : nullptr;
  prm.v_new = p.append ? a.v.data : nullptr;
  prm.o = a.o.data;
  prm.lse = a.lse.defined() ? static_cast<float*>(a.lse.data) : nullptr;
  copy_strides(a.q, prm.q_stride, 4);
  copy_strides(a.k_cache, prm.kc_stride, 4);
  copy_strides(a.v_cache, prm.vc_stride, 4);
  if (p.append) copy_strides(a.k, prm.kn_stride, 4), copy_strides(a.v, prm.vn_stride, 4);
  copy_strides(a.o, prm.o_stride, 4);
  if (a.lse.defined()) copy_strides(a.lse, prm.lse_stride, 3);
  // The cache stride of a sequence (contiguous) is multiplied by b, a block's by its index: both by stride[0].
  prm.table_stride[0] = p.paged ? a.block_table.stride[0] : 0;
  prm.table_stride[1] = p.paged ? a.block_table.stride[1] : 0;
  prm.batch = int(p.batch), prm.q_len = int(p.q_len), prm.q_heads = int(p.q_heads), prm.kv_heads = int(p.kv_heads);
  prm.group = int(p.q_heads / p.kv_heads);
  prm.capacity = int(p.capacity), prm.block_size = int(p.block_size), prm.num_blocks = int(p.num_blocks);
  prm.row_chunks = ceil_div(p.q_len * prm.group, kRows);
  prm.value_dim = int(p.value_dim);
  const KvCachePlan plan = plan_splits(a, p);
  prm.splits = plan.splits, prm.keys_per_split = plan.keys_per_split;
  prm.scale = float(p.scale);
  prm.causal = p.causal, prm.append = p.append;
  prm.vec_k = vector_loads(a.k_cache), prm.vec_v = vector_loads(a.v_cache), prm.vec_q = vector_loads(a.q);
  const bool tensor_cores = tensor_core_path(a);
  // The combine may start early only where the code the device runs has its griddepcontrol wait (code built
  // for sm_90 or newer; an sm_80 build compiles it out, whatever the device), as for the GLA kernels.
  const bool overlap = prm.splits > 1 && loaded_code().sm90;
  const size_t needed = workspace_for(p, prm.splits);
  Scratch scratch(a.workspace, a.workspace_bytes, a.allocate_workspace, needed, stream,
                  "attention_with_kvcache_workspace_bytes", "workspace", 16);
  if (needed > 0) {
    prm.part_lse = scratch.floats();
    prm.part_o = scratch.floats() + partial_lse_floats(p, prm.splits);
  }
  switch (a.q.dtype) {
    case DType::f32: launch<float>(prm, p, false, overlap, stream); break;
    case DType::bf16: launch<__nv_bfloat16>(prm, p, tensor_cores, overlap, stream); break;
    case DType::f16: launch<__half>(prm, p, tensor_cores, overlap, stream); break;
    default: break;  // f64 refused in check_supported
  }
}

}  // namespace flashgla::cuda
