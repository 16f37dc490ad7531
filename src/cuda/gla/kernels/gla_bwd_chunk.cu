// The chunk kernel of the chunked GLA backward (docs/algorithm.md steps 7-11,
// with 3-4 recomputed unless the forward saved A: BwdParams::intra):
// everything of one chunk of 64 tokens, after the state scans.
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
// dg, chunk-local (docs/algorithm.md step 11), written so that nothing
// cancels: the diagonal terms i = j contribute equally to q ⊙ dq and k ⊙ dk and
// are left out, and the state term's Σ_r k_r ⊙ dk_r^{(S)} is split at t. For
// row t:
//   dg_t = Σ_{s>=t} (q_s ⊙ dq'_s − k_s ⊙ dk^{(A)'}_s) + Σ_{s<t} k_s ⊙ dk^{(S)}_s
//          + exp(γ) ⊙ rowsum(S ⊙ dS)
// with ' = without the diagonal term, dk^{(A)} the intra-chunk part of dk and
// dk^{(S)} the part through dS. Every term then carries the decay of the gates
// it differentiates, so gates of −20 per step give tiny, accurate dg.
//
// fp16 inputs run on fp16 operands (gla_bwd.cuh, Compute): the stored dS is
// scaled by exp(−E) and multiplied back here in fp32 (gate_tile.cuh,
// kScaledDStates), and the stages between sub-chunks use other reference rows
// (between_key_ref in stages/chunk_bwd.cuh), so that weights of e^-20 stay out
// of the operands.
#include "cuda/common/host.cuh"
#include "cuda/gla/device/elements.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/gla/device/chunk_slots.cuh"
#include "cuda/gla/device/gate_tile.cuh"
#include "cuda/gla/device/tiles.cuh"
#include "cuda/gla/device/warp_mma.cuh"
#include "cuda/gla/device/gla_bwd.cuh"
#include "cuda/gla/stages/chunk_bwd.cuh"

namespace flashgla::cuda::gla {
namespace {

// T: the operands' type, fp32, bf16 or fp16 (gla_bwd.cuh, Compute).
// kPlain (bf16 only): every tile of q, k, v, dO and of the outputs is whole
// aligned 16-byte rows of bf16 (BwdChunkKernel::plain, plan.cpp), so the kernel
// holds only the asynchronous copies and vector stores, none of the converting
// or element-wise fallbacks: half the code, fewer instruction-cache misses (a
// large share of the general kernel's stalls in a profile: bench/notes_gla_bwd.md).
// kF32Dg (plain_f32_dg): the same with a vector gate's dg in fp32 rows and g in
// bf16 or fp32 rows; an instantiation of its own because those branches made
// the plain kernel spill.
template <class T, class GT, bool kPlain, bool kF32Dg = false>
__global__ void __launch_bounds__(kBwdChunkThreads, 2) chunk_kernel(const BwdParams p) {
  using Smem = ChunkSmem<T, GT>;
  constexpr int LD = kLd<T>;
  constexpr int LDF = kLdF;
  extern __shared__ __align__(16) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem + Smem::q);
  T* sK = reinterpret_cast<T*>(smem + Smem::k);
  T* sdA = reinterpret_cast<T*>(smem + Smem::dA);
  GT* sG = reinterpret_cast<GT*>(smem + Smem::gates);
  T* R = reinterpret_cast<T*>(smem + Smem::r);
  float* sRowSums = reinterpret_cast<float*>(smem + Smem::row_sums);

  BwdSeq seq;
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
  const bool has_next = seq.len > (chunk + 1) * kChunk;  // fp16: E of the scaled dS (gate_tile.cuh)

  // ---- phase A: dA --------------------------------------------------------------
  // (The stages' register arrays are declared here, in the kernel: see stages/chunk_bwd.cuh.)
  {
    float acc[2][2][4];
    chunk_bwd_dA<T, GT, kPlain>(p, b, t0, rows, h, s, hc, V, scale, acc);
  }

  // ---- phase A: A (the forward's intra-chunk scores: saved by the forward, else recomputed) ----
  if (p.intra.data) {  // unscaled: chunk_bwd_dv scales its product
    load_tile_async<T, kBwdChunkThreads, kPlain>(sQ, p.intra, b, t0, rows, h, 0, kChunk);
    cp_async_commit_and_wait_all();
  } else {
    float acc[2][2][4];
    float k_reg[kSub];
    GT g_reg[kSub];
    float part[kSub];
    chunk_fwd_intra<T, GT, kPlain, kF32Dg>(p, b, t0, rows, h, s, hc, lane, K, scale, acc, k_reg, g_reg, part);
  }
  __syncthreads();

  // Everything below reads the scans' states or writes outputs.
  wait_for_previous_grid();

  // ---- phase B: dv ----------------------------------------------------------------
  {
    float acc[Smem::kValueGroup][4][4];
    GateTile<GT, kBwdChunkThreads> gate;
    chunk_bwd_dv<T, GT, kPlain, kF32Dg>(p, gamma, b, t0, slot, rows, h, s, hc, K, V, acc, gate, has_next);
  }

  // ---- phase C: dq, dk, dg, one key tile at a time ------------------------------------
  // Phase B leaves the last key tile's Γ in sG (and fp16's E in next_gates): with a vector gate phase C walks the
  // key tiles from the last, so that its first keeps them. (Each key tile's dq, dk and dg of a vector gate are its
  // own: the order changes no result. A scalar gate's dg sums the key tiles in order.)
  const bool from_last = p.gate == GateKind::vector;
  if (threadIdx.x < kTile) sRowSums[threadIdx.x] = 0.f;
  for (int step = 0; step < p.key_tiles; ++step) {
    const int kt = from_last ? p.key_tiles - 1 - step : step;
    const bool gamma_kept = from_last && step == 0;
    const int col = 32 * hc + lane;  // this lane's column in the element-wise steps
    if (gamma_kept) {  // (two branches: a gate tile declared outside them made the plain kernel spill)
      load_tile_async<T, kBwdChunkThreads, kPlain>(sQ, p.q, b, t0, rows, h, kt * kTile, K);
      load_tile_async<T, kBwdChunkThreads, kPlain>(sK, p.k, b, t0, rows, h, kt * kTile, K);
      cp_async_commit_and_wait_all();
      __syncthreads();  // every thread's copies have landed
    } else {
      auto gate = start_gate_tile<GT, kPlain, kF32Dg>(p, sG, b, t0, rows, h, kt * kTile, false);
      if constexpr (kScaledDStates<T>)
        store_next_gates(p, reinterpret_cast<float*>(smem + Smem::next_gates), b, t0, h, kt * kTile, has_next);
      load_tile_async<T, kBwdChunkThreads, kPlain>(sQ, p.q, b, t0, rows, h, kt * kTile, K);
      load_tile_async<T, kBwdChunkThreads, kPlain>(sK, p.k, b, t0, rows, h, kt * kTile, K);
      cp_async_commit_and_wait_all();
      finish_gate_tile<GT, kPlain, kF32Dg>(p, sG, gate, false);
    }

    // ---- dq, dk between sub-chunks, on the products (accumulators kept until chunk_bwd_dqk):
    //   dq_I += (dA_{I,<I} K̃) ⊙ exp(Γ_I − Γ_{16I}),  dk_J = (dA_{>J,J}^T Q̃) ⊙ exp(Γ_{16J+15} − Γ_J)
    //   (fp16: against rows 16I − 1 and 16J + 16, between_key_ref in stages/chunk_bwd.cuh).
    float acc_qa[4][4], acc_ka[4][4];
    zero(acc_qa);
    zero(acc_ka);
    {
      T* sKStage = R;
      T* sQStage = R + kBetweenRows * LD;
      map_rows<T, kBwdChunkThreads, kBetweenRows, kPlain>(sKStage, sK, between_key_key, [&](int row, int c, float x) {
        return x * exp2_of(sG[between_key_ref<T>(between_key_sub(row)) * LDF + c] - sG[between_key_key(row) * LDF + c]);
      });
      map_rows<T, kBwdChunkThreads, kBetweenRows, kPlain>(
          sQStage, sQ, between_query_query, [&](int row, int c, float x) {
            const int i = between_query_query(row), ref = between_query_ref<T>(between_query_sub(row));
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

    // ---- dq, dk through the states: dq ∝ dO S^T, dk^{(S)} ∝ V dS^T, and rowsum(S ⊙ dS) ----
    float acc_q[4][4], acc_k[4][4];
    chunk_bwd_dqk_inter<T, GT, kPlain>(p, b, t0, slot, rows, h, s, hc, kt, V, acc_q, acc_k);
    __syncthreads();  // R is free for the fp32 results

    // ---- dq, dk of the key tile (products scaled and gated, diagonal blocks element by element) and
    //      this sub-chunk's part of dg ----
    float within_sub[kSub];
    float k_reg[kSub], q_reg[kSub], dq_d[kSub], dk_d[kSub];
    GT g_reg[kSub];
    chunk_bwd_dqk<T, GT>(gamma, s, hc, col, scale, acc_q, acc_qa, acc_k, acc_ka, within_sub, k_reg, q_reg, dq_d, dk_d,
                         g_reg);
    float* sDQ = reinterpret_cast<float*>(R);  // dq
    float* sDKS = sDQ + kTile * LDF;           // dg (a vector gate)
    float* sDKA = sDKS + kTile * LDF;          // dk
    __syncthreads();

    // ---- dg: this sub-chunk's part, the carry from the others and the state term ----
    chunk_bwd_dg<T, GT>(p, gamma, kt, col, K, within_sub);
    __syncthreads();
    if (p.gate == GateKind::scalar) chunk_bwd_dg_row_sums<T, GT>();
    store_tile<kBwdChunkThreads, kPlain>(p.dq, b, t0, rows, h, kt * kTile, K, sDQ);
    store_tile<kBwdChunkThreads, kPlain>(p.dk, b, t0, rows, h, kt * kTile, K, sDKA);
    if (p.gate == GateKind::vector) {
      if constexpr (kF32Dg) store_tile<kBwdChunkThreads, false, true>(p.dg, b, t0, rows, h, kt * kTile, K, sDKS);
      else store_tile<kBwdChunkThreads, kPlain>(p.dg, b, t0, rows, h, kt * kTile, K, sDKS);
    }
    __syncthreads();  // R is read by the stores above
  }

  if (p.gate == GateKind::scalar && p.dg.data && threadIdx.x < rows)
    store_as(p.dg.data, offset4(p.dg, b, t0 + threadIdx.x, h, 0), p.dg.dtype, sRowSums[threadIdx.x]);
  // The chunk's sum for d_g_gamma, one entry per block: each of the first two warps sums its 32 rows in a
  // fixed order and adds it to the zeroed entry; 0 + a + b = 0 + b + a, so the result is deterministic.
  if (p.gamma_chunk_sums && threadIdx.x < kChunk) {
    float sum = threadIdx.x < rows ? sRowSums[threadIdx.x] : 0.f;
#pragma unroll
    for (int offset = 16; offset >= 1; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (lane == 0) atomicAdd(&p.gamma_chunk_sums[blockIdx.x * gridDim.y + blockIdx.y], sum);
  }
}

template <class T, class GT, bool kPlain, bool kF32Dg = false>
void launch(const BwdParams& p, bool overlap_scans, cudaStream_t stream) {
  const size_t smem = ChunkSmem<T, GT>::bytes;
  auto kernel = chunk_kernel<T, GT, kPlain, kF32Dg>;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
             "cudaFuncSetAttribute (GLA backward chunk kernel)");
  launch_after_previous(kernel, dim3(unsigned(p.num_slots), unsigned(p.heads)), dim3(kBwdChunkThreads), smem, stream,
                        overlap_scans, p, "GLA backward chunk kernel launch");
}

}  // namespace

namespace {
bool whole_rows(const View& t, int D, Elem dtype, int per_16_bytes) {
  return t.dtype == dtype && t.stride[3] == 1 && D % kTile == 0 && t.stride[0] % per_16_bytes == 0 &&
         t.stride[1] % per_16_bytes == 0 && t.stride[2] % per_16_bytes == 0 &&
         reinterpret_cast<uintptr_t>(t.data) % 16 == 0 && t.stride[1] < (int64_t(1) << 31) / kChunk;
}
}  // namespace

bool bf16_rows(const View& t, int D) { return whole_rows(t, D, Elem::bf16, 8); }
bool f32_rows(const View& t, int D) { return whole_rows(t, D, Elem::f32, 4); }

size_t bwd_chunk_smem_bytes(Compute c) {
  switch (c) {
    case Compute::f32: return ChunkSmem<float, double>::bytes;
    case Compute::f16: return ChunkSmem<__half, float>::bytes;
    default: return ChunkSmem<bf16, float>::bytes;
  }
}

void launch_bwd_chunk(const BwdParams& p, BwdChunkKernel kernel, bool overlap_scans, cudaStream_t stream) {
  switch (kernel) {
    case BwdChunkKernel::f32: launch<float, double, false>(p, overlap_scans, stream); break;
    case BwdChunkKernel::general: launch<bf16, float, false>(p, overlap_scans, stream); break;
    case BwdChunkKernel::plain: launch<bf16, float, true>(p, overlap_scans, stream); break;
    case BwdChunkKernel::plain_f32_dg: launch<bf16, float, true, true>(p, overlap_scans, stream); break;
    case BwdChunkKernel::f16: launch<__half, float, false>(p, overlap_scans, stream); break;
    case BwdChunkKernel::scalar: launch_bwd_scalar_chunk(p, overlap_scans, stream); break;
  }
}

}  // namespace flashgla::cuda::gla
