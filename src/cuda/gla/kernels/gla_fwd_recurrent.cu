// Recurrent GLA forward (fused_recurrent style): one pass over each sequence,
// token by token, forward or reverse, with the state on chip in fp32.
//
// One CTA per (sequence, head, tile of value columns). Each thread owns 16 keys
// of one value column of the state in registers; the `key_groups` threads that
// share a column sit in one warp and sum q·S with shuffles. Tokens are staged
// in shared memory `steps` at a time (cp.async, double-buffered), and
// α = exp(g) is computed once per staged element.
#include "cuda/common/host.cuh"
#include "cuda/gla/device/elements.cuh"
#include "cuda/gla/device/tiles.cuh"
#include "cuda/gla/device/gla_fwd.cuh"

namespace flashgla::cuda::gla {
namespace {

constexpr int kKeysPerThread = 16;
constexpr int kMaxThreads = 256;
constexpr int kMaxSmem = 64 * 1024;

// Shared memory: two stages of staged tokens (q, k, g, v at these offsets in
// stage 0, `stage` bytes apart), then α and the scalar gate.
struct RecurrentLayout {
  int q, k, g, v, stage, alpha, scalar, bytes;
};

int round16(int bytes) { return (bytes + 15) / 16 * 16; }

RecurrentLayout recurrent_layout(const RecurrentParams& p) {
  const int esize = elem_size(p.q.dtype);
  RecurrentLayout L{};
  int offset = 0;
  auto take = [&](int bytes) {
    const int at = offset;
    offset += round16(bytes);
    return at;
  };
  L.q = take(p.steps * p.key_pad * esize);
  L.k = take(p.steps * p.key_pad * esize);
  L.g = take(p.gate == Gate::vector ? p.steps * p.key_pad * elem_size(p.g.dtype) : 0);
  L.v = take(p.steps * p.columns * esize);
  L.stage = offset;
  offset *= 2;
  L.alpha = take(p.steps * p.key_pad * 4);
  L.scalar = take(p.steps * 4);
  L.bytes = offset;
  return L;
}

// kPool: vLLM's state pools (p.pool_rows set); a separate instantiation, so the plain path keeps its registers.
template <class E, bool kPool>
__global__ void __launch_bounds__(kMaxThreads) recurrent_forward_kernel(const RecurrentParams p,
                                                                        const RecurrentLayout L) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int tid = threadIdx.x, threads = blockDim.x;
  const int groups = p.key_groups, kg = tid & (groups - 1), col = tid / groups;
  const int64_t nh = blockIdx.x;
  const int64_t n = nh / p.heads;
  const int h = int(nh % p.heads);
  const int v0 = blockIdx.y * p.columns, vcol = v0 + col;
  const int K = p.key_dim, V = p.value_dim, Kp = p.key_pad, TS = p.steps;
  const int k0 = kg * kKeysPerThread;
  const SeqSpan seq = sequence_span(p.seqs, n);
  auto row_offset = [&](const View& t, int64_t token) { return token_offset(t, seq, h, token); };
  float* alpha = reinterpret_cast<float*>(smem + L.alpha);
  float* scalar = reinterpret_cast<float*>(smem + L.scalar);

  // With a state pool, h0's row is the sequence's start row; a padded slot (a start row outside the pool,
  // or an accepted count out of range) gets zero outputs and touches no pool row. The branch is per CTA.
  int64_t h0_row = n;
  if constexpr (kPool) {
    const int64_t first = p.accepted ? int64_t(p.accepted[n * p.accepted_stride]) - 1 : 0;
    const bool in_range = first >= 0 && first < max(p.pool_cols, 1);
    h0_row = in_range ? int64_t(p.pool_rows[n * p.pool_row_stride + first * p.pool_col_stride]) : -1;
    if (h0_row < 0 || h0_row >= p.pool_size) {
      if (kg == 0 && vcol < V)
        for (int64_t t = 0; t < seq.len; ++t)
          static_cast<E*>(p.o.data)[row_offset(p.o, t) + vcol * p.o.stride[3]] = from_float<E>(0.f);
      return;
    }
  }
  float s[kKeysPerThread];
#pragma unroll
  for (int i = 0; i < kKeysPerThread; ++i) {
    const int kk = k0 + i;
    s[i] = p.h0.data && kk < K && vcol < V
               ? static_cast<const float*>(p.h0.data)[h0_row * p.h0.stride[0] + h * p.h0.stride[1] +
                                                       kk * p.h0.stride[2] + vcol * p.h0.stride[3]]
               : 0.f;
  }
  // This thread's keys of column vcol of the state, to row `row` of `dst` (ht, or the pool h0).
  auto store_state = [&](const View& dst, int64_t row) {
    if (vcol >= V) return;
    float* base = static_cast<float*>(dst.data) + row * dst.stride[0] + h * dst.stride[1] + vcol * dst.stride[3];
#pragma unroll
    for (int i = 0; i < kKeysPerThread; ++i)
      if (k0 + i < K) base[(k0 + i) * dst.stride[2]] = s[i];
  };
  if (p.gate == Gate::none)
    for (int e = tid; e < TS * Kp; e += threads) alpha[e] = 1.f;

  const int64_t blocks = (seq.len + TS - 1) / TS;
  auto block_at = [&](int64_t i) { return p.reverse ? blocks - 1 - i : i; };
  auto issue = [&](int64_t b, int stage) {
    const int64_t t0 = b * TS;
    const int rows = int(min(int64_t(TS), seq.len - t0));
    load_tile_unpadded(p.q, sizeof(E), row_offset(p.q, t0), p.q.stride[1], TS, rows, 0, K, Kp, smem + L.q + stage * L.stage, tid, threads);
    load_tile_unpadded(p.k, sizeof(E), row_offset(p.k, t0), p.k.stride[1], TS, rows, 0, K, Kp, smem + L.k + stage * L.stage, tid, threads);
    if (p.gate == Gate::vector)
      load_tile_unpadded(p.g, elem_size(p.g.dtype), row_offset(p.g, t0), p.g.stride[1], TS, rows, 0, K, Kp, smem + L.g + stage * L.stage,
                tid, threads);
    load_tile_unpadded(p.v, sizeof(E), row_offset(p.v, t0), p.v.stride[1], TS, rows, v0, V, p.columns, smem + L.v + stage * L.stage, tid,
              threads);
  };
  if (blocks > 0) issue(block_at(0), 0);
  cp_async_commit_unordered();

  E* out = static_cast<E*>(p.o.data);
  for (int64_t i = 0; i < blocks; ++i) {
    const int stage = int(i & 1);
    const int64_t b = block_at(i);
    const int rows = int(min(int64_t(TS), seq.len - b * TS));
    cp_async_wait_committed();
    __syncthreads();  // this block's tokens are in; the previous block is done with the other stage
    if (i + 1 < blocks) issue(block_at(i + 1), stage ^ 1);
    cp_async_commit_unordered();
    if (p.gate == Gate::vector) {
      for (int e = tid; e < TS * Kp; e += threads) alpha[e] = __expf(load_as<float>(smem + L.g + stage * L.stage, e, p.g.dtype));
    } else if (p.gate == Gate::scalar) {
      for (int t = tid; t < TS; t += threads)
        scalar[t] = t < rows ? __expf(load_as<float>(p.g.data, row_offset(p.g, b * TS + t), p.g.dtype)) : 1.f;
      __syncthreads();
      for (int e = tid; e < TS * Kp; e += threads) alpha[e] = scalar[e / Kp];
    }
    __syncthreads();

    const E* qs = reinterpret_cast<const E*>(smem + L.q + stage * L.stage);
    const E* ks = reinterpret_cast<const E*>(smem + L.k + stage * L.stage);
    const E* vs = reinterpret_cast<const E*>(smem + L.v + stage * L.stage);
    for (int j = 0; j < rows; ++j) {
      const int t = p.reverse ? rows - 1 - j : j;
      const float v = to_float(vs[t * p.columns + col]);
      const float* a = alpha + t * Kp + k0;
      float part = 0.f;
#pragma unroll
      for (int i4 = 0; i4 < kKeysPerThread; i4 += 4) {
        const float4 a4 = load4(a + i4), k4 = load4(ks + t * Kp + k0 + i4), q4 = load4(qs + t * Kp + k0 + i4);
        s[i4 + 0] = fmaf(s[i4 + 0], a4.x, k4.x * v);
        s[i4 + 1] = fmaf(s[i4 + 1], a4.y, k4.y * v);
        s[i4 + 2] = fmaf(s[i4 + 2], a4.z, k4.z * v);
        s[i4 + 3] = fmaf(s[i4 + 3], a4.w, k4.w * v);
        part += q4.x * s[i4 + 0] + q4.y * s[i4 + 1] + q4.z * s[i4 + 2] + q4.w * s[i4 + 3];
      }
      for (int m = 1; m < groups; m <<= 1) part += __shfl_xor_sync(0xffffffffu, part, m);
      if (kg == 0 && vcol < V) out[row_offset(p.o, b * TS + t) + vcol * p.o.stride[3]] = from_float<E>(p.scale * part);
      if constexpr (kPool) {  // the state after this token: to its pool row (inplace), else to its packed row of ht
        const int64_t token = b * TS + t;
        if (p.inplace) {
          if (token < p.pool_cols) {
            const int64_t row = p.pool_rows[n * p.pool_row_stride + token * p.pool_col_stride];
            if (row >= 0 && row < p.pool_size) store_state(p.h0, row);
          }
        } else if (p.ht.data) {
          store_state(p.ht, seq.batch * p.seqs.total_len + seq.begin + token);
        }
      }
    }
  }

  if constexpr (!kPool) {
    if (p.ht.data) store_state(p.ht, n);
  } else if (p.inplace && p.pool_cols == 0 && seq.len > 0) {
    store_state(p.h0, h0_row);  // [N] indices: the final state back to the start row
  }
}

template <class E, bool kPool>
void launch_as(const RecurrentParams& p, const RecurrentLayout& L, dim3 grid, int threads, cudaStream_t stream) {
  check_cuda(cudaFuncSetAttribute(recurrent_forward_kernel<E, kPool>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  L.bytes),
             "cudaFuncSetAttribute (GLA recurrent kernel)");
  recurrent_forward_kernel<E, kPool><<<grid, threads, L.bytes, stream>>>(p, L);
  check_cuda(cudaGetLastError(), "GLA recurrent kernel launch");
}

template <class E>
void launch(const RecurrentParams& p, const RecurrentLayout& L, dim3 grid, int threads, cudaStream_t stream) {
  if (p.pool_rows) return launch_as<E, true>(p, L, grid, threads, stream);
  launch_as<E, false>(p, L, grid, threads, stream);
}

}  // namespace

void launch_recurrent_forward(RecurrentParams p, int num_seqs, cudaStream_t stream) {
  // Threads per column: the power of two that covers K in groups of 16 keys.
  int groups = 1;
  while (groups * kKeysPerThread < p.key_dim) groups *= 2;
  if (groups > 32)
    check::fail(ErrorKind::unsupported, "q", "the CUDA recurrent GLA kernel supports K ≤ 512, got K = " +
                                                 std::to_string(p.key_dim));
  p.key_groups = groups;
  p.key_pad = groups * kKeysPerThread;
  // As many columns as fit in 256 threads, fewer for a narrow V (at least one warp, at least 8 columns).
  p.columns = kMaxThreads / groups;
  while (p.columns / 2 >= p.value_dim && p.columns / 2 >= 8 && groups * (p.columns / 2) >= 32) p.columns /= 2;
  p.steps = 32;
  while (p.steps > 1 && recurrent_layout(p).bytes > kMaxSmem) p.steps /= 2;
  const RecurrentLayout L = recurrent_layout(p);
  const dim3 grid(unsigned(int64_t(num_seqs) * p.heads), unsigned((p.value_dim + p.columns - 1) / p.columns));
  if (grid.x == 0) return;
  const int threads = groups * p.columns;
  switch (p.q.dtype) {
    case Elem::f32: return launch<float>(p, L, grid, threads, stream);
    case Elem::bf16: return launch<__nv_bfloat16>(p, L, grid, threads, stream);
    case Elem::f16: return launch<__half>(p, L, grid, threads, stream);
    default: return;
  }
}

}  // namespace flashgla::cuda::gla
