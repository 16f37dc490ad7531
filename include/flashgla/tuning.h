// Tuning of the CUDA kernels, passed with each call (GlaForwardArgs::tuning, AttentionForwardArgs::tuning, ...).
// A default-constructed struct is the library's choice everywhere; benchmarks and tests set fields to force a
// path. The library never reads the environment for these: the flashgla command, the benchmarks and the Python
// extension map the FLASHGLA_* variables named below onto them (tools/tuning_env.h).
#pragma once

#include <cstdint>

namespace flashgla {

struct GlaTuning {
  enum class Force : int8_t { library, off, on };
  // Forward.
  bool fast = true;                   // FLASHGLA_GLA_FAST=0: never the fast path (the general kernel instead)
  Force hopper = Force::library;      // FLASHGLA_GLA_HOPPER=0|1: the Hopper path never / wherever it applies
  int64_t splits = 0;                 // FLASHGLA_GLA_SPLITS=<n ≥ 1>: sequence splits (0: the library's count)
  int64_t state_pieces = 0;           // FLASHGLA_GLA_STATE_PIECES=<n ≥ 1>: pieces per split of the states kernel
  bool hopper_pdl = true;             // FLASHGLA_GLA_HOPPER_PDL=0: the Hopper state kernel without PDL
  // Backward.
  bool bwd_scan_pairs = true;         // FLASHGLA_GLA_BWD_SCAN_PAIR=0: one block per 64x64 tile
  bool bwd_scan_pipeline = true;      // FLASHGLA_GLA_BWD_SCAN_PIPELINE=0: the scans without a pipeline
  int64_t bwd_scan_split = -1;        // FLASHGLA_GLA_BWD_SCAN_SPLIT=<chunks per piece, 0: none> (-1: library)
  bool bwd_diag_elementwise = false;  // FLASHGLA_GLA_BWD_DIAG=elementwise (=factored: the default)
  bool bwd_general_layout = false;    // FLASHGLA_GLA_BWD_LAYOUT=general
  Force bwd_overlap = Force::library; // FLASHGLA_GLA_BWD_OVERLAP=0|1
  Force bwd_norm_chain = Force::library;  // FLASHGLA_GLA_BWD_NORM=passes (off) | chain (on)
  // Segment summaries.
  int64_t segment_pieces = 0;         // FLASHGLA_GLA_SEGMENT_PIECES=<n ≥ 1>
  Force segment_split_kernel = Force::library;  // FLASHGLA_GLA_SEGMENT_KERNEL=generic (off) | split (on)
};

struct AttentionTuning {
  // Which kernel takes bf16/fp16 at head dims 64 and 128 (forward and backward; FLASHGLA_ATTENTION_KERNEL for the
  // forward, FLASHGLA_ATTENTION_BACKWARD for the backward). library: the Hopper kernels where they can run, else
  // the portable ones; portable: the mma.sync kernels; hopper: the Hopper kernels, and an error where the
  // device, the build or the tensors do not allow them (so that a test cannot pass on the portable kernel).
  enum class Kernel : int8_t { library, portable, hopper };
  Kernel kernel = Kernel::library;
};

}  // namespace flashgla
