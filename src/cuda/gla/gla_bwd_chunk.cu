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
#include "cuda/gla/stages/chunk_bwd.cuh"

namespace flashgla::cuda::gla_bwd {
namespace {

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
  float* sTotA = reinterpret_cast<float*>(smem + Smem::totals);
  float* sTotB = sTotA + kSubs * kTile;
  float* sStateTerm = reinterpret_cast<float*>(smem + Smem::state_term);
  float* sRowSums = reinterpret_cast<float*>(smem + Smem::row_sums);

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
  // (The stages' register arrays are declared here, in the kernel: see stages/chunk_bwd.cuh.)
  {
    float acc[2][2][4];
    chunk_bwd_dA<T, GT, kPlain>(p, b, t0, rows, h, s, hc, V, scale, acc);
  }

  // ---- phase A: A (the forward's intra-chunk scores, recomputed) -----------------
  {
    float acc[2][2][4];
    float k_reg[kSub];
    GT g_reg[kSub];
    float part[kSub];
    chunk_fwd_intra<T, GT, kPlain>(p, b, t0, rows, h, s, hc, lane, K, scale, acc, k_reg, g_reg, part);
  }
  __syncthreads();

  // Everything below reads the scans' states or writes outputs.
  wait_for_previous_grid();

  // ---- phase B: dv ----------------------------------------------------------------
  {
    float acc[Smem::kValueGroup][4][4];
    GateTile<GT, kChunkThreads> gate;
    chunk_bwd_dv<T, GT, kPlain>(p, gamma, b, t0, slot, rows, h, s, hc, K, V, acc, gate);
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
