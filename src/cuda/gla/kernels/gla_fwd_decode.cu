// GLA decode: T ≤ 16 tokens per sequence, the fp32 state updated in place:
//     S ← diag(exp g_t) S + k_t^T v_t,   o_t = scale · q_t S     (t = 0 … T-1)
// Memory-bound: every state element is read once and written once per call
// (plus once per token into token_states when asked), so the kernel is one
// pass over the state with as many 16-byte loads in flight as possible.
//
// One CTA per (sequence, head, `columns` value columns); thread (row group,
// 4 columns) owns rows group, group + groups, … of that slice as float4s. The
// launcher picks columns = 64, 32 or 16: narrower slices give more CTAs when
// N·H is small (latency: the whole step is one wave of loads), wider ones keep
// more rows per thread in flight when the GPU is full. The thread's first
// kRows rows are loaded before anything else, so the loads of q, k, g and v
// overlap them; when all its rows fit in those registers (K ≤ groups · kRows)
// the slice stays there for all T tokens, otherwise each token streams it
// through global memory (each element is only ever touched by one thread, so
// no synchronisation is needed between tokens). The partial products q·S are
// summed by warp shuffles, then across the 8 warps in shared memory. With a
// state pool, a negative (or out-of-range) row makes the CTA write zero
// outputs (and zero token states) and touch no pool row. vLLM's state-pool
// steps (DecodeParams: cu_seqlens, a start row picked by num_accepted_tokens,
// the state after each token to its own row) run here too, the state then
// held in registers throughout so that its start row is only ever read.
#include <algorithm>

#include "cuda/common/host.cuh"
#include "cuda/gla/device/elements.cuh"
#include "cuda/gla/device/warp_mma.cuh"
#include "cuda/gla/device/gla_fwd.cuh"

namespace flashgla::cuda::gla {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMinBlocks = 3;       // CTAs per SM the registers must allow (in-flight loads)
constexpr int kRows = 8;             // state rows per thread held in registers
constexpr int kStageFloats = 12288;  // shared memory for staged tokens: 48 KB, no opt-in needed
static_assert(kThreads / (16 / 4) * kRows == kDecodeResidentKeys, "the narrowest slice's rows in registers");

struct Slice {  // where one thread's 4 columns live in a [*, H, K, V] f32 tensor
  float* base;
  int64_t row_stride, col_stride;
  bool vector;  // the 4 columns form one aligned float4
};

__device__ __forceinline__ float4 load_row(const Slice& s, int k, int col, int V) {
  const float* row = s.base + k * s.row_stride;
  if (s.vector) return *reinterpret_cast<const float4*>(row + col);
  float e[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) e[j] = col + j < V ? row[(col + j) * s.col_stride] : 0.f;
  return make_float4(e[0], e[1], e[2], e[3]);
}

__device__ __forceinline__ void store_row(const Slice& s, int k, int col, int V, float4 x) {
  float* row = s.base + k * s.row_stride;
  if (s.vector) {
    *reinterpret_cast<float4*>(row + col) = x;
    return;
  }
  const float e[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
  for (int j = 0; j < 4; ++j)
    if (col + j < V) row[(col + j) * s.col_stride] = e[j];
}

// The packed row of token t of `seq` in [N·T, …] (fixed length) or [total, …] (cu_seqlens) per-token outputs.
__device__ __forceinline__ int64_t token_row(const DecodeParams& p, const SeqSpan& seq, int t) {
  return seq.batch * p.seqs.total_len + seq.begin + t;
}

template <class E>
__global__ void __launch_bounds__(kThreads, kMinBlocks) decode_kernel(const DecodeParams p, const int columns,
                                                          const int stage_tokens) {
  extern __shared__ __align__(16) float shared[];
  const int K = p.key_dim, V = p.value_dim;
  const int vectors = columns / 4, groups = kThreads / vectors;
  const int tid = threadIdx.x, group = tid / vectors, vec = tid % vectors;
  const int64_t n = blockIdx.x / p.heads;
  const int h = int(blockIdx.x % p.heads);
  const int col0 = blockIdx.y * columns, col = col0 + 4 * vec;
  const SeqSpan seq = sequence_span(p.seqs, n);
  const int T = int(seq.len);
  auto at = [&](const View& t, int token) { return token_offset(t, seq, h, token); };
  E* const o = static_cast<E*>(p.o.data) + at(p.o, 0);

  int64_t row = n;
  if (p.pool_cols > 0) {  // per-token rows: start from column a_n − 1
    const int64_t first = p.accepted ? int64_t(p.accepted[n * p.accepted_stride]) - 1 : 0;
    row = first >= 0 && first < p.pool_cols ? p.state_indices[n * p.index_stride + first * p.pool_col_stride] : -1;
  } else if (p.state_indices != nullptr) {
    row = p.state_indices[n * p.index_stride];
  }
  if (row >= p.state_rows) row = -1;  // cannot be checked on the host without a sync: never accessed
  if (row < 0) {  // padded slot (uniform over the CTA): zero outputs and token states
    for (int i = tid; i < T * columns; i += kThreads) {
      const int t = i / columns, c = col0 + i % columns;
      if (c < V) o[t * p.o.stride[1] + c * p.o.stride[3]] = from_float<E>(0.f);
    }
    if (p.token_states.data != nullptr && p.zero_padded_token_states)
      for (int64_t i = tid; i < int64_t(T) * K * columns; i += kThreads) {
        const int64_t t = i / (int64_t(K) * columns), k = i / columns % K;
        const int c = col0 + int(i % columns);
        if (c < V)
          static_cast<float*>(p.token_states.data)[token_row(p, seq, t) * p.token_states.stride[0] + h * p.token_states.stride[1] +
                                                   k * p.token_states.stride[2] + c * p.token_states.stride[3]] = 0.f;
      }
    return;
  }

  const bool vector_cols = col + 3 < V;
  const Slice state{static_cast<float*>(p.state.data) + row * p.state.stride[0] + h * p.state.stride[1],
                    p.state.stride[2], p.state.stride[3], p.state.rows16 && vector_cols};
  const int block_rows = groups * kRows;       // rows of the slice per pass of the CTA
  const bool resident = K <= block_rows;       // the thread's rows stay in registers across tokens

  // The first block of rows, before anything else.
  float4 x[kRows];
#pragma unroll
  for (int u = 0; u < kRows; ++u) {
    const int k = group + u * groups;
    if (k < K) x[u] = load_row(state, k, col, V);
  }

  float* const qs = shared;                        // [stage][K]
  float* const ks = qs + stage_tokens * K;          // [stage][K]
  float* const as = ks + stage_tokens * K;          // [stage][K] decay exp(g)
  float* const vs = as + stage_tokens * K;          // [stage][columns]
  float* const partial = vs + stage_tokens * columns;  // [2][kWarps][columns]

  const int lane = tid % 32, warp = tid / 32;
  for (int t0 = 0; t0 < T; t0 += stage_tokens) {
    // Stage the tokens' q, k, exp(g) and this CTA's v columns. The previous
    // stage's readers have all passed the last token's barrier.
    const int staged = min(stage_tokens, T - t0);
    for (int i = tid; i < staged * K; i += kThreads) {
      const int t = t0 + i / K, kk = i % K;
      qs[i] = load_as<float>(p.q.data, at(p.q, t) + kk * p.q.stride[3], p.q.dtype);
      ks[i] = load_as<float>(p.k.data, at(p.k, t) + kk * p.k.stride[3], p.k.dtype);
      float g = 0.f;
      if (p.gate == Gate::vector)
        g = load_as<float>(p.g.data, at(p.g, t) + kk * p.g.stride[3], p.g.dtype);
      if (p.gate == Gate::scalar)
        g = load_as<float>(p.g.data, at(p.g, t), p.g.dtype);
      as[i] = p.gate == Gate::none ? 1.f : __expf(g);
    }
    for (int i = tid; i < staged * columns; i += kThreads) {
      const int t = t0 + i / columns, c = col0 + i % columns;
      vs[i] = c < V ? load_as<float>(p.v.data, at(p.v, t) + c * p.v.stride[3], p.v.dtype)
                    : 0.f;
    }
    __syncthreads();

    for (int ts = 0; ts < staged; ++ts) {
      const int t = t0 + ts;
      const float* q = qs + ts * K;
      const float* kv = ks + ts * K;
      const float* a = as + ts * K;
      const float* vt = vs + ts * columns + 4 * vec;  // (offsets need not be 16-byte aligned: K may be odd)
      const float4 v = make_float4(vt[0], vt[1], vt[2], vt[3]);
      const bool last = t == T - 1;
      Slice out{nullptr, 0, 0, false};  // where the state after this token goes too, if anywhere
      if (p.token_states.data != nullptr) {
        out = Slice{static_cast<float*>(p.token_states.data) + token_row(p, seq, t) * p.token_states.stride[0] +
                        h * p.token_states.stride[1],
                    p.token_states.stride[2], p.token_states.stride[3], p.token_states.rows16 && vector_cols};
      } else if (p.pool_token_rows && t < p.pool_cols) {
        const int64_t r = p.state_indices[n * p.index_stride + t * p.pool_col_stride];
        if (r >= 0 && r < p.state_rows)
          out = Slice{static_cast<float*>(p.state.data) + r * p.state.stride[0] + h * p.state.stride[1],
                      p.state.stride[2], p.state.stride[3], p.state.rows16 && vector_cols};
      }
      float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
      for (int k0 = group; k0 < K; k0 += block_rows) {
        if (!resident && (t > 0 || k0 != group)) {
#pragma unroll
          for (int u = 0; u < kRows; ++u) {
            const int k = k0 + u * groups;
            if (k < K) x[u] = load_row(state, k, col, V);
          }
        }
#pragma unroll
        for (int u = 0; u < kRows; ++u) {
          const int k = k0 + u * groups;
          if (k >= K) continue;
          const float ak = a[k], kk = kv[k], qk = q[k];
          float4 s = x[u];
          s.x = fmaf(ak, s.x, kk * v.x);
          s.y = fmaf(ak, s.y, kk * v.y);
          s.z = fmaf(ak, s.z, kk * v.z);
          s.w = fmaf(ak, s.w, kk * v.w);
          acc.x = fmaf(qk, s.x, acc.x), acc.y = fmaf(qk, s.y, acc.y);
          acc.z = fmaf(qk, s.z, acc.z), acc.w = fmaf(qk, s.w, acc.w);
          x[u] = s;
          if (out.base != nullptr) store_row(out, k, col, V, s);
          if (!resident || (last && p.write_back)) store_row(state, k, col, V, s);
        }
      }
      // Sum over the row groups: first the groups within a warp (lanes that
      // differ by multiples of `vectors`), then the warps through shared memory.
      for (int offset = vectors; offset < 32; offset *= 2) {
        acc.x += __shfl_xor_sync(0xffffffffu, acc.x, offset);
        acc.y += __shfl_xor_sync(0xffffffffu, acc.y, offset);
        acc.z += __shfl_xor_sync(0xffffffffu, acc.z, offset);
        acc.w += __shfl_xor_sync(0xffffffffu, acc.w, offset);
      }
      float* sums = partial + (t % 2) * kWarps * columns;  // alternating: one barrier per token
      if (lane < vectors) {
        float* dst = sums + warp * columns + 4 * vec;
        dst[0] = acc.x, dst[1] = acc.y, dst[2] = acc.z, dst[3] = acc.w;
      }
      __syncthreads();
      if (tid < columns && col0 + tid < V) {
        float sum = 0.f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) sum += sums[w * columns + tid];
        o[t * p.o.stride[1] + (col0 + tid) * p.o.stride[3]] = from_float<E>(p.scale * sum);
      }
    }
  }
}

template <class E>
void launch(const DecodeParams& p, dim3 grid, int columns, int stage_tokens, size_t smem, cudaStream_t stream) {
  if (smem > 48 * 1024)  // only very wide keys need more than the default
    check_cuda(cudaFuncSetAttribute(decode_kernel<E>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
               "cudaFuncSetAttribute (GLA decode kernel)");
  decode_kernel<E><<<grid, kThreads, smem, stream>>>(p, columns, stage_tokens);
  check_cuda(cudaGetLastError(), "GLA decode kernel launch");
}

__global__ void __launch_bounds__(kThreads) copy_state_rows_kernel(const StateRowsCopy c) {
  const int64_t n = blockIdx.x / c.heads;
  const int h = int(blockIdx.x % c.heads);
  const int64_t src_row = c.src_index ? int64_t(c.src_index[n * c.src_index_stride]) : n;
  const int64_t dst_row = c.dst_index ? int64_t(c.dst_index[n * c.dst_index_stride]) : n;
  if (dst_row < 0 || dst_row >= c.dst_rows) return;
  const bool zero = src_row < 0 || src_row >= c.src_rows;
  const float* src = static_cast<const float*>(c.src.data) + (zero ? 0 : src_row * c.src.stride[0] + h * c.src.stride[1]);
  float* dst = static_cast<float*>(c.dst.data) + dst_row * c.dst.stride[0] + h * c.dst.stride[1];
  const int64_t size = int64_t(c.key_dim) * c.value_dim;
  for (int64_t i = threadIdx.x; i < size; i += kThreads) {
    const int64_t k = i / c.value_dim, v = i % c.value_dim;
    dst[k * c.dst.stride[2] + v * c.dst.stride[3]] = zero ? 0.f : src[k * c.src.stride[2] + v * c.src.stride[3]];
  }
}

}  // namespace

void launch_copy_state_rows(const StateRowsCopy& c, int num_seqs, cudaStream_t stream) {
  const int64_t blocks = int64_t(num_seqs) * c.heads;
  if (blocks == 0) return;
  copy_state_rows_kernel<<<unsigned(blocks), kThreads, 0, stream>>>(c);
  check_cuda(cudaGetLastError(), "GLA state rows copy launch");
}

void launch_decode(const DecodeParams& p, int num_seqs, int multiprocessors, cudaStream_t stream) {
  const int64_t pairs = int64_t(num_seqs) * p.heads;
  if (pairs == 0) return;
  const int K = p.key_dim, V = p.value_dim;
  auto ctas = [&](int columns) { return pairs * ((V + columns - 1) / columns); };
  auto resident = [&](int columns) { return K <= kThreads / (columns / 4) * kRows; };
  // Narrower slices while the grid would not fill the GPU twice over (small N·H:
  // latency), while V leaves half the columns idle, or while several tokens
  // would otherwise stream the slice through memory once per token.
  int columns = 64;
  // The state streams through its start row only where that row takes the final state (write_back).
  const bool keep_resident = p.tokens > 1 || !p.write_back;
  while (columns > 16 && (ctas(columns) < 2 * int64_t(multiprocessors) || V <= columns / 2 ||
                          (keep_resident && !resident(columns))))
    columns /= 2;
  const int fixed = 2 * kWarps * columns;  // partial sums
  const int per_token = 3 * K + columns;
  const int stage_tokens = std::max(1, std::min(p.tokens, (kStageFloats - fixed) / per_token));
  const size_t smem = size_t(fixed + stage_tokens * per_token) * sizeof(float);
  const dim3 grid(unsigned(pairs), unsigned((V + columns - 1) / columns));
  switch (p.q.dtype) {
    case Elem::f32: return launch<float>(p, grid, columns, stage_tokens, smem, stream);
    case Elem::bf16: return launch<__nv_bfloat16>(p, grid, columns, stage_tokens, smem, stream);
    case Elem::f16: return launch<__half>(p, grid, columns, stage_tokens, smem, stream);
    default: return;
  }
}

}  // namespace flashgla::cuda::gla
