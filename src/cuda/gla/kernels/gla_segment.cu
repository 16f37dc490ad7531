// CUDA per-segment summaries (gla_segment_states, gla_segment_state_grads):
// each segment's end state from a zero start and summed log decay, or its
// entering-state gradient, reading k, v, g (or q, d_o, g) once per tile and
// writing nothing per token.
//
// Like the forward's sequence split (gla_fwd_states.cuh), a CTA owns a 64×64
// tile of the [K, V] summary of one (segment, head) and one piece of the
// segment's chunks, and walks its chunks so that every weight is the exp of a
// running sum of gates, never a difference (−inf gates give weight 0, not NaN):
//   states: last chunk first, S += (x ⊙ exp Σ_{u>t} g_u)ᵀ y            (x = k, y = v)
//   grads:  first chunk first, B += scale (x ⊙ exp Σ_{u≤t} g_u)ᵀ y     (x = q, y = d_o)
// A piece records its summary and its total log decay; with several pieces a
// fold kernel combines them in order (states: S ← exp(a_p) S + S_p over the
// pieces in time order; grads: B ← B_p + exp(a_p) B from the last piece to the
// first), which is exact in real arithmetic since each piece is linear in its
// start. The products are fp32 FMAs on shared-memory tiles (any input dtype);
// see bench/bench_segment_states.py for how close it runs to reading the inputs.
//
// bf16/fp16 inputs with K ≤ 256 and 16-byte aligned rows run the forward's
// split states kernel instead (gla_fwd_states.cuh: tensor cores, copies in
// flight), one split per sequence cut into pieces, which also writes each
// piece's log decay and, for the gradients, walks forward with inclusive
// prefix sums (walk_forward); the same fold combines the pieces.
// The choice and the pieces: plan_segment (plan.h); GlaTuning::segment_split_kernel forces one or the other
// (where the split kernel applies).
#include <algorithm>
#include <string>

#include "core/backend.h"
#include "core/sequences.h"
#include "cuda/common/host.cuh"
#include "cuda/gla/device/elements.cuh"
#include "cuda/gla/device/split_chunks.cuh"
#include "cuda/gla/device/gla_fwd.cuh"
#include "cuda/gla/host/gla_host.cuh"

namespace flashgla::cuda {
namespace {

using gla::Elem;
using gla::Gate;
using gla::GateByte;
using gla::View;

constexpr int kRows = gla::kSegmentRows;  // tokens per chunk (32; layouts.h, where the planner reads it)
constexpr int kTile = gla::kSegmentTile;  // keys and values per CTA (64)
constexpr int kPitch = kTile + 4;  // floats per shared row: 16-byte aligned rows for float4 reads
constexpr int kThreads = 256;  // gate phase: (key, row quarter); product: 4 keys × 4 values per thread
constexpr int kQuarterRows = kRows / 4;

struct SegmentParams {
  View x, y, g;  // x: k or q [B,T,H,K]; y: v or d_o [B,T,H,V]; g: [B,T,H,K], [B,T,H] or absent
  View g_gamma;  // [H] fp32, added to a scalar gate where it is read (gamma_gate in gla_host.cuh); absent: none
  Sequences seqs;
  int heads = 0, key_dim = 0, value_dim = 0;
  GateByte gate = Gate::none;
  bool grads = false;  // false: S(L); true: B(L)
  float scale = 1.f;   // multiplies x (1 for the states)
  int pieces = 1;
  int64_t piece_chunks = 1;          // chunks per piece (the last ones of a short segment are empty)
  float* piece_states = nullptr;     // [N·H][pieces][K][V] when pieces > 1
  float* piece_log_decay = nullptr;  // [N·H][pieces][K] when pieces > 1
  View states, log_decay;            // outputs, f32 [N,H,K,V] and [N,H,K] (log_decay absent for the grads)
};

__global__ void __launch_bounds__(kThreads) segment_summary_kernel(const SegmentParams p) {
  __shared__ __align__(16) float xs[kRows][kPitch];
  __shared__ __align__(16) float ys[kRows][kPitch];
  __shared__ float gs[kRows][kTile + 1];  // the vector gate (a scalar gate: column 0)
  const int tid = threadIdx.x;
  const int64_t nh = blockIdx.x;
  const int64_t n = nh / p.heads;
  const int h = int(nh % p.heads);
  const int K = p.key_dim, V = p.value_dim;
  const int value_tiles = (V + kTile - 1) / kTile;
  const int k0 = int(blockIdx.y / value_tiles) * kTile, v0 = int(blockIdx.y % value_tiles) * kTile;
  const int piece = blockIdx.z;

  const SeqSpan seq = sequence_span(p.seqs, n);
  const int64_t num_chunks = (seq.len + kRows - 1) / kRows;
  const int64_t c_begin = min(num_chunks, piece * p.piece_chunks);
  const int64_t c_end = min(num_chunks, c_begin + p.piece_chunks);
  const int64_t count = c_end - c_begin;
  auto at = [&](const View& t, int64_t token, int64_t col) {
    return seq.batch * t.stride[0] + (seq.begin + token) * t.stride[1] + h * t.stride[2] + col * t.stride[3];
  };

  // Gate phase roles: key `gk` of the tile, rows [8·quarter, 8·quarter + 8) of the chunk.
  const int gk = tid >> 2, quarter = tid & 3;
  float carry = 0.f;  // Σ g over the chunks of this piece already walked
  // Product roles: keys 4·pk .. 4·pk + 3, values 4·pv .. 4·pv + 3 of the tile.
  const int pk = tid >> 4, pv = tid & 15;
  float acc[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.f;

  for (int64_t i = 0; i < count; ++i) {
    const int64_t c = p.grads ? c_begin + i : c_end - 1 - i;
    const int rows = int(min(int64_t(kRows), seq.len - c * kRows));
    // Tiles of the chunk into shared memory as fp32; rows past the segment and columns past K, V are zero.
    for (int e = tid; e < kRows * kTile; e += kThreads) {
      const int r = e / kTile, col = e % kTile;
      const int64_t token = c * kRows + r;
      const bool row_ok = r < rows;
      xs[r][col] = row_ok && k0 + col < K ? p.scale * gla::load_as<float>(p.x.data, at(p.x, token, k0 + col), p.x.dtype)
                                          : 0.f;
      ys[r][col] = row_ok && v0 + col < V ? gla::load_as<float>(p.y.data, at(p.y, token, v0 + col), p.y.dtype) : 0.f;
      if (p.gate == Gate::vector)
        gs[r][col] = row_ok && k0 + col < K ? gla::load_as<float>(p.g.data, at(p.g, token, k0 + col), p.g.dtype) : 0.f;
      else if (p.gate == Gate::scalar && col == 0)
        gs[r][0] = row_ok ? gla::scalar_gate(p.g, at(p.g, token, 0), p.g_gamma, h) : 0.f;
    }
    __syncthreads();

    if (p.gate != Gate::none) {
      const int gcol = p.gate == Gate::vector ? gk : 0;
      const int r0 = quarter * kQuarterRows;
      float total = 0.f;
#pragma unroll
      for (int r = 0; r < kQuarterRows; ++r) total += gs[r0 + r][gcol];
      // The four quarters of a key are lanes 4j .. 4j + 3 of one warp.
      float before = 0.f, after = 0.f, chunk = 0.f;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float t = __shfl_sync(0xffffffffu, total, (tid & 31 & ~3) | q);
        chunk += t;
        if (q < quarter) before += t;
        if (q > quarter) after += t;
      }
      if (p.grads) {
        float run = carry + before;  // Σ g over the segment's tokens up to and including row r (in this piece)
#pragma unroll
        for (int r = 0; r < kQuarterRows; ++r) {
          run += gs[r0 + r][gcol];
          xs[r0 + r][gk] *= __expf(run);
        }
      } else {
        float run = carry + after;  // Σ g over the piece's tokens after row r
#pragma unroll
        for (int r = kQuarterRows - 1; r >= 0; --r) {
          xs[r0 + r][gk] *= __expf(run);
          run += gs[r0 + r][gcol];
        }
      }
      carry += chunk;
      __syncthreads();
    }

#pragma unroll 8
    for (int r = 0; r < kRows; ++r) {
      const float4 a = *reinterpret_cast<const float4*>(&xs[r][4 * pk]);
      const float4 b = *reinterpret_cast<const float4*>(&ys[r][4 * pv]);
      const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
      for (int ii = 0; ii < 4; ++ii)
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) acc[ii][jj] = fmaf(av[ii], bv[jj], acc[ii][jj]);
    }
    __syncthreads();  // every warp done with the tiles before they are refilled
  }

  // The piece's summary (the segment's when there is one piece) and its log decay.
  const bool single = p.pieces == 1;
  const int64_t slot = nh * p.pieces + piece;
#pragma unroll
  for (int ii = 0; ii < 4; ++ii) {
    const int key = k0 + 4 * pk + ii;
    if (key >= K) continue;
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) {
      const int val = v0 + 4 * pv + jj;
      if (val >= V) continue;
      if (single) {
        const View& s = p.states;
        static_cast<float*>(s.data)[offset4(s, n, h, key, val)] = acc[ii][jj];
      } else {
        p.piece_states[(slot * K + key) * V + val] = acc[ii][jj];
      }
    }
  }
  if (v0 == 0 && quarter == 0 && k0 + gk < K) {
    if (!single) {
      p.piece_log_decay[slot * K + k0 + gk] = carry;
    } else if (p.log_decay.data) {
      const View& d = p.log_decay;
      static_cast<float*>(d.data)[offset3(d, n, h, k0 + gk)] = carry;
    }
  }
}

// Folds the pieces of every (segment, head): thread per element of [K, V] (and of the log decay).
__global__ void __launch_bounds__(kThreads) fold_pieces_kernel(const SegmentParams p) {
  const int64_t nh = blockIdx.x;
  const int64_t n = nh / p.heads;
  const int h = int(nh % p.heads);
  const int K = p.key_dim, V = p.value_dim;
  const int64_t e = int64_t(blockIdx.y) * kThreads + threadIdx.x;
  if (e >= int64_t(K) * V) return;
  const int key = int(e / V), val = int(e % V);
  const int64_t first = nh * p.pieces;
  float sum = 0.f, log_decay = 0.f;
  if (p.grads) {
    for (int piece = p.pieces - 1; piece >= 0; --piece) {
      const int64_t slot = first + piece;
      sum = p.piece_states[(slot * K + key) * V + val] + __expf(p.piece_log_decay[slot * K + key]) * sum;
    }
  } else {
    for (int piece = 0; piece < p.pieces; ++piece) {
      const int64_t slot = first + piece;
      const float a = p.piece_log_decay[slot * K + key];
      sum = __expf(a) * sum + p.piece_states[(slot * K + key) * V + val];
      log_decay += a;
    }
  }
  const View& s = p.states;
  static_cast<float*>(s.data)[offset4(s, n, h, key, val)] = sum;
  if (val == 0 && !p.grads && p.log_decay.data) {
    const View& d = p.log_decay;
    static_cast<float*>(d.data)[offset3(d, n, h, key)] = log_decay;
  }
}

// The plan of a call: the parameters (without the scratch pointers) and the scratch it needs.
struct SegmentPlan {
  SegmentParams params;
  int64_t pairs = 0;  // N·H
  size_t workspace_bytes = 0;
  bool use_split = false;  // the states through the forward's split states kernel, then the fold
  gla::ChunkParams split;
};

// The parameters of a call and the planner's choices (plan.h: plan_segment): the generic tile kernel with
// its pieces, or the forward's split states kernel (see the top of this file), then the fold.
SegmentPlan plan(const TensorView& x, const TensorView& y, const TensorView& g, const TensorView& g_gamma,
                 const TensorView& cu_seqlens, const TensorView& cu_seqlens_host, const GlaProblem& pr, bool grads,
                 const GlaTuning& tuning) {
  SegmentPlan plan;
  SegmentParams& p = plan.params;
  p.x = view_of(x), p.y = view_of(y);
  gamma_gate(g, g_gamma, p.g, p.g_gamma);
  p.seqs = sequences_of(cu_seqlens, pr.seq_len);
  p.heads = int(pr.heads), p.key_dim = int(pr.key_dim), p.value_dim = int(pr.value_dim);
  p.gate = pr.gate;
  p.grads = grads;
  p.scale = grads ? float(pr.scale) : 1.f;
  plan.pairs = pr.num_seqs * pr.heads;

  gla::SegmentProblem sp;
  sp.input = p.x.dtype, sp.gate_dtype = p.g.dtype, sp.gate = p.gate;
  sp.heads = p.heads, sp.key_dim = p.key_dim, sp.value_dim = p.value_dim;
  sp.num_seqs = pr.num_seqs;
  const int64_t longest = longest_sequence(pr, cu_seqlens, cu_seqlens_host);
  sp.longest = longest < 0 ? pr.seq_len : longest;  // unknown without reading device memory: at most T
  sp.x_rows16 = p.x.rows16, sp.y_rows16 = p.y.rows16, sp.g_rows16 = p.g.rows16;
  const gla::SegmentPlan chosen = gla::plan_segment(sp, device_props(x.device.index), tuning);
  p.pieces = chosen.pieces;
  p.piece_chunks = chosen.piece_chunks;
  plan.workspace_bytes = chosen.workspace_bytes;
  plan.use_split = chosen.use_split;
  if (plan.use_split) {
    gla::ChunkParams& c = plan.split;
    c.q = c.k = p.x, c.v = p.y, c.g = p.g, c.g_gamma = p.g_gamma;
    c.seqs = p.seqs;
    c.heads = p.heads, c.key_dim = p.key_dim, c.value_dim = p.value_dim;
    c.gate = p.gate;
    c.num_splits = 2;  // one split per sequence: slot nh · pieces + piece
    c.chunks_per_split = chosen.split_chunks;
    c.whole_segments = true;
    c.walk_forward = grads;
    c.summary_scale = p.scale;
    c.state_pieces = chosen.pieces;
  }
  return plan;
}

void launch(SegmentPlan& plan, void* workspace, size_t workspace_bytes, const WorkspaceAllocator& allocate,
            cudaStream_t stream, const char* query) {
  SegmentParams& p = plan.params;
  if (plan.pairs == 0) return;
  const Scratch scratch(workspace, workspace_bytes, allocate, plan.workspace_bytes, stream, query, "workspace", 16);
  const int blocks = ceil_div(int64_t(p.key_dim) * p.value_dim, kThreads);
  if (plan.use_split) {
    gla::ChunkParams& c = plan.split;
    const int64_t slots = plan.pairs * c.state_pieces;
    c.piece_states = scratch.floats();
    c.piece_decay = c.piece_states + slots * int64_t(p.key_dim) * p.value_dim;
    c.piece_log_decay = c.piece_decay + slots * p.key_dim;
    gla::launch_segment_states(c, int(plan.pairs / p.heads), stream);
    p.piece_states = c.piece_states, p.piece_log_decay = c.piece_log_decay;
    fold_pieces_kernel<<<dim3(unsigned(plan.pairs), unsigned(blocks)), kThreads, 0, stream>>>(p);
    check_cuda(cudaGetLastError(), "GLA segment fold kernel launch");
    return;
  }
  if (p.pieces > 1) {
    p.piece_states = scratch.floats();
    p.piece_log_decay = p.piece_states + plan.pairs * p.pieces * int64_t(p.key_dim) * p.value_dim;
  }
  const int tiles = ceil_div(p.key_dim, kTile) * ceil_div(p.value_dim, kTile);
  FLASHGLA_REQUIRE(tiles <= 65535, ErrorKind::unsupported, "k", "K and V too large for the CUDA segment kernels");
  segment_summary_kernel<<<dim3(unsigned(plan.pairs), unsigned(tiles), unsigned(p.pieces)), kThreads, 0, stream>>>(p);
  check_cuda(cudaGetLastError(), "GLA segment summary kernel launch");
  if (p.pieces == 1) return;
  fold_pieces_kernel<<<dim3(unsigned(plan.pairs), unsigned(blocks)), kThreads, 0, stream>>>(p);
  check_cuda(cudaGetLastError(), "GLA segment fold kernel launch");
}

SegmentPlan plan_states(const GlaSegmentStatesArgs& a, const GlaProblem& pr) {
  require_compute_dtype(a.k, "k");
  SegmentPlan s = plan(a.k, a.v, a.g, a.g_gamma, a.cu_seqlens, a.cu_seqlens_host, pr, false, a.tuning);
  s.params.states = view_of(a.states), s.params.log_decay = view_of(a.log_decay);
  return s;
}

SegmentPlan plan_grads(const GlaSegmentStateGradsArgs& a, const GlaProblem& pr) {
  require_compute_dtype(a.q, "q");
  SegmentPlan s = plan(a.q, a.d_o, a.g, a.g_gamma, a.cu_seqlens, a.cu_seqlens_host, pr, true, a.tuning);
  s.params.states = view_of(a.d_states);
  return s;
}

}  // namespace

size_t gla_segment_states_workspace_bytes(const GlaSegmentStatesArgs& a, const GlaProblem& pr) {
  const DeviceGuard guard(a.k.device.index);
  return plan_states(a, pr).workspace_bytes;
}

size_t gla_segment_state_grads_workspace_bytes(const GlaSegmentStateGradsArgs& a, const GlaProblem& pr) {
  const DeviceGuard guard(a.q.device.index);
  return plan_grads(a, pr).workspace_bytes;
}

void gla_segment_states(const GlaSegmentStatesArgs& a, const GlaProblem& pr) {
  const DeviceGuard guard(a.k.device.index);
  SegmentPlan s = plan_states(a, pr);
  launch(s, a.workspace, a.workspace_bytes, a.allocate_workspace, static_cast<cudaStream_t>(a.stream),
         "gla_segment_states_workspace_bytes");
}

void gla_segment_state_grads(const GlaSegmentStateGradsArgs& a, const GlaProblem& pr) {
  const DeviceGuard guard(a.q.device.index);
  SegmentPlan s = plan_grads(a, pr);
  launch(s, a.workspace, a.workspace_bytes, a.allocate_workspace, static_cast<cudaStream_t>(a.stream),
         "gla_segment_state_grads_workspace_bytes");
}

}  // namespace flashgla::cuda
