// flashgla: gated linear attention and FlashAttention kernels. Public C++ API.
#pragma once

#include "flashgla/attention.h"
#include "flashgla/error.h"
#include "flashgla/gla.h"
#include "flashgla/gla_fold.h"
#include "flashgla/gla_normalize.h"
#include "flashgla/norm.h"
#include "flashgla/tensor.h"

namespace flashgla {

const char* version();
bool cuda_available();  // built with CUDA and at least one device visible
int cuda_device_count();

// The CUDA kernels' tuning switches (FLASHGLA_GLA_*: benchmarks and tests) are read from the environment once
// per process, at the first call that plans a launch; this makes the next such call read them again (for a
// process that changes them between calls). A bad value raises flashgla::Error naming the variable there.
void reload_tuning();

}  // namespace flashgla
