// The CUDA normaliser's cut of the work (src/cuda/gla/plan/normalize_layout.h), checked on the CPU:
// every chunk of every sequence gets exactly one slot inside the grid, teams fit a block and whole
// warps, and the vector-load test accepts exactly the rows a 16-byte load may read.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <utility>
#include <vector>

#include "cuda/gla/plan/normalize_layout.h"

namespace flashgla::cuda::norm {
namespace {

// Locates every slot of the grid and checks that the chunks found are exactly those of the sequences.
void expect_slots_cover(const std::vector<int64_t>& bounds, int64_t batch, int64_t seq_len, bool varlen) {
  const int64_t num_seqs = varlen ? int64_t(bounds.size()) - 1 : batch;
  const ChunkSlots slots = chunk_slots(batch, seq_len, num_seqs, varlen);
  auto boundary = [&](int64_t i) { return bounds[size_t(i)]; };
  std::map<std::pair<int64_t, int64_t>, int> hits;
  for (int64_t slot = 0; slot < slots.count; ++slot) {
    int64_t n = -1, chunk = -1;
    if (!locate_slot(slots, slot, boundary, n, chunk)) continue;
    ASSERT_GE(n, 0);
    ASSERT_LT(n, num_seqs);
    const int64_t begin = varlen ? bounds[size_t(n)] : 0;
    EXPECT_EQ(first_slot(slots, n, begin) + chunk, slot);
    ++hits[{n, chunk}];
  }
  int64_t chunks = 0;
  for (int64_t n = 0; n < num_seqs; ++n) {
    const int64_t len = varlen ? bounds[size_t(n + 1)] - bounds[size_t(n)] : seq_len;
    for (int64_t c = 0; c < chunks_of(len); ++c, ++chunks)
      EXPECT_EQ(hits[std::make_pair(n, c)], 1) << "sequence " << n << " chunk " << c << " (len " << len << ")";
  }
  EXPECT_EQ(int64_t(hits.size()), chunks) << "a slot located a chunk no sequence has";
}

TEST(GlaNormalizeLayout, FixedLengthSlots) {
  for (int64_t T : {1, 63, 64, 65, 128, 4096, 20000}) expect_slots_cover({}, 3, T, false);
  EXPECT_EQ(chunk_slots(8, 4096, 8, false).count, 8 * 64);
  EXPECT_EQ(chunk_slots(2, 0, 2, false).count, 0);
}

TEST(GlaNormalizeLayout, VarlenSlots) {
  // Empty sequences (first, middle, last), one token, lengths on and off the chunk, a long one.
  expect_slots_cover({0, 0, 5, 5, 6, 77, 141, 205, 205}, 1, 205, true);
  expect_slots_cover({0, 64, 128, 129, 20129}, 1, 20129, true);
  expect_slots_cover({0, 0, 0}, 1, 0, true);
  expect_slots_cover({0, 1}, 1, 1, true);
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<int64_t> bounds{0};
    const int seqs = 1 + int(rng() % 40);
    for (int s = 0; s < seqs; ++s) bounds.push_back(bounds.back() + int64_t(rng() % 4 == 0 ? 0 : rng() % 300));
    expect_slots_cover(bounds, 1, bounds.back(), true);
  }
}

TEST(GlaNormalizeLayout, StepsRunBackwardsWithReverse) {
  EXPECT_EQ(step_row(10, 5, 0, false), 10);
  EXPECT_EQ(step_row(10, 5, 4, false), 14);
  EXPECT_EQ(step_row(10, 5, 0, true), 14);
  EXPECT_EQ(step_row(10, 5, 4, true), 10);
}

TEST(GlaNormalizeLayout, TeamShapes) {
  // The anchors: bf16 K=128 and K=64 with 16-byte loads; K=128 one element at a time.
  TeamShape t = team_shape(128, 8);
  EXPECT_EQ(t.lanes, 16);
  EXPECT_EQ(t.teams, 16);
  EXPECT_EQ(t.steps_per_team, 4);
  t = team_shape(64, 8);
  EXPECT_EQ(t.lanes, 8);
  EXPECT_EQ(t.teams, 32);
  t = team_shape(128, 1);
  EXPECT_EQ(t.lanes, 32);
  EXPECT_EQ(t.teams, 8);
  for (int vec : {1, 4, 8})
    for (int64_t K = vec; K <= 20000; K += (K < 600 ? vec : 997 * vec)) {
      t = team_shape(K, vec);
      const std::string at = "K " + std::to_string(K) + " vec " + std::to_string(vec);
      EXPECT_TRUE(t.lanes >= 1 && t.lanes <= 32 && (t.lanes & (t.lanes - 1)) == 0) << at;
      EXPECT_TRUE(t.teams >= 1 && (t.teams & (t.teams - 1)) == 0 && t.teams <= kChunk) << at;
      EXPECT_EQ(t.teams * t.steps_per_team, kChunk) << at;
      EXPECT_EQ(t.threads, t.lanes * t.teams) << at;
      EXPECT_EQ(t.threads % 32, 0) << at;
      EXPECT_LE(t.threads, kMaxThreads) << at;
      EXPECT_TRUE(t.lanes == 32 || t.lanes >= t.vectors) << at;
      EXPECT_EQ(t.team_array_bytes, size_t(t.teams) * size_t(K) * 4) << at;
      if (t.teams > 1) EXPECT_LE(t.team_array_bytes, size_t(kTeamFloats) * 4) << at;
    }
}

TEST(GlaNormalizeLayout, VectorRows) {
  alignas(16) static char memory[4096];
  auto view = [&](int64_t K, int offset_elems, int64_t row_stride) {
    TensorView t = TensorView::contiguous(memory + 2 * offset_elems, DType::bf16, {2, 3, 4, K});
    if (row_stride > 0) {
      t.stride[2] = row_stride, t.stride[1] = 4 * row_stride, t.stride[0] = 3 * 4 * row_stride;
    }
    return t;
  };
  EXPECT_TRUE(vector_rows(view(40, 0, 0), 8, 2));
  EXPECT_TRUE(vector_rows(view(40, 0, 0), 1, 2));
  EXPECT_FALSE(vector_rows(view(12, 0, 0), 8, 2)) << "K not a multiple of 8";
  EXPECT_FALSE(vector_rows(view(40, 1, 0), 8, 2)) << "base not 16-byte aligned";
  EXPECT_FALSE(vector_rows(view(40, 0, 43), 8, 2)) << "row stride not a multiple of 8";
  EXPECT_TRUE(vector_rows(view(40, 0, 48), 8, 2));
  TensorView strided = view(40, 0, 0);
  strided.stride[3] = 2;
  EXPECT_FALSE(vector_rows(strided, 8, 2)) << "last dimension not unit-stride";
  TensorView single = TensorView::contiguous(memory, DType::bf16, {1, 3, 4, 40});
  single.stride[0] = 7;  // a dimension of one: its stride is never used
  EXPECT_TRUE(vector_rows(single, 8, 2));
}

TEST(GlaNormalizeLayout, WorkspaceSizes) {
  const ChunkSlots fixed = chunk_slots(8, 4096, 8, false);
  EXPECT_EQ(forward_workspace_floats(fixed, 16, 128), size_t(512) * 16 * 128);
  EXPECT_EQ(backward_workspace_floats(fixed, 16, 128), size_t(2) * 512 * 16 * 128 + size_t(512) * 16 * kChunk);
  EXPECT_EQ(forward_workspace_floats(chunk_slots(1, 0, 3, true), 16, 128), 0u);
}

}  // namespace
}  // namespace flashgla::cuda::norm
