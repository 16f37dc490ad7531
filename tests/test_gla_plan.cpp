// The GLA CUDA planner (src/cuda/gla/plan/plan.h) on the CPU: its decisions at the anchor shapes of the project
// (ANCHORS in bench/bench_gla_fwd.py) and the GLA 340M model's layer (hidden 1024, 4 heads: K = 128, V = 256), for an
// H100-like device (132 SMs, 227 KB per block, sm_90a code) and an A100-like one (108 SMs, 163 KB, sm_80
// code only). The expected values are worked out here from the rules as the code's comments and
// bench/notes_gla_*.md state them (not copied from the planner's output); then every tuning field forces its
// choice, and a bad environment value is an error naming the variable.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <tuple>
#include <vector>

#include "core/sequences.h"
#include "cuda/gla/plan/plan.h"
#include "flashgla/error.h"

namespace flashgla::cuda::gla {
namespace {

using Force = GlaTuning::Force;

// The general kernel's occupancy is a query of the compiled kernel; the stand-in says 2 CTAs per SM and
// records what it was asked.
struct Occupancy {
  std::vector<int> asked_bytes;
  int answer = 2;
};

DeviceProps h100(Occupancy* occupancy = nullptr) {
  DeviceProps d;
  d.multiprocessors = 132, d.max_smem_per_block = 227 * 1024, d.smem_per_sm = 228 * 1024;
  d.sm90 = d.sm90a = true;
  d.general_blocks_per_sm = [occupancy](Elem, int bytes) {
    if (!occupancy) return 2;
    occupancy->asked_bytes.push_back(bytes);
    return occupancy->answer;
  };
  return d;
}

DeviceProps a100(Occupancy* occupancy = nullptr) {
  DeviceProps d = h100(occupancy);
  d.multiprocessors = 108, d.max_smem_per_block = 163 * 1024, d.smem_per_sm = 164 * 1024;
  d.sm90 = d.sm90a = false;
  return d;
}

// bf16 q, k, v, o and a bf16 vector gate, every row 16-byte aligned: what chunk_gla gets from a model.
FwdProblem forward(int64_t B, int64_t T, int H, int K, int V, Elem input = Elem::bf16) {
  FwdProblem p;
  p.input = p.gate_dtype = input;
  p.gate = Gate::vector;
  p.heads = H, p.key_dim = K, p.value_dim = V;
  p.num_seqs = B, p.seq_len = T, p.longest = T;
  p.q_rows16 = p.k_rows16 = p.v_rows16 = p.g_rows16 = p.o_rows16 = true;
  return p;
}

constexpr size_t kFloat = sizeof(float);

// Bytes of the split slots: (splits − 1) states [K][V] and decays [K] per (sequence, head).
size_t split_slot_bytes(const FwdProblem& p, int splits) {
  return size_t(p.num_seqs * p.heads * (splits - 1)) * size_t(p.key_dim) * size_t(p.value_dim + 1) * kFloat;
}

// Bytes of the Hopper chunk pass's slots: one per (chunk, head) of (decay row: K_pad × 128 bytes, 1 KB,
// the q image: K_pad × 128 bytes, the A image: 64 × 128 bytes), plus 1 KB of alignment slack.
size_t hopper_slot_bytes(int64_t slots, int heads, int key_pad) {
  const size_t slot = size_t(key_pad) * 128 + 1024 + size_t(key_pad) * 128 + 64 * 128;
  return size_t(slots) * size_t(heads) * slot + 1024;
}

// ---- forward: the decision table ---------------------------------------------------------

// The longest sequence the planner sees from boundaries on the CPU: checked ones as they are; boundaries read back
// from the device unchecked, each clamped into [0, T] as the kernels read them (an end before its begin: empty).
TEST(GlaPlan, LongestSequenceAsTheKernelsReadIt) {
  GlaProblem p;
  p.varlen = true, p.batch = 1, p.seq_len = 10;
  std::vector<int32_t> checked = {0, 3, 9, 10};
  p.num_seqs = 3;
  const TensorView none;
  EXPECT_EQ(longest_sequence(p, TensorView::contiguous(checked.data(), DType::i32, {4}), none), 6);
  std::vector<int64_t> wild = {-4, 2, 1000, 3};  // [-4, 2) -> [0, 2); [2, 1000) -> [2, 10); [1000, 3) -> empty
  EXPECT_EQ(longest_of_boundaries(p, TensorView::contiguous(wild.data(), DType::i64, {4})), 8);
  wild = {-4, 2, 1, 1};
  EXPECT_EQ(longest_of_boundaries(p, TensorView::contiguous(wild.data(), DType::i64, {4})), 2);
  p.varlen = false;
  EXPECT_EQ(longest_sequence(p, none, none), 10);
}

// B8 T2048 H16 d64: the fast path on both (its 64×64 layout fits 163 KB); 8·16 = 128 value tiles fill
// both GPUs' SMs at one CTA each (132 / 128 = 1, 108 / 128 = 0): no split, no workspace.
TEST(GlaPlan, ForwardAnchorD64) {
  const FwdProblem p = forward(8, 2048, 16, 64, 64);
  for (const DeviceProps& d : {h100(), a100()}) {
    const FwdPlan plan = plan_forward(p, d, GlaTuning{});
    EXPECT_EQ(plan.kernel, FwdKernel::fast);
    EXPECT_EQ(plan.num_splits, 1);
    EXPECT_EQ(plan.chunks_per_split, 32);
    EXPECT_EQ(plan.states, StatesPass::none);
    EXPECT_EQ(plan.workspace_bytes, 0u);
  }
}

// B8 T4096 H16 d128: the fast path on the H100 (128×128 tiles, 223 KB of shared memory: too much for an
// A100, which runs the general kernel; K = 128 with V < 256 is not the Hopper path's). No split on either:
// 128 tiles for 132 SMs; the general kernel's 8·16·2 = 256 tiles of 64 columns for 108 × 2 slots.
TEST(GlaPlan, ForwardAnchorD128) {
  const FwdProblem p = forward(8, 4096, 16, 128, 128);
  const FwdPlan on_h100 = plan_forward(p, h100(), GlaTuning{});
  EXPECT_EQ(on_h100.kernel, FwdKernel::fast);
  EXPECT_EQ(on_h100.num_splits, 1);
  EXPECT_EQ(on_h100.workspace_bytes, 0u);
  Occupancy occupancy;
  const FwdPlan on_a100 = plan_forward(p, a100(&occupancy), GlaTuning{});
  EXPECT_EQ(on_a100.kernel, FwdKernel::general);
  EXPECT_EQ(on_a100.num_splits, 1);
  EXPECT_EQ(on_a100.workspace_bytes, 0u);
  ASSERT_EQ(occupancy.asked_bytes.size(), 1u);  // the general kernel's slots come from its occupancy
  EXPECT_EQ(occupancy.asked_bytes[0], on_a100.smem.bytes);
  EXPECT_LE(on_a100.smem.bytes, 163 * 1024);
}

// B2 T16384 H16 d128, the long-sequence anchor. H100: 32 tiles, 132 / 32 = 4 splits (chunks allow 256 / 4),
// 64 chunks each; the states kernel with one piece (3 · 32 = 96 CTAs already fill one per SM), prefix slots;
// workspace: the split slots and the pieces' slots. A100 (general kernel, 2 CTAs per SM): 64 tiles of 64
// columns, 216 / 64 = 3 splits of 86 chunks, the kernel's own states pass, the split slots only.
TEST(GlaPlan, ForwardAnchorLongSequenceSplits) {
  const FwdProblem p = forward(2, 16384, 16, 128, 128);
  const FwdPlan on_h100 = plan_forward(p, h100(), GlaTuning{});
  EXPECT_EQ(on_h100.kernel, FwdKernel::fast);
  EXPECT_EQ(on_h100.num_splits, 4);
  EXPECT_EQ(on_h100.chunks_per_split, 64);
  EXPECT_EQ(on_h100.states, StatesPass::states_kernel);
  EXPECT_EQ(on_h100.state_pieces, 1);
  EXPECT_EQ(on_h100.workspace_bytes, 2 * split_slot_bytes(p, 4));
  EXPECT_EQ(on_h100.split_states_floats, size_t(2 * 16 * 3) * 128 * 128);
  EXPECT_EQ(on_h100.split_floats, size_t(2 * 16 * 3) * 128 * 129);
  EXPECT_EQ(on_h100.piece_states_floats, size_t(2 * 16 * 3) * 128 * 128);

  const FwdPlan on_a100 = plan_forward(p, a100(), GlaTuning{});
  EXPECT_EQ(on_a100.kernel, FwdKernel::general);
  EXPECT_EQ(on_a100.num_splits, 3);
  EXPECT_EQ(on_a100.chunks_per_split, 86);
  EXPECT_EQ(on_a100.states, StatesPass::in_kernel);
  EXPECT_EQ(on_a100.state_pieces, 0);
  EXPECT_EQ(on_a100.workspace_bytes, split_slot_bytes(p, 3));
}

// One long sequence, B1 T1M H16 d128: 16 tiles, 132 / 16 = 8 splits of 2048 chunks; one piece per split would
// leave 132 − 7 · 16 = 20 SMs idle, and the pieces stay long, so two (224 CTAs, at most 2 per SM). B1 T128K:
// splits of 256 chunks, two pieces of 128. B2 T16K above keeps one (pieces of 32 chunks).
TEST(GlaPlan, ForwardOneLongSequenceTakesASecondPiece) {
  const FwdPlan million = plan_forward(forward(1, 1 << 20, 16, 128, 128), h100(), GlaTuning{});
  EXPECT_EQ(million.kernel, FwdKernel::fast);
  EXPECT_EQ(million.num_splits, 8);
  EXPECT_EQ(million.chunks_per_split, 2048);
  EXPECT_EQ(million.state_pieces, 2);
  EXPECT_EQ(million.piece_states_floats, size_t(16 * 7 * 2) * 128 * 128);
  EXPECT_EQ(plan_forward(forward(1, 1 << 17, 16, 128, 128), h100(), GlaTuning{}).state_pieces, 2);
  GlaTuning one;
  one.state_pieces = 1;  // the override still wins
  EXPECT_EQ(plan_forward(forward(1, 1 << 20, 16, 128, 128), h100(), one).state_pieces, 1);
}

// B4 T4096 H4 K256 V512, the GLA layer's heads: the Hopper path on sm_90a (128 < K ≤ 256), 4·4·8 = 128 value
// tiles of 64 columns: no split; its workspace is the chunk pass's slots (4 · 64 chunks × 4 heads, key pad
// 256). The A100 has neither the Hopper code nor room for the fast path's 128×128 tiles: the general kernel.
TEST(GlaPlan, ForwardAnchorGlaLayerHeads) {
  const FwdProblem p = forward(4, 4096, 4, 256, 512);
  const FwdPlan on_h100 = plan_forward(p, h100(), GlaTuning{});
  EXPECT_EQ(on_h100.kernel, FwdKernel::hopper);
  EXPECT_EQ(on_h100.num_splits, 1);
  EXPECT_EQ(on_h100.prep_key_pad, 256);
  EXPECT_EQ(on_h100.prep_chunks, 64);
  EXPECT_EQ(on_h100.prep_grid_chunks, 64);
  EXPECT_EQ(on_h100.prep_offset, 0u);
  EXPECT_EQ(on_h100.workspace_bytes, hopper_slot_bytes(4 * 64, 4, 256));
  EXPECT_TRUE(on_h100.hopper_pdl);

  const FwdPlan on_a100 = plan_forward(p, a100(), GlaTuning{});
  EXPECT_EQ(on_a100.kernel, FwdKernel::general);
  EXPECT_EQ(on_a100.num_splits, 1);
  EXPECT_EQ(on_a100.workspace_bytes, 0u);
}

// The 340M model's heads (K = 128, V = 256, H = 4): the Hopper path when its 64-column value tiles fill at
// least half the SMs (2 × tiles > SMs): B8 T2048 has 8·4·4 = 128 tiles (256 > 132); B2 T8192 has 32
// (64 ≤ 132): the fast path, split 132 / 16 = 8 ways (16 chunks each) with the states kernel (one piece:
// 7 · 16 = 112 CTAs), as bench/results_gla_forward.md timed it.
TEST(GlaPlan, Forward340MModelHeads) {
  const FwdProblem wide = forward(8, 2048, 4, 128, 256);
  const FwdPlan hopper = plan_forward(wide, h100(), GlaTuning{});
  EXPECT_EQ(hopper.kernel, FwdKernel::hopper);
  EXPECT_EQ(hopper.num_splits, 1);
  EXPECT_EQ(hopper.prep_key_pad, 128);
  EXPECT_EQ(hopper.workspace_bytes, hopper_slot_bytes(8 * 32, 4, 128));

  const FwdProblem long_seq = forward(2, 8192, 4, 128, 256);
  const FwdPlan fast = plan_forward(long_seq, h100(), GlaTuning{});
  EXPECT_EQ(fast.kernel, FwdKernel::fast);
  EXPECT_EQ(fast.num_splits, 8);
  EXPECT_EQ(fast.chunks_per_split, 16);
  EXPECT_EQ(fast.states, StatesPass::states_kernel);
  EXPECT_EQ(fast.state_pieces, 1);
  EXPECT_EQ(fast.workspace_bytes, 2 * split_slot_bytes(long_seq, 8));

  // An A100: the general kernel (8·4·4 = 128 tiles of 64 columns against 108 × 2 slots: no split).
  const FwdPlan general = plan_forward(wide, a100(), GlaTuning{});
  EXPECT_EQ(general.kernel, FwdKernel::general);
  EXPECT_EQ(general.num_splits, 1);
}

// The Hopper path's slots for a varlen batch: one per (chunk of the packed T, head) plus one per sequence and
// one more (a sequence's chunks start at its own boundary), after the split's slots; its chunk pass covers the
// longest sequence's chunks. Past 65535 chunks of T the Hopper path does not apply (the general kernel runs: the
// fast path takes K ≤ 128).
TEST(GlaPlan, ForwardHopperVarlenAndLimits) {
  FwdProblem p = forward(3, 4096, 4, 256, 512);
  p.varlen = true, p.longest = 2000;
  const FwdPlan plan = plan_forward(p, h100(), GlaTuning{});
  EXPECT_EQ(plan.kernel, FwdKernel::hopper);
  EXPECT_EQ(plan.num_splits, 2);  // 64 chunks, the longest 32: 2 sequences of 4·8 tiles, 132 / 64 = 2 splits
  EXPECT_EQ(plan.prep_chunks, 64);
  EXPECT_EQ(plan.prep_grid_chunks, 32);
  EXPECT_EQ(plan.workspace_bytes, split_slot_bytes(p, 2) + hopper_slot_bytes(3 + 64 + 1, 4, 256));
  const FwdProblem huge = forward(1, int64_t(65536) * 64, 4, 256, 512);
  EXPECT_EQ(plan_forward(huge, h100(), GlaTuning{}).kernel, FwdKernel::general);
}

// fp32 inputs: always the general kernel (32-column value tiles); a fixed-length batch of one sequence
// and one head is split into as many pieces as slots allow, at least 4 chunks each.
TEST(GlaPlan, ForwardFp32GeneralKernel) {
  const FwdProblem p = forward(1, 4096, 1, 64, 64, Elem::f32);
  const FwdPlan plan = plan_forward(p, h100(), GlaTuning{});
  EXPECT_EQ(plan.kernel, FwdKernel::general);
  // 2 value tiles, 264 slots: 132 splits wanted, 64 / 4 = 16 allowed.
  EXPECT_EQ(plan.num_splits, 16);
  EXPECT_EQ(plan.chunks_per_split, 4);
  EXPECT_EQ(plan.states, StatesPass::in_kernel);
  EXPECT_EQ(plan.workspace_bytes, split_slot_bytes(p, 16));
}

// Varlen without host lengths: nothing to plan a split with; with them, the batch counts as as many sequences of
// the longest's length as its tokens make, to the nearest: T = 30000 is 469 chunks, the longest 313, so 1 sequence
// of one tile: 132 splits wanted, 313 / 4 = 78 allowed, of 5 chunks: 63 of them.
TEST(GlaPlan, ForwardVarlenSplitNeedsHostLengths) {
  FwdProblem p = forward(3, 30000, 1, 64, 64);
  p.varlen = true, p.longest = -1;
  EXPECT_EQ(plan_forward(p, h100(), GlaTuning{}).num_splits, 1);
  p.longest = 20000;
  const FwdPlan plan = plan_forward(p, h100(), GlaTuning{});
  EXPECT_EQ(plan.num_splits, 63);
  EXPECT_EQ(plan.chunks_per_split, 5);
}

// One long sequence among short ones (issue 24's varlen shape, 1M tokens and 32 of 2048, H16 d128): 17408 chunks,
// 16384 of them the long one's, count as 1 sequence of 16 value tiles: 132 / 16 = 8 splits, as the long sequence
// alone. Two sequences of nearly the longest's length count as 2. As many short sequences of the same tokens split
// none.
TEST(GlaPlan, ForwardVarlenLongSequenceAmongShortOnes) {
  FwdProblem p = forward(33, (1 << 20) + 32 * 2048, 16, 128, 128);
  p.varlen = true, p.longest = 1 << 20;
  EXPECT_EQ(plan_forward(p, h100(), GlaTuning{}).num_splits, 8);
  EXPECT_EQ(plan_forward(forward(1, 1 << 20, 16, 128, 128), h100(), GlaTuning{}).num_splits, 8);
  FwdProblem pair = forward(2, (1 << 20) + (1 << 20) - 64 * 100, 16, 128, 128);
  pair.varlen = true, pair.longest = 1 << 20;
  EXPECT_EQ(plan_forward(pair, h100(), GlaTuning{}).num_splits, 4);  // 132 / 32
  FwdProblem shorts = forward(544, 544 * 2048, 16, 128, 128);
  shorts.varlen = true, shorts.longest = 2048;
  EXPECT_EQ(plan_forward(shorts, h100(), GlaTuning{}).num_splits, 1);
}

// Inputs the fast path does not take: unaligned rows, an fp64 gate, K > 128.
TEST(GlaPlan, ForwardFastPathConditions) {
  FwdProblem p = forward(8, 2048, 16, 64, 64);
  p.v_rows16 = false;
  EXPECT_EQ(plan_forward(p, h100(), GlaTuning{}).kernel, FwdKernel::general);
  p = forward(8, 2048, 16, 64, 64);
  p.gate_dtype = Elem::f64;
  EXPECT_EQ(plan_forward(p, h100(), GlaTuning{}).kernel, FwdKernel::general);
  p.gate = Gate::scalar;  // a scalar gate's dtype does not matter
  EXPECT_EQ(plan_forward(p, h100(), GlaTuning{}).kernel, FwdKernel::fast);
  p = forward(8, 2048, 16, 512, 64);
  EXPECT_EQ(plan_forward(p, h100(), GlaTuning{}).kernel, FwdKernel::general);
  p = forward(8, 2048, 16, 129, 64);
  EXPECT_EQ(plan_forward(p, a100(), GlaTuning{}).kernel, FwdKernel::general);
}

// The fast path's split always takes the states kernel (the planner does not check that it fits): its shared
// memory is less than the fast kernel's for every input the fast path takes, K ≤ 128 and any V, gate and gate
// dtype; also for 128 < K ≤ 256 (the segment summaries' key parts), against the fast kernel's widest tiles.
TEST(GlaPlan, ForwardStatesKernelFitsWhereTheFastPathDoes) {
  for (const Elem input : {Elem::bf16, Elem::f16})
    for (const Gate gate : {Gate::none, Gate::scalar, Gate::vector})
      for (const Elem gate_dtype : {input, Elem::f32})
        for (const int key_dim : {1, 64, 65, 128, 129, 256})
          for (const int value_dim : {1, 64, 65, 128, 512, 4096}) {
            const int states = split_states_smem_bytes(input, gate_dtype, gate, key_dim, value_dim);
            EXPECT_GT(states, 0);
            EXPECT_LT(states, fast_chunk_smem_bytes(key_dim, value_dim))
                << "K " << key_dim << " V " << value_dim << " gate " << int(gate);
          }
}

// A device without room for the general kernel's shared memory: an error naming q, not a failed launch.
TEST(GlaPlan, ForwardTooLittleSharedMemoryIsAnError) {
  DeviceProps small = a100();
  small.max_smem_per_block = 48 * 1024;
  const FwdProblem p = forward(1, 256, 1, 512, 64, Elem::f32);
  try {
    plan_forward(p, small, GlaTuning{});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::unsupported);
    EXPECT_EQ(e.argument(), "q");
  }
}

// ---- forward: intra (GlaForwardArgs::intra) -----------------------------------------------------

// Where saves_intra says yes, a forward with intra takes the fast kernel or the Hopper path whatever the tuning,
// and the library's choice between them; where it says no, nothing would write intra.
TEST(GlaPlan, ForwardWithIntraTakesAKernelThatWritesIt) {
  GlaTuning no_fast, hopper_on, hopper_off;
  no_fast.fast = false;
  hopper_on.hopper = Force::on;
  hopper_off.hopper = Force::off;
  struct Case {
    FwdProblem p;
    FwdKernel h100_kernel;  // with intra, under every tuning
    bool library_writes = true;  // the library's choice without intra writes it too (then the same kernel)
  };
  FwdProblem fp32_gate = forward(8, 2048, 16, 64, 64);
  fp32_gate.gate_dtype = Elem::f32;
  FwdProblem unaligned_keys = forward(2, 256, 2, 100, 64);  // q, k rows not 16-byte aligned: the Hopper path's
  unaligned_keys.q_rows16 = unaligned_keys.k_rows16 = false;
  const Case cases[] = {
      {forward(8, 2048, 16, 64, 64), FwdKernel::fast},
      {forward(8, 4096, 16, 128, 128), FwdKernel::fast},
      {fp32_gate, FwdKernel::fast},
      {forward(8, 2048, 4, 128, 256), FwdKernel::hopper},  // the 340M model's heads, value tiles fill the SMs
      {forward(2, 8192, 4, 128, 256), FwdKernel::fast},    // ... and where they do not
      {forward(4, 4096, 4, 256, 512), FwdKernel::hopper},
      {unaligned_keys, FwdKernel::hopper, false},  // (without intra: the general kernel)
  };
  for (const Case& c : cases) {
    EXPECT_TRUE(saves_intra(c.p, h100())) << "K " << c.p.key_dim << " V " << c.p.value_dim;
    FwdProblem with = c.p;
    with.intra = true;
    for (const GlaTuning& tuning : {GlaTuning{}, no_fast, hopper_on, hopper_off})
      EXPECT_EQ(plan_forward(with, h100(), tuning).kernel, c.h100_kernel)
          << "K " << c.p.key_dim << " V " << c.p.value_dim;
    if (c.library_writes)
      EXPECT_EQ(plan_forward(with, h100(), GlaTuning{}).kernel, plan_forward(c.p, h100(), GlaTuning{}).kernel)
          << "intra leaves the library's choice alone";
  }
  // The A100 has no Hopper path, and the fast kernel's K, V > 64 tiles do not fit its shared memory.
  EXPECT_TRUE(saves_intra(forward(8, 2048, 16, 64, 64), a100()));
  EXPECT_FALSE(saves_intra(forward(4, 4096, 4, 256, 512), a100()));
  EXPECT_FALSE(saves_intra(unaligned_keys, a100()));

  FwdProblem scalar = forward(8, 2048, 16, 64, 64);
  scalar.gate = Gate::scalar;
  EXPECT_FALSE(saves_intra(scalar, h100())) << "a scalar gate: the kernels write no A";
  FwdProblem unaligned_values = forward(2, 256, 2, 64, 100);
  unaligned_values.v_rows16 = false;
  EXPECT_FALSE(saves_intra(unaligned_values, h100()));
  EXPECT_FALSE(saves_intra(forward(2, 256, 2, 64, 64, Elem::f32), h100())) << "fp32 inputs";
  FwdProblem unaligned_o = forward(8, 2048, 16, 64, 64);
  unaligned_o.o_rows16 = false;
  EXPECT_TRUE(saves_intra(unaligned_o, h100())) << "o is not asked (the forward requires its rows)";
}

// ---- forward: tuning forces each choice ------------------------------------------------------

TEST(GlaPlan, ForwardTuningForcesChoices) {
  const FwdProblem d64 = forward(8, 2048, 16, 64, 64);
  GlaTuning no_fast;
  no_fast.fast = false;
  EXPECT_EQ(plan_forward(d64, h100(), no_fast).kernel, FwdKernel::general);

  GlaTuning hopper_on;
  hopper_on.hopper = Force::on;
  EXPECT_EQ(plan_forward(forward(8, 4096, 16, 128, 128), h100(), hopper_on).kernel, FwdKernel::hopper);
  EXPECT_EQ(plan_forward(forward(8, 4096, 16, 128, 128), a100(), hopper_on).kernel, FwdKernel::general);
  GlaTuning hopper_off;
  hopper_off.hopper = Force::off;
  EXPECT_EQ(plan_forward(forward(4, 4096, 4, 256, 512), h100(), hopper_off).kernel, FwdKernel::general);
  // Forced onto K ≤ 64, the Hopper path pads the keys to 128; with K ≤ 128 it never splits (a forced split
  // count included), with K > 128 it does.
  GlaTuning hopper_split = hopper_on;
  hopper_split.splits = 3;
  const FwdPlan narrow = plan_forward(forward(1, 4096, 2, 64, 64), h100(), hopper_split);
  EXPECT_EQ(narrow.kernel, FwdKernel::hopper);
  EXPECT_EQ(narrow.prep_key_pad, 128);
  EXPECT_EQ(narrow.num_splits, 1);
  EXPECT_EQ(narrow.states, StatesPass::none);
  const FwdPlan wide_keys = plan_forward(forward(1, 4096, 2, 256, 64), h100(), hopper_split);
  EXPECT_EQ(wide_keys.prep_key_pad, 256);
  EXPECT_EQ(wide_keys.num_splits, 3);
  EXPECT_EQ(wide_keys.states, StatesPass::in_kernel);

  GlaTuning three_splits;
  three_splits.splits = 3;
  const FwdPlan split = plan_forward(d64, h100(), three_splits);
  EXPECT_EQ(split.num_splits, 3);
  EXPECT_EQ(split.chunks_per_split, 11);
  EXPECT_EQ(split.states, StatesPass::states_kernel);
  three_splits.splits = 1000;  // at most one split per chunk
  EXPECT_EQ(plan_forward(d64, h100(), three_splits).num_splits, 32);

  GlaTuning pieces;
  pieces.state_pieces = 3;
  const FwdProblem long_seq = forward(2, 16384, 16, 128, 128);
  const FwdPlan with_pieces = plan_forward(long_seq, h100(), pieces);
  EXPECT_EQ(with_pieces.state_pieces, 3);
  EXPECT_EQ(with_pieces.workspace_bytes, split_slot_bytes(long_seq, 4) * 4);  // split slots + 3 pieces' slots
  EXPECT_EQ(with_pieces.piece_states_floats, size_t(2 * 16 * 3 * 3) * 128 * 128);
  pieces.state_pieces = 500;  // at most one piece per chunk of a split
  EXPECT_EQ(plan_forward(long_seq, h100(), pieces).state_pieces, 64);

  GlaTuning no_pdl;
  no_pdl.hopper_pdl = false;
  EXPECT_FALSE(plan_forward(forward(4, 4096, 4, 256, 512), h100(), no_pdl).hopper_pdl);
}

// ---- backward ----------------------------------------------------------------------------------

BwdProblem backward(int64_t B, int64_t T, int H, int K, int V, bool f32 = false) {
  BwdProblem p;
  p.chunked = true, p.compute = f32 ? Elem::f32 : Elem::bf16;
  p.batch = p.num_seqs = B, p.seq_len = T;
  p.heads = H, p.key_dim = K, p.value_dim = V;
  p.gate = Gate::vector, p.gate_dtype = f32 ? Elem::f32 : Elem::bf16;
  p.q_bf16_rows = p.k_bf16_rows = p.v_bf16_rows = p.do_bf16_rows = p.g_bf16_rows = !f32;
  p.dq_bf16_rows = p.dk_bf16_rows = p.dv_bf16_rows = p.dg_bf16_rows = !f32;
  return p;
}

// State tiles: one 64×64 tile of the compute type per (chunk, head, key tile, value tile), twice (S and dS).
size_t state_bytes(const BwdProblem& p, size_t elem) {
  const int64_t slots = p.batch * ((p.seq_len + 63) / 64);
  return size_t(slots * p.heads * ((p.key_dim + 63) / 64) * ((p.value_dim + 63) / 64)) * 4096 * elem;
}

// B8 T4096 H16 d128, bf16 rows: paired scans (2 value tiles); pipelined on the H100 (two 105 KB blocks fit
// its 228 KB per SM) but not on the A100 (164 KB); 1024 scan blocks against 132 × 4 resident: no split; the
// chunk kernel overlaps the scans where the code has griddepcontrol (sm_90).
TEST(GlaPlan, BackwardAnchorD128) {
  const BwdProblem p = backward(8, 4096, 16, 128, 128);
  const BwdPlan on_h100 = plan_backward(p, h100(), GlaTuning{});
  EXPECT_EQ(on_h100.scans, BwdScanKernel::pipelined);
  EXPECT_EQ(on_h100.scan_splits, 1);
  EXPECT_EQ(on_h100.chunks_per_split, 0);
  EXPECT_TRUE(on_h100.overlap);
  EXPECT_EQ(on_h100.diag_factor_limit, 64.f);  // factors within 2^±64: what bf16 and fp32 operands hold
  EXPECT_EQ(on_h100.chunk_kernel, BwdChunkKernel::plain);
  EXPECT_EQ(on_h100.num_slots, 8 * 64);
  EXPECT_EQ(on_h100.total(), 2 * state_bytes(p, 2));

  const BwdPlan on_a100 = plan_backward(p, a100(), GlaTuning{});
  EXPECT_EQ(on_a100.scans, BwdScanKernel::paired);
  EXPECT_FALSE(on_a100.overlap);
  EXPECT_EQ(on_a100.scan_splits, 1);

  // A vector gate in fp32 (bench_cp.py's) or not in whole bf16 rows: the pipelined scans copy a vector gate's
  // raw bf16 rows a step ahead, so such a gate runs the paired scans.
  BwdProblem f32_gate = p;
  f32_gate.gate_dtype = Elem::f32;
  f32_gate.g_bf16_rows = f32_gate.dg_bf16_rows = false;
  f32_gate.g_f32_rows = f32_gate.dg_f32_rows = true;
  EXPECT_EQ(plan_backward(f32_gate, h100(), GlaTuning{}).scans, BwdScanKernel::paired);
  EXPECT_EQ(plan_backward(f32_gate, h100(), GlaTuning{}).chunk_kernel, BwdChunkKernel::plain_f32_dg);
}

// B2 T16384 H16 d128: 256 scan blocks fill half of the H100's 528 slots: the pipelined scans stay unsplit
// (they split only at a quarter); the A100's unpipelined scans at 432 / 256 = 1 slot per block: no split.
TEST(GlaPlan, BackwardAnchorLongSequence) {
  const BwdProblem p = backward(2, 16384, 16, 128, 128);
  EXPECT_EQ(plan_backward(p, h100(), GlaTuning{}).scan_splits, 1);
  EXPECT_EQ(plan_backward(p, a100(), GlaTuning{}).scan_splits, 1);
  BwdProblem unpipelined = p;
  unpipelined.g_bf16_rows = false;  // a vector gate not in whole bf16 rows: no pipeline, 2 slots per block suffice
  const BwdPlan split = plan_backward(unpipelined, h100(), GlaTuning{});
  EXPECT_EQ(split.scans, BwdScanKernel::paired);
  EXPECT_EQ(split.scan_splits, 2);  // min(528 / 256, 256 / 8) = 2 pieces of 128 chunks
  EXPECT_EQ(split.chunks_per_split, 128);
  EXPECT_FALSE(split.overlap);      // the chunk kernel follows the fold
}

// Few heads, a long sequence: 32 scan blocks, 528 / 32 = 16 pieces (256 / 8 = 32 allowed) of 16 chunks;
// the summaries (state tile and decay per piece and tile, both scans) and the chunk decays join the scratch.
TEST(GlaPlan, BackwardSplitScansAndWorkspace) {
  const BwdProblem p = backward(1, 16384, 4, 128, 128);
  const BwdPlan plan = plan_backward(p, h100(), GlaTuning{});
  EXPECT_EQ(plan.scan_splits, 16);
  EXPECT_EQ(plan.chunks_per_split, 16);
  EXPECT_FALSE(plan.overlap);
  EXPECT_EQ(plan.split_summaries, size_t(2 * 1 * 4 * 16 * 4) * (4096 + 64) * kFloat);
  // Chunk decays: both scans × 256 chunks of 64 tokens × 4 heads × 2 key tiles × 64 columns.
  EXPECT_EQ(plan.chunk_decays, size_t(2 * 256 * 4 * 2 * 64) * kFloat);
  EXPECT_EQ(plan.total(), 2 * state_bytes(p, 2) + plan.split_summaries + plan.chunk_decays);
  BwdProblem varlen = p;
  varlen.varlen = true;  // varlen with the lengths only on the device: no split, unless forced
  EXPECT_EQ(plan_backward(varlen, h100(), GlaTuning{}).scan_splits, 1);
  GlaTuning forced;
  forced.bwd_scan_split = 100;  // pieces counted from T, the bound of the longest
  EXPECT_EQ(plan_backward(varlen, h100(), forced).scan_splits, 3);
  varlen.longest = 16384;  // one sequence, its length known: the fixed-length plan
  EXPECT_EQ(plan_backward(varlen, h100(), GlaTuning{}).scan_splits, 16);
  EXPECT_EQ(plan_backward(varlen, h100(), GlaTuning{}).chunks_per_split, 16);
}

// Varlen, one long sequence among short ones (16384 tokens and eight of 512): counted as 320 / 256 = 1.25, to
// the nearest 1 sequence of the longest's 256 chunks, 2 × 4 × 4 = 32 scan blocks, 528 / 32 = 16 pieces of 16
// chunks. Every sequence is cut at the same places; the short ones' later pieces are empty. Many sequences of the
// longest's length fill the GPU unsplit.
TEST(GlaPlan, BackwardSplitScansVarlen) {
  BwdProblem p = backward(1, 16384 + 8 * 512, 4, 128, 128);
  p.varlen = true, p.num_seqs = 9, p.longest = 16384;
  const BwdPlan plan = plan_backward(p, h100(), GlaTuning{});
  EXPECT_EQ(plan.scan_splits, 16);
  EXPECT_EQ(plan.chunks_per_split, 16);
  EXPECT_EQ(plan.split_summaries, size_t(2 * 9 * 4 * 16 * 4) * (4096 + 64) * kFloat);
  p.seq_len = 64 * 4096, p.num_seqs = 64, p.longest = 4096;  // 64 sequences of 4096: 2048 blocks, no room
  EXPECT_EQ(plan_backward(p, h100(), GlaTuning{}).scan_splits, 1);
  p.seq_len = p.longest = 0, p.num_seqs = 3;  // only empty sequences
  EXPECT_EQ(plan_backward(p, h100(), GlaTuning{}).scan_splits, 1);
}

// The 340M model's heads (K128 V256, H4) at B8 T2048: 4 value tiles (paired), pipelined; 2 scans × 8 × 4 ×
// 8 tiles = 512 blocks for 528 slots: unsplit. fp32 inputs: fp32 state tiles, 2 resident blocks per SM, no
// pipeline.
TEST(GlaPlan, Backward340MAndFp32) {
  const BwdProblem model = backward(8, 2048, 4, 128, 256);
  const BwdPlan plan = plan_backward(model, h100(), GlaTuning{});
  EXPECT_EQ(plan.scans, BwdScanKernel::pipelined);
  EXPECT_EQ(plan.scan_splits, 1);
  EXPECT_EQ(plan.total(), 2 * state_bytes(model, 2));

  const BwdProblem f32 = backward(1, 4096, 2, 64, 64, true);
  const BwdPlan f32_plan = plan_backward(f32, h100(), GlaTuning{});
  EXPECT_EQ(f32_plan.scans, BwdScanKernel::one_tile);  // one value tile
  EXPECT_EQ(f32_plan.chunk_kernel, BwdChunkKernel::f32);
  // 4 blocks, 132 × 2 resident: 66 per block; min(66, 64 / 8 = 8) = 8 pieces of 8 chunks.
  EXPECT_EQ(f32_plan.scan_splits, 8);
  EXPECT_EQ(f32_plan.states, state_bytes(f32, 4));
}

TEST(GlaPlan, BackwardRecurrentScratch) {
  BwdProblem p = backward(2, 100, 3, 32, 48);
  p.chunked = false;
  const BwdPlan plan = plan_backward(p, h100(), GlaTuning{});
  const size_t per_token = size_t(2 * 100 * 3 * 32) * kFloat;
  EXPECT_EQ(plan.states, 0u);
  EXPECT_EQ(plan.dq_acc, per_token);
  EXPECT_EQ(plan.dg_prefix_terms, per_token);
  EXPECT_EQ(plan.dg_final, size_t(2 * 3 * 32) * kFloat);
  EXPECT_NE(plan.scans, BwdScanKernel::pipelined);
  EXPECT_EQ(plan.total(), 4 * ((per_token + 255) / 256 * 256) + (size_t(2 * 3 * 32) * kFloat + 255) / 256 * 256);
}

// The chunk kernel: the plain instantiation only where every tile it reads or writes is whole aligned bf16
// rows (a vector gate and its dg: bf16 or fp32 rows) and a scalar gate is bf16 or fp32 (its loaders there); else
// the general one. Where the plain one would take a scalar gate or none at K, V of 64 or 128, the scalar kernel.
TEST(GlaPlan, BackwardChunkKernel) {
  const BwdProblem p = backward(2, 1000, 2, 128, 128);
  EXPECT_EQ(plan_backward(p, h100(), GlaTuning{}).chunk_kernel, BwdChunkKernel::plain);
  auto kernel = [](const BwdProblem& q) { return plan_backward(q, h100(), GlaTuning{}).chunk_kernel; };
  BwdProblem q = p;
  q.dv_bf16_rows = false;  // an output in another layout (or dtype)
  EXPECT_EQ(kernel(q), BwdChunkKernel::general);
  q = p;
  q.dg_bf16_rows = false;  // a vector gate's dg in fp32
  EXPECT_EQ(kernel(q), BwdChunkKernel::general);
  q = p;
  q.gate = Gate::scalar, q.g_bf16_rows = q.dg_bf16_rows = false;
  EXPECT_EQ(kernel(q), BwdChunkKernel::scalar);
  q.gate_dtype = Elem::f32;  // a scalar gate in fp32 (FLA's simple GLA gate)
  EXPECT_EQ(kernel(q), BwdChunkKernel::scalar);
  q.gate_dtype = Elem::f16;  // any other dtype: the general kernel
  EXPECT_EQ(kernel(q), BwdChunkKernel::general);
  q.gate_dtype = Elem::f32;
  for (const auto& [K, V, expected] : {std::tuple{64, 64, BwdChunkKernel::scalar},
                                       std::tuple{128, 64, BwdChunkKernel::scalar},
                                       std::tuple{64, 128, BwdChunkKernel::scalar},
                                       std::tuple{256, 128, BwdChunkKernel::plain},
                                       std::tuple{128, 192, BwdChunkKernel::plain}}) {
    BwdProblem shape = q;
    shape.key_dim = K, shape.value_dim = V;
    EXPECT_EQ(kernel(shape), expected) << "K " << K << " V " << V;
  }
  DeviceProps small = h100();
  small.max_smem_per_block = 100 * 1024;  // the scalar kernel's 159 KB at K = V = 128 do not fit
  EXPECT_EQ(plan_backward(q, small, GlaTuning{}).chunk_kernel, BwdChunkKernel::plain);
  EXPECT_LE(bwd_scalar_chunk_smem_bytes(128, 128), 160 * 1024);
  q = p;
  q.gate_dtype = Elem::f32;  // a vector gate in fp32, and its dg: whole fp32 rows are copied and stored there too
  q.g_bf16_rows = q.dg_bf16_rows = false;
  q.g_f32_rows = q.dg_f32_rows = true;
  EXPECT_EQ(kernel(q), BwdChunkKernel::plain_f32_dg);
  q.dg_f32_rows = false;  // dg in another layout
  EXPECT_EQ(kernel(q), BwdChunkKernel::general);
  q.dg_bf16_rows = true;  // an fp32 gate with a bf16 dg: only the general kernel has both
  EXPECT_EQ(kernel(q), BwdChunkKernel::general);
  q.dg_bf16_rows = false;
  q.dg_f32_rows = true, q.g_f32_rows = false;  // g in another layout
  EXPECT_EQ(kernel(q), BwdChunkKernel::general);
  q = p;
  q.dg_bf16_rows = false, q.dg_f32_rows = true;  // a bf16 gate with its dg in fp32 (dg's dtype is the caller's)
  EXPECT_EQ(kernel(q), BwdChunkKernel::plain_f32_dg);
  q.gate = Gate::scalar;  // a scalar gate's dg is stored per token: whatever its dtype
  EXPECT_EQ(kernel(q), BwdChunkKernel::scalar);
  q.gate = Gate::none;
  EXPECT_EQ(kernel(q), BwdChunkKernel::scalar);
  EXPECT_EQ(kernel(backward(2, 1000, 2, 128, 128, true)), BwdChunkKernel::f32);
}

// The folded normaliser's dz handed from chunk to chunk inside the scalar chunk kernel (the chain) where the
// (sequence, head) pairs are at least half the blocks in flight, so that two chunks of a pair never wait on each
// other inside a wave; else the two passes after it. Fixed-length sequences only; FLASHGLA_GLA_BWD_NORM forces
// either (the chain still not for varlen or empty sequences).
TEST(GlaPlan, BackwardNormaliserChain) {
  auto normalized = [](int64_t B, int64_t T, int H, int D) {
    BwdProblem p = backward(B, T, H, D, D);
    p.gate = Gate::none, p.normalize = true;
    return p;
  };
  auto plan = [](const BwdProblem& p, GlaTuning::Force force = GlaTuning::Force::library) {
    GlaTuning t;
    t.bwd_norm_chain = force;
    return plan_backward(p, h100(), t);
  };
  // Issue 23's shapes: 128 pairs against 132 blocks in flight at d128, 512 against 264 at d64.
  for (const BwdProblem& p : {normalized(8, 4096, 16, 128), normalized(32, 2048, 16, 64)}) {
    const BwdPlan chained = plan(p);
    EXPECT_EQ(chained.chunk_kernel, BwdChunkKernel::scalar);
    EXPECT_TRUE(chained.norm_chain);
    EXPECT_EQ(chained.norm_key_grads, size_t(chained.num_slots * p.heads * p.key_dim) * 8);  // carry and flag
    const BwdPlan passes = plan(p, GlaTuning::Force::off);
    EXPECT_FALSE(passes.norm_chain);
    EXPECT_EQ(passes.norm_key_grads, size_t(passes.num_slots * p.heads * p.key_dim) * sizeof(float));
  }
  EXPECT_TRUE(plan(normalized(4, 4096, 17, 128)).norm_chain);    // 68 pairs ≥ 132 / 2
  EXPECT_FALSE(plan(normalized(4, 4096, 16, 128)).norm_chain);   // 64 pairs
  EXPECT_FALSE(plan(normalized(8, 2048, 16, 64)).norm_chain);    // 128 pairs against 264 in flight at d64
  EXPECT_TRUE(plan(normalized(1, 4096, 2, 128), GlaTuning::Force::on).norm_chain);
  BwdProblem varlen = normalized(1, 65536, 16, 128);
  varlen.varlen = true, varlen.num_seqs = 64;
  EXPECT_FALSE(plan(varlen).norm_chain);
  EXPECT_FALSE(plan(varlen, GlaTuning::Force::on).norm_chain);
  EXPECT_FALSE(plan(normalized(64, 0, 16, 128), GlaTuning::Force::on).norm_chain);  // no chunk kernel to run it
  BwdProblem plain = normalized(8, 4096, 16, 128);
  plain.normalize = false;
  EXPECT_FALSE(plan(plain, GlaTuning::Force::on).norm_chain);
}

// fp16 inputs compute with fp16 operands (bf16 ones cost 3 bits: dq ~3e-3 against FLA's 1e-3): the general
// kernel's fp16 instantiation whatever the layout, paired or one-tile scans (the pipelined scans copy bf16
// rows), fp16 states of the same size as bf16's, and A's factored diagonal blocks only within 2^±4, which fp16
// holds.
TEST(GlaPlan, BackwardF16Operands) {
  BwdProblem p = backward(8, 4096, 16, 128, 128);
  p.compute = Elem::f16, p.gate_dtype = Elem::f16;
  // bf16_rows (gla_bwd_chunk.cu) is false for any fp16 tensor.
  p.q_bf16_rows = p.k_bf16_rows = p.v_bf16_rows = p.do_bf16_rows = p.g_bf16_rows = false;
  p.dq_bf16_rows = p.dk_bf16_rows = p.dv_bf16_rows = p.dg_bf16_rows = false;
  const BwdPlan plan = plan_backward(p, h100(), GlaTuning{});
  EXPECT_EQ(plan.chunk_kernel, BwdChunkKernel::f16);
  EXPECT_EQ(plan.scans, BwdScanKernel::paired);
  EXPECT_EQ(plan.states, state_bytes(p, 2));
  EXPECT_EQ(plan.dstates, state_bytes(p, 2));
  EXPECT_EQ(plan.diag_factor_limit, kDiagFactorLimitF16);
  EXPECT_LE(kDiagFactorLimitF16, 4.f);  // 4094 · 2^4 < 65504
  EXPECT_EQ(plan_backward(backward(8, 4096, 16, 128, 128), h100(), GlaTuning{}).diag_factor_limit, kDiagFactorLimit);
  GlaTuning elementwise;
  elementwise.bwd_diag_elementwise = true;
  EXPECT_EQ(plan_backward(p, h100(), elementwise).diag_factor_limit, -1.f);
  // Whatever the layout and the gate: the one fp16 instantiation.
  BwdProblem scalar = p;
  scalar.gate = Gate::scalar, scalar.gate_dtype = Elem::f32;
  EXPECT_EQ(plan_backward(scalar, h100(), GlaTuning{}).chunk_kernel, BwdChunkKernel::f16);
  GlaTuning general;
  general.bwd_general_layout = true;
  EXPECT_EQ(plan_backward(p, h100(), general).chunk_kernel, BwdChunkKernel::f16);
  // Scan blocks per SM as bf16's (same element size): a split as bf16 gets at the same shape.
  BwdProblem small = backward(1, 16384, 4, 128, 128), small_f16 = small;
  small_f16.compute = Elem::f16;
  small_f16.q_bf16_rows = small_f16.k_bf16_rows = small_f16.v_bf16_rows = small_f16.do_bf16_rows = false;
  small.q_bf16_rows = false;  // unpipelined bf16, as fp16 is
  EXPECT_EQ(plan_backward(small_f16, h100(), GlaTuning{}).scan_splits,
            plan_backward(small, h100(), GlaTuning{}).scan_splits);
}

TEST(GlaPlan, BackwardTuningForcesChoices) {
  const BwdProblem p = backward(8, 4096, 16, 128, 128);
  GlaTuning t;
  t.bwd_scan_pairs = false;
  EXPECT_EQ(plan_backward(p, h100(), t).scans, BwdScanKernel::one_tile);  // the pipeline needs pairs
  t = GlaTuning{};
  t.bwd_scan_pipeline = false;
  EXPECT_EQ(plan_backward(p, h100(), t).scans, BwdScanKernel::paired);
  t = GlaTuning{};
  t.bwd_scan_split = 3;  // pieces of 3 chunks
  const BwdPlan split = plan_backward(p, h100(), t);
  EXPECT_EQ(split.chunks_per_split, 3);
  EXPECT_EQ(split.scan_splits, 22);
  EXPECT_FALSE(split.overlap);
  t.bwd_scan_split = 0;  // none
  EXPECT_EQ(plan_backward(backward(1, 16384, 4, 128, 128), h100(), t).scan_splits, 1);
  t = GlaTuning{};
  t.bwd_diag_elementwise = true;
  EXPECT_LT(plan_backward(p, h100(), t).diag_factor_limit, 0.f);
  t = GlaTuning{};
  t.bwd_general_layout = true;
  EXPECT_EQ(plan_backward(p, h100(), t).chunk_kernel, BwdChunkKernel::general);
  t = GlaTuning{};
  t.bwd_overlap = Force::off;
  EXPECT_FALSE(plan_backward(p, h100(), t).overlap);
  t.bwd_overlap = Force::on;
  t.bwd_scan_split = 3;
  EXPECT_TRUE(plan_backward(p, h100(), t).overlap);   // after a fold too
  EXPECT_FALSE(plan_backward(p, a100(), t).overlap);  // never without griddepcontrol in the loaded code
}

// ---- segment summaries ----------------------------------------------------------------------------

SegmentProblem segment(int64_t N, int H, int K, int V, int64_t longest, Elem input = Elem::bf16) {
  SegmentProblem p;
  p.input = p.gate_dtype = input;
  p.gate = Gate::vector;
  p.heads = H, p.key_dim = K, p.value_dim = V;
  p.num_seqs = N, p.longest = longest;
  p.x_rows16 = p.y_rows16 = p.g_rows16 = true;
  return p;
}

// bf16, K ≤ 256, aligned rows: the forward's states kernel, one split per segment, pieces for about two CTAs
// per SM of at least 8 chunks: 128 (sequence, head) pairs × 1 tile: ceil(264 / 128) = 3 pieces; workspace:
// per piece a state [K][V], its decay and its log decay [K].
TEST(GlaPlan, SegmentSplitKernel) {
  const SegmentProblem p = segment(8, 16, 128, 128, 4096);
  const SegmentPlan plan = plan_segment(p, h100(), GlaTuning{});
  EXPECT_TRUE(plan.use_split);
  EXPECT_EQ(plan.split_chunks, 64);
  EXPECT_EQ(plan.pieces, 3);
  EXPECT_EQ(plan.workspace_bytes, size_t(128 * 3) * (128 * 128 + 2 * 128) * kFloat);
}

// The A100 fits the states kernel too (128×128 tiles: 102 KB with a bf16 gate, 134 KB with fp32); about two
// CTAs per SM of its 108 SMs: ceil(216 / 128) = 2 pieces.
TEST(GlaPlan, SegmentSplitKernelOnA100) {
  const SegmentPlan plan = plan_segment(segment(8, 16, 128, 128, 4096), a100(), GlaTuning{});
  EXPECT_TRUE(plan.use_split);
  EXPECT_EQ(plan.pieces, 2);
}

// fp32 (or K > 256): the generic tile kernel, chunks of 32 tokens, pieces for about eight CTAs per SM of
// at least 16 chunks: 128 pairs × 4 tiles of 64×64: ceil(1056 / 512) = 3 pieces of 43 chunks.
TEST(GlaPlan, SegmentGenericKernel) {
  const SegmentProblem p = segment(8, 16, 128, 128, 4096, Elem::f32);
  const SegmentPlan plan = plan_segment(p, h100(), GlaTuning{});
  EXPECT_FALSE(plan.use_split);
  EXPECT_EQ(plan.pieces, 3);
  EXPECT_EQ(plan.piece_chunks, 43);
  EXPECT_EQ(plan.workspace_bytes, size_t(128 * 3) * (128 * 128 + 128) * kFloat);
  // One short segment: a single piece, no workspace.
  EXPECT_EQ(plan_segment(segment(1, 1, 64, 64, 100, Elem::f32), h100(), GlaTuning{}).workspace_bytes, 0u);
}

TEST(GlaPlan, SegmentTuningForcesChoices) {
  const SegmentProblem p = segment(8, 16, 128, 128, 4096);
  GlaTuning t;
  t.segment_split_kernel = Force::off;
  EXPECT_FALSE(plan_segment(p, h100(), t).use_split);
  t = GlaTuning{};
  t.segment_pieces = 5;
  const SegmentPlan five = plan_segment(p, h100(), t);
  EXPECT_EQ(five.pieces, 5);
  EXPECT_EQ(five.workspace_bytes, size_t(128 * 5) * (128 * 128 + 2 * 128) * kFloat);
  t.segment_pieces = 1000;  // at most one piece per chunk
  EXPECT_EQ(plan_segment(p, h100(), t).pieces, 64);
}

}  // namespace
}  // namespace flashgla::cuda::gla
