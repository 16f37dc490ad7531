// flashgla: gated linear attention and FlashAttention kernels. Public C++ API.
#pragma once

#include "flashgla/attention.h"
#include "flashgla/error.h"
#include "flashgla/gla.h"
#include "flashgla/gla_fold.h"
#include "flashgla/gla_normalize.h"
#include "flashgla/norm.h"
#include "flashgla/tensor.h"
#include "flashgla/tuning.h"

namespace flashgla {

const char* version();
bool cuda_available();  // built with CUDA and at least one device visible
int cuda_device_count();

}  // namespace flashgla
