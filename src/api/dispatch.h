// Routes a checked call to the backend of its device.
#pragma once

#include "api/checks.h"
#include "core/backend.h"

namespace flashgla {

#ifdef FLASHGLA_WITH_CUDA
#define FLASHGLA_DISPATCH(device, fn, ...)                                  \
  ((device).type == DeviceType::cpu ? cpu::fn(__VA_ARGS__) : cuda::fn(__VA_ARGS__))
#else
#define FLASHGLA_DISPATCH(device, fn, ...)                                                              \
  ((device).type == DeviceType::cpu                                                                    \
       ? cpu::fn(__VA_ARGS__)                                                                          \
       : check::fail(ErrorKind::unsupported, "q",                                                      \
                     "tensors are on " + (device).str() + " but this flashgla was built without CUDA"))
#endif

}  // namespace flashgla
