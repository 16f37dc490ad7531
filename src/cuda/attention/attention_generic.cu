// The generic CUDA softmax attention (see attention_generic.cuh): one warp per
// row, fp32 arithmetic, tensors read element by element through their strides
// (64-bit offsets).
//   forward, per (query, head): the online softmax over the visible keys
//     (docs/algorithm.md section 8), o = Σ_j P_ij v_j and lse = ln Σ_j exp(s_ij).
//   backward (FlashAttention-2's math, without atomics), P_ij = exp(s_ij − lse_i):
//     1. per (query, head):   dsum_i = dO_i · O_i
//     2. per (key, KV head):  over the query heads sharing it and the queries
//        that see the key, dS_ij = P_ij (dO_i · v_j − dsum_i),
//        dv_j = Σ_i P_ij dO_i, dk_j = scale Σ_i dS_ij q_i
//     3. per (query, head):   dq_i = scale Σ_j dS_ij k_j
// Every output element has one writer: no races, and runs are deterministic.
//
// A row vector is spread over its warp: lane l holds elements l, l + 32, ...
// (CHUNKS of them, CHUNKS · 32 ≥ max(D, Dv), zeros past the end). Dot products
// end in an xor-shuffle reduction, which leaves the same bits in every lane
// (a + b == b + a), so every lane runs the same softmax arithmetic and nothing
// needs a broadcast. A warp's loop bounds depend on its row only, so every
// shuffle runs with all 32 lanes.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "cuda/attention/attention_generic.cuh"
#include "cuda/attention/attention_sequences.cuh"
#include "cuda/common/dtype.cuh"
#include "cuda/common/host.cuh"

namespace flashgla::cuda::attn {
namespace generic {

constexpr int kWarps = 4;  // rows per block
constexpr unsigned kAllLanes = 0xffffffffu;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Keys (or queries) per step of a row's loop: their loads are issued together
// and their reductions interleave. Fewer for long rows, to bound registers.
template <int CHUNKS>
constexpr int kStep = CHUNKS >= 8 ? 1 : 8 / CHUNKS;

// ---- elements and rows ------------------------------------------------------------

// to_float / from_float (float, bf16, fp16): cuda/common/dtype.cuh.

// Element offset of row (batch, token, head) of a [B, T, H, ·] tensor.
__device__ __forceinline__ int64_t row_offset(const Strided& t, int64_t batch, int64_t token, int64_t head) {
  return batch * t.batch + token * t.token + head * t.head;
}

// This lane's elements of the n-element row at element offset `at` (0 past n;
// n = 0 reads nothing).
template <class T, int CHUNKS>
__device__ __forceinline__ void load_row(float (&x)[CHUNKS], const Strided& t, int64_t at, int n, int lane) {
  const T* data = static_cast<const T*>(t.data) + at;
#pragma unroll
  for (int c = 0; c < CHUNKS; ++c) {
    const int d = c * 32 + lane;
    x[c] = d < n ? to_float(data[d * t.dim]) : 0.f;
  }
}

// Writes factor · x to the n-element row at `at`, rounded to T.
template <class T, int CHUNKS>
__device__ __forceinline__ void store_row(const Strided& t, int64_t at, const float (&x)[CHUNKS], float factor, int n,
                                          int lane) {
  T* data = static_cast<T*>(t.data) + at;
#pragma unroll
  for (int c = 0; c < CHUNKS; ++c) {
    const int d = c * 32 + lane;
    if (d < n) data[d * t.dim] = from_float<T>(x[c] * factor);
  }
}

// This lane's share of a · b.
template <int CHUNKS>
__device__ __forceinline__ float partial_dot(const float (&a)[CHUNKS], const float (&b)[CHUNKS]) {
  float sum = 0.f;
#pragma unroll
  for (int c = 0; c < CHUNKS; ++c) sum = fmaf(a[c], b[c], sum);
  return sum;
}

// The sum over the warp, in every lane (bitwise the same: each step adds a
// pair of values both lanes hold, in either order).
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(kAllLanes, x, offset);
  return x;
}

// ---- sequences and masks ------------------------------------------------------------

__device__ __forceinline__ bool locate(const AttentionParams& p, int64_t flat, bool by_key, Seq& s,
                                       int64_t& index) {
  const int64_t total = by_key ? p.k_len : p.q_len;
  if (!p.varlen) {
    s = sequence(p, flat / total);
    index = flat % total;
    return true;
  }
  const void* cu = by_key ? p.cu_k : p.cu_q;
  const int64_t stride = by_key ? p.cu_k_stride : p.cu_q_stride;
  const bool is64 = by_key ? p.cu_k_64 : p.cu_q_64;
  // The last sequence that starts at or before the token (an empty sequence
  // before it starts there too, and is passed over).
  int64_t lo = 0, hi = p.num_seqs - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (boundary(cu, stride, is64, mid, total) <= flat) lo = mid;
    else hi = mid - 1;
  }
  s = sequence(p, lo);
  index = flat - (by_key ? s.k_begin : s.q_begin);
  return index >= 0 && index < (by_key ? s.k_len : s.q_len);
}

// Query i of s sees keys [0, visible_keys): all of them, or causally (aligned
// to the bottom right) those with j ≤ i + Tk − Tq.
__device__ __forceinline__ int64_t visible_keys(const AttentionParams& p, const Seq& s, int64_t i) {
  if (!p.causal) return s.k_len;
  return min(s.k_len, max(int64_t(0), i + s.k_len - s.q_len + 1));
}

// The first query of s that sees key j (the same condition, solved for i).
__device__ __forceinline__ int64_t first_query(const AttentionParams& p, const Seq& s, int64_t j) {
  return p.causal ? max(int64_t(0), j - (s.k_len - s.q_len)) : 0;
}

__device__ __forceinline__ int64_t lse_offset(const AttentionParams& p, int64_t batch, int64_t head, int64_t token) {
  return batch * p.lse_batch + head * p.lse_head + token * p.lse_token;
}

// Row of [B, Hq, Tq] (the dsum scratch).
__device__ __forceinline__ int64_t dsum_index(const AttentionParams& p, int64_t batch, int64_t head, int64_t token) {
  return (batch * p.q_heads + head) * p.q_len + token;
}

// P = exp(s − lse), the score s given in the log2 domain; 0 for a row that saw
// no key (lse = −inf), as the fast kernels do.
__device__ __forceinline__ float probability(float score_log2, float lse) {
  return lse == -INFINITY ? 0.f : exp2f(score_log2 - lse * kLog2e);
}

// ---- kernels ---------------------------------------------------------------------

// One warp per (query, head); warp w of the grid takes query token w % tokens
// (tokens = B · Tq) of head w / tokens, so a block's warps share keys in cache.
template <class T, int CHUNKS>
__global__ void __launch_bounds__(kWarps * 32)
    forward_kernel(const AttentionParams p, int head_dim, int value_dim, int64_t tokens) {
  constexpr int KEYS = kStep<CHUNKS>;
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  Seq s;
  int64_t i;
  if (row >= tokens * p.q_heads || !locate(p, row % tokens, false, s, i)) return;  // the whole warp
  const int64_t head = row / tokens, kv_head = head / p.group, token = s.q_begin + i;

  float q[CHUNKS];
  load_row<T>(q, p.q, row_offset(p.q, s.batch, token, head), head_dim, lane);
#pragma unroll
  for (int c = 0; c < CHUNKS; ++c) q[c] *= p.scale_log2;  // scores in the log2 domain, for exp2
  const int64_t k_at = row_offset(p.k, s.batch, s.k_begin, kv_head);
  const int64_t v_at = row_offset(p.v, s.batch, s.k_begin, kv_head);
  const int64_t visible = visible_keys(p, s, i);

  // Running max m of the scores, l = Σ exp2(score − m), o = Σ exp2(score − m) v.
  float o[CHUNKS] = {};
  float m = -INFINITY, l = 0.f;
  for (int64_t j0 = 0; j0 < visible; j0 += KEYS) {
    float k[KEYS][CHUNKS], v[KEYS][CHUNKS], score[KEYS];
#pragma unroll
    for (int u = 0; u < KEYS; ++u) {
      const bool valid = j0 + u < visible;  // past the visible keys: zero rows, nothing read
      load_row<T>(k[u], p.k, k_at + (j0 + u) * p.k.token, valid ? head_dim : 0, lane);
      load_row<T>(v[u], p.v, v_at + (j0 + u) * p.v.token, valid ? value_dim : 0, lane);
      score[u] = partial_dot(q, k[u]);
    }
    float m_new = m;
#pragma unroll
    for (int u = 0; u < KEYS; ++u) {
      const float sum = warp_sum(score[u]);
      score[u] = j0 + u < visible ? sum : -INFINITY;
      m_new = fmaxf(m_new, score[u]);
    }
    // Key j0 is visible, so m_new is finite; on the first step alpha = exp2(−inf) = 0.
    const float alpha = exp2f(m - m_new);
    l *= alpha;
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) o[c] *= alpha;
#pragma unroll
    for (int u = 0; u < KEYS; ++u) {
      const float pr = exp2f(score[u] - m_new);
      l += pr;
#pragma unroll
      for (int c = 0; c < CHUNKS; ++c) o[c] = fmaf(pr, v[u][c], o[c]);
    }
    m = m_new;
  }

  // l ≥ 1 once a key is seen (the max contributes exp2(0)); a row that sees
  // no key gets o = 0 and lse = −inf.
  store_row<T>(p.o, row_offset(p.o, s.batch, token, head), o, l > 0.f ? 1.f / l : 0.f, value_dim, lane);
  if (lane == 0) p.lse[lse_offset(p, s.batch, head, token)] = l > 0.f ? (m + log2f(l)) * kLn2 : -INFINITY;
}

// dsum = rowsum(dO ⊙ O), one warp per row of [B, Hq, Tq].
template <class T>
__global__ void __launch_bounds__(kWarps * 32) row_dot_kernel(const AttentionParams p, int value_dim) {
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (row >= p.batch * p.q_heads * p.q_len) return;
  const int64_t token = row % p.q_len, head = (row / p.q_len) % p.q_heads, batch = row / (p.q_len * p.q_heads);
  const T* d_o = static_cast<const T*>(p.d_o.data) + row_offset(p.d_o, batch, token, head);
  const T* o = static_cast<const T*>(p.o.data) + row_offset(p.o, batch, token, head);
  float sum = 0.f;
  for (int e = lane; e < value_dim; e += 32) sum = fmaf(to_float(d_o[e * p.d_o.dim]), to_float(o[e * p.o.dim]), sum);
  sum = warp_sum(sum);
  if (lane == 0) p.dsum[row] = sum;  // row == dsum_index(p, batch, head, token)
}

// One warp per (key, KV head), laid out like the forward's warps over
// tokens = B · Tk: dk and dv of the key, summed over the group's query heads
// and the queries that see the key.
template <class T, int CHUNKS>
__global__ void __launch_bounds__(kWarps * 32)
    dkdv_kernel(const AttentionParams p, int head_dim, int value_dim, int64_t tokens) {
  // At most 4 queries per step: each also holds its lse and dsum, and 8 made ptxas spill on sm_90a.
  constexpr int QUERIES = kStep<CHUNKS> < 4 ? kStep<CHUNKS> : 4;
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  Seq s;
  int64_t j;
  if (row >= tokens * p.kv_heads || !locate(p, row % tokens, true, s, j)) return;  // the whole warp
  const int64_t kv_head = row / tokens, key = s.k_begin + j;

  float k[CHUNKS], v[CHUNKS];
  load_row<T>(k, p.k, row_offset(p.k, s.batch, key, kv_head), head_dim, lane);
  load_row<T>(v, p.v, row_offset(p.v, s.batch, key, kv_head), value_dim, lane);
#pragma unroll
  for (int c = 0; c < CHUNKS; ++c) k[c] *= p.scale_log2;  // used for scores only, in the log2 domain

  float dk[CHUNKS] = {}, dv[CHUNKS] = {};
  const int64_t first = first_query(p, s, j);
  for (int64_t head = kv_head * p.group; head < (kv_head + 1) * p.group; ++head) {
    const int64_t q_at = row_offset(p.q, s.batch, s.q_begin, head);
    const int64_t do_at = row_offset(p.d_o, s.batch, s.q_begin, head);
    for (int64_t i0 = first; i0 < s.q_len; i0 += QUERIES) {
      float q[QUERIES][CHUNKS], d_o[QUERIES][CHUNKS], score[QUERIES], dp[QUERIES], lse[QUERIES], dsum[QUERIES];
#pragma unroll
      for (int u = 0; u < QUERIES; ++u) {
        const int64_t i = i0 + u, token = s.q_begin + i;
        const bool valid = i < s.q_len;  // past the sequence: zero rows, nothing read
        load_row<T>(q[u], p.q, q_at + i * p.q.token, valid ? head_dim : 0, lane);
        load_row<T>(d_o[u], p.d_o, do_at + i * p.d_o.token, valid ? value_dim : 0, lane);
        lse[u] = valid ? p.lse[lse_offset(p, s.batch, head, token)] : -INFINITY;
        dsum[u] = valid ? p.dsum[dsum_index(p, s.batch, head, token)] : 0.f;
        score[u] = partial_dot(k, q[u]);
        dp[u] = partial_dot(v, d_o[u]);
      }
#pragma unroll
      for (int u = 0; u < QUERIES; ++u) {
        score[u] = warp_sum(score[u]);
        dp[u] = warp_sum(dp[u]);
      }
#pragma unroll
      for (int u = 0; u < QUERIES; ++u) {
        const float pr = probability(score[u], lse[u]);  // 0 past the sequence (lse = −inf)
        const float ds = pr * (dp[u] - dsum[u]);
#pragma unroll
        for (int c = 0; c < CHUNKS; ++c) {
          dv[c] = fmaf(pr, d_o[u][c], dv[c]);
          dk[c] = fmaf(ds, q[u][c], dk[c]);
        }
      }
    }
  }
  // Every key of a sequence is written, 0 where no query sees it.
  store_row<T>(p.dk, row_offset(p.dk, s.batch, key, kv_head), dk, p.scale, head_dim, lane);
  store_row<T>(p.dv, row_offset(p.dv, s.batch, key, kv_head), dv, 1.f, value_dim, lane);
}

// One warp per (query, head), laid out like the forward's warps.
template <class T, int CHUNKS>
__global__ void __launch_bounds__(kWarps * 32)
    dq_kernel(const AttentionParams p, int head_dim, int value_dim, int64_t tokens) {
  constexpr int KEYS = kStep<CHUNKS>;
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  Seq s;
  int64_t i;
  if (row >= tokens * p.q_heads || !locate(p, row % tokens, false, s, i)) return;  // the whole warp
  const int64_t head = row / tokens, kv_head = head / p.group, token = s.q_begin + i;

  float q[CHUNKS], d_o[CHUNKS];
  load_row<T>(q, p.q, row_offset(p.q, s.batch, token, head), head_dim, lane);
  load_row<T>(d_o, p.d_o, row_offset(p.d_o, s.batch, token, head), value_dim, lane);
#pragma unroll
  for (int c = 0; c < CHUNKS; ++c) q[c] *= p.scale_log2;  // scores in the log2 domain
  const float lse = p.lse[lse_offset(p, s.batch, head, token)];
  const float dsum = p.dsum[dsum_index(p, s.batch, head, token)];
  const int64_t k_at = row_offset(p.k, s.batch, s.k_begin, kv_head);
  const int64_t v_at = row_offset(p.v, s.batch, s.k_begin, kv_head);
  const int64_t visible = visible_keys(p, s, i);

  float dq[CHUNKS] = {};
  for (int64_t j0 = 0; j0 < visible; j0 += KEYS) {
    float k[KEYS][CHUNKS], v[KEYS][CHUNKS], score[KEYS], dp[KEYS];
#pragma unroll
    for (int u = 0; u < KEYS; ++u) {
      const bool valid = j0 + u < visible;  // past the visible keys: zero rows, nothing read
      load_row<T>(k[u], p.k, k_at + (j0 + u) * p.k.token, valid ? head_dim : 0, lane);
      load_row<T>(v[u], p.v, v_at + (j0 + u) * p.v.token, valid ? value_dim : 0, lane);
      score[u] = partial_dot(q, k[u]);
      dp[u] = partial_dot(d_o, v[u]);
    }
#pragma unroll
    for (int u = 0; u < KEYS; ++u) {
      score[u] = warp_sum(score[u]);
      dp[u] = warp_sum(dp[u]);
    }
#pragma unroll
    for (int u = 0; u < KEYS; ++u) {
      const float pr = j0 + u < visible ? probability(score[u], lse) : 0.f;
      const float ds = pr * (dp[u] - dsum);
#pragma unroll
      for (int c = 0; c < CHUNKS; ++c) dq[c] = fmaf(ds, k[u][c], dq[c]);
    }
  }
  // A query that sees no key gets dq = 0.
  store_row<T>(p.dq, row_offset(p.dq, s.batch, token, head), dq, p.scale, head_dim, lane);
}

// ---- launchers ---------------------------------------------------------------------

// Blocks of kWarps warps for one warp per row.
unsigned blocks_for(int64_t rows) {
  const int64_t blocks = (rows + kWarps - 1) / kWarps;
  if (blocks > 0x7fffffff)
    check::fail(ErrorKind::unsupported, "q", "too many rows for one launch (" + std::to_string(rows) + ")");
  return unsigned(blocks);
}

template <class T, int CHUNKS>
void forward(const AttentionParams& p, int head_dim, int value_dim, cudaStream_t stream) {
  const int64_t tokens = p.batch * p.q_len;  // B == 1 with varlen
  if (tokens * p.q_heads == 0) return;
  forward_kernel<T, CHUNKS>
      <<<blocks_for(tokens * p.q_heads), kWarps * 32, 0, stream>>>(p, head_dim, value_dim, tokens);
  check_cuda(cudaGetLastError(), "generic attention forward kernel launch");
}

template <class T, int CHUNKS>
void backward(const AttentionParams& p, int head_dim, int value_dim, cudaStream_t stream) {
  const int64_t q_tokens = p.batch * p.q_len, k_tokens = p.batch * p.k_len;
  const int64_t q_rows = q_tokens * p.q_heads, k_rows = k_tokens * p.kv_heads;
  // dsum first: the other two read it (same stream, so in order).
  if (q_rows > 0) {
    row_dot_kernel<T><<<blocks_for(q_rows), kWarps * 32, 0, stream>>>(p, value_dim);
    check_cuda(cudaGetLastError(), "generic attention backward dsum kernel launch");
  }
  if (k_rows > 0) {
    dkdv_kernel<T, CHUNKS><<<blocks_for(k_rows), kWarps * 32, 0, stream>>>(p, head_dim, value_dim, k_tokens);
    check_cuda(cudaGetLastError(), "generic attention backward dk/dv kernel launch");
  }
  if (q_rows > 0) {
    dq_kernel<T, CHUNKS><<<blocks_for(q_rows), kWarps * 32, 0, stream>>>(p, head_dim, value_dim, q_tokens);
    check_cuda(cudaGetLastError(), "generic attention backward dq kernel launch");
  }
}

// Calls fn(T{}, std::integral_constant<int, CHUNKS>{}) for the dtype and the
// fewest CHUNKS in {1, 2, 4, 8, 16} with CHUNKS · 32 ≥ max(D, Dv).
template <class Fn>
void dispatch(DType dtype, int head_dim, int value_dim, Fn&& fn) {
  const int max_dim = head_dim > value_dim ? head_dim : value_dim;
  if (head_dim < 1 || value_dim < 1 || max_dim > kGenericMaxDim)
    check::fail(ErrorKind::unsupported, head_dim > kGenericMaxDim ? "q" : "v",
                "the generic CUDA attention runs head dims 1 to " + std::to_string(kGenericMaxDim) + ", got D = " +
                    std::to_string(head_dim) + " and Dv = " + std::to_string(value_dim));
  const int chunks = (max_dim + 31) / 32;
  auto by_chunks = [&](auto type) {
    if (chunks <= 1) fn(type, std::integral_constant<int, 1>{});
    else if (chunks <= 2) fn(type, std::integral_constant<int, 2>{});
    else if (chunks <= 4) fn(type, std::integral_constant<int, 4>{});
    else if (chunks <= 8) fn(type, std::integral_constant<int, 8>{});
    else fn(type, std::integral_constant<int, 16>{});
  };
  if (dtype == DType::f32) by_chunks(float{});
  else if (dtype == DType::bf16) by_chunks(__nv_bfloat16{});
  else if (dtype == DType::f16) by_chunks(__half{});
  else
    check::fail(ErrorKind::unsupported, "q",
                std::string("the generic CUDA attention runs float32, bfloat16 and float16, got ") + dtype_name(dtype));
}

}  // namespace generic

void run_attention_generic_forward(const AttentionParams& p, DType dtype, int head_dim, int value_dim,
                                   cudaStream_t stream) {
  generic::dispatch(dtype, head_dim, value_dim, [&](auto type, auto chunks) {
    generic::forward<decltype(type), decltype(chunks)::value>(p, head_dim, value_dim, stream);
  });
}

void run_attention_generic_backward(const AttentionParams& p, DType dtype, int head_dim, int value_dim,
                                    cudaStream_t stream) {
  generic::dispatch(dtype, head_dim, value_dim, [&](auto type, auto chunks) {
    generic::backward<decltype(type), decltype(chunks)::value>(p, head_dim, value_dim, stream);
  });
}

}  // namespace flashgla::cuda::attn
