// What the CUDA attention kernels receive: one plain struct of pointers and
// int64 strides per call (built by src/cuda/attention/attention.cu), and the launchers,
// one explicit instantiation per (dtype, head dim) in attention_d*.cu.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace flashgla::cuda::attn {

// A [B, T, H, D] tensor of 2-byte elements; strides in elements.
struct Strided {
  void* data = nullptr;
  int64_t batch = 0, token = 0, head = 0, dim = 0;
  bool vec16 = false;  // rows move as 16-byte chunks: dim stride 1, pointer and other strides 16-byte aligned
  bool vec4 = false;   // column pairs move as 4 bytes: dim stride 1, pointer and other strides 4-byte aligned
};

struct AttentionParams {
  Strided q, k, v, o;         // o: written by the forward, read by the backward
  Strided d_o, dq, dk, dv;    // backward only
  float* lse = nullptr;       // [B, Hq, Tq]
  int64_t lse_batch = 0, lse_head = 0, lse_token = 0;

  // Variable length: B == 1 and boundaries [N+1] (int32 or int64) on the device.
  const void* cu_q = nullptr;
  const void* cu_k = nullptr;
  int64_t cu_q_stride = 0, cu_k_stride = 0;
  bool cu_q_64 = false, cu_k_64 = false;
  bool varlen = false;

  int64_t batch = 0, q_len = 0, k_len = 0;  // totals with varlen
  int64_t q_heads = 0, kv_heads = 0, group = 1;
  int64_t num_seqs = 0;
  bool causal = false;
  float scale = 1.f;       // softmax scale
  float scale_log2 = 1.f;  // scale · log2(e): scores go through exp2

  // Tiles of the work axis (queries in the forward, keys in the backward) per
  // head and batch row; with varlen, N + ceil(T / tile) slots (see decode_work).
  // Set by the launchers.
  int64_t tile_slots = 0;

  // Backward scratch: dq_accum [B, Hq, Tq, D] fp32, lse_log2 and dsum [B, Hq, Tq] fp32.
  float* dq_accum = nullptr;
  float* lse_log2 = nullptr;
  float* dsum = nullptr;

  // The deterministic backward (attention_dq_turns.cuh): one turn counter per (batch row, query head, query tile
  // slot, 64-column block of dq), zeroed with dq_accum; null when dq is added in whatever order the CTAs arrive.
  // dq_turn_slots: query tile slots per (batch row, head) (tile_slots_of), set by the launcher for its tile height.
  int* dq_turns = nullptr;
  int64_t dq_turn_slots = 0;
};

// Tile slots per (batch row, head) for tiles of `rows` along `len` tokens, as decode_work numbers them: with
// varlen, sequence n's tiles start at slot n + begin_n / rows, so N + ⌈T / rows⌉ slots cover every tile.
inline int64_t tile_slots_of(int64_t len, int rows, bool varlen, int64_t num_seqs) {
  return (len + rows - 1) / rows + (varlen ? num_seqs : 0);
}

// Tile shapes, shared by the launchers and the host (grid and workspace sizes).
template <int D>
struct ForwardConfig {
  static constexpr int kBlockM = D <= 128 ? 128 : 64;  // queries per CTA
  static constexpr int kBlockN = 64;                   // keys per step
  static constexpr int kWarps = 4;                     // each owns kBlockM / 4 query rows
  static constexpr int kMinBlocks = 2;
  static constexpr int kSmemBytes = (kBlockM + 2 * kBlockN) * D * 2;
};

template <int D>
struct BackwardConfig {
  static constexpr int kBlockN = D <= 128 ? 128 : 64;  // keys per CTA
  static constexpr int kBlockM = D <= 128 ? 64 : 32;   // queries per step
  static constexpr int kWarps = 8;
  // Warp grids of the three products (rows x columns of warps):
  // S and dP [queries x keys], dK and dV [keys x dims], dQ [queries x dims].
  static constexpr int kSdpWarpsM = 2, kDkvWarpsN = D <= 128 ? 4 : 2, kDqWarpsM = 2;
  static constexpr int kSmemBytes =
      (2 * kBlockN * D + 4 * kBlockM * D + 2 * kBlockM * kBlockN) * 2 + 4 * kBlockM * 4;
};

template <class T, int D>
void run_attention_forward(AttentionParams p, cudaStream_t stream);
template <class T, int D>
void run_attention_backward(AttentionParams p, cudaStream_t stream);
// The sm_90a forward (attention_hopper.cu, D in {64, 128}): nullptr once
// launched, else why this device, build or tensors do not allow it (and
// nothing was launched). Variants: ping_pong (a producer warp, the two
// warpgroups' MMAs take turns), overlap_wide (no producer warp; each
// warpgroup also overlaps its softmax with its own P V, over 176-key tiles at
// D = 128).
enum class HopperForwardVariant { ping_pong, overlap_wide };
template <class T, int D>
const char* run_attention_forward_hopper(AttentionParams p, cudaStream_t stream, HopperForwardVariant variant);
// The sm_90a backward (attention_hopper_bwd.cu, D in {64, 128}; all three
// steps, dq_accum zeroed by the caller): nullptr once launched, else why not
// (and nothing was launched).
template <class T, int D>
const char* run_attention_backward_hopper(AttentionParams p, cudaStream_t stream);

}  // namespace flashgla::cuda::attn
