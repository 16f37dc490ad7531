// What a backend implements for gla_fold_states (flashgla/gla_fold.h).
// Arguments arrive checked: shapes, dtypes, devices and the rank range.
#pragma once

#include "flashgla/gla_fold.h"

namespace flashgla::cpu {
void gla_fold_states(const GlaFoldStatesArgs& args);
}  // namespace flashgla::cpu

#ifdef FLASHGLA_WITH_CUDA
namespace flashgla::cuda {
void gla_fold_states(const GlaFoldStatesArgs& args);
}  // namespace flashgla::cuda
#endif
