// The device types every GLA kernel reads, forward and backward: the strided view of a
// tensor and the sequence boundaries (cuda/common/sequences.cuh); element types, gate
// kinds and tile sizes: cuda/gla/plan/layouts.h.
#pragma once

#include <cstdint>

#include "cuda/common/sequences.cuh"
#include "cuda/gla/plan/layouts.h"

namespace flashgla::cuda::gla {

using cuda::Sequences;
using cuda::SeqSpan;

// A strided view with up to four dimensions, as the kernels see it.
struct View {
  void* data = nullptr;        // null: absent
  int64_t stride[4] = {0, 0, 0, 0};
  Elem dtype = Elem::f32;
  bool rows16 = false;         // innermost stride 1 and every row start 16-byte aligned (16-byte path)
};

}  // namespace flashgla::cuda::gla
