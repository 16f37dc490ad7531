// Recurrent GLA backward: the backward of the token-by-token recurrence
//   S_t = diag(exp g_t) S_{t-1} + k_t^T v_t,   o_t = scale q_t S_t
// (with `reverse`, tokens are processed from the last to the first).
//
// One block per (sequence, head, 32 value columns); thread k owns row k of the
// state. Two passes, all in fp32:
//   forward:  S_t again from h0, and dq_t = scale S_t dO_t;
//   backward: dS from dht, dS_t = exp(g_{t+1}) dS_{t+1} + scale q_t^T dO_t,
//             dk_t = dS_t v_t, dv_t = dS_t^T k_t (a sum over the block's rows).
// dg needs no state in the backward pass, so nothing is stored or walked back
// (S_{t-1} = (S_t − k_t^T v_t) / exp g_t would blow up rounding errors). It is
// the closed form dg_t = Σ_{s at or after t} (q_s ⊙ dq_s − k_s ⊙ dk_s) +
// rowsum(S_T ⊙ dht), rearranged so that no two large terms cancel:
//   * the diagonal term scale (q_s·k_s)(v_s·dO_s) enters q ⊙ dq and k ⊙ dk
//     equally and is left out of both (dq'_s = scale exp(g_s) S_{s-1} dO_s);
//   * dk splits into the part through dht, P_s (dht v_s) with P_s the product
//     of exp(g) over the later tokens, and the rest dk^{(o)}; rowsum(S_T ⊙ dht)
//     is Σ_s k_s ⊙ P_s (dht v_s) + P_0 ⊙ rowsum(h0 ⊙ dht), so
//   dg_t = Σ_{s at or after t} (q_s ⊙ dq'_s − k_s ⊙ dk'^{(o)}_s)     (suffix terms)
//        + Σ_{s before t} k_s ⊙ P_s (dht v_s)                        (prefix terms)
//        + P_0 ⊙ rowsum(h0 ⊙ dht).                                   (final term)
// Every remaining term carries the decay of the gate it differentiates, so
// strongly decaying gates give small dg accurately, not as a difference.
// Per value tile, the blocks add their parts of dq, dk and these terms into
// fp32 accumulators; finalize kernels convert them and take the sums.
#include "cuda/common/host.cuh"
#include "cuda/gla/device/elements.cuh"
#include "cuda/gla/device/chunk_slots.cuh"
#include "cuda/gla/device/warp_mma.cuh"
#include "cuda/gla/device/gla_bwd.cuh"

namespace flashgla::cuda::gla {
namespace {

constexpr int kCols = kRecurrentCols;
constexpr int kBatch = kRecurrentBatch;
constexpr int kMaxWarps = kRecurrentMaxThreads / 32;

__device__ __forceinline__ int64_t token_at(const BwdParams& p, const BwdSeq& seq, int64_t pos) {
  return seq.begin + (p.reverse ? seq.len - 1 - pos : pos);
}

// Index of (token, head, key) in the fp32 accumulators.
__device__ __forceinline__ int64_t acc_index(const BwdParams& p, const BwdSeq& seq, int64_t token, int h, int key) {
  return ((seq.batch * p.seqs.total_len + token) * p.heads + h) * int64_t(p.key_dim) + key;
}

__global__ void __launch_bounds__(kRecurrentMaxThreads) recurrent_kernel(const BwdParams p) {
  __shared__ float sV[kBatch][kCols], sDO[kBatch][kCols];
  __shared__ float sDV[kBatch][kMaxWarps][kCols];
  extern __shared__ float dht_rows[];  // [blockDim.x][kCols + 1]
  const int64_t n = blockIdx.x / p.heads;
  const int h = int(blockIdx.x % p.heads);
  const int v0 = blockIdx.y * kCols;
  const int key = threadIdx.x, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const bool has_key = key < p.key_dim;
  const BwdSeq seq = sequence(p, n);
  const float scale = p.scale;
  const int V = p.value_dim;

  float qb[kBatch], kb[kBatch], decay[kBatch];
  // Stages v and dO of the tokens at positions pos0..pos0+count-1 and loads
  // this row's q, k and exp(g) of them.
  auto load_batch = [&](int64_t pos0, int count) {
    __syncthreads();  // earlier readers of sV, sDO, sDV are done
    for (int idx = threadIdx.x; idx < kBatch * kCols; idx += blockDim.x) {
      const int tb = idx / kCols, c = idx % kCols;
      float v = 0.f, d_o = 0.f;
      if (tb < count && v0 + c < V) {
        const int64_t t = token_at(p, seq, pos0 + tb);
        v = load_as<float>(p.v.data, offset4(p.v, seq.batch, t, h, v0 + c), p.v.dtype);
        d_o = load_as<float>(p.d_o.data, offset4(p.d_o, seq.batch, t, h, v0 + c), p.d_o.dtype);
      }
      sV[tb][c] = v;
      sDO[tb][c] = d_o;
    }
#pragma unroll
    for (int tb = 0; tb < kBatch; ++tb) {
      qb[tb] = kb[tb] = 0.f;
      decay[tb] = 1.f;
      if (tb < count && has_key) {
        const int64_t t = token_at(p, seq, pos0 + tb);
        qb[tb] = load_as<float>(p.q.data, offset4(p.q, seq.batch, t, h, key), p.q.dtype);
        kb[tb] = load_as<float>(p.k.data, offset4(p.k, seq.batch, t, h, key), p.k.dtype);
        if (p.gate != GateKind::none) {
          const int d = p.gate == GateKind::vector ? key : 0;
          decay[tb] = expf(load_as<float>(p.g.data, offset4(p.g, seq.batch, t, h, d), p.g.dtype));
        }
      }
    }
    __syncthreads();
  };

  // ---- forward pass: S_t and dq_t ----
  float S[kCols];
#pragma unroll
  for (int c = 0; c < kCols; ++c)
    S[c] = (p.h0.data && has_key && v0 + c < V)
               ? static_cast<const float*>(p.h0.data)[offset4(p.h0, n, h, key, v0 + c)]
               : 0.f;
  for (int64_t pos0 = 0; pos0 < seq.len; pos0 += kBatch) {
    const int count = int(seq.len - pos0 < kBatch ? seq.len - pos0 : kBatch);
    load_batch(pos0, count);
#pragma unroll
    for (int tb = 0; tb < kBatch; ++tb) {
      if (tb >= count) break;
      float dq_part = 0.f, v_dot_do = 0.f;  // dq_part: (exp(g_t) S_{t-1}) dO_t over this tile
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        const float decayed = decay[tb] * S[c], d_o = sDO[tb][c], v = sV[tb][c];
        dq_part += decayed * d_o;
        v_dot_do += v * d_o;
        S[c] = decayed + kb[tb] * v;
      }
      if (has_key) {
        const int64_t i = acc_index(p, seq, token_at(p, seq, pos0 + tb), h, key);
        atomicAdd(p.dq_acc + i, scale * (dq_part + kb[tb] * v_dot_do));
        atomicAdd(p.dg_suffix_terms + i, qb[tb] * scale * dq_part);
      }
    }
  }
  // ---- backward pass: dS, dk_t, dv_t ----
  // The gradient of the state after the current token is D + P dht + (this
  // token's scale q^T dO): D from later outputs, P the decay since dht.
  float* sDht = dht_rows;  // [key][kCols + 1]: this block's dht columns
  const bool has_dht = p.dht.data != nullptr;
  if (has_dht) {
#pragma unroll
    for (int c = 0; c < kCols; ++c)
      sDht[key * (kCols + 1) + c] = (has_key && v0 + c < V)
                                        ? static_cast<const float*>(p.dht.data)[offset4(p.dht, n, h, key, v0 + c)]
                                        : 0.f;
  }
  float D[kCols];
#pragma unroll
  for (int c = 0; c < kCols; ++c) D[c] = 0.f;
  float P = 1.f;
  for (int64_t end = seq.len; end > 0; end -= kBatch) {
    const int64_t pos0 = end > kBatch ? end - kBatch : 0;
    const int count = int(end - pos0);
    load_batch(pos0, count);
#pragma unroll
    for (int tb = kBatch - 1; tb >= 0; --tb) {
      if (tb >= count) continue;
      const float q_scaled = scale * qb[tb];
      // dk_o: D v_t; dht_v: dht v_t (both over this tile)
      float dk_o = 0.f, dht_v = 0.f, v_dot_do = 0.f, dv_part[kCols];
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        const float d_o = sDO[tb][c], v = sV[tb][c];
        const float dht = has_dht ? sDht[key * (kCols + 1) + c] : 0.f;
        dk_o += D[c] * v;
        dht_v += dht * v;
        v_dot_do += v * d_o;
        const float from_outputs = D[c] + q_scaled * d_o;
        dv_part[c] = kb[tb] * (from_outputs + P * dht);
        D[c] = decay[tb] * from_outputs;
      }
      sDV[tb][warp][transpose_reduce_index<kCols>()] = transpose_reduce<kCols>(dv_part);
      if (has_key) {
        const int64_t i = acc_index(p, seq, token_at(p, seq, pos0 + tb), h, key);
        atomicAdd(p.dk_acc + i, dk_o + P * dht_v + q_scaled * v_dot_do);
        atomicAdd(p.dg_suffix_terms + i, -kb[tb] * dk_o);
        if (has_dht) atomicAdd(p.dg_prefix_terms + i, kb[tb] * P * dht_v);
      }
      P *= decay[tb];
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < count * kCols; idx += blockDim.x) {
      const int tb = idx / kCols, c = idx % kCols;
      float sum = 0.f;
      for (int w = 0; w < warps; ++w) sum += sDV[tb][w][c];
      if (v0 + c < V)
        store_as(p.dv.data, offset4(p.dv, seq.batch, token_at(p, seq, pos0 + tb), h, v0 + c), p.dv.dtype, sum);
    }
  }
  if (has_key) {
    float final_term = 0.f;  // rowsum(h0 ⊙ dht) over this tile
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      if (v0 + c >= V) continue;
      const float dht = has_dht ? sDht[key * (kCols + 1) + c] : 0.f;
      if (p.dh0.data) static_cast<float*>(p.dh0.data)[offset4(p.dh0, n, h, key, v0 + c)] = D[c] + P * dht;
      if (p.h0.data) final_term += static_cast<const float*>(p.h0.data)[offset4(p.h0, n, h, key, v0 + c)] * dht;
    }
    if (has_dht && p.h0.data) atomicAdd(p.dg_final + (n * p.heads + h) * p.key_dim + key, P * final_term);
  }
}

// One warp per (sequence, head, 32 keys): dq and dk to their dtype, and with
// a vector gate dg = suffix sums + prefix sums + final term. Walks the
// sequence forward (prefix sums, in place) and then backward.
__global__ void finalize_kernel(const BwdParams p) {
  const int groups = (p.key_dim + 31) / 32;
  const int64_t w = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (w >= p.num_seqs * p.heads * groups) return;
  const int key = int(w % groups) * 32 + threadIdx.x % 32;
  if (key >= p.key_dim) return;
  const int64_t nh = w / groups, n = nh / p.heads;
  const int h = int(nh % p.heads);
  const BwdSeq seq = sequence(p, n);
  const bool vector_gate = p.gate == GateKind::vector;
  if (vector_gate) {
    float prefix = 0.f;
    for (int64_t pos = 0; pos < seq.len; ++pos) {
      const int64_t i = acc_index(p, seq, token_at(p, seq, pos), h, key);
      const float term = p.dg_prefix_terms[i];
      p.dg_prefix_terms[i] = prefix;
      prefix += term;
    }
  }
  const float final_term = vector_gate ? p.dg_final[nh * p.key_dim + key] : 0.f;
  float suffix = 0.f;
  for (int64_t pos = seq.len - 1; pos >= 0; --pos) {
    const int64_t t = token_at(p, seq, pos), i = acc_index(p, seq, t, h, key);
    store_as(p.dq.data, offset4(p.dq, seq.batch, t, h, key), p.dq.dtype, p.dq_acc[i]);
    store_as(p.dk.data, offset4(p.dk, seq.batch, t, h, key), p.dk.dtype, p.dk_acc[i]);
    if (vector_gate) {
      suffix += p.dg_suffix_terms[i];
      store_as(p.dg.data, offset4(p.dg, seq.batch, t, h, key), p.dg.dtype, suffix + p.dg_prefix_terms[i] + final_term);
    }
  }
}

// Scalar gate: dg_t = Σ_k of the vector-gate gradient, one warp per (sequence, head).
__global__ void scalar_gate_kernel(const BwdParams p) {
  const int64_t nh = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (nh >= p.num_seqs * p.heads) return;
  const int lane = threadIdx.x % 32;
  const int64_t n = nh / p.heads;
  const int h = int(nh % p.heads);
  const BwdSeq seq = sequence(p, n);
  // Σ_k of row i of a [*, K] accumulator, in every lane.
  auto row_sum = [&](const float* row) {
    float x = 0.f;
    for (int key = lane; key < p.key_dim; key += 32) x += row[key];
#pragma unroll
    for (int offset = 16; offset >= 1; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
    return x;
  };
  // Forward: the prefix sums, kept in key 0 of each token's prefix terms.
  float prefix = 0.f;
  for (int64_t pos = 0; pos < seq.len; ++pos) {
    float* row = p.dg_prefix_terms + acc_index(p, seq, token_at(p, seq, pos), h, 0);
    const float term = row_sum(row);
    __syncwarp();
    if (lane == 0) row[0] = prefix;
    prefix += term;
  }
  __syncwarp();
  const float final_term = row_sum(p.dg_final + nh * p.key_dim);
  float suffix = 0.f;
  for (int64_t pos = seq.len - 1; pos >= 0; --pos) {
    const int64_t t = token_at(p, seq, pos), i0 = acc_index(p, seq, t, h, 0);
    suffix += row_sum(p.dg_suffix_terms + i0);
    if (lane == 0)
      store_as(p.dg.data, offset4(p.dg, seq.batch, t, h, 0), p.dg.dtype, suffix + p.dg_prefix_terms[i0] + final_term);
  }
}

}  // namespace

void launch_bwd_recurrent(const BwdParams& p, cudaStream_t stream) {
  const int threads = (p.key_dim + 31) / 32 * 32;
  const dim3 grid(unsigned(p.num_seqs * p.heads), unsigned((p.value_dim + kCols - 1) / kCols));
  const size_t smem = size_t(threads) * (kCols + 1) * sizeof(float);  // dht rows
  check_cuda(cudaFuncSetAttribute(recurrent_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
             "cudaFuncSetAttribute (GLA recurrent backward)");
  recurrent_kernel<<<grid, threads, smem, stream>>>(p);
  check_cuda(cudaGetLastError(), "GLA recurrent backward launch");

  constexpr int kWarpsPerBlock = 4;
  const int64_t rows = p.num_seqs * p.heads * ((p.key_dim + 31) / 32);
  finalize_kernel<<<unsigned((rows + kWarpsPerBlock - 1) / kWarpsPerBlock), 32 * kWarpsPerBlock, 0, stream>>>(p);
  check_cuda(cudaGetLastError(), "GLA recurrent backward finalize launch");
  if (p.gate == GateKind::scalar) {
    const int64_t heads = p.num_seqs * p.heads;
    scalar_gate_kernel<<<unsigned((heads + kWarpsPerBlock - 1) / kWarpsPerBlock), 32 * kWarpsPerBlock, 0, stream>>>(p);
    check_cuda(cudaGetLastError(), "GLA recurrent backward scalar-gate launch");
  }
}

}  // namespace flashgla::cuda::gla
