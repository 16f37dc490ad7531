// CUDA side of the linear-attention normaliser (flashgla/gla_normalize.h) as a parallel scan over
// chunks of kChunk steps (the cut: plan/normalize_layout.h), so that it runs at memory speed with
// one block per (chunk, head) instead of one per (sequence, head).
//
// Forward:  (1) key_sums: Σ k over each chunk -> workspace [slots, H, K];
//           (2) scan_chunks: per (sequence, head, key column) the exclusive prefix over the chunks
//               from z_init (z at each chunk's start), and z_final;
//           (3) normalize_chunks: per chunk, the running z, den_t = scale·q_t·z_t + 1e-10 and
//               o_t = o_raw_t / den_t.
// Backward: (1) and (2) as above for z; (3) backward_chunks: den_t, d_o_raw = d_o / den,
//           d_den_t = -(d_o_t·o_raw_t) / den_t², dq_t = d_den_t·scale·z_t, d_den into the workspace
//           and Σ d_den·scale·q over each chunk; (4) scan_chunks backwards over those sums from
//           d_z_final (what is left at the start is d_z_init); (5) key_grad_chunks: dk_t =
//           (that suffix) + Σ over the chunk's steps from t on of d_den·scale·q.
// All sums in fp32. Rows are read as 16-byte vectors where every row of the pass allows it, else one
// element at a time: a run-time flag, so that each kernel is built once per dtype (at_width below).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/gla_options_backend.h"
#include "cuda/common/dtype.cuh"
#include "cuda/common/host.cuh"
#include "cuda/common/sequences.cuh"
#include "cuda/gla/host/gla_host.cuh"
#include "cuda/gla/plan/normalize_layout.h"

namespace flashgla::cuda {
namespace {

using norm::ChunkSlots;
using norm::kChunk;

constexpr float kNormalizeEps = norm::kEps;

// A small [N, H, K] tensor of any float dtype (z_init, z_final, d_z_final, d_z_init), read per element.
struct Any {
  void* data = nullptr;
  DType dtype = DType::f32;
  int64_t stride[3] = {0, 0, 0};
};

Any any_of(const TensorView& t) {
  Any a;
  if (!t.defined()) return a;
  a.data = t.data, a.dtype = t.dtype;
  for (int d = 0; d < 3; ++d) a.stride[d] = t.stride[d];
  return a;
}

__device__ __forceinline__ float load(const Any& t, int64_t n, int64_t h, int64_t d) {
  const int64_t at = n * t.stride[0] + h * t.stride[1] + d * t.stride[2];
  switch (t.dtype) {
    case DType::f32: return static_cast<const float*>(t.data)[at];
    case DType::bf16: return __bfloat162float(static_cast<const __nv_bfloat16*>(t.data)[at]);
    case DType::f16: return __half2float(static_cast<const __half*>(t.data)[at]);
    default: return float(static_cast<const double*>(t.data)[at]);
  }
}

__device__ __forceinline__ void store_f32(const Any& t, int64_t n, int64_t h, int64_t d, float x) {
  static_cast<float*>(t.data)[n * t.stride[0] + h * t.stride[1] + d * t.stride[2]] = x;  // f32 (checked)
}

// A [B, T, H, D] tensor of element type E.
template <class E>
struct Rows {
  E* data = nullptr;
  int64_t stride[4] = {0, 0, 0, 0};
  __device__ __forceinline__ E* at(int64_t b, int64_t t, int64_t h, int64_t d) const {
    return data + b * stride[0] + t * stride[1] + h * stride[2] + d * stride[3];
  }
};

template <class E>
Rows<E> rows_of(const TensorView& t) {
  Rows<E> r;
  r.data = static_cast<E*>(t.data);
  for (int d = 0; d < 4; ++d) r.stride[d] = t.stride[d];
  return r;
}

// A row width: elements per load.
template <int VEC>
struct Width {
  static constexpr int elements = VEC;
};

template <class E>
constexpr int kVector = int(16 / sizeof(E));

// f(Width<kVector<E>>{}) for rows read as 16-byte vectors, f(Width<1>{}) otherwise: each loop exists at
// both widths in one kernel, and the flag is uniform over the grid, so the branch costs no divergence.
// The loops over a lane's column vectors carry `unroll 1`: the compiler unrolls only the one-element ones,
// and as both widths share the kernel's registers, that would cost the 16-byte path occupancy (fp32:
// about 100 registers instead of 48).
template <class E, class F>
__device__ __forceinline__ auto at_width(bool vector, F&& f) {
  if (vector) return f(Width<kVector<E>>{});
  return f(Width<1>{});
}

// x[0, VEC) = VEC elements from column d on: one 16-byte load when VEC > 1 (the host checked alignment),
// else one element.
template <int VEC, class E>
__device__ __forceinline__ void load_vec(const Rows<E>& r, int64_t b, int64_t t, int64_t h, int64_t d, float* x,
                                         Width<VEC>) {
  if constexpr (VEC == 1) {
    x[0] = to_float(*r.at(b, t, h, d));
  } else {
    static_assert(VEC * sizeof(E) == 16, "vector loads are 16 bytes");
    const uint4 raw = *reinterpret_cast<const uint4*>(r.at(b, t, h, d));
    const E* e = reinterpret_cast<const E*>(&raw);
#pragma unroll
    for (int i = 0; i < VEC; ++i) x[i] = to_float(e[i]);
  }
}

template <int VEC, class E>
__device__ __forceinline__ void store_vec(const Rows<E>& r, int64_t b, int64_t t, int64_t h, int64_t d,
                                          const float* x, Width<VEC>) {
  if constexpr (VEC == 1) {
    *r.at(b, t, h, d) = from_float<E>(x[0]);
  } else {
    uint4 raw;
    E* e = reinterpret_cast<E*>(&raw);
#pragma unroll
    for (int i = 0; i < VEC; ++i) e[i] = from_float<E>(x[i]);
    *reinterpret_cast<uint4*>(r.at(b, t, h, d)) = raw;
  }
}

// dst[b, t, h, :] = src[b, t, h, :] / den over this lane's vectors of the row (lanes apart); `first` holds its
// first vector (v = lane), loaded early for latency.
template <int VV, class E>
__device__ __forceinline__ void store_row_over(const Rows<E>& src, const Rows<E>& dst, int64_t b, int64_t t,
                                               int64_t h, int64_t V, int lane, int lanes, const float* first,
                                               float den, Width<VV> w) {
#pragma unroll 1
  for (int64_t v = lane; v * VV < V; v += lanes) {
    float x[VV];
    if (v == lane) {
#pragma unroll
      for (int i = 0; i < VV; ++i) x[i] = first[i];
    } else {
      load_vec(src, b, t, h, v * VV, x, w);
    }
#pragma unroll
    for (int i = 0; i < VV; ++i) x[i] /= den;
    store_vec(dst, b, t, h, v * VV, x, w);
  }
}

template <class E>
struct Params {
  Rows<E> q, k, o_raw, o;                 // forward
  Rows<E> d_o, d_o_raw, dq, dk;           // backward
  Any z_init, z_final, d_z_final, d_z_init;
  Sequences seqs;  // seqs.total_len: T
  ChunkSlots slots;
  int64_t heads = 0, K = 0, V = 0;
  int lanes = 0, teams = 0, steps_per_team = 0;
  float scale = 1.f;
  bool reverse = false;
  bool o_raw_is_output = false;  // backward: o_raw holds o = o_raw / den (GlaNormalizeBackwardArgs)
  bool vector_keys = false;    // q, k (dq, dk) rows as 16-byte vectors
  bool vector_values = false;  // o_raw, o (d_o, d_o_raw) rows as 16-byte vectors
  float* key_sums = nullptr;   // [slots, H, K]: Σ k per chunk, then z at each chunk's start
  float* grad_sums = nullptr;  // [slots, H, K]: Σ d_den·scale·q per chunk, then what follows each chunk
  float* d_den = nullptr;      // [slots, H, kChunk]
};

// The scan kernel's view (dtype-free).
struct ScanParams {
  Sequences seqs;
  ChunkSlots slots;
  int64_t heads = 0, K = 0;
  float* sums = nullptr;  // [slots, H, K]
  Any init, final_out;    // optional
  bool backwards = false;
};

// This block's chunk: sequence, chunk index, its steps [step0, step0 + steps).
struct Chunk {
  SeqSpan seq;
  int64_t n, slot, step0;
  int steps;
};

__device__ __forceinline__ bool this_chunk(const Sequences& seqs, const ChunkSlots& slots, Chunk& c) {
  c.slot = blockIdx.x;
  int64_t chunk = 0;
  const auto boundary_at = [&](int64_t i) { return boundary(seqs, i); };
  if (!norm::locate_slot(slots, c.slot, boundary_at, c.n, chunk)) return false;
  c.seq = sequence_span(seqs, c.n);
  c.step0 = chunk * kChunk;
  const int64_t left = c.seq.len - c.step0;
  c.steps = int(left < kChunk ? left : kChunk);
  return c.steps > 0;
}

// Σ of x over the team's lanes (an aligned group of `lanes` lanes of one warp); every lane of the warp calls it.
__device__ __forceinline__ float team_sum(float x, int lanes) {
  for (int offset = lanes / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// The z of a chunk's start (from key_sums after the scan) into zs[team][·], each team's entry moved on by
// the keys of the teams before it. Lane-private columns when there is one team; a block-wide pass otherwise.
template <int VK, class E>
__device__ void team_starts(const Params<E>& p, const Chunk& c, int64_t h, float* zs, Width<VK> w) {
  const int team = threadIdx.x / p.lanes, lane = threadIdx.x % p.lanes;
  const float* start = p.key_sums + (c.slot * p.heads + h) * p.K;
  if (p.teams == 1) {
#pragma unroll 1
    for (int64_t v = lane; v * VK < p.K; v += p.lanes)
#pragma unroll
      for (int i = 0; i < VK; ++i) zs[v * VK + i] = start[v * VK + i];
    return;  // each lane reads back only the column vectors it wrote
  }
  float* own = zs + team * p.K;
#pragma unroll 1
  for (int64_t v = lane; v * VK < p.K; v += p.lanes) {
    float sum[VK] = {};
    for (int j = 0; j < p.steps_per_team; ++j) {
      const int64_t step = c.step0 + team * p.steps_per_team + j;
      if (step >= c.step0 + c.steps) break;
      float x[VK];
      load_vec(p.k, c.seq.batch, norm::step_row(c.seq.begin, c.seq.len, step, p.reverse), h, v * VK, x, w);
#pragma unroll
      for (int i = 0; i < VK; ++i) sum[i] += x[i];
    }
#pragma unroll
    for (int i = 0; i < VK; ++i) own[v * VK + i] = sum[i];
  }
  __syncthreads();
  for (int64_t d = threadIdx.x; d < p.K; d += blockDim.x) {
    float run = start[d];
    for (int t = 0; t < p.teams; ++t) {
      const float x = zs[t * p.K + d];
      zs[t * p.K + d] = run;
      run += x;
    }
  }
  __syncthreads();
}

// Step j of this thread's team: its step index, and whether the chunk has it.
template <class E>
__device__ __forceinline__ bool team_step(const Params<E>& p, const Chunk& c, int j, int64_t& step) {
  step = c.step0 + (threadIdx.x / p.lanes) * p.steps_per_team + j;
  return step < c.step0 + c.steps;
}

// q_t·z_t over the team, z moving on by k_t in zs (this lane's columns); every lane of the warp calls it.
template <int VK, class E>
__device__ __forceinline__ float advance_and_dot(const Params<E>& p, const Chunk& c, int64_t h, int64_t t, bool active,
                                                 float* z, Width<VK> w) {
  const int lane = threadIdx.x % p.lanes;
  float partial = 0.f;
  if (active)
#pragma unroll 1
    for (int64_t v = lane; v * VK < p.K; v += p.lanes) {
      float kk[VK], qq[VK];
      load_vec(p.k, c.seq.batch, t, h, v * VK, kk, w);
      load_vec(p.q, c.seq.batch, t, h, v * VK, qq, w);
#pragma unroll
      for (int i = 0; i < VK; ++i) {
        const float zz = z[v * VK + i] + kk[i];
        z[v * VK + i] = zz;
        partial += qq[i] * zz;
      }
    }
  return team_sum(partial, p.lanes);
}

// ---- kernels ---------------------------------------------------------------------

// Σ k over each chunk: each team sums its steps, then the teams' sums are added in team order.
template <int VK, class E>
__device__ __forceinline__ void key_sums(const Params<E>& p, Width<VK> w) {
  extern __shared__ float shared[];
  Chunk c;
  if (!this_chunk(p.seqs, p.slots, c)) return;
  const int64_t h = blockIdx.y;
  const int team = threadIdx.x / p.lanes, lane = threadIdx.x % p.lanes;
  float* own = shared + team * p.K;
#pragma unroll 1
  for (int64_t v = lane; v * VK < p.K; v += p.lanes) {
    float sum[VK] = {};
    for (int j = 0; j < p.steps_per_team; ++j) {
      int64_t step;
      if (!team_step(p, c, j, step)) break;
      float x[VK];
      load_vec(p.k, c.seq.batch, norm::step_row(c.seq.begin, c.seq.len, step, p.reverse), h, v * VK, x, w);
#pragma unroll
      for (int i = 0; i < VK; ++i) sum[i] += x[i];
    }
#pragma unroll
    for (int i = 0; i < VK; ++i) own[v * VK + i] = sum[i];
  }
  __syncthreads();
  float* out = p.key_sums + (c.slot * p.heads + h) * p.K;
  for (int64_t d = threadIdx.x; d < p.K; d += blockDim.x) {
    float total = 0.f;
    for (int t = 0; t < p.teams; ++t) total += shared[t * p.K + d];
    out[d] = total;
  }
}

template <class E>
__global__ void key_sums_kernel(Params<E> p) {
  at_width<E>(p.vector_keys, [&](auto w) { key_sums(p, w); });
}

// Per (sequence, head, key column): the chunk sums become the exclusive prefix from init (forwards) or the
// exclusive suffix from init (backwards), and final_out gets the sum of all (init for an empty sequence).
__global__ void scan_chunks_kernel(ScanParams p) {
  const int64_t index = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (index >= p.slots.num_seqs * p.heads * p.K) return;
  const int64_t d = index % p.K, h = index / p.K % p.heads, n = index / (p.K * p.heads);
  const SeqSpan s = sequence_span(p.seqs, n);
  const int64_t first = norm::first_slot(p.slots, n, s.begin), chunks = norm::chunks_of(s.len);
  float run = p.init.data ? load(p.init, n, h, d) : 0.f;
  float* column = p.sums + h * p.K + d;
  const int64_t slot_stride = p.heads * p.K;
  constexpr int kBatch = 8;  // loads in flight per thread
  for (int64_t c0 = 0; c0 < chunks; c0 += kBatch) {
    float x[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int64_t c = p.backwards ? chunks - 1 - (c0 + j) : c0 + j;
      x[j] = c0 + j < chunks ? column[(first + c) * slot_stride] : 0.f;
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j)
      if (c0 + j < chunks) {
        const int64_t c = p.backwards ? chunks - 1 - (c0 + j) : c0 + j;
        column[(first + c) * slot_stride] = run;
        run += x[j];
      }
  }
  if (p.final_out.data) store_f32(p.final_out, n, h, d, run);
}

// o_t = o_raw_t / (scale·q_t·z_t + eps). Shared: z per team [teams][K].
template <class E>
__global__ void normalize_chunks_kernel(Params<E> p) {
  extern __shared__ float shared[];
  Chunk c;
  if (!this_chunk(p.seqs, p.slots, c)) return;
  const int64_t h = blockIdx.y;
  const int team = threadIdx.x / p.lanes, lane = threadIdx.x % p.lanes;
  at_width<E>(p.vector_keys, [&](auto w) { team_starts(p, c, h, shared, w); });
  float* z = shared + (p.teams == 1 ? 0 : team * p.K);
  for (int j = 0; j < p.steps_per_team; ++j) {
    int64_t step;
    const bool active = team_step(p, c, j, step);
    const int64_t t = active ? norm::step_row(c.seq.begin, c.seq.len, step, p.reverse) : 0;
    float first[kVector<E>];  // this lane's first o_raw vector, loaded before the sum over the team (latency)
    at_width<E>(p.vector_values, [&](auto w) {
      const int64_t d = int64_t(lane) * decltype(w)::elements;
      if (active && d < p.V) load_vec(p.o_raw, c.seq.batch, t, h, d, first, w);
    });
    const float dot = at_width<E>(p.vector_keys, [&](auto w) { return advance_and_dot(p, c, h, t, active, z, w); });
    const float den = p.scale * dot + kNormalizeEps;
    if (!active) continue;
    at_width<E>(p.vector_values,
                [&](auto w) { store_row_over(p.o_raw, p.o, c.seq.batch, t, h, p.V, lane, p.lanes, first, den, w); });
  }
}

// Blocks of kMaxThreads per SM that backward_chunks_kernel's registers must allow: as many as its 16-byte
// path alone allows (48 registers fp32, 64 for 16-bit types); unbounded, the two widths take 56 in fp32.
template <class E>
constexpr int kBackwardBlocksPerSm = sizeof(E) == 4 ? 5 : 4;

// Per chunk: d_o_raw, dq, d_den (workspace) and the chunk's Σ d_den·scale·q (grad_sums).
// Shared: z per team and Σ d_den·scale·q per team, [teams][K] each.
template <class E>
__global__ void __launch_bounds__(norm::kMaxThreads, kBackwardBlocksPerSm<E>) backward_chunks_kernel(Params<E> p) {
  extern __shared__ float shared[];
  Chunk c;
  if (!this_chunk(p.seqs, p.slots, c)) return;
  const int64_t h = blockIdx.y;
  const int team = threadIdx.x / p.lanes, lane = threadIdx.x % p.lanes;
  at_width<E>(p.vector_keys, [&](auto w) { team_starts(p, c, h, shared, w); });
  float* z = shared + (p.teams == 1 ? 0 : team * p.K);
  float* g = shared + p.teams * p.K + team * p.K;
  at_width<E>(p.vector_keys, [&](auto w) {
    constexpr int VK = decltype(w)::elements;
#pragma unroll 1
    for (int64_t v = lane; v * VK < p.K; v += p.lanes)
#pragma unroll
      for (int i = 0; i < VK; ++i) g[v * VK + i] = 0.f;  // lane-private column vectors, as z's
  });
  float* d_den_out = p.d_den + (c.slot * p.heads + h) * kChunk;
  for (int j = 0; j < p.steps_per_team; ++j) {
    int64_t step;
    const bool active = team_step(p, c, j, step);
    const int64_t t = active ? norm::step_row(c.seq.begin, c.seq.len, step, p.reverse) : 0;
    // d_o·o_raw first (it does not need den), keeping this lane's first d_o vector for d_o_raw.
    float dot = 0.f, first[kVector<E>];
    if (active)
      at_width<E>(p.vector_values, [&](auto w) {
        constexpr int VV = decltype(w)::elements;
#pragma unroll 1
        for (int64_t v = lane; v * VV < p.V; v += p.lanes) {
          float dout[VV], raw[VV];
          load_vec(p.d_o, c.seq.batch, t, h, v * VV, dout, w);
          load_vec(p.o_raw, c.seq.batch, t, h, v * VV, raw, w);
#pragma unroll
          for (int i = 0; i < VV; ++i) {
            dot += dout[i] * raw[i];
            if (v == lane) first[i] = dout[i];
          }
        }
      });
    const float q_dot_z =
        at_width<E>(p.vector_keys, [&](auto w) { return advance_and_dot(p, c, h, t, active, z, w); });
    const float den = p.scale * q_dot_z + kNormalizeEps;
    dot = team_sum(dot, p.lanes);
    if (!active) continue;
    at_width<E>(p.vector_values, [&](auto w) {
      store_row_over(p.d_o, p.d_o_raw, c.seq.batch, t, h, p.V, lane, p.lanes, first, den, w);
    });
    const float d_den = p.o_raw_is_output ? -dot / den : -dot / (den * den);  // d_o·o_raw = den · d_o·o
    if (lane == 0) d_den_out[step - c.step0] = d_den;
    const float dq_factor = d_den * p.scale;
    at_width<E>(p.vector_keys, [&](auto w) {
      constexpr int VK = decltype(w)::elements;
#pragma unroll 1
      for (int64_t v = lane; v * VK < p.K; v += p.lanes) {
        float qq[VK], out[VK];
        load_vec(p.q, c.seq.batch, t, h, v * VK, qq, w);
#pragma unroll
        for (int i = 0; i < VK; ++i) {
          out[i] = dq_factor * z[v * VK + i];
          g[v * VK + i] += dq_factor * qq[i];
        }
        store_vec(p.dq, c.seq.batch, t, h, v * VK, out, w);
      }
    });
  }
  __syncthreads();
  float* sums = p.grad_sums + (c.slot * p.heads + h) * p.K;
  for (int64_t d = threadIdx.x; d < p.K; d += blockDim.x) {
    float total = 0.f;
    for (int t = 0; t < p.teams; ++t) total += shared[p.teams * p.K + t * p.K + d];
    sums[d] = total;
  }
}

// dk_t = (d_z_final + Σ over the chunks after this one, from grad_sums after the backwards scan)
//        + Σ over this chunk's steps from t on of d_den·scale·q. Shared: the running sum per team [teams][K].
template <int VK, class E>
__device__ __forceinline__ void key_grad_chunks(const Params<E>& p, Width<VK> w) {
  extern __shared__ float shared[];
  Chunk c;
  if (!this_chunk(p.seqs, p.slots, c)) return;
  const int64_t h = blockIdx.y;
  const int team = threadIdx.x / p.lanes, lane = threadIdx.x % p.lanes;
  const float* after = p.grad_sums + (c.slot * p.heads + h) * p.K;
  const float* d_den = p.d_den + (c.slot * p.heads + h) * kChunk;
  float* acc = shared + (p.teams == 1 ? 0 : team * p.K);
  if (p.teams == 1) {
#pragma unroll 1
    for (int64_t v = lane; v * VK < p.K; v += p.lanes)
#pragma unroll
      for (int i = 0; i < VK; ++i) acc[v * VK + i] = after[v * VK + i];  // lane-private column vectors
  } else {
#pragma unroll 1
    for (int64_t v = lane; v * VK < p.K; v += p.lanes) {
      float sum[VK] = {};
      for (int j = 0; j < p.steps_per_team; ++j) {
        int64_t step;
        if (!team_step(p, c, j, step)) break;
        const float factor = d_den[step - c.step0] * p.scale;
        float qq[VK];
        load_vec(p.q, c.seq.batch, norm::step_row(c.seq.begin, c.seq.len, step, p.reverse), h, v * VK, qq, w);
#pragma unroll
        for (int i = 0; i < VK; ++i) sum[i] += factor * qq[i];
      }
#pragma unroll
      for (int i = 0; i < VK; ++i) acc[v * VK + i] = sum[i];
    }
    __syncthreads();
    for (int64_t d = threadIdx.x; d < p.K; d += blockDim.x) {  // suffix over the teams, the last team first
      float run = after[d];
      for (int t = p.teams - 1; t >= 0; --t) {
        const float x = shared[t * p.K + d];
        shared[t * p.K + d] = run;
        run += x;
      }
    }
    __syncthreads();
  }
  for (int j = p.steps_per_team - 1; j >= 0; --j) {
    int64_t step;
    if (!team_step(p, c, j, step)) continue;
    const int64_t t = norm::step_row(c.seq.begin, c.seq.len, step, p.reverse);
    const float factor = d_den[step - c.step0] * p.scale;
#pragma unroll 1
    for (int64_t v = lane; v * VK < p.K; v += p.lanes) {
      float qq[VK], out[VK];
      load_vec(p.q, c.seq.batch, t, h, v * VK, qq, w);
#pragma unroll
      for (int i = 0; i < VK; ++i) {
        out[i] = acc[v * VK + i] + factor * qq[i];
        acc[v * VK + i] = out[i];
      }
      store_vec(p.dk, c.seq.batch, t, h, v * VK, out, w);
    }
  }
}

template <class E>
__global__ void key_grad_chunks_kernel(Params<E> p) {
  at_width<E>(p.vector_keys, [&](auto w) { key_grad_chunks(p, w); });
}

// ---- host ------------------------------------------------------------------------

void require_dtype(const TensorView& t, const char* name) {
  FLASHGLA_REQUIRE(!t.defined() || t.dtype != DType::f64, ErrorKind::unsupported, name,
                   "the CUDA backend takes float32, bfloat16 or float16, got float64 (use the CPU backend)");
}

ChunkSlots slots_of(const TensorView& cu_seqlens, const GlaProblem& p) {
  return norm::chunk_slots(p.batch, p.seq_len, p.num_seqs, cu_seqlens.defined());
}

// Shared memory beyond 48 KB needs an opt-in per kernel; past the device's limit the key dimension is too large.
void set_shared(const void* kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return;
  int device = 0, limit = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device), "cudaDeviceGetAttribute");
  FLASHGLA_REQUIRE(bytes <= size_t(limit), ErrorKind::unsupported, "q",
                   "the CUDA normaliser keeps K fp32 values per thread team in shared memory: K is too large for "
                   "this device (" + std::to_string(bytes) + " bytes needed, " + std::to_string(limit) + " available)");
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)),
             "cudaFuncSetAttribute (normaliser)");
}

template <class E>
Params<E> params_of(const TensorView& o_raw, const TensorView& q, const TensorView& k, const TensorView& cu_seqlens,
                    bool reverse, const GlaProblem& p, const norm::TeamShape& shape) {
  Params<E> c;
  c.o_raw = rows_of<E>(o_raw), c.q = rows_of<E>(q), c.k = rows_of<E>(k);
  c.seqs = sequences_of(cu_seqlens, p.seq_len);
  c.slots = slots_of(cu_seqlens, p);
  c.heads = p.heads, c.K = p.key_dim, c.V = p.value_dim;
  c.lanes = shape.lanes, c.teams = shape.teams, c.steps_per_team = shape.steps_per_team;
  c.scale = float(p.scale), c.reverse = reverse;
  return c;
}

void scan(const ScanParams& s, cudaStream_t stream, const char* what) {
  const int64_t threads = s.slots.num_seqs * s.heads * s.K;
  if (threads == 0) return;
  constexpr int kScanThreads = 256;
  scan_chunks_kernel<<<unsigned((threads + kScanThreads - 1) / kScanThreads), kScanThreads, 0, stream>>>(s);
  check_cuda(cudaGetLastError(), what);
}

bool all_vector_rows(std::initializer_list<const TensorView*> tensors, int vec, int element_bytes) {
  for (const TensorView* t : tensors)
    if (!norm::vector_rows(*t, vec, element_bytes)) return false;
  return true;
}

// divide: o = o_raw / den; without, only z (the chunks' starts in key_sums, and z_final).
template <class E>
void forward_launch(const GlaNormalizeArgs& a, const GlaProblem& p, const Params<E>& c, const norm::TeamShape& shape,
                    bool divide, cudaStream_t stream) {
  const dim3 grid(unsigned(c.slots.count), unsigned(p.heads));
  const size_t smem = shape.team_array_bytes;
  if (c.slots.count > 0) {
    set_shared(reinterpret_cast<const void*>(key_sums_kernel<E>), smem);
    key_sums_kernel<E><<<grid, shape.threads, smem, stream>>>(c);
    check_cuda(cudaGetLastError(), "normaliser key_sums_kernel launch");
  }
  // Also with no tokens at all: z_final = z_init.
  ScanParams s;
  s.seqs = c.seqs, s.slots = c.slots, s.heads = p.heads, s.K = p.key_dim, s.sums = c.key_sums;
  s.init = any_of(a.z_init), s.final_out = any_of(a.z_final);
  scan(s, stream, "normaliser scan_chunks_kernel launch");
  if (divide && c.slots.count > 0) {
    set_shared(reinterpret_cast<const void*>(normalize_chunks_kernel<E>), smem);
    normalize_chunks_kernel<E><<<grid, shape.threads, smem, stream>>>(c);
    check_cuda(cudaGetLastError(), "normaliser normalize_chunks_kernel launch");
  }
}

template <class E>
void forward_typed(const GlaNormalizeArgs& a, const GlaProblem& p, float* workspace, bool divide = true) {
  const cudaStream_t stream = static_cast<cudaStream_t>(a.stream);
  constexpr int W = kVector<E>;
  const bool keys = all_vector_rows({&a.q, &a.k}, W, int(sizeof(E)));
  const bool values = all_vector_rows({&a.o_raw, &a.o}, W, int(sizeof(E)));
  const norm::TeamShape shape = norm::team_shape(p.key_dim, keys ? W : 1);
  Params<E> c = params_of<E>(a.o_raw, a.q, a.k, a.cu_seqlens, a.reverse, p, shape);
  c.o = rows_of<E>(a.o);
  c.key_sums = workspace;
  c.vector_keys = keys, c.vector_values = values;
  forward_launch(a, p, c, shape, divide, stream);
}

template <class E>
void backward_launch(const GlaNormalizeBackwardArgs& a, const GlaProblem& p, const Params<E>& c,
                     const norm::TeamShape& shape, cudaStream_t stream) {
  const dim3 grid(unsigned(c.slots.count), unsigned(p.heads));
  const size_t smem = shape.team_array_bytes;
  ScanParams s;
  s.seqs = c.seqs, s.slots = c.slots, s.heads = p.heads, s.K = p.key_dim;
  if (c.slots.count > 0) {
    set_shared(reinterpret_cast<const void*>(key_sums_kernel<E>), smem);
    key_sums_kernel<E><<<grid, shape.threads, smem, stream>>>(c);
    check_cuda(cudaGetLastError(), "normaliser key_sums_kernel launch");
    s.sums = c.key_sums, s.init = any_of(a.z_init);
    scan(s, stream, "normaliser scan_chunks_kernel launch");
    set_shared(reinterpret_cast<const void*>(backward_chunks_kernel<E>), 2 * smem);
    backward_chunks_kernel<E><<<grid, shape.threads, 2 * smem, stream>>>(c);
    check_cuda(cudaGetLastError(), "normaliser backward_chunks_kernel launch");
  }
  // Also with no tokens at all: d_z_init = d_z_final.
  s.sums = c.grad_sums, s.init = any_of(a.d_z_final), s.final_out = any_of(a.d_z_init), s.backwards = true;
  scan(s, stream, "normaliser scan_chunks_kernel launch");
  if (c.slots.count > 0) {
    set_shared(reinterpret_cast<const void*>(key_grad_chunks_kernel<E>), smem);
    key_grad_chunks_kernel<E><<<grid, shape.threads, smem, stream>>>(c);
    check_cuda(cudaGetLastError(), "normaliser key_grad_chunks_kernel launch");
  }
}

template <class E>
void backward_typed(const GlaNormalizeBackwardArgs& a, const GlaProblem& p, float* workspace) {
  const cudaStream_t stream = static_cast<cudaStream_t>(a.stream);
  constexpr int W = kVector<E>;
  const bool keys = all_vector_rows({&a.q, &a.k, &a.dq, &a.dk}, W, int(sizeof(E)));
  const bool values = all_vector_rows({&a.o_raw, &a.d_o, &a.d_o_raw}, W, int(sizeof(E)));
  const norm::TeamShape shape = norm::team_shape(p.key_dim, keys ? W : 1);
  Params<E> c = params_of<E>(a.o_raw, a.q, a.k, a.cu_seqlens, a.reverse, p, shape);
  c.d_o = rows_of<E>(a.d_o), c.d_o_raw = rows_of<E>(a.d_o_raw), c.dq = rows_of<E>(a.dq), c.dk = rows_of<E>(a.dk);
  c.o_raw_is_output = a.o_raw_is_output;
  const size_t sums = norm::forward_workspace_floats(c.slots, p.heads, p.key_dim);
  c.key_sums = workspace, c.grad_sums = workspace + sums, c.d_den = workspace + 2 * sums;
  c.vector_keys = keys, c.vector_values = values;
  backward_launch(a, p, c, shape, stream);
}

template <class T>
struct ElementType {
  using type = T;
};

// Either pass on the tensors' device: nothing to do without (sequence, head) pairs; the heads' limit (grid y);
// its workspace (`bytes` of it, named `bytes_name` in errors); then `typed(ElementType<E>{}, workspace)` with
// the inputs' element type E.
template <class Args, class Typed>
void run_pass(const Args& a, const GlaProblem& p, size_t (*bytes)(const Args&, const GlaProblem&),
              const char* bytes_name, Typed typed) {
  DeviceGuard guard(a.q.device.index);
  if (p.num_seqs * p.heads == 0) return;
  FLASHGLA_REQUIRE(p.heads <= 65535, ErrorKind::unsupported, "q",
                   "the CUDA normaliser takes at most 65535 heads, got " + std::to_string(p.heads));
  const cudaStream_t stream = static_cast<cudaStream_t>(a.stream);
  Scratch scratch(a.workspace, a.workspace_bytes, a.allocate_workspace, bytes(a, p), stream, bytes_name, "workspace",
                  alignof(float));
  switch (a.q.dtype) {
    case DType::bf16: typed(ElementType<__nv_bfloat16>{}, scratch.floats()); break;
    case DType::f16: typed(ElementType<__half>{}, scratch.floats()); break;
    default: typed(ElementType<float>{}, scratch.floats()); break;
  }
}

}  // namespace

size_t gla_normalize_forward_workspace_bytes(const GlaNormalizeArgs& a, const GlaProblem& p) {
  return norm::forward_workspace_floats(slots_of(a.cu_seqlens, p), p.heads, p.key_dim) * sizeof(float);
}

size_t gla_normalize_backward_workspace_bytes(const GlaNormalizeBackwardArgs& a, const GlaProblem& p) {
  return norm::backward_workspace_floats(slots_of(a.cu_seqlens, p), p.heads, p.key_dim) * sizeof(float);
}

void gla_normalize_forward(const GlaNormalizeArgs& a, const GlaProblem& p) {
  require_dtype(a.q, "q"), require_dtype(a.z_init, "z_init");
  run_pass(a, p, gla_normalize_forward_workspace_bytes, "gla_normalize_forward_workspace_bytes",
           [&](auto element, float* workspace) { forward_typed<typename decltype(element)::type>(a, p, workspace); });
}

void gla_normalize_key_prefix(const GlaNormalizeArgs& a, const GlaProblem& p, float* z_starts) {
  require_dtype(a.q, "q"), require_dtype(a.z_init, "z_init");
  if (p.num_seqs * p.heads == 0) return;
  FLASHGLA_REQUIRE(p.heads <= 65535, ErrorKind::unsupported, "q",
                   "the CUDA normaliser takes at most 65535 heads, got " + std::to_string(p.heads));
  switch (a.q.dtype) {
    case DType::bf16: return forward_typed<__nv_bfloat16>(a, p, z_starts, false);
    case DType::f16: return forward_typed<__half>(a, p, z_starts, false);
    default: return forward_typed<float>(a, p, z_starts, false);
  }
}

void gla_normalize_backward(const GlaNormalizeBackwardArgs& a, const GlaProblem& p) {
  require_dtype(a.q, "q"), require_dtype(a.z_init, "z_init"), require_dtype(a.d_z_final, "d_z_final");
  run_pass(a, p, gla_normalize_backward_workspace_bytes, "gla_normalize_backward_workspace_bytes",
           [&](auto element, float* workspace) { backward_typed<typename decltype(element)::type>(a, p, workspace); });
}

}  // namespace flashgla::cuda
